import type { NaradClient, ReadOptions } from "./client.js";
import { errorOf, NaradError } from "./errors.js";
import { nextWait, sleep } from "./wait.js";
import { parseSse } from "./sse.js";
import type { AuthorityEvent, Capabilities, HydrateRecord, ReplayGap, WatchEvent } from "./types.js";

/** One frame of a stream, decoded. */
export type Frame =
  | { kind: "capabilities"; capabilities: Capabilities }
  | {
      kind: "authority";
      id: string;
      event: AuthorityEvent;
      /** Read from history to fill a gap in the stream, not from the stream itself. */
      fromHistory?: true;
    }
  | { kind: "watch"; id: string; event: WatchEvent }
  | { kind: "hydrate"; record: HydrateRecord }
  | { kind: "replay-gap"; gap: ReplayGap }
  /** The session was erased: nothing of it is left; a session's follow ends here. */
  | { kind: "session-erased"; sessionId: string };

/** What to follow, and from where. */
export interface FollowOptions {
  /** A session's stream; without it, the tenant stream (`GET /v1/events`). */
  sessionId?: string;
  /** On the tenant stream: only this session's events. */
  onlySession?: string;
  /** Resume after this frame id (what `Frame.id` gave). */
  lastEventId?: string;
  /** On a session stream, with no `lastEventId`: start after this sessionSequence. */
  afterSessionSequence?: number;
  /** The profiles to negotiate (default: every profile). */
  profiles?: string[];
  /** Stops the stream. */
  signal?: AbortSignal;
  /** The first wait before reconnecting, in ms (default 250); it doubles up to `maxBackoffMs`. */
  initialBackoffMs?: number;
  /** The longest wait between reconnects, in ms (default 10,000). */
  maxBackoffMs?: number;
  /**
   * Called each time a connection that was open ends and the follow goes on
   * to reconnect (a restart, a network fault, a replay block): until the
   * next frame arrives, nothing is live. A session stream's first frame on
   * a new connection is `capabilities`.
   */
  onDisconnected?: () => void;
}

/**
 * Follows a session's stream, or the tenant's, for as long as the caller
 * reads (or until `signal` aborts): it reconnects when a connection ends
 * (a replay block, a restart, a network fault) with `Last-Event-ID`, tries
 * the client's servers in turn with exponential backoff, and never yields
 * an authority event twice (a session's sessionSequence only grows) nor
 * past a gap: when a session's next event skips sequences (retention
 * forgot rows before a slow reader got them, announced by a `replay-gap`
 * frame, which is yielded too), the missing events are read from history
 * and yielded first, marked `fromHistory`; a `replay-gap` that names its
 * session fills that session at once. A
 * refusal that no retry can mend (401, 403, 404, or a cursor the store
 * does not know: 409 NRD-0302/0303) is thrown as {@link NaradError}.
 */
export async function* follow(client: NaradClient, options: FollowOptions = {}): AsyncGenerator<Frame> {
  let lastEventId = options.lastEventId;
  const initial = options.initialBackoffMs ?? 250;
  const maxBackoff = options.maxBackoffMs ?? 10_000;
  let backoff = initial;
  const seen = new Map<string, number>();
  const path = options.sessionId
    ? `/v1/sessions/${encodeURIComponent(options.sessionId)}/stream`
    : "/v1/events";
  // The longest wait the servers asked for since the last try (Retry-After).
  let asked: number | undefined;
  while (!options.signal?.aborted) {
    let progressed = false;
    for (const server of client.serversInTurn()) {
      const opened = await open(client, server, path, options, lastEventId);
      if (!(opened instanceof Response)) {
        asked = Math.max(asked ?? 0, opened.retryAfterMs ?? 0);
        continue;
      }
      const response = opened;
      client.prefer(server);
      try {
        for await (const sse of parseSse(response.body as ReadableStream<Uint8Array>, lastEventId ?? "")) {
          const frame = decode(sse.event, sse.data, sse.ownId ? sse.id : undefined);
          if (frame === undefined) {
            continue;
          }
          progressed = true;
          backoff = initial;
          if (frame.kind === "authority") {
            const session = frame.event.sessionId;
            const sequence = frame.event.sessionSequence;
            const last = seen.get(session);
            if (sequence <= (last ?? 0)) {
              if (sse.ownId) {
                lastEventId = sse.id;
              }
              continue;
            }
            if (last !== undefined && sequence > last + 1) {
              // Should history not answer, the stream resumes before this frame.
              yield* fill(client, session, last, sequence, seen, options.signal);
            }
            seen.set(session, sequence);
          }
          yield frame;
          // The cursor moves once the frame is the caller's.
          if (sse.ownId) {
            lastEventId = sse.id;
          }
          if (frame.kind === "session-erased" && frame.sessionId === options.sessionId) {
            // Erased: reconnecting would only be answered 410.
            return;
          }
          if (frame.kind === "replay-gap" && frame.gap.sessionId !== undefined) {
            const last = seen.get(frame.gap.sessionId);
            if (last !== undefined) {
              yield* fill(client, frame.gap.sessionId, last, undefined, seen, options.signal);
            }
          }
        }
      } catch (e) {
        if (options.signal?.aborted) {
          return;
        }
        // A connection cut mid-frame: resume from the last whole frame. A
        // gap history could not fill now: resume too, after a backoff.
        if (e instanceof FillInterrupted) {
          progressed = false;
        }
      } finally {
        // Ended here, or by the caller (a `break`, a `return`): the
        // connection is closed now, not when it is collected.
        response.body?.cancel().catch(() => undefined);
      }
      if (!options.signal?.aborted) {
        options.onDisconnected?.();
      }
      break;
    }
    if (options.signal?.aborted) {
      return;
    }
    if (!progressed) {
      await sleep(nextWait(backoff, asked), options.signal);
      asked = undefined;
      backoff = Math.min(backoff * 2, maxBackoff);
    }
  }
}

/**
 * A session's authority after `after` (and before `before`, when given),
 * read from history; `seen` follows what is yielded.
 */
async function* fill(
  client: NaradClient,
  sessionId: string,
  after: number,
  before: number | undefined,
  seen: Map<string, number>,
  signal: AbortSignal | undefined,
): AsyncGenerator<Frame> {
  try {
    // One try per server: on failure this follow's own backoff and
    // reconnection retry, from before the frame that found the gap.
    const read: ReadOptions = { retry: { maxElapsedMs: 0 } };
    if (signal !== undefined) read.signal = signal;
    for await (const event of client.allHistory(sessionId, { afterSessionSequence: after }, read)) {
      if (before !== undefined && event.sessionSequence >= before) {
        return;
      }
      seen.set(sessionId, event.sessionSequence);
      yield { kind: "authority", id: event.eventId, event, fromHistory: true };
    }
  } catch (e) {
    // History refuses for good (the session is gone, or not this
    // caller's): the gap stays, and a reducer fed the frames says so.
    if (e instanceof NaradError && !e.retryable) {
      return;
    }
    throw new FillInterrupted(e);
  }
}

/** History did not answer while a gap was being filled: try again later. */
class FillInterrupted extends Error {
  constructor(readonly reason: unknown) {
    super("history did not answer while a gap was being filled");
  }
}

/**
 * Opens the stream on one server: its response, or (to try another, or
 * later) how long the server asked to wait, if it did.
 */
async function open(
  client: NaradClient,
  server: string,
  path: string,
  options: FollowOptions,
  lastEventId: string | undefined,
): Promise<Response | { retryAfterMs: number | undefined }> {
  const query = new URLSearchParams();
  if (options.profiles) {
    query.set("profiles", options.profiles.join(","));
  }
  if (options.onlySession !== undefined) {
    query.set("sessionId", options.onlySession);
  }
  if (lastEventId === undefined && options.afterSessionSequence !== undefined) {
    query.set("afterSessionSequence", String(options.afterSessionSequence));
  }
  const headers: Record<string, string> = {
    Authorization: `Bearer ${await client.bearer()}`,
    Accept: "text/event-stream",
  };
  if (lastEventId !== undefined) {
    headers["Last-Event-ID"] = lastEventId;
  }
  const text = query.toString();
  let response: Response;
  try {
    const init: RequestInit = { headers };
    if (options.signal) {
      init.signal = options.signal;
    }
    response = await client.fetchImpl(server + path + (text ? `?${text}` : ""), init);
  } catch {
    return { retryAfterMs: undefined };
  }
  if (response.ok && response.body) {
    return response;
  }
  // Over a limit (429), or unavailable: refused at open; try again when
  // the server says.
  const error = await errorOf(response);
  if (error.retryable) {
    return { retryAfterMs: error.retryAfterMs };
  }
  throw error;
}

/** A frame from an SSE event's name, data and own id. */
export function decode(event: string, data: string, id: string | undefined): Frame | undefined {
  let value: unknown;
  try {
    value = JSON.parse(data);
  } catch {
    return undefined;
  }
  switch (event) {
    case "capabilities":
      return { kind: "capabilities", capabilities: value as Capabilities };
    case "hydrate":
      return { kind: "hydrate", record: value as HydrateRecord };
    case "replay-gap":
      return { kind: "replay-gap", gap: value as ReplayGap };
    case "session-erased": {
      const sessionId = (value as { sessionId?: unknown }).sessionId;
      return typeof sessionId === "string" ? { kind: "session-erased", sessionId } : undefined;
    }
    case "message": {
      if (id === undefined) {
        return undefined;
      }
      const object = value as { sessionSequence?: unknown };
      return typeof object.sessionSequence === "number"
        ? { kind: "authority", id, event: value as AuthorityEvent }
        : { kind: "watch", id, event: value as WatchEvent };
    }
    default:
      return undefined;
  }
}

export { NaradError };
