"""What the framework adapters share, against a real ``narad serve``: keyed
steps and their replay, ``ReplayDiverged``, progress and state documents,
usage on every terminal, :func:`narad.integrations.drive` under a finish,
an error and a stop, and :func:`narad.integrations.conversation`."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from test_runtime import has, of_type, serving, start, wait_history

from narad import Client, ReplayDiverged, RunContext, RuntimeOptions, ToolError, ToolFailed
from narad.integrations import Usage, conversation, drive


async def test_importing_narad_imports_no_framework() -> None:
    code = (
        "import sys, narad, narad.integrations\n"
        "loaded = [m for m in ('langgraph', 'langchain_core', 'agents', 'pydantic_ai') "
        "if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", code)
    assert await process.wait() == 0


async def test_keyed_steps_replay_by_key_and_a_diverged_replay_is_caught(client: Client) -> None:
    calls: list[dict[str, Any]] = []
    seen: list[Any] = []

    async def handler(ctx: RunContext) -> None:
        # Keys, not positions: the second pass takes the steps in another order.
        for order in (("b", "a"), ("a", "b")):
            for key in order:
                seen.append(await ctx.tool("look", {"key": key}, calls.append, key=key))
        message = ctx.message(key="m1")
        await message.say("once")
        await message.complete()
        again = ctx.message(key="m1")
        await again.say("once")
        await again.complete()
        await ctx.progress("thinking", key="p")
        await ctx.progress("thinking", key="p")
        await ctx.progress("thinking", status="completed", key="p")
        try:
            await ctx.tool("other", {}, calls.append, key="a")
        except ReplayDiverged as e:
            await ctx.fail("replay_diverged", str(e), usage={"inputTokens": 3})

    async with serving(client, handler):
        session, run = await start(client)
        events = await wait_history(client, session, has("run.error", runId=run))
    assert len(calls) == 2, calls  # each key ran once
    assert len(of_type(events, "tool.call.started")) == 2
    assert [e["progressId"] for e in of_type(events, "progress.recorded")] == [
        f"{run}.p.progress"
    ] * 2
    assert len(of_type(events, "message.text.started")) == 1
    error = of_type(events, "run.error")[0]
    assert error["code"] == "replay_diverged" and error["usage"] == {"inputTokens": 3}
    assert "'look'" in error["message"] and "'other'" in error["message"]


async def test_state_documents_snapshot_and_patch_by_revision(client: Client) -> None:
    revisions: list[int] = []

    async def handler(ctx: RunContext) -> None:
        revisions.append(await ctx.put_state({"count": 1}, scope="graph", key="s1"))
        revisions.append(
            await ctx.patch_state(
                [{"op": "replace", "path": "/count", "value": 2}], scope="graph", key="s2"
            )
        )
        # A replayed step (same key) writes nothing and answers the revision.
        revisions.append(await ctx.put_state({"count": 9}, scope="graph", key="s1"))
        revisions.append((await ctx.read_state("graph"))[0])
        assert (await ctx.read_state("graph"))[1] == {"count": 2}
        assert await ctx.read_state("none") == (0, None)
        await ctx.finish()

    async with serving(client, handler):
        session, run = await start(client)
        events = await wait_history(client, session, has("run.finished", runId=run))
    assert revisions == [1, 2, 2, 2]
    assert [e["type"] for e in events if e["type"].startswith("state.")] == [
        "state.snapshot",
        "state.delta",
    ]


async def test_drive_ends_the_run_by_how_the_work_went(client: Client) -> None:
    started = asyncio.Event()

    async def handler(ctx: RunContext) -> None:
        usage = Usage()
        prompt = ctx.input["prompt"]

        async def work() -> None:
            usage.add(inputTokens=10, outputTokens=None)
            await ctx.say(f"answer to {prompt}")
            usage.add(outputTokens=4, inputTokens=-1)
            if prompt == "fail":
                raise ValueError("the model said no")
            if prompt == "stop":
                started.set()
                await asyncio.sleep(60)

        await drive(ctx, work, usage=usage, error_code=lambda e: type(e).__name__.lower())

    async with serving(client, handler):
        ok_session, ok_run = await start(client, prompt="ok")
        fail_session, fail_run = await start(client, prompt="fail")
        stop_session, stop_run = await start(client, prompt="stop")
        await asyncio.wait_for(started.wait(), 15)
        await client.stop_run(stop_session, run_id=stop_run)
        ok = await wait_history(client, ok_session, has("run.finished", runId=ok_run))
        failed = await wait_history(client, fail_session, has("run.error", runId=fail_run))
        stopped = await wait_history(client, stop_session, has("run.cancelled", runId=stop_run))
    usage = {"inputTokens": 10, "outputTokens": 4}
    assert of_type(ok, "run.finished")[0]["usage"] == usage
    error = of_type(failed, "run.error")[0]
    assert (error["code"], error["message"], error["usage"]) == (
        "valueerror",
        "the model said no",
        usage,
    )
    cancelled = of_type(stopped, "run.cancelled")[0]
    assert cancelled["code"] == "stopped" and cancelled["usage"] == usage
    # The stopped run's message was completed with what was said.
    assert of_type(stopped, "message.text.completed")


async def test_conversation_is_the_chat_before_the_run(client: Client) -> None:
    heard: list[list[tuple[str, str]]] = []

    async def handler(ctx: RunContext) -> None:
        heard.append([(t.role, t.text) for t in await conversation(ctx)])
        await ctx.say(f"reply {len(heard)}")
        await ctx.finish()

    async with serving(client, handler):
        session, first = await start(client, prompt="first")
        await wait_history(client, session, has("run.finished", runId=first))
        await client.record_user_message(session, content={"text": "and now?"})
        second = "r2-" + first
        await client.start_run(
            session,
            run_id=second,
            input={"prompt": "second"},
            runtime=RuntimeOptions(queue="default"),
        )
        await wait_history(client, session, has("run.finished", runId=second))
    assert heard[0] == [("user", "first")]
    assert heard[1] == [("assistant", "reply 1"), ("user", "and now?"), ("user", "second")]


async def test_a_tool_error_chooses_the_code_its_call_finishes_with(client: Client) -> None:
    async def missing(args: dict[str, Any]) -> Any:
        raise ToolError("not_found", f"no city named {args['city']}")

    async def handler(ctx: RunContext) -> None:
        try:
            await ctx.tool("weather", {"city": "Atlantis"}, missing, key="w")
        except ToolFailed as e:
            assert isinstance(e.__cause__, ToolError)
            await ctx.finish()

    async with serving(client, handler):
        session, run = await start(client)
        events = await wait_history(client, session, has("run.finished", runId=run))
    finished = of_type(events, "tool.call.finished")[0]
    assert (finished["outcome"], finished["code"], finished["message"]) == (
        "error",
        "not_found",
        "no city named Atlantis",
    )
