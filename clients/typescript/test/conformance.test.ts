// The reducer against narad's golden traces (conformance/traces), read as
// conformance/README.md specifies: every delivery-mode trace, and every
// journal-mode trace whose rule a client can check (the `issuer.*` rules
// need to know who appended an event, which only the server knows).
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { test } from "node:test";

import { SessionReducer, Violation } from "../src/index.js";

const dir = resolve(process.env.NARAD_TRACES ?? "../../conformance/traces");

interface Manifest {
  spec: string;
  description: string;
  profiles: string[];
  mode: "journal" | "delivery";
  outcome: "accept" | "reject";
  rejectAt?: number;
  rule?: string;
  issuer?: "backend" | "person";
  state?: unknown;
}

interface Trace {
  name: string;
  lines: [number, string][];
  manifest: Manifest;
}

function load(): Trace[] {
  return readdirSync(dir)
    .filter((f) => f.endsWith(".jsonl"))
    .sort()
    .map((f) => {
      const name = f.slice(0, -".jsonl".length);
      const lines = readFileSync(join(dir, f), "utf8")
        .split("\n")
        .map((l, i): [number, string] => [i + 1, l])
        .filter(([, l]) => l.trim() !== "");
      const manifest = JSON.parse(readFileSync(join(dir, `${name}.expect.json`), "utf8")) as Manifest;
      return { name, lines, manifest };
    });
}

/** `actual` contains `expected` (conformance/README.md: subset match; null may be absent). */
function contains(actual: unknown, expected: unknown, at: string): void {
  if (typeof expected === "object" && expected !== null && !Array.isArray(expected)) {
    assert.ok(typeof actual === "object" && actual !== null, `${at} is ${JSON.stringify(actual)}; expected an object`);
    for (const [k, v] of Object.entries(expected)) {
      const a = (actual as Record<string, unknown>)[k];
      if (a === undefined) {
        assert.equal(v, null, `${at}/${k} is missing; expected ${JSON.stringify(v)}`);
        continue;
      }
      contains(a, v, `${at}/${k}`);
    }
    return;
  }
  if (Array.isArray(expected) && Array.isArray(actual) && actual.length === expected.length) {
    expected.forEach((v, i) => contains(actual[i], v, `${at}/${i}`));
    return;
  }
  assert.deepEqual(actual, expected, `${at} is ${JSON.stringify(actual)}; expected ${JSON.stringify(expected)}`);
}

function run(trace: Trace): { rejection?: [number, Violation]; reducer: SessionReducer } {
  const reducer = new SessionReducer({ profiles: trace.manifest.profiles });
  for (const [line, text] of trace.lines) {
    const before = JSON.stringify(reducer.state());
    try {
      const value: unknown = JSON.parse(text);
      if (trace.manifest.mode === "journal") reducer.append(value);
      else reducer.deliver(value);
    } catch (e) {
      if (!(e instanceof Violation)) throw e;
      assert.equal(JSON.stringify(reducer.state()), before, `${trace.name}: line ${line} was refused but changed the state`);
      return { rejection: [line, e], reducer };
    }
  }
  return { reducer };
}

const traces = load();
const checkable = (t: Trace) => t.manifest.mode === "delivery" || !t.manifest.rule?.startsWith("issuer.");

test("the traces are there: every delivery-mode trace and most journal traces run", () => {
  const delivery = traces.filter((t) => t.manifest.mode === "delivery");
  assert.ok(delivery.length >= 19, `${delivery.length} delivery traces in ${dir}`);
  assert.ok(traces.filter(checkable).length > 100, "the journal traces run too");
});

for (const trace of traces.filter(checkable)) {
  test(`${trace.manifest.mode} trace ${trace.name}`, () => {
    const m = trace.manifest;
    const { rejection, reducer } = run(trace);
    if (m.outcome === "accept") {
      assert.equal(rejection, undefined, `line ${rejection?.[0]} was refused: ${rejection?.[1].rule}: ${rejection?.[1].message}`);
    } else {
      assert.ok(rejection !== undefined, `every line was accepted; line ${m.rejectAt} should have been refused`);
      const [line, v] = rejection;
      assert.equal(line, m.rejectAt, `line ${line} was refused (${v.rule}: ${v.message}), not line ${m.rejectAt}`);
      if (m.rule !== undefined) assert.equal(v.rule, m.rule, `line ${line}: ${v.message}`);
    }
    if (m.state !== undefined) contains(reducer.state(), m.state, "");
  });
}

test("a reducer that skipped deduplication would fail the duplicate trace", () => {
  // The duplicate trace re-delivers applied events; delivering them to a
  // journal (no deduplication) must be refused, or the trace proves nothing.
  const trace = traces.find((t) => t.name === "delivery-duplicates-deduplicated");
  assert.ok(trace);
  const journal = run({ ...trace, manifest: { ...trace.manifest, mode: "journal" } });
  assert.equal(journal.rejection?.[1].rule, "event.id.unique");
});
