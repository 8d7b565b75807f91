// Against a running narad: NARAD_URL and NARAD_TOKEN (a token with the
// roles reader, writer and backend) must be set; .ci/typescript-sdk sets
// them. Without them the tests fail: they are never skipped.
import assert from "node:assert/strict";
import { test } from "node:test";

import { follow, NaradClient, NaradError, parseSse, SessionReducer } from "../src/index.js";
import type { Frame, GraphNode, ProposedEvent } from "../src/index.js";

const url = process.env["NARAD_URL"];
const token = process.env["NARAD_TOKEN"];
if (!url || !token) {
  throw new Error("set NARAD_URL and NARAD_TOKEN: these tests run against a narad server");
}

function note(eventId: string, n: number): ProposedEvent {
  return { protocolVersion: "narad/v1", type: "session.custom", eventId, name: "sdk.note", value: { n } };
}

test("sessions, appends, history and commands, with errors as values", async () => {
  const narad = new NaradClient({ servers: url, token });
  const session = await narad.createSession({ title: "sdk" });
  const appended = await narad.appendEvents(session.sessionId, [note(`${session.sessionId}-1`, 1)], {
    expectedSessionSequence: session.sessionSequence,
  });
  assert.equal(appended.duplicate, false);
  // The same batch again is a duplicate, not a second event.
  const again = await narad.appendEvents(session.sessionId, [note(`${session.sessionId}-1`, 1)]);
  assert.equal(again.duplicate, true);

  const said = await narad.command("record-user-message", {
    sessionId: session.sessionId,
    messageScope: "session",
    content: "hello",
  });
  assert.ok(said);

  // Paged with a small limit: every event once, in order.
  for (let i = 2; i <= 5; i++) {
    await narad.appendEvents(session.sessionId, [note(`${session.sessionId}-${i}`, i)]);
  }
  const all = [];
  for await (const event of narad.allHistory(session.sessionId, { limit: 2 })) {
    all.push(event);
  }
  const sequences = all.map((e) => e.sessionSequence);
  assert.deepEqual(sequences, Array.from({ length: sequences.length }, (_, i) => i + 1));
  assert.equal(all.filter((e) => e.type === "session.custom").length, 5);

  await assert.rejects(narad.getSession(`${session.sessionId}-missing`), (e: unknown) => {
    assert.ok(e instanceof NaradError);
    assert.equal(e.status, 404);
    assert.equal(e.code, "NRD-0007");
    return true;
  });
  await assert.rejects(
    narad.appendEvents(session.sessionId, [note(`${session.sessionId}-x`, 0)], { expectedSessionSequence: 1 }),
    (e: unknown) => e instanceof NaradError && e.code === "NRD-0203",
  );
});

test("follow resumes after a cut connection and across servers, never repeating", async () => {
  // The first stream connection is cut after its first few frames, as a
  // restarting server or a proxy would; the first server is not there.
  let streams = 0;
  const cutting: typeof fetch = async (input, init) => {
    const response = await fetch(input, init);
    const isStream = String(input).includes("/stream");
    if (!isStream || streams++ > 0 || !response.body) {
      return response;
    }
    const reader = response.body.getReader();
    let sent = 0;
    const cut = new ReadableStream<Uint8Array>({
      async pull(controller) {
        const { done, value } = await reader.read();
        if (done || sent > 2) {
          await reader.cancel();
          controller.close();
          return;
        }
        sent += 1;
        controller.enqueue(value);
      },
    });
    return new Response(cut, { status: response.status, headers: response.headers });
  };
  const narad = new NaradClient({ servers: ["http://127.0.0.1:9", url], token, fetch: cutting });
  const session = await narad.createSession({});
  const total = 30;
  const writer = (async () => {
    for (let i = 1; i <= total; i++) {
      await narad.appendEvents(session.sessionId, [note(`${session.sessionId}-${i}`, i)]);
    }
  })();
  const stop = new AbortController();
  const got: number[] = [];
  const frames: Frame[] = [];
  for await (const frame of follow(narad, { sessionId: session.sessionId, signal: stop.signal, initialBackoffMs: 20 })) {
    frames.push(frame);
    if (frame.kind === "authority" && frame.event.type === "session.custom") {
      got.push((frame.event.value as { n: number }).n);
      if (got.length === total) {
        stop.abort();
      }
    }
  }
  await writer;
  assert.deepEqual(got, Array.from({ length: total }, (_, i) => i + 1));
  assert.ok(streams >= 2, `the stream was reopened (${streams} connections)`);
  assert.equal(frames[0]?.kind, "capabilities");
});

test("a stream ticket opens its stream without Authorization", async () => {
  const narad = new NaradClient({ servers: url, token });
  const session = await narad.createSession({});
  const ticket = await narad.streamTicket({ stream: "session", sessionId: session.sessionId });
  assert.ok(ticket.ticket.startsWith("nst_"));
  const stop = new AbortController();
  const response = await fetch(url + ticket.url, { signal: stop.signal });
  assert.equal(response.status, 200);
  for await (const event of parseSse(response.body as ReadableStream<Uint8Array>)) {
    assert.equal(event.event, "capabilities");
    break;
  }
  stop.abort();
  const refused = await fetch(`${url}/v1/sessions/${session.sessionId}/events?ticket=${ticket.ticket}`);
  assert.equal(refused.status, 401);
});

test("the reducer's run graph, patched delta by delta, equals the snapshot a new stream sends", async () => {
  const narad = new NaradClient({ servers: url, token });
  const session = await narad.createSession({ title: "graph" });
  const sid = session.sessionId;
  const e = (type: string, extra: Record<string, unknown>): ProposedEvent =>
    ({ protocolVersion: "narad/v1", type, eventId: `${sid}-${type}-${JSON.stringify(extra).length}-${Math.random()}`, ...extra }) as ProposedEvent;
  const r1 = { rootRunId: "g1", runId: "g1" };
  await narad.appendEvents(sid, [e("run.started", r1)]);
  const reducer = new SessionReducer();
  const stop = new AbortController();
  const following = (async () => {
    for await (const frame of follow(narad, { sessionId: sid, signal: stop.signal, initialBackoffMs: 20 })) {
      if (frame.kind === "authority") reducer.deliver(frame.event);
      else if (frame.kind === "hydrate") reducer.deliver(frame.record);
      const root = reducer.graphs.get("g1")?.document.nodes.find((n) => n.id === "run:g1");
      if (root?.status === "finished") stop.abort();
    }
  })();
  const nested = { rootRunId: "g1", runId: "g2", parentRunId: "g1" };
  await narad.appendEvents(sid, [
    e("tool.call.started", { ...r1, toolCallId: "t1", toolName: "search", executor: "backend", args: {} }),
    e("tool.call.finished", { ...r1, toolCallId: "t1", outcome: "success", response: { hits: 3 } }),
  ]);
  await narad.appendEvents(sid, [e("run.started", nested), e("run.finished", nested), e("run.finished", r1)]);
  await following;
  const held = reducer.graphs.get("g1")!;
  assert.equal(held.stale, false);
  // A new connection gets the journal's snapshot at the same revision.
  let snapshot: Record<string, unknown> | undefined;
  const again = new AbortController();
  for await (const frame of follow(narad, { sessionId: sid, afterSessionSequence: 6, signal: again.signal })) {
    if (frame.kind === "hydrate" && frame.record.type === "graph.snapshot") {
      snapshot = frame.record as unknown as Record<string, unknown>;
      again.abort();
    }
  }
  assert.ok(snapshot, "a graph.snapshot on attach");
  assert.equal(snapshot.revision, held.revision);
  assert.deepEqual({ rootNodeId: snapshot.rootNodeId, nodes: snapshot.nodes, edges: snapshot.edges }, held.document);
  const kinds = held.document.nodes.map((n: GraphNode) => `${n.kind}:${n.status}`).sort();
  assert.deepEqual(kinds, ["run:finished", "run:finished", "tool.call:success"]);
});

test("a blob goes up and comes back, whole and in part, and a person attaches one", async () => {
  const narad = new NaradClient({ servers: url, token });
  const session = await narad.createSession({ title: "blobs" });
  const bytes = new Uint8Array(3 * 1024 * 1024 + 7).map((_, i) => (i * 7) % 251);
  const blob = await narad.uploadBlob(session.sessionId, bytes, { name: "data.bin" });
  assert.equal(blob.sizeBytes, bytes.length);
  assert.ok(blob.uri.startsWith("narad://blobs/"));
  const whole = new Uint8Array(await (await narad.downloadBlob(blob.uri)).arrayBuffer());
  assert.deepEqual(whole, bytes);
  const part = await narad.downloadBlob(blob.blobId, { range: [1024 * 1024 - 2, 1024 * 1024 + 1] });
  assert.equal(part.status, 206);
  assert.deepEqual(new Uint8Array(await part.arrayBuffer()), bytes.slice(1024 * 1024 - 2, 1024 * 1024 + 2));
  // A plain URL, with no Authorization, as an <img src> would load it.
  const plain = await narad.blobUrl(blob.uri);
  assert.ok(plain.startsWith(url) && plain.includes("?ticket=nst_"), plain);
  const fetched = await fetch(plain);
  assert.equal(fetched.status, 200);
  assert.deepEqual(new Uint8Array(await fetched.arrayBuffer()), bytes);
  assert.equal((await fetch(plain.replace(/\?ticket=.*/, ""))).status, 401);
  const attached = await narad.uploadBlob(session.sessionId, "hello", {
    name: "hello.txt",
    mediaType: "text/plain",
    attachmentId: "att-1",
  });
  assert.equal(attached.attachmentId, "att-1");
  const types: string[] = [];
  for await (const e of narad.allHistory(session.sessionId)) {
    types.push(e.type);
  }
  assert.deepEqual(types.slice(-2), ["attachment.added", "attachment.ready"]);
  // Another session's reference is refused with its code.
  const other = await narad.createSession({ title: "other" });
  await assert.rejects(
    narad.appendEvents(other.sessionId, [
      {
        protocolVersion: "narad/v1",
        type: "attachment.added",
        eventId: `${other.sessionId}-a`,
        attachmentId: "a",
        name: "x",
        mediaType: "text/plain",
        uri: blob.uri,
      } as ProposedEvent,
    ]),
    (e: unknown) => e instanceof NaradError && e.code === "NRD-0209",
  );
});

test("open interrupts, the tenant's or one session's, until resolved", async () => {
  const narad = new NaradClient({ servers: url, token });
  const sessions: string[] = [];
  for (const n of [1, 2]) {
    const { sessionId } = await narad.createSession({});
    sessions.push(sessionId);
    const runId = `run-${n}`;
    await narad.command("start-run", { sessionId, runId });
    const run = { protocolVersion: "narad/v1" as const, rootRunId: runId, runId };
    await narad.appendEvents(sessionId, [
      { ...run, type: "interrupt.requested", eventId: `${sessionId}-i`, interruptId: `${sessionId}-ask`, waitId: `${sessionId}-w`, kind: "approval", actions: ["approve", "deny"] },
      { ...run, type: "run.paused", eventId: `${sessionId}-p`, waitId: `${sessionId}-w`, interruptId: `${sessionId}-ask`, reason: "narad.approval", resumeMode: "command" },
    ]);
  }
  const [first, second] = sessions as [string, string];
  const ids = async (query: { sessionId?: string }) => {
    const found: string[] = [];
    for await (const i of narad.openInterrupts(query)) found.push(i.interruptId);
    return found;
  };
  assert.deepEqual(await ids({ sessionId: first }), [`${first}-ask`]);
  const all = await ids({});
  assert.ok(all.includes(`${first}-ask`) && all.includes(`${second}-ask`), JSON.stringify(all));
  // Expired by the backend (a person's decision needs the approver role).
  const run = { protocolVersion: "narad/v1" as const, rootRunId: "run-1", runId: "run-1" };
  await narad.appendEvents(first, [
    { ...run, type: "interrupt.resolved", eventId: `${first}-r`, interruptId: `${first}-ask`, waitId: `${first}-w`, decision: "expired" },
    { ...run, type: "run.resumed", eventId: `${first}-u`, waitId: `${first}-w` },
  ]);
  assert.deepEqual(await ids({ sessionId: first }), []);
  assert.deepEqual(await ids({ sessionId: second }), [`${second}-ask`]);
});

test("searchSessions finds what was said, with its passage marked, and says why words with nothing to find find nothing", async () => {
  const narad = new NaradClient({ servers: url, token });
  const word = `zq${Date.now().toString(36)}`;
  const session = await narad.createSession({ title: "searched" });
  await narad.command("record-user-message", { sessionId: session.sessionId, messageScope: "session", content: `about ${word} today` });
  const page = await narad.searchSessions({ q: word, limit: 5 });
  assert.deepEqual(
    page.results.map((r) => r.session.sessionId),
    [session.sessionId],
  );
  const [match] = page.results[0]?.matches ?? [];
  assert.equal(match?.field, "message");
  assert.deepEqual(
    match?.snippet.filter((p) => p.matched).map((p) => p.text),
    [word],
  );
  const nothing = await narad.searchSessions({ q: "the" });
  assert.deepEqual(nothing.results, []);
  assert.match(nothing.notice ?? "", /no searchable word/);
});

test("usage sums what run terminals carried, per session and per day, by the model each run named", async () => {
  const narad = new NaradClient({ servers: url, token });
  const session = await narad.createSession({ title: "usage" });
  const sid = session.sessionId;
  const model = `model-${sid}`;
  const run = (runId: string) => ({ protocolVersion: "narad/v1", eventId: `${sid}-${runId}`, rootRunId: runId, runId }) as const;
  await narad.appendEvents(sid, [{ ...run("u1"), type: "run.started", input: { model } } as ProposedEvent]);
  await narad.appendEvents(sid, [{ ...run("u1"), eventId: `${sid}-u1-end`, type: "run.finished", usage: { inputTokens: 120, outputTokens: 48 } } as ProposedEvent]);
  const bySession = await narad.usage({ by: "session", sessions: sid });
  assert.deepEqual(bySession.buckets, [{ key: sid, model, runs: 1, usage: { inputTokens: 120, outputTokens: 48 } }]);
  const byDay = await narad.usage({ zone: "Europe/Paris" });
  assert.equal(byDay.zone, "Europe/Paris");
  const ours = byDay.buckets.filter((b) => b.model === model);
  assert.equal(ours.length, 1);
  assert.match(ours[0]!.key, /^\d{4}-\d{2}-\d{2}$/);
  await assert.rejects(narad.usage({ zone: "Nowhere/Atlantis" }), (e: unknown) => e instanceof NaradError && e.code === "NRD-0008");
});
