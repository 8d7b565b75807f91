import type { NaradClient } from "./client.js";
import { NaradError } from "./errors.js";
import type { Schemas } from "./types.js";

/** What a tool is handed besides its arguments. */
export interface ToolContext {
  /** The tool call. */
  toolCallId: string;
  /** The call's single-use token (the key of the store). */
  executionToken: string;
}

/** A client-side tool: its arguments in, its response (any JSON) out; throwing finishes the call `error`/`tool_error`. */
export type Tool = (args: unknown, context: ToolContext) => unknown;

/** A tool call's outcome, as its finish carries it. */
export interface ToolResult {
  outcome: "success" | "error";
  response: unknown;
  code?: string;
  message?: string;
}

/**
 * A delivered call as the store keeps it: recorded as accepted before its
 * tool runs, then with its result until the server has the finish.
 */
export interface TokenEntry {
  executionToken: string;
  /** The lease the call was delivered under (its finish names it). */
  leaseId: string;
  toolCallId: string;
  result?: ToolResult;
  /** The server has the finish (kept, so that the token is never run again). */
  finished?: boolean;
}

/**
 * Where an executor keeps the tokens it accepted, so that a restarted one
 * never runs a call again: durable in production ({@link IndexedDbTokenStore}
 * in a browser).
 */
export interface TokenStore {
  get(executionToken: string): Promise<TokenEntry | undefined>;
  put(entry: TokenEntry): Promise<void>;
  all(): Promise<TokenEntry[]>;
}

/** A store that lives as long as the page or process: for tests. */
export class MemoryTokenStore implements TokenStore {
  private readonly entries = new Map<string, TokenEntry>();
  async get(token: string): Promise<TokenEntry | undefined> {
    return this.entries.get(token);
  }
  async put(entry: TokenEntry): Promise<void> {
    this.entries.set(entry.executionToken, { ...entry });
  }
  async all(): Promise<TokenEntry[]> {
    return [...this.entries.values()];
  }
}

/** A browser's durable store: one IndexedDB database per executor. */
export class IndexedDbTokenStore implements TokenStore {
  private readonly db: Promise<IDBDatabase>;

  constructor(name: string) {
    this.db = new Promise((resolve, reject) => {
      const open = indexedDB.open(name, 1);
      open.onupgradeneeded = () => open.result.createObjectStore("tokens", { keyPath: "executionToken" });
      open.onsuccess = () => resolve(open.result);
      open.onerror = () => reject(open.error);
    });
  }

  private async run<T>(mode: IDBTransactionMode, work: (store: IDBObjectStore) => IDBRequest): Promise<T> {
    const db = await this.db;
    return new Promise((resolve, reject) => {
      const tx = db.transaction("tokens", mode);
      const request = work(tx.objectStore("tokens"));
      // Resolved once the transaction is durable, not when the request is.
      tx.oncomplete = () => resolve(request.result as T);
      tx.onerror = () => reject(tx.error);
      tx.onabort = () => reject(tx.error);
    });
  }

  get(token: string): Promise<TokenEntry | undefined> {
    return this.run("readonly", (s) => s.get(token));
  }
  async put(entry: TokenEntry): Promise<void> {
    await this.run("readwrite", (s) => s.put(entry));
  }
  all(): Promise<TokenEntry[]> {
    return this.run("readonly", (s) => s.getAll());
  }
}

/**
 * What the executor needs of a WebSocket: the global one (browsers, Node
 * 22, Node 20 with `--experimental-websocket`) and the `ws` package's both
 * fit, with no cast.
 */
export interface WebSocketLike {
  readonly readyState: number;
  onmessage: ((event: never) => void) | null;
  onclose: ((event: never) => void) | null;
  onerror: ((event: never) => void) | null;
  send(data: string): void;
  close(code?: number): void;
}

/** A WebSocket constructor: `new WebSocket(url, protocols)`. */
export type WebSocketConstructor = new (url: string, protocols: string[]) => WebSocketLike;

/** How an executor runs. */
export interface ExecutorOptions {
  /** The clientExecutorId it attaches as (runs started with it are its). */
  id: string;
  /** The tools it runs, by name. */
  tools: Record<string, Tool>;
  /** Where accepted tokens are kept (default: in memory). */
  store?: TokenStore;
  /**
   * The WebSocket constructor (default: the global one). Node 20 has no
   * global one without `--experimental-websocket`: pass the `ws` package's
   * (`import { WebSocket } from "ws"`).
   */
  WebSocket?: WebSocketConstructor;
  /** The longest wait between reattachments, in ms (default 10,000). */
  maxBackoffMs?: number;
  /** Called with the new lease each time the executor is attached. */
  onAttached?: (leaseId: string) => void;
}

type Execute = Schemas["control.client.tool.execute"];

/**
 * A client executor (spec §11): attaches over the WebSocket (the token as
 * a `narad.bearer.` subprotocol, as a browser must), runs only what
 * `client.tool.execute` assigns, records each token as accepted before its
 * tool runs and never runs a known token again (a token accepted by an
 * earlier page or process that never got a result is finished
 * `error`/`client_restarted`), sends heartbeats, finishes over HTTP under
 * the delivering lease until the server has the finish, and reattaches
 * with backoff when the socket closes, trying the client's servers in
 * turn. In Node 20 pass `WebSocket` (or run with
 * `--experimental-websocket`); Node 22 and browsers have one.
 */
export class Executor {
  private readonly store: TokenStore;
  private readonly WS: WebSocketConstructor;
  private stopped = false;
  private socket: WebSocketLike | undefined;
  private readonly sending = new Set<string>();
  /** Calls run by this instance, for tests and status displays. */
  readonly ran: string[] = [];

  constructor(
    private readonly client: NaradClient,
    private readonly options: ExecutorOptions,
  ) {
    this.store = options.store ?? new MemoryTokenStore();
    const ws = options.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    if (!ws) {
      throw new Error(
        "this runtime has no global WebSocket (Node 20 has one only with --experimental-websocket; " +
          "Node 22 and browsers have one): pass ExecutorOptions.WebSocket, e.g. the `ws` package's " +
          "(npm install ws; import { WebSocket } from \"ws\"; new Executor(client, { WebSocket, ... })), " +
          "or run node with --experimental-websocket",
      );
    }
    this.WS = ws;
  }

  /** Runs until {@link stop}: recovers, attaches, and reattaches. */
  async run(): Promise<void> {
    await this.recover();
    let backoff = 250;
    const max = this.options.maxBackoffMs ?? 10_000;
    while (!this.stopped) {
      const attached = await this.attachOnce();
      if (this.stopped) {
        return;
      }
      backoff = attached ? 250 : Math.min(backoff * 2, max);
      await new Promise((r) => setTimeout(r, backoff));
    }
  }

  /** Closes the socket and ends {@link run}. */
  stop(): void {
    this.stopped = true;
    this.socket?.close(1000);
  }

  /** Finishes, `client_restarted`, every token accepted without a result. */
  private async recover(): Promise<void> {
    for (const entry of await this.store.all()) {
      if (!entry.result && !entry.finished) {
        entry.result = {
          outcome: "error",
          response: null,
          code: "client_restarted",
          message: "the executor stopped while the tool ran; it is not run again",
        };
        await this.store.put(entry);
      }
    }
  }

  /** One socket, until it closes; whether it got attached. */
  private async attachOnce(): Promise<boolean> {
    const servers = this.client.serversInTurn();
    const server = servers[0] as string;
    const url = `${server.replace(/^http/, "ws")}/v1/executors/${encodeURIComponent(this.options.id)}/connect`;
    const token = await this.client.bearer();
    return new Promise((resolve) => {
      let attached = false;
      let heartbeat: ReturnType<typeof setInterval> | undefined;
      const socket = new this.WS(url, ["narad", `narad.bearer.${token}`]);
      this.socket = socket;
      socket.onmessage = (message: { data: unknown }) => {
        const control = JSON.parse(String(message.data)) as { type: string };
        if (control.type === "client.attached") {
          const a = control as Schemas["control.client.attached"];
          attached = true;
          heartbeat = setInterval(() => {
            socket.send(
              JSON.stringify({
                protocolVersion: "narad/v1",
                type: "client.heartbeat",
                clientExecutorId: this.options.id,
                leaseId: a.leaseId,
              }),
            );
          }, a.heartbeatIntervalMs);
          this.options.onAttached?.(a.leaseId);
          void this.flush();
        } else if (control.type === "client.tool.execute") {
          void this.handle(control as Execute);
        }
      };
      let ended = false;
      const end = () => {
        if (ended) {
          return;
        }
        ended = true;
        if (heartbeat) {
          clearInterval(heartbeat);
        }
        // Not attached here: the next attempt tries the next server.
        const next = servers[1];
        if (!attached && next !== undefined) {
          this.client.prefer(next);
        }
        resolve(attached);
      };
      socket.onclose = end;
      // An open socket's error is followed by close. A socket that never
      // opened may get no close event at all (Node's undici), and closing it
      // again would only raise another error: it ends here.
      socket.onerror = () => {
        if (socket.readyState === 1) {
          socket.close();
        } else {
          end();
        }
      };
    });
  }

  /** One delivery: run it once, ever. */
  private async handle(execute: Execute): Promise<void> {
    if (await this.store.get(execute.executionToken)) {
      return; // accepted before (by this page or an earlier one): never again
    }
    const entry: TokenEntry = {
      executionToken: execute.executionToken,
      leaseId: execute.leaseId,
      toolCallId: execute.toolCallId,
    };
    await this.store.put(entry);
    const tool = this.options.tools[execute.toolName];
    if (!tool) {
      entry.result = {
        outcome: "error",
        response: null,
        code: "unknown_tool",
        message: `this executor has no tool ${execute.toolName}`,
      };
    } else {
      this.ran.push(execute.toolCallId);
      try {
        const response = await tool(execute.args, {
          toolCallId: execute.toolCallId,
          executionToken: execute.executionToken,
        });
        entry.result = { outcome: "success", response: response ?? null };
      } catch (e) {
        entry.result = { outcome: "error", response: null, code: "tool_error", message: String(e) };
      }
    }
    await this.store.put(entry);
    await this.finish(entry);
  }

  /** Sends every result the server does not have yet. */
  private async flush(): Promise<void> {
    for (const entry of await this.store.all()) {
      if (entry.result && !entry.finished) {
        await this.finish(entry);
      }
    }
  }

  /** Sends one finish; marks the token finished once the server has it (or never will take it). */
  private async finish(entry: TokenEntry): Promise<void> {
    if (!entry.result || entry.finished || this.sending.has(entry.executionToken)) {
      return;
    }
    this.sending.add(entry.executionToken);
    try {
      await this.client.request("POST", `/v1/executors/${encodeURIComponent(this.options.id)}/finish`, {
        body: {
          protocolVersion: "narad/v1",
          type: "client.tool.finish",
          clientExecutorId: this.options.id,
          executionToken: entry.executionToken,
          leaseId: entry.leaseId,
          toolCallId: entry.toolCallId,
          ...entry.result,
        },
      });
      await this.store.put({ ...entry, finished: true });
    } catch (e) {
      // Refused for good (finished already, expired, not this executor's):
      // nothing to send again. Anything else is retried on the next attach.
      if (e instanceof NaradError && !e.retryable) {
        await this.store.put({ ...entry, finished: true });
      }
    } finally {
      this.sending.delete(entry.executionToken);
    }
  }
}
