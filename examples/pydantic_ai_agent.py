"""A Pydantic AI agent served by narad (``narad.integrations.pydantic_ai``).

It answers the runs queued on ``--queue`` with Pydantic AI's ``TestModel``
(which calls the ``weather`` tool and answers with its result), or with
OpenAI when ``OPENAI_API_KEY`` is set (``pip install "pydantic-ai-slim[openai]"``).
``book_table`` needs a person's approval: a narad interrupt. ``clock_now``
runs on the run's client executor (``narad executor``), not here.

    NARAD_URL=http://127.0.0.1:8080 NARAD_TOKEN=... python examples/pydantic_ai_agent.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

from narad import Client, Runtime
from narad.integrations.pydantic_ai import handler

real = bool(os.environ.get("OPENAI_API_KEY"))
model: Any = "openai:gpt-4o-mini" if real else TestModel(call_tools=["weather"])
agent = Agent(model, instructions="Answer in one sentence; use the tools.")


@agent.tool_plain
def weather(city: str) -> str:
    """Today's weather in ``city``."""
    return f"Sunny in {city}, 21 °C"


@agent.tool_plain(requires_approval=True)
def book_table(restaurant: str, people: int) -> str:
    """Books a table (a person approves it first)."""
    return f"Booked {restaurant} for {people}"


@agent.tool_plain
def clock_now() -> str:
    """The time on the user's machine (run by the client executor)."""
    raise RuntimeError("runs on the client executor")


async def main() -> None:
    parser = argparse.ArgumentParser(description="A Pydantic AI agent on narad")
    parser.add_argument("--queue", default="pydantic-ai")
    args = parser.parse_args()
    async with Client(os.environ["NARAD_URL"], os.environ["NARAD_TOKEN"]) as client:
        run = handler(agent, client_tools=["clock_now"])
        runtime = Runtime(client, run, queue=args.queue, release_when_waiting=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, runtime.stop)
        print(f"pydantic ai agent is serving queue {args.queue}", flush=True)
        await runtime.run()


if __name__ == "__main__":
    asyncio.run(main())
