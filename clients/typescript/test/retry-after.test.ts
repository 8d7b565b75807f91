// Retry-After: a 429 (a limit of the tenant) is tried again once the
// server's wait has passed, for requests and for streams, within the
// client's budget. A scripted fetch stands for the server.
import assert from "node:assert/strict";
import { test } from "node:test";

import { follow, NaradClient, NaradError } from "../src/index.js";

const limited = () =>
  new Response(JSON.stringify({ code: "NRD-0501", title: "Over a limit", message: "commands per second" }), {
    status: 429,
    headers: { "content-type": "application/json", "retry-after": "1" },
  });

/** A fetch that answers `answers` in turn, counting the calls. */
function scripted(answers: (() => Response)[]): { fetch: typeof fetch; calls: () => number } {
  let n = 0;
  const fake = (async () => {
    const answer = answers[Math.min(n, answers.length - 1)]!;
    n += 1;
    return answer();
  }) as typeof fetch;
  return { fetch: fake, calls: () => n };
}

test("a request refused over a limit is sent again after Retry-After", async () => {
  const server = scripted([limited, () => Response.json({ sessionId: "s1", sessionSequence: 0 }, { status: 201 })]);
  const client = new NaradClient({ servers: "http://narad.test", token: "t", fetch: server.fetch });
  const started = Date.now();
  const made = await client.createSession({ sessionId: "s1" });
  assert.equal(made.sessionId, "s1");
  assert.equal(server.calls(), 2);
  assert.ok(Date.now() - started >= 950, `tried again after ${Date.now() - started} ms, before the 1 s asked for`);
});

test("past the client's budget the 429 is the answer, with the wait it asked for", async () => {
  const server = scripted([limited]);
  const client = new NaradClient({ servers: "http://narad.test", token: "t", fetch: server.fetch, maxRateLimitWaitMs: 500 });
  await assert.rejects(client.createSession({}), (e: unknown) => {
    assert.ok(e instanceof NaradError);
    assert.equal(e.status, 429);
    assert.equal(e.retryAfterMs, 1000);
    assert.equal(e.retryable, true);
    return true;
  });
  assert.equal(server.calls(), 1);
});

test("a stream refused at open over a limit opens again after Retry-After", async () => {
  const stream = () =>
    new Response('event: capabilities\ndata: {"protocolVersion":"narad/v1","profiles":[]}\n\n', {
      status: 200,
      headers: { "content-type": "text/event-stream" },
    });
  const server = scripted([limited, stream]);
  const client = new NaradClient({ servers: "http://narad.test", token: "t", fetch: server.fetch });
  const stop = new AbortController();
  const started = Date.now();
  for await (const frame of follow(client, { sessionId: "s1", signal: stop.signal, initialBackoffMs: 20 })) {
    assert.equal(frame.kind, "capabilities");
    stop.abort();
  }
  assert.equal(server.calls(), 2);
  assert.ok(Date.now() - started >= 950, `opened again after ${Date.now() - started} ms, before the 1 s asked for`);
});
