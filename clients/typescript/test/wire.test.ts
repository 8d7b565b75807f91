// The generated validators read the schemas' patterns as ECMAScript does;
// the server reads them as Rust does. Names must get one verdict from both.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { test } from "node:test";

import { Violation, classify, profileSet } from "../src/index.js";

const profiles = profileSet(["narad.extensions/v1"]);

const schemaPath = resolve(process.env.NARAD_SCHEMA ?? "../../schema", "events/node.custom.json");
const example = (JSON.parse(readFileSync(schemaPath, "utf8")) as { examples: Record<string, unknown>[] }).examples[0]!;

function nodeCustom(name: string): unknown {
  return { ...example, name };
}

test("a namespaced name with two clean segments is accepted", () => {
  for (const name of ["acme.audit", "acme.audit.v2", "é.ü", "a.\ufeffb"]) {
    assert.equal(classify(nodeCustom(name), profiles).outcome, "accepted", name);
  }
});

test("white space and control characters in a namespaced name are refused as the server refuses them", () => {
  // U+0085 is white space to Rust and Python but not to ECMAScript's \s:
  // a client validating with `\s` sent names the server refused.
  for (const name of ["a.b\u0085c", "a\u0001.b", "a.b\u3000", "a.b c", "a..b", "a", "a.b\u007f"]) {
    assert.throws(
      () => classify(nodeCustom(name), profiles),
      (e: unknown) => e instanceof Violation && e.rule === "wire.invalid" && e.pointer === "/name",
      JSON.stringify(name),
    );
  }
});
