// Exactly once: a call whose answer is lost after the server acted is sent
// again with the same Idempotency-Key, answered with the server's replay of
// its first answer, and leaves its effect in the journal once. For every
// command, session creation (the command and POST /v1/sessions), a blob
// upload and a stream ticket; with one server (a proxy forwards the call,
// lets the server act and drops its answer; the client sends it again to
// the same server) and with two (two replicas of one database, each behind
// a proxy; the first drops the answer, the client fails over to the
// second). Servers of the test's own (retry-support's OwnServer: NARAD_BIN,
// else target/debug/narad, on a fresh database of NARAD_TEST_DATABASE_URL),
// and a tenant of its own per test, so that what a test counts (sessions,
// blobs, tickets, audit entries) is its own.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { NaradClient } from "../src/index.js";
import type { ProposedEvent } from "../src/index.js";
import { OwnServer, startProxy, type Mode, type Seen } from "./retry-support.js";

const ROLES = "reader,writer,backend,approver,admin";
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

let server: OwnServer;
let replica: OwnServer;

before(async () => {
  server = await OwnServer.start();
  replica = await server.replica();
});

after(async () => {
  await replica?.stop();
  await server?.stop();
});

let tenants = 0;

/** A tenant of its own for one test, and a client of it straight to the server (no proxy). */
function tenant(): { org: string; token: string; direct: NaradClient } {
  tenants += 1;
  const org = `exactly-once-${tenants}-${Math.random().toString(36).slice(2, 8)}`;
  const token = server.token(ROLES, org);
  return { org, token, direct: new NaradClient({ servers: server.url, token }) };
}

/** What a case's check gets. */
interface Done {
  direct: NaradClient;
  org: string;
  /** The session the call acted on (for a session's creation, the one it made). */
  sessionId: string;
  /** What the call answered. */
  answer: unknown;
}

/** A keyed call: where it posts, what it needs first, and how its one effect shows. */
interface Case {
  path: (sessionId: string) => string;
  /** Whether the test makes the session first (not for a session's creation). */
  session: boolean;
  setup?: (direct: NaradClient, sessionId: string) => Promise<void>;
  call: (narad: NaradClient, sessionId: string) => Promise<unknown>;
  /** Asserts the effect is there once. */
  once: (done: Done) => Promise<void>;
}

/** How many events of `type` the session's history holds. */
async function count(direct: NaradClient, sessionId: string, type: string): Promise<number> {
  let n = 0;
  for await (const e of direct.allHistory(sessionId)) if (e.type === type) n++;
  return n;
}

/** The audit log's entries of `action` on the session: those that acted, and the replays. */
async function audited(direct: NaradClient, sessionId: string, action: string): Promise<{ acted: number; replayed: number }> {
  const page = await direct.request<{ entries: { action: string; replayed: boolean }[] }>("GET", "/v1/audit", {
    query: { sessionId, action },
  });
  const of = page.entries.filter((e) => e.action === action);
  return { acted: of.filter((e) => !e.replayed).length, replayed: of.filter((e) => e.replayed).length };
}

/** The audit log holds `action` once as done and once as replayed. */
async function auditedOnce(direct: NaradClient, sessionId: string, action: string): Promise<void> {
  assert.deepEqual(await audited(direct, sessionId, action), { acted: 1, replayed: 1 }, `the audit log's ${action}`);
}

/** The tenant holds one session, the one the call made, audited once as made and once as replayed. */
async function oneSession({ direct, answer }: Done): Promise<void> {
  const { sessions } = await direct.listSessions();
  const made = (answer as { sessionId: string }).sessionId;
  assert.deepEqual(
    sessions.map((s) => s.sessionId),
    [made],
    "the tenant holds one session",
  );
  await auditedOnce(direct, made, "create-session");
}

/** One event of `type` in the session, and the command audited once (and its replay). */
const once =
  (type: string, action: string) =>
  async ({ direct, sessionId }: Done): Promise<void> => {
    assert.equal(await count(direct, sessionId, type), 1, `one ${type}`);
    await auditedOnce(direct, sessionId, action);
  };

const queuedStarts = async (direct: NaradClient, sessionId: string) =>
  (await direct.request<{ queuedStarts: { runId: string }[] }>("GET", `/v1/sessions/${encodeURIComponent(sessionId)}/queued-starts`))
    .queuedStarts;

/** Run `r1` of the session, asking a person (interrupt `i1`) and paused for the answer. */
async function openInterrupt(direct: NaradClient, sessionId: string): Promise<void> {
  await direct.command("start-run", { sessionId, runId: "r1" });
  const base = { protocolVersion: "narad/v1", rootRunId: "r1", runId: "r1" } as const;
  await direct.appendEvents(sessionId, [
    {
      ...base,
      type: "interrupt.requested",
      eventId: `${sessionId}-ask`,
      interruptId: "i1",
      waitId: "w1",
      kind: "approval",
      actions: ["approve", "deny"],
      message: "May I?",
    } as ProposedEvent,
    {
      ...base,
      type: "run.paused",
      eventId: `${sessionId}-pause`,
      waitId: "w1",
      interruptId: "i1",
      reason: "approval",
      resumeMode: "command",
    } as ProposedEvent,
  ]);
}

const command = (name: string) => () => `/v1/commands/${name}`;

const CASES: Record<string, Case> = {
  "POST /v1/sessions": {
    path: () => "/v1/sessions",
    session: false,
    call: (narad) => narad.createSession({ title: "made once" }),
    once: oneSession,
  },
  "create-session": {
    path: command("create-session"),
    session: false,
    call: (narad) => narad.command("create-session", { title: "made once" }),
    once: oneSession,
  },
  "start-run": {
    path: command("start-run"),
    session: true,
    // No runId: the server makes one, so the key alone keeps it once.
    call: (narad, sessionId) => narad.command("start-run", { sessionId, input: { n: 1 } }),
    once: async (done) => {
      await once("run.started", "start-run")(done);
      assert.deepEqual(await queuedStarts(done.direct, done.sessionId), []);
    },
  },
  "start-run, onConflict enqueue": {
    path: command("start-run"),
    session: true,
    setup: async (direct, sessionId) => {
      await direct.command("start-run", { sessionId, runId: "holding" });
    },
    call: (narad, sessionId) => narad.command("start-run", { sessionId, onConflict: "enqueue", input: { n: 1 } }),
    once: async ({ direct, sessionId, answer }) => {
      const queued = await queuedStarts(direct, sessionId);
      assert.equal(queued.length, 1, "one queued start");
      assert.equal(queued[0]?.runId, (answer as { runId: string }).runId);
      assert.equal(await count(direct, sessionId, "run.started"), 1, "the holding run only");
      assert.deepEqual(await audited(direct, sessionId, "start-run"), { acted: 2, replayed: 1 }, "the holding start and this one, and its replay");
    },
  },
  "stop-run": {
    path: command("stop-run"),
    session: true,
    setup: async (direct, sessionId) => {
      await direct.command("start-run", { sessionId, runId: "r1" });
    },
    call: (narad, sessionId) => narad.command("stop-run", { sessionId, runId: "r1", reason: "enough" }),
    once: once("run.stop.requested", "stop-run"),
  },
  "resolve-interrupt": {
    path: command("resolve-interrupt"),
    session: true,
    setup: openInterrupt,
    call: (narad, sessionId) => narad.command("resolve-interrupt", { sessionId, interruptId: "i1", decision: "approve" }),
    once: once("interrupt.resolved", "resolve-interrupt"),
  },
  "record-user-message": {
    path: command("record-user-message"),
    session: true,
    // No messageId: the server makes one, so the key alone keeps it once.
    call: (narad, sessionId) => narad.command("record-user-message", { sessionId, messageScope: "session", content: "said once" }),
    once: once("message.user.recorded", "record-user-message"),
  },
  "start-workflow": {
    path: command("start-workflow"),
    session: true,
    call: (narad, sessionId) => narad.command("start-workflow", { sessionId, input: { n: 1 } }),
    once: once("workflow.started", "start-workflow"),
  },
  "cancel-workflow": {
    path: command("cancel-workflow"),
    session: true,
    setup: async (direct, sessionId) => {
      await direct.command("start-workflow", { sessionId, workflowId: "w1" });
    },
    call: (narad, sessionId) => narad.command("cancel-workflow", { sessionId, workflowId: "w1", reason: "enough" }),
    once: once("workflow.cancelled", "cancel-workflow"),
  },
  "redact-message": {
    path: command("redact-message"),
    session: true,
    setup: async (direct, sessionId) => {
      await direct.command("record-user-message", { sessionId, messageScope: "session", content: "my number is 555", messageId: "m1" });
    },
    call: (narad, sessionId) =>
      narad.command("redact-message", { sessionId, messageId: "m1", reason: "pii", displayReplacement: "[removed]" }),
    once: once("message.redacted", "redact-message"),
  },
  "update-session": {
    path: command("update-session"),
    session: true,
    call: (narad, sessionId) => narad.command("update-session", { sessionId, title: "renamed once" }),
    // No event: the audit log shows it done once.
    once: async ({ direct, sessionId }) => {
      assert.equal((await direct.getSession(sessionId)).title, "renamed once");
      await auditedOnce(direct, sessionId, "update-session");
    },
  },
  "archive-session": {
    path: command("archive-session"),
    session: true,
    call: (narad, sessionId) => narad.command("archive-session", { sessionId }),
    // No event: archived once (the answer's archivedAt is the session's), audited once.
    once: async ({ direct, sessionId, answer }) => {
      const archivedAt = (answer as { archivedAt?: string }).archivedAt;
      assert.ok(archivedAt);
      assert.equal((await direct.getSession(sessionId)).archivedAt, archivedAt);
      await auditedOnce(direct, sessionId, "archive-session");
    },
  },
  uploadBlob: {
    path: (sessionId) => `/v1/sessions/${sessionId}/blobs`,
    session: true,
    call: (narad, sessionId) =>
      narad.uploadBlob(sessionId, "some bytes", { name: "a.txt", mediaType: "text/plain", attachmentId: "att-1" }),
    once: async ({ direct, org, sessionId, answer }) => {
      const blobs = server.sql(`select blob_id from blobs where tenant_id = '${org}' and session_id = '${sessionId}'`);
      assert.deepEqual(blobs.split("\n"), [(answer as { blobId: string }).blobId], "one blob");
      assert.equal(await count(direct, sessionId, "attachment.added"), 1, "added once");
      await auditedOnce(direct, sessionId, "upload-blob");
    },
  },
  streamTicket: {
    path: () => "/v1/stream-tickets",
    session: true,
    call: (narad, sessionId) => narad.streamTicket({ stream: "session", sessionId }),
    once: async ({ org }) => {
      assert.equal(server.sql(`select count(*) from stream_tickets where tenant_id = '${org}'`), "1", "one ticket");
    },
  },
};

/** The path of a request, without its query. */
const pathOf = (seen: Seen) => seen.path.split("?")[0];

/** A decision of a proxy: drop the answer of the first POST to `path`, pass everything else. */
function dropFirst(path: string): (seen: Seen) => Mode {
  let dropped = false;
  return (seen) => {
    if (!dropped && seen.method === "POST" && pathOf(seen) === path) {
      dropped = true;
      return "drop-answer";
    }
    return "pass";
  };
}

for (const [name, c] of Object.entries(CASES)) {
  for (const servers of ["one", "two"] as const) {
    const how =
      servers === "one"
        ? "one server: the answer is lost, the call is sent again to it"
        : "two replicas: the answer is lost, the call fails over to the other";
    test(`${name}, ${how} with its key, answered by the replay, done once`, { timeout: 30_000 }, async () => {
      const { org, token, direct } = tenant();
      const made = `s-${crypto.randomUUID()}`;
      if (c.session) {
        await direct.createSession({ sessionId: made });
      }
      await c.setup?.(direct, made);
      const path = c.path(made);
      const first = await startProxy(server.url, dropFirst(path));
      const second = servers === "two" ? await startProxy(replica.url, () => "pass") : undefined;
      try {
        const narad = new NaradClient({ servers: second ? [first.url, second.url] : first.url, token });
        const answer = await c.call(narad, made);
        const sent = [...first.seen, ...(second?.seen ?? [])]
          .filter((s) => s.method === "POST" && pathOf(s) === path)
          .sort((a, b) => a.order - b.order);
        assert.deepEqual(
          sent.map((s) => s.outcome),
          ["dropped", "answered"],
          "the server acted, its answer was lost, the call was sent again once",
        );
        const [lost, again] = sent as [Seen, Seen];
        assert.ok(lost.status !== undefined && lost.status < 300, `the server acted: ${lost.status} ${lost.answer}`);
        assert.equal(lost.replayed, false);
        assert.match(lost.key ?? "", UUID, "a key made for the call");
        assert.equal(again.key, lost.key, "the same key again");
        assert.equal(again.body, lost.body, "the same request again");
        assert.equal(again.proxy, (second ?? first).url, servers === "one" ? "to the same server" : "to the other replica");
        assert.equal(again.replayed, true, "answered by the replay (Idempotent-Replayed: true)");
        assert.equal(again.status, lost.status);
        assert.deepEqual(JSON.parse(again.answer ?? ""), JSON.parse(lost.answer ?? ""), "the first answer again");
        assert.deepEqual(answer, JSON.parse(again.answer ?? ""), "the call answered the replay");
        const sessionId = c.session ? made : (answer as { sessionId: string }).sessionId;
        await c.once({ direct, org, sessionId, answer });
      } finally {
        await first.close();
        await second?.close();
      }
    });
  }
}

test("the harness sees a second effect: a resend under a new key records the message twice", async () => {
  // A fetch that gives every request a key of its own, as a client that
  // made its key per attempt would: the tests above would fail on it.
  const forgetful: typeof fetch = (input, init) => {
    const headers = new Headers(init?.headers);
    if (headers.has("idempotency-key")) headers.set("idempotency-key", crypto.randomUUID());
    return fetch(input, { ...init, headers });
  };
  const { token, direct } = tenant();
  const sessionId = `s-${crypto.randomUUID()}`;
  await direct.createSession({ sessionId });
  const path = "/v1/commands/record-user-message";
  const proxy = await startProxy(server.url, dropFirst(path));
  try {
    const narad = new NaradClient({ servers: proxy.url, token, fetch: forgetful });
    await narad.command("record-user-message", { sessionId, messageScope: "session", content: "said twice" });
    const sent = proxy.seen.filter((s) => pathOf(s) === path);
    assert.deepEqual(sent.map((s) => [s.outcome, s.replayed]), [["dropped", false], ["answered", false]]);
    assert.notEqual(sent[0]?.key, sent[1]?.key);
    assert.equal(await count(direct, sessionId, "message.user.recorded"), 2);
  } finally {
    await proxy.close();
  }
});
