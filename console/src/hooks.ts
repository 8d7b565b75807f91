/** Preact hooks over the live models. */
import { useEffect, useState } from "preact/hooks";

import type { Observable } from "./live.js";

/** Re-renders the component whenever `o` changes (at most once per frame). */
export function useObservable(o: Observable | undefined): void {
  const [, set] = useState(o?.version ?? 0);
  useEffect(() => o?.subscribe(() => set(o.version)), [o]);
}

/** "3 s ago", "5 min ago", … for a time in ms since the epoch. */
export function ago(ms: number, now = Date.now()): string {
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

/** Re-renders every `ms` (for relative times). */
export function useTick(ms: number): number {
  const [now, set] = useState(Date.now());
  useEffect(() => {
    const t = setInterval(() => set(Date.now()), ms);
    return () => clearInterval(t);
  }, [ms]);
  return now;
}

/**
 * Calls `read` at once and then every `ms` until the component goes or
 * `deps` change; `read` is told whether its answer still matters
 * (`current()`: false once stopped), so that a late answer sets nothing.
 */
export function usePoll(read: (current: () => boolean) => Promise<void>, ms: number, deps: readonly unknown[]): void {
  useEffect(() => {
    let stopped = false;
    const current = () => !stopped;
    void read(current);
    const t = setInterval(() => void read(current), ms);
    return () => {
      stopped = true;
      clearInterval(t);
    };
  }, deps);
}
