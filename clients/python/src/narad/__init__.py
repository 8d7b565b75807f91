"""narad: the Python client of narad/v1.

- :class:`Client`: sessions, commands, appends (idempotent retries), history,
  errors as :class:`NaradError` with their ``NRD-xxxx`` code, ``Retry-After``
  honoured, several replicas tried in turn.
- :func:`follow`: a session's stream or the tenant's, resumed across ends of
  connections and servers, gaps filled from history.
- :class:`SessionReducer`: what a client received, reduced to session state,
  with the client obligations of §10 (deduplication, gaps, conflicts).
- :class:`Runtime` and :class:`RunContext`: an agent runtime loop.
- :class:`Executor`: a client executor loop with a durable token store.
"""

from .client import Client, Event, HistoryPage, TokenSource
from .errors import NaradError
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
from .runtime import (
    LeaseLost,
    Message,
    RunContext,
    RunHandler,
    RunStopped,
    Runtime,
    ToolFailed,
)
from .sse import SseEvent, SseParser, parse_sse
from .wire import ALL_PROFILES, PROFILE_NAMESPACES, PROTOCOL_VERSION, Violation, classify

__all__ = [
    "ALL_PROFILES",
    "CLIENT_RESTARTED",
    "PROFILE_NAMESPACES",
    "PROTOCOL_VERSION",
    "TOOL_ERROR",
    "UNKNOWN_TOOL",
    "AcceptedToken",
    "Client",
    "Delivered",
    "Event",
    "Executor",
    "ExecutorStats",
    "FileTokenStore",
    "Frame",
    "HistoryPage",
    "LeaseLost",
    "MemoryTokenStore",
    "Message",
    "NaradError",
    "ReducedState",
    "RunContext",
    "RunHandler",
    "RunStopped",
    "Runtime",
    "SessionReducer",
    "SseEvent",
    "SseParser",
    "TokenEntry",
    "TokenSource",
    "TokenStore",
    "TokenStoreError",
    "Tool",
    "ToolFailed",
    "ToolResult",
    "Violation",
    "classify",
    "events",
    "follow",
    "parse_sse",
]
