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
 * | a tool named in `clientTools`           | `tool.call.started` (`executor: "client"`) after the call, its result from the run's executor |
 * | `tool-approval-request` (`needsApproval`) | `interrupt.requested` + `run.paused`; the decision → `tool-approval-response` |
 * | `finish-step`                           | `state.snapshot` of scope `ai-sdk/{runId}`: the messages and usage so far |
 * | `finish` (`totalUsage`)                 | `run.finished` with `usage`                              |
 * | a narad stop → `abortSignal` → `abort`  | `run.cancelled` (`stopped`) with the usage so far        |
 * | `error` (the model failed)              | `run.error` with a code (`api_call_error`, …) and the usage so far |
 *
 * **Ids and takeover.** Every step is keyed (see `StepOptions` of the run
 * context): a tool call by the model's toolCallId (`{runId}.{toolCallId}.tool`,
 * `.client`, `.approval`), a text or reasoning block by the model call it
 * belongs to and its place there (`{runId}.step2.text0.message`). At every
 * step boundary (`finish-step`) the AI SDK's messages so far (the model's
 * responses and the tools' results, after the conversation) and the usage
 * so far are kept in the run's own state document (scope
 * {@link stateScope} `ai-sdk/{runId}`, keyed by the step, so a replay writes
 * nothing twice). A runtime that takes the run over (after a lost runtime,
 * or a run given back while it waited) reads it from the run's journal and
 * resumes `streamText` with the conversation and those messages: the model
 * is asked only for what no kept step holds, whatever ids it answers with.
 * What the lost runtime journaled past the last kept step is not written
 * again: a half message is carried on when the replayed step says the same,
 * and completed as it stands otherwise (what the replay says then goes out
 * as a message of its own); a decided approval or a finished
 * client tool call answers from the journal. A state document that cannot
 * be read back ends the run `run.error` {@link NO_RESUMABLE_STATE}.
 *
 * **Waiting.** An approval and a client tool's call are answered between
 * `streamText` calls (a client tool has no `execute` there: its call ends
 * the call, the run's executor runs it, and its result goes back in a
 * `tool` message), so a `Runtime` with `releaseWhenWaiting` gives the run
 * back while a person decides or the executor works, and the run resumes
 * from its state document when the answer comes.
 */
import { isStepCount, modelMessageSchema, streamText } from "ai";
import type {
  LanguageModel,
  LanguageModelUsage,
  ModelMessage,
  StopCondition,
  Tool,
  ToolApprovalResponse,
  ToolContent,
  ToolExecutionOptions,
  ToolModelMessage,
  ToolResultPart,
  ToolSet,
} from "ai";

import type { Json } from "./jsonpatch.js";
import { HANDLER_ERROR, LeaseLost, RunStopped, RunWaiting } from "./run-errors.js";
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
  /** When a `streamText` call stops taking steps (default `isStepCount(20)`); counted per call (a decided approval, a client tool's result and a takeover start another). */
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
      if (error instanceof LeaseLost || error instanceof RunWaiting || ctx.lost()) {
        throw error; // the runtime's: a lost lease, or a run given back while it waits
      }
      if (ctx.ended) {
        return;
      }
      if (error instanceof RunStopped || ctx.stopRequested()) {
        await ctx.cancel(usage.fields());
        return;
      }
      const known = error instanceof ReplayDiverged || error instanceof ModelFailed || error instanceof Unresumable;
      const code =
        error instanceof ReplayDiverged
          ? REPLAY_DIVERGED
          : error instanceof Unresumable
            ? NO_RESUMABLE_STATE
            : error instanceof ModelFailed
              ? (options.errorCode ?? errorCode)(error.cause)
              : HANDLER_ERROR;
      const message =
        error instanceof ReplayDiverged
          ? "the run's replay took another path than its journal"
          : error instanceof Unresumable
            ? "the run cannot be taken over: its state document cannot be read back"
            : error instanceof ModelFailed
              ? `the model call failed (${code})`
              : "the agent failed: its handler met an error";
      await ctx.fail(code, message, usage.fields());
      if (!known) {
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

/** The run's state document is there and cannot be read back: the run ends `run.error` {@link NO_RESUMABLE_STATE}. */
class Unresumable extends Error {
  constructor(message: string) {
    super(message);
    this.name = "Unresumable";
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

  /** The counters of this and `other` together (for the state document). */
  with(other: UsageCounter): Record<string, number> {
    const sum = { ...this.counts };
    for (const [name, value] of Object.entries(other.counts)) {
      sum[name] = (sum[name] ?? 0) + value;
    }
    return sum;
  }

  /** Starts from counters a state document kept. */
  load(counts: Record<string, number>): void {
    this.clear();
    Object.assign(this.counts, counts);
  }

  /** `{ usage }` when something was counted, else `{}` (for the terminal's fields). */
  fields(): { usage?: Usage } {
    return Object.keys(this.counts).length > 0 ? { usage: { ...this.counts } } : {};
  }
}

/** A promise with its resolver. */
function deferred<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve: (value: T) => void = () => undefined;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/** A step key of a model's id: the id itself, unless all digits (those are positions). */
function keyOf(id: string): string {
  return /^[0-9]*$/.test(id) ? `call-${id}` : id;
}

/** The code of the `run.error` a run taken over ends in when its state document cannot be read back. */
export const NO_RESUMABLE_STATE = "no_resumable_state";

/**
 * The scope of the state document that keeps run `runId`'s model messages
 * (`ai-sdk/{runId}`): a scope of the run's own, so that runs of one session
 * never share it.
 */
export function stateScope(runId: string): string {
  return `ai-sdk/${runId}`;
}

/**
 * What the state document holds at a step boundary: every message after the
 * conversation (the model's responses, the tools' results, the decisions),
 * the model calls so far, and the usage they counted.
 */
interface Saved {
  version: 1;
  step: number;
  messages: ModelMessage[];
  usage: Record<string, number>;
}

/** A tool call of the last response that waits on something outside `streamText`: a person's decision, or the run's client executor. */
interface Pending {
  readonly kind: "approval" | "client";
  readonly toolCallId: string;
  readonly toolName: string;
  readonly input: unknown;
  readonly approvalId?: string;
}

/** A stream of the journal (a message or reasoning block) and whether it completed. */
function openStreamsOf(journal: readonly { readonly type: string; readonly [field: string]: unknown }[], runId: string): Map<string, "message" | "reasoning"> {
  const open = new Map<string, "message" | "reasoning">();
  for (const e of journal) {
    if (e["runId"] !== runId) {
      continue;
    }
    if (e.type === "message.text.started") {
      open.set(String(e["messageId"]), "message");
    } else if (e.type === "reasoning.started") {
      open.set(String(e["reasoningId"]), "reasoning");
    } else if (e.type === "message.text.completed") {
      open.delete(String(e["messageId"]));
    } else if (e.type === "reasoning.completed") {
      open.delete(String(e["reasoningId"]));
    }
  }
  return open;
}

/**
 * One run driven by `streamText`, call after call while tool calls wait on a
 * person or the client executor; its messages kept in the run's state
 * document at every step boundary, from which a later holder resumes.
 */
class Drive {
  /** Tool calls the stream has reached: a tool's step waits for its call's part, so that text before it is journaled first. */
  private readonly seen = new Map<string, { promise: Promise<void>; resolve: () => void }>();
  /** What a tool's execute met that ends the run (a stop, a lost lease, a diverged replay). */
  private fatal: unknown;
  private readonly abort = new AbortController();
  private readonly tools: ToolSet;
  private readonly client: ReadonlySet<string>;
  private readonly scope: string;
  /** The model calls so far (`finish-step`s), over every `streamText` call and every holder. */
  private step = 0;
  /** Every message after the conversation, as of the last `streamText` call's end (or the state document). */
  private added: ModelMessage[] = [];
  /** The streams a lost holder left open, completed at the next step boundary unless the replay carries them on. */
  private leftovers = new Map<string, "message" | "reasoning">();

  constructor(
    private readonly ctx: RunContext,
    private readonly options: AiSdkHandlerOptions,
    private readonly usage: UsageCounter,
  ) {
    this.client = new Set(options.clientTools ?? []);
    this.tools = this.wrapTools((options.tools ?? {}) as ToolSet);
    this.scope = stateScope(ctx.runId);
  }

  async run(): Promise<void> {
    const { ctx, options } = this;
    const stop = () => this.abort.abort(ctx.signal.reason);
    if (ctx.signal.aborted) {
      stop();
    }
    ctx.signal.addEventListener("abort", stop);
    try {
      const saved = this.load();
      if (saved !== undefined) {
        this.added = saved.messages;
        this.step = saved.step;
        this.usage.load(saved.usage);
      }
      this.leftovers = openStreamsOf(ctx.journal, ctx.runId);
      const history = options.messages ? await options.messages(ctx) : await conversation(ctx);
      // Taken over from a state document that ends in the tools' results:
      // the model is asked what comes next. Ending in a response: what it
      // waits on is answered first, or the model was done.
      let ask = saved === undefined || saved.messages[saved.messages.length - 1]?.role === "tool";
      for (;;) {
        ctx.checkRunning();
        if (ask) {
          await this.call(history);
        }
        const pending = this.pending();
        if (pending.length === 0) {
          break;
        }
        this.added = [...this.added, await this.answer(pending)];
        ask = true;
      }
      await this.completeLeftovers();
      await ctx.finish(this.usage.fields());
    } finally {
      ctx.signal.removeEventListener("abort", stop);
    }
  }

  /** One `streamText` call, journaled part by part; the messages kept at each of its step boundaries. */
  private async call(conversation: ModelMessage[]): Promise<void> {
    const { ctx, options } = this;
    const before = this.added;
    let initial: ModelMessage[] = [];
    const steps: ModelMessage[][] = [];
    const ended: { promise: Promise<ModelMessage[]>; resolve: (messages: ModelMessage[]) => void }[] = [];
    const stepEnded = (n: number) => {
      while (ended.length <= n) {
        ended.push(deferred<ModelMessage[]>());
      }
      return ended[n] as { promise: Promise<ModelMessage[]>; resolve: (messages: ModelMessage[]) => void };
    };
    const settings = (options.settings ?? {}) as Record<string, unknown>;
    const { onStepEnd, onStepFinish, prepareStep, ...rest } = settings as {
      onStepEnd?: (event: never) => unknown;
      onStepFinish?: (event: never) => unknown;
      prepareStep?: (options: never) => unknown;
    };
    const theirStepEnd = onStepEnd ?? onStepFinish;
    let stepsEnded = 0;
    const result = streamText({
      onError: () => undefined, // error parts are journaled, not logged
      ...(rest as StreamTextSettings),
      model: options.model,
      tools: this.tools,
      messages: [...conversation, ...before],
      ...(options.instructions === undefined ? {} : { instructions: options.instructions }),
      stopWhen: options.stopWhen ?? isStepCount(20),
      abortSignal: this.abort.signal,
      // What the call's approved tools answered before its first step (not in any step's messages).
      prepareStep: async (step) => {
        if (step.stepNumber === 0) {
          initial = [...step.responseMessages];
        }
        return prepareStep === undefined ? undefined : await (prepareStep as (o: typeof step) => unknown)(step);
      },
      onStepEnd: async (event) => {
        stepEnded(stepsEnded++).resolve(event.response.messages);
        await theirStepEnd?.(event as never);
      },
    } as Parameters<typeof streamText>[0]);
    const texts = new Map<string, TextStream>();
    const thoughts = new Map<string, TextStream>();
    let ordinal = 0;
    const partial = new UsageCounter();
    let failure: { error: unknown } | undefined;
    let aborted = false;
    const abortion = new Promise<undefined>((resolve) => {
      if (this.abort.signal.aborted) {
        resolve(undefined);
      }
      this.abort.signal.addEventListener("abort", () => resolve(undefined), { once: true });
    });
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
            break;
          case "finish-step": {
            partial.add(part.usage);
            this.step += 1;
            const messages = await Promise.race([stepEnded(steps.length).promise, abortion]);
            if (messages === undefined) {
              break; // aborted: nothing kept past what was
            }
            steps.push(messages);
            for (const stream of [...thoughts.values(), ...texts.values()]) {
              await stream.complete();
            }
            texts.clear();
            thoughts.clear();
            await this.completeLeftovers();
            await this.save([...before, ...initial, ...steps.flat()], this.usage.with(partial));
            break;
          }
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
    this.added = [...before, ...initial, ...steps.flat()];
  }

  /**
   * The tool calls of the last response that wait on something outside
   * `streamText`: an approval asked and not answered, a client tool's call
   * without a result.
   */
  private pending(): Pending[] {
    const at = this.added.map((m) => m.role).lastIndexOf("assistant");
    const response = this.added[at];
    if (response === undefined || response.role !== "assistant" || typeof response.content === "string") {
      return [];
    }
    const answered = new Set<string>();
    const decided = new Set<string>();
    for (const message of this.added.slice(at + 1)) {
      if (message.role === "tool") {
        for (const part of message.content) {
          if (part.type === "tool-result") {
            answered.add(part.toolCallId);
          } else if (part.type === "tool-approval-response") {
            decided.add(part.approvalId);
          }
        }
      }
    }
    const asked = new Map<string, string>();
    for (const part of response.content) {
      if (part.type === "tool-approval-request" && !decided.has(part.approvalId)) {
        asked.set(part.toolCallId, part.approvalId);
      }
    }
    const pending: Pending[] = [];
    for (const part of response.content) {
      if (part.type !== "tool-call" || part.providerExecuted === true || answered.has(part.toolCallId)) {
        continue;
      }
      const approvalId = asked.get(part.toolCallId);
      const call = { toolCallId: part.toolCallId, toolName: part.toolName, input: part.input };
      if (approvalId !== undefined) {
        pending.push({ kind: "approval", approvalId, ...call });
      } else if (this.client.has(part.toolName) && !response.content.some((p) => p.type === "tool-approval-request" && p.toolCallId === part.toolCallId)) {
        // (A client call that needed approval is run with its approval; denied, the AI SDK answers it.)
        pending.push({ kind: "client", ...call });
      }
    }
    return pending;
  }

  /**
   * Answers what the last response waits on, as the AI SDK expects it: a
   * `tool` message of `tool-approval-response` parts (an approved backend
   * tool then runs in the next `streamText` call) and of the client tools'
   * `tool-result`s.
   */
  private async answer(pending: Pending[]): Promise<ToolModelMessage> {
    const content: ToolContent = [];
    for (const call of pending) {
      if (call.kind === "approval") {
        const response = await this.decide(call);
        content.push(response);
        if (response.approved && this.client.has(call.toolName)) {
          content.push(await this.runClient(call));
        } else if (response.approved) {
          this.reached(call.toolCallId); // it runs in the next streamText call
        }
      } else {
        content.push(await this.runClient(call));
      }
    }
    return { role: "tool", content };
  }

  /** Asks a person about a tool call that needs approval (keyed by its toolCallId); answers the AI SDK's response. */
  private async decide(request: Pending): Promise<ToolApprovalResponse> {
    const call = { toolCallId: request.toolCallId, toolName: request.toolName, input: request.input };
    const asked = this.options.approval?.(call) ?? { message: `Run ${request.toolName}?` };
    const approval = await this.ctx.approve(asked.message, {
      key: keyOf(request.toolCallId),
      ...(asked.title === undefined ? {} : { title: asked.title }),
      input: { toolName: request.toolName, args: request.input ?? null },
    });
    const response: ToolApprovalResponse = {
      type: "tool-approval-response",
      approvalId: request.approvalId ?? "",
      approved: approval.decision === "approve",
    };
    const reason = approval.reason ?? (approval.decision === "approve" ? undefined : `the person's decision: ${approval.decision}`);
    if (reason !== undefined) {
      response.reason = reason;
    }
    return response;
  }

  /** Runs a client tool's call on the run's executor (keyed by its toolCallId); answers its result for the model. */
  private async runClient(call: Pending): Promise<ToolResultPart> {
    const args = isRecord(call.input) ? call.input : { input: call.input };
    let output: ToolResultPart["output"];
    try {
      const result = await this.ctx.clientTool(call.toolName, args, { key: keyOf(call.toolCallId) });
      const tool = this.options.tools?.[call.toolName] as { toModelOutput?: (o: { toolCallId: string; input: unknown; output: unknown }) => unknown } | undefined;
      output = tool?.toModelOutput
        ? ((await tool.toModelOutput({ toolCallId: call.toolCallId, input: call.input, output: result })) as ToolResultPart["output"])
        : typeof result === "string"
          ? { type: "text", value: result }
          : { type: "json", value: (result ?? null) as never };
    } catch (error) {
      if (error instanceof RunStopped || error instanceof LeaseLost || error instanceof RunWaiting || error instanceof ReplayDiverged) {
        throw error;
      }
      // The executor's error (or the server's expiry) reaches the model as the tool's error.
      output = { type: "error-text", value: error instanceof Error ? error.message : String(error) };
    }
    return { type: "tool-result", toolCallId: call.toolCallId, toolName: call.toolName, output };
  }

  /** The state document an earlier holder kept (`undefined` when none); throws {@link Unresumable} when it cannot be read back. */
  private load(): Saved | undefined {
    let kept: unknown;
    let found = false;
    for (const e of this.ctx.journal) {
      if ((e.type === "state.snapshot" || e.type === "state.delta") && e["scope"] === this.scope) {
        if (e.type === "state.delta") {
          throw new Unresumable(`the state document ${this.scope} was changed by a patch`);
        }
        kept = e["state"];
        found = true;
      }
    }
    if (!found) {
      return undefined;
    }
    if (!isRecord(kept) || kept["version"] !== 1) {
      throw new Unresumable(`the state document ${this.scope} is not one this adapter wrote`);
    }
    const { step, messages, usage } = kept;
    const valid =
      typeof step === "number" &&
      Number.isInteger(step) &&
      step > 0 &&
      Array.isArray(messages) &&
      messages.length > 0 &&
      messages.every((m) => isRecord(m) && (m["role"] === "assistant" || m["role"] === "tool") && validMessage(m)) &&
      isRecord(usage) &&
      Object.values(usage).every((v) => typeof v === "number" && Number.isFinite(v) && v >= 0);
    if (!valid) {
      throw new Unresumable(`the state document ${this.scope} cannot be read back as model messages`);
    }
    return { version: 1, step, messages: messages as ModelMessage[], usage: usage as Record<string, number> };
  }

  /** Keeps the messages at a step boundary (keyed by the step: a replayed boundary writes nothing). */
  private async save(messages: ModelMessage[], usage: Record<string, number>): Promise<void> {
    const state: Saved = { version: 1, step: this.step, messages, usage };
    // JSON as the journal keeps it (undefined fields left out).
    await this.ctx.setState(JSON.parse(JSON.stringify(state)) as Json, { scope: this.scope, key: `ai-sdk.step${this.step}` });
  }

  /** Completes what a lost holder left open and the replay did not carry on (as it stands). */
  private async completeLeftovers(): Promise<void> {
    if (this.leftovers.size === 0) {
      return;
    }
    const open = openStreamsOf(this.ctx.journal, this.ctx.runId);
    const events = [];
    for (const [id, kind] of this.leftovers) {
      if (open.has(id)) {
        events.push(
          kind === "message"
            ? this.ctx.event("message.text.completed", { messageId: id })
            : this.ctx.event("reasoning.completed", { reasoningId: id }),
        );
      }
    }
    this.leftovers.clear();
    if (events.length > 0) {
      await this.ctx.append(events);
    }
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

  /**
   * The tools with their `execute` run through the journal, keyed by
   * toolCallId, once; client tools without `execute`, so that their calls
   * end the `streamText` call and go to the run's executor from here.
   */
  private wrapTools(tools: ToolSet): ToolSet {
    for (const name of this.client) {
      if (!(name in tools)) {
        throw new RangeError(`clientTools names ${JSON.stringify(name)}, which is not one of the tools`);
      }
    }
    const wrapped: ToolSet = {};
    for (const [name, tool] of Object.entries(tools)) {
      const execute = tool.execute as ((input: unknown, options: ToolExecutionOptions<unknown>) => unknown) | undefined;
      if (this.client.has(name)) {
        const { execute: _run, ...rest } = tool as Tool & { execute?: unknown };
        void _run;
        wrapped[name] = rest as ToolSet[string];
        continue;
      }
      if (execute === undefined) {
        wrapped[name] = tool; // the model's call ends the step, as the AI SDK has it
        continue;
      }
      wrapped[name] = {
        ...tool,
        execute: async (input: unknown, options: ToolExecutionOptions<unknown>) => {
          await this.waiter(options.toolCallId).promise;
          const args = isRecord(input) ? input : { input };
          try {
            return await this.ctx.tool(
              name,
              args,
              (_args, call) => execute?.(input, { ...options, abortSignal: anySignal(options.abortSignal, call.signal) }),
              { key: keyOf(options.toolCallId) },
            );
          } catch (error) {
            if (error instanceof RunStopped || error instanceof LeaseLost || error instanceof ReplayDiverged || error instanceof RunWaiting) {
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

/** Whether `message` is a model message as the AI SDK's own schema has it. */
function validMessage(message: unknown): boolean {
  const checked = (modelMessageSchema as unknown as { "~standard": { validate(value: unknown): unknown } })["~standard"].validate(message);
  return isRecord(checked) && !("issues" in checked && checked["issues"] !== undefined);
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
