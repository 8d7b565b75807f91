// A restart of the only server: appends and commands carry on through it,
// and what the server did before it died is not done twice. The test
// starts a `narad serve` of its own (NARAD_BIN, else target/debug/narad;
// a database on NARAD_TEST_DATABASE_URL), kills it (SIGKILL) and starts it
// again on the same port and database.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { NaradClient, UnavailableError } from "../src/index.js";
import type { AuthorityEvent, ProposedEvent } from "../src/index.js";
import { OwnServer, startProxy } from "./retry-support.js";

let server: OwnServer;
let token: string;

before(async () => {
  server = await OwnServer.start();
  token = server.token();
});

after(async () => {
  await server?.stop();
});

const note = (eventId: string): ProposedEvent => ({
  protocolVersion: "narad/v1",
  type: "session.custom",
  eventId,
  name: "sdk.restart",
  value: { eventId },
});

async function journal(client: NaradClient, sessionId: string): Promise<AuthorityEvent[]> {
  const all: AuthorityEvent[] = [];
  for await (const e of client.allHistory(sessionId)) all.push(e);
  return all;
}

test("a command and an append sent while the only server is down succeed once it is back, once each", { timeout: 120_000 }, async () => {
  const narad = new NaradClient({ servers: server.url, token });
  const { sessionId } = await narad.createSession({ title: "restart" });
  await server.kill();
  const started = Date.now();
  const command = narad.command("record-user-message", { sessionId, messageScope: "session", content: "through a restart" });
  const append = narad.appendEvents(sessionId, [note(`${sessionId}-1`)]);
  // Not safe to send again, and it never reached a server: thrown at once, not waited for.
  await assert.rejects(narad.request("POST", "/v1/runtime/claims", { body: { waitMs: 0 } }), (e: unknown) => {
    assert.ok(e instanceof UnavailableError, String(e));
    assert.equal(e.maybeProcessed, false);
    return true;
  });
  await new Promise((r) => setTimeout(r, 2000));
  await server.restart();
  const [said, appended] = await Promise.all([command, append]);
  assert.ok(Date.now() - started >= 2000, "answered after the restart");
  assert.equal(appended.duplicate, false);
  assert.equal(said.sessionId, sessionId);
  const events = await journal(narad, sessionId);
  assert.equal(events.filter((e) => e.type === "message.user.recorded").length, 1);
  assert.equal(events.filter((e) => e.type === "session.custom").length, 1);
});

test("the server dies after an append and a command, before answering: sent again through its restart, done once", { timeout: 120_000 }, async () => {
  let restarting: Promise<void> | undefined;
  // In front of the server: the first append and the first command reach
  // it; it acts, and is killed before its answer leaves; it comes back a
  // second later. Requests meanwhile lose their connections.
  const crashes = new Set(["/events", "/v1/commands/record-user-message"]);
  const proxy = await startProxy(
    server.url,
    (seen) => (seen.method === "POST" && [...crashes].some((p) => seen.path.endsWith(p)) ? "drop-answer" : "pass"),
    async (seen, status) => {
      const which = [...crashes].find((p) => seen.path.endsWith(p));
      if (seen.method !== "POST" || which === undefined || status >= 300) return;
      crashes.delete(which);
      await server.kill();
      restarting = new Promise((r) => setTimeout(r, 1000)).then(() => server.restart());
    },
  );
  try {
    const narad = new NaradClient({ servers: proxy.url, token });
    const direct = new NaradClient({ servers: server.url, token });
    const { sessionId } = await narad.createSession({ title: "restart after acting" });

    const appended = await narad.appendEvents(sessionId, [note(`${sessionId}-1`)]);
    await restarting;
    assert.equal(appended.duplicate, true, "the batch written before the crash, answered again");
    const appends = proxy.seen.filter((s) => s.method === "POST" && s.path.endsWith("/events"));
    assert.ok(appends.length >= 2, `sent again (${appends.length} times)`);

    const said = await narad.command("record-user-message", { sessionId, messageScope: "session", content: "once" });
    await restarting;
    const commands = proxy.seen.filter((s) => s.path === "/v1/commands/record-user-message");
    assert.ok(commands.length >= 2, `sent again (${commands.length} times)`);
    assert.ok(commands[0]!.key);
    assert.ok(commands.every((c) => c.key === commands[0]!.key), "with the same key every time");
    // The first reached the server, which acted and died; those sent while
    // it was down lost their connections; the one after the restart was
    // answered with the replay of the first answer.
    assert.equal(commands[0]!.outcome, "dropped");
    const answered = commands.filter((c) => c.outcome === "answered");
    assert.equal(answered.length, 1);
    assert.equal(answered[0]!.replayed, true, "answered by the replay");
    assert.deepEqual(said, JSON.parse(commands[0]!.answer ?? ""), "the first answer again");

    const events = await journal(direct, sessionId);
    assert.equal(events.filter((e) => e.type === "session.custom").length, 1, "the append written once");
    assert.equal(events.filter((e) => e.type === "message.user.recorded").length, 1, "the command done once");
  } finally {
    await restarting;
    await proxy.close();
  }
});
