"""``narad.integrations.openai_agents`` against a real ``narad serve``, offline:
a scripted :class:`agents.Model` (:class:`Script`) streams the Responses
events a provider would — text deltas, reasoning, function calls, usage —
and the adapter journals what the SDK does with them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from agents import Agent, ModelResponse, RunConfig, function_tool, set_tracing_disabled
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.tool import Tool
from agents.usage import Usage as AgentsUsage
from conftest import REPO, NaradServer
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam
from openai.types.responses.response_reasoning_item import Summary
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from test_runtime import ROLES, SHORT_LEASES, has, of_type, serving, start, wait_history

from narad import Client, Event, Executor, RuntimeOptions, SessionReducer
from narad.integrations.openai_agents import handler, state_scope

QUEUE = "agents"
set_tracing_disabled(True)  # no trace export offline
INPUT_TOKENS, OUTPUT_TOKENS = 10, 5


# --- the scripted model ------------------------------------------------------------


@dataclass
class Say:
    """Streamed assistant text, a delta per word."""

    text: str


@dataclass
class Think:
    """A reasoning item with a summary."""

    text: str


@dataclass
class Call:
    """A function call of ``name`` with ``args``."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)


Part = Say | Think | Call
Reply = Callable[[list[dict[str, Any]]], Sequence[Part]]


class Script(Model):
    """A model whose answer is ``reply(input items)``, streamed as Responses events,
    ``delay`` seconds between text deltas; every response counts 10 input and 5
    output tokens. Item and call ids derive from the input's length, so the same
    conversation gets the same ids in any process."""

    def __init__(self, reply: Reply, *, delay: float = 0.0) -> None:
        self.reply = reply
        self.delay = delay
        self.calls = 0

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        raise NotImplementedError("the adapter streams")

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        self.calls += 1
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        plain = [dict(cast(dict[str, Any], i)) for i in items]
        turn = len(plain)
        n = 0

        def seq() -> int:
            nonlocal n
            n += 1
            return n

        response = Response(
            id=f"resp_{turn}",
            created_at=0,
            model="script",
            object="response",
            output=[],
            tool_choice="auto",
            tools=[],
            top_p=None,
            parallel_tool_calls=True,
            status="in_progress",
        )
        yield ResponseCreatedEvent(
            type="response.created", response=response, sequence_number=seq()
        )
        output: list[Any] = []
        for index, part in enumerate(self.reply(plain)):
            if isinstance(part, Say):
                item_id = f"msg_{turn}_{index}"
                empty = ResponseOutputMessage(
                    id=item_id, type="message", role="assistant", status="in_progress", content=[]
                )
                yield ResponseOutputItemAddedEvent(
                    type="response.output_item.added",
                    item=empty,
                    output_index=index,
                    sequence_number=seq(),
                )
                words = part.text.split(" ")
                for i, word in enumerate(words):
                    if self.delay:
                        await asyncio.sleep(self.delay)
                    yield ResponseTextDeltaEvent(
                        type="response.output_text.delta",
                        item_id=item_id,
                        output_index=index,
                        content_index=0,
                        delta=word if i == 0 else " " + word,
                        logprobs=[],
                        sequence_number=seq(),
                    )
                done: Any = empty.model_copy(
                    update={
                        "status": "completed",
                        "content": [
                            ResponseOutputText(
                                type="output_text", text=part.text, annotations=[], logprobs=[]
                            )
                        ],
                    }
                )
            elif isinstance(part, Think):
                item_id = f"rs_{turn}_{index}"
                yield ResponseOutputItemAddedEvent(
                    type="response.output_item.added",
                    item=ResponseReasoningItem(id=item_id, type="reasoning", summary=[]),
                    output_index=index,
                    sequence_number=seq(),
                )
                yield ResponseReasoningSummaryTextDeltaEvent(
                    type="response.reasoning_summary_text.delta",
                    item_id=item_id,
                    output_index=index,
                    summary_index=0,
                    delta=part.text,
                    sequence_number=seq(),
                )
                done = ResponseReasoningItem(
                    id=item_id,
                    type="reasoning",
                    summary=[Summary(type="summary_text", text=part.text)],
                )
            else:
                done = ResponseFunctionToolCall(
                    id=f"fc_{turn}_{index}",
                    call_id=f"call_{part.name}_{turn}_{index}",
                    type="function_call",
                    name=part.name,
                    arguments=json.dumps(part.args),
                    status="completed",
                )
                yield ResponseOutputItemAddedEvent(
                    type="response.output_item.added",
                    item=done,
                    output_index=index,
                    sequence_number=seq(),
                )
            output.append(done)
            yield ResponseOutputItemDoneEvent(
                type="response.output_item.done",
                item=done,
                output_index=index,
                sequence_number=seq(),
            )
        finished = response.model_copy(
            update={
                "status": "completed",
                "output": output,
                "usage": ResponseUsage(
                    input_tokens=INPUT_TOKENS,
                    output_tokens=OUTPUT_TOKENS,
                    total_tokens=INPUT_TOKENS + OUTPUT_TOKENS,
                    input_tokens_details=InputTokensDetails.model_validate(
                        {"cached_tokens": 0, "cache_write_tokens": 0}
                    ),
                    output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
                ),
            }
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=finished, sequence_number=seq()
        )


def last_output(items: list[dict[str, Any]]) -> str | None:
    """The output of the conversation's last item when it is a tool's output."""
    last = items[-1] if items else {}
    return str(last["output"]) if last.get("type") == "function_call_output" else None


def usage_of(requests: int) -> dict[str, float]:
    """The terminal's usage after ``requests`` model responses."""
    return {
        "inputTokens": INPUT_TOKENS * requests,
        "outputTokens": OUTPUT_TOKENS * requests,
        "totalTokens": (INPUT_TOKENS + OUTPUT_TOKENS) * requests,
        "requests": requests,
    }


# --- helpers ---------------------------------------------------------------------


def reduced(events: list[Event]) -> list[str]:
    """The assistant texts of the reducer's transcript (every append accepted)."""
    reducer = SessionReducer()
    for event in events:
        reducer.deliver(event)
    return [
        str(item["content"])
        for item in reducer.transcript()
        if item["item"] == "message" and item["role"] == "assistant"
    ]


def said(events: list[Event], run: str) -> str:
    return "".join(
        str(e["delta"]) for e in of_type(events, "message.text.delta") if e["runId"] == run
    )


async def run_to_end(
    client: Client, agent: Agent[Any], *, prompt: str = "hello", **options: Any
) -> tuple[str, str, list[Event]]:
    """Serves ``agent`` until a run of ``prompt`` ends; its session, run and history."""
    async with serving(client, handler(agent, **options), queue=QUEUE):
        session, run = await start(client, prompt=prompt, runtime=RuntimeOptions(queue=QUEUE))
        events = await wait_history(client, session, terminal(run))
    return session, run, events


def terminal(run: str) -> Callable[[list[Event]], bool]:
    return lambda events: any(
        e["type"] in ("run.finished", "run.error", "run.cancelled") and e["runId"] == run
        for e in events
    )


# --- a streamed answer, reasoning, usage --------------------------------------------


async def test_a_streamed_answer_with_reasoning_and_usage(client: Client) -> None:
    answer = "Hello there, how can I help you today?"
    model = Script(lambda items: [Think("The user greets me."), Say(answer)], delay=0.06)
    agent = Agent(name="greeter", instructions="Be kind.", model=model)
    _, run, events = await run_to_end(client, agent)
    finished = of_type(events, "run.finished")
    assert len(finished) == 1 and finished[0]["usage"] == usage_of(1), finished
    assert said(events, run) == answer
    assert len(of_type(events, "message.text.delta")) > 1  # streamed, not one piece
    thought = of_type(events, "reasoning.delta")
    assert [t["delta"] for t in thought] == ["The user greets me."]
    assert thought[0]["reasoningId"] == f"{run}.1.0.rs_1_0.thought"
    started = of_type(events, "message.text.started")[0]
    assert started["messageId"] == f"{run}.1.1.msg_1_1.message"
    assert reduced(events) == [answer]
