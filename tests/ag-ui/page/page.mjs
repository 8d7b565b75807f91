// A chat page on @ag-ui/client's HttpAgent, unmodified, pointed at narad's
// POST /v1/ag-ui. When a run's connection breaks (the server went away),
// the page rejoins: it runs the agent again with nothing new until the
// server answers, which sends the transcript so far and the rest live.
// `window.agui` holds what the test reads: messages, status, the events and
// the client's warnings.
import { HttpAgent } from "@ag-ui/client";
import { EventSchema } from "@ag-ui/core/schemas";

const params = new URLSearchParams(location.hash.slice(1));
const agui = { status: "ready", messages: [], events: [], invalid: [], warnings: [], failures: [], runs: 0 };
window.agui = agui;

const warn = console.warn;
console.warn = (...args) => {
  if (typeof args[0] === "string" && (args[0].startsWith("[ag-ui][enforce]") || args[0].startsWith("[ag-ui][compat]"))) {
    agui.warnings.push(args.map(String).join(" "));
  }
  warn(...args);
};
// HttpAgent re-throws a broken connection's cancel outside the run's promise.
window.addEventListener("unhandledrejection", (e) => {
  agui.failures.push(String(e.reason));
  e.preventDefault();
});

const agent = new HttpAgent({
  url: `${params.get("api")}/v1/ag-ui`,
  threadId: params.get("thread"),
  headers: { Authorization: `Bearer ${params.get("token")}` },
});
const forwardedProps = { narad: { queue: params.get("queue") } };

function render() {
  agui.messages = structuredClone(agent.messages);
  const list = document.getElementById("messages");
  list.replaceChildren(
    ...agent.messages.map((m) => {
      const div = document.createElement("div");
      div.className = `message ${m.role}`;
      div.dataset.id = m.id;
      if (m.role === "assistant" && m.toolCalls?.length) {
        div.classList.add("tool");
        div.textContent = m.toolCalls.map((t) => `${t.function.name}(${t.function.arguments})`).join("\n");
      } else {
        div.textContent = typeof m.content === "string" ? m.content : JSON.stringify(m.content);
      }
      return div;
    }),
  );
  document.getElementById("status").textContent = agui.status + (agui.error ? `: ${agui.error}` : "");
}

agent.subscribe({
  onEvent: ({ event }) => {
    agui.events.push(event);
    const checked = EventSchema.safeParse(event);
    if (!checked.success) {
      agui.invalid.push(`${JSON.stringify(event)}: ${checked.error.message}`);
    }
  },
  onMessagesChanged: render,
});

/** Runs the agent; when the connection breaks, rejoins until the server answers. */
async function run() {
  agui.status = "streaming";
  agui.error = undefined;
  render();
  for (;;) {
    agui.runs += 1;
    try {
      await agent.runAgent({ forwardedProps });
      agui.status = "ready";
      agui.error = undefined;
      break;
    } catch (e) {
      agui.error = String(e?.message ?? e);
      if (e?.status) {
        agui.status = "error";
        break;
      }
      agui.status = "rejoining";
      render();
      await new Promise((resolve) => setTimeout(resolve, 300));
    }
  }
  render();
}

document.getElementById("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const input = document.getElementById("say");
  agent.addMessage({ id: crypto.randomUUID(), role: "user", content: input.value });
  input.value = "";
  run();
});
render();
