/**
 * The run journal of one root run as an agent runtime has read and
 * written it: what its runs, tool calls, interrupts and streams are now,
 * so that a step can tell what an earlier holder of the run already did.
 * The same fold as the Python SDK's `narad.runtime._Journal`.
 */

/** An event of a run journal, as read from history or as appended (with its sequences). */
export type JournalEvent = { readonly type: string; readonly [field: string]: unknown };

/** The event types that end a run. */
export const TERMINALS: ReadonlySet<string> = new Set(["run.finished", "run.error", "run.cancelled"]);

/** One run of the journal, as its events left it. */
export interface RunState {
  /** The run. */
  readonly runId: string;
  /** Its parent, for a nested run. */
  parentRunId: string | undefined;
  /** Its `run.started`, once read. */
  started: JournalEvent | undefined;
  /** The type of its terminal, once it ended. */
  terminal: string | undefined;
  /** A `run.stop.requested` names it. */
  stopRequested: boolean;
  /** The open pause: its waitId, interruptId and resumeMode. */
  pause: { waitId: string; interruptId: string | undefined; resumeMode: string } | undefined;
  /** Open tool calls: toolCallId → executor. */
  readonly openCalls: Map<string, string>;
  /** Open interrupts: interruptId → waitId. */
  readonly openInterrupts: Map<string, string>;
}

/** A streamed message or reasoning: its run, the text so far, whether it completed. */
export interface StreamState {
  /** The run it belongs to. */
  readonly runId: string;
  /** Its text so far. */
  text: string;
  /** Its `*.completed` was read. */
  completed: boolean;
}

/**
 * The run journal of one root run. Events are folded in run-tree
 * `sequence` order only: one that arrives past a gap waits until the gap
 * is read.
 */
export class Journal {
  /** The run-tree sequence through which events were folded. */
  through = 0;
  /** The highest sessionSequence among the folded events. */
  sessionThrough = 0;
  /** The folded events, in order. */
  readonly events: JournalEvent[] = [];
  /** The eventIds of the folded events. */
  readonly eventIds = new Map<string, JournalEvent>();
  /** Runs by id. */
  readonly runs = new Map<string, RunState>();
  /** `tool.call.started` by toolCallId. */
  readonly calls = new Map<string, JournalEvent>();
  /** `tool.call.finished` by toolCallId. */
  readonly finished = new Map<string, JournalEvent>();
  /** `interrupt.requested` by interruptId. */
  readonly interrupts = new Map<string, JournalEvent>();
  /** `interrupt.resolved` by interruptId. */
  readonly resolutions = new Map<string, JournalEvent>();
  /** Streamed messages by messageId. */
  readonly messages = new Map<string, StreamState>();
  /** Reasoning streams by reasoningId. */
  readonly reasoning = new Map<string, StreamState>();
  private readonly pending = new Map<number, JournalEvent>();

  /** The journal of root run `root`. */
  constructor(readonly root: string) {}

  /** Takes an event of the session: kept when it belongs to this journal and is not folded yet. */
  add(event: JournalEvent): void {
    const sequence = event["sequence"];
    if (event["rootRunId"] !== this.root || typeof sequence !== "number") {
      return;
    }
    if (sequence > this.through) {
      this.pending.set(sequence, event);
    }
  }

  /** Folds what is contiguous; answers the events folded. */
  advance(): JournalEvent[] {
    const folded: JournalEvent[] = [];
    for (let next = this.pending.get(this.through + 1); next !== undefined; next = this.pending.get(this.through + 1)) {
      this.pending.delete(this.through + 1);
      this.through += 1;
      const sessionSequence = next["sessionSequence"];
      if (typeof sessionSequence === "number") {
        this.sessionThrough = Math.max(this.sessionThrough, sessionSequence);
      }
      this.fold(next);
      this.events.push(next);
      const eventId = next["eventId"];
      if (typeof eventId === "string") {
        this.eventIds.set(eventId, next);
      }
      folded.push(next);
    }
    return folded;
  }

  /** Whether events past an unread one wait. */
  get hasGap(): boolean {
    return this.pending.size > 0;
  }

  /** The state of run `runId` (an empty one if it never started). */
  run(runId: string): RunState {
    let run = this.runs.get(runId);
    if (run === undefined) {
      run = {
        runId,
        parentRunId: undefined,
        started: undefined,
        terminal: undefined,
        stopRequested: false,
        pause: undefined,
        openCalls: new Map(),
        openInterrupts: new Map(),
      };
      this.runs.set(runId, run);
    }
    return run;
  }

  /** The ids of one step, in the order they were used: `base`, `base.2`, `base.3`, … */
  stepIds(base: string, among: Iterable<string>): string[] {
    const prefix = `${base}.`;
    const serials: [string, number][] = [];
    for (const id of among) {
      if (id === base) {
        serials.push([id, 1]);
      } else if (id.startsWith(prefix) && /^[0-9]+$/.test(id.slice(prefix.length))) {
        serials.push([id, Number(id.slice(prefix.length))]);
      }
    }
    return serials.sort((a, b) => a[1] - b[1]).map(([id]) => id);
  }

  /** The ids of run `runId` and of its ancestors in the journal, the run first. */
  lineage(runId: string): string[] {
    const ids = [runId];
    for (let at = this.runs.get(runId); at?.parentRunId !== undefined && this.runs.has(at.parentRunId); ) {
      ids.push(at.parentRunId);
      at = this.runs.get(at.parentRunId);
    }
    return ids;
  }

  /**
   * The runs of `under`'s tree (`under` and what is nested in it) that
   * started and have not ended, children before parents.
   */
  openRunsDeepestFirst(under: string): RunState[] {
    return [...this.runs.values()]
      .filter((r) => r.started !== undefined && r.terminal === undefined)
      .map((r) => ({ run: r, lineage: this.lineage(r.runId) }))
      .filter(({ lineage }) => lineage.includes(under))
      .sort((a, b) => b.lineage.length - a.lineage.length || (a.run.runId < b.run.runId ? -1 : a.run.runId > b.run.runId ? 1 : 0))
      .map(({ run }) => run);
  }

  private fold(e: JournalEvent): void {
    const str = (field: string): string => String(e[field]);
    const run = this.run(str("runId"));
    switch (e.type) {
      case "run.started":
        run.started = e;
        run.parentRunId = typeof e["parentRunId"] === "string" ? e["parentRunId"] : undefined;
        break;
      case "run.finished":
      case "run.error":
      case "run.cancelled":
        run.terminal = e.type;
        break;
      case "run.stop.requested":
        this.run(typeof e["targetRunId"] === "string" ? e["targetRunId"] : run.runId).stopRequested = true;
        break;
      case "run.paused":
        run.pause = {
          waitId: str("waitId"),
          interruptId: typeof e["interruptId"] === "string" ? e["interruptId"] : undefined,
          resumeMode: str("resumeMode"),
        };
        break;
      case "run.resumed":
        run.pause = undefined;
        break;
      case "tool.call.started":
        this.calls.set(str("toolCallId"), e);
        run.openCalls.set(str("toolCallId"), str("executor"));
        break;
      case "tool.call.finished":
        this.finished.set(str("toolCallId"), e);
        run.openCalls.delete(str("toolCallId"));
        break;
      case "interrupt.requested":
        this.interrupts.set(str("interruptId"), e);
        run.openInterrupts.set(str("interruptId"), str("waitId"));
        break;
      case "interrupt.resolved":
        this.resolutions.set(str("interruptId"), e);
        run.openInterrupts.delete(str("interruptId"));
        break;
      case "message.text.started":
        this.messages.set(str("messageId"), { runId: run.runId, text: "", completed: false });
        break;
      case "reasoning.started":
        this.reasoning.set(str("reasoningId"), { runId: run.runId, text: "", completed: false });
        break;
      case "message.text.delta":
      case "reasoning.delta": {
        const stream = this.stream(e);
        if (stream !== undefined) {
          stream.text += typeof e["delta"] === "string" ? e["delta"] : "";
        }
        break;
      }
      case "message.text.completed":
      case "reasoning.completed": {
        const stream = this.stream(e);
        if (stream !== undefined) {
          stream.completed = true;
        }
        break;
      }
    }
  }

  private stream(e: JournalEvent): StreamState | undefined {
    return e.type.startsWith("message.")
      ? this.messages.get(String(e["messageId"]))
      : this.reasoning.get(String(e["reasoningId"]));
  }
}
