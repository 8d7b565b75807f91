/**
 * The event inspector: every authority event of the session with its
 * sequences, filterable by run and type, each linkable by its eventId
 * (`#/sessions/<id>/events/<eventId>`). The list draws only the rows in
 * view, so that tens of thousands of events scroll smoothly.
 */
import { useEffect, useLayoutEffect, useRef, useState } from "preact/hooks";

import { SessionReducer } from "../../clients/typescript/src/index.js";
import { type Event, type LiveSession, messageText } from "./live.js";

/** The conversation as it stood after event `seq`: the session's events up to it, reduced afresh (on opening). */
function AsItStood({ live, seq }: { live: LiveSession; seq: number }) {
  const [open, setOpen] = useState(false);
  let items: [string, string][] = [];
  if (open) {
    const reducer = new SessionReducer();
    for (const e of live.events) {
      if (e.sessionSequence > seq) break;
      reducer.deliver(e);
    }
    items = reducer
      .transcript(Object.keys(reducer.state().runs))
      .flatMap((i): [string, string][] => (i.item === "message" ? [[i.role, messageText(i)]] : []));
  }
  return (
    <details class="as-it-stood" onToggle={(e) => setOpen(e.currentTarget.open)}>
      <summary>The conversation as it stood after #{seq}</summary>
      {open &&
        (items.length === 0 ? (
          <p class="quiet">No message yet.</p>
        ) : (
          <ol>
            {items.map(([role, text], i) => (
              <li key={i} data-role={role}>
                <strong>{role}</strong>: {text}
              </li>
            ))}
          </ol>
        ))}
    </details>
  );
}

const ROW = 28;

export function EventInspector({ live, focus }: { live: LiveSession; focus: string | undefined }) {
  const [run, setRun] = useState("");
  const [type, setType] = useState("");
  const [top, setTop] = useState(0);
  const [height, setHeight] = useState(600);
  const list = useRef<HTMLElement>(null);
  const needle = type.trim();
  const events = live.events.filter(
    (e) => (run === "" || (run === "-" ? e.runId === undefined : e.runId === run)) && (needle === "" || e.type.includes(needle)),
  );
  const selected = focus === undefined ? undefined : live.events.find((e) => e.eventId === focus);

  // A new filter shows its matches from the first: the old position means
  // nothing in another list.
  const filtered = useRef(false);
  useEffect(() => {
    if (!filtered.current) {
      filtered.current = true;
      return;
    }
    if (list.current !== null) list.current.scrollTop = 0;
    setTop(0);
  }, [run, needle]);

  // Bring a linked event into view once it is there.
  const shown = useRef<string | undefined>(undefined);
  useLayoutEffect(() => {
    const el = list.current;
    if (el === null) return;
    setHeight(el.clientHeight);
    if (focus !== undefined && shown.current !== focus) {
      const i = events.findIndex((e) => e.eventId === focus);
      if (i >= 0) {
        el.scrollTop = Math.max(0, i * ROW - el.clientHeight / 2);
        shown.current = focus;
      }
    }
  });

  const first = Math.max(0, Math.floor(top / ROW) - 10);
  const last = Math.min(events.length, Math.ceil((top + height) / ROW) + 10);
  const link = (e: Event) => `#/sessions/${encodeURIComponent(live.sessionId)}/events/${encodeURIComponent(e.eventId)}`;

  return (
    <div class="inspector">
      <div class="filters">
        <label>
          Run{" "}
          <select value={run} onChange={(e) => setRun(e.currentTarget.value)}>
            <option value="">every run</option>
            <option value="-">session-level only</option>
            {[...live.reducer.lifecycle.runs.keys()].map((r) => (
              <option key={r} value={r}>
                {r}
              </option>
            ))}
          </select>
        </label>
        <input type="search" placeholder="Type contains…" aria-label="Filter events by type" value={type} onInput={(e) => setType(e.currentTarget.value)} />
        <span class="quiet">
          {events.length} of {live.events.length} events
        </span>
      </div>
      <div class="panes">
        <nav class="rows" ref={list} aria-label="Events" onScroll={(e) => setTop(e.currentTarget.scrollTop)}>
          <div style={{ height: `${events.length * ROW}px`, position: "relative" }}>
            {events.slice(first, last).map((e, i) => (
              <a
                key={e.eventId}
                href={link(e)}
                class={`row ${e.eventId === focus ? "selected" : ""}`}
                style={{ top: `${(first + i) * ROW}px`, height: `${ROW}px` }}
                data-event={e.eventId}
              >
                <span class="num">{e.sessionSequence}</span>
                <span class="type">{e.type}</span>
                <span class="quiet">{e.runId === undefined ? "session" : `${e.runId} #${e.sequence}`}</span>
              </a>
            ))}
          </div>
        </nav>
        <section class="detail" aria-label="The selected event" tabIndex={0}>
          {selected === undefined ? (
            <p class="quiet">Pick an event to see it whole.</p>
          ) : (
            <>
              <h3>
                {selected.type} <span class="quiet">#{selected.sessionSequence}</span>
              </h3>
              <AsItStood key={selected.eventId} live={live} seq={selected.sessionSequence} />
              <pre class="json" tabIndex={0}>
                {JSON.stringify(selected, null, 2)}
              </pre>
            </>
          )}
        </section>
      </div>
    </div>
  );
}
