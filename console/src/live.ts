/**
 * Live models the views render: one session followed and reduced with the
 * SDK (`follow` + `SessionReducer`), and the tenant's session list kept
 * current from the tenant stream. Each notifies its subscribers at most
 * once per animation frame, however fast events arrive.
 */
import { follow, type NaradClient, NaradError, SessionReducer, type Frame, type TranscriptItem } from "../../clients/typescript/src/index.js";
import { modelOf } from "./cost.js";

type Listener = () => void;

/** What a person reads when no server answered a request. */
const UNREACHABLE = "The server did not answer (it is down, or the network is): try again once it is back.";

/** Whether `e` is a request that reached no server (fetch's own failure, or the SDK's status 0). */
function unreachable(e: unknown): boolean {
  if (e instanceof NaradError) return e.status === 0;
  return e instanceof TypeError && /fetch|network|load failed/i.test(e.message);
}

/** What went wrong, for a person: the NRD code and message of an API error, once. */
export function messageOf(e: unknown): string {
  if (unreachable(e)) return UNREACHABLE;
  // With the server's envelope, the SDK's message already leads with its code.
  if (e instanceof NaradError) return e.body === undefined ? `${e.status}: ${e.message}` : e.message;
  return e instanceof Error ? e.message : String(e);
}

/** Something views subscribe to. */
export class Observable {
  private readonly listeners = new Set<Listener>();
  private scheduled = false;
  /** Bumped on every change: views compare it to re-render. */
  version = 0;

  subscribe(listener: Listener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  protected changed(): void {
    this.version += 1;
    if (this.scheduled) return;
    this.scheduled = true;
    const run = () => {
      this.scheduled = false;
      for (const l of this.listeners) l();
    };
    if (typeof requestAnimationFrame === "function" && document.visibilityState === "visible") requestAnimationFrame(run);
    else setTimeout(run, 50);
  }

  private soon: ReturnType<typeof setTimeout> | undefined;

  /** Notifies within 100 ms, once for everything that changed meanwhile. */
  protected changedSoon(): void {
    if (this.soon !== undefined) return;
    this.soon = setTimeout(() => {
      this.soon = undefined;
      this.changed();
    }, 100);
  }
}

/** An authority event as the console reads it. */
export type Event = Record<string, unknown> & {
  type: string;
  eventId: string;
  sessionSequence: number;
  runId?: string;
  rootRunId?: string;
  sequence?: number;
  timestamp: string;
};

/** What happened to a stream: `failed` is a refusal no retry mends (401, 403, 404). */
export type Connection = "connecting" | "live" | "failed";

/**
 * Whether the server answers: a network failure of any request marks it
 * unreachable, the next answer reachable again. The SDK retries streams by
 * itself; this is what the banner shows meanwhile. A 401 (the token is
 * expired, refused or badly signed) is kept as `refused`: the console then
 * goes back to signing in, with the server's reason.
 */
export class Reachability extends Observable {
  reachable = true;
  /** The server's reason for refusing the token, once it has. */
  refused: string | undefined;

  /** `fetch`, reporting to this. */
  wrap(inner: typeof fetch): typeof fetch {
    return async (...args) => {
      try {
        const response = await inner(...args);
        this.set(true);
        if (response.status === 401 && this.refused === undefined) void this.refuse(response.clone());
        return response;
      } catch (e) {
        if (!(e instanceof DOMException && e.name === "AbortError")) this.set(false);
        throw e;
      }
    };
  }

  private async refuse(response: Response): Promise<void> {
    let reason = "NRD-0101: the server refused the token";
    try {
      const body = (await response.json()) as { code?: unknown; message?: unknown };
      if (typeof body.code === "string" && typeof body.message === "string") {
        reason = messageOf(new NaradError(401, body.message, body as never));
      }
    } catch {
      // No envelope: the generic reason.
    }
    this.refused = reason;
    this.changed();
  }

  private set(reachable: boolean): void {
    if (this.reachable !== reachable) {
      this.reachable = reachable;
      this.changed();
    }
  }
}

/** A model fed by a stream: whether that stream is live now. */
class Followed extends Observable {
  connection: Connection = "connecting";

  /** For `follow`'s `onDisconnected`: not live until the next connection attaches. */
  protected readonly disconnected = (): void => {
    this.connection = "connecting";
    this.changed();
  };
}

/** The text a message shows: its content's text, or what its redaction displays instead. */
export function messageText(item: TranscriptItem & { item: "message" }): string {
  const content = item.redaction ? (item.redaction.displayReplacement ?? "[redacted]") : item.content;
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((p) => (typeof p === "object" && p !== null && typeof (p as { text?: unknown }).text === "string" ? (p as { text: string }).text : ""))
      .join("");
  }
  return JSON.stringify(content);
}

/** Who an event names as its actor (a person's `sub`), if anyone. */
export function actorOf(e: Event | undefined): { sub: string; extension?: string } | undefined {
  const actor = e?.actor as { sub?: unknown; extension?: unknown } | undefined;
  if (typeof actor?.sub !== "string") return undefined;
  return typeof actor.extension === "string" ? { sub: actor.sub, extension: actor.extension } : { sub: actor.sub };
}

/** One session, followed live and reduced. */
export class LiveSession extends Followed {
  readonly reducer = new SessionReducer();
  /** Every authority event, in sessionSequence order (the event inspector's list). */
  readonly events: Event[] = [];
  /** The first sessionSequence of each message, reasoning stream, tool call and interrupt. */
  readonly firstSeen = new Map<string, number>();
  /** interrupt.requested by interruptId. */
  readonly interruptRequests = new Map<string, Event>();
  /** interrupt.resolved by interruptId. */
  readonly interruptResolutions = new Map<string, Event>();
  /** tool.call.started and tool.call.finished by toolCallId. */
  readonly toolCalls = new Map<string, { started: Event; finished?: Event }>();
  /** run.stop.requested by the run it targets. */
  readonly stops = new Map<string, Event>();
  /** Terminals by runId. */
  readonly terminals = new Map<string, Event>();
  /** Attachments and artifacts (§9.5) by `attachment:<id>` / `artifact:<id>`: their events in order. */
  readonly files = new Map<string, Event[]>();
  /** The sessionSequence that first named each run-graph node (`run:<id>`, `tool.call:<id>`, `interrupt:<id>`). */
  readonly nodeSeen = new Map<string, number>();
  problem: string | undefined;
  private readonly abort = new AbortController();

  constructor(
    private readonly client: NaradClient,
    readonly sessionId: string,
  ) {
    super();
    void this.run();
  }

  /** Stops following. */
  close(): void {
    this.abort.abort();
  }

  private async run(): Promise<void> {
    const connect = (frame: Frame) => {
      if (frame.kind === "capabilities") {
        this.connection = "live";
        this.changed();
      }
    };
    try {
      // History first, page by page (the fastest way through a long
      // session; the next page is on its way while one is applied), drawn
      // after the first page (something to read at once) and once it is
      // all in, not per page: drawing a long session costs more than
      // reading it. Then the stream from where history ends.
      let first = true;
      for await (const e of pages(this.client, this.sessionId, this.abort.signal)) {
        for (const event of e) this.apply(event, false);
        if (first) this.changed();
        first = false;
      }
      this.changed();
      if (this.abort.signal.aborted) return;
      for await (const frame of follow(this.client, {
        afterSessionSequence: this.reducer.sessionSequence,
        sessionId: this.sessionId,
        signal: this.abort.signal,
        initialBackoffMs: 200,
        maxBackoffMs: 3000,
        onDisconnected: this.disconnected,
      })) {
        connect(frame);
        if (frame.kind === "authority") this.apply(frame.event as unknown as Event);
        else if (frame.kind === "watch") this.deliver(frame.event);
        // A stream attaching sends a graph snapshot per run journal (a
        // long session has hundreds): drawn together, a moment later.
        else if (frame.kind === "hydrate") this.deliver(frame.record, "soon");
      }
    } catch (e) {
      if (this.abort.signal.aborted) return;
      this.connection = "failed";
      this.problem = messageOf(e);
      this.changed();
    }
  }

  /** The event of sessionSequence `seq`, if it is here. */
  at(seq: number): Event | undefined {
    // Held in order from 1, so it is found where its number says; should
    // one ever be missing, by search.
    const e = this.events[seq - 1];
    if (e?.sessionSequence === seq) return e;
    let [lo, hi] = [0, this.events.length - 1];
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const m = this.events[mid]!;
      if (m.sessionSequence === seq) return m;
      if (m.sessionSequence < seq) lo = mid + 1;
      else hi = mid - 1;
    }
    return undefined;
  }

  /** run.started by runId. */
  started(runId: string): Event | undefined {
    const seq = this.nodeSeen.get(`run:${runId}`);
    return seq === undefined ? undefined : this.at(seq);
  }

  /**
   * The person's message a run answers: the last `message.user.recorded`
   * before its `run.started` with no other run started in between.
   */
  startingMessage(started: Event): Event | undefined {
    for (let seq = started.sessionSequence - 1; seq > 0; seq--) {
      const e = this.at(seq);
      if (e === undefined || e.type === "run.started") return undefined;
      if (e.type === "message.user.recorded") return e;
    }
    return undefined;
  }

  /**
   * A run's short name: its input's `title` (the starter's), else the
   * first text of its input (`message`, `prompt`, `text`, `content`,
   * `query`), else the message it answers; at most 60 characters, cut at a word.
   */
  runName(runId: string): string | undefined {
    const started = this.started(runId);
    if (started === undefined) return undefined;
    const input = started.input as Record<string, unknown> | undefined;
    const short = (t: string) => {
      const one = t.replace(/\s+/g, " ").trim();
      if (one.length <= 60) return one;
      // Cut at a word, unless that leaves too little.
      const cut = one.slice(0, 59);
      const space = cut.lastIndexOf(" ");
      return `${space > 40 ? cut.slice(0, space) : cut}…`;
    };
    if (typeof input === "object" && input !== null) {
      for (const key of ["title", "message", "prompt", "text", "content", "query"]) {
        if (typeof input[key] === "string" && input[key] !== "") return short(input[key] as string);
      }
    }
    const message = this.startingMessage(started)?.content;
    return typeof message === "string" && message !== "" ? short(message) : undefined;
  }

  /**
   * Token usage (§6.1 `usage` on run terminals): of run `runId`, or summed
   * over every run that ended with one.
   */
  usage(runId?: string): Record<string, number> {
    const sum: Record<string, number> = {};
    const terminals = runId === undefined ? this.terminals.values() : [this.terminals.get(runId)];
    for (const t of terminals) addUsage(sum, t?.usage);
    return sum;
  }

  /**
   * The same usage split by the model each run named (`input.model` of its
   * `run.started`; `undefined`: none), to be priced.
   */
  usageByModel(runId?: string): Map<string | undefined, Record<string, number>> {
    const out = new Map<string | undefined, Record<string, number>>();
    const runs = runId === undefined ? [...this.terminals.keys()] : [runId];
    for (const run of runs) {
      const terminal = this.terminals.get(run);
      if (terminal === undefined) continue;
      const model = modelOf(this.started(run));
      const sum = out.get(model) ?? {};
      addUsage(sum, terminal.usage);
      out.set(model, sum);
    }
    return out;
  }

  /** Reduces one object; draws now, soon (within 100 ms, with whatever follows), or later. */
  private deliver(object: unknown, draw: "now" | "soon" | "later" = "now"): void {
    try {
      this.reducer.deliver(object);
    } catch (e) {
      this.problem = e instanceof Error ? e.message : String(e);
    }
    if (draw === "now") this.changed();
    else if (draw === "soon") this.changedSoon();
  }

  private apply(e: Event, draw = true): void {
    const before = this.reducer.sessionSequence;
    this.deliver(e, draw ? "now" : "later");
    if (this.reducer.sessionSequence === before) return; // a duplicate, or refused
    this.events.push(e);
    const first = (id: unknown) => {
      if (typeof id === "string" && !this.firstSeen.has(id)) this.firstSeen.set(id, e.sessionSequence);
    };
    const node = (id: string) => {
      if (!this.nodeSeen.has(id)) this.nodeSeen.set(id, e.sessionSequence);
    };
    if (e.type.startsWith("attachment.") || e.type.startsWith("artifact.")) {
      const kind = e.type.startsWith("attachment.") ? "attachment" : "artifact";
      const key = `${kind}:${String(e[`${kind}Id`])}`;
      first(key);
      const seen = this.files.get(key);
      if (seen === undefined) this.files.set(key, [e]);
      else seen.push(e);
      return;
    }
    switch (e.type) {
      case "run.started":
        node(`run:${String(e.runId)}`);
        break;
      case "message.user.recorded":
      case "message.text.started":
        first(e.messageId);
        break;
      case "reasoning.started":
        first(e.reasoningId);
        break;
      case "tool.call.started":
        first(e.toolCallId);
        node(`tool.call:${String(e.toolCallId)}`);
        this.toolCalls.set(e.toolCallId as string, { started: e });
        break;
      case "tool.call.finished": {
        const call = this.toolCalls.get(e.toolCallId as string);
        if (call !== undefined) call.finished = e;
        break;
      }
      case "interrupt.requested":
        first(e.interruptId);
        node(`interrupt:${String(e.interruptId)}`);
        this.interruptRequests.set(e.interruptId as string, e);
        break;
      case "interrupt.resolved":
        this.interruptResolutions.set(e.interruptId as string, e);
        break;
      case "run.stop.requested":
        this.stops.set(e.targetRunId as string, e);
        break;
      case "run.finished":
      case "run.error":
      case "run.cancelled":
        if (e.runId !== undefined) this.terminals.set(e.runId, e);
        break;
      default:
        break;
    }
  }
}

/** Adds the additive counters of a `usage` object to `sum`. */
function addUsage(sum: Record<string, number>, usage: unknown): void {
  if (typeof usage !== "object" || usage === null) return;
  for (const [k, v] of Object.entries(usage)) {
    if (typeof v === "number" && Number.isFinite(v)) sum[k] = (sum[k] ?? 0) + v;
  }
}

/** A session's history, a page of events at a time. */
async function* pages(client: NaradClient, sessionId: string, signal: AbortSignal): AsyncGenerator<Event[]> {
  const read = (after: number) => client.history(sessionId, { afterSessionSequence: after, limit: 1000 });
  // A read left behind when following stops must not fail unheard.
  const ahead = (after: number) => {
    const p = read(after);
    p.catch(() => undefined);
    return p;
  };
  let next = ahead(0);
  while (!signal.aborted) {
    const page = await next;
    if (page.events.length === 0) return;
    const more = page.nextSessionSequence !== undefined;
    // The next page is asked for before this one is applied.
    if (more) next = ahead(page.nextSessionSequence as number);
    yield page.events as unknown as Event[];
    if (!more) return;
  }
}

/** A session as the list shows it. */
export interface SessionSummary {
  sessionId: string;
  title?: string;
  createdAt: string;
  archivedAt?: string;
  sessionSequence: number;
  activeExecution?: { kind: string; runId?: string; workflowId?: string };
  /** When the list last heard of it (ms since the epoch). */
  lastActivity?: number;
  /** Interrupts requested and not resolved, as seen on the tenant stream since the list opened. */
  pending: Set<string>;
}

/** The tenant's sessions: read page by page, then kept current from the tenant stream. */
export class LiveSessionList extends Followed {
  readonly sessions = new Map<string, SessionSummary>();
  problem: string | undefined;
  loaded = false;
  private readonly abort = new AbortController();
  private readonly refreshing = new Map<string, ReturnType<typeof setTimeout>>();

  constructor(private readonly client: NaradClient) {
    super();
    void this.run();
  }

  close(): void {
    this.abort.abort();
    for (const t of this.refreshing.values()) clearTimeout(t);
  }

  private async run(): Promise<void> {
    // The stream first, so that nothing changed while the list is read is missed.
    const stream = this.follow();
    try {
      let after: string | undefined;
      do {
        const query = new URLSearchParams({ limit: "500" });
        if (after !== undefined) query.set("after", after);
        const page = await this.client.request<{ sessions: SessionSummary[]; nextAfter?: string }>("GET", `/v1/sessions?${query}`);
        for (const s of page.sessions) this.put(s);
        after = page.nextAfter;
      } while (after !== undefined && !this.abort.signal.aborted);
      this.loaded = true;
      this.changed();
    } catch (e) {
      this.problem = messageOf(e);
      this.changed();
    }
    await stream;
  }

  private put(s: Omit<SessionSummary, "pending">): void {
    const had = this.sessions.get(s.sessionId);
    this.sessions.set(s.sessionId, { ...had, ...s, pending: had?.pending ?? new Set() });
    this.changed();
  }

  private async follow(): Promise<void> {
    try {
      const options = { signal: this.abort.signal, initialBackoffMs: 200, maxBackoffMs: 3000, onDisconnected: this.disconnected };
      for await (const frame of follow(this.client, options)) {
        if (frame.kind === "capabilities") {
          this.connection = "live";
          this.changed();
          continue;
        }
        if (frame.kind === "session-erased") {
          // Erased: it leaves the list, as it left the journal.
          if (this.sessions.delete(frame.sessionId)) this.changed();
          continue;
        }
        if (frame.kind !== "authority" && frame.kind !== "watch") continue;
        const e = frame.event as unknown as Record<string, unknown>;
        const sessionId = typeof e.sessionId === "string" ? e.sessionId : undefined;
        if (sessionId === undefined) continue;
        const known = this.sessions.get(sessionId);
        if (known !== undefined) {
          known.lastActivity = Date.now();
          if (e.type === "interrupt.requested") known.pending.add(e.interruptId as string);
          if (e.type === "interrupt.resolved") known.pending.delete(e.interruptId as string);
          if (typeof e.sessionSequence === "number" && e.sessionSequence > known.sessionSequence) known.sessionSequence = e.sessionSequence;
          this.changed();
        }
        this.refresh(sessionId);
      }
    } catch (e) {
      if (this.abort.signal.aborted) return;
      this.connection = "failed";
      this.problem = messageOf(e);
      this.changed();
    }
  }

  /** Reads one session again, at most every 300 ms however busy it is. */
  private refresh(sessionId: string): void {
    if (this.refreshing.has(sessionId)) return;
    this.refreshing.set(
      sessionId,
      setTimeout(async () => {
        this.refreshing.delete(sessionId);
        try {
          const s = await this.client.request<SessionSummary>("GET", `/v1/sessions/${encodeURIComponent(sessionId)}`);
          const lastActivity = this.sessions.get(sessionId)?.lastActivity ?? Date.now();
          this.put({ ...s, lastActivity });
        } catch {
          // Gone or not readable: the next event tries again.
        }
      }, 300),
    );
  }
}

/** An open interrupt as the inbox shows it. */
export interface Waiting {
  sessionId: string;
  sessionTitle?: string;
  interruptId: string;
  requestedAt: string;
  request: Record<string, unknown>;
}

/**
 * The tenant's open interrupts (the approvals inbox): read from
 * `GET /v1/interrupts`, and read again whenever the tenant stream carries
 * an interrupt being requested or resolved.
 */
export class LiveInbox extends Followed {
  waiting: Waiting[] = [];
  loaded = false;
  problem: string | undefined;
  private readonly abort = new AbortController();
  private timer: ReturnType<typeof setTimeout> | undefined;

  constructor(private readonly client: NaradClient) {
    super();
    void this.follow();
    this.reload();
  }

  close(): void {
    this.abort.abort();
    clearTimeout(this.timer);
  }

  /** Reads the inbox again soon (once however many events ask for it). */
  reload(): void {
    if (this.timer !== undefined) return;
    this.timer = setTimeout(async () => {
      this.timer = undefined;
      try {
        const all: Waiting[] = [];
        for await (const i of this.client.openInterrupts()) all.push(i as unknown as Waiting);
        this.waiting = all;
        this.loaded = true;
        this.problem = undefined;
      } catch (e) {
        this.problem = messageOf(e);
      }
      this.changed();
    }, 150);
  }

  private async follow(): Promise<void> {
    try {
      const options = { signal: this.abort.signal, initialBackoffMs: 200, maxBackoffMs: 3000, onDisconnected: this.disconnected };
      for await (const frame of follow(this.client, options)) {
        if (frame.kind === "capabilities") {
          this.connection = "live";
          this.reload(); // a reconnect may have missed changes
          this.changed();
        } else if (frame.kind === "authority" && (frame.event.type === "interrupt.requested" || frame.event.type === "interrupt.resolved")) {
          this.reload();
        }
      }
    } catch (e) {
      if (this.abort.signal.aborted) return;
      this.connection = "failed";
      this.problem = messageOf(e);
      this.changed();
    }
  }
}
