// A chat page on @ag-ui/client's HttpAgent (bundled here with esbuild,
// offline) in Debian's chromium holds a conversation with a narad agent.
// The server is killed (SIGKILL) mid-answer and started again on the same
// address and database; the page rejoins (runs the agent again with nothing
// new) and ends with the answer once, in order, its messages equal to the
// thread's transcript and the run in narad's history.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";

import { build } from "esbuild";
import { chromium } from "playwright-core";

import { call, framesOf, freePort, history, kill, saidInRun, startNarad, token, waitFor } from "./harness.mjs";

const here = fileURLToPath(new URL(".", import.meta.url));
const QUEUE = "browser-ag-ui";
const THREAD = "b-ag-ui";

/** The page and its bundle, served from another origin. */
async function startSite() {
  const out = mkdtempSync(join(tmpdir(), "ag-ui-page-"));
  await build({
    entryPoints: [join(here, "page/page.mjs")],
    bundle: true,
    format: "esm",
    minify: true,
    platform: "browser",
    outfile: join(out, "page.js"),
    logLevel: "warning",
  });
  const files = {
    "/page.html": ["text/html; charset=utf-8", readFileSync(join(here, "page/page.html"))],
    "/page.js": ["text/javascript", readFileSync(join(out, "page.js"))],
  };
  rmSync(out, { recursive: true, force: true });
  const site = createServer((req, res) => {
    const file = files[new URL(req.url, "http://x").pathname];
    if (!file) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "Content-Type": file[0] });
    res.end(file[1]);
  });
  await new Promise((resolve) => site.listen(0, "127.0.0.1", resolve));
  return { site, origin: `http://127.0.0.1:${site.address().port}` };
}

/** The agent, as a runtime drives a run: a claim, then events under its lease. */
async function claim(api, jwt) {
  for (let i = 0; i < 200; i++) {
    const { status, body } = await call(api, jwt, "POST", "/v1/runtime/claims", { queue: QUEUE, waitMs: 1000 });
    if (status === 200) {
      return body;
    }
    assert.equal(status, 204, JSON.stringify(body));
  }
  throw new Error("no run to claim");
}

function appender(api, jwt, held) {
  let n = 0;
  return async (events) => {
    const res = await fetch(`${api}/v1/sessions/${held.sessionId}/events`, {
      method: "POST",
      headers: { Authorization: `Bearer ${jwt}`, "Content-Type": "application/json", "Narad-Runtime-Lease": held.lease.leaseId },
      body: JSON.stringify({
        events: events.map(([type, fields]) => ({
          protocolVersion: "narad/v1",
          type,
          eventId: `${held.runId}-${++n}`,
          rootRunId: held.runId,
          runId: held.runId,
          ...fields,
        })),
      }),
    });
    assert.equal(res.status, 201, await res.text());
  };
}

/** A message as compared: its id, role, content, tool calls and the call it answers. */
function shape(m) {
  const out = { id: m.id, role: m.role };
  for (const k of ["content", "toolCalls", "toolCallId", "error"]) {
    if (m[k] !== undefined) {
      out[k] = k === "toolCalls" ? m[k].map((t) => ({ id: t.id, name: t.function.name, arguments: t.function.arguments })) : m[k];
    }
  }
  return out;
}

const WORDS = ["one ", "two ", "three ", "four ", "five ", "six ", "seven ", "eight ", "nine ", "ten ", "eleven ", "twelve."];

test("an AG-UI page in chromium: a SIGKILL of the server mid-answer, a rejoin, and the answer once, in order", { timeout: 120_000 }, async () => {
  const port = await freePort();
  const api = `http://127.0.0.1:${port}`;
  const { site, origin } = await startSite();
  let narad = await startNarad(port, origin);
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const person = token("reader,writer", "ann");
    const agent = token("reader,backend", "agent");
    const tab = await browser.newPage({ viewport: { width: 900, height: 700 } });
    const errors = [];
    tab.on("pageerror", (e) => errors.push(String(e)));
    const q = new URLSearchParams({ api, token: person, thread: THREAD, queue: QUEUE });
    await tab.goto(`${origin}/page.html#${q}`);
    const state = () => tab.evaluate(() => JSON.parse(JSON.stringify(window.agui ?? null)));
    await waitFor("the page", async () => (await state())?.status === "ready");
    const said = async () => (await state()).messages.filter((m) => m.role === "assistant" && typeof m.content === "string").map((m) => m.content).join("");

    await tab.fill("#say", "Count to twelve, and look in /tmp first");
    await tab.click("#send");
    const held = await claim(api, agent);
    assert.equal(held.sessionId, THREAD);
    const say = appender(api, agent, held);
    await say([
      ["tool.call.started", { toolCallId: "ls1", toolName: "fs.list", executor: "backend", args: { path: "/tmp" } }],
      ["tool.call.finished", { toolCallId: "ls1", outcome: "success", response: ["a.txt"] }],
      ["message.text.started", { messageId: "m1", role: "assistant", messageScope: "run" }],
    ]);
    for (const w of WORDS.slice(0, 4)) {
      await say([["message.text.delta", { messageId: "m1", delta: w }]]);
      await sleep(60);
    }
    await waitFor("four words on the page", async () => (await said()).includes("four"));
    await picture(tab, "ag-ui-before-kill");

    // The server dies mid-answer; the page's run breaks and it keeps trying to rejoin.
    await kill(narad);
    await waitFor("the broken run on the page", async () => (await state()).status === "rejoining");
    await picture(tab, "ag-ui-server-killed");
    narad = await startNarad(port, origin);
    // The agent goes on; the page rejoins (the transcript so far, then live).
    for (const w of WORDS.slice(4, 7)) {
      await say([["message.text.delta", { messageId: "m1", delta: w }]]);
    }
    await waitFor("the rejoined answer", async () => (await said()).includes("seven"));
    for (const w of WORDS.slice(7)) {
      await say([["message.text.delta", { messageId: "m1", delta: w }]]);
      await sleep(40);
    }
    await say([
      ["message.text.completed", { messageId: "m1" }],
      ["run.finished", {}],
    ]);
    await waitFor("the end of the answer", async () => {
      const s = await state();
      return s.status === "ready" && (await said()).endsWith("twelve.");
    });
    const s = await state();
    assert.equal(await said(), WORDS.join(""), "the answer once, in order");
    assert.ok(s.runs >= 2, "the page rejoined");
    assert.equal(s.error, undefined);
    assert.deepEqual(s.invalid, [], "every event valid by EventSchema");
    assert.deepEqual(s.warnings, [], "no [ag-ui][enforce] or [ag-ui][compat] warning");
    assert.ok(s.events.some((e) => e.type === "MESSAGES_SNAPSHOT"), "a rejoin starts from a snapshot");
    const runFinished = s.events.filter((e) => e.type === "RUN_FINISHED");
    assert.deepEqual(runFinished.at(-1).outcome ?? { type: "success" }, { type: "success" });

    // Matching history: the run's text in narad's history, and the page's
    // messages equal to the thread's transcript as a new client reads it.
    const events = await history(api, person, THREAD);
    assert.equal(saidInRun(events, held.runId), WORDS.join(""));
    const res = await fetch(`${api}/v1/ag-ui`, {
      method: "POST",
      headers: { Authorization: `Bearer ${person}`, "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify({ threadId: THREAD, runId: "read-back", messages: [], tools: [], context: [], forwardedProps: {} }),
    });
    const failures = [];
    const read = framesOf(await res.text(), failures);
    assert.deepEqual(failures.map(String), []);
    assert.deepEqual(
      read.map((e) => e.type),
      ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"],
    );
    assert.deepEqual(s.messages.map(shape), read[1].messages.map(shape));
    assert.deepEqual(
      s.messages.map((m) => m.role),
      ["user", "assistant", "tool", "assistant"],
    );
    const shown = await tab.textContent('[data-id="m1"]');
    assert.equal(shown, WORDS.join(""));
    await picture(tab, "ag-ui-after-restart");
    // Only the broken connection's own failures reached the page.
    assert.deepEqual(errors, []);
  } finally {
    await browser.close();
    await kill(narad, false);
    site.close();
  }
});

/** Saves a picture of the page when SCREENSHOTS names a folder. */
async function picture(tab, name) {
  if (process.env.SCREENSHOTS) {
    await tab.screenshot({ path: join(process.env.SCREENSHOTS, `${name}.png`), fullPage: true });
  }
}
