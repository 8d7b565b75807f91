/**
 * The operations page (role admin): client executors and their leases,
 * runtime queues and the runs runtimes hold (`GET /v1/operations`), and the
 * server's stream, outbox and pool figures (`/metrics`), read every two
 * seconds.
 */
import { useEffect, useState } from "preact/hooks";

import type { NaradClient, Operations } from "../../clients/typescript/src/index.js";
import { ago, useTick } from "./hooks.js";
import { messageOf } from "./live.js";

/** The figures of `/metrics` the page shows, by series name (labels summed). */
const FIGURES: [string, string][] = [
  ["narad_streams_open", "streams open"],
  ["narad_stream_frames_total", "frames sent"],
  ["narad_stream_slow_consumer_drops_total", "slow readers dropped"],
  ["narad_outbox_lag_rows", "outbox lag (rows)"],
  ["narad_outbox_lag_seconds", "outbox lag (s)"],
  ["narad_appended_events_total", "events appended"],
  ["narad_executor_leases_active", "executor leases"],
  ["narad_runtime_queue_depth", "runs queued"],
  ["narad_db_pool_connections", "pool connections (idle + in use)"],
  ["narad_db_pool_waiting", "waiting for a connection"],
];

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

export function OperationsPage({ client }: { client: NaradClient }) {
  const [ops, setOps] = useState<Operations>();
  const [metrics, setMetrics] = useState<Map<string, number>>();
  const [problem, setProblem] = useState<string>();
  const now = useTick(2000);
  useEffect(() => {
    let stopped = false;
    const read = async () => {
      try {
        const [o, m] = await Promise.all([client.operations(), fetch("/metrics").then((r) => (r.ok ? r.text() : ""))]);
        if (stopped) return;
        setOps(o);
        setMetrics(figures(m));
        setProblem(undefined);
      } catch (e) {
        if (!stopped) setProblem(messageOf(e));
      }
    };
    void read();
    const t = setInterval(read, 2000);
    return () => {
      stopped = true;
      clearInterval(t);
    };
  }, [client]);
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
            {FIGURES.filter(([name]) => metrics.has(name)).map(([name, label]) => (
              <div key={name}>
                <dt>{label}</dt>
                <dd data-metric={name}>{Math.round((metrics.get(name) ?? 0) * 100) / 100}</dd>
              </div>
            ))}
          </dl>
        </section>
      )}
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
