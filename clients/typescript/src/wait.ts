/** Waiting between tries. */

/** Resolves after `ms`, or at once when `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve();
      return;
    }
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/** The wait before the next try: the backoff, or longer when the server asked (`Retry-After`). */
export function nextWait(backoffMs: number, retryAfterMs: number | undefined): number {
  return Math.max(backoffMs, retryAfterMs ?? 0);
}
