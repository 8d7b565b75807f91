// A chat page on @ag-ui/client's HttpAgent (bundled here with esbuild,
// offline) in Debian's chromium holds a conversation with a narad agent.
// The server is killed (SIGKILL) mid-answer and started again on the same
// address and database; the page rejoins (runs the agent again with nothing
// new) and ends with the answer once, in order, its messages equal to the
// thread's transcript and the run in narad's history.
import assert from "node:assert/strict";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { build } from "esbuild";
import { chromium } from "playwright-core";

import { WORDS, answerAcrossKill, framesOf, history, saidInRun, startPageSite, token, waitFor } from "./harness.mjs";

const here = fileURLToPath(new URL(".", import.meta.url));
const QUEUE = "browser-ag-ui";
const THREAD = "b-ag-ui";

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

const state = (tab) => tab.evaluate(() => JSON.parse(JSON.stringify(window.agui ?? null)));

/** The page's answer: its assistant messages' text. */
function said(s) {
  return s.messages.filter((m) => m.role === "assistant" && typeof m.content === "string").map((m) => m.content).join("");
}

test("an AG-UI page in chromium: a SIGKILL of the server mid-answer, a rejoin, and the answer once, in order", { timeout: 120_000 }, async () => {
  await answerAcrossKill({
    chromium,
    startSite: () => startPageSite(build, here, "page.mjs", { platform: "browser" }),
    name: "ag-ui",
    queue: QUEUE,
    sessionId: THREAD,
    token,
    async open(tab, { api, origin, person }) {
      const q = new URLSearchParams({ api, token: person, thread: THREAD, queue: QUEUE });
      await tab.goto(`${origin}/page.html#${q}`);
      await waitFor("the page", async () => (await state(tab))?.status === "ready");
    },
    state,
    said,
    // The page's run breaks and it keeps trying to rejoin (the transcript so far, then live).
    broken: (s) => s.status === "rejoining",
    async check({ api, person, held, tab, state: s }) {
      assert.equal(said(s), WORDS.join(""), "the answer once, in order");
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
    },
  });
});
