// A page built with @ai-sdk/react's useChat (resume: true, DefaultChatTransport
// pointed at narad; bundled here with esbuild, offline) in Debian's chromium
// holds a conversation with a narad agent. The server is killed (SIGKILL)
// mid-answer and started again on the same address and database; the page,
// back in view, resumes and ends with the answer once, in order, equal to
// the run in narad's history.
import assert from "node:assert/strict";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { build } from "esbuild";
import { chromium } from "playwright-core";

import { WORDS, answerAcrossKill, history, shapeOfMessage, shapeOfRun, startPageSite, textOf, token, waitFor } from "./harness.mjs";

const here = fileURLToPath(new URL(".", import.meta.url));
const QUEUE = "browser-chat";
const SESSION = "b-chat";

const state = (tab) => tab.evaluate(() => JSON.parse(JSON.stringify(window.chat ?? null)));

test("useChat in chromium: a SIGKILL of the server mid-answer, and the answer once, in order", { timeout: 120_000 }, async () => {
  await answerAcrossKill({
    chromium,
    startSite: () => startPageSite(build, here, "page.jsx", { jsx: "automatic", define: { "process.env.NODE_ENV": '"production"' } }),
    name: "ai-sdk-ui",
    queue: QUEUE,
    sessionId: SESSION,
    token,
    async open(tab, { api, origin, person }) {
      const q = new URLSearchParams({ api, token: person, session: SESSION, queue: QUEUE });
      const resumedOnMount = tab.waitForResponse((r) => r.url().includes(`/v1/chat/${SESSION}/stream`));
      await tab.goto(`${origin}/page.html#${q}`);
      // Mounted: the resume on mount finds nothing to resume (a new chat).
      assert.equal((await resumedOnMount).status(), 204);
      await waitFor("the page", async () => (await state(tab))?.status === "ready");
      assert.equal((await state(tab)).error, undefined);
    },
    state,
    said: (s) => textOf(s.messages.at(-1)),
    afterFour: (s, held) => assert.equal(s.messages.at(-1).id, held.runId),
    // The page's stream breaks.
    broken: (s) => s.status === "error",
    // The agent goes on while the page is away; it comes back into view:
    // useChat resumes a stream that broke on the network (GET
    // /v1/chat/{id}/stream), which replays the message from start and goes
    // on live.
    back: (tab) => tab.evaluate(() => document.dispatchEvent(new Event("visibilitychange"))),
    async check({ api, person, held, tab, state: { messages, error } }) {
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

      // A reload now: nothing to resume (204), no error.
      const resumedOnReload = tab.waitForResponse((r) => r.url().includes(`/v1/chat/${SESSION}/stream`));
      await tab.reload();
      assert.equal((await resumedOnReload).status(), 204);
      await waitFor("the reloaded page", async () => (await state(tab))?.status === "ready");
      assert.equal((await state(tab)).error, undefined);
    },
  });
});
