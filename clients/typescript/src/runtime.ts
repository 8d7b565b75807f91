import type { NaradClient } from "./client.js";
import { NaradError } from "./errors.js";
import type { Appended, AuthorityEvent, ProposedEvent, Schemas } from "./types.js";

/** A run handed to this runtime by a claim. */
export type Claim = Schemas["Claim"];

/** A lease's standing, as a heartbeat or a controls poll reports it. */
export type LeaseStanding = Schemas["LeaseStanding"];

/** What a run handler works with. */
export interface RunContext {
  /** The claim: the run, its session, the cursor, the lease. */
  readonly claim: Claim;
  /** Aborted when the run is asked to stop or the lease is lost. */
  readonly signal: AbortSignal;
  /** Whether the run was asked to stop: close its work and end it (run.cancelled). */
  stopRequested(): boolean;
  /** Whether the lease was lost: nothing more may be appended. */
  lost(): boolean;
  /** The session's events after the claim's cursor (and after what this run read since). */
  history(): AsyncGenerator<AuthorityEvent>;
  /** Appends under the run's lease. */
  append(events: ProposedEvent[]): Promise<Appended>;
}

/** Works on one claimed run; returns when done with it for now. Throwing leaves the run to its lease's lapse. */
export type RunHandler = (context: RunContext) => Promise<void>;

/** How a runtime claims. */
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
  /**
   * Told of every handler that throws, with its claim (default: a line on
   * `console.error`). The run is not released: its lease lapses and the
   * run's `onLost` policy applies (another runtime retries it, or the
   * server ends it `run.error`).
   */
  onError?: (error: unknown, claim: Claim) => void;
}

/**
 * An agent runtime loop for Node (or any runtime with `fetch`): claims
 * queued runs while it has a free slot, renews each lease and long-polls
 * its controls (a stop reaches the handler within about a second through
 * `signal` and `stopRequested()`), and releases a run when its handler
 * returns, with `handledThrough` = the last sessionSequence the handler
 * read or wrote. A handler that throws is reported (`onError`, or a line
 * on `console.error`) and not released: its lease lapses and the run's
 * `onLost` policy applies.
 */
export class Runtime {
  private stopped = false;
  private active = 0;
  private slotFreed: (() => void) | undefined;
  private readonly running = new Set<Promise<void>>();

  constructor(
    private readonly client: NaradClient,
    private readonly options: RuntimeOptions,
  ) {}

  /** Claims and serves runs until {@link stop}; then waits for the runs it holds. */
  async run(): Promise<void> {
    const concurrency = this.options.concurrency ?? 4;
    while (!this.stopped) {
      if (this.active >= concurrency) {
        await new Promise<void>((resolve) => (this.slotFreed = resolve));
        continue;
      }
      let claim: Claim | undefined;
      try {
        claim = await this.claim();
      } catch (e) {
        if (e instanceof NaradError && !e.retryable) {
          throw e;
        }
        await new Promise((r) => setTimeout(r, 1000));
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
  }

  /** Stops claiming (a claim waiting now ends within its wait); runs held go on to their end. */
  stop(): void {
    this.stopped = true;
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
    return this.client.request<Claim | undefined>("POST", "/v1/runtime/claims", { body });
  }

  /** Serves one claimed run: keeps its lease, runs the handler, releases it. */
  private async serve(claim: Claim): Promise<void> {
    const controller = new AbortController();
    const leaseId = claim.lease.leaseId;
    const lease = `/v1/runtime/leases/${encodeURIComponent(leaseId)}`;
    let stopRequested = claim.stopRequested;
    let lost = false;
    let done = false;
    let handledThrough = claim.cursor;
    if (stopRequested) {
      controller.abort("stop");
    }
    const standing = (s: LeaseStanding) => {
      if (s.stopRequested && !stopRequested) {
        stopRequested = true;
        controller.abort("stop");
      }
    };
    const keeper = (async () => {
      let renewAt = 0;
      while (!done) {
        try {
          if (Date.now() >= renewAt) {
            const renewed = await this.client.request<LeaseStanding>("POST", `${lease}/heartbeat`);
            standing(renewed);
            const left = Date.parse(renewed.expiresAt) - Date.now();
            renewAt = Date.now() + Math.max(500, left / 3);
          }
          standing(await this.client.request<LeaseStanding>("GET", `${lease}/controls`, { query: { waitMs: 1000 } }));
        } catch (e) {
          if (e instanceof NaradError && e.status === 409) {
            lost = true;
            controller.abort("lost");
            return;
          }
          await new Promise((r) => setTimeout(r, 500));
        }
      }
    })();
    const client = this.client;
    const context: RunContext = {
      claim,
      signal: controller.signal,
      stopRequested: () => stopRequested,
      lost: () => lost,
      async *history() {
        for await (const event of client.allHistory(claim.sessionId, { afterSessionSequence: handledThrough })) {
          handledThrough = Math.max(handledThrough, event.sessionSequence);
          yield event;
        }
      },
      async append(events) {
        const appended = await client.appendEvents(claim.sessionId, events, { lease: leaseId });
        for (const e of appended.events) {
          handledThrough = Math.max(handledThrough, e.sessionSequence);
        }
        return appended;
      },
    };
    try {
      await this.options.handler(context);
      if (!lost) {
        await this.client.request("POST", `${lease}/release`, { body: { handledThrough } });
      }
    } catch (error) {
      // Not released: the lease lapses and the run's onLost policy applies.
      // Said, never swallowed.
      const report =
        this.options.onError ??
        ((e: unknown, c: Claim) =>
          console.error(
            `narad runtime: the handler of run ${c.runId} (session ${c.sessionId}) failed; its lease is ` +
              `left to lapse and the run's onLost policy applies:`,
            e,
          ));
      try {
        report(error, claim);
      } catch (hook) {
        console.error("narad runtime: onError threw", hook);
      }
    } finally {
      done = true;
      await keeper;
    }
  }
}
