// The executor loop in Node against a running narad (NARAD_URL,
// NARAD_TOKEN with reader, writer and backend; NARAD_EXECUTOR_TOKEN with
// executor; .ci/typescript-sdk sets them and runs node with a WebSocket).
// A call runs once and its result is the run's; a process that stops while
// a tool runs is replaced by another with the same token file, which
// finishes the call client_restarted and never runs it; the first
// process's late result is refused, so the call has exactly one finish.
import assert from "node:assert/strict";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { Executor, NaradClient } from "../src/index.js";
import type { AuthorityEvent } from "../src/index.js";
import { FileTokenStore } from "../src/node.js";
import { until } from "./support.js";

const url = process.env["NARAD_URL"];
const token = process.env["NARAD_TOKEN"];
const executorToken = process.env["NARAD_EXECUTOR_TOKEN"];
if (!url || !token || !executorToken) {
  throw new Error("set NARAD_URL, NARAD_TOKEN and NARAD_EXECUTOR_TOKEN: these tests run against a narad server");
}

test("a Node executor runs a call once; its replacement never reruns an accepted token", { timeout: 90_000 }, async () => {
  const writer = new NaradClient({ servers: url, token });
  const session = await writer.createSession({ title: "executor in node" });
  const sid = session.sessionId;
  const executorId = `node-${sid}`;
  await writer.command("start-run", { sessionId: sid, runId: "r1", clientExecutorId: executorId });
  let sequence = 0;
  const startCall = (toolCallId: string, toolName: string, args: Record<string, number>) =>
    writer.appendEvents(sid, [
      {
        protocolVersion: "narad/v1",
        type: "tool.call.started",
        eventId: `${sid}-${toolCallId}-${++sequence}`,
        rootRunId: "r1",
        runId: "r1",
        toolCallId,
        toolName,
        executor: "client",
        args,
      },
    ]);
  const finishes = async () => {
    const all: AuthorityEvent[] = [];
    for await (const e of writer.allHistory(sid)) {
      if (e.type === "tool.call.finished") all.push(e);
    }
    return all;
  };

  // The first server named is not listening: the executor moves on to the next.
  const executorClient = new NaradClient({ servers: ["http://127.0.0.1:9", url], token: executorToken });
  const store = join(mkdtempSync(join(tmpdir(), "narad-executor-")), "tokens.jsonl");
  let release: (v: { late: true }) => void = () => {};
  const slow = new Promise<{ late: true }>((r) => (release = r));
  let attached = 0;
  const first = new Executor(executorClient, {
    id: executorId,
    store: new FileTokenStore(store),
    maxBackoffMs: 500,
    onAttached: () => attached++,
    tools: {
      "math.add": (args) => ({ sum: (args as { a: number; b: number }).a + (args as { a: number; b: number }).b }),
      "slow.wait": () => slow,
    },
  });
  const firstRun = first.run();
  await until("the first executor's attachment", async () => (attached > 0 ? true : undefined));

  await startCall("tc1", "math.add", { a: 2, b: 3 });
  const tc1 = await until("tc1's finish", async () => (await finishes()).find((e) => e.toolCallId === "tc1"));
  assert.equal(tc1.outcome, "success");
  assert.deepEqual(tc1.response, { sum: 5 });

  await startCall("tc2", "slow.wait", {});
  await until("tc2 running in the first executor", async () => (first.ran.includes("tc2") ? true : undefined));
  first.stop();
  await firstRun;

  const second = new Executor(executorClient, {
    id: executorId,
    store: new FileTokenStore(store),
    maxBackoffMs: 500,
    tools: { "slow.wait": () => ({ ranAgain: true }), "math.add": () => ({ sum: 0 }) },
  });
  const secondRun = second.run();
  const tc2 = await until("tc2's finish", async () => (await finishes()).find((e) => e.toolCallId === "tc2"));
  assert.equal(tc2.outcome, "error");
  assert.equal(tc2.code, "client_restarted");
  assert.deepEqual(second.ran, [], "the replacement ran nothing");

  release({ late: true }); // the first process's tool ends after all: its finish is refused
  await new Promise((r) => setTimeout(r, 1000));
  second.stop();
  await secondRun;
  assert.deepEqual(
    (await finishes()).map((e) => [e.toolCallId, e.outcome]),
    [
      ["tc1", "success"],
      ["tc2", "error"],
    ],
    "one finish per call",
  );
});

test("without a WebSocket, the executor says what to pass or how to run node", () => {
  const client = new NaradClient({ servers: "http://127.0.0.1:1", token: "t" });
  const global = globalThis as { WebSocket?: typeof WebSocket };
  const saved = global.WebSocket;
  delete global.WebSocket;
  try {
    assert.throws(
      () => new Executor(client, { id: "desk", tools: {} }),
      /ExecutorOptions\.WebSocket.*--experimental-websocket/s,
    );
  } finally {
    if (saved !== undefined) global.WebSocket = saved;
  }
});
