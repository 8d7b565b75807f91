"""``client.runs`` against a real server: a run's stream ends at its terminal,
holds its own frames and its nested runs' (no one else's), each once, across
cut connections; ``wait`` and ``join`` answer the result, for a run going, over
or queued."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from conftest import NaradServer
from helpers import FaultProxy

from narad import Client, Frame, NotFoundError, RunContext, Runtime
from narad.typed import TextDelta

WAIT = 60.0


def name(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def echo(ctx: RunContext) -> None:
    """Says back what the person said, word by word."""
    given = ctx.input if isinstance(ctx.input, dict) else {}
    words = f"You said: {given.get('content', given.get('prompt', ''))}".split(" ")
    for n, word in enumerate(words):
        await ctx.say(word if n == 0 else f" {word}")
        await asyncio.sleep(0.02)
    await ctx.finish()


@pytest.fixture
async def agent(narad_server: NaradServer, org: str) -> AsyncIterator[str]:
    """A runtime serving queue ``agents`` of the test's tenant with :func:`echo`."""
    async with Client(narad_server.base, narad_server.token(org=org, sub="agent")) as client:
        runtime = Runtime(client, echo, queue="agents", claim_wait=1.0, delta_window=0.01)
        serving = asyncio.create_task(runtime.run())
        yield "agents"
        runtime.stop()
        await asyncio.wait_for(serving, 30)


@pytest.fixture
async def client(narad_server: NaradServer, org: str) -> AsyncIterator[Client]:
    async with Client(narad_server.base, narad_server.token(org=org)) as c:
        yield c


def run_events(run_id: str, *types: str, parent: str | None = None) -> list[dict[str, Any]]:
    """Events of a backend-driven run (``run.started`` comes from ``start-run``)."""
    events: list[dict[str, Any]] = []
    for n, kind in enumerate(types):
        event: dict[str, Any] = {
            "protocolVersion": "narad/v1",
            "type": kind,
            "eventId": f"{run_id}-{n}-{uuid.uuid4().hex[:6]}",
            "rootRunId": parent or run_id,
            "runId": run_id,
        }
        if kind.startswith("message.text."):
            event["messageId"] = f"{run_id}-m"
        if kind == "message.text.started":
            event |= {"role": "assistant", "messageScope": "run"}
        if kind == "message.text.delta":
            event["delta"] = f"text of {run_id}"
        if kind == "run.error":
            event |= {"code": "boom", "message": "it broke"}
        events.append(event)
    return events


async def test_a_run_stream_ends_at_its_terminal_with_its_own_frames(
    client: Client, agent: str
) -> None:
    session_id = name()
    await client.create_session(session_id)
    frames: list[Frame] = []
    stream = client.runs.stream(session_id, message="hello there", queue=agent)
    run_id = stream.run_id  # known before anything was sent
    async with stream:
        async for frame in stream:
            frames.append(frame)
            if frame.kind == "authority" and frame.data["type"] == "run.started":
                # Something of the session's own, not of the run: never yielded.
                await client.record_user_message(session_id, "meanwhile")
    assert stream.started is not None and stream.started.run_id == run_id
    types = [f.data["type"] for f in frames]
    assert types[0] == "run.started" and types[-1] == "run.finished", types
    assert all(f.kind == "authority" and f.data["runId"] == run_id for f in frames)
    sequences = [f.data["sessionSequence"] for f in frames]
    assert sequences == sorted(set(sequences))
    deltas = [f.event for f in frames if isinstance(f.event, TextDelta)]
    assert "".join(d.delta for d in deltas) == "You said: hello there"
    assert stream.status == "finished" and stream.terminal is not None
    assert stream.terminal.run_id == run_id
    history = [e async for e in client.all_history(session_id, root_run_id=run_id)]
    assert [f.data for f in frames] == history


async def test_a_run_stream_resumes_across_cut_connections(
    narad_server: NaradServer, org: str, client: Client, agent: str
) -> None:
    session_id = name()
    await client.create_session(session_id)
    proxy = FaultProxy(narad_server.base, cuts=6, seed=7)
    base = await proxy.start()
    try:
        async with Client(base, narad_server.token(org=org)) as cut:
            long = " ".join(f"word{n}" for n in range(60))
            stream = cut.runs.stream(session_id, message=long, queue=agent)
            frames = await asyncio.wait_for(collect(stream), WAIT)
    finally:
        await proxy.close()
    assert proxy.cut == 6, "the stream ended before the proxy cut it as often as planned"
    history = [e async for e in client.all_history(session_id, root_run_id=stream.run_id)]
    assert [f.data for f in frames] == history
    assert frames[-1].data["type"] == "run.finished"


async def collect(stream: AsyncIterator[Frame]) -> list[Frame]:
    return [frame async for frame in stream]


async def test_wait_answers_the_result_with_the_transcript_and_state(
    client: Client, agent: str
) -> None:
    session_id = name()
    await client.create_session(session_id)
    result = await asyncio.wait_for(client.runs.wait(session_id, message="hi", queue=agent), WAIT)
    assert result.status == "finished" and result.terminal.type == "run.finished"
    assert result.text == "You said: hi"
    assert [(i["item"], i.get("role")) for i in result.transcript] == [
        ("message", "user"),
        ("message", "assistant"),
    ]
    assert [i.get("runId") for i in result.output] == [result.run_id]
    assert result.state["sessionSequence"] == result.terminal.session_sequence
    assert result.state["runs"][result.run_id]["state"] == "finished"
    assert result.violations == []


async def test_join_reads_a_run_that_ended_from_history(client: Client, agent: str) -> None:
    session_id = name()
    await client.create_session(session_id)
    first = await asyncio.wait_for(
        client.runs.wait(session_id, input={"prompt": "x"}, queue=agent), WAIT
    )
    await client.record_user_message(session_id, "later")
    joined = await asyncio.wait_for(client.runs.join(session_id, first.run_id), WAIT)
    assert joined.events == first.events
    assert joined.terminal == first.terminal
    with pytest.raises(NotFoundError):
        await client.runs.join(session_id, "no-such-run")


async def test_join_stream_of_a_queued_run_waits_for_it(client: Client) -> None:
    """Backend-driven runs: the second waits in the queue; joined, its stream
    starts when it does and ends at its terminal."""
    session_id = name()
    await client.create_session(session_id)
    await client.start_run(session_id, run_id="first")
    queued = await client.start_run(session_id, run_id="second", on_conflict="enqueue")
    assert queued.queue_id is not None
    joined = client.runs.join_stream(session_id, "second")
    reading = asyncio.create_task(collect(joined))
    await asyncio.sleep(0.5)
    assert not reading.done()
    await client.append(session_id, run_events("first", "run.finished"))
    # The slot freed: the queued start ran; its run is driven by appends.
    for _ in range(100):
        if not (await client.queued_starts(session_id)).queued_starts:
            break
        await asyncio.sleep(0.05)
    await client.append(session_id, run_events("second", "run.error"))
    frames = await asyncio.wait_for(reading, WAIT)
    assert [f.data["type"] for f in frames] == ["run.started", "run.error"]
    assert joined.status == "error" and joined.terminal is not None
    assert joined.terminal.type == "run.error" and joined.terminal.code == "boom"


async def test_a_run_stream_holds_its_nested_runs(client: Client) -> None:
    session_id = name()
    await client.create_session(session_id)
    await client.start_run(session_id, run_id="parent")
    await client.start_run(session_id, run_id="child", parent_run_id="parent")
    await client.append(
        session_id,
        run_events(
            "child",
            "message.text.started",
            "message.text.delta",
            "message.text.completed",
            "run.finished",
            parent="parent",
        ),
    )
    await client.append(session_id, run_events("parent", "run.finished"))
    parent = await asyncio.wait_for(collect(client.runs.join_stream(session_id, "parent")), WAIT)
    child = await asyncio.wait_for(collect(client.runs.join_stream(session_id, "child")), WAIT)
    assert [(f.data["runId"], f.data["type"]) for f in parent] == [
        ("parent", "run.started"),
        ("child", "run.started"),
        ("child", "message.text.started"),
        ("child", "message.text.delta"),
        ("child", "message.text.completed"),
        ("child", "run.finished"),
        ("parent", "run.finished"),
    ]
    assert [f.data for f in child] == [f.data for f in parent[1:6]]
    result = await client.runs.join(session_id, "parent")
    assert result.text == "text of child"
    assert {i.get("runId") for i in result.output} == {"child"}


async def test_the_same_keyed_stream_call_again_starts_nothing_twice(
    client: Client, agent: str
) -> None:
    session_id = name()
    await client.create_session(session_id)
    key = f"chat-turn-{uuid.uuid4()}"
    first = await asyncio.wait_for(
        client.runs.wait(session_id, message="once", queue=agent, idempotency_key=key), WAIT
    )
    again = await asyncio.wait_for(
        client.runs.wait(session_id, message="once", queue=agent, idempotency_key=key), WAIT
    )
    assert again.run_id == first.run_id and again.events == first.events
    history = [e async for e in client.all_history(session_id)]
    assert [e["type"] for e in history].count("message.user.recorded") == 1
    assert [e["type"] for e in history].count("run.started") == 1
