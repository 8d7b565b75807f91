"""An agent runtime: claims the runs queued for agent runtimes (a ``start-run``
with ``runtime``), runs an ``async def handler(ctx)`` on each under a renewed
lease, and gives the run back when the handler returns.

The loop (:meth:`Runtime.run`), round trip by round trip:

- ``POST /v1/runtime/claims {queue?, runtimeId?, waitMs}``: a long poll, sent
  only while one of ``concurrency`` slots is free, so the runtime never holds
  a run it cannot start. 204 means nothing came; a claim carries the run, its
  session, a ``cursor`` and a lease.
- Per claim: ``GET /v1/sessions/{id}/events?rootRunId=&afterSequence=`` reads
  the run's journal once (what earlier holders did, for replay; later reads
  only what is new), then the handler runs. Meanwhile
  ``POST /v1/runtime/leases/{id}/heartbeat`` renews the lease (every
  ``heartbeat_interval``, or a third of what is left of it) and
  ``GET /v1/runtime/leases/{id}/controls?waitMs=20000`` long-polls for a stop,
  so a stop reaches the handler within about a second
  (:attr:`RunContext.stop_requested`). A 409 (``NRD-0501``) on any of them
  means the lease was lost: the handler's task is cancelled and the run is
  left to the server.
- Every append carries ``Narad-Runtime-Lease``. When the handler returns, or
  raises :class:`RunStopped`, the run is closed if it was asked to stop (open
  work first, then ``run.cancelled``) and released with
  ``POST /v1/runtime/leases/{id}/release {handledThrough}``. A handler that
  raises anything else is *not* released: its lease lapses and the run's
  ``onLost`` policy applies (another holder, with the lost holder's backend
  tool calls closed ``cancelled``/``runtime_lost``, or ``run.error``).

The :class:`RunContext` gives a handler steps that write the protocol's
events for it: :meth:`~RunContext.say` (streamed assistant text, coalesced
into few appends), :meth:`~RunContext.think` (reasoning),
:meth:`~RunContext.tool` (a backend tool call), :meth:`~RunContext.client_tool`
(a call on the run's client executor, waited for),
:meth:`~RunContext.approve` (an interrupt and its pause, waited for),
:meth:`~RunContext.nested` (a nested run: an agent handed off to, a subgraph),
:meth:`~RunContext.finish`, :meth:`~RunContext.cancel`, :meth:`~RunContext.fail`.

**Replay.** Steps are numbered in the order the handler takes them, and
each step's ids derive from the run id and that number (``{runId}.3.tool``,
``{runId}.4.approval``), not from the holder. A later holder of the run (after
a lost runtime, or a release) runs the handler from the top and every step
first looks in the journal: a finished tool call answers its recorded result
without running again, an approval already requested is waited for (and a
decided one answers its decision at once), a completed message is not said
again, and a message a lost holder left half-streamed is carried on from
where it stopped. A backend call the server closed as ``runtime_lost`` runs
again under a new toolCallId (``{runId}.3.tool.2``: a retry that may repeat
side effects takes a new id, §11.3). Replay assumes the handler takes the
same steps in the same order for the same journal. EventIds are
``{runId}@{attempt}.{lease}.{n}``: fixed when an event is built, so the
client's resend of a batch after a lost answer is recognised by the server as
the same batch.

Example::

    async def handler(ctx: RunContext) -> None:
        await ctx.say("Hello")
        if await ctx.approve("Delete the files?") == "approve":
            await ctx.tool("fs.delete", {"path": "/tmp/x"}, delete)
        await ctx.finish()

    async with Client(url, token) as client:
        runtime = Runtime(client, handler, queue="agents")
        await runtime.run()  # until runtime.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import logging
import uuid
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import TracebackType
from typing import Any, TypeVar

from .client import Client, Event
from .errors import ConflictError, NaradError
from .models import Appended, Claim, LeaseStanding
from .wire import PROTOCOL_VERSION

__all__ = [
    "LEASE_HEADER",
    "LeaseLost",
    "Message",
    "ReplayDiverged",
    "RunContext",
    "RunHandler",
    "RunStopped",
    "Runtime",
    "ToolError",
    "ToolFailed",
]

log = logging.getLogger("narad.runtime")

#: The code of a nested run that ended because its block raised.
NESTED_RUN_FAILED = "nested_run_failed"

#: The code of a run whose replay took another path than its journal.
REPLAY_DIVERGED = "replay_diverged"

#: The header that carries a runtime lease on appends.
LEASE_HEADER = "Narad-Runtime-Lease"

#: The code of ``NRD-0501``: the lease presented is not the run's current one.
LEASE_NOT_CURRENT = "NRD-0501"

#: The longest a claim or a controls poll may wait, in seconds (the server's limit).
MAX_WAIT = 30.0

#: How long one controls poll waits for a stop, in seconds.
CONTROLS_WAIT = 20.0

#: A request's own time on top of a long poll's wait, in seconds.
REQUEST_SLACK = 15.0

#: The event types that end a run.
TERMINALS = frozenset({"run.finished", "run.error", "run.cancelled"})

#: The code and message of the ``run.cancelled`` a stop ends in.
STOPPED = "stopped"
STOPPED_MESSAGE = "stopped on request"

#: The code of a backend tool call whose function raised.
TOOL_ERROR = "tool_error"

#: The code the server closes a lost holder's work with.
RUNTIME_LOST = "runtime_lost"

_CLOSING_MESSAGES = {
    STOPPED: STOPPED_MESSAGE,
    RUNTIME_LOST: "the agent runtime running this call was lost",
}

_HISTORY_PAGE = 1000
_MAX_ID = 256
_ID_NAMESPACE = uuid.UUID("5f3c4c1e-3a52-4f0e-9d8e-6e6172616401")
_CLOSE_TRIES = 5
#: The rules a document event breaks when another writer moved the document.
_REVISION_MOVED = ("state.revision.base", "state.revision.contiguous", "state.revision.regress")

T = TypeVar("T")

RunHandler = Callable[["RunContext"], Awaitable[None]]
"""A run handler: ``async def handler(ctx: RunContext) -> None``."""


# ------------------------------------------------------------------ errors


class RunStopped(Exception):
    """The run was asked to stop: raised by a step the handler takes after the stop.

    Let it propagate: the runtime closes the run's open work and ends it with
    ``run.cancelled`` (``code: "stopped"``), then releases it. A handler that
    wants another ending catches it and calls :meth:`RunContext.finish` or
    :meth:`RunContext.fail` itself.
    """


class LeaseLost(ConflictError):
    """The run's lease is no longer current (``NRD-0501``): it lapsed or was released.

    Nothing of the refused request was written. Stop working on the run: the
    server retries it on another runtime or ends it, as its ``onLost`` says.
    """

    @staticmethod
    def for_run(run_id: str) -> LeaseLost:
        """The refusal a context raises itself once it knows its lease is lost."""
        body = {
            "code": LEASE_NOT_CURRENT,
            "title": "Runtime lease not current",
            "message": f"the runtime lease of run {run_id} is no longer current",
        }
        return LeaseLost(409, str(body["message"]), body=body)

    @staticmethod
    def of(error: NaradError) -> LeaseLost:
        """The same refusal, as a :class:`LeaseLost`."""
        return LeaseLost(
            error.status,
            error.message,
            body=error.body,
            retry_after=error.retry_after,
            request_id=error.request_id,
        )


class ToolError(Exception):
    """Raised by a backend tool's function to say how its call failed: the
    call finishes ``error`` with this ``code`` (instead of ``tool_error``) and
    ``message``. A framework adapter raises it ``from`` the framework's own
    exception to keep the kind of failure in the journal (e.g. ``retry``)."""

    def __init__(self, code: str, message: str) -> None:
        """A failure of code ``code`` (1 to 256 characters) and ``message``."""
        super().__init__(message)
        self.code = code
        self.message = message


class ToolFailed(Exception):
    """A tool call ended with outcome ``error`` or ``cancelled``.

    ``outcome``, ``code``, ``message`` and ``response`` are its
    ``tool.call.finished``'s.
    """

    def __init__(self, tool_call_id: str, finished: Mapping[str, Any]) -> None:
        """The failure of call ``tool_call_id``, from its ``tool.call.finished``."""
        self.tool_call_id = tool_call_id
        self.outcome: str = str(finished.get("outcome"))
        self.code: str | None = finished.get("code")
        self.message: str | None = finished.get("message")
        self.response: Any = finished.get("response")
        super().__init__(
            f"tool call {tool_call_id} ended {self.outcome}"
            + (f" ({self.code})" if self.code else "")
            + (f": {self.message}" if self.message else "")
        )


class ReplayDiverged(Exception):
    """A replayed step is not the step the journal holds under its id: the
    handler (or the framework it drives) took another path than the holder
    before it, e.g. a call of another tool under the same key. The run cannot
    go on safely; ``narad.integrations.drive`` ends it ``run.error`` with code
    ``replay_diverged``."""


class _Waiting(Exception):
    """A step waits on a person or a client executor, and the runtime gives runs back then."""


# ----------------------------------------------------------------- the journal


def _ident(*parts: object) -> str:
    """An id made of ``parts`` joined with dots; hashed when over the 256-character limit."""
    text = ".".join(str(p) for p in parts)
    if len(text) <= _MAX_ID:
        return text
    return f"{uuid.uuid5(_ID_NAMESPACE, text)}.{str(parts[-1])[:64]}"


@dataclass
class _RunState:
    """One run of the journal, as its events left it."""

    run_id: str
    parent_run_id: str | None = None
    started: Event | None = None
    terminal: str | None = None
    stop_requested: bool = False
    #: The open pause: its waitId, interruptId and resumeMode.
    pause: tuple[str, str | None, str] | None = None
    #: Open tool calls: toolCallId -> executor.
    open_calls: dict[str, str] = field(default_factory=dict)
    #: Open interrupts: interruptId -> waitId.
    open_interrupts: dict[str, str] = field(default_factory=dict)


@dataclass
class _Stream:
    """A streamed message or reasoning: its run, text so far and whether it completed."""

    run_id: str
    text: str = ""
    completed: bool = False


class _Journal:
    """The run journal of one root run as read (and written) so far.

    Events are folded in run-tree ``sequence`` order only: one that arrives
    past a gap waits in ``pending`` until the gap is read.
    """

    def __init__(self, root_run_id: str) -> None:
        self.root = root_run_id
        self.through = 0
        self.session_through = 0
        self.pending: dict[int, Event] = {}
        self.events: list[Event] = []
        self.runs: dict[str, _RunState] = {}
        self.calls: dict[str, Event] = {}
        self.finished: dict[str, Event] = {}
        self.interrupts: dict[str, Event] = {}
        self.resolutions: dict[str, Event] = {}
        self.messages: dict[str, _Stream] = {}
        self.reasoning: dict[str, _Stream] = {}
        #: progressId -> the statuses recorded for it.
        self.progress: dict[str, set[str]] = {}
        #: The eventIds of the journal (state steps name their events).
        self.event_ids: set[str] = set()

    def add(self, event: Mapping[str, Any]) -> None:
        """Takes an event of the session: kept when it belongs to this journal."""
        sequence = event.get("sequence")
        if event.get("rootRunId") != self.root or not isinstance(sequence, int):
            return
        if sequence > self.through:
            self.pending[sequence] = dict(event)

    def advance(self) -> list[Event]:
        """Folds what is contiguous; answers the events folded."""
        folded: list[Event] = []
        while self.through + 1 in self.pending:
            event = self.pending.pop(self.through + 1)
            self.through += 1
            session_sequence = event.get("sessionSequence")
            if isinstance(session_sequence, int):
                self.session_through = max(self.session_through, session_sequence)
            self._fold(event)
            self.event_ids.add(str(event.get("eventId")))
            self.events.append(event)
            folded.append(event)
        return folded

    @property
    def has_gap(self) -> bool:
        """Whether events past an unread one wait."""
        return bool(self.pending)

    def run(self, run_id: str) -> _RunState:
        """The state of run ``run_id`` (an empty one if it never started)."""
        return self.runs.setdefault(run_id, _RunState(run_id))

    def _fold(self, e: Event) -> None:
        kind = e.get("type")
        run_id = str(e.get("runId"))
        run = self.run(run_id)
        if kind == "run.started":
            run.started = e
            run.parent_run_id = e.get("parentRunId")
        elif kind in TERMINALS:
            run.terminal = str(kind)
        elif kind == "run.stop.requested":
            self.run(str(e.get("targetRunId", run_id))).stop_requested = True
        elif kind == "run.paused":
            run.pause = (str(e.get("waitId")), e.get("interruptId"), str(e.get("resumeMode")))
        elif kind == "run.resumed":
            run.pause = None
        elif kind == "tool.call.started":
            call = str(e.get("toolCallId"))
            self.calls[call] = e
            run.open_calls[call] = str(e.get("executor"))
        elif kind == "tool.call.finished":
            call = str(e.get("toolCallId"))
            self.finished[call] = e
            run.open_calls.pop(call, None)
        elif kind == "interrupt.requested":
            interrupt = str(e.get("interruptId"))
            self.interrupts[interrupt] = e
            run.open_interrupts[interrupt] = str(e.get("waitId"))
        elif kind == "interrupt.resolved":
            interrupt = str(e.get("interruptId"))
            self.resolutions[interrupt] = e
            run.open_interrupts.pop(interrupt, None)
        elif kind in ("message.text.started", "reasoning.started"):
            streams = self.messages if kind == "message.text.started" else self.reasoning
            key = "messageId" if kind == "message.text.started" else "reasoningId"
            streams[str(e.get(key))] = _Stream(run_id)
        elif kind in ("message.text.delta", "reasoning.delta"):
            stream = self._stream(e)
            if stream is not None:
                stream.text += str(e.get("delta", ""))
        elif kind in ("message.text.completed", "reasoning.completed"):
            stream = self._stream(e)
            if stream is not None:
                stream.completed = True
        elif kind == "progress.recorded":
            self.progress.setdefault(str(e.get("progressId")), set()).add(str(e.get("status")))

    def _stream(self, e: Event) -> _Stream | None:
        if str(e.get("type")).startswith("message."):
            return self.messages.get(str(e.get("messageId")))
        return self.reasoning.get(str(e.get("reasoningId")))

    def step_ids(self, base: str, among: Collection[str]) -> list[str]:
        """The ids of one step, in the order they were used: ``base``, ``base.2``, ..."""
        prefix = base + "."
        serials = {
            i: int(i[len(prefix) :])
            for i in among
            if i.startswith(prefix) and i[len(prefix) :].isdigit()
        }
        if base in among:
            serials[base] = 1
        return sorted(serials, key=serials.__getitem__)

    def lineage(self, run: _RunState) -> list[str]:
        """The ids of ``run`` and of its ancestors in the journal, the run first."""
        ids = [run.run_id]
        while run.parent_run_id is not None and run.parent_run_id in self.runs:
            run = self.runs[run.parent_run_id]
            ids.append(run.run_id)
        return ids

    def open_runs_deepest_first(self, under: str) -> list[_RunState]:
        """The runs of the journal in ``under``'s tree (``under`` and what is
        nested in it) that have started and not ended, children before parents."""
        open_runs = [
            (len(lineage), r)
            for r in self.runs.values()
            if r.started is not None and not r.terminal and under in (lineage := self.lineage(r))
        ]
        return [r for _, r in sorted(open_runs, key=lambda p: (-p[0], p[1].run_id))]


# ------------------------------------------------------------------ messages


@dataclass
class _Batch:
    """What one append of a message sends: its events, the text they carry,
    whether they open a new message (a diverged replay) and complete it."""

    final: bool
    events: list[Event] = field(default_factory=list)
    text: str = ""
    diverged: bool = False


class Message:
    """One streamed message (``message.text.started`` / ``.delta`` / ``.completed``).

    Text given to :meth:`say` is sent as ``message.text.delta`` events,
    coalesced: what is said within ``delta_window`` seconds (50 ms by
    default), or up to ``delta_chars`` characters, goes out as one delta in
    one append; the first append also carries ``message.text.started``.
    :meth:`complete` sends what is left with ``message.text.completed``.
    Use it as ``async with ctx.message() as m: await m.say(...)``, or let
    :meth:`RunContext.say` open one: any other step (a tool, an approval,
    the run's end) completes the open message first.

    On replay, a message the journal holds completed is not sent again
    (what is said to it is only counted), and one a lost holder left
    half-way is carried on: what is said goes out from where the journal
    stops. Should the text differ from what the journal holds, that message
    is completed as it stands and the text goes out in a new one.
    """

    def __init__(self, ctx: RunContext, step: int | str, role: str) -> None:
        """A message of ``ctx`` at step ``step``, a position or a key (made by
        :meth:`RunContext.message`)."""
        self._ctx = ctx
        self.role = role
        self._base_id = _ident(ctx.run_id, step, "message")
        journal = ctx._journal
        ids = journal.step_ids(self._base_id, journal.messages)
        last = journal.messages.get(ids[-1]) if ids else None
        #: Its messageId (a later one when a replay diverged from a lost holder's text).
        self.message_id = ids[-1] if ids else self._base_id
        self._serial = max(len(ids), 1)
        #: The journal holds it completed: nothing of it is sent again.
        self._replayed = last is not None and last.completed
        #: Its ``message.text.started`` is in the journal.
        self._started = last is not None
        #: The text the journal holds for it (a lost holder's and ours).
        self._sent = last.text if last is not None else ""
        #: Everything this holder said to it.
        self._said = ""
        self._done = False
        self._timer: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    @property
    def text(self) -> str:
        """What was said to it so far."""
        return self._said

    @property
    def completed(self) -> bool:
        """Whether it was completed."""
        return self._done

    async def __aenter__(self) -> Message:
        await self._ctx._complete_before(self)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # After an error the run's closing (a stop) completes it, if anyone does.
        if error is None:
            await self.complete()

    async def say(self, text: str) -> None:
        """Adds ``text`` to the message (raises :class:`RunStopped` after a stop)."""
        self._raise_failure()
        ctx = self._ctx
        ctx._check_running()
        if self._done:
            raise RuntimeError(f"message {self.message_id} is complete; open another")
        await ctx._complete_before(self)
        self._said += text
        if self._replayed:
            return
        unsent = self._unsent()
        if len(unsent) >= ctx._delta_chars:
            await self._flush()
        elif unsent and self._timer is None:
            self._timer = asyncio.create_task(self._flush_later())

    async def complete(self) -> None:
        """Sends what is left of the message and ``message.text.completed``."""
        self._raise_failure()
        if self._done:
            return
        await self._ctx._complete_before(self)
        self._cancel_timer()
        async with self._ctx._writing:
            batch = self._batch(final=True)
            if batch.events:
                await self._ctx._append_locked(batch.events)
            self._sent_batch(batch)

    def _diverged(self) -> bool:
        """Whether this holder said something else than the journal holds."""
        return not (self._said.startswith(self._sent) or self._sent.startswith(self._said))

    def _unsent(self) -> str:
        """What was said and is not in the journal yet."""
        if self._diverged():
            return self._said
        return self._said[len(self._sent) :] if len(self._said) > len(self._sent) else ""

    def _batch(self, *, final: bool) -> _Batch:
        """The events that send what is unsent (and complete the message when ``final``).

        Nothing changes until :meth:`_sent_batch` records the batch as
        appended: more may be said while it is on its way.
        """
        batch = _Batch(final=final)
        if self._done or self._replayed:
            return batch
        ctx = self._ctx
        message_id, started = self.message_id, self._started
        if self._diverged():
            batch.events.append(ctx.event("message.text.completed", messageId=message_id))
            batch.diverged = True
            message_id, started = _ident(self._base_id, self._serial + 1), False
        batch.text = self._unsent()
        if not started:
            if not batch.text:
                return batch  # nothing said: no empty message
            batch.events.append(
                ctx.event(
                    "message.text.started", messageId=message_id, role=self.role, messageScope="run"
                )
            )
        if batch.text:
            batch.events.append(
                ctx.event("message.text.delta", messageId=message_id, delta=batch.text)
            )
        if final:
            batch.events.append(ctx.event("message.text.completed", messageId=message_id))
        return batch

    def _sent_batch(self, batch: _Batch) -> None:
        """Records that ``batch`` (of :meth:`_batch`) was appended."""
        if self._done:
            return
        if batch.diverged:
            self._serial += 1
            self.message_id = _ident(self._base_id, self._serial)
            self._sent, self._started = "", False
        if batch.text:
            self._started = True
            self._sent += batch.text
        if batch.final:
            self._done = True
            self._cancel_timer()
            self._ctx._forget(self)

    async def _flush(self) -> None:
        self._cancel_timer()
        async with self._ctx._writing:
            batch = self._batch(final=False)
            if batch.events:
                await self._ctx._append_locked(batch.events)
            self._sent_batch(batch)

    async def _flush_later(self) -> None:
        try:
            await asyncio.sleep(self._ctx._delta_window)
            self._timer = None
            await self._flush()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # raised again by the next say() or complete()
            self._failure = e

    def _cancel_timer(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure


# ------------------------------------------------------------------ context


class RunContext:
    """A claimed run, as its handler sees it: the claim, the journal, appends
    under the lease, the stop and lost signals, and steps that write the
    protocol's events (see the module documentation for replay)."""

    def __init__(
        self,
        client: Client,
        claim: Claim,
        *,
        poll_interval: float = 1.0,
        delta_window: float = 0.05,
        delta_chars: int = 256,
        release_when_waiting: bool = False,
    ) -> None:
        """The context of ``claim`` (made by the :class:`Runtime`; see its settings)."""
        self.claim = claim
        self.client = client
        #: Set when the run is asked to stop (``await ctx.stop_event.wait()``).
        self.stop_event = asyncio.Event()
        #: Set when the lease is lost.
        self.lost_event = asyncio.Event()
        self._journal = _Journal(str(claim.run_id))
        self._writing = asyncio.Lock()
        #: The run this context writes: the claimed run, or a nested one.
        self._run_id = str(claim.run_id)
        self._parent: RunContext | None = None
        #: The claimed run's context and its nested ones (shared by all of them).
        self._family: list[RunContext] = [self]
        self._events_made = 0
        self._steps = 0
        #: Messages opened and not completed, in the order they opened.
        self._messages: list[Message] = []
        self._current: Message | None = None
        self._ended = False
        self._poll_interval = poll_interval
        self._delta_window = delta_window
        self._delta_chars = delta_chars
        self._release_when_waiting = release_when_waiting
        self._on_lost: Callable[[], object] | None = None
        if claim.stop_requested:
            self.stop_event.set()

    def __repr__(self) -> str:
        return (
            f"RunContext(run_id={self.run_id!r}, session_id={self.session_id!r}, "
            f"attempt={self.attempt}, stop_requested={self.stop_requested}, lost={self.lost})"
        )

    # --- the claim -----------------------------------------------------------

    @property
    def session_id(self) -> str:
        """The run's session."""
        return str(self.claim.session_id)

    @property
    def run_id(self) -> str:
        """The run this context writes: the claimed run (the root of its
        journal), or a nested run of it (:meth:`nested`)."""
        return self._run_id

    @property
    def parent(self) -> RunContext | None:
        """The context of the run this one is nested in (``None`` for the claimed run)."""
        return self._parent

    @property
    def attempt(self) -> int:
        """This holder's number, from 1; above 1 after lost holders."""
        return int(self.claim.attempt)

    @property
    def reason(self) -> str:
        """Why the run was ready: ``started``, ``event`` or ``retry``."""
        return str(self.claim.reason)

    @property
    def lease_id(self) -> str:
        """The lease every append presents."""
        return str(self.claim.lease.lease_id)

    @property
    def started(self) -> Event:
        """The run's ``run.started`` event."""
        return self._journal.run(self.run_id).started or {}

    @property
    def input(self) -> Any:
        """The ``input`` of the run's start (``None`` when it had none)."""
        return self.started.get("input")

    @property
    def client_executor_id(self) -> str | None:
        """The client executor the run is bound to, if any (for :meth:`client_tool`)."""
        executor = self.started.get("clientExecutorId")
        return str(executor) if executor is not None else None

    # --- signals -------------------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        """Whether the run was asked to stop: close its work and end it."""
        return self.stop_event.is_set()

    @property
    def lost(self) -> bool:
        """Whether the lease was lost: nothing more can be appended."""
        return self.lost_event.is_set()

    @property
    def ended(self) -> bool:
        """Whether the run has ended (its terminal is in the journal or was appended)."""
        return self._ended or self._journal.run(self.run_id).terminal is not None

    def _request_stop(self) -> None:
        if not self.stop_event.is_set():
            log.info("run %s was asked to stop", self.run_id)
            self.stop_event.set()
        for ctx in self._family:
            if ctx._parent is self:
                ctx._request_stop()

    def _lease_refused(self) -> None:
        if self.ended or self.lost:
            return
        log.warning("run %s: the runtime lease is no longer current", self.run_id)
        self.lost_event.set()
        if self._on_lost is not None:
            self._on_lost()

    def _check_running(self) -> None:
        """Raises when no new work may start: the lease lost, or a stop."""
        if self.lost:
            raise LeaseLost.for_run(self.run_id)
        if self.stop_requested:
            raise RunStopped(f"run {self.run_id} was asked to stop")

    # --- reading -------------------------------------------------------------

    @property
    def journal(self) -> list[Event]:
        """The run journal's events read or written so far, in run-tree order."""
        return list(self._journal.events)

    @property
    def handled_through(self) -> int:
        """The sessionSequence through which every event of the run's journal was read."""
        return max(int(self.claim.cursor), self._journal.session_through)

    async def sync(self) -> list[Event]:
        """Reads what is new in the run's journal; answers the new events."""
        folded: list[Event] = []
        while True:
            page = await self.client.history(
                self.session_id,
                root_run_id=self._journal.root,
                after_sequence=self._journal.through,
                limit=_HISTORY_PAGE,
            )
            for event in page.events:
                self._journal.add(event)
            before = self._journal.through
            folded.extend(self._observe_folded())
            if page.next_sequence is None or self._journal.through == before:
                return folded

    async def history(self) -> list[Event]:
        """The session's events after the claim's cursor: what is new to this holder."""
        return await self.history_after(int(self.claim.cursor))

    async def history_after(self, session_sequence: int) -> list[Event]:
        """Every event of the session after ``session_sequence``, in order."""
        events = [
            e
            async for e in self.client.all_history(
                self.session_id, after_session_sequence=session_sequence
            )
        ]
        for event in events:
            self._journal.add(event)
        self._observe_folded()
        return events

    def _observe_folded(self) -> list[Event]:
        folded = self._journal.advance()
        # Parents come before their nested runs in the family: a stop of a
        # run reaches what is nested in it.
        for ctx in self._family:
            parent = ctx._parent
            if self._journal.run(ctx.run_id).stop_requested or (
                parent is not None and parent.stop_requested
            ):
                ctx._request_stop()
        return folded

    # --- writing -------------------------------------------------------------

    def event(self, type: str, **fields: Any) -> Event:
        """A proposed event of this run: ``protocolVersion``, ``type``, a new
        ``eventId``, ``rootRunId`` and ``runId``, then ``fields`` (wire names,
        e.g. ``messageId=``; they win, e.g. a child's ``runId``)."""
        self._events_made += 1
        event_id = _ident(
            f"{self.run_id}@{self.attempt}", self.lease_id.replace("-", "")[:12], self._events_made
        )
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "type": type,
            "eventId": event_id,
            "rootRunId": self._journal.root,
            "runId": self.run_id,
            **fields,
        }

    async def append(self, events: Sequence[Event]) -> Appended:
        """Appends a batch atomically under the run's lease.

        Raises :class:`LeaseLost` when the lease is not current (and marks the
        context lost), :class:`~narad.errors.NaradError` with the rule when the
        journal refuses an event. An open message is not completed first: use
        the steps, or :meth:`finish_message`, to keep the order you want.
        """
        async with self._writing:
            return await self._append_locked(events)

    async def _append_locked(self, events: Sequence[Event]) -> Appended:
        if self.lost:
            raise LeaseLost.for_run(self.run_id)
        if not events:
            return Appended(duplicate=False, events=[])
        try:
            appended = await self.client.append(self.session_id, events, lease=self.lease_id)
        except NaradError as e:
            if e.status == 409 and e.code == LEASE_NOT_CURRENT:
                self._lease_refused()
                raise LeaseLost.of(e) from e
            raise
        by_id = {str(e.get("eventId")): e for e in events}
        for got in appended.events:
            proposed = by_id.get(str(got.event_id))
            if proposed is None or got.sequence is None:
                continue
            self._journal.add(
                {**proposed, "sequence": got.sequence, "sessionSequence": got.session_sequence}
            )
        if any(e.get("type") in TERMINALS and e.get("runId") == self.run_id for e in events):
            self._ended = True
        self._observe_folded()
        if self._journal.has_gap:
            # Someone else wrote to the journal between our reads and this
            # append: read it, so that the next step sees the journal whole
            # (or the next read does, when this one fails).
            try:
                await self.sync()
            except NaradError as e:
                log.debug("run %s: reading the journal after an append failed: %s", self.run_id, e)
        return appended

    # --- steps ---------------------------------------------------------------

    def _next_step(self) -> int:
        self._steps += 1
        return self._steps

    def _step(self, key: str | None) -> int | str:
        """The next step's position, or ``key`` when the caller names its steps.

        A keyed step's ids are ``{runId}.{key}.{kind}``: a framework that
        resumes from state of its own and names its steps by its own ids (a
        model's tool-call id, an interrupt's id) finds them in the journal
        whatever their position. Keys are the caller's to keep unique per run.
        """
        if key is None:
            return self._next_step()
        if not key:
            raise ValueError("a step key is a non-empty string")
        return key

    def message(self, role: str = "assistant", *, key: str | None = None) -> Message:
        """Opens the next message (``assistant`` or ``system``); its first use
        completes the message opened before it. ``key`` names the step
        instead of its position."""
        message = Message(self, self._step(key), role)
        self._messages.append(message)
        self._current = message
        return message

    async def say(self, text: str | Iterable[str] | AsyncIterable[str]) -> None:
        """Says ``text`` in the current assistant message, opening one if needed:
        a string, or the pieces of an (async) iterable as they come (a model's
        stream of tokens).

        Deltas are coalesced (see :class:`Message`). Raises :class:`RunStopped`
        once the run is asked to stop, so that a long answer ends there.
        """
        if isinstance(text, str):
            pieces: AsyncIterable[str] | None = None
        elif isinstance(text, AsyncIterable):
            pieces = text
        else:
            pieces = _aiter_of(text)
        if isinstance(text, str):
            await self._say_piece(text)
            return
        assert pieces is not None
        async for piece in pieces:
            await self._say_piece(piece)

    async def _say_piece(self, text: str) -> None:
        message = self._current
        if message is None or message.completed:
            self._check_running()
            message = self.message()
        await message.say(text)

    async def finish_message(self) -> None:
        """Completes the open message(s): sends what is buffered and ``message.text.completed``."""
        for message in list(self._messages):
            await message.complete()

    async def _complete_before(self, message: Message) -> None:
        """Completes the messages opened before ``message``."""
        while self._messages and self._messages[0] is not message:
            await self._messages[0].complete()

    def _forget(self, message: Message) -> None:
        if message in self._messages:
            self._messages.remove(message)

    def _message_batches(self) -> tuple[list[tuple[Message, _Batch]], list[Event]]:
        """The open messages with the batches that send their rest and complete
        them, and those batches' events in order."""
        batches = [(message, message._batch(final=True)) for message in self._messages]
        return batches, [e for _, batch in batches for e in batch.events]

    @staticmethod
    def _sent_batches(batches: list[tuple[Message, _Batch]]) -> None:
        for message, batch in batches:
            message._sent_batch(batch)

    async def think(self, text: str, *, key: str | None = None) -> None:
        """Records a reasoning block (``reasoning.started`` / ``.delta`` / ``.completed``).
        ``key`` names the step instead of its position."""
        await self.finish_message()
        self._check_running()
        step = self._step(key)
        reasoning_id = _ident(self.run_id, step, "thought")
        known = self._journal.reasoning.get(reasoning_id)
        if known is not None and known.completed:
            return
        events: list[Event] = []
        if known is None:
            events.append(self.event("reasoning.started", reasoningId=reasoning_id))
            events.append(self.event("reasoning.delta", reasoningId=reasoning_id, delta=text))
        events.append(self.event("reasoning.completed", reasoningId=reasoning_id))
        await self.append(events)

    async def tool(
        self,
        name: str,
        args: Mapping[str, Any] | None,
        fn: Callable[[dict[str, Any]], Any],
        *,
        key: str | None = None,
    ) -> Any:
        """Calls backend tool ``name``: ``tool.call.started``, ``fn(args)``, then
        ``tool.call.finished``. Answers what ``fn`` returned (or awaited to),
        which must be JSON. When ``fn`` raises, the call finishes ``error``
        (code ``tool_error``, the exception's text as message) and
        :class:`ToolFailed` is raised from the exception (a :class:`ToolError`
        chooses the code). On replay a finished
        call answers its recorded response without calling ``fn``; a recorded
        call of another tool raises :class:`ReplayDiverged`. ``key`` names the
        step instead of its position (a model's tool-call id).
        """
        await self.finish_message()
        self._check_running()
        step = self._step(key)
        base = _ident(self.run_id, step, "tool")
        arguments = dict(args or {})
        earlier = self._journal.step_ids(base, self._journal.calls)
        self._same_tool(earlier, name)
        if earlier:
            last = earlier[-1]
            finished = self._journal.finished.get(last)
            if finished is not None and finished.get("outcome") != "cancelled":
                return _result(last, finished)
            if finished is None:
                # An earlier holder's call nobody will finish: closed first.
                await self.append([self._cancelled_call(self.run_id, last, RUNTIME_LOST)])
        call_id = _ident(base, len(earlier) + 1) if earlier else base
        await self._until_running()
        await self.append(
            [
                self.event(
                    "tool.call.started",
                    toolCallId=call_id,
                    toolName=name,
                    executor="backend",
                    args=arguments,
                )
            ]
        )
        try:
            response = fn(arguments)
            if inspect.isawaitable(response):
                response = await response
        except Exception as e:
            text = str(e) or type(e).__name__
            finished_event = self.event(
                "tool.call.finished",
                toolCallId=call_id,
                outcome="error",
                response=None,
                code=e.code if isinstance(e, ToolError) else TOOL_ERROR,
                message=text[:500],
            )
            await self.append([finished_event])
            raise ToolFailed(call_id, finished_event) from e
        await self.append(
            [
                self.event(
                    "tool.call.finished", toolCallId=call_id, outcome="success", response=response
                )
            ]
        )
        return response

    def _same_tool(self, earlier: list[str], name: str) -> None:
        """Raises :class:`ReplayDiverged` when the journal's call of this step is another tool's."""
        if earlier:
            recorded = self._journal.calls[earlier[-1]].get("toolName")
            if recorded != name:
                raise ReplayDiverged(
                    f"run {self.run_id}: step {earlier[-1]} is a call of {recorded!r} in the "
                    f"journal, and the replay calls {name!r}"
                )

    async def client_tool(
        self, name: str, args: Mapping[str, Any] | None = None, *, key: str | None = None
    ) -> Any:
        """Calls tool ``name`` on the run's client executor and waits for its result.

        Appends ``tool.call.started`` with ``executor: "client"`` (the server
        hands it to the executor), then waits — the lease kept alive — until
        the journal holds its ``tool.call.finished``: answers its response,
        raises :class:`ToolFailed` for ``error``/``cancelled``, or
        :class:`RunStopped` when the run is asked to stop meanwhile (the
        run's closing then cancels the call).
        """
        await self.finish_message()
        self._check_running()
        if self.client_executor_id is None:
            raise ValueError(f"run {self.run_id} is bound to no client executor")
        step = self._step(key)
        base = _ident(self.run_id, step, "client")
        earlier = self._journal.step_ids(base, self._journal.calls)
        self._same_tool(earlier, name)
        if earlier:
            call_id = earlier[-1]
        else:
            call_id = base
            await self._until_running()
            await self.append(
                [
                    self.event(
                        "tool.call.started",
                        toolCallId=call_id,
                        toolName=name,
                        executor="client",
                        args=dict(args or {}),
                    )
                ]
            )
        finished = await self._wait_for(lambda: self._journal.finished.get(call_id))
        if finished.get("outcome") == "cancelled" and self.stop_requested:
            raise RunStopped(f"run {self.run_id} was asked to stop")
        return _result(call_id, finished)

    async def approve(
        self,
        message: str,
        *,
        title: str | None = None,
        actions: Sequence[str] = ("approve", "deny"),
        kind: str = "approval",
        input: Any = None,
        expires_at: datetime | str | None = None,
        reason: str = "narad.approval",
        key: str | None = None,
    ) -> str:
        """Asks a person: ``interrupt.requested`` and ``run.paused`` (one batch,
        as §7.6 wants them consecutive), waits — the lease kept alive — for
        ``interrupt.resolved`` (``resolve-interrupt``), appends ``run.resumed``
        and answers the decision: one of ``actions``, or ``expired``.

        Raises :class:`RunStopped` when the run is asked to stop meanwhile
        (the run's closing then resolves the interrupt ``expired``).
        """
        await self.finish_message()
        self._check_running()
        step = self._step(key)
        interrupt_id = _ident(self.run_id, step, "approval")
        wait_id = _ident(self.run_id, step, "wait")
        if interrupt_id not in self._journal.interrupts:
            await self._until_running()
            fields: dict[str, Any] = {
                "interruptId": interrupt_id,
                "waitId": wait_id,
                "kind": kind,
                "actions": list(actions),
                "message": message,
            }
            if title is not None:
                fields["title"] = title
            if input is not None:
                fields["input"] = input
            if expires_at is not None:
                fields["expiresAt"] = (
                    expires_at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
                    if isinstance(expires_at, datetime)
                    else expires_at
                )
            await self.append(
                [
                    self.event("interrupt.requested", **fields),
                    self.event(
                        "run.paused",
                        waitId=wait_id,
                        interruptId=interrupt_id,
                        reason=reason,
                        resumeMode="command",
                    ),
                ]
            )
        resolved = await self._wait_for(lambda: self._journal.resolutions.get(interrupt_id))
        pause = self._journal.run(self.run_id).pause
        if pause is not None and pause[0] == wait_id:
            await self.append([self.event("run.resumed", waitId=wait_id)])
        return str(resolved.get("decision"))

    async def progress(
        self,
        label: str,
        *,
        status: str = "active",
        category: str = "step",
        detail: str | None = None,
        privacy: str = "public",
        key: str | None = None,
    ) -> None:
        """Records ``progress.recorded``: a step of the run (``active``, then
        ``completed``, ``failed`` or ``cancelled`` under the same ``key``).
        On replay a status the journal holds for the step is not recorded again.
        """
        await self.finish_message()
        self._check_running()
        progress_id = _ident(self.run_id, self._step(key), "progress")
        if status in self._journal.progress.get(progress_id, ()):
            return
        fields: dict[str, Any] = {
            "progressId": progress_id,
            "category": category,
            "label": label,
            "status": status,
            "privacy": privacy,
        }
        if detail is not None:
            fields["detail"] = detail
        await self.append([self.event("progress.recorded", **fields)])

    @contextlib.asynccontextmanager
    async def nested(
        self, key: str | None = None, *, input: Any = None
    ) -> AsyncIterator[RunContext]:
        """Runs a nested run of this run (§3.3): an agent handed off to, a
        subgraph, a sub-agent called as a tool.

        On entering, ``run.started`` with ``parentRunId`` (this run),
        ``clientExecutorId`` (this run's, recorded explicitly as §3.3 wants)
        and ``input``; the block gets the nested run's context, whose steps
        write into the nested run, under the same lease. On leaving, the
        nested run ends: ``run.finished`` (unless the block ended it itself,
        e.g. ``await child.finish(usage=...)``); ``run.cancelled`` when the
        block raised :class:`RunStopped`; ``run.error`` when it raised
        anything else (code ``replay_diverged``, a :class:`ToolError`'s or
        :class:`ToolFailed`'s code, else ``nested_run_failed``), the
        exception going on to the caller. A stop of this run reaches the
        nested one; a stop of the nested run alone cancels it and raises
        :class:`RunStopped` from the block, which the caller may catch.

        The nested run's id is ``{runId}.{key}.run`` (``key`` names the step
        instead of its position): on replay a nested run already in the
        journal is entered again without a second ``run.started``, its steps
        found in the journal as any others, and one that ended is not ended
        twice.
        """
        await self.finish_message()
        self._check_running()
        child_id = _ident(self.run_id, self._step(key), "run")
        if self._journal.run(child_id).started is None:
            await self._until_running()
            fields: dict[str, Any] = {"runId": child_id, "parentRunId": self.run_id}
            if self.client_executor_id is not None:
                fields["clientExecutorId"] = self.client_executor_id
            if input is not None:
                fields["input"] = input
            await self.append([self.event("run.started", **fields)])
        child = self._fork(child_id)
        try:
            yield child
        except (_Waiting, LeaseLost, asyncio.CancelledError):
            await child._settle_quietly()
            raise
        except RunStopped:
            if not child.ended and not child.lost:
                await child.cancel()
            raise
        except Exception as error:
            if not child.ended and not child.lost:
                await child._fail_with(error)
            raise
        else:
            await child.finish()
        finally:
            child._abandon_timers()
            self._family.remove(child)

    def _fork(self, run_id: str) -> RunContext:
        """The context of nested run ``run_id``: this one's client, claim,
        lease, journal and write lock, with steps, messages and a stop of its own."""
        child = copy.copy(self)
        child._run_id = run_id
        child._parent = self
        child.stop_event = asyncio.Event()
        child._events_made = 0
        child._steps = 0
        child._messages = []
        child._current = None
        child._ended = False
        self._family.append(child)
        if self.stop_requested or self._journal.run(run_id).stop_requested:
            child.stop_event.set()
        return child

    async def _fail_with(self, error: Exception) -> None:
        """Ends this run ``run.error`` for ``error`` (see :meth:`nested`); a
        journal that refuses it leaves the run to the caller's closing."""
        if isinstance(error, ReplayDiverged):
            code = REPLAY_DIVERGED
        elif isinstance(error, ToolError):
            code = error.code
        elif isinstance(error, ToolFailed):
            code = error.code or TOOL_ERROR
        else:
            code = NESTED_RUN_FAILED
        text = str(error) or type(error).__name__
        try:
            await self.fail(code, text[:500])
        except NaradError as e:
            log.warning("run %s: the failed nested run could not be closed: %s", self.run_id, e)

    async def _settle_quietly(self) -> None:
        """Sends what is buffered of the open messages, unless the lease is gone."""
        if not self.lost:
            with contextlib.suppress(NaradError):
                await self.finish_message()

    async def read_state(self, scope: str = "session", *, ui: bool = False) -> tuple[int, Any]:
        """The session's state document of ``scope`` (``ui``: the UI profile's):
        its revision and value; ``(0, None)`` when it has none."""
        documents = await self.client.request(
            "GET", f"/v1/sessions/{self.session_id}/documents", idempotent=True
        )
        for document in documents["ui" if ui else "state"]:
            if document["scope"] == scope:
                return int(document["revision"]), document["state"]
        return 0, None

    async def put_state(
        self, state: Any, *, scope: str = "session", ui: bool = False, key: str | None = None
    ) -> int:
        """Replaces the state document of ``scope`` (``state.snapshot``, or
        ``ui.state.snapshot`` with ``ui``); answers its new revision."""
        kind = "ui.state.snapshot" if ui else "state.snapshot"
        return await self._document(
            scope, ui, key, lambda revision: self.event(kind, revision=revision + 1, state=state)
        )

    async def patch_state(
        self,
        patch: Sequence[Mapping[str, Any]],
        *,
        scope: str = "session",
        ui: bool = False,
        key: str | None = None,
    ) -> int:
        """Changes the state document of ``scope`` by an RFC 6902 ``patch``
        (``state.delta``, or ``ui.state.delta`` with ``ui``); answers its new revision."""
        kind = "ui.state.delta" if ui else "state.delta"
        operations = [dict(op) for op in patch]
        return await self._document(
            scope,
            ui,
            key,
            lambda revision: self.event(
                kind, baseRevision=revision, revision=revision + 1, patch=operations
            ),
        )

    async def _document(
        self, scope: str, ui: bool, key: str | None, make: Callable[[int], Event]
    ) -> int:
        """Appends a document event made for the document's current revision;
        reads the revision again when another writer moved it. The event's id
        is the step's, so a replayed step is not written twice."""
        await self.finish_message()
        self._check_running()
        event_id = _ident(self.run_id, self._step(key), "state")
        for attempt in range(_CLOSE_TRIES):
            revision, _ = await self.read_state(scope, ui=ui)
            if event_id in self._journal.event_ids:
                return revision
            event = {**make(revision), "scope": scope, "eventId": event_id}
            try:
                await self.append([event])
            except NaradError as e:
                moved = e.status == 409 and e.rule in _REVISION_MOVED
                if not moved or attempt + 1 == _CLOSE_TRIES:
                    raise
                continue
            return int(event["revision"])
        raise AssertionError("unreachable")

    async def finish(self, **fields: Any) -> None:
        """Ends the run with ``run.finished`` (``fields``: e.g. ``usage=``),
        completing the open message in the same batch. A nested run an
        earlier holder left open (no context of this holder is in it) is
        closed first in the batch, ``run.cancelled`` with code
        ``runtime_lost``. Does nothing once the run has ended."""
        if self.ended:
            return
        await self._until_running(for_terminal=True)
        self._abandon_timers()
        async with self._writing:
            batches, events = self._message_batches()
            # A run some context of this holder writes in, or in what is nested in it.
            held = {
                i for c in self._family for i in self._journal.lineage(self._journal.run(c.run_id))
            }
            left = [
                r
                for r in self._journal.open_runs_deepest_first(self.run_id)
                if r.run_id not in held
            ]
            lost = "the agent runtime running this nested run was lost"
            events.extend(self._closing_of(left, "run.cancelled", RUNTIME_LOST, lost, None, set()))
            events.append(self.event("run.finished", **fields))
            await self._append_locked(events)
            self._sent_batches(batches)

    async def cancel(
        self,
        code: str = STOPPED,
        message: str = STOPPED_MESSAGE,
        *,
        usage: Mapping[str, float] | None = None,
    ) -> None:
        """Closes the run's open work and ends it with ``run.cancelled``.

        In one batch: the open message completed (with what was said), open
        tool calls finished ``cancelled``, open interrupts resolved
        ``expired``, the open pause resumed, nested runs first, then the run.
        What the runtime does when a handler leaves a stopped run open.
        ``usage``: what the run used so far, on its terminal.
        """
        await self._close("run.cancelled", code, message, usage)

    async def fail(
        self, code: str, message: str, *, usage: Mapping[str, float] | None = None
    ) -> None:
        """Closes the run's open work (as :meth:`cancel`) and ends it with ``run.error``.

        A backend may close a client tool call only under a stop: with one
        open and no stop, the journal refuses this.
        """
        await self._close("run.error", code, message, usage)

    # --- waiting and closing -------------------------------------------------

    async def _nap(self, seconds: float) -> None:
        """Sleeps ``seconds``, less when the run is asked to stop or the lease is lost."""
        waiters = [
            asyncio.ensure_future(self.stop_event.wait()),
            asyncio.ensure_future(self.lost_event.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _wait_for(self, found: Callable[[], T | None]) -> T:
        """Polls the journal until ``found`` answers something."""
        delay = min(0.1, self._poll_interval)
        while True:
            got = found()
            if got is not None:
                return got
            self._check_running()
            if self._release_when_waiting:
                raise _Waiting()
            await self._nap(delay)
            delay = min(delay * 1.5, self._poll_interval)
            await self._sync_patiently()

    async def _until_running(self, *, for_terminal: bool = False) -> None:
        """Waits while the server holds the run paused (``resumeMode: automatic``,
        e.g. its client executor away): no new work, and no terminal, until it
        resumes it."""
        delay = min(0.1, self._poll_interval)
        while True:
            pause = self._journal.run(self.run_id).pause
            if pause is None or pause[2] != "automatic":
                return
            if self.lost or (self.stop_requested and not for_terminal):
                self._check_running()
            await self._nap(delay)
            delay = min(delay * 1.5, self._poll_interval)
            await self._sync_patiently()

    async def _sync_patiently(self) -> None:
        """Reads the journal; a server that does not answer is asked again next time."""
        try:
            await self.sync()
        except NaradError as e:
            if not e.retryable:
                raise
            log.info("run %s: reading the journal failed (%s); trying again", self.run_id, e)

    def _cancelled_call(self, run_id: str, call_id: str, code: str) -> Event:
        return self.event(
            "tool.call.finished",
            runId=run_id,
            toolCallId=call_id,
            outcome="cancelled",
            response=None,
            code=code,
            message=_CLOSING_MESSAGES.get(code, code),
        )

    def _closing_events(
        self, terminal: str, code: str, message: str, usage: Mapping[str, float] | None = None
    ) -> tuple[list[tuple[Message, _Batch]], list[Event]]:
        """The events that close the journal's open runs (see :meth:`cancel`),
        with the batches of the open messages among them."""
        batches, events = self._message_batches()
        ours = {m.message_id for m, _ in batches}
        open_runs = self._journal.open_runs_deepest_first(self.run_id)
        events.extend(self._closing_of(open_runs, terminal, code, message, usage, ours))
        return batches, events

    def _closing_of(
        self,
        open_runs: list[_RunState],
        terminal: str,
        code: str,
        message: str | None,
        usage: Mapping[str, float] | None,
        ours: set[str],
    ) -> list[Event]:
        """The events that close ``open_runs`` (deepest first): their open
        messages (but ``ours``, sent with their batches), calls, interrupts
        and pauses, then each run's ``terminal``."""
        journal = self._journal
        message = message or _CLOSING_MESSAGES.get(code, code)
        events: list[Event] = []
        open_ids = {r.run_id for r in open_runs}
        for message_id, stream in journal.messages.items():
            if not stream.completed and stream.run_id in open_ids and message_id not in ours:
                events.append(
                    self.event("message.text.completed", runId=stream.run_id, messageId=message_id)
                )
        for run in open_runs:
            for call_id in run.open_calls:
                events.append(self._cancelled_call(run.run_id, call_id, code))
            for interrupt_id, wait_id in run.open_interrupts.items():
                events.append(
                    self.event(
                        "interrupt.resolved",
                        runId=run.run_id,
                        interruptId=interrupt_id,
                        waitId=wait_id,
                        decision="expired",
                        reason=code,
                    )
                )
            if run.pause is not None:
                events.append(self.event("run.resumed", runId=run.run_id, waitId=run.pause[0]))
            ending: dict[str, Any] = {"code": code, "message": message}
            if usage and run.run_id == self.run_id:
                ending["usage"] = dict(usage)
            events.append(self.event(terminal, runId=run.run_id, **ending))
        return events

    async def _close(
        self,
        terminal: str,
        code: str,
        message: str,
        usage: Mapping[str, float] | None = None,
    ) -> None:
        self._abandon_timers()
        for attempt in range(_CLOSE_TRIES):
            if self.ended:
                return
            async with self._writing:
                batches, events = self._closing_events(terminal, code, message, usage)
                try:
                    await self._append_locked(events)
                except NaradError as e:
                    # The journal moved meanwhile (an executor's finish, the
                    # server's own closing of a client call): read and retry.
                    if isinstance(e, LeaseLost) or e.status != 409 or attempt + 1 == _CLOSE_TRIES:
                        raise
                    log.info(
                        "run %s: closing refused (%s); reading the journal again", self.run_id, e
                    )
                else:
                    self._sent_batches(batches)
                    self._ended = True
                    return
            await self.sync()

    async def _settle(self) -> None:
        """Sends what is buffered of the open messages and completes them."""
        if not self.lost:
            await self.finish_message()

    def _abandon_timers(self) -> None:
        """Cancels the coalescing timers (what they would send goes with the next batch)."""
        for message in self._messages:
            message._cancel_timer()


def _result(call_id: str, finished: Mapping[str, Any]) -> Any:
    """The response of a finished call, or :class:`ToolFailed`."""
    if finished.get("outcome") == "success":
        return finished.get("response")
    raise ToolFailed(call_id, finished)


# ------------------------------------------------------------------ runtime


class Runtime:
    """An agent runtime loop: claims runs and hands each to ``handler``.

    ``await runtime.run()`` claims (from ``queue``, or any queue) while fewer
    than ``concurrency`` runs are held, each claim waiting up to
    ``claim_wait`` seconds (at most 30), until :meth:`stop`; then it claims no
    more and waits up to ``shutdown_grace`` seconds for the runs it holds
    (handlers still running then are cancelled and their leases lapse).
    Cancelling the task of :meth:`run` drops every run at once, unreleased,
    like a runtime that died.

    ``release_when_waiting=True`` gives a run back while it waits on a
    person or a client executor instead of holding it (and a slot) until
    the answer comes: the answer queues the run again, and the handler runs
    again from the top, replaying its finished steps.
    """

    def __init__(
        self,
        client: Client,
        handler: RunHandler,
        *,
        queue: str | None = None,
        runtime_id: str | None = None,
        concurrency: int = 4,
        claim_wait: float = 20.0,
        heartbeat_interval: float = 10.0,
        poll_interval: float = 1.0,
        delta_window: float = 0.05,
        delta_chars: int = 256,
        release_when_waiting: bool = False,
        shutdown_grace: float = 30.0,
    ) -> None:
        """A runtime of ``client`` serving ``handler``; ``ValueError`` for settings
        that cannot work. ``heartbeat_interval`` is the longest between lease
        renewals, ``poll_interval`` the longest between journal reads while a
        step waits, ``delta_window``/``delta_chars`` how text is coalesced."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0 <= claim_wait <= MAX_WAIT:
            raise ValueError(f"claim_wait must be 0 to {MAX_WAIT:.0f} seconds")
        if heartbeat_interval <= 0 or poll_interval <= 0:
            raise ValueError("heartbeat_interval and poll_interval must be above 0")
        if queue is not None and not queue:
            raise ValueError("queue must not be empty")
        self.client = client
        self.handler = handler
        self.queue = queue
        self.runtime_id = runtime_id
        self.concurrency = concurrency
        self.claim_wait = claim_wait
        self.heartbeat_interval = heartbeat_interval
        self.poll_interval = poll_interval
        self.delta_window = delta_window
        self.delta_chars = delta_chars
        self.release_when_waiting = release_when_waiting
        self.shutdown_grace = shutdown_grace
        self._stopping = asyncio.Event()
        self._held: dict[str, RunContext] = {}
        self._running = False

    @property
    def held(self) -> list[RunContext]:
        """The runs this runtime holds now."""
        return list(self._held.values())

    def stop(self) -> None:
        """Stops claiming: :meth:`run` returns once the runs it holds are done."""
        self._stopping.set()

    async def run(self) -> None:
        """Claims and serves runs until :meth:`stop`.

        An unreachable server is retried with backoff; a refusal of the claim
        itself (a bad token, a role missing, a bad queue) ends the loop with
        that :class:`~narad.errors.NaradError`, once the runs held are done.
        """
        if self._running:
            raise RuntimeError("this runtime is running already")
        self._running = True
        slots = asyncio.Semaphore(self.concurrency)
        serving: set[asyncio.Task[None]] = set()
        failure: NaradError | None = None
        backoff = 0.1
        log.info("agent runtime started (queue %s, concurrency %d)", self.queue, self.concurrency)
        try:
            while not self._stopping.is_set():
                if not await self._unless_stopped(slots.acquire()):
                    break
                try:
                    claimed = await self._unless_stopped(self._claim())
                except NaradError as e:
                    slots.release()
                    if not e.retryable:
                        log.error("the runtime stops claiming: %s", e)
                        failure = e
                        break
                    log.warning("claiming failed (%s); again in %.1f s", e, backoff)
                    await self._unless_stopped(asyncio.sleep(backoff))
                    backoff = min(backoff * 2, 5.0)
                    continue
                backoff = 0.1
                if claimed is None or claimed[0] is None:
                    slots.release()
                    continue
                task = asyncio.create_task(self._serve(claimed[0], slots))
                serving.add(task)
                task.add_done_callback(serving.discard)
        except asyncio.CancelledError:
            for task in serving:
                task.cancel()
            await asyncio.gather(*serving, return_exceptions=True)
            self._running = False
            self._stopping.clear()
            raise
        if serving:
            log.info("the runtime claims no more; waiting for %d runs", len(serving))
            _, late = await asyncio.wait(serving, timeout=self.shutdown_grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        self._running = False
        self._stopping.clear()  # it may run again
        log.info("agent runtime stopped")
        if failure is not None:
            raise failure

    async def _unless_stopped(self, work: Awaitable[T]) -> tuple[T] | None:
        """Awaits ``work`` unless :meth:`stop` comes first (then cancels it): ``(result,)``."""
        task = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            stopping.cancel()
        if task.done():
            return (task.result(),)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, NaradError):
            await task
        return None

    async def _claim(self) -> Claim | None:
        body: dict[str, Any] = {"waitMs": int(self.claim_wait * 1000)}
        if self.queue is not None:
            body["queue"] = self.queue
        if self.runtime_id is not None:
            body["runtimeId"] = self.runtime_id
        got = await self.client.request(
            "POST", "/v1/runtime/claims", json=body, timeout=self.claim_wait + REQUEST_SLACK
        )
        return None if got is None else Claim.model_validate(got)

    def _context(self, claim: Claim) -> RunContext:
        return RunContext(
            self.client,
            claim,
            poll_interval=self.poll_interval,
            delta_window=self.delta_window,
            delta_chars=self.delta_chars,
            release_when_waiting=self.release_when_waiting,
        )

    async def _serve(self, claim: Claim, slots: asyncio.Semaphore) -> None:
        """Serves one claim: keeps its lease, runs the handler, releases the run."""
        ctx = self._context(claim)
        log.info(
            "run %s of session %s claimed (%s, attempt %s)",
            ctx.run_id,
            ctx.session_id,
            ctx.reason,
            ctx.attempt,
        )
        self._held[ctx.lease_id] = ctx
        keeper = asyncio.create_task(self._keep(ctx))
        handling = asyncio.create_task(self._handle(ctx))
        ctx._on_lost = handling.cancel
        try:
            try:
                await asyncio.wait({handling})
            except asyncio.CancelledError:
                handling.cancel()
                await asyncio.gather(handling, return_exceptions=True)
                raise
            if handling.cancelled():
                release = False
                log.warning("run %s: the lease was lost; the handler was stopped", ctx.run_id)
            elif handling.exception() is not None:
                release = False
                log.error("run %s: the runtime failed", ctx.run_id, exc_info=handling.exception())
            else:
                release = handling.result()
            ctx._abandon_timers()
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            if release and not ctx.lost:
                await self._release(ctx)
        finally:
            ctx._abandon_timers()
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
            del self._held[ctx.lease_id]
            slots.release()

    async def _handle(self, ctx: RunContext) -> bool:
        """Runs the handler; whether to release the run after it."""
        try:
            await ctx.sync()
            if not ctx.ended:
                await self.handler(ctx)
                await ctx._settle()
        except RunStopped:
            ctx._request_stop()
        except _Waiting:
            await ctx._settle()
            return True
        except LeaseLost:
            log.warning("run %s: the handler ended on a lost lease", ctx.run_id)
            return False
        except Exception:
            if ctx.ended:
                log.exception("run %s: the handler failed after the run ended", ctx.run_id)
                return True
            log.exception(
                "run %s: the handler failed; its lease is left to lapse, and the server "
                "retries the run or ends it as its onLost policy says",
                ctx.run_id,
            )
            return False
        if ctx.stop_requested and not ctx.ended:
            try:
                await ctx.cancel()
            except NaradError:
                log.exception("run %s: the stopped run could not be closed", ctx.run_id)
                return False
        return True

    async def _release(self, ctx: RunContext) -> None:
        lease = f"/v1/runtime/leases/{ctx.lease_id}/release"
        body = {"handledThrough": ctx.handled_through}
        for attempt in range(3):
            try:
                got = await self.client.request("POST", lease, json=body)
                released = got.get("released") if isinstance(got, dict) else None
                log.info(
                    "run %s released (%s, handledThrough %d)",
                    ctx.run_id,
                    released,
                    ctx.handled_through,
                )
                return
            except NaradError as e:
                if e.retryable and attempt < 2:
                    await asyncio.sleep(0.5 * (attempt + 1))
                    continue
                log.warning(
                    "run %s could not be released (%s); its lease lapses and the server "
                    "applies its onLost policy",
                    ctx.run_id,
                    e,
                )
                return

    async def _keep(self, ctx: RunContext) -> None:
        """Keeps a run's lease: renews it and long-polls its controls."""
        await asyncio.gather(self._renew(ctx), self._watch(ctx))

    def _standing(self, ctx: RunContext, got: Any) -> LeaseStanding:
        standing = LeaseStanding.model_validate(got)
        if standing.stop_requested:
            ctx._request_stop()
        return standing

    async def _renew(self, ctx: RunContext) -> None:
        path = f"/v1/runtime/leases/{ctx.lease_id}/heartbeat"
        delay = self._renewal_delay(ctx.claim.lease.expires_at)
        while True:
            await asyncio.sleep(delay)
            try:
                standing = self._standing(ctx, await self.client.request("POST", path))
            except (NaradError, ValueError) as e:
                if isinstance(e, NaradError) and e.status == 409 and e.code == LEASE_NOT_CURRENT:
                    ctx._lease_refused()
                    return
                log.warning("run %s: renewing the lease failed (%s); trying again", ctx.run_id, e)
                delay = min(self.heartbeat_interval, 1.0)
                continue
            if standing.ended:
                return
            delay = self._renewal_delay(standing.expires_at)

    async def _watch(self, ctx: RunContext) -> None:
        path = f"/v1/runtime/leases/{ctx.lease_id}/controls"
        backoff = 0.1
        while not ctx.stop_requested:
            try:
                got = await self.client.request(
                    "GET",
                    path,
                    params={"waitMs": int(CONTROLS_WAIT * 1000)},
                    timeout=CONTROLS_WAIT + REQUEST_SLACK,
                )
                standing = self._standing(ctx, got)
            except (NaradError, ValueError) as e:
                if isinstance(e, NaradError) and e.status == 409 and e.code == LEASE_NOT_CURRENT:
                    ctx._lease_refused()
                    return
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            if standing.ended:
                return

    def _renewal_delay(self, expires_at: datetime | str) -> float:
        """The interval, or a third of what is left of the lease when that is shorter."""
        try:
            at = (
                expires_at
                if isinstance(expires_at, datetime)
                else datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
            )
            left = (at - datetime.now(timezone.utc)).total_seconds()
        except (ValueError, TypeError):
            return self.heartbeat_interval
        if left <= 0:
            return 0.1
        return max(0.1, min(self.heartbeat_interval, left / 3))


async def _aiter_of(pieces: Iterable[str]) -> AsyncIterator[str]:
    """The pieces of a plain iterable, as an async iterator."""
    for piece in pieces:
        yield piece
