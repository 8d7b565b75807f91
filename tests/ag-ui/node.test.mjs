// AG-UI's own client in Node against POST /v1/ag-ui, with an agent runtime
// of @narad/client answering: an unmodified HttpAgent (@ag-ui/client 1.0.0),
// every event checked by @ag-ui/core's EventSchema both as the agent's
// subscribers see it and as the raw SSE frames came, and any warning of the
// client's enforce or compatibility stages a failure. A streamed answer, a
// backend tool, a frontend tool, an approval round trip and the 409 of a
// decision made elsewhere first, a stop, a rejoin while a run streams.
import assert from "node:assert/strict";
import { after, afterEach, before, test } from "node:test";

import { buildResumeArray } from "@ag-ui/client";

import { call, conversation, history, saidAfter, saidInRun, scenarioAgent, serveWithAgent, token, waitFor } from "./harness.mjs";

const QUEUE = "ag-ui-node";
const WORDS = Array.from({ length: 24 }, (_, i) => `w${i + 1} `);
const FRONT_END_TOOLS = [{ name: "getLocation", description: "where the person is", parameters: { type: "object", properties: { precise: { type: "boolean" } } } }];
let api;
let server;
let ann;
let bob;
const warnings = [];

// HttpAgent re-throws a cut connection's cancel outside the run's promise
// (a Node process would end on it); the run itself rejects as well.
process.on("unhandledRejection", (e) => {
  if (String(e?.message) !== "terminated") {
    throw e;
  }
});

// The client's own detectors of material it does not know or must convert.
const warn = console.warn;
console.warn = (...args) => {
  if (typeof args[0] === "string" && (args[0].startsWith("[ag-ui][enforce]") || args[0].startsWith("[ag-ui][compat]"))) {
    warnings.push(args.map(String).join(" "));
  }
  warn(...args);
};

before(async () => {
  server = await serveWithAgent(token, QUEUE, scenarioAgent(WORDS, 100));
  api = server.api;
  ann = token("reader,writer,approver", "ann");
  bob = token("reader,writer,approver", "bob");
});

afterEach(() => {
  assert.deepEqual(warnings.splice(0), [], "no [ag-ui][enforce] or [ag-ui][compat] warning");
});

after(async () => {
  await server?.stop();
});

const props = { narad: { queue: QUEUE } };

function user(id, content) {
  return { id, role: "user", content };
}

/** Sends `id` as the next user message and runs the agent (narad's run is `run-<id>`). */
async function say(c, id, content, extra = {}) {
  c.agent.addMessage(user(id, content));
  return c.agent.runAgent({ runId: `run-${id}`, forwardedProps: props, ...extra });
}

test("a streamed answer and a backend tool: two turns of one thread", { timeout: 60_000 }, async () => {
  const c = conversation(api, ann, "g-turns");
  await say(c, "text-1", "Hello");
  assert.equal(c.finished.at(-1).outcome, "success");
  let events = await history(api, ann, "g-turns");
  assert.equal(saidAfter(c.agent.messages, "text-1"), "Hello, I am narad's agent.");
  assert.equal(saidInRun(events, "run-text-1"), "Hello, I am narad's agent.");
  const reasoning = c.agent.messages.find((m) => m.role === "reasoning");
  assert.equal(reasoning?.content, "The user greets; greet back.");
  const types = c.answers[0].events.map((e) => e.type);
  assert.equal(types[0], "RUN_STARTED");
  assert.equal(types.at(-1), "RUN_FINISHED");
  assert.ok(types.filter((t) => t === "TEXT_MESSAGE_CONTENT").length >= 1, types.join(" "));
  assert.ok(types.includes("REASONING_MESSAGE_CONTENT"), types.join(" "));
  assert.deepEqual(
    c.answers[0].events.map((e) => e.type),
    c.seen.map((e) => e.type),
    "the agent saw every frame, nothing dropped",
  );

  await say(c, "backend-1", "What is in /tmp?");
  assert.equal(c.finished.at(-1).outcome, "success");
  assert.deepEqual(c.finished.at(-1).pendingToolCallIds ?? [], [], "nothing is the client's to answer");
  const call_ = c.agent.messages.find((m) => m.role === "assistant" && m.toolCalls?.some((t) => t.function.name === "fs.list"));
  const toolCall = call_.toolCalls.find((t) => t.function.name === "fs.list");
  assert.deepEqual(JSON.parse(toolCall.function.arguments), { path: "/tmp" });
  const result = c.agent.messages.filter((m) => m.role === "tool" && m.toolCallId === toolCall.id);
  assert.equal(result.length, 1, "one tool message");
  assert.deepEqual(JSON.parse(result[0].content), ["a.txt", "b.txt"]);
  events = await history(api, ann, "g-turns");
  assert.equal(saidAfter(c.agent.messages, "backend-1"), "There are 2 files: a.txt, b.txt.");
  assert.equal(saidInRun(events, "run-backend-1"), "There are 2 files: a.txt, b.txt.");
  assert.equal(events.filter((e) => e.type === "run.started").length, 2, "one narad run per turn");
  assert.equal(c.agent.messages.filter((m) => m.role === "user").length, 2);
  await c.check();
});

test("a frontend tool: the run ends pending it, its tool message continues the run", { timeout: 60_000 }, async () => {
  const c = conversation(api, ann, "g-client");
  await say(c, "client-1", "Where am I?", { tools: FRONT_END_TOOLS });
  const first = c.finished.at(-1);
  assert.equal(first.outcome, "success");
  assert.equal(first.pendingToolCallIds?.length, 1, JSON.stringify(first));
  const [id] = first.pendingToolCallIds;
  const asked = c.agent.messages.flatMap((m) => m.toolCalls ?? []).find((t) => t.id === id);
  assert.equal(asked.function.name, "getLocation");
  assert.deepEqual(JSON.parse(asked.function.arguments), { precise: true });
  const started = (await history(api, ann, "g-client")).find((e) => e.type === "run.started");
  assert.equal(started.clientExecutorId, "front-end:g-client");

  c.agent.addMessage({ id: "tool-answer-1", role: "tool", toolCallId: id, content: JSON.stringify({ city: "Berlin" }) });
  await c.agent.runAgent({ tools: FRONT_END_TOOLS, forwardedProps: props });
  assert.equal(c.finished.at(-1).outcome, "success");
  assert.deepEqual(c.finished.at(-1).pendingToolCallIds ?? [], []);
  const events = await history(api, ann, "g-client");
  const finished = events.filter((e) => e.type === "tool.call.finished");
  assert.equal(finished.length, 1);
  assert.deepEqual([finished[0].outcome, finished[0].response], ["success", { city: "Berlin" }]);
  assert.equal(saidInRun(events, "run-client-1"), "Let me look where you are. You are in Berlin.");
  assert.equal(saidAfter(c.agent.messages, "client-1"), "Let me look where you are. You are in Berlin.");
  assert.equal(c.agent.messages.filter((m) => m.role === "tool").length, 1, "the client's own tool message only");
  assert.equal(events.filter((e) => e.type === "run.started").length, 1, "one narad run across both AG-UI runs");
  await c.check();
});

test("an approval: an interrupt outcome, a resume, and the 409 of a decision made elsewhere first", { timeout: 60_000 }, async () => {
  const c = conversation(api, ann, "g-approve");
  await say(c, "approve-1", "Delete it");
  const asked = c.finished.at(-1);
  assert.equal(asked.outcome, "interrupt");
  assert.equal(c.agent.pendingInterrupts.length, 1);
  const interrupt = c.agent.pendingInterrupts[0];
  assert.deepEqual(interrupt.responseSchema?.properties?.decision?.enum, ["approve", "deny"], JSON.stringify(interrupt));
  const types = c.answers[0].events.map((e) => e.type);
  assert.ok(types.indexOf("MESSAGES_SNAPSHOT") > 0, `a snapshot before the interrupt outcome: ${types.join(" ")}`);
  assert.equal(types.at(-1), "RUN_FINISHED");

  await c.agent.runAgent({
    forwardedProps: props,
    resume: buildResumeArray(c.agent.pendingInterrupts, { [interrupt.id]: { status: "resolved", payload: { decision: "approve", reason: "fine" } } }),
  });
  assert.equal(c.finished.at(-1).outcome, "success");
  assert.deepEqual(c.agent.pendingInterrupts, []);
  let events = await history(api, ann, "g-approve");
  const resolved = events.find((e) => e.type === "interrupt.resolved");
  assert.equal(resolved.decision, "approve");
  assert.equal(resolved.reason, "fine");
  assert.equal(resolved.actor.sub, "ann", "the signed-in person decided");
  assert.ok(events.some((e) => e.type === "tool.call.finished" && e.toolName === "fs.delete") || events.some((e) => e.type === "tool.call.started" && e.toolName === "fs.delete"));
  assert.equal(saidInRun(events, "run-approve-1"), "Deleted /x/approve-1.");
  assert.equal(saidAfter(c.agent.messages, "approve-1"), "Deleted /x/approve-1.");

  // Bob decides the next one elsewhere first: ann's resume is a 409 with his decision.
  await say(c, "approve-2", "Delete another");
  assert.equal(c.finished.at(-1).outcome, "interrupt");
  const second = c.agent.pendingInterrupts[0];
  const decided = await call(api, bob, "POST", "/v1/commands/resolve-interrupt", { sessionId: "g-approve", interruptId: second.id, decision: "deny" });
  assert.equal(decided.status, 200, JSON.stringify(decided.body));
  const refused = await c.agent
    .runAgent({
      forwardedProps: props,
      resume: buildResumeArray(c.agent.pendingInterrupts, { [second.id]: { status: "resolved", payload: { decision: "approve" } } }),
    })
    .then(
      () => assert.fail("the resume is refused"),
      (e) => e,
    );
  assert.equal(refused.status, 409, String(refused));
  assert.equal(refused.payload.code, "NRD-0205");
  assert.equal(refused.payload.details.decision, "deny");
  assert.equal(refused.payload.details.actor.sub, "bob");
  await waitFor("the run's end", async () => (await history(api, ann, "g-approve")).some((e) => e.type === "run.finished" && e.runId === "run-approve-2"));
  events = await history(api, ann, "g-approve");
  assert.equal(events.filter((e) => e.type === "interrupt.resolved" && e.interruptId === second.id).length, 1);
  assert.equal(saidInRun(events, "run-approve-2"), "Kept /x/approve-2 (deny by bob).");
  // The page clears what it was told was decided, and reads the rest of the thread.
  c.agent.pendingInterrupts = [];
  await c.agent.runAgent({ forwardedProps: props });
  assert.equal(c.finished.at(-1).outcome, "success");
  assert.equal(saidAfter(c.agent.messages, "approve-2"), "Kept /x/approve-2 (deny by bob).");
  await c.check();
});

test("abortRun() alone: the run is stopped once the grace passes with no rejoin", { timeout: 60_000 }, async () => {
  const c = conversation(api, ann, "g-abort");
  const running_ = say(c, "slow-abort", "Count slowly").catch(() => undefined);
  await waitFor("the first words", async () => saidInRun(await history(api, ann, "g-abort", true), "run-slow-abort").length > 0);
  c.agent.abortRun();
  await running_;
  const events = await waitFor("the run cancelled", async () => {
    const got = await history(api, ann, "g-abort");
    return got.some((e) => e.type === "run.cancelled" && e.runId === "run-slow-abort") ? got : undefined;
  });
  const stop = events.find((e) => e.type === "run.stop.requested");
  assert.deepEqual([stop.reason, stop.actor?.sub], ["front_end.abort", "ann"]);
  assert.ok(saidInRun(events, "run-slow-abort").length < WORDS.join("").length, "stopped before the end");
});

test("a stop: stop-run ends the AG-UI run cancelled", { timeout: 60_000 }, async () => {
  const c = conversation(api, ann, "g-stop");
  const running_ = say(c, "slow-stop", "Count slowly");
  await waitFor("the first words", async () => saidInRun(await history(api, ann, "g-stop", true), "run-slow-stop").length > 0);
  const stopped = await call(api, ann, "POST", "/v1/commands/stop-run", { sessionId: "g-stop", runId: "run-slow-stop" });
  assert.ok(stopped.status < 300, JSON.stringify(stopped.body));
  await running_;
  assert.equal(c.finished.at(-1).outcome, "cancelled");
  const events = await history(api, ann, "g-stop");
  assert.ok(events.some((e) => e.type === "run.cancelled" && e.runId === "run-slow-stop"));
  const said = saidInRun(events, "run-slow-stop");
  assert.ok(said.length < WORDS.join("").length, "stopped before the end");
  assert.equal(saidAfter(c.agent.messages, "slow-stop"), said);
  await c.check();
});

test("a rejoin while a run streams: the answer once, not doubled", { timeout: 60_000 }, async () => {
  const c = conversation(api, ann, "g-rejoin");
  const first = say(c, "slow-rejoin", "Count slowly");
  await waitFor("a few words", () => saidAfter(c.agent.messages, "slow-rejoin").split(" ").length > 3);
  // A second client holding what the first has so far, and a third holding nothing.
  const partial = structuredClone(c.agent.messages);
  const d = conversation(api, ann, "g-rejoin", partial);
  const e = conversation(api, ann, "g-rejoin");
  await Promise.all([d.agent.runAgent({ forwardedProps: props }), e.agent.runAgent({ forwardedProps: props }), first]);
  const whole = WORDS.join("");
  const events = await history(api, ann, "g-rejoin");
  assert.equal(saidInRun(events, "run-slow-rejoin"), whole);
  for (const x of [c, d, e]) {
    assert.equal(x.finished.at(-1).outcome, "success");
    assert.equal(saidAfter(x.agent.messages, "slow-rejoin"), whole, "the answer once");
    assert.equal(x.agent.messages.filter((m) => m.role === "user").length, 1);
  }
  assert.equal(d.answers[0].events[1].type, "MESSAGES_SNAPSHOT", "a rejoin starts from a snapshot");
  assert.equal(events.filter((e) => e.type === "run.started").length, 1, "a rejoin starts nothing");
  await Promise.all([c.check(), d.check(), e.check()]);
});
