// One conversation, three front ends, one session: a turn started in an AI
// SDK page (DefaultChatTransport and the chat engine), a turn continued the
// way the narad console does it (record-user-message, then start-run on a
// queue), and a turn through AG-UI (an unmodified HttpAgent of
// @ag-ui/client 1.0.0 that first rejoins the thread with nothing new), with
// an agent runtime of @narad/client answering each. Every AI SDK chunk is
// checked by the `ai` package's uiMessageChunkSchema and every AG-UI event
// by @ag-ui/core's EventSchema; at the end, the AI SDK side (a fresh page's
// reconnect and its messages rebuilt from history), the AG-UI side and
// narad's history reduced by @narad/client's SessionReducer hold the same
// transcript, turn by turn: every user message once, each answer once.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { HttpAgent } from "@ag-ui/client";
import { EventSchema } from "@ag-ui/core/schemas";
import { validateUIMessages } from "ai";

import { NaradClient, SessionReducer } from "../../clients/typescript/dist/index.js";
import { NodeChat, checkedFetch, history, serveWithAgent, shapeOfMessage, shapeOfRun, textOf, token, transport } from "./harness.mjs";

const QUEUE = "one-transcript";
const SESSION = "o-one";
let api;
let server;
const warnings = [];

// AG-UI's client's own detectors of material it does not know or must convert.
const warn = console.warn;
console.warn = (...args) => {
  if (typeof args[0] === "string" && (args[0].startsWith("[ag-ui][enforce]") || args[0].startsWith("[ag-ui][compat]"))) {
    warnings.push(args.map(String).join(" "));
  }
  warn(...args);
};

async function* pieces(...parts) {
  for (const p of parts) {
    yield p;
    await sleep(15);
  }
}

/**
 * The agent answers the session's last user message, whichever front end
 * recorded it (a run the console starts has no input): it reads the
 * session's history, so its answer also says how many user turns it saw.
 */
async function agent(ctx, client) {
  const users = [];
  for await (const e of client.allHistory(ctx.sessionId)) {
    if (e.type === "message.user.recorded") {
      users.push(String(e.content));
    }
  }
  const last = users.at(-1);
  if (last === "What is in /tmp?") {
    await ctx.think("Look in /tmp.");
    const files = await ctx.tool("fs.list", { path: "/tmp" }, () => ["a.txt", "b.txt"]);
    await ctx.say(pieces("There are ", `${files.length} files: `, files.join(", "), "."));
  } else {
    await ctx.say(pieces(`Turn ${users.length}: `, "you said ", `"${last}".`));
  }
  await ctx.finish();
}

before(async () => {
  server = await serveWithAgent(token, QUEUE, agent);
  api = server.api;
});

after(async () => {
  await server?.stop();
  assert.deepEqual(warnings, [], "no [ag-ui][enforce] or [ag-ui][compat] warning");
});

/** An unmodified HttpAgent on the session whose fetch checks every raw SSE frame with EventSchema. */
function agUi(jwt) {
  const answers = [];
  const failures = [];
  const reading = [];
  const fetchImpl = async (url, init) => {
    const res = await fetch(url, init);
    const answer = { status: res.status, input: JSON.parse(init.body), events: [] };
    answers.push(answer);
    if (!res.ok || !res.body) {
      return res;
    }
    const [mine, theirs] = res.body.tee();
    reading.push(
      (async () => {
        const text = await new Response(mine).text();
        for (const frame of text.split("\n\n")) {
          const data = frame
            .split("\n")
            .filter((l) => l.startsWith("data:"))
            .map((l) => l.slice(l.startsWith("data: ") ? 6 : 5));
          if (data.length === 0) {
            continue;
          }
          const event = JSON.parse(data.join("\n"));
          const checked = EventSchema.safeParse(event);
          if (!checked.success) {
            failures.push(`${JSON.stringify(event)}: ${checked.error.message}`);
          }
          answer.events.push(event);
        }
      })(),
    );
    return new Response(theirs, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
  const agent = new HttpAgent({ url: `${api}/v1/ag-ui`, threadId: SESSION, headers: { Authorization: `Bearer ${jwt}` }, fetch: fetchImpl });
  const finished = [];
  agent.subscribe({
    onEvent: ({ event }) => {
      const checked = EventSchema.safeParse(event);
      if (!checked.success) {
        failures.push(`as the agent saw it: ${JSON.stringify(event)}: ${checked.error.message}`);
      }
    },
    onRunFinishedEvent: (params) => finished.push(params),
  });
  return {
    agent,
    answers,
    finished,
    /** Waits until every answer so far is read. */
    read: () => Promise.all(reading),
    async check() {
      await Promise.all(reading);
      assert.deepEqual(failures, [], "every AG-UI event is valid by EventSchema");
    },
  };
}

const textOfContent = (content) =>
  typeof content === "string"
    ? content
    : (content ?? [])
        .filter((p) => p.type === "text")
        .map((p) => p.text)
        .join("");

/** Turns of AG-UI messages: each user message's text and the assistants' text after it. */
function turnsOfAgUi(messages) {
  const turns = [];
  for (const m of messages) {
    if (m.role === "user") {
      turns.push({ id: m.id, user: textOfContent(m.content), answer: "" });
    } else if (m.role === "assistant" && typeof m.content === "string") {
      assert.ok(turns.length > 0, "an answer after a user message");
      turns.at(-1).answer += m.content;
    }
  }
  return turns;
}

/** Turns of UI messages (the AI SDK's): a user message, then its run's assistant message. */
function turnsOfUi(messages) {
  const turns = [];
  for (const m of messages) {
    if (m.role === "user") {
      turns.push({ id: m.id, user: textOf(m), answer: "" });
    } else if (m.role === "assistant") {
      turns.at(-1).answer += textOf(m);
    }
  }
  return turns;
}

/** Turns of narad's transcript as @narad/client's SessionReducer holds it (every top-level run shown). */
function turnsOfHistory(events) {
  const reducer = new SessionReducer();
  for (const e of events) {
    reducer.deliver(e);
  }
  const runs = Object.keys(reducer.state().runs);
  const turns = [];
  for (const item of reducer.transcript(runs)) {
    if (item.item !== "message") {
      continue;
    }
    assert.ok(item.completed, `message ${item.messageId} completed`);
    if (item.role === "user") {
      turns.push({ id: item.messageId, user: textOfContent(item.content), answer: "" });
    } else if (item.role === "assistant") {
      turns.at(-1).answer += item.content;
    }
  }
  return turns;
}

/** The page's messages rebuilt from narad's history: user messages, and each top-level run as one assistant message. */
function uiMessagesOf(events) {
  const messages = [];
  for (const e of events) {
    if (e.type === "message.user.recorded") {
      messages.push({ id: e.messageId, role: "user", parts: [{ type: "text", text: String(e.content) }] });
    } else if (e.type === "run.started" && e.parentRunId === undefined) {
      const parts = [{ type: "step-start" }];
      for (const p of shapeOfRun(events, e.runId)) {
        if (p.kind === "tool") {
          const part = { type: `tool-${p.toolName}`, toolCallId: p.toolCallId, state: p.state, input: p.input, providerExecuted: true };
          if (p.state === "output-available") {
            part.output = p.output;
          }
          if (p.state === "output-error") {
            part.errorText = p.errorText;
          }
          parts.push(part);
        } else {
          parts.push({ type: p.kind, text: p.text, state: "done" });
        }
      }
      messages.push({ id: e.runId, role: "assistant", parts });
    }
  }
  return messages;
}

test("an AI SDK page, the console and AG-UI: one session, one transcript", { timeout: 60_000 }, async () => {
  const ann = token("reader,writer", "ann");

  // 1. The page: useChat's engine over DefaultChatTransport, a backend tool in the answer.
  const checked = checkedFetch();
  const chat = new NodeChat({ id: SESSION, transport: transport(api, ann, QUEUE, checked) });
  await chat.sendMessage({ id: "one-1", role: "user", parts: [{ type: "text", text: "What is in /tmp?" }] });
  assert.equal(chat.status, "ready", String(chat.error));
  const first = chat.messages.at(-1);
  assert.equal(first.id, "one-1.run");
  assert.equal(textOf(first), "There are 2 files: a.txt, b.txt.");
  assert.ok(first.parts.some((p) => p.type === "tool-fs.list" && p.state === "output-available" && p.providerExecuted === true));
  assert.deepEqual(shapeOfMessage(first), shapeOfRun(await history(api, ann, SESSION), "one-1.run"));

  // 2. The console: the person types in the session's composer
  // (record-user-message at session scope), then starts a run on a queue.
  const console_ = new NaradClient({ servers: api, token: token("reader,writer", "ann") });
  await console_.command("record-user-message", { sessionId: SESSION, messageScope: "session", content: "And how big are they?" });
  const started = await console_.command("start-run", { sessionId: SESSION, runtime: { queue: QUEUE } });
  const consoleRun = started.runId;
  assert.ok(consoleRun && consoleRun !== "one-1.run", JSON.stringify(started));
  let events = await history(api, ann, SESSION);
  for (let i = 0; !events.some((e) => e.type === "run.finished" && e.runId === consoleRun); i++) {
    assert.ok(i < 600, "the console's run finishes");
    await sleep(50);
    events = await history(api, ann, SESSION);
  }

  // 3. AG-UI: an HttpAgent on the thread rejoins with nothing new, and
  // reads the whole conversation; then a third turn.
  const g = agUi(ann);
  await g.agent.runAgent({ forwardedProps: { narad: { queue: QUEUE } } });
  await g.read();
  assert.equal(g.finished.at(-1)?.outcome ?? "success", "success");
  const rejoin = g.answers[0].events.map((e) => e.type);
  assert.equal(rejoin[0], "RUN_STARTED");
  assert.equal(rejoin.at(-1), "RUN_FINISHED");
  assert.ok(rejoin.includes("MESSAGES_SNAPSHOT"), rejoin.join(" "));
  assert.ok(!rejoin.some((t) => t.startsWith("TEXT_MESSAGE") || t.startsWith("TOOL_CALL")), `a rejoin with nothing new replays nothing live: ${rejoin.join(" ")}`);
  const snapshot = g.answers[0].events.find((e) => e.type === "MESSAGES_SNAPSHOT").messages;
  const twoTurns = [
    { id: "one-1", user: "What is in /tmp?", answer: "There are 2 files: a.txt, b.txt." },
    { user: "And how big are they?", answer: 'Turn 2: you said "And how big are they?".' },
  ];
  const snapTurns = turnsOfAgUi(snapshot);
  assert.deepEqual(
    snapTurns.map(({ user, answer }) => ({ user, answer })),
    twoTurns.map(({ user, answer }) => ({ user, answer })),
  );
  assert.equal(snapTurns[0].id, "one-1", "the page's message keeps its id");
  assert.deepEqual(turnsOfAgUi(g.agent.messages), snapTurns, "the agent holds the snapshot");
  const toolCall = snapshot.flatMap((m) => m.toolCalls ?? []).find((t) => t.function.name === "fs.list");
  assert.deepEqual(JSON.parse(toolCall.function.arguments), { path: "/tmp" });
  assert.deepEqual(JSON.parse(snapshot.find((m) => m.role === "tool" && m.toolCallId === toolCall.id).content), ["a.txt", "b.txt"]);

  g.agent.addMessage({ id: "three-1", role: "user", content: "Thanks" });
  await g.agent.runAgent({ runId: "run-three-1", forwardedProps: { narad: { queue: QUEUE } } });
  await g.read();
  assert.equal(g.finished.at(-1).outcome ?? "success", "success");
  const third = g.answers[1].events.map((e) => e.type);
  assert.equal(third[0], "RUN_STARTED");
  assert.equal(third.at(-1), "RUN_FINISHED");
  assert.ok(third.includes("TEXT_MESSAGE_CONTENT"), `the third answer streamed: ${third.join(" ")}`);
  assert.equal(g.answers[1].events[0].metadata?.narad?.runId, "run-three-1");
  const threeTurns = [...twoTurns, { user: "Thanks", answer: 'Turn 3: you said "Thanks".' }];
  const agUiTurns = turnsOfAgUi(g.agent.messages);
  assert.deepEqual(
    agUiTurns.map(({ user, answer }) => ({ user, answer })),
    threeTurns.map(({ user, answer }) => ({ user, answer })),
  );
  assert.equal(g.agent.messages.filter((m) => m.role === "tool").length, 1, "the tool result once");
  await g.check();

  // 4. The AI SDK side again: nothing is active (a fresh transport's
  // reconnect answers 204), and a page opened now shows its messages
  // rebuilt from history, which the chat engine keeps as they are.
  assert.equal(await transport(api, ann, QUEUE, checked).reconnectToStream({ chatId: SESSION }), null);
  assert.equal(checked.answers.at(-1).status, 204);
  events = await history(api, ann, SESSION);
  const rebuilt = await validateUIMessages({ messages: uiMessagesOf(events) });
  const page = new NodeChat({ id: SESSION, messages: rebuilt, transport: transport(api, ann, QUEUE, checked) });
  await page.resumeStream();
  assert.equal(page.status, "ready", String(page.error));
  assert.equal(checked.answers.at(-1).status, 204);
  assert.deepEqual(page.messages, rebuilt);
  assert.deepEqual(shapeOfMessage(page.messages[1]), shapeOfMessage(first), "the first answer as the page streamed it");
  await checked.check();

  // narad's history: one session, the three turns' runs, every user
  // message once, each answer once.
  assert.ok(events.every((e) => e.sessionId === SESSION));
  const runs = events.filter((e) => e.type === "run.started" && e.parentRunId === undefined).map((e) => e.runId);
  assert.deepEqual(runs, ["one-1.run", consoleRun, "run-three-1"]);
  for (const runId of runs) {
    assert.equal(events.filter((e) => e.type === "run.finished" && e.runId === runId).length, 1, `${runId} finished once`);
  }
  const users = events.filter((e) => e.type === "message.user.recorded");
  assert.deepEqual(
    users.map((e) => e.content),
    ["What is in /tmp?", "And how big are they?", "Thanks"],
  );
  assert.equal(new Set(users.map((e) => e.messageId)).size, 3);
  assert.equal(events.filter((e) => e.type === "message.text.started" && e.role === "assistant").length, 3, "one answer per turn");
  assert.equal(events.filter((e) => e.type === "tool.call.started").length, 1);

  // The same transcript whichever toolkit reads it.
  const truth = turnsOfHistory(events);
  assert.deepEqual(
    truth.map(({ user, answer }) => ({ user, answer })),
    threeTurns.map(({ user, answer }) => ({ user, answer })),
  );
  assert.deepEqual(agUiTurns, truth, "AG-UI's messages are narad's transcript, ids included");
  assert.deepEqual(turnsOfUi(rebuilt), truth, "the page's messages are narad's transcript, ids included");
});
