// Errors by class of answer: every refusal is a NaradError (status, code,
// envelope) of the subclass of its status. Scripted answers for each
// class, then real refusals of a server (NARAD_URL, NARAD_TOKEN).
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  AuthError,
  ConflictError,
  GoneError,
  InvalidRequestError,
  NaradClient,
  NaradError,
  NotFoundError,
  RateLimitedError,
  UnavailableError,
  errorOf,
} from "../src/index.js";
import { closedUrl } from "./retry-support.js";

const url = process.env["NARAD_URL"];
const token = process.env["NARAD_TOKEN"];
if (!url || !token) {
  throw new Error("set NARAD_URL and NARAD_TOKEN: these tests run against a narad server");
}

const envelope = (status: number, code: string, extra: Record<string, unknown> = {}, headers: Record<string, string> = {}) =>
  new Response(JSON.stringify({ code, title: "t", message: "m", ...extra }), {
    status,
    headers: { "content-type": "application/json", "x-request-id": "req-1", ...headers },
  });

test("errorOf gives the subclass of each class of answer, each a NaradError", async () => {
  const cases: [Response, new (...args: never[]) => NaradError, string][] = [
    [envelope(400, "NRD-0003", { fields: { "/title": "not a string" } }), InvalidRequestError, "InvalidRequestError"],
    [envelope(422, "NRD-0211"), InvalidRequestError, "InvalidRequestError"],
    [envelope(401, "NRD-0101"), AuthError, "AuthError"],
    [envelope(403, "NRD-0102"), AuthError, "AuthError"],
    [envelope(404, "NRD-0007"), NotFoundError, "NotFoundError"],
    [envelope(409, "NRD-0205", { details: { decision: "deny" } }), ConflictError, "ConflictError"],
    [envelope(410, "NRD-0208"), GoneError, "GoneError"],
    [envelope(429, "NRD-0602", {}, { "retry-after": "2" }), RateLimitedError, "RateLimitedError"],
    [envelope(502, "NRD-0001"), UnavailableError, "UnavailableError"],
    [envelope(503, "NRD-0901", {}, { "retry-after": "1" }), UnavailableError, "UnavailableError"],
    [new Response("gateway timeout", { status: 504 }), UnavailableError, "UnavailableError"],
    [envelope(500, "NRD-0001"), NaradError, "NaradError"],
  ];
  for (const [response, Class, name] of cases) {
    const status = response.status;
    const e = await errorOf(response);
    assert.ok(e instanceof Class, `${status} is a ${name}`);
    assert.ok(e instanceof NaradError, `${status} is a NaradError`);
    assert.ok(e instanceof Error);
    assert.equal(e.name, name);
    assert.equal(e.status, status);
    assert.equal(e.requestId, status === 504 ? undefined : "req-1");
  }
  const invalid = await errorOf(envelope(400, "NRD-0003", { fields: { "/title": "not a string" } }));
  assert.deepEqual(invalid.fields, { "/title": "not a string" });
  assert.equal(invalid.code, "NRD-0003");
  assert.equal(invalid.message, "NRD-0003: m");
  const resolved = await errorOf(envelope(409, "NRD-0205", { details: { decision: "deny" } }));
  assert.ok(resolved instanceof ConflictError);
  assert.equal(resolved.decision, "deny");
  assert.deepEqual(resolved.details, { decision: "deny" });
  assert.equal(resolved.retryable, false);
  const inFlight = await errorOf(envelope(409, "NRD-0212", {}, { "retry-after": "1" }));
  assert.ok(inFlight instanceof ConflictError);
  assert.equal(inFlight.retryable, true);
  assert.equal(inFlight.retryAfterMs, 1000);
  const limited = await errorOf(envelope(429, "NRD-0602", {}, { "retry-after": "2" }));
  assert.equal(limited.retryAfterMs, 2000);
  assert.equal(limited.retryable, true);
  const dated = await errorOf(envelope(503, "NRD-0901", {}, { "retry-after": new Date(Date.now() + 3000).toUTCString() }));
  assert.ok(dated.retryAfterMs !== undefined && dated.retryAfterMs > 1000 && dated.retryAfterMs <= 3000, String(dated.retryAfterMs));
  const unavailable = await errorOf(new Response("bad gateway", { status: 502 }));
  assert.ok(unavailable instanceof UnavailableError);
  assert.equal(unavailable.maybeProcessed, true);
  assert.equal(unavailable.code, undefined);
  assert.deepEqual(unavailable.details, {});
});

test("a server's refusals arrive as their subclasses, with code and details", async () => {
  const narad = new NaradClient({ servers: url, token });
  await assert.rejects(narad.getSession("no-such-session-at-all"), (e: unknown) => {
    assert.ok(e instanceof NotFoundError && e instanceof NaradError);
    assert.equal(e.status, 404);
    assert.equal(e.code, "NRD-0007");
    return true;
  });
  const { sessionId } = await narad.createSession({ title: "errors" });
  await narad.command("start-run", { sessionId, runId: "busy-1" });
  await assert.rejects(narad.command("start-run", { sessionId, runId: "busy-2" }), (e: unknown) => {
    assert.ok(e instanceof ConflictError, String(e));
    assert.equal(e.status, 409);
    assert.equal(e.code, "NRD-0204");
    const active = e.details["activeExecution"] as Record<string, unknown> | undefined;
    assert.ok(active, `details name the active execution: ${JSON.stringify(e.body)}`);
    assert.ok(JSON.stringify(active).includes("busy-1"), JSON.stringify(active));
    return true;
  });
  await assert.rejects(
    narad.command("record-user-message", { sessionId, messageScope: "run", content: "x" }),
    (e: unknown) => e instanceof InvalidRequestError && e.status === 400 && Object.keys(e.fields).length > 0,
  );
  const stranger = new NaradClient({ servers: url, token: "not-a-token" });
  await assert.rejects(stranger.getSession(sessionId), (e: unknown) => e instanceof AuthError && e.status === 401);
  const nowhere = new NaradClient({ servers: await closedUrl(), token, retry: { maxElapsedMs: 0 } });
  await assert.rejects(nowhere.getSession(sessionId), (e: unknown) => {
    assert.ok(e instanceof UnavailableError);
    assert.equal(e.status, 0);
    assert.equal(e.maybeProcessed, false, "a refused connection reached nothing");
    return true;
  });
});
