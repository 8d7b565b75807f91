// Benchmark: how long the console takes to open a long session, from
// navigation to the newest entry drawn, beside the baseline of the same
// page reading the same history as plain JSON (fetch, every page of
// GET /v1/sessions/{id}/events). Two shapes of about 10,000 authority
// events: "long answers" (100 turns, each a question and an answer
// streamed in 96 deltas) and "many messages" (1,700 turns of one-delta
// answers: 3,400 messages and 1,700 runs, 5,100 entries). For the second,
// also the entries in the page once open (the window) and the time from
// a jump to the top until the first question is drawn. Prints each figure
// and the ratios, medians of RUNS runs; BENCHMARKS.md keeps them.
//
//   NARAD_BIN=target/release/narad NARAD_DATABASE_URL=postgres://…/fresh_db \
//     node tests/browser/bench/console-open.mjs
import { call, freePort, kill, launch, startNarad, token } from "../harness.mjs";

const SHAPES = [
  { name: "long answers", turns: 100, deltas: 96 },
  { name: "many messages", turns: 1700, deltas: 1 },
];
const RUNS = Number(process.env.RUNS ?? 5);

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/** Appends a session of `shape` and opens it RUNS times; prints the figures. */
async function measure({ name, turns, deltas }, jwt, page) {
  const { sessionId } = await call(api, jwt, "POST", "/v1/sessions", { title: `a long session: ${name}` });
  let batch = [];
  const flush = async () => {
    if (batch.length > 0) await call(api, jwt, "POST", `/v1/sessions/${sessionId}/events`, { events: batch });
    batch = [];
  };
  const e = (type, extra) => ({ protocolVersion: "narad/v1", type, eventId: crypto.randomUUID(), ...extra });
  for (let t = 0; t < turns; t++) {
    const run = { rootRunId: `r${t}`, runId: `r${t}` };
    batch.push(e("message.user.recorded", { messageId: `u${t}`, messageScope: "session", content: `question ${t}` }));
    batch.push(e("run.started", run));
    batch.push(e("message.text.started", { ...run, messageId: `a${t}`, role: "assistant", messageScope: "run" }));
    for (let d = 0; d < deltas; d++) batch.push(e("message.text.delta", { ...run, messageId: `a${t}`, delta: `word${d} ` }));
    batch.push(e("message.text.completed", { ...run, messageId: `a${t}` }));
    batch.push(e("run.finished", run));
    if (batch.length >= 900) await flush();
  }
  await flush();
  const total = turns * (deltas + 5);
  const open = [];
  const plain = [];
  const top = [];
  let drawn = 0;
  for (let i = 0; i < RUNS; i++) {
    await page.goto(`${api}/console/#token=${jwt}`);
    await page.getByRole("heading", { name: "Sessions" }).waitFor();
    // Baseline: the same history as JSON, read by the page.
    plain.push(
      await page.evaluate(
        async ([sid, bearer]) => {
          const t0 = performance.now();
          let after = 0;
          for (;;) {
            const r = await fetch(`/v1/sessions/${sid}/events?afterSessionSequence=${after}&limit=1000`, {
              headers: { Authorization: `Bearer ${bearer}` },
            });
            const body = await r.json();
            if (body.events.length === 0) break;
            after = body.events.at(-1).sessionSequence;
          }
          return performance.now() - t0;
        },
        [sessionId, jwt],
      ),
    );
    const t0 = Date.now();
    await page.evaluate((sid) => (location.hash = `#/sessions/${encodeURIComponent(sid)}`), sessionId);
    try {
      await page.locator(`[data-session-sequence="${total}"]`).waitFor({ timeout: 120_000 });
      await page.locator(`article[data-message="a${turns - 1}"]`).waitFor({ timeout: 120_000 });
    } catch (e) {
      await page.screenshot({ path: `${process.env.SCREENSHOTS ?? "/tmp"}/console-open-failed.png` });
      throw e;
    }
    open.push(Date.now() - t0);
    drawn = await page.locator(".timeline .entry").count();
    const t1 = Date.now();
    await page.locator(".timeline").evaluate((el) => (el.scrollTop = 0));
    await page.locator('article[data-message="u0"]').waitFor({ timeout: 30_000 });
    top.push(Date.now() - t1);
  }
  const o = median(open);
  const b = median(plain);
  console.log(`${name}: events: ${total}; entries in the page once open: ${drawn}`);
  console.log(`${name}: console open (ms, median of ${RUNS}): ${o} [${open.join(", ")}]`);
  console.log(`${name}: baseline, history as JSON (ms): ${Math.round(b)} [${plain.map(Math.round).join(", ")}]`);
  console.log(`${name}: ratio: ${(o / b).toFixed(2)}`);
  console.log(`${name}: jump to the top, first question drawn (ms): ${median(top)} [${top.join(", ")}]`);
}

const port = await freePort();
const api = `http://127.0.0.1:${port}`;
const narad = await startNarad(port, "http://127.0.0.1:1");
const browser = await launch();
try {
  const jwt = token("reader,writer,backend,approver");
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  for (const shape of SHAPES) await measure(shape, jwt, page);
} finally {
  await browser.close();
  await kill(narad);
}
