import type { components } from "./generated/api.js";

/** The error envelope every refused request answers (docs/errors.md). */
export type ErrorBody = components["schemas"]["Error"];

/** A catalogued error code, `NRD-xxxx`. */
export type ErrorCode = ErrorBody["code"];

/**
 * A request narad refused, or could not answer: the HTTP status, and the
 * envelope's code, message, rule and fields when the server sent one.
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
  ) {
    super(body ? `${body.code}: ${body.message}` : message);
    this.name = "NaradError";
    this.status = status;
    this.code = body?.code;
    this.body = body;
    this.retryAfterMs = retryAfterMs;
    this.requestId = requestId;
  }

  /** Whether retrying the same request later may succeed. */
  get retryable(): boolean {
    return this.status === 0 || this.status === 429 || this.status >= 500;
  }
}

/** The error of an answer that is not a success. */
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
  const retryAfter = Number(response.headers.get("retry-after"));
  return new NaradError(
    response.status,
    `narad answered ${response.status}: ${text.slice(0, 200)}`,
    body,
    Number.isFinite(retryAfter) && retryAfter > 0 ? retryAfter * 1000 : undefined,
    response.headers.get("x-request-id") ?? undefined,
  );
}
