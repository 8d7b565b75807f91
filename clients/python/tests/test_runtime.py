"""The agent runtime loop (``narad.runtime``) against a real ``narad serve``.

Every test has a tenant of its own (the ``org`` fixture), so runtimes of
different tests never claim each other's runs. The tests that lose a runtime
use a server whose runtime leases live two seconds and whose sweeper looks
every 200 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import pytest
from conftest import NaradServer

from narad.client import Client, Event, RuntimeOptions
from narad.errors import NaradError
from narad.runtime import (
    TERMINALS,
    LeaseLost,
    RunContext,
    RunHandler,
    RunStopped,
    Runtime,
    ToolFailed,
    _ident,
    _Journal,
)

ROLES = "reader,writer,backend,approver"
SHORT_LEASES = {"NARAD_RUNTIME_LEASE_TTL_MS": "2000", "NARAD_RUNTIME_SWEEP_MS": "200"}
WAIT = 15.0


# --- helpers --------------------------------------------------------------


@pytest.fixture
async def client(narad_server: NaradServer, org: str) -> AsyncIterator[Client]:
    """A client of this test's tenant with every role a runtime test needs."""
    async with Client(narad_server.base, narad_server.token(ROLES, org=org)) as c:
        yield c


@pytest.fixture
def short_server(start_server: Callable[..., NaradServer]) -> NaradServer:
    """A server whose runtime leases lapse after 2 s."""
    return start_server(**SHORT_LEASES)


@pytest.fixture
async def short_client(short_server: NaradServer, org: str) -> AsyncIterator[Client]:
    """A client of this test's tenant on the short-lease server."""
    async with Client(short_server.base, short_server.token(ROLES, org=org)) as c:
        yield c


@contextlib.asynccontextmanager
async def serving(
    client: Client, handler: RunHandler, *, kind: type[Runtime] = Runtime, **options: Any
) -> AsyncIterator[Runtime]:
    """A runtime running in the background while the block runs; stopped after it."""
    options.setdefault("claim_wait", 1.0)
    runtime = kind(client, handler, **options)
    task = asyncio.create_task(runtime.run())
    try:
        yield runtime
    finally:
        runtime.stop()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=10)
        except asyncio.TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise


async def kill(runtime_task: asyncio.Task[None]) -> None:
    """Ends a runtime the way a crash would: its runs are dropped, nothing released."""
    runtime_task.cancel()
    await asyncio.gather(runtime_task, return_exceptions=True)


async def start(
    client: Client,
    prompt: str = "hello",
    *,
    queue: str = "default",
    runtime: RuntimeOptions | None = None,
    client_executor_id: str | None = None,
) -> tuple[str, str]:
    """A new session and a run in it for the runtimes of ``queue`` (or ``runtime``)."""
    session = f"s-{uuid.uuid4().hex[:10]}"
    run = f"r-{uuid.uuid4().hex[:10]}"
    await client.create_session(session)
    await client.start_run(
        session,
        run_id=run,
        input={"prompt": prompt},
        runtime=runtime or RuntimeOptions(queue=queue),
        client_executor_id=client_executor_id,
    )
    return session, run


async def history(client: Client, session: str) -> list[Event]:
    """Every event of the session."""
    return [e async for e in client.all_history(session)]


async def wait_history(
    client: Client,
    session: str,
    until: Callable[[list[Event]], bool],
    *,
    timeout: float = WAIT,
) -> list[Event]:
    """Polls the session's history until ``until`` holds; fails with the history otherwise."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        events = await history(client, session)
        if until(events):
            return events
        if asyncio.get_running_loop().time() > deadline:
            kinds = [e["type"] for e in events]
            raise AssertionError(f"history of {session} never got there: {kinds}")
        await asyncio.sleep(0.1)


def has(kind: str, **fields: Any) -> Callable[[list[Event]], bool]:
    """Whether a history holds an event of type ``kind`` with ``fields``."""
    return lambda events: any(
        e["type"] == kind and all(e.get(k) == v for k, v in fields.items()) for e in events
    )


def of_type(events: list[Event], kind: str) -> list[Event]:
    """The events of type ``kind``."""
    return [e for e in events if e["type"] == kind]


def types(events: list[Event]) -> list[str]:
    """The event types, in order."""
    return [str(e["type"]) for e in events]


async def until(check: Callable[[], bool], *, timeout: float = WAIT) -> None:
    """Waits until ``check()`` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


def said(events: list[Event], run: str) -> str:
    """The text run ``run`` streamed (its ``message.text.delta`` s joined)."""
    return "".join(
        str(e["delta"]) for e in events if e["type"] == "message.text.delta" and e["runId"] == run
    )


def terminal(events: list[Event], run: str) -> Event:
    """The terminal of ``run``; fails unless there is exactly one."""
    found = [e for e in events if e["type"] in TERMINALS and e["runId"] == run]
    assert len(found) == 1, found
    return found[0]


async def forever() -> None:
    """Waits for ever (until cancelled)."""
    await asyncio.Event().wait()


# --- claims and messages ----------------------------------------------------


async def test_a_claimed_run_streams_said_text_as_coalesced_deltas(client: Client) -> None:
    seen: list[RunContext] = []

    async def handler(ctx: RunContext) -> None:
        seen.append(ctx)
        await ctx.say("Hello")
        await ctx.say(", world")  # within the 50 ms window: one delta with "Hello"
        await asyncio.sleep(0.3)
        await ctx.say("!")
        await ctx.finish()

    session, run = await start(client, prompt="greet me")
    async with serving(client, handler):
        events = await wait_history(client, session, has("run.finished", runId=run))
    ctx = seen[0]
    assert (ctx.run_id, ctx.session_id, ctx.reason, ctx.attempt) == (run, session, "started", 1)
    assert ctx.input == {"prompt": "greet me"}
    assert ctx.client_executor_id is None
    started = of_type(events, "message.text.started")
    assert len(started) == 1
    assert started[0]["role"] == "assistant" and started[0]["messageScope"] == "run"
    message_id = started[0]["messageId"]
    deltas = of_type(events, "message.text.delta")
    assert [d["delta"] for d in deltas] == ["Hello, world", "!"]
    assert all(d["messageId"] == message_id and d["runId"] == run for d in deltas)
    assert types(events)[-2:] == ["message.text.completed", "run.finished"]
    # The last delta, the completion and the end went out as one batch.
    assert [e["sessionSequence"] for e in events[-3:]] == [
        events[-3]["sessionSequence"] + i for i in range(3)
    ]
    assert ctx.ended and not ctx.lost


class _SlowAppends(Client):
    """A client whose appends take 300 ms on their way (a slow network)."""

    async def append(self, session_id: str, events: Any, **options: Any) -> Any:
        await asyncio.sleep(0.3)
        return await super().append(session_id, events, **options)


async def test_text_said_while_a_delta_is_on_its_way_is_not_lost(
    narad_server: NaradServer, org: str
) -> None:
    async def handler(ctx: RunContext) -> None:
        await ctx.say("one")
        await asyncio.sleep(0.15)  # the window closed: "one" is on its way
        await ctx.say(" two")  # said while that append is in flight
        await asyncio.sleep(0.6)  # "two" goes out on its own
        await ctx.say(" three")
        await ctx.finish()

    async with _SlowAppends(narad_server.base, narad_server.token(ROLES, org=org)) as client:
        session, run = await start(client)
        async with serving(client, handler):
            events = await wait_history(client, session, has("run.finished", runId=run))
    deltas = [d["delta"] for d in of_type(events, "message.text.delta")]
    assert deltas == ["one", " two", " three"]


async def test_messages_opened_as_context_managers_complete_in_order(client: Client) -> None:
    async def handler(ctx: RunContext) -> None:
        async with ctx.message() as first:
            for word in ["one", " two", " three"]:
                await first.say(word)
        await ctx.say("loose text")  # opens a message of its own
        async with ctx.message(role="system") as second:  # completes the loose one first
            await second.say("system note")
        await ctx.finish()

    session, run = await start(client)
    async with serving(client, handler):
        events = await wait_history(client, session, has("run.finished", runId=run))
    texts: dict[str, str] = {}
    order: list[str] = []
    for e in events:
        if e["type"] == "message.text.started":
            order.append(e["messageId"])
            texts[e["messageId"]] = ""
        elif e["type"] == "message.text.delta":
            texts[e["messageId"]] += e["delta"]
    assert [texts[m] for m in order] == ["one two three", "loose text", "system note"]
    roles = [e["role"] for e in of_type(events, "message.text.started")]
    assert roles == ["assistant", "assistant", "system"]
    completed = [e["messageId"] for e in of_type(events, "message.text.completed")]
    assert completed == order
    # Each message completes before the next one starts.
    kinds = [e["type"] for e in events if e["type"].startswith("message.text.")]
    starts = [i for i, k in enumerate(kinds) if k == "message.text.started"]
    ends = [i for i, k in enumerate(kinds) if k == "message.text.completed"]
    assert all(end < next_start for end, next_start in zip(ends, starts[1:], strict=False))


async def test_history_reads_what_is_new_since_the_claim(client: Client) -> None:
    got: list[list[Event]] = []

    async def handler(ctx: RunContext) -> None:
        got.append(await ctx.history())
        await ctx.finish()

    session, run = await start(client)
    await client.record_user_message(session, "a note before the claim")
    async with serving(client, handler):
        await wait_history(client, session, has("run.finished", runId=run))
    assert types(got[0]) == ["run.started", "message.user.recorded"]


# --- tools ----------------------------------------------------------------


async def test_backend_tools_record_their_start_and_finish(client: Client) -> None:
    answers: list[Any] = []

    async def lookup(args: dict[str, Any]) -> dict[str, Any]:
        return {"found": args["key"].upper()}

    def broken(args: dict[str, Any]) -> None:
        raise ValueError("no such file")

    async def handler(ctx: RunContext) -> None:
        answers.append(await ctx.tool("kv.get", {"key": "abc"}, lookup))
        try:
            await ctx.tool("fs.read", {"path": "/nope"}, broken)
        except ToolFailed as e:
            answers.append((e.outcome, e.code, e.message, isinstance(e.__cause__, ValueError)))
        await ctx.finish()

    session, run = await start(client)
    async with serving(client, handler):
        events = await wait_history(client, session, has("run.finished", runId=run))
    assert answers == [{"found": "ABC"}, ("error", "tool_error", "no such file", True)]
    started = of_type(events, "tool.call.started")
    finished = of_type(events, "tool.call.finished")
    assert [(s["toolName"], s["executor"], s["args"]) for s in started] == [
        ("kv.get", "backend", {"key": "abc"}),
        ("fs.read", "backend", {"path": "/nope"}),
    ]
    assert [(f["toolCallId"], f["outcome"]) for f in finished] == [
        (started[0]["toolCallId"], "success"),
        (started[1]["toolCallId"], "error"),
    ]
    assert finished[0]["response"] == {"found": "ABC"}


async def executor_api(
    server: NaradServer, org: str, desk: str
) -> tuple[Client, str, Callable[[], Awaitable[list[dict[str, Any]]]]]:
    """Attaches executor ``desk`` over HTTP: its client, its lease, and a poll of its controls."""
    executor = Client(server.base, server.token("executor", org=org, sub=desk))
    attached = await executor.request("POST", f"/v1/executors/{desk}/attach", json={})
    lease = str(attached["leaseId"])

    async def controls() -> list[dict[str, Any]]:
        got = await executor.request(
            "GET",
            f"/v1/executors/{desk}/controls",
            params={"leaseId": lease, "waitMs": 1000},
            timeout=20,
        )
        return list(got["controls"])

    return executor, lease, controls


async def finish_call(
    executor: Client,
    desk: str,
    lease: str,
    execute: dict[str, Any],
    outcome: str,
    response: Any,
    **extra: Any,
) -> None:
    """Finishes the client tool call ``execute`` (a control of executor ``desk``
    under ``lease``) with ``outcome`` and ``response`` (and ``extra`` fields)."""
    await executor.request(
        "POST",
        f"/v1/executors/{desk}/finish",
        json={
            "type": "client.tool.finish",
            "protocolVersion": "narad/v1",
            "executionToken": execute["executionToken"],
            "toolCallId": execute["toolCallId"],
            "clientExecutorId": desk,
            "leaseId": lease,
            "outcome": outcome,
            "response": response,
            **extra,
        },
    )


async def test_a_client_tool_answers_what_the_executor_finished(
    narad_server: NaradServer, client: Client, org: str
) -> None:
    desk = f"desk-{uuid.uuid4().hex[:6]}"
    executor, lease, controls = await executor_api(narad_server, org, desk)
    got: list[Any] = []

    async def handler(ctx: RunContext) -> None:
        assert ctx.client_executor_id == desk
        now = await ctx.client_tool("clock.now", {"tz": "UTC"})
        got.append(now)
        try:
            await ctx.client_tool("fs.read", {"path": "/x"})
        except ToolFailed as e:
            got.append((e.outcome, e.code, e.response))
        await ctx.say(f"It is {now['now']}.")
        await ctx.finish()

    finish = partial(finish_call, executor, desk, lease)
    async with executor:
        session, run = await start(client, client_executor_id=desk)
        async with serving(client, handler):
            calls: list[dict[str, Any]] = []
            while not calls:
                calls = await controls()
            assert (calls[0]["toolName"], calls[0]["args"]) == ("clock.now", {"tz": "UTC"})
            await asyncio.sleep(0.3)
            assert got == []  # the handler waits for the executor
            await finish(calls[0], "success", {"now": "2026-12-02T10:00:00Z"})
            calls = []
            while not calls:
                calls = await controls()
            assert calls[0]["toolName"] == "fs.read"
            await finish(calls[0], "error", {"errno": 2}, code="not_found", message="no such file")
            events = await wait_history(client, session, has("run.finished", runId=run))
    assert got == [{"now": "2026-12-02T10:00:00Z"}, ("error", "not_found", {"errno": 2})]
    started = of_type(events, "tool.call.started")
    assert [s["executor"] for s in started] == ["client", "client"]
    said = "".join(d["delta"] for d in of_type(events, "message.text.delta"))
    assert said == "It is 2026-12-02T10:00:00Z."


# --- approvals and stops --------------------------------------------------


async def test_approve_waits_for_the_resolution_and_answers_the_decision(client: Client) -> None:
    decisions: list[str] = []

    async def handler(ctx: RunContext) -> None:
        decision = await ctx.approve("Delete the logs?", title="Delete")
        decisions.append(decision)
        await ctx.say(f"You said {decision}.")
        await ctx.finish()

    session, run = await start(client, prompt="delete the logs")
    async with serving(client, handler):
        events = await wait_history(client, session, has("run.paused", runId=run))
        requested = of_type(events, "interrupt.requested")[0]
        paused = of_type(events, "run.paused")[0]
        # §7.6: the pause follows its interrupt consecutively, with its ids.
        assert paused["sequence"] == requested["sequence"] + 1
        assert (paused["waitId"], paused["interruptId"]) == (
            requested["waitId"],
            requested["interruptId"],
        )
        assert paused["resumeMode"] == "command"
        assert requested["actions"] == ["approve", "deny"]
        assert requested["message"] == "Delete the logs?" and requested["title"] == "Delete"
        await asyncio.sleep(0.5)
        assert decisions == []  # still waiting
        # A person finds it among the session's open interrupts.
        waiting = [i async for i in client.open_interrupts(session_id=session)]
        assert [(i.session_id, i.interrupt_id) for i in waiting] == [
            (session, requested["interruptId"])
        ]
        await client.resolve_interrupt(
            session, interrupt_id=requested["interruptId"], decision="deny"
        )
        events = await wait_history(client, session, has("run.finished", runId=run))
    assert decisions == ["deny"]
    assert [i async for i in client.open_interrupts(session_id=session)] == []
    tail = types(events)[types(events).index("interrupt.resolved") :]
    assert tail[:2] == ["interrupt.resolved", "run.resumed"]
    assert of_type(events, "run.resumed")[0]["waitId"] == requested["waitId"]


async def test_a_stop_mid_answer_completes_the_message_and_cancels(client: Client) -> None:
    stopped: list[bool] = []

    async def handler(ctx: RunContext) -> None:
        try:
            for n in range(400):
                await ctx.say(f"word{n} ")
                await asyncio.sleep(0.02)
            await ctx.finish()
        except RunStopped:
            stopped.append(True)
            raise

    session, run = await start(client)
    async with serving(client, handler):
        await wait_history(client, session, lambda es: len(of_type(es, "message.text.delta")) >= 3)
        await client.stop_run(session, run_id=run)
        events = await wait_history(client, session, has("run.cancelled", runId=run))
    assert stopped == [True]
    cancelled = of_type(events, "run.cancelled")[0]
    assert (cancelled["code"], cancelled["message"]) == ("stopped", "stopped on request")
    kinds = types(events)
    assert kinds[-2:] == ["message.text.completed", "run.cancelled"]
    assert kinds.index("run.stop.requested") < kinds.index("message.text.completed")
    assert "run.finished" not in kinds
    said = "".join(d["delta"] for d in of_type(events, "message.text.delta"))
    assert said.startswith("word0 word1 word2 ") and "word399" not in said


async def test_a_stop_while_waiting_for_approval_closes_the_interrupt(client: Client) -> None:
    async def handler(ctx: RunContext) -> None:
        await ctx.say("Let me ask first.")
        await ctx.approve("Drop the table?")
        await ctx.finish()

    session, run = await start(client)
    async with serving(client, handler):
        await wait_history(client, session, has("run.paused", runId=run))
        await client.stop_run(session, run_id=run)
        events = await wait_history(client, session, has("run.cancelled", runId=run))
    kinds = types(events)
    assert kinds[kinds.index("run.stop.requested") :] == [
        "run.stop.requested",
        "interrupt.resolved",
        "run.resumed",
        "run.cancelled",
    ]
    resolved = of_type(events, "interrupt.resolved")[0]
    assert (resolved["decision"], resolved["reason"]) == ("expired", "stopped")


async def test_a_stop_while_a_client_tool_runs_cancels_the_call(
    narad_server: NaradServer, client: Client, org: str
) -> None:
    desk = f"desk-{uuid.uuid4().hex[:6]}"
    executor, _, controls = await executor_api(narad_server, org, desk)
    outcomes: list[str] = []

    async def handler(ctx: RunContext) -> None:
        try:
            await ctx.client_tool("build.everything", {})
        except RunStopped:
            outcomes.append("stopped")
            raise

    async with executor:
        session, run = await start(client, client_executor_id=desk)
        async with serving(client, handler):
            calls: list[dict[str, Any]] = []
            while not calls:
                calls = await controls()  # delivered: the executor has it, and never finishes
            await client.stop_run(session, run_id=run)
            events = await wait_history(client, session, has("run.cancelled", runId=run))
    assert outcomes == ["stopped"]
    finished = of_type(events, "tool.call.finished")
    assert len(finished) == 1
    assert (finished[0]["outcome"], finished[0]["code"], finished[0]["response"]) == (
        "cancelled",
        "stopped",
        None,
    )
    assert types(events)[-2:] == ["tool.call.finished", "run.cancelled"]


# --- lost runtimes, replay and releases -----------------------------------


async def test_a_killed_runtime_loses_its_run_to_another_that_sees_its_calls_closed(
    short_client: Client,
) -> None:
    client = short_client
    contexts: list[RunContext] = []
    calls: list[int] = []

    async def slow(args: dict[str, Any]) -> str:
        calls.append(len(contexts))
        if len(contexts) == 1:
            await forever()  # the first runtime dies in here
        return "done"

    async def handler(ctx: RunContext) -> None:
        contexts.append(ctx)
        await ctx.say("Working on it.")
        result = await ctx.tool("slow.job", {}, slow)
        await ctx.say(f" Result: {result}.")
        await ctx.finish()

    session, run = await start(client, runtime=RuntimeOptions(queue="default", on_lost="retry"))
    first = Runtime(client, handler, claim_wait=1.0)
    first_task = asyncio.create_task(first.run())
    await wait_history(client, session, has("tool.call.started", runId=run))
    await kill(first_task)
    async with serving(client, handler):
        events = await wait_history(client, session, has("run.finished", runId=run))
    assert [c.attempt for c in contexts] == [1, 2]
    assert contexts[1].reason == "retry"
    assert calls == [1, 2]
    started = of_type(events, "tool.call.started")
    finished = of_type(events, "tool.call.finished")
    # The lost holder's call, closed by the server; then the second holder's own.
    assert [(f["outcome"], f.get("code")) for f in finished] == [
        ("cancelled", "runtime_lost"),
        ("success", None),
    ]
    assert finished[0]["toolCallId"] == started[0]["toolCallId"]
    assert finished[1]["toolCallId"] == started[1]["toolCallId"] == started[0]["toolCallId"] + ".2"
    # The second holder saw the repair in its journal before it went on.
    seen = {e["eventId"] for e in contexts[1].journal}
    assert finished[0]["eventId"] in seen
    # The first holder's message was complete: it is not said again.
    said = [d["delta"] for d in of_type(events, "message.text.delta")]
    assert said == ["Working on it.", " Result: done."]


async def test_a_new_holder_carries_on_a_half_said_message_and_adopts_the_approval(
    short_client: Client,
) -> None:
    client = short_client
    decisions: list[str] = []

    async def handler(ctx: RunContext) -> None:
        await ctx.say("Hello ")
        await asyncio.sleep(0.3)  # "Hello " goes out
        if ctx.attempt == 1:
            await forever()  # the first runtime dies mid-message
        await ctx.say("world")
        decision = await ctx.approve("Go on?")
        if ctx.attempt == 2:
            await forever()  # the second dies waiting for the person
        decisions.append(decision)
        await ctx.finish()

    session, run = await start(client, runtime=RuntimeOptions(queue="default", max_attempts=5))
    task = asyncio.create_task(Runtime(client, handler, claim_wait=1.0).run())
    await wait_history(client, session, has("message.text.delta", runId=run))
    await kill(task)
    task = asyncio.create_task(Runtime(client, handler, claim_wait=1.0).run())
    events = await wait_history(client, session, has("run.paused", runId=run))
    await kill(task)
    async with serving(client, handler):
        await asyncio.sleep(3)  # the lease of the second lapses; the third holds the run
        interrupt = of_type(events, "interrupt.requested")[0]["interruptId"]
        await client.resolve_interrupt(session, interrupt_id=interrupt, decision="approve")
        events = await wait_history(client, session, has("run.finished", runId=run))
    assert decisions == ["approve"]
    assert len(of_type(events, "interrupt.requested")) == 1
    assert len(of_type(events, "message.text.started")) == 1
    assert "".join(d["delta"] for d in of_type(events, "message.text.delta")) == "Hello world"
    assert [d["delta"] for d in of_type(events, "message.text.delta")] == ["Hello ", "world"]


async def test_a_handler_that_raises_is_not_released_and_the_run_is_retried(
    short_client: Client,
) -> None:
    client = short_client
    attempts: list[tuple[int, str]] = []

    async def handler(ctx: RunContext) -> None:
        attempts.append((ctx.attempt, ctx.reason))
        if ctx.attempt == 1:
            raise ValueError("the model provider is down")
        await ctx.finish()

    session, run = await start(client, runtime=RuntimeOptions(queue="default", on_lost="retry"))
    async with serving(client, handler):
        await wait_history(client, session, has("run.finished", runId=run))
    assert attempts == [(1, "started"), (2, "retry")]


async def test_a_lost_runtime_under_on_lost_fail_ends_the_run_in_error(
    short_client: Client,
) -> None:
    client = short_client

    async def handler(ctx: RunContext) -> None:
        await ctx.tool("never.finished", {}, lambda args: forever())

    session, run = await start(client, runtime=RuntimeOptions(queue="default", on_lost="fail"))
    task = asyncio.create_task(Runtime(client, handler, claim_wait=1.0).run())
    await wait_history(client, session, has("tool.call.started", runId=run))
    await kill(task)
    events = await wait_history(client, session, has("run.error", runId=run))
    assert of_type(events, "run.error")[0]["code"] == "runtime_lost"
    assert of_type(events, "tool.call.finished")[0]["outcome"] == "cancelled"


class _Zombie(Runtime):
    """A runtime that stops renewing its leases (a process that froze)."""

    async def _keep(self, ctx: RunContext) -> None:
        await forever()


async def test_a_zombie_whose_lease_lapsed_cannot_append(short_client: Client) -> None:
    client = short_client
    refusals: list[NaradError] = []
    lost: list[bool] = []

    async def handler(ctx: RunContext) -> None:
        if ctx.attempt == 1:
            await asyncio.sleep(3.5)  # no heartbeats: the lease lapses meanwhile
            try:
                await ctx.say("too late")
                await ctx.finish()
            except LeaseLost as e:
                refusals.append(e)
                lost.append(ctx.lost)
                raise
        else:
            await ctx.finish()

    session, run = await start(client)
    async with serving(client, handler, kind=_Zombie, runtime_id="zombie"):
        await wait_history(client, session, has("run.finished", runId=run), timeout=20)
    assert [(e.status, e.code) for e in refusals] == [(409, "NRD-0501")]
    assert lost == [True]
    events = await history(client, session)
    assert "message.text.delta" not in types(events)


async def test_released_while_waiting_the_run_comes_back_and_replays(client: Client) -> None:
    calls: list[str] = []

    async def handler(ctx: RunContext) -> None:
        calls.append(ctx.reason)
        await ctx.think("A person should say yes first.")
        await ctx.say("Asking you first.")
        decision = await ctx.approve("May I?")
        await ctx.say(f" You said {decision}.")
        await ctx.finish()

    session, run = await start(client)
    async with serving(client, handler, release_when_waiting=True) as runtime:
        events = await wait_history(client, session, has("run.paused", runId=run))
        await until(lambda: not runtime.held)  # given back while it waits
        assert calls == ["started"]
        interrupt = of_type(events, "interrupt.requested")[0]["interruptId"]
        await client.resolve_interrupt(session, interrupt_id=interrupt, decision="approve")
        events = await wait_history(client, session, has("run.finished", runId=run))
    assert calls == ["started", "event"]
    assert len(of_type(events, "reasoning.started")) == 1
    assert len(of_type(events, "interrupt.requested")) == 1
    said = "".join(d["delta"] for d in of_type(events, "message.text.delta"))
    assert said == "Asking you first. You said approve."


async def test_a_runtime_holds_at_most_its_concurrency(client: Client) -> None:
    gate = asyncio.Event()
    active: list[int] = []
    peak = [0]

    async def handler(ctx: RunContext) -> None:
        active.append(1)
        peak[0] = max(peak[0], len(active))
        await gate.wait()
        active.pop()
        await ctx.finish()

    runs = [await start(client) for _ in range(3)]
    async with serving(client, handler, concurrency=2) as runtime:
        await until(lambda: len(runtime.held) == 2)
        await asyncio.sleep(1.5)  # a third claim would have come by now
        assert len(runtime.held) == 2 and peak[0] == 2
        gate.set()
        for session, run in runs:
            await wait_history(client, session, has("run.finished", runId=run))
    assert peak[0] == 2


async def test_a_refused_claim_ends_the_loop(narad_server: NaradServer, org: str) -> None:
    async with Client(narad_server.base, narad_server.token("reader", org=org)) as reader:

        async def handler(ctx: RunContext) -> None:
            raise AssertionError("never claimed")

        with pytest.raises(NaradError) as refused:
            await asyncio.wait_for(Runtime(reader, handler, claim_wait=1.0).run(), timeout=10)
    assert (refused.value.status, refused.value.code) == (403, "NRD-0102")


# --- nested runs ------------------------------------------------------------


async def test_a_nested_run_writes_under_its_parent_and_ends_before_it(client: Client) -> None:
    async def handler(ctx: RunContext) -> None:
        await ctx.say("Handing over.")
        async with ctx.nested("billing", input={"agent": "billing"}) as child:
            assert child.parent is ctx and child.run_id != ctx.run_id
            await child.say("Billing here.")
            await child.tool("invoice.find", {"n": 7}, lambda args: {"found": args["n"]})
        await ctx.say("Back.")
        await ctx.finish()

    session, run = await start(client)
    async with serving(client, handler):
        events = await wait_history(client, session, has("run.finished", runId=run))
    child_id = f"{run}.billing.run"
    started = [e for e in of_type(events, "run.started") if e["runId"] == child_id]
    assert len(started) == 1
    assert started[0]["parentRunId"] == run and started[0]["rootRunId"] == run
    assert started[0]["input"] == {"agent": "billing"}
    assert "clientExecutorId" not in started[0]  # the parent has none
    mine = [e for e in events if e["runId"] == child_id]
    assert types(mine) == [
        "run.started",
        "message.text.started",
        "message.text.delta",
        "message.text.completed",
        "tool.call.started",
        "tool.call.finished",
        "run.finished",
    ]
    assert all(e["rootRunId"] == run for e in events if e.get("rootRunId"))
    assert said(events, child_id) == "Billing here."
    assert said(events, run) == "Handing over.Back."
    kinds = types(events)
    assert kinds[-1] == "run.finished" and events[-1]["runId"] == run


async def test_a_nested_run_records_its_parents_client_executor(
    narad_server: NaradServer, client: Client, org: str
) -> None:
    desk = f"desk-{uuid.uuid4().hex[:6]}"
    await executor_api(narad_server, org, desk)

    async def handler(ctx: RunContext) -> None:
        async with ctx.nested() as child:
            assert child.client_executor_id == desk
        await ctx.finish()

    session, run = await start(client, client_executor_id=desk)
    async with serving(client, handler):
        events = await wait_history(client, session, has("run.finished", runId=run))
    nested = [e for e in of_type(events, "run.started") if e.get("parentRunId") == run]
    assert [e["clientExecutorId"] for e in nested] == [desk]


async def test_a_nested_run_that_raises_ends_in_error_and_the_parent_goes_on(
    client: Client,
) -> None:
    async def handler(ctx: RunContext) -> None:
        try:
            async with ctx.nested("flaky") as child:
                await child.say("Trying.")
                raise RuntimeError("the sub-agent broke")
        except RuntimeError:
            await ctx.say("The sub-agent failed; answering myself.")
        await ctx.finish()

    session, run = await start(client)
    async with serving(client, handler):
        events = await wait_history(client, session, has("run.finished", runId=run))
    child_id = f"{run}.flaky.run"
    error = terminal(events, child_id)
    assert error["type"] == "run.error"
    assert (error["code"], error["message"]) == ("nested_run_failed", "the sub-agent broke")
    kinds = [(e["type"], e["runId"]) for e in events if e["type"].startswith("message.text.com")]
    assert kinds[0] == ("message.text.completed", child_id)  # completed before its error
    assert terminal(events, run)["type"] == "run.finished"


async def test_a_stop_of_the_run_cancels_its_nested_run_first(client: Client) -> None:
    async def handler(ctx: RunContext) -> None:
        async with ctx.nested("talker") as child:
            for n in range(400):
                await child.say(f"word{n} ")
                await asyncio.sleep(0.02)
        await ctx.finish()

    session, run = await start(client)
    async with serving(client, handler):
        await wait_history(client, session, lambda es: len(of_type(es, "message.text.delta")) >= 3)
        await client.stop_run(session, run_id=run)
        events = await wait_history(client, session, has("run.cancelled", runId=run))
    child_id = f"{run}.talker.run"
    tail = [(e["type"], e["runId"]) for e in events][-3:]
    assert tail == [
        ("message.text.completed", child_id),
        ("run.cancelled", child_id),
        ("run.cancelled", run),
    ]


async def test_no_nested_run_starts_once_the_run_was_asked_to_stop(client: Client) -> None:
    refused: list[str] = []

    async def handler(ctx: RunContext) -> None:
        await ctx.say("Working.")
        await ctx._wait_for(lambda: True if ctx.stop_requested else None)
        try:
            async with ctx.nested("late"):
                pass
        except RunStopped:
            refused.append("nested")
            raise

    session, run = await start(client)
    async with serving(client, handler):
        await wait_history(client, session, has("message.text.delta", runId=run))
        await client.stop_run(session, run_id=run)
        events = await wait_history(client, session, has("run.cancelled", runId=run))
    # §6.3: after run.stop.requested the backend starts no new child run.
    assert refused == ["nested"]
    assert [e["runId"] for e in of_type(events, "run.started")] == [run]


async def test_a_nested_run_waiting_on_a_person_is_released_and_replayed_once(
    client: Client,
) -> None:
    entered: list[str] = []

    async def handler(ctx: RunContext) -> None:
        async with ctx.nested("reviewer", input={"agent": "reviewer"}) as child:
            entered.append(child.run_id)
            await child.say("Reviewing.")
            decision = await child.approve("Ship it?")
            await child.say(f" {decision}.")
        await ctx.finish()

    session, run = await start(client)
    async with serving(client, handler, release_when_waiting=True) as runtime:
        events = await wait_history(client, session, has("run.paused"))
        await until(lambda: not runtime.held)
        interrupt = of_type(events, "interrupt.requested")[0]
        assert interrupt["runId"] == f"{run}.reviewer.run"
        await client.resolve_interrupt(
            session, interrupt_id=interrupt["interruptId"], decision="approve"
        )
        events = await wait_history(client, session, has("run.finished", runId=run))
    child_id = f"{run}.reviewer.run"
    assert entered == [child_id, child_id]  # entered again on the second claim
    assert [e["runId"] for e in of_type(events, "run.started")] == [run, child_id]
    assert said(events, child_id) == "Reviewing. approve."
    assert terminal(events, child_id)["type"] == "run.finished"


async def test_a_nested_run_an_earlier_holder_left_open_is_closed_before_the_finish(
    client: Client,
) -> None:
    async def handler(ctx: RunContext) -> None:
        # What a lost holder leaves: a nested run started, nobody in it.
        orphan = f"{ctx.run_id}.lost.run"
        await ctx.append([ctx.event("run.started", runId=orphan, parentRunId=ctx.run_id)])
        await ctx.append(
            [
                ctx.event(
                    "message.text.started",
                    runId=orphan,
                    messageId="m-lost",
                    role="assistant",
                    messageScope="run",
                )
            ]
        )
        async with ctx.nested("kept") as child:
            await child.say("Still here.")
            await child.finish()
        await ctx.finish()

    session, run = await start(client)
    async with serving(client, handler):
        events = await wait_history(client, session, has("run.finished", runId=run))
    tail = [(e["type"], e["runId"]) for e in events][-3:]
    assert tail == [
        ("message.text.completed", f"{run}.lost.run"),
        ("run.cancelled", f"{run}.lost.run"),
        ("run.finished", run),
    ]
    closed = terminal(events, f"{run}.lost.run")
    assert closed["code"] == "runtime_lost"
    assert terminal(events, f"{run}.kept.run")["type"] == "run.finished"


# --- without a server -----------------------------------------------------


def test_runtime_settings_are_checked() -> None:
    client = Client("http://127.0.0.1:1", "t")

    async def handler(ctx: RunContext) -> None:
        return None

    bad_settings: list[dict[str, Any]] = [
        {"concurrency": 0},
        {"claim_wait": 31.0},
        {"queue": ""},
        {"poll_interval": 0},
    ]
    for bad in bad_settings:
        with pytest.raises(ValueError):
            Runtime(client, handler, **bad)


def test_ids_are_readable_and_never_longer_than_the_protocol_allows() -> None:
    assert _ident("run-1", 3, "tool") == "run-1.3.tool"
    long = _ident("r" * 300, 3, "tool")
    assert len(long) <= 256 and long.endswith(".tool")
    assert long == _ident("r" * 300, 3, "tool") != _ident("r" * 300, 4, "tool")


def test_the_journal_folds_only_without_gaps() -> None:
    journal = _Journal("r1")

    def event(sequence: int, kind: str, **fields: Any) -> dict[str, Any]:
        return {
            "type": kind,
            "rootRunId": "r1",
            "runId": "r1",
            "sequence": sequence,
            "sessionSequence": sequence + 10,
            **fields,
        }

    journal.add(event(1, "run.started"))
    journal.add(event(3, "tool.call.finished", toolCallId="t", outcome="success"))
    journal.add({"type": "run.started", "rootRunId": "other", "runId": "other", "sequence": 2})
    assert [e["type"] for e in journal.advance()] == ["run.started"]
    assert journal.has_gap and journal.session_through == 11
    journal.add(event(2, "tool.call.started", toolCallId="t", executor="backend"))
    assert [e["sequence"] for e in journal.advance()] == [2, 3]
    assert journal.run("r1").open_calls == {} and journal.session_through == 13
    assert journal.step_ids("r1.1.tool", ["r1.1.tool.2", "r1.1.tool", "r1.10.tool"]) == [
        "r1.1.tool",
        "r1.1.tool.2",
    ]
