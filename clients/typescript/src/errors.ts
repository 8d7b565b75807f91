import type { components } from "./generated/api.js";

/** The error envelope every refused request answers (docs/errors.md). */
export type ErrorBody = components["schemas"]["Error"];

/** A catalogued error code, `NRD-xxxx`. */
export type ErrorCode = ErrorBody["code"];

/** The code of a repeat of an `Idempotency-Key` while its first request is still being answered (409). */
export const IDEMPOTENCY_IN_FLIGHT = "NRD-0212";
/** The code of an `Idempotency-Key` used again with a different request (422). */
export const IDEMPOTENCY_KEY_REUSED = "NRD-0211";

/**
 * A request narad refused, or could not answer: the HTTP status, and the
 * envelope's code, message, rule, fields and details when the server sent
 * one. Every error the client throws for an answer is one of its
 * subclasses, by class of answer: {@link InvalidRequestError} (400, 422),
 * {@link AuthError} (401, 403), {@link NotFoundError} (404),
 * {@link ConflictError} (409), {@link GoneError} (410),
 * {@link RateLimitedError} (429), {@link UnavailableError} (no answer,
 * 502, 503, 504); any other status is a plain `NaradError`.
 */
export class NaradError extends Error {
  /** The HTTP status (0 when no server answered). */
  readonly status: number;
  /** The catalogued code, when the server sent the envelope. */
  readonly code: ErrorCode | undefined;
  /** The whole envelope, when the server sent one. */
  readonly body: ErrorBody | undefined;
  /** How long the server asked to wait before retrying (`Retry-After`). */
  readonly retryAfterMs: number | undefined;
  /** The request id to quote when reporting a server error. */
  readonly requestId: string | undefined;

  constructor(
    status: number,
    message: string,
    body?: ErrorBody,
    retryAfterMs?: number,
    requestId?: string,
    options?: { cause?: unknown },
  ) {
    super(body ? `${body.code}: ${body.message}` : message, options);
    this.name = "NaradError";
    this.status = status;
    this.code = body?.code;
    this.body = body;
    this.retryAfterMs = retryAfterMs;
    this.requestId = requestId;
  }

  /** The narad/v1 rule a refused event broke (NRD-0201), when the envelope names one. */
  get rule(): string | undefined {
    return this.body?.rule;
  }

  /** What is wrong at each JSON pointer of the request (`{"/events/1": "…"}`); empty when none. */
  get fields(): Record<string, string> {
    return this.body?.fields ?? {};
  }

  /**
   * Structured context from the envelope (the active execution a start
   * conflicts with, the decision an interrupt was already resolved with,
   * …); empty when none.
   */
  get details(): Record<string, unknown> {
    return this.body?.details ?? {};
  }

  /**
   * Whether the same request may succeed later: no answer, 429, a 5xx, or
   * a repeat of an `Idempotency-Key` whose first request is still being
   * answered (409 NRD-0212). Whether the client may send it again by
   * itself is another matter: see the retry policy of `NaradClient.send`.
   */
  get retryable(): boolean {
    return (
      this.status === 0 ||
      this.status === 429 ||
      this.status >= 500 ||
      (this.status === 409 && (this.code as string | undefined) === IDEMPOTENCY_IN_FLIGHT)
    );
  }
}

/** 400 or 422: the request itself is wrong (a field, a parameter, an `Idempotency-Key` reused for another request); sending it again changes nothing. */
export class InvalidRequestError extends NaradError {
  constructor(...args: ConstructorParameters<typeof NaradError>) {
    super(...args);
    this.name = "InvalidRequestError";
  }
}

/** 401 or 403: the credential is missing, expired, or lacks the role or the session. */
export class AuthError extends NaradError {
  constructor(...args: ConstructorParameters<typeof NaradError>) {
    super(...args);
    this.name = "AuthError";
  }
}

/** 404: no such session, run, interrupt, blob, … for this caller. */
export class NotFoundError extends NaradError {
  constructor(...args: ConstructorParameters<typeof NaradError>) {
    super(...args);
    this.name = "NotFoundError";
  }
}

/**
 * 409: the request conflicts with what the journal holds: a rule
 * (`rule`), a session busy (`details` names the active execution), an
 * interrupt resolved before (`details.decision`, {@link decision}), a
 * lease no longer current, an `Idempotency-Key` whose first request is
 * still being answered (NRD-0212, `retryAfterMs`; the client waits and
 * sends it again by itself within its retry budget).
 */
export class ConflictError extends NaradError {
  constructor(...args: ConstructorParameters<typeof NaradError>) {
    super(...args);
    this.name = "ConflictError";
  }

  /** The decision recorded before, when an interrupt was already resolved (NRD-0205). */
  get decision(): string | undefined {
    const d = this.details["decision"];
    return typeof d === "string" ? d : undefined;
  }
}

/** 410: erased (a session, NRD-0208; an organisation, NRD-0210) or expired (an execution token); stop using it. */
export class GoneError extends NaradError {
  constructor(...args: ConstructorParameters<typeof NaradError>) {
    super(...args);
    this.name = "GoneError";
  }
}

/** 429: over a limit of the tenant, refused before any effect; `retryAfterMs` says when to try again. */
export class RateLimitedError extends NaradError {
  constructor(...args: ConstructorParameters<typeof NaradError>) {
    super(...args);
    this.name = "RateLimitedError";
  }
}

/**
 * No server answered (status 0: unreachable, the connection lost), or one
 * answered 502, 503 or 504. `maybeProcessed` says whether a server may
 * have acted on the request before the answer was lost.
 */
export class UnavailableError extends NaradError {
  /**
   * False only when no server can have acted on the request: it was
   * refused before any effect (connection refused, the name not found, no
   * route). True when the connection was lost after the request was sent,
   * or a gateway answered 502–504, or narad answered 503.
   */
  readonly maybeProcessed: boolean;

  constructor(
    status: number,
    message: string,
    body?: ErrorBody,
    retryAfterMs?: number,
    requestId?: string,
    options?: { cause?: unknown; maybeProcessed?: boolean },
  ) {
    super(status, message, body, retryAfterMs, requestId, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "UnavailableError";
    this.maybeProcessed = options?.maybeProcessed ?? true;
  }
}

/** The error class of an answer's status. */
function classOf(status: number): typeof NaradError {
  switch (status) {
    case 400:
    case 422:
      return InvalidRequestError;
    case 401:
    case 403:
      return AuthError;
    case 404:
      return NotFoundError;
    case 409:
      return ConflictError;
    case 410:
      return GoneError;
    case 429:
      return RateLimitedError;
    case 0:
    case 502:
    case 503:
    case 504:
      return UnavailableError;
    default:
      return NaradError;
  }
}

/** The error of an answer that is not a success, of the subclass of its status. */
export async function errorOf(response: Response): Promise<NaradError> {
  const text = await response.text();
  let body: ErrorBody | undefined;
  try {
    const parsed: unknown = JSON.parse(text);
    if (parsed && typeof parsed === "object" && "code" in parsed) {
      body = parsed as ErrorBody;
    }
  } catch {
    body = undefined;
  }
  const Class = classOf(response.status);
  return new Class(
    response.status,
    `narad answered ${response.status}: ${text.slice(0, 200)}`,
    body,
    retryAfterOf(response.headers.get("retry-after")),
    response.headers.get("x-request-id") ?? undefined,
  );
}

/** A `Retry-After` header in ms: delay-seconds or an HTTP date; undefined when absent, past or malformed. */
export function retryAfterOf(header: string | null): number | undefined {
  if (header === null || header.trim() === "") {
    return undefined;
  }
  const seconds = Number(header);
  if (Number.isFinite(seconds)) {
    return seconds > 0 ? seconds * 1000 : undefined;
  }
  const at = Date.parse(header);
  if (Number.isNaN(at)) {
    return undefined;
  }
  const ms = at - Date.now();
  return ms > 0 ? ms : undefined;
}
