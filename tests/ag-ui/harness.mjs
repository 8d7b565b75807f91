// What the AG-UI tests share: what tests/front-ends/harness.mjs gives
// (narad started and killed on a port of its own, tokens, calls to the API,
// a session's history), with tokens of tenant "agui", and an unmodified
// HttpAgent whose fetch keeps the raw SSE frames of every answer and checks
// each with @ag-ui/core's own EventSchema.
//
// Environment (.ci/ag-ui sets it): NARAD_BIN, NARAD_DATABASE_URL (a fresh
// database), CHROMIUM (the browser binary; default /usr/bin/chromium),
// SCREENSHOTS (optional: a folder for pictures of the page).
import assert from "node:assert/strict";

import { HttpAgent } from "@ag-ui/client";
import { EventSchema } from "@ag-ui/core/schemas";

import { tokensOf } from "../front-ends/harness.mjs";

export * from "../front-ends/harness.mjs";

/** A token of the test tenant for `sub` with `roles` (comma-separated). */
export const token = tokensOf("agui");

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
