/**
 * Times, durations and usage as people read them: a time relative to now
 * with the exact one (in the viewer's zone) on hover, durations between
 * two events, and token counters.
 */
import { ago } from "./hooks.js";

/** A duration for a person: "420 ms", "3.2 s", "4 min 05 s", "2 h 10 min". */
export function duration(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, "0")} s`;
  return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")} min`;
}

/** Milliseconds between two RFC 3339 times (NaN when either is not one). */
export function between(from: unknown, to: unknown): number {
  return typeof from === "string" && typeof to === "string" ? Date.parse(to) - Date.parse(from) : Number.NaN;
}

/** An exact time in the viewer's zone, to the second. */
export function exact(ms: number): string {
  return new Date(ms).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
}

/** An event's time: relative to `now`, exact on hover, machine-readable in `dateTime`. */
export function When({ at, now }: { at: unknown; now: number }) {
  if (typeof at !== "string") return null;
  const ms = Date.parse(at);
  if (Number.isNaN(ms)) return null;
  return (
    <time class="when" dateTime={at} title={exact(ms)}>
      {ago(ms, now)}
    </time>
  );
}

/** A usage object's counters for a person: "1,200 input tokens · 340 output tokens". */
export function usageText(usage: Record<string, number>): string {
  const first = (k: string) => (k === "inputTokens" ? 0 : k === "outputTokens" ? 1 : 2);
  return Object.entries(usage)
    .sort(([a], [b]) => first(a) - first(b) || a.localeCompare(b))
    .map(([k, v]) => `${v.toLocaleString("en")} ${k.replace(/([A-Z])/g, " $1").toLowerCase()}`)
    .join(" · ");
}
