"""`follow` against a real server: live delivery under concurrent appends,
resume from a frame id, failover from a dead server, and connections cut at
random points by a TCP proxy between the client and the server. Each time
the reduced state must equal the state reduced from history, every event
delivered exactly once and in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from conftest import NaradServer
from helpers import FaultProxy

from narad import Client, Frame, NaradError, SessionReducer, follow

EVENTS = 120
BATCH = 6


def custom(session_id: str, n: int) -> dict[str, Any]:
    """The n-th extension event of a test session."""
    return {
        "protocolVersion": "narad/v1",
        "type": "session.custom",
        "eventId": f"{session_id}-custom-{n}",
        "name": "pytest.counter",
        "value": {"n": n, "pad": "x" * (n % 37)},
    }


async def fill(client: Client, session_id: str) -> None:
    """Appends the session's events in batches, with user messages between them."""
    for start in range(0, EVENTS, BATCH):
        await client.append(
            session_id, [custom(session_id, n) for n in range(start, start + BATCH)]
        )
        if start % (BATCH * 4) == 0:
            await client.record_user_message(session_id, f"message {start}")
        await asyncio.sleep(0)


async def history_of(client: Client, session_id: str) -> list[dict[str, Any]]:
    return [e async for e in client.all_history(session_id)]


async def collect(frames: AsyncIterator[Frame], reducer: SessionReducer, until: int) -> list[Frame]:
    """Reads authority frames into ``reducer`` until it holds sequence ``until``."""
    got: list[Frame] = []
    async for frame in frames:
        if frame.kind != "authority":
            continue
        got.append(frame)
        outcome = reducer.deliver(frame.data)
        assert outcome == "applied", (outcome, frame)
        if reducer.session_sequence >= until:
            break
    return got


def reduced(events: list[dict[str, Any]]) -> SessionReducer:
    reducer = SessionReducer()
    for event in events:
        reducer.deliver(event)
    return reducer


async def total_after_fill(client: Client, session_id: str) -> int:
    return int((await client.get_session(session_id)).session_sequence)


@pytest.fixture
async def writer(narad_server: NaradServer, org: str) -> AsyncIterator[Client]:
    async with Client(narad_server.base, narad_server.token(org=org)) as client:
        yield client


async def test_follow_under_concurrent_appends_equals_history(writer: Client) -> None:
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    await writer.create_session(session_id)
    reducer = SessionReducer()
    frames = follow(writer, session_id=session_id)
    appending = asyncio.create_task(fill(writer, session_id))
    # The follow starts while the appends run; it stops at the last one.
    first = await collect(frames, reducer, until=1)
    await appending
    total = await total_after_fill(writer, session_id)
    rest = await asyncio.wait_for(collect(frames, reducer, until=total), 60)
    await frames.aclose()
    delivered = [f.data["sessionSequence"] for f in first + rest]
    assert delivered == list(range(1, total + 1))
    history = await history_of(writer, session_id)
    assert [f.data for f in first + rest] == history
    assert reducer.state() == reduced(history).state()


async def test_follow_resumes_after_a_frame_id(writer: Client) -> None:
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    await writer.create_session(session_id)
    await fill(writer, session_id)
    total = await total_after_fill(writer, session_id)
    frames = follow(writer, session_id=session_id)
    whole = await collect(frames, SessionReducer(), until=total)
    await frames.aclose()
    history = await history_of(writer, session_id)
    for k in (0, 1, total // 2, total - 2):
        # A client that had reduced the first k + 1 events resumes after them.
        reducer = reduced(history[: k + 1])
        resumed = follow(writer, session_id=session_id, last_event_id=whole[k].id)
        after = await asyncio.wait_for(collect(resumed, reducer, until=total), 30)
        await resumed.aclose()
        assert [f.data["sessionSequence"] for f in after] == list(range(k + 2, total + 1)), k
        assert reducer.state() == reduced(history).state()


async def test_follow_fails_over_from_a_dead_server(
    narad_server: NaradServer, org: str, writer: Client
) -> None:
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    await writer.create_session(session_id)
    await fill(writer, session_id)
    total = await total_after_fill(writer, session_id)
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    async with Client([dead, narad_server.base], narad_server.token(org=org)) as client:
        reducer = SessionReducer()
        frames = follow(client, session_id=session_id, initial_backoff=0.05)
        got = await asyncio.wait_for(collect(frames, reducer, until=total), 30)
        await frames.aclose()
    assert [f.data["sessionSequence"] for f in got] == list(range(1, total + 1))
    assert reducer.state() == reduced(await history_of(writer, session_id)).state()


async def test_follow_of_the_tenant_stream_narrowed_to_one_session(writer: Client) -> None:
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    other = f"s-{uuid.uuid4().hex[:12]}"
    await writer.create_session(session_id)
    await writer.create_session(other)
    frames = follow(writer, only_session=session_id)
    # The tenant stream is live: subscribed once its capabilities arrived.
    first = await asyncio.wait_for(frames.__anext__(), 30)
    assert first.kind == "capabilities"
    await asyncio.gather(fill(writer, other), fill(writer, session_id))
    total = await total_after_fill(writer, session_id)
    reducer = SessionReducer()
    got = await asyncio.wait_for(collect(frames, reducer, until=total), 60)
    await frames.aclose()
    assert {f.data["sessionId"] for f in got} == {session_id}
    assert [f.data["sessionSequence"] for f in got] == list(range(1, total + 1))
    assert reducer.state() == reduced(await history_of(writer, session_id)).state()


async def test_follow_refuses_a_session_it_cannot_read(writer: Client) -> None:
    frames = follow(writer, session_id=f"missing-{uuid.uuid4().hex[:8]}")
    with pytest.raises(NaradError) as refused:
        await asyncio.wait_for(frames.__anext__(), 30)
    assert refused.value.status == 404
    assert (refused.value.code or "").startswith("NRD-")


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_follow_survives_connections_cut_at_random_points(
    narad_server: NaradServer, org: str, writer: Client, seed: int
) -> None:
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    await writer.create_session(session_id)
    proxy = FaultProxy(narad_server.base, cuts=12, seed=seed)
    base = await proxy.start()
    try:
        async with Client(base, narad_server.token(org=org)) as client:
            reducer = SessionReducer()
            frames = follow(client, session_id=session_id, initial_backoff=0.02)
            appending = asyncio.create_task(fill(writer, session_id))
            first = await asyncio.wait_for(collect(frames, reducer, until=1), 30)
            await appending
            total = await total_after_fill(writer, session_id)
            rest = await asyncio.wait_for(collect(frames, reducer, until=total), 60)
            await frames.aclose()
    finally:
        await proxy.close()
    assert proxy.cut == 12, "the stream ended before the proxy cut it as often as planned"
    delivered = [f.data["sessionSequence"] for f in first + rest]
    assert delivered == list(range(1, total + 1))
    history = await history_of(writer, session_id)
    assert reducer.state() == reduced(history).state()


async def test_follow_fills_a_replay_gap_from_history(
    start_server: Callable[..., NaradServer], org: str
) -> None:
    """Cut off longer than the tenant stream keeps its replay, a follow
    resumes into a ``replay-gap`` and reads what it missed from history."""
    server = start_server(NARAD_OUTBOX_RETENTION_SECONDS="1")
    token = server.token(org=org)
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    proxy = FaultProxy(server.base)
    base = await proxy.start()
    try:
        async with Client(server.base, token) as writer, Client(base, token) as client:
            await writer.create_session(session_id)
            reducer = SessionReducer()
            frames = follow(client, only_session=session_id, initial_backoff=0.1, max_backoff=0.5)
            assert (await asyncio.wait_for(frames.__anext__(), 30)).kind == "capabilities"
            await writer.record_user_message(session_id, "before the cut")
            before = await asyncio.wait_for(collect(frames, reducer, until=1), 30)
            proxy.switch_off()
            await fill(writer, session_id)
            total = await total_after_fill(writer, session_id)
            # Retention forgets the rows the follow missed (pruned every second).
            await asyncio.sleep(4)
            proxy.on = True
            kinds: list[str] = []
            after: list[Frame] = []

            async def resume() -> None:
                async for frame in frames:
                    kinds.append(frame.kind)
                    if frame.kind == "authority":
                        after.append(frame)
                        assert reducer.deliver(frame.data) == "applied", frame
                        if reducer.session_sequence >= total:
                            return

            await asyncio.wait_for(resume(), 30)
            await frames.aclose()
        assert "replay-gap" in kinds, kinds
        delivered = [f.data["sessionSequence"] for f in before + after]
        assert delivered == list(range(1, total + 1))
        assert all(f.from_history for f in after[: len(after) // 2]), "the gap was not filled"
        async with Client(server.base, token) as reader:
            history = await history_of(reader, session_id)
        assert reducer.state() == reduced(history).state()
    finally:
        await proxy.close()


async def test_follow_reads_a_long_tenant_replay_served_in_blocks(writer: Client) -> None:
    """The tenant stream replays at most 5,000 frames per connection, then
    ends it; the follow resumes from the last id each time."""
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    await writer.create_session(session_id)
    frames = follow(writer, only_session=session_id)
    assert (await asyncio.wait_for(frames.__anext__(), 30)).kind == "capabilities"
    await writer.record_user_message(session_id, "the first event")
    first = await asyncio.wait_for(collect(frames, SessionReducer(), until=1), 30)
    await frames.aclose()
    count = 5_200
    for start in range(0, count, 200):
        await writer.append(session_id, [custom(session_id, n) for n in range(start, start + 200)])
    total = count + 1
    resumed = follow(writer, only_session=session_id, last_event_id=first[0].id)
    sequences: list[int] = []

    async def read() -> None:
        async for frame in resumed:
            if frame.kind == "authority":
                assert not frame.from_history, "the replay had a gap"
                sequences.append(frame.data["sessionSequence"])
                if frame.data["sessionSequence"] >= total:
                    return

    await asyncio.wait_for(read(), 120)
    await resumed.aclose()
    assert sequences == list(range(2, total + 1))
