/**
 * The run tree of a session, drawn from the run graphs of the graph profile
 * (`narad.graph/v1`: a snapshot per run journal, then a delta for every
 * event that changes it): runs nested in their parents, with their tool
 * calls and interrupts, each with its status, in the order they began.
 */
import { useState } from "preact/hooks";

import type { GraphNode, HeldGraph } from "../../clients/typescript/src/index.js";
import type { LiveSession } from "./live.js";

function label(node: GraphNode): string {
  switch (node.kind) {
    case "run":
      return `run ${node.runId ?? node.id}`;
    case "tool.call":
      return `tool ${node.toolName ?? node.toolCallId ?? node.id}`;
    case "interrupt":
      return `interrupt ${node.interruptId ?? node.id}`;
    default:
      return node.id;
  }
}

function Details({ node }: { node: GraphNode }) {
  const parts: string[] = [];
  if (node.kind === "tool.call" && node.executor !== undefined) parts.push(node.executor);
  if (node.clientExecutorId !== undefined) parts.push(`executor ${node.clientExecutorId}`);
  if (node.pauseReason !== undefined) parts.push(node.pauseReason);
  if (node.stopRequested === true && node.status !== "cancelled") parts.push("stop requested");
  if (node.decision !== undefined) parts.push(node.decision);
  return parts.length === 0 ? null : <span class="quiet"> · {parts.join(" · ")}</span>;
}

/** A run's short name, when it has one. */
function RunName({ live, runId }: { live: LiveSession; runId: string }) {
  const name = live.runName(runId);
  return name === undefined ? null : <span class="run-name"> “{name}”</span>;
}

function Branch({
  id,
  nodes,
  children,
  seen,
  live,
}: {
  id: string;
  nodes: ReadonlyMap<string, GraphNode>;
  children: ReadonlyMap<string, string[]>;
  seen: ReadonlyMap<string, number>;
  live: LiveSession;
}) {
  const node = nodes.get(id);
  if (node === undefined) return null;

  const below = [...(children.get(id) ?? [])].sort((a, b) => (seen.get(a) ?? Infinity) - (seen.get(b) ?? Infinity));
  return (
    <li data-node={id} class={`node ${node.kind.replace(".", "-")}`}>
      <span class="what">{label(node)}</span>
      {node.kind === "run" && node.runId !== undefined && <RunName live={live} runId={node.runId} />} {node.status !== undefined && <span class={`badge ${node.status}`}>{node.status}</span>}
      <Details node={node} />
      {below.length > 0 && (
        <ul>
          {below.map((child) => (
            <Branch key={child} id={child} nodes={nodes} children={children} seen={seen} live={live} />
          ))}
        </ul>
      )}
    </li>
  );
}

function Graph({ graph, live }: { graph: HeldGraph; live: LiveSession }) {
  const seen = live.nodeSeen;
  const nodes = new Map(graph.document.nodes.map((n) => [n.id, n]));
  const children = new Map<string, string[]>();
  for (const edge of graph.document.edges) {
    const list = children.get(edge.from);
    if (list === undefined) children.set(edge.from, [edge.to]);
    else list.push(edge.to);
  }
  return (
    <ul class="tree" data-root-run={graph.rootRunId} data-graph-revision={graph.revision}>
      <Branch id={graph.document.rootNodeId} nodes={nodes} children={children} seen={seen} live={live} />
      {graph.stale && <li class="quiet">(catching up…)</li>}
    </ul>
  );
}

/** How many run journals the tree shows before it is asked for all. */
const RECENT = 20;

/** The run tree, one graph per run journal, newest journal last. */
export function RunTree({ live }: { live: LiveSession }) {
  const [all, setAll] = useState(false);
  const graphs = live.reducer.graphs.all();
  const runs = Object.entries(live.reducer.state().runs);
  if (graphs.length === 0) {
    // A server without the graph profile: the runs the reducer knows.
    return runs.length === 0 ? (
      <p class="quiet">No runs yet.</p>
    ) : (
      <ul class="runs">
        {runs.map(([runId, r]) => (
          <li key={runId} style={{ marginLeft: r.parentRunId ? "1em" : 0 }}>
            <code>{runId}</code>
            <RunName live={live} runId={runId} /> <span class={`badge ${r.state}`}>{r.state}</span>
          </li>
        ))}
      </ul>
    );
  }
  const ordered = [...graphs].sort(
    (a, b) => (live.nodeSeen.get(`run:${a.rootRunId}`) ?? Infinity) - (live.nodeSeen.get(`run:${b.rootRunId}`) ?? Infinity),
  );
  // A long session has hundreds of journals: the latest ones, unless
  // asked for all.
  const shown = all ? ordered : ordered.slice(-RECENT);
  return (
    <>
      {shown.length < ordered.length && (
        <button type="button" class="quiet" onClick={() => setAll(true)}>
          Show all {ordered.length} runs ({ordered.length - shown.length} earlier)
        </button>
      )}
      {shown.map((g) => (
        <Graph key={g.rootRunId} graph={g} live={live} />
      ))}
    </>
  );
}
