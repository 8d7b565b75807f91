// A chat page as a product builds it with the AI SDK: useChat with
// resume: true and an unchanged DefaultChatTransport pointed at narad's
// POST /v1/chat (a bearer token in a header). The test reads its state from
// window.chat and the page's text.
import { useChat } from "@ai-sdk/react";
import { DefaultChatTransport, isToolUIPart, getToolName } from "ai";
import { useState } from "react";
import { createRoot } from "react-dom/client";

const params = new URLSearchParams(location.hash.slice(1));
const api = params.get("api");
const token = params.get("token");
const sessionId = params.get("session");
const queue = params.get("queue");

const transport = new DefaultChatTransport({
  api: `${api}/v1/chat?queue=${encodeURIComponent(queue)}`,
  headers: () => ({ authorization: `Bearer ${token}` }),
});

function Part({ part }) {
  if (part.type === "text" || part.type === "reasoning") {
    return <span className={part.type}>{part.text}</span>;
  }
  if (isToolUIPart(part)) {
    return (
      <div className="tool">
        {getToolName(part)}({JSON.stringify(part.input)}) · {part.state}
        {part.state === "output-available" ? ` → ${JSON.stringify(part.output)}` : ""}
      </div>
    );
  }
  return null;
}

function Chat() {
  const { messages, sendMessage, status, error, resumeStream } = useChat({ id: sessionId, transport, resume: true });
  const [text, setText] = useState("");
  window.chat = { messages, status, error: error?.message, resumeStream, sendMessage };
  return (
    <main>
      <h1>useChat · narad session {sessionId}</h1>
      <div className="meta">POST {api}/v1/chat · resume: true</div>
      <div id="messages">
        {messages.map((m) => (
          <div key={m.id} className={`message ${m.role}`} data-id={m.id}>
            <div className="role">{m.role}</div>
            {m.parts.map((p, i) => (
              <Part key={i} part={p} />
            ))}
          </div>
        ))}
      </div>
      <div className="status" id="status" data-status={status}>
        status: {status}
        {error ? <span className="error"> · {error.message}</span> : null}
      </div>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          sendMessage({ text });
          setText("");
        }}
      >
        <input id="say" value={text} onChange={(e) => setText(e.target.value)} placeholder="Say something" />
        <button id="send" type="submit" disabled={status !== "ready" && status !== "error"}>
          Send
        </button>
      </form>
    </main>
  );
}

createRoot(document.getElementById("root")).render(<Chat />);
