// follow() says when a connection ends and it goes on to reconnect
// (`onDisconnected`), so that a view can stop calling itself live until
// frames flow again; it says nothing when the caller stops it.
import assert from "node:assert/strict";
import { test } from "node:test";

import { follow, NaradClient } from "../src/index.js";

const said = (seq: number) => ({
  protocolVersion: "narad/v1",
  type: "message.user.recorded",
  eventId: `e${seq}`,
  timestamp: "2026-12-01T00:00:00Z",
  sessionId: "ses-a",
  sessionSequence: seq,
  messageId: `m${seq}`,
  messageScope: "session",
  content: `line ${seq}`,
});

/** Each connection serves two frames after Last-Event-ID, then ends. */
function twoPerConnection(): typeof fetch {
  const frames = [1, 2, 3, 4].map((n) => `id: f${n}\ndata: ${JSON.stringify(said(n))}\n\n`);
  return (async (_input: string | URL | Request, init?: RequestInit) => {
    const after = new Headers(init?.headers).get("Last-Event-ID");
    const from = after === null ? 0 : Number(after.slice(1));
    return new Response(frames.slice(from, from + 2).join(""), { headers: { "content-type": "text/event-stream" } });
  }) as typeof fetch;
}

test("a connection that ends is reported before the frames of the next one", { timeout: 5_000 }, async () => {
  const client = new NaradClient({ servers: "http://narad.test", token: "t", fetch: twoPerConnection() });
  const seen: string[] = [];
  const abort = new AbortController();
  for await (const frame of follow(client, {
    signal: abort.signal,
    initialBackoffMs: 1,
    onDisconnected: () => seen.push("disconnected"),
  })) {
    if (frame.kind === "authority") seen.push(`#${frame.event.sessionSequence}`);
    if (seen.length === 5) {
      abort.abort();
      break;
    }
  }
  assert.deepEqual(seen, ["#1", "#2", "disconnected", "#3", "#4"]);
});

test("stopping the follow is not a disconnection", async () => {
  const client = new NaradClient({ servers: "http://narad.test", token: "t", fetch: twoPerConnection() });
  let disconnected = 0;
  for await (const frame of follow(client, { onDisconnected: () => (disconnected += 1) })) {
    if (frame.kind === "authority") break;
  }
  assert.equal(disconnected, 0);
});
