"""What several test modules share: a TCP proxy that cuts connections, an httpx
transport that records every request and injects faults, a URL no server
listens on; and, for the tests of agent runtimes, what a session's history
says (the streamed text, a run's end), the environment of a runtime program
run as a process of its own, and its kill -9 half-way through a run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

import httpx
from conftest import REPO, NaradServer
from test_runtime import ROLES

from narad import Client, Event

T = TypeVar("T")
TERMINALS = ("run.finished", "run.error", "run.cancelled")


def dead_url() -> str:
    """A URL of this host where nothing listens (connections are refused)."""
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@dataclass
class Sent:
    """One request as it left the client (every attempt is one), and its answer."""

    method: str
    url: str
    path: str
    headers: dict[str, str]
    body: bytes
    #: What became of it: ``answered``, ``unreachable``, ``dropped`` (the
    #: server answered, the client never got it) or ``faked``.
    outcome: str = ""
    status: int | None = None
    answer: bytes = b""
    answer_headers: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str | None:
        """Its ``Idempotency-Key``."""
        return self.headers.get("idempotency-key")

    @property
    def replayed(self) -> bool:
        """Whether its answer was marked a replay (``Idempotent-Replayed: true``)."""
        return self.answer_headers.get("idempotent-replayed", "").lower() == "true"


Action = Literal["drop-answer", "answer"]


@dataclass
class Fault:
    """What to do to the requests ``match`` picks, ``times`` times.

    ``drop-answer`` sends the request, reads the server's answer and throws
    it away (``httpx.ReadError``): the server acted, the client never
    knows. ``answer`` answers ``status`` (with ``headers`` and ``body``)
    without sending anything. ``then`` runs after the fault (e.g. to kill
    the server).
    """

    match: Callable[[Sent], bool]
    action: Action
    times: int = 1
    status: int = 502
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    then: Callable[[], None] | None = None


def to_path(path: str) -> Callable[[Sent], bool]:
    """A :class:`Fault` match: the requests to ``path``."""
    return lambda sent: sent.path == path


class Recorder(httpx.AsyncBaseTransport):
    """An httpx transport over the real network that records every request
    and its answer, and applies :class:`Fault` s in order."""

    def __init__(self, *faults: Fault) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.faults = list(faults)
        self.sent: list[Sent] = []

    def client(self, servers: str | list[str], token: str, **options: float) -> Client:
        """A narad client whose requests go through this transport (closed with it)."""
        http = httpx.AsyncClient(transport=self, timeout=httpx.Timeout(30.0, connect=5.0))
        client = Client(servers, token, http=http, **options)
        client._own_http = True
        return client

    def to(self, path: str) -> list[Sent]:
        """The requests sent to ``path`` (every attempt), in order."""
        return [s for s in self.sent if s.path == path]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        sent = Sent(
            request.method,
            str(request.url),
            request.url.path,
            {k.lower(): v for k, v in request.headers.items()},
            body,
        )
        self.sent.append(sent)
        fault = next((f for f in self.faults if f.times > 0 and f.match(sent)), None)
        if fault is not None and fault.action == "answer":
            fault.times -= 1
            sent.outcome, sent.status = "faked", fault.status
            if fault.then is not None:
                fault.then()
            return httpx.Response(
                fault.status, headers=fault.headers, content=fault.body, request=request
            )
        try:
            response = await self.inner.handle_async_request(request)
        except httpx.TransportError:
            sent.outcome = "unreachable"
            raise
        sent.status = response.status_code
        sent.answer_headers = {k.lower(): v for k, v in response.headers.items()}
        if request.headers.get("accept") == "text/event-stream":
            sent.outcome = "answered"
            return response
        assert isinstance(response.stream, httpx.AsyncByteStream)
        raw = b"".join([chunk async for chunk in response.stream])
        await response.aclose()
        rebuilt = httpx.Response(
            response.status_code, headers=response.headers, content=raw, request=request
        )
        sent.answer = rebuilt.read()
        if fault is not None:
            fault.times -= 1
            sent.outcome = "dropped"
            if fault.then is not None:
                fault.then()
            raise httpx.ReadError("the answer was lost (a fault of the test)", request=request)
        sent.outcome = "answered"
        return rebuilt

    async def aclose(self) -> None:
        await self.inner.aclose()


class FaultProxy:
    """A TCP proxy between a client and the server. It cuts its first
    ``cuts`` connections after a random number of bytes from the server
    (mid-frame, mid-header) with a reset; switched off, it resets every
    connection it holds and every new one, as a network partition looks."""

    def __init__(self, upstream: str, *, cuts: int = 0, seed: int = 0) -> None:
        host, port = upstream.removeprefix("http://").rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.cuts = cuts
        self.cut = 0
        self.random = random.Random(seed)
        self.on = True
        self.held: set[asyncio.StreamWriter] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def switch_off(self) -> None:
        self.on = False
        for w in self.held:
            w.transport.abort()

    async def close(self) -> None:
        self.switch_off()
        if self.server is not None:
            self.server.close()

    async def _serve(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        if not self.on:
            down_w.transport.abort()
            return
        budget: int | None = None
        if self.cut < self.cuts:
            self.cut += 1
            budget = self.random.randint(150, 6000)
        try:
            up_r, up_w = await asyncio.open_connection(self.host, self.port)
        except OSError:
            down_w.transport.abort()
            return
        self.held.update((down_w, up_w))

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, limit: int | None) -> None:
            sent = 0
            with contextlib.suppress(ConnectionError, OSError):
                while data := await r.read(1024):
                    if limit is not None and sent + len(data) >= limit:
                        w.write(data[: limit - sent])
                        await w.drain()
                        return
                    sent += len(data)
                    w.write(data)
                    await w.drain()

        tasks = [
            asyncio.create_task(pipe(down_r, up_w, None)),
            asyncio.create_task(pipe(up_r, down_w, budget)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for w in (up_w, down_w):
            self.held.discard(w)
            # A reset, not a polite end: what a dropped connection looks like.
            w.transport.abort()


# --- agent runtimes ---------------------------------------------------------


def said(events: list[Event], run: str | None = None) -> str:
    """The assistant's streamed text: the ``message.text.delta`` s joined (``run``'s alone)."""
    return "".join(
        str(e["delta"])
        for e in events
        if e["type"] == "message.text.delta" and (run is None or e["runId"] == run)
    )


def ended(run: str) -> Callable[[list[Event]], bool]:
    """Whether a history holds a terminal of ``run`` (a ``wait_history`` condition)."""
    return lambda events: any(e["type"] in TERMINALS and e["runId"] == run for e in events)


def terminal(events: list[Event], run: str) -> Event:
    """The terminal of ``run``; fails unless there is exactly one."""
    found = [e for e in events if e["type"] in TERMINALS and e["runId"] == run]
    assert len(found) == 1, found
    return found[0]


def runtime_env(
    server: NaradServer, org: str, *, sub: str = "pytest", **extra: str
) -> dict[str, str]:
    """The environment of a runtime program (or an example agent) run as a process:
    ``NARAD_URL``, a ``NARAD_TOKEN`` of ``org`` with every runtime role, this SDK's
    source first on ``PYTHONPATH``, no ``OPENAI_API_KEY`` (so the examples use their
    test models), and ``extra``."""
    env = {
        **os.environ,
        "NARAD_URL": server.base,
        "NARAD_TOKEN": server.token(ROLES, org=org, sub=sub),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO / "clients" / "python" / "src"), os.environ.get("PYTHONPATH")) if p
        ),
        **extra,
    }
    env.pop("OPENAI_API_KEY", None)
    return env


async def spawn_and_kill_when(
    program: Path, env: dict[str, str], half_way: Callable[[], Awaitable[T]]
) -> T:
    """Runs the runtime program ``program`` as a process of its own until
    ``half_way()`` is done (e.g. the journal shows an answer half said), then
    kills it with SIGKILL (no release, no goodbye) and reaps it. Answers what
    ``half_way()`` did; the process never outlives the call."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(program), env=env, stdout=asyncio.subprocess.DEVNULL
    )
    try:
        got = await half_way()
        process.send_signal(signal.SIGKILL)
        await asyncio.wait_for(process.wait(), timeout=10)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == -signal.SIGKILL, process.returncode
    return got
