/**
 * Token usage and its cost over time (`GET /v1/usage`): per day on the
 * operations page (the last 14 days in the viewer's zone, a bar per day,
 * each model's share), and per session for the sessions list.
 */
import { useState } from "preact/hooks";

import type { NaradClient, UsageBucket } from "../../clients/typescript/src/index.js";
import { costOf, costText, hasPrices } from "./cost.js";
import { usageText } from "./figures.js";
import { usePoll } from "./hooks.js";
import { messageOf } from "./live.js";

/** How many days the operations page shows. */
const DAYS = 14;

/** The longest window the server sums (days). */
const LONGEST_DAYS = 400;

/** The viewer's time zone (an IANA name), as the browser knows it. */
export function viewerZone(): string {
  return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
}

/** Buckets of one key summed: usage per model, runs, and all counters together. */
interface Summed {
  runs: number;
  byModel: Map<string | undefined, Record<string, number>>;
  usage: Record<string, number>;
}

/** Groups buckets by key (a day or a session), in the server's order. */
export function byKey(buckets: readonly UsageBucket[]): Map<string, Summed> {
  const out = new Map<string, Summed>();
  for (const b of buckets) {
    const s: Summed = out.get(b.key) ?? { runs: 0, byModel: new Map(), usage: {} };
    s.runs += b.runs;
    s.byModel.set(b.model, b.usage);
    for (const [k, v] of Object.entries(b.usage)) s.usage[k] = (s.usage[k] ?? 0) + v;
    out.set(b.key, s);
  }
  return out;
}

/** Tokens for a list cell: "1,200 in · 340 out", or every counter when those two are absent. */
export function tokensText(usage: Record<string, number>): string {
  const { inputTokens: input, outputTokens: output } = usage;
  if (input === undefined && output === undefined) return usageText(usage);
  return [input !== undefined ? `${input.toLocaleString("en")} in` : "", output !== undefined ? `${output.toLocaleString("en")} out` : ""].filter(Boolean).join(" · ");
}

/** The days from `DAYS - 1` days ago to today, in the viewer's zone (`YYYY-MM-DD`). */
function lastDays(now: number): string[] {
  const day = new Intl.DateTimeFormat("en-CA", { year: "numeric", month: "2-digit", day: "2-digit" });
  const days: string[] = [];
  for (let i = DAYS - 1; i >= 0; i--) days.push(day.format(new Date(now - i * 86_400_000)));
  return [...new Set(days)];
}

/** Usage per day of the last two weeks, with cost when the operator priced it; read once a minute. */
export function UsagePanel({ client }: { client: NaradClient }) {
  const [buckets, setBuckets] = useState<UsageBucket[]>();
  const [problem, setProblem] = useState<string>();
  usePoll(
    async (current) => {
      try {
        // A day more than shown: "14 days ago" in the viewer's zone starts before now − 14 × 24 h.
        const since = new Date(Date.now() - (DAYS + 1) * 86_400_000).toISOString();
        const page = await client.usage({ zone: viewerZone(), since });
        if (current()) {
          setBuckets(page.buckets);
          setProblem(undefined);
        }
      } catch (e) {
        if (current()) setProblem(messageOf(e));
      }
    },
    60_000,
    [client],
  );
  if (problem !== undefined)
    return (
      <section aria-label="Usage">
        <h2>Usage</h2>
        <p role="alert" class="problem">
          {problem}
        </p>
      </section>
    );
  if (buckets === undefined) return null;
  const days = byKey(buckets);
  const shown = lastDays(Date.now());
  const total = byKey(buckets.map((b) => ({ ...b, key: "all" }))).get("all");
  const tokens = (s: Summed | undefined) => (s === undefined ? 0 : (s.usage["inputTokens"] ?? 0) + (s.usage["outputTokens"] ?? 0));
  const highest = Math.max(1, ...shown.map((d) => tokens(days.get(d))));
  const cost = total && costOf(total.byModel);
  return (
    <section aria-label="Usage" tabIndex={0}>
      <h2>Usage, last {DAYS} days</h2>
      {total === undefined ? (
        <p class="quiet">No run reported usage in the last {DAYS} days.</p>
      ) : (
        <>
          <p data-usage-total>
            {total.runs} runs · {usageText(total.usage)}
            {cost !== undefined && <span data-cost> · {costText(cost)}</span>}
            {!hasPrices() && <span class="quiet"> · no price table (NARAD_CONSOLE_PRICES), so no cost</span>}
          </p>
          <svg class="usage-chart" width={shown.length * 18} height={62} role="img" aria-label={`input and output tokens per day, highest ${highest.toLocaleString("en")}`}>
            {shown.map((d, i) => {
              const h = Math.round((tokens(days.get(d)) / highest) * 44);
              return (
                <rect key={d} x={i * 18 + 2} y={46 - h} width={14} height={Math.max(h, 1)} fill="currentColor" opacity={h === 0 ? 0.2 : 0.8}>
                  <title>{`${d}: ${tokens(days.get(d)).toLocaleString("en")} tokens`}</title>
                </rect>
              );
            })}
            <text x={2} y={60} font-size={10} fill="currentColor" opacity={0.7}>
              {shown[0]?.slice(5)}
            </text>
            <text x={shown.length * 18 - 2} y={60} font-size={10} fill="currentColor" opacity={0.7} text-anchor="end">
              today
            </text>
          </svg>
          <table>
            <thead>
              <tr>
                <th scope="col">Day</th>
                <th scope="col">Runs</th>
                <th scope="col">Tokens</th>
                <th scope="col">By model</th>
                {hasPrices() && <th scope="col">Cost</th>}
              </tr>
            </thead>
            <tbody>
              {[...days].reverse().map(([day, s]) => {
                const c = costOf(s.byModel);
                return (
                  <tr key={day} data-day={day}>
                    <td>{day}</td>
                    <td class="num">{s.runs}</td>
                    <td title={usageText(s.usage)}>{tokensText(s.usage)}</td>
                    <td>
                      {[...s.byModel.keys()].map((m, i) => (
                        <span key={m ?? ""}>
                          {i > 0 && ", "}
                          <code class="model">{m ?? "no model named"}</code>
                        </span>
                      ))}
                    </td>
                    {c !== undefined && <td data-cost>{costText(c)}</td>}
                  </tr>
                );
              })}
            </tbody>
          </table>
        </>
      )}
    </section>
  );
}

/**
 * The usage of sessions `ids` (the first 100), since the oldest of them
 * was created (at most 400 days back); read again when the ids change,
 * when `moved` does (say, which of them run: a run that ends reports its
 * usage), or a minute passes.
 */
export function useSessionUsage(client: NaradClient, ids: readonly string[], oldest: number | undefined, moved: string): Map<string, Summed> {
  const [usage, setUsage] = useState(new Map<string, Summed>());
  const key = ids.slice(0, 100).join(",");
  usePoll(
    async (current) => {
      if (key === "" || oldest === undefined) return;
      const since = new Date(Math.max(oldest, Date.now() - (LONGEST_DAYS - 1) * 86_400_000)).toISOString();
      try {
        const page = await client.usage({ by: "session", sessions: key, since });
        if (current()) setUsage(byKey(page.buckets));
      } catch {
        // The list works without its usage column.
      }
    },
    60_000,
    [client, key, oldest, moved],
  );
  return usage;
}

/** A session's usage cell: tokens, and cost when priced. */
export function SessionUsage({ usage }: { usage: Summed | undefined }) {
  if (usage === undefined) return <>—</>;
  const cost = costOf(usage.byModel);
  return (
    <span title={`${usage.runs} runs: ${usageText(usage.usage)}`}>
      {tokensText(usage.usage)}
      {cost !== undefined && (
        <>
          <br />
          <span data-cost class="quiet">
            {costText(cost)}
          </span>
        </>
      )}
    </span>
  );
}
