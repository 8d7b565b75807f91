"""A restart of the only server, with ``kill -9``, while calls are under way.

The server is killed right after it acted on a call and before the client
read the answer (the answer is lost with it), then started again on the same
address and database a second later: the call is sent again through the
refused connections until the server is back, and succeeds with one effect.
A call made while the server is down waits for it too. An agent runtime's
handler streaming an answer carries on through a restart, never seeing it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable

from conftest import NaradServer
from helpers import Fault, Recorder, to_path

from narad import Client, RunContext, Runtime, RuntimeOptions

DOWN_FOR = 1.0


def restart_soon(server: NaradServer, after: float = DOWN_FOR) -> Callable[[], None]:
    """Kills ``server`` now; starts it again ``after`` seconds later (in a thread)."""

    def kill_then_start() -> None:
        server.kill()

        def start() -> None:
            time.sleep(after)
            server.restart()

        threading.Thread(target=start, daemon=True).start()

    return kill_then_start


async def count(client: Client, session_id: str, kind: str) -> int:
    return sum(1 for e in [e async for e in client.all_history(session_id)] if e["type"] == kind)


async def test_a_command_through_a_restart_of_the_only_server(
    own_server: Callable[..., NaradServer],
) -> None:
    server = own_server()
    token = server.token()
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    path = "/v1/commands/record-user-message"
    recorder = Recorder(Fault(to_path(path), "drop-answer", then=restart_soon(server)))
    async with recorder.client(server.base, token) as client:
        await client.create_session(session_id)
        said = await client.record_user_message(session_id, "said once")
        assert await count(client, session_id, "message.user.recorded") == 1
    sent = recorder.to(path)
    outcomes = [s.outcome for s in sent]
    assert outcomes[0] == "dropped" and outcomes[-1] == "answered", outcomes
    assert "unreachable" in outcomes, outcomes  # it was sent while the server was down
    assert len({s.key for s in sent}) == 1
    assert sent[-1].replayed
    assert said.session_id == session_id


async def test_a_start_through_a_restart_of_the_only_server_starts_one_run(
    own_server: Callable[..., NaradServer],
) -> None:
    server = own_server()
    token = server.token()
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    path = "/v1/commands/start-run"
    recorder = Recorder(Fault(to_path(path), "drop-answer", then=restart_soon(server)))
    async with recorder.client(server.base, token) as client:
        await client.create_session(session_id)
        started = await client.start_run(session_id, on_conflict="enqueue", input={"n": 1})
        assert await count(client, session_id, "run.started") == 1
        assert (await client.queued_starts(session_id)).queued_starts == []
        history = [e async for e in client.all_history(session_id)]
    assert [e["runId"] for e in history if e["type"] == "run.started"] == [started.run_id]
    assert len({s.key for s in recorder.to(path)}) == 1


async def test_an_append_through_a_restart_of_the_only_server_is_written_once(
    own_server: Callable[..., NaradServer],
) -> None:
    server = own_server()
    token = server.token()
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    path = f"/v1/sessions/{session_id}/events"
    recorder = Recorder(Fault(to_path(path), "drop-answer", then=restart_soon(server)))
    events = [
        {
            "protocolVersion": "narad/v1",
            "type": "session.custom",
            "eventId": f"{session_id}-{n}",
            "name": "pytest.counter",
            "value": {"n": n},
        }
        for n in range(5)
    ]
    async with recorder.client(server.base, token) as client:
        await client.create_session(session_id)
        appended = await client.append(session_id, events)
        assert appended.duplicate
        assert await count(client, session_id, "session.custom") == 5
    outcomes = [s.outcome for s in recorder.to(path)]
    assert outcomes[0] == "dropped" and "unreachable" in outcomes and outcomes[-1] == "answered"


async def test_a_command_sent_while_the_only_server_is_down_waits_for_it(
    own_server: Callable[..., NaradServer],
) -> None:
    server = own_server()
    token = server.token()
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    recorder = Recorder()
    async with recorder.client(server.base, token) as client:
        await client.create_session(session_id)
        restart_soon(server, after=1.5)()
        began = time.monotonic()
        await client.record_user_message(session_id, "while it was down")
        assert time.monotonic() - began >= 1.0
        assert await count(client, session_id, "message.user.recorded") == 1
    outcomes = [s.outcome for s in recorder.to("/v1/commands/record-user-message")]
    assert outcomes[:-1] and set(outcomes[:-1]) == {"unreachable"}, outcomes
    assert outcomes[-1] == "answered"


async def test_a_runtime_handler_carries_on_through_a_restart(
    own_server: Callable[..., NaradServer],
) -> None:
    """A handler streams forty words; the server is killed and started again
    in the middle: no exception reaches it, and the answer is there once."""
    server = own_server()
    token = server.token()
    session_id, run_id = f"s-{uuid.uuid4().hex[:12]}", f"r-{uuid.uuid4().hex[:8]}"
    words = [f"w{n}" for n in range(40)]
    failures: list[BaseException] = []
    said = asyncio.Event()

    async def handler(ctx: RunContext) -> None:
        try:
            for n, word in enumerate(words):
                await ctx.say(word if n == 0 else f" {word}")
                if n == 10:
                    said.set()
                await asyncio.sleep(0.05)
            await ctx.finish()
        except BaseException as e:
            failures.append(e)
            raise

    async with Client(server.base, token) as client:
        await client.create_session(session_id)
        await client.start_run(session_id, run_id=run_id, runtime=RuntimeOptions(queue="restart"))
        runtime = Runtime(client, handler, queue="restart", delta_window=0.01, claim_wait=1.0)
        serving = asyncio.create_task(runtime.run())
        await asyncio.wait_for(said.wait(), 30)
        await asyncio.to_thread(restart_soon(server))
        result = await asyncio.wait_for(client.runs.join(session_id, run_id), 60)
        runtime.stop()
        await asyncio.wait_for(serving, 30)
    assert failures == []
    assert result.status == "finished"
    assert result.text == " ".join(words)
    assert [e["type"] for e in result.events].count("message.text.started") == 1
