"""A demonstration agent on narad's Python SDK: what ``narad demo-agent`` does,
written with the public API only (``narad.Client``, ``narad.runtime``,
``narad.follow``).

It serves the runs queued for agent runtimes on ``--queue`` (a ``start-run``
with ``runtime: {queue}`` and ``input: {prompt}``), and answers each from its
prompt:

- a prompt that asks to delete, drop or remove something first asks a person
  (``ctx.approve``: ``interrupt.requested`` + ``run.paused``), then says what
  it did, or did not;
- a prompt that asks for the time calls the client tool ``clock.now`` on the
  run's client executor (``narad executor`` runs one), when the run has one;
- anything else is echoed, word by word.

Every answer streams word by word (``ctx.say``) and the run ends with
``run.finished``. A stop is honoured between words and while it waits: the
runtime closes the open work and ends the run ``run.cancelled``. A runtime
that dies is replaced by another that replays the journal (see
``narad.runtime``).

Unless ``--no-listen``, it also follows the tenant stream and starts a run
for each user message recorded at session scope (``record-user-message``),
bound to ``--executor`` when given.

Run it::

    python examples/python_agent.py --url http://127.0.0.1:8080 \\
        --token "$NARAD_TOKEN" [--queue demo] [--executor desk-1]

with a token of roles ``reader,writer,backend``. Ctrl-C (or SIGTERM) stops it:
it claims no more and lets the runs it holds finish.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from narad.client import Client
from narad.errors import NaradError
from narad.follow import follow
from narad.runtime import RunContext, Runtime

log = logging.getLogger("python_agent")

DANGEROUS = ("delete", "drop", "remove", "rm ")
ASK_FIRST = "This changes things for good: a person should approve it first."
USE_THE_CLOCK = "The time is best read on the user's own machine: a client tool."
CLOCK = ("time", "clock")


def prompt_of(value: Any) -> str:
    """The text of a run's input, or of a message's content (a string or text parts)."""
    if isinstance(value, dict):
        value = value.get("prompt", "")
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [p.get("text", "") if isinstance(p, dict) else str(p) for p in value]
        return " ".join(p for p in parts if p)
    return "" if value is None else str(value)


class Agent:
    """The run handler: answers one run from its prompt."""

    def __init__(self, word_delay: float) -> None:
        """An agent that waits ``word_delay`` seconds between the words it says."""
        self.word_delay = word_delay

    async def __call__(self, ctx: RunContext) -> None:
        """Works on one claimed run until it ends (or is stopped)."""
        prompt = prompt_of(ctx.input) or "hello"
        lower = prompt.lower()
        if any(word in lower for word in DANGEROUS):
            await ctx.think(ASK_FIRST)
            decision = await ctx.approve(
                f"The agent wants to: {prompt}", title="Approve a destructive action"
            )
            if decision == "approve":
                answer = f"Approved. Pretending to {prompt} now: done, nothing harmed."
            else:
                answer = f"Denied ({decision}). I did not {prompt}."
        elif any(word in lower for word in CLOCK) and ctx.client_executor_id:
            await ctx.think(USE_THE_CLOCK)
            response = await ctx.client_tool("clock.now", {})
            now = response.get("now") if isinstance(response, dict) else response
            answer = f"Your executor's clock says {now}."
        else:
            await ctx.think("A friendly echo will do.")
            answer = f"You said: {prompt}"
        await self.say_slowly(ctx, answer)
        await ctx.finish()

    async def say_slowly(self, ctx: RunContext, text: str) -> None:
        """Streams ``text`` word by word (a stop raises ``RunStopped`` in between)."""
        for n, word in enumerate(text.split(" ")):
            await ctx.say(word if n == 0 else f" {word}")
            await asyncio.sleep(self.word_delay)


async def start_runs_for_messages(client: Client, queue: str, desk: str | None) -> None:
    """Follows the tenant stream: a run for each user message at session scope."""
    try:
        await _follow_messages(client, queue, desk)
    except NaradError as e:
        log.error("the tenant stream was refused (%s): no runs start for messages", e)


async def _follow_messages(client: Client, queue: str, executor: str | None) -> None:
    attached = False
    async for frame in follow(client):
        if frame.kind == "capabilities" and not attached:
            attached = True
            print("python agent is listening for user messages", flush=True)
            continue
        event = frame.data
        if frame.kind != "authority" or event.get("type") != "message.user.recorded":
            continue
        if event.get("messageScope") != "session":
            continue
        try:
            await client.start_run(
                str(event["sessionId"]),
                on_conflict="enqueue",
                queue=queue,
                input={
                    "prompt": prompt_of(event.get("content")),
                    "messageId": event.get("messageId"),
                },
                client_executor_id=executor,
            )
        except NaradError as e:
            log.warning("start-run for a message was refused: %s", e)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (``NARAD_URL`` and ``NARAD_TOKEN`` stand in for the flags)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        action="append",
        help="a server URL (repeat for replicas; default $NARAD_URL)",
    )
    parser.add_argument(
        "--token", default=os.environ.get("NARAD_TOKEN"), help="default $NARAD_TOKEN"
    )
    parser.add_argument("--queue", default="demo", help="the work queue (default demo)")
    parser.add_argument("--executor", help="the executor runs from messages bind to")
    parser.add_argument("--word-delay-ms", type=int, default=60, help="between words")
    parser.add_argument("--concurrency", type=int, default=4, help="runs held at once")
    parser.add_argument("--no-listen", action="store_true", help="no runs for messages")
    args = parser.parse_args(argv)
    args.url = args.url or [u for u in os.environ.get("NARAD_URL", "").split(",") if u]
    if not args.url:
        parser.error("give --url (or set NARAD_URL)")
    if not args.token:
        parser.error("give --token (or set NARAD_TOKEN)")
    return args


async def main(argv: Sequence[str] | None = None) -> int:
    """Runs the agent until SIGINT or SIGTERM."""
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    # One line per request drowns what the agent does; failures still show.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    async with Client(args.url, args.token) as client:
        runtime = Runtime(
            client,
            Agent(args.word_delay_ms / 1000),
            queue=args.queue,
            runtime_id="python-demo-agent",
            concurrency=args.concurrency,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runtime.stop)
        watcher = None
        if not args.no_listen:
            watcher = asyncio.create_task(
                start_runs_for_messages(client, args.queue, args.executor)
            )
        print(f"python agent is serving queue {args.queue}", flush=True)
        try:
            await runtime.run()
        finally:
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
    print("python agent stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
