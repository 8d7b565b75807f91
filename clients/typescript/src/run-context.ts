/**
 * What a run handler works with: the claimed run, its journal, appends
 * under the run's lease, the stop and lost signals, and steps that write
 * the protocol's events (the Python SDK's `narad.runtime.RunContext`,
 * with the same ids, so either SDK takes over the other's runs).
 *
 * **Replay.** Steps are numbered in the order the handler takes them, and
 * each step's ids derive from the run id and that number (`{runId}.3.tool`,
 * `{runId}.4.approval`), not from the holder. A later holder of the run
 * (after a lost runtime, or a release) runs the handler from the top, and
 * every step first looks in the journal: a finished tool call answers its
 * recorded result without running again, an approval already requested is
 * waited for (a decided one answers its decision at once), a completed
 * message is not said again, and a message a lost holder left half-streamed
 * is carried on from where it stopped. A backend call the server closed as
 * `runtime_lost` runs again under a new toolCallId (`{runId}.3.tool.2`: a
 * retry that may repeat side effects takes a new id, §11.3). Replay assumes
 * the handler takes the same steps in the same order for the same journal.
 *
 * **Keyed steps.** A step given a `key` ({@link StepOptions}) derives its
 * ids from the key instead of its position (`{runId}.{key}.tool`,
 * `{runId}.{key}.approval`), and takes no position: a framework that names
 * its steps by ids of its own (a model's toolCallId) finds them in the
 * journal whatever order they come in. A key names one step of a run; a
 * journal that holds a call of another tool under it throws
 * {@link ReplayDiverged}.
 * EventIds are `{runId}@{attempt}.{lease}.{n}`: fixed when an event is
 * built, so a batch sent again after a lost answer is recognised by the
 * server as the same batch.
 */
import type { NaradClient } from "./client.js";
import { NaradError } from "./errors.js";
import { runEvent } from "./events.js";
import type { EventFields, Proposed, ProposedType } from "./events.js";
import { follow } from "./follow.js";
import { ident } from "./ids.js";
import { Journal, TERMINALS } from "./journal.js";
import type { JournalEvent } from "./journal.js";
import type { Json, PatchOperation } from "./jsonpatch.js";
import { LeaseLost, LEASE_NOT_CURRENT, RunStopped, RunWaiting, RUNTIME_LOST, STOPPED, STOPPED_MESSAGE, TOOL_ERROR, ToolFailed } from "./run-errors.js";
import type { RunState } from "./journal.js";
import { Mutex, openStreams, TextStream } from "./text-stream.js";
import type { StreamBatch, StreamHost } from "./text-stream.js";
import type { Appended, AuthorityEvent, ProposedEvent, Schemas } from "./types.js";

/** A run handed to a runtime by a claim. */
export type Claim = Schemas["Claim"];

/** Token counters and other additive fields of a run's terminal (§7.5). */
export type Usage = Schemas["defs.usage"];

/** Who resolved an interrupt (protected provenance the server stamps). */
export type Actor = Schemas["defs.actor"];

/** What a person decided, as {@link RunContext.approve} answers it. */
export interface Approval {
  /** One of the request's actions, or `expired`. */
  readonly decision: string;
  /** Who decided, when the server recorded it (a user's `sub`, or an extension). */
  readonly actor: Actor | undefined;
  /** The reason given with the decision, if any. */
  readonly reason: string | undefined;
  /** The decision of each member of a pack, when the request listed members. */
  readonly members: Schemas["defs.memberDecision"][] | undefined;
  /** The interrupt. */
  readonly interruptId: string;
  /** The `interrupt.resolved` event. */
  readonly event: JournalEvent;
}

/** What every step takes. */
export interface StepOptions {
  /**
   * Names the step: its ids are `{runId}.{key}.{kind}` instead of
   * `{runId}.{position}.{kind}`, and it takes no position. Unique per run
   * and step kind; not all digits (those are positions).
   */
  key?: string;
}

/**
 * A replayed step is not what the journal holds under its id: the handler
 * (or the framework it drives) took another path than the holder before it,
 * e.g. a call of another tool under the same key. The run cannot go on
 * safely; end it (`run.error`, code {@link REPLAY_DIVERGED}).
 */
export class ReplayDiverged extends Error {
  /** The step id the journal holds otherwise. */
  readonly stepId: string;

  /** The divergence at step `stepId`, told by `message`. */
  constructor(stepId: string, message: string) {
    super(message);
    this.name = "ReplayDiverged";
    this.stepId = stepId;
  }
}

/** The code of the `run.error` a run whose replay diverged ends in. */
export const REPLAY_DIVERGED = "replay_diverged";

/** How {@link RunContext.approve} asks. */
export interface ApproveOptions extends StepOptions {
  /** A title for the person's inbox. */
  title?: string;
  /** The decisions offered (default `["approve", "deny"]`). */
  actions?: string[];
  /** The interrupt's kind, an open namespaced string (default `approval`). */
  kind?: string;
  /** Kind-specific structured input (what is to be approved). */
  input?: unknown;
  /** When the server resolves it `expired` if nobody decided. */
  expiresAt?: Date | string;
  /** The pause's reason (default `narad.approval`). */
  reason?: string;
}

/** How {@link RunContext.progress} records an activity. */
export interface ProgressOptions extends StepOptions {
  /** The activity item it updates (default: a new one, `{runId}.{step}.progress`). */
  progressId?: string;
  /** `active` (the default), `completed`, `failed` or `cancelled`. */
  status?: "active" | "completed" | "failed" | "cancelled";
  /** An open namespaced category (default `agent.step`). */
  category?: string;
  /** More than the label says. */
  detail?: string;
  /** Who may see it: `public` (the default), `internal` or `sensitive`. */
  privacy?: "public" | "internal" | "sensitive";
}

/** Which document a state step writes. */
export interface DocumentOptions extends StepOptions {
  /** The document's scope (default `session`). */
  scope?: string;
  /** The UI document of that scope (`ui.state.*`) instead of the state document (`state.*`). */
  ui?: boolean;
}

/** What a backend tool's function gets besides its arguments. */
export interface ToolCall {
  /** The call's toolCallId. */
  readonly toolCallId: string;
  /** Aborted when the run is asked to stop or its lease is lost. */
  readonly signal: AbortSignal;
}

/** How a run context coalesces and waits (the runtime's settings). */
export interface RunContextOptions {
  /** How long said text may wait before it goes out as one delta, in ms (default 50). */
  deltaWindowMs?: number;
  /** How many characters of said text go out at once without waiting (default 256). */
  deltaChars?: number;
  /** The longest wait between journal reads when the session's stream cannot be followed, in ms (default 1,000). */
  pollIntervalMs?: number;
  /**
   * A step that waits on a person ({@link RunContext.approve}) or a client
   * executor ({@link RunContext.clientTool}) throws `RunWaiting` instead of
   * waiting, once what it waits for is asked and not yet answered: the
   * runtime gives the run back, and the answer queues it again (default
   * false: the step waits, the run held).
   */
  releaseWhenWaiting?: boolean;
}

/** The options of a nested run ({@link RunContext.nested}). */
export interface NestedOptions extends StepOptions {
  /** The nested run's `input` on its `run.started` (what it was asked: an agent's name, a prompt). */
  input?: Json;
}

/** The code of a nested run that ended because its body threw. */
export const NESTED_RUN_FAILED = "nested_run_failed";

/** What the claimed run's context and its nested runs' share: the lease's fate and the session's stream. */
interface Shared {
  lost: boolean;
  watcher: AbortController | undefined;
  watchFailed: boolean;
  closed: boolean;
  /** The claimed run's context and its nested runs', parents first. */
  family: RunContext[];
}

const HISTORY_PAGE = 1000;
const CLOSE_TRIES = 5;
/** With the session's stream followed, the journal is read anyway after this long without a change. */
const QUIET_READ_MS = 15_000;
const CLOSING_MESSAGES: Record<string, string> = {
  [STOPPED]: STOPPED_MESSAGE,
  [RUNTIME_LOST]: "the agent runtime running this call was lost",
};

/**
 * A claimed run, as its handler sees it (made by the `Runtime`): the claim,
 * the journal, appends under the lease, the stop and lost signals, and
 * steps that write the protocol's events — {@link say}, {@link think},
 * {@link tool}, {@link clientTool}, {@link approve}, {@link progress},
 * {@link setState} / {@link patchState}, {@link finish}, {@link cancel},
 * {@link fail} — replayed by a later holder (see the module documentation).
 *
 * ```ts
 * const handler = async (ctx: RunContext) => {
 *   await ctx.say(model.stream(prompt)); // an AsyncIterable<string>
 *   const { decision } = await ctx.approve("Delete the files?");
 *   if (decision === "approve") await ctx.tool("fs.delete", { path: "/tmp/x" }, remove);
 *   await ctx.finish({ usage: { inputTokens: 120, outputTokens: 48 } });
 * };
 * ```
 */
export class RunContext {
  /** The claim: the run, its session, the cursor, the lease. */
  readonly claim: Claim;
  /** The client the context appends and reads through. */
  readonly client: NaradClient;
  /** Aborted when the run is asked to stop (reason `"stop"`) or the lease is lost (`"lost"`). */
  readonly signal: AbortSignal;

  private readonly controller = new AbortController();
  /** Aborted when the lease is lost: an append still being tried again stops then. */
  private readonly leaseGone: AbortController;
  private readonly state: Journal;
  private readonly writing: Mutex;
  private readonly shared: Shared;
  /** The run this context writes: the claimed run, or a nested one. */
  private readonly ownRunId: string;
  /** The context of the run this one is nested in. */
  readonly parent: RunContext | undefined;
  private readonly host: StreamHost;
  private readonly deltaWindowMs: number;
  private readonly deltaChars: number;
  private readonly pollIntervalMs: number;
  private readonly releaseWhenWaiting: boolean;
  private stopFlag = false;
  private endedHere = false;
  private eventsMade = 0;
  private steps = 0;
  /** Streams opened and not completed, in the order they opened. */
  private open: TextStream[] = [];
  private current: TextStream | undefined;
  /** The sessionSequence through which `history()` read (or appends wrote). */
  private readThrough: number;
  private readonly waiters: Set<() => void>;
  private readonly revisions: Map<string, number>;

  /**
   * The context of `claim` (made by the `Runtime`); `nestedIn` is for
   * {@link nested}: the context of nested run `runId` of `parent`, sharing
   * its client, lease, journal and write lock.
   */
  constructor(client: NaradClient, claim: Claim, options: RunContextOptions = {}, nestedIn?: { parent: RunContext; runId: string }) {
    this.client = client;
    this.claim = claim;
    this.signal = this.controller.signal;
    const parent = nestedIn?.parent;
    this.parent = parent;
    this.ownRunId = nestedIn?.runId ?? claim.runId;
    this.state = parent?.state ?? new Journal(claim.runId);
    this.writing = parent?.writing ?? new Mutex();
    this.leaseGone = parent?.leaseGone ?? new AbortController();
    this.waiters = parent?.waiters ?? new Set();
    this.revisions = parent?.revisions ?? new Map();
    this.shared = parent?.shared ?? { lost: false, watcher: undefined, watchFailed: false, closed: false, family: [] };
    this.shared.family.push(this);
    this.readThrough = claim.cursor;
    this.deltaWindowMs = options.deltaWindowMs ?? 50;
    this.deltaChars = options.deltaChars ?? 256;
    this.pollIntervalMs = options.pollIntervalMs ?? 1000;
    this.releaseWhenWaiting = options.releaseWhenWaiting ?? false;
    if (parent === undefined ? claim.stopRequested : parent.stopFlag || this.state.run(this.ownRunId).stopRequested) {
      this._requestStop();
    }
    const self = this;
    this.host = {
      runId: this.ownRunId,
      journal: this.state,
      writing: this.writing,
      deltaWindowMs: this.deltaWindowMs,
      deltaChars: this.deltaChars,
      event: (type, fields) => this.event(type as ProposedType, fields as never),
      appendLocked: (events) => this.appendLocked(events),
      checkRunning: () => this.checkRunning(),
      completeBefore: (stream) => self.completeBefore(stream),
      forget: (stream) => {
        self.open = self.open.filter((s) => s !== stream);
      },
    };
  }

  // --- the claim ------------------------------------------------------------

  /** The run's session. */
  get sessionId(): string {
    return this.claim.sessionId;
  }

  /** The run this context writes: the claimed run (the root of its journal), or a nested run of it ({@link nested}). */
  get runId(): string {
    return this.ownRunId;
  }

  /** This holder's number, from 1; above 1 after lost holders. */
  get attempt(): number {
    return this.claim.attempt;
  }

  /** Why the run was ready: `started`, `event` (its journal moved) or `retry` (a holder was lost). */
  get reason(): string {
    return this.claim.reason;
  }

  /** The lease every append presents. */
  get leaseId(): string {
    return this.claim.lease.leaseId;
  }

  /** The run's `run.started` (once the journal was read: the runtime reads it before the handler runs). */
  get started(): JournalEvent | undefined {
    return this.state.run(this.runId).started;
  }

  /** The `input` of the run's start (undefined when it had none). */
  get input(): unknown {
    return this.started?.["input"];
  }

  /** The client executor the run is bound to, if any (for {@link clientTool}). */
  get clientExecutorId(): string | undefined {
    const executor = this.started?.["clientExecutorId"];
    return typeof executor === "string" ? executor : undefined;
  }

  // --- signals --------------------------------------------------------------

  /** Whether the run was asked to stop: close its work and end it (`run.cancelled`). */
  stopRequested(): boolean {
    return this.stopFlag;
  }

  /** Whether the lease was lost: nothing more may be appended. */
  lost(): boolean {
    return this.shared.lost;
  }

  /** Whether the run has ended (its terminal is in the journal, or was appended). */
  get ended(): boolean {
    return this.endedHere || this.state.run(this.runId).terminal !== undefined;
  }

  /** Marks the run asked to stop and aborts {@link signal} (the runtime calls it on a stop). */
  _requestStop(): void {
    if (!this.stopFlag) {
      this.stopFlag = true;
      this.controller.abort("stop");
      this.notify();
    }
    for (const ctx of this.shared.family) {
      if (ctx.parent === this) {
        ctx._requestStop();
      }
    }
  }

  /** Marks the lease lost and aborts {@link signal} (the runtime calls it on a 409 NRD-0501). */
  _leaseRefused(): void {
    if (this.ended || this.shared.lost) {
      return;
    }
    this.shared.lost = true;
    for (const ctx of this.shared.family) {
      ctx.controller.abort("lost");
    }
    this.leaseGone.abort(new LeaseLost(this.runId));
    this.notify();
  }

  /** Throws when no new work may start: `LeaseLost` once the lease is lost, `RunStopped` after a stop. */
  checkRunning(): void {
    if (this.shared.lost) {
      throw new LeaseLost(this.runId);
    }
    if (this.stopFlag) {
      throw new RunStopped(this.runId);
    }
  }

  // --- reading --------------------------------------------------------------

  /** The run journal's events read or written so far, in run-tree order. */
  get journal(): readonly JournalEvent[] {
    return this.state.events;
  }

  /** The sessionSequence through which the run's events (and what `history()` gave) were read. */
  get handledThrough(): number {
    return Math.max(this.readThrough, this.state.sessionThrough);
  }

  /** Reads what is new in the run's journal (`?rootRunId=&afterSequence=`); answers the new events. */
  async sync(): Promise<JournalEvent[]> {
    const folded: JournalEvent[] = [];
    for (;;) {
      const page = await this.client.history(this.sessionId, {
        rootRunId: this.state.root,
        afterSequence: this.state.through,
        limit: HISTORY_PAGE,
      });
      for (const event of page.events) {
        this.state.add(event as JournalEvent);
      }
      const before = this.state.through;
      folded.push(...this.observeFolded());
      if (page.nextSequence === undefined || this.state.through === before) {
        return folded;
      }
    }
  }

  /**
   * The session's events after the claim's cursor and after what this
   * context read or wrote since: what is new to this holder (every run's).
   */
  async *history(): AsyncGenerator<AuthorityEvent> {
    for await (const event of this.client.allHistory(this.sessionId, { afterSessionSequence: this.readThrough })) {
      this.readThrough = Math.max(this.readThrough, event.sessionSequence);
      this.state.add(event as JournalEvent);
      this.observeFolded();
      yield event;
    }
  }

  // --- writing --------------------------------------------------------------

  /**
   * A proposed event of this run: `protocolVersion`, `type`, a new
   * `eventId`, `rootRunId` and `runId`, then `fields` (which win, e.g. a
   * nested run's `runId`). Typed by the event's type:
   * `ctx.event("message.text.delta", { messageId, delta })`.
   */
  event<T extends ProposedType>(type: T, fields: EventFields<T>): Proposed<T> {
    return runEvent({ rootRunId: this.state.root, runId: this.runId, eventId: () => this.nextEventId() }, type, fields);
  }

  /**
   * Appends a batch atomically under the run's lease. While the server
   * does not answer (no connection, a lost answer, 502–504, a restart),
   * the client sends the same batch again — to its other servers, then
   * after a backoff, within its `retry.maxElapsedMs` (30 s by default; see
   * `NaradClient.send`); the eventIds make that safe — and stops once the
   * lease is lost. Throws `LeaseLost` when the lease is not current (and
   * marks the context lost), `NaradError` with the rule when the journal
   * refuses an event, `UnavailableError` when no server answered within
   * the client's budget. An open message is not completed first: use the
   * steps, or {@link finishMessage}, to keep the order you want.
   */
  append(events: ProposedEvent[]): Promise<Appended> {
    return this.writing.run(() => this.appendLocked(events));
  }

  private nextEventId(): string {
    this.eventsMade += 1;
    return ident(`${this.runId}@${this.attempt}`, this.leaseId.replace(/-/g, "").slice(0, 12), this.eventsMade);
  }

  private async appendLocked(events: ProposedEvent[]): Promise<Appended> {
    if (this.shared.lost) {
      throw new LeaseLost(this.runId);
    }
    if (events.length === 0) {
      return { duplicate: false, events: [] };
    }
    let appended: Appended;
    try {
      // The client's retry policy is the only one: an append is safe to
      // send again, so NaradClient.send tries it through restarts and
      // failover, within the client's budget. This is appendEvents with a
      // signal, which stops those tries once the lease is lost.
      appended = await this.client.request<Appended>("POST", `/v1/sessions/${encodeURIComponent(this.sessionId)}/events`, {
        body: { events },
        headers: { "Narad-Runtime-Lease": this.leaseId },
        signal: this.leaseGone.signal,
      });
    } catch (e) {
      if (e instanceof NaradError && e.status === 409 && e.code === LEASE_NOT_CURRENT) {
        this._leaseRefused();
        throw new LeaseLost(this.runId, e);
      }
      if (this.leaseGone.signal.aborted && !(e instanceof LeaseLost)) {
        throw new LeaseLost(this.runId);
      }
      throw e;
    }
    const byId = new Map<string, ProposedEvent>(events.map((e) => [e.eventId, e]));
    for (const got of appended.events) {
      const proposed = byId.get(got.eventId);
      this.readThrough = Math.max(this.readThrough, got.sessionSequence);
      if (proposed !== undefined && got.sequence !== undefined) {
        this.state.add({ ...proposed, sequence: got.sequence, sessionSequence: got.sessionSequence });
      }
    }
    if (events.some((e) => TERMINALS.has(e.type) && e.runId === this.runId)) {
      this.endedHere = true;
    }
    this.observeFolded();
    if (this.state.hasGap) {
      // Someone else wrote to the journal between our reads and this
      // append: read it, so that the next step sees the journal whole.
      try {
        await this.sync();
      } catch {
        // The next read mends it.
      }
    }
    return appended;
  }

  // --- steps ----------------------------------------------------------------

  private nextStep(): number {
    this.steps += 1;
    return this.steps;
  }

  /** The next step's position, or its key when the caller names it (see {@link StepOptions}). */
  private step(key: string | undefined): number | string {
    if (key === undefined) {
      return this.nextStep();
    }
    if (key === "" || /^[0-9]+$/.test(key)) {
      throw new RangeError(`a step key is a non-empty string, not all digits: ${JSON.stringify(key)}`);
    }
    return key;
  }

  /** Throws {@link ReplayDiverged} when the journal's call of this step is another tool's. */
  private sameTool(earlier: string[], name: string): void {
    const last = earlier[earlier.length - 1];
    if (last === undefined) {
      return;
    }
    const recorded = this.state.calls.get(last)?.["toolName"];
    if (recorded !== name) {
      throw new ReplayDiverged(last, `run ${this.runId}: step ${last} is a call of ${JSON.stringify(recorded)} in the journal, and the replay calls ${JSON.stringify(name)}`);
    }
  }

  /**
   * Opens the next message (`assistant` or `system`) as a step of its own;
   * its first use completes the message opened before it. `ctx.say` opens
   * one when none is open. With a `key`, the message is that step's (see
   * {@link StepOptions}).
   */
  message(role: "assistant" | "system" = "assistant", options: StepOptions = {}): TextStream {
    // A step is a position or a key: the stream derives its ids from either.
    const stream = new TextStream(this.host, this.step(options.key), "message", role);
    this.open.push(stream);
    this.current = stream;
    return stream;
  }

  /**
   * Says `text` in the current assistant message, opening one if needed:
   * a string, or the chunks of an (async) iterable as they come (a model's
   * stream). Deltas are coalesced (see {@link TextStream}). Throws
   * `RunStopped` once the run is asked to stop, so that a long answer ends
   * there. Answers the text said.
   */
  async say(text: string | Iterable<string> | AsyncIterable<string>): Promise<string> {
    let said = "";
    for await (const chunk of chunks(text)) {
      let stream = this.current;
      if (stream === undefined || stream.completed || stream.kind !== "message") {
        this.checkRunning();
        stream = this.message();
      }
      await stream.say(chunk);
      said += chunk;
    }
    return said;
  }

  /** Completes the open message(s): sends what is buffered and `message.text.completed`. */
  async finishMessage(): Promise<void> {
    for (const stream of [...this.open]) {
      await stream.complete();
    }
  }

  private async completeBefore(stream: TextStream): Promise<void> {
    for (let first = this.open[0]; first !== undefined && first !== stream; first = this.open[0]) {
      await first.complete();
    }
  }

  /**
   * Records reasoning (`reasoning.started` / `.delta` / `.completed`): a
   * string, or an (async) iterable's chunks streamed as they come. A block
   * the journal holds completed is not recorded again; one a lost holder
   * left half-way is carried on. With a `key`, the block is that step's.
   */
  async think(text: string | Iterable<string> | AsyncIterable<string>, options: StepOptions = {}): Promise<void> {
    const stream = await this.reasoning(options);
    for await (const chunk of chunks(text)) {
      await stream.say(chunk);
    }
    await stream.complete();
  }

  /**
   * Opens a reasoning block (`reasoning.*`) to stream into as its text
   * comes ({@link TextStream.say}, then {@link TextStream.complete}):
   * what {@link think} does with a whole text. Completes the open message
   * first. With a `key`, the block is that step's.
   */
  async reasoning(options: StepOptions = {}): Promise<TextStream> {
    await this.finishMessage();
    this.checkRunning();
    // A step is a position or a key: the stream derives its ids from either.
    const stream = new TextStream(this.host, this.step(options.key), "reasoning");
    this.open.push(stream);
    return stream;
  }

  /**
   * Calls backend tool `name`: `tool.call.started`, `fn(args)`, then
   * `tool.call.finished`. Answers what `fn` returned (or resolved to),
   * which must be JSON (undefined is recorded as null). When `fn` throws,
   * the call finishes `error` (code `tool_error`, the error's message) and
   * `ToolFailed` is thrown with the error as its cause. On replay a
   * finished call answers its recorded response without calling `fn`; a
   * call a lost holder left open is closed (`cancelled`/`runtime_lost`,
   * unless the server did) and runs again under the next toolCallId. With
   * a `key` (a model's toolCallId), the call is that step's
   * (`{runId}.{key}.tool`); a journal that holds a call of another tool
   * under the step's id throws {@link ReplayDiverged}.
   */
  async tool<A extends Record<string, unknown>, R>(
    name: string,
    args: A,
    fn: (args: A, call: ToolCall) => R | Promise<R>,
    options: StepOptions = {},
  ): Promise<R> {
    await this.finishMessage();
    this.checkRunning();
    const base = ident(this.runId, this.step(options.key), "tool");
    const earlier = this.state.stepIds(base, this.state.calls.keys());
    this.sameTool(earlier, name);
    const last = earlier[earlier.length - 1];
    if (last !== undefined) {
      const finished = this.state.finished.get(last);
      if (finished !== undefined && finished["outcome"] !== "cancelled") {
        return result(last, finished) as R;
      }
      if (finished === undefined) {
        // An earlier holder's call nobody will finish: closed first.
        await this.append([this.cancelledCall(this.runId, last, RUNTIME_LOST)]);
      }
    }
    const toolCallId = last !== undefined ? ident(base, earlier.length + 1) : base;
    await this.untilRunning(false);
    await this.append([this.event("tool.call.started", { toolCallId, toolName: name, executor: "backend", args })]);
    let response: R;
    try {
      response = await fn(args, { toolCallId, signal: this.signal });
    } catch (e) {
      const text = (e instanceof Error ? e.message || e.name : String(e)) || "the tool failed";
      const finished = this.event("tool.call.finished", {
        toolCallId,
        outcome: "error",
        response: null,
        code: TOOL_ERROR,
        message: Array.from(text).slice(0, 500).join(""),
      });
      await this.append([finished]);
      throw new ToolFailed(toolCallId, finished, { cause: e });
    }
    await this.append([
      this.event("tool.call.finished", { toolCallId, outcome: "success", response: response === undefined ? null : response }),
    ]);
    return response;
  }

  /**
   * Calls tool `name` on the run's client executor and waits for its
   * result: appends `tool.call.started` with `executor: "client"` (the
   * server hands it to the executor), then waits — following the session,
   * the lease kept alive — until the journal holds its
   * `tool.call.finished`: answers its response, throws `ToolFailed` for
   * `error`/`cancelled`, or `RunStopped` when the run is asked to stop
   * meanwhile (the run's closing then cancels the call). With a `key`, the
   * call is that step's (`{runId}.{key}.client`; see {@link tool}).
   */
  async clientTool<R = unknown>(name: string, args: Record<string, unknown> = {}, options: StepOptions = {}): Promise<R> {
    await this.finishMessage();
    this.checkRunning();
    if (this.clientExecutorId === undefined) {
      throw new Error(`run ${this.runId} is bound to no client executor`);
    }
    const base = ident(this.runId, this.step(options.key), "client");
    const earlier = this.state.stepIds(base, this.state.calls.keys());
    this.sameTool(earlier, name);
    let toolCallId = earlier[earlier.length - 1];
    if (toolCallId === undefined) {
      toolCallId = base;
      await this.untilRunning(false);
      await this.append([this.event("tool.call.started", { toolCallId, toolName: name, executor: "client", args })]);
    }
    const id = toolCallId;
    const finished = await this.waitFor(() => this.state.finished.get(id));
    if (finished["outcome"] === "cancelled" && this.stopFlag) {
      throw new RunStopped(this.runId);
    }
    return result(id, finished) as R;
  }

  /**
   * Asks a person: `interrupt.requested` and `run.paused` (one batch, as
   * §7.6 wants them consecutive), waits — following the session, the lease
   * kept alive — for `interrupt.resolved` (`resolve-interrupt`), appends
   * `run.resumed`, and answers the decision (one of `actions`, or
   * `expired`) with who decided. Throws `RunStopped` when the run is asked
   * to stop meanwhile (the run's closing then resolves the interrupt
   * `expired`). With a `key`, the interrupt is that step's
   * (`{runId}.{key}.approval`): asked once, its decision answered to every replay.
   */
  async approve(message: string, options: ApproveOptions = {}): Promise<Approval> {
    await this.finishMessage();
    this.checkRunning();
    const step = this.step(options.key);
    const interruptId = ident(this.runId, step, "approval");
    const waitId = ident(this.runId, step, "wait");
    if (!this.state.interrupts.has(interruptId)) {
      await this.untilRunning(false);
      const fields: EventFields<"interrupt.requested"> = {
        interruptId,
        waitId,
        kind: options.kind ?? "approval",
        actions: options.actions ?? ["approve", "deny"],
        message,
      };
      if (options.title !== undefined) {
        fields.title = options.title;
      }
      if (options.input !== undefined) {
        fields.input = options.input;
      }
      if (options.expiresAt !== undefined) {
        fields.expiresAt = options.expiresAt instanceof Date ? options.expiresAt.toISOString() : options.expiresAt;
      }
      await this.append([
        this.event("interrupt.requested", fields),
        this.event("run.paused", { waitId, interruptId, reason: options.reason ?? "narad.approval", resumeMode: "command" }),
      ]);
    }
    const resolved = await this.waitFor(() => this.state.resolutions.get(interruptId));
    const pause = this.state.run(this.runId).pause;
    if (pause !== undefined && pause.waitId === waitId) {
      await this.append([this.event("run.resumed", { waitId })]);
    }
    return {
      decision: String(resolved["decision"]),
      actor: resolved["actor"] as Actor | undefined,
      reason: typeof resolved["reason"] === "string" ? resolved["reason"] : undefined,
      members: resolved["members"] as Schemas["defs.memberDecision"][] | undefined,
      interruptId,
      event: resolved,
    };
  }

  /**
   * Records what the run is doing (`progress.recorded`, no lifecycle
   * meaning): a new activity item, or an update of one (`progressId`, e.g.
   * to mark it `completed`). Answers its progressId. Recorded once: a
   * replay of the step writes nothing.
   */
  async progress(label: string, options: ProgressOptions = {}): Promise<string> {
    this.checkRunning();
    const eventId = ident(this.runId, this.step(options.key), "progress");
    const progressId = options.progressId ?? eventId;
    if (!this.state.eventIds.has(eventId)) {
      const fields: EventFields<"progress.recorded"> = {
        eventId,
        progressId,
        label,
        category: options.category ?? "agent.step",
        status: options.status ?? "active",
        privacy: options.privacy ?? "public",
      };
      if (options.detail !== undefined) {
        fields.detail = options.detail;
      }
      await this.append([this.event("progress.recorded", fields)]);
    }
    return progressId;
  }

  /**
   * Runs `body` in a nested run of this run (§3.3): an agent handed off to,
   * a subgraph, a sub-agent called as a tool. Answers what `body` answers.
   *
   * First `run.started` with `parentRunId` (this run), `clientExecutorId`
   * (this run's, recorded explicitly as §3.3 wants) and `input`; `body` gets
   * the nested run's context, whose steps write into the nested run under
   * the same lease. When `body` returns, the nested run ends `run.finished`
   * (unless `body` ended it itself, e.g. `child.finish({ usage })`); when it
   * throws `RunStopped`, `run.cancelled`; anything else, `run.error` (code
   * `replay_diverged`, a `ToolFailed`'s code, else `nested_run_failed`), and
   * the error goes on to the caller. A stop of this run reaches the nested
   * one; a stop of the nested run alone cancels it and throws `RunStopped`
   * from `nested`, which the caller may catch.
   *
   * The nested run's id is `{runId}.{step}.run` (a `key` names the step
   * instead of its position): on replay a nested run already in the
   * journal is entered again without a second `run.started`, its steps
   * found in the journal as any others, and one that ended is not ended twice.
   */
  async nested<T>(body: (child: RunContext) => Promise<T>, options: NestedOptions = {}): Promise<T> {
    await this.finishMessage();
    this.checkRunning();
    const runId = ident(this.runId, this.step(options.key), "run");
    if (this.state.run(runId).started === undefined) {
      await this.untilRunning(false);
      const fields: EventFields<"run.started"> = { runId, parentRunId: this.runId };
      if (this.clientExecutorId !== undefined) {
        fields.clientExecutorId = this.clientExecutorId;
      }
      if (options.input !== undefined) {
        fields.input = options.input;
      }
      await this.append([this.event("run.started", fields)]);
    }
    const child = new RunContext(
      this.client,
      this.claim,
      { deltaWindowMs: this.deltaWindowMs, deltaChars: this.deltaChars, pollIntervalMs: this.pollIntervalMs, releaseWhenWaiting: this.releaseWhenWaiting },
      { parent: this, runId },
    );
    try {
      const answer = await body(child);
      await child.finish();
      return answer;
    } catch (e) {
      if (e instanceof RunWaiting || e instanceof LeaseLost) {
        if (!child.lost()) {
          await child.finishMessage().catch(() => undefined);
        }
      } else if (!child.ended && !child.lost()) {
        await (e instanceof RunStopped ? child.cancel() : child.failWith(e));
      }
      throw e;
    } finally {
      child.abandonTimers();
      this.shared.family.splice(this.shared.family.indexOf(child), 1);
    }
  }

  /** Ends this run `run.error` for `error` (see {@link nested}); a journal that refuses it leaves the run to the caller's closing. */
  private async failWith(error: unknown): Promise<void> {
    const code =
      error instanceof ReplayDiverged ? REPLAY_DIVERGED : error instanceof ToolFailed ? (error.code ?? TOOL_ERROR) : NESTED_RUN_FAILED;
    const text = (error instanceof Error ? error.message || error.name : String(error)) || "the nested run failed";
    try {
      await this.fail(code, Array.from(text).slice(0, 500).join(""));
    } catch (e) {
      if (!(e instanceof NaradError)) {
        throw e;
      }
    }
  }

  /**
   * Replaces a state document (`state.snapshot`, or `ui.state.snapshot`
   * with `ui`) of scope `scope` (default `session`) at its next revision;
   * answers that revision. Written once: a replay of the step writes nothing.
   */
  setState(state: Json, options: DocumentOptions = {}): Promise<number> {
    return this.document(options, (revision) => ({
      type: options.ui ? "ui.state.snapshot" : "state.snapshot",
      fields: { revision: revision + 1, state },
    }));
  }

  /**
   * Changes a state document (`state.delta`, or `ui.state.delta` with
   * `ui`) of scope `scope` (default `session`) by an RFC 6902 patch, on
   * its current revision (read from the server; a concurrent change is read
   * and the patch tried again on it); answers the new revision. Written
   * once: a replay of the step writes nothing.
   */
  patchState(patch: PatchOperation[], options: DocumentOptions = {}): Promise<number> {
    return this.document(options, (revision) => ({
      type: options.ui ? "ui.state.delta" : "state.delta",
      fields: { baseRevision: revision, revision: revision + 1, patch },
    }));
  }

  private async document(
    options: DocumentOptions,
    make: (revision: number) => { type: "state.snapshot" | "ui.state.snapshot" | "state.delta" | "ui.state.delta"; fields: Record<string, unknown> },
  ): Promise<number> {
    await this.finishMessage();
    this.checkRunning();
    const scope = options.scope ?? "session";
    const family = options.ui ? "ui" : "state";
    const eventId = ident(this.runId, this.step(options.key), "state");
    const written = this.state.eventIds.get(eventId);
    if (written !== undefined) {
      return Number(written["revision"]);
    }
    const key = `${family}:${scope}`;
    for (let attempt = 1; ; attempt++) {
      const revision = this.revisions.get(key) ?? (await this.readRevision(family, scope));
      const { type, fields } = make(revision);
      try {
        await this.append([this.event(type, { ...fields, scope, eventId } as never)]);
        this.revisions.set(key, revision + 1);
        return revision + 1;
      } catch (e) {
        const moved = e instanceof NaradError && e.status === 409 && (e.body?.rule === "state.revision.base" || e.body?.rule === "state.revision.regress");
        this.revisions.delete(key);
        if (!moved || attempt >= CLOSE_TRIES) {
          throw e;
        }
      }
    }
  }

  private async readRevision(family: "state" | "ui", scope: string): Promise<number> {
    const documents = await this.client.request<Schemas["SessionDocuments"]>(
      "GET",
      `/v1/sessions/${encodeURIComponent(this.sessionId)}/documents`,
    );
    return documents[family].find((d) => d.scope === scope)?.revision ?? 0;
  }

  /**
   * Ends the run with `run.finished` (`usage`, `artifactIds`), completing
   * the open message in the same batch. Does nothing once the run has ended.
   */
  async finish(fields: { usage?: Usage; artifactIds?: string[] } = {}): Promise<void> {
    if (this.ended) {
      return;
    }
    await this.untilRunning(true);
    this.abandonTimers();
    await this.writing.run(async () => {
      const [batches, events] = this.messageBatches();
      // A nested run an earlier holder left open (no context of this
      // holder writes in it or in what is nested in it) is closed first.
      const held = new Set(this.shared.family.flatMap((ctx) => this.state.lineage(ctx.runId)));
      const left = this.state.openRunsDeepestFirst(this.runId).filter((r) => !held.has(r.runId));
      events.push(...this.closingOf(left, "run.cancelled", RUNTIME_LOST, "the agent runtime running this nested run was lost", undefined, new Set()));
      events.push(this.event("run.finished", fields));
      await this.appendLocked(events);
      sentBatches(batches);
    });
  }

  /**
   * Closes the run's open work and ends it with `run.cancelled` (default
   * code `stopped`). In one batch: the open messages completed (with what
   * was said), open tool calls finished `cancelled`, open interrupts
   * resolved `expired`, the open pause resumed, nested runs first, then the
   * run (with `usage`). What the runtime does when a handler leaves a
   * stopped run open.
   */
  cancel(options: { code?: string; message?: string; usage?: Usage } = {}): Promise<void> {
    return this.close("run.cancelled", options.code ?? STOPPED, options.message ?? STOPPED_MESSAGE, options.usage);
  }

  /**
   * Closes the run's open work (as {@link cancel}) and ends it with
   * `run.error` (`code`, a user-safe `message`, partial `usage`). A backend
   * may close a client tool call only under a stop: with one open and no
   * stop, the journal refuses this.
   */
  fail(code: string, message: string, options: { usage?: Usage } = {}): Promise<void> {
    return this.close("run.error", code, message, options.usage);
  }

  // --- waiting and closing --------------------------------------------------

  /**
   * Waits until `found` answers something: follows the session's stream
   * (from what the journal holds) and folds what comes; throws when the
   * run is asked to stop or the lease is lost meanwhile, and `RunWaiting`
   * at once when runs are given back while they wait (`releaseWhenWaiting`).
   */
  private async waitFor<T>(found: () => T | undefined): Promise<T> {
    let delay = Math.min(100, this.pollIntervalMs);
    for (;;) {
      const got = found();
      if (got !== undefined) {
        return got;
      }
      this.checkRunning();
      if (this.releaseWhenWaiting) {
        throw new RunWaiting(this.runId);
      }
      this.watch();
      const changed = await this.nextChange(this.shared.watchFailed ? delay : QUIET_READ_MS);
      if (!changed || this.shared.watchFailed) {
        await this.syncPatiently();
        delay = Math.min(delay * 1.5, this.pollIntervalMs);
      }
    }
  }

  /**
   * Waits while the server holds the run paused (`resumeMode: automatic`,
   * e.g. its client executor away): no new work, and no terminal, until it
   * resumes it.
   */
  private async untilRunning(forTerminal: boolean): Promise<void> {
    let delay = Math.min(100, this.pollIntervalMs);
    for (;;) {
      const pause = this.state.run(this.runId).pause;
      if (pause === undefined || pause.resumeMode !== "automatic") {
        return;
      }
      if (this.shared.lost || (this.stopFlag && !forTerminal)) {
        this.checkRunning();
      }
      this.watch();
      const changed = await this.nextChange(this.shared.watchFailed ? delay : QUIET_READ_MS);
      if (!changed || this.shared.watchFailed) {
        await this.syncPatiently();
        delay = Math.min(delay * 1.5, this.pollIntervalMs);
      }
    }
  }

  /** Starts following the session's stream (once): what it brings is folded into the journal. */
  private watch(): void {
    const shared = this.shared;
    if (shared.watcher !== undefined || shared.closed) {
      return;
    }
    const watcher = new AbortController();
    shared.watcher = watcher;
    shared.watchFailed = false;
    void (async () => {
      try {
        for await (const frame of follow(this.client, {
          sessionId: this.sessionId,
          afterSessionSequence: this.state.sessionThrough,
          signal: watcher.signal,
        })) {
          if (frame.kind === "authority" && frame.event.rootRunId === this.state.root) {
            this.state.add(frame.event as JournalEvent);
            this.observeFolded();
          }
        }
      } catch {
        // Refused for good (a token without the stream, say): the waits
        // read the journal instead.
        if (!watcher.signal.aborted) {
          shared.watchFailed = true;
        }
      } finally {
        if (shared.watcher === watcher && !watcher.signal.aborted) {
          shared.watchFailed = true;
        }
        this.notify();
      }
    })();
  }

  /** Resolves true when the journal folded something new, false after `ms`; at once on a stop or a lost lease. */
  private nextChange(ms: number): Promise<boolean> {
    return new Promise((resolve) => {
      const finish = (changed: boolean) => {
        clearTimeout(timer);
        this.waiters.delete(wake);
        this.signal.removeEventListener("abort", wake);
        resolve(changed);
      };
      const wake = () => finish(true);
      const timer = setTimeout(() => finish(false), ms);
      this.waiters.add(wake);
      this.signal.addEventListener("abort", wake);
    });
  }

  private notify(): void {
    for (const wake of [...this.waiters]) {
      wake();
    }
  }

  private observeFolded(): JournalEvent[] {
    const folded = this.state.advance();
    // Parents come before their nested runs in the family: a stop of a run
    // reaches what is nested in it.
    for (const ctx of this.shared.family) {
      if (this.state.run(ctx.runId).stopRequested || ctx.parent?.stopFlag === true) {
        ctx._requestStop();
      }
    }
    if (folded.length > 0) {
      this.notify();
    }
    return folded;
  }

  /** Reads the journal; a server that does not answer is asked again next time. */
  private async syncPatiently(): Promise<void> {
    try {
      await this.sync();
    } catch (e) {
      if (!(e instanceof NaradError) || !e.retryable) {
        throw e;
      }
    }
  }

  private cancelledCall(runId: string, toolCallId: string, code: string): ProposedEvent {
    return this.event("tool.call.finished", {
      runId,
      toolCallId,
      outcome: "cancelled",
      response: null,
      code,
      message: CLOSING_MESSAGES[code] ?? code,
    });
  }

  private messageBatches(): [[TextStream, StreamBatch][], ProposedEvent[]] {
    const batches: [TextStream, StreamBatch][] = this.open.map((stream) => [stream, stream.batch(true)]);
    return [batches, batches.flatMap(([, batch]) => batch.events)];
  }

  /** The events that close the journal's open runs (see {@link cancel}), with the open streams' batches. */
  private closingEvents(terminal: "run.cancelled" | "run.error", code: string, message: string, usage: Usage | undefined) {
    const [batches, events] = this.messageBatches();
    const ours = new Set(batches.map(([stream]) => stream.id));
    const openRuns = this.state.openRunsDeepestFirst(this.runId);
    events.push(...this.closingOf(openRuns, terminal, code, message, usage, ours));
    return { batches, events };
  }

  /**
   * The events that close `openRuns` (deepest first): their open streams
   * (but `ours`, sent with their batches), calls, interrupts and pauses,
   * then each run's `terminal` (with `usage` on this run's).
   */
  private closingOf(
    openRuns: RunState[],
    terminal: "run.cancelled" | "run.error",
    code: string,
    message: string,
    usage: Usage | undefined,
    ours: Set<string>,
  ): ProposedEvent[] {
    const events: ProposedEvent[] = [];
    const openIds = new Set(openRuns.map((r) => r.runId));
    for (const stream of openStreams(this.state, openIds)) {
      if (!ours.has(stream.id)) {
        events.push(
          stream.kind === "message"
            ? this.event("message.text.completed", { runId: stream.runId, messageId: stream.id })
            : this.event("reasoning.completed", { runId: stream.runId, reasoningId: stream.id }),
        );
      }
    }
    for (const run of openRuns) {
      for (const toolCallId of run.openCalls.keys()) {
        events.push(this.cancelledCall(run.runId, toolCallId, code));
      }
      for (const [interruptId, waitId] of run.openInterrupts) {
        events.push(
          this.event("interrupt.resolved", { runId: run.runId, interruptId, waitId, decision: "expired", reason: code }),
        );
      }
      if (run.pause !== undefined) {
        events.push(this.event("run.resumed", { runId: run.runId, waitId: run.pause.waitId }));
      }
      const fields: EventFields<"run.error"> = { runId: run.runId, code, message };
      if (usage !== undefined && run.runId === this.runId) {
        fields.usage = usage;
      }
      events.push(this.event(terminal, fields));
    }
    return events;
  }

  private async close(terminal: "run.cancelled" | "run.error", code: string, message: string, usage: Usage | undefined): Promise<void> {
    this.abandonTimers();
    for (let attempt = 0; attempt < CLOSE_TRIES; attempt++) {
      if (this.ended) {
        return;
      }
      const refused = await this.writing.run(async () => {
        const { batches, events } = this.closingEvents(terminal, code, message, usage);
        try {
          await this.appendLocked(events);
        } catch (e) {
          // The journal moved meanwhile (an executor's finish, the
          // server's own closing of a client call): read and try again.
          if (e instanceof LeaseLost || !(e instanceof NaradError) || e.status !== 409 || attempt + 1 === CLOSE_TRIES) {
            throw e;
          }
          return e;
        }
        sentBatches(batches);
        this.endedHere = true;
        return undefined;
      });
      if (refused === undefined) {
        return;
      }
      await this.sync();
    }
  }

  /** Completes the open messages (the runtime does it when the handler returns). */
  async _settle(): Promise<void> {
    if (!this.shared.lost) {
      await this.finishMessage();
    }
  }

  /** Ends the context's background work: coalescing timers and the session's stream (the runtime does it). */
  _close(): void {
    this.shared.closed = true;
    for (const ctx of this.shared.family) {
      ctx.abandonTimers();
    }
    this.shared.watcher?.abort();
    this.notify();
  }

  private abandonTimers(): void {
    for (const stream of this.open) {
      stream.cancelTimer();
    }
  }
}

function sentBatches(batches: [TextStream, StreamBatch][]): void {
  for (const [stream, batch] of batches) {
    stream.sentBatch(batch);
  }
}

/** The response of a finished call, or `ToolFailed`. */
function result(toolCallId: string, finished: JournalEvent): unknown {
  if (finished["outcome"] === "success") {
    return finished["response"];
  }
  throw new ToolFailed(toolCallId, finished);
}

/** The chunks of a string (itself), or of an (async) iterable of strings. */
async function* chunks(text: string | Iterable<string> | AsyncIterable<string>): AsyncGenerator<string> {
  if (typeof text === "string") {
    yield text;
    return;
  }
  yield* text;
}
