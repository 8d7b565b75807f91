// An AI SDK agent served by narad: a runtime claims the runs of its queue
// and drives `streamText` with the adapter of @narad/client/ai-sdk; this
// program then asks it something and prints the streamed answer and how
// the run ended.
//
//   npm install @narad/client ai
//   NARAD_URL=http://127.0.0.1:7400 NARAD_TOKEN=$(narad token --roles reader,writer,backend) node ai_sdk_agent.mjs
//
// The model is the AI SDK's mock (ai/test), scripted to call a tool and
// answer, unless OPENAI_API_KEY is set and @ai-sdk/openai is installed
// (or ANTHROPIC_API_KEY and @ai-sdk/anthropic): then that provider's.
import { NaradClient, Runtime } from "@narad/client";
import { aiSdkHandler } from "@narad/client/ai-sdk";
import { jsonSchema, tool } from "ai";

async function provider(key, module, make) {
  if (!process.env[key]) return undefined;
  try {
    return make(await import(module));
  } catch {
    return undefined; // the provider's package is not installed
  }
}

/** A mock model: the weather tool first, then an answer made of its result. */
async function mockModel() {
  const { MockLanguageModelV4, simulateReadableStream } = await import("ai/test");
  const usage = { inputTokens: { total: 20, noCache: 20 }, outputTokens: { total: 9, text: 9 } };
  return new MockLanguageModelV4({
    doStream: async ({ prompt }) => {
      const result = prompt.findLast((m) => m.role === "tool")?.content[0]?.output?.value;
      const chunks = result
        ? [{ type: "text-start", id: "a" },
           ...`It is ${result.celsius} °C in ${result.city}.`.split(/(?= )/).map((delta) => ({ type: "text-delta", id: "a", delta })),
           { type: "text-end", id: "a" },
           { type: "finish", finishReason: { unified: "stop" }, usage }]
        : [{ type: "tool-call", toolCallId: "call-1", toolName: "weather", input: JSON.stringify({ city: "Oslo" }) },
           { type: "finish", finishReason: { unified: "tool-calls" }, usage }];
      return { stream: simulateReadableStream({ chunks, chunkDelayInMs: 40 }) };
    },
  });
}

const model =
  (await provider("OPENAI_API_KEY", "@ai-sdk/openai", (m) => m.openai(process.env.OPENAI_MODEL ?? "gpt-4o-mini"))) ??
  (await provider("ANTHROPIC_API_KEY", "@ai-sdk/anthropic", (m) => m.anthropic(process.env.ANTHROPIC_MODEL ?? "claude-3-5-haiku-latest"))) ??
  (await mockModel());

const tools = {
  weather: tool({
    description: "The weather in a city",
    inputSchema: jsonSchema({ type: "object", properties: { city: { type: "string" } }, required: ["city"] }),
    execute: async ({ city }) => ({ city, celsius: 21 }),
  }),
};

const narad = new NaradClient({ servers: process.env.NARAD_URL.split(","), token: process.env.NARAD_TOKEN });
const queue = process.env.NARAD_QUEUE ?? `ai-sdk-${Math.random().toString(36).slice(2, 8)}`;
const runtime = new Runtime(narad, { queue, handler: aiSdkHandler({ model, tools, instructions: "Answer briefly." }) });
const serving = runtime.run();

const { sessionId } = await narad.createSession({ title: "The AI SDK" });
const stream = narad.runs.stream({ sessionId, message: "What is the weather in Oslo?", queue });
for await (const frame of stream) {
  if (frame.event.type === "message.text.delta") process.stdout.write(frame.event.delta);
  if (frame.event.type === "tool.call.started") console.log(`[${frame.event.toolName} ${JSON.stringify(frame.event.args)}]`);
}
console.log("\n" + stream.status);
runtime.stop();
await serving;
