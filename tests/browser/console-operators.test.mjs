// The console as operators use it every day, in Chromium against a real
// server: every entry with its time (relative, exact on hover), tool calls
// with their latency, runs with their duration and token usage, usage
// summed per session; and the defects an outside test found: the session's
// dot after a SIGKILL (D1), a sign-in link pasted into an open tab (D3), a
// refused token (D4), the outage banner and a command sent meanwhile
// (D5/D6), tabs and the way back from an event's address (D8), the events
// filter's scroll position (D9), the favicon (D10); search of what was
// said, with its filters; and usage priced with the operator's table.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { call, freePort, kill, launch, picture, startNarad, token } from "./harness.mjs";

/** Appends `events` (proposals without sequences) to `sessionId` as a backend. */
function append(api, jwt, sessionId, events) {
  return call(api, jwt, "POST", `/v1/sessions/${sessionId}/events`, {
    events: events.map((e, i) => ({ protocolVersion: "narad/v1", eventId: `${sessionId}-${e.type}-${Date.now()}-${i}`, ...e })),
  });
}

/** A run of one tool call and one answer, with `usage` on its terminal; waits between the steps so that times differ. */
async function timedRun(api, jwt, sessionId, runId, usage, input) {
  const run = { runId, rootRunId: runId };
  await append(api, jwt, sessionId, [{ type: "run.started", ...run, ...(input === undefined ? {} : { input }) }]);
  await sleep(300);
  await append(api, jwt, sessionId, [
    { type: "tool.call.started", ...run, toolCallId: `${runId}-call`, toolName: "lookup", executor: "backend", args: { q: "weather" } },
  ]);
  await sleep(250);
  await append(api, jwt, sessionId, [
    { type: "tool.call.finished", ...run, toolCallId: `${runId}-call`, outcome: "success", response: { sky: "clear" } },
    { type: "message.text.started", ...run, messageId: `${runId}-m`, role: "assistant", messageScope: "run" },
    { type: "message.text.delta", ...run, messageId: `${runId}-m`, delta: "The sky is clear." },
    { type: "message.text.completed", ...run, messageId: `${runId}-m` },
    { type: "run.finished", ...run, usage },
  ]);
}

/**
 * A test of the console: narad on a port of its own, a token for `org`
 * with `roles`, and a Chromium page of `viewport` (not yet navigated);
 * `body` gets them, with `stop()` (SIGKILL) and `restart()` of the server.
 * Any error the page throws fails the test; everything is closed after.
 */
function consoleTest(name, { roles, org = "browser", viewport = { width: 1100, height: 800 }, timeout = 120_000, env = {} }, body) {
  test(name, { timeout }, async () => {
    const port = await freePort();
    const api = `http://127.0.0.1:${port}`;
    let narad = await startNarad(port, "http://127.0.0.1:1", env);
    const person = token(roles, "tester", org);
    const browser = await launch();
    try {
      const page = await browser.newPage({ viewport });
      const errors = [];
      page.on("pageerror", (e) => errors.push(String(e)));
      await body({
        api,
        person,
        page,
        stop: () => kill(narad),
        restart: async () => {
          narad = await startNarad(port, "http://127.0.0.1:1", env);
        },
      });
      assert.deepEqual(errors, []);
    } finally {
      await browser.close();
      await kill(narad);
    }
  });
}

consoleTest("times, latencies, durations and usage in a session", { roles: "reader,writer,approver,backend" }, async ({ api, person, page }) => {
  const session = await call(api, person, "POST", "/v1/sessions", { title: "timed" });
  await timedRun(api, person, session.sessionId, "run-a", { inputTokens: 1200, outputTokens: 340 });
  await page.goto(`${api}/console/#token=${person}`);
  await page.locator(`tr[data-session="${session.sessionId}"]`).getByRole("link").click({ timeout: 15_000 });
  await page.getByRole("heading", { name: "timed" }).waitFor();

  // The tool call's latency: from its start to its result (≥ the 250 ms waited).
  const latency = await page.locator("article.tool .latency").textContent({ timeout: 15_000 });
  const ms = /^(\d+) ms$/.exec(latency.trim())?.[1] ?? (/^([\d.]+) s$/.exec(latency.trim())?.[1] ?? "0") * 1000;
  assert.ok(Number(ms) >= 240, `tool latency ${latency}`);
  // Each entry has its time: machine-readable, relative, exact on hover.
  const times = await page.$$eval("time.when", (els) => els.map((e) => [e.getAttribute("datetime"), e.textContent, e.getAttribute("title")]));
  assert.ok(times.length >= 3, `times shown: ${JSON.stringify(times)}`);
  for (const [at, relative, exact] of times) {
    assert.ok(!Number.isNaN(Date.parse(at)), `datetime ${at}`);
    assert.match(relative, /^\d+ (s|min|h|d) ago$/);
    assert.ok(exact && exact.length > 8, `exact time on hover: ${exact}`);
  }
  // The run: its duration (≥ the 550 ms waited) and its usage.
  const marker = page.locator('.run-marker[data-run="run-a"]');
  await marker.locator(".badge.finished").waitFor();
  assert.match(await marker.locator(".duration").textContent(), /^after (\d+ ms|[\d.]+ s)$/);
  assert.match(await marker.textContent(), /1,200 input tokens · 340 output tokens/);
  assert.match(await page.locator("[data-usage]").textContent(), /1,200 input tokens · 340 output tokens/);

  // A second run, answering a person's message, adds to the session's sum, live.
  await call(api, person, "POST", "/v1/commands/record-user-message", {
    sessionId: session.sessionId,
    messageScope: "session",
    content: "Will it rain in Lisbon tomorrow afternoon, and should I take an umbrella to the market?",
  });
  await timedRun(api, person, session.sessionId, "run-b", { inputTokens: 100, outputTokens: 60, cachedInputTokens: 40 });
  await page.locator("[data-usage]").getByText("1,300 input tokens · 400 output tokens · 40 cached input tokens").waitFor({ timeout: 15_000 });
  // Runs are named: by the message they answer, or by their input's title.
  await timedRun(api, person, session.sessionId, "run-c", {}, { title: "Weather check", city: "Lisbon" });
  assert.equal(await page.locator('.run-marker[data-run="run-a"] .run-name').count(), 0);
  assert.equal(
    await page.locator('.run-marker[data-run="run-b"] .run-name').textContent(),
    "“Will it rain in Lisbon tomorrow afternoon, and should I…” ",
  );
  await page.locator('.run-marker[data-run="run-c"] .run-name').getByText("“Weather check”").waitFor({ timeout: 15_000 });
  await page.locator('.run-marker[data-run="run-c"] details.run-input summary').click();
  assert.deepEqual(JSON.parse(await page.locator('.run-marker[data-run="run-c"] details.run-input pre').textContent()), {
    title: "Weather check",
    city: "Lisbon",
  });
  assert.match(await page.getByRole("complementary", { name: "Runs" }).textContent(), /run run-c\s*“Weather check”/);
  await picture(page, "console-times");

  // Export: the history as JSONL, each line an event as the API gives
  // it; a Markdown transcript with times, latencies and usage.
  const [jsonl] = await Promise.all([page.waitForEvent("download"), page.getByRole("button", { name: "Export JSONL" }).click()]);
  assert.equal(jsonl.suggestedFilename(), `narad-session-${session.sessionId}.jsonl`);
  const lines = readFileSync(await jsonl.path(), "utf8").trimEnd().split("\n").map((l) => JSON.parse(l));
  const history = await call(api, person, "GET", `/v1/sessions/${session.sessionId}/events?limit=1000`);
  assert.deepEqual(lines, history.events);
  const [md] = await Promise.all([page.waitForEvent("download"), page.getByRole("button", { name: "Export Markdown" }).click()]);
  const transcript = readFileSync(await md.path(), "utf8");
  assert.match(transcript, /^# timed\n/);
  assert.match(transcript, /## Run `run-a`: finished after \d+ ms · 1,200 input tokens · 340 output tokens/);
  assert.match(transcript, /- tool `lookup` \(backend\) · _[^_]+_: success in \d+ ms/);
  assert.match(transcript, /\*\*assistant\*\* · _[^_]+_\n\n> The sky is clear\./);
  assert.match(transcript, /## Run `run-c` “Weather check”: finished after \d+ ms/);
  assert.match(transcript, /Usage: 1,300 input tokens · 400 output tokens · 40 cached input tokens/);
});

consoleTest("the inbox: a count on the navigation, and a notification for those who opt in", { roles: "reader,writer,approver,backend", org: `inbox-${Date.now()}`, viewport: { width: 1000, height: 700 } }, async ({ api, person, page }) => {
  const session = await call(api, person, "POST", "/v1/sessions", { title: "needs a yes" });
  // The browser's notifications, recorded: granted, and each one kept.
  await page.addInitScript(() => {
    window.shown = [];
    window.Notification = class {
      static permission = "default";
      static async requestPermission() {
        window.Notification.permission = "granted";
        return "granted";
      }
      constructor(title, options) {
        window.shown.push({ title, body: options?.body });
      }
    };
  });
  await page.goto(`${api}/console/#token=${person}`);
  await page.getByRole("link", { name: "Approvals" }).click();
  await page.getByText("Nothing is waiting for a decision.").waitFor({ timeout: 15_000 });
  assert.equal(await page.locator(".top nav .count").count(), 0);
  await page.getByLabel("Notify me of new approvals").check();
  await picture(page, "console-approvals-notify");
  await page.getByRole("link", { name: "Sessions", exact: true }).click();

  const run = { runId: "run-q", rootRunId: "run-q" };
  await append(api, person, session.sessionId, [
    { type: "run.started", ...run },
    { type: "interrupt.requested", ...run, interruptId: "int-1", waitId: "w-1", kind: "approval", title: "Delete the logs", actions: ["approve", "deny"] },
    { type: "run.paused", ...run, waitId: "w-1", reason: "interrupt", resumeMode: "command", interruptId: "int-1" },
  ]);
  await page.locator('.top nav .count[data-waiting="1"]').waitFor({ timeout: 15_000 });
  assert.equal(await page.getByRole("link", { name: /^Approvals\s*,\s*1 waiting$/ }).count(), 1);
  await page.waitForFunction(() => window.shown.length === 1, null, { timeout: 5_000 });
  const [note] = await page.evaluate(() => window.shown);
  assert.equal(note.title, "An approval is waiting");
  assert.match(note.body, /Delete the logs — in needs a yes/);
  await picture(page, "console-inbox-count");

  // Decided elsewhere: the count goes, and nothing more is notified.
  await call(api, person, "POST", "/v1/commands/resolve-interrupt", { sessionId: session.sessionId, interruptId: "int-1", decision: "approve" });
  await page.locator(".top nav .count").waitFor({ state: "detached", timeout: 15_000 });
  assert.equal(await page.evaluate(() => window.shown.length), 1);
});

consoleTest("search: sessions found by what was said and answered, filtered, each passage linked to its event", { roles: "reader,writer,approver,backend", org: `search-${Date.now()}` }, async ({ api, person, page }) => {
  const say = (sessionId, content) => call(api, person, "POST", "/v1/commands/record-user-message", { sessionId, messageScope: "session", content });
  const billing = await call(api, person, "POST", "/v1/sessions", { title: "Billing" });
  const shipping = await call(api, person, "POST", "/v1/sessions", { title: "Shipping" });
  const approval = await call(api, person, "POST", "/v1/sessions", { title: "Refund approval" });
  await say(billing.sessionId, "Please refund order 42, it arrived broken");
  await say(shipping.sessionId, "Where is my parcel?");
  const run = { runId: "run-s", rootRunId: "run-s" };
  await append(api, person, approval.sessionId, [
    { type: "run.started", ...run },
    { type: "interrupt.requested", ...run, interruptId: "int-s", waitId: "w-s", kind: "approval", title: "Refund 120 EUR to the customer?", actions: ["approve", "deny"] },
    { type: "run.paused", ...run, waitId: "w-s", reason: "interrupt", resumeMode: "command", interruptId: "int-s" },
  ]);
  await page.goto(`${api}/console/#token=${person}`);
  await page.locator(`tr[data-session="${shipping.sessionId}"]`).waitFor({ timeout: 15_000 });

  // Words: stemmed, newest match first, the matched words marked.
  const box = page.getByRole("searchbox", { name: "Search sessions" });
  await box.fill("refunds");
  const results = page.getByRole("region", { name: "Search results" });
  await results.locator(`tr[data-session="${approval.sessionId}"]`).waitFor({ timeout: 10_000 });
  const found = await results.locator("tbody tr").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-session")));
  assert.deepEqual(found, [approval.sessionId, billing.sessionId]);
  assert.deepEqual(await results.locator(`tr[data-session="${billing.sessionId}"] mark`).allTextContents(), ["refund"]);
  assert.match(await results.locator(`tr[data-session="${approval.sessionId}"] .passages`).innerText(), /asked\s+Refund 120 EUR to the customer\?/);
  assert.match(await results.locator(`tr[data-session="${billing.sessionId}"] .passages`).innerText(), /tester said\s+Please refund order 42/);
  await picture(page, "console-search");

  // A filter: waiting on an approval leaves the session that waits.
  await page.getByLabel("Waiting on an approval").check();
  await results.locator(`tr[data-session="${billing.sessionId}"]`).waitFor({ state: "detached", timeout: 10_000 });
  assert.deepEqual(await results.locator("tbody tr").evaluateAll((rows) => rows.map((r) => r.getAttribute("data-session"))), [approval.sessionId]);
  await page.getByLabel("Waiting on an approval").uncheck();

  // Words with nothing to find say why nothing was found; a whole id opens its session.
  await box.fill("the");
  await results.getByRole("status").filter({ hasText: "no searchable word" }).waitFor({ timeout: 10_000 });
  assert.equal(await results.locator("tbody tr").count(), 0);
  await picture(page, "console-search-nothing");
  await box.fill(shipping.sessionId);
  await page.getByText("has this id").getByRole("link", { name: "Shipping" }).waitFor({ timeout: 10_000 });

  // A passage opens its event in the session.
  await box.fill("broken");
  await results.locator(`tr[data-session="${billing.sessionId}"] .passages a`).click({ timeout: 10_000 });
  await page.waitForFunction((id) => location.hash.startsWith(`#/sessions/${id}/events/`), billing.sessionId, { timeout: 10_000 });
  await page.getByRole("heading", { name: "Billing" }).waitFor({ timeout: 10_000 });
});

consoleTest("a run's trace: nested runs, tool calls, an interrupt and its pause on one timeline, live", { roles: "reader,writer,approver,backend", org: `trace-${Date.now()}` }, async ({ api, person, page }) => {
  const { sessionId: sid } = await call(api, person, "POST", "/v1/sessions", { title: "traced" });
  const top = { runId: "run-t", rootRunId: "run-t" };
  const nested = { runId: "run-n", rootRunId: "run-t", parentRunId: "run-t" };
  await append(api, person, sid, [{ type: "run.started", ...top, input: { title: "Plan a trip" } }]);
  await sleep(200);
  await append(api, person, sid, [
    { type: "run.started", ...nested },
    { type: "tool.call.started", runId: "run-n", rootRunId: "run-t", toolCallId: "c-1", toolName: "search", executor: "backend", args: {} },
  ]);

  await page.goto(`${api}/console/#token=${person}`);
  await page.locator(`tr[data-session="${sid}"]`).getByRole("link").click({ timeout: 15_000 });
  await page.getByRole("tab", { name: "Trace" }).click();
  const trace = page.getByRole("region", { name: "Trace of run run-t" });
  // Live: the tool call goes on, its bar open and its time still counting.
  const call1 = trace.locator('tr[data-span="tool:c-1"]');
  await call1.waitFor({ timeout: 15_000 });
  assert.match(await call1.getAttribute("class"), /\bopen\b/);
  assert.match(await call1.locator("td").nth(2).textContent(), /…$/);
  await sleep(300);
  await append(api, person, sid, [
    { type: "tool.call.finished", runId: "run-n", rootRunId: "run-t", toolCallId: "c-1", outcome: "success", response: {} },
    { type: "run.finished", ...nested },
    { type: "interrupt.requested", ...top, interruptId: "i-1", waitId: "w-1", kind: "approval", title: "Book it?", actions: ["approve", "deny"] },
    { type: "run.paused", ...top, waitId: "w-1", reason: "interrupt", resumeMode: "command", interruptId: "i-1" },
  ]);
  await trace.locator('tr[data-span="tool:c-1"]:not(.open)').waitFor({ timeout: 10_000 });
  await sleep(300);
  await call(api, person, "POST", "/v1/commands/resolve-interrupt", { sessionId: sid, interruptId: "i-1", decision: "approve" });
  await trace.locator('tr[data-span="interrupt:i-1"] .badge.approve').waitFor({ timeout: 10_000 });

  // The rows, in the order they began, nested under their runs.
  const rows = await trace.locator("tbody tr").evaluateAll((trs) => trs.map((tr) => [tr.dataset.span, tr.querySelector("td").style.paddingLeft]));
  assert.deepEqual(
    rows.map(([k]) => k).slice(0, 5),
    ["run:run-t", "run:run-n", "tool:c-1", "interrupt:i-1", "pause:run-t:w-1"],
  );
  assert.ok(parseFloat(rows[1][1]) > parseFloat(rows[0][1]) && parseFloat(rows[2][1]) > parseFloat(rows[1][1]), "nested deeper");
  assert.match(await trace.locator('tr[data-span="run:run-t"]').textContent(), /“Plan a trip”/);
  assert.match(await trace.locator('tr[data-span="interrupt:i-1"]').textContent(), /by tester/);
  // The tool call took ≥ 300 ms, its bar inside the run's.
  const took = await call1.locator("td").nth(2).textContent();
  const tookMs = took.endsWith(" ms") ? Number.parseInt(took, 10) : Number.parseFloat(took) * 1000;
  assert.ok(/^(\d+ ms|[\d.]+ s)$/.test(took) && tookMs >= 290, took);
  const [runBar, toolBar] = await Promise.all(
    ["run:run-n", "tool:c-1"].map((k) => trace.locator(`tr[data-span="${k}"] .bar`).boundingBox()),
  );
  assert.ok(toolBar.x >= runBar.x - 1 && toolBar.x + toolBar.width <= runBar.x + runBar.width + 1, "the call's bar lies within its run's");
  await picture(page, "console-trace");

  // A span leads to its event.
  await call1.getByRole("link").click();
  await page.waitForURL(/\/events\//);
  // The page follows the address on its next render.
  await page.locator('#tab-events[aria-selected="true"]').waitFor({ timeout: 5_000 });
  assert.match(await page.getByRole("region", { name: "The selected event" }).textContent(), /tool\.call\.started/);
});

consoleTest("state over time, and the conversation as it stood at an event", { roles: "reader,writer,backend" }, async ({ api, person, page }) => {
  const session = await call(api, person, "POST", "/v1/sessions", { title: "stateful" });
  const sid = session.sessionId;
  await append(api, person, sid, [{ type: "state.snapshot", scope: "plan", revision: 1, state: { steps: [] } }]);
  const [early] = (
    await append(api, person, sid, [
      { type: "state.delta", scope: "plan", baseRevision: 1, revision: 2, patch: [{ op: "add", path: "/steps/-", value: "look" }] },
    ])
  ).events;
  await timedRun(api, person, sid, "run-s", { outputTokens: 5 });
  const [late] = (
    await append(api, person, sid, [
      { type: "state.delta", scope: "plan", baseRevision: 2, revision: 3, patch: [{ op: "add", path: "/steps/-", value: "answer" }] },
    ])
  ).events;
  await page.goto(`${api}/console/#token=${person}`);
  await page.locator(`tr[data-session="${sid}"]`).getByRole("link").click({ timeout: 15_000 });
  await page.getByRole("heading", { name: "stateful" }).waitFor();

  // The State tab: the document now, its three revisions with their deltas, and revision 2 whole.
  await page.getByRole("tab", { name: "State" }).click();
  const history = page.locator('details.revisions[data-scope="plan"]');
  await history.locator("summary").getByText("3 revisions").click();
  assert.deepEqual(JSON.parse(await history.locator("[data-document-at]").textContent()), { steps: ["look", "answer"] });
  assert.match(await history.locator("li").nth(1).textContent(), /"op":"add","path":"\/steps\/-","value":"look"/);
  await history.getByRole("button", { name: "revision 2" }).click();
  assert.equal(await history.locator("[data-revision-shown]").textContent(), "2");
  assert.deepEqual(JSON.parse(await history.locator("[data-document-at]").textContent()), { steps: ["look"] });
  await history.getByRole("button", { name: "revision 1" }).click();
  assert.deepEqual(JSON.parse(await history.locator("[data-document-at]").textContent()), { steps: [] });
  await picture(page, "console-state-revisions");

  // The conversation as it stood: before the run, nothing; after it, the answer.
  await page.goto(`${api}/console/#/sessions/${sid}/events/${early.eventId}`);
  await page.getByText(`The conversation as it stood after #${early.sessionSequence}`).click();
  await page.locator(".as-it-stood").getByText("No message yet.").waitFor();
  await page.goto(`${api}/console/#/sessions/${sid}/events/${late.eventId}`);
  await page.getByText(`The conversation as it stood after #${late.sessionSequence}`).click();
  assert.match(await page.locator(".as-it-stood li").first().textContent(), /^assistant: The sky is clear\.$/);
});

consoleTest("operations over time: charts of the figures read, and runtimes per queue", { roles: "reader,writer,backend,admin", org: `ops-${Date.now()}`, viewport: { width: 1100, height: 900 } }, async ({ api, person: admin, page }) => {
  // A run held by runtime rt-ops from queue q-ops.
  const session = await call(api, admin, "POST", "/v1/sessions", { title: "queued" });
  await call(api, admin, "POST", "/v1/commands/start-run", { sessionId: session.sessionId, runId: "run-ops", runtime: { queue: "q-ops" } });
  const claimed = await call(api, admin, "POST", "/v1/runtime/claims", { queue: "q-ops", runtimeId: "rt-ops" });
  assert.equal(claimed.runId, "run-ops");

  await page.goto(`${api}/console/#token=${admin}`);
  await page.getByRole("link", { name: "Operations" }).click();
  await page.locator('tr[data-queue="q-ops"] [data-runtimes]').getByText("rt-ops (1)").waitFor({ timeout: 15_000 });

  // Appends while the page reads every two seconds: the appended-events
  // rate's chart gathers readings, and its highest is above zero.
  const until = Date.now() + 7_000;
  for (let i = 0; Date.now() < until; i++) {
    await append(api, admin, session.sessionId, [{ type: "session.custom", name: "ops.note", value: { i } }]);
    await sleep(50);
  }
  const chart = page.getByRole("img", { name: /^events appended per second: \d+ readings/ });
  await chart.waitFor({ timeout: 10_000 });
  const described = await chart.getAttribute("aria-label");
  const [, readings, highest] = /: (\d+) readings, .* highest ([\d.]+)$/.exec(described);
  assert.ok(Number(readings) >= 3, described);
  assert.ok(Number(highest) > 1, described);
  assert.ok((await chart.locator("polyline").getAttribute("points")).split(" ").length >= 3);
  await picture(page, "console-operations-charts");
});

consoleTest("the defects D1, D3, D4, D5/D6, D8, D9, D10 stay mended", { roles: "reader,writer,approver,backend", viewport: { width: 1000, height: 700 }, timeout: 180_000 }, async ({ api, person, page, stop, restart }) => {
  const session = await call(api, person, "POST", "/v1/sessions", { title: "mended" });
  for (let i = 0; i < 6; i++) await timedRun(api, person, session.sessionId, `run-${i}`, { inputTokens: 10 });
  const missing = [];
  page.on("response", (r) => r.status() === 404 && missing.push(r.url()));

  // D10: the console names its icon; nothing it asks for is missing.
  await page.goto(`${api}/console/#token=${person}`);
  await page.getByRole("heading", { name: "Sessions" }).waitFor();
  assert.equal(await page.locator('link[rel="icon"]').count(), 1);

  // D3: a sign-in link opened in a tab already on the console signs in
  // with its token and takes it out of the address at once.
  const other = token("reader,writer", "second-person");
  await page.evaluate((t) => {
    location.hash = `#token=${t}`;
  }, other);
  await page.locator(".top .who").getByText("second-person").waitFor({ timeout: 5_000 });
  assert.ok(!page.url().includes(other), "the token left the address");
  await page.evaluate((t) => {
    location.hash = `#token=${t}`;
  }, person);
  await page.locator(".top .who").getByText("tester").waitFor({ timeout: 5_000 });

  // D8: the tabs answer arrow keys and name their panels; coming back
  // from an event's address shows the conversation and its message box.
  await page.goto(`${api}/console/#/sessions/${session.sessionId}`);
  await page.getByRole("heading", { name: "mended" }).waitFor();
  await page.getByRole("tab", { name: "Conversation" }).focus();
  await page.keyboard.press("ArrowRight");
  assert.equal(await page.getByRole("tab", { name: "Trace" }).getAttribute("aria-selected"), "true");
  await page.keyboard.press("ArrowRight");
  const events = page.getByRole("tab", { name: "Events" });
  assert.equal(await events.getAttribute("aria-selected"), "true");
  assert.ok(await events.evaluate((el) => el === document.activeElement), "the selected tab has the focus");
  assert.equal(await page.getByRole("tabpanel").getAttribute("aria-labelledby"), "tab-events");
  await page.keyboard.press("End");
  assert.equal(await page.getByRole("tab", { name: "State" }).getAttribute("aria-selected"), "true");
  await page.keyboard.press("Home");
  assert.equal(await page.getByRole("tab", { name: "Conversation" }).getAttribute("aria-selected"), "true");

  // D9: a new filter of the events list shows its matches from the first.
  await events.click();
  const rows = page.getByRole("navigation", { name: "Events" });
  await rows.locator("a.row").first().waitFor();
  await rows.evaluate((el) => {
    el.scrollTop = el.scrollHeight;
  });
  await page.getByLabel("Filter events by type").fill("tool.call");
  await page.waitForFunction(() => document.querySelector('nav[aria-label="Events"]')?.scrollTop === 0, null, { timeout: 5_000 });
  assert.match(await rows.locator("a.row").first().textContent(), /tool\.call/);
  await rows.locator("a.row").first().click();
  await page.waitForURL(/\/events\//);
  await page.goto(`${api}/console/#/sessions/${session.sessionId}`);
  await page.locator('#tab-conversation[aria-selected="true"]').waitFor({ timeout: 5_000 });
  await page.getByLabel("Say something").waitFor({ timeout: 5_000 });

  // D1: the session's dot says live only while its stream is.
  const dot = page.getByRole("status", { name: /session stream/ });
  await page.getByRole("status", { name: "session stream live" }).waitFor({ timeout: 10_000 });
  await stop();
  const killedAt = Date.now();
  await page.getByRole("status", { name: "session stream connecting" }).waitFor({ timeout: 5_000 });
  assert.ok(Date.now() - killedAt < 5_000, "the dot left live within 5 s");
  assert.equal(await page.locator("section.timeline").getAttribute("aria-busy"), "true");

  // D5/D6: the outage banner leaves the message box in the window; a
  // message sent meanwhile says it waits for the server (no raw
  // "TypeError"), and is sent once when the server is back.
  await page.getByText("The server does not answer").waitFor({ timeout: 10_000 });
  const box = await page.getByLabel("Say something").boundingBox();
  assert.ok(box && box.y + box.height <= 700, `the message box is in the window (${JSON.stringify(box)})`);
  await page.getByLabel("Say something").fill("are you there?");
  await page.getByRole("button", { name: "Send" }).click();
  await page.locator(".composer .sending").waitFor({ timeout: 5_000 });
  assert.doesNotMatch(await page.locator(".composer").textContent(), /TypeError|Failed to fetch/);
  await picture(page, "console-outage");

  await restart();
  await dot.and(page.getByRole("status", { name: "session stream live" })).waitFor({ timeout: 15_000 });
  // Sent: the message box empties, with no problem said, and the journal
  // holds the message once.
  await page.waitForFunction(() => document.querySelector("#say")?.value === "", null, { timeout: 30_000 });
  assert.equal(await page.locator(".composer .problem").count(), 0);
  const said = (await call(api, person, "GET", `/v1/sessions/${session.sessionId}/events?limit=1000`)).events.filter(
    (e) => e.type === "message.user.recorded" && e.content === "are you there?",
  );
  assert.equal(said.length, 1, "sent once");

  // D4: a badly signed token goes back to signing in, with the server's
  // reason said once, not "Loading sessions…" for ever.
  const forged = `${person.split(".").slice(0, 2).join(".")}.${"A".repeat(43)}`;
  await page.goto(`${api}/console/#token=${forged}`);
  await page.getByLabel("Bearer token").waitFor({ timeout: 10_000 });
  const reason = await page.getByRole("alert").textContent();
  assert.match(reason, /^Sign in again: NRD-0101: .*signature/);
  assert.equal(reason.split("NRD-0101").length - 1, 1, `the code once: ${reason}`);
  assert.equal(await page.getByText("Loading sessions").count(), 0);
  await picture(page, "console-refused-token");

  assert.deepEqual(missing, []);
});

consoleTest(
  "usage and cost: per run, per session, in the list and per day, priced with the operator's table",
  {
    roles: "reader,writer,approver,backend,admin",
    org: `usage-${Date.now()}`,
    env: { NARAD_CONSOLE_PRICES: JSON.stringify({ "small-1": { inputTokens: 2, outputTokens: 8 }, "*": { inputTokens: 1 } }), NARAD_CONSOLE_CURRENCY: "EUR" },
  },
  async ({ api, person, page }) => {
    const session = await call(api, person, "POST", "/v1/sessions", { title: "priced" });
    // 0.5 M input at 2 + 0.25 M output at 8 = 3.00; a model without an entry takes "*": 1 M input at 1, its output unpriced.
    await timedRun(api, person, session.sessionId, "run-a", { inputTokens: 500_000, outputTokens: 250_000 }, { model: "small-1" });
    await timedRun(api, person, session.sessionId, "run-b", { inputTokens: 1_000_000, outputTokens: 10 }, { model: "large-9" });
    await page.goto(`${api}/console/#token=${person}`);
    const row = page.locator(`tr[data-session="${session.sessionId}"]`);
    await row.locator("[data-usage] [data-cost]").waitFor({ timeout: 15_000 });
    assert.match(await row.locator("[data-usage]").textContent(), /^1,500,000 in · 250,010 out€4\.00 \(not priced: large-9: outputTokens\)$/);

    await row.getByRole("link").click();
    await page.getByRole("heading", { name: "priced" }).waitFor();
    const a = page.locator('.run-marker[data-run="run-a"]');
    await a.locator("[data-cost]").waitFor({ timeout: 15_000 });
    assert.match(await a.textContent(), /on small-1/);
    assert.equal((await a.locator("[data-cost]").textContent()).trim(), "· €3.00");
    assert.equal((await page.locator('.run-marker[data-run="run-b"] [data-cost]').textContent()).trim(), "· €1.00 (not priced: large-9: outputTokens)");
    assert.match(await page.locator("p[data-usage]").textContent(), /€4\.00 \(not priced: large-9: outputTokens\)/);
    await picture(page, "console-usage-session");

    await page.getByRole("link", { name: "Operations" }).click();
    const total = page.locator("[data-usage-total]");
    await total.waitFor({ timeout: 15_000 });
    assert.match(await total.textContent(), /^2 runs · 1,500,000 input tokens · 250,010 output tokens · €4\.00/);
    const today = await page.evaluate(() => new Intl.DateTimeFormat("en-CA", { year: "numeric", month: "2-digit", day: "2-digit" }).format(new Date()));
    const day = page.locator(`tr[data-day="${today}"]`);
    assert.match(await day.textContent(), /2.*1,500,000 in · 250,010 out.*large-9.*small-1.*€4\.00/);
    await picture(page, "console-usage-operations");
    if (process.env.SCREENSHOTS) await page.getByRole("region", { name: "Usage" }).screenshot({ path: `${process.env.SCREENSHOTS}/console-usage.png` });
  },
);
