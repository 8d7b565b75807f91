// The runtime loop against a running narad (NARAD_URL, NARAD_TOKEN with
// the roles reader, writer and backend; .ci/typescript-sdk sets them).
import assert from "node:assert/strict";
import { test } from "node:test";

import { NaradClient, Runtime } from "../src/index.js";
import type { AuthorityEvent, RunContext } from "../src/index.js";
import { until } from "./support.js";

const url = process.env["NARAD_URL"];
const token = process.env["NARAD_TOKEN"];
if (!url || !token) {
  throw new Error("set NARAD_URL and NARAD_TOKEN: these tests run against a narad server");
}

async function historyOf(narad: NaradClient, sessionId: string): Promise<AuthorityEvent[]> {
  const all: AuthorityEvent[] = [];
  for await (const e of narad.allHistory(sessionId)) {
    all.push(e);
  }
  return all;
}

test("a runtime claims a queued run, answers, finishes and releases it; a stop reaches it", async () => {
  const narad = new NaradClient({ servers: url, token });
  const queue = `q-${Date.now()}-${Math.random().toString(36).slice(2)}`;
  const seen: string[] = [];
  let held: () => void = () => {};
  const longHeld = new Promise<void>((resolve) => (held = resolve));
  const handler = async (ctx: RunContext): Promise<void> => {
    const { runId, sessionId } = ctx.claim;
    for await (const event of ctx.history()) {
      seen.push(event.type);
    }
    const base = { protocolVersion: "narad/v1" as const, rootRunId: runId, runId };
    if (runId.startsWith("long")) {
      // Works until asked to stop, then closes the run.
      held();
      await new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve()));
      assert.ok(ctx.stopRequested());
      await ctx.append([{ ...base, type: "run.cancelled", eventId: `${runId}-cancelled` }]);
      return;
    }
    await ctx.append([
      { ...base, type: "message.text.started", eventId: `${runId}-1`, messageId: `${runId}-m`, role: "assistant", messageScope: "run" },
      { ...base, type: "message.text.delta", eventId: `${runId}-2`, messageId: `${runId}-m`, delta: "Done." },
      { ...base, type: "message.text.completed", eventId: `${runId}-3`, messageId: `${runId}-m` },
      { ...base, type: "run.finished", eventId: `${runId}-4` },
    ]);
    assert.equal(sessionId.length > 0, true);
  };
  const runtime = new Runtime(narad, { handler, queue, waitMs: 1000 });
  const running = runtime.run();
  try {
    const session = await narad.createSession({});
    const sid = session.sessionId;
    await narad.command("start-run", { sessionId: sid, runId: "quick", runtime: { queue } });
    const finished = await until("run.finished", async () =>
      (await historyOf(narad, sid)).find((e) => e.type === "run.finished"),
    );
    assert.equal(finished.runId, "quick");
    assert.ok(seen.includes("run.started"), `the handler read the run's start: ${seen}`);

    await narad.command("start-run", { sessionId: sid, runId: "long", runtime: { queue } });
    await longHeld;
    await narad.command("stop-run", { runId: "long" });
    const cancelled = await until("run.cancelled", async () =>
      (await historyOf(narad, sid)).find((e) => e.type === "run.cancelled" && e.runId === "long"),
    );
    assert.equal(cancelled.eventId, "long-cancelled", "the runtime, not the server, closed it");
  } finally {
    runtime.stop();
    await running;
  }
});

test("a handler that throws is reported to onError, or logged, never swallowed", async () => {
  const narad = new NaradClient({ servers: url, token });
  const queue = `q-${Date.now()}-${Math.random().toString(36).slice(2)}`;
  const reported: [unknown, string][] = [];
  const runtime = new Runtime(narad, {
    queue,
    waitMs: 1000,
    handler: async () => {
      throw new Error("the model provider is down");
    },
    onError: (error, claim) => reported.push([error, claim.runId]),
  });
  const running = runtime.run();
  try {
    const session = await narad.createSession({});
    await narad.command("start-run", { sessionId: session.sessionId, runId: "fails", runtime: { queue } });
    await until("the failure reported", async () => (reported.length > 0 ? true : undefined));
    assert.equal(reported[0]![1], "fails");
    assert.match(String(reported[0]![0]), /the model provider is down/);
  } finally {
    runtime.stop();
    await running;
  }

  // Without a hook: a line on console.error naming the run.
  const logged: unknown[][] = [];
  const original = console.error;
  console.error = (...args: unknown[]) => void logged.push(args);
  const quiet = new Runtime(narad, {
    queue: `${queue}-2`,
    waitMs: 1000,
    handler: async () => {
      throw new Error("boom");
    },
  });
  const serving = quiet.run();
  try {
    const session = await narad.createSession({});
    await narad.command("start-run", { sessionId: session.sessionId, runId: "logged", runtime: { queue: `${queue}-2` } });
    await until("the failure logged", async () => (logged.length > 0 ? true : undefined));
  } finally {
    console.error = original;
    quiet.stop();
    await serving;
  }
  assert.match(String(logged[0]![0]), /run logged .*failed/);
  assert.match(String(logged[0]![1]), /boom/);
});
