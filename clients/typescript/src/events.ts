/**
 * Typed builders of proposed events: the fields of one event type, checked
 * by the compiler against the generated wire types, with the envelope
 * (`protocolVersion`, `eventId`, `rootRunId`, `runId`) filled in, so that
 * no `as ProposedEvent` cast is needed.
 */
import type { ProposedEvent } from "./types.js";

/** The type name of every event an append may propose (`message.text.delta`, …). */
export type ProposedType = ProposedEvent["type"];

/** The proposed event of type `T`, as the generated wire types define it. */
export type Proposed<T extends ProposedType> = Extract<ProposedEvent, { type: T }>;

/** The envelope fields a builder fills in (or the journal assigns). */
type Envelope = "protocolVersion" | "type" | "eventId" | "sequence" | "sessionSequence" | "workflowSequence";

/**
 * The fields of an event of type `T` beyond its envelope (`messageId`,
 * `delta`, …), with the run position optional: a builder fills `rootRunId`
 * and `runId` (give `runId` for a nested run's event), and `eventId` when
 * it is not given.
 */
export type EventFields<T extends ProposedType> = DistributiveOmit<Proposed<T>, Envelope | "rootRunId" | "runId"> & {
  eventId?: string;
  rootRunId?: string;
  runId?: string;
};

type DistributiveOmit<T, K extends PropertyKey> = T extends unknown ? Omit<T, K> : never;

/** Where the events a builder makes belong: a run journal, and how event ids are made. */
export interface EventEnvelope {
  /** The run the events belong to (their `runId`, unless the fields name another). */
  runId: string;
  /** The root of its journal (default: `runId`, a top-level run). */
  rootRunId?: string;
  /** Makes the `eventId` of an event that names none (default: `crypto.randomUUID()`). */
  eventId?: () => string;
}

/**
 * A proposed event of type `type` with `fields`, in the run journal of
 * `envelope`: `protocolVersion` "narad/v1", an `eventId` (the fields', or
 * a new one), `rootRunId` and `runId` (the fields win, e.g. a nested
 * run's `runId`).
 *
 * ```ts
 * const delta = runEvent({ runId: "run-1" }, "message.text.delta", { messageId: "m-1", delta: "Hi" });
 * await narad.appendEvents(sessionId, [delta]);
 * ```
 */
export function runEvent<T extends ProposedType>(
  envelope: EventEnvelope,
  type: T,
  fields: EventFields<T>,
): Proposed<T> {
  const eventId = fields.eventId ?? (envelope.eventId ? envelope.eventId() : globalThis.crypto.randomUUID());
  return {
    protocolVersion: "narad/v1",
    type,
    rootRunId: envelope.rootRunId ?? envelope.runId,
    runId: envelope.runId,
    ...fields,
    eventId,
  } as unknown as Proposed<T>;
}

/**
 * A proposed event of type `type` with `fields` and no run position (a
 * session's `state.snapshot`, a `session.custom`, …): `protocolVersion`
 * and an `eventId` (the fields', or `crypto.randomUUID()`) filled in.
 */
export function sessionEvent<T extends ProposedType>(
  type: T,
  fields: DistributiveOmit<Proposed<T>, Envelope> & { eventId?: string },
): Proposed<T> {
  return {
    protocolVersion: "narad/v1",
    type,
    ...fields,
    eventId: fields.eventId ?? globalThis.crypto.randomUUID(),
  } as unknown as Proposed<T>;
}
