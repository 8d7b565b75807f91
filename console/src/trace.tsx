/**
 * The trace of a run, drawn as a timeline (as LangSmith and Temporal draw
 * one): the run, its nested runs, tool calls (backend or client, with the
 * executor), interrupts and pauses, each a bar from its start to its end
 * on one time axis, live while the run goes; each links to its event.
 */
import { useState } from "preact/hooks";

import { duration } from "./figures.js";
import { useTick } from "./hooks.js";
import { actorOf, type Event, type LiveSession } from "./live.js";

/** One bar of the trace. */
export interface Span {
  key: string;
  kind: "run" | "tool" | "interrupt" | "pause";
  label: string;
  detail: string;
  depth: number;
  start: number;
  /** Absent while it goes on. */
  end: number | undefined;
  status: string;
  eventId: string;
}

/** The spans of the run journal rooted at `root`, in the order they began. */
export function spansOf(live: LiveSession, root: string): Span[] {
  const spans: Span[] = [];
  const open = new Map<string, Span>();
  const depth = new Map<string, number>();
  const state = live.reducer.state();
  const time = (e: Event) => Date.parse(e.timestamp);
  const close = (key: string, e: Event, status: string) => {
    const s = open.get(key);
    if (s === undefined) return;
    s.end = time(e);
    s.status = status;
    open.delete(key);
  };
  for (const e of live.events) {
    if (e.rootRunId !== root) continue;
    const run = e.runId ?? root;
    const below = (depth.get(run) ?? 0) + 1;
    const add = (s: Omit<Span, "start" | "end" | "eventId">) => {
      const span: Span = { ...s, start: time(e), end: undefined, eventId: e.eventId };
      spans.push(span);
      open.set(s.key, span);
    };
    switch (e.type) {
      case "run.started": {
        const d = e.parentRunId === undefined ? 0 : (depth.get(e.parentRunId as string) ?? 0) + 1;
        depth.set(run, d);
        const name = live.runName(run);
        add({ key: `run:${run}`, kind: "run", label: `run ${run}${name ? ` “${name}”` : ""}`, detail: "", depth: d, status: "running" });
        break;
      }
      case "run.finished":
      case "run.error":
      case "run.cancelled":
        close(`run:${run}`, e, e.type.slice(4));
        break;
      case "tool.call.started": {
        const client = e.executor === "client";
        const executor = client ? `client executor ${state.runs[run]?.clientExecutorId ?? "?"}` : "backend";
        add({ key: `tool:${String(e.toolCallId)}`, kind: "tool", label: `tool ${String(e.toolName)}`, detail: executor, depth: below, status: "running" });
        break;
      }
      case "tool.call.finished":
        close(`tool:${String(e.toolCallId)}`, e, String(e.outcome));
        break;
      case "interrupt.requested":
        add({
          key: `interrupt:${String(e.interruptId)}`,
          kind: "interrupt",
          label: `interrupt ${(e.title as string | undefined) ?? String(e.kind)}`,
          detail: "",
          depth: below,
          status: "waiting",
        });
        break;
      case "interrupt.resolved": {
        const by = actorOf(e)?.sub;
        const s = open.get(`interrupt:${String(e.interruptId)}`);
        if (s !== undefined && by !== undefined) s.detail = `by ${by}`;
        close(`interrupt:${String(e.interruptId)}`, e, String(e.decision));
        break;
      }
      case "run.paused":
        add({ key: `pause:${run}:${String(e.waitId)}`, kind: "pause", label: `paused: ${String(e.reason)}`, detail: "", depth: below, status: "paused" });
        break;
      case "run.resumed":
        close(`pause:${run}:${String(e.waitId)}`, e, "resumed");
        break;
      default:
        break;
    }
  }
  return spans;
}

/** The timeline of one top-level run of the session (the latest unless another is picked). */
export function TraceView({ live }: { live: LiveSession }) {
  // Bars of what goes on grow every second; a finished trace stands still.
  const running = live.reducer.state().slot !== null;
  const now = useTick(running ? 1000 : 60_000);
  const roots = Object.entries(live.reducer.state().runs)
    .filter(([, r]) => r.parentRunId === undefined)
    .map(([id]) => id)
    .sort((a, b) => (live.nodeSeen.get(`run:${a}`) ?? 0) - (live.nodeSeen.get(`run:${b}`) ?? 0));
  const [picked, setPicked] = useState<string>();
  const root = picked !== undefined && roots.includes(picked) ? picked : roots.at(-1);
  if (root === undefined) return <p class="quiet">No run yet.</p>;
  const spans = spansOf(live, root);
  // What goes on ends, for now, at the later of this clock and the newest
  // time the journal gave (the two clocks may differ).
  const latest = Math.max(...spans.map((s) => s.end ?? s.start));
  const until = Math.max(now, latest);
  const t0 = Math.min(...spans.map((s) => s.start));
  const t1 = Math.max(...spans.map((s) => s.end ?? until));
  const total = Math.max(t1 - t0, 1);
  const link = (s: Span) => `#/sessions/${encodeURIComponent(live.sessionId)}/events/${encodeURIComponent(s.eventId)}`;
  return (
    <section class="trace" aria-label={`Trace of run ${root}`}>
      <div class="trace-head">
        <label>
          Run{" "}
          <select value={root} onChange={(e) => setPicked(e.currentTarget.value)}>
            {roots.map((r) => {
              const name = live.runName(r);
              return (
                <option key={r} value={r}>
                  {r}
                  {name === undefined ? "" : ` “${name}”`}
                </option>
              );
            })}
          </select>
        </label>
        <span class="quiet">
          {spans.length} spans over {duration(total)}
        </span>
      </div>
      <table class="spans" data-spans={spans.length}>
        <thead>
          <tr>
            <th scope="col">What</th>
            <th scope="col">Start</th>
            <th scope="col">Took</th>
            <th scope="col" class="axis">
              0 → {duration(total)}
            </th>
          </tr>
        </thead>
        <tbody>
          {spans.map((s) => {
            const end = s.end ?? until;
            return (
              <tr key={s.key} class={`span ${s.kind} ${s.end === undefined ? "open" : ""}`} data-span={s.key}>
                <td style={{ paddingLeft: `${0.6 + s.depth * 1.1}em` }}>
                  <a href={link(s)}>{s.label}</a> {s.detail && <span class="quiet">{s.detail}</span>}{" "}
                  <span class={`badge ${s.status}`}>{s.status}</span>
                </td>
                <td class="num">+{duration(s.start - t0)}</td>
                <td class="num">{s.end === undefined ? `${duration(end - s.start)}…` : duration(end - s.start)}</td>
                <td class="axis">
                  <span
                    class="bar"
                    title={`${s.label}: ${duration(end - s.start)}`}
                    style={{ marginLeft: `${((s.start - t0) / total) * 100}%`, width: `${Math.max(((end - s.start) / total) * 100, 0.4)}%` }}
                  />
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </section>
  );
}
