import { errorOf, IDEMPOTENCY_IN_FLIGHT, NaradError, UnavailableError } from "./errors.js";
import { newKey } from "./keys.js";
import { Runs } from "./runs.js";
import { backoffWait, nextWait, sleep } from "./wait.js";
import type {
  Appended,
  CommandAnswer,
  CommandBody,
  CommandName,
  HistoryPage,
  HistoryQuery,
  InterruptPage,
  OpenInterrupt,
  Operations,
  SearchPage,
  SearchQuery,
  SessionPage,
  ProposedEvent,
  SessionRecord,
  Schemas,
  StreamTicket,
  TicketRequest,
  UsagePage,
  UsageQuery,
} from "./types.js";

/** Bytes a blob upload sends: held whole, so that another replica can be tried. */
export type BlobBytes = Blob | Uint8Array | ArrayBuffer | string;

/** How a blob is uploaded. */
export interface UploadOptions {
  /** Its file name. */
  name: string;
  /** Its media type (default `application/octet-stream`); stored as given, never sniffed. */
  mediaType?: string;
  /** Add it to the session as this attachment, on the caller's behalf (role `writer`). */
  attachmentId?: string;
  signal?: AbortSignal;
  /** The upload's `Idempotency-Key` (default: a new UUID for this call, kept across its retries). */
  idempotencyKey?: string;
}

/** What a keyed call (a command, a session's creation, a stream ticket) may carry. */
export interface CallOptions {
  /**
   * The call's `Idempotency-Key`: the same key with the same request is
   * answered once, however often it is sent (a retry, a failover, or the
   * caller's own resend after a crash). Default: a new UUID for this call,
   * kept across every retry of it. 1 to 255 visible ASCII characters (no spaces).
   */
  idempotencyKey?: string;
  signal?: AbortSignal;
}

/** How long and how often a request that is safe to send again is retried (see {@link NaradClient.send}). */
export interface RetryOptions {
  /**
   * How long one request may take in all, in ms, trying again through
   * unreachable servers, restarts, 502–504 and 409 NRD-0212 (default
   * 30,000; 0: every server once, no waiting). Waits for a 429 count
   * against `maxRateLimitWaitMs` instead.
   */
  maxElapsedMs?: number;
  /** The first backoff's ceiling, in ms (default 200); it doubles each round, with full jitter. */
  initialBackoffMs?: number;
  /** The largest backoff ceiling, in ms (default 5,000). */
  maxBackoffMs?: number;
}

/** The prefix of a reference to a blob narad holds. */
export const BLOB_REFERENCE = "narad://blobs/";

/** A bearer token, or a function that gives the current one. */
export type TokenSource = string | (() => string | Promise<string>);

/** How to reach narad. */
export interface ClientOptions {
  /** The server's URL, or several replicas' (tried in turn when one fails). */
  servers: string | string[];
  /** The credential of every request. */
  token: TokenSource;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /**
   * How long one request may wait in all, in ms, when the server answers
   * 429 (a limit of the tenant) with `Retry-After` before trying again
   * (default 60,000; 0: never wait, the 429 is thrown at once).
   */
  maxRateLimitWaitMs?: number;
  /** How requests that are safe to send again are retried (see {@link NaradClient.send}). */
  retry?: RetryOptions;
}

/** A request's parts beyond its method and path. */
export interface RequestOptions {
  body?: unknown;
  /** Bytes sent as they are (instead of `body` as JSON), with their media type. */
  raw?: { bytes: BlobBytes; mediaType: string };
  query?: Record<string, string | number | boolean | undefined>;
  headers?: Record<string, string>;
  signal?: AbortSignal;
  /** Sent as the `Idempotency-Key` header (which makes the request safe to send again). */
  idempotencyKey?: string;
  /**
   * Whether the request may be sent again after it may have reached a
   * server (default: decided by its method, route and `Idempotency-Key`;
   * see {@link NaradClient.send}).
   */
  idempotent?: boolean;
  /** This request's retry budget and backoff, instead of the client's. */
  retry?: RetryOptions;
}

/** How a read is made: its signal, and its retries when not the client's. */
export interface ReadOptions {
  signal?: AbortSignal;
  /** This read's retry budget and backoff, instead of the client's (`{ maxElapsedMs: 0 }`: each server once). */
  retry?: RetryOptions;
}

/**
 * narad's HTTP API: commands, sessions, appends and history, with errors
 * as {@link NaradError} (of a subclass per class of answer).
 *
 * Every command, session creation, blob upload and stream ticket carries
 * an `Idempotency-Key`, made once per call (or the caller's own) and kept
 * across every retry and failover of that call: the server answers the
 * same key with the same request once, and repeats its first answer.
 *
 * Retries, one policy for every request ({@link send}):
 * - A request is *safe to send again* when it is idempotent: `GET`,
 *   `HEAD`, `OPTIONS`, `PUT`, `DELETE`; any request with an
 *   `Idempotency-Key`; an append (its events carry their eventIds: a
 *   batch sent again answers `duplicate: true`); a runtime lease's
 *   heartbeat and release; an executor's heartbeat and finish (a token
 *   finishes once). A claim (`POST /v1/runtime/claims`) is not: a claim
 *   whose answer was lost holds a run nobody works on until its lease
 *   lapses, and claiming again would take another.
 * - A request safe to send again goes to the next server when one cannot
 *   be reached, loses the connection, or answers 502, 503, 504 or 409
 *   NRD-0212 (its key's first request still being answered); after every
 *   server was tried, it waits (exponential backoff with full jitter, at
 *   least the longest `Retry-After` asked) and tries them all again, until
 *   `retry.maxElapsedMs` (30 s by default) has passed: a restart of the
 *   only server is waited out.
 * - Any other request goes to another server only when it never reached
 *   one (the connection was refused, the name not found: nothing can have
 *   acted on it) and is never sent to the same server twice; a lost
 *   connection or a 502–504 is thrown as {@link UnavailableError}, its
 *   `maybeProcessed` true.
 * - A 429 (a limit of the tenant, refused before any effect) is sent again
 *   to the same server once its `Retry-After` has passed, within
 *   `maxRateLimitWaitMs`, whatever the request.
 */
export class NaradClient {
  readonly servers: readonly string[];
  private readonly token: TokenSource;
  /** The `fetch` requests and streams go through. */
  readonly fetchImpl: typeof fetch;
  private preferred = 0;
  private readonly maxRateLimitWaitMs: number;
  private readonly retry: Required<RetryOptions>;
  private runsApi: Runs | undefined;

  constructor(options: ClientOptions) {
    const servers = Array.isArray(options.servers) ? options.servers : [options.servers];
    if (servers.length === 0) {
      throw new Error("give at least one server URL");
    }
    this.servers = servers.map((s) => s.replace(/\/+$/, ""));
    this.token = options.token;
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.maxRateLimitWaitMs = options.maxRateLimitWaitMs ?? 60_000;
    this.retry = {
      maxElapsedMs: options.retry?.maxElapsedMs ?? 30_000,
      initialBackoffMs: options.retry?.initialBackoffMs ?? 200,
      maxBackoffMs: options.retry?.maxBackoffMs ?? 5_000,
    };
  }

  /**
   * The run-level API: `runs.stream` (start a run, stream its frames to its
   * end), `runs.wait` (its result), `runs.joinStream` and `runs.join` (the
   * same for a run already going or over).
   */
  get runs(): Runs {
    return (this.runsApi ??= new Runs(this));
  }

  /** The current bearer token. */
  async bearer(): Promise<string> {
    return typeof this.token === "string" ? this.token : await this.token();
  }

  /** The servers, starting with the one that answered last. */
  serversInTurn(): string[] {
    const n = this.servers.length;
    return Array.from({ length: n }, (_, i) => this.servers[(this.preferred + i) % n] as string);
  }

  /** Marks `server` as the one to try first. */
  prefer(server: string): void {
    const i = this.servers.indexOf(server);
    if (i >= 0) {
      this.preferred = i;
    }
  }

  /** Sends a request and answers its JSON (undefined for 204). */
  async request<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
    const response = await this.send(method, path, options);
    if (response.status === 204) {
      return undefined as T;
    }
    return (await response.json()) as T;
  }

  /**
   * Sends a request and answers the first success, with the retry policy
   * of the class (see {@link NaradClient}); a refusal is thrown as the
   * {@link NaradError} subclass of its status.
   */
  async send(method: string, path: string, options: RequestOptions = {}): Promise<Response> {
    const headers: Record<string, string> = { ...options.headers };
    if (options.idempotencyKey !== undefined) {
      headers["Idempotency-Key"] = checkedKey(options.idempotencyKey);
    }
    let body: BodyInit | undefined;
    if (options.raw !== undefined) {
      headers["Content-Type"] = options.raw.mediaType;
      body = options.raw.bytes as BodyInit;
    } else if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(options.body);
    }
    const again = options.idempotent ?? safeToSendAgain(method, path, headers);
    const retry: Required<RetryOptions> = { ...this.retry, ...definedOf(options.retry) };
    const deadline = Date.now() + retry.maxElapsedMs;
    let last: NaradError | undefined;
    let rateLimitWaited = 0;
    // The longest Retry-After asked in this round of servers.
    let asked: number | undefined;
    for (let round = 0; ; round++) {
      if (round > 0) {
        // Every server was tried: wait, then try them all again.
        const left = deadline - Date.now();
        if (!again || left <= 0 || (asked ?? 0) > left) {
          throw last ?? new UnavailableError(0, "no server answered");
        }
        await sleep(Math.min(left, nextWait(backoffWait(round - 1, retry), asked)), options.signal);
        throwIfAborted(options.signal);
        asked = undefined;
      }
      const servers = this.serversInTurn();
      for (let i = 0; i < servers.length; i++) {
        const server = servers[i] as string;
        let response: Response;
        const init: RequestInit = {
          method,
          headers: { Authorization: `Bearer ${await this.bearer()}`, ...headers },
        };
        try {
          if (body !== undefined) {
            init.body = body;
          }
          if (options.signal) {
            init.signal = options.signal;
          }
          response = await this.fetchImpl(server + path + queryString(options.query), init);
        } catch (e) {
          throwIfAborted(options.signal);
          const refused = neverSent(e);
          last = new UnavailableError(0, `${server} cannot be reached: ${describe(e)}`, undefined, undefined, undefined, {
            cause: e,
            maybeProcessed: !refused,
          });
          if (refused || again) {
            continue;
          }
          // It may have reached the server, which may have acted: never
          // sent again.
          throw last;
        }
        if ([502, 503, 504, 409].includes(response.status)) {
          const error = await errorOf(response);
          if (response.status === 409 && (error.code as string | undefined) !== IDEMPOTENCY_IN_FLIGHT) {
            this.prefer(server);
            throw error;
          }
          last = error;
          if (!again) {
            throw last;
          }
          asked = Math.max(asked ?? 0, last.retryAfterMs ?? 0);
          continue;
        }
        if (response.status === 429) {
          // Over a limit, refused before any effect: the same request is
          // sent again once the server's Retry-After has passed, within the
          // client's budget.
          const limited = await errorOf(response);
          const wait = nextWait(250, limited.retryAfterMs);
          if (rateLimitWaited + wait > this.maxRateLimitWaitMs || options.signal?.aborted) {
            throw limited;
          }
          await sleep(wait, options.signal);
          throwIfAborted(options.signal);
          rateLimitWaited += wait;
          i -= 1;
          continue;
        }
        this.prefer(server);
        if (!response.ok) {
          throw await errorOf(response);
        }
        return response;
      }
    }
  }

  /** Creates a session (keyed: see {@link CallOptions}). */
  createSession(body: Schemas["commands.create-session"] = {}, options: CallOptions = {}): Promise<SessionRecord> {
    return this.request("POST", "/v1/sessions", keyed({ body }, options));
  }

  /** One page of the tenant's sessions, oldest first (`after`: the previous page's `nextAfter`). */
  listSessions(query: { after?: string; limit?: number } = {}): Promise<SessionPage> {
    return this.request("GET", "/v1/sessions", { query: { ...query } });
  }

  /**
   * Finds sessions by what people said and answered in them and by their
   * titles (`q`, web-search syntax), narrowed by `state`,
   * `pendingApprovals`, `actor` and `since`/`until`; newest match first,
   * each with its newest matching passages (`after`: the previous page's
   * `nextAfter`).
   */
  searchSessions(query: SearchQuery = {}): Promise<SearchPage> {
    return this.request("GET", "/v1/search", { query: { ...query } });
  }

  /**
   * The token usage of the tenant's runs (the `usage` of their terminals),
   * summed per day in a time zone (`by: "day"`, the default; `zone`, e.g.
   * `Europe/Paris`, default UTC) or per session (`by: "session"`,
   * `sessions`: comma-separated ids), split by the model each run named
   * (`input.model` of its `run.started`); over `since`..`until` (default:
   * the last 30 days).
   */
  usage(query: UsageQuery = {}): Promise<UsagePage> {
    return this.request("GET", "/v1/usage", { query: { ...query } });
  }

  /**
   * Uploads bytes as a blob of a session: answers its reference (`uri`,
   * `narad://blobs/{blobId}`, for `attachment.added` / `artifact.added`),
   * size and SHA-256. With `attachmentId`, the server also adds it to the
   * session as that attachment.
   */
  async uploadBlob(sessionId: string, bytes: BlobBytes, options: UploadOptions): Promise<Schemas["Blob"]> {
    const query: Record<string, string> = { name: options.name };
    if (options.attachmentId !== undefined) {
      query["attachmentId"] = options.attachmentId;
    }
    const request: RequestOptions = {
      raw: { bytes, mediaType: options.mediaType ?? "application/octet-stream" },
      query,
    };
    return this.request("POST", `/v1/sessions/${encodeURIComponent(sessionId)}/blobs`, keyed(request, options));
  }

  /**
   * Downloads a blob, by its reference (`narad://blobs/{id}`) or id: the
   * response, whose body streams the bytes. `range` asks for bytes
   * `[first, last]` (206).
   */
  async downloadBlob(reference: string, options: { range?: [number, number]; signal?: AbortSignal } = {}): Promise<Response> {
    const id = blobIdOf(reference);
    const request: RequestOptions = {};
    if (options.range) {
      request.headers = { Range: `bytes=${options.range[0]}-${options.range[1]}` };
    }
    if (options.signal) {
      request.signal = options.signal;
    }
    return this.send("GET", `/v1/blobs/${encodeURIComponent(id)}`, request);
  }

  /**
   * A plain URL that reads a blob, by its reference or id, for a minute
   * without `Authorization` (an `<img src>`, a download link, a player's
   * range requests): a ticket bound to this token and to that one blob.
   */
  async blobUrl(reference: string): Promise<string> {
    const ticket = await this.streamTicket({ stream: "blob", blobId: blobIdOf(reference) });
    return (this.serversInTurn()[0] as string) + ticket.url;
  }

  /**
   * The open interrupts (requested, not yet resolved), the longest waiting
   * first, page by page: the tenant's (an approvals inbox), or one
   * session's with `sessionId`.
   */
  async *openInterrupts(query: { limit?: number; sessionId?: string } = {}): AsyncGenerator<OpenInterrupt> {
    let after: string | undefined;
    do {
      const page: InterruptPage = await this.request("GET", "/v1/interrupts", {
        query: after === undefined ? { ...query } : { ...query, after },
      });
      yield* page.interrupts;
      after = page.nextAfter;
    } while (after !== undefined);
  }

  /** The tenant's client executors with their leases, runtime queues and held runs (role admin). */
  operations(): Promise<Operations> {
    return this.request("GET", "/v1/operations");
  }

  /** Reads a session. */
  getSession(sessionId: string): Promise<SessionRecord> {
    return this.request("GET", `/v1/sessions/${encodeURIComponent(sessionId)}`);
  }

  /**
   * Appends a batch atomically (role backend). A retry of the same batch
   * (same eventIds and bodies) answers `duplicate: true`. `lease` is the
   * runtime lease of a claimed run.
   */
  appendEvents(
    sessionId: string,
    events: ProposedEvent[],
    options: { expectedSessionSequence?: number; lease?: string } = {},
  ): Promise<Appended> {
    const body: Schemas["AppendRequest"] = { events };
    if (options.expectedSessionSequence !== undefined) {
      body.expectedSessionSequence = options.expectedSessionSequence;
    }
    const headers: Record<string, string> = {};
    if (options.lease !== undefined) {
      headers["Narad-Runtime-Lease"] = options.lease;
    }
    return this.request("POST", `/v1/sessions/${encodeURIComponent(sessionId)}/events`, {
      body,
      headers,
    });
  }

  /** Reads one page of a session's history. */
  history(sessionId: string, query: HistoryQuery = {}, options: ReadOptions = {}): Promise<HistoryPage> {
    return this.request("GET", `/v1/sessions/${encodeURIComponent(sessionId)}/events`, {
      ...options,
      query: { ...query },
    });
  }

  /**
   * Every event of a session's history from `query`'s cursor on, page by
   * page, with whichever cursor form the query uses.
   */
  async *allHistory(sessionId: string, query: HistoryQuery = {}, options: ReadOptions = {}): AsyncGenerator<Schemas["AuthorityEvent"]> {
    let cursor: HistoryQuery = { ...query };
    for (;;) {
      const page = await this.history(sessionId, cursor, options);
      yield* page.events;
      const next = nextCursor(cursor, page);
      if (next === undefined || page.events.length === 0) {
        return;
      }
      cursor = next;
    }
  }

  /**
   * Sends command `name` (`start-run`, `resolve-interrupt`, …), keyed: its
   * `Idempotency-Key` (the caller's, or one made for this call) is the same
   * on every retry and failover, so a command whose answer was lost is
   * answered again, not carried out twice.
   */
  command<N extends CommandName>(name: N, body: CommandBody<N>, options: CallOptions = {}): Promise<CommandAnswer<N>> {
    return this.request("POST", `/v1/commands/${name}`, keyed({ body }, options));
  }

  /**
   * A stream ticket, for a browser's `EventSource` (which cannot send
   * `Authorization`): its `url` opens the stream for a minute.
   */
  streamTicket(request: TicketRequest, options: CallOptions = {}): Promise<StreamTicket> {
    return this.request("POST", "/v1/stream-tickets", keyed({ body: request }, options));
  }
}

/** The options given, without those given as undefined. */
function definedOf(options: RetryOptions | undefined): RetryOptions {
  const out: RetryOptions = {};
  if (options?.maxElapsedMs !== undefined) out.maxElapsedMs = options.maxElapsedMs;
  if (options?.initialBackoffMs !== undefined) out.initialBackoffMs = options.initialBackoffMs;
  if (options?.maxBackoffMs !== undefined) out.maxBackoffMs = options.maxBackoffMs;
  return out;
}

/** `request` with the call's `Idempotency-Key` (the caller's, or a new UUID) and signal. */
function keyed(request: RequestOptions, options: CallOptions): RequestOptions {
  const out: RequestOptions = { ...request, idempotencyKey: options.idempotencyKey ?? newKey() };
  if (options.signal) {
    out.signal = options.signal;
  }
  return out;
}

/** An `Idempotency-Key` as given, when it is one: 1 to 255 visible ASCII characters (no spaces). */
function checkedKey(key: string): string {
  if (!/^[\x21-\x7e]{1,255}$/.test(key)) {
    throw new TypeError(`an Idempotency-Key is 1 to 255 visible ASCII characters (no spaces), not ${JSON.stringify(key)}`);
  }
  return key;
}

/**
 * Whether a request may be sent again after it may have reached a server:
 * idempotent by its method, by its `Idempotency-Key`, or by its route
 * (appends carry eventIds; lease heartbeats and releases, executor
 * heartbeats and finishes take effect once). Claims are not.
 */
export function safeToSendAgain(method: string, path: string, headers: Record<string, string>): boolean {
  const m = method.toUpperCase();
  if (["GET", "HEAD", "OPTIONS", "PUT", "DELETE"].includes(m)) {
    return true;
  }
  if (Object.keys(headers).some((h) => h.toLowerCase() === "idempotency-key")) {
    return true;
  }
  if (m !== "POST") {
    return false;
  }
  return (
    /^\/v1\/sessions\/[^/]+\/events$/.test(path) ||
    /^\/v1\/runtime\/leases\/[^/]+\/(heartbeat|release)$/.test(path) ||
    /^\/v1\/executors\/[^/]+\/(heartbeat|finish)$/.test(path)
  );
}

/**
 * The error codes of a request that never left for a server: the
 * connection was refused or never made (the name not found, no route),
 * so nothing can have acted on it.
 */
const NOT_SENT = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EAI_NONAME",
  "EHOSTUNREACH",
  "EHOSTDOWN",
  "ENETUNREACH",
  "ENETDOWN",
  "EADDRNOTAVAIL",
  "UND_ERR_CONNECT_TIMEOUT",
]);

/**
 * Whether a fetch error means the request never reached a server. Node's
 * fetch (undici) throws `TypeError("fetch failed")` whose `cause` (or a
 * cause of it, or each error of an `AggregateError` when several
 * addresses were tried) has the socket's `code`: a refused or never-made
 * connection is one of {@link NOT_SENT}; a reset or closed connection
 * (`ECONNRESET`, `UND_ERR_SOCKET`), a timeout after connecting, or an error
 * with no code (a browser's) may have been sent. A port the Fetch standard
 * blocks (`bad port`) was never tried.
 */
export function neverSent(error: unknown): boolean {
  const seen = new Set<unknown>();
  const walk = (e: unknown): boolean => {
    if (e === null || typeof e !== "object" || seen.has(e)) {
      return false;
    }
    seen.add(e);
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && NOT_SENT.has(code)) {
      return true;
    }
    // A port fetch refuses to use (the Fetch standard's bad ports: 9, 25, …).
    if (e instanceof Error && e.message === "bad port") {
      return true;
    }
    if (e instanceof AggregateError && e.errors.length > 0 && e.errors.every((x) => walk(x))) {
      return true;
    }
    return walk((e as { cause?: unknown }).cause);
  };
  return walk(error);
}

/** A fetch error in a line: its message and its causes' codes and messages. */
function describe(error: unknown): string {
  const parts: string[] = [];
  for (let e: unknown = error, n = 0; e !== undefined && e !== null && n < 4; n++) {
    const code = (e as { code?: unknown }).code;
    parts.push(`${typeof code === "string" ? `${code} ` : ""}${e instanceof Error ? e.message : String(e)}`);
    e = (e as { cause?: unknown }).cause;
  }
  return parts.join(": ");
}

function throwIfAborted(signal: AbortSignal | undefined): void {
  if (signal?.aborted) {
    throw signal.reason ?? new DOMException("aborted", "AbortError");
  }
}

/** A blob's id, from its reference (`narad://blobs/{id}`) or the id itself. */
function blobIdOf(reference: string): string {
  return reference.startsWith(BLOB_REFERENCE) ? reference.slice(BLOB_REFERENCE.length) : reference;
}

/** The cursor of the page after `page`, in the form `query` used. */
function nextCursor(query: HistoryQuery, page: HistoryPage): HistoryQuery | undefined {
  if (query.rootRunId !== undefined) {
    return page.nextSequence === undefined ? undefined : { ...query, afterSequence: page.nextSequence };
  }
  if (query.workflowId !== undefined) {
    return page.nextWorkflowSequence === undefined
      ? undefined
      : { ...query, afterWorkflowSequence: page.nextWorkflowSequence };
  }
  return page.nextSessionSequence === undefined
    ? undefined
    : { ...query, afterSessionSequence: page.nextSessionSequence };
}

function queryString(query: RequestOptions["query"]): string {
  if (!query) {
    return "";
  }
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) {
    if (value !== undefined) {
      params.set(name, String(value));
    }
  }
  const text = params.toString();
  return text ? `?${text}` : "";
}
