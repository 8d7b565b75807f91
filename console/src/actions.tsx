/** Controls shared by the views: deciding an interrupt. */
import { useState } from "preact/hooks";

import { type NaradClient, NaradError } from "../../clients/typescript/src/index.js";
import { messageOf } from "./live.js";

/**
 * A button per action the interrupt offers, with an optional reason. When
 * someone else decided first (409), that is said as what happened: their
 * decision stands and arrives with the stream.
 */
export function InterruptActions({
  client,
  sessionId,
  interruptId,
  actions,
}: {
  client: NaradClient;
  sessionId: string;
  interruptId: string;
  actions: string[];
}) {
  const [reason, setReason] = useState("");
  const [busy, setBusy] = useState(false);
  const [note, setNote] = useState<string>();
  const resolve = async (decision: string) => {
    setBusy(true);
    setNote(undefined);
    try {
      const body: { interruptId: string; sessionId: string; decision: string; reason?: string } = { interruptId, sessionId, decision };
      if (reason.trim() !== "") body.reason = reason.trim();
      await client.command("resolve-interrupt", body);
    } catch (e) {
      if (e instanceof NaradError && e.status === 409) {
        const recorded = (e.body as { details?: { decision?: string } } | undefined)?.details?.decision;
        setNote(`Someone else decided first${recorded ? `: ${recorded}` : ""}. Their decision stands.`);
      } else {
        setNote(messageOf(e));
      }
    } finally {
      setBusy(false);
    }
  };
  return (
    <div class="actions">
      <input
        type="text"
        placeholder="Reason (optional)"
        aria-label={`reason for interrupt ${interruptId}`}
        value={reason}
        onInput={(e) => setReason(e.currentTarget.value)}
      />
      {actions.map((a) => (
        <button key={a} type="button" class={a === "approve" ? "primary" : ""} disabled={busy} onClick={() => resolve(a)}>
          {a[0]?.toUpperCase()}
          {a.slice(1)}
        </button>
      ))}
      {note && (
        <p role="status" class="quiet note">
          {note}
        </p>
      )}
    </div>
  );
}
