/**
 * Search on the sessions page: `GET /v1/search` (what people said and
 * answered, titles; state, waiting approvals, actor, dates), newest match
 * first, each session with its matching passages linked to their events.
 */
import { useEffect, useState } from "preact/hooks";

import type { NaradClient, SearchPage, SearchQuery, SearchResult } from "../../clients/typescript/src/index.js";
import { When } from "./figures.js";
import { messageOf } from "./live.js";
import { SessionName, sessionHref } from "./names.js";

/** What the operator asked for; empty strings mean "any". */
export interface Criteria {
  q: string;
  state: "" | NonNullable<SearchQuery["state"]>;
  pending: boolean;
  actor: string;
  /** Days (`YYYY-MM-DD`, the viewer's zone), inclusive. */
  since: string;
  until: string;
}

export const NO_CRITERIA: Criteria = { q: "", state: "", pending: false, actor: "", since: "", until: "" };

/** A day of the viewer's zone as the instant it starts (RFC 3339). */
function dayStart(day: string, plusDays = 0): string | undefined {
  const [y, m, d] = day.split("-").map(Number);
  if (y === undefined || m === undefined || d === undefined) return undefined;
  return new Date(y, m - 1, d + plusDays).toISOString();
}

/** What `GET /v1/search` is asked for `c`: only what is set. */
function queryOf(c: Criteria): SearchQuery {
  const q: SearchQuery = {};
  if (c.q.trim() !== "") q.q = c.q.trim();
  if (c.state !== "") q.state = c.state;
  if (c.pending) q.pendingApprovals = true;
  if (c.actor.trim() !== "") q.actor = c.actor.trim();
  const since = c.since === "" ? undefined : dayStart(c.since);
  const until = c.until === "" ? undefined : dayStart(c.until, 1);
  if (since !== undefined) q.since = since;
  if (until !== undefined) q.until = until;
  return q;
}

/** Whether the criteria ask the server anything (else the live list shows). */
export function searching(c: Criteria): boolean {
  return Object.keys(queryOf(c)).length > 0;
}

interface Found {
  results: SearchResult[];
  nextAfter: string | undefined;
  /** Why nothing was looked for (words with nothing searchable). */
  notice: string | undefined;
  loading: boolean;
  problem: string | undefined;
}

/** The results of `criteria`, asked 250 ms after they stop changing; a later question wins over an earlier answer. */
function useSearch(client: NaradClient, criteria: Criteria): Found & { more: () => void } {
  const [found, setFound] = useState<Found>({ results: [], nextAfter: undefined, notice: undefined, loading: true, problem: undefined });
  const key = JSON.stringify(criteria);
  useEffect(() => {
    let current = true;
    setFound((f) => ({ ...f, loading: true }));
    const timer = setTimeout(() => {
      client
        .searchSessions(queryOf(criteria))
        .then((page: SearchPage) => {
          if (current) setFound({ results: page.results, nextAfter: page.nextAfter, notice: page.notice, loading: false, problem: undefined });
        })
        .catch((e: unknown) => {
          if (current) setFound({ results: [], nextAfter: undefined, notice: undefined, loading: false, problem: messageOf(e) });
        });
    }, 250);
    return () => {
      current = false;
      clearTimeout(timer);
    };
    // `key` stands for the criteria: a new object with the same values asks nothing new.
  }, [client, key]);
  const more = () => {
    if (found.nextAfter === undefined) return;
    const after = found.nextAfter;
    setFound((f) => ({ ...f, loading: true }));
    client
      .searchSessions({ ...queryOf(criteria), after })
      .then((page) =>
        setFound((f) => (f.nextAfter === after ? { ...f, results: [...f.results, ...page.results], nextAfter: page.nextAfter, loading: false } : f)),
      )
      .catch((e: unknown) => setFound((f) => ({ ...f, loading: false, problem: messageOf(e) })));
  };
  return { ...found, more };
}

const FIELD: Record<string, string> = { title: "title", message: "said", question: "asked", answer: "answered" };

/** Who a match names as its actor, followed by a space; empty when nobody. */
function who(actor: unknown): string {
  const sub = (actor as { sub?: unknown } | undefined)?.sub;
  return typeof sub === "string" ? `${sub} ` : "";
}

/** A passage, its matched words marked. */
function Passage({ parts }: { parts: SearchResult["matches"][number]["snippet"] }) {
  return <>{parts.map((p, i) => (p.matched ? <mark key={i}>{p.text}</mark> : p.text))}</>;
}

/** The search form's filters beside the words (the words' box is the page's). */
export function Filters({ criteria, set }: { criteria: Criteria; set: (c: Criteria) => void }) {
  return (
    <div class="filters" role="group" aria-label="Search filters">
      <label>
        State{" "}
        <select value={criteria.state} onChange={(e) => set({ ...criteria, state: e.currentTarget.value as Criteria["state"] })}>
          <option value="">any</option>
          <option value="open">open</option>
          <option value="running">running</option>
          <option value="idle">idle</option>
          <option value="archived">archived</option>
        </select>
      </label>
      <label class="check">
        <input type="checkbox" checked={criteria.pending} onChange={(e) => set({ ...criteria, pending: e.currentTarget.checked })} /> Waiting on an
        approval
      </label>
      <label>
        Who{" "}
        <input type="text" size={12} placeholder="a person's sub" value={criteria.actor} onInput={(e) => set({ ...criteria, actor: e.currentTarget.value })} />
      </label>
      <label>
        From <input type="date" value={criteria.since} onInput={(e) => set({ ...criteria, since: e.currentTarget.value })} />
      </label>
      <label>
        To <input type="date" value={criteria.until} onInput={(e) => set({ ...criteria, until: e.currentTarget.value })} />
      </label>
      {searching(criteria) && (
        <button type="button" onClick={() => set(NO_CRITERIA)}>
          Clear
        </button>
      )}
    </div>
  );
}

/** The sessions the server found for `criteria`. */
export function SearchResults({ client, criteria, now }: { client: NaradClient; criteria: Criteria; now: number }) {
  const found = useSearch(client, criteria);
  return (
    <section aria-label="Search results" aria-busy={found.loading}>
      {found.problem !== undefined && (
        <p role="alert" class="problem">
          {found.problem}
        </p>
      )}
      {found.loading && found.results.length === 0 && <p class="quiet">Searching…</p>}
      {!found.loading && found.notice !== undefined && (
        <p role="status" class="quiet">
          {found.notice}
        </p>
      )}
      {!found.loading && found.problem === undefined && found.notice === undefined && found.results.length === 0 && <p class="quiet">No session matches.</p>}
      {found.results.length > 0 && (
        <table class="found">
          <thead>
            <tr>
              <th scope="col">Session</th>
              <th scope="col">Matches</th>
              <th scope="col">Approvals</th>
              <th scope="col">Last match</th>
            </tr>
          </thead>
          <tbody>
            {found.results.map((r) => (
              <tr key={r.session.sessionId} data-session={r.session.sessionId}>
                <td>
                  <SessionName session={r.session} />
                  {r.matches.length > 0 && (
                    <ul class="passages">
                      {r.matches.map((m, i) => (
                        <li key={m.eventId ?? `title-${i}`}>
                          <span class="field">
                            {who(m.actor)}
                            {FIELD[m.field] ?? m.field}
                          </span>{" "}
                          {m.eventId === undefined ? (
                            <Passage parts={m.snippet} />
                          ) : (
                            <a href={sessionHref(r.session.sessionId, m.eventId)}>
                              <Passage parts={m.snippet} />
                            </a>
                          )}{" "}
                          <When at={m.at} now={now} />
                        </li>
                      ))}
                    </ul>
                  )}
                </td>
                <td class="num">{r.matchCount}</td>
                <td>{r.openInterrupts > 0 ? <span class="badge waiting">{r.openInterrupts} waiting</span> : "—"}</td>
                <td>
                  <When at={r.at} now={now} />
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {found.nextAfter !== undefined && (
        <button type="button" onClick={found.more} disabled={found.loading}>
          More
        </button>
      )}
    </section>
  );
}
