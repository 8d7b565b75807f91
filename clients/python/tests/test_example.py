"""``examples/python_agent.py`` run as a subprocess against a real ``narad serve``.

One agent process serves the module's tenant; each test drives one run of
one behaviour (an echo, an approval, the ``clock.now`` client tool, a stop,
a run started by a user message) and reads the session's history.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import test_runtime
from conftest import REPO, NaradServer
from helpers import runtime_env, said
from test_runtime import ROLES, finish_call, has, start, types

from narad.client import Client

EXAMPLE = REPO / "examples" / "python_agent.py"
QUEUE = "demo-py"
DESK = "desk-example"
WORD_DELAY_MS = 40
WAIT = 20.0

#: This module's waits on a session's history last up to WAIT seconds.
wait_history = partial(test_runtime.wait_history, timeout=WAIT)


@dataclass
class Agent:
    """The example agent's process, its tenant and where its output goes."""

    server: NaradServer
    org: str
    process: subprocess.Popen[bytes]
    output: Path

    def text(self) -> str:
        """What the process printed so far."""
        return self.output.read_text(errors="replace")


@pytest.fixture(scope="module")
def agent(narad_server: NaradServer) -> Iterator[Agent]:
    """The example agent, serving queue ``demo-py`` of a tenant of its own."""
    org = f"py-example-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="narad-example-"))
    output = work / "agent.out"
    env = runtime_env(narad_server, org, sub="python-agent")
    command = [
        sys.executable,
        str(EXAMPLE),
        "--queue",
        QUEUE,
        "--executor",
        DESK,
        "--word-delay-ms",
        str(WORD_DELAY_MS),
    ]
    with open(output, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    running = Agent(narad_server, org, process, output)
    deadline = time.monotonic() + WAIT
    while "listening for user messages" not in running.text():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the example agent did not start:\n{running.text()}")
        time.sleep(0.1)
    yield running
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.fixture
async def client(agent: Agent) -> AsyncIterator[Client]:
    """A client of the agent's tenant (a person and an operator in one)."""
    async with Client(agent.server.base, agent.server.token(ROLES, org=agent.org)) as c:
        yield c


async def test_the_example_echoes_a_prompt_word_by_word(client: Client) -> None:
    session, _ = await start(client, "hello there, agent", queue=QUEUE)
    events = await wait_history(client, session, has("run.finished"))
    assert said(events) == "You said: hello there, agent"
    deltas = [e["delta"] for e in events if e["type"] == "message.text.delta"]
    assert len(deltas) >= 3  # word by word, not in one piece
    assert "reasoning.started" in types(events)
    assert types(events)[-2:] == ["message.text.completed", "run.finished"]


async def test_the_example_asks_before_deleting(client: Client) -> None:
    session, _ = await start(client, "delete the old logs", queue=QUEUE)
    events = await wait_history(client, session, has("run.paused"))
    requested = next(e for e in events if e["type"] == "interrupt.requested")
    assert requested["actions"] == ["approve", "deny"]
    assert "delete the old logs" in requested["message"]
    assert "message.text.delta" not in types(events)  # nothing said before the decision
    await client.resolve_interrupt(
        session, interrupt_id=requested["interruptId"], decision="approve"
    )
    events = await wait_history(client, session, has("run.finished"))
    assert said(events).startswith("Approved. Pretending to delete the old logs now")
    tail = types(events)[types(events).index("interrupt.resolved") :]
    assert tail[:2] == ["interrupt.resolved", "run.resumed"]


async def test_the_example_reads_the_time_with_the_executors_clock(
    agent: Agent, client: Client
) -> None:
    executor = Client(agent.server.base, agent.server.token("executor", org=agent.org, sub=DESK))
    async with executor:
        attached = await executor.request("POST", f"/v1/executors/{DESK}/attach", json={})
        lease = attached["leaseId"]
        session, _ = await start(client, "what time is it?", queue=QUEUE, client_executor_id=DESK)
        controls: list[dict[str, Any]] = []
        deadline = asyncio.get_running_loop().time() + WAIT
        while not controls:
            assert asyncio.get_running_loop().time() < deadline, "no clock.now call came"
            got = await executor.request(
                "GET",
                f"/v1/executors/{DESK}/controls",
                params={"leaseId": lease, "waitMs": 1000},
                timeout=20,
            )
            controls = got["controls"]
        execute = controls[0]
        assert (execute["toolName"], execute["args"]) == ("clock.now", {})
        await finish_call(
            executor, DESK, lease, execute, "success", {"now": "2026-12-02T12:34:56Z"}
        )
    events = await wait_history(client, session, has("run.finished"))
    assert said(events) == "Your executor's clock says 2026-12-02T12:34:56Z."
    started = next(e for e in events if e["type"] == "tool.call.started")
    assert started["executor"] == "client"


async def test_the_example_honours_a_stop(client: Client) -> None:
    prompt = " ".join(f"word{n}" for n in range(100))
    session, run = await start(client, prompt, queue=QUEUE)
    await wait_history(
        client, session, lambda es: sum(e["type"] == "message.text.delta" for e in es) >= 3
    )
    await client.stop_run(session, run_id=run)
    events = await wait_history(client, session, has("run.cancelled"))
    assert "run.finished" not in types(events)
    assert types(events)[-2:] == ["message.text.completed", "run.cancelled"]
    cancelled = events[-1]
    assert cancelled["code"] == "stopped"
    assert "word99" not in said(events)


async def test_the_example_answers_a_user_message(client: Client) -> None:
    session = f"s-{uuid.uuid4().hex[:10]}"
    await client.create_session(session)
    await client.record_user_message(session, "hi from a person")
    events = await wait_history(client, session, has("run.finished"))
    started = next(e for e in events if e["type"] == "run.started")
    assert started["input"]["prompt"] == "hi from a person"
    assert started["clientExecutorId"] == DESK
    assert said(events) == "You said: hi from a person"


def test_the_example_stops_on_sigint(agent: Agent) -> None:
    agent.process.send_signal(signal.SIGINT)
    assert agent.process.wait(timeout=WAIT) == 0
    assert "python agent stopped" in agent.text()
