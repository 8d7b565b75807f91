"""The wire's events as the generated pydantic models, for a type checker to read.

:data:`AnyEvent` is the union of every authority event type of ``schema/events``
(what ``narad.models.HistoryPage.events`` holds); comparing ``event.type`` with
a literal narrows it, so ``mypy --strict`` knows the fields of each::

    event = parse_event(data)
    if event.type == "message.text.delta":
        print(event.delta)          # a TextDelta: a misspelt field is an error
    elif event.type in ("run.finished", "run.error", "run.cancelled"):
        ...

:data:`AnyWatchEvent` and :data:`AnyHydrateRecord` do the same for watch events
and hydrate records. The models keep the fields they do not declare
(``extra="allow"``), and :attr:`~narad.follow.Frame.data` keeps the JSON as
it came, which is what a :class:`~narad.reducer.SessionReducer` takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypeAlias

from pydantic import Field, TypeAdapter

from .models import HydrateRecord, WatchEvent
from .models.events import artifact, attachment, interrupt, progress, reasoning, view
from .models.events import message as message_events
from .models.events import node as node_events
from .models.events import run as run_events
from .models.events import session as session_events
from .models.events import state as state_events
from .models.events import workflow as workflow_events
from .models.events.message import text, user
from .models.events.run import stop
from .models.events.tool import call
from .models.events.ui import state as ui_state
from .models.events.workflow import edge, step
from .models.hydrate import graph, messages
from .models.watch import node as node_watch
from .models.watch import run as run_watch
from .models.watch import session as session_watch
from .models.watch import workflow as workflow_watch
from .models.watch import workspace as workspace_watch

__all__ = [
    "AnyEvent",
    "AnyHydrateRecord",
    "AnyWatchEvent",
    "InterruptRequested",
    "InterruptResolved",
    "ReasoningDelta",
    "RunCancelled",
    "RunError",
    "RunFinished",
    "RunPaused",
    "RunResumed",
    "RunStarted",
    "RunTerminal",
    "TextCompleted",
    "TextDelta",
    "TextStarted",
    "ToolCallFinished",
    "ToolCallStarted",
    "UserMessageRecorded",
    "parse_event",
    "parse_hydrate",
    "parse_watch",
]

RunStarted = run_events.Started
RunPaused = run_events.Paused
RunResumed = run_events.Resumed
RunFinished = run_events.Finished
RunError = run_events.Error
RunCancelled = run_events.Cancelled
TextStarted = text.Started
TextDelta = text.Delta
TextCompleted = text.Completed
ReasoningDelta = reasoning.Delta
UserMessageRecorded = user.Recorded
InterruptRequested = interrupt.Requested
InterruptResolved = interrupt.Resolved
ToolCallStarted = call.Started
ToolCallFinished = call.Finished

#: The event that ends a run.
RunTerminal: TypeAlias = run_events.Finished | run_events.Error | run_events.Cancelled

#: Any authority event (§5), by its ``type``.
AnyEvent: TypeAlias = (
    artifact.Added
    | artifact.Failed
    | artifact.Ready
    | attachment.Added
    | attachment.Failed
    | attachment.Ready
    | attachment.Removed
    | interrupt.Requested
    | interrupt.Resolved
    | message_events.Redacted
    | text.Completed
    | text.Delta
    | text.Started
    | user.Recorded
    | node_events.Custom
    | node_events.Raw
    | progress.Recorded
    | reasoning.Completed
    | reasoning.Delta
    | reasoning.Started
    | run_events.Cancelled
    | run_events.Custom
    | run_events.Error
    | run_events.Finished
    | run_events.Paused
    | run_events.Raw
    | run_events.Resumed
    | run_events.Started
    | stop.Requested
    | session_events.Custom
    | session_events.Raw
    | state_events.Compacted
    | state_events.Delta
    | state_events.Snapshot
    | call.Finished
    | call.Started
    | ui_state.Delta
    | ui_state.Snapshot
    | view.Closed
    | view.Opened
    | view.Updated
    | workflow_events.Cancelled
    | workflow_events.Custom
    | edge.Taken
    | workflow_events.Error
    | workflow_events.Finished
    | workflow_events.Paused
    | workflow_events.Raw
    | workflow_events.Resumed
    | workflow_events.Started
    | step.Started
)

#: Any watch event (§9.4).
AnyWatchEvent: TypeAlias = (
    node_watch.Revision
    | run_watch.Revision
    | session_watch.Archived
    | session_watch.Created
    | session_watch.Revision
    | session_watch.Updated
    | workflow_watch.Revision
    | workspace_watch.Revision
)

#: Any hydrate record: a graph snapshot or delta, a transcript snapshot.
AnyHydrateRecord: TypeAlias = graph.Delta | graph.Snapshot | messages.Snapshot

_EVENTS: TypeAdapter[AnyEvent] = TypeAdapter(Annotated[AnyEvent, Field(discriminator="type")])
_TERMINALS: TypeAdapter[RunTerminal] = TypeAdapter(
    Annotated[RunTerminal, Field(discriminator="type")]
)


def parse_event(data: Mapping[str, Any]) -> AnyEvent:
    """An authority event's JSON as its model (pydantic's ``ValidationError`` when
    it is not one of ``schema/events``' types, or not valid)."""
    return _EVENTS.validate_python(data)


def parse_watch(data: Mapping[str, Any]) -> AnyWatchEvent:
    """A watch event's JSON as its model."""
    parsed: AnyWatchEvent = WatchEvent.model_validate(data).root
    return parsed


def parse_hydrate(data: Mapping[str, Any]) -> AnyHydrateRecord:
    """A hydrate record's JSON as its model."""
    parsed: AnyHydrateRecord = HydrateRecord.model_validate(data).root
    return parsed


def parse_terminal(data: Mapping[str, Any]) -> RunTerminal:
    """A run terminal's JSON (``run.finished``, ``run.error``, ``run.cancelled``) as its model."""
    return _TERMINALS.validate_python(data)
