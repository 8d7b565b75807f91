// A tab is a client executor: a run calls a client tool, the tab runs it
// and its result becomes the run's tool.call.finished; the tab is reloaded
// while a second call runs, and nothing runs twice (the interrupted call is
// finished client_restarted, never run again).
import assert from "node:assert/strict";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { call, freePort, kill, launch, picture, startNarad, startSite, token } from "./harness.mjs";

async function finishedCalls(api, jwt, sessionId) {
  const page = await call(api, jwt, "GET", `/v1/sessions/${sessionId}/events?limit=1000`);
  return page.events.filter((e) => e.type === "tool.call.finished");
}

async function waitFor(what, check, seconds = 30) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const got = await check();
    if (got) {
      return got;
    }
    assert.ok(Date.now() < deadline, `no ${what} within ${seconds} s`);
    await sleep(100);
  }
}

test("a tab runs client tools once, across a reload mid-call", { timeout: 120_000 }, async () => {
  const apiPort = await freePort();
  const api = `http://127.0.0.1:${apiPort}`;
  const { site, origin } = await startSite();
  const narad = await startNarad(apiPort, origin);
  const browser = await launch();
  try {
    const writer = token("writer,backend");
    const session = await call(api, writer, "POST", "/v1/sessions", { title: "a tab executes" });
    const sid = session.sessionId;
    const executorId = `tab-${sid}`;
    await call(api, writer, "POST", "/v1/commands/start-run", { sessionId: sid, runId: "r1", clientExecutorId: executorId });
    const startCall = (toolCallId, args) =>
      call(api, writer, "POST", `/v1/sessions/${sid}/events`, {
        events: [
          {
            protocolVersion: "narad/v1",
            type: "tool.call.started",
            eventId: `${sid}-${toolCallId}`,
            rootRunId: "r1",
            runId: "r1",
            toolCallId,
            toolName: "math.add",
            executor: "client",
            args,
          },
        ],
      });

    const tab = await browser.newPage();
    const errors = [];
    tab.on("pageerror", (e) => errors.push(String(e)));
    const q = new URLSearchParams({ api, token: token("executor"), executor: executorId });
    await tab.goto(`${origin}/executor-tab.html?${q}`);
    await tab.waitForFunction(() => window.attached >= 1, null, { timeout: 20_000 });

    // 1. A call runs in the tab; its result is the run's.
    await startCall("tc1", { a: 2, b: 3 });
    const first = await waitFor("tc1's finish", async () =>
      (await finishedCalls(api, writer, sid)).find((e) => e.toolCallId === "tc1"),
    );
    assert.equal(first.outcome, "success");
    assert.deepEqual(first.response, { sum: 5 });

    // 2. A long call; the tab is reloaded while it runs.
    await startCall("tc2", { a: 1, b: 1, ms: 5000 });
    await tab.waitForFunction(() => JSON.parse(localStorage.getItem("ran") ?? "[]").includes("tc2"), null, {
      timeout: 20_000,
    });
    await tab.reload();
    await tab.waitForFunction(() => window.attached >= 1, null, { timeout: 20_000 });
    const second = await waitFor("tc2's finish", async () =>
      (await finishedCalls(api, writer, sid)).find((e) => e.toolCallId === "tc2"),
    );
    assert.equal(second.outcome, "error");
    assert.equal(second.code, "client_restarted");
    await sleep(6000); // the interrupted call's 5 s would be over by now
    const ran = await tab.evaluate(() => JSON.parse(localStorage.getItem("ran") ?? "[]"));
    await picture(tab, "executor-tab");
    assert.deepEqual(ran, ["tc1", "tc2"], "each call ran once, none again after the reload");
    const finished = await finishedCalls(api, writer, sid);
    assert.deepEqual(
      finished.map((e) => e.toolCallId),
      ["tc1", "tc2"],
      "one finish per call",
    );
    assert.deepEqual(errors, []);
  } finally {
    await browser.close();
    await kill(narad);
    site.close();
  }
});
