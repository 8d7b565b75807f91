/** One server-sent event, as the HTML standard's parser dispatches it. */
export interface SseEvent {
  /** `event:`, or `message` when the frame named none. */
  event: string;
  /** The `data:` lines, joined with newlines. */
  data: string;
  /** The last event id: this frame's `id:`, or the last one before it. */
  id: string;
  /** Whether this frame carried an `id:` line of its own. */
  ownId: boolean;
}

/**
 * Parses an event stream (the HTML standard's algorithm: lines end with
 * CR, LF or CRLF; `:` starts a comment; a blank line dispatches), starting
 * from `lastEventId`.
 */
export async function* parseSse(
  body: ReadableStream<Uint8Array>,
  lastEventId = "",
): AsyncGenerator<SseEvent> {
  const decoder = new TextDecoder();
  const reader = body.getReader();
  let buffer = "";
  let event = "";
  let data: string[] = [];
  let id = lastEventId;
  let ownId = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        return;
      }
      buffer += decoder.decode(value, { stream: true });
      for (;;) {
        const end = buffer.search(/\r\n|\r|\n/);
        if (end < 0) {
          break;
        }
        // A lone CR at the end may be the first half of a CRLF.
        if (buffer[end] === "\r" && end === buffer.length - 1) {
          break;
        }
        const line = buffer.slice(0, end);
        buffer = buffer.slice(end + (buffer.startsWith("\r\n", end) ? 2 : 1));
        if (line === "") {
          if (data.length > 0) {
            yield { event: event || "message", data: data.join("\n"), id, ownId };
          }
          event = "";
          data = [];
          ownId = false;
          continue;
        }
        if (line.startsWith(":")) {
          continue;
        }
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) {
          value = value.slice(1);
        }
        if (field === "event") {
          event = value;
        } else if (field === "data") {
          data.push(value);
        } else if (field === "id" && !value.includes("\0")) {
          id = value;
          ownId = true;
        }
      }
    }
  } finally {
    reader.releaseLock();
  }
}
