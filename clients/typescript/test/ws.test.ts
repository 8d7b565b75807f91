// Node 20 without --experimental-websocket has no global WebSocket: an
// executor there says what to pass, and runs with the `ws` package's
// WebSocket. The suite itself runs with the flag, so the executor runs in
// a node of its own started without it. Against a running narad
// (NARAD_URL, NARAD_TOKEN, NARAD_EXECUTOR_TOKEN).
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { WebSocket as WsWebSocket } from "ws";

import { NaradClient } from "../src/index.js";
import type { AuthorityEvent, ExecutorOptions } from "../src/index.js";
import { until } from "./support.js";

const url = process.env["NARAD_URL"];
const token = process.env["NARAD_TOKEN"];
const executorToken = process.env["NARAD_EXECUTOR_TOKEN"];
if (!url || !token || !executorToken) {
  throw new Error("set NARAD_URL, NARAD_TOKEN and NARAD_EXECUTOR_TOKEN: these tests run against a narad server");
}

// Both constructors fit the option with no cast (a compile-time check).
const fromWs: ExecutorOptions["WebSocket"] = WsWebSocket;
const fromGlobal: ExecutorOptions["WebSocket"] = globalThis.WebSocket;
void fromWs;
void fromGlobal;

/** The executor's program: no flag, the SDK as built for the tests, `ws` from this package. */
const child = `
import { WebSocket } from "ws";
import { Executor, NaradClient } from ${JSON.stringify(new URL("../src/index.js", import.meta.url).href)};
const say = (o) => console.log(JSON.stringify(o));
say({ globalWebSocket: typeof globalThis.WebSocket });
const client = new NaradClient({ servers: process.env.NARAD_URL, token: process.env.NARAD_EXECUTOR_TOKEN });
try {
  new Executor(client, { id: "nothing", tools: {} });
  say({ refused: null });
} catch (e) {
  say({ refused: e.message });
}
const executor = new Executor(client, {
  id: process.env.EXECUTOR_ID,
  WebSocket,
  maxBackoffMs: 500,
  tools: { "math.add": (args) => ({ sum: args.a + args.b, node: process.version }) },
  onAttached: (leaseId) => say({ attached: leaseId }),
});
process.on("SIGTERM", () => executor.stop());
await executor.run();
say({ stopped: true });
`;

test("in node without --experimental-websocket, an executor names its option and runs with the ws package", { timeout: 60_000 }, async () => {
  const writer = new NaradClient({ servers: url, token });
  const { sessionId } = await writer.createSession({ title: "executor with ws" });
  const executorId = `ws-${sessionId}`;
  await writer.command("start-run", { sessionId, runId: "r1", clientExecutorId: executorId });

  const node = spawn(process.execPath, ["--input-type=module", "-e", child], {
    // The package's directory, where `ws` is installed.
    cwd: fileURLToPath(new URL("../../", import.meta.url)),
    env: { ...process.env, EXECUTOR_ID: executorId, NODE_OPTIONS: "" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const said: Record<string, unknown>[] = [];
  let errors = "";
  node.stderr.on("data", (d: Buffer) => (errors += d.toString()));
  createInterface({ input: node.stdout }).on("line", (line) => said.push(JSON.parse(line) as Record<string, unknown>));
  const exited = new Promise<number | null>((resolve) => node.on("exit", resolve));
  try {
    await until("the executor's attachment", async () => {
      assert.equal(node.exitCode, null, `the executor's node exited: ${errors}`);
      return said.find((s) => "attached" in s);
    });
    assert.equal(said.find((s) => "globalWebSocket" in s)?.["globalWebSocket"], "undefined", "no global WebSocket in that node");
    const refused = String(said.find((s) => "refused" in s)?.["refused"]);
    assert.match(refused, /ExecutorOptions\.WebSocket/);
    assert.match(refused, /`ws` package/);
    assert.match(refused, /--experimental-websocket/);

    await writer.appendEvents(sessionId, [
      {
        protocolVersion: "narad/v1",
        type: "tool.call.started",
        eventId: `${sessionId}-tc1`,
        rootRunId: "r1",
        runId: "r1",
        toolCallId: "tc1",
        toolName: "math.add",
        executor: "client",
        args: { a: 2, b: 3 },
      },
    ]);
    const finished = await until("tc1's finish", async () => {
      for await (const e of writer.allHistory(sessionId)) if (e.type === "tool.call.finished") return e;
      return undefined;
    });
    const f = finished as AuthorityEvent & { outcome?: string; response?: { sum?: number; node?: string } };
    assert.equal(f.outcome, "success");
    assert.equal(f.response?.sum, 5);
    assert.equal(f.response?.node, process.version);
  } finally {
    node.kill("SIGTERM");
    await exited;
  }
  assert.ok(said.some((s) => "stopped" in s), `the executor stopped when asked: ${errors}`);
});
