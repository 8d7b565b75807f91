"""Runs, one at a time: start one and read its frames until it ends, or wait for its result.

``client.runs`` (a :class:`Runs`) is the run-level API, shaped like LangGraph's
SDK (``runs.stream``, ``wait``, ``join``, ``join_stream``)::

    async for frame in client.runs.stream(session_id, message="Hi!", queue="agents"):
        event = frame.event
        if event is not None and event.type == "message.text.delta":
            print(event.delta, end="")

    result = await client.runs.wait(session_id, message="Hi!", queue="agents")
    print(result.status, result.text)

A :class:`RunStream` yields the authority frames of one run and of the runs
nested in it (whose ``run.started`` names a run of the tree as its
``parentRunId``), in order and each once, from its ``run.started`` to its
terminal (``run.finished``, ``run.error`` or ``run.cancelled``), which it
yields last. It is built on :func:`~narad.follow.follow`: a connection that
ends, a restart or a server that goes away is resumed from the last frame,
gaps filled from history. A run that already ended is read from the journal.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from .client import Client, Event, JsonValue, OnConflict, RuntimeOptions
from .errors import GoneError, NaradError, NotFoundError
from .follow import Frame, follow
from .models import RunStartAnswer
from .reducer import ReducedState, SessionReducer, TranscriptItem
from .typed import RunTerminal, parse_terminal
from .wire import Violation

__all__ = ["RunResult", "RunStatus", "RunStream", "Runs"]

#: The event types that end a run.
TERMINALS = frozenset({"run.finished", "run.error", "run.cancelled"})

#: How a run ended.
RunStatus = Literal["finished", "error", "cancelled"]

# The ids a keyed start makes derive from its key, so that the same call
# sent again is the same request (and the server's replay, not a refusal).
_IDS = uuid.UUID("9b0d3a52-6c1f-4d0e-8a43-72756e732d31")
_MAX_BASE_KEY = 247


def _status(terminal: RunTerminal) -> RunStatus:
    if terminal.type == "run.finished":
        return "finished"
    if terminal.type == "run.error":
        return "error"
    return "cancelled"


@dataclass(frozen=True)
class RunResult:
    """How a run ended, with the session as it stood then.

    ``terminal`` is the run's terminal event (typed); ``events`` the authority
    events of the run and its nested runs (JSON, in order); ``output`` the
    transcript items they wrote; ``transcript`` the session's transcript at
    the run's end (the person's messages included); ``state`` the session's
    state reduced through the terminal (:meth:`SessionReducer.state`);
    ``violations`` what the reducer refused (none, unless history lost rows).
    """

    session_id: str
    run_id: str
    terminal: RunTerminal
    events: list[Event]
    output: list[TranscriptItem]
    transcript: list[TranscriptItem]
    state: ReducedState
    violations: list[Violation]

    @property
    def status(self) -> RunStatus:
        """``finished``, ``error`` or ``cancelled``."""
        return _status(self.terminal)

    @property
    def text(self) -> str:
        """The text the run (and its nested runs) streamed, joined."""
        return "".join(
            str(e.get("delta", "")) for e in self.events if e.get("type") == "message.text.delta"
        )


@dataclass(frozen=True)
class _Start:
    """What :meth:`Runs.stream` starts."""

    session_id: str
    run_id: str
    message: JsonValue
    message_id: str | None
    attachment_ids: Sequence[str] | None
    input: JsonValue
    queue: str | None
    runtime: RuntimeOptions | None
    on_conflict: OnConflict | None
    client_executor_id: str | None
    parent_run_id: str | None
    workflow_id: str | None
    idempotency_key: str | None


class RunStream(AsyncIterator[Frame]):
    """The frames of one run, from its ``run.started`` to its terminal (see the module).

    Nothing is sent before it is read: ``async for frame in stream`` first
    starts the run (:meth:`Runs.stream`) or finds where it starts
    (:meth:`Runs.join_stream`). :attr:`run_id` is known from the outset;
    :attr:`started` holds the ``start-run`` answer of a run it started,
    :attr:`terminal` the terminal event once read. Close it (``await
    stream.aclose()``, or ``async with``) to stop reading before the end.
    """

    def __init__(self, client: Client, session_id: str, run_id: str, start: _Start | None) -> None:
        self.client = client
        self.session_id = session_id
        self.run_id = run_id
        self._start = start
        self._reader: AsyncGenerator[Frame, None] | None = None
        self._reducer: SessionReducer | None = None
        self._violations: list[Violation] = []
        #: What ``start-run`` answered (a stream that started its run).
        self.started: RunStartAnswer | None = None
        #: The run's terminal event, once read.
        self.terminal: RunTerminal | None = None
        #: The authority events yielded so far, as JSON.
        self.events: list[Event] = []

    @property
    def status(self) -> RunStatus | None:
        """How the run ended, once read."""
        return None if self.terminal is None else _status(self.terminal)

    def __aiter__(self) -> RunStream:
        return self

    async def __anext__(self) -> Frame:
        if self._reader is None:
            self._reader = self._read()
        return await self._reader.__anext__()

    async def aclose(self) -> None:
        """Stops reading (closes the connection)."""
        if self._reader is not None:
            await self._reader.aclose()

    async def __aenter__(self) -> RunStream:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _begin(self) -> int:
        """Starts or finds the run: the sessionSequence its frames come after."""
        if self._start is not None:
            return await _start_run(self.client, self._start, self)
        return await _start_of(self.client, self.session_id, self.run_id)

    async def _read(self) -> AsyncGenerator[Frame, None]:
        after = await self._begin()
        if self._reducer is not None:
            # A result needs the whole session: read from its start.
            after = 0
        run_id = self.run_id
        tree = {run_id}
        frames = follow(self.client, session_id=self.session_id, after_session_sequence=after)
        try:
            async for frame in frames:
                if self._reducer is not None and frame.kind in ("authority", "hydrate"):
                    try:
                        self._reducer.deliver(frame.data)
                    except Violation as e:
                        self._violations.append(e)
                if frame.kind == "session-erased":
                    raise GoneError(
                        410, f"session {self.session_id} was erased before run {run_id} ended"
                    )
                if frame.kind != "authority":
                    continue
                data = frame.data
                of_run = data.get("runId")
                if data.get("type") == "run.started" and data.get("parentRunId") in tree:
                    tree.add(str(of_run))
                if of_run not in tree:
                    continue
                self.events.append(data)
                if of_run == run_id and data.get("type") in TERMINALS:
                    self.terminal = parse_terminal(data)
                    yield frame
                    return
                yield frame
        finally:
            await frames.aclose()

    async def result(self) -> RunResult:
        """Reads the run to its end and answers its :class:`RunResult` (the session is
        read from its start: the reducer needs all of it). Call it before reading
        any frame."""
        if self._reader is not None:
            raise RuntimeError("result() reads the stream itself: call it before reading it")
        self._reducer = reducer = SessionReducer()
        async for _ in self:
            pass
        terminal = self.terminal
        if terminal is None:
            raise NaradError(
                0, f"the stream of session {self.session_id} ended before run {self.run_id}"
            )
        tree = {str(e.get("runId")) for e in self.events}
        transcript = copy.deepcopy(reducer.transcript(tree))
        return RunResult(
            session_id=self.session_id,
            run_id=self.run_id,
            terminal=terminal,
            events=list(self.events),
            output=[i for i in transcript if i.get("runId") in tree],
            transcript=transcript,
            state=reducer.state(),
            violations=list(self._violations),
        )


async def _start_run(client: Client, start: _Start, stream: RunStream) -> int:
    """Records the message (when there is one), starts the run; the sessionSequence
    its frames come after."""
    session_id = start.session_id
    key = start.idempotency_key
    run_input = start.input
    if start.message is not None:
        message_id = start.message_id or _made_id("msg", key, "message")
        said = await client.record_user_message(
            session_id,
            start.message,
            message_id=message_id,
            attachment_ids=start.attachment_ids,
            idempotency_key=f"{key}:message" if key is not None else None,
        )
        after = min((int(e.session_sequence) for e in said.appended.events), default=1) - 1
        if run_input is None:
            run_input = {"messageId": message_id, "content": start.message}
    else:
        # Read before the start, so that no event of the run can come before it.
        after = int((await client.get_session(session_id)).session_sequence)
    stream.started = await client.start_run(
        session_id,
        run_id=start.run_id,
        input=run_input,
        queue=start.queue,
        runtime=start.runtime,
        on_conflict=start.on_conflict,
        client_executor_id=start.client_executor_id,
        parent_run_id=start.parent_run_id,
        workflow_id=start.workflow_id,
        idempotency_key=f"{key}:run" if key is not None else None,
    )
    return after


async def _start_of(client: Client, session_id: str, run_id: str) -> int:
    """Where a run started before stands in its session: the sessionSequence
    before its ``run.started``; for a queued run, the end of history now.
    :class:`NotFoundError` when the session holds no such run and none is queued."""
    try:
        page = await client.history(session_id, root_run_id=run_id, after_sequence=0, limit=1)
        first = page.events[0] if page.events else None
        if first is not None and first.get("type") == "run.started" and first["runId"] == run_id:
            return int(first["sessionSequence"]) - 1
    except NotFoundError:
        pass
    # A nested run, or one not started yet: the queue, then the whole history.
    queued = await client.queued_starts(session_id)
    last = 0
    async for event in client.all_history(session_id):
        if event.get("type") == "run.started" and event.get("runId") == run_id:
            return int(event["sessionSequence"]) - 1
        last = int(event["sessionSequence"])
    if any(str(q.run_id) == run_id for q in queued.queued_starts):
        return last
    raise NotFoundError(404, f"session {session_id} holds no run {run_id}, and none is queued")


def _made_id(prefix: str, key: str | None, part: str) -> str:
    """A new id, or, for a keyed call, one derived from its key."""
    if key is None:
        return f"{prefix}-{uuid.uuid4()}"
    return f"{prefix}-{uuid.uuid5(_IDS, f'{key}:{part}')}"


class Runs:
    """The run-level API of a :class:`~narad.client.Client` (``client.runs``)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def stream(
        self,
        session_id: str,
        *,
        message: JsonValue = None,
        message_id: str | None = None,
        attachment_ids: Sequence[str] | None = None,
        input: JsonValue = None,
        queue: str | None = None,
        run_id: str | None = None,
        runtime: RuntimeOptions | None = None,
        on_conflict: OnConflict | None = None,
        client_executor_id: str | None = None,
        parent_run_id: str | None = None,
        workflow_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> RunStream:
        """Starts a run and streams its frames to its terminal.

        ``message`` (text, or any JSON content) is recorded first as the
        person's message (``record-user-message``, session scope); unless
        ``input`` is given, the run's input is then ``{"messageId": ...,
        "content": message}``, so that the agent knows what it answers.
        ``queue`` (or ``runtime``) hands the run to agent runtimes; the other
        settings are :meth:`~narad.client.Client.start_run`'s. The run's id
        (and the message's) is made here when not given, so it is known
        before the run starts. Both commands carry an idempotency key:
        ``{idempotency_key}:message`` and ``{idempotency_key}:run`` when
        ``idempotency_key`` is given (at most 247 characters; the ids made
        then derive from it), so that the same call made again after a
        crash records and starts nothing twice; new keys otherwise.
        """
        if idempotency_key is not None and not 1 <= len(idempotency_key) <= _MAX_BASE_KEY:
            raise ValueError(f"a runs idempotency key is 1 to {_MAX_BASE_KEY} characters")
        run = run_id or _made_id("run", idempotency_key, "run")
        start = _Start(
            session_id=session_id,
            run_id=run,
            message=message,
            message_id=message_id,
            attachment_ids=attachment_ids,
            input=input,
            queue=queue,
            runtime=runtime,
            on_conflict=on_conflict,
            client_executor_id=client_executor_id,
            parent_run_id=parent_run_id,
            workflow_id=workflow_id,
            idempotency_key=idempotency_key,
        )
        return RunStream(self.client, session_id, run, start)

    async def wait(
        self,
        session_id: str,
        *,
        message: JsonValue = None,
        message_id: str | None = None,
        attachment_ids: Sequence[str] | None = None,
        input: JsonValue = None,
        queue: str | None = None,
        run_id: str | None = None,
        runtime: RuntimeOptions | None = None,
        on_conflict: OnConflict | None = None,
        client_executor_id: str | None = None,
        parent_run_id: str | None = None,
        workflow_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> RunResult:
        """Starts a run as :meth:`stream` does and answers its :class:`RunResult` once it ended."""
        stream = self.stream(
            session_id,
            message=message,
            message_id=message_id,
            attachment_ids=attachment_ids,
            input=input,
            queue=queue,
            run_id=run_id,
            runtime=runtime,
            on_conflict=on_conflict,
            client_executor_id=client_executor_id,
            parent_run_id=parent_run_id,
            workflow_id=workflow_id,
            idempotency_key=idempotency_key,
        )
        async with stream:
            return await stream.result()

    def join_stream(self, session_id: str, run_id: str) -> RunStream:
        """The frames of a run started before (running, queued, or over: then read
        from history), from its ``run.started`` to its terminal, as :meth:`stream`
        gives them. Reading raises :class:`~narad.errors.NotFoundError` when the
        session holds no such run and none is queued."""
        return RunStream(self.client, session_id, run_id, None)

    async def join(self, session_id: str, run_id: str) -> RunResult:
        """The :class:`RunResult` of a run started before, once it ended (at once
        when it had)."""
        async with self.join_stream(session_id, run_id) as stream:
            return await stream.result()
