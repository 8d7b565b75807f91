/**
 * A streamed message or reasoning block of a run: text said to it goes out
 * as coalesced deltas, and a later holder of the run carries on what an
 * earlier one left half-said (the Python SDK's `narad.runtime.Message`).
 */
import { ident } from "./ids.js";
import type { Journal, JournalEvent, StreamState } from "./journal.js";
import type { ProposedEvent } from "./types.js";

/** Runs async sections one at a time, in the order they asked. */
export class Mutex {
  private tail: Promise<unknown> = Promise.resolve();

  /** Runs `section` once every section asked before it has ended; answers what it answers. */
  run<T>(section: () => Promise<T>): Promise<T> {
    const result = this.tail.then(section);
    this.tail = result.catch(() => undefined);
    return result;
  }
}

/** What a stream needs of its run context (given by the context; not for user code). */
export interface StreamHost {
  /** The run. */
  readonly runId: string;
  /** The run's journal as read and written so far. */
  readonly journal: Journal;
  /** Serialises the context's appends. */
  readonly writing: Mutex;
  /** How long said text may wait before it goes out, in ms. */
  readonly deltaWindowMs: number;
  /** How much said text goes out at once, at most waiting. */
  readonly deltaChars: number;
  /** A proposed event of the run (envelope filled). */
  event(type: string, fields: Record<string, unknown>): ProposedEvent;
  /** Appends a batch; the caller holds `writing`. */
  appendLocked(events: ProposedEvent[]): Promise<unknown>;
  /** Throws when no new work may start (a stop: `RunStopped`; the lease lost: `LeaseLost`). */
  checkRunning(): void;
  /** Completes the streams opened before `stream`. */
  completeBefore(stream: TextStream): Promise<void>;
  /** Forgets a completed stream. */
  forget(stream: TextStream): void;
}

/** Which kind of stream: an assistant or system message, or reasoning. */
export type StreamKind = "message" | "reasoning";

/** What one append of a stream sends (see {@link TextStream.batch}). */
export interface StreamBatch {
  /** It completes the stream. */
  readonly final: boolean;
  /** Its events, in order. */
  readonly events: ProposedEvent[];
  /** The text its delta carries. */
  text: string;
  /** It completes a diverged stream and opens its next id. */
  diverged: boolean;
}

/**
 * One streamed message (`message.text.started` / `.delta` / `.completed`)
 * or reasoning block (`reasoning.*`).
 *
 * Text given to {@link say} goes out as deltas, coalesced: what is said
 * within the delta window (50 ms by default), or up to the delta size (256
 * characters), goes out as one delta in one append; the first append also
 * carries the `*.started`. {@link complete} sends what is left with the
 * `*.completed`. Any other step of the run (a tool, an approval, the run's
 * end) completes the open message first.
 *
 * On replay, a message the journal holds completed is not sent again (what
 * is said to it is only counted), and one a lost holder left half-way is
 * carried on: what is said goes out from where the journal stops. Should
 * the text differ from what the journal holds, that message is completed
 * as it stands and the text goes out under the next id (`….message.2`).
 */
export class TextStream {
  /** `message` or `reasoning`. */
  readonly kind: StreamKind;
  /** The role of a message (`assistant` or `system`). */
  readonly role: "assistant" | "system";
  private readonly host: StreamHost;
  private readonly baseId: string;
  private currentId: string;
  private serial: number;
  /** The journal holds it completed: nothing of it is sent again. */
  private readonly replayed: boolean;
  /** Its `*.started` is in the journal. */
  private started: boolean;
  /** The text the journal holds for it (a lost holder's and this one's). */
  private sent: string;
  /** Everything this holder said to it. */
  private said = "";
  private done = false;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private failure: unknown;

  /** The stream of step `step` (a position, or a key the caller names it by) of the host's run (made by the run context). */
  constructor(host: StreamHost, step: number | string, kind: StreamKind, role: "assistant" | "system" = "assistant") {
    this.host = host;
    this.kind = kind;
    this.role = role;
    this.baseId = ident(host.runId, step, kind === "message" ? "message" : "thought");
    const streams = this.streams();
    const ids = host.journal.stepIds(this.baseId, streams.keys());
    const lastId = ids[ids.length - 1];
    const last: StreamState | undefined = lastId === undefined ? undefined : streams.get(lastId);
    this.currentId = lastId ?? this.baseId;
    this.serial = Math.max(ids.length, 1);
    this.replayed = last !== undefined && last.completed;
    this.started = last !== undefined;
    this.sent = last?.text ?? "";
  }

  /** Its messageId (or reasoningId): a later one when a replay diverged from a lost holder's text. */
  get id(): string {
    return this.currentId;
  }

  /** What this holder said to it so far. */
  get text(): string {
    return this.said;
  }

  /** Whether it was completed. */
  get completed(): boolean {
    return this.done;
  }

  /** Adds `text` (throws `RunStopped` after a stop, and what a delta sent in the background met). */
  async say(text: string): Promise<void> {
    this.raiseFailure();
    this.host.checkRunning();
    if (this.done) {
      throw new Error(`${this.kind} ${this.currentId} is complete; open another`);
    }
    await this.host.completeBefore(this);
    this.said += text;
    if (this.replayed) {
      return;
    }
    const unsent = this.unsent();
    if (unsent.length >= this.host.deltaChars) {
      await this.flush();
    } else if (unsent.length > 0 && this.timer === undefined) {
      this.timer = setTimeout(() => {
        this.timer = undefined;
        this.flush().catch((e: unknown) => {
          this.failure ??= e;
        });
      }, this.host.deltaWindowMs);
    }
  }

  /** Sends what is left and the `*.completed`. */
  async complete(): Promise<void> {
    this.raiseFailure();
    if (this.done) {
      return;
    }
    await this.host.completeBefore(this);
    this.cancelTimer();
    await this.host.writing.run(async () => {
      const batch = this.batch(true);
      if (batch.events.length > 0) {
        await this.host.appendLocked(batch.events);
      }
      this.sentBatch(batch);
    });
  }

  /**
   * The events that send what is unsent (and complete the stream when
   * `final`). Nothing changes until {@link sentBatch} records the batch as
   * appended: more may be said while it is on its way.
   */
  batch(final: boolean): StreamBatch {
    const batch: StreamBatch = { final, events: [], text: "", diverged: false };
    if (this.done || this.replayed) {
      return batch;
    }
    let id = this.currentId;
    let started = this.started;
    if (this.diverged()) {
      batch.events.push(this.completedEvent(id));
      batch.diverged = true;
      id = ident(this.baseId, this.serial + 1);
      started = false;
    }
    batch.text = this.unsent();
    if (!started) {
      if (batch.text.length === 0) {
        return batch; // nothing said: no empty message
      }
      batch.events.push(
        this.kind === "message"
          ? this.host.event("message.text.started", { messageId: id, role: this.role, messageScope: "run" })
          : this.host.event("reasoning.started", { reasoningId: id }),
      );
    }
    if (batch.text.length > 0) {
      batch.events.push(this.host.event(`${this.prefix()}.delta`, { [this.idField()]: id, delta: batch.text }));
    }
    if (final) {
      batch.events.push(this.completedEvent(id));
    }
    return batch;
  }

  /** Records that `batch` (of {@link batch}) was appended. */
  sentBatch(batch: StreamBatch): void {
    if (this.done) {
      return;
    }
    if (batch.diverged) {
      this.serial += 1;
      this.currentId = ident(this.baseId, this.serial);
      this.sent = "";
      this.started = false;
    }
    if (batch.text.length > 0) {
      this.started = true;
      this.sent += batch.text;
    }
    if (batch.final) {
      this.done = true;
      this.cancelTimer();
      this.host.forget(this);
    }
  }

  /** Cancels the coalescing timer (what it would send goes with the next batch). */
  cancelTimer(): void {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
  }

  private streams(): Map<string, StreamState> {
    return this.kind === "message" ? this.host.journal.messages : this.host.journal.reasoning;
  }

  private prefix(): string {
    return this.kind === "message" ? "message.text" : "reasoning";
  }

  private idField(): string {
    return this.kind === "message" ? "messageId" : "reasoningId";
  }

  private completedEvent(id: string): ProposedEvent {
    return this.host.event(`${this.prefix()}.completed`, { [this.idField()]: id });
  }

  /** Whether this holder said something else than the journal holds. */
  private diverged(): boolean {
    return !(this.said.startsWith(this.sent) || this.sent.startsWith(this.said));
  }

  /** What was said and is not in the journal yet. */
  private unsent(): string {
    if (this.diverged()) {
      return this.said;
    }
    return this.said.length > this.sent.length ? this.said.slice(this.sent.length) : "";
  }

  private async flush(): Promise<void> {
    this.cancelTimer();
    await this.host.writing.run(async () => {
      const batch = this.batch(false);
      if (batch.events.length > 0) {
        await this.host.appendLocked(batch.events);
      }
      this.sentBatch(batch);
    });
  }

  private raiseFailure(): void {
    if (this.failure !== undefined) {
      const failure = this.failure;
      this.failure = undefined;
      throw failure;
    }
  }
}

/** The streams of runs `runIds` the journal holds open (a lost holder's included), for the closing of a run. */
export function openStreams(journal: Journal, runIds: ReadonlySet<string>): { kind: StreamKind; id: string; runId: string }[] {
  const open: { kind: StreamKind; id: string; runId: string }[] = [];
  for (const [id, s] of journal.messages) {
    if (!s.completed && runIds.has(s.runId)) {
      open.push({ kind: "message", id, runId: s.runId });
    }
  }
  for (const [id, s] of journal.reasoning) {
    if (!s.completed && runIds.has(s.runId)) {
      open.push({ kind: "reasoning", id, runId: s.runId });
    }
  }
  return open;
}

