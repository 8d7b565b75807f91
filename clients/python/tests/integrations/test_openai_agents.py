"""``narad.integrations.openai_agents`` against a real ``narad serve``, offline:
a scripted :class:`agents.Model` (:class:`Script`) streams the Responses
events a provider would — text deltas, reasoning, function calls, usage —
and the adapter journals what the SDK does with them."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from agents import Agent, ModelResponse, function_tool, set_tracing_disabled
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseStreamEvent
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.tool import Tool
from conftest import REPO, NaradServer
from helpers import ended, runtime_env, said, spawn_and_kill_when
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
from test_runtime import has, of_type, serving, start, wait_history

from narad import Client, Event, Executor, SessionReducer
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


def tool_outputs(items: list[dict[str, Any]]) -> list[str]:
    """The outputs of the conversation's tool calls (handoffs among them), in order."""
    return [str(i["output"]) for i in items if i.get("type") == "function_call_output"]


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


async def run_to_end(
    client: Client, agent: Agent[Any], *, prompt: str = "hello", **options: Any
) -> tuple[str, str, list[Event]]:
    """Serves ``agent`` until a run of ``prompt`` ends; its session, run and history."""
    async with serving(client, handler(agent, **options), queue=QUEUE):
        session, run = await start(client, prompt, queue=QUEUE)
        events = await wait_history(client, session, ended(run))
    return session, run, events


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


# --- backend tools: a result and an error --------------------------------------------


@function_tool
def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


@function_tool
def broken(path: str) -> str:
    """Always fails."""
    raise OSError(f"disk on fire at {path}")


async def test_backend_tools_are_journaled_with_arguments_results_and_errors(
    client: Client,
) -> None:
    def reply(items: list[dict[str, Any]]) -> list[Part]:
        outputs = [str(i["output"]) for i in items if i.get("type") == "function_call_output"]
        if not outputs:
            return [
                Say("Let me see."),
                Call("add", {"a": 2, "b": 3}),
                Call("broken", {"path": "/x"}),
            ]
        return [Say(f"The sum is {outputs[0]}; the other tool said: {outputs[1]}")]

    agent = Agent(name="calc", model=Script(reply), tools=[add, broken])
    _, run, events = await run_to_end(client, agent)
    assert of_type(events, "run.finished")[0]["usage"] == usage_of(2)
    started = of_type(events, "tool.call.started")
    assert [(s["toolName"], s["args"], s["executor"]) for s in started] == [
        ("add", {"a": 2, "b": 3}, "backend"),
        ("broken", {"path": "/x"}, "backend"),
    ]
    assert started[0]["toolCallId"] == f"{run}.call_add_1_1.tool"
    finished = {f["toolCallId"]: f for f in of_type(events, "tool.call.finished")}
    ok, failed = (finished[s["toolCallId"]] for s in started)
    assert (ok["outcome"], ok["response"]) == ("success", 5)
    assert (failed["outcome"], failed["code"]) == ("error", "tool_error")
    assert "disk on fire at /x" in failed["message"]
    # The model was told what the SDK tells it of a failed tool.
    told = "An error occurred while running the tool. Please try again."
    final = f"The sum is 5; the other tool said: {told}"
    assert reduced(events) == ["Let me see.", final]


# --- a client tool ----------------------------------------------------------------


@function_tool
def clock_now(tz: str) -> str:
    """The time of day on the user's machine."""
    raise AssertionError("a client tool's body never runs in the runtime")


async def test_a_client_tool_is_run_by_the_executor_and_its_result_goes_to_the_model(
    client: Client, narad_server: NaradServer, org: str
) -> None:
    def reply(items: list[dict[str, Any]]) -> list[Part]:
        output = last_output(items)
        return [Call("clock_now", {"tz": "UTC"})] if output is None else [Say(f"It is {output}.")]

    agent = Agent(name="clock", model=Script(reply), tools=[clock_now])
    desk = f"desk-{uuid.uuid4().hex[:8]}"
    ran: list[dict[str, Any]] = []

    def now(args: dict[str, Any]) -> Any:
        ran.append(args)
        return {"time": "12:00", "tz": args["tz"]}

    async with (
        Client(
            narad_server.base, narad_server.token("executor", org=org, sub="desk")
        ) as desk_client,
        serving(client, handler(agent, client_tools=["clock_now"]), queue=QUEUE),
    ):
        executor = Executor(desk_client, desk, {"clock_now": now}, poll_wait=2)
        running = asyncio.create_task(executor.run())
        try:
            session, run = await start(client, queue=QUEUE, client_executor_id=desk)
            events = await wait_history(client, session, ended(run))
        finally:
            executor.stop()
            await asyncio.wait_for(running, 30)
    assert ran == [{"tz": "UTC"}]
    (call,) = of_type(events, "tool.call.started")
    assert (call["toolName"], call["executor"], call["args"]) == (
        "clock_now",
        "client",
        {"tz": "UTC"},
    )
    assert of_type(events, "tool.call.finished")[0]["outcome"] == "success"
    assert not of_type(events, "interrupt.requested")  # a client tool asks nobody
    assert of_type(events, "run.finished")[0]["usage"] == usage_of(2)
    assert reduced(events) == ['It is {"time": "12:00", "tz": "UTC"}.']
    # The SDK paused at the call: its RunState was kept before the wait.
    snapshots = of_type(events, "state.snapshot")
    assert [s["scope"] for s in snapshots] == [state_scope(run)]


# --- approvals ----------------------------------------------------------------------


deleted: list[str] = []


@function_tool(needs_approval=True)
def delete_file(path: str) -> str:
    """Deletes a file."""
    deleted.append(path)
    return f"deleted {path}"


def deleting(items: list[dict[str, Any]]) -> list[Part]:
    output = last_output(items)
    if output is None:
        return [Say("I will delete it."), Call("delete_file", {"path": "/tmp/x"})]
    return [Say(f"Done: {output}")]


@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_a_tool_that_needs_approval_waits_for_a_person(client: Client, decision: str) -> None:
    deleted.clear()
    agent = Agent(name="janitor", model=Script(deleting), tools=[delete_file])
    async with serving(client, handler(agent), queue=QUEUE):
        session, run = await start(client, queue=QUEUE)
        events = await wait_history(client, session, has("run.paused", runId=run))
        (asked,) = of_type(events, "interrupt.requested")
        assert asked["interruptId"] == f"{run}.call_delete_file_1_1.approval"
        assert asked["input"] == {"tool": "delete_file", "args": {"path": "/tmp/x"}}
        assert asked["actions"] == ["approve", "deny"]
        assert not of_type(events, "tool.call.started") and deleted == []
        # The state was kept before the run paused.
        assert of_type(events, "state.snapshot")[0]["scope"] == state_scope(run)
        await client.resolve_interrupt(
            session, interrupt_id=asked["interruptId"], decision=decision
        )
        events = await wait_history(client, session, ended(run))
    assert of_type(events, "run.finished")[0]["usage"] == usage_of(2)
    if decision == "approve":
        assert deleted == ["/tmp/x"]
        (finished,) = of_type(events, "tool.call.finished")
        assert finished["response"] == "deleted /tmp/x"
        assert reduced(events) == ["I will delete it.", "Done: deleted /tmp/x"]
    else:
        assert deleted == [] and not of_type(events, "tool.call.started")
        assert reduced(events) == ["I will delete it.", "Done: Tool execution was not approved."]


async def test_a_handoff_runs_the_next_agent_in_a_nested_run(client: Client) -> None:
    def reply(items: list[dict[str, Any]]) -> list[Part]:
        outputs = tool_outputs(items)
        if not outputs:
            return [Say("Passing you to billing."), Call("transfer_to_billing")]
        return [Call("add", {"a": 40, "b": 2})] if len(outputs) == 1 else [Say("You owe 42.")]

    model = Script(reply)
    billing = Agent(name="billing", model=model, tools=[add])
    triage = Agent(name="triage", model=model, handoffs=[billing])
    _, run, events = await run_to_end(client, triage)
    (nested,) = [e for e in of_type(events, "run.started") if e.get("parentRunId") == run]
    assert nested["input"] == {"agent": "billing", "from": "triage"}
    child = nested["runId"]
    assert child.startswith(f"{run}.handoff.") and child.endswith(".run")
    # The next agent's tools are journaled in its nested run, which ends
    # before the run does; what it says goes on in the conversation (§9.2).
    (call,) = of_type(events, "tool.call.finished")
    assert (call["runId"], call["response"]) == (child, 42)
    assert said(events, child) == ""
    assert said(events, run) == "Passing you to billing.You owe 42."
    ends = [(e["type"], e["runId"]) for e in events if e["type"] == "run.finished"]
    assert ends == [("run.finished", child), ("run.finished", run)]
    assert not of_type(events, "progress.recorded")
    assert reduced(events) == ["Passing you to billing.", "You owe 42."]
    assert of_type(events, "run.finished")[-1]["usage"] == usage_of(3)


async def test_an_approval_in_a_handed_off_agent_resumes_in_its_nested_run(
    client: Client,
) -> None:
    deleted.clear()

    def reply(items: list[dict[str, Any]]) -> list[Part]:
        outputs = tool_outputs(items)
        if not outputs:
            return [Call("transfer_to_janitor")]
        if len(outputs) == 1:
            return [Say("I will delete it."), Call("delete_file", {"path": "/tmp/x"})]
        return [Say(f"Done: {outputs[-1]}")]

    model = Script(reply)
    janitor = Agent(name="janitor", model=model, tools=[delete_file])
    triage = Agent(name="triage", model=model, handoffs=[janitor])
    claims: list[int] = []
    inner = handler(triage)

    async def counted(ctx: Any) -> None:
        claims.append(ctx.attempt)
        await inner(ctx)

    async with serving(client, counted, queue=QUEUE, release_when_waiting=True):
        session, run = await start(client, queue=QUEUE)
        events = await wait_history(client, session, has("run.paused"))
        await asyncio.sleep(0.3)
        assert len(claims) == 1  # given back while it waits
        (nested,) = [e for e in of_type(events, "run.started") if e.get("parentRunId") == run]
        (asked,) = of_type(events, "interrupt.requested")
        assert asked["runId"] == nested["runId"]  # the janitor asks, in its own run
        await client.resolve_interrupt(
            session, interrupt_id=asked["interruptId"], decision="approve"
        )
        events = await wait_history(client, session, ended(run))
    assert len(claims) == 2, claims
    child = nested["runId"]
    assert [e["runId"] for e in of_type(events, "run.started")] == [run, child]
    assert deleted == ["/tmp/x"]
    (call,) = of_type(events, "tool.call.finished")
    assert (call["runId"], call["response"]) == (child, "deleted /tmp/x")
    assert said(events, run) == "I will delete it.Done: deleted /tmp/x"
    assert reduced(events) == ["I will delete it.", "Done: deleted /tmp/x"]
    ends = [e["runId"] for e in events if e["type"] == "run.finished"]
    assert ends == [child, run]


# --- a stop, errors --------------------------------------------------------------------


async def test_a_stop_mid_stream_cancels_the_run_with_partial_usage(client: Client) -> None:
    long = " ".join(f"word{i}" for i in range(200))

    def reply(items: list[dict[str, Any]]) -> list[Part]:
        return [Call("add", {"a": 1, "b": 1})] if last_output(items) is None else [Say(long)]

    model = Script(reply, delay=0.05)
    agent = Agent(name="talker", model=model, tools=[add])
    async with serving(client, handler(agent), queue=QUEUE):
        session, run = await start(client, queue=QUEUE)
        await wait_history(client, session, lambda events: "word5" in said(events, run))
        await client.stop_run(session, run_id=run)
        events = await wait_history(client, session, ended(run))
        calls = model.calls
        await asyncio.sleep(0.5)
    assert model.calls == calls == 2  # the streaming stopped; no more model calls
    (cancelled,) = of_type(events, "run.cancelled")
    assert cancelled["code"] == "stopped"
    assert cancelled["usage"] == usage_of(1)  # the first response; the second never completed
    text = said(events, run)
    assert text and long.startswith(text) and text != long
    assert len(of_type(events, "message.text.completed")) == 1
    assert reduced(events) == [text]


async def test_framework_errors_end_the_run_with_a_code_and_partial_usage(client: Client) -> None:
    looping = Agent(
        name="looper", model=Script(lambda items: [Call("add", {"a": 1, "b": 2})]), tools=[add]
    )
    _, _, events = await run_to_end(client, looping, max_turns=2)
    (error,) = of_type(events, "run.error")
    assert error["code"] == "max_turns_exceeded", error
    assert error["usage"] == usage_of(2)
    assert len(of_type(events, "tool.call.finished")) == 2

    def down(items: list[dict[str, Any]]) -> list[Part]:
        raise ConnectionError("the provider is down")

    failing = Agent(name="down", model=Script(down))
    _, _, events = await run_to_end(client, failing)
    (error,) = of_type(events, "run.error")
    assert (error["code"], error["message"]) == ("connection_error", "the provider is down")
    assert "usage" not in error


# --- kill -9 and takeover ---------------------------------------------------------------

TESTS = Path(__file__).resolve().parents[1]
LONG = " ".join(f"word{i}" for i in range(60))


def takeover_agent(delay: float) -> Agent[Any]:
    """The agent of the takeover test: asked to delete, it calls a tool that
    needs approval; asked anything else, it talks at length."""

    def reply(items: list[dict[str, Any]]) -> list[Part]:
        if "delete" in str(items[0].get("content")):
            return deleting(items)
        return [Say(LONG)]

    return Agent(name="survivor", model=Script(reply, delay=delay), tools=[delete_file])


#: The first holder: a runtime process of its own serving the takeover agent.
FIRST_HOLDER = textwrap.dedent(
    """
    import asyncio, os, sys
    sys.path[:0] = [os.environ["TESTS"]]
    from integrations.test_openai_agents import takeover_agent
    from narad import Client, Runtime
    from narad.integrations.openai_agents import handler

    async def main():
        async with Client(os.environ["NARAD_URL"], os.environ["NARAD_TOKEN"]) as client:
            agent = handler(takeover_agent(0.1))
            await Runtime(client, agent, queue="takeover", claim_wait=1.0).run()

    asyncio.run(main())
    """
)


async def test_a_runtime_killed_with_sigkill_is_taken_over_without_writing_anything_twice(
    short_server: NaradServer, short_client: Client, org: str, tmp_path: Path
) -> None:
    client = short_client
    deleted.clear()
    program = tmp_path / "first_holder.py"
    program.write_text(FIRST_HOLDER)

    async def half_way() -> tuple[str, str, str, str]:
        # Run A pauses for an approval (its RunState kept); run B is cut mid-answer.
        session_a, run_a = await start(client, "delete /tmp/x", queue="takeover")
        session_b, run_b = await start(client, "talk", queue="takeover")
        await wait_history(client, session_a, has("run.paused", runId=run_a), timeout=30)
        await wait_history(client, session_b, lambda events: "word8" in said(events, run_b))
        return session_a, run_a, session_b, run_b

    env = runtime_env(short_server, org, TESTS=str(TESTS))
    session_a, run_a, session_b, run_b = await spawn_and_kill_when(program, env, half_way)
    cut = said(await wait_history(client, session_b, lambda _: True), run_b)
    asked = of_type(await wait_history(client, session_a, lambda _: True), "interrupt.requested")
    await client.resolve_interrupt(
        session_a, interrupt_id=asked[0]["interruptId"], decision="approve"
    )

    async with serving(client, handler(takeover_agent(0.0)), queue="takeover"):
        events_a = await wait_history(client, session_a, ended(run_a))
        events_b = await wait_history(client, session_b, ended(run_b))

    # A: resumed from its RunState; nothing of the first holder written again.
    assert of_type(events_a, "run.finished"), [e["type"] for e in events_a]
    assert len(of_type(events_a, "interrupt.requested")) == 1
    assert len(of_type(events_a, "state.snapshot")) == 1
    assert len(of_type(events_a, "tool.call.started")) == 1 and deleted == ["/tmp/x"]
    assert reduced(events_a) == ["I will delete it.", "Done: deleted /tmp/x"]
    holders = {
        str(e["eventId"]).split("@")[1].split(".")[0]
        for e in of_type(events_a, "message.text.delta")
    }
    assert holders == {"1", "2"}
    assert of_type(events_a, "run.finished")[0]["usage"] == usage_of(2)  # the RunState's count too

    # B: no state to resume from, and the journal holds the first holder's words.
    (error,) = of_type(events_b, "run.error")
    assert error["code"] == "no_resumable_state", error
    assert len(of_type(events_b, "message.text.started")) == 1
    assert said(events_b, run_b) == cut and LONG.startswith(cut)
    assert reduced(events_b) == [cut]


async def test_a_runtime_that_releases_waiting_runs_resumes_them_from_the_run_state(
    client: Client,
) -> None:
    deleted.clear()
    agent = Agent(name="janitor", model=Script(deleting), tools=[delete_file])
    inner = handler(agent)
    claims: list[int] = []

    async def counted(ctx: Any) -> None:
        claims.append(ctx.attempt)
        await inner(ctx)

    async with serving(client, counted, queue=QUEUE, release_when_waiting=True):
        session, run = await start(client, queue=QUEUE)
        events = await wait_history(client, session, has("run.paused", runId=run))
        await asyncio.sleep(0.3)
        assert len(claims) == 1  # given back while it waits
        (asked,) = of_type(events, "interrupt.requested")
        await client.resolve_interrupt(
            session, interrupt_id=asked["interruptId"], decision="approve"
        )
        events = await wait_history(client, session, ended(run))
    assert len(claims) == 2, claims
    assert of_type(events, "run.finished")[0]["usage"] == usage_of(2)
    assert deleted == ["/tmp/x"] and len(of_type(events, "tool.call.started")) == 1
    assert len(of_type(events, "interrupt.requested")) == 1
    assert len(of_type(events, "state.snapshot")) == 1
    assert reduced(events) == ["I will delete it.", "Done: deleted /tmp/x"]


# --- the example -------------------------------------------------------------------


async def test_the_example_answers_a_run_with_the_sdk_scripted_model(
    client: Client, narad_server: NaradServer, org: str, tmp_path: Path
) -> None:
    env = runtime_env(narad_server, org)
    output = tmp_path / "example.out"
    with open(output, "wb") as out:  # noqa: ASYNC230 (a file for the child's output)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(REPO / "examples" / "openai_agents_agent.py"),
            "--queue",
            "openai-agents-example",
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
        )
    try:
        session, run = await start(client, "Weather in Paris?", queue="openai-agents-example")
        events = await wait_history(client, session, ended(run), timeout=30)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=15)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
    assert of_type(events, "run.finished"), output.read_text()
    (finished,) = of_type(events, "tool.call.finished")
    assert finished["outcome"] == "success" and finished["response"] == "Sunny in Paris, 21 °C"
    assert reduced(events) == ["Here is the weather: Sunny in Paris, 21 °C"]
