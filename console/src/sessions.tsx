/**
 * The sessions page: the live list (archived sessions on request) or, once
 * words or filters are given, the sessions the server's search finds.
 */
import { useEffect, useMemo, useState } from "preact/hooks";

import type { NaradClient } from "../../clients/typescript/src/index.js";
import { type Identity, may } from "./auth.js";
import { ago, useObservable, useTick } from "./hooks.js";
import { LiveSessionList, messageOf, type SessionSummary } from "./live.js";
import { SessionName, sessionHref } from "./names.js";
import { type Criteria, Filters, NO_CRITERIA, SearchResults, searching } from "./search.js";
import { SessionUsage, useSessionUsage } from "./usage.js";

function activity(s: SessionSummary): number {
  return s.lastActivity ?? Date.parse(s.createdAt);
}

export function SessionsPage({ client, identity }: { client: NaradClient; identity: Identity }) {
  const list = useMemo(() => new LiveSessionList(client), [client]);
  useEffect(() => () => list.close(), [list]);
  useObservable(list);
  const now = useTick(5000);
  const [criteria, setCriteria] = useState<Criteria>(NO_CRITERIA);
  const [archived, setArchived] = useState(false);
  const [problem, setProblem] = useState<string>();
  const search = searching(criteria);
  // A session id typed whole opens that session (search finds words, not ids).
  const byId = list.sessions.get(criteria.q.trim());
  const rows = [...list.sessions.values()].filter((s) => archived || s.archivedAt === undefined).sort((a, b) => activity(b) - activity(a));
  const priced = rows.slice(0, 100);
  const usage = useSessionUsage(
    client,
    priced.map((s) => s.sessionId),
    priced.length > 0 ? Math.min(...priced.map((s) => Date.parse(s.createdAt))) : undefined,
    priced.map((s) => (s.activeExecution ? "1" : "0")).join(""),
  );

  const create = async () => {
    try {
      const s = await client.createSession({ title: `Session ${new Date().toLocaleString()}` });
      location.hash = sessionHref(s.sessionId);
    } catch (e) {
      setProblem(messageOf(e));
    }
  };

  return (
    <main class="sessions">
      <div class="toolbar">
        <h1>Sessions</h1>
        <input
          type="search"
          placeholder="Search what was said, answers, titles"
          aria-label="Search sessions"
          value={criteria.q}
          onInput={(e) => setCriteria({ ...criteria, q: e.currentTarget.value })}
        />
        {!search && (
          <label class="check">
            <input type="checkbox" checked={archived} onChange={(e) => setArchived(e.currentTarget.checked)} /> Show archived
          </label>
        )}
        {may(identity, "command") && (
          <button type="button" onClick={create}>
            New session
          </button>
        )}
        <span class={`dot ${list.connection}`} role="status" aria-label={`tenant stream ${list.connection}`} title={`tenant stream: ${list.connection}`} />
      </div>
      <Filters criteria={criteria} set={setCriteria} />
      {(problem ?? list.problem) && (
        <p role="alert" class="problem">
          {problem ?? list.problem}
        </p>
      )}
      {byId && (
        <p>
          Session <a href={sessionHref(byId.sessionId)}>{byId.title ?? byId.sessionId}</a> has this id.
        </p>
      )}
      {search && <SearchResults client={client} criteria={criteria} now={now} />}
      {!search && !list.loaded && <p class="quiet">Loading sessions…</p>}
      {!search && list.loaded && rows.length === 0 && <p class="quiet">No sessions yet.</p>}
      {!search && rows.length > 0 && (
        <table>
          <thead>
            <tr>
              <th scope="col">Session</th>
              <th scope="col">Active</th>
              <th scope="col">Approvals</th>
              <th scope="col">Events</th>
              <th scope="col">Usage</th>
              <th scope="col">Last activity</th>
            </tr>
          </thead>
          <tbody>
            {rows.map((s) => (
              <tr key={s.sessionId} data-session={s.sessionId}>
                <td>
                  <SessionName session={s} />
                </td>
                <td>
                  {s.activeExecution ? (
                    <span class="badge running id-badge" title={s.activeExecution.runId ?? s.activeExecution.workflowId}>
                      {s.activeExecution.kind} {s.activeExecution.runId ?? s.activeExecution.workflowId}
                    </span>
                  ) : (
                    "—"
                  )}
                </td>
                <td>{s.pending.size > 0 ? <span class="badge waiting">{s.pending.size} waiting</span> : "—"}</td>
                <td class="num">{s.sessionSequence}</td>
                <td data-usage>
                  <SessionUsage usage={usage.get(s.sessionId)} />
                </td>
                <td>{ago(activity(s), now)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </main>
  );
}
