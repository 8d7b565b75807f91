/**
 * narad's TypeScript client: commands, sessions, appends and history
 * ({@link NaradClient}), resumable streams ({@link follow}), and the types
 * of every wire object, generated from narad's OpenAPI document.
 */
export { BLOB_REFERENCE, NaradClient } from "./client.js";
export type { BlobBytes, ClientOptions, RequestOptions, TokenSource, UploadOptions } from "./client.js";
export { neverSent, safeToSendAgain } from "./client.js";
export type { CallOptions, ReadOptions, RetryOptions } from "./client.js";
export { newKey } from "./keys.js";
export { Runs, RunStream } from "./runs.js";
export type { RunFrame, RunReadOptions, RunRequest, RunResult, RunStartAnswer, RunStatus } from "./runs.js";
export { NaradError } from "./errors.js";
export {
  AuthError,
  ConflictError,
  GoneError,
  IDEMPOTENCY_IN_FLIGHT,
  IDEMPOTENCY_KEY_REUSED,
  InvalidRequestError,
  NotFoundError,
  RateLimitedError,
  UnavailableError,
  errorOf,
  retryAfterOf,
} from "./errors.js";
export type { ErrorBody, ErrorCode } from "./errors.js";
export { follow, decode } from "./follow.js";
export type { FollowOptions, Frame } from "./follow.js";
export { Executor, IndexedDbTokenStore, MemoryTokenStore } from "./executor.js";
export type { ExecutorOptions, TokenEntry, TokenStore, Tool, ToolContext, ToolResult } from "./executor.js";
export type { WebSocketConstructor, WebSocketLike } from "./executor.js";
export { Runtime } from "./runtime.js";
export type { Claim, LeaseStanding, RunContext, RunHandler, RuntimeOptions } from "./runtime.js";
export { parseSse } from "./sse.js";
export { SessionReducer } from "./reducer.js";
export type { Delivered, ReducedState, ReducerOptions, TranscriptItem, TranscriptMessage, TranscriptReasoning } from "./reducer.js";
export { SessionState, foldMembers } from "./engine.js";
export type { AuthorityEvent, Slot, Status } from "./engine.js";
export { ALL_PROFILES, PROFILE_NAMESPACES, PROTOCOL_VERSION, WIRE_TYPE_INFO, Violation, classify, profileSet } from "./wire.js";
export type { Classified, ProfileId, WireKind, WireObject, WireTypeInfo } from "./wire.js";
export { RunGraphs } from "./graph.js";
export type { GraphDocument, GraphEdge, GraphNode, GraphOutcome, HeldGraph } from "./graph.js";
export { applyPatch, PatchError } from "./jsonpatch.js";
export type { Json, PatchOperation } from "./jsonpatch.js";
export type { SseEvent } from "./sse.js";
export type * from "./types.js";
export type { components, paths, operations } from "./generated/api.js";
export { HANDLER_ERROR, LeaseLost, RunStopped, RunWaiting, RUNTIME_LOST, STOPPED, TOOL_ERROR, ToolFailed } from "./run-errors.js";
export { NESTED_RUN_FAILED, REPLAY_DIVERGED, ReplayDiverged } from "./run-context.js";
export type { Actor, Approval, ApproveOptions, DocumentOptions, NestedOptions, ProgressOptions, RunContextOptions, StepOptions, ToolCall, Usage } from "./run-context.js";
export type { RunFailure } from "./runtime.js";
export { TextStream } from "./text-stream.js";
export type { StreamKind } from "./text-stream.js";
export { runEvent, sessionEvent } from "./events.js";
export type { EventEnvelope, EventFields, Proposed, ProposedType } from "./events.js";
export type { JournalEvent } from "./journal.js";
export { ident } from "./ids.js";
