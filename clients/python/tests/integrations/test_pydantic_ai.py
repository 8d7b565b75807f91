"""``narad.integrations.pydantic_ai`` against a real ``narad serve``, driven
by Pydantic AI's own ``FunctionModel`` (scripted streams, tool calls, usage).

Each test runs one agent in a runtime of this process (the takeover test
also in a child process it kills with SIGKILL), reads the session's history
and checks the terminal, that the SDK's reducer accepts every event, and
that the reduced transcript is what the same agent produces run locally.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, NaradServer
from helpers import ended, runtime_env, said, spawn_and_kill_when, terminal
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    ModelRetry,
    ToolDenied,
    ToolFailed,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ThinkingPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import (
    AgentInfo,
    DeltaThinkingCalls,
    DeltaThinkingPart,
    DeltaToolCall,
    DeltaToolCalls,
    FunctionModel,
)
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.toolsets import ExternalToolset
from pydantic_ai.usage import UsageLimits
from test_runtime import ROLES, of_type, serving, start, wait_history

from narad.client import Client, Event, RuntimeOptions
from narad.executor import Executor
from narad.integrations.pydantic_ai import delegate, handler, state_scope
from narad.reducer import SessionReducer

QUEUE = "pydantic"
WAIT = 20.0

#: This module's waits on a session's history last up to WAIT seconds.
wait_for = partial(wait_history, timeout=WAIT)

Item = str | DeltaToolCalls | DeltaThinkingCalls


# --- the scripted model ----------------------------------------------------------


def scripted(*turns: Sequence[Item], delay: float = 0.0) -> FunctionModel:
    """A model that streams turn n when the history holds n responses (then the last again)."""

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Item]:
        n = sum(isinstance(m, ModelResponse) for m in messages)
        for item in turns[min(n, len(turns) - 1)]:
            if delay:
                await asyncio.sleep(delay)
            yield item

    return FunctionModel(stream_function=stream)


def call(name: str, args: str, call_id: str, index: int = 0) -> DeltaToolCalls:
    """A whole tool call as one stream item."""
    return {index: DeltaToolCall(name=name, json_args=args, tool_call_id=call_id)}


def returns_of(message: ModelMessage) -> list[ToolReturnPart]:
    """The tool returns a request carries."""
    if not isinstance(message, ModelRequest):
        return []
    return [p for p in message.parts if isinstance(p, ToolReturnPart)]


def thought(text: str) -> DeltaThinkingCalls:
    return {0: DeltaThinkingPart(content=text)}


# --- the server, the runtime, the run ---------------------------------------------


def transcript(events: list[Event]) -> list[tuple[str, str]]:
    """The session's transcript as the SDK's reducer makes it: (kind, text) in order."""
    reducer = SessionReducer()
    for event in events:
        reducer.deliver(event)
    items: list[tuple[str, str]] = []
    for item in reducer.transcript():
        if item["item"] == "reasoning":
            items.append(("reasoning", str(item["text"])))
        elif item["role"] == "assistant":
            items.append(("assistant", str(item["content"])))
    return items


def produced(messages: Sequence[ModelMessage]) -> list[tuple[str, str]]:
    """What the framework produced: its responses' thinking and text parts, in order."""
    items: list[tuple[str, str]] = []
    for message in messages:
        if isinstance(message, ModelResponse):
            for part in message.parts:
                if isinstance(part, ThinkingPart) and part.content:
                    items.append(("reasoning", part.content))
                elif isinstance(part, TextPart) and part.content:
                    items.append(("assistant", part.content))
    return items


@pytest.fixture
def no_refusals(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fails the test when the runtime logged an error (a refused append, a failed handler)."""
    caplog.set_level(logging.WARNING, logger="narad")
    yield
    errors = [
        r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("narad")
    ]
    assert not errors, [r.getMessage() for r in errors]


async def local(agent: Agent[None, Any], *args: Any, **options: Any) -> Any:
    """The same agent run here, streamed as the adapter runs it (the run's result)."""

    async def ignore(_: Any, events: AsyncIterable[Any]) -> None:
        async for _event in events:
            pass

    return await agent.run(*args, event_stream_handler=ignore, **options)


def usage_of(u: Any) -> dict[str, float]:
    """A Pydantic AI ``RunUsage`` as the terminal's ``usage``."""
    counts = {
        "inputTokens": u.input_tokens,
        "outputTokens": u.output_tokens,
        "totalTokens": u.input_tokens + u.output_tokens,
        "requests": u.requests,
        "toolCalls": u.tool_calls,
    }
    return {k: float(v) for k, v in counts.items() if v}


# --- a streamed answer ------------------------------------------------------------


async def test_a_streamed_answer_with_thinking_is_a_message_and_its_usage_the_terminals(
    client: Client, no_refusals: None
) -> None:
    model = scripted([thought("The user greets me."), "Hello", ", there", " and welcome."])
    agent = Agent(model)
    session, run = await start(client, "hi", queue=QUEUE)
    async with serving(client, handler(agent), queue=QUEUE):
        events = await wait_for(client, session, ended(run))
    here = await local(agent, "hi")
    finished = terminal(events, run)
    assert finished["type"] == "run.finished"
    assert transcript(events) == produced(here.all_messages())
    assert transcript(events) == [
        ("reasoning", "The user greets me."),
        ("assistant", "Hello, there and welcome."),
    ]
    assert finished["usage"] == usage_of(here.usage)
    assert finished["usage"]["requests"] == 1
    # The text came as deltas (at least one), under a key of the response and part.
    started = of_type(events, "message.text.started")
    assert [e["messageId"] for e in started] == [f"{run}.r0.p1.message"]


async def test_a_conversation_goes_to_the_agent_as_its_message_history(
    client: Client, no_refusals: None
) -> None:
    seen: list[list[ModelMessage]] = []

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        seen.append(list(messages))
        yield f"turn {len(messages)}"

    agent = Agent(FunctionModel(stream_function=stream))
    session, first = await start(client, "one", queue=QUEUE)
    async with serving(client, handler(agent), queue=QUEUE):
        await wait_for(client, session, ended(first))
        second = f"r-{uuid.uuid4().hex[:10]}"
        await client.start_run(
            session,
            run_id=second,
            input={"prompt": "two"},
            runtime=RuntimeOptions(queue=QUEUE),
        )
        events = await wait_for(client, session, ended(second))
    # The second run's model saw the first answer, then its own prompt.
    assert produced(seen[-1]) == [("assistant", "turn 1")]
    assert [type(m).__name__ for m in seen[-1]] == ["ModelResponse", "ModelRequest"]
    # The primary transcript shows the latest run's messages (§9.2).
    assert transcript(events) == [("assistant", "turn 2")]


# --- tools ------------------------------------------------------------------------


def tool_agent(ran: list[str]) -> Agent[None, str]:
    model = scripted(
        [
            call("add", '{"a": 1, "b": 2}', "call-add", 0),
            call("city", '{"name": "Atlantis"}', "call-city", 1),
            call("flaky", "{}", "call-flaky", 2),
        ],
        [call("flaky", "{}", "call-flaky-2")],
        ["1 + 2 = 3; Atlantis is nowhere."],
    )
    agent = Agent(model)

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        ran.append("add")
        return a + b

    @agent.tool_plain
    def city(name: str) -> str:
        ran.append("city")
        raise ToolFailed(f"no city named {name}")

    @agent.tool_plain(retries=3)
    def flaky() -> str:
        ran.append("flaky")
        if ran.count("flaky") == 1:
            raise ModelRetry("try again")
        return "steady"

    return agent


async def test_backend_tools_are_journaled_with_results_and_failures_with_a_code(
    client: Client, no_refusals: None
) -> None:
    ran: list[str] = []
    agent = tool_agent(ran)
    session, run = await start(client, "add and look", queue=QUEUE)
    async with serving(client, handler(agent), queue=QUEUE):
        events = await wait_for(client, session, ended(run))
    assert terminal(events, run)["type"] == "run.finished"
    assert ran == ["add", "city", "flaky", "flaky"]
    started = {e["toolCallId"]: e for e in of_type(events, "tool.call.started")}
    finished = {e["toolCallId"]: e for e in of_type(events, "tool.call.finished")}
    add_id, city_id = f"{run}.call-add.tool", f"{run}.call-city.tool"
    assert started[add_id]["toolName"] == "add"
    assert started[add_id]["args"] == {"a": 1, "b": 2}
    assert started[add_id]["executor"] == "backend"
    assert finished[add_id]["outcome"] == "success"
    assert finished[add_id]["response"] == 3
    assert finished[city_id]["outcome"] == "error"
    assert finished[city_id]["code"] == "tool_failed"
    assert finished[city_id]["message"] == "no city named Atlantis"
    # A ModelRetry is the framework's: the call ends error, the model calls again.
    flaky = finished[f"{run}.call-flaky.tool"]
    assert (flaky["code"], flaky["message"]) == ("retry", "try again")
    assert finished[f"{run}.call-flaky-2.tool"]["response"] == "steady"
    ran.clear()
    here = await local(agent, "add and look")
    assert transcript(events) == produced(here.all_messages())
    assert terminal(events, run)["usage"] == usage_of(here.usage)


async def test_a_tool_that_raises_ends_the_run_failed_with_the_exceptions_class_as_code(
    client: Client, no_refusals: None
) -> None:
    agent = Agent(scripted([call("broken", "{}", "call-1")], ["never"]))

    @agent.tool_plain
    def broken() -> str:
        raise ValueError("the disk is gone")

    session, run = await start(client, "go", queue=QUEUE)
    async with serving(client, handler(agent), queue=QUEUE):
        events = await wait_for(client, session, ended(run))
    error = terminal(events, run)
    assert error["type"] == "run.error"
    assert error["code"] == "value_error"
    assert "the disk is gone" in error["message"]
    assert error["usage"]["requests"] == 1
    (finished,) = of_type(events, "tool.call.finished")
    assert (finished["outcome"], finished["code"]) == ("error", "tool_error")


# --- a client tool ----------------------------------------------------------------


async def test_a_client_tool_runs_on_the_executor_and_its_result_goes_to_the_model(
    narad_server: NaradServer, org: str, client: Client, no_refusals: None
) -> None:
    seen: list[str] = []

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Item]:
        returns = returns_of(messages[-1])
        if not returns:
            yield call("clock_now", '{"zone": "UTC"}', "call-clock")
        else:
            seen.append(str(returns[0].content))
            yield f"It is {returns[0].content}."

    agent = Agent(FunctionModel(stream_function=stream))

    @agent.tool_plain
    def clock_now(zone: str) -> str:
        """The time on the user's machine (run by the client)."""
        raise AssertionError("a client tool never runs in the agent")

    desk = f"desk-{uuid.uuid4().hex[:8]}"
    calls: list[dict[str, Any]] = []

    def now(args: dict[str, Any]) -> str:
        calls.append(args)
        return "12:00 " + str(args["zone"])

    token = narad_server.token("executor", org=org, sub="desk")
    async with Client(narad_server.base, token) as desk_client:
        executor = Executor(desk_client, desk, {"clock_now": now}, poll_wait=5)
        running = asyncio.create_task(executor.run())
        try:
            session, run = await start(
                client, "what time is it?", queue=QUEUE, client_executor_id=desk
            )
            async with serving(client, handler(agent, client_tools=["clock_now"]), queue=QUEUE):
                events = await wait_for(client, session, ended(run))
        finally:
            executor.stop()
            await asyncio.wait_for(running, 30)
    assert terminal(events, run)["type"] == "run.finished"
    assert calls == [{"zone": "UTC"}]
    (started,) = of_type(events, "tool.call.started")
    assert started["executor"] == "client"
    assert started["toolCallId"] == f"{run}.call-clock.client"
    assert seen == ["12:00 UTC"]
    assert transcript(events) == [("assistant", "It is 12:00 UTC.")]


# --- approvals --------------------------------------------------------------------


def approval_agent(ran: list[str]) -> Agent[None, str | DeferredToolRequests]:
    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Item]:
        returns = returns_of(messages[-1])
        if not returns:
            yield call("delete", '{"path": "/tmp/x"}', "call-delete")
        else:
            yield f"Done: {returns[0].content}"

    agent: Agent[None, str | DeferredToolRequests] = Agent(
        FunctionModel(stream_function=stream), output_type=[str, DeferredToolRequests]
    )

    @agent.tool_plain(requires_approval=True)
    def delete(path: str) -> str:
        ran.append(path)
        return f"deleted {path}"

    return agent


async def wait_interrupt(client: Client, session: str) -> Event:
    events = await wait_for(client, session, lambda es: bool(of_type(es, "run.paused")))
    (requested,) = of_type(events, "interrupt.requested")
    return requested


@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_a_tool_that_needs_approval_asks_and_runs_only_when_approved(
    client: Client, decision: str, no_refusals: None
) -> None:
    ran: list[str] = []
    agent = approval_agent(ran)
    session, run = await start(client, "delete /tmp/x", queue=QUEUE)
    # The runtime gives the run back while it waits; a later claim resumes it.
    async with serving(client, handler(agent), queue=QUEUE, release_when_waiting=True):
        requested = await wait_interrupt(client, session)
        assert requested["interruptId"] == f"{run}.call-delete.approval"
        assert requested["input"] == {"toolName": "delete", "args": {"path": "/tmp/x"}}
        assert ran == []
        await client.resolve_interrupt(
            session, interrupt_id=requested["interruptId"], decision=decision
        )
        events = await wait_for(client, session, ended(run))
    assert terminal(events, run)["type"] == "run.finished"
    assert len(of_type(events, "interrupt.requested")) == 1
    calls = of_type(events, "tool.call.started")
    # The framework's own flow, locally: deferred, then resumed with the decision.
    here = await local(agent, "delete /tmp/x")
    assert isinstance(here.output, DeferredToolRequests)
    answer: bool | ToolDenied = (
        True if decision == "approve" else ToolDenied("The tool call was denied (deny).")
    )
    resumed = await local(
        agent,
        message_history=here.all_messages(),
        deferred_tool_results=DeferredToolResults(approvals={"call-delete": answer}),
    )
    assert transcript(events) == produced(resumed.all_messages())
    if decision == "approve":
        assert ran == ["/tmp/x", "/tmp/x"]  # here and in the local run
        assert [c["toolCallId"] for c in calls] == [f"{run}.call-delete.tool"]
        assert transcript(events) == [("assistant", "Done: deleted /tmp/x")]
    else:
        assert ran == [] and calls == []
        assert transcript(events) == [("assistant", "Done: The tool call was denied (deny).")]


async def test_an_agent_delegated_to_from_a_tool_runs_in_a_nested_run(
    client: Client, no_refusals: None
) -> None:
    expert = Agent(
        scripted(
            ["Let me check. ", call("lookup", '{"code": "NRD"}', "call-lookup")],
            ["It means narad."],
        ),
        name="expert",
    )

    @expert.tool_plain
    def lookup(code: str) -> str:
        """Looks a code up."""
        return f"{code} = narad"

    agent = Agent(
        scripted(
            [call("ask_expert", '{"question": "NRD?"}', "call-ask")],
            ["The expert says: It means narad."],
        ),
        name="front",
    )

    @agent.tool
    async def ask_expert(ctx: RunContext[object], question: str) -> str:
        """Asks the expert."""
        return str(await delegate(expert, question, usage=ctx.usage))

    session, run = await start(client, "what is NRD?", queue=QUEUE)
    async with serving(client, handler(agent), queue=QUEUE):
        events = await wait_for(client, session, ended(run))
    child = f"{run}.delegate.call-ask.run"
    (nested,) = [e for e in of_type(events, "run.started") if e.get("parentRunId") == run]
    assert nested["runId"] == child
    assert nested["input"] == {"agent": "expert", "prompt": "NRD?"}
    calls = [(e["runId"], e["toolName"]) for e in of_type(events, "tool.call.started")]
    assert calls == [(run, "ask_expert"), (child, "lookup")]
    finished = {e["toolCallId"]: e["response"] for e in of_type(events, "tool.call.finished")}
    assert finished[f"{run}.call-ask.tool"] == "It means narad."
    assert said(events, child) == "Let me check. It means narad."
    # The expert's work is in its nested run, ended before the call that made it.
    order = [
        (e["type"], e["runId"])
        for e in events
        if e["type"] in ("run.finished", "tool.call.finished")
    ]
    assert order == [
        ("tool.call.finished", child),
        ("run.finished", child),
        ("tool.call.finished", run),
        ("run.finished", run),
    ]
    assert transcript(events) == [("assistant", "The expert says: It means narad.")]
    # The run's usage counts the expert's requests too (the caller's usage was shared).
    assert terminal(events, run)["usage"]["requests"] == 2 + 2


# --- stop and errors --------------------------------------------------------------


async def test_a_stop_mid_stream_cancels_the_agent_and_ends_the_run_cancelled(
    client: Client, no_refusals: None
) -> None:
    words = [f"word{i} " for i in range(200)]
    agent = Agent(scripted(words, delay=0.05))
    session, run = await start(client, "talk", queue=QUEUE)
    async with serving(client, handler(agent), queue=QUEUE):
        await wait_for(client, session, lambda es: bool(of_type(es, "message.text.delta")))
        await client.stop_run(session, run_id=run)
        events = await wait_for(client, session, ended(run))
    cancelled = terminal(events, run)
    assert (cancelled["type"], cancelled["code"]) == ("run.cancelled", "stopped")
    ((kind, text),) = transcript(events)
    assert kind == "assistant" and "".join(words).startswith(text) and len(text) < 600
    assert of_type(events, "message.text.completed")


async def test_a_model_error_and_a_usage_limit_end_the_run_failed_with_a_code(
    client: Client, no_refusals: None
) -> None:
    async def broken(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        yield "I was about to"
        raise ConnectionError("the model went away")

    looping = Agent(scripted([call("again", "{}", "c1")], [call("again", "{}", "c2")]))

    @looping.tool_plain
    def again() -> str:
        return "more"

    first, first_run = await start(client, "x", queue=QUEUE)
    async with serving(client, handler(Agent(FunctionModel(stream_function=broken))), queue=QUEUE):
        events = await wait_for(client, first, ended(first_run))
    error = terminal(events, first_run)
    assert (error["type"], error["code"]) == ("run.error", "connection_error")
    assert transcript(events) == [("assistant", "I was about to")]

    second, second_run = await start(client, "y", queue=QUEUE)
    limits = UsageLimits(request_limit=2)
    async with serving(client, handler(looping, usage_limits=limits), queue=QUEUE):
        events = await wait_for(client, second, ended(second_run))
    error = terminal(events, second_run)
    assert (error["type"], error["code"]) == ("run.error", "usage_limit_exceeded")
    assert error["usage"]["requests"] == 2
    assert len(of_type(events, "tool.call.finished")) == 2


# --- takeover ---------------------------------------------------------------------

#: The agent of the takeover test, in both holders: it calls ``record`` (which
#: appends a line to a file: the tool's side effect), then streams WORDS.
TAKEOVER_AGENT = textwrap.dedent(
    """
    import asyncio, os
    from pathlib import Path
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse
    from pydantic_ai.models.function import DeltaToolCall, FunctionModel
    from narad import Client, Runtime
    from narad.integrations.pydantic_ai import handler

    WORDS = [f"word{i} " for i in range(40)]

    def make(delay):
        async def stream(messages, info):
            if not any(isinstance(m, ModelResponse) for m in messages):
                yield {0: DeltaToolCall("record", '{"note": "once"}', tool_call_id="call-rec")}
                return
            for word in WORDS:
                await asyncio.sleep(delay)
                yield word

        agent = Agent(FunctionModel(stream_function=stream))

        @agent.tool_plain
        def record(note: str) -> str:
            with open(os.environ["SIDE_EFFECTS"], "a") as f:
                f.write(note + "\\n")
            return "recorded"

        return agent

    async def main():
        async with Client(os.environ["NARAD_URL"], os.environ["NARAD_TOKEN"]) as client:
            runtime = Runtime(client, handler(make(0.1)), queue="pydantic", claim_wait=1.0)
            await runtime.run()

    if __name__ == "__main__":
        asyncio.run(main())
    """
)


async def test_a_runtime_killed_mid_answer_is_taken_over_and_nothing_is_written_twice(
    short_server: NaradServer,
    short_client: Client,
    org: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_refusals: None,
) -> None:
    program = tmp_path / "takeover_agent.py"
    program.write_text(TAKEOVER_AGENT)
    side_effects = tmp_path / "side-effects"
    env = runtime_env(short_server, org, SIDE_EFFECTS=str(side_effects))
    client = short_client
    session, run = await start(client, "note it", queue=QUEUE)
    await spawn_and_kill_when(
        program, env, lambda: wait_for(client, session, lambda es: "word8 " in said(es))
    )
    documents = await client.request("GET", f"/v1/sessions/{session}/documents")
    scopes = [d["scope"] for d in documents["state"]]
    assert state_scope(run) in scopes

    monkeypatch.setenv("SIDE_EFFECTS", str(side_effects))
    sys.path.insert(0, str(tmp_path))
    try:
        import takeover_agent  # type: ignore[import-not-found]

        agent = takeover_agent.make(0.0)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("takeover_agent", None)
    async with serving(client, handler(agent), queue=QUEUE):
        events = await wait_for(client, session, ended(run), timeout=30)
    assert terminal(events, run)["type"] == "run.finished"
    assert side_effects.read_text() == "once\n", "the tool ran once"
    assert len(of_type(events, "tool.call.started")) == 1
    assert len(of_type(events, "tool.call.finished")) == 1
    assert len(of_type(events, "message.text.started")) == 1
    assert len(of_type(events, "message.text.completed")) == 1
    words = "".join(f"word{i} " for i in range(40))
    assert transcript(events) == [("assistant", words)]
    holders = {
        str(e["eventId"]).split("@")[1].split(".")[0]
        for e in of_type(events, "message.text.delta")
        if "@" in str(e["eventId"])
    }
    assert holders == {"1", "2"}, holders
    ids = [e["eventId"] for e in events]
    assert len(ids) == len(set(ids))


# --- the example ------------------------------------------------------------------


def test_the_example_answers_a_run_with_its_test_model(
    narad_server: NaradServer, org: str, tmp_path: Path
) -> None:
    env = runtime_env(narad_server, org)
    output = tmp_path / "example.out"
    with open(output, "wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "examples" / "pydantic_ai_agent.py"),
                "--queue",
                "pydantic-example",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:

        async def drive() -> list[Event]:
            async with Client(narad_server.base, narad_server.token(ROLES, org=org)) as client:
                session, run = await start(
                    client, "What is the weather in Paris?", queue="pydantic-example"
                )
                events = await wait_for(client, session, ended(run))
                assert terminal(events, run)["type"] == "run.finished", output.read_text()
                return events

        events = asyncio.run(drive())
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert of_type(events, "tool.call.finished")[0]["outcome"] == "success"
    ((kind, text),) = transcript(events)
    assert kind == "assistant" and text


# --- external tools, structured output, an unreadable state -----------------------


@dataclass
class Forecast:
    city: str
    sky: str


async def test_an_external_tool_runs_on_the_executor_and_a_structured_output_is_said(
    narad_server: NaradServer, org: str, client: Client, no_refusals: None
) -> None:
    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Item]:
        returns = returns_of(messages[-1])
        if not returns:
            yield call("lookup", '{"city": "Paris"}', "call-ext")
        else:
            sky = str(returns[0].content)
            yield call(info.output_tools[0].name, f'{{"city": "Paris", "sky": "{sky}"}}', "out")

    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    agent: Agent[None, Forecast] = Agent(
        FunctionModel(stream_function=stream),
        output_type=Forecast,
        toolsets=[ExternalToolset([ToolDefinition(name="lookup", parameters_json_schema=schema)])],
    )
    desk = f"desk-{uuid.uuid4().hex[:8]}"
    token = narad_server.token("executor", org=org, sub="desk")
    async with Client(narad_server.base, token) as desk_client:
        executor = Executor(desk_client, desk, {"lookup": lambda args: "sunny"}, poll_wait=5)
        running = asyncio.create_task(executor.run())
        try:
            session, run = await start(client, "forecast", queue=QUEUE, client_executor_id=desk)
            async with serving(client, handler(agent), queue=QUEUE):
                events = await wait_for(client, session, ended(run))
        finally:
            executor.stop()
            await asyncio.wait_for(running, 30)
    assert terminal(events, run)["type"] == "run.finished"
    (started,) = of_type(events, "tool.call.started")
    assert (started["toolCallId"], started["executor"]) == (f"{run}.call-ext.client", "client")
    assert transcript(events) == [("assistant", '{"city": "Paris", "sky": "sunny"}')]


async def test_a_state_document_that_cannot_be_read_back_ends_the_run_no_resumable_state(
    client: Client, no_refusals: None
) -> None:
    session = f"s-{uuid.uuid4().hex[:10]}"
    run = f"r-{uuid.uuid4().hex[:10]}"
    await client.create_session(session)
    bogus = {
        "protocolVersion": "narad/v1",
        "type": "state.snapshot",
        "eventId": f"{session}-bogus",
        "scope": state_scope(run),
        "revision": 1,
        "state": {"messages": "not a history"},
    }
    await client.append(session, [bogus])
    await client.start_run(
        session, run_id=run, input={"prompt": "hi"}, runtime=RuntimeOptions(queue=QUEUE)
    )
    async with serving(client, handler(Agent(scripted(["never said"]))), queue=QUEUE):
        events = await wait_for(client, session, ended(run))
    error = terminal(events, run)
    assert (error["type"], error["code"]) == ("run.error", "no_resumable_state")
    assert transcript(events) == []
