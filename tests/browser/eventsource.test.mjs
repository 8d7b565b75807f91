// Pages of another origin follow a session while a writer appends; the
// server is killed (SIGKILL) and started again mid-stream; each page ends
// with every event exactly once, in order, as history has them:
// 1. the browser's native EventSource with a stream ticket;
// 2. the SDK's follow (fetch with Authorization, so CORS preflights too).
import assert from "node:assert/strict";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { call, freePort, kill, launch, note, picture, startNarad, startSite, token } from "./harness.mjs";

for (const [name, page] of [
  ["a native EventSource with a ticket", "eventsource.html"],
  ["the SDK's follow", "sdk-follow.html"],
]) {
  test(`${name} survives a SIGKILL of the server`, { timeout: 120_000 }, async () => {
    const apiPort = await freePort();
    const api = `http://127.0.0.1:${apiPort}`;
    const { site, origin } = await startSite();
    let narad = await startNarad(apiPort, origin);
    const browser = await launch();
    try {
      const writer = token("writer,backend");
      const reader = token("reader");
      const session = await call(api, writer, "POST", "/v1/sessions", { title: name });
      const tab = await browser.newPage();
      const errors = [];
      tab.on("pageerror", (e) => errors.push(String(e)));
      const q = new URLSearchParams({ api, token: reader, session: session.sessionId });
      await tab.goto(`${origin}/${page}?${q}`);
      await tab.waitForFunction(() => window.connections >= 1, null, { timeout: 20_000 });

      for (let i = 1; i <= 15; i++) {
        await note(api, writer, session.sessionId, i);
      }
      await tab.waitForFunction(() => window.got.length >= 15, null, { timeout: 20_000 });
      await kill(narad);
      await tab.waitForFunction(() => window.errors > 0, null, { timeout: 20_000 });
      narad = await startNarad(apiPort, origin);
      for (let i = 16; i <= 30; i++) {
        await note(api, writer, session.sessionId, i);
      }
      await tab.waitForFunction(() => window.got.length >= 30, null, { timeout: 60_000 });
      await sleep(500); // anything repeated would arrive now
      const got = await tab.evaluate(() => window.got);
      const connections = await tab.evaluate(() => window.connections);
      await picture(tab, page.replace(".html", ""));

      const history = await call(api, reader, "GET", `/v1/sessions/${session.sessionId}/events?limit=1000`);
      assert.deepEqual(
        got.map((e) => e.eventId),
        history.events.map((e) => e.eventId),
        "every event exactly once, in history's order",
      );
      assert.ok(connections >= 2, `the stream was opened again after the kill (${connections})`);
      if (page === "sdk-follow.html") {
        // The page's reducer ends where history reduced in Node ends.
        const { SessionReducer } = await import("../../clients/typescript/dist/index.js");
        const replayed = new SessionReducer();
        for (const e of history.events) replayed.deliver(e);
        assert.deepEqual(await tab.evaluate(() => window.violations), []);
        assert.deepEqual(await tab.evaluate(() => window.state), replayed.state());
        assert.equal(replayed.state().sessionSequence, 30, "every note reduced");
      }
      assert.deepEqual(errors, []);
    } finally {
      await browser.close();
      await kill(narad);
      site.close();
    }
  });
}
