/**
 * State over time: each revision of a state or UI document with its RFC
 * 6902 delta (or its snapshot), and the document as it stood at any
 * revision, folded from the session's events.
 */
import { useState } from "preact/hooks";

import { applyPatch, type Json, type PatchOperation } from "../../clients/typescript/src/index.js";
import type { Event } from "./live.js";

/** One revision of a document: the event that made it. */
interface Revision {
  revision: number;
  event: Event;
}

/** The revisions of `scope` in a family (`state` or `ui`), in order. */
export function revisionsOf(events: readonly Event[], family: "state" | "ui", scope: string): Revision[] {
  const prefix = family === "state" ? "state." : "ui.state.";
  return events
    .filter((e) => (e.type === `${prefix}snapshot` || e.type === `${prefix}delta`) && e.scope === scope)
    .map((e) => ({ revision: e.revision as number, event: e }));
}

/** The document after `upTo` (an index into `revisions`), folded from the snapshots and deltas before it. */
export function documentAt(revisions: readonly Revision[], upTo: number): Json {
  let doc: Json = null;
  for (const { event } of revisions.slice(0, upTo + 1)) {
    doc = event.type.endsWith(".snapshot") ? (event.state as Json) : applyPatch(doc, event.patch as PatchOperation[]);
  }
  return doc;
}

/** A document's revisions, each delta shown, and the document at the revision picked. */
export function RevisionHistory({ events, family, scope }: { events: readonly Event[]; family: "state" | "ui"; scope: string }) {
  const revisions = revisionsOf(events, family, scope);
  const [picked, setPicked] = useState<number | undefined>(undefined);
  if (revisions.length === 0) return null;
  const at = Math.min(picked ?? revisions.length - 1, revisions.length - 1);
  let doc: Json | undefined;
  let problem: string | undefined;
  try {
    doc = documentAt(revisions, at);
  } catch (e) {
    problem = e instanceof Error ? e.message : String(e);
  }
  return (
    <details class="revisions" data-scope={scope}>
      <summary>
        {revisions.length} revision{revisions.length === 1 ? "" : "s"}
      </summary>
      <ol>
        {revisions.map((r, i) => (
          <li key={r.event.eventId} class={i === at ? "picked" : ""}>
            <button type="button" class="quiet" aria-pressed={i === at} onClick={() => setPicked(i)}>
              revision {r.revision}
            </button>{" "}
            <span class="quiet">
              #{r.event.sessionSequence} · <time dateTime={r.event.timestamp}>{new Date(r.event.timestamp).toLocaleString()}</time>
            </span>
            <pre class="json delta">{r.event.type.endsWith(".snapshot") ? `snapshot ${JSON.stringify(r.event.state)}` : JSON.stringify(r.event.patch)}</pre>
          </li>
        ))}
      </ol>
      <p>
        The document at revision <strong data-revision-shown>{revisions[at]!.revision}</strong>:
      </p>
      {problem === undefined ? <pre class="json" data-document-at>{JSON.stringify(doc, null, 2)}</pre> : <p class="problem">{problem}</p>}
    </details>
  );
}
