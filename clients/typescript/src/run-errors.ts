/** What the steps of a run handler throw, and the codes the runtime writes. */
import { NaradError } from "./errors.js";
import type { ErrorBody } from "./errors.js";

/** The code of `NRD-0501`: the lease presented is not the run's current one. */
export const LEASE_NOT_CURRENT = "NRD-0501";

/** The code and message of the `run.cancelled` a stop ends in. */
export const STOPPED = "stopped";
/** The message of the `run.cancelled` a stop ends in. */
export const STOPPED_MESSAGE = "stopped on request";

/** The code of a backend tool call whose function threw. */
export const TOOL_ERROR = "tool_error";

/** The code of the `run.error` a handler that throws ends its run in (by default). */
export const HANDLER_ERROR = "handler_error";

/** The code the server closes a lost holder's work with. */
export const RUNTIME_LOST = "runtime_lost";

/**
 * The run was asked to stop: thrown by a step the handler takes after the
 * stop (and by a wait the stop interrupts). Let it propagate: the runtime
 * closes the run's open work and ends it with `run.cancelled` (`code:
 * "stopped"`), then releases it. A handler that wants another ending
 * catches it and calls `ctx.finish()` or `ctx.fail()` itself.
 */
export class RunStopped extends Error {
  /** The run that was asked to stop. */
  readonly runId: string;

  /** The stop of run `runId`. */
  constructor(runId: string) {
    super(`run ${runId} was asked to stop`);
    this.name = "RunStopped";
    this.runId = runId;
  }
}

/**
 * A step waits on a person (an approval) or a client executor (a client
 * tool call), and the runtime gives runs back while they wait
 * (`releaseWhenWaiting`): thrown by that step once what it waits for is
 * asked (its `interrupt.requested` / `tool.call.started` in the journal).
 * Let it propagate: the runtime completes the open messages and releases
 * the run; the answer queues it again, and the handler runs from the top,
 * replaying its finished steps to where it waited. A handler that catches
 * errors rethrows it, as it does `LeaseLost`.
 */
export class RunWaiting extends Error {
  /** The run that waits. */
  readonly runId: string;

  /** Run `runId` waits on a person or a client executor. */
  constructor(runId: string) {
    super(`run ${runId} waits on a decision or a client tool's result; it is given back meanwhile`);
    this.name = "RunWaiting";
    this.runId = runId;
  }
}

/**
 * The run's lease is no longer current (`409 NRD-0501`): it lapsed or was
 * released. Nothing of the refused request was written. Stop working on
 * the run: the server retries it on another runtime or ends it, as its
 * `onLost` says.
 */
export class LeaseLost extends NaradError {
  /** The refusal the server sent, or the one a context makes once it knows its lease is lost. */
  constructor(runId: string, refusal?: NaradError) {
    const body: ErrorBody = refusal?.body ?? {
      code: LEASE_NOT_CURRENT,
      title: "Runtime lease not current",
      message: `the runtime lease of run ${runId} is no longer current`,
    };
    super(409, body.message ?? "runtime lease not current", body, refusal?.retryAfterMs, refusal?.requestId);
    this.name = "LeaseLost";
  }
}

/**
 * A tool call ended with outcome `error` or `cancelled`: `outcome`, `code`,
 * `message` and `response` are its `tool.call.finished`'s.
 */
export class ToolFailed extends Error {
  /** The call. */
  readonly toolCallId: string;
  /** `error` or `cancelled`. */
  readonly outcome: string;
  /** Its code (`tool_error`, `client_execution_expired`, `runtime_lost`, …), if any. */
  readonly code: string | undefined;
  /** Its user-safe message, if any. */
  readonly detail: string | undefined;
  /** Its response (any JSON). */
  readonly response: unknown;

  /** The failure of call `toolCallId`, from its `tool.call.finished`'s fields. */
  constructor(toolCallId: string, finished: { readonly [field: string]: unknown }, options?: { cause?: unknown }) {
    const outcome = String(finished["outcome"]);
    const code = typeof finished["code"] === "string" ? finished["code"] : undefined;
    const detail = typeof finished["message"] === "string" ? finished["message"] : undefined;
    super(
      `tool call ${toolCallId} ended ${outcome}${code ? ` (${code})` : ""}${detail ? `: ${detail}` : ""}`,
      options?.cause === undefined ? undefined : { cause: options.cause },
    );
    this.name = "ToolFailed";
    this.toolCallId = toolCallId;
    this.outcome = outcome;
    this.code = code;
    this.detail = detail;
    this.response = finished["response"];
  }
}
