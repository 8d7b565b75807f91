/**
 * The approvals inbox: every open interrupt of the tenant, oldest first,
 * with how long it has waited; and, for those who opt in, a browser
 * notification when a new one arrives (while the console is open).
 */
import { useEffect, useRef, useState } from "preact/hooks";

import type { NaradClient } from "../../clients/typescript/src/index.js";
import { InterruptActions } from "./actions.js";
import { type Identity, may } from "./auth.js";
import { ago, useObservable, useTick } from "./hooks.js";
import { LiveInbox } from "./live.js";

/** Where the opt-in to notifications is kept (this browser). */
const NOTIFY = "narad.console.notify-approvals";

/** Whether this browser asked to be told of new approvals, and may be. */
function notifying(): boolean {
  return localStorage.getItem(NOTIFY) === "on" && typeof Notification === "function" && Notification.permission === "granted";
}

/**
 * Tells the person of each interrupt that arrives after the inbox was first
 * read, once, when they opted in (the console open in some tab).
 */
export function useApprovalNotifications(inbox: LiveInbox | undefined): void {
  const known = useRef<Set<string> | undefined>(undefined);
  useEffect(() => {
    if (inbox === undefined || !inbox.loaded) return;
    const ids = new Set(inbox.waiting.map((w) => w.interruptId));
    const before = known.current;
    known.current = ids;
    if (before === undefined || !notifying()) return;
    for (const w of inbox.waiting) {
      if (before.has(w.interruptId)) continue;
      const title = (w.request.title as string | undefined) ?? (w.request.kind as string);
      const n = new Notification("An approval is waiting", { body: `${title} — in ${w.sessionTitle ?? w.sessionId}`, tag: w.interruptId });
      n.onclick = () => {
        focus();
        location.hash = `#/sessions/${encodeURIComponent(w.sessionId)}`;
      };
    }
  });
}

/** The opt-in to notifications, asked of the browser on a click. */
function NotifyToggle() {
  const [on, setOn] = useState(notifying);
  const [problem, setProblem] = useState<string>();
  if (typeof Notification !== "function") return null;
  return (
    <label class="check">
      <input
        type="checkbox"
        checked={on}
        onChange={async (e) => {
          const wanted = e.currentTarget.checked;
          if (wanted && Notification.permission !== "granted" && (await Notification.requestPermission()) !== "granted") {
            setProblem("The browser does not allow notifications for this site.");
            setOn(false);
            return;
          }
          localStorage.setItem(NOTIFY, wanted ? "on" : "off");
          setProblem(undefined);
          setOn(wanted);
        }}
      />{" "}
      Notify me of new approvals
      {problem && <span class="problem"> {problem}</span>}
    </label>
  );
}

export function ApprovalsPage({ client, identity, inbox }: { client: NaradClient; identity: Identity; inbox: LiveInbox }) {
  useObservable(inbox);
  const now = useTick(5000);
  return (
    <main class="approvals">
      <div class="toolbar">
        <h1>Approvals</h1>
        <span class={`dot ${inbox.connection}`} role="status" aria-label={`tenant stream ${inbox.connection}`} title={`tenant stream: ${inbox.connection}`} />
        <NotifyToggle />
      </div>
      {inbox.problem && (
        <p role="alert" class="problem">
          {inbox.problem}
        </p>
      )}
      {!inbox.loaded && <p class="quiet">Loading…</p>}
      {inbox.loaded && inbox.waiting.length === 0 && <p class="quiet">Nothing is waiting for a decision.</p>}
      <ol class="inbox">
        {inbox.waiting.map((w) => (
          <li key={w.interruptId} class="interrupt open" data-interrupt={w.interruptId}>
            <header>
              {(w.request.title as string | undefined) ?? (w.request.kind as string)}
              <span class="badge waiting" title={w.requestedAt}>
                waiting {ago(Date.parse(w.requestedAt), now).replace(" ago", "")}
              </span>
            </header>
            {typeof w.request.message === "string" && <p>{w.request.message}</p>}
            <p class="quiet">
              in <a href={`#/sessions/${encodeURIComponent(w.sessionId)}`}>{w.sessionTitle ?? w.sessionId}</a>
            </p>
            {may(identity, "approve") && (
              <InterruptActions client={client} sessionId={w.sessionId} interruptId={w.interruptId} actions={(w.request.actions as string[]) ?? []} />
            )}
          </li>
        ))}
      </ol>
    </main>
  );
}
