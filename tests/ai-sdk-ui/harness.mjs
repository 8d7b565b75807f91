// What the AI SDK UI tests share: what tests/front-ends/harness.mjs gives
// (narad started and killed on a port of its own, tokens, calls to the API,
// a session's history), with tokens of tenant "aisdk", a transport whose
// every chunk is checked by the `ai` package's own schema, the AI SDK's chat
// engine without React, and the run's transcript read from narad's history
// in the shape of a UI message.
//
// Environment (.ci/ai-sdk-ui sets it): NARAD_BIN, NARAD_DATABASE_URL (a
// fresh database), CHROMIUM (the browser binary; default /usr/bin/chromium),
// SCREENSHOTS (optional: a folder for pictures of the page).
import assert from "node:assert/strict";

import {
  AbstractChat,
  DefaultChatTransport,
  isToolUIPart,
  getToolName,
  parseJsonEventStream,
  uiMessageChunkSchema,
} from "ai";

import { tokensOf } from "../front-ends/harness.mjs";

export * from "../front-ends/harness.mjs";

/** A token of the test tenant for `sub` with `roles` (comma-separated). */
export const token = tokensOf("aisdk");

/**
 * A `fetch` for DefaultChatTransport that checks every answer of the chat
 * routes with the package's own reader: the protocol header, and each
 * chunk parsed by `parseJsonEventStream` with `uiMessageChunkSchema` (a
 * chunk that fails it is recorded in `failures`). `answers` holds, per
 * request, its method, status and chunks.
 */
export function checkedFetch() {
  const answers = [];
  const failures = [];
  const reading = [];
  const fetchImpl = async (input, init) => {
    const res = await fetch(input, init);
    const answer = { method: init?.method ?? "GET", url: String(input), status: res.status, chunks: [], body: undefined };
    answers.push(answer);
    if (!res.ok || res.status === 204 || !res.body) {
      return res;
    }
    if (res.headers.get("x-vercel-ai-ui-message-stream") !== "v1") {
      failures.push(new Error(`${answer.method} ${answer.url}: no x-vercel-ai-ui-message-stream: v1`));
    }
    const [mine, theirs] = res.body.tee();
    reading.push(
      (async () => {
        try {
          for await (const r of parseJsonEventStream({ stream: mine, schema: uiMessageChunkSchema })) {
            if (r.success) {
              answer.chunks.push(r.value);
            } else {
              failures.push(r.error);
              answer.chunks.push({ invalid: r.rawValue });
            }
          }
        } catch (e) {
          // The connection went away (an abort): the chunks so far stand.
          answer.cut = String(e);
        }
      })(),
    );
    return new Response(theirs, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
  return {
    fetch: fetchImpl,
    answers,
    failures,
    /** Waits for every answer read so far and asserts that each chunk was valid. */
    async check() {
      await Promise.all(reading);
      assert.deepEqual(failures.map(String), [], "every chunk is valid by uiMessageChunkSchema");
    },
  };
}

/** DefaultChatTransport for `api`/v1/chat (on `queue`) with a bearer token and a checked fetch. */
export function transport(api, jwt, queue, checked) {
  return new DefaultChatTransport({
    api: `${api}/v1/chat?queue=${encodeURIComponent(queue)}`,
    headers: () => ({ authorization: `Bearer ${jwt}` }),
    fetch: checked.fetch,
  });
}

class NodeChatState {
  constructor(messages = []) {
    this.messages = messages;
    this.status = "ready";
    this.error = undefined;
  }
  pushMessage = (m) => {
    this.messages = this.messages.concat([m]);
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (i, m) => {
    this.messages = [...this.messages.slice(0, i), this.snapshot(m), ...this.messages.slice(i + 1)];
  };
  snapshot = (v) => structuredClone(v);
}

/** useChat's engine (the AI SDK's AbstractChat) with its state in memory: what a page runs, without React. */
export class NodeChat extends AbstractChat {
  constructor({ messages, ...init }) {
    super({ ...init, state: new NodeChatState(messages) });
  }
}

/**
 * A UI message as a comparable list: text and reasoning (adjacent pieces
 * joined), and tool parts by id, name, input, state and outcome; step
 * boundaries and narad's data parts left out.
 */
export function shapeOfMessage(message) {
  const out = [];
  for (const part of message.parts) {
    if (part.type === "text" || part.type === "reasoning") {
      const last = out.at(-1);
      if (last?.kind === part.type) {
        last.text += part.text;
      } else {
        out.push({ kind: part.type, text: part.text });
      }
    } else if (isToolUIPart(part)) {
      const tool = { kind: "tool", toolCallId: part.toolCallId, toolName: getToolName(part), input: part.input, state: part.state };
      if (part.state === "output-available") {
        tool.output = part.output;
      }
      if (part.state === "output-error") {
        tool.errorText = part.errorText;
      }
      out.push(tool);
    }
  }
  return out.filter((p) => p.kind === "tool" || p.text !== "");
}

/**
 * Run `runId`'s transcript from narad's history, in the same shape: the
 * assistant's text and reasoning as said, the tool calls with their
 * arguments and results, an interrupt about a tool as that tool's part
 * (`interrupt:<id>`), decided or not.
 */
export function shapeOfRun(events, runId) {
  const out = [];
  const tools = new Map();
  const assistant = new Set();
  const said = (kind, text) => {
    const last = out.at(-1);
    if (last?.kind === kind) {
      last.text += text;
    } else {
      out.push({ kind, text });
    }
  };
  for (const e of events) {
    if (e.rootRunId !== runId) {
      continue;
    }
    switch (e.type) {
      case "message.text.started":
        if (e.role === "assistant") {
          assistant.add(e.messageId);
        }
        break;
      case "message.text.delta":
        if (assistant.has(e.messageId)) {
          said("text", e.delta);
        }
        break;
      case "reasoning.delta":
        said("reasoning", e.delta);
        break;
      case "tool.call.started": {
        const tool = { kind: "tool", toolCallId: e.toolCallId, toolName: e.toolName, input: e.args, state: "input-available" };
        tools.set(e.toolCallId, tool);
        out.push(tool);
        break;
      }
      case "tool.call.finished": {
        const tool = tools.get(e.toolCallId);
        if (e.outcome === "success") {
          Object.assign(tool, { state: "output-available", output: e.response });
        } else {
          Object.assign(tool, { state: "output-error", errorText: e.message || e.code || e.outcome });
        }
        break;
      }
      case "interrupt.requested":
        if (e.input?.toolName) {
          const tool = {
            kind: "tool",
            toolCallId: `interrupt:${e.interruptId}`,
            toolName: e.input.toolName,
            input: e.input.args ?? {},
            state: "approval-requested",
          };
          tools.set(e.interruptId, tool);
          out.push(tool);
        }
        break;
      case "interrupt.resolved": {
        const tool = tools.get(e.interruptId);
        if (tool && e.decision === "approve") {
          const output = { decision: e.decision };
          if (e.reason != null) {
            output.reason = e.reason;
          }
          Object.assign(tool, { state: "output-available", output });
        } else if (tool) {
          tool.state = "output-denied";
        }
        break;
      }
      default:
    }
  }
  return out.filter((p) => p.kind === "tool" || p.text !== "");
}

/** The text of a UI message's text parts. */
export function textOf(message) {
  return message.parts
    .filter((p) => p.type === "text")
    .map((p) => p.text)
    .join("");
}
