// Copies the generated JavaScript modules (src/generated/*.js with their
// .d.ts) into a build output directory: tsc compiles TypeScript only.
// Usage: node scripts/copy-generated.mjs OUT_DIR (e.g. dist, dist-test/src)
import { copyFileSync, mkdirSync, readdirSync } from "node:fs";
import { join } from "node:path";

const out = join(process.argv[2] ?? "dist", "generated");
mkdirSync(out, { recursive: true });
for (const f of readdirSync("src/generated").filter((f) => f.endsWith(".js") || f.endsWith(".d.ts"))) {
  copyFileSync(join("src/generated", f), join(out, f));
}
