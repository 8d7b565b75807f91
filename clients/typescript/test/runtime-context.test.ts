// The run context's steps (say, think, tool, clientTool, approve, progress,
// state, finish, fail, cancel), the runtime's handling of errors and stops,
// takeover after kill -9, appends through a restart of the only server and
// within the client's one retry budget,
// against narad servers of their own: started here (NARAD_BIN, else this
// checkout's target/debug/narad) on fresh databases of the test Postgres
// (NARAD_TEST_DATABASE_URL, else postgres://postgres@127.0.0.1:5432/postgres,
// created with psql), as .ci/lib/test-server.sh starts one, with runtime
// leases of two seconds, so that a killed runtime's run is taken over soon.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import { Executor, LeaseLost, MemoryTokenStore, NaradClient, RunStopped, Runtime, ToolFailed, UnavailableError, ident, runEvent } from "../src/index.js";
import type { Approval, AuthorityEvent, Claim, RunHandler, RuntimeOptions } from "../src/index.js";
import { RunContext } from "../src/run-context.js";
import { until } from "./support.js";

// --- a server of our own ----------------------------------------------------

const ADMIN_URL = process.env["NARAD_TEST_DATABASE_URL"] ?? "postgres://postgres@127.0.0.1:5432/postgres";
const SECRET = "typescript-runtime-test-hs256-secret-of-32-bytes-or-more";
const BINARY = process.env["NARAD_BIN"] ?? fileURLToPath(new URL("../../../../target/debug/narad", import.meta.url));
const SDK = new URL("../src/index.js", import.meta.url).href;
const SHORT_LEASES = { NARAD_RUNTIME_LEASE_TTL_MS: "2000", NARAD_RUNTIME_SWEEP_MS: "200" };

/** A running `narad serve` on a database of its own. */
interface TestServer {
  base: string;
  /** A token of tenant `ts-runtime` (`narad token`). */
  token(roles: string, sub?: string): string;
  /** Kills the server (SIGKILL) and serves again on the same port and database after `downMs`. */
  restart(downMs: number): Promise<void>;
  stop(): Promise<void>;
}

function psql(sql: string): void {
  const done = spawnSync("psql", ["-X", "-q", "-v", "ON_ERROR_STOP=1", ADMIN_URL, "-c", sql], { encoding: "utf8" });
  if (done.status !== 0) {
    throw new Error(`psql ${sql}: ${done.stderr || done.error}`);
  }
}

async function serve(settings: Record<string, string>): Promise<TestServer> {
  if (!existsSync(BINARY)) {
    throw new Error(`no narad binary at ${BINARY}: build it (cargo build -p narad-server --bin narad) or set NARAD_BIN`);
  }
  const database = `narad_ts_runtime_${process.pid}_${Math.random().toString(36).slice(2, 10)}`;
  psql(`create database ${database}`);
  const work = mkdtempSync(join(tmpdir(), "narad-ts-runtime-"));
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    NARAD_JWT_HS256_SECRET: SECRET,
    NARAD_DATABASE_URL: `${ADMIN_URL.slice(0, ADMIN_URL.lastIndexOf("/"))}/${database}`,
    NARAD_HOME: join(work, "home"),
    NARAD_SHUTDOWN_GRACE_MS: "500",
    RUST_LOG: "warn",
    ...settings,
  };
  let log = "";
  const start = (listen: string): Promise<{ child: ChildProcess; base: string }> =>
    new Promise((resolve, reject) => {
      const child = spawn(BINARY, ["serve"], { env: { ...env, NARAD_LISTEN: listen }, stdio: ["ignore", "pipe", "pipe"] });
      let out = "";
      const timer = setTimeout(() => reject(new Error(`narad serve did not start within 60 s:\n${out}\n${log}`)), 60_000);
      child.stderr?.on("data", (d: Buffer) => (log += d.toString()));
      child.stdout?.on("data", (d: Buffer) => {
        out += d.toString();
        const served = /narad is serving on (\S+)/.exec(out);
        if (served) {
          clearTimeout(timer);
          resolve({ child, base: served[1] as string });
        }
      });
      child.on("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`narad serve exited (${code}) before serving:\n${out}\n${log}`));
      });
    });
  let { child, base } = await start("127.0.0.1:0");
  const tokens = new Map<string, string>();
  const ended = (c: ChildProcess) =>
    new Promise<void>((resolve) => (c.exitCode !== null || c.signalCode !== null ? resolve() : c.once("exit", () => resolve())));
  return {
    base,
    token(roles, sub = "ts-runtime") {
      const key = `${roles}/${sub}`;
      if (!tokens.has(key)) {
        const made = spawnSync(BINARY, ["token", "--org", "ts-runtime", "--sub", sub, "--roles", roles], { env, encoding: "utf8" });
        assert.equal(made.status, 0, made.stderr);
        tokens.set(key, made.stdout.trim());
      }
      return tokens.get(key) as string;
    },
    async restart(downMs) {
      child.kill("SIGKILL");
      await ended(child);
      await new Promise((r) => setTimeout(r, downMs));
      ({ child } = await start(new URL(base).host));
    },
    async stop() {
      child.kill("SIGTERM");
      await ended(child);
      psql(`drop database if exists ${database} with (force)`);
      rmSync(work, { recursive: true, force: true });
    },
  };
}

// --- helpers ---------------------------------------------------------------

let server: TestServer;
let narad: NaradClient;
let approver: NaradClient;

before(async () => {
  server = await serve(SHORT_LEASES);
  narad = new NaradClient({ servers: server.base, token: server.token("reader,writer,backend") });
  approver = new NaradClient({ servers: server.base, token: server.token("reader,approver", "approver-ann") });
});

after(async () => {
  await server?.stop();
});

let queues = 0;

/** A queue of its own for one test, so that runtimes of different tests never claim each other's runs. */
function newQueue(): string {
  queues += 1;
  return `q${queues}-${Math.random().toString(36).slice(2, 8)}`;
}

/** A new session and a run in it, queued on `queue`. */
async function start(queue: string, extra: { clientExecutorId?: string; input?: unknown; maxAttempts?: number } = {}) {
  const { sessionId } = await narad.createSession({});
  const runId = `r-${Math.random().toString(36).slice(2, 10)}`;
  await narad.command("start-run", {
    sessionId,
    runId,
    runtime: { queue, onLost: "retry", maxAttempts: extra.maxAttempts ?? 3 },
    ...(extra.clientExecutorId === undefined ? {} : { clientExecutorId: extra.clientExecutorId }),
    ...(extra.input === undefined ? {} : { input: extra.input }),
  });
  return { sessionId, runId };
}

async function historyOf(sessionId: string, client: NaradClient = narad): Promise<AuthorityEvent[]> {
  const all: AuthorityEvent[] = [];
  for await (const e of client.allHistory(sessionId)) {
    all.push(e);
  }
  return all;
}

type Field = { readonly [field: string]: unknown };

/** The events of `type` (as plain objects, to read any field). */
function ofType(events: AuthorityEvent[], type: string): Field[] {
  return events.filter((e) => e.type === type) as unknown as Field[];
}

/** Waits for an event of `type` (of run `runId`) in the session; answers the whole history then. */
async function waitFor(sessionId: string, type: string, runId?: string, seconds = 20): Promise<AuthorityEvent[]> {
  return until(
    type,
    async () => {
      const events = await historyOf(sessionId);
      return events.some((e) => e.type === type && (runId === undefined || e.runId === runId)) ? events : undefined;
    },
    seconds,
  );
}

/** Runs a runtime with `handler` while `body` runs; then stops it and waits for it. */
async function serving<T>(options: Omit<RuntimeOptions, "waitMs">, body: (runtime: Runtime) => Promise<T>): Promise<T> {
  const runtime = new Runtime(narad, { waitMs: 1000, ...options });
  const running = runtime.run();
  try {
    return await body(runtime);
  } finally {
    runtime.stop();
    await running;
  }
}

/** The chunks one by one, `ms` apart (none at all for 0: said within one delta window). */
async function* slowly(chunks: string[], ms: number): AsyncGenerator<string> {
  for (const chunk of chunks) {
    yield chunk;
    if (ms > 0) {
      await new Promise((r) => setTimeout(r, ms));
    }
  }
}

// --- steps -----------------------------------------------------------------

test("step ids are the Python runtime's: readable, within 256 characters, hashed alike when longer", () => {
  assert.equal(ident("run-1", 3, "tool"), "run-1.3.tool");
  const long = ident("r".repeat(300), 3, "tool");
  // uuid.uuid5(UUID("5f3c4c1e-3a52-4f0e-9d8e-6e6172616401"), "r" * 300 + ".3.tool"), as Python's _ident makes it
  assert.equal(long, "1f692021-426f-5332-a82c-20f7774ad263.tool");
  assert.notEqual(ident("r".repeat(300), 4, "tool"), long);
});

test("say streams a string and an async iterable as one coalesced message; think records reasoning; finish carries usage", async () => {
  const queue = newQueue();
  const { sessionId, runId } = await start(queue);
  const errors: unknown[] = [];
  await serving(
    {
      queue,
      onError: (e) => errors.push(e),
      handler: async (ctx) => {
        await ctx.think("Plan: greet, then ask.");
        await ctx.say("Hello");
        const said = await ctx.say(slowly([", world", "!", " How", " are", " you?"], 0));
        assert.equal(said, ", world! How are you?");
        await ctx.finish({ usage: { inputTokens: 3, outputTokens: 7 } });
      },
    },
    async (runtime) => {
      await waitFor(sessionId, "run.finished", runId);
      await until("the run released", async () => (runtime.held.length === 0 ? true : undefined));
    },
  );
  assert.deepEqual(errors, []);
  const events = await historyOf(sessionId);
  const reasoning = ofType(events, "reasoning.delta");
  assert.deepEqual(
    reasoning.map((e) => [e["reasoningId"], e["delta"]]),
    [[`${runId}.1.thought`, "Plan: greet, then ask."]],
  );
  assert.equal(ofType(events, "reasoning.completed").length, 1);
  assert.deepEqual(
    ofType(events, "message.text.started").map((e) => [e["messageId"], e["role"], e["messageScope"]]),
    [[`${runId}.2.message`, "assistant", "run"]],
  );
  const deltas = ofType(events, "message.text.delta");
  assert.equal(deltas.map((e) => e["delta"]).join(""), "Hello, world! How are you?");
  assert.ok(deltas.length <= 2, `six chunks said within the delta window go out in few deltas: ${deltas.length}`);
  // The message completes in the run's last batch, just before run.finished.
  const types = events.map((e) => e.type);
  assert.deepEqual(types.slice(-2), ["message.text.completed", "run.finished"]);
  assert.deepEqual(ofType(events, "run.finished")[0]?.["usage"], { inputTokens: 3, outputTokens: 7 });
  for (const e of events.filter((e) => e.type !== "run.started")) {
    assert.ok(e.eventId.startsWith(`${runId}@1.`), `the context's eventIds are the run's: ${e.eventId}`);
  }
});

test("messages opened with ctx.message complete in the order they opened", async () => {
  const queue = newQueue();
  const { sessionId, runId } = await start(queue);
  await serving(
    {
      queue,
      handler: async (ctx) => {
        const first = ctx.message();
        const second = ctx.message("system");
        await first.say("One");
        await second.say("Two"); // completes the first
        assert.ok(first.completed);
        await second.say(", three");
        await ctx.say("Four"); // the current message is the second: said to it
        await ctx.finish();
      },
    },
    () => waitFor(sessionId, "run.finished", runId),
  );
  const events = await historyOf(sessionId);
  const stream = events
    .filter((e) => e.type.startsWith("message.text."))
    .map((e) => [e.type.slice("message.text.".length), (e as unknown as Field)["messageId"], (e as unknown as Field)["delta"] ?? (e as unknown as Field)["role"] ?? null]);
  assert.deepEqual(stream, [
    ["started", `${runId}.1.message`, "assistant"],
    ["delta", `${runId}.1.message`, "One"],
    ["completed", `${runId}.1.message`, null],
    ["started", `${runId}.2.message`, "system"],
    ["delta", `${runId}.2.message`, "Two, threeFour"],
    ["completed", `${runId}.2.message`, null],
  ]);
});

test("tool records a backend call and its result; a function that throws finishes the call error tool_error and throws ToolFailed", async () => {
  const queue = newQueue();
  const { sessionId, runId } = await start(queue);
  let failure: unknown;
  await serving(
    {
      queue,
      handler: async (ctx) => {
        const { sum } = await ctx.tool("math.add", { a: 2, b: 3 }, ({ a, b }, call) => {
          assert.equal(call.toolCallId, `${ctx.runId}.1.tool`);
          return { sum: a + b };
        });
        try {
          await ctx.tool("disk.write", { path: "/x" }, async () => {
            throw new Error("disk full");
          });
        } catch (e) {
          failure = e;
        }
        await ctx.tool("nothing", {}, () => undefined);
        await ctx.say(`The sum is ${sum}.`);
        await ctx.finish();
      },
    },
    () => waitFor(sessionId, "run.finished", runId),
  );
  assert.ok(failure instanceof ToolFailed, `ToolFailed: ${String(failure)}`);
  assert.equal(failure.code, "tool_error");
  assert.equal(failure.toolCallId, `${runId}.2.tool`);
  assert.match(String((failure.cause as Error).message), /disk full/);
  const events = await historyOf(sessionId);
  assert.deepEqual(
    ofType(events, "tool.call.started").map((e) => [e["toolCallId"], e["toolName"], e["executor"], e["args"]]),
    [
      [`${runId}.1.tool`, "math.add", "backend", { a: 2, b: 3 }],
      [`${runId}.2.tool`, "disk.write", "backend", { path: "/x" }],
      [`${runId}.3.tool`, "nothing", "backend", {}],
    ],
  );
  assert.deepEqual(
    ofType(events, "tool.call.finished").map((e) => [e["outcome"], e["response"], e["code"], e["message"]]),
    [
      ["success", { sum: 5 }, undefined, undefined],
      ["error", null, "tool_error", "disk full"],
      ["success", null, undefined, undefined],
    ],
  );
  assert.equal(ofType(events, "message.text.delta")[0]?.["delta"], "The sum is 5.");
});

test("clientTool waits for the executor's result; approve waits on the session's stream and resolves to the decision with its actor", async () => {
  const queue = newQueue();
  const executorId = `desk-${Math.random().toString(36).slice(2, 8)}`;
  let attached = false;
  const executor = new Executor(new NaradClient({ servers: server.base, token: server.token("executor", "desk") }), {
    id: executorId,
    store: new MemoryTokenStore(),
    maxBackoffMs: 500,
    onAttached: () => (attached = true),
    tools: { "clock.now": () => ({ now: "2026-12-06T10:00:00Z" }) },
  });
  const executing = executor.run();
  // Every history read of the runtime's client: the waits must not poll it.
  const reads: number[] = [];
  const counting: typeof fetch = (input, init) => {
    const url = String(input instanceof Request ? input.url : input);
    if (/\/events(\?|$)/.test(url) && (init?.method ?? "GET") === "GET") {
      reads.push(Date.now());
    }
    return fetch(input, init);
  };
  const runtimeClient = new NaradClient({ servers: server.base, token: server.token("reader,writer,backend"), fetch: counting });
  let approval: Approval | undefined;
  let now: unknown;
  try {
    await until("the executor attached", async () => (attached ? true : undefined));
    const { sessionId, runId } = await start(queue, { clientExecutorId: executorId });
    const runtime = new Runtime(runtimeClient, {
      queue,
      waitMs: 1000,
      handler: async (ctx) => {
        now = await ctx.clientTool<{ now: string }>("clock.now", { tz: "UTC" });
        approval = await ctx.approve("Delete the files?", { title: "Delete", input: { path: "/tmp/x" } });
        await ctx.say(`Decided: ${approval.decision}.`);
        await ctx.finish();
      },
    });
    const running = runtime.run();
    try {
      const paused = await waitFor(sessionId, "run.paused", runId);
      const interrupt = ofType(paused, "interrupt.requested")[0] as Field;
      assert.equal(interrupt["interruptId"], `${runId}.2.approval`);
      assert.equal(interrupt["title"], "Delete");
      assert.deepEqual(interrupt["actions"], ["approve", "deny"]);
      const since = Date.now();
      await new Promise((r) => setTimeout(r, 2000));
      const readsWhileWaiting = reads.filter((t) => t >= since).length;
      assert.ok(readsWhileWaiting <= 1, `the approval is awaited on the stream, not by polling history: ${readsWhileWaiting} reads in 2 s`);
      await approver.command("resolve-interrupt", { interruptId: `${runId}.2.approval`, decision: "approve" });
      await waitFor(sessionId, "run.finished", runId);
    } finally {
      runtime.stop();
      await running;
    }
    const events = await historyOf(sessionId);
    const types = events.map((e) => e.type);
    const resolved = types.indexOf("interrupt.resolved");
    assert.equal(types[resolved + 1], "run.resumed", `run.resumed follows the resolution: ${types}`);
    assert.deepEqual(
      ofType(events, "tool.call.started").map((e) => [e["toolCallId"], e["executor"], e["args"]]),
      [[`${runId}.1.client`, "client", { tz: "UTC" }]],
    );
  } finally {
    executor.stop();
    await executing;
  }
  assert.deepEqual(now, { now: "2026-12-06T10:00:00Z" });
  assert.equal(approval?.decision, "approve");
  assert.equal(approval?.actor?.sub, "approver-ann");
  assert.equal(approval?.interruptId, approval?.event["interruptId"]);
});

test("releaseWhenWaiting: a step waiting on the executor or a person gives the run back; the answer queues it again and the handler replays to where it waited", { timeout: 60_000 }, async () => {
  const queue = newQueue();
  const executorId = `desk-${Math.random().toString(36).slice(2, 8)}`;
  let attached = false;
  let open: () => void = () => undefined;
  const gate = new Promise<void>((resolve) => (open = resolve));
  const executor = new Executor(new NaradClient({ servers: server.base, token: server.token("executor", "desk") }), {
    id: executorId,
    store: new MemoryTokenStore(),
    maxBackoffMs: 500,
    onAttached: () => (attached = true),
    tools: {
      "clock.now": async () => {
        await gate; // the run is given back meanwhile
        return { now: "10:00" };
      },
    },
  });
  const executing = executor.run();
  const claims: string[] = [];
  let said = 0;
  try {
    await until("the executor attached", async () => (attached ? true : undefined));
    const { sessionId, runId } = await start(queue, { clientExecutorId: executorId });
    await serving(
      {
        queue,
        releaseWhenWaiting: true,
        handler: async (ctx) => {
          claims.push(ctx.reason);
          const { now } = await ctx.clientTool<{ now: string }>("clock.now", { tz: "UTC" });
          const { decision } = await ctx.approve(`Delete the files at ${now}?`);
          said += 1;
          await ctx.say(`Decided: ${decision}.`);
          await ctx.finish();
        },
      },
      async (runtime) => {
        await waitFor(sessionId, "tool.call.started", runId);
        await until("the run given back while the executor works", async () => (runtime.held.length === 0 ? true : undefined));
        assert.equal(ofType(await historyOf(sessionId), "tool.call.finished").length, 0, "still running on the executor");
        open();
        const paused = await waitFor(sessionId, "run.paused", runId);
        await until("the run given back while a person decides", async () => (runtime.held.length === 0 ? true : undefined));
        const interrupt = ofType(paused, "interrupt.requested")[0] as Field;
        assert.equal(interrupt["message"], "Delete the files at 10:00?");
        await approver.command("resolve-interrupt", { interruptId: String(interrupt["interruptId"]), decision: "approve" });
        await waitFor(sessionId, "run.finished", runId);
      },
    );
    const result = await narad.runs.join(sessionId, runId);
    assert.equal(result.status, "finished");
    assert.deepEqual(result.violations.map(String), []);
    const events = result.events;
    assert.equal(ofType(events, "tool.call.started").length, 1, "the client call asked once");
    assert.equal(ofType(events, "interrupt.requested").length, 1, "the approval asked once");
    const types = events.map((e) => e.type);
    assert.equal(types[types.indexOf("interrupt.resolved") + 1], "run.resumed", types.join(" "));
    assert.equal(ofType(events, "message.text.started").length, 1);
    assert.equal(said, 1);
    assert.equal(claims[0], "started");
    assert.ok(claims.length >= 3 && claims.slice(1).every((r) => r === "event"), `claimed again on the answers: ${claims.join(" ")}`);
  } finally {
    open();
    executor.stop();
    await executing;
  }
});

test("progress records activity once per step; setState and patchState write the session's documents at their next revisions", async () => {
  const queue = newQueue();
  const { sessionId, runId } = await start(queue);
  const revisions: number[] = [];
  await serving(
    {
      queue,
      handler: async (ctx) => {
        const searching = await ctx.progress("Searching", { detail: "three sources" });
        revisions.push(await ctx.setState({ todo: ["read"] }));
        revisions.push(await ctx.patchState([{ op: "add", path: "/todo/-", value: "write" }]));
        revisions.push(await ctx.setState({ open: true }, { ui: true, scope: "panel" }));
        await ctx.progress("Searching", { progressId: searching, status: "completed" });
        await ctx.finish();
      },
    },
    () => waitFor(sessionId, "run.finished", runId),
  );
  assert.deepEqual(revisions, [1, 2, 1]);
  const documents = await narad.request<{ state: { scope: string; revision: number; state: unknown }[]; ui: { scope: string; revision: number; state: unknown }[] }>(
    "GET",
    `/v1/sessions/${sessionId}/documents`,
  );
  assert.deepEqual(documents.state, [{ scope: "session", revision: 2, state: { todo: ["read", "write"] } }]);
  assert.deepEqual(documents.ui, [{ scope: "panel", revision: 1, state: { open: true } }]);
  const events = await historyOf(sessionId);
  assert.deepEqual(
    ofType(events, "progress.recorded").map((e) => [e["progressId"], e["label"], e["status"], e["detail"], e["privacy"]]),
    [
      [`${runId}.1.progress`, "Searching", "active", "three sources", "public"],
      [`${runId}.1.progress`, "Searching", "completed", undefined, "public"],
    ],
  );
});

test("typed builders: ctx.event and runEvent make proposed events without casts", async () => {
  const queue = newQueue();
  const { sessionId, runId } = await start(queue);
  await serving(
    {
      queue,
      handler: async (ctx) => {
        const note = ctx.event("run.custom", { name: "acme.note", value: { seen: true } });
        // @ts-expect-error: a misspelt field is refused by the compiler
        ctx.event("message.text.delta", { messageId: "m", detla: "x" });
        await ctx.append([note, ctx.event("run.finished", {})]);
      },
    },
    () => waitFor(sessionId, "run.finished", runId),
  );
  const events = await historyOf(sessionId);
  const custom = ofType(events, "run.custom")[0] as Field;
  assert.deepEqual([custom["name"], custom["value"], custom["rootRunId"], custom["runId"]], ["acme.note", { seen: true }, runId, runId]);

  // Outside a runtime: a run driven by a backend that appends itself.
  const { sessionId: other } = await narad.createSession({});
  await narad.command("start-run", { sessionId: other, runId: "plain" });
  const run = { runId: "plain" };
  await narad.appendEvents(other, [
    runEvent(run, "message.text.started", { messageId: "m1", role: "assistant", messageScope: "run" }),
    runEvent(run, "message.text.delta", { messageId: "m1", delta: "Hi" }),
    runEvent(run, "message.text.completed", { messageId: "m1" }),
    runEvent(run, "run.finished", { usage: { outputTokens: 1 } }),
  ]);
  const plain = await historyOf(other);
  assert.deepEqual(plain.map((e) => e.type).slice(-2), ["message.text.completed", "run.finished"]);
});

// --- errors and stops ------------------------------------------------------

test("a handler that throws ends its run run.error handler_error, its open message completed first, and reaches onError", async () => {
  const queue = newQueue();
  const { sessionId, runId } = await start(queue);
  const reported: [unknown, string][] = [];
  await serving(
    {
      queue,
      onError: (error, claim) => reported.push([error, claim.runId]),
      handler: async (ctx) => {
        await ctx.say("Let me look");
        throw new Error("the model provider is down");
      },
    },
    async (runtime) => {
      await waitFor(sessionId, "run.error", runId);
      await until("the run released", async () => (runtime.held.length === 0 ? true : undefined));
    },
  );
  assert.equal(reported.length, 1);
  assert.equal(reported[0]?.[1], runId);
  assert.match(String(reported[0]?.[0]), /the model provider is down/);
  const events = await historyOf(sessionId);
  const types = events.map((e) => e.type);
  assert.deepEqual(types.slice(-2), ["message.text.completed", "run.error"]);
  assert.ok(types.indexOf("message.text.completed") < types.indexOf("run.error"), `the message completes first: ${types}`);
  const error = ofType(events, "run.error")[0] as Field;
  assert.equal(error["code"], "handler_error");
  assert.doesNotMatch(String(error["message"]), /provider/, "the error's own text stays out of the journal");
  assert.equal(ofType(events, "message.text.delta").map((e) => e["delta"]).join(""), "Let me look");
});

test("a stop mid-answer: say throws RunStopped, the message is completed and the run ends run.cancelled", async () => {
  const queue = newQueue();
  const { sessionId, runId } = await start(queue);
  let thrown: unknown;
  let aborted: unknown;
  await serving(
    {
      queue,
      onError: (e) => assert.fail(`no error: ${String(e)}`),
      handler: async (ctx) => {
        try {
          for (let i = 0; ; i++) {
            await ctx.say(`word${i} `);
            await new Promise((r) => setTimeout(r, 50));
          }
        } catch (e) {
          thrown = e;
          aborted = ctx.signal.reason;
          throw e;
        }
      },
    },
    async () => {
      await waitFor(sessionId, "message.text.delta", runId);
      await narad.command("stop-run", { runId });
      await waitFor(sessionId, "run.cancelled", runId);
    },
  );
  assert.ok(thrown instanceof RunStopped, `RunStopped: ${String(thrown)}`);
  assert.equal(aborted, "stop");
  const events = await historyOf(sessionId);
  const types = events.map((e) => e.type);
  assert.ok(types.indexOf("message.text.completed") < types.indexOf("run.cancelled"), `the message completes first: ${types}`);
  const cancelled = ofType(events, "run.cancelled")[0] as Field;
  assert.deepEqual([cancelled["code"], cancelled["message"]], ["stopped", "stopped on request"]);
  assert.notEqual(cancelled["eventId"], undefined);
  assert.ok(String(cancelled["eventId"]).startsWith(`${runId}@1.`), "the runtime, not the server, closed it");
});

// --- nested runs ---------------------------------------------------------------

/** The text run `runId` streamed. */
function saidBy(events: AuthorityEvent[], runId: string): string {
  return ofType(events, "message.text.delta")
    .filter((e) => e["runId"] === runId)
    .map((e) => String(e["delta"]))
    .join("");
}

test("nested: a nested run writes under its parent, records the parent's executor, and ends before it; one that throws ends run.error", async () => {
  const queue = newQueue();
  const { sessionId, runId } = await start(queue, { clientExecutorId: "desk-nested" });
  let caught: unknown;
  await serving(
    {
      queue,
      onError: (e) => assert.fail(`no error: ${String(e)}`),
      handler: async (ctx) => {
        await ctx.say("Handing over.");
        const found = await ctx.nested(
          async (child) => {
            assert.equal(child.parent, ctx);
            assert.equal(child.clientExecutorId, "desk-nested");
            await child.say("Billing here.");
            return child.tool("invoice.find", { n: 7 }, (args) => ({ found: args.n }));
          },
          { key: "billing", input: { agent: "billing" } },
        );
        assert.deepEqual(found, { found: 7 });
        try {
          await ctx.nested(async (child) => {
            await child.say("Trying.");
            throw new Error("the sub-agent broke");
          });
        } catch (e) {
          caught = e;
        }
        await ctx.say(" Back.");
        await ctx.finish();
      },
    },
    async () => {
      await waitFor(sessionId, "run.finished", runId);
    },
  );
  assert.equal((caught as Error | undefined)?.message, "the sub-agent broke");
  const result = await narad.runs.join(sessionId, runId);
  assert.deepEqual(result.violations.map(String), []);
  const events = await historyOf(sessionId);
  const billing = `${runId}.billing.run`;
  const started = ofType(events, "run.started").filter((e) => e["parentRunId"] === runId);
  assert.deepEqual(
    started.map((e) => [e["runId"], e["clientExecutorId"], e["input"]]),
    [
      [billing, "desk-nested", { agent: "billing" }],
      [`${runId}.2.run`, "desk-nested", undefined],
    ],
  );
  assert.ok(events.every((e) => e.rootRunId === runId));
  assert.deepEqual(
    events.filter((e) => e.runId === billing).map((e) => e.type),
    ["run.started", "message.text.started", "message.text.delta", "message.text.completed", "tool.call.started", "tool.call.finished", "run.finished"],
  );
  assert.equal(saidBy(events, billing), "Billing here.");
  assert.equal(saidBy(events, runId), "Handing over. Back.");
  const failed = ofType(events, "run.error")[0] as Field;
  assert.deepEqual([failed["runId"], failed["code"], failed["message"]], [`${runId}.2.run`, "nested_run_failed", "the sub-agent broke"]);
  assert.equal(events[events.length - 1]?.type, "run.finished");
  assert.equal(events[events.length - 1]?.runId, runId);
});

test("nested: a stop of the run cancels its nested run first; a nested run an earlier holder left open is closed before the finish", async () => {
  const queue = newQueue();
  const stopped = await start(queue);
  const orphaned = await start(queue);
  await serving(
    {
      queue,
      handler: async (ctx) => {
        if (ctx.runId === orphaned.runId) {
          const orphan = `${ctx.runId}.lost.run`;
          await ctx.append([ctx.event("run.started", { runId: orphan, parentRunId: ctx.runId })]);
          await ctx.nested(async (child) => child.say("Still here."), { key: "kept" });
          await ctx.finish();
          return;
        }
        await ctx.nested(
          async (child) => {
            for (let i = 0; ; i++) {
              await child.say(`word${i} `);
              await new Promise((r) => setTimeout(r, 30));
            }
          },
          { key: "talker" },
        );
      },
    },
    async () => {
      await waitFor(stopped.sessionId, "message.text.delta", `${stopped.runId}.talker.run`);
      await narad.command("stop-run", { runId: stopped.runId });
      await waitFor(stopped.sessionId, "run.cancelled", stopped.runId);
      await waitFor(orphaned.sessionId, "run.finished", orphaned.runId);
    },
  );
  const events = await historyOf(stopped.sessionId);
  const talker = `${stopped.runId}.talker.run`;
  assert.deepEqual(
    events.slice(-3).map((e) => [e.type, e.runId]),
    [
      ["message.text.completed", talker],
      ["run.cancelled", talker],
      ["run.cancelled", stopped.runId],
    ],
  );
  const other = await historyOf(orphaned.sessionId);
  const lost = `${orphaned.runId}.lost.run`;
  assert.deepEqual(
    other.slice(-2).map((e) => [e.type, e.runId]),
    [
      ["run.cancelled", lost],
      ["run.finished", orphaned.runId],
    ],
  );
  assert.equal((ofType(other, "run.cancelled")[0] as Field)["code"], "runtime_lost");
  assert.equal(ofType(other, "run.finished").filter((e) => e["runId"] === `${orphaned.runId}.kept.run`).length, 1);
});

test("nested: a nested run waiting on a person is given back and entered again once answered, without a second run.started", { timeout: 60_000 }, async () => {
  const queue = newQueue();
  const { sessionId, runId } = await start(queue);
  const entered: string[] = [];
  await serving(
    {
      queue,
      releaseWhenWaiting: true,
      handler: async (ctx) => {
        await ctx.nested(
          async (child) => {
            entered.push(child.runId);
            await child.say("Reviewing.");
            const { decision } = await child.approve("Ship it?");
            await child.say(` ${decision}.`);
          },
          { key: "reviewer" },
        );
        await ctx.finish();
      },
    },
    async (runtime) => {
      const paused = await waitFor(sessionId, "run.paused");
      await until("the run given back", async () => (runtime.held.length === 0 ? true : undefined));
      const interrupt = ofType(paused, "interrupt.requested")[0] as Field;
      assert.equal(interrupt["runId"], `${runId}.reviewer.run`);
      await approver.command("resolve-interrupt", { interruptId: String(interrupt["interruptId"]), decision: "approve" });
      await waitFor(sessionId, "run.finished", runId);
    },
  );
  const child = `${runId}.reviewer.run`;
  assert.deepEqual(entered, [child, child]);
  const events = await historyOf(sessionId);
  assert.deepEqual(ofType(events, "run.started").map((e) => e["runId"]), [runId, child]);
  assert.equal(saidBy(events, child), "Reviewing. approve.");
  assert.deepEqual(ofType(events, "run.finished").map((e) => e["runId"]), [child, runId]);
});

test("a stop while an approval is awaited resolves the interrupt expired, resumes the run and cancels it", async () => {
  const queue = newQueue();
  const { sessionId, runId } = await start(queue);
  let thrown: unknown;
  await serving(
    {
      queue,
      handler: async (ctx) => {
        try {
          await ctx.approve("May I?");
        } catch (e) {
          thrown = e;
          throw e;
        }
      },
    },
    async () => {
      await waitFor(sessionId, "run.paused", runId);
      await narad.command("stop-run", { runId });
      await waitFor(sessionId, "run.cancelled", runId);
    },
  );
  assert.ok(thrown instanceof RunStopped);
  const events = await historyOf(sessionId);
  assert.deepEqual(
    events.map((e) => e.type).slice(-3),
    ["interrupt.resolved", "run.resumed", "run.cancelled"],
  );
  assert.equal(ofType(events, "interrupt.resolved")[0]?.["decision"], "expired");
});

// --- takeover ----------------------------------------------------------------

/**
 * A runtime in a process of its own (killed with SIGKILL by the test): its
 * handler looks something up (a backend tool), streams ANSWER word by word
 * (WORD_MS apart), asks for an approval, then says the decision and finishes.
 * It prints what it does, one line at a time.
 */
const HOLDER = `
const { NaradClient, Runtime } = await import(process.env.SDK);
const narad = new NaradClient({ servers: process.env.URL, token: process.env.TOKEN });
const say = (line) => process.stdout.write(line + "\\n");
async function* words(text, ms) {
  for (const [i, word] of text.split(" ").entries()) {
    yield i === 0 ? word : " " + word;
    await new Promise((r) => setTimeout(r, ms));
  }
}
const runtime = new Runtime(narad, {
  queue: process.env.QUEUE,
  waitMs: 1000,
  onError: (e) => say("error " + String(e)),
  handler: async (ctx) => {
    say("claimed " + ctx.attempt + " " + ctx.reason);
    const found = await ctx.tool("search", { q: "narad" }, () => {
      say("searched");
      return { hits: 3 };
    });
    await ctx.say(words(process.env.ANSWER, Number(process.env.WORD_MS)));
    const { decision, actor } = await ctx.approve("Publish it?");
    say("decided " + decision + " " + (actor && actor.sub));
    await ctx.say("Published, with " + found.hits + " sources.");
    await ctx.finish();
    say("finished");
  },
});
say("ready");
await runtime.run();
`;

interface Holder {
  lines: string[];
  kill(): Promise<void>;
}

function holder(queue: string, wordMs: number): Holder {
  const child = spawn(process.execPath, ["--input-type=module", "-e", HOLDER], {
    env: {
      ...process.env,
      SDK,
      URL: server.base,
      TOKEN: server.token("reader,writer,backend"),
      QUEUE: queue,
      ANSWER,
      WORD_MS: String(wordMs),
    },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const lines: string[] = [];
  let partial = "";
  child.stdout?.on("data", (d: Buffer) => {
    partial += d.toString();
    const whole = partial.split("\n");
    partial = whole.pop() ?? "";
    lines.push(...whole);
  });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  return {
    lines,
    async kill() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGKILL");
      }
      await exited;
    },
  };
}

const ANSWER = "The quick brown fox jumps over the lazy dog while the journal keeps every word once";

test("kill -9 mid-stream and while an approval waits: each next runtime carries on from the journal, and the answer is there once", { timeout: 90_000 }, async () => {
  const queue = newQueue();
  const { sessionId, runId } = await start(queue, { maxAttempts: 5 });
  const messageId = `${runId}.2.message`;
  const said = (events: AuthorityEvent[]) =>
    ofType(events, "message.text.delta")
      .filter((e) => e["messageId"] === messageId)
      .map((e) => String(e["delta"]));
  const holders: Holder[] = [];
  // Waits for `check`, failing at once should a runtime report a handler error (a 409, say).
  const watching = <T>(what: string, check: () => Promise<T | undefined>) =>
    until(
      what,
      async () => {
        const failed = holders.flatMap((h) => h.lines).find((l) => l.startsWith("error"));
        assert.equal(failed, undefined, `a runtime failed: ${failed}`);
        return check();
      },
      30,
    );
  const typed = (type: string) => async () => {
    const events = await historyOf(sessionId);
    return events.some((e) => e.type === type && e.runId === runId) ? events : undefined;
  };
  try {
    // The first runtime streams slowly and is killed once some words are out.
    const first = holder(queue, 150);
    holders.push(first);
    await watching("some words of the answer", async () =>
      said(await historyOf(sessionId)).join("").split(" ").length >= 3 ? true : undefined,
    );
    await first.kill();
    const before = said(await historyOf(sessionId)).join("");
    assert.ok(before.length < ANSWER.length, "killed mid-stream");

    // The second carries the message on after the lease lapses, asks, and is killed waiting.
    const second = holder(queue, 0);
    holders.push(second);
    await watching("run.paused", typed("run.paused"));
    await second.kill();

    // The person decides while no runtime holds the run; a third finishes it.
    await approver.command("resolve-interrupt", { interruptId: `${runId}.3.approval`, decision: "approve" });
    const third = holder(queue, 0);
    holders.push(third);
    await watching("run.finished", typed("run.finished"));
    await watching("the third runtime's last line", async () => (third.lines.includes("finished") ? true : undefined));

    assert.deepEqual(first.lines.slice(0, 3), ["ready", "claimed 1 started", "searched"]);
    assert.deepEqual(second.lines.slice(0, 2), ["ready", "claimed 2 retry"]);
    assert.deepEqual(third.lines, ["ready", "claimed 3 retry", "decided approve approver-ann", "finished"]);
    assert.equal(holders.flatMap((h) => h.lines).filter((l) => l === "searched").length, 1, "the search ran once");

    const events = await historyOf(sessionId);
    const deltas = said(events);
    assert.equal(deltas.join(""), ANSWER, "the answer is there once, whole");
    assert.ok(deltas.join("").startsWith(before), "carried on from where the first runtime stopped");
    assert.equal(ofType(events, "message.text.started").filter((e) => e["messageId"] === messageId).length, 1);
    assert.equal(ofType(events, "message.text.completed").filter((e) => e["messageId"] === messageId).length, 1);
    assert.equal(ofType(events, "tool.call.started").length, 1, "the finished search is not called again");
    assert.equal(ofType(events, "interrupt.requested").length, 1, "the approval is adopted, not asked again");
    assert.equal(ofType(events, "run.finished").length, 1);
    assert.equal(ofType(events, "message.text.delta").at(-1)?.["delta"], "Published, with 3 sources.");
  } finally {
    await Promise.all(holders.map((h) => h.kill()));
  }
});

// --- a restart of the only server --------------------------------------------

test("appends through the context survive a restart of the only server: the answer is there once", { timeout: 90_000 }, async () => {
  const own = await serve({});
  try {
    const client = new NaradClient({ servers: own.base, token: own.token("reader,writer,backend") });
    const queue = newQueue();
    const { sessionId } = await client.createSession({});
    const runId = "through-restart";
    await client.command("start-run", { sessionId, runId, runtime: { queue } });
    const errors: unknown[] = [];
    const words = ANSWER.split(" ").map((w, i) => (i === 0 ? w : ` ${w}`));
    const handler: RunHandler = async (ctx: RunContext) => {
      await ctx.say(slowly(words, 120));
      await ctx.finish();
    };
    const runtime = new Runtime(client, { queue, waitMs: 1000, handler, onError: (e) => errors.push(e) });
    const running = runtime.run();
    try {
      await until("the first words", async () => ((await historyOf(sessionId, client)).some((e) => e.type === "message.text.delta") ? true : undefined));
      await own.restart(1000);
      await until("run.finished", async () => ((await historyOf(sessionId, client).catch(() => [])).some((e) => e.type === "run.finished") ? true : undefined), 40);
    } finally {
      runtime.stop();
      await running;
    }
    assert.deepEqual(errors, [], "no error reached the handler");
    const events = await historyOf(sessionId, client);
    assert.equal(ofType(events, "message.text.delta").map((e) => e["delta"]).join(""), ANSWER);
    assert.equal(ofType(events, "message.text.started").length, 1);
  } finally {
    await own.stop();
  }
});

// --- one retry budget: the client's -------------------------------------------

/** A claim made by hand, for a context that claims nothing from a server. */
function handMadeClaim(runId: string): Claim {
  return {
    runId,
    sessionId: "s-by-hand",
    cursor: 0,
    attempt: 1,
    reason: "started",
    stopRequested: false,
    maxAttempts: 1,
    onLost: "fail",
    queue: "by-hand",
    lease: { leaseId: "lease-by-hand", expiresAt: new Date(Date.now() + 60_000).toISOString() },
  };
}

/** A fetch whose every connection is refused (nothing answers), counting its calls. */
function refusing(): { fetch: typeof fetch; calls: () => number } {
  let calls = 0;
  const fake = (async () => {
    calls += 1;
    throw new TypeError("fetch failed", { cause: Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:1"), { code: "ECONNREFUSED" }) });
  }) as typeof fetch;
  return { fetch: fake, calls: () => calls };
}

test("an append through servers that do not answer is tried again by the client alone, within the client's budget", { timeout: 10_000 }, async () => {
  const down = refusing();
  const client = new NaradClient({
    servers: "http://narad.test",
    token: "t",
    fetch: down.fetch,
    retry: { maxElapsedMs: 500, initialBackoffMs: 20, maxBackoffMs: 100 },
  });
  const ctx = new RunContext(client, handMadeClaim("r-budget"));
  const started = Date.now();
  await assert.rejects(ctx.append([ctx.event("run.finished", {})]), (e: unknown) => e instanceof UnavailableError && e.status === 0);
  const took = Date.now() - started;
  // The client's 0.5 s, not a budget of the context's on top of it.
  assert.ok(took >= 450 && took < 1500, `gave up after ${took} ms`);
  assert.ok(down.calls() >= 3, `tried ${down.calls()} times`);
  assert.equal(ctx.ended, false);
});

test("an append being tried again stops once the lease is lost", { timeout: 10_000 }, async () => {
  const down = refusing();
  // The client's default budget: 30 s.
  const client = new NaradClient({ servers: "http://narad.test", token: "t", fetch: down.fetch, retry: { initialBackoffMs: 20, maxBackoffMs: 100 } });
  const ctx = new RunContext(client, handMadeClaim("r-lost"));
  setTimeout(() => ctx._leaseRefused(), 300);
  const started = Date.now();
  await assert.rejects(ctx.append([ctx.event("run.finished", {})]), (e: unknown) => e instanceof LeaseLost);
  assert.ok(Date.now() - started < 1500, `stopped after ${Date.now() - started} ms`);
  assert.equal(ctx.lost(), true);
  const tries = down.calls();
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(down.calls(), tries, "nothing sent after");
});
