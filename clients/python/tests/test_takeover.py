"""kill -9 of an agent runtime mid-answer: a runtime in a process of its own
streams an answer word by word and is killed with SIGKILL half-way (no
release, no goodbye); a second runtime claims the run once the lease lapses
and carries the answer on. The transcript holds the answer once, whole."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from conftest import NaradServer
from helpers import runtime_env, said, spawn_and_kill_when
from test_runtime import ROLES, SHORT_LEASES, has, of_type, serving, start, wait_history

from narad import Client, RunContext

WORDS = [f"word{i} " for i in range(40)]

#: The agent both runtimes run: it says WORDS one by one, a tenth of a
#: second apart (each its own step), then finishes.
AGENT = textwrap.dedent(
    """
    import asyncio, os, sys
    from narad import Client, Runtime

    WORDS = [f"word{i} " for i in range(40)]

    async def agent(ctx):
        async def words():
            for word in WORDS:
                yield word
                await asyncio.sleep(0.1)
        await ctx.say(words())
        await ctx.finish()

    async def main():
        async with Client(os.environ["NARAD_URL"], os.environ["NARAD_TOKEN"]) as client:
            print("serving", flush=True)
            await Runtime(client, agent, queue="takeover", claim_wait=1.0).run()

    asyncio.run(main())
    """
)


@pytest.fixture
async def short(
    start_server: Callable[..., NaradServer], org: str
) -> AsyncIterator[tuple[NaradServer, Client]]:
    """A server whose runtime leases lapse after 2 s, and a client of this test's tenant."""
    server = start_server(**SHORT_LEASES)
    async with Client(server.base, server.token(ROLES, org=org)) as client:
        yield server, client


async def test_a_runtime_killed_with_sigkill_mid_answer_is_taken_over_and_the_answer_is_whole(
    short: tuple[NaradServer, Client], org: str, tmp_path: Path
) -> None:
    server, client = short
    program = tmp_path / "agent.py"
    program.write_text(AGENT)
    session, run = await start(client, queue="takeover")
    # Half-way through the answer, the process dies at once.
    await spawn_and_kill_when(
        program,
        runtime_env(server, org),
        lambda: wait_history(client, session, lambda events: "word12 " in said(events)),
    )
    cut = await wait_history(client, session, has("message.text.started", runId=run))
    assert not of_type(cut, "message.text.completed"), "the first holder died mid-answer"

    # The second runtime runs the same agent (without the pauses).
    async def agent(ctx: RunContext) -> None:
        async def words() -> AsyncIterator[str]:
            for word in WORDS:
                yield word

        await ctx.say(words())
        await ctx.finish()

    async with serving(client, agent, queue="takeover"):
        events = await wait_history(client, session, has("run.finished", runId=run))
    assert len(of_type(events, "message.text.started")) == 1, [e["type"] for e in events]
    assert len(of_type(events, "message.text.completed")) == 1
    assert said(events) == "".join(WORDS), said(events)
    # Both holders wrote part of it: the first up to where it died, the
    # second the rest (event ids are {runId}@{attempt}.…).
    holders = {
        str(d["eventId"]).split("@")[1].split(".")[0] for d in of_type(events, "message.text.delta")
    }
    assert holders == {"1", "2"}, holders
    assert len(of_type(events, "run.finished")) == 1
