// What the AG-UI tests share: narad started (and killed) as a process on a
// port of its own, tokens, calls to the API, a session's history, and an
// unmodified HttpAgent whose fetch keeps the raw SSE frames of every answer
// and checks each with @ag-ui/core's own EventSchema.
//
// Environment (.ci/ag-ui sets it): NARAD_BIN, NARAD_DATABASE_URL (a fresh
// database), CHROMIUM (the browser binary; default /usr/bin/chromium),
// SCREENSHOTS (optional: a folder for pictures of the page).
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { createServer } from "node:http";
import { setTimeout as sleep } from "node:timers/promises";

import { HttpAgent } from "@ag-ui/client";
import { EventSchema } from "@ag-ui/core/schemas";

const secret = "ag-ui-test-hs256-secret-of-32-bytes-or-more";

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

/** A token of the test tenant for `sub` with `roles` (comma-separated). */
export function token(roles, sub = "ann") {
  return execFileSync(required("NARAD_BIN"), ["token", "--org", "agui", "--sub", sub, "--roles", roles], {
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
 * The raw SSE frames of a body, as the bytes came: split on "\n\n" (AG-UI's
 * framing), each frame's `data:` lines joined; comment lines skipped. A
 * frame with anything but `data:` lines and comments is a failure. (Members
 * the schema does not know pass its loose objects; the client's enforce
 * stage warns of them, and the tests fail on that warning.)
 */
export function framesOf(text, failures) {
  const events = [];
  for (const frame of text.split("\n\n")) {
    if (frame.trim() === "") {
      continue;
    }
    const data = [];
    for (const line of frame.split("\n")) {
      if (line.startsWith(":")) {
        continue;
      }
      if (line.startsWith("data:")) {
        data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
      } else {
        failures.push(new Error(`a frame line that is no data: ${JSON.stringify(line)}`));
      }
    }
    if (data.length === 0) {
      continue;
    }
    let event;
    try {
      event = JSON.parse(data.join("\n"));
    } catch (e) {
      failures.push(new Error(`a frame that is no JSON: ${JSON.stringify(frame)}`));
      continue;
    }
    const checked = EventSchema.safeParse(event);
    if (!checked.success) {
      failures.push(new Error(`${JSON.stringify(event)}: ${checked.error.message}`));
    }
    events.push(event);
  }
  return events;
}

/**
 * An AG-UI conversation of thread `threadId` for the holder of `jwt`: an
 * unmodified HttpAgent whose fetch keeps each answer's raw frames
 * (`answers`: status, events) and checks every one with EventSchema
 * (`failures`); `seen` holds the events the agent's subscribers got, each
 * checked by EventSchema too.
 */
export function conversation(api, jwt, threadId, initialMessages) {
  const answers = [];
  const failures = [];
  const reading = [];
  const fetchImpl = async (url, init) => {
    const res = await fetch(url, init);
    const answer = { status: res.status, events: [], body: undefined, input: JSON.parse(init.body) };
    answers.push(answer);
    if (!res.ok || !res.body) {
      return res;
    }
    if (!String(res.headers.get("content-type")).startsWith("text/event-stream")) {
      failures.push(new Error(`content-type ${res.headers.get("content-type")}`));
    }
    const [mine, theirs] = res.body.tee();
    reading.push(
      (async () => {
        let text = "";
        try {
          const decoder = new TextDecoder();
          for await (const chunk of mine) {
            text += decoder.decode(chunk, { stream: true });
          }
        } catch (e) {
          answer.cut = String(e);
        }
        if (text.includes("\r")) {
          failures.push(new Error("CR in the stream: AG-UI frames with \\n only"));
        }
        answer.events = framesOf(text, failures);
      })(),
    );
    return new Response(theirs, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
  const agent = new HttpAgent({
    url: `${api}/v1/ag-ui`,
    threadId,
    headers: { Authorization: `Bearer ${jwt}` },
    fetch: fetchImpl,
    initialMessages,
  });
  const seen = [];
  const finished = [];
  agent.subscribe({
    onEvent: ({ event }) => {
      const checked = EventSchema.safeParse(event);
      if (!checked.success) {
        failures.push(new Error(`as the agent saw it: ${JSON.stringify(event)}: ${checked.error.message}`));
      }
      seen.push(event);
    },
    onRunFinishedEvent: (params) => {
      finished.push(params);
    },
  });
  return {
    agent,
    answers,
    failures,
    seen,
    finished,
    /** Waits for every answer read so far and asserts that each frame was valid. */
    async check() {
      await Promise.all(reading);
      assert.deepEqual(failures.map(String), [], "every frame is valid by EventSchema");
    },
  };
}

/** The assistant's text of run `runId` as narad's history holds it. */
export function saidInRun(events, runId) {
  const assistant = new Set();
  let text = "";
  for (const e of events) {
    if (e.rootRunId !== runId) {
      continue;
    }
    if (e.type === "message.text.started" && e.role === "assistant") {
      assistant.add(e.messageId);
    }
    if (e.type === "message.text.delta" && assistant.has(e.messageId)) {
      text += e.delta;
    }
  }
  return text;
}

/** The text of an agent's assistant messages after the user message `userId`. */
export function saidAfter(messages, userId) {
  const at = messages.findIndex((m) => m.id === userId);
  assert.ok(at >= 0, `the user message ${userId} is in the conversation`);
  return messages
    .slice(at + 1)
    .filter((m) => m.role === "assistant" && typeof m.content === "string")
    .map((m) => m.content)
    .join("");
}
