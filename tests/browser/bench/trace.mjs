// Benchmark: how long the console takes to draw the trace of a run of
// 1,000 tool calls (2,002 events: the run, each call started and
// finished), from a click on the Trace tab to its last row drawn, the
// session already open; beside the same page switching to its Events tab
// (a windowed list of the same events) as the baseline. Prints the median
// of RUNS switches; BENCHMARKS.md keeps the figures.
//
//   NARAD_BIN=target/release/narad NARAD_DATABASE_URL=postgres://…/fresh_db \
//     node tests/browser/bench/trace.mjs
import { call, freePort, kill, launch, startNarad, token } from "../harness.mjs";

const CALLS = Number(process.env.CALLS ?? 1000);
const RUNS = Number(process.env.RUNS ?? 7);

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

const port = await freePort();
const api = `http://127.0.0.1:${port}`;
const narad = await startNarad(port, "http://127.0.0.1:1");
const browser = await launch();
try {
  const jwt = token("reader,writer,backend");
  const { sessionId } = await call(api, jwt, "POST", "/v1/sessions", { title: "a run of many tool calls" });
  const run = { runId: "r", rootRunId: "r" };
  const e = (type, extra) => ({ protocolVersion: "narad/v1", type, eventId: crypto.randomUUID(), ...run, ...extra });
  await call(api, jwt, "POST", `/v1/sessions/${sessionId}/events`, { events: [e("run.started", {})] });
  for (let c = 0; c < CALLS; c += 100) {
    const batch = [];
    for (let k = c; k < Math.min(c + 100, CALLS); k++) {
      batch.push(e("tool.call.started", { toolCallId: `c-${k}`, toolName: `tool${k % 7}`, executor: "backend", args: { k } }));
      batch.push(e("tool.call.finished", { toolCallId: `c-${k}`, outcome: "success", response: { k } }));
    }
    await call(api, jwt, "POST", `/v1/sessions/${sessionId}/events`, { events: batch });
  }
  await call(api, jwt, "POST", `/v1/sessions/${sessionId}/events`, { events: [e("run.finished", {})] });

  const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
  await page.goto(`${api}/console/#token=${jwt}`);
  await page.getByRole("heading", { name: "Sessions" }).waitFor();
  await page.evaluate((sid) => (location.hash = `#/sessions/${encodeURIComponent(sid)}`), sessionId);
  await page.locator(`[data-session-sequence="${2 * CALLS + 2}"]`).waitFor({ timeout: 60_000 });

  /** Clicks tab `name` and waits until `selector` is drawn: ms in the page. */
  const switchTo = async (name, selector) => {
    await page.getByRole("tab", { name: "Conversation" }).click();
    await page.locator("section.timeline").waitFor();
    const t0 = await page.evaluate(() => performance.now());
    await page.getByRole("tab", { name }).click();
    await page.locator(selector).waitFor({ timeout: 60_000 });
    return (await page.evaluate(() => performance.now())) - t0;
  };
  const trace = [];
  const events = [];
  let rows;
  for (let i = 0; i < RUNS; i++) {
    trace.push(await switchTo("Trace", `tr[data-span="tool:c-${CALLS - 1}"]`));
    rows = await page.evaluate(() => document.querySelectorAll("table.spans tbody tr").length);
    events.push(await switchTo("Events", 'nav[aria-label="Events"] a.row >> nth=0'));
  }
  const t = median(trace);
  const b = median(events);
  console.log(`trace of ${CALLS} tool calls: ${rows} rows drawn`);
  console.log(`trace drawn (ms, median of ${RUNS}): ${Math.round(t)} [${trace.map(Math.round).join(", ")}]`);
  console.log(`baseline, the Events tab (ms): ${Math.round(b)} [${events.map(Math.round).join(", ")}]`);
  console.log(`ratio: ${(t / b).toFixed(2)}`);
} finally {
  await browser.close();
  await kill(narad);
}
