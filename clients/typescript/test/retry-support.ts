// What the retry tests share: a recording HTTP proxy that can lose
// answers, and a `narad serve` of the test's own that can be killed and
// started again on the same port and database, with replicas on that
// database.
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** A request a proxy saw, and what became of its answer. */
export interface Seen {
  method: string;
  path: string;
  key: string | undefined;
  /** The request's body, as text. */
  body: string;
  /** The URL of the proxy that saw it. */
  proxy: string;
  /** Its place among the requests every proxy of this process saw (to order requests seen by several). */
  order: number;
  /**
   * What the proxy did: `answered` (the server's answer forwarded),
   * `dropped` (the server answered, the connection was closed instead),
   * `reset` (closed without forwarding), `failed` (the server could not
   * be reached); undefined while it is under way.
   */
  outcome?: "answered" | "dropped" | "reset" | "failed";
  /** The server's status, when it answered. */
  status?: number;
  /** Whether the server's answer said `Idempotent-Replayed: true`. */
  replayed?: boolean;
  /** The server's answer body, as text. */
  answer?: string;
}

let seenInAll = 0;

/**
 * What a proxy does with a request: forward it and its answer (`pass`),
 * forward it and close the connection instead of answering
 * (`drop-answer`: the server acted, the client never hears), or close the
 * connection without forwarding (`reset`).
 */
export type Mode = "pass" | "drop-answer" | "reset";

/** A recording HTTP proxy in front of a server. */
export interface Proxy {
  url: string;
  seen: Seen[];
  close(): Promise<void>;
}

/**
 * A proxy in front of `upstream` that records every request and does what
 * `decide` says with it; `answered` is told of each answer it forwarded
 * or dropped (and may act, e.g. kill the server, before the client hears).
 * A request it cannot forward (the server down) loses its connection.
 */
export async function startProxy(
  upstream: string,
  decide: (seen: Seen, n: number) => Mode,
  answered?: (seen: Seen, status: number, mode: Mode) => Promise<void> | void,
): Promise<Proxy> {
  const seen: Seen[] = [];
  const server: Server = createServer((req, res) => {
    void (async () => {
      const body = await read(req);
      const key = req.headers["idempotency-key"];
      const one: Seen = {
        method: req.method ?? "GET",
        path: req.url ?? "/",
        key: typeof key === "string" ? key : undefined,
        body: body.toString("utf8"),
        proxy: url,
        order: ++seenInAll,
      };
      seen.push(one);
      const mode = decide(one, seen.length);
      if (mode === "reset") {
        one.outcome = "reset";
        req.socket.destroy();
        return;
      }
      const headers: Record<string, string> = {};
      for (const [name, value] of Object.entries(req.headers)) {
        if (typeof value === "string" && !["host", "connection", "content-length", "keep-alive"].includes(name)) {
          headers[name] = value;
        }
      }
      const init: RequestInit = { method: one.method, headers };
      if (body.length > 0) init.body = new Uint8Array(body);
      let answer: Response;
      try {
        answer = await fetch(upstream + one.path, init);
      } catch (e) {
        one.outcome = "failed";
        throw e;
      }
      const bytes = new Uint8Array(await answer.arrayBuffer());
      one.status = answer.status;
      one.replayed = answer.headers.get("idempotent-replayed") === "true";
      one.answer = new TextDecoder().decode(bytes);
      await answered?.(one, answer.status, mode);
      if (mode === "drop-answer") {
        one.outcome = "dropped";
        req.socket.destroy();
        return;
      }
      one.outcome = "answered";
      const out: Record<string, string> = {};
      answer.headers.forEach((value, name) => {
        if (!["content-length", "connection", "keep-alive", "transfer-encoding", "content-encoding"].includes(name)) out[name] = value;
      });
      res.writeHead(answer.status, out);
      res.end(bytes);
    })().catch(() => req.socket.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  const url = `http://127.0.0.1:${port}`;
  return {
    url,
    seen,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

function read(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

const REPO = fileURLToPath(new URL("../../../../", import.meta.url));
const ADMIN_URL = process.env["NARAD_TEST_DATABASE_URL"] ?? "postgres://postgres@127.0.0.1:5432/postgres";
const SECRET = "typescript-sdk-restart-test-hs256-secret-of-32-bytes";

/**
 * A `narad serve` of the test's own, as .ci/lib/test-server.sh starts one
 * (the binary: `NARAD_BIN`, else this repository's `target/debug/narad`;
 * a fresh database on `NARAD_TEST_DATABASE_URL`), that can be killed and
 * started again on the same port and database.
 */
export class OwnServer {
  /** Its URL, the same across restarts. */
  url = "";
  private process: ChildProcess | undefined;
  private readonly env: NodeJS.ProcessEnv;
  private readonly work: string;

  private constructor(
    private readonly binary: string,
    /** Its database (on NARAD_TEST_DATABASE_URL's server). */
    readonly database: string,
    /** Whether its database is its own, dropped when it stops (not a replica's). */
    private readonly ownsDatabase = true,
  ) {
    this.work = mkdtempSync(join(tmpdir(), "narad-ts-restart-"));
    this.env = {
      ...process.env,
      NARAD_JWT_HS256_SECRET: SECRET,
      NARAD_DATABASE_URL: `${ADMIN_URL.slice(0, ADMIN_URL.lastIndexOf("/"))}/${database}`,
      NARAD_HOME: join(this.work, "home"),
      RUST_LOG: process.env["RUST_LOG"] ?? "warn",
    };
  }

  /** Starts a server on a fresh database; throws, saying why, when it cannot. */
  static async start(): Promise<OwnServer> {
    const binary = process.env["NARAD_BIN"] ?? join(REPO, "target", "debug", "narad");
    if (!existsSync(binary)) {
      throw new Error(`no narad binary at ${binary}: build it (cargo build -p narad) or set NARAD_BIN`);
    }
    const database = `narad_ts_${process.pid}_${Math.random().toString(36).slice(2, 10)}`;
    psql(`create database ${database}`);
    const server = new OwnServer(binary, database);
    await server.serve("127.0.0.1:0");
    return server;
  }

  /**
   * Another replica of this server: a `narad serve` of its own on the same
   * database (its `stop()` leaves the database to this one).
   */
  async replica(): Promise<OwnServer> {
    const replica = new OwnServer(this.binary, this.database, false);
    await replica.serve("127.0.0.1:0");
    return replica;
  }

  /** Runs `query` on its database (as the test Postgres's admin, whom row-level security does not bind); answers psql's unaligned output. */
  sql(query: string): string {
    const url = `${ADMIN_URL.slice(0, ADMIN_URL.lastIndexOf("/"))}/${this.database}`;
    return execFileSync("psql", ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", url, "-c", query], { encoding: "utf8" }).trim();
  }

  /** A token of tenant `org` with `roles`. */
  token(roles = "reader,writer,backend", org = "ts-restart", sub = "sdk"): string {
    return execFileSync(this.binary, ["token", "--org", org, "--sub", sub, "--roles", roles], { env: this.env, encoding: "utf8" }).trim();
  }

  /** Kills the server (SIGKILL: a crash, nothing answered after it) and waits for it to exit. */
  async kill(): Promise<void> {
    const p = this.process;
    if (p === undefined || p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise((resolve) => p.once("exit", resolve));
    p.kill("SIGKILL");
    await exited;
  }

  /** Starts it again on the same port and database. */
  async restart(): Promise<void> {
    await this.kill();
    await this.serve(new URL(this.url).host);
  }

  /** Stops it and drops its database. */
  async stop(): Promise<void> {
    const p = this.process;
    if (p !== undefined && p.exitCode === null && p.signalCode === null) {
      const exited = new Promise((resolve) => p.once("exit", resolve));
      p.kill("SIGTERM");
      await exited;
    }
    if (this.ownsDatabase) {
      try {
        psql(`drop database if exists ${this.database} with (force)`);
      } catch {
        // Left for the machine's cleanup.
      }
    }
    rmSync(this.work, { recursive: true, force: true });
  }

  private async serve(listen: string): Promise<void> {
    const stdout = join(this.work, `stdout-${Date.now()}`);
    const log = join(this.work, "server.log");
    const child = spawn(this.binary, ["serve"], {
      env: { ...this.env, NARAD_LISTEN: listen },
      stdio: ["ignore", openSync(stdout, "w"), openSync(log, "a")],
    });
    this.process = child;
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline) {
      const line = readFileSync(stdout, "utf8")
        .split("\n")
        .find((l) => l.startsWith("narad is serving on "));
      if (line !== undefined) {
        this.url = line.slice("narad is serving on ".length).trim().replace(/\/+$/, "");
        return;
      }
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new Error(`narad serve exited before serving: ${readFileSync(log, "utf8").slice(-2000)}`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`narad serve did not start within 60 s: ${readFileSync(log, "utf8").slice(-2000)}`);
  }
}

function psql(sql: string): void {
  execFileSync("psql", ["-X", "-q", "-v", "ON_ERROR_STOP=1", ADMIN_URL, "-c", sql], { stdio: ["ignore", "ignore", "pipe"] });
}

/** A URL where nothing listens (a port just given up by the kernel): its connections are refused. */
export async function closedUrl(): Promise<string> {
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address() as AddressInfo;
  await new Promise((resolve) => probe.close(resolve));
  return `http://127.0.0.1:${port}`;
}
