import type { components, operations, paths } from "./generated/api.js";

/** Every schema of narad's OpenAPI document, by component name. */
export type Schemas = components["schemas"];

/** An authority event as stored (any type of schema/events/). */
export type AuthorityEvent = Schemas["AuthorityEvent"];
/** A watch event (any type of schema/watch/). */
export type WatchEvent = Schemas["WatchEvent"];
/** A hydrate record (any type of schema/hydrate/). */
export type HydrateRecord = Schemas["HydrateRecord"];
/** An authority event as an append proposes it (no sequences). */
export type ProposedEvent = Schemas["ProposedEvent"];
/** A stream's capability document, its first frame. */
export type Capabilities = Schemas["control.capabilities"];
/** The data of a `replay-gap` frame. */
export type ReplayGap = Schemas["ReplayGap"];
/** A session as stored. */
export type SessionRecord = Schemas["SessionRecord"];
/** One page of the tenant's sessions. */
export type SessionPage = Schemas["SessionPage"];
/** One page of sessions found by `GET /v1/search`. */
export type SearchPage = Schemas["SearchPage"];
/** A session found, with its newest matches. */
export type SearchResult = Schemas["SearchResult"];
/** What `GET /v1/search` takes. */
export type SearchQuery = NonNullable<operations["searchSessions"]["parameters"]["query"]>;
/** Token usage summed per day or per session, by model (`GET /v1/usage`). */
export type UsagePage = Schemas["UsagePage"];
/** The usage of one day or session and one model. */
export type UsageBucket = Schemas["UsageBucket"];
/** What `GET /v1/usage` takes. */
export type UsageQuery = NonNullable<operations["getUsage"]["parameters"]["query"]>;
/** An interrupt waiting for a decision, with its request. */
export type OpenInterrupt = Schemas["OpenInterrupt"];
/** One page of the tenant's open interrupts. */
export type InterruptPage = Schemas["InterruptPage"];
/** A tenant's client executors, runtime queues and held runs. */
export type Operations = Schemas["Operations"];
/** One page of history. */
export type HistoryPage = Schemas["HistoryPage"];
/** What an append answers. */
export type Appended = Schemas["Appended"];
/** A stream ticket and its URL. */
export type StreamTicket = Schemas["StreamTicket"];
/** What a ticket opens. */
export type TicketRequest = Schemas["TicketRequest"];
/** The cursors and filters of a history read. */
export type HistoryQuery = NonNullable<operations["readHistory"]["parameters"]["query"]>;

type CommandPath = Extract<keyof paths, `/v1/commands/${string}`>;

/** The name of a command (`start-run`, `resolve-interrupt`, …). */
export type CommandName = CommandPath extends `/v1/commands/${infer N}` ? N : never;

type Operation<N extends CommandName> = paths[`/v1/commands/${N}`]["post"];

/** The body of command `N`. */
export type CommandBody<N extends CommandName> = Operation<N> extends {
  requestBody: { content: { "application/json": infer B } };
}
  ? B
  : never;

type JsonOf<R> = R extends { content: { "application/json": infer B } } ? B : never;

/** What command `N` answers when it succeeds. */
export type CommandAnswer<N extends CommandName> = {
  [S in keyof Operation<N>["responses"]]: S extends 200 | 201 | 202
    ? JsonOf<Operation<N>["responses"][S]>
    : never;
}[keyof Operation<N>["responses"]];
