"""A real ``narad serve`` for the tests, started the way ``.ci/lib/test-server.sh`` does.

Each server gets a fresh Postgres database on ``NARAD_TEST_DATABASE_URL``
(default ``postgres://postgres@127.0.0.1:5432/postgres``), listens on a port
the kernel picks (``NARAD_LISTEN=127.0.0.1:0``) and announces its URL on
stdout (``narad is serving on URL``). The binary is ``NARAD_BIN`` (default
``target/debug/narad`` of this repository); without it, or without a
Postgres to create databases on, the tests that need a server are skipped
with the reason — unless ``NARAD_TESTS_REQUIRE_SERVER=1`` (as ``.ci/python-sdk``
sets it), which makes them fail instead: CI never passes by skipping.

Fixtures:

- ``narad_binary``: the path of the narad binary.

- ``start_server(**env)``: a server started with extra ``NARAD_*``
  settings (e.g. ``NARAD_RUNTIME_LEASE_TTL_MS="2000"``); one server per
  distinct set of settings for the whole test session, stopped (and its
  database dropped) at the end.
- ``narad_server``: the server with the default settings.
- ``own_server(**env)``: a server of the test's own, to kill
  (``server.kill()``) and start again on the same address and database
  (``server.restart()``); stopped at the end of the test.
- ``org``: a tenant of its own for each test, so that runtimes of
  different tests never claim each other's runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DEFAULT_BIN = REPO / "target" / "debug" / "narad"
ADMIN_URL = os.environ.get("NARAD_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
SECRET = "python-sdk-test-server-hs256-secret-of-32-bytes-or-more"
DEFAULT_ROLES = "reader,writer,backend"
START_TIMEOUT = 60.0


def narad_bin() -> Path | None:
    """The narad binary the tests use, if there is one."""
    path = Path(os.environ.get("NARAD_BIN", str(DEFAULT_BIN)))
    return path.resolve() if path.is_file() and os.access(path, os.X_OK) else None


def _psql(sql: str) -> None:
    subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", ADMIN_URL, "-c", sql],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )


@dataclass
class NaradServer:
    """A running ``narad serve``: its URL, binary and settings; it mints tokens."""

    base: str
    bin: str
    env: dict[str, str]
    database: str
    process: subprocess.Popen[bytes]
    work: Path
    _tokens: dict[tuple[str, str, str], str] = field(default_factory=dict)
    #: How many times it was started again (:meth:`restart`).
    starts: int = 0

    def token(
        self, roles: str | Sequence[str] = DEFAULT_ROLES, *, org: str = "py", sub: str = "pytest"
    ) -> str:
        """A token of tenant ``org`` for ``sub`` with ``roles`` (``narad token``)."""
        joined = roles if isinstance(roles, str) else ",".join(roles)
        key = (joined, org, sub)
        if key not in self._tokens:
            got = subprocess.run(
                [self.bin, "token", "--org", org, "--sub", sub, "--roles", joined],
                env=self.env,
                check=True,
                capture_output=True,
                text=True,
                timeout=30,
            )
            self._tokens[key] = got.stdout.strip()
        return self._tokens[key]

    def log(self) -> str:
        """What the server wrote to stderr so far (for failure messages)."""
        path = self.work / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        """Kills the server at once (SIGKILL), as a crash does; its database stays."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def restart(self) -> None:
        """Kills the server if it runs, then starts it again on the same address and
        database (blocks until it serves)."""
        self.kill()
        self.starts += 1
        env = {**self.env, "NARAD_LISTEN": self.base.removeprefix("http://")}
        self.process = _launch(Path(self.bin), env, self.work, self.starts)
        _await_serving(self, self.starts)

    def stop(self) -> None:
        """Stops the server and drops its database."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:
            _psql(f"drop database if exists {self.database} with (force)")
        except (subprocess.SubprocessError, OSError):
            pass
        shutil.rmtree(self.work, ignore_errors=True)


def _launch(binary: Path, env: dict[str, str], work: Path, n: int) -> subprocess.Popen[bytes]:
    """Starts ``narad serve`` (its ``n``-th start in ``work``)."""
    with open(work / f"stdout.{n}", "wb") as out, open(work / "server.log", "ab") as err:
        return subprocess.Popen([str(binary), "serve"], stdout=out, stderr=err, env=env)


def _await_serving(server: NaradServer, n: int) -> None:
    """Waits for the ``n``-th start to announce its URL; raises if it does not."""
    deadline = time.monotonic() + START_TIMEOUT
    stdout = server.work / f"stdout.{n}"
    while time.monotonic() < deadline:
        for line in stdout.read_text(errors="replace").splitlines():
            if line.startswith("narad is serving on "):
                server.base = line.removeprefix("narad is serving on ").strip().rstrip("/")
                return
        if server.process.poll() is not None:
            log = server.log()
            server.stop()
            raise RuntimeError(f"narad serve exited before serving:\n{log}")
        time.sleep(0.05)
    log = server.log()
    server.stop()
    raise RuntimeError(f"narad serve did not start within {START_TIMEOUT:.0f} s:\n{log}")


def _serve(binary: Path, settings: dict[str, str]) -> NaradServer:
    """Starts ``narad serve`` on a fresh database; raises if it does not come up."""
    database = f"narad_py_{os.getpid()}_{uuid.uuid4().hex[:10]}"
    _psql(f"create database {database}")
    work = Path(tempfile.mkdtemp(prefix="narad-py-"))
    env = {
        **os.environ,
        "NARAD_JWT_HS256_SECRET": SECRET,
        "NARAD_LISTEN": "127.0.0.1:0",
        "NARAD_DATABASE_URL": f"{ADMIN_URL.rsplit('/', 1)[0]}/{database}",
        "NARAD_HOME": str(work / "home"),
        "RUST_LOG": os.environ.get("RUST_LOG", "warn"),
        **settings,
    }
    process = _launch(binary, env, work, 0)
    server = NaradServer("", str(binary), env, database, process, work)
    _await_serving(server, 0)
    return server


def _unavailable(reason: str) -> None:
    """Skips the test for ``reason``, or fails it where a server is required."""
    if os.environ.get("NARAD_TESTS_REQUIRE_SERVER") == "1":
        pytest.fail(f"{reason} (NARAD_TESTS_REQUIRE_SERVER=1)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def narad_binary() -> Path:
    """The narad binary (``NARAD_BIN``, else this repository's debug build)."""
    binary = narad_bin()
    if binary is None:
        _unavailable(
            f"no narad binary at {os.environ.get('NARAD_BIN', str(DEFAULT_BIN))}: "
            "build it (cargo build) or set NARAD_BIN"
        )
    assert binary is not None
    return binary


@pytest.fixture(scope="session")
def start_server() -> Iterator[Callable[..., NaradServer]]:
    """Starts (once per distinct settings) a server with extra ``NARAD_*`` settings."""
    binary = narad_bin()
    started: dict[tuple[tuple[str, str], ...], NaradServer] = {}

    def start(**env: str) -> NaradServer:
        if binary is None:
            _unavailable(
                f"no narad binary at {os.environ.get('NARAD_BIN', str(DEFAULT_BIN))}: "
                "build it (cargo build) or set NARAD_BIN"
            )
        assert binary is not None
        if shutil.which("psql") is None:
            _unavailable("psql is not installed: the tests create a database per server with it")
        key = tuple(sorted(env.items()))
        if key not in started:
            try:
                started[key] = _serve(binary, dict(env))
            except subprocess.CalledProcessError as e:
                _unavailable(
                    f"cannot create a test database on {ADMIN_URL} "
                    f"(set NARAD_TEST_DATABASE_URL): {e.stderr.strip()}"
                )
        return started[key]

    yield start
    for server in started.values():
        server.stop()


@pytest.fixture(scope="session")
def narad_server(start_server: Callable[..., NaradServer]) -> NaradServer:
    """A server with the default settings, shared by the whole test session."""
    return start_server()


@pytest.fixture
def own_server() -> Iterator[Callable[..., NaradServer]]:
    """Starts servers of this test's own (to kill and restart), stopped at its end."""
    binary = narad_bin()
    started: list[NaradServer] = []

    def start(**env: str) -> NaradServer:
        if binary is None:
            _unavailable(
                f"no narad binary at {os.environ.get('NARAD_BIN', str(DEFAULT_BIN))}: "
                "build it (cargo build) or set NARAD_BIN"
            )
        assert binary is not None
        if shutil.which("psql") is None:
            _unavailable("psql is not installed: the tests create a database per server with it")
        try:
            server = _serve(binary, dict(env))
        except subprocess.CalledProcessError as e:
            _unavailable(
                f"cannot create a test database on {ADMIN_URL} "
                f"(set NARAD_TEST_DATABASE_URL): {e.stderr.strip()}"
            )
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def org() -> str:
    """A tenant of this test's own."""
    return f"py-{uuid.uuid4().hex[:12]}"
