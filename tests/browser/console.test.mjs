// The console (served by narad at /console) in Chromium, against a real
// server with `narad demo-agent` and `narad executor` running: signed in
// by its link, a session a script creates appears in the list; "hello" is
// answered word by word; a destructive request waits for an approval that
// a click gives (and the resolution names the signed-in person); a long
// answer is stopped half-way; a SIGKILL of the server mid-page is
// recovered from with nothing shown twice. Pictures go to SCREENSHOTS.
import zlib from "node:zlib";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { call, freePort, kill, launch, picture, required, startNarad, token } from "./harness.mjs";

/** Starts `narad <args>` with `jwt` as its token; the process. */
/** A `width`×`height` RGB PNG of a colour gradient: an image to upload and see. */
function gradientPng(width, height) {
  const chunk = (type, data) => {
    const length = Buffer.alloc(4);
    length.writeUInt32BE(data.length);
    const body = Buffer.concat([Buffer.from(type, "ascii"), data]);
    const crc = Buffer.alloc(4);
    crc.writeUInt32BE(zlib.crc32(body));
    return Buffer.concat([length, body, crc]);
  };
  const header = Buffer.alloc(13);
  header.writeUInt32BE(width, 0);
  header.writeUInt32BE(height, 4);
  header.set([8, 2, 0, 0, 0], 8);
  const rows = [];
  for (let y = 0; y < height; y++) {
    const row = Buffer.alloc(1 + width * 3);
    for (let x = 0; x < width; x++) row.set([(x * 255) / width, (y * 255) / height, 160], 1 + x * 3);
    rows.push(row);
  }
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", header),
    chunk("IDAT", zlib.deflateSync(Buffer.concat(rows))),
    chunk("IEND", Buffer.alloc(0)),
  ]);
}

function helper(api, jwt, args) {
  return spawn(required("NARAD_BIN"), [...args, "--server", api], {
    env: { ...process.env, NARAD_TOKEN: jwt, RUST_LOG: "warn" },
    stdio: ["ignore", "ignore", "inherit"],
  });
}

/** The transcript as the page shows it: [role, text] per message drawn. */
function shown(page) {
  return page.$$eval("article.message", (els) =>
    els.map((el) => [el.getAttribute("aria-label"), el.querySelector("p")?.textContent ?? ""]),
  );
}

/** The messages drawn, by messageId: [role, text]. */
function shownById(page) {
  return page.$$eval("article.message", (els) =>
    Object.fromEntries(els.map((el) => [el.dataset.message, [el.getAttribute("aria-label"), el.querySelector("p")?.textContent ?? ""]])),
  );
}

test("the console: sign in, watch, say, approve, stop, survive a SIGKILL", { timeout: 240_000 }, async () => {
  const apiPort = await freePort();
  const api = `http://127.0.0.1:${apiPort}`;
  let narad = await startNarad(apiPort, "http://127.0.0.1:1");
  const person = token("reader,writer,approver,admin");
  const agent = helper(api, token("reader,writer,backend"), ["demo-agent", "--executor", "desk-1", "--word-delay-ms", "40"]);
  const store = join(mkdtempSync(join(tmpdir(), "narad-console-")), "desk-1.tokens");
  const executor = helper(api, token("executor"), ["executor", "--id", "desk-1", "--store", store]);
  const browser = await launch();
  try {
    const page = await browser.newPage({ viewport: { width: 1100, height: 900 } });
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));

    // 1. The link signs in; the token leaves the address bar at once.
    await page.goto(`${api}/console/#token=${person}`);
    await page.getByRole("heading", { name: "Sessions" }).waitFor();
    assert.ok(!page.url().includes(person), "the token is gone from the address");
    await page.locator(".top .who").getByText("tester").waitFor();
    const session = await call(api, person, "POST", "/v1/sessions", { title: "made by a script" });
    const row = page.locator(`tr[data-session="${session.sessionId}"]`);
    await row.waitFor({ timeout: 15_000 });
    assert.match(await row.textContent(), /made by a script/);
    await picture(page, "console-sessions");

    // 2. "hello": the answer streams in word by word.
    await row.getByRole("link").click();
    await page.getByRole("heading", { name: "made by a script" }).waitFor();
    const say = async (text) => {
      await page.getByLabel("Say something").fill(text);
      await page.getByRole("button", { name: "Send" }).click();
    };
    await say("hello there console friend");
    const partials = new Set();
    const deadline = Date.now() + 30_000;
    for (;;) {
      const messages = await shown(page);
      const answer = messages.find(([role]) => role === "assistant message");
      if (answer) partials.add(answer[1]);
      if (answer && (await page.locator("article.message.assistant .cursor").count()) === 0 && answer[1].length > 0) break;
      assert.ok(Date.now() < deadline, "no whole answer within 30 s");
      await sleep(20);
    }
    assert.ok(partials.size >= 3, `the answer grew word by word (${[...partials].join(" | ")})`);

    // 3. Something destructive: the approval shows in the session and in
    // the inbox (another tab), and a click there gives it.
    const inbox = await browser.newPage({ viewport: { width: 900, height: 700 } });
    inbox.on("pageerror", (e) => errors.push(String(e)));
    await inbox.goto(`${api}/console/#token=${person}`);
    await inbox.getByRole("link", { name: "Approvals" }).click();
    await inbox.getByText("Nothing is waiting for a decision.").waitFor({ timeout: 15_000 });
    await say("please delete the old logs");
    const interrupt = page.locator("article.interrupt.open");
    await interrupt.waitFor({ timeout: 30_000 });
    const waiting = inbox.locator("li.interrupt");
    await waiting.waitFor({ timeout: 15_000 });
    assert.match(await waiting.textContent(), /waiting \d+ s/);
    assert.match(await waiting.textContent(), /in made by a script/);
    await picture(inbox, "console-approvals");
    await waiting.getByRole("button", { name: "Approve" }).click();
    await inbox.getByText("Nothing is waiting for a decision.").waitFor({ timeout: 15_000 });
    await inbox.close();
    const resolved = page.locator("article.interrupt.resolved");
    await resolved.waitFor({ timeout: 15_000 });
    assert.match(await resolved.textContent(), /approve\s+by tester/);
    await page.locator(".run-marker .badge.finished").nth(1).waitFor({ timeout: 30_000 });

    // 4. A long answer, stopped half-way.
    const long = Array.from({ length: 120 }, (_, i) => `word${i}`).join(" ");
    await say(long);
    await page.getByRole("button", { name: "Stop run" }).waitFor({ timeout: 30_000 });
    await page.waitForFunction(() => [...document.querySelectorAll("article.message.assistant p")].some((p) => p.textContent.includes("word10")), null, {
      timeout: 30_000,
    });
    await page.getByRole("button", { name: "Stop run" }).click();
    await page.locator(".run-marker .badge.cancelled").waitFor({ timeout: 30_000 });
    const cut = (await shown(page)).filter(([role]) => role === "assistant message").at(-1)[1];
    assert.ok(!cut.includes("word119"), "the answer stopped before its end");

    // The run tree (graph profile): the approved run finished, its
    // interrupt resolved with the decision, the stopped run cancelled.
    const tree = page.locator("aside .tree");
    await tree.locator('li.node.interrupt:has(.badge.resolved)').filter({ hasText: "approve" }).first().waitFor({ timeout: 20_000 });
    assert.ok((await tree.locator("li.node.run:has(> .badge.finished)").count()) >= 2, "finished runs in the run tree");
    await tree.locator("li.node.run:has(> .badge.cancelled)").first().waitFor({ timeout: 20_000 });

    // 5. The server is killed and started again under the open page.
    const beforeById = await shownById(page);
    const entriesBefore = Number(await page.locator(".timeline .window").getAttribute("data-entries"));
    await kill(narad);
    await page.getByRole("status").getByText("reconnecting").waitFor({ timeout: 20_000 });
    narad = await startNarad(apiPort, "http://127.0.0.1:1");
    await say("hello again");
    await page.waitForFunction((n) => Number(document.querySelector(".timeline .window")?.dataset.entries) >= n + 2, entriesBefore, {
      timeout: 60_000,
    });
    await page.locator(".banner").waitFor({ state: "detached", timeout: 20_000 });
    await sleep(1500); // an answer still streaming, or anything shown twice, shows by now
    const afterById = await shownById(page);
    const ids = await page.$$eval("article.message", (els) => els.map((el) => el.dataset.message));
    assert.equal(new Set(ids).size, ids.length, "no message shown twice");
    const positions = await page.$$eval(".timeline .entry", (els) => els.map((el) => el.getAttribute("aria-posinset")));
    assert.equal(new Set(positions).size, positions.length, "no entry drawn twice");
    for (const [id, message] of Object.entries(afterById)) {
      if (id in beforeById) assert.deepEqual(message, beforeById[id], `message ${id} stays as it was`);
    }
    assert.ok(Object.keys(afterById).some((id) => id in beforeById), "messages from before the restart are still drawn");
    const history = await call(api, person, "GET", `/v1/sessions/${session.sessionId}/events?limit=1000`);
    const last = history.events.at(-1).sessionSequence;
    await page.locator(`[data-session-sequence="${last}"]`).waitFor({ timeout: 20_000 });

    // Operations: the executor desk-1 with a live lease; every run done, so
    // no queued work and no held run.
    await page.getByRole("link", { name: "Operations" }).click();
    await page.locator('tr[data-executor="desk-1"]').getByText("live").waitFor({ timeout: 20_000 });
    await page.getByText("No queued work.").waitFor({ timeout: 20_000 });
    await page.getByText("No runtime holds a run.").waitFor({ timeout: 20_000 });
    await page.locator('[data-metric="narad_streams_open"]').waitFor({ timeout: 20_000 });
    await picture(page, "console-operations");
    await page.goBack();
    await page.locator(`[data-session-sequence="${last}"]`).waitFor({ timeout: 20_000 });

    // 6. A picture of the session at the end.
    await picture(page, "console-session");

    // The agent leaves: it would answer each of the questions below.
    agent.kill("SIGKILL");

    // A long conversation: only what is in view is in the page, scrolling
    // to the top reaches the first message, and an attachment shows with
    // its reference.
    const many = await call(api, person, "POST", "/v1/sessions", { title: "a long conversation" });
    const ev = (type, extra) => ({ protocolVersion: "narad/v1", type, eventId: crypto.randomUUID(), ...extra });
    const questions = Array.from({ length: 600 }, (_, i) =>
      ev("message.user.recorded", { messageId: `q${i}`, messageScope: "session", content: `question ${i}` }),
    );
    const uri = "https://files.example.com/att-1";
    const files = [
      ev("attachment.added", { attachmentId: "att-1", name: "notes.txt", mediaType: "text/plain", sizeBytes: 2048, uri }),
      ev("attachment.ready", { attachmentId: "att-1", uri }),
    ];
    await call(api, token("reader,writer,backend"), "POST", `/v1/sessions/${many.sessionId}/events`, { events: [...questions, ...files] });
    await page.evaluate((sid) => (location.hash = `#/sessions/${encodeURIComponent(sid)}`), many.sessionId);
    await page.locator('[data-session-sequence="602"]').waitFor({ timeout: 20_000 });
    const file = page.locator('article.file[data-file="attachment:att-1"]');
    await file.waitFor({ timeout: 20_000 });
    assert.match(await file.textContent(), /notes\.txt.*ready.*text\/plain · 2\.0 KiB/s);
    assert.equal(await file.getByRole("link").getAttribute("href"), uri);
    // Bytes narad holds: a person's image is drawn in place (read with the
    // token, as an object URL), a text file is a download.
    const upload = async (name, mediaType, body, attachmentId) => {
      const res = await fetch(`${api}/v1/sessions/${many.sessionId}/blobs?name=${name}&attachmentId=${attachmentId}`, {
        method: "POST",
        headers: { Authorization: `Bearer ${person}`, "Content-Type": mediaType },
        body,
      });
      assert.equal(res.status, 201, await res.clone().text());
    };
    const png = gradientPng(96, 64);
    await upload("gradient.png", "image/png", png, "att-img");
    await upload("plan.txt", "text/plain", "step one", "att-txt");
    const image = page.locator('article.file[data-file="attachment:att-img"] img.blob');
    await image.waitFor({ timeout: 20_000 });
    await page.waitForFunction((el) => el.complete && el.naturalWidth === 96, await image.elementHandle());
    assert.match(await image.getAttribute("src"), /^blob:/);
    const text = page.locator('article.file[data-file="attachment:att-txt"]');
    await text.getByRole("button", { name: "Download plan.txt" }).waitFor({ timeout: 20_000 });
    const [download] = await Promise.all([page.waitForEvent("download"), text.getByRole("button").click()]);
    assert.equal(download.suggestedFilename(), "plan.txt");
    // Drawn again after the click, from the image already read.
    await page.waitForFunction(() => [...document.querySelectorAll("img.blob")].every((i) => i.complete && i.naturalWidth === 96));
    await picture(page, "console-attachments");
    assert.equal(await page.locator(".timeline .window").getAttribute("data-entries"), "603");
    const drawn = await page.locator(".timeline .entry").count();
    assert.ok(drawn < 60, `${drawn} of 603 entries are in the page`);
    await page.locator(".timeline").evaluate((el) => (el.scrollTop = 0));
    await page.locator('article[data-message="q0"]').waitFor({ timeout: 10_000 });
    assert.equal(await page.locator('article[data-message="q599"]').count(), 0, "the last message left the page");

    // Start run names the queue its run goes to: an agent runtime claims it
    // from there (a run no backend takes would never end).
    const start = page.locator("form.start-run");
    await start.getByLabel("Queue").fill("console-queue");
    await picture(page, "console-start-run");
    await start.getByRole("button", { name: "Start run" }).click();
    await page.getByRole("button", { name: "Stop run" }).waitFor({ timeout: 20_000 });
    await picture(page, "console-started-on-a-queue");
    const claimed = await call(api, token("reader,writer,backend"), "POST", "/v1/runtime/claims", { queue: "console-queue" });
    assert.equal(claimed.sessionId, many.sessionId);
    assert.equal(claimed.queue, "console-queue");

    // 7. Every view, keyboard and screen-reader usable (axe-core: no serious
    // or critical violation), and whole in a narrow window. axe is injected
    // past the console's Content-Security-Policy (bypassCSP, this context only).
    const a11y = await browser.newContext({ bypassCSP: true, viewport: { width: 390, height: 800 } });
    const narrow = await a11y.newPage();
    narrow.on("pageerror", (e) => errors.push(String(e)));
    await narrow.goto(`${api}/console/#token=${person}`);
    const views = [
      ["sessions", "#/sessions", () => narrow.getByRole("heading", { name: "Sessions" })],
      ["session", `#/sessions/${encodeURIComponent(session.sessionId)}`, () => narrow.locator("article.message").first()],
      ["events", `#/sessions/${encodeURIComponent(session.sessionId)}/events/${encodeURIComponent(history.events[0].eventId)}`, () => narrow.locator(".inspector .detail h3")],
      ["approvals", "#/approvals", () => narrow.getByText("Nothing is waiting for a decision.")],
      ["operations", "#/operations", () => narrow.locator('tr[data-executor="desk-1"]')],
    ];
    for (const [name, hash, ready] of views) {
      await narrow.evaluate((h) => (location.hash = h), hash);
      await ready().waitFor({ timeout: 20_000 });
      await narrow.addScriptTag({ path: createRequire(import.meta.url).resolve("axe-core/axe.min.js") });
      const found = await narrow.evaluate(async () => (await window.axe.run(document)).violations);
      const serious = found.filter((v) => v.impact === "serious" || v.impact === "critical");
      assert.deepEqual(
        serious.map((v) => `${v.id}: ${v.nodes.map((n) => n.target.join(" ")).join(", ")}`),
        [],
        `${name}: accessibility violations`,
      );
      const overflow = await narrow.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      assert.ok(overflow <= 0, `${name}: ${overflow} px wider than a 390 px window`);
      await picture(narrow, `console-narrow-${name}`);
    }
    await a11y.close();
    assert.deepEqual(errors, []);
  } catch (e) {
    for (const [i, p] of browser.contexts().flatMap((c) => c.pages()).entries()) await picture(p, `console-failed-${i}`);
    throw e;
  } finally {
    await browser.close();
    agent.kill("SIGKILL");
    executor.kill("SIGKILL");
    await kill(narad);
  }
});
