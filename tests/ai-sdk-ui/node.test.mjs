// The AI SDK's own client in Node against POST /v1/chat and its reconnect
// (GET /v1/chat/{id}/stream), with an agent runtime of @narad/client
// answering: useChat's engine (AbstractChat) over DefaultChatTransport, every
// chunk checked by the package's uiMessageChunkSchema, and the message the
// SDK builds equal to the run's transcript in narad's history. A streamed
// answer with reasoning, a backend tool, a client tool, an approval round
// trip and the 409 of a decision made elsewhere first, a stop, a reconnect
// mid-answer.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import {
  lastAssistantMessageIsCompleteWithApprovalResponses,
  lastAssistantMessageIsCompleteWithToolCalls,
  readUIMessageStream,
  validateUIMessages,
} from "ai";

import {
  NodeChat,
  call,
  checkedFetch,
  history,
  shapeOfMessage,
  shapeOfRun,
  scenarioAgent,
  serveWithAgent,
  textOf,
  token,
  transport,
  waitFor,
} from "./harness.mjs";

const QUEUE = "node-chat";
const WORDS = Array.from({ length: 24 }, (_, i) => `w${i + 1} `);
let api;
let server;
let ann;
let bob;

before(async () => {
  server = await serveWithAgent(token, QUEUE, scenarioAgent(WORDS, 120));
  api = server.api;
  ann = token("reader,writer,approver", "ann");
  bob = token("reader,writer,approver", "bob");
});

after(async () => {
  await server?.stop();
});

/** A chat of session `id` as a page has it: the transport checked, tools and approvals sent on automatically. */
function chatOf(id, checked, onToolCall) {
  const chat = new NodeChat({
    id,
    transport: transport(api, ann, QUEUE, checked),
    sendAutomaticallyWhen: ({ messages }) =>
      lastAssistantMessageIsCompleteWithToolCalls({ messages }) || lastAssistantMessageIsCompleteWithApprovalResponses({ messages }),
    onToolCall: onToolCall ? ({ toolCall }) => onToolCall(chat, toolCall) : undefined,
  });
  return chat;
}

function user(id, text) {
  return { id, role: "user", parts: [{ type: "text", text }] };
}

/** The chat's last message is the run's whole answer: as narad's history holds it, valid for the SDK. */
async function matchesHistory(chat, sessionId, runId) {
  const message = chat.messages.at(-1);
  assert.equal(message.role, "assistant");
  assert.equal(message.id, runId, "the assistant message is the run");
  assert.equal(message.metadata?.narad?.runId, runId);
  assert.equal(chat.messages.filter((m) => m.id === runId).length, 1, "one message per run");
  const events = await history(api, ann, sessionId);
  assert.deepEqual(shapeOfMessage(message), shapeOfRun(events, runId));
  await validateUIMessages({ messages: chat.messages });
  return { message, events };
}

test("a streamed answer and a backend tool: two turns of one chat", { timeout: 60_000 }, async () => {
  const checked = checkedFetch();
  const chat = chatOf("n-turns", checked);
  await chat.sendMessage(user("text-1", "Hello"));
  assert.equal(chat.status, "ready", String(chat.error));
  const { message } = await matchesHistory(chat, "n-turns", "text-1.run");
  assert.equal(textOf(message), "Hello, I am narad's agent.");
  assert.deepEqual(
    message.parts.map((p) => p.type),
    ["step-start", "reasoning", "text"],
  );
  assert.equal(message.parts[1].text, "The user greets; greet back.");
  assert.ok(message.parts.slice(1).every((p) => p.state === "done"));
  const types = checked.answers[0].chunks.map((c) => c.type);
  assert.equal(types[0], "start");
  assert.ok(types.filter((t) => t === "text-delta").length >= 1);
  assert.equal(types.at(-1), "finish");
  assert.equal(checked.answers[0].chunks.at(-1).finishReason, "stop");

  await chat.sendMessage(user("backend-1", "What is in /tmp?"));
  assert.equal(chat.status, "ready", String(chat.error));
  const turn = await matchesHistory(chat, "n-turns", "backend-1.run");
  const tool = turn.message.parts.find((p) => p.type === "tool-fs.list");
  assert.equal(tool.state, "output-available");
  assert.equal(tool.providerExecuted, true, "a backend tool is the server's");
  assert.deepEqual(tool.input, { path: "/tmp" });
  assert.deepEqual(tool.output, ["a.txt", "b.txt"]);
  assert.equal(textOf(turn.message), "There are 2 files: a.txt, b.txt.");
  assert.deepEqual(
    chat.messages.map((m) => m.id),
    ["text-1", "text-1.run", "backend-1", "backend-1.run"],
  );
  // The run ended: the reconnect has nothing (204 → null).
  assert.equal(await transport(api, ann, QUEUE, checked).reconnectToStream({ chatId: "n-turns" }), null);
  assert.equal(checked.answers.at(-1).status, 204);
  await checked.check();
});

test("a client tool: the page runs it and its output-available part continues the message", { timeout: 60_000 }, async () => {
  const checked = checkedFetch();
  const calls = [];
  const chat = chatOf("n-client", checked, (chat, toolCall) => {
    calls.push(toolCall);
    if (toolCall.toolName === "getLocation") {
      chat.addToolOutput({ tool: "getLocation", toolCallId: toolCall.toolCallId, output: { city: "Berlin" } });
    }
  });
  await chat.sendMessage(user("client-1", "Where am I?"));
  assert.equal(chat.status, "ready", String(chat.error));
  assert.equal(calls.length, 1, "onToolCall once");
  assert.deepEqual(calls[0].input, { precise: true });
  const { message, events } = await matchesHistory(chat, "n-client", "client-1.run");
  assert.equal(textOf(message), "Let me look where you are. You are in Berlin.");
  const part = message.parts.find((p) => p.type === "tool-getLocation");
  assert.equal(part.state, "output-available");
  assert.equal(part.providerExecuted, undefined, "the page's tool");
  const finished = events.filter((e) => e.type === "tool.call.finished");
  assert.equal(finished.length, 1);
  assert.deepEqual(finished[0].response, { city: "Berlin" });
  // Two answers: the first ends where the page's tool is due, the second
  // (the POST with the output) goes on in a step of its own.
  const posts = checked.answers.filter((a) => a.method === "POST");
  assert.equal(posts.length, 2);
  assert.equal(posts[0].chunks.at(-1).finishReason, "tool-calls");
  assert.equal(posts[1].chunks[0].messageId, "client-1.run");
  assert.equal(posts[1].chunks.find((c) => !c.type.startsWith("data-") && c.type !== "start").type, "start-step");
  assert.equal(posts[1].chunks.at(-1).finishReason, "stop");
  await checked.check();
});

test("an approval round trip, and the 409 when someone else decided first", { timeout: 60_000 }, async () => {
  const checked = checkedFetch();
  const chat = chatOf("n-approve", checked);
  await chat.sendMessage(user("approve-1", "Delete the file"));
  assert.equal(chat.status, "ready", String(chat.error));
  let part = chat.messages.at(-1).parts.find((p) => p.type === "tool-fs.delete");
  assert.equal(part.state, "approval-requested");
  assert.equal(part.approval.id.length > 0, true);
  await matchesHistory(chat, "n-approve", "approve-1.run");

  // Ann approves in the page: the next POST carries approval-responded.
  await chat.addToolApprovalResponse({ id: part.approval.id, approved: true, reason: "fine" });
  await waitFor("the answer after the approval", () => chat.status === "ready" && textOf(chat.messages.at(-1)).includes("Deleted"));
  const posts = checked.answers.filter((a) => a.method === "POST");
  assert.equal(posts.length, 2);
  const { message, events } = await matchesHistory(chat, "n-approve", "approve-1.run");
  const resolved = events.find((e) => e.type === "interrupt.resolved");
  assert.equal(resolved.decision, "approve");
  assert.equal(resolved.actor.sub, "ann", "the signed-in person decided");
  assert.equal(resolved.reason, "fine");
  part = message.parts.find((p) => p.toolCallId === `interrupt:${resolved.interruptId}`);
  assert.equal(part.state, "output-available");
  assert.equal(part.approval.approved, true);
  assert.ok(message.parts.some((p) => p.type === "tool-fs.delete" && p.toolCallId !== part.toolCallId && p.state === "output-available"));
  assert.equal(textOf(message), "Deleted /x/approve-1.");

  // The next approval is decided by bob in another place first: ann's yes
  // is refused (409 NRD-0205 with bob's decision), and a reconnect shows it.
  await chat.sendMessage(user("approve-2", "Delete another"));
  part = chat.messages.at(-1).parts.find((p) => p.type === "tool-fs.delete");
  assert.equal(part.state, "approval-requested");
  const decided = await call(api, bob, "POST", "/v1/commands/resolve-interrupt", {
    sessionId: "n-approve",
    interruptId: part.approval.id,
    decision: "deny",
  });
  assert.equal(decided.status, 200, JSON.stringify(decided.body));
  await chat.addToolApprovalResponse({ id: part.approval.id, approved: true });
  await waitFor("the refusal", () => chat.status === "error");
  const refused = checked.answers.at(-1);
  assert.equal(refused.status, 409);
  const body = JSON.parse(chat.error.message);
  assert.equal(body.code, "NRD-0205");
  assert.equal(body.details.decision, "deny");
  assert.equal(body.details.actor.sub, "bob");
  // Nothing of ann's yes was written: bob's no stands, and the agent went
  // on from it.
  await waitFor("the run's end", async () => (await history(api, ann, "n-approve")).some((e) => e.type === "run.finished" && e.runId === "approve-2.run"));
  const events2 = await history(api, ann, "n-approve");
  const resolutions = events2.filter((e) => e.type === "interrupt.resolved" && e.interruptId === part.approval.id);
  assert.equal(resolutions.length, 1);
  assert.equal(resolutions[0].actor.sub, "bob");
  const said = events2
    .filter((e) => e.type === "message.text.delta" && e.rootRunId === "approve-2.run")
    .map((e) => e.delta)
    .join("");
  assert.equal(said, "Kept /x/approve-2 (deny by bob).");
  await checked.check();
});

test("a stop: stop-run with the message id ends the answer", { timeout: 60_000 }, async () => {
  const checked = checkedFetch();
  const chat = chatOf("n-stop", checked);
  const sending = chat.sendMessage(user("slow-stop", "Count slowly"));
  await waitFor("a few words", () => textOf(chat.messages.at(-1) ?? { parts: [] }).includes("w3 "));
  const runId = chat.messages.at(-1).id;
  assert.equal(runId, "slow-stop.run");
  const stopped = await call(api, ann, "POST", "/v1/commands/stop-run", { sessionId: "n-stop", runId });
  assert.ok(stopped.status < 300, JSON.stringify(stopped.body));
  await sending;
  assert.equal(chat.status, "ready", String(chat.error));
  const chunks = checked.answers[0].chunks;
  assert.deepEqual(
    chunks.slice(-2).map((c) => c.type),
    ["abort", "finish"],
  );
  assert.equal(chunks.at(-1).finishReason, "interrupted");
  const { message, events } = await matchesHistory(chat, "n-stop", runId);
  assert.ok(events.some((e) => e.type === "run.cancelled" && e.runId === runId));
  const text = textOf(message);
  assert.ok(text.length > 0 && text.length < WORDS.join("").length, `a part of the answer: ${text}`);
  assert.ok(message.parts.filter((p) => p.type === "text").every((p) => p.state === "done"), "its text closed");
  await checked.check();
});

test("stop() alone: the transport's abort stops the run once the grace passes with no reconnect", { timeout: 60_000 }, async () => {
  const checked = checkedFetch();
  const chat = chatOf("n-abort", checked);
  const sending = chat.sendMessage(user("slow-abort", "Count slowly"));
  await waitFor("a few words", () => textOf(chat.messages.at(-1) ?? { parts: [] }).includes("w3 "));
  await chat.stop();
  await sending;
  const events = await waitFor("the run cancelled", async () => {
    const got = await history(api, ann, "n-abort");
    return got.some((e) => e.type === "run.cancelled") ? got : undefined;
  });
  const stop = events.find((e) => e.type === "run.stop.requested");
  assert.deepEqual([stop.runId, stop.reason, stop.actor?.sub], ["slow-abort.run", "front_end.abort", "ann"]);
  const said = events.filter((e) => e.type === "message.text.delta").map((e) => e.delta).join("");
  assert.ok(said.length > 0 && said.length < WORDS.join("").length, `stopped before the end: ${said}`);
  await checked.check();
});

test("a reconnect mid-answer gives the whole message once", { timeout: 60_000 }, async () => {
  const checked = checkedFetch();
  const chat = chatOf("n-resume", checked);
  const sending = chat.sendMessage(user("slow-resume", "Count slowly"));
  await waitFor("a few words", () => textOf(chat.messages.at(-1) ?? { parts: [] }).includes("w4 "));
  // The page goes away (stop() only closes the connection: the run goes on).
  await chat.stop();
  await sending;
  const partial = textOf(chat.messages.at(-1));
  assert.ok(!partial.includes(WORDS.at(-1)), partial);

  // Meanwhile another reader, the transport's reconnect alone, reads the
  // whole message so far and then live, with the SDK's reducer.
  const raw = await transport(api, ann, QUEUE, checked).reconnectToStream({ chatId: "n-resume" });
  assert.ok(raw, "a stream: the run is active");
  const reading = (async () => {
    let last;
    for await (const m of readUIMessageStream({ stream: raw, terminateOnError: true })) {
      last = m;
    }
    return last;
  })();

  await sleep(300);
  await chat.resumeStream();
  assert.equal(chat.status, "ready", String(chat.error));
  const { message } = await matchesHistory(chat, "n-resume", "slow-resume.run");
  assert.equal(textOf(message), WORDS.join(""), "the answer once, in order");
  assert.deepEqual(
    chat.messages.map((m) => m.id),
    ["slow-resume", "slow-resume.run"],
  );
  const read = await reading;
  assert.equal(read.id, "slow-resume.run");
  assert.deepEqual(shapeOfMessage(read), shapeOfMessage(message));
  const gets = checked.answers.filter((a) => a.method === "GET");
  assert.equal(gets.length, 2);
  for (const g of gets) {
    assert.equal(g.chunks.filter((c) => c.type === "start").length, 1);
    assert.equal(g.chunks.at(-1).finishReason, "stop");
  }
  await checked.check();
});
