// RunGraphs: snapshots replace, deltas patch only the revision they name,
// a missed revision leaves the graph stale until the next snapshot.
import assert from "node:assert/strict";
import { test } from "node:test";

import { RunGraphs } from "../src/index.js";

const base = { protocolVersion: "narad/v1", timestamp: "2026-12-02T00:00:00.000Z", sessionId: "s", scope: "run", rootRunId: "r1", graphSchemaVersion: "narad.graph/1" };
const run = { id: "run:r1", kind: "run", runId: "r1", status: "running" };
const call = { id: "tool.call:t1", kind: "tool.call", toolCallId: "t1", toolName: "search", executor: "backend", status: "open" };
const edge = { id: "tool.call:run:r1->tool.call:t1", kind: "tool.call", from: "run:r1", to: "tool.call:t1" };

function snapshot(revision: number, nodes: unknown[], edges: unknown[] = []) {
  return { ...base, type: "graph.snapshot", sourceRunCursor: { sequence: revision }, revision, rootNodeId: "run:r1", nodes, edges };
}
function delta(baseRevision: number, patch: unknown[]) {
  return { ...base, type: "graph.delta", sourceRunCursor: { sequence: baseRevision + 1 }, baseRevision, revision: baseRevision + 1, patch };
}

test("a snapshot, then deltas on the revision they name", () => {
  const g = new RunGraphs();
  assert.equal(g.apply(snapshot(1, [run])), "replaced");
  assert.equal(
    g.apply(delta(1, [{ op: "add", path: "/nodes/1", value: call }, { op: "add", path: "/edges/0", value: edge }])),
    "patched",
  );
  assert.equal(g.apply(delta(2, [{ op: "replace", path: "/nodes/1/status", value: "success" }])), "patched");
  const held = g.get("r1")!;
  assert.equal(held.revision, 3);
  assert.equal(held.stale, false);
  assert.deepEqual(held.document.nodes.map((n) => [n.id, n.status]), [["run:r1", "running"], ["tool.call:t1", "success"]]);
  assert.equal(held.document.edges.length, 1);
  // A repeat is old news; an older snapshot never winds the graph back.
  assert.equal(g.apply(delta(2, [{ op: "replace", path: "/nodes/1/status", value: "error" }])), "old");
  assert.equal(g.apply(snapshot(1, [run])), "old");
  assert.equal(g.get("r1")!.revision, 3);
});

test("a missed revision leaves the graph as it was, stale, until a snapshot", () => {
  const g = new RunGraphs();
  g.apply(snapshot(1, [run]));
  assert.equal(g.apply(delta(2, [{ op: "replace", path: "/nodes/0/status", value: "finished" }])), "stale");
  const stale = g.get("r1")!;
  assert.equal(stale.stale, true);
  assert.equal(stale.revision, 1);
  assert.equal(stale.document.nodes[0]!.status, "running");
  // Later deltas do not apply on top of a stale graph either.
  assert.equal(g.apply(delta(3, [{ op: "replace", path: "/nodes/0/status", value: "error" }])), "stale");
  assert.equal(g.apply(snapshot(4, [{ ...run, status: "finished" }])), "replaced");
  assert.equal(g.get("r1")!.stale, false);
  assert.equal(g.get("r1")!.document.nodes[0]!.status, "finished");
});

test("a delta of a journal never seen, or one that does not apply, is not drawn", () => {
  const g = new RunGraphs();
  assert.equal(g.apply(delta(0, [{ op: "add", path: "/nodes/0", value: run }])), "stale");
  assert.equal(g.get("r1"), undefined);
  g.apply(snapshot(1, [run]));
  assert.equal(g.apply(delta(1, [{ op: "replace", path: "/nodes/7/status", value: "x" }])), "stale");
  assert.equal(g.get("r1")!.document.nodes[0]!.status, "running");
});
