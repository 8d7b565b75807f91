/** Waiting between tries. */

/** Resolves after `ms`, or at once when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve();
      return;
    }
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** The wait before the next try: the backoff, or longer when the server asked (`Retry-After`). */
export function nextWait(backoffMs: number, retryAfterMs: number | undefined): number {
  return Math.max(backoffMs, retryAfterMs ?? 0);
}

/**
 * The backoff before retry number `attempt` (0 for the first): exponential
 * with full jitter, a random wait between 0 and `initialBackoffMs · 2^attempt`,
 * that ceiling capped at `maxBackoffMs`.
 */
export function backoffWait(attempt: number, options: { initialBackoffMs: number; maxBackoffMs: number }): number {
  const ceiling = Math.min(options.maxBackoffMs, options.initialBackoffMs * 2 ** Math.min(attempt, 30));
  return Math.random() * ceiling;
}
