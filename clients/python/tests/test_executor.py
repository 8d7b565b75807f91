"""The client executor loop against a real ``narad serve`` (and its token stores on their own).

Each server test binds run r1 of a fresh session to a fresh executor id,
starts client tool calls as a backend would (``tool.call.started`` with
``executor: "client"``), and reads the terminal from history. The restart
tests run the executor in a child process and kill it with SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from conftest import NaradServer

from narad.client import Client, Event
from narad.errors import NaradError
from narad.executor import (
    CLIENT_RESTARTED,
    TOOL_ERROR,
    UNKNOWN_TOOL,
    AcceptedToken,
    Executor,
    FileTokenStore,
    MemoryTokenStore,
    TokenStoreError,
    ToolResult,
)

T = TypeVar("T")

# Short heartbeats and leases, so that lost leases show within a second.
SHORT_EXECUTOR_LEASES = {
    "NARAD_EXECUTOR_HEARTBEAT_MS": "300",
    "NARAD_EXECUTOR_LEASE_TTL_MS": "3000",
}


@pytest.fixture
def server(start_server: Callable[..., NaradServer]) -> NaradServer:
    """The conftest's ``narad serve``, with short executor heartbeats and leases."""
    return start_server(**SHORT_EXECUTOR_LEASES)


# --- helpers ---------------------------------------------------------------------


async def until(what: str, check: Callable[[], Awaitable[T | None]], seconds: float = 20) -> T:
    """Polls ``check`` every 50 ms until it gives a value; fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        got = await check()
        if got is not None:
            return got
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        await asyncio.sleep(0.05)


class Bound:
    """A fresh session whose run r1 is bound to a fresh executor id."""

    def __init__(self, server: NaradServer, org: str, writer: Client) -> None:
        self.server = server
        self.org = org
        self.writer = writer
        self.session_id = f"s-{uuid.uuid4().hex[:12]}"
        self.executor_id = f"desk-{uuid.uuid4().hex[:12]}"

    async def bind(self) -> Bound:
        await self.writer.create_session(self.session_id)
        await self.writer.start_run(
            self.session_id, run_id="r1", client_executor_id=self.executor_id
        )
        return self

    async def start_call(self, tool_call_id: str, tool_name: str, args: dict[str, Any]) -> None:
        """Appends ``tool.call.started`` with ``executor: client``, as a backend."""
        await self.writer.append(
            self.session_id,
            [
                {
                    "protocolVersion": "narad/v1",
                    "type": "tool.call.started",
                    "eventId": f"{self.session_id}-{tool_call_id}-started",
                    "runId": "r1",
                    "rootRunId": "r1",
                    "toolCallId": tool_call_id,
                    "toolName": tool_name,
                    "executor": "client",
                    "args": args,
                }
            ],
        )

    async def finishes(self) -> list[Event]:
        """Every ``tool.call.finished`` of the session so far."""
        return [
            e
            async for e in self.writer.all_history(self.session_id)
            if e["type"] == "tool.call.finished"
        ]

    async def finish_of(self, tool_call_id: str, seconds: float = 20) -> Event:
        """Waits for the call's ``tool.call.finished``."""

        async def check() -> Event | None:
            return next((e for e in await self.finishes() if e["toolCallId"] == tool_call_id), None)

        return await until(f"tool.call.finished of {tool_call_id}", check, seconds)

    def executor_client(self, http: httpx.AsyncClient | None = None) -> Client:
        """A client with a token of role ``executor``."""
        return Client(self.server.base, self.token("executor", "desk"), http=http)

    def token(self, roles: str, sub: str) -> str:
        """A token of the test's tenant."""
        return self.server.token(roles, org=self.org, sub=sub)


@pytest.fixture
async def writer(server: NaradServer, org: str) -> AsyncIterator[Client]:
    """A client of role reader, writer and backend, in the test's own tenant."""
    async with Client(server.base, server.token("reader,writer,backend", org=org)) as c:
        yield c


@pytest.fixture
async def bound(server: NaradServer, org: str, writer: Client) -> Bound:
    """A fresh session bound to a fresh executor id."""
    return await Bound(server, org, writer).bind()


class Running:
    """An executor running in a task of this process."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.task = asyncio.create_task(executor.run())

    async def attached(self, times: int = 1) -> str:
        """Waits until the executor was attached ``times`` times; its lease."""

        async def check() -> str | None:
            if self.task.done():
                self.task.result()  # raises what ended it
            lease = self.executor.lease_id
            return lease if self.executor.stats.attachments >= times and lease else None

        return await until(f"attachment #{times}", check)

    async def stop(self) -> None:
        """Stops the executor and waits for its run to end."""
        self.executor.stop()
        await asyncio.wait_for(self.task, 30)


# --- tools run once; errors and unknown tools -------------------------------------


async def test_a_tool_runs_once_and_its_response_is_the_finish(bound: Bound) -> None:
    calls: list[dict[str, Any]] = []
    async with bound.executor_client() as client:
        executor = Executor(client, bound.executor_id, poll_wait=5)

        @executor.tool("math.add")
        def add(args: dict[str, Any]) -> Any:  # a plain def runs in a thread
            calls.append(args)
            return {"sum": args["a"] + args["b"]}

        @executor.tool()
        async def shout(args: dict[str, Any]) -> Any:
            return {"text": str(args["text"]).upper(), "list": [1, None, True]}

        running = Running(executor)
        await running.attached()
        await bound.start_call("tc1", "math.add", {"a": 2, "b": 3})
        await bound.start_call("tc2", "shout", {"text": "hi"})
        tc1 = await bound.finish_of("tc1")
        tc2 = await bound.finish_of("tc2")
        await running.stop()

    assert (tc1["outcome"], tc1["response"]) == ("success", {"sum": 5})
    assert (tc2["outcome"], tc2["response"]) == ("success", {"text": "HI", "list": [1, None, True]})
    assert "code" not in tc1
    assert calls == [{"a": 2, "b": 3}]
    assert executor.ran == ["tc1", "tc2"]
    assert executor.stats.executions_started == 2
    assert executor.stats.finishes_accepted == 2
    # The two tools run at once: their finishes may land in either order.
    assert sorted(e["toolCallId"] for e in await bound.finishes()) == ["tc1", "tc2"]


async def test_a_raising_tool_finishes_error_tool_error_with_its_message(bound: Bound) -> None:
    async with bound.executor_client() as client:

        async def broken(args: dict[str, Any]) -> Any:
            raise RuntimeError(f"cannot open {args['path']}")

        def not_json(args: dict[str, Any]) -> Any:
            return {"when": object()}

        def chosen(args: dict[str, Any]) -> Any:
            return ToolResult.error("file_missing", "no such file", {"path": "/x"})

        tools = {"open.file": broken, "not.json": not_json, "chosen.error": chosen}
        executor = Executor(client, bound.executor_id, tools, poll_wait=5)
        running = Running(executor)
        await running.attached()
        await bound.start_call("tc1", "open.file", {"path": "/nope"})
        await bound.start_call("tc2", "not.json", {})
        await bound.start_call("tc3", "chosen.error", {})
        tc1 = await bound.finish_of("tc1")
        tc2 = await bound.finish_of("tc2")
        tc3 = await bound.finish_of("tc3")
        await running.stop()

    assert tc1["outcome"] == "error"
    assert tc1["code"] == TOOL_ERROR
    assert tc1["message"] == "cannot open /nope"
    assert tc1["response"] is None
    assert (tc2["outcome"], tc2["code"]) == ("error", TOOL_ERROR)
    assert "not JSON" in tc2["message"]
    assert (tc3["outcome"], tc3["code"], tc3["message"]) == (
        "error",
        "file_missing",
        "no such file",
    )
    assert tc3["response"] == {"path": "/x"}


async def test_an_unknown_tool_finishes_error_unknown_tool_and_runs_nothing(bound: Bound) -> None:
    async with bound.executor_client() as client:
        executor = Executor(client, bound.executor_id, {"echo": lambda a: a}, poll_wait=5)
        running = Running(executor)
        await running.attached()
        await bound.start_call("tc1", "open.file", {"path": "/x"})
        tc1 = await bound.finish_of("tc1")
        await running.stop()

    assert (tc1["outcome"], tc1["code"]) == ("error", UNKNOWN_TOOL)
    assert "open.file" in tc1["message"]
    assert executor.ran == []
    assert executor.stats.unknown_tools == 1


# --- duplicate deliveries -------------------------------------------------------------


class Redeliver(httpx.AsyncBaseTransport):
    """Answers the next controls poll after one that handed out calls with the same calls again.

    As if the server (or a proxy) delivered every ``client.tool.execute`` twice.
    """

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.replay: bytes | None = None
        self.replayed = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/controls") and self.replay is not None:
            body, self.replay = self.replay, None
            self.replayed += 1
            return httpx.Response(200, content=body, headers={"content-type": "application/json"})
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/controls") and response.status_code == 200:
            body = await response.aread()
            if json.loads(body).get("controls"):
                self.replay = body
            return httpx.Response(200, content=body, headers=response.headers)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_duplicate_delivery_never_runs_the_tool_again(bound: Bound) -> None:
    runs: list[int] = []
    transport = Redeliver()
    release = asyncio.Event()
    http = httpx.AsyncClient(transport=transport)  # a Client leaves a given httpx client open
    async with http, bound.executor_client(http) as client:

        async def slow(args: dict[str, Any]) -> Any:
            runs.append(args["n"])
            await release.wait()  # still running when the copy arrives
            return {"n": args["n"]}

        def fast(args: dict[str, Any]) -> Any:
            runs.append(args["n"])
            return {"n": args["n"]}

        executor = Executor(client, bound.executor_id, {"slow": slow, "fast": fast}, poll_wait=5)
        running = Running(executor)
        await running.attached()
        # A copy delivered while the tool runs, then one after its finish.
        await bound.start_call("tc1", "slow", {"n": 1})
        await until("the copy of tc1", async_value(lambda: transport.replayed >= 1 or None))
        await until(
            "the copy of tc1 handled",
            async_value(lambda: executor.stats.duplicate_deliveries >= 1 or None),
        )
        release.set()
        await bound.finish_of("tc1")
        await bound.start_call("tc2", "fast", {"n": 2})
        await bound.finish_of("tc2")
        await until(
            "the copy of tc2", async_value(lambda: executor.stats.duplicate_deliveries >= 2 or None)
        )
        await running.stop()

    assert runs == [1, 2]
    assert transport.replayed == 2
    assert executor.stats.executions_started == 2
    assert [e["toolCallId"] for e in await bound.finishes()] == ["tc1", "tc2"]


def async_value(check: Callable[[], T | None]) -> Callable[[], Awaitable[T | None]]:
    """``check`` as the coroutine function :func:`until` wants."""

    async def call() -> T | None:
        return check()

    return call


# --- lost leases -------------------------------------------------------------------------


async def test_a_superseded_lease_is_recovered_by_attaching_again(bound: Bound) -> None:
    async with bound.executor_client() as client:
        executor = Executor(client, bound.executor_id, {"echo": lambda a: a}, poll_wait=5)
        running = Running(executor)
        first = await running.attached()
        # Another attachment of the same id supersedes the executor's lease.
        intruder = await client.request("POST", f"/v1/executors/{bound.executor_id}/attach")
        assert intruder["leaseId"] != first
        second = await running.attached(2)
        assert second not in (first, intruder["leaseId"])
        assert executor.stats.leases_lost == 1
        # The executor's new lease superseded the intruder's...
        with pytest.raises(NaradError) as refused:
            await client.request(
                "GET",
                f"/v1/executors/{bound.executor_id}/controls",
                params={"leaseId": intruder["leaseId"], "waitMs": 0},
            )
        assert (refused.value.status, refused.value.code) == (409, "NRD-0401")
        # ...and calls reach it.
        await bound.start_call("tc1", "echo", {"after": "re-attach"})
        tc1 = await bound.finish_of("tc1")
        await running.stop()

    assert (tc1["outcome"], tc1["response"]) == ("success", {"after": "re-attach"})


async def test_a_call_accepted_under_a_lost_lease_finishes_under_it(bound: Bound) -> None:
    release = asyncio.Event()
    async with bound.executor_client() as client:

        async def wait(args: dict[str, Any]) -> Any:
            await release.wait()
            return {"done": True}

        executor = Executor(client, bound.executor_id, {"wait": wait}, poll_wait=5)
        running = Running(executor)
        first = await running.attached()
        await bound.start_call("tc1", "wait", {})
        await until("tc1 running", async_value(lambda: executor.ran or None))
        await client.request("POST", f"/v1/executors/{bound.executor_id}/attach")
        second = await running.attached(2)
        assert second != first
        release.set()  # its finish names the first lease (§11.3.8)
        tc1 = await bound.finish_of("tc1")
        await running.stop()

    assert (tc1["outcome"], tc1["response"]) == ("success", {"done": True})
    assert executor.stats.finishes_refused == 0


class Unavailable(httpx.AsyncBaseTransport):
    """Answers the first attach 503 with ``Retry-After: 1``, and records when each attach came."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.attaches: list[float] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/attach"):
            self.attaches.append(time.monotonic())
            if len(self.attaches) == 1:
                body = {"code": "NRD-0901", "title": "Database unavailable", "message": "busy"}
                return httpx.Response(503, json=body, headers={"retry-after": "1"})
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_retry_after_is_waited_out_before_attaching_again(bound: Bound) -> None:
    transport = Unavailable()
    http = httpx.AsyncClient(transport=transport)  # a Client leaves a given httpx client open
    async with http, bound.executor_client(http) as client:
        executor = Executor(client, bound.executor_id, {"echo": lambda a: a}, poll_wait=5)
        running = Running(executor)
        await running.attached()
        await running.stop()

    first, second = transport.attaches[:2]
    assert second - first >= 1.0, "attached again before Retry-After passed"
    assert executor.stats.attachments == 1


async def test_a_token_without_the_executor_role_is_refused_for_good(bound: Bound) -> None:
    reader = bound.token("reader,writer,backend", "pytest")
    async with Client(bound.server.base, reader) as client:
        executor = Executor(client, bound.executor_id, poll_wait=5)
        with pytest.raises(NaradError) as refused:
            await asyncio.wait_for(executor.run(), 20)
    assert (refused.value.status, refused.value.code) == (403, "NRD-0102")


async def test_stopping_lets_a_running_tool_finish_and_sends_its_result(bound: Bound) -> None:
    async with bound.executor_client() as client:

        async def slow(args: dict[str, Any]) -> Any:
            await asyncio.sleep(0.5)
            return {"slept": True}

        executor = Executor(client, bound.executor_id, {"slow": slow}, poll_wait=5)
        running = Running(executor)
        await running.attached()
        await bound.start_call("tc1", "slow", {})
        await until("tc1 running", async_value(lambda: executor.ran or None))
        await running.stop()  # within the grace: the tool ends, its finish goes

    assert executor.stats.finishes_accepted == 1
    tc1 = await bound.finish_of("tc1", seconds=1)
    assert (tc1["outcome"], tc1["response"]) == ("success", {"slept": True})


# --- restarts: a process killed with SIGKILL ------------------------------------------------

_CHILD = r"""
import asyncio, json, os, sys

import httpx

from narad.client import Client
from narad.executor import Executor, FileTokenStore

cfg = json.loads(sys.argv[1])


class BlockFinishes(httpx.AsyncBaseTransport):
    # With mode "block_finish", every finish is answered 503: its result stays stored.
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if cfg["mode"] == "block_finish" and request.url.path.endswith("/finish"):
            return httpx.Response(
                503, json={"code": "NRD-0901", "title": "test", "message": "finish blocked"}
            )
        return await self.inner.handle_async_request(request)


async def main() -> None:
    http = httpx.AsyncClient(transport=BlockFinishes(), timeout=60)
    async with Client(cfg["base"], cfg["token"], http=http) as client:
        executor = Executor(
            client, cfg["executor_id"], store=FileTokenStore(cfg["store"]), poll_wait=2
        )

        @executor.tool("side.effect")
        async def side_effect(args):
            with open(cfg["side_effect"], "a") as f:
                f.write(json.dumps(args) + "\n")
                f.flush()
                os.fsync(f.fileno())
            if cfg["mode"] == "hang":
                await asyncio.Event().wait()  # killed here, before any result
            return {"pid": os.getpid(), "args": args}

        await executor.run()


asyncio.run(main())
"""


class Child:
    """An executor process with a FileTokenStore and the tool ``side.effect``."""

    def __init__(self, bound: Bound, store: Path, side_effect: Path, mode: str) -> None:
        cfg = {
            "base": bound.server.base,
            "token": bound.token("executor", "child"),
            "executor_id": bound.executor_id,
            "store": str(store),
            "side_effect": str(side_effect),
            "mode": mode,
        }
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(cfg)])

    def kill(self) -> None:
        """SIGKILL: no handler, no flush, no goodbye."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        assert self.proc.returncode == -signal.SIGKILL

    def alive(self) -> None:
        assert self.proc.poll() is None, f"the executor process ended: {self.proc.returncode}"


def side_effects(path: Path) -> list[Any]:
    """What the tool ``side.effect`` wrote, one entry per run."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def replacement(bound: Bound, client: Client, store: FileTokenStore, side_effect: Path) -> Executor:
    """An executor with the killed one's store and a ``side.effect`` that would run again."""

    def again(args: dict[str, Any]) -> Any:
        with open(side_effect, "a") as f:
            f.write(json.dumps({"again": args}) + "\n")
        return {"ranAgain": True}

    return Executor(client, bound.executor_id, {"side.effect": again}, store, poll_wait=5)


async def test_a_process_killed_mid_call_is_never_run_again(bound: Bound, tmp_path: Path) -> None:
    store, effects = tmp_path / "tokens.jsonl", tmp_path / "effects.jsonl"
    child = Child(bound, store, effects, mode="hang")
    try:
        await bound.start_call("tc1", "side.effect", {"n": 1})
        await until("the side effect", async_value(lambda: side_effects(effects) or None), 30)
        child.alive()
    finally:
        child.kill()
    lines = [json.loads(line) for line in store.read_text().splitlines()]
    assert [line["op"] for line in lines] == ["accepted"]  # accepted, durably, before it ran

    with FileTokenStore(store) as tokens:
        async with bound.executor_client() as client:
            executor = replacement(bound, client, tokens, effects)
            running = Running(executor)
            tc1 = await bound.finish_of("tc1")
            await running.attached()
            await running.stop()

    assert (tc1["outcome"], tc1["code"]) == ("error", CLIENT_RESTARTED)
    assert side_effects(effects) == [{"n": 1}], "the tool ran exactly once"
    assert executor.ran == []
    assert executor.stats.restarted_recovered == 1
    assert len(await bound.finishes()) == 1


async def test_a_stored_result_is_finished_after_a_restart(bound: Bound, tmp_path: Path) -> None:
    store, effects = tmp_path / "tokens.jsonl", tmp_path / "effects.jsonl"
    child = Child(bound, store, effects, mode="block_finish")

    def result_stored() -> bool | None:
        text = store.read_text() if store.exists() else ""
        ops = [json.loads(line)["op"] for line in text.splitlines()]
        return True if "result" in ops else None

    try:
        await bound.start_call("tc1", "side.effect", {"n": 7})
        await until("the stored result", async_value(result_stored), 30)
        child.alive()
    finally:
        child.kill()
    assert await bound.finishes() == []  # the server has no finish yet

    with FileTokenStore(store) as tokens:
        async with bound.executor_client() as client:
            executor = replacement(bound, client, tokens, effects)
            running = Running(executor)
            tc1 = await bound.finish_of("tc1")
            await until(
                "the finish recorded", async_value(lambda: executor.stats.finishes_accepted or None)
            )
            await running.stop()

    assert tc1["outcome"] == "success"
    assert tc1["response"] == {"pid": child.proc.pid, "args": {"n": 7}}
    assert side_effects(effects) == [{"n": 7}], "the tool ran exactly once"
    assert executor.ran == []
    with FileTokenStore(store) as reopened:
        assert await reopened.pending() == []  # marked finished: never sent again


# --- token stores on their own ---------------------------------------------------------------


def accepted(token: str, expires_at: str = "2999-01-01T00:00:00Z") -> AcceptedToken:
    return AcceptedToken(token, "desk", "L1", f"tc-{token}", "echo", expires_at)


async def test_a_file_store_survives_reopening_and_reads_the_rust_sdk_lines(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens.jsonl"
    # Lines as services/narad-client's FileTokenStore writes them.
    rust = [
        {"op": "accepted", **accepted("r1").to_json()},
        {
            "op": "result",
            "executionToken": "r1",
            "result": {"outcome": "error", "response": None, "code": "boom", "message": "m"},
        },
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in rust))
    with FileTokenStore(path) as store:
        assert await store.accept(accepted("t1"))
        assert not await store.accept(accepted("t1"))
        await store.record_result("t1", ToolResult.ok({"a": 1}))
        await store.record_result("t1", ToolResult.ok({"a": 2}))  # the first result stays
        assert await store.accept(accepted("t2"))
        await store.mark_finished("r1")
        with pytest.raises(TokenStoreError):
            await store.record_result("never-accepted", ToolResult.ok())
    with FileTokenStore(path) as store:
        pending = await store.pending()
        assert [e.accepted.execution_token for e in pending] == ["t1", "t2"]
        assert pending[0].result == ToolResult.ok({"a": 1})
        assert pending[1].result is None
        r1 = await store.get("r1")
        assert r1 is not None and r1.finished
        assert r1.result == ToolResult.error("boom", "m")


async def test_a_torn_last_line_is_dropped_and_a_damaged_one_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens.jsonl"
    with FileTokenStore(path) as store:
        await store.accept(accepted("t1"))
    good = path.read_bytes()
    path.write_bytes(good + b'{"op":"accepted","executionTo')  # a crash mid-write
    with FileTokenStore(path) as store:
        assert [e.accepted.execution_token for e in await store.pending()] == ["t1"]
        await store.accept(accepted("t2"))
    assert path.read_bytes().startswith(good + b'{"op":"accepted","executionToken":"t2"')
    with FileTokenStore(path) as store:  # t2's line did not join the torn one
        assert [e.accepted.execution_token for e in await store.pending()] == ["t1", "t2"]
    path.write_bytes(b"not json\n" + good)  # damage before a good line
    with pytest.raises(TokenStoreError, match="line 1"):
        FileTokenStore(path)


async def test_a_file_store_is_held_by_one_process_and_compacts(tmp_path: Path) -> None:
    path = tmp_path / "tokens.jsonl"
    store = FileTokenStore(path, compact_after=4)
    with pytest.raises(TokenStoreError, match="in use"):
        FileTokenStore(path)
    await store.accept(accepted("old", "2000-01-01T00:00:00Z"))
    await store.record_result("old", ToolResult.ok())
    await store.accept(accepted("live"))
    await store.mark_finished("old")  # the 4th line: compaction drops the expired, finished token
    assert await store.get("old") is None
    assert [json.loads(line)["op"] for line in path.read_text().splitlines()] == ["accepted"]
    store.close()
    with FileTokenStore(path) as again:
        assert [e.accepted.execution_token for e in await again.pending()] == ["live"]


async def test_a_memory_store_keeps_one_result_per_token() -> None:
    store = MemoryTokenStore()
    assert await store.accept(accepted("t1"))
    assert not await store.accept(accepted("t1"))
    await store.record_result("t1", ToolResult.error("", "x"))
    entry = await store.get("t1")
    assert entry is not None and entry.result == ToolResult("error", None, TOOL_ERROR, "x")
    await store.mark_finished("t1")
    assert await store.pending() == []
