"""narad: the Python client of narad/v1.

- :class:`Client`: sessions, typed commands under idempotency keys, appends,
  history, blobs; one retry policy (failover between replicas, restarts waited
  out, ``Retry-After`` honoured); errors as :class:`NaradError` subclasses with
  their ``NRD-xxxx`` code.
- ``client.runs`` (:class:`Runs`): one run's frames to its end
  (``stream``, ``join_stream``), or its result (``wait``, ``join``).
- :func:`follow`: a session's stream or the tenant's, resumed across ends of
  connections and servers, gaps filled from history.
- :class:`SessionReducer`: what a client received, reduced to session state,
  with the client obligations of §10 (deduplication, gaps, conflicts).
- :class:`Runtime` and :class:`RunContext`: an agent runtime loop.
- :class:`Executor`: a client executor loop with a durable token store.
"""

from .client import (
    Client,
    Event,
    HistoryPage,
    JsonValue,
    MemberDecision,
    RuntimeOptions,
    TokenSource,
    new_idempotency_key,
)
from .errors import (
    AuthError,
    ConflictError,
    GoneError,
    NaradError,
    NotFoundError,
    RateLimitedError,
    UnavailableError,
)
from .executor import (
    CLIENT_RESTARTED,
    TOOL_ERROR,
    UNKNOWN_TOOL,
    AcceptedToken,
    Executor,
    ExecutorStats,
    FileTokenStore,
    MemoryTokenStore,
    TokenEntry,
    TokenStore,
    TokenStoreError,
    Tool,
    ToolResult,
)
from .follow import Frame, events, follow
from .reducer import Delivered, ReducedState, SessionReducer
from .runs import RunResult, Runs, RunStream
from .runtime import (
    LeaseLost,
    Message,
    ReplayDiverged,
    RunContext,
    RunHandler,
    RunStopped,
    Runtime,
    ToolError,
    ToolFailed,
)
from .sse import SseEvent, SseParser, parse_sse
from .typed import AnyEvent, AnyHydrateRecord, AnyWatchEvent, RunTerminal, parse_event
from .wire import ALL_PROFILES, PROFILE_NAMESPACES, PROTOCOL_VERSION, Violation, classify

__all__ = [
    "ALL_PROFILES",
    "CLIENT_RESTARTED",
    "PROFILE_NAMESPACES",
    "PROTOCOL_VERSION",
    "TOOL_ERROR",
    "UNKNOWN_TOOL",
    "AcceptedToken",
    "AnyEvent",
    "AnyHydrateRecord",
    "AnyWatchEvent",
    "AuthError",
    "Client",
    "ConflictError",
    "Delivered",
    "Event",
    "Executor",
    "ExecutorStats",
    "FileTokenStore",
    "Frame",
    "GoneError",
    "HistoryPage",
    "JsonValue",
    "LeaseLost",
    "MemberDecision",
    "MemoryTokenStore",
    "Message",
    "NaradError",
    "NotFoundError",
    "RateLimitedError",
    "ReducedState",
    "ReplayDiverged",
    "RunContext",
    "RunHandler",
    "RunResult",
    "RunStopped",
    "RunStream",
    "RunTerminal",
    "Runs",
    "Runtime",
    "RuntimeOptions",
    "SessionReducer",
    "SseEvent",
    "SseParser",
    "TokenEntry",
    "TokenSource",
    "TokenStore",
    "TokenStoreError",
    "Tool",
    "ToolError",
    "ToolFailed",
    "ToolResult",
    "UnavailableError",
    "Violation",
    "classify",
    "events",
    "follow",
    "new_idempotency_key",
    "parse_event",
    "parse_sse",
]
