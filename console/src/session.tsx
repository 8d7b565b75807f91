/**
 * One session, live: the conversation as it streams (reasoning folded,
 * tool calls with arguments and results, interrupts with their actions),
 * the run tree, and the controls the signed-in roles allow: say something,
 * approve or deny, stop the active run.
 */
import type { ComponentChildren } from "preact";
import { useEffect, useLayoutEffect, useMemo, useRef, useState } from "preact/hooks";

import type { NaradClient, ReducedState, TranscriptItem } from "../../clients/typescript/src/index.js";
import { InterruptActions } from "./actions.js";
import { type Identity, may } from "./auth.js";
import { costOf, costText, modelOf } from "./cost.js";
import { between, duration, usageText, When } from "./figures.js";
import { useObservable, useTick } from "./hooks.js";
import { Export } from "./export.js";
import { EventInspector } from "./inspector.js";
import { actorOf, type Event, LiveSession, messageOf, messageText } from "./live.js";
import { RevisionHistory } from "./revisions.js";
import { RunTree } from "./runtree.js";
import { TraceView } from "./trace.js";
import { useVirtualizer } from "./virtual.js";

/** One entry of the conversation: drawn only while in (or near) view. */
type Entry = { key: string; seq: number; label: string; render: () => ComponentChildren };

function Json({ value }: { value: unknown }) {
  return (
    <pre class="json" tabIndex={0}>
      {JSON.stringify(value, null, 2)}
    </pre>
  );
}

function Actor({ event }: { event: Event | undefined }) {
  const actor = actorOf(event);
  if (actor === undefined) return null;
  return (
    <span class="actor">
      by {actor.sub}
      {actor.extension ? ` (${actor.extension})` : ""}
    </span>
  );
}

function TranscriptEntry({ item, at, now }: { item: TranscriptItem; at: string | undefined; now: number }) {
  if (item.item === "reasoning") {
    return (
      <details class="reasoning">
        <summary>
          Reasoning{item.completed ? "" : "…"} <When at={at} now={now} />
        </summary>
        <p>{item.text}</p>
      </details>
    );
  }
  const shown = messageText(item);
  return (
    <article class={`message ${item.role}`} data-message={item.messageId} aria-label={`${item.role} message`}>
      <header>
        {item.role} <When at={at} now={now} />
      </header>
      <p>
        {shown}
        {!item.completed && <span class="cursor" aria-hidden="true" />}
      </p>
      {item.redaction && <footer class="quiet">redacted: {item.redaction.reason}</footer>}
    </article>
  );
}

function ToolCall({
  started,
  finished,
  executorId,
  now,
}: {
  started: Event;
  finished: Event | undefined;
  executorId: string | undefined;
  now: number;
}) {
  const client = started.executor === "client";
  return (
    <article class="tool" data-tool-call={started.toolCallId as string} aria-label={`tool call ${started.toolName as string}`}>
      <header>
        tool <code>{started.toolName as string}</code> · {client ? `client executor ${executorId ?? "?"}` : "backend"} · <When at={started.timestamp} now={now} />
        {finished ? (
          <>
            <span class={`badge ${finished.outcome as string}`}>{finished.outcome as string}</span>
            <span class="latency" title="from the call's start to its result">
              {duration(between(started.timestamp, finished.timestamp))}
            </span>
          </>
        ) : (
          <span class="badge running">running</span>
        )}
      </header>
      <details>
        <summary>arguments</summary>
        <Json value={started.args} />
      </details>
      {finished && (
        <details open={finished.outcome !== "success"}>
          <summary>result{finished.code ? ` (${finished.code as string})` : ""}</summary>
          {finished.message ? <p>{finished.message as string}</p> : null}
          <Json value={finished.response} />
        </details>
      )}
    </article>
  );
}

function Interrupt({
  live,
  request,
  client,
  identity,
  now,
}: {
  live: LiveSession;
  request: Event;
  client: NaradClient;
  identity: Identity;
  now: number;
}) {
  const id = request.interruptId as string;
  const resolution = live.interruptResolutions.get(id);
  return (
    <article class={`interrupt ${resolution ? "resolved" : "open"}`} data-interrupt={id} aria-label="interrupt">
      <header>
        {(request.title as string | undefined) ?? (request.kind as string)} <When at={request.timestamp} now={now} />
        {resolution ? (
          <span class={`badge ${resolution.decision as string}`}>{resolution.decision as string}</span>
        ) : (
          <span class="badge waiting">waiting</span>
        )}
      </header>
      {typeof request.message === "string" && <p>{request.message}</p>}
      {request.input !== undefined && (
        <details>
          <summary>details</summary>
          <Json value={request.input} />
        </details>
      )}
      {resolution && (
        <p class="resolution">
          {resolution.decision as string} <Actor event={resolution} /> <When at={resolution.timestamp} now={now} />
          <span class="waited"> · waited {duration(between(request.timestamp, resolution.timestamp))}</span>
          {typeof resolution.reason === "string" ? `: ${resolution.reason}` : ""}
        </p>
      )}
      {!resolution && may(identity, "approve") && (
        <InterruptActions client={client} sessionId={live.sessionId} interruptId={id} actions={(request.actions as string[]) ?? []} />
      )}
    </article>
  );
}

/** A link only for web addresses: a reference of another scheme is shown, never followed. */
function Reference({ uri }: { uri: unknown }) {
  if (typeof uri !== "string") return null;
  let web = false;
  try {
    web = ["http:", "https:"].includes(new URL(uri).protocol);
  } catch {
    web = false;
  }
  return web ? (
    <a href={uri} rel="noopener noreferrer" target="_blank">
      {uri}
    </a>
  ) : (
    <code>{uri}</code>
  );
}

function bytes(n: unknown): string {
  if (typeof n !== "number") return "";
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

/** Raster images: drawn in the page. Anything else (SVG included) is offered as a download. */
const INLINE_IMAGES = ["image/png", "image/jpeg", "image/gif", "image/webp", "image/avif"];

/** The prefix of a reference to bytes narad holds. */
const BLOB_REFERENCE = "narad://blobs/";

/** Images read so far, by reference: an entry scrolled out and back is not read again. */
const images = new Map<string, Promise<string>>();

/** How many images stay read; the oldest is let go beyond. */
const IMAGES_KEPT = 64;

/** Reads a blob with the signed-in token (an <img> or a link could not send it) as an object URL. */
async function blobUrl(client: NaradClient, uri: string): Promise<string> {
  const response = await client.downloadBlob(uri);
  return URL.createObjectURL(await response.blob());
}

/** An image's object URL, read once and kept while it is among the last {@link IMAGES_KEPT}. */
function imageUrl(client: NaradClient, uri: string): Promise<string> {
  let url = images.get(uri);
  if (url === undefined) {
    url = blobUrl(client, uri);
    url.catch(() => images.delete(uri));
    images.set(uri, url);
    if (images.size > IMAGES_KEPT) {
      const [oldest, gone] = images.entries().next().value as [string, Promise<string>];
      images.delete(oldest);
      void gone.then(URL.revokeObjectURL, () => undefined);
    }
  }
  return url;
}

/** A blob narad holds: an image drawn in place, anything else a download button. */
function HeldBlob({ client, uri, name, mediaType }: { client: NaradClient; uri: string; name: string; mediaType: string }) {
  const inline = INLINE_IMAGES.includes(mediaType.split(";")[0]!.trim().toLowerCase());
  const [src, setSrc] = useState<string>();
  const [problem, setProblem] = useState<string>();
  useEffect(() => {
    if (!inline) return;
    let gone = false;
    imageUrl(client, uri).then(
      (u) => !gone && setSrc(u),
      (e: unknown) => !gone && setProblem(messageOf(e)),
    );
    return () => {
      gone = true;
    };
  }, [client, uri, inline]);
  const download = async () => {
    try {
      const url = await blobUrl(client, uri);
      const a = document.createElement("a");
      a.href = url;
      a.download = name;
      a.click();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (e) {
      setProblem(messageOf(e));
    }
  };
  if (problem !== undefined) return <p class="problem">{problem}</p>;
  if (inline) return src === undefined ? <p class="quiet">loading image…</p> : <img class="blob" src={src} alt={name} />;
  return (
    <p>
      <button type="button" onClick={() => void download()}>
        Download {name}
      </button>
    </p>
  );
}

/** An attachment or artifact (§9.5): its metadata and reference as its events give them. */
function File({ kind, events, client }: { kind: "attachment" | "artifact"; events: Event[]; client: NaradClient }) {
  const added = events.find((e) => e.type.endsWith(".added"));
  const last = events.at(-1)!;
  const state = last.type.slice(kind.length + 1);
  const uri = [...events].reverse().find((e) => typeof e.uri === "string")?.uri;
  const id = String(events[0]![`${kind}Id`]);
  return (
    <article class="file" data-file={`${kind}:${id}`} aria-label={`${kind} ${String(added?.name ?? id)}`}>
      <header>
        {kind} <code>{String(added?.name ?? id)}</code>
        <span class={`badge ${state}`}>{state === "added" ? "pending" : state}</span>
      </header>
      <p class="quiet">
        {[added?.mediaType, bytes(added?.sizeBytes)].filter((x) => typeof x === "string" && x !== "").join(" · ")}
        {state === "failed" && ` · ${String(last.code)}${typeof last.message === "string" ? `: ${last.message}` : ""}`}
      </p>
      {typeof uri === "string" && uri.startsWith(BLOB_REFERENCE) && state === "ready" ? (
        <HeldBlob client={client} uri={uri} name={String(added?.name ?? id)} mediaType={String(added?.mediaType ?? "")} />
      ) : (
        uri !== undefined &&
        state !== "removed" && (
          <p>
            <Reference uri={uri} />
          </p>
        )
      )}
    </article>
  );
}

function RunMarker({ live, runId, started, now }: { live: LiveSession; runId: string; started: Event; now: number }) {
  const terminal = live.terminals.get(runId);
  const stop = live.stops.get(runId);
  const usage = live.usage(runId);
  const cost = costOf(live.usageByModel(runId));
  const model = modelOf(started);
  const name = live.runName(runId);
  const message = live.startingMessage(started);
  return (
    <div class="run-marker" data-run={runId}>
      {name !== undefined && (
        <span class="run-name" title={message !== undefined ? `answers the message of #${message.sessionSequence}` : "from the run's input"}>
          “{name}”{" "}
        </span>
      )}
      run <code>{runId}</code> {started.parentRunId ? `(in ${started.parentRunId as string}) ` : ""}
      {model !== undefined && <span class="model">on {model} </span>}started <When at={started.timestamp} now={now} />
      {stop && (
        <>
          {" "}
          · stop requested <Actor event={stop} />
        </>
      )}
      {terminal && (
        <>
          {" "}
          · <span class={`badge ${terminal.type.slice(4)}`}>{terminal.type.slice(4)}</span>{" "}
          <span class="duration" title="from run.started to its terminal">
            after {duration(between(started.timestamp, terminal.timestamp))}
          </span>
          {Object.keys(usage).length > 0 && <span class="usage"> · {usageText(usage)}</span>}
          {cost !== undefined && Object.keys(usage).length > 0 && (
            <span class="cost" data-cost>
              {" "}
              · {costText(cost)}
            </span>
          )}
        </>
      )}
      {started.input !== undefined && (
        <details class="run-input">
          <summary>input</summary>
          <Json value={started.input} />
        </details>
      )}
    </div>
  );
}

function Composer({ live, client }: { live: LiveSession; client: NaradClient }) {
  const [draft, setDraft] = useState("");
  const [problem, setProblem] = useState<string>();
  const [busy, setBusy] = useState(false);
  const send = async () => {
    const content = draft.trim();
    if (content === "") return;
    setBusy(true);
    try {
      await client.command("record-user-message", { sessionId: live.sessionId, messageScope: "session", content });
      setDraft("");
      setProblem(undefined);
    } catch (e) {
      setProblem(messageOf(e));
    } finally {
      setBusy(false);
    }
  };
  return (
    <form
      class="composer"
      onSubmit={(e) => {
        e.preventDefault();
        void send();
      }}
    >
      <label for="say" class="visually-hidden">
        Say something
      </label>
      <textarea
        id="say"
        rows={2}
        placeholder="Say something (Enter sends, Shift+Enter for a new line)"
        value={draft}
        onInput={(e) => setDraft(e.currentTarget.value)}
        onKeyDown={(e) => {
          if (e.key === "Enter" && !e.shiftKey) {
            e.preventDefault();
            void send();
          }
        }}
      />
      <button type="submit" class="primary" disabled={busy || draft.trim() === ""}>
        Send
      </button>
      {busy && (
        <p role="status" class="quiet sending">
          Sending… (sent once, as soon as the server answers)
        </p>
      )}
      {problem && (
        <p role="alert" class="problem">
          {problem}
        </p>
      )}
    </form>
  );
}

/** The state and UI documents and the views (§9.6), as the reducer holds them, each document with its revisions. */
function Documents({ state, events }: { state: ReducedState; events: readonly Event[] }) {
  const families = [
    ["State documents", "state", state.documents.state],
    ["UI documents", "ui", state.documents.ui],
  ] as const;
  const views = Object.entries(state.views);
  return (
    <section class="documents" aria-label="State" tabIndex={0}>
      {families.map(([title, family, docs]) => (
        <div key={title}>
          <h2>{title}</h2>
          {docs === undefined || Object.keys(docs).length === 0 ? (
            <p class="quiet">None.</p>
          ) : (
            Object.entries(docs).map(([scope, d]) => (
              <details key={scope} open>
                <summary>
                  <code>{scope}</code> <span class="quiet">revision {d.revision}</span>
                </summary>
                <Json value={d.state} />
                <RevisionHistory events={events} family={family} scope={scope} />
              </details>
            ))
          )}
        </div>
      ))}
      <h2>Views</h2>
      {views.length === 0 ? (
        <p class="quiet">None.</p>
      ) : (
        views.map(([viewId, v]) => (
          <details key={viewId} open={v.open}>
            <summary>
              <code>{viewId}</code> <span class="quiet">{v.open ? "open" : "closed"}</span>
            </summary>
            <Json value={v.state} />
          </details>
        ))
      )}
    </section>
  );
}

/** The views of a session. */
type Tab = "conversation" | "trace" | "events" | "state";
const TABS: readonly { id: Tab; name: string }[] = [
  { id: "conversation", name: "Conversation" },
  { id: "trace", name: "Trace" },
  { id: "events", name: "Events" },
  { id: "state", name: "State" },
];

/** The tab list, as the ARIA tabs pattern has it: one tab in the Tab order, arrows, Home and End move between them. */
function Tabs({ tab, onChange }: { tab: Tab; onChange: (t: Tab) => void }) {
  const go = (to: Tab) => {
    onChange(to);
    document.getElementById(`tab-${to}`)?.focus();
  };
  return (
    <div
      class="tabs"
      role="tablist"
      aria-label="Views of the session"
      onKeyDown={(e) => {
        const i = TABS.findIndex((t) => t.id === tab);
        const to =
          e.key === "ArrowRight" ? (i + 1) % TABS.length
          : e.key === "ArrowLeft" ? (i + TABS.length - 1) % TABS.length
          : e.key === "Home" ? 0
          : e.key === "End" ? TABS.length - 1
          : undefined;
        if (to === undefined) return;
        e.preventDefault();
        go(TABS[to]!.id);
      }}
    >
      {TABS.map((t) => (
        <button
          key={t.id}
          id={`tab-${t.id}`}
          type="button"
          role="tab"
          aria-selected={tab === t.id}
          aria-controls={`panel-${t.id}`}
          tabIndex={tab === t.id ? 0 : -1}
          class={tab === t.id ? "selected" : ""}
          onClick={() => onChange(t.id)}
        >
          {t.name}
        </button>
      ))}
    </div>
  );
}

export function SessionPage({
  client,
  identity,
  sessionId,
  focus,
}: {
  client: NaradClient;
  identity: Identity;
  sessionId: string;
  focus?: string | undefined;
}) {
  const live = useMemo(() => new LiveSession(client, sessionId), [client, sessionId]);
  useEffect(() => () => live.close(), [live]);
  useObservable(live);
  // Relative times move on by themselves.
  const now = useTick(15_000);
  const [record, setRecord] = useState<{ title?: string; archivedAt?: string }>();
  const [tab, setTab] = useState<Tab>(focus === undefined ? "conversation" : "events");
  // An event's address opens the Events tab; the session's own address, the
  // conversation (with its message box), also when coming back from one.
  useEffect(() => {
    setTab(focus === undefined ? "conversation" : "events");
  }, [focus]);
  const act = async (f: () => Promise<unknown>) => {
    try {
      await f();
      setProblem(undefined);
    } catch (e) {
      setProblem(messageOf(e));
    }
  };
  const [problem, setProblem] = useState<string>();
  const [opened, setOpened] = useState<string[]>([]);
  // The runtime queue a run started here goes to: a run nothing takes
  // would wait for a backend that never comes.
  const [queue, setQueue] = useState("default");
  useEffect(() => {
    client.getSession(sessionId).then(setRecord, (e: unknown) => setProblem(messageOf(e)));
  }, [client, sessionId]);

  const timeline = useRef<HTMLElement>(null);

  const state = live.reducer.state();
  const slot = state.slot;
  const activeRun = slot?.kind === "run" ? slot.runId : undefined;
  const stop = async () => {
    if (activeRun === undefined) return;
    try {
      await client.command("stop-run", { sessionId, runId: activeRun, reason: "stopped from the console" });
    } catch (e) {
      setProblem(messageOf(e));
    }
  };

  const entries: Entry[] = [];
  // Every top-level run's messages (the protocol's default transcript shows
  // the latest run's only; an operator reads the whole conversation), and
  // those of the nested runs opened.
  const topLevel = Object.entries(state.runs).flatMap(([runId, r]) => (r.parentRunId === undefined ? [runId] : []));
  const transcript = live.reducer.transcript([...topLevel, ...opened]);
  transcript.forEach((item, i) => {
    const id = item.item === "message" ? item.messageId : item.reasoningId;
    entries.push({
      key: `t-${id}-${i}`,
      seq: live.firstSeen.get(id) ?? 0,
      label: item.item === "message" ? `${item.role} message` : "reasoning",
      render: () => <TranscriptEntry item={item} at={live.at(live.firstSeen.get(id) ?? 0)?.timestamp} now={now} />,
    });
  });
  for (const [toolCallId, call] of live.toolCalls) {
    const runId = call.started.runId;
    entries.push({
      key: `c-${toolCallId}`,
      seq: call.started.sessionSequence,
      label: `tool call ${String(call.started.toolName)}`,
      render: () => (
        <ToolCall started={call.started} finished={call.finished} executorId={runId ? state.runs[runId]?.clientExecutorId : undefined} now={now} />
      ),
    });
  }
  for (const request of live.interruptRequests.values()) {
    entries.push({
      key: `i-${request.interruptId as string}`,
      seq: request.sessionSequence,
      label: live.interruptResolutions.has(request.interruptId as string) ? "interrupt resolved" : "interrupt waiting for a decision",
      render: () => <Interrupt live={live} request={request} client={client} identity={identity} now={now} />,
    });
  }
  for (const [key, events] of live.files) {
    const kind = key.startsWith("attachment:") ? "attachment" : "artifact";
    entries.push({ key: `f-${key}`, seq: events[0]!.sessionSequence, label: kind, render: () => <File kind={kind} events={events} client={client} /> });
  }
  for (const e of live.events) {
    if (e.type === "run.started" && e.runId !== undefined) {
      const runId = e.runId;
      entries.push({ key: `r-${runId}`, seq: e.sessionSequence, label: `run ${runId}`, render: () => <RunMarker live={live} runId={runId} started={e} now={now} /> });
    }
  }
  entries.sort((a, b) => a.seq - b.seq);
  const nested = Object.entries(state.runs).filter(([, r]) => r.parentRunId !== undefined);
  const sessionUsage = live.usage();
  const sessionCost = costOf(live.usageByModel());
  const list = useVirtualizer({
    count: entries.length,
    getScrollElement: () => timeline.current,
    estimateSize: () => 90,
    getItemKey: (i) => entries[i]!.key,
    overscan: 8,
    gap: 10,
    // A reader at the bottom stays there as entries arrive and as an
    // answer streams in (the list keeps its end anchored, measuring as it
    // goes); one who scrolled up stays where they are.
    anchorTo: "end",
    followOnAppend: true,
  });
  // A session opens at its newest entry, however many arrived before the
  // list was first drawn.
  const openedAtEnd = useRef(false);
  useLayoutEffect(() => {
    if (!openedAtEnd.current && entries.length > 0) {
      openedAtEnd.current = true;
      list.scrollToEnd();
    }
  });

  return (
    <main class="session">
      <div class="toolbar">
        <a href="#/sessions" class="quiet">
          ← Sessions
        </a>
        <h1>{record?.title ?? sessionId}</h1>
        <span class="id">{sessionId}</span>
        <span class={`dot ${live.connection}`} role="status" aria-label={`session stream ${live.connection}`} title={`stream: ${live.connection}`} />
        {activeRun !== undefined && (
          <span class="badge running" data-active-run={activeRun}>
            {activeRun}: {state.runs[activeRun]?.state}
          </span>
        )}
        {activeRun !== undefined && may(identity, "command") && (
          <button type="button" class="danger" onClick={stop} disabled={state.runs[activeRun]?.stopRequested === true}>
            {state.runs[activeRun]?.stopRequested ? "Stopping…" : "Stop run"}
          </button>
        )}
        {slot === null && may(identity, "command") && (
          <form
            class="start-run"
            onSubmit={(e) => {
              e.preventDefault();
              void act(() => client.command("start-run", { sessionId, runtime: { queue: queue.trim() || "default" } }));
            }}
          >
            <label>
              Queue{" "}
              <input
                name="queue"
                value={queue}
                size={10}
                required
                title="The agent runtimes' queue the run goes to"
                onInput={(e) => setQueue(e.currentTarget.value)}
              />
            </label>
            <button type="submit">Start run</button>
          </form>
        )}
        {may(identity, "command") && record !== undefined && record.archivedAt === undefined && (
          <button
            type="button"
            class="quiet"
            onClick={() => {
              if (confirm("Archive this session? It stays readable; it leaves the list unless archived sessions are shown.")) {
                void act(async () => setRecord(await client.command("archive-session", { sessionId })));
              }
            }}
          >
            Archive
          </button>
        )}
        {record?.archivedAt !== undefined && <span class="badge">archived</span>}
        <Export client={client} live={live} title={record?.title ?? sessionId} />
      </div>
      {(problem ?? live.problem) && (
        <p role="alert" class="problem">
          {problem ?? live.problem}
        </p>
      )}
      <Tabs tab={tab} onChange={setTab} />
      {tab === "trace" && (
        <div role="tabpanel" id="panel-trace" aria-labelledby="tab-trace" class="panel">
          <TraceView live={live} />
        </div>
      )}
      {tab === "events" && (
        <div role="tabpanel" id="panel-events" aria-labelledby="tab-events" class="panel">
          <EventInspector live={live} focus={focus} />
        </div>
      )}
      {tab === "state" && (
        <div role="tabpanel" id="panel-state" aria-labelledby="tab-state" class="panel">
          <Documents state={state} events={live.events} />
        </div>
      )}
      <div class="columns" role="tabpanel" id="panel-conversation" aria-labelledby="tab-conversation" hidden={tab !== "conversation"}>
        <section class="timeline" role="feed" aria-label="Conversation" aria-busy={live.connection !== "live"} ref={timeline} tabIndex={0}>
          {entries.length === 0 && <p class="quiet">Nothing here yet.</p>}
          <div class="window" style={{ height: `${list.getTotalSize()}px` }} data-entries={entries.length}>
            {list.getVirtualItems().map((item) => {
              const e = entries[item.index]!;
              return (
                <div
                  class="entry"
                  role="article"
                  aria-label={e.label}
                  aria-posinset={item.index + 1}
                  aria-setsize={entries.length}
                  key={e.key}
                  data-index={item.index}
                  ref={list.measureElement}
                  style={{ transform: `translateY(${item.start}px)` }}
                >
                  {e.render()}
                </div>
              );
            })}
          </div>
        </section>
        <p class="sr-only" aria-live="polite">
          {entries.length > 0 ? `latest: ${entries.at(-1)!.label}` : ""}
        </p>
        <aside aria-label="Runs" tabIndex={0}>
          <h2>Run tree</h2>
          <RunTree live={live} />
          {nested.length > 0 && (
            <fieldset>
              <legend>Show nested runs in the conversation</legend>
              {nested.map(([runId]) => (
                <label class="check" key={runId}>
                  <input
                    type="checkbox"
                    checked={opened.includes(runId)}
                    onChange={(e) => setOpened(e.currentTarget.checked ? [...opened, runId] : opened.filter((r) => r !== runId))}
                  />{" "}
                  {runId}
                </label>
              ))}
            </fieldset>
          )}
          <p class="quiet">
            {state.sessionSequence} events · <span data-session-sequence={state.sessionSequence}>through {state.sessionSequence}</span>
          </p>
          {Object.keys(sessionUsage).length > 0 && (
            <p class="usage" data-usage>
              Usage: {usageText(sessionUsage)}
              {sessionCost !== undefined && <span data-cost> · {costText(sessionCost)}</span>}
            </p>
          )}
        </aside>
      </div>
      {tab === "conversation" && may(identity, "command") && <Composer live={live} client={client} />}
    </main>
  );
}
