// What the front-end tests (tests/ag-ui, tests/ai-sdk-ui) share: narad
// started (and killed) as a process on a port of its own on a fresh
// database, tokens, calls to the API, a session's history, an agent runtime
// of @narad/client answering, the agent of the Node tests' scenarios, a run
// driven event by event under a claim's lease, a page bundled with esbuild
// served from another origin, and a page in chromium holding an answer
// across a SIGKILL of the server and its restart.
//
// Only Node built-ins and the SDK (clients/typescript/dist) are imported
// here: each folder has its own packages (its own package-lock), so what
// comes from a package (esbuild's build, playwright-core's chromium) is
// passed in by the caller.
//
// Environment (.ci/ag-ui, .ci/ai-sdk-ui set it): NARAD_BIN,
// NARAD_DATABASE_URL (a fresh database), CHROMIUM (the browser binary;
// default /usr/bin/chromium), SCREENSHOTS (optional: a folder for pictures
// of the page).
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { NaradClient, Runtime } from "../../clients/typescript/dist/index.js";

const secret = "front-end-test-hs256-secret-of-32-bytes-or-more";

export function required(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(`set ${name}`);
  }
  return value;
}

/** A port nothing listens on now. */
export async function freePort() {
  const server = createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** Starts narad on `port` (for pages of `origin`, if any); resolves once it serves. */
export async function startNarad(port, origin) {
  const env = {
    ...process.env,
    NARAD_LISTEN: `127.0.0.1:${port}`,
    NARAD_DATABASE_URL: required("NARAD_DATABASE_URL"),
    NARAD_JWT_HS256_SECRET: secret,
    // A stream the client breaks off stops its run after a second unless a
    // front end comes back to the session (the tests' reconnects come sooner).
    NARAD_CHAT_ABORT_GRACE_MS: "1000",
    RUST_LOG: "warn",
  };
  if (origin) {
    env.NARAD_CORS_ORIGINS = origin;
  }
  const child = spawn(required("NARAD_BIN"), ["serve"], { env, stdio: ["ignore", "pipe", "inherit"] });
  await new Promise((resolve, reject) => {
    let out = "";
    child.stdout.on("data", (chunk) => {
      out += chunk;
      if (out.includes("narad is serving on")) {
        resolve();
      }
    });
    child.on("exit", (code) => reject(new Error(`narad exited (${code}) before serving`)));
  });
  return child;
}

/** Stops narad: SIGKILL when `hard`, else SIGTERM; waits until it is gone. */
export async function kill(child, hard = true) {
  if (child.exitCode !== null || child.signalCode !== null) {
    return;
  }
  const gone = new Promise((resolve) => child.once("exit", resolve));
  child.kill(hard ? "SIGKILL" : "SIGTERM");
  await gone;
}

/** Tokens of tenant `org`: `(roles, sub = "ann")`, roles comma-separated. */
export function tokensOf(org) {
  return (roles, sub = "ann") =>
    execFileSync(required("NARAD_BIN"), ["token", "--org", org, "--sub", sub, "--roles", roles], {
      env: { ...process.env, NARAD_JWT_HS256_SECRET: secret },
    })
      .toString()
      .trim();
}

/** A call to the API from Node: `{status, body}`. */
export async function call(api, jwt, method, path, body) {
  const res = await fetch(api + path, {
    method,
    headers: { Authorization: `Bearer ${jwt}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : undefined };
}

/** The session's whole history (every page); none when `orNone` and the session does not exist yet. */
export async function history(api, jwt, sessionId, orNone = false) {
  const events = [];
  let after = 0;
  for (;;) {
    const { status, body } = await call(api, jwt, "GET", `/v1/sessions/${sessionId}/events?limit=1000&afterSessionSequence=${after}`);
    if (orNone && status === 404) {
      return events;
    }
    assert.equal(status, 200, JSON.stringify(body));
    events.push(...body.events);
    if (body.nextSessionSequence == null) {
      return events;
    }
    after = body.nextSessionSequence;
  }
}

export async function waitFor(what, check, seconds = 30) {
  const deadline = Date.now() + seconds * 1000;
  for (;;) {
    const got = await check();
    if (got) {
      return got;
    }
    assert.ok(Date.now() < deadline, `no ${what} within ${seconds} s`);
    await sleep(50);
  }
}

/**
 * narad on a port of its own with an agent runtime of @narad/client
 * answering on `queue` with `handler` (given the runtime's client):
 * `{api, client, token, stop}`; `stop` ends the runtime and narad and
 * asserts that the agent met no error.
 */
export async function serveWithAgent(token, queue, handler) {
  const port = await freePort();
  const api = `http://127.0.0.1:${port}`;
  const narad = await startNarad(port);
  const errors = [];
  const client = new NaradClient({ servers: api, token: token("reader,writer,backend", "agent") });
  const runtime = new Runtime(client, { queue, waitMs: 1000, deltaWindowMs: 10, handler: (ctx) => handler(ctx, client), onError: (e) => errors.push(e) });
  const running = runtime.run();
  return {
    api,
    client,
    async stop() {
      runtime.stop();
      await running;
      await kill(narad, false);
      assert.deepEqual(errors.map(String), [], "the agent met no error");
    },
  };
}

/**
 * The agent of the Node tests: what it does depends on the user message's
 * id (`<scenario>-…`): text, backend, client, approve, slow (`words`, one
 * each `slowMs`).
 */
export function scenarioAgent(words, slowMs) {
  return async (ctx) => {
    const scenario = String(ctx.input?.messageId ?? "").split("-")[0];
    switch (scenario) {
      case "text":
        await ctx.think("The user greets; greet back.");
        await ctx.say(
          (async function* () {
            for (const piece of ["Hello", ", ", "I am ", "narad's ", "agent."]) {
              yield piece;
              await sleep(20);
            }
          })(),
        );
        break;
      case "backend": {
        const files = await ctx.tool("fs.list", { path: "/tmp" }, () => ["a.txt", "b.txt"]);
        await ctx.say(`There are ${files.length} files: ${files.join(", ")}.`);
        break;
      }
      case "client": {
        await ctx.say("Let me look where you are. ");
        const where = await ctx.clientTool("getLocation", { precise: true });
        await ctx.say(`You are in ${where.city}.`);
        break;
      }
      case "approve": {
        const path = `/x/${ctx.input.messageId}`;
        const approval = await ctx.approve(`Delete ${path}?`, {
          kind: "tool.approval",
          input: { toolName: "fs.delete", args: { path } },
        });
        if (approval.decision === "approve") {
          await ctx.tool("fs.delete", { path }, () => ({ deleted: path }));
          await ctx.say(`Deleted ${path}.`);
        } else {
          await ctx.say(`Kept ${path} (${approval.decision} by ${approval.actor?.sub}).`);
        }
        break;
      }
      case "slow": {
        const m = ctx.message();
        for (const w of words) {
          await m.say(w);
          await sleep(slowMs);
        }
        break;
      }
      default:
        await ctx.say(`no scenario ${scenario}`);
    }
    await ctx.finish();
  };
}

/** The agent, as a runtime drives a run: a claim on `queue`. */
export async function claim(api, jwt, queue) {
  for (let i = 0; i < 200; i++) {
    const { status, body } = await call(api, jwt, "POST", "/v1/runtime/claims", { queue, waitMs: 1000 });
    if (status === 200) {
      return body;
    }
    assert.equal(status, 204, JSON.stringify(body));
  }
  throw new Error("no run to claim");
}

/** Appends events (`[type, fields]` each) to the claimed run `held` under its lease. */
export function appender(api, jwt, held) {
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

/**
 * The page (`page/page.html` of `dir`) and its bundle (`page/<entry>` built
 * by esbuild's `build` with `options`), served from another origin.
 */
export async function startPageSite(build, dir, entry, options) {
  const out = mkdtempSync(join(tmpdir(), "front-end-page-"));
  await build({
    entryPoints: [join(dir, "page", entry)],
    bundle: true,
    format: "esm",
    minify: true,
    outfile: join(out, "page.js"),
    logLevel: "warning",
    ...options,
  });
  const files = {
    "/page.html": ["text/html; charset=utf-8", readFileSync(join(dir, "page/page.html"))],
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

/** Saves a picture of the page when SCREENSHOTS names a folder. */
export async function picture(tab, name) {
  if (process.env.SCREENSHOTS) {
    await tab.screenshot({ path: join(process.env.SCREENSHOTS, `${name}.png`), fullPage: true });
  }
}

export const WORDS = ["one ", "two ", "three ", "four ", "five ", "six ", "seven ", "eight ", "nine ", "ten ", "eleven ", "twelve."];

/**
 * A chat page in Debian's chromium (playwright-core's `chromium`, on the
 * site `startSite` gives) asks to count to twelve on `queue`; the agent
 * (a claim, events under its lease) looks in /tmp and answers word by
 * word. The server is killed (SIGKILL) mid-answer and started again on the
 * same address and database while the agent goes on; the page gets its
 * answer back and ends ready with all twelve words.
 *
 * The page's own parts: `open(tab, {api, origin, person})` loads it until
 * ready; `state(tab)` is its state; `said(state)` the answer's text on it;
 * `broken(state)` true once the kill broke its stream; `back(tab)` (if any)
 * what brings it back after the restart; `afterFour(state, held)` (if any)
 * more checks once four words show; `check({api, person, held, tab,
 * state})` its checks at the end. Pictures are named `<name>-…`; every
 * page error is a failure.
 */
export async function answerAcrossKill({ chromium, startSite, name, queue, sessionId, token, open, state, said, broken, back, afterFour, check }) {
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
    await open(tab, { api, origin, person });
    const now = () => state(tab);

    await tab.fill("#say", "Count to twelve, and look in /tmp first");
    await tab.click("#send");
    const held = await claim(api, agent, queue);
    assert.equal(held.sessionId, sessionId);
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
    await waitFor("four words on the page", async () => said(await now()).includes("four"));
    if (afterFour) {
      await afterFour(await now(), held);
    }
    await picture(tab, `${name}-before-kill`);

    // The server dies mid-answer; the page's stream breaks.
    await kill(narad);
    await waitFor("the broken stream on the page", async () => broken(await now()));
    await picture(tab, `${name}-server-killed`);
    narad = await startNarad(port, origin);
    // The agent goes on; the page gets the answer back (so far, then live).
    for (const w of WORDS.slice(4, 7)) {
      await say([["message.text.delta", { messageId: "m1", delta: w }]]);
    }
    if (back) {
      await back(tab);
    }
    await waitFor("the answer back on the page", async () => said(await now()).includes("seven"));
    for (const w of WORDS.slice(7)) {
      await say([["message.text.delta", { messageId: "m1", delta: w }]]);
      await sleep(40);
    }
    await say([
      ["message.text.completed", { messageId: "m1" }],
      ["run.finished", {}],
    ]);
    await waitFor("the end of the answer", async () => {
      const s = await now();
      return s.status === "ready" && said(s).endsWith("twelve.");
    });
    await picture(tab, `${name}-after-restart`);
    await check({ api, person, held, tab, state: await now() });
    // Only the broken connection's own failures reached the page.
    assert.deepEqual(errors, []);
  } finally {
    await browser.close();
    await kill(narad, false);
    site.close();
  }
}
