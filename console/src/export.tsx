/**
 * A session downloaded: its history as JSONL (each event as the API gives
 * it, one per line, read afresh page by page) or a Markdown transcript
 * for people (messages, tool calls with latency, interrupts with who
 * decided, runs with duration and usage, each with its time).
 */
import { useState } from "preact/hooks";

import type { NaradClient } from "../../clients/typescript/src/index.js";
import { costOf, costText } from "./cost.js";
import { between, duration, usageText } from "./figures.js";
import { actorOf, type Event, type LiveSession, messageOf, messageText } from "./live.js";

/** Offers `text` as a file named `name`. */
function save(name: string, type: string, text: string): void {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

/** The session's history as JSONL, every page read from the API. */
async function jsonl(client: NaradClient, sessionId: string): Promise<string> {
  let lines = "";
  for await (const e of client.allHistory(sessionId, { afterSessionSequence: 0 })) lines += `${JSON.stringify(e)}\n`;
  return lines;
}

function quote(text: string): string {
  return text
    .split("\n")
    .map((l) => `> ${l}`)
    .join("\n");
}

/** The session as a Markdown transcript, from what the page holds. */
export function markdown(live: LiveSession, title: string): string {
  const state = live.reducer.state();
  const texts = new Map<string, string>();
  for (const item of live.reducer.transcript(Object.keys(state.runs))) {
    if (item.item === "message") texts.set(item.messageId, messageText(item));
  }
  const out = [`# ${title}`, "", `Session \`${live.sessionId}\` · ${live.events.length} events · exported ${new Date().toISOString()}`];
  const usage = live.usage();
  const cost = costOf(live.usageByModel());
  if (Object.keys(usage).length > 0) out.push("", `Usage: ${usageText(usage)}${cost === undefined ? "" : ` · ${costText(cost)}`}`);
  const at = (e: Event) => `_${e.timestamp}_`;
  for (const e of live.events) {
    switch (e.type) {
      case "run.started": {
        const end = live.terminals.get(e.runId as string);
        const runUsage = live.usage(e.runId as string);
        const outcome = end === undefined ? "running" : `${end.type.slice(4)} after ${duration(between(e.timestamp, end.timestamp))}`;
        const runCost = costOf(live.usageByModel(e.runId as string));
        const priced = runCost === undefined ? "" : ` · ${costText(runCost)}`;
        const extra = Object.keys(runUsage).length > 0 ? ` · ${usageText(runUsage)}${priced}` : "";
        const name = live.runName(e.runId as string);
        const named = `\`${String(e.runId)}\`${name === undefined ? "" : ` “${name}”`}`;
        out.push("", `## Run ${named}${e.parentRunId ? ` (in \`${String(e.parentRunId)}\`)` : ""}: ${outcome}${extra}`, "", at(e));
        break;
      }
      case "message.user.recorded":
      case "message.text.started": {
        const role = e.type === "message.user.recorded" ? "user" : String(e.role);
        const actor = actorOf(e)?.sub;
        out.push("", `**${role}**${actor ? ` (${actor})` : ""} · ${at(e)}`, "", quote(texts.get(e.messageId as string) ?? ""));
        break;
      }
      case "tool.call.started": {
        const done = live.toolCalls.get(e.toolCallId as string)?.finished;
        const result = done === undefined ? "running" : `${String(done.outcome)} in ${duration(between(e.timestamp, done.timestamp))}`;
        out.push("", `- tool \`${String(e.toolName)}\` (${String(e.executor)}) · ${at(e)}: ${result}`);
        break;
      }
      case "interrupt.requested": {
        const r = live.interruptResolutions.get(e.interruptId as string);
        const name = (e.title as string | undefined) ?? String(e.kind);
        const by = actorOf(r)?.sub;
        const decided =
          r === undefined ? "waiting" : `${String(r.decision)}${by ? ` by ${by}` : ""} after ${duration(between(e.timestamp, r.timestamp))}`;
        out.push("", `- interrupt “${name}” · ${at(e)}: ${decided}`);
        break;
      }
      default:
        break;
    }
  }
  return `${out.join("\n")}\n`;
}

/** The export buttons of a session. */
export function Export({ client, live, title }: { client: NaradClient; live: LiveSession; title: string }) {
  const [problem, setProblem] = useState<string>();
  const [busy, setBusy] = useState(false);
  const base = `narad-session-${live.sessionId}`;
  return (
    <span class="export">
      <button
        type="button"
        class="quiet"
        disabled={busy}
        title="Every event of the session, as the API gives it, one JSON object per line"
        onClick={async () => {
          setBusy(true);
          try {
            save(`${base}.jsonl`, "application/x-ndjson", await jsonl(client, live.sessionId));
            setProblem(undefined);
          } catch (e) {
            setProblem(messageOf(e));
          } finally {
            setBusy(false);
          }
        }}
      >
        Export JSONL
      </button>
      <button type="button" class="quiet" title="A readable transcript" onClick={() => save(`${base}.md`, "text/markdown", markdown(live, title))}>
        Export Markdown
      </button>
      {problem && <span class="problem">{problem}</span>}
    </span>
  );
}
