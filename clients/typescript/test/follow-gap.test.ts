// follow() fills a gap from history: retention forgot rows of the tenant
// stream before this reader got them (a `replay-gap` frame), so a session's
// next event skips sequences; the events in between come from history,
// before it, and the reduced state equals what history holds. Served by a
// scripted fetch: a real server forgets rows only under retention pressure
// (narad's own test of that is tests/tests/resume.rs).
import assert from "node:assert/strict";
import { test } from "node:test";

import { follow, NaradClient, SessionReducer, type Frame } from "../src/index.js";

function event(session: string, seq: number, type: string, extra: Record<string, unknown> = {}) {
  return {
    protocolVersion: "narad/v1",
    type,
    eventId: `${session}-e${seq}`,
    timestamp: "2026-12-01T00:00:00Z",
    sessionId: session,
    sessionSequence: seq,
    ...extra,
  };
}

const said = (session: string, seq: number) =>
  event(session, seq, "message.user.recorded", { messageId: `m${seq}`, messageScope: "session", content: `line ${seq}` });

const history = [1, 2, 3, 4, 5].map((n) => said("ses-a", n));

function sse(frames: readonly { event?: string; id?: string; data: unknown }[]): string {
  return frames
    .map((f) => `${f.event ? `event: ${f.event}\n` : ""}${f.id ? `id: ${f.id}\n` : ""}data: ${JSON.stringify(f.data)}\n\n`)
    .join("");
}

/** A server: the stream (every connection gets all of it), and history, whose first `failures` reads answer `status`. */
function scripted(
  frames: Parameters<typeof sse>[0],
  failures = 0,
  status = 503,
): { fetch: typeof fetch; historyReads: string[]; streamOpens: () => number } {
  const historyReads: string[] = [];
  let opens = 0;
  let failed = 0;
  const impl = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
    const url = new URL(String(input));
    if (url.pathname === "/v1/events") {
      opens += 1;
      // Resumes after Last-Event-ID, as narad does.
      const after = new Headers(init?.headers).get("Last-Event-ID");
      const from = after === null ? 0 : frames.findIndex((f) => f.id === after) + 1;
      return new Response(sse(frames.slice(from)), { headers: { "content-type": "text/event-stream" } });
    }
    const m = /^\/v1\/sessions\/([^/]+)\/events$/.exec(url.pathname);
    if (m) {
      historyReads.push(url.search);
      if (failed < failures) {
        failed += 1;
        return Response.json({ code: status === 404 ? "NRD-0007" : "NRD-0001", title: "no", message: "not now" }, { status });
      }
      const after = Number(url.searchParams.get("afterSessionSequence") ?? 0);
      const events = history.filter((e) => e.sessionId === m[1] && e.sessionSequence > after).slice(0, 2);
      const last = events.at(-1);
      const body = last === undefined ? { events } : { events, nextSessionSequence: last.sessionSequence };
      return Response.json(body);
    }
    return new Response("{}", { status: 404 });
  };
  return { fetch: impl as typeof fetch, historyReads, streamOpens: () => opens };
}

async function take(frames: AsyncGenerator<Frame>, n: number): Promise<Frame[]> {
  const out: Frame[] = [];
  for await (const f of frames) {
    out.push(f);
    if (out.length === n) break;
  }
  return out;
}

test("a gap announced by replay-gap is filled from history, in order, once", async () => {
  const stream = [
    { event: "capabilities", data: { protocolVersion: "narad/v1", type: "capabilities" } },
    { id: "ses-a-e1", data: history[0] },
    { event: "replay-gap", data: { protocolVersion: "narad/v1", type: "replay-gap", forgottenThrough: "ses-a-e3", message: "forgotten" } },
    { id: "ses-a-e5", data: history[4] },
  ];
  const { fetch, historyReads } = scripted(stream);
  const client = new NaradClient({ servers: "http://narad.test", token: "t", fetch });
  const frames = await take(follow(client), 7);
  const authority = frames.flatMap((f) => (f.kind === "authority" ? [f] : []));
  assert.deepEqual(
    authority.map((f) => [f.event.sessionSequence, f.fromHistory === true]),
    [
      [1, false],
      [2, true],
      [3, true],
      [4, true],
      [5, false],
    ],
  );
  assert.ok(frames.some((f) => f.kind === "replay-gap"), "the replay-gap frame is yielded to the caller");
  assert.deepEqual(historyReads, ["?afterSessionSequence=1", "?afterSessionSequence=3"], "history is read page by page up to the stream's event");
  const reducer = new SessionReducer();
  for (const f of authority) reducer.deliver(f.event);
  const replayed = new SessionReducer();
  for (const e of history) replayed.deliver(e);
  assert.deepEqual(reducer.state(), replayed.state());
});

test("a replay-gap naming its session fills that session at once", async () => {
  const stream = [
    { id: "ses-a-e1", data: history[0] },
    { id: "ses-a-e2", data: history[1] },
    { event: "replay-gap", data: { protocolVersion: "narad/v1", type: "replay-gap", forgottenThrough: null, sessionId: "ses-a", message: "forgotten" } },
  ];
  const { fetch } = scripted(stream);
  const client = new NaradClient({ servers: "http://narad.test", token: "t", fetch });
  const frames = await take(follow(client, { onlySession: "ses-a" }), 6);
  assert.deepEqual(
    frames.flatMap((f) => (f.kind === "authority" ? [f.event.sessionSequence] : [])),
    [1, 2, 3, 4, 5],
  );
});

const gapStream = () => [
  { id: "ses-a-e1", data: history[0] },
  { event: "replay-gap", data: { protocolVersion: "narad/v1", type: "replay-gap", forgottenThrough: "ses-a-e3", message: "forgotten" } },
  { id: "ses-a-e5", data: history[4] },
];

test("history not answering while a gap is filled: the stream resumes before the frame, after a backoff", { timeout: 10_000 }, async () => {
  const { fetch, streamOpens } = scripted(gapStream(), 1, 503);
  const client = new NaradClient({ servers: "http://narad.test", token: "t", fetch });
  const frames = await take(follow(client, { initialBackoffMs: 50 }), 7);
  assert.deepEqual(
    frames.flatMap((f) => (f.kind === "authority" ? [f.event.sessionSequence] : [])),
    [1, 2, 3, 4, 5],
    "every event once, in order: the frame after the gap was not lost",
  );
  assert.equal(streamOpens(), 2, "one reconnect");
});

test("history refusing for good leaves the gap, and the stream goes on", { timeout: 10_000 }, async () => {
  const { fetch, streamOpens } = scripted(gapStream(), 100, 404);
  const client = new NaradClient({ servers: "http://narad.test", token: "t", fetch });
  const frames = await take(follow(client, { initialBackoffMs: 50 }), 3);
  const seqs = frames.flatMap((f) => (f.kind === "authority" ? [f.event.sessionSequence] : []));
  assert.deepEqual(seqs, [1, 5]);
  const reducer = new SessionReducer();
  reducer.deliver(history[0]);
  assert.throws(() => reducer.deliver(history[4]), (e: Error & { rule?: string }) => e.rule === "delivery.gap");
  assert.equal(streamOpens(), 1, "no reconnect loop");
});
