"""Following a session's stream, or the tenant's, across ends of connections and servers.

:func:`follow` yields :class:`Frame` objects for as long as the caller reads.
It reconnects with ``Last-Event-ID`` whenever a connection ends (a replay
served in blocks ends the connection after each block; a restart, a network
fault), tries the client's servers in turn with exponential backoff (and
the server's ``Retry-After`` when it asked), never yields an authority event
twice (a session's ``sessionSequence`` only grows) nor past a gap: when a
session's next event skips sequences (the stream forgot rows, announced by
a ``replay-gap`` frame, which is yielded too), the missing events are read
from history first and yielded with ``from_history=True``.

Feed the authority frames to a :class:`~narad.reducer.SessionReducer` to
hold a session's state::

    reducer = SessionReducer()
    async for frame in follow(client, session_id="s1"):
        if frame.kind in ("authority", "watch", "hydrate"):
            reducer.deliver(frame.data)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal
from urllib.parse import quote

import httpx

from .client import Client, Event
from .errors import NaradError, error_of
from .sse import SseParser
from .typed import (
    AnyEvent,
    AnyHydrateRecord,
    AnyWatchEvent,
    parse_event,
    parse_hydrate,
    parse_watch,
)

FrameKind = Literal["capabilities", "authority", "watch", "hydrate", "replay-gap", "session-erased"]


@dataclass(frozen=True)
class Frame:
    """One frame of a stream, decoded.

    ``kind`` says what ``data`` holds: the ``capabilities`` control message,
    an ``authority`` or ``watch`` event (``id`` its eventId), a ``hydrate``
    record (graph snapshots and deltas, transcript snapshots), a
    ``replay-gap`` (the stream forgot part of the range asked for) or
    ``session-erased`` (nothing of the session is left; its follow ends).
    """

    kind: FrameKind
    data: dict[str, Any]
    id: str | None = None
    from_history: bool = field(default=False)

    @cached_property
    def event(self) -> AnyEvent | None:
        """An ``authority`` frame's event as its typed model (``None`` for other kinds).

        ``event.type`` narrows it: ``if event.type == "message.text.delta":
        event.delta``. Raises pydantic's ``ValidationError`` for an event
        this package's models do not know; :attr:`data` has it as JSON.
        """
        return parse_event(self.data) if self.kind == "authority" else None

    @cached_property
    def watch(self) -> AnyWatchEvent | None:
        """A ``watch`` frame's event as its typed model (``None`` for other kinds)."""
        return parse_watch(self.data) if self.kind == "watch" else None

    @cached_property
    def hydrate(self) -> AnyHydrateRecord | None:
        """A ``hydrate`` frame's record as its typed model (``None`` for other kinds)."""
        return parse_hydrate(self.data) if self.kind == "hydrate" else None


class _FillInterrupted(Exception):
    """History did not answer while a gap was being filled: resume later."""


def decode(event: str, data: str, own_id: str | None) -> Frame | None:
    """A frame from an SSE event's name, data and own id (``None``: not one of narad's)."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    if event in ("capabilities", "hydrate", "replay-gap"):
        kind: FrameKind = event  # type: ignore[assignment]
        return Frame(kind, value)
    if event == "session-erased":
        return Frame("session-erased", value) if isinstance(value.get("sessionId"), str) else None
    if event == "message" and own_id is not None:
        if isinstance(value.get("sessionSequence"), int):
            return Frame("authority", value, own_id)
        return Frame("watch", value, own_id)
    return None


async def follow(
    client: Client,
    *,
    session_id: str | None = None,
    only_session: str | None = None,
    last_event_id: str | None = None,
    after_session_sequence: int | None = None,
    profiles: Sequence[str] | None = None,
    initial_backoff: float = 0.25,
    max_backoff: float = 10.0,
) -> AsyncGenerator[Frame, None]:
    """Follows ``session_id``'s stream, or the tenant stream (``GET /v1/events``).

    ``only_session`` narrows the tenant stream to one session;
    ``last_event_id`` resumes after a frame id a previous follow yielded;
    ``after_session_sequence`` starts a session stream after that sequence
    and says what the caller holds of its session (``session_id`` or
    ``only_session``): a gap after it is filled from history. A
    ``replay-gap`` is filled for the session it names, or for every session
    this follow has yielded events of. Close the generator
    (``await frames.aclose()``) to end the connection.
    A refusal no retry can mend (401, 403, 404, a cursor the store does not
    know: 409 ``NRD-0302``/``NRD-0303``) raises :class:`NaradError`.
    """
    path = f"/v1/sessions/{quote(session_id, safe='')}/stream" if session_id else "/v1/events"
    seen: dict[str, int] = {}
    # What the caller holds of its session: a gap after it is filled too.
    held = session_id or only_session
    if held is not None and after_session_sequence is not None:
        seen[held] = after_session_sequence
    backoff = initial_backoff
    cursor = last_event_id
    while True:
        progressed = False
        asked = 0.0
        for server in client.servers_in_turn():
            params: dict[str, str] = {}
            if profiles is not None:
                params["profiles"] = ",".join(profiles)
            if only_session is not None:
                params["sessionId"] = only_session
            if cursor is None and after_session_sequence is not None:
                params["afterSessionSequence"] = str(after_session_sequence)
            headers = {
                "Authorization": f"Bearer {await client.bearer()}",
                "Accept": "text/event-stream",
            }
            if cursor is not None:
                headers["Last-Event-ID"] = cursor
            request = client.http.build_request(
                "GET",
                server + path,
                params=params,
                headers=headers,
                timeout=httpx.Timeout(10.0, read=None),
            )
            try:
                response = await client.http.send(request, stream=True)
            except httpx.TransportError:
                continue
            try:
                if response.status_code >= 300:
                    await response.aread()
                    error = error_of(response)
                    if error.retryable:
                        asked = max(asked, error.retry_after or 0.0)
                        continue
                    raise error
                client.prefer(server)
                parser = SseParser(cursor or "")
                async for chunk in response.aiter_bytes():
                    for sse in parser.feed(chunk):
                        frame = decode(sse.event, sse.data, sse.id if sse.own_id else None)
                        if frame is None:
                            continue
                        progressed = True
                        backoff = initial_backoff
                        if frame.kind == "authority":
                            session = str(frame.data.get("sessionId"))
                            sequence = int(frame.data["sessionSequence"])
                            last = seen.get(session)
                            if sequence <= (last or 0):
                                cursor = frame.id
                                continue
                            if last is not None and sequence > last + 1:
                                async for filled in _fill(client, session, last, sequence, seen):
                                    yield filled
                            seen[session] = sequence
                        yield frame
                        # The cursor moves once the frame is the caller's.
                        if sse.own_id:
                            cursor = sse.id
                        if frame.kind == "session-erased" and frame.data.get("sessionId") == (
                            session_id
                        ):
                            return
                        if frame.kind == "replay-gap":
                            # Named, the session the stream is narrowed to;
                            # else every session this follow has seen.
                            named = frame.data.get("sessionId")
                            gapped = [named] if isinstance(named, str) else list(seen)
                            for gap_session in gapped:
                                last = seen.get(gap_session)
                                if last is None:
                                    continue
                                async for filled in _fill(client, gap_session, last, None, seen):
                                    yield filled
            except (httpx.TransportError, httpx.StreamError):
                # Cut mid-frame: resume from the last whole frame.
                pass
            except _FillInterrupted:
                progressed = False
            finally:
                await response.aclose()
            break
        if not progressed:
            await asyncio.sleep(max(backoff, asked))
            backoff = min(backoff * 2, max_backoff)


async def _fill(
    client: Client, session_id: str, after: int, before: int | None, seen: dict[str, int]
) -> AsyncIterator[Frame]:
    """A session's authority after ``after`` (and before ``before``), read from history."""
    try:
        async for event in client.all_history(session_id, after_session_sequence=after):
            sequence = int(event["sessionSequence"])
            if before is not None and sequence >= before:
                return
            seen[session_id] = sequence
            yield Frame("authority", event, str(event["eventId"]), from_history=True)
    except NaradError as e:
        # History refuses for good (gone, not this caller's): the gap
        # stays, and a reducer fed the frames says so.
        if not e.retryable:
            return
        raise _FillInterrupted() from e


async def events(
    client: Client, session_id: str, *, after_session_sequence: int = 0
) -> AsyncGenerator[Event, None]:
    """A session's authority events, from history then live, each once and in order."""
    async for frame in follow(
        client, session_id=session_id, after_session_sequence=after_session_sequence
    ):
        if frame.kind == "authority":
            yield frame.data
        elif frame.kind == "session-erased":
            return
