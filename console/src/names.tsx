/** How the console's lists name a session and link to it. */

/** The console's address of a session, or of one of its events. */
export function sessionHref(sessionId: string, eventId?: string): string {
  return `#/sessions/${encodeURIComponent(sessionId)}${eventId === undefined ? "" : `/events/${encodeURIComponent(eventId)}`}`;
}
/** A session as lists name it: its title (or id) linked to it, its id, whether it is archived. */
export function SessionName({ session }: { session: { sessionId: string; title?: string | undefined; archivedAt?: string | undefined } }) {
  return (
    <>
      <a href={sessionHref(session.sessionId)}>{session.title ?? session.sessionId}</a>
      <div class="id">{session.sessionId}</div>
      {session.archivedAt !== undefined && <span class="badge">archived</span>}
    </>
  );
}
