// The AI SDK adapter (@narad/client/ai-sdk) against a narad server of its
// own (NARAD_BIN, else this checkout's target/debug/narad, on a fresh
// database of NARAD_TEST_DATABASE_URL; runtime leases of two seconds so
// that a killed runtime's run is taken over soon), with the AI SDK's own
// mock language model (MockLanguageModelV4 of `ai/test`) scripting the
// model's streams. Each run: its terminal, no append refused (no handler
// error, no violation of the reducer), and the transcript the SDK's reducer
// makes of the journal is the text the AI SDK produced.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";

import { jsonSchema, tool } from "ai";
import { MockLanguageModelV4, simulateReadableStream } from "ai/test";

import { Executor, MemoryTokenStore, NaradClient, Runtime } from "../src/index.js";
import type { AuthorityEvent, RunResult, TranscriptItem } from "../src/index.js";
import { aiSdkHandler, errorCode } from "../src/ai-sdk.js";
import type { AiSdkHandlerOptions } from "../src/ai-sdk.js";
import { until } from "./support.js";

const ADMIN_URL = process.env["NARAD_TEST_DATABASE_URL"] ?? "postgres://postgres@127.0.0.1:5432/postgres";
const SECRET = "typescript-ai-sdk-test-hs256-secret-of-32-bytes-or-more";
const BINARY = process.env["NARAD_BIN"] ?? fileURLToPath(new URL("../../../../target/debug/narad", import.meta.url));
const PACKAGE = fileURLToPath(new URL("../..", import.meta.url)); // clients/typescript
const BUILT = fileURLToPath(new URL("../src", import.meta.url)); // dist-test/src
const EXAMPLE = join(PACKAGE, "..", "..", "examples", "ai_sdk_agent.mjs");

// --- a server of our own ----------------------------------------------------

function psql(sql: string): void {
  const done = spawnSync("psql", ["-X", "-q", "-v", "ON_ERROR_STOP=1", ADMIN_URL, "-c", sql], { encoding: "utf8" });
  if (done.status !== 0) {
    throw new Error(`psql ${sql}: ${done.stderr || done.error}`);
  }
}

let child: ChildProcess;
let base = "";
let database = "";
let work = "";
let env: NodeJS.ProcessEnv = {};
const tokens = new Map<string, string>();

function token(roles: string, sub = "ai-sdk"): string {
  const key = `${roles}/${sub}`;
  if (!tokens.has(key)) {
    const made = spawnSync(BINARY, ["token", "--org", "ts-ai-sdk", "--sub", sub, "--roles", roles], { env, encoding: "utf8" });
    assert.equal(made.status, 0, made.stderr);
    tokens.set(key, made.stdout.trim());
  }
  return tokens.get(key) as string;
}

let narad: NaradClient;
let approver: NaradClient;

before(async () => {
  if (!existsSync(BINARY)) {
    throw new Error(`no narad binary at ${BINARY}: build it (cargo build -p narad-server --bin narad) or set NARAD_BIN`);
  }
  database = `narad_ts_ai_sdk_${process.pid}_${Math.random().toString(36).slice(2, 10)}`;
  psql(`create database ${database}`);
  work = mkdtempSync(join(tmpdir(), "narad-ts-ai-sdk-"));
  env = {
    ...process.env,
    NARAD_JWT_HS256_SECRET: SECRET,
    NARAD_DATABASE_URL: `${ADMIN_URL.slice(0, ADMIN_URL.lastIndexOf("/"))}/${database}`,
    NARAD_HOME: join(work, "home"),
    NARAD_SHUTDOWN_GRACE_MS: "500",
    NARAD_RUNTIME_LEASE_TTL_MS: "2000",
    NARAD_RUNTIME_SWEEP_MS: "200",
    RUST_LOG: "warn",
  };
  base = await new Promise<string>((resolve, reject) => {
    child = spawn(BINARY, ["serve"], { env: { ...env, NARAD_LISTEN: "127.0.0.1:0" }, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    const timer = setTimeout(() => reject(new Error(`narad serve did not start within 60 s:\n${out}`)), 60_000);
    child.stdout?.on("data", (d: Buffer) => {
      out += d.toString();
      const served = /narad is serving on (\S+)/.exec(out);
      if (served) {
        clearTimeout(timer);
        resolve(served[1] as string);
      }
    });
    child.stderr?.resume();
    child.on("exit", (code) => reject(new Error(`narad serve exited (${code}) before serving:\n${out}`)));
  });
  narad = new NaradClient({ servers: base, token: token("reader,writer,backend") });
  approver = new NaradClient({ servers: base, token: token("reader,approver", "approver-ann") });
});

after(async () => {
  if (child && child.exitCode === null) {
    child.kill("SIGTERM");
    await new Promise((r) => child.once("exit", r));
  }
  if (database) psql(`drop database if exists ${database} with (force)`);
  if (work) rmSync(work, { recursive: true, force: true });
});

// --- a scripted model ----------------------------------------------------------

/** A part of a model's stream (the provider specification's `LanguageModelV4StreamPart`). */
type Part = Awaited<ReturnType<MockLanguageModelV4["doStream"]>>["stream"] extends ReadableStream<infer P> ? P : never;

const USAGE = (input: number, output: number) => ({
  inputTokens: { total: input, noCache: input, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: output, text: output, reasoning: undefined },
});

function text(id: string, ...deltas: string[]): Part[] {
  return [{ type: "text-start", id }, ...deltas.map((delta): Part => ({ type: "text-delta", id, delta })), { type: "text-end", id }];
}

function reasoning(id: string, ...deltas: string[]): Part[] {
  return [{ type: "reasoning-start", id }, ...deltas.map((delta): Part => ({ type: "reasoning-delta", id, delta })), { type: "reasoning-end", id }];
}

function call(toolCallId: string, toolName: string, input: unknown): Part {
  return { type: "tool-call", toolCallId, toolName, input: JSON.stringify(input) };
}

function finish(reason: "stop" | "tool-calls", input = 10, output = 5): Part {
  return { type: "finish", finishReason: { unified: reason, raw: undefined }, usage: USAGE(input, output) };
}

/**
 * A mock model answering by turn: the model's nth call of a run (the
 * assistant messages its prompt holds) streams `turns[n]`, `delayMs` apart.
 * Answering by the prompt, not by a counter, it answers a replayed call as
 * before, in any process.
 */
function scripted(turns: Part[][], delayMs = 0): MockLanguageModelV4 {
  return new MockLanguageModelV4({
    doStream: async ({ prompt }) => {
      const turn = prompt.filter((m) => m.role === "assistant").length;
      const chunks = turns[turn] ?? [...text("late", "(no more turns)"), finish("stop")];
      return { stream: simulateReadableStream({ chunks, chunkDelayInMs: delayMs, initialDelayInMs: null }) };
    },
  });
}

// --- runs ---------------------------------------------------------------------

let queues = 0;
function newQueue(): string {
  queues += 1;
  return `ai${queues}-${Math.random().toString(36).slice(2, 8)}`;
}

/** What the AI SDK produced: the text of each step (via onStepFinish). */
function producedBy(options: AiSdkHandlerOptions): { options: AiSdkHandlerOptions; texts: string[] } {
  const texts: string[] = [];
  return {
    texts,
    options: {
      ...options,
      settings: {
        ...options.settings,
        onStepFinish: (step: { text: string }) => {
          if (step.text !== "") texts.push(step.text);
        },
      },
    },
  };
}

/** Serves `options` on a queue of its own while `body` runs; answers what the runtime reported and what body answered. */
async function serving<T>(options: AiSdkHandlerOptions, body: (queue: string) => Promise<T>): Promise<{ errors: unknown[]; value: T }> {
  const queue = newQueue();
  const errors: unknown[] = [];
  const runtime = new Runtime(narad, { queue, waitMs: 1000, handler: aiSdkHandler(options), onError: (e) => errors.push(e) });
  const running = runtime.run();
  try {
    return { errors, value: await body(queue) };
  } finally {
    runtime.stop();
    await running;
  }
}

async function historyOf(sessionId: string): Promise<AuthorityEvent[]> {
  const all: AuthorityEvent[] = [];
  for await (const e of narad.allHistory(sessionId)) all.push(e);
  return all;
}

type Field = { readonly [field: string]: unknown };
const fieldOf = (event: AuthorityEvent, name: string): unknown => (event as unknown as Field)[name];
const ofType = (events: AuthorityEvent[], type: string) => events.filter((e) => e.type === type) as unknown as Field[];

/** The assistant messages of the run's transcript, as text. */
function said(items: TranscriptItem[]): string[] {
  return items.filter((i) => i.item === "message" && i.role === "assistant").map((i) => String((i as { content: unknown }).content));
}

/** Checks what every run must: no refusal (no runtime error, no violation), every message complete. */
function accepted(result: RunResult, errors: unknown[]): void {
  assert.deepEqual(errors.map(String), [], "the runtime met no error (no refused append)");
  assert.deepEqual(result.violations.map(String), [], "the reducer accepts the journal");
  for (const item of result.output) assert.ok(item.completed, `complete: ${JSON.stringify(item)}`);
}

async function session(): Promise<string> {
  return (await narad.createSession({})).sessionId;
}

// --- the tests ------------------------------------------------------------------

test("a streamed answer: reasoning and text journaled in the run's scope, totalUsage on run.finished", async () => {
  const model = scripted([[...reasoning("r1", "The user ", "greets."), ...text("t1", "Hello", ", ", "world!"), finish("stop", 12, 7)]]);
  const { options, texts } = producedBy({ model, instructions: "Be brief." });
  const sessionId = await session();
  const { errors, value: result } = await serving(options, (queue) => narad.runs.wait({ sessionId, message: "Hi", queue }));
  assert.equal(result.status, "finished");
  accepted(result, errors);
  assert.deepEqual(said(result.output), texts);
  assert.deepEqual(texts, ["Hello, world!"]);
  const thoughts = result.output.filter((i) => i.item === "reasoning").map((i) => (i as { text: string }).text);
  assert.deepEqual(thoughts, ["The user greets."]);
  assert.deepEqual(fieldOf(result.terminal, "usage"), { inputTokens: 12, outputTokens: 7, totalTokens: 19 });
  const started = ofType(result.events, "message.text.started")[0] as Field;
  assert.equal(started["messageId"], `${result.runId}.step0.text1.message`);
  assert.equal(started["messageScope"], "run");
  // The model saw the session's conversation: the user's message and the instructions.
  const prompt = model.doStreamCalls[0]?.prompt ?? [];
  assert.deepEqual(prompt.map((m) => m.role), ["system", "user"]);
});

test("a backend tool: keyed by the model's toolCallId, args and result journaled; a tool that throws finishes error tool_error and the model goes on", async () => {
  let runs = 0;
  const tools = {
    weather: tool({
      description: "The weather in a city",
      inputSchema: jsonSchema<{ city: string }>({ type: "object", properties: { city: { type: "string" } }, required: ["city"] }),
      execute: async ({ city }) => {
        runs += 1;
        return { city, celsius: 21 };
      },
    }),
    broken: tool({
      description: "Always fails",
      inputSchema: jsonSchema<{ q?: string }>({ type: "object", properties: { q: { type: "string" } } }),
      execute: async (): Promise<{ written: boolean }> => {
        throw new Error("the disk is full");
      },
    }),
  };
  const model = scripted([
    [...text("t1", "Let me check."), call("call-w", "weather", { city: "Oslo" }), call("call-b", "broken", {}), finish("tool-calls")],
    [...text("t2", "It is 21 °C in Oslo."), finish("stop")],
  ]);
  const { options, texts } = producedBy({ model, tools });
  const sessionId = await session();
  const { errors, value: result } = await serving(options, (queue) => narad.runs.wait({ sessionId, message: "Weather in Oslo?", queue }));
  assert.equal(result.status, "finished");
  accepted(result, errors);
  assert.equal(runs, 1);
  assert.deepEqual(said(result.output), texts);
  assert.deepEqual(texts, ["Let me check.", "It is 21 °C in Oslo."]);
  const runId = result.runId;
  assert.deepEqual(
    ofType(result.events, "tool.call.started").map((e) => [e["toolCallId"], e["toolName"], e["executor"], e["args"]]),
    [
      [`${runId}.call-w.tool`, "weather", "backend", { city: "Oslo" }],
      [`${runId}.call-b.tool`, "broken", "backend", {}],
    ],
  );
  const finished = new Map(ofType(result.events, "tool.call.finished").map((e) => [e["toolCallId"], e]));
  assert.deepEqual(finished.get(`${runId}.call-w.tool`)?.["response"], { city: "Oslo", celsius: 21 });
  assert.deepEqual([finished.get(`${runId}.call-b.tool`)?.["outcome"], finished.get(`${runId}.call-b.tool`)?.["code"]], ["error", "tool_error"]);
  // The text said before the calls completed before them.
  const types = result.events.map((e) => e.type);
  assert.ok(types.indexOf("message.text.completed") < types.indexOf("tool.call.started"), types.join(" "));
  // The model got the result and the error.
  const toolMessage = model.doStreamCalls[1]?.prompt.find((m) => m.role === "tool");
  assert.match(JSON.stringify(toolMessage), /celsius/);
  assert.match(JSON.stringify(toolMessage), /the disk is full/);
  assert.deepEqual(fieldOf(result.terminal, "usage"), { inputTokens: 20, outputTokens: 10, totalTokens: 30 });
});

test("a client tool runs on the run's executor and its result goes back to the model", async () => {
  const executorId = `desk-${Math.random().toString(36).slice(2, 8)}`;
  let attached = false;
  const executor = new Executor(new NaradClient({ servers: base, token: token("executor", "desk") }), {
    id: executorId,
    store: new MemoryTokenStore(),
    maxBackoffMs: 500,
    onAttached: () => (attached = true),
    tools: { "clock.now": (args) => ({ now: "2026-12-06T10:00:00Z", tz: (args as { tz?: string }).tz ?? "?" }) },
  });
  const executing = executor.run();
  try {
    await until("the executor attached", async () => (attached ? true : undefined));
    const tools = {
      "clock.now": tool({
        description: "The time on the user's desk",
        inputSchema: jsonSchema<{ tz: string }>({ type: "object", properties: { tz: { type: "string" } } }),
        outputSchema: jsonSchema<{ now: string }>({ type: "object", properties: { now: { type: "string" } } }),
      }),
    };
    const model = scripted([[call("call-c", "clock.now", { tz: "UTC" }), finish("tool-calls")], [...text("t", "It is 10:00 UTC."), finish("stop")]]);
    const { options, texts } = producedBy({ model, tools, clientTools: ["clock.now"] });
    const sessionId = await session();
    const { errors, value: result } = await serving(options, (queue) => narad.runs.wait({ sessionId, message: "Time?", queue, clientExecutorId: executorId }));
    assert.equal(result.status, "finished");
    accepted(result, errors);
    assert.deepEqual(said(result.output), texts);
    const started = ofType(result.events, "tool.call.started")[0] as Field;
    assert.deepEqual([started["toolCallId"], started["executor"], started["args"]], [`${result.runId}.call-c.client`, "client", { tz: "UTC" }]);
    assert.match(JSON.stringify(model.doStreamCalls[1]?.prompt), /2026-12-06T10:00:00Z/);
  } finally {
    executor.stop();
    await executing;
  }
});

/** A model that wants to delete a file (a tool that needs approval), then says what happened. */
function deleting() {
  let deleted = 0;
  const tools = {
    remove: tool({
      description: "Deletes a file",
      inputSchema: jsonSchema<{ path: string }>({ type: "object", properties: { path: { type: "string" } } }),
      needsApproval: true,
      execute: async ({ path }) => {
        deleted += 1;
        return { deleted: path };
      },
    }),
  };
  const model = new MockLanguageModelV4({
    doStream: async ({ prompt }) => {
      const result = JSON.stringify(prompt.filter((m) => m.role === "tool"));
      const chunks: Part[] =
        prompt.some((m) => m.role === "tool")
          ? [...text("t2", /execution-denied/.test(result) ? "I left it." : "Deleted."), finish("stop")]
          : [...text("t1", "I will delete it."), call("call-rm", "remove", { path: "/tmp/x" }), finish("tool-calls")];
      return { stream: simulateReadableStream({ chunks, chunkDelayInMs: 0, initialDelayInMs: null }) };
    },
  });
  return { tools, model, deleted: () => deleted };
}

for (const decision of ["approve", "deny"] as const) {
  test(`an approval round trip (${decision}): needsApproval ↔ a narad interrupt, the decision fed back as tool-approval-response`, async () => {
    const { tools, model, deleted } = deleting();
    const { options, texts } = producedBy({ model, tools, approval: (c) => ({ message: `Delete ${(c.input as { path: string }).path}?`, title: "Delete" }) });
    const sessionId = await session();
    const { errors, value: result } = await serving(options, async (queue) => {
      const waiting = narad.runs.wait({ sessionId, message: "Delete /tmp/x", queue });
      const paused = await until("run.paused", async () => {
        const events = await historyOf(sessionId);
        return events.some((e) => e.type === "run.paused") ? events : undefined;
      });
      const interrupt = ofType(paused, "interrupt.requested")[0] as Field;
      assert.equal(interrupt["message"], "Delete /tmp/x?");
      assert.deepEqual(interrupt["input"], { toolName: "remove", args: { path: "/tmp/x" } });
      await approver.command("resolve-interrupt", { interruptId: String(interrupt["interruptId"]), decision });
      return waiting;
    });
    assert.equal(result.status, "finished");
    accepted(result, errors);
    assert.equal(deleted(), decision === "approve" ? 1 : 0);
    assert.deepEqual(said(result.output), texts);
    assert.deepEqual(texts, ["I will delete it.", decision === "approve" ? "Deleted." : "I left it."]);
    const runId = result.runId;
    assert.equal((ofType(result.events, "interrupt.requested")[0] as Field)["interruptId"], `${runId}.call-rm.approval`);
    assert.deepEqual(
      ofType(result.events, "tool.call.started").map((e) => e["toolCallId"]),
      decision === "approve" ? [`${runId}.call-rm.tool`] : [],
    );
    const types = result.events.map((e) => e.type).filter((t) => t.startsWith("interrupt") || t.startsWith("run.") || t.startsWith("tool"));
    assert.deepEqual(types, [
      "run.started",
      "interrupt.requested",
      "run.paused",
      "interrupt.resolved",
      "run.resumed",
      ...(decision === "approve" ? ["tool.call.started", "tool.call.finished"] : []),
      "run.finished",
    ]);
  });
}

test("releaseWhenWaiting: a client tool and an approval round trip with the run given back meanwhile, with a model whose ids change on every call: asked nothing twice", { timeout: 60_000 }, async () => {
  const executorId = `desk-${Math.random().toString(36).slice(2, 8)}`;
  let attached = false;
  let open: () => void = () => undefined;
  const gate = new Promise<void>((resolve) => (open = resolve));
  const executor = new Executor(new NaradClient({ servers: base, token: token("executor", "desk") }), {
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
  let deleted = 0;
  const tools = {
    "clock.now": tool({
      description: "The time on the user's desk",
      inputSchema: jsonSchema<{ tz?: string }>({ type: "object" }),
      outputSchema: jsonSchema<{ now: string }>({ type: "object", properties: { now: { type: "string" } } }),
    }),
    remove: tool({
      description: "Deletes a file",
      inputSchema: jsonSchema<{ path: string }>({ type: "object", properties: { path: { type: "string" } } }),
      needsApproval: true,
      execute: async ({ path }) => {
        deleted += 1;
        return { deleted: path };
      },
    }),
  };
  // By turn, under ids of its own on every call: what a real provider does.
  let calls = 0;
  const model = new MockLanguageModelV4({
    doStream: async ({ prompt }) => {
      calls += 1;
      const turn = prompt.filter((m) => m.role === "assistant").length;
      const chunks: Part[] =
        turn === 0
          ? [...text(`t${calls}`, "Checking the time."), call(`call-${calls}`, "clock.now", { tz: "UTC" }), finish("tool-calls")]
          : turn === 1
            ? [call(`call-${calls}`, "remove", { path: "/tmp/x" }), finish("tool-calls")]
            : [...text(`t${calls}`, /execution-denied/.test(JSON.stringify(prompt)) ? "Left it." : "Deleted at 10:00."), finish("stop")];
      return { stream: simulateReadableStream({ chunks, chunkDelayInMs: 0, initialDelayInMs: null }) };
    },
  });
  const { options, texts } = producedBy({ model, tools, clientTools: ["clock.now"] });
  const inner = aiSdkHandler(options);
  const claims: string[] = [];
  const errors: unknown[] = [];
  const queue = newQueue();
  const runtime = new Runtime(narad, {
    queue,
    waitMs: 1000,
    releaseWhenWaiting: true,
    onError: (e) => errors.push(e),
    handler: async (ctx) => {
      claims.push(ctx.reason);
      await inner(ctx);
    },
  });
  const running = runtime.run();
  try {
    await until("the executor attached", async () => (attached ? true : undefined));
    const sessionId = await session();
    const runId = `r-${Math.random().toString(36).slice(2, 10)}`;
    await narad.command("record-user-message", { sessionId, messageId: `${runId}-m`, messageScope: "session", content: "Delete /tmp/x" });
    await narad.command("start-run", { sessionId, runId, runtime: { queue }, clientExecutorId: executorId });
    await until("the client call", async () => (ofType(await historyOf(sessionId), "tool.call.started").length > 0 ? true : undefined));
    await until("the run given back while the executor works", async () => (runtime.held.length === 0 ? true : undefined));
    open();
    const paused = await until("run.paused", async () => {
      const events = await historyOf(sessionId);
      return events.some((e) => e.type === "run.paused") ? events : undefined;
    });
    await until("the run given back while a person decides", async () => (runtime.held.length === 0 ? true : undefined));
    const interrupt = ofType(paused, "interrupt.requested")[0] as Field;
    await approver.command("resolve-interrupt", { interruptId: String(interrupt["interruptId"]), decision: "approve" });
    const result = await narad.runs.join(sessionId, runId);
    assert.equal(result.status, "finished");
    accepted(result, errors);
    assert.equal(calls, 3, "the model was asked once per turn, never again after a release");
    assert.equal(deleted, 1);
    assert.deepEqual(texts, ["Checking the time.", "Deleted at 10:00."]);
    assert.deepEqual(said(result.output), texts);
    assert.deepEqual(
      ofType(result.events, "tool.call.started").map((e) => [e["toolName"], e["executor"]]),
      [
        ["clock.now", "client"],
        ["remove", "backend"],
      ],
    );
    assert.equal(ofType(result.events, "interrupt.requested").length, 1);
    assert.match(JSON.stringify(model.doStreamCalls[1]?.prompt), /10:00/, "the executor's result reached the model");
    assert.equal(claims[0], "started");
    assert.ok(claims.length >= 3 && claims.slice(1).every((r) => r === "event"), `claimed again on the answers: ${claims.join(" ")}`);
    assert.deepEqual(fieldOf(result.terminal, "usage"), { inputTokens: 30, outputTokens: 15, totalTokens: 45 });
  } finally {
    open();
    runtime.stop();
    await running;
    executor.stop();
    await executing;
  }
});

test("a stop mid-stream aborts streamText: the message completes with what was said, run.cancelled with partial usage", async () => {
  const words = Array.from({ length: 200 }, (_, i) => `word${i} `);
  const model = scripted([[...text("t1", ...words), finish("stop")]], 30);
  const sessionId = await session();
  const { errors, value: result } = await serving({ model }, async (queue) => {
    const waiting = narad.runs.wait({ sessionId, message: "Talk", queue });
    await until("some words", async () => ((await historyOf(sessionId)).some((e) => e.type === "message.text.delta") ? true : undefined));
    const runId = (ofType(await historyOf(sessionId), "run.started")[0] as Field)["runId"] as string;
    await narad.command("stop-run", { runId });
    return waiting;
  });
  assert.equal(result.status, "cancelled");
  accepted(result, errors);
  assert.equal(fieldOf(result.terminal, "code"), "stopped");
  const cut = said(result.output)[0] ?? "";
  assert.ok(cut.startsWith("word0 ") && cut.length < words.join("").length, `cut short: ${cut.length}`);
  // No step finished before the stop: no usage counted, none invented.
  assert.equal(fieldOf(result.terminal, "usage"), undefined);
});

test("a model error ends the run run.error with a code and the usage of the steps before it", async () => {
  const tools = {
    lookup: tool({
      description: "Looks up",
      inputSchema: jsonSchema<{ q?: string }>({ type: "object", properties: { q: { type: "string" } } }),
      execute: async () => ({ found: true }),
    }),
  };
  let calls = 0;
  const model = new MockLanguageModelV4({
    doStream: async () => {
      calls += 1;
      if (calls === 1) {
        return { stream: simulateReadableStream({ chunks: [...text("t1", "Looking."), call("c1", "lookup", {}), finish("tool-calls", 8, 3)], chunkDelayInMs: 0, initialDelayInMs: null }) };
      }
      throw Object.assign(new Error("upstream said no"), { name: "AI_APICallError" });
    },
  });
  const { options, texts } = producedBy({ model, tools, settings: { maxRetries: 0 } });
  const sessionId = await session();
  const { errors, value: result } = await serving(options, (queue) => narad.runs.wait({ sessionId, message: "Go", queue }));
  assert.equal(result.status, "error");
  accepted(result, errors);
  assert.deepEqual(said(result.output), texts);
  assert.equal(fieldOf(result.terminal, "code"), "api_call_error");
  assert.doesNotMatch(String(fieldOf(result.terminal, "message")), /upstream/, "the provider's text stays out of the journal");
  assert.deepEqual(fieldOf(result.terminal, "usage"), { inputTokens: 8, outputTokens: 3, totalTokens: 11 });
  assert.equal(errorCode(new Error("x")), "model_error");
  assert.equal(errorCode(Object.assign(new Error("x"), { name: "AI_NoSuchToolError" })), "no_such_tool_error");
});

// --- takeover -------------------------------------------------------------------

/**
 * A runtime in a process of its own (killed with SIGKILL by the test): the
 * adapter with a scripted model that looks something up (a backend tool,
 * printing "searched" when it runs), then streams ANSWER word by word
 * (WORD_MS apart). It prints a line when it claims a run.
 */
const HOLDER = `
const { NaradClient, Runtime } = await import(process.env.SDK + "/index.js");
const { aiSdkHandler } = await import(process.env.SDK + "/ai-sdk.js");
const { jsonSchema, tool } = await import("ai");
const { MockLanguageModelV4, simulateReadableStream } = await import("ai/test");
const say = (line) => process.stdout.write(line + "\\n");
const usage = { inputTokens: { total: 10, noCache: 10 }, outputTokens: { total: 5, text: 5 } };
// IDS=fresh: a real provider's ids, new on every call (a replayed call is answered under other ids).
let calls = 0;
const id = (base) => (process.env.IDS === "fresh" ? base + "-" + process.pid + "-" + ++calls : base);
const words = process.env.ANSWER.split(" ").map((w, i) => (i === 0 ? w : " " + w));
const model = new MockLanguageModelV4({
  doStream: async ({ prompt }) => {
    const chunks = prompt.some((m) => m.role === "tool")
      ? ((a) => [{ type: "text-start", id: a }, ...words.map((delta) => ({ type: "text-delta", id: a, delta })), { type: "text-end", id: a },
         { type: "finish", finishReason: { unified: "stop" }, usage }])(id("a"))
      : [{ type: "tool-call", toolCallId: id("call-s"), toolName: "search", input: "{}" }, { type: "finish", finishReason: { unified: "tool-calls" }, usage }];
    return { stream: simulateReadableStream({ chunks, chunkDelayInMs: Number(process.env.WORD_MS), initialDelayInMs: null }) };
  },
});
const tools = { search: tool({ inputSchema: jsonSchema({ type: "object" }), execute: async () => { say("searched"); return { hits: 3 }; } }) };
const narad = new NaradClient({ servers: process.env.URL, token: process.env.TOKEN });
const handler = aiSdkHandler({ model, tools });
const runtime = new Runtime(narad, {
  queue: process.env.QUEUE, waitMs: 1000,
  onError: (e) => say("error " + String(e)),
  handler: async (ctx) => { say("claimed " + ctx.attempt); await handler(ctx); say("finished"); },
});
await runtime.run();
`;

function holder(queue: string, wordMs: number, answer: string, ids: "fixed" | "fresh" = "fixed"): { lines: string[]; kill(): Promise<void> } {
  const proc = spawn(process.execPath, ["--input-type=module", "-e", HOLDER], {
    cwd: PACKAGE,
    env: { ...process.env, SDK: new URL("../src", import.meta.url).href, URL: base, TOKEN: token("reader,writer,backend"), QUEUE: queue, ANSWER: answer, WORD_MS: String(wordMs), IDS: ids },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const lines: string[] = [];
  let partial = "";
  proc.stdout?.on("data", (d: Buffer) => {
    partial += d.toString();
    const whole = partial.split("\n");
    partial = whole.pop() ?? "";
    lines.push(...whole);
  });
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
  return {
    lines,
    async kill() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
      await exited;
    },
  };
}

test("kill -9 of the runtime mid-answer: the next one replays, the finished tool is not run again and the answer is there once, whole", { timeout: 90_000 }, async () => {
  const answer = "The journal keeps every word of this answer once, whatever happens to the runtime that streams it";
  const queue = newQueue();
  const sessionId = await session();
  const runId = `r-${Math.random().toString(36).slice(2, 10)}`;
  await narad.command("record-user-message", { sessionId, messageId: `${runId}-m`, messageScope: "session", content: "Search, then answer" });
  await narad.command("start-run", { sessionId, runId, runtime: { queue, onLost: "retry", maxAttempts: 4 } });
  const messageId = `${runId}.step1.text0.message`;
  const deltas = (events: AuthorityEvent[]) => ofType(events, "message.text.delta").filter((e) => e["messageId"] === messageId).map((e) => String(e["delta"]));
  const first = holder(queue, 120, answer);
  let second: ReturnType<typeof holder> | undefined;
  try {
    await until("some words", async () => (deltas(await historyOf(sessionId)).join("").split(" ").length >= 3 ? true : undefined), 30);
    await first.kill();
    const before = deltas(await historyOf(sessionId)).join("");
    assert.ok(before.length < answer.length, "killed mid-answer");
    second = holder(queue, 0, answer);
    const done = second;
    await until("run.finished", async () => ((await historyOf(sessionId)).some((e) => e.type === "run.finished") ? true : undefined), 40);
    await until("the second runtime's last line", async () => (done.lines.includes("finished") ? true : undefined));
    assert.deepEqual(first.lines.slice(0, 2), ["claimed 1", "searched"]);
    assert.deepEqual(second.lines, ["claimed 2", "finished"], "the second runtime never searched");
    const result = await narad.runs.join(sessionId, runId);
    assert.equal(result.status, "finished");
    assert.deepEqual(result.violations.map(String), []);
    const events = result.events;
    assert.equal(deltas(events).join(""), answer, "the answer is there once, whole");
    assert.ok(deltas(events).join("").startsWith(before), "carried on from where the first runtime stopped");
    assert.equal(ofType(events, "message.text.started").length, 1);
    assert.equal(ofType(events, "message.text.completed").length, 1);
    assert.equal(ofType(events, "tool.call.started").length, 1, "the finished search is not called again");
    assert.deepEqual(said(result.output), [answer]);
    assert.equal(ofType(events, "run.finished").length, 1);
  } finally {
    await first.kill();
    await second?.kill();
  }
});

/** Starts a run of `queue` after a user's message; answers its session and run. */
async function queued(queue: string, content: string): Promise<{ sessionId: string; runId: string }> {
  const sessionId = await session();
  const runId = `r-${Math.random().toString(36).slice(2, 10)}`;
  await narad.command("record-user-message", { sessionId, messageId: `${runId}-m`, messageScope: "session", content });
  await narad.command("start-run", { sessionId, runId, runtime: { queue, onLost: "retry", maxAttempts: 4 } });
  return { sessionId, runId };
}

test("kill -9 after a tool step, with a model whose ids change on every call: the next runtime resumes from the state document, the tool runs once and no text is written twice", { timeout: 90_000 }, async () => {
  const answer = "A provider answers a replayed call under new ids, so the journal alone cannot tell what was done";
  const queue = newQueue();
  const { sessionId, runId } = await queued(queue, "Search, then answer");
  const messageId = `${runId}.step1.text0.message`;
  const deltas = (events: AuthorityEvent[]) => ofType(events, "message.text.delta").filter((e) => e["messageId"] === messageId).map((e) => String(e["delta"]));
  const first = holder(queue, 120, answer, "fresh");
  let second: ReturnType<typeof holder> | undefined;
  try {
    await until("some words", async () => (deltas(await historyOf(sessionId)).join("").split(" ").length >= 3 ? true : undefined), 30);
    await first.kill();
    const killed = await historyOf(sessionId);
    const before = deltas(killed).join("");
    assert.ok(before.length < answer.length, "killed mid-answer");
    second = holder(queue, 0, answer, "fresh");
    const done = second;
    await until("run.finished", async () => ((await historyOf(sessionId)).some((e) => e.type === "run.finished") ? true : undefined), 40);
    await until("the second runtime's last line", async () => (done.lines.includes("finished") ? true : undefined));
    assert.deepEqual(first.lines.slice(0, 2), ["claimed 1", "searched"]);
    assert.deepEqual(second.lines, ["claimed 2", "finished"], "the second runtime never searched");
    const result = await narad.runs.join(sessionId, runId);
    assert.equal(result.status, "finished");
    assert.deepEqual(result.violations.map(String), []);
    const events = result.events;
    assert.equal(ofType(events, "tool.call.started").length, 1, "the search ran once");
    assert.equal(deltas(events).join(""), answer, "the answer is there once, whole");
    assert.ok(deltas(events).join("").startsWith(before), "carried on from where the first runtime stopped");
    assert.equal(ofType(events, "message.text.started").length, 1);
    assert.equal(ofType(events, "message.text.completed").length, 1);
    const texts = said(result.output);
    assert.deepEqual(texts, [answer]);
    assert.equal(new Set(texts).size, texts.length, "no text twice");
    assert.equal(ofType(events, "run.finished").length, 1);
    // Usage: the search step (the first runtime's, kept) and the answer step (the second's).
    assert.deepEqual(fieldOf(result.terminal, "usage"), { inputTokens: 20, outputTokens: 10, totalTokens: 30 });
    // What the second runtime resumed from: the messages of the step that searched, kept at its boundary in the run's own document.
    const kept = ofType(killed, "state.snapshot").filter((e) => e["scope"] === `ai-sdk/${runId}`);
    assert.equal(kept.length, 1, "one step boundary passed");
    assert.deepEqual(
      (kept[0]?.["state"] as { messages: { role: string }[] }).messages.map((m) => m.role),
      ["assistant", "tool"],
    );
  } finally {
    await first.kill();
    await second?.kill();
  }
});

test("kill -9 mid-answer and a replay that answers otherwise: the half message is completed as it stands, the new answer goes out once under the next id", { timeout: 90_000 }, async () => {
  const answer = "Alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike";
  const other = "Something else entirely";
  const queue = newQueue();
  const { sessionId, runId } = await queued(queue, "Search, then answer");
  const messageId = `${runId}.step1.text0.message`;
  const deltas = (events: AuthorityEvent[]) => ofType(events, "message.text.delta").filter((e) => e["messageId"] === messageId).map((e) => String(e["delta"]));
  const first = holder(queue, 150, answer, "fresh");
  let second: ReturnType<typeof holder> | undefined;
  try {
    await until("some words", async () => (deltas(await historyOf(sessionId)).join("").split(" ").length >= 3 ? true : undefined), 30);
    await first.kill();
    const before = deltas(await historyOf(sessionId)).join("");
    second = holder(queue, 0, other, "fresh");
    await until("run.finished", async () => ((await historyOf(sessionId)).some((e) => e.type === "run.finished") ? true : undefined), 40);
    const result = await narad.runs.join(sessionId, runId);
    assert.equal(result.status, "finished");
    assert.deepEqual(result.violations.map(String), []);
    assert.equal(ofType(result.events, "tool.call.started").length, 1, "the search ran once");
    assert.deepEqual(said(result.output), [before, other]);
    for (const item of result.output) assert.ok(item.completed, `complete: ${JSON.stringify(item)}`);
  } finally {
    await first.kill();
    await second?.kill();
  }
});

test("a state document that cannot be read back ends the run run.error no_resumable_state", async () => {
  const { stateScope, NO_RESUMABLE_STATE } = await import("../src/ai-sdk.js");
  let asked = 0;
  const model = new MockLanguageModelV4({
    doStream: async () => {
      asked += 1;
      return { stream: simulateReadableStream({ chunks: [...text("t", "Never."), finish("stop")], chunkDelayInMs: 0, initialDelayInMs: null }) };
    },
  });
  const inner = aiSdkHandler({ model });
  const queue = newQueue();
  const errors: unknown[] = [];
  const runtime = new Runtime(narad, {
    queue,
    waitMs: 1000,
    onError: (e) => errors.push(e),
    handler: async (ctx) => {
      await ctx.setState({ version: 1, step: 1, messages: [{ role: "bogus" }], usage: {} }, { scope: stateScope(ctx.runId) });
      await inner(ctx);
    },
  });
  const running = runtime.run();
  try {
    const { sessionId, runId } = await queued(queue, "Hi");
    const result = await narad.runs.join(sessionId, runId);
    assert.equal(result.status, "error");
    assert.equal(fieldOf(result.terminal, "code"), NO_RESUMABLE_STATE);
    assert.deepEqual(result.violations.map(String), []);
  } finally {
    runtime.stop();
    await running;
  }
  assert.equal(asked, 0, "the model was not asked");
  assert.deepEqual(errors.map(String), []);
});

// --- the example ----------------------------------------------------------------------

test("examples/ai_sdk_agent.mjs runs as written with its mock model and ends its run finished", { timeout: 60_000 }, async () => {
  // A project where "@narad/client" is this build and "ai" the installed one.
  const project = mkdtempSync(join(tmpdir(), "narad-ai-sdk-example-"));
  try {
    const pkg = join(project, "node_modules", "@narad", "client");
    mkdirSync(pkg, { recursive: true });
    symlinkSync(BUILT, join(pkg, "src"));
    writeFileSync(
      join(pkg, "package.json"),
      JSON.stringify({ name: "@narad/client", type: "module", exports: { ".": "./src/index.js", "./ai-sdk": "./src/ai-sdk.js" } }),
    );
    symlinkSync(join(PACKAGE, "node_modules", "ai"), join(project, "node_modules", "ai"));
    cpSync(EXAMPLE, join(project, "agent.mjs"));
    const run = spawnSync(process.execPath, ["agent.mjs"], {
      cwd: project,
      env: { ...process.env, NARAD_URL: base, NARAD_TOKEN: token("reader,writer,backend"), OPENAI_API_KEY: "", ANTHROPIC_API_KEY: "" },
      encoding: "utf8",
      timeout: 50_000,
    });
    assert.equal(run.status, 0, `${run.stdout}\n${run.stderr}`);
    assert.equal(run.stderr, "");
    const lines = run.stdout.trim().split("\n");
    assert.equal(lines.at(-1), "finished", run.stdout);
    assert.ok(dirname(EXAMPLE).endsWith("examples"));
  } finally {
    rmSync(project, { recursive: true, force: true });
  }
});

// --- keyed steps, and what the package's main entry loads ------------------------

test("keyed steps: a key names a tool call whatever its position; another tool under a recorded key is ReplayDiverged, and the adapter ends such a run replay_diverged", async () => {
  const { ReplayDiverged } = await import("../src/ai-sdk.js");
  let ran = 0;
  let diverged: unknown;
  const inner = aiSdkHandler({
    model: scripted([[call("call-x", "weather", { city: "Oslo" }), finish("tool-calls")], [...text("t", "Never said."), finish("stop")]]),
    tools: { weather: tool({ inputSchema: jsonSchema<{ city: string }>({ type: "object" }), execute: async () => ({ celsius: 1 }) }) },
  });
  const queue = newQueue();
  const errors: unknown[] = [];
  const runtime = new Runtime(narad, {
    queue,
    waitMs: 1000,
    onError: (e) => errors.push(e),
    handler: async (ctx) => {
      const first = await ctx.tool("lookup", { q: 1 }, () => ({ n: ++ran }), { key: "call-x" });
      const again = await ctx.tool("lookup", { q: 1 }, () => ({ n: ++ran }), { key: "call-x" });
      assert.deepEqual([first, again], [{ n: 1 }, { n: 1 }], "the recorded result, not a second run");
      await assert.rejects(ctx.tool("lookup", {}, () => null, { key: "12" }), RangeError);
      diverged = await ctx.tool("other", {}, () => ++ran, { key: "call-x" }).catch((e: unknown) => e);
      await inner(ctx); // the model calls "weather" as call-x, which the journal holds as "lookup"
    },
  });
  const running = runtime.run();
  try {
    const sessionId = await session();
    const runId = `r-${Math.random().toString(36).slice(2, 10)}`;
    await narad.command("start-run", { sessionId, runId, runtime: { queue }, input: { prompt: "Weather?" } });
    const result = await narad.runs.join(sessionId, runId);
    assert.equal(result.status, "error");
    assert.equal(fieldOf(result.terminal, "code"), "replay_diverged");
    assert.deepEqual(result.violations.map(String), []);
    assert.deepEqual(ofType(result.events, "tool.call.started").map((e) => e["toolCallId"]), [`${runId}.call-x.tool`]);
  } finally {
    runtime.stop();
    await running;
  }
  assert.ok(diverged instanceof ReplayDiverged, `ReplayDiverged: ${String(diverged)}`);
  assert.equal(diverged.stepId, `${diverged.stepId.split(".")[0]}.call-x.tool`);
  assert.equal(ran, 1);
  assert.deepEqual(errors.map(String), []);
});

test("the package's main entry never loads ai: only @narad/client/ai-sdk imports it", async () => {
  const { readFileSync } = await import("node:fs");
  const seen = new Set<string>();
  const imports: string[] = [];
  const walk = (file: string) => {
    if (seen.has(file)) return;
    seen.add(file);
    const source = readFileSync(file, "utf8");
    for (const m of source.matchAll(/(?:import|export)\s[^;]*?from\s+"([^"]+)"|import\("([^"]+)"\)/g)) {
      const spec = (m[1] ?? m[2]) as string;
      imports.push(spec);
      if (spec.startsWith(".")) walk(join(dirname(file), spec));
    }
  };
  walk(join(BUILT, "index.js"));
  walk(join(BUILT, "node.js"));
  assert.ok(seen.size > 10, `read ${seen.size} modules`);
  assert.deepEqual(imports.filter((s) => !s.startsWith(".") && !s.startsWith("node:")), [], "no package imported");
  assert.ok(![...seen].some((f) => f.endsWith("ai-sdk.js")));
});
