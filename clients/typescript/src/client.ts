import { errorOf, NaradError } from "./errors.js";
import { nextWait, sleep } from "./wait.js";
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
  SessionPage,
  ProposedEvent,
  SessionRecord,
  Schemas,
  StreamTicket,
  TicketRequest,
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
}

/** A request's parts beyond its method and path. */
export interface RequestOptions {
  body?: unknown;
  /** Bytes sent as they are (instead of `body` as JSON), with their media type. */
  raw?: { bytes: BlobBytes; mediaType: string };
  query?: Record<string, string | number | boolean | undefined>;
  headers?: Record<string, string>;
  signal?: AbortSignal;
}

/**
 * narad's HTTP API: commands, sessions, appends and history, with errors
 * as {@link NaradError}. Requests go to the first server that answers; a
 * server that cannot be reached or answers 502–504 is left for the next;
 * a 429 (a limit of the tenant) is sent again once its `Retry-After` has
 * passed, within `maxRateLimitWaitMs`.
 */
export class NaradClient {
  readonly servers: readonly string[];
  private readonly token: TokenSource;
  /** The `fetch` requests and streams go through. */
  readonly fetchImpl: typeof fetch;
  private preferred = 0;
  private readonly maxRateLimitWaitMs: number;

  constructor(options: ClientOptions) {
    const servers = Array.isArray(options.servers) ? options.servers : [options.servers];
    if (servers.length === 0) {
      throw new Error("give at least one server URL");
    }
    this.servers = servers.map((s) => s.replace(/\/+$/, ""));
    this.token = options.token;
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.maxRateLimitWaitMs = options.maxRateLimitWaitMs ?? 60_000;
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

  /** Sends a request and answers the response of the first server that answers. */
  async send(method: string, path: string, options: RequestOptions = {}): Promise<Response> {
    const headers: Record<string, string> = {
      Authorization: `Bearer ${await this.bearer()}`,
      ...options.headers,
    };
    let body: BodyInit | undefined;
    if (options.raw !== undefined) {
      headers["Content-Type"] = options.raw.mediaType;
      body = options.raw.bytes as BodyInit;
    } else if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(options.body);
    }
    let last: NaradError | undefined;
    let waited = 0;
    for (let i = 0, servers = this.serversInTurn(); i < servers.length; i++) {
      const server = servers[i] as string;
      let response: Response;
      try {
        const init: RequestInit = { method, headers };
        if (body !== undefined) {
          init.body = body;
        }
        if (options.signal) {
          init.signal = options.signal;
        }
        response = await this.fetchImpl(server + path + queryString(options.query), init);
      } catch (e) {
        if (options.signal?.aborted) {
          throw e;
        }
        last = new NaradError(0, `${server} cannot be reached: ${String(e)}`);
        continue;
      }
      if ([502, 503, 504].includes(response.status)) {
        last = await errorOf(response);
        continue;
      }
      if (response.status === 429) {
        // Over a limit, refused before any effect: the same request is
        // sent again once the server's Retry-After has passed, within the
        // client's budget.
        const limited = await errorOf(response);
        const wait = nextWait(250, limited.retryAfterMs);
        if (waited + wait > this.maxRateLimitWaitMs || options.signal?.aborted) {
          throw limited;
        }
        await sleep(wait, options.signal);
        waited += wait;
        i -= 1;
        continue;
      }
      this.prefer(server);
      if (!response.ok) {
        throw await errorOf(response);
      }
      return response;
    }
    throw last ?? new NaradError(0, "no server answered");
  }

  /** Creates a session. */
  createSession(body: Schemas["commands.create-session"] = {}): Promise<SessionRecord> {
    return this.request("POST", "/v1/sessions", { body });
  }

  /** One page of the tenant's sessions, oldest first (`after`: the previous page's `nextAfter`). */
  listSessions(query: { after?: string; limit?: number } = {}): Promise<SessionPage> {
    return this.request("GET", "/v1/sessions", { query: { ...query } });
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
    if (options.signal) {
      request.signal = options.signal;
    }
    return this.request("POST", `/v1/sessions/${encodeURIComponent(sessionId)}/blobs`, request);
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
  history(sessionId: string, query: HistoryQuery = {}): Promise<HistoryPage> {
    return this.request("GET", `/v1/sessions/${encodeURIComponent(sessionId)}/events`, {
      query: { ...query },
    });
  }

  /**
   * Every event of a session's history from `query`'s cursor on, page by
   * page, with whichever cursor form the query uses.
   */
  async *allHistory(sessionId: string, query: HistoryQuery = {}): AsyncGenerator<Schemas["AuthorityEvent"]> {
    let cursor: HistoryQuery = { ...query };
    for (;;) {
      const page = await this.history(sessionId, cursor);
      yield* page.events;
      const next = nextCursor(cursor, page);
      if (next === undefined || page.events.length === 0) {
        return;
      }
      cursor = next;
    }
  }

  /** Sends command `name` (`start-run`, `resolve-interrupt`, …). */
  command<N extends CommandName>(name: N, body: CommandBody<N>): Promise<CommandAnswer<N>> {
    return this.request("POST", `/v1/commands/${name}`, { body });
  }

  /**
   * A stream ticket, for a browser's `EventSource` (which cannot send
   * `Authorization`): its `url` opens the stream for a minute.
   */
  streamTicket(request: TicketRequest): Promise<StreamTicket> {
    return this.request("POST", "/v1/stream-tickets", { body: request });
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
