/** The approvals inbox: every open interrupt of the tenant, oldest first, with how long it has waited. */
import { useEffect, useMemo } from "preact/hooks";

import type { NaradClient } from "../../clients/typescript/src/index.js";
import { InterruptActions } from "./actions.js";
import { type Identity, may } from "./auth.js";
import { ago, useObservable, useTick } from "./hooks.js";
import { LiveInbox } from "./live.js";

export function ApprovalsPage({ client, identity }: { client: NaradClient; identity: Identity }) {
  const inbox = useMemo(() => new LiveInbox(client), [client]);
  useEffect(() => () => inbox.close(), [inbox]);
  useObservable(inbox);
  const now = useTick(5000);
  return (
    <main class="approvals">
      <div class="toolbar">
        <h1>Approvals</h1>
        <span class={`dot ${inbox.connection}`} role="status" aria-label={`tenant stream ${inbox.connection}`} title={`tenant stream: ${inbox.connection}`} />
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
