"""A LangGraph agent served by narad (``narad.integrations.langgraph``): a model
node and a ``ToolNode`` loop until the model answers. The model is
langchain-core's fake (it calls ``weather``, then answers), or OpenAI when
``OPENAI_API_KEY`` is set (``pip install langchain-openai``). ``publish`` asks
a person (``interrupt()``: a narad approval); ``clock_now`` runs on the run's
client executor. The checkpointer is ``NaradSaver``: the graph's checkpoints are
kept in the run's journal, so another runtime resumes a run this one lost.
``NARAD_URL=... NARAD_TOKEN=... python examples/langgraph_agent.py``
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import sys
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import interrupt
from pydantic import BaseModel

from narad import Client, Runtime
from narad.integrations.langgraph import NaradSaver, client_tool, handler


@tool
def weather(city: str) -> str:
    """Today's weather in ``city``."""
    return f"Sunny in {city}, 21 °C"


@tool
def publish(text: str) -> str:
    """Publishes ``text`` once a person approves."""
    return "published" if interrupt({"message": f"Publish {text!r}?"}) == "approve" else "denied"


tools = [weather, publish, client_tool("clock_now", "The user's local time.", BaseModel)]
if os.environ.get("OPENAI_API_KEY"):
    openai: Any = importlib.import_module("langchain_openai")
    model: Any = openai.ChatOpenAI(model="gpt-4o-mini").bind_tools(tools)
else:
    call = {"id": "call_1", "name": "weather", "args": {"city": "Paris"}}
    answers: list[BaseMessage] = [AIMessage("", tool_calls=[call]), AIMessage("Sunny in Paris.")]
    model = FakeMessagesListChatModel(responses=answers)


async def agent(state: MessagesState) -> dict[str, Any]:
    return {"messages": [await model.ainvoke(state["messages"])]}


builder = StateGraph(MessagesState)
builder.add_node("agent", agent)
builder.add_node("tools", ToolNode(tools))
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", tools_condition)
builder.add_edge("tools", "agent")
# The graph's checkpoints in the run's journal: a runtime that takes the run over resumes it.
graph = builder.compile(checkpointer=NaradSaver())


async def main(queue: str) -> None:
    async with Client(os.environ["NARAD_URL"], os.environ["NARAD_TOKEN"]) as client:
        runtime = Runtime(client, handler(graph, client_tools=["clock_now"]), queue=queue)
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, runtime.stop)
        print(f"langgraph agent is serving queue {queue}", flush=True)
        await runtime.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[2] if sys.argv[1:2] == ["--queue"] else "langgraph"))
