// The run-level API against a running narad (NARAD_URL, NARAD_TOKEN with
// reader, writer and backend): the test plays the agent's backend,
// appending each run's events as an agent would.
import assert from "node:assert/strict";
import { test } from "node:test";

import { ConflictError, NaradClient, NotFoundError } from "../src/index.js";
import type { AuthorityEvent, ProposedEvent, RunFrame, TranscriptMessage } from "../src/index.js";
import { uuidV5 } from "../src/ids.js";
import { until } from "./support.js";

const url = process.env["NARAD_URL"];
const token = process.env["NARAD_TOKEN"];
if (!url || !token) {
  throw new Error("set NARAD_URL and NARAD_TOKEN: these tests run against a narad server");
}

const narad = new NaradClient({ servers: url, token });

/** Builds the events of one run (and of runs nested in it), with unique eventIds. */
function events(sessionId: string, rootRunId: string) {
  let n = 0;
  return (runId: string, type: string, extra: Record<string, unknown> = {}): ProposedEvent =>
    ({
      protocolVersion: "narad/v1",
      type,
      eventId: `${sessionId}-${runId}-${++n}-${type}`,
      rootRunId,
      runId,
      ...extra,
    }) as ProposedEvent;
}

/** A streamed assistant answer of `runId`. */
function answer(e: ReturnType<typeof events>, runId: string, words: string[]): ProposedEvent[] {
  const messageId = `${runId}-answer`;
  return [
    e(runId, "message.text.started", { messageId, role: "assistant", messageScope: "run" }),
    ...words.map((w) => e(runId, "message.text.delta", { messageId, delta: w })),
    e(runId, "message.text.completed", { messageId }),
  ];
}

/** Waits until `runId` has started in the session's journal. */
function started(sessionId: string, runId: string): Promise<AuthorityEvent> {
  return until(`run ${runId} started`, async () => {
    for await (const e of narad.allHistory(sessionId)) if (e.type === "run.started" && e.runId === runId) return e;
    return undefined;
  });
}

async function collect(stream: AsyncIterable<RunFrame>): Promise<RunFrame[]> {
  const frames: RunFrame[] = [];
  for await (const frame of stream) frames.push(frame);
  return frames;
}

test("runs.stream records the message, starts the run and yields its frames and its nested run's, to its terminal", { timeout: 60_000 }, async () => {
  const { sessionId } = await narad.createSession({ title: "runs.stream" });
  const stream = narad.runs.stream({ sessionId, message: "What is 2 + 3?", input: { prompt: "add" } });
  const runId = stream.runId;
  assert.match(runId, /^run-/);
  const reading = collect(stream);
  await started(sessionId, runId);
  const e = events(sessionId, runId);
  const nested = `${runId}-tool`;
  await narad.appendEvents(sessionId, [
    e(nested, "run.started", { parentRunId: runId }),
    e(nested, "run.finished"),
    ...answer(e, runId, ["It ", "is ", "5."]),
  ]);
  // Not the run's: another session-level fact, between its events.
  await narad.appendEvents(sessionId, [
    { protocolVersion: "narad/v1", type: "session.custom", eventId: `${sessionId}-aside`, name: "sdk.aside", value: {} },
  ]);
  await narad.appendEvents(sessionId, [e(runId, "run.finished")]);
  const frames = await reading;
  const types = frames.map((f) => `${f.event.runId === runId ? "run" : "nested"}:${f.event.type}`);
  assert.deepEqual(types, [
    "run:run.started",
    "nested:run.started",
    "nested:run.finished",
    "run:message.text.started",
    "run:message.text.delta",
    "run:message.text.delta",
    "run:message.text.delta",
    "run:message.text.completed",
    "run:run.finished",
  ]);
  assert.deepEqual((frames[0]!.event as { input?: unknown }).input, { prompt: "add" });
  assert.equal(stream.terminal?.type, "run.finished");
  assert.equal(stream.status, "finished");
  assert.equal(stream.started?.runId, runId);
  // One message, one run: nothing was sent twice.
  const journal: AuthorityEvent[] = [];
  for await (const event of narad.allHistory(sessionId)) journal.push(event);
  assert.equal(journal.filter((x) => x.type === "message.user.recorded").length, 1);
  assert.equal(journal.filter((x) => x.type === "run.started" && x.runId === runId).length, 1);
  const said = journal.find((x) => x.type === "message.user.recorded")!;
  const start = journal.find((x) => x.type === "run.started" && x.runId === runId)!;
  assert.ok(said.sessionSequence < start.sessionSequence, "the message is recorded before the run starts");
});

test("runs.stream resumes after a cut connection, never repeating a frame", { timeout: 60_000 }, async () => {
  // The first two stream connections are cut after a few chunks, as a restarting server or a proxy would.
  let streams = 0;
  const cutting: typeof fetch = async (input, init) => {
    const response = await fetch(input, init);
    if (!String(input).includes("/stream") || !response.body) return response;
    streams += 1;
    if (streams > 2) return response;
    const reader = response.body.getReader();
    let sent = 0;
    const cut = new ReadableStream<Uint8Array>({
      async pull(controller) {
        const { done, value } = await reader.read();
        if (done || sent >= 3) {
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
  const client = new NaradClient({ servers: url, token, fetch: cutting });
  const { sessionId } = await client.createSession({ title: "runs.stream resumes" });
  const stream = client.runs.stream({ sessionId, message: "count" }, { initialBackoffMs: 20 });
  const reading = collect(stream);
  await started(sessionId, stream.runId);
  const e = events(sessionId, stream.runId);
  const words = Array.from({ length: 25 }, (_, i) => `${i} `);
  const batch = answer(e, stream.runId, words);
  for (const one of batch) await narad.appendEvents(sessionId, [one]);
  await narad.appendEvents(sessionId, [e(stream.runId, "run.finished")]);
  const frames = await reading;
  const deltas = frames.filter((f) => f.event.type === "message.text.delta").map((f) => (f.event as { delta: string }).delta);
  assert.deepEqual(deltas, words);
  const sequences = frames.map((f) => f.event.sessionSequence);
  assert.deepEqual(sequences, [...new Set(sequences)].sort((a, b) => a - b), "in order, each once");
  assert.equal(frames.at(-1)?.event.type, "run.finished");
  assert.ok(streams >= 3, `the stream was reopened (${streams} connections)`);
});

test("runs.wait answers the run's result; runs.join answers it again from history", { timeout: 60_000 }, async () => {
  const { sessionId } = await narad.createSession({ title: "runs.wait" });
  const runId = `wait-${crypto.randomUUID()}`;
  const waiting = narad.runs.wait({ sessionId, runId, message: "Tidy up" });
  await started(sessionId, runId);
  const e = events(sessionId, runId);
  await narad.appendEvents(sessionId, [...answer(e, runId, ["Tidied ", "up."]), e(runId, "run.finished")]);
  const result = await waiting;
  assert.equal(result.status, "finished");
  assert.equal(result.terminal.type, "run.finished");
  assert.equal(result.runId, runId);
  assert.deepEqual(result.violations, []);
  const texts = (items: typeof result.transcript) =>
    items.map((i) => (i.item === "message" ? `${i.role}:${String((i as TranscriptMessage).content)}` : i.item));
  assert.deepEqual(texts(result.transcript), ["user:Tidy up", "assistant:Tidied up."]);
  assert.deepEqual(texts(result.output), ["assistant:Tidied up."]);
  assert.equal(result.state.runs[runId]?.state, "finished");
  assert.equal(result.events[0]?.type, "run.started");
  assert.equal(result.events.at(-1)?.type, "run.finished");

  // Later runs do not change what join answers for this one: it stops at the run's end.
  const later = `later-${crypto.randomUUID()}`;
  await narad.command("start-run", { sessionId, runId: later });
  const l = events(sessionId, later);
  await narad.appendEvents(sessionId, [...answer(l, later, ["more"]), l(later, "run.error", { code: "model_failed", message: "the model failed" })]);
  const joined = await narad.runs.join(sessionId, runId);
  assert.deepEqual(texts(joined.output), ["assistant:Tidied up."]);
  assert.deepEqual(joined.events.map((x) => x.eventId), result.events.map((x) => x.eventId));
  const failed = await narad.runs.join(sessionId, later);
  assert.equal(failed.status, "error");
  assert.equal((failed.terminal as { code?: string }).code, "model_failed");
  assert.deepEqual(texts(failed.output), ["assistant:more"]);

  await assert.rejects(narad.runs.join(sessionId, "no-such-run"), (x: unknown) => x instanceof NotFoundError && x.status === 404);
});

test("runs.joinStream follows a run already going, and a nested one alone", { timeout: 60_000 }, async () => {
  const { sessionId } = await narad.createSession({ title: "runs.joinStream" });
  const runId = `join-${crypto.randomUUID()}`;
  await narad.command("start-run", { sessionId, runId });
  const e = events(sessionId, runId);
  const nested = `${runId}-child`;
  await narad.appendEvents(sessionId, [e(runId, "message.text.started", { messageId: "m1", role: "assistant", messageScope: "run" })]);
  const whole = collect(narad.runs.joinStream(sessionId, runId));
  await narad.appendEvents(sessionId, [e(nested, "run.started", { parentRunId: runId })]);
  const child = collect(narad.runs.joinStream(sessionId, nested));
  await narad.appendEvents(sessionId, [
    e(nested, "run.cancelled"),
    e(runId, "message.text.delta", { messageId: "m1", delta: "done" }),
    e(runId, "message.text.completed", { messageId: "m1" }),
    e(runId, "run.finished"),
  ]);
  const frames = await whole;
  assert.deepEqual(
    frames.map((f) => f.event.type),
    ["run.started", "message.text.started", "run.started", "run.cancelled", "message.text.delta", "message.text.completed", "run.finished"],
  );
  const childFrames = await child;
  assert.deepEqual(childFrames.map((f) => `${f.event.runId}:${f.event.type}`), [`${nested}:run.started`, `${nested}:run.cancelled`]);
  // Over already: the same frames, from history.
  const again = await collect(narad.runs.joinStream(sessionId, runId));
  assert.deepEqual(again.map((f) => f.event.eventId), frames.map((f) => f.event.eventId));
});

test("runs.stream throws the start's refusal: a busy session without enqueue", { timeout: 30_000 }, async () => {
  const { sessionId } = await narad.createSession({ title: "runs busy" });
  await narad.command("start-run", { sessionId, runId: "holding" });
  const stream = narad.runs.stream({ sessionId, input: {} });
  await assert.rejects(collect(stream), (x: unknown) => x instanceof ConflictError && x.code === "NRD-0204");
  // Queued instead: the stream waits for it to start, then follows it to its end.
  const queued = narad.runs.stream({ sessionId, input: {}, onConflict: "enqueue" });
  const reading = collect(queued);
  await until("the queued start", async () => (queued.started ? true : undefined));
  const h = events(sessionId, "holding");
  await narad.appendEvents(sessionId, [h("holding", "run.finished")]);
  await started(sessionId, queued.runId);
  const q = events(sessionId, queued.runId);
  await narad.appendEvents(sessionId, [q(queued.runId, "run.finished")]);
  const frames = await reading;
  assert.deepEqual(frames.map((f) => f.event.type), ["run.started", "run.finished"]);
});

test("runs.wait made again with the same idempotencyKey is the same request: one message, one run, the same result", { timeout: 60_000 }, async () => {
  // The ids derive from the key as the Python SDK derives them (narad.runs._made_id).
  const vector = narad.runs.stream({ sessionId: "unread", message: "hi", idempotencyKey: "order-42" });
  assert.equal(vector.runId, "run-d2a7f93f-0e36-5e76-a27c-fa45ae9f0087");
  assert.throws(() => narad.runs.stream({ sessionId: "unread", idempotencyKey: "k".repeat(248) }), TypeError);
  // Without a key, each call makes ids of its own.
  assert.notEqual(narad.runs.stream({ sessionId: "unread" }).runId, narad.runs.stream({ sessionId: "unread" }).runId);

  const { sessionId } = await narad.createSession({ title: "runs.wait keyed" });
  const key = `order-${crypto.randomUUID()}`;
  const ns = "9b0d3a52-6c1f-4d0e-8a43-72756e732d31";
  const runId = `run-${uuidV5(ns, `${key}:run`)}`;
  const messageId = `msg-${uuidV5(ns, `${key}:message`)}`;
  // Sent with its own keys, recorded: `{key}:message`, `{key}:run`.
  const keys: string[] = [];
  const recording: typeof fetch = (input, init) => {
    const k = new Headers(init?.headers).get("idempotency-key");
    if (k !== null) keys.push(k);
    return fetch(input, init);
  };
  const client = new NaradClient({ servers: url, token, fetch: recording });
  const request = { sessionId, message: "Tidy up", input: { job: "tidy" }, idempotencyKey: key };
  const waiting = client.runs.wait(request);
  await started(sessionId, runId);
  const e = events(sessionId, runId);
  await narad.appendEvents(sessionId, [...answer(e, runId, ["Tidied ", "up."]), e(runId, "run.finished")]);
  const first = await waiting;
  assert.equal(first.runId, runId);
  // The same call after, say, a crash of the caller: both commands are the server's replays.
  const again = await client.runs.wait(request);
  assert.deepEqual(keys, [`${key}:message`, `${key}:run`, `${key}:message`, `${key}:run`]);
  assert.equal(again.runId, runId);
  assert.equal(again.status, "finished");
  assert.deepEqual(again.events.map((x) => x.eventId), first.events.map((x) => x.eventId));
  assert.deepEqual(again.transcript, first.transcript);
  const journal: AuthorityEvent[] = [];
  for await (const event of narad.allHistory(sessionId)) journal.push(event);
  const said = journal.filter((x) => x.type === "message.user.recorded");
  assert.equal(said.length, 1, "one message");
  assert.equal((said[0] as { messageId?: string }).messageId, messageId);
  assert.deepEqual(journal.filter((x) => x.type === "run.started").map((x) => x.runId), [runId], "one run");
  // And as a stream: the same run's frames again, its start the first answer.
  const stream = client.runs.stream(request);
  const frames = await collect(stream);
  assert.equal(stream.runId, runId);
  assert.equal(stream.started?.runId, runId);
  assert.deepEqual(frames.map((f) => f.event.eventId), first.events.map((x) => x.eventId));
  assert.equal(journal.length, (await narad.history(sessionId)).events.length, "nothing more written");
});
