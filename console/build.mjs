// Builds the console into OUT_DIR (default dist): src/main.tsx and the
// TypeScript SDK it is built on (clients/typescript/src) bundled by esbuild
// into one minified ES module (narad serves src/index.html and
// src/console.css as they are). The file in dist/ is checked in (narad serve embeds them, so a machine
// without Node serves the console); CI rebuilds them and fails when they
// differ.
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { build } from "esbuild";

const out = process.argv[2] ?? "dist";
mkdirSync(out, { recursive: true });
await build({
  entryPoints: ["src/main.tsx"],
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  minify: true,
  legalComments: "none",
  jsx: "automatic",
  jsxImportSource: "preact",
  outfile: join(out, "console.js"),
  logLevel: "warning",
});
