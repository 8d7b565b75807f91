/**
 * The operations page (role admin): client executors and their leases,
 * runtime queues with the runtimes holding their runs, the runs runtimes
 * hold (`GET /v1/operations`), and the server's stream, outbox, pool and
 * claim figures (`/metrics`), read every two seconds, each with a small
 * chart of what the page has read since it opened (counters as rates);
 * and token usage and its cost per day ([`UsagePanel`]).
 */
import { useRef, useState } from "preact/hooks";

import type { NaradClient, Operations } from "../../clients/typescript/src/index.js";
import { ago, usePoll, useTick } from "./hooks.js";
import { messageOf } from "./live.js";
import { UsagePanel } from "./usage.js";

/** The figures of `/metrics` the page shows, by series name (labels summed). */
const FIGURES: [string, string][] = [
  ["narad_streams_open", "streams open"],
  ["narad_stream_frames_total", "frames sent per second"],
  ["narad_stream_slow_consumer_drops_total", "slow readers dropped"],
  ["narad_outbox_lag_rows", "outbox lag (rows)"],
  ["narad_outbox_lag_seconds", "outbox lag (s)"],
  ["narad_appended_events_total", "events appended per second"],
  ["narad_executor_leases_active", "executor leases"],
  ["narad_runtime_queue_depth", "runs queued"],
  ["narad_db_pool_connections", "pool connections (idle + in use)"],
  ["narad_db_pool_waiting", "waiting for a connection"],
];

/** How many readings each chart keeps (10 minutes at one per two seconds). */
const KEPT = 300;

/** A counter (`_total`): charted and shown as a rate per second. */
const isCounter = (name: string) => name.endsWith("_total");

/** The readings of the figures so far, per figure: values for gauges, rates per second for counters. */
export class FigureHistory {
  readonly series = new Map<string, number[]>();
  private last: { at: number; figures: Map<string, number> } | undefined;

  /** Adds one reading of `/metrics` taken at `at` (ms). */
  add(at: number, figures: Map<string, number>): void {
    const previous = this.last;
    this.last = { at, figures };
    const push = (name: string, value: number) => {
      const s = this.series.get(name) ?? [];
      s.push(value);
      if (s.length > KEPT) s.shift();
      this.series.set(name, s);
    };
    for (const [name] of FIGURES) {
      const now = figures.get(name);
      if (now === undefined) continue;
      if (!isCounter(name)) push(name, now);
      else if (previous !== undefined) {
        const before = previous.figures.get(name) ?? 0;
        const seconds = (at - previous.at) / 1000;
        // A counter that went back is a restarted server: no rate for that step.
        if (seconds > 0 && now >= before) push(name, (now - before) / seconds);
      }
    }
    // The mean wait of the claims made since the last reading.
    if (previous !== undefined) {
      const sum = (figures.get(`${CLAIM_WAIT}_sum`) ?? 0) - (previous.figures.get(`${CLAIM_WAIT}_sum`) ?? 0);
      const count = (figures.get(`${CLAIM_WAIT}_count`) ?? 0) - (previous.figures.get(`${CLAIM_WAIT}_count`) ?? 0);
      if (count > 0 && sum >= 0) push(CLAIM_WAIT, sum / count);
    }
  }
}

/** The histogram of how long runs waited before a runtime claimed them. */
const CLAIM_WAIT = "narad_runtime_claim_wait_seconds";

/** A small line chart of `values` (the newest at the right), scaled to their own range. */
export function Sparkline({ values, label }: { values: readonly number[]; label: string }) {
  const [w, h] = [120, 28];
  if (values.length < 2) return <svg class="spark" width={w} height={h} role="img" aria-label={`${label}: not enough readings yet`} />;
  const max = Math.max(...values);
  const min = Math.min(0, ...values);
  const span = max - min || 1;
  const points = values.map((v, i) => `${((i / (values.length - 1)) * w).toFixed(1)},${(h - 2 - ((v - min) / span) * (h - 4)).toFixed(1)}`).join(" ");
  return (
    <svg class="spark" width={w} height={h} viewBox={`0 0 ${w} ${h}`} role="img" aria-label={`${label}: ${values.length} readings, from ${round(values[0]!)} to ${round(values.at(-1)!)}, highest ${round(max)}`}>
      <polyline points={points} fill="none" stroke="currentColor" stroke-width="1.5" />
    </svg>
  );
}

const round = (n: number) => Math.round(n * 100) / 100;

/** Sums each series of a Prometheus text exposition over its labels. */
export function figures(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (line.startsWith("#") || line.trim() === "") continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (m === null) continue;
    const value = Number(m[3]);
    if (Number.isFinite(value)) out.set(m[1] as string, (out.get(m[1] as string) ?? 0) + value);
  }
  return out;
}

/** The runtimes holding runs of `queue`, each with how many. */
function runtimesOf(ops: Operations, queue: string): string {
  const held = new Map<string, number>();
  for (const c of ops.claims) if (c.queue === queue) held.set(c.runtimeId ?? "unnamed", (held.get(c.runtimeId ?? "unnamed") ?? 0) + 1);
  return held.size === 0 ? "—" : [...held].map(([id, n]) => `${id} (${n})`).join(", ");
}

export function OperationsPage({ client }: { client: NaradClient }) {
  const [ops, setOps] = useState<Operations>();
  const [metrics, setMetrics] = useState<Map<string, number>>();
  const history = useRef(new FigureHistory());
  const [problem, setProblem] = useState<string>();
  const now = useTick(2000);
  usePoll(
    async (current) => {
      try {
        const [o, m] = await Promise.all([client.operations(), fetch("/metrics").then((r) => (r.ok ? r.text() : ""))]);
        if (!current()) return;
        setOps(o);
        const read = figures(m);
        history.current.add(Date.now(), read);
        setMetrics(read);
        setProblem(undefined);
      } catch (e) {
        if (current()) setProblem(messageOf(e));
      }
    },
    2000,
    [client],
  );
  const until = (t: string) => Math.round((Date.parse(t) - now) / 1000);
  return (
    <main class="operations">
      <div class="toolbar">
        <h1>Operations</h1>
      </div>
      {problem && (
        <p role="alert" class="problem">
          {problem}
        </p>
      )}
      {ops === undefined && problem === undefined && <p class="quiet">Loading…</p>}
      {metrics !== undefined && metrics.size > 0 && (
        <section aria-label="Server figures">
          <h2>This server</h2>
          <dl class="figures">
            {[...FIGURES, [CLAIM_WAIT, "claim wait, mean (s)"] as [string, string]]
              .filter(([name]) => metrics.has(name) || history.current.series.has(name))
              .map(([name, label]) => {
                const series = history.current.series.get(name) ?? [];
                const shown = isCounter(name) || name === CLAIM_WAIT ? series.at(-1) : metrics.get(name);
                return (
                  <div key={name}>
                    <dt>{label}</dt>
                    <dd data-metric={name}>{shown === undefined ? "—" : round(shown)}</dd>
                    <dd>
                      <Sparkline values={series} label={label} />
                    </dd>
                  </div>
                );
              })}
          </dl>
        </section>
      )}
      <UsagePanel client={client} />
      {ops !== undefined && (
        <>
          <section aria-label="Client executors" tabIndex={0}>
            <h2>Client executors</h2>
            {ops.executors.length === 0 ? (
              <p class="quiet">No client executor has attached.</p>
            ) : (
              <table>
                <thead>
                  <tr>
                    <th scope="col">Executor</th>
                    <th scope="col">Lease</th>
                    <th scope="col">Attached</th>
                    <th scope="col">Calls waiting / running</th>
                  </tr>
                </thead>
                <tbody>
                  {ops.executors.map((x) => (
                    <tr key={x.clientExecutorId} data-executor={x.clientExecutorId}>
                      <td>
                        <code>{x.clientExecutorId}</code>
                      </td>
                      <td>
                        <span class={`badge ${x.live ? "finished" : "cancelled"}`}>{x.live ? "live" : "lapsed"}</span>{" "}
                        {x.live ? `${until(x.leaseExpiresAt)} s left` : `since ${ago(Date.parse(x.leaseExpiresAt), now)}`}
                      </td>
                      <td>{ago(Date.parse(x.attachedAt), now)}</td>
                      <td class="num">
                        {x.waitingCalls} / {x.runningCalls}
                      </td>
                    </tr>
                  ))}
                </tbody>
              </table>
            )}
          </section>
          <section aria-label="Runtime queues" tabIndex={0}>
            <h2>Runtime queues</h2>
            {ops.queues.length === 0 ? (
              <p class="quiet">No queued work.</p>
            ) : (
              <table>
                <thead>
                  <tr>
                    <th scope="col">Queue</th>
                    <th scope="col">Ready</th>
                    <th scope="col">Held</th>
                    <th scope="col">Idle</th>
                    <th scope="col">Closing</th>
                    <th scope="col">Oldest ready</th>
                    <th scope="col">Runtimes holding its runs</th>
                  </tr>
                </thead>
                <tbody>
                  {ops.queues.map((q) => (
                    <tr key={q.queue} data-queue={q.queue}>
                      <td>
                        <code>{q.queue}</code>
                      </td>
                      <td class="num">{q.ready}</td>
                      <td class="num">{q.claimed}</td>
                      <td class="num">{q.idle}</td>
                      <td class="num">{q.closing}</td>
                      <td>{q.oldestReadyAt ? ago(Date.parse(q.oldestReadyAt), now) : "—"}</td>
                      <td data-runtimes>{runtimesOf(ops, q.queue)}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            )}
          </section>
          <section aria-label="Held runs" tabIndex={0}>
            <h2>Runs held by runtimes</h2>
            {ops.claims.length === 0 ? (
              <p class="quiet">No runtime holds a run.</p>
            ) : (
              <table>
                <thead>
                  <tr>
                    <th scope="col">Run</th>
                    <th scope="col">Queue</th>
                    <th scope="col">Runtime</th>
                    <th scope="col">Held</th>
                    <th scope="col">Lease</th>
                    <th scope="col">Attempt</th>
                  </tr>
                </thead>
                <tbody>
                  {ops.claims.map((c) => (
                    <tr key={c.runId}>
                      <td>
                        <a href={`#/sessions/${encodeURIComponent(c.sessionId)}`}>
                          <code>{c.runId}</code>
                        </a>
                        {c.stopRequested && <span class="badge cancelled">stop requested</span>}
                      </td>
                      <td>
                        <code>{c.queue}</code>
                      </td>
                      <td>{c.runtimeId ?? "—"}</td>
                      <td>{ago(Date.parse(c.claimedAt), now)}</td>
                      <td>{until(c.leaseExpiresAt)} s left</td>
                      <td class="num">{c.attempt}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            )}
          </section>
        </>
      )}
    </main>
  );
}
