// The retry policy of NaradClient.send and the Idempotency-Key of keyed
// calls. Scripted fetches for the policy's arithmetic; recording HTTP
// proxies in front of a real server (NARAD_URL, NARAD_TOKEN) for lost
// answers and failover: a proxy forwards a request, lets the server act,
// and then drops the connection instead of answering.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { NaradClient, NaradError, UnavailableError, neverSent, safeToSendAgain } from "../src/index.js";
import type { ProposedEvent } from "../src/index.js";
import { closedUrl, startProxy, type Proxy } from "./retry-support.js";

const url = process.env["NARAD_URL"];
const token = process.env["NARAD_TOKEN"];
if (!url || !token) {
  throw new Error("set NARAD_URL and NARAD_TOKEN: these tests run against a narad server");
}

const connectionRefused = () =>
  new TypeError("fetch failed", { cause: Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:1"), { code: "ECONNREFUSED" }) });
const connectionReset = () =>
  new TypeError("fetch failed", { cause: Object.assign(new Error("other side closed"), { code: "UND_ERR_SOCKET" }) });

/** A fetch that plays `script` in turn (the last step again when it runs out), recording each request. */
function scripted(script: (() => Response | Error)[]) {
  const calls: { url: string; method: string; key: string | null; at: number }[] = [];
  const fake = (async (input: string | URL | Request, init?: RequestInit) => {
    const headers = new Headers(init?.headers);
    calls.push({ url: String(input), method: init?.method ?? "GET", key: headers.get("idempotency-key"), at: Date.now() });
    const step = script[Math.min(calls.length - 1, script.length - 1)]!();
    if (step instanceof Error) throw step;
    return step;
  }) as typeof fetch;
  return { fetch: fake, calls };
}

const ok = (body: unknown = { sessionId: "s1", sessionSequence: 0 }, status = 200) => () => Response.json(body, { status });
const unavailable = (status = 503, retryAfter?: string) => () =>
  new Response(JSON.stringify({ code: "NRD-0901", title: "Database unavailable", message: "down" }), {
    status,
    headers: { "content-type": "application/json", ...(retryAfter ? { "retry-after": retryAfter } : {}) },
  });

test("what is safe to send again: idempotent methods, keyed requests, appends, lease and executor upkeep; not claims", () => {
  assert.equal(safeToSendAgain("GET", "/v1/sessions/s1", {}), true);
  assert.equal(safeToSendAgain("DELETE", "/v1/sessions/s1", {}), true);
  assert.equal(safeToSendAgain("POST", "/v1/sessions/s1/events", {}), true);
  assert.equal(safeToSendAgain("POST", "/v1/runtime/leases/l1/heartbeat", {}), true);
  assert.equal(safeToSendAgain("POST", "/v1/runtime/leases/l1/release", {}), true);
  assert.equal(safeToSendAgain("POST", "/v1/executors/e1/finish", {}), true);
  assert.equal(safeToSendAgain("POST", "/v1/commands/start-run", { "Idempotency-Key": "k" }), true);
  assert.equal(safeToSendAgain("POST", "/v1/commands/start-run", {}), false);
  assert.equal(safeToSendAgain("POST", "/v1/runtime/claims", {}), false);
  assert.equal(safeToSendAgain("POST", "/v1/executors/e1/attach", {}), false);
  assert.equal(safeToSendAgain("PATCH", "/v1/blobs/b1/upload", {}), false);
});

test("a refused connection never reached a server; a connection lost after sending may have", async () => {
  assert.equal(neverSent(connectionRefused()), true);
  assert.equal(neverSent(connectionReset()), false);
  assert.equal(neverSent(new TypeError("Failed to fetch")), false, "a browser's error says nothing: it may have been sent");
  // Real errors of this runtime's fetch.
  const refused = await fetch(`${await closedUrl()}/v1/sessions`, { method: "POST" }).then(
    () => undefined,
    (e: unknown) => e,
  );
  assert.ok(refused !== undefined);
  assert.equal(neverSent(refused), true, `connection refused: ${String((refused as Error).cause)}`);
  const blocked = await fetch("http://127.0.0.1:9/", { method: "POST" }).then(
    () => undefined,
    (e: unknown) => e,
  );
  assert.equal(neverSent(blocked), true, `a port fetch blocks: ${String((blocked as Error).cause)}`);
  const hangUp = createServer((req) => req.on("data", () => undefined).on("end", () => req.socket.destroy()));
  await new Promise<void>((resolve) => hangUp.listen(0, "127.0.0.1", resolve));
  try {
    const lost = await fetch(`http://127.0.0.1:${(hangUp.address() as AddressInfo).port}/v1/runtime/claims`, {
      method: "POST",
      body: "{}",
    }).then(
      () => undefined,
      (e: unknown) => e,
    );
    assert.ok(lost !== undefined);
    assert.equal(neverSent(lost), false, `connection closed after sending: ${String((lost as Error).cause)}`);
  } finally {
    hangUp.closeAllConnections();
    hangUp.close();
  }
});

test("every keyed call sends a new key, the caller's when given, the same on every try", async () => {
  const server = scripted([() => connectionReset(), unavailable(503), ok()]);
  const client = new NaradClient({ servers: "http://narad.test", token: "t", fetch: server.fetch, retry: { initialBackoffMs: 10 } });
  await client.createSession({});
  assert.equal(server.calls.length, 3, "a reset and a 503 are tried again");
  const key = server.calls[0]!.key;
  assert.match(key ?? "", /^[0-9a-f-]{36}$/);
  assert.deepEqual(server.calls.map((c) => c.key), [key, key, key]);
  await client.command("stop-run", { runId: "r1" });
  assert.notEqual(server.calls[3]!.key, key, "another call, another key");
  await client.command("stop-run", { runId: "r1" }, { idempotencyKey: "mine-1" });
  assert.equal(server.calls[4]!.key, "mine-1");
  await client.streamTicket({ stream: "session", sessionId: "s1" });
  await client.uploadBlob("s1", "x", { name: "x.txt", idempotencyKey: "up-1" });
  assert.ok(server.calls[5]!.key);
  assert.equal(server.calls[6]!.key, "up-1");
  await assert.rejects(client.command("stop-run", { runId: "r1" }, { idempotencyKey: "" }), TypeError);
  await assert.rejects(client.command("stop-run", { runId: "r1" }, { idempotencyKey: "x".repeat(256) }), TypeError);
  await assert.rejects(client.command("stop-run", { runId: "r1" }, { idempotencyKey: "é" }), TypeError);
  // The server refuses a key with a space (400): the SDK says so before sending.
  await assert.rejects(client.command("stop-run", { runId: "r1" }, { idempotencyKey: "two words" }), TypeError);
});

test("a request not safe to send again goes to another server only when it never reached one", async () => {
  // A 503 and a lost connection: it may have acted; thrown, never sent again.
  for (const failure of [unavailable(503), () => connectionReset()]) {
    const server = scripted([failure, ok()]);
    const client = new NaradClient({ servers: ["http://a.test", "http://b.test"], token: "t", fetch: server.fetch });
    await assert.rejects(client.request("POST", "/v1/runtime/claims", { body: {} }), (e: unknown) => {
      assert.ok(e instanceof UnavailableError, String(e));
      assert.equal(e.maybeProcessed, true);
      return true;
    });
    assert.equal(server.calls.length, 1);
  }
  // A refused connection: the next server.
  const server = scripted([() => connectionRefused(), ok({})]);
  const client = new NaradClient({ servers: ["http://a.test", "http://b.test"], token: "t", fetch: server.fetch });
  await client.request("POST", "/v1/runtime/claims", { body: {} });
  assert.deepEqual(server.calls.map((c) => new URL(c.url).host), ["a.test", "b.test"]);
  // Every server refused: thrown after one round, never waited for.
  const none = scripted([() => connectionRefused()]);
  const nowhere = new NaradClient({ servers: ["http://a.test", "http://b.test"], token: "t", fetch: none.fetch });
  await assert.rejects(nowhere.request("POST", "/v1/runtime/claims", { body: {} }), (e: unknown) => e instanceof UnavailableError && !e.maybeProcessed);
  assert.equal(none.calls.length, 2);
});

test("a keyed request whose first try is still being answered (409 NRD-0212) is sent again after Retry-After", async () => {
  const inFlight = () =>
    new Response(JSON.stringify({ code: "NRD-0212", title: "In flight", message: "the first request with this key is still being answered" }), {
      status: 409,
      headers: { "content-type": "application/json", "retry-after": "1" },
    });
  const server = scripted([inFlight, ok({ sessionId: "s1", runId: "r1" }, 201)]);
  const client = new NaradClient({ servers: "http://narad.test", token: "t", fetch: server.fetch, retry: { initialBackoffMs: 1 } });
  const started = Date.now();
  await client.command("start-run", { sessionId: "s1", runId: "r1" });
  assert.equal(server.calls.length, 2);
  assert.equal(server.calls[0]!.key, server.calls[1]!.key);
  assert.ok(server.calls[1]!.at - started >= 950, `sent again after ${server.calls[1]!.at - started} ms`);
  // Any other 409 is the answer.
  const busy = scripted([
    () => new Response(JSON.stringify({ code: "NRD-0204", title: "Session busy", message: "busy" }), { status: 409 }),
  ]);
  const other = new NaradClient({ servers: "http://narad.test", token: "t", fetch: busy.fetch });
  await assert.rejects(other.command("start-run", { sessionId: "s1" }), (e: unknown) => e instanceof NaradError && e.code === "NRD-0204");
  assert.equal(busy.calls.length, 1);
});

test("a request safe to send again is retried within its budget, with backoff, then thrown", async () => {
  const server = scripted([() => connectionRefused()]);
  const client = new NaradClient({
    servers: ["http://a.test", "http://b.test"],
    token: "t",
    fetch: server.fetch,
    retry: { maxElapsedMs: 800, initialBackoffMs: 50, maxBackoffMs: 200 },
  });
  const started = Date.now();
  await assert.rejects(client.getSession("s1"), (e: unknown) => e instanceof UnavailableError && e.status === 0);
  const took = Date.now() - started;
  assert.ok(took >= 750 && took < 2000, `gave up after ${took} ms`);
  assert.ok(server.calls.length >= 6, `${server.calls.length} tries`);
  // Each round tries both servers; rounds are spaced by the backoff.
  assert.deepEqual(server.calls.slice(0, 2).map((c) => new URL(c.url).host), ["a.test", "b.test"]);
  // A Retry-After longer than what is left: thrown at once, not waited for.
  const slow = scripted([unavailable(503, "5")]);
  const impatient = new NaradClient({ servers: "http://a.test", token: "t", fetch: slow.fetch, retry: { maxElapsedMs: 1000 } });
  const t0 = Date.now();
  await assert.rejects(impatient.getSession("s1"), (e: unknown) => e instanceof UnavailableError && e.retryAfterMs === 5000);
  assert.ok(Date.now() - t0 < 500);
  assert.equal(slow.calls.length, 1);
  // A 503 on the only server, then an answer: waited out.
  const restarting = scripted([unavailable(503, "1"), unavailable(502), ok()]);
  const patient = new NaradClient({ servers: "http://a.test", token: "t", fetch: restarting.fetch });
  const t1 = Date.now();
  await patient.getSession("s1");
  assert.equal(restarting.calls.length, 3);
  assert.ok(restarting.calls[1]!.at - t1 >= 950, "Retry-After honoured");
});

test("an abort stops the retries at once", async () => {
  const server = scripted([() => connectionRefused()]);
  const client = new NaradClient({ servers: "http://a.test", token: "t", fetch: server.fetch, retry: { initialBackoffMs: 5_000 } });
  const stop = new AbortController();
  setTimeout(() => stop.abort(new Error("stopped")), 100);
  const started = Date.now();
  await assert.rejects(client.request("GET", "/v1/sessions", { signal: stop.signal }), /stopped/);
  assert.ok(Date.now() - started < 2000);
});

const note = (eventId: string): ProposedEvent => ({
  protocolVersion: "narad/v1",
  type: "session.custom",
  eventId,
  name: "sdk.retry",
  value: { eventId },
});

test("failover with the answer lost: an append is written once, a command keeps its key and is done once", async () => {
  // A: forwards every POST and drops its answer; B: passes everything.
  const a = await startProxy(url, (seen) => (seen.method === "POST" ? "drop-answer" : "pass"));
  const b = await startProxy(url, () => "pass");
  try {
    const narad = new NaradClient({ servers: [a.url, b.url], token });
    const direct = new NaradClient({ servers: url, token });
    const { sessionId } = await direct.createSession({ title: "failover" });

    const appended = await narad.appendEvents(sessionId, [note(`${sessionId}-1`)]);
    assert.equal(appended.duplicate, true, "B answered the batch A had written");
    const appends = (proxy: Proxy) => proxy.seen.filter((s) => s.path.endsWith("/events") && s.method === "POST").length;
    assert.equal(appends(a), 1);
    assert.equal(appends(b), 1);
    const customs = async () => {
      let n = 0;
      for await (const e of direct.allHistory(sessionId)) if (e.type === "session.custom") n++;
      return n;
    };
    assert.equal(await customs(), 1);

    // A client of its own, so that A is tried first again.
    const other = new NaradClient({ servers: [a.url, b.url], token });
    const said = await other.command("record-user-message", { sessionId, messageScope: "session", content: "once" });
    const sent = [...a.seen, ...b.seen].filter((s) => s.path === "/v1/commands/record-user-message");
    assert.equal(sent.length, 2, "sent to A, then again to B");
    assert.ok(sent[0]!.key, "with a key");
    assert.equal(sent[0]!.key, sent[1]!.key, "the same key both times");
    assert.deepEqual(sent.map((s) => [s.proxy, s.outcome, s.replayed]), [[a.url, "dropped", false], [b.url, "answered", true]]);
    assert.deepEqual(said, JSON.parse(sent[0]!.answer ?? ""), "answered A's first answer, replayed by B");
    let messages = 0;
    for await (const e of direct.allHistory(sessionId)) if (e.type === "message.user.recorded") messages++;
    assert.equal(messages, 1, "the server answered the key once");
  } finally {
    await a.close();
    await b.close();
  }
});

test("a request not safe to send again is not sent again after the server got it", async () => {
  const a = await startProxy(url, () => "drop-answer");
  const b = await startProxy(url, () => "pass");
  try {
    const narad = new NaradClient({ servers: [a.url, b.url], token });
    const claim = { waitMs: 0, queue: `nobody-${crypto.randomUUID()}` };
    await assert.rejects(narad.request("POST", "/v1/runtime/claims", { body: claim }), (e: unknown) => {
      assert.ok(e instanceof UnavailableError, String(e));
      assert.equal(e.maybeProcessed, true);
      return true;
    });
    assert.equal(a.seen.length, 1);
    assert.equal(b.seen.length, 0, "never sent to B");
    // A request that never reached a server (A refuses) goes to B.
    await a.close();
    const answered = await narad.request("POST", "/v1/runtime/claims", { body: claim });
    assert.equal(answered, undefined, "nothing to claim (204)");
    assert.equal(b.seen.length, 1);
  } finally {
    await a.close();
    await b.close();
  }
});
