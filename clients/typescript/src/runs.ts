/**
 * The run-level API (`client.runs`), as LangGraph's SDK has it: start a
 * run and stream its frames to its end (`stream`), wait for its result
 * (`wait`), or join a run already going or already over (`joinStream`,
 * `join`). Built on {@link follow}: the stream resumes across cut
 * connections, restarts and servers, and never yields an event twice.
 */
import type { CallOptions, NaradClient } from "./client.js";
import { newKey } from "./keys.js";
import { GoneError, NotFoundError, NaradError } from "./errors.js";
import { follow, type Frame } from "./follow.js";
import { uuidV5 } from "./ids.js";
import { SessionReducer, type ReducedState, type TranscriptItem } from "./reducer.js";
import type { AuthorityEvent, CommandAnswer, CommandBody } from "./types.js";
import { Violation } from "./wire.js";

/** A frame of a run's stream: an authority event of the run or of a run nested in it. */
export type RunFrame = Extract<Frame, { kind: "authority" }>;

/** How a run ended. */
export type RunStatus = "finished" | "error" | "cancelled";

/** What `start-run` answered. */
export type RunStartAnswer = CommandAnswer<"start-run">;

/** A run to start, and the user message that starts it. */
export interface RunRequest {
  /** The run's session. */
  sessionId: string;
  /**
   * What the person says, recorded before the run starts
   * (`record-user-message`, session scope): text, or any JSON content.
   */
  message?: unknown;
  /**
   * The message's id (default: made here, `msg-` and a UUID; derived from
   * {@link idempotencyKey} when there is one).
   */
  messageId?: string;
  /** Attachments the message carries (added to the session before). */
  attachmentIds?: string[];
  /** The run's input (`run.started`'s `input`). */
  input?: unknown;
  /**
   * The run's id (default: made here, `run-` and a UUID, so that it is
   * known before the run starts; derived from {@link idempotencyKey} when
   * there is one).
   */
  runId?: string;
  /**
   * The agent runtimes' queue that takes the run (`runtime.queue` of
   * `start-run`). Without `queue` or `runtime`, the run is not handed to
   * runtimes: a backend drives it by appending its events.
   */
  queue?: string;
  /** The run's runtime settings (`maxAttempts`, `onLost`, `queue`). */
  runtime?: NonNullable<CommandBody<"start-run">["runtime"]>;
  /**
   * When the session's top-level slot is taken: `reject` (the server's
   * default: a {@link ConflictError} 409 NRD-0204 naming the active
   * execution), `enqueue` (start when the slot frees) or `interrupt` (stop
   * the active run first).
   */
  onConflict?: "reject" | "enqueue" | "interrupt";
  /** The client executor that runs the run's client tools. */
  clientExecutorId?: string;
  /** Start a nested run under this one. */
  parentRunId?: string;
  /** Start the run in this workflow. */
  workflowId?: string;
  /**
   * The base of both commands' `Idempotency-Key`s (`{key}:message`,
   * `{key}:run`; 1 to 247 printable ASCII characters): give the same one to
   * start the same run again after a crash, and neither is done twice. The
   * ids not given (`messageId`, `runId`) are then derived from it — UUIDv5s
   * of `{key}:message` and `{key}:run`, as the Python SDK derives them — so
   * that the same call made again is the same request, answered by the
   * server's replay. Default: a new key per command, and new ids per call
   * (kept across that call's retries).
   */
  idempotencyKey?: string;
}

/** How a run's frames are read. */
export interface RunReadOptions {
  /** Stops the stream (it ends), or the wait (it throws the signal's reason). */
  signal?: AbortSignal;
  /** The first wait before reconnecting, in ms (default 250; see {@link FollowOptions}). */
  initialBackoffMs?: number;
  /** The longest wait between reconnects, in ms (default 10,000). */
  maxBackoffMs?: number;
}

/** A run's result, as `wait` and `join` answer it. */
export interface RunResult {
  sessionId: string;
  runId: string;
  /** How it ended. */
  status: RunStatus;
  /** Its terminal event (`run.finished`, `run.error` with its `code`, or `run.cancelled`). */
  terminal: AuthorityEvent;
  /** The events of the run and of the runs nested in it, in order. */
  events: AuthorityEvent[];
  /** The items of the transcript written by the run and its nested runs. */
  output: TranscriptItem[];
  /**
   * The session's transcript as it stood at the run's end: the session's
   * messages (the user message that started it among them) and the run's
   * items, its nested runs' included.
   */
  transcript: TranscriptItem[];
  /** The session's reduced state as it stood at the run's end. */
  state: ReducedState;
  /** The reducer that holds it, to read more from (`lifecycle`, `graphs`). */
  reducer: SessionReducer;
  /** What the reducer refused to apply (none, unless history lost rows the run's stream needed). */
  violations: Violation[];
}

const TERMINAL: ReadonlySet<string> = new Set(["run.finished", "run.error", "run.cancelled"]);

/**
 * The UUID namespace of the ids a keyed start derives from its key: the
 * Python SDK's (`narad.runs._IDS`), so that both SDKs make the same ids of
 * the same key.
 */
const KEYED_IDS = "9b0d3a52-6c1f-4d0e-8a43-72756e732d31";
/** The longest base key: `{key}:message` stays within an `Idempotency-Key`'s 255 characters. */
const MAX_BASE_KEY = 247;

/** The ids a start uses: the caller's, else derived from its key, else new ones. */
interface StartIds {
  runId: string;
  messageId: string;
}

/**
 * An id a start makes: for a keyed call, `{prefix}-` and the UUIDv5 of
 * `{key}:{part}` in {@link KEYED_IDS}; otherwise `{prefix}-` and a random
 * UUID.
 */
function madeId(prefix: "run" | "msg", key: string | undefined, part: "run" | "message"): string {
  return `${prefix}-${key === undefined ? newKey() : uuidV5(KEYED_IDS, `${key}:${part}`)}`;
}

/** The ids of one call: made once, so that every retry of its commands sends them alike. */
function startIds(request: RunRequest): StartIds {
  const key = request.idempotencyKey;
  if (key !== undefined && (key.length < 1 || key.length > MAX_BASE_KEY)) {
    throw new TypeError(`a runs idempotencyKey is 1 to ${MAX_BASE_KEY} characters: ${JSON.stringify(key)}`);
  }
  return {
    runId: request.runId ?? madeId("run", key, "run"),
    messageId: request.messageId ?? madeId("msg", key, "message"),
  };
}

/**
 * One run's frames, from its start to its terminal event: an async
 * iterable (read it once). `runId` is known before the first frame;
 * `terminal` holds the terminal event once the stream reached it;
 * `started` what `start-run` answered (for a run this stream started).
 */
export class RunStream implements AsyncIterable<RunFrame> {
  /** The terminal event, once read. */
  terminal: AuthorityEvent | undefined;
  /** What `start-run` answered, once the run was started by this stream. */
  started: RunStartAnswer | undefined;
  private readonly frames: AsyncGenerator<RunFrame>;

  constructor(
    readonly sessionId: string,
    readonly runId: string,
    frames: (stream: RunStream) => AsyncGenerator<RunFrame>,
  ) {
    this.frames = frames(this);
  }

  [Symbol.asyncIterator](): AsyncGenerator<RunFrame> {
    return this.frames;
  }

  /** How the run ended, once read. */
  get status(): RunStatus | undefined {
    return this.terminal === undefined ? undefined : statusOf(this.terminal);
  }
}

/** `client.runs`: start, stream, wait for and join runs. */
export class Runs {
  constructor(private readonly client: NaradClient) {}

  /**
   * Starts a run — records `message` first when given
   * (`record-user-message`), then `start-run` — and streams its frames:
   * the authority events of the run and of the runs nested in it, until
   * its terminal event (`run.finished`, `run.error`, `run.cancelled`),
   * which is the last frame. Nothing is sent until the stream is read.
   * Both commands are keyed (see {@link RunRequest.idempotencyKey}) and the
   * run's and the message's ids are made here, so a retried start is never
   * a second run; with the caller's key they derive from it, so the same
   * call made again (after a crash) is answered by the server's replay. The
   * stream resumes across cut connections and servers; it ends early, with
   * no terminal, when `signal` aborts.
   */
  stream(request: RunRequest, options: RunReadOptions = {}): RunStream {
    const ids = startIds(request);
    return new RunStream(request.sessionId, ids.runId, (stream) =>
      this.frames(stream, async () => {
        const { after, answer } = await this.start(request, ids, options.signal);
        stream.started = answer;
        return after;
      }, options),
    );
  }

  /**
   * Starts a run as {@link stream} does and answers its result once it
   * ended: how, its terminal event, its events, its transcript and the
   * session's reduced state at its end. The session is read from its start
   * (the reducer needs all of it).
   */
  async wait(request: RunRequest, options: RunReadOptions = {}): Promise<RunResult> {
    const ids = startIds(request);
    await this.start(request, ids, options.signal);
    return this.result(request.sessionId, ids.runId, options);
  }

  /**
   * The frames of a run already started (or queued, or already over:
   * then read from history), from its `run.started` to its terminal
   * event, as {@link stream} gives them. Throws {@link NotFoundError} when
   * the session holds no such run and none is queued.
   */
  joinStream(sessionId: string, runId: string, options: RunReadOptions = {}): RunStream {
    return new RunStream(sessionId, runId, (stream) =>
      this.frames(stream, () => this.startOf(sessionId, runId), options),
    );
  }

  /**
   * The result of a run already started (or queued, or already over), as
   * {@link wait} answers it. Throws {@link NotFoundError} when the session
   * holds no such run and none is queued.
   */
  async join(sessionId: string, runId: string, options: RunReadOptions = {}): Promise<RunResult> {
    await this.startOf(sessionId, runId);
    return this.result(sessionId, runId, options);
  }

  /**
   * Records the message (when there is one) and starts the run; answers
   * the sessionSequence its frames come after, and start-run's answer.
   */
  private async start(
    request: RunRequest,
    { runId, messageId }: StartIds,
    signal: AbortSignal | undefined,
  ): Promise<{ after: number; answer: RunStartAnswer }> {
    const { sessionId } = request;
    const keyOf = (part: string): CallOptions => {
      const options: CallOptions = {};
      if (request.idempotencyKey !== undefined) options.idempotencyKey = `${request.idempotencyKey}:${part}`;
      if (signal !== undefined) options.signal = signal;
      return options;
    };
    let after: number;
    if (request.message !== undefined) {
      const body: CommandBody<"record-user-message"> = {
        sessionId,
        messageScope: "session",
        content: request.message,
        messageId,
      };
      if (request.attachmentIds !== undefined) body.attachmentIds = request.attachmentIds;
      const said = await this.client.command("record-user-message", body, keyOf("message"));
      after = said.appended.events[0]?.sessionSequence ?? 0;
    } else {
      // Read before the start, so that no event of the run can come before it.
      after = (await this.client.getSession(sessionId)).sessionSequence;
    }
    const body: CommandBody<"start-run"> = { sessionId, runId };
    if (request.input !== undefined) body.input = request.input;
    if (request.queue !== undefined || request.runtime !== undefined) {
      body.runtime = { ...request.runtime };
      if (request.queue !== undefined) body.runtime.queue = request.queue;
    }
    if (request.onConflict !== undefined) body.onConflict = request.onConflict;
    if (request.clientExecutorId !== undefined) body.clientExecutorId = request.clientExecutorId;
    if (request.parentRunId !== undefined) body.parentRunId = request.parentRunId;
    if (request.workflowId !== undefined) body.workflowId = request.workflowId;
    const answer = await this.client.command("start-run", body, keyOf("run"));
    return { after, answer };
  }

  /**
   * The sessionSequence a run's frames come after: just before its
   * `run.started`; when it is queued and not started yet, the end of what
   * history holds now.
   */
  private async startOf(sessionId: string, runId: string): Promise<number> {
    // A top-level run is the root of its own run journal: one page of one event.
    try {
      const page = await this.client.history(sessionId, { rootRunId: runId, limit: 1 });
      const first = page.events[0];
      if (first !== undefined && first.type === "run.started" && first.runId === runId) {
        return first.sessionSequence - 1;
      }
    } catch (e) {
      if (!(e instanceof NotFoundError)) throw e;
    }
    // A nested run, or one not started: the queue, then the whole history.
    const queued = await this.client.request<{ queuedStarts: { runId: string }[] }>(
      "GET",
      `/v1/sessions/${encodeURIComponent(sessionId)}/queued-starts`,
    );
    let last = 0;
    for await (const e of this.client.allHistory(sessionId)) {
      if (e.type === "run.started" && e.runId === runId) {
        return e.sessionSequence - 1;
      }
      last = e.sessionSequence;
    }
    if (queued.queuedStarts.some((q) => q.runId === runId)) {
      return last;
    }
    throw new NotFoundError(404, `session ${sessionId} holds no run ${runId}, and none is queued`);
  }

  /** Streams a run's frames after the sequence `from` answers; `reducer` is fed every frame. */
  private async *frames(
    stream: RunStream,
    from: () => Promise<number>,
    options: RunReadOptions,
    reducer?: { deliver(frame: Frame): void },
  ): AsyncGenerator<RunFrame> {
    const after = await from();
    const stop = new AbortController();
    const abort = () => stop.abort(options.signal?.reason);
    if (options.signal?.aborted) return;
    options.signal?.addEventListener("abort", abort, { once: true });
    const tree = new Set([stream.runId]);
    const followOptions: Parameters<typeof follow>[1] = {
      sessionId: stream.sessionId,
      afterSessionSequence: after,
      signal: stop.signal,
    };
    if (options.initialBackoffMs !== undefined) followOptions.initialBackoffMs = options.initialBackoffMs;
    if (options.maxBackoffMs !== undefined) followOptions.maxBackoffMs = options.maxBackoffMs;
    try {
      for await (const frame of follow(this.client, followOptions)) {
        reducer?.deliver(frame);
        if (frame.kind === "session-erased") {
          throw new GoneError(410, `session ${stream.sessionId} was erased before run ${stream.runId} ended`);
        }
        if (frame.kind !== "authority") continue;
        const e = frame.event;
        const parent = (e as { parentRunId?: string }).parentRunId;
        if (e.type === "run.started" && parent !== undefined && tree.has(parent) && e.runId !== undefined) {
          tree.add(e.runId);
        }
        if (e.runId === undefined || !tree.has(e.runId)) continue;
        if (e.runId === stream.runId && TERMINAL.has(e.type)) {
          stream.terminal = e;
          yield frame;
          return;
        }
        yield frame;
      }
    } finally {
      options.signal?.removeEventListener("abort", abort);
      stop.abort();
    }
  }

  /** Reads a session from its start through a run's terminal event, reducing it. */
  private async result(sessionId: string, runId: string, options: RunReadOptions): Promise<RunResult> {
    const reducer = new SessionReducer();
    const violations: Violation[] = [];
    const feed = {
      deliver(frame: Frame): void {
        const object = frame.kind === "authority" ? frame.event : frame.kind === "hydrate" ? frame.record : undefined;
        if (object === undefined) return;
        try {
          reducer.deliver(object);
        } catch (e) {
          if (!(e instanceof Violation)) throw e;
          violations.push(e);
        }
      },
    };
    const stream = new RunStream(sessionId, runId, (s) => this.frames(s, async () => 0, options, feed));
    const events: AuthorityEvent[] = [];
    for await (const frame of stream) {
      events.push(frame.event);
    }
    const terminal = stream.terminal;
    if (terminal === undefined) {
      if (options.signal?.aborted) throw options.signal.reason ?? new NaradError(0, "aborted");
      throw new NaradError(0, `the stream of session ${sessionId} ended before run ${runId} did`);
    }
    const tree = new Set(events.map((e) => e.runId).filter((r): r is string => r !== undefined));
    const transcript = reducer.transcript([...tree]);
    return {
      sessionId,
      runId,
      status: statusOf(terminal),
      terminal,
      events,
      output: transcript.filter((i) => i.runId !== undefined && tree.has(i.runId)),
      transcript,
      state: reducer.state(),
      reducer,
      violations,
    };
  }
}

function statusOf(terminal: AuthorityEvent): RunStatus {
  return terminal.type === "run.finished" ? "finished" : terminal.type === "run.error" ? "error" : "cancelled";
}
