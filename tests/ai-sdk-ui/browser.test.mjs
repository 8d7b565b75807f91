// A page built with @ai-sdk/react's useChat (resume: true, DefaultChatTransport
// pointed at narad; bundled here with esbuild, offline) in Debian's chromium
// holds a conversation with a narad agent. The server is killed (SIGKILL)
// mid-answer and started again on the same address and database; the page,
// back in view, resumes and ends with the answer once, in order, equal to
// the run in narad's history.
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

import { call, freePort, history, kill, shapeOfMessage, shapeOfRun, startNarad, textOf, token, waitFor } from "./harness.mjs";

const here = fileURLToPath(new URL(".", import.meta.url));
const QUEUE = "browser-chat";
const SESSION = "b-chat";

/** The page and its bundle, served from another origin. */
async function startSite() {
  const out = mkdtempSync(join(tmpdir(), "ai-sdk-ui-page-"));
  await build({
    entryPoints: [join(here, "page/page.jsx")],
    bundle: true,
    format: "esm",
    jsx: "automatic",
    minify: true,
    define: { "process.env.NODE_ENV": '"production"' },
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

const WORDS = ["one ", "two ", "three ", "four ", "five ", "six ", "seven ", "eight ", "nine ", "ten ", "eleven ", "twelve."];

test("useChat in chromium: a SIGKILL of the server mid-answer, and the answer once, in order", { timeout: 120_000 }, async () => {
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
    const q = new URLSearchParams({ api, token: person, session: SESSION, queue: QUEUE });
    const resumedOnMount = tab.waitForResponse((r) => r.url().includes(`/v1/chat/${SESSION}/stream`));
    await tab.goto(`${origin}/page.html#${q}`);
    const state = () => tab.evaluate(() => JSON.parse(JSON.stringify(window.chat ?? null)));
    // Mounted: the resume on mount finds nothing to resume (a new chat).
    assert.equal((await resumedOnMount).status(), 204);
    await waitFor("the page", async () => (await state())?.status === "ready");
    assert.equal((await state()).error, undefined);

    await tab.fill("#say", "Count to twelve, and look in /tmp first");
    await tab.click("#send");
    const held = await claim(api, agent);
    assert.equal(held.sessionId, SESSION);
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
    await waitFor("four words on the page", async () => textOf((await state()).messages.at(-1)).includes("four"));
    assert.equal((await state()).messages.at(-1).id, held.runId);
    await picture(tab, "ai-sdk-ui-before-kill");

    // The server dies mid-answer; the page's stream breaks.
    await kill(narad);
    await waitFor("the broken stream on the page", async () => (await state()).status === "error");
    await picture(tab, "ai-sdk-ui-server-killed");
    narad = await startNarad(port, origin);
    // The agent goes on while the page is away.
    for (const w of WORDS.slice(4, 7)) {
      await say([["message.text.delta", { messageId: "m1", delta: w }]]);
    }
    // The page comes back into view: useChat resumes a stream that broke
    // on the network (GET /v1/chat/{id}/stream), which replays the message
    // from start and goes on live.
    await tab.evaluate(() => document.dispatchEvent(new Event("visibilitychange")));
    await waitFor("the resumed answer", async () => textOf((await state()).messages.at(-1)).includes("seven"));
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
      return s.status === "ready" && textOf(s.messages.at(-1)).endsWith("twelve.");
    });
    const { messages, error } = await state();
    assert.equal(error, undefined);
    assert.deepEqual(
      messages.map((m) => m.role),
      ["user", "assistant"],
    );
    assert.equal(messages[1].id, held.runId, "one assistant message: the run");
    assert.equal(textOf(messages[1]), WORDS.join(""), "the answer once, in order");
    const events = await history(api, person, SESSION);
    assert.deepEqual(shapeOfMessage(messages[1]), shapeOfRun(events, held.runId));
    const user = events.find((e) => e.type === "message.user.recorded");
    assert.equal(user.messageId, messages[0].id);
    assert.equal(user.content, "Count to twelve, and look in /tmp first");
    const shown = await tab.textContent(`[data-id="${held.runId}"]`);
    assert.ok(shown.includes(WORDS.join("")), shown);
    await picture(tab, "ai-sdk-ui-after-restart");

    // A reload now: nothing to resume (204), no error.
    const resumedOnReload = tab.waitForResponse((r) => r.url().includes(`/v1/chat/${SESSION}/stream`));
    await tab.reload();
    assert.equal((await resumedOnReload).status(), 204);
    await waitFor("the reloaded page", async () => (await state())?.status === "ready");
    assert.equal((await state()).error, undefined);
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
