"""An OpenAI Agents SDK agent on narad: the SDK's offline ``ScriptedModel`` (the
``weather`` tool, then its result), or OpenAI when ``OPENAI_API_KEY`` is set.
``book_table`` asks a person first; ``clock_now`` runs on the client executor.

    NARAD_URL=... NARAD_TOKEN=... python examples/openai_agents_agent.py [--queue Q]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import uuid
from typing import Any

from agents import Agent, function_tool, set_tracing_disabled
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call

from narad import Client, Runtime
from narad.integrations.openai_agents import handler


def offline(call: ModelCall) -> list[Any]:
    """The scripted model's answer (and the next call's step)."""
    model.enqueue(ModelStep.respond(offline))
    last = call.input[-1] if isinstance(call.input, list) and call.input else {}
    if isinstance(last, dict) and last.get("type") == "function_call_output":
        return [assistant_message(f"Here is the weather: {last['output']}")]
    return [function_call("weather", {"city": "Paris"}, call_id=f"call_{uuid.uuid4().hex}")]


real = bool(os.environ.get("OPENAI_API_KEY"))
model: Any = "gpt-4.1-mini" if real else ScriptedModel([ModelStep.respond(offline)])
set_tracing_disabled(not real)


@function_tool
def weather(city: str) -> str:
    """Today's weather in ``city``."""
    return f"Sunny in {city}, 21 °C"


@function_tool(needs_approval=True)
def book_table(restaurant: str, people: int) -> str:
    """Books a table (a person approves it first)."""
    return f"Booked {restaurant} for {people}"


@function_tool
def clock_now() -> str:
    """The time on the user's machine (run by the client executor)."""
    raise RuntimeError("runs on the client executor")


tools: list[Any] = [weather, book_table, clock_now]
agent = Agent(name="concierge", instructions="Answer in one sentence.", model=model, tools=tools)


async def main() -> None:
    parser = argparse.ArgumentParser(description="An OpenAI Agents SDK agent on narad")
    parser.add_argument("--queue", default="openai-agents")
    queue = parser.parse_args().queue
    async with Client(os.environ["NARAD_URL"], os.environ["NARAD_TOKEN"]) as client:
        run = handler(agent, client_tools=["clock_now"])
        runtime = Runtime(client, run, queue=queue, release_when_waiting=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, runtime.stop)
        print(f"openai agents agent is serving queue {queue}", flush=True)
        await runtime.run()


if __name__ == "__main__":
    asyncio.run(main())
