/**
 * An agent runtime: claims the runs queued for agent runtimes (a
 * `start-run` with `runtime`), runs a handler on each under a renewed
 * lease with a {@link RunContext}, and gives the run back when the handler
 * returns.
 *
 * The loop ({@link Runtime.run}), round trip by round trip:
 *
 * - `POST /v1/runtime/claims {queue?, runtimeId?, waitMs}`: a long poll,
 *   sent only while one of `concurrency` slots is free. A claim carries the
 *   run, its session, a `cursor` and a lease.
 * - Per claim: `GET /v1/sessions/{id}/events?rootRunId=&afterSequence=`
 *   reads the run's journal (what earlier holders did, for replay), then
 *   the handler runs. Meanwhile `POST /v1/runtime/leases/{id}/heartbeat`
 *   renews the lease and `GET /v1/runtime/leases/{id}/controls` long-polls
 *   for a stop, so a stop reaches the handler within about a second
 *   (`ctx.signal`, `ctx.stopRequested()`, and `RunStopped` from the next
 *   step). A 409 on either means the lease was lost: `ctx.signal` aborts
 *   and nothing more can be appended.
 * - When the handler returns, or throws `RunStopped`, the run is closed if
 *   it was asked to stop (open work first, then `run.cancelled`) and
 *   released (`POST /v1/runtime/leases/{id}/release {handledThrough}`). A
 *   handler that throws anything else is reported (`onError`, or a line on
 *   `console.error`) and its run ends `run.error` (`handler_error`), its
 *   open work closed first, then released; a run whose lease was lost is
 *   left to the server (its `onLost` policy: another holder, or
 *   `run.error`).
 * - With `releaseWhenWaiting`, a step that waits on a person or a client
 *   executor throws `RunWaiting` once it has asked: the open messages are
 *   completed and the run released (`handledThrough` = what the context
 *   read or wrote), freeing the slot. The decision or the result is an
 *   event of the run's journal after `handledThrough`, which queues the run
 *   again: a later claim (`reason: "event"`, here or on another runtime)
 *   runs the handler from the top, which replays its finished steps to the
 *   wait and goes on from the answer.
 */
import type { NaradClient } from "./client.js";
import { NaradError } from "./errors.js";
import { HANDLER_ERROR, LeaseLost, RunStopped, RunWaiting } from "./run-errors.js";
import { RunContext } from "./run-context.js";
import type { Claim, RunContextOptions } from "./run-context.js";
import type { Schemas } from "./types.js";
import { sleep } from "./wait.js";

export type { Claim } from "./run-context.js";
export { RunContext } from "./run-context.js";

/** A lease's standing, as a heartbeat or a controls poll reports it. */
export type LeaseStanding = Schemas["LeaseStanding"];

/** Works on one claimed run; returns when done with it for now (see {@link RunContext}). */
export type RunHandler = (context: RunContext) => Promise<void>;

/** The code and user-safe message of the `run.error` a handler's error ends its run in. */
export interface RunFailure {
  /** An opaque machine string (default `handler_error`). */
  code: string;
  /** Sanitised, user-safe text: it is stored in the journal and shown to people. */
  message: string;
}

/** How a runtime claims and serves. */
export interface RuntimeOptions {
  /** The handler of every claimed run. */
  handler: RunHandler;
  /** Only runs of this queue (default: any). */
  queue?: string;
  /** The name it claims under (default: the token's subject). */
  runtimeId?: string;
  /** How many runs it holds at once (default 4). */
  concurrency?: number;
  /** How long one claim waits for a run, in ms (default 20,000; at most 30,000). */
  waitMs?: number;
  /** How long said text may wait before it goes out as one delta, in ms (default 50). */
  deltaWindowMs?: number;
  /** How many characters of said text go out at once without waiting (default 256). */
  deltaChars?: number;
  /**
   * Gives a run back while a step waits on a person (`ctx.approve`) or a
   * client executor (`ctx.clientTool`) instead of holding it, and a slot,
   * until the answer comes: the answer queues the run again, and the
   * handler runs again from the top, replaying its finished steps (default
   * false). The Python runtime's `release_when_waiting`.
   */
  releaseWhenWaiting?: boolean;
  /**
   * Told of every handler that throws (but for `RunStopped`), with its
   * claim (default: a line on `console.error` naming the run and what
   * happens to it). The run then ends `run.error` (see `failWith`), unless
   * its lease was lost: then the server applies the run's `onLost` policy.
   */
  onError?: (error: unknown, claim: Claim) => void;
  /**
   * The code and user-safe message of the `run.error` a handler's error
   * ends its run in (default `handler_error`, "the agent failed"). The
   * error itself goes to `onError` and the log, never to the journal.
   */
  failWith?: (error: unknown, claim: Claim) => RunFailure;
}

/** The `run.error` of a handler's error, unless `failWith` says otherwise. */
const DEFAULT_FAILURE: RunFailure = {
  code: HANDLER_ERROR,
  message: "the agent failed: its handler met an error",
};

/**
 * An agent runtime loop for Node (or any runtime with `fetch`): claims
 * queued runs while it has a free slot, renews each lease and long-polls
 * its controls, runs the handler with a {@link RunContext}, and releases
 * the run when the handler returns, with `handledThrough` = the last
 * sessionSequence the context read or wrote. See the module documentation
 * for stops, errors and lost leases.
 *
 * ```ts
 * const runtime = new Runtime(narad, {
 *   queue: "agents",
 *   handler: async (ctx) => {
 *     await ctx.say("Hello");
 *     await ctx.finish();
 *   },
 * });
 * await runtime.run(); // until runtime.stop()
 * ```
 */
export class Runtime {
  private stopped = false;
  private active = 0;
  private slotFreed: (() => void) | undefined;
  private claiming: AbortController | undefined;
  private readonly running = new Set<Promise<void>>();
  private readonly contexts = new Map<string, RunContext>();

  /** A runtime of `client` with `options`. */
  constructor(
    private readonly client: NaradClient,
    private readonly options: RuntimeOptions,
  ) {
    if (options.concurrency !== undefined && options.concurrency < 1) {
      throw new RangeError("concurrency must be at least 1");
    }
    if (options.queue !== undefined && options.queue === "") {
      throw new RangeError("queue must not be empty");
    }
  }

  /** The runs this runtime holds now. */
  get held(): RunContext[] {
    return [...this.contexts.values()];
  }

  /**
   * Claims and serves runs until {@link stop}; then waits for the runs it
   * holds. A server that does not answer is tried again; a refusal of the
   * claim itself (a bad token, a role missing) ends the loop with that
   * `NaradError`, once the runs held are done.
   */
  async run(): Promise<void> {
    const concurrency = this.options.concurrency ?? 4;
    let failure: unknown;
    while (!this.stopped) {
      if (this.active >= concurrency) {
        await new Promise<void>((resolve) => (this.slotFreed = resolve));
        continue;
      }
      let claim: Claim | undefined;
      try {
        claim = await this.claim();
      } catch (e) {
        if (this.stopped) {
          break;
        }
        if (e instanceof NaradError && !e.retryable) {
          failure = e;
          break;
        }
        await sleep(1000);
        continue;
      }
      if (claim) {
        this.active += 1;
        const serving = this.serve(claim).finally(() => {
          this.active -= 1;
          this.running.delete(serving);
          this.slotFreed?.();
        });
        this.running.add(serving);
      }
    }
    await Promise.all(this.running);
    if (failure !== undefined) {
      throw failure;
    }
  }

  /**
   * Stops claiming (a claim waiting now is given up: a run the server
   * handed it meanwhile goes to another runtime once its lease lapses);
   * runs held go on to their end, then {@link run} returns.
   */
  stop(): void {
    this.stopped = true;
    this.claiming?.abort();
    this.slotFreed?.();
  }

  private async claim(): Promise<Claim | undefined> {
    const body: Schemas["ClaimRequest"] = { waitMs: Math.min(this.options.waitMs ?? 20_000, 30_000) };
    if (this.options.queue !== undefined) {
      body.queue = this.options.queue;
    }
    if (this.options.runtimeId !== undefined) {
      body.runtimeId = this.options.runtimeId;
    }
    const claiming = new AbortController();
    this.claiming = claiming;
    try {
      return await this.client.request<Claim | undefined>("POST", "/v1/runtime/claims", { body, signal: claiming.signal });
    } finally {
      this.claiming = undefined;
    }
  }

  /** Serves one claimed run: keeps its lease, runs the handler, closes and releases the run. */
  private async serve(claim: Claim): Promise<void> {
    const contextOptions: RunContextOptions = {};
    if (this.options.releaseWhenWaiting) {
      contextOptions.releaseWhenWaiting = true;
    }
    if (this.options.deltaWindowMs !== undefined) {
      contextOptions.deltaWindowMs = this.options.deltaWindowMs;
    }
    if (this.options.deltaChars !== undefined) {
      contextOptions.deltaChars = this.options.deltaChars;
    }
    const ctx = new RunContext(this.client, claim, contextOptions);
    this.contexts.set(claim.lease.leaseId, ctx);
    const keeping = { done: false, wake: new AbortController() };
    const keeper = this.keep(ctx, keeping);
    try {
      if (await this.handle(ctx)) {
        await this.release(ctx);
      }
    } finally {
      ctx._close();
      keeping.done = true;
      keeping.wake.abort();
      await keeper;
      this.contexts.delete(claim.lease.leaseId);
    }
  }

  /** Runs the handler and ends what it leaves; whether to release the run. */
  private async handle(ctx: RunContext): Promise<boolean> {
    try {
      await this.readJournal(ctx);
      if (!ctx.ended) {
        await this.options.handler(ctx);
        await ctx._settle();
      }
    } catch (error) {
      if (error instanceof RunWaiting && !ctx.lost() && !ctx.stopRequested()) {
        // Given back while it waits: the answer queues it again.
        try {
          await ctx._settle();
        } catch (closing) {
          this.report(closing, ctx, "completing its messages before the release failed: its lease is left to lapse");
          return false;
        }
        return true;
      }
      if (error instanceof RunStopped || (error instanceof RunWaiting && !ctx.lost())) {
        ctx._requestStop(); // a RunWaiting here met a stop: closed as one
      } else if (error instanceof LeaseLost || ctx.lost()) {
        this.report(error, ctx, "its lease was lost, so the server retries the run or ends it as its onLost policy says");
        return false;
      } else if (ctx.ended) {
        this.report(error, ctx, "after the run had ended");
        return true;
      } else {
        const failure = this.failure(error, ctx.claim);
        this.report(error, ctx, `the run ends run.error ${failure.code}`);
        try {
          await ctx.fail(failure.code, failure.message);
        } catch (closing) {
          this.report(closing, ctx, "and the run could not be ended: its lease is left to lapse");
          return false;
        }
        return true;
      }
    }
    if (ctx.stopRequested() && !ctx.ended && !ctx.lost()) {
      try {
        await ctx.cancel();
      } catch (closing) {
        this.report(closing, ctx, "closing the stopped run failed: its lease is left to lapse");
        return false;
      }
    }
    return !ctx.lost();
  }

  /** Reads the run's journal before the handler runs, through a server that does not answer for a while. */
  private async readJournal(ctx: RunContext): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        await ctx.sync();
        return;
      } catch (e) {
        if (!(e instanceof NaradError) || !e.retryable || attempt >= 20 || ctx.lost()) {
          throw e;
        }
        await sleep(Math.min(2000, 100 * 2 ** attempt), ctx.signal);
      }
    }
  }

  private failure(error: unknown, claim: Claim): RunFailure {
    if (this.options.failWith === undefined) {
      return DEFAULT_FAILURE;
    }
    try {
      const chosen = this.options.failWith(error, claim);
      return chosen.code && chosen.message ? chosen : DEFAULT_FAILURE;
    } catch (e) {
      console.error("narad runtime: failWith threw", e);
      return DEFAULT_FAILURE;
    }
  }

  /** Tells `onError` (or the log) of a handler's error, and what happens to the run. */
  private report(error: unknown, ctx: RunContext, next: string): void {
    const hook =
      this.options.onError ??
      ((e: unknown, c: Claim) =>
        console.error(`narad runtime: the handler of run ${c.runId} (session ${c.sessionId}) failed; ${next}:`, e));
    try {
      hook(error, ctx.claim);
    } catch (e) {
      console.error("narad runtime: onError threw", e);
    }
  }

  private async release(ctx: RunContext): Promise<void> {
    const path = `/v1/runtime/leases/${encodeURIComponent(ctx.leaseId)}/release`;
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        await this.client.request("POST", path, { body: { handledThrough: ctx.handledThrough } });
        return;
      } catch (e) {
        if (e instanceof NaradError && e.retryable && attempt < 2) {
          await sleep(500 * (attempt + 1));
          continue;
        }
        // Not released: the lease lapses and the server applies the run's onLost policy.
        console.error(`narad runtime: run ${ctx.runId} could not be released; its lease lapses:`, e);
        return;
      }
    }
  }

  /** Keeps a run's lease: renews it and long-polls its controls until the run is served. */
  private async keep(ctx: RunContext, keeping: { done: boolean; wake: AbortController }): Promise<void> {
    const lease = `/v1/runtime/leases/${encodeURIComponent(ctx.leaseId)}`;
    const standing = (s: LeaseStanding) => {
      if (s.stopRequested) {
        ctx._requestStop();
      }
      return s;
    };
    let renewAt = 0;
    while (!keeping.done) {
      try {
        if (Date.now() >= renewAt) {
          const renewed = standing(await this.client.request<LeaseStanding>("POST", `${lease}/heartbeat`));
          const left = Date.parse(renewed.expiresAt) - Date.now();
          renewAt = Date.now() + Math.max(500, left / 3);
        }
        standing(
          await this.client.request<LeaseStanding>("GET", `${lease}/controls`, {
            query: { waitMs: 1000 },
            signal: keeping.wake.signal,
          }),
        );
      } catch (e) {
        if (keeping.done) {
          return;
        }
        if (e instanceof NaradError && e.status === 409) {
          ctx._leaseRefused();
          return;
        }
        await sleep(500, keeping.wake.signal);
      }
    }
  }
}
