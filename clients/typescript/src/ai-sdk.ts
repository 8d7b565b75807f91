/**
 * The AI SDK (`ai`, v7) as a narad agent: {@link aiSdkHandler} makes a
 * `Runtime` handler that runs `streamText` on each claimed run and journals
 * what it streams as the narad events that mean the same thing, so that
 * every narad client (the console, the reducers, `narad tail`) shows it
 * without knowing the AI SDK. Imported from `@narad/client/ai-sdk`: the
 * package's main entry never loads `ai`, an optional peer dependency.
 *
 * | AI SDK (`fullStream` part, tool)        | narad event                                              |
 * | --------------------------------------- | -------------------------------------------------------- |
 * | `text-start` / `text-delta` / `text-end`| `message.text.started` / `.delta` / `.completed` (run scope) |
 * | `reasoning-start` / `-delta` / `-end`   | `reasoning.started` / `.delta` / `.completed`            |
 * | a tool's `execute` (backend)            | `tool.call.started` / `.finished` (`executor: "backend"`) |
 * | a tool that throws (`tool-error`)       | `tool.call.finished` outcome `error`, code `tool_error`  |
 * | a tool named in `clientTools`           | `tool.call.started` (`executor: "client"`), its result from the run's executor |
 * | `tool-approval-request` (`needsApproval`) | `interrupt.requested` + `run.paused`; the decision → `tool-approval-response` |
 * | `finish` (`totalUsage`)                 | `run.finished` with `usage`                              |
 * | a narad stop → `abortSignal` → `abort`  | `run.cancelled` (`stopped`) with the usage so far        |
 * | `error` (the model failed)              | `run.error` with a code (`api_call_error`, …) and the usage so far |
 *
 * **Ids and takeover.** Every step is keyed (see `StepOptions` of the run
 * context): a tool call by the model's toolCallId (`{runId}.{toolCallId}.tool`,
 * `.client`, `.approval`), a text or reasoning block by the model call it
 * belongs to and its place there (`{runId}.step2.text0.message`). A runtime
 * that takes the run over replays the conversation: a finished tool call
 * answers its recorded result without running again, a decided approval
 * answers its decision, a completed message is not said again and a half
 * message is carried on from where the journal stops. This holds for a
 * model that answers a replayed call as it did before (the AI SDK's mock
 * models, a recorded or cached provider); see docs/integrations/ai-sdk.md
 * for a model that answers otherwise.
 */
import { isStepCount, streamText } from "ai";
import type { LanguageModel, LanguageModelUsage, ModelMessage, StopCondition, Tool, ToolApprovalResponse, ToolExecutionOptions, ToolSet } from "ai";

import { HANDLER_ERROR, LeaseLost, RunStopped } from "./run-errors.js";
import { REPLAY_DIVERGED, ReplayDiverged } from "./run-context.js";
import type { RunContext, Usage } from "./run-context.js";
import type { RunHandler } from "./runtime.js";
import type { TextStream } from "./text-stream.js";

export { REPLAY_DIVERGED, ReplayDiverged } from "./run-context.js";

/** What `streamText` is given besides what the handler sets (model, tools, messages, stopWhen, abortSignal). */
export type StreamTextSettings = Omit<
  Parameters<typeof streamText>[0],
  "model" | "tools" | "messages" | "prompt" | "stopWhen" | "abortSignal" | "instructions" | "system"
>;

/** A tool call waiting for a person's decision, as {@link AiSdkHandlerOptions.approval} describes it. */
export interface ApprovalCall {
  /** The model's toolCallId. */
  readonly toolCallId: string;
  /** The tool. */
  readonly toolName: string;
  /** Its input, as the model gave it. */
  readonly input: unknown;
}

/** How {@link aiSdkHandler} runs the AI SDK. */
export interface AiSdkHandlerOptions {
  /** The language model (a provider's, or `MockLanguageModelV4` from `ai/test`). */
  model: LanguageModel;
  /** The tools (`tool({...})` of `ai`). Their `execute` runs through the run's journal. */
  tools?: Record<string, Tool<any, any, any>>; // any tool, as streamText's own ToolSet
  /**
   * Tools run by the run's client executor rather than here: their calls go
   * to the executor the run is bound to (`clientExecutorId`), and its
   * result goes back to the model. Such a tool needs no `execute`.
   */
  clientTools?: readonly string[];
  /** The system prompt (`instructions` of `streamText`). */
  instructions?: string;
  /** When a `streamText` call stops taking steps (default `isStepCount(20)`); counted per call (a decided approval starts another). */
  stopWhen?: StopCondition<ToolSet> | StopCondition<ToolSet>[];
  /** More options of `streamText` (temperature, maxRetries, providerOptions, …). */
  settings?: StreamTextSettings;
  /**
   * The conversation the model is given (default: the session's user
   * messages and completed assistant messages recorded before the run, then
   * the run's `input` when it is a string or has a string `prompt`).
   */
  messages?: (ctx: RunContext) => ModelMessage[] | Promise<ModelMessage[]>;
  /** The interrupt's message and title for a tool call that needs approval (default: "Run {toolName}?"). */
  approval?: (call: ApprovalCall) => { message: string; title?: string };
  /** The code of the `run.error` a model's error ends the run in (default: the error's name in snake case, e.g. `api_call_error`). */
  errorCode?: (error: unknown) => string;
}

/**
 * A `Runtime` handler that drives the AI SDK's `streamText` on each run and
 * journals it (see the module documentation for the mapping):
 *
 * ```ts
 * import { Runtime } from "@narad/client";
 * import { aiSdkHandler } from "@narad/client/ai-sdk";
 * const runtime = new Runtime(narad, { queue: "agents", handler: aiSdkHandler({ model, tools }) });
 * ```
 *
 * The run ends `run.finished` with the AI SDK's `totalUsage` when the model
 * is done; `run.cancelled` (usage so far) on a narad stop, which aborts
 * `streamText`; `run.error` with a code when the model fails (or
 * `replay_diverged` when a takeover's replay meets another tool than the
 * journal holds). A lost lease is left to the runtime.
 */
export function aiSdkHandler(options: AiSdkHandlerOptions): RunHandler {
  return async (ctx: RunContext) => {
    if (ctx.ended) {
      return;
    }
    const usage = new UsageCounter();
    try {
      await new Drive(ctx, options, usage).run();
    } catch (error) {
      if (error instanceof LeaseLost || ctx.lost()) {
        throw error;
      }
      if (ctx.ended) {
        return;
      }
      if (error instanceof RunStopped || ctx.stopRequested()) {
        await ctx.cancel(usage.fields());
        return;
      }
      const code = error instanceof ReplayDiverged ? REPLAY_DIVERGED : error instanceof ModelFailed ? (options.errorCode ?? errorCode)(error.cause) : HANDLER_ERROR;
      const message =
        error instanceof ReplayDiverged
          ? "the run's replay took another path than its journal"
          : error instanceof ModelFailed
            ? `the model call failed (${code})`
            : "the agent failed: its handler met an error";
      await ctx.fail(code, message, usage.fields());
      if (!(error instanceof ModelFailed) && !(error instanceof ReplayDiverged)) {
        throw error; // the runtime reports it (the run has ended)
      }
    }
  };
}

/** The model (or the AI SDK) reported an error part: the run ends `run.error`. */
class ModelFailed extends Error {
  constructor(cause: unknown) {
    super("the model call failed", { cause });
    this.name = "ModelFailed";
  }
}

/** Token counters added up over the run's model calls. */
class UsageCounter {
  private readonly counts: Record<string, number> = {};

  /** Adds an AI SDK usage (undefined counters are left out). */
  add(usage: LanguageModelUsage | undefined): void {
    if (usage === undefined) {
      return;
    }
    for (const name of ["inputTokens", "outputTokens", "totalTokens"] as const) {
      const value = usage[name];
      if (typeof value === "number" && Number.isFinite(value) && value >= 0) {
        this.counts[name] = (this.counts[name] ?? 0) + value;
      }
    }
  }

  /** Adds what `other` counted, and empties it. */
  take(other: UsageCounter): void {
    for (const [name, value] of Object.entries(other.counts)) {
      this.counts[name] = (this.counts[name] ?? 0) + value;
      delete other.counts[name];
    }
  }

  /** Forgets what was counted. */
  clear(): void {
    for (const name of Object.keys(this.counts)) {
      delete this.counts[name];
    }
  }

  /** `{ usage }` when something was counted, else `{}` (for the terminal's fields). */
  fields(): { usage?: Usage } {
    return Object.keys(this.counts).length > 0 ? { usage: { ...this.counts } } : {};
  }
}

/** A promise with its resolver. */
function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve: () => void = () => undefined;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

/** A step key of a model's id: the id itself, unless all digits (those are positions). */
function keyOf(id: string): string {
  return /^[0-9]*$/.test(id) ? `call-${id}` : id;
}

/** One run driven by `streamText`, call after call while approvals are decided. */
class Drive {
  /** Tool calls the stream has reached: a tool's step waits for its call's part, so that text before it is journaled first. */
  private readonly seen = new Map<string, { promise: Promise<void>; resolve: () => void }>();
  /** What a tool's execute met that ends the run (a stop, a lost lease, a diverged replay). */
  private fatal: unknown;
  private readonly abort = new AbortController();
  private readonly tools: ToolSet;
  /** The model calls so far (`finish-step`s), over every `streamText` call. */
  private step = 0;

  constructor(
    private readonly ctx: RunContext,
    private readonly options: AiSdkHandlerOptions,
    private readonly usage: UsageCounter,
  ) {
    this.tools = this.wrapTools((options.tools ?? {}) as ToolSet);
  }

  async run(): Promise<void> {
    const { ctx, options } = this;
    const stop = () => this.abort.abort(ctx.signal.reason);
    if (ctx.signal.aborted) {
      stop();
    }
    ctx.signal.addEventListener("abort", stop);
    try {
      let messages = options.messages ? await options.messages(ctx) : await conversation(ctx);
      for (;;) {
        ctx.checkRunning();
        const { approvals, response } = await this.call(messages);
        if (approvals.length === 0) {
          break;
        }
        const decided: ToolApprovalResponse[] = [];
        for (const request of approvals) {
          decided.push(await this.decide(request));
        }
        messages = [...messages, ...(await response).messages, { role: "tool", content: decided }];
      }
      await ctx.finish(this.usage.fields());
    } finally {
      ctx.signal.removeEventListener("abort", stop);
    }
  }

  /** One `streamText` call, journaled part by part; answers the approvals it asks for. */
  private async call(messages: ModelMessage[]): Promise<{
    approvals: { approvalId: string; toolCallId: string; toolName: string; input: unknown }[];
    response: PromiseLike<{ messages: ModelMessage[] }>;
  }> {
    const { ctx, options } = this;
    const result = streamText({
      onError: () => undefined, // error parts are journaled, not logged
      ...options.settings,
      model: options.model,
      tools: this.tools,
      messages,
      ...(options.instructions === undefined ? {} : { instructions: options.instructions }),
      stopWhen: options.stopWhen ?? isStepCount(20),
      abortSignal: this.abort.signal,
    });
    const texts = new Map<string, TextStream>();
    const thoughts = new Map<string, TextStream>();
    let ordinal = 0;
    const partial = new UsageCounter();
    const approvals: { approvalId: string; toolCallId: string; toolName: string; input: unknown }[] = [];
    let failure: { error: unknown } | undefined;
    let aborted = false;
    try {
      for await (const part of result.fullStream) {
        switch (part.type) {
          case "start-step":
            ordinal = 0;
            break;
          case "text-start":
            texts.set(part.id, ctx.message("assistant", { key: `step${this.step}.text${ordinal++}` }));
            break;
          case "text-delta": {
            let stream = texts.get(part.id);
            if (stream === undefined) {
              stream = ctx.message("assistant", { key: `step${this.step}.text${ordinal++}` });
              texts.set(part.id, stream);
            }
            if (part.text !== "") {
              await stream.say(part.text);
            }
            break;
          }
          case "text-end":
            await texts.get(part.id)?.complete();
            texts.delete(part.id);
            break;
          case "reasoning-start":
            thoughts.set(part.id, await ctx.reasoning({ key: `step${this.step}.reasoning${ordinal++}` }));
            break;
          case "reasoning-delta":
            if (part.text !== "") {
              let stream = thoughts.get(part.id);
              if (stream === undefined) {
                stream = await ctx.reasoning({ key: `step${this.step}.reasoning${ordinal++}` });
                thoughts.set(part.id, stream);
              }
              await stream.say(part.text);
            }
            break;
          case "reasoning-end":
            await thoughts.get(part.id)?.complete();
            thoughts.delete(part.id);
            break;
          case "tool-call":
            this.reached(part.toolCallId);
            break;
          case "tool-approval-request":
            this.reached(part.toolCall.toolCallId);
            approvals.push({ approvalId: part.approvalId, toolCallId: part.toolCall.toolCallId, toolName: part.toolCall.toolName, input: part.toolCall.input });
            break;
          case "finish-step":
            partial.add(part.usage);
            this.step += 1;
            break;
          case "finish":
            // The call's own total, in place of the sum of its steps.
            this.usage.add(part.totalUsage);
            partial.clear();
            break;
          case "abort":
            aborted = true;
            break;
          case "error":
            failure ??= { error: part.error };
            break;
          default:
            break;
        }
      }
    } catch (error) {
      this.usage.take(partial); // the steps this call finished: partial usage
      throw this.fatal ?? error;
    }
    this.usage.take(partial);
    if (this.fatal !== undefined) {
      throw this.fatal;
    }
    if (ctx.lost()) {
      throw new LeaseLost(ctx.runId);
    }
    if (aborted || ctx.stopRequested()) {
      throw new RunStopped(ctx.runId);
    }
    if (failure !== undefined) {
      throw new ModelFailed(failure.error);
    }
    for (const stream of [...thoughts.values(), ...texts.values()]) {
      await stream.complete();
    }
    return { approvals, response: result.response };
  }

  /** Asks a person about a tool call that needs approval (keyed by its toolCallId); answers the AI SDK's response. */
  private async decide(request: { approvalId: string; toolCallId: string; toolName: string; input: unknown }): Promise<ToolApprovalResponse> {
    const call = { toolCallId: request.toolCallId, toolName: request.toolName, input: request.input };
    const asked = this.options.approval?.(call) ?? { message: `Run ${request.toolName}?` };
    const approval = await this.ctx.approve(asked.message, {
      key: keyOf(request.toolCallId),
      ...(asked.title === undefined ? {} : { title: asked.title }),
      input: { toolName: request.toolName, args: request.input ?? null },
    });
    const response: ToolApprovalResponse = {
      type: "tool-approval-response",
      approvalId: request.approvalId,
      approved: approval.decision === "approve",
    };
    const reason = approval.reason ?? (approval.decision === "approve" ? undefined : `the person's decision: ${approval.decision}`);
    if (reason !== undefined) {
      response.reason = reason;
    }
    return response;
  }

  /** The stream reached tool call `toolCallId`. */
  private reached(toolCallId: string): void {
    this.waiter(toolCallId).resolve();
  }

  private waiter(toolCallId: string): { promise: Promise<void>; resolve: () => void } {
    let waiting = this.seen.get(toolCallId);
    if (waiting === undefined) {
      waiting = deferred();
      this.seen.set(toolCallId, waiting);
    }
    return waiting;
  }

  /** The tools with their `execute` run through the journal: keyed by toolCallId, once, on the run's executor for client tools. */
  private wrapTools(tools: ToolSet): ToolSet {
    const client = new Set(this.options.clientTools ?? []);
    for (const name of client) {
      if (!(name in tools)) {
        throw new RangeError(`clientTools names ${JSON.stringify(name)}, which is not one of the tools`);
      }
    }
    const wrapped: ToolSet = {};
    for (const [name, tool] of Object.entries(tools)) {
      const execute = tool.execute as ((input: unknown, options: ToolExecutionOptions<unknown>) => unknown) | undefined;
      if (!client.has(name) && execute === undefined) {
        wrapped[name] = tool; // the model's call ends the step, as the AI SDK has it
        continue;
      }
      wrapped[name] = {
        ...tool,
        execute: async (input: unknown, options: ToolExecutionOptions<unknown>) => {
          await this.waiter(options.toolCallId).promise;
          const args = isRecord(input) ? input : { input };
          try {
            if (client.has(name)) {
              return await this.ctx.clientTool(name, args, { key: keyOf(options.toolCallId) });
            }
            return await this.ctx.tool(
              name,
              args,
              (_args, call) => execute?.(input, { ...options, abortSignal: anySignal(options.abortSignal, call.signal) }),
              { key: keyOf(options.toolCallId) },
            );
          } catch (error) {
            if (error instanceof RunStopped || error instanceof LeaseLost || error instanceof ReplayDiverged) {
              this.fatal ??= error;
              this.abort.abort(error.name);
            }
            throw error;
          }
        },
      } as ToolSet[string];
    }
    return wrapped;
  }
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** A signal aborted when any of `signals` is. */
function anySignal(...signals: (AbortSignal | undefined)[]): AbortSignal {
  const given = signals.filter((s): s is AbortSignal => s !== undefined);
  return given.length === 1 ? (given[0] as AbortSignal) : AbortSignal.any(given);
}

/** The run-error code of an error: its name in snake case without the AI SDK's `AI_` prefix (`AI_APICallError` → `api_call_error`). */
export function errorCode(error: unknown): string {
  const name = error instanceof Error ? error.name : "";
  const bare = name.replace(/^AI_/, "");
  if (bare === "" || bare === "Error") {
    return "model_error";
  }
  return bare
    .replace(/([A-Z]+)([A-Z][a-z])/g, "$1_$2")
    .replace(/([a-z0-9])([A-Z])/g, "$1_$2")
    .toLowerCase();
}

/** The text of a message's content: a string, a `{text}` object, or a list of such parts. */
function textOf(content: unknown): string {
  if (typeof content === "string") {
    return content;
  }
  if (Array.isArray(content)) {
    return content.map(textOf).join("");
  }
  if (isRecord(content) && typeof content["text"] === "string") {
    return content["text"];
  }
  return "";
}

/**
 * The session's conversation before the run, as AI SDK messages: its
 * users' messages and the completed assistant messages recorded before the
 * run started, in order, then the run's `input` when it is a string or has
 * a string `prompt`.
 */
export async function conversation(ctx: RunContext): Promise<ModelMessage[]> {
  const startedAt = ctx.started?.["sessionSequence"];
  const before = typeof startedAt === "number" ? startedAt : Number.POSITIVE_INFINITY;
  const turns: { role: "user" | "assistant"; text: string }[] = [];
  const assistant = new Map<string, string>();
  for await (const event of ctx.client.allHistory(ctx.sessionId)) {
    if (event.sessionSequence >= before) {
      break;
    }
    const e = event as unknown as Record<string, unknown>;
    const id = String(e["messageId"]);
    if (event.type === "message.user.recorded") {
      turns.push({ role: "user", text: textOf(e["content"]) });
    } else if (event.type === "message.text.started" && e["role"] === "assistant") {
      assistant.set(id, "");
    } else if (event.type === "message.text.delta" && assistant.has(id)) {
      assistant.set(id, (assistant.get(id) ?? "") + String(e["delta"] ?? ""));
    } else if (event.type === "message.text.completed" && assistant.has(id)) {
      turns.push({ role: "assistant", text: assistant.get(id) ?? "" });
      assistant.delete(id);
    }
  }
  const input = ctx.input;
  const prompt = isRecord(input) ? input["prompt"] : input;
  if (typeof prompt === "string" && prompt !== "") {
    turns.push({ role: "user", text: prompt });
  }
  return turns.filter((t) => t.text !== "").map((t) => ({ role: t.role, content: t.text }));
}
