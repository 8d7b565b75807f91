// Runs every ```ts block of the package README (clients/typescript/README.md)
// as written, each as its own Node program in a project where @narad/client
// is installed from the packed tarball (so "@narad/client" and
// "@narad/client/node" resolve as a user's imports do), against a server,
// and checks what each prints. The blocks are plain JavaScript in ts fences:
// each is written to PROJECT/<marker>.mjs and run with node, no flags.
//
// Every block has a marker right above it (`<!-- name -->` or
// `<!-- name: what it is -->`) and an entry in BLOCKS below; a block without
// a marker, a marker without an entry and an entry without a block all fail.
//
//   first-steps       runs to its end: prints the streamed answer and a 404's code.
//   reducer           runs to its end: follows a session until its transcript
//                     holds the message it recorded.
//   retries           runs to its end with NARAD_URL naming first a server that
//                     drops every request (counted: it must have been tried),
//                     then the real one: a keyed command sent twice answers the
//                     same, a busy session's ConflictError, a NotFoundError.
//   agent-typescript  the agent runtime (queue "agents"), served while `runs`
//                     runs; at most 25 lines of code (non-blank, non-comment).
//   executor          client executor desk-1 (fs.delete), served while `runs`
//                     runs; prints each deletion, keeps its tokens in desk-1.tokens.
//   runs              runs to its end against the two above, while an approver
//                     here approves every open interrupt (as a person would from
//                     an inbox): streams a run, waits for a second, joins it.
//   ai-sdk            the AI SDK agent (@narad/client/ai-sdk, its mock model from
//                     ai/test), served while this script asks the queue it names
//                     something: the run must end run.finished, its transcript's
//                     one assistant message the text the block's model streams
//                     (its text-delta chunks); at most 30 lines of code. The top
//                     README and docs/integrations/ai-sdk.md show it too, as the
//                     same text.
// The served blocks are then stopped with SIGTERM (each block stops on it).
// Every block must exit 0 having written nothing to stderr (a handler's
// error would), within 30 s (runs: 60 s). The scenarios run side by side.
//
// Usage: node scripts/readme-blocks.mjs [--list] [--readme README.md] --project DIR
//   --list   only lists the blocks and checks markers, entries, the blocks'
//            lengths and the copies in other READMEs (no server needed).
// The project has @narad/client installed from the packed tarball, and ws and
// ai (the devDependencies' versions) beside it.
// Environment: NARAD_URL (the server), NARAD_TOKEN (roles reader, writer,
// backend), NARAD_EXECUTOR_TOKEN (role executor), NARAD_APPROVER_TOKEN
// (roles reader, approver).
import { spawn } from "node:child_process";
import { existsSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { format } from "node:util";

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const option = (name) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
const readme = resolve(option("--readme") ?? join(here, "..", "README.md"));
const listOnly = args.includes("--list");
const AGENT_MAX_LINES = 25;
const FRAMEWORK_MAX_LINES = 30;
const WAIT_MS = 30_000;

/** The fences that hold code a user runs: each must be a marked block. */
const CODE_FENCE = /^(\s*)```(ts|typescript|js|javascript|mjs|tsx)\s*$/;
const MARKER = /^<!-- ([a-z0-9][a-z0-9-]*)(?::[^]*)? -->$/;

/** The README's code blocks: marker (or undefined), line, code (its fence's indentation removed). */
function blocksOf(path) {
  const lines = readFileSync(path, "utf8").split("\n");
  const found = [];
  for (let n = 0; n < lines.length; n++) {
    const open = CODE_FENCE.exec(lines[n]);
    if (!open) continue;
    const indent = open[1];
    const above = n > 0 ? MARKER.exec(lines[n - 1].trim()) : null;
    const code = [];
    let m = n + 1;
    for (; m < lines.length && lines[m].trimEnd() !== `${indent}\`\`\``; m++) {
      code.push(lines[m].startsWith(indent) ? lines[m].slice(indent.length) : lines[m]);
    }
    if (m === lines.length) throw new Error(`${path}:${n + 1}: the block never closes`);
    found.push({ marker: above?.[1], line: n + 1, code: code.join("\n") + "\n" });
    n = m;
  }
  return found;
}

/** Lines of code: neither blank nor only a comment. */
function linesOfCode(code) {
  let inComment = false;
  let count = 0;
  for (const raw of code.split("\n")) {
    let line = raw.trim();
    if (inComment) {
      const end = line.indexOf("*/");
      if (end < 0) continue;
      inComment = false;
      line = line.slice(end + 2).trim();
    }
    if (line.startsWith("/*")) {
      const end = line.indexOf("*/", 2);
      if (end < 0) {
        inComment = true;
        continue;
      }
      line = line.slice(end + 2).trim();
    }
    if (line !== "" && !line.startsWith("//")) count++;
  }
  return count;
}

function fail(message) {
  throw new Error(message);
}

function expectEqual(actual, expected, what) {
  if (JSON.stringify(actual) !== JSON.stringify(expected)) {
    fail(`${what}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`);
  }
}

function printedLines(out) {
  return out.replace(/\n$/, "").split("\n");
}

/** The `sub` of a JWT (to know who the approver is). */
function subOf(token) {
  return JSON.parse(Buffer.from(token.split(".")[1], "base64url").toString()).sub;
}

// --- the blocks ---------------------------------------------------------------------------

/**
 * Each block: `run` (run to its end, then `check(stdout, context)`) or
 * `serve` (started for the scenario that names it, stopped after it, then
 * `check`). `env` gives its environment beyond NARAD_URL.
 */
const BLOCKS = {
  "first-steps": {
    run: true,
    env: (c) => ({ NARAD_TOKEN: c.token }),
    check(out) {
      expectEqual(printedLines(out), ["Tidied up.", "404 NRD-0007"], "first-steps printed");
    },
  },
  reducer: {
    run: true,
    env: (c) => ({ NARAD_TOKEN: c.token }),
    check(out) {
      const lines = printedLines(out);
      // One render a frame: empty until the recorded message is in.
      expectEqual(lines.at(-1), "[ 'Hello, whoever reads this' ]", "reducer's last render");
      expectEqual(lines.slice(0, -1).filter((l) => l !== "[]"), [], "reducer's renders before it");
    },
  },
  retries: {
    run: true,
    env: (c) => ({ NARAD_TOKEN: c.token, NARAD_URL: `${c.dropping.url},${c.url}` }),
    check(out, c) {
      expectEqual(
        printedLines(out),
        ["true", "NRD-0204 { kind: 'run', runId: 'run-7' }", "404 NRD-0007"],
        "retries printed",
      );
      if (c.dropping.connections === 0) fail("retries never tried the first server, which drops connections");
    },
  },
  "agent-typescript": {
    serve: true,
    maxLines: AGENT_MAX_LINES,
    env: (c) => ({ NARAD_TOKEN: c.token }),
    check(out) {
      expectEqual(out, "", "the agent printed");
    },
  },
  executor: {
    serve: true,
    env: (c) => ({ NARAD_EXECUTOR_TOKEN: c.executorToken }),
    before(c) {
      rmSync(join(c.project, "desk-1.tokens"), { force: true });
    },
    check(out, c) {
      // Once for each of the runs block's two runs.
      expectEqual(printedLines(out), Array(2).fill("would delete /var/log/app.log"), "the executor printed");
      const tokens = join(c.project, "desk-1.tokens");
      if (!existsSync(tokens) || statSync(tokens).size === 0) fail("the executor's desk-1.tokens holds no token");
    },
  },
  runs: {
    run: true,
    serving: ["agent-typescript", "executor"],
    approver: true,
    timeoutMs: 60_000,
    env: (c) => ({ NARAD_TOKEN: c.token }),
    check(out, c) {
      const said = `Deleted /var/log/app.log, as ${subOf(c.approverToken)} approved.`;
      const lines = printedLines(out);
      expectEqual(lines[0], `Looking... ${said}`, "runs.stream's deltas");
      if (!/^run-[0-9a-f-]{36} finished$/.test(lines[1])) fail(`runs.stream's run and status: ${lines[1]}`);
      const waited = format("finished", ["Looking... ", said]).split("\n");
      expectEqual(lines.slice(2, 2 + waited.length), waited, "runs.wait's status and output");
      const types = lines.slice(2 + waited.length, -1).filter((t, i, all) => t !== all[i - 1]);
      expectEqual(
        types,
        [
          "run.started",
          ...["message.text.started", "message.text.delta", "message.text.completed"],
          ...["tool.call.started", "tool.call.finished"],
          ...["interrupt.requested", "run.paused", "interrupt.resolved", "run.resumed"],
          ...["tool.call.started", "tool.call.finished"],
          ...["message.text.started", "message.text.delta", "message.text.completed"],
          "run.finished",
        ],
        "runs.joinStream's event types (repeated deltas counted once)",
      );
      expectEqual(lines.at(-1), "finished true", "runs.join");
      expectEqual(c.approved, 2, "interrupts approved");
    },
  },
  "ai-sdk": {
    serve: true,
    maxLines: FRAMEWORK_MAX_LINES,
    /** Shown in these READMEs too (relative to this one), as the same text. */
    copies: ["../../README.md", "../../docs/integrations/ai-sdk.md"],
    env: (c) => ({ NARAD_TOKEN: c.token }),
    /** Asks the queue the block serves something; answers the run's result. */
    async drive(c, sdk, code) {
      const queues = [...code.matchAll(/queue: "([^"]+)"/g)].map((m) => m[1]);
      if (queues.length !== 1) fail(`the block names no queue, or several: ${JSON.stringify(queues)}`);
      const narad = new sdk.NaradClient({ servers: c.url.split(","), token: c.token });
      const { sessionId } = await narad.createSession({ title: "The AI SDK, as the README has it" });
      return narad.runs.wait({ sessionId, message: "Hello?", queue: queues[0] });
    },
    check(out, c, result, code) {
      // What the block's mock model streams: its text-delta chunks, in order.
      const said = [...code.matchAll(/type: "text-delta", id: "[^"]*", delta: "([^"]*)"/g)].map((m) => m[1]).join("");
      if (said === "") fail("the block's model streams no text-delta");
      expectEqual(result.terminal.type, "run.finished", "the run's terminal event");
      expectEqual(result.status, "finished", "the run's status");
      const answers = result.output
        .filter((i) => i.item === "message" && i.role === "assistant")
        .map((i) => [i.content, i.completed]);
      expectEqual(answers, [[said, true]], "the run's assistant messages (text, completed)");
      expectEqual(
        result.transcript.filter((i) => i.item === "message").map((i) => [i.role, i.content]),
        [["user", "Hello?"], ["assistant", said]],
        "the session's transcript",
      );
      expectEqual(out, "", "what the block printed");
    },
  },
};

// --- running ------------------------------------------------------------------------------

/** A started block: its process, what it printed, and its end. */
function start(block, c, env) {
  const program = join(c.project, `${block.marker}.mjs`);
  writeFileSync(program, block.code);
  const child = spawn(process.execPath, [program], {
    cwd: c.project,
    env: { ...process.env, NARAD_URL: c.url, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const started = { marker: block.marker, child, stdout: "", stderr: "", exit: undefined };
  child.stdout.on("data", (d) => (started.stdout += d));
  child.stderr.on("data", (d) => (started.stderr += d));
  started.ended = new Promise((resolveEnd) =>
    child.on("exit", (code, signal) => {
      started.exit = { code, signal };
      resolveEnd(started.exit);
    }),
  );
  return started;
}

function describe(s) {
  return `${s.marker} (exit ${JSON.stringify(s.exit)}):\n--- stdout\n${s.stdout}--- stderr\n${s.stderr}`;
}

async function ended(s, ms) {
  let timer;
  const timeout = new Promise((r) => (timer = setTimeout(() => r("timeout"), ms)));
  const result = await Promise.race([s.ended, timeout]);
  clearTimeout(timer);
  return result !== "timeout";
}

/**
 * A server that drops each connection once a request's first bytes came,
 * counting them (a replica that dies with the request). Not at accept: in
 * Node 20 a fetch whose connection is closed before it wrote anything never
 * settles.
 */
async function droppingServer() {
  const dropping = { connections: 0 };
  const server = createServer((socket) => {
    socket.once("data", () => {
      dropping.connections++;
      socket.destroy();
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  dropping.url = `http://127.0.0.1:${server.address().port}`;
  dropping.close = () => new Promise((r) => server.close(r));
  return dropping;
}

/** Approves every open interrupt of the tenant until stopped; counts them. */
function approver(c, sdk) {
  const client = new sdk.NaradClient({ servers: c.url.split(","), token: c.approverToken });
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      for await (const open of client.openInterrupts()) {
        await client.command("resolve-interrupt", {
          sessionId: open.sessionId,
          interruptId: open.interruptId,
          decision: "approve",
        });
        c.approved++;
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  loop.catch(() => {}); // handled: its error is thrown where it is stopped
  return async () => {
    stopped = true;
    await loop;
  };
}

/**
 * A served block this script drives itself: started, asked by
 * `entry.drive`, stopped with SIGTERM, then checked with what the drive
 * answered.
 */
async function driven(marker, blocks, c, sdk) {
  const entry = BLOCKS[marker];
  const t0 = Date.now();
  const block = blocks.get(marker);
  const served = start(block, c, entry.env(c));
  try {
    const driving = entry.drive(c, sdk, block.code);
    driving.catch(() => {}); // handled by the race below, or moot once the block failed
    const exited = Symbol("exited");
    const late = Symbol("late");
    let timer;
    const result = await Promise.race([
      driving,
      served.ended.then(() => exited),
      new Promise((r) => (timer = setTimeout(() => r(late), WAIT_MS))),
    ]).finally(() => clearTimeout(timer));
    if (result === exited) fail(`${marker} exited while it was asked: ${describe(served)}`);
    if (result === late) fail(`${marker}: no answer within ${WAIT_MS / 1000} s: ${describe(served)}`);
    served.child.kill("SIGTERM");
    if (!(await ended(served, 10_000))) fail(`${marker} did not stop within 10 s of SIGTERM: ${describe(served)}`);
    if (served.exit.code !== 0 || served.stderr !== "") fail(`${marker} stopped badly: ${describe(served)}`);
    try {
      entry.check(served.stdout, c, result, block.code);
    } catch (e) {
      fail(`${marker}: ${e.message}\n${describe(served)}`);
    }
    console.log(`ok ${marker} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  } finally {
    if (served.exit === undefined) served.child.kill("SIGKILL");
  }
}

/** Runs one scenario: its served blocks, its approver, the block run to its end. */
async function scenario(marker, blocks, c, sdk) {
  const entry = BLOCKS[marker];
  if (entry.drive) return driven(marker, blocks, c, sdk);
  const t0 = Date.now();
  const served = [];
  for (const name of entry.serving ?? []) {
    BLOCKS[name].before?.(c);
    served.push(start(blocks.get(name), c, BLOCKS[name].env(c)));
  }
  const stopApprover = entry.approver ? approver(c, sdk) : undefined;
  const main = start(blocks.get(marker), c, entry.env(c));
  try {
    // A served block that exits early fails the scenario at once.
    const early = Promise.race(served.map((s) => s.ended.then(() => s)));
    let timer;
    const first = await Promise.race([
      main.ended.then(() => main),
      early,
      new Promise((r) => (timer = setTimeout(() => r(undefined), entry.timeoutMs ?? WAIT_MS))),
    ]);
    clearTimeout(timer);
    if (first === undefined) fail(`${marker} did not end within ${(entry.timeoutMs ?? WAIT_MS) / 1000} s: ${describe(main)}`);
    if (first !== main) fail(`${first.marker} exited while ${marker} ran: ${describe(first)}`);
    if (main.exit.code !== 0 || main.stderr !== "") fail(describe(main));
    await stopApprover?.();
    for (const s of served) s.child.kill("SIGTERM");
    for (const s of served) {
      if (!(await ended(s, 10_000))) fail(`${s.marker} did not stop within 10 s of SIGTERM: ${describe(s)}`);
      if (s.exit.code !== 0 || s.stderr !== "") fail(`${s.marker} stopped badly: ${describe(s)}`);
    }
    try {
      entry.check(main.stdout, c);
    } catch (e) {
      fail(`${marker}: ${e.message}\n${describe(main)}`);
    }
    for (const s of served) {
      try {
        BLOCKS[s.marker].check(s.stdout, c);
      } catch (e) {
        fail(`${s.marker}: ${e.message}\n${describe(s)}`);
      }
    }
    const names = [marker, ...(entry.serving ?? [])].join(", ");
    console.log(`ok ${names} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  } finally {
    for (const s of [main, ...served]) if (s.exit === undefined) s.child.kill("SIGKILL");
    await stopApprover?.().catch(() => {});
  }
}

async function main() {
  const found = blocksOf(readme);
  const problems = [];
  const blocks = new Map();
  for (const b of found) {
    console.log(`block ${b.marker ?? "(no marker)"} at README.md:${b.line}, ${linesOfCode(b.code)} lines of code`);
    if (b.marker === undefined) problems.push(`README.md:${b.line}: a code block without a <!-- marker --> right above it`);
    else if (blocks.has(b.marker)) problems.push(`README.md:${b.line}: a second block marked ${b.marker}`);
    else if (!(b.marker in BLOCKS)) problems.push(`README.md:${b.line}: block ${b.marker} has no entry in ${fileURLToPath(import.meta.url)}`);
    else blocks.set(b.marker, b);
  }
  for (const marker of Object.keys(BLOCKS)) {
    if (!blocks.has(marker) && !found.some((b) => b.marker === marker)) problems.push(`no block marked ${marker} in README.md`);
  }
  for (const [marker, b] of blocks) {
    const max = BLOCKS[marker].maxLines;
    if (max !== undefined && linesOfCode(b.code) > max) {
      problems.push(`block ${marker} has ${linesOfCode(b.code)} lines of code; at most ${max}`);
    }
  }
  for (const [marker, entry] of Object.entries(BLOCKS)) {
    if (entry.serve && !entry.drive && !Object.values(BLOCKS).some((e) => e.serving?.includes(marker))) {
      problems.push(`served block ${marker} is served by no block that runs`);
    }
  }
  // A block another README shows must be the same text there (and so tested here).
  for (const [marker, entry] of Object.entries(BLOCKS)) {
    for (const other of entry.copies ?? []) {
      const path = resolve(dirname(readme), other);
      const copies = blocksOf(path).filter((b) => b.marker === marker);
      if (copies.length !== 1) problems.push(`${path}: ${copies.length} blocks marked ${marker}, not one`);
      else if (blocks.has(marker) && copies[0].code !== blocks.get(marker).code) {
        problems.push(`${path}:${copies[0].line}: block ${marker} is not the text of README.md's`);
      }
    }
  }
  if (problems.length > 0) {
    for (const p of problems) console.error(p);
    process.exit(1);
  }
  if (listOnly) return;

  const project = resolve(option("--project") ?? fail("--project DIR: the project with @narad/client installed"));
  const env = (name) => process.env[name] ?? fail(`${name} is not set`);
  const installed = join(project, "node_modules", "@narad", "client");
  const manifest = JSON.parse(readFileSync(join(installed, "package.json"), "utf8"));
  const sdk = await import(pathToFileURL(join(installed, manifest.exports["."].import)).href);
  const dropping = await droppingServer();
  const c = {
    project,
    url: env("NARAD_URL"),
    token: env("NARAD_TOKEN"),
    executorToken: env("NARAD_EXECUTOR_TOKEN"),
    approverToken: env("NARAD_APPROVER_TOKEN"),
    dropping,
    approved: 0,
  };
  const t0 = Date.now();
  try {
    const runs = Object.keys(BLOCKS).filter((m) => BLOCKS[m].run || BLOCKS[m].drive);
    const results = await Promise.allSettled(runs.map((m) => scenario(m, blocks, c, sdk)));
    const failed = results.filter((r) => r.status === "rejected");
    for (const r of failed) console.error(`FAILED ${r.reason?.message ?? r.reason}`);
    if (failed.length > 0) process.exitCode = 1;
    else console.log(`every block of README.md ran as written (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  } finally {
    await dropping.close();
  }
}

main().catch((e) => {
  console.error(e.message ?? e);
  process.exit(1);
});
