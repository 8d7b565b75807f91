"""What every framework adapter shares: :func:`drive` runs the framework's
work as a run's handler would (a stop cancels it, its end or its error ends
the run), :class:`Usage` adds up the framework's token counters, and
:func:`conversation` reads the session's chat so far as the framework's input.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..runtime import REPLAY_DIVERGED, LeaseLost, ReplayDiverged, RunContext, RunStopped, _Waiting

__all__ = ["Turn", "Usage", "conversation", "drive", "text_of"]

log = logging.getLogger("narad.integrations")

#: The longest message a terminal carries (run.error's is for people).
_MESSAGE_LIMIT = 500


class Usage:
    """Additive, non-negative counters for a run's terminal (``usage``, §6.1),
    e.g. ``inputTokens``, ``outputTokens``, ``totalTokens``, ``requests``."""

    def __init__(self) -> None:
        self._counts: dict[str, float] = {}

    def add(self, **counts: float | None) -> None:
        """Adds each counter given (``None`` and negative values are ignored)."""
        for name, value in counts.items():
            if value is not None and value >= 0:
                self._counts[name] = self._counts.get(name, 0) + value

    def as_dict(self) -> dict[str, float] | None:
        """The counters so far, or ``None`` when none was counted."""
        return dict(self._counts) if self._counts else None


ErrorCode = str | Callable[[BaseException], str]


async def drive(
    ctx: RunContext,
    work: Callable[[], Awaitable[object]],
    *,
    usage: Usage,
    error_code: ErrorCode = "framework_error",
) -> None:
    """Runs ``work()`` (the framework driving the run) and ends the run by how it went.

    - ``work`` returns: ``run.finished`` with ``usage`` (unless it ended the run itself);
    - the run is asked to stop: ``work``'s task is cancelled (the framework's
      own cancellation runs) and the run ends ``run.cancelled`` with the usage so far;
    - ``work`` raises: ``run.error`` with ``error_code`` (a string, or a function
      of the exception) and the exception's text; ``ReplayDiverged`` ends it
      with code ``replay_diverged``; both with the usage so far;
    - the lease is lost, or the run waits to be given back
      (``release_when_waiting``): that goes to the runtime, nothing is written.
    """
    if ctx.ended:
        return
    task: asyncio.Task[object] = asyncio.ensure_future(work())
    signals = [
        asyncio.ensure_future(ctx.stop_event.wait()),
        asyncio.ensure_future(ctx.lost_event.wait()),
    ]
    try:
        await asyncio.wait([task, *signals], return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        await _cancel(task)
        raise
    finally:
        for signal in signals:
            signal.cancel()
    if not task.done():
        await _cancel(task)
    if ctx.lost:
        raise LeaseLost.for_run(ctx.run_id)
    error = None if task.cancelled() else task.exception()
    if ctx.stop_requested and (task.cancelled() or error is not None):
        # A stop wins over what the framework made of its cancellation.
        await ctx.cancel(usage=usage.as_dict())
        return
    if error is None:
        if not ctx.ended:
            counts = usage.as_dict()
            await (ctx.finish(usage=counts) if counts else ctx.finish())
        return
    if isinstance(error, (LeaseLost, _Waiting)):
        raise error
    if isinstance(error, RunStopped):
        await ctx.cancel(usage=usage.as_dict())
        return
    if isinstance(error, ReplayDiverged):
        code = REPLAY_DIVERGED
    elif isinstance(error_code, str):
        code = error_code
    else:
        code = error_code(error)
    log.warning("run %s failed (%s): %r", ctx.run_id, code, error)
    text = str(error) or type(error).__name__
    await ctx.fail(code, text[:_MESSAGE_LIMIT], usage=usage.as_dict())


async def _cancel(task: asyncio.Task[object]) -> None:
    """Cancels ``task`` and waits for it to unwind (whatever it raises then)."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


@dataclass(frozen=True)
class Turn:
    """One message of the session's conversation: who said it and its text."""

    role: Literal["user", "assistant"]
    text: str


def text_of(content: Any) -> str:
    """The text of a message's ``content``: a string, a ``{"text": ...}`` object,
    or a list of such parts (other parts are left out)."""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        text = content.get("text")
        return text if isinstance(text, str) else ""
    if isinstance(content, list):
        return "".join(text_of(part) for part in content)
    return ""


async def conversation(ctx: RunContext) -> list[Turn]:
    """The session's conversation before the run: its users' messages and the
    completed assistant messages recorded before the run started, in order,
    then the run's ``input`` when it is a string or has a string ``prompt``."""
    started = ctx.started.get("sessionSequence")
    before = int(started) if isinstance(started, int) else None
    turns: list[Turn] = []
    assistant: dict[str, list[str]] = {}
    order: list[tuple[str, str]] = []
    for event in await ctx.history_after(0):
        sequence = event.get("sessionSequence")
        if before is not None and isinstance(sequence, int) and sequence >= before:
            break
        kind = event.get("type")
        if kind == "message.user.recorded":
            order.append(("user", text_of(event.get("content"))))
        elif kind == "message.text.started" and event.get("role") == "assistant":
            assistant[str(event.get("messageId"))] = []
        elif kind == "message.text.delta" and str(event.get("messageId")) in assistant:
            assistant[str(event.get("messageId"))].append(str(event.get("delta", "")))
        elif kind == "message.text.completed" and str(event.get("messageId")) in assistant:
            order.append(("assistant", "".join(assistant.pop(str(event.get("messageId"))))))
    for role, text in order:
        if text:
            turns.append(Turn("user" if role == "user" else "assistant", text))
    prompt = ctx.input.get("prompt") if isinstance(ctx.input, Mapping) else ctx.input
    if isinstance(prompt, str) and prompt:
        turns.append(Turn("user", prompt))
    return turns
