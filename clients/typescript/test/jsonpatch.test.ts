// The JSON Patch applier against the RFC 6902 test suite
// (json-patch-test-suite: the RFC's own examples and the community cases).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { test } from "node:test";

import { applyPatch, type Json, type PatchOperation } from "../src/jsonpatch.js";

interface Case {
  comment?: string;
  doc: Json;
  patch: PatchOperation[];
  expected?: Json;
  error?: string;
  disabled?: boolean;
}

const require = createRequire(import.meta.url);
const cases = ["tests.json", "spec_tests.json"].flatMap((f) =>
  (JSON.parse(readFileSync(require.resolve(`json-patch-test-suite/${f}`), "utf8")) as Case[]).map((c, i) => ({ ...c, name: `${f}#${i} ${c.comment ?? ""}` })),
);

test("the suite is there", () => {
  assert.ok(cases.filter((c) => !c.disabled).length > 90);
});

for (const c of cases.filter((c) => !c.disabled)) {
  test(c.name, () => {
    const before = JSON.stringify(c.doc);
    if (c.error !== undefined) {
      assert.throws(() => applyPatch(c.doc, c.patch), `expected an error: ${c.error}`);
    } else {
      const out = applyPatch(c.doc, c.patch);
      if (c.expected !== undefined) assert.deepEqual(out, c.expected);
    }
    assert.equal(JSON.stringify(c.doc), before, "the input document is never changed");
  });
}
