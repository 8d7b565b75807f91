// A program written against the types openapi-typescript generates from
// narad's OpenAPI document (generated/api.d.ts, made by `npm run generate`,
// never committed): it must type-check, and it must work against a server.
// It creates a session, appends an event, reads history, and reads an
// error, each through openapi-fetch with the generated `paths`.
//
//   NARAD_URL=http://127.0.0.1:8080 NARAD_TOKEN=... node dist/main.js

import createClient from "openapi-fetch";
import type { components, paths } from "./generated/api.js";

type Schemas = components["schemas"];
type ProposedEvent = Schemas["ProposedEvent"];
type AuthorityEvent = Schemas["AuthorityEvent"];
type ErrorCode = Schemas["Error"]["code"];

function env(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(`set ${name}`);
  }
  return value;
}

function fail(step: string, detail: unknown): never {
  throw new Error(`${step}: ${JSON.stringify(detail)}`);
}

const narad = createClient<paths>({
  baseUrl: env("NARAD_URL"),
  headers: { Authorization: `Bearer ${env("NARAD_TOKEN")}` },
});

// 1. A session.
const created = await narad.POST("/v1/sessions", {
  body: { title: "typed from the document", metadata: { client: "openapi-typescript" } },
});
if (created.error) {
  fail("createSession", created.error);
}
const session: Schemas["SessionRecord"] = created.data;

// 2. An append. A proposal is checked against the type it names.
const note: ProposedEvent = {
  protocolVersion: "narad/v1",
  type: "session.custom",
  eventId: `note-${session.sessionId}`,
  name: "contract.note",
  value: { written: "from TypeScript" },
};
// The journal assigns sequences: a proposal that carries one is no proposal.
// @ts-expect-error sessionSequence is not part of a proposal
const carriesSequence: ProposedEvent = { ...note, sessionSequence: 1 };
// A run event proposes its run position.
// @ts-expect-error run.raw needs rootRunId, runId, contentType and payload
const incomplete: ProposedEvent = { protocolVersion: "narad/v1", type: "run.raw", eventId: "e" };
void carriesSequence;
void incomplete;

const appended = await narad.POST("/v1/sessions/{sessionId}/events", {
  params: { path: { sessionId: session.sessionId } },
  body: { events: [note], expectedSessionSequence: session.sessionSequence },
});
if (appended.error) {
  fail("appendEvents", appended.error);
}
const written = appended.data.events[0];
if (written === undefined || written.eventId !== note.eventId) {
  fail("appendEvents answer", appended.data);
}

// 3. History: the event as stored, narrowed by its type.
const page = await narad.GET("/v1/sessions/{sessionId}/events", {
  params: { path: { sessionId: session.sessionId }, query: { afterSessionSequence: 0, limit: 100 } },
});
if (page.error) {
  fail("readHistory", page.error);
}
const stored: AuthorityEvent | undefined = page.data.events.find((e) => e.eventId === note.eventId);
if (stored === undefined || stored.type !== "session.custom") {
  fail("readHistory: the appended event", page.data);
}
if (stored.name !== "contract.note" || stored.sessionSequence !== written.sessionSequence) {
  fail("readHistory: the stored event", stored);
}

// 4. An error answers the envelope, its code one of the catalog's.
const missing = await narad.GET("/v1/sessions/{sessionId}", {
  params: { path: { sessionId: `${session.sessionId}-missing` } },
});
const code: ErrorCode | undefined = missing.error?.code;
if (missing.response.status !== 404 || code !== "NRD-0007") {
  fail("getSession of an unknown session", { status: missing.response.status, error: missing.error });
}

console.log(
  JSON.stringify({
    sessionId: session.sessionId,
    appended: written.sessionSequence,
    read: page.data.events.length,
    notFound: code,
  }),
);
