/**
 * The client reducer (§10, §13): reduces what a client received —
 * duplicates and re-deliveries included — into session state: the run
 * tree, interrupts, tool calls, documents, views and the transcript.
 *
 * It keeps the client obligations of §10: deduplicates by eventId before
 * applying; applies nothing past a gap in sessionSequence
 * (`delivery.gap`: re-read history from {@link SessionReducer.sessionSequence});
 * refuses one eventId at two sequences (`delivery.conflict`); never lets a
 * watch revision regress; replaces the transcript with a
 * `messages.snapshot` (one older than what it holds is ignored); validates the authority of the profiles it
 * negotiated with the lifecycle rules ({@link SessionState}); never invents
 * a terminal and never executes anything (control messages are ignored).
 */
import { type AuthorityEvent, SessionState, type Slot, type Status } from "./engine.js";
import { RunGraphs } from "./graph.js";
import type { Json } from "./jsonpatch.js";
import { ALL_PROFILES, classify, type ProfileId, profileSet, Violation, type WireObject } from "./wire.js";

/** What the reducer did with one delivered object. */
export type Delivered = "applied" | "duplicate" | "recorded" | "ignored";

/** A transcript message (§9.2). */
export interface TranscriptMessage {
  item: "message";
  messageId: string;
  role: "user" | "assistant" | "system";
  scope: "session" | "workflow" | "run";
  runId?: string;
  /** User content, or the streamed text so far. */
  content: Json;
  completed: boolean;
  /** A display redaction (§9.4); the content itself is kept. */
  redaction?: { reason: string; displayReplacement: Json };
}

/** A reasoning stream, kept even when a later message carries the turn's final text (§9.2). */
export interface TranscriptReasoning {
  item: "reasoning";
  reasoningId: string;
  messageId?: string;
  runId?: string;
  text: string;
  completed: boolean;
}

/** One entry of the transcript. */
export type TranscriptItem = TranscriptMessage | TranscriptReasoning;

/** The reduced state of a session, in the form of the conformance traces' `state`. */
export interface ReducedState {
  sessionSequence: number;
  slot: Slot | null;
  runs: Record<string, { state: Status; stopRequested: boolean; rootRunId: string; parentRunId?: string; workflowId?: string; clientExecutorId?: string }>;
  workflows: Record<string, { state: Status }>;
  interrupts: Record<string, { open: boolean; decision?: string }>;
  toolCalls: Record<string, { runId: string; toolName: string; executor: string; outcome?: string }>;
  transcript: TranscriptItem[];
  documents: { state?: Record<string, { revision: number; state: Json }>; ui?: Record<string, { revision: number; state: Json }> };
  views: Record<string, { open: boolean; state: Json }>;
  watch: Record<string, number>;
}

/** Options of a {@link SessionReducer}. */
export interface ReducerOptions {
  /** The profiles the client negotiated (core is implied). Default: every profile. */
  profiles?: Iterable<string>;
}

const WATCH_ID: Readonly<Record<string, [string, string]>> = {
  "session.revision": ["session.revision", "sessionId"],
  "run.revision": ["run.revision", "runId"],
  "workflow.revision": ["workflow.revision", "workflowId"],
  "node.revision": ["node.revision", "nodeId"],
  "workspace.revision": ["workspace.revision", "workspaceId"],
  "session.created": ["workspace.revision", "workspaceId"],
  "session.updated": ["workspace.revision", "workspaceId"],
  "session.archived": ["workspace.revision", "workspaceId"],
};

/** The reducer of one session. */
export class SessionReducer {
  private readonly profiles: ReadonlySet<ProfileId>;
  private readonly engine: SessionState;
  /** Authority delivered so far: eventId → sessionSequence. */
  private readonly delivered = new Map<string, number>();
  private readonly bySequence = new Map<number, string>();
  private readonly watchSeen = new Set<string>();
  private readonly watchRevisions = new Map<string, number>();
  private transcriptItems: TranscriptItem[] = [];
  /** Transcript replaced by a snapshot through this sequence. */
  private transcriptCovered = 0;
  private lastTopLevelRun: string | undefined;
  /** The run graphs (`narad.graph/v1`) from the stream's graph records. */
  readonly graphs = new RunGraphs();

  constructor(options: ReducerOptions = {}) {
    this.profiles = profileSet(options.profiles ?? ALL_PROFILES);
    this.engine = new SessionState(this.profiles);
  }

  /** The last sessionSequence applied (0 before any): resume history or a stream after it. */
  get sessionSequence(): number {
    return this.engine.sessionSequence;
  }

  /** The lifecycle state the rules keep (runs, interrupts, tool calls, documents, views). */
  get lifecycle(): SessionState {
    return this.engine;
  }

  /**
   * Reduces one delivered wire object (§10.1: at least once, in order).
   * Throws a {@link Violation} for an object that breaks a rule; the state
   * is then as it was before it.
   */
  deliver(value: unknown): Delivered {
    const c = classify(value, this.profiles);
    if (c.outcome === "ignored") {
      if (c.reason !== "not-negotiated") return "ignored";
      // Authority of a profile not negotiated is still read, so that its
      // sequence is accounted for and never looks like a gap (§2.1).
      let all;
      try {
        all = classify(value, profileSet(ALL_PROFILES));
      } catch {
        return "ignored";
      }
      if (all.outcome !== "accepted" || all.info.kind !== "authority") return "ignored";
      return this.deliverAuthority(all.object as AuthorityEvent);
    }
    switch (c.info.kind) {
      case "authority":
        return this.deliverAuthority(c.object as AuthorityEvent);
      case "watch":
        return this.deliverWatch(c.object);
      case "hydrate":
        if (c.object.type === "messages.snapshot") {
          // A snapshot older than what the transcript already holds would
          // take back what later authority added.
          const holds = Math.max(this.transcriptCovered, this.engine.sessionSequence);
          if ((c.object.coversThroughSessionSequence as number) < holds) return "ignored";
          this.replaceTranscript(c.object);
        } else this.graphs.apply(c.object);
        return "recorded";
      case "control":
        return "ignored";
    }
  }

  /**
   * Applies the next event of a journal with no deduplication: every event
   * must be new and next, of a negotiated profile (`profile.not-active`
   * otherwise). The view of a writer checking what it is about to append.
   */
  append(value: unknown): void {
    const c = classify(value, profileSet(ALL_PROFILES));
    if (c.outcome === "ignored") {
      throw new Violation("wire.unknown-type", `${JSON.stringify(c.type)} is no narad/v1 type; a journal holds only known types`, "/type");
    }
    if (!this.profiles.has(c.info.profile)) {
      throw new Violation("profile.not-active", `${c.object.type} belongs to ${c.info.profile}, which is not active`, "/type");
    }
    if (c.info.kind !== "authority") {
      throw new Violation("wire.invalid", `a journal holds authority events only, not ${c.object.type}`, "/type");
    }
    this.applyAuthority(c.object as AuthorityEvent);
  }

  private deliverAuthority(e: AuthorityEvent): Delivered {
    const had = this.delivered.get(e.eventId);
    const seq = e.sessionSequence;
    if (had !== undefined) {
      if (had === seq) return "duplicate";
      throw at(new Violation("delivery.conflict", `event ${e.eventId} was delivered at sessionSequence ${had}, now at ${seq}`), e);
    }
    const through = this.engine.sessionSequence;
    if (seq <= through) {
      const other = this.bySequence.get(seq);
      throw at(
        new Violation("delivery.conflict", `sessionSequence ${seq} was already delivered as ${other === undefined ? "another event" : `event ${other}`}`),
        e,
      );
    }
    if (seq > through + 1) {
      throw at(
        new Violation(
          "delivery.gap",
          `sessionSequence ${seq} arrived after ${through}: re-read history from ${through} before applying more`,
        ),
        e,
      );
    }
    if (this.engine.isOutsideProfiles(e)) {
      this.engine.skip(e);
      this.remember(e);
      return "ignored";
    }
    this.applyAuthority(e);
    return "applied";
  }

  private applyAuthority(e: AuthorityEvent): void {
    this.engine.apply(e);
    this.remember(e);
    this.reduceTranscript(e);
  }

  private remember(e: AuthorityEvent): void {
    this.delivered.set(e.eventId, e.sessionSequence);
    this.bySequence.set(e.sessionSequence, e.eventId);
  }

  private deliverWatch(w: WireObject): Delivered {
    const id = w.eventId as string;
    if (this.watchSeen.has(id)) return "duplicate";
    const [family, member] = WATCH_ID[w.type] ?? [w.type, "id"];
    const scope = `${family}/${String(w[member])}`;
    const revision = w.revision as number;
    const last = this.watchRevisions.get(scope);
    if (last !== undefined && revision < last) {
      throw at(new Violation("watch.revision.regress", `${scope} went from revision ${last} back to ${revision}`), w);
    }
    this.watchSeen.add(id);
    this.watchRevisions.set(scope, revision);
    return "recorded";
  }

  private replaceTranscript(s: WireObject): void {
    interface SnapshotMessage {
      messageId: string;
      role: TranscriptMessage["role"];
      messageScope: TranscriptMessage["scope"];
      runId?: string;
      content: Json;
      completed: boolean;
      redaction?: { reason: string; displayReplacement: Json };
      reasoning?: { reasoningId: string; text: string; completed: boolean }[];
    }
    const items: TranscriptItem[] = [];
    for (const m of s.messages as SnapshotMessage[]) {
      for (const r of m.reasoning ?? []) {
        items.push(withRun({ item: "reasoning", reasoningId: r.reasoningId, messageId: m.messageId, text: r.text, completed: r.completed }, m.runId));
      }
      const message: TranscriptMessage = withRun(
        { item: "message", messageId: m.messageId, role: m.role, scope: m.messageScope, content: m.content, completed: m.completed },
        m.runId,
      );
      if (m.redaction !== undefined) message.redaction = { reason: m.redaction.reason, displayReplacement: m.redaction.displayReplacement };
      items.push(message);
    }
    this.transcriptItems = items;
    this.transcriptCovered = s.coversThroughSessionSequence as number;
  }

  private reduceTranscript(e: AuthorityEvent): void {
    if (e.type === "run.started" && e.parentRunId === undefined) this.lastTopLevelRun = e.runId;
    if (e.sessionSequence <= this.transcriptCovered) return;
    const runId = e.runId;
    const b = e as AuthorityEvent & Record<string, unknown>;
    switch (e.type) {
      case "message.user.recorded":
        this.transcriptItems.push(
          withRun({ item: "message", messageId: b.messageId as string, role: "user", scope: b.messageScope as TranscriptMessage["scope"], content: b.content as Json, completed: true }, runId),
        );
        break;
      case "message.text.started":
        this.transcriptItems.push(
          withRun({ item: "message", messageId: b.messageId as string, role: b.role as TranscriptMessage["role"], scope: b.messageScope as TranscriptMessage["scope"], content: "", completed: false }, runId),
        );
        break;
      case "message.text.delta": {
        const m = this.message(b.messageId as string);
        if (m !== undefined && typeof m.content === "string") m.content += b.delta as string;
        break;
      }
      case "message.text.completed": {
        const m = this.message(b.messageId as string);
        if (m !== undefined) m.completed = true;
        break;
      }
      case "message.redacted": {
        const m = this.message(b.messageId as string);
        if (m !== undefined) m.redaction = { reason: b.reason as string, displayReplacement: b.displayReplacement as Json };
        break;
      }
      case "reasoning.started": {
        const r: TranscriptReasoning = withRun({ item: "reasoning", reasoningId: b.reasoningId as string, text: "", completed: false }, runId);
        if (typeof b.messageId === "string") r.messageId = b.messageId;
        this.transcriptItems.push(r);
        break;
      }
      case "reasoning.delta": {
        const r = this.reasoning(b.reasoningId as string);
        if (r !== undefined) r.text += b.delta as string;
        break;
      }
      case "reasoning.completed": {
        const r = this.reasoning(b.reasoningId as string);
        if (r !== undefined) r.completed = true;
        break;
      }
      default:
        break;
    }
  }

  private message(id: string): TranscriptMessage | undefined {
    return this.transcriptItems.findLast((i): i is TranscriptMessage => i.item === "message" && i.messageId === id);
  }

  private reasoning(id: string): TranscriptReasoning | undefined {
    return this.transcriptItems.findLast((i): i is TranscriptReasoning => i.item === "reasoning" && i.reasoningId === id);
  }

  /**
   * The default transcript (§9.2): session- and workflow-scoped items and
   * those of the most recently started top-level run, in order; items of
   * the runs in `opened` (e.g. a nested run a person expanded) as well.
   */
  transcript(opened: readonly string[] = []): TranscriptItem[] {
    const shown = new Set(opened);
    return this.transcriptItems.filter((i) => i.runId === undefined || i.runId === this.lastTopLevelRun || shown.has(i.runId));
  }

  /** The reduced state, in the form of the conformance traces' `state` (conformance/README.md). */
  state(): ReducedState {
    const s = this.engine;
    const runs: ReducedState["runs"] = {};
    for (const [id, r] of s.runs) {
      const v: ReducedState["runs"][string] = { state: r.state, stopRequested: r.stopRequested, rootRunId: r.rootRunId };
      if (r.parentRunId !== undefined) v.parentRunId = r.parentRunId;
      if (r.workflowId !== undefined) v.workflowId = r.workflowId;
      if (r.clientExecutorId !== undefined) v.clientExecutorId = r.clientExecutorId;
      runs[id] = v;
    }
    const workflows: ReducedState["workflows"] = {};
    for (const [id, w] of s.workflows) workflows[id] = { state: w.state };
    const interrupts: ReducedState["interrupts"] = {};
    for (const [id, i] of s.interrupts) interrupts[id] = i.decision === undefined ? { open: true } : { open: false, decision: i.decision };
    const toolCalls: ReducedState["toolCalls"] = {};
    for (const [id, t] of s.toolCalls) toolCalls[id] = { ...t };
    const documents: ReducedState["documents"] = {};
    for (const family of ["state", "ui"] as const) {
      if (s.documents[family].size > 0) documents[family] = Object.fromEntries([...s.documents[family]].map(([k, d]) => [k, { ...d }]));
    }
    return {
      sessionSequence: s.sessionSequence,
      slot: s.slot === undefined ? null : { ...s.slot },
      runs,
      workflows,
      interrupts,
      toolCalls,
      transcript: this.transcript().map((i) => ({ ...i })),
      documents,
      views: Object.fromEntries([...s.views].map(([k, v]) => [k, { ...v }])),
      watch: Object.fromEntries(this.watchRevisions),
    };
  }
}

function withRun<T extends TranscriptItem>(item: T, runId: string | undefined): T {
  if (runId !== undefined) item.runId = runId;
  return item;
}

function at(v: Violation, o: WireObject): Violation {
  if (typeof o.eventId === "string") v.eventId = o.eventId;
  return v;
}
