import assert from "node:assert/strict";
import { test } from "node:test";

import { decode, parseSse } from "../src/index.js";

function streamOf(chunks: string[]): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  return new ReadableStream({
    start(controller) {
      for (const chunk of chunks) {
        controller.enqueue(encoder.encode(chunk));
      }
      controller.close();
    },
  });
}

test("the parser follows the HTML standard's event-stream rules", async () => {
  const chunks = [
    ": keep-alive\n\n",
    "event: capabilities\r\ndata: {\"a\":1}\r\n\r\n",
    "id: e1\ndata: {\"x\":\n",
    "data: 2}\n\n",
    "event: hydrate\ndata: {}\r",
    "\n\r\n",
    "data:no-space\n\n",
    "id: e2\ndata: half", // no blank line: never dispatched
  ];
  const events = [];
  for await (const e of parseSse(streamOf(chunks), "start")) {
    events.push(e);
  }
  assert.deepEqual(events, [
    { event: "capabilities", data: '{"a":1}', id: "start", ownId: false },
    { event: "message", data: '{"x":\n2}', id: "e1", ownId: true },
    // A frame without an id keeps the last one (the last event ID buffer).
    { event: "hydrate", data: "{}", id: "e1", ownId: false },
    { event: "message", data: "no-space", id: "e1", ownId: false },
  ]);
});

test("frames are told apart: authority events carry a sessionSequence", () => {
  assert.equal(decode("message", '{"type":"run.started","sessionSequence":3}', "e")?.kind, "authority");
  assert.equal(decode("message", '{"type":"session.revision","revision":4}', "w")?.kind, "watch");
  assert.equal(decode("replay-gap", '{"type":"replay-gap"}', undefined)?.kind, "replay-gap");
  assert.equal(decode("message", "not json", "e"), undefined);
  assert.deepEqual(decode("session-erased", '{"type":"session.erased","sessionId":"s1"}', "x"), {
    kind: "session-erased",
    sessionId: "s1",
  });
  assert.equal(decode("session-erased", '{"type":"session.erased"}', "x"), undefined);
});
