"""Server-sent events: an incremental parser of `text/event-stream`.

The HTML standard's algorithm: lines end with CR, LF or CRLF (a CRLF split
between two chunks is one line end); a line starting with `:` is a comment;
`field: value` loses one space after the colon; a blank line dispatches the
frame when it has data. `id:` sets the last event id, which every later
frame keeps until another `id:` (one holding NUL is ignored); a frame
knows whether the id was its own — what a reader resumes from with
`Last-Event-ID`.

Feed it what arrives, bytes or text, in pieces of any size::

    parser = SseParser(last_event_id)
    async for chunk in response.aiter_bytes():
        for frame in parser.feed(chunk):
            ...

or let :func:`parse_sse` do the loop over an async iterable.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass

__all__ = ["SseEvent", "SseParser", "parse_sse"]

_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched frame of an event stream."""

    #: `event:`, or `message` when the frame named none.
    event: str
    #: The `data:` lines, joined with newlines.
    data: str
    #: The last event id: this frame's `id:`, or the last one before it.
    id: str
    #: Whether this frame carried an `id:` line of its own.
    own_id: bool


class SseParser:
    """An incremental event-stream parser: :meth:`feed` chunks, get whole frames back."""

    def __init__(self, last_event_id: str = "") -> None:
        """Starts a stream whose last event id is `last_event_id` (a resumed one's)."""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._started = False
        self._event = ""
        self._data: list[str] = []
        self._id = last_event_id
        self._own_id = False

    @property
    def last_event_id(self) -> str:
        """The last event id seen (or given): what to resume from with `Last-Event-ID`."""
        return self._id

    def feed(self, chunk: bytes | str) -> list[SseEvent]:
        """Reads one chunk; the frames it completed, in order."""
        text = self._decoder.decode(chunk) if isinstance(chunk, bytes) else chunk
        if not self._started and text:
            self._started = True
            # The stream may open with a byte order mark, which is no content.
            if text.startswith("\ufeff"):
                text = text[1:]
        self._buffer += text
        return self._lines()

    def _lines(self) -> list[SseEvent]:
        frames: list[SseEvent] = []
        buffer = self._buffer
        start = 0
        while True:
            end = _LINE_END.search(buffer, start)
            if end is None:
                break
            # A lone CR at the end may be the first half of a CRLF.
            if end.group() == "\r" and end.end() == len(buffer):
                break
            frame = self._line(buffer[start : end.start()])
            if frame is not None:
                frames.append(frame)
            start = end.end()
        self._buffer = buffer[start:]
        return frames

    def _line(self, line: str) -> SseEvent | None:
        if line == "":
            frame = None
            if self._data:
                frame = SseEvent(
                    event=self._event or "message",
                    data="\n".join(self._data),
                    id=self._id,
                    own_id=self._own_id,
                )
            self._event = ""
            self._data = []
            self._own_id = False
            return frame
        if line.startswith(":"):
            return None
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id" and "\0" not in value:
            self._id = value
            self._own_id = True
        return None


async def parse_sse(
    chunks: AsyncIterable[bytes] | AsyncIterable[str], last_event_id: str = ""
) -> AsyncIterator[SseEvent]:
    """The frames of an event stream read from `chunks` (e.g. httpx's `aiter_bytes()`).

    A frame left without its blank line when `chunks` ends is never dispatched.
    """
    parser = SseParser(last_event_id)
    async for chunk in chunks:
        for frame in parser.feed(chunk):
            yield frame
