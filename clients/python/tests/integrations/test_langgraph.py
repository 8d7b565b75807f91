"""``narad.integrations.langgraph`` against a real ``narad serve``, driven by
langchain-core's fake chat model (streamed word by word, with tool calls and
``usage_metadata``): a streamed answer, backend tools (a result and an
error), a client tool run by an executor, ``interrupt()`` approved and
denied, a stop mid-stream, a graph error, and a runtime killed with SIGKILL
mid-run whose run another runtime resumes from the graph's checkpoint, kept in
the run's journal by ``NaradSaver`` (which also carries interrupts and client
tools across a release, and whose bytes per superstep are measured).
Each run's journal goes through the SDK's reducer, and its transcript is
what the graph produced."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import signal
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, NaradServer
from helpers import runtime_env, spawn_and_kill_when
from helpers import said as streamed
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.pregel import Pregel
from langgraph.types import interrupt
from pydantic import BaseModel
from test_runtime import (
    executor_api,
    finish_call,
    has,
    kill,
    of_type,
    serving,
    start,
    types,
    wait_history,
)

from narad import Client, Event, Runtime, SessionReducer
from narad.integrations.langgraph import NaradSaver, NotInARun, client_tool, handler
from narad.integrations.langgraph_checkpoint import BLOBS, CHECKPOINT, WRITES

# --- the model and the graphs ----------------------------------------------


class Scripted(GenericFakeChatModel):
    """A fake chat model that answers ``script[n]`` to a conversation holding n
    answers already (so a graph resumed in another process answers the same),
    streamed word by word (``delay`` apart), then its tool calls and usage."""

    script: list[AIMessage]
    delay: float = 0.0
    messages: Iterator[AIMessage | str] = iter(())

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        answered = sum(1 for m in messages if isinstance(m, AIMessage))
        reply = self.script[answered]
        if reply.content == "RAISE":
            raise ValueError("the model is down")
        thought = reply.additional_kwargs.get("reasoning_content")
        if thought:
            first = AIMessageChunk(content="", additional_kwargs={"reasoning_content": thought})
            yield ChatGenerationChunk(message=first)
        words = [w for w in re.split(r"(\s)", str(reply.content)) if w]
        for word in words:
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word))
            if run_manager:
                await run_manager.on_llm_new_token(word, chunk=chunk)
            yield chunk
            if self.delay:
                await asyncio.sleep(self.delay)
        last = AIMessageChunk(
            content="",
            chunk_position="last",
            tool_call_chunks=[
                {
                    "type": "tool_call_chunk",
                    "name": c["name"],
                    "args": json.dumps(c["args"]),
                    "id": c["id"],
                    "index": i,
                }
                for i, c in enumerate(reply.tool_calls)
            ],
            usage_metadata=reply.usage_metadata,
        )
        chunk = ChatGenerationChunk(message=last)
        if run_manager:
            await run_manager.on_llm_new_token("", chunk=chunk)
        yield chunk


def said(text: str, *calls: tuple[str, str, dict[str, Any]], tokens: int = 10) -> AIMessage:
    """A scripted answer: its text, tool calls (id, name, args) and usage."""
    return AIMessage(
        content=text,
        tool_calls=[{"id": i, "name": n, "args": a} for i, n, a in calls],
        usage_metadata={"input_tokens": tokens, "output_tokens": 2, "total_tokens": tokens + 2},
    )


class State(MessagesState):
    turns: int
    verdict: str


@tool
def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


@tool
def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"exploded: {reason}")


class DeleteArgs(BaseModel):
    path: str


def build(
    script: Sequence[AIMessage],
    tools: Sequence[Any] = (),
    *,
    delay: float = 0.0,
    review: bool = False,
    handle_tool_errors: bool = True,
    checkpointer: Any = None,
) -> Pregel[Any, Any, Any, Any]:
    """agent ⇄ tools, then (``review``) a node that asks a person with ``interrupt()``."""
    model = Scripted(script=list(script), delay=delay)

    async def agent(state: State) -> dict[str, Any]:
        reply = await model.ainvoke(state["messages"])
        return {"messages": [reply], "turns": state.get("turns", 0) + 1}

    def ask(state: State) -> dict[str, Any]:
        decision = interrupt({"message": "Publish the answer?", "actions": ["approve", "deny"]})
        return {"verdict": decision}

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    after = "review" if review else END
    if review:
        graph.add_node("review", ask)
        graph.add_edge("review", END)
    if tools:
        graph.add_node("tools", ToolNode(list(tools), handle_tool_errors=handle_tool_errors))
        graph.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: after})
        graph.add_edge("tools", "agent")
    else:
        graph.add_edge("agent", after)
    graph.add_edge(START, "agent")
    return graph.compile(checkpointer=checkpointer or InMemorySaver())


# --- checks -----------------------------------------------------------------


def transcript(events: list[Event], item: str = "message") -> list[str]:
    """The assistant messages (or reasoning) of the reduced journal, every event accepted."""
    reducer = SessionReducer()
    for event in events:
        assert reducer.deliver(event) in ("applied", "recorded"), event
    got = reducer.transcript()
    if item == "reasoning":
        return [str(i["text"]) for i in got if i["item"] == "reasoning" and i["completed"]]
    return [str(i["content"]) for i in got if i["item"] == "message" and i["role"] == "assistant"]


async def state_of(
    graph: Pregel[Any, Any, Any, Any], run: str, events: list[Event] | None = None
) -> Any:
    """The graph state of the run's thread (a ``NaradSaver``'s: read from ``events``)."""
    if isinstance(graph.checkpointer, NaradSaver):
        assert events is not None, "a NaradSaver's checkpoints are in the run's journal"
        graph = graph.copy(update={"checkpointer": NaradSaver(journal=events)})
    return await graph.aget_state({"configurable": {"thread_id": run}})


async def produced(
    graph: Pregel[Any, Any, Any, Any], run: str, events: list[Event] | None = None
) -> list[str]:
    """The graph's own AI message texts of the run's thread."""
    state = await state_of(graph, run, events)
    return [
        str(m.content)
        for m in state.values.get("messages", ())
        if isinstance(m, AIMessage) and m.content
    ]


def checkpoints(events: list[Event], *names: str) -> list[Event]:
    """The ``NaradSaver`` events of the journal (of ``names``, or all)."""
    return [
        e
        for e in of_type(events, "run.custom")
        if str(e["name"]).startswith("langgraph.") and (not names or e["name"] in names)
    ]


def one_each(events: list[Event]) -> None:
    """No event was journaled twice (the same id or the same step)."""
    ids = [str(e["eventId"]) for e in events]
    assert len(ids) == len(set(ids))
    for kind, field in (
        ("tool.call.started", "toolCallId"),
        ("tool.call.finished", "toolCallId"),
        ("message.text.started", "messageId"),
        ("message.text.completed", "messageId"),
        ("interrupt.requested", "interruptId"),
    ):
        keys = [e[field] for e in of_type(events, kind)]
        assert len(keys) == len(set(keys)), (kind, keys)


# --- tests ------------------------------------------------------------------


async def test_a_streamed_answer_with_progress_state_and_usage(client: Client) -> None:
    answer = said("Hello there, how are you?", tokens=7)
    answer.additional_kwargs["reasoning_content"] = "They greeted me."
    graph = build([answer], delay=0.01)
    async with serving(client, handler(graph)):
        session, run = await start(client, prompt="hi")
        events = await wait_history(client, session, has("run.finished", runId=run))
    assert transcript(events) == await produced(graph, run) == ["Hello there, how are you?"]
    assert transcript(events, "reasoning") == ["They greeted me."]
    assert types(events).index("reasoning.completed") < types(events).index("message.text.started")
    assert len(of_type(events, "message.text.delta")) >= 1
    finished = of_type(events, "run.finished")[0]
    assert finished["usage"] == {"inputTokens": 7, "outputTokens": 2, "totalTokens": 9}
    progress = [(p["label"], p["status"]) for p in of_type(events, "progress.recorded")]
    assert progress == [("agent", "active"), ("agent", "completed")]
    snapshot = of_type(events, "state.snapshot")[0]
    assert "messages" not in snapshot["state"]
    deltas = of_type(events, "state.delta")
    assert {"op": "add", "path": "/turns", "value": 1} in [op for d in deltas for op in d["patch"]]
    one_each(events)


async def test_backend_tools_a_result_and_an_error(client: Client) -> None:
    graph = build(
        [
            said("Let me add.", ("call_add", "add", {"a": 2, "b": 3})),
            said("Now this.", ("call_boom", "explode", {"reason": "test"})),
            said("The sum is 5."),
        ],
        [add, explode],
    )
    async with serving(client, handler(graph)):
        session, run = await start(client, prompt="add 2 and 3")
        events = await wait_history(client, session, has("run.finished", runId=run))
    started = of_type(events, "tool.call.started")
    assert [(s["toolCallId"], s["toolName"], s["args"]) for s in started] == [
        (f"{run}.call_add.tool", "add", {"a": 2, "b": 3}),
        (f"{run}.call_boom.tool", "explode", {"reason": "test"}),
    ]
    finished = of_type(events, "tool.call.finished")
    assert (finished[0]["outcome"], finished[0]["response"]) == ("success", "5")
    assert (finished[1]["outcome"], finished[1]["code"]) == ("error", "tool_error")
    assert "exploded: test" in finished[1]["message"]
    assert transcript(events) == await produced(graph, run)
    assert transcript(events) == ["Let me add.", "Now this.", "The sum is 5."]
    assert of_type(events, "run.finished")[0]["usage"]["inputTokens"] == 30
    one_each(events)


async def test_a_tool_error_the_graph_does_not_handle_fails_the_run(client: Client) -> None:
    graph = build(
        [said("Trying.", ("call_boom", "explode", {"reason": "x"}))],
        [explode],
        handle_tool_errors=False,
    )
    async with serving(client, handler(graph)):
        session, run = await start(client)
        events = await wait_history(client, session, has("run.error", runId=run))
    error = of_type(events, "run.error")[0]
    assert error["code"] == "tool_error" and "exploded: x" in error["message"]
    assert error["usage"]["inputTokens"] == 10
    assert of_type(events, "tool.call.finished")[0]["outcome"] == "error"
    transcript(events)


async def test_a_graph_error_fails_the_run_with_partial_usage(client: Client) -> None:
    graph = build([said("Adding.", ("c1", "add", {"a": 1, "b": 1})), AIMessage("RAISE")], [add])
    async with serving(client, handler(graph)):
        session, run = await start(client)
        events = await wait_history(client, session, has("run.error", runId=run))
    error = of_type(events, "run.error")[0]
    assert error["code"] == "graph_error" and error["message"] == "the model is down"
    assert error["usage"] == {"inputTokens": 10, "outputTokens": 2, "totalTokens": 12}
    assert [(p["label"], p["status"]) for p in of_type(events, "progress.recorded")][-1] == (
        "agent",
        "failed",
    )
    assert transcript(events) == ["Adding."]


@pytest.mark.parametrize(
    ("release", "saver"), [(False, InMemorySaver), (True, InMemorySaver), (True, NaradSaver)]
)
async def test_a_client_tool_runs_on_the_executor(
    narad_server: NaradServer, client: Client, org: str, release: bool, saver: Callable[[], Any]
) -> None:
    desk = f"desk-{uuid.uuid4().hex[:6]}"
    executor, lease, controls = await executor_api(narad_server, org, desk)
    delete = client_tool("fs.delete", "Deletes a file on the user's machine.", DeleteArgs)
    graph = build(
        [said("Deleting.", ("call_del", "fs.delete", {"path": "/tmp/x"})), said("Done: gone.")],
        [delete],
        checkpointer=saver(),
    )
    agent = handler(graph, client_tools=("fs.delete",))
    async with executor, serving(client, agent, release_when_waiting=release):
        session, run = await start(client, client_executor_id=desk)
        calls: list[dict[str, Any]] = []
        while not calls:
            calls = await controls()
        assert (calls[0]["toolName"], calls[0]["args"]) == ("fs.delete", {"path": "/tmp/x"})
        await finish_call(executor, desk, lease, calls[0], "success", {"deleted": True})
        events = await wait_history(client, session, has("run.finished", runId=run))
    started = of_type(events, "tool.call.started")[0]
    assert (started["toolCallId"], started["executor"]) == (f"{run}.call_del.client", "client")
    state = await state_of(graph, run, events)
    answers = [m for m in state.values["messages"] if m.type == "tool"]
    assert [json.loads(str(m.content)) for m in answers] == [{"deleted": True}]
    assert transcript(events) == await produced(graph, run, events) == ["Deleting.", "Done: gone."]


@pytest.mark.parametrize(
    ("decision", "release", "saver"),
    [
        ("approve", False, InMemorySaver),
        ("deny", False, InMemorySaver),
        ("approve", True, InMemorySaver),
        ("approve", True, NaradSaver),
        ("deny", True, NaradSaver),
    ],
)
async def test_interrupt_is_an_approval_and_its_decision_resumes_the_graph(
    client: Client, decision: str, release: bool, saver: Callable[[], Any]
) -> None:
    graph = build([said("Here is the draft.")], review=True, checkpointer=saver())
    async with serving(client, handler(graph), release_when_waiting=release):
        session, run = await start(client)
        events = await wait_history(client, session, has("run.paused", runId=run))
        requested = of_type(events, "interrupt.requested")[0]
        assert requested["message"] == "Publish the answer?"
        assert requested["actions"] == ["approve", "deny"]
        await client.resolve_interrupt(
            session, interrupt_id=requested["interruptId"], decision=decision
        )
        events = await wait_history(client, session, has("run.finished", runId=run))
    state = await state_of(graph, run, events)
    assert state.values["verdict"] == decision
    assert ["interrupt.resolved", "run.resumed"] == [
        e["type"] for e in events if e["type"] in ("interrupt.resolved", "run.resumed")
    ]
    review = [p["status"] for p in of_type(events, "progress.recorded") if p["label"] == "review"]
    assert review == ["active", "completed"]
    assert transcript(events) == await produced(graph, run, events)
    one_each(events)
    if saver is NaradSaver:
        # Given back while a person decided: the next lease resumed from the journal.
        leases = {str(e["eventId"]).split("@")[1].split(".")[1] for e in checkpoints(events)}
        assert len(leases) == 2, leases
        assert not state.next and state.tasks == ()


async def test_a_stop_mid_stream_cancels_the_graph_with_partial_usage(client: Client) -> None:
    words = " ".join(f"w{i}" for i in range(200))
    graph = build(
        [said("Adding.", ("c1", "add", {"a": 1, "b": 1})), said(words)], [add], delay=0.02
    )
    async with serving(client, handler(graph)):
        session, run = await start(client)
        await wait_history(
            client, session, lambda ev: len(of_type(ev, "message.text.started")) == 2
        )
        await client.stop_run(session, run_id=run)
        events = await wait_history(client, session, has("run.cancelled", runId=run))
    cancelled = of_type(events, "run.cancelled")[0]
    assert cancelled["code"] == "stopped"
    assert cancelled["usage"] == {"inputTokens": 10, "outputTokens": 2, "totalTokens": 12}
    texts = transcript(events)
    assert texts[0] == "Adding." and words.startswith(texts[1]) and texts[1] != words
    assert len(of_type(events, "message.text.completed")) == 2


# --- takeover -----------------------------------------------------------------


HERE = Path(__file__).resolve().parent

LONG = " ".join(f"word{i}" for i in range(60))

#: The graph both runtimes run: a tool call, then a long answer.
TAKEOVER_SCRIPT = [
    said("Adding first.", ("call_t1", "add", {"a": 20, "b": 22})),
    said(LONG),
]

AGENT = textwrap.dedent(
    """
    import asyncio, os, sys
    sys.path[:0] = [os.environ["TESTS"], os.environ["INTEGRATION_TESTS"]]
    from narad import Client, Runtime
    from narad.integrations.langgraph import handler
    from narad.integrations.langgraph import NaradSaver
    from test_langgraph import TAKEOVER_SCRIPT, add, build

    async def main():
        graph = build(TAKEOVER_SCRIPT, [add], delay=0.1, checkpointer=NaradSaver())
        async with Client(os.environ["NARAD_URL"], os.environ["NARAD_TOKEN"]) as client:
            await Runtime(client, handler(graph), queue="lg-takeover", claim_wait=1.0).run()

    asyncio.run(main())
    """
)


async def test_a_runtime_killed_mid_run_is_resumed_from_the_checkpoint_in_narad(
    short_server: NaradServer, short_client: Client, org: str, tmp_path: Path
) -> None:
    """The graph's checkpointer is a ``NaradSaver``: nothing but the run's journal
    carries the checkpoint from the killed process to the next holder."""
    program = tmp_path / "agent.py"
    program.write_text(AGENT)
    env = runtime_env(short_server, org, TESTS=str(HERE.parent), INTEGRATION_TESTS=str(HERE))
    client = short_client
    session, run = await start(client, "add", queue="lg-takeover")
    await spawn_and_kill_when(
        program,
        env,
        lambda: wait_history(client, session, lambda ev: "word10" in streamed(ev), timeout=30),
    )
    graph = build(TAKEOVER_SCRIPT, [add], checkpointer=NaradSaver())
    async with serving(client, handler(graph), queue="lg-takeover"):
        events = await wait_history(client, session, has("run.finished", runId=run), timeout=30)
    one_each(events)
    assert len(of_type(events, "tool.call.started")) == 1
    assert of_type(events, "tool.call.finished")[0]["response"] == "42"
    assert transcript(events) == await produced(graph, run, events) == ["Adding first.", LONG]
    assert streamed(events).count("word59") == 1
    holders = {str(e["eventId"]).split("@")[1].split(".")[0] for e in events if "@" in e["eventId"]}
    assert holders == {"1", "2"}, holders
    assert of_type(events, "run.finished")[0]["usage"]["inputTokens"] == 20
    # The checkpoints: the first holder's up to the tool's result, then the second
    # holder's from there; no step checkpointed twice, no task's write written twice.
    saved = [t async for t in NaradSaver(journal=events).alist(None)][::-1]
    steps = [t.metadata["step"] for t in saved]
    assert steps == list(range(-1, len(steps) - 1)), steps
    by = {e["value"]["id"]: e["eventId"].split("@")[1][0] for e in checkpoints(events, CHECKPOINT)}
    holder = [by[t.config["configurable"]["checkpoint_id"]] for t in saved]
    assert holder[:4] == ["1"] * 4 and holder[-1] == "2", holder
    written = [
        (e["value"]["checkpoint"], e["value"]["task"], w[0])
        for e in checkpoints(events, WRITES)
        for w in e["value"]["writes"]
    ]
    assert len(written) == len(set(written))


async def test_the_example_answers_a_run_with_the_fake_model(
    narad_server: NaradServer, client: Client, tmp_path: Path, org: str
) -> None:
    env = runtime_env(narad_server, org)
    example = str(REPO / "examples" / "langgraph_agent.py")
    process = await asyncio.create_subprocess_exec(
        sys.executable, example, "--queue", "lg-example", env=env, stdout=asyncio.subprocess.DEVNULL
    )
    try:
        session, run = await start(client, queue="lg-example")
        events = await wait_history(client, session, has("run.finished", runId=run), timeout=30)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=15)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
    finished = of_type(events, "tool.call.finished")
    assert [(f["outcome"], f["response"]) for f in finished] == [
        ("success", "Sunny in Paris, 21 °C")
    ]
    assert transcript(events) == ["Sunny in Paris."]


@tool
def publish(title: str) -> str:
    """Publishes a post once a person approves."""
    if interrupt({"message": f"Publish {title}?"}) != "approve":
        return "not published"
    return f"published {title}"


@pytest.mark.parametrize("saver", [InMemorySaver, NaradSaver])
async def test_an_interrupt_inside_a_tool_runs_the_tool_after_the_decision(
    client: Client, saver: Callable[[], Any]
) -> None:
    graph = build(
        [said("Publishing.", ("call_pub", "publish", {"title": "news"})), said("Done.")],
        [publish],
        checkpointer=saver(),
    )
    async with serving(client, handler(graph), release_when_waiting=saver is NaradSaver):
        session, run = await start(client)
        events = await wait_history(client, session, has("run.paused", runId=run))
        requested = of_type(events, "interrupt.requested")[0]
        assert requested["message"] == "Publish news?"
        await client.resolve_interrupt(
            session, interrupt_id=requested["interruptId"], decision="approve"
        )
        events = await wait_history(client, session, has("run.finished", runId=run))
    calls = [
        (e["toolCallId"], e.get("outcome"), e.get("code"))
        for e in events
        if e["type"] == "tool.call.finished"
    ]
    assert calls == [
        (f"{run}.call_pub.tool", "cancelled", "interrupted"),
        (f"{run}.call_pub.tool.2", "success", None),
    ]
    finished = [f for f in of_type(events, "tool.call.finished") if f["outcome"] == "success"]
    assert [f["response"] for f in finished] == ["published news"]
    assert transcript(events) == await produced(graph, run, events) == ["Publishing.", "Done."]


def with_subgraph(sub: Pregel[Any, Any, Any, Any], checkpointer: Any) -> Pregel[Any, Any, Any, Any]:
    """A top graph whose one node, ``research``, runs ``sub`` as a subgraph."""
    builder = StateGraph(State)
    builder.add_node("research", sub.copy(update={"checkpointer": None}))
    builder.add_edge(START, "research")
    builder.add_edge("research", END)
    return builder.compile(checkpointer=checkpointer)


@pytest.mark.parametrize("messages", ["top", "nested"])
async def test_a_subgraph_runs_in_a_nested_run_ended_with_its_node(
    client: Client, messages: str
) -> None:
    sub = build([said("Looking.", ("c_add", "add", {"a": 1, "b": 2})), said("It is 3.")], [add])
    graph = with_subgraph(sub, InMemorySaver())
    async with serving(client, handler(graph, subgraph_messages=messages)):  # type: ignore[arg-type]
        session, run = await start(client)
        events = await wait_history(client, session, has("run.finished", runId=run))
    (nested,) = [e for e in of_type(events, "run.started") if e.get("parentRunId") == run]
    child = nested["runId"]
    assert nested["input"] == {"subgraph": "research"}
    assert child.startswith(f"{run}.subgraph.") and child.endswith(".run")
    (call,) = of_type(events, "tool.call.finished")
    assert (call["runId"], call["response"]) == (child, "3")  # a ToolMessage's content
    # The subgraph's node steps are the nested run's; the top graph's node is the run's.
    steps = {(e["runId"], e["label"]) for e in of_type(events, "progress.recorded")}
    assert steps == {(run, "research"), (child, "agent"), (child, "tools")}
    speaker = run if messages == "top" else child
    assert streamed(events, speaker) == "Looking.It is 3."
    # The nested run ends when its node does, before the node's step completes.
    order = [
        (e["type"], e["runId"], e.get("status"))
        for e in events
        if e["type"] == "run.finished" or (e["type"] == "progress.recorded" and e["runId"] == run)
    ]
    assert order == [
        ("progress.recorded", run, "active"),
        ("run.finished", child, None),
        ("progress.recorded", run, "completed"),
        ("run.finished", run, None),
    ]
    assert of_type(events, "run.finished")[-1]["usage"]["inputTokens"] == 20
    one_each(events)
    if messages == "top":
        assert transcript(events) == ["Looking.", "It is 3."]


@pytest.mark.parametrize("saver", [InMemorySaver, NaradSaver])
async def test_an_interrupt_in_a_subgraph_is_asked_in_its_nested_run(
    client: Client, saver: Callable[[], Any]
) -> None:
    sub = build([said("Here is the draft.")], review=True)
    graph = with_subgraph(sub, saver())
    release = saver is NaradSaver  # a second holder finds where the interrupt was raised
    async with serving(client, handler(graph), release_when_waiting=release):
        session, run = await start(client)
        events = await wait_history(client, session, has("run.paused"))
        (nested,) = [e for e in of_type(events, "run.started") if e.get("parentRunId") == run]
        (asked,) = of_type(events, "interrupt.requested")
        assert asked["runId"] == nested["runId"]
        assert asked["message"] == "Publish the answer?"
        await client.resolve_interrupt(
            session, interrupt_id=asked["interruptId"], decision="approve"
        )
        events = await wait_history(client, session, has("run.finished", runId=run))
    child = nested["runId"]
    assert [e["runId"] for e in of_type(events, "run.started")] == [run, child]
    assert [e["runId"] for e in of_type(events, "run.finished")] == [child, run]
    assert [e["runId"] for e in of_type(events, "run.resumed")] == [child]
    one_each(events)
    assert transcript(events) == ["Here is the draft."]
    assert (await state_of(graph, run, events)).values["verdict"] == "approve"


async def test_a_takeover_without_a_checkpoint_fails_the_run_cleanly(short_client: Client) -> None:
    words = " ".join(f"w{i}" for i in range(100))
    model = Scripted(script=[said(words)], delay=0.05)

    async def agent(state: State) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(State)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    graph = builder.compile()  # no checkpointer
    first = Runtime(short_client, handler(graph), queue="default", claim_wait=1.0)
    task = asyncio.create_task(first.run())
    session, run = await start(short_client)
    await wait_history(short_client, session, lambda ev: len(of_type(ev, "message.text.delta")) > 2)
    await kill(task)  # the runtime is lost: nothing released
    async with serving(short_client, handler(graph)):
        events = await wait_history(short_client, session, has("run.error", runId=run))
    error = of_type(events, "run.error")[0]
    assert error["code"] == "no_checkpoint"
    assert len(of_type(events, "message.text.started")) == 1
    transcript(events)


# --- NaradSaver -----------------------------------------------------------------


async def test_narad_saver_outside_a_narad_run_says_so() -> None:
    graph = build([said("Hello.")], checkpointer=NaradSaver())
    config: Any = {"configurable": {"thread_id": "t-1"}}
    with pytest.raises(NotInARun, match="only inside a claimed narad run"):
        await graph.ainvoke({"messages": [("user", "hi")]}, config)
    with pytest.raises(NotInARun, match="only inside a claimed narad run"):
        await graph.aget_state(config)


@pytest.mark.parametrize("split", [False, True])
async def test_narad_saver_keeps_the_checkpoints_in_the_run_journal(
    client: Client, split: bool
) -> None:
    """``split``: events above ``max_event_bytes`` put their values in events of their own."""
    saver = NaradSaver(max_event_bytes=700) if split else NaradSaver()
    graph = build(
        [said("Let me add.", ("call_add", "add", {"a": 2, "b": 3})), said("The sum is 5.")],
        [add],
        checkpointer=saver,
    )
    async with serving(client, handler(graph)):
        session, run = await start(client, prompt="add 2 and 3")
        events = await wait_history(client, session, has("run.finished", runId=run))
    assert transcript(events) == await produced(graph, run, events)
    assert transcript(events) == ["Let me add.", "The sum is 5."]
    saved = checkpoints(events)
    assert {e["name"] for e in saved} == (
        {CHECKPOINT, WRITES, BLOBS} if split else {CHECKPOINT, WRITES}
    )
    assert all(e["runId"] == run for e in saved)
    assert types(events).index("run.custom") < types(events).index("message.text.started")
    # The whole history of the thread, each checkpoint's parent the one before it.
    history = [
        t async for t in NaradSaver(journal=events).alist({"configurable": {"thread_id": run}})
    ]
    assert [t.metadata["step"] for t in history] == [3, 2, 1, 0, -1]
    for child, parent in itertools.pairwise(history):
        assert child.parent_config == parent.config
    messages = history[0].checkpoint["channel_values"]["messages"]
    assert [m.type for m in messages] == ["human", "ai", "tool", "ai"]
    assert messages[2].content == "5"


async def test_narad_saver_writes_per_superstep_what_changed(client: Client) -> None:
    """A 20-turn conversation (19 tool calls, then the answer): the bytes each
    superstep writes to the journal stay flat while the conversation grows."""
    turns = 20
    script = [
        said(
            f"Turn {n}: let me add {n} and {n} to check the running total.",
            (f"c{n}", "add", {"a": n, "b": n}),
        )
        for n in range(1, turns)
    ]
    script.append(said("All twenty turns are done; the totals are above."))
    graph = build(script, [add], checkpointer=NaradSaver())
    async with serving(client, handler(graph, config={"recursion_limit": 100})):
        session, run = await start(client, prompt="count with me")
        events = await wait_history(client, session, has("run.finished", runId=run))
    assert len(transcript(events)) == turns
    # Bytes each superstep appended (the events as journaled), by checkpoint step.
    per_step: list[tuple[int, int]] = []
    pending = 0
    reader = NaradSaver(journal=events)
    for event in checkpoints(events):
        pending += len(json.dumps(event, separators=(",", ":")))
        if event["name"] == CHECKPOINT:
            config: Any = {
                "configurable": {"thread_id": run, "checkpoint_id": event["value"]["id"]}
            }
            found = reader.get_tuple(config)
            assert found is not None
            per_step.append((found.metadata["step"], pending))
            pending = 0
    # What the same supersteps would write with whole channel values (InMemorySaver's blobs).
    serde = NaradSaver().serde
    whole = [
        len(base64.b64encode(serde.dumps_typed(t.checkpoint["channel_values"].get("messages"))[1]))
        async for t in reader.alist({"configurable": {"thread_id": run}})
    ][::-1]
    print("\nstep  bytes  whole-messages-b64")
    for (step, size), full in zip(per_step, whole, strict=True):
        print(f"{step:4}  {size:5}  {full:6}")
    total = sum(size for _, size in per_step)
    print(f"supersteps {len(per_step)}: {total} bytes; messages as one blob: {sum(whole)}")
    sizes = [size for step, size in per_step if step >= 1]
    assert len(sizes) == 2 * turns - 1
    assert max(sizes[-4:]) < 1.2 * max(sizes[:4]), sizes
    assert max(sizes) < 4000, sizes
    assert whole[-1] > 5 * max(sizes), (whole, sizes)
    assert total < sum(whole) / 2
