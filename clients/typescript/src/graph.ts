/**
 * The run graphs of a session (`narad.graph/v1`, spec §9.7), kept from the
 * `graph.snapshot` and `graph.delta` hydrate records a stream sends to a
 * client of the graph profile. One graph per run journal (scope `run`,
 * keyed by `rootRunId`); the document model is `docs/graph.md`.
 *
 * A snapshot replaces its graph unless it is older than the one held; a
 * delta applies only on top of the revision it names. A delta that does
 * not fit (a revision was missed) leaves the graph as it was and marks it
 * stale: it is drawn as last known until the next snapshot, which a stream
 * sends again on every (re)connection after history.
 */
import { type Json, type PatchOperation, applyPatch } from "./jsonpatch.js";

/** A node of a run graph: a run, a tool call or an interrupt. */
export interface GraphNode {
  readonly id: string;
  readonly kind: string;
  readonly status?: string;
  readonly runId?: string;
  readonly parentRunId?: string;
  readonly clientExecutorId?: string;
  readonly pauseReason?: string;
  readonly stopRequested?: boolean;
  readonly toolCallId?: string;
  readonly toolName?: string;
  readonly executor?: string;
  readonly interruptId?: string;
  readonly decision?: string;
  readonly [member: string]: unknown;
}

/** An edge of a run graph: `parent`, `tool.call` or `interrupt`, from the owning run. */
export interface GraphEdge {
  readonly id: string;
  readonly kind: string;
  readonly from: string;
  readonly to: string;
}

/** The graph document deltas patch: the `rootNodeId`, `nodes` and `edges` of a snapshot. */
export interface GraphDocument {
  readonly rootNodeId: string;
  readonly nodes: readonly GraphNode[];
  readonly edges: readonly GraphEdge[];
}

/** One run journal's graph as held by the client. */
export interface HeldGraph {
  /** The run journal. */
  readonly rootRunId: string;
  /** The revision of `document`. */
  readonly revision: number;
  readonly document: GraphDocument;
  /** A delta did not fit: `document` is the last known one until the next snapshot. */
  readonly stale: boolean;
}

/** What {@link RunGraphs.apply} did with a record. */
export type GraphOutcome = "replaced" | "patched" | "old" | "stale" | "ignored";

interface GraphRecord {
  readonly type: string;
  readonly scope?: string;
  readonly rootRunId?: string;
  readonly revision?: number;
  readonly baseRevision?: number;
  readonly rootNodeId?: string;
  readonly nodes?: GraphNode[];
  readonly edges?: GraphEdge[];
  readonly patch?: PatchOperation[];
}

/** The run graphs of one session, in the order their journals were first seen. */
export class RunGraphs {
  private readonly graphs = new Map<string, HeldGraph>();

  /** Applies a `graph.snapshot` or `graph.delta` (other records are ignored). */
  apply(value: unknown): GraphOutcome {
    const r = value as GraphRecord;
    if (r.scope !== "run" || typeof r.rootRunId !== "string" || typeof r.revision !== "number") return "ignored";
    const held = this.graphs.get(r.rootRunId);
    if (r.type === "graph.snapshot") {
      if (held !== undefined && !held.stale && r.revision < held.revision) return "old";
      const document: GraphDocument = { rootNodeId: r.rootNodeId ?? "", nodes: r.nodes ?? [], edges: r.edges ?? [] };
      this.graphs.set(r.rootRunId, { rootRunId: r.rootRunId, revision: r.revision, document, stale: false });
      return "replaced";
    }
    if (r.type !== "graph.delta" || r.patch === undefined) return "ignored";
    // A stream sends a journal's snapshot before its first delta: a delta
    // of a journal never seen has nothing to patch.
    if (held === undefined) return "stale";
    if (r.revision <= held.revision) return "old";
    const base = held;
    if (base.stale || r.baseRevision !== base.revision) {
      this.graphs.set(r.rootRunId, { ...base, stale: true });
      return "stale";
    }
    let document: GraphDocument;
    try {
      document = applyPatch(base.document as unknown as Json, r.patch) as unknown as GraphDocument;
    } catch {
      this.graphs.set(r.rootRunId, { ...base, stale: true });
      return "stale";
    }
    this.graphs.set(r.rootRunId, { rootRunId: r.rootRunId, revision: r.revision, document, stale: false });
    return "patched";
  }

  /** The graph of one run journal. */
  get(rootRunId: string): HeldGraph | undefined {
    return this.graphs.get(rootRunId);
  }

  /** Every graph held, in the order their journals were first seen. */
  all(): HeldGraph[] {
    return [...this.graphs.values()];
  }
}
