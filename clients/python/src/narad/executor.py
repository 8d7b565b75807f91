"""A client executor (spec §11) over narad's HTTP executor API.

An :class:`Executor` attaches to a logical ``clientExecutorId``
(``POST /v1/executors/{id}/attach``), long-polls for the calls assigned to
it (``GET .../controls``), renews its lease with heartbeats at the
negotiated interval (``POST .../heartbeat``) and reports each call's
result (``POST .../finish``). The rules it keeps (§11.1, §11.3):

- a tool runs only from a ``client.tool.execute`` addressed to this
  executor, under its current lease, with an unexpired token;
- the token is recorded as accepted in the :class:`TokenStore` before the
  tool runs, and a token the store already holds never runs again, however
  often it is delivered;
- the result is stored before its finish is sent, and the finish is sent
  again (after failures, on every attachment and on every start) until the
  server gives a definite answer, always under the lease the token was
  delivered under;
- a token an earlier process accepted but left without a result is
  finished ``error`` / ``client_restarted``, never run;
- a lost lease (``NRD-0401``: superseded by another attachment, or lapsed)
  is replaced by attaching again; missing heartbeats end nothing else.

One round trip per step: an attachment is one POST; a poll is one GET that
waits up to ``poll_wait`` seconds; a delivery costs one store read and one
durable store write (an fsync for :class:`FileTokenStore`) before the tool
runs, one more after it, one finish POST, and one last store write once the
server has the finish.

Usage::

    async with Client(url, token) as client:
        executor = Executor(client, "desk-1", store=FileTokenStore("desk-1.tokens"))

        @executor.tool("echo")
        async def echo(args: dict[str, Any]) -> Any:
            return args

        await executor.run()  # until executor.stop()
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import inspect
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import quote

from .client import Client
from .errors import NaradError
from .wire import PROTOCOL_VERSION, Violation, validate

try:  # POSIX: a store file is held by one process at a time.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CLIENT_RESTARTED",
    "TOOL_ERROR",
    "UNKNOWN_TOOL",
    "AcceptedToken",
    "Executor",
    "ExecutorStats",
    "FileTokenStore",
    "MemoryTokenStore",
    "TokenEntry",
    "TokenStore",
    "TokenStoreError",
    "Tool",
    "ToolResult",
]

log = logging.getLogger(__name__)

UNKNOWN_TOOL = "unknown_tool"
"""Finish code: the server assigned a tool this executor has no function for."""
TOOL_ERROR = "tool_error"
"""Finish code: the tool raised (the message is the exception's text)."""
CLIENT_RESTARTED = "client_restarted"
"""Finish code: an earlier process accepted the token and stopped before it had a result.

The tool may or may not have taken effect; it is never run again.
"""

Outcome = Literal["success", "error", "cancelled"]
"""How a tool call ended."""

Tool = Callable[[dict[str, Any]], Any]
"""A client tool: the call's ``args`` in, its response (any JSON value) out.

A plain ``def`` runs in a worker thread (so that it cannot hold up
heartbeats); an ``async def`` runs on the event loop. Returning a
:class:`ToolResult` sets the outcome, code and message; raising finishes the
call ``error`` / ``tool_error`` with the exception's text.
"""

_ToolT = TypeVar("_ToolT", bound=Callable[..., Any])

# Finish refusals that are final for the token: a definite answer that
# sending the same finish again cannot change (docs/errors.md).
_FINAL_CODES = frozenset({"NRD-0401", "NRD-0402", "NRD-0403", "NRD-0404"})
_FINAL_STATUSES = frozenset({400, 409, 410, 413, 422})


# --- results and token records ----------------------------------------------


@dataclass(frozen=True)
class ToolResult:
    """How a tool call ended, as its ``client.tool.finish`` reports it."""

    outcome: Outcome
    response: Any = None
    code: str | None = None
    message: str | None = None

    @classmethod
    def ok(cls, response: Any = None) -> ToolResult:
        """A success with this response."""
        return cls("success", response)

    @classmethod
    def error(cls, code: str, message: str, response: Any = None) -> ToolResult:
        """An error with a machine code (``tool_error`` when empty) and user-safe text."""
        return cls("error", response, code or TOOL_ERROR, message)

    @classmethod
    def cancelled(cls, code: str, message: str, response: Any = None) -> ToolResult:
        """A cancellation with a machine code (``tool_error`` when empty) and user-safe text."""
        return cls("cancelled", response, code or TOOL_ERROR, message)

    def to_json(self) -> dict[str, Any]:
        """The finish fields: ``outcome``, ``response``, and ``code``/``message`` when set."""
        out: dict[str, Any] = {"outcome": self.outcome, "response": self.response}
        if self.code is not None:
            out["code"] = self.code
        if self.message is not None:
            out["message"] = self.message
        return out

    @staticmethod
    def from_json(body: Mapping[str, Any]) -> ToolResult:
        """The result of its finish fields."""
        outcome = body["outcome"]
        if outcome not in ("success", "error", "cancelled"):
            raise ValueError(f"outcome {outcome!r}")
        return ToolResult(outcome, body.get("response"), body.get("code"), body.get("message"))


@dataclass(frozen=True)
class AcceptedToken:
    """What a ``client.tool.execute`` said about its token, recorded when it is accepted."""

    execution_token: str
    client_executor_id: str
    lease_id: str
    """The lease it was delivered under: its finish names this lease, even after a re-attach."""
    tool_call_id: str
    tool_name: str
    execution_token_expires_at: str
    """RFC 3339, as the server sent it."""

    def expired(self, now: datetime | None = None) -> bool:
        """Whether the token's ``executionTokenExpiresAt`` has passed (by this clock)."""
        when = _parse_time(self.execution_token_expires_at)
        return when is not None and when <= (now or datetime.now(timezone.utc))

    def to_json(self) -> dict[str, Any]:
        """Its camelCase JSON form."""
        return {
            "executionToken": self.execution_token,
            "clientExecutorId": self.client_executor_id,
            "leaseId": self.lease_id,
            "toolCallId": self.tool_call_id,
            "toolName": self.tool_name,
            "executionTokenExpiresAt": self.execution_token_expires_at,
        }

    @staticmethod
    def from_json(body: Mapping[str, Any]) -> AcceptedToken:
        """The record of its JSON form (a ``client.tool.execute`` reads as one too)."""
        return AcceptedToken(
            execution_token=str(body["executionToken"]),
            client_executor_id=str(body["clientExecutorId"]),
            lease_id=str(body["leaseId"]),
            tool_call_id=str(body["toolCallId"]),
            tool_name=str(body["toolName"]),
            execution_token_expires_at=str(body["executionTokenExpiresAt"]),
        )


@dataclass
class TokenEntry:
    """A token the store holds, and how far it got."""

    accepted: AcceptedToken
    result: ToolResult | None = None
    """The tool's result, once recorded."""
    finished: bool = False
    """The server gave a definite answer to its finish: it is never sent again."""


def _parse_time(text: str) -> datetime | None:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


# --- token stores -----------------------------------------------------------


class TokenStoreError(Exception):
    """The token store cannot do what was asked (I/O, a damaged file, an unknown token)."""


class TokenStore(abc.ABC):
    """Durable memory of execution tokens (§11.3 rules 5 and 8).

    Each call returns once what it recorded survives a crash of the process
    (and, for a file store, of the machine). What it holds decides what a
    delivery may do: a token it holds never runs again.
    """

    @abc.abstractmethod
    async def accept(self, token: AcceptedToken) -> bool:
        """Records a delivered token as accepted; ``False`` (nothing written) when already held."""

    @abc.abstractmethod
    async def record_result(self, execution_token: str, result: ToolResult) -> None:
        """Records an accepted token's result; a token has one result, later ones are ignored."""

    @abc.abstractmethod
    async def mark_finished(self, execution_token: str) -> None:
        """Records that the server gave a definite answer to the token's finish."""

    @abc.abstractmethod
    async def get(self, execution_token: str) -> TokenEntry | None:
        """What the store holds about a token."""

    @abc.abstractmethod
    async def pending(self) -> list[TokenEntry]:
        """Every token not yet finished, in the order accepted."""


class _Ledger:
    """Tokens as the records so far leave them (records in the Rust SDK's line format)."""

    def __init__(self) -> None:
        self.entries: dict[str, TokenEntry] = {}

    def accept_record(self, token: AcceptedToken) -> dict[str, Any] | None:
        if token.execution_token in self.entries:
            return None
        return {"op": "accepted", **token.to_json()}

    def result_record(self, execution_token: str, result: ToolResult) -> dict[str, Any] | None:
        if self.known(execution_token).result is not None:
            return None
        return {"op": "result", "executionToken": execution_token, "result": result.to_json()}

    def final_record(self, execution_token: str) -> dict[str, Any] | None:
        if self.known(execution_token).finished:
            return None
        return {"op": "final", "executionToken": execution_token}

    def known(self, execution_token: str) -> TokenEntry:
        entry = self.entries.get(execution_token)
        if entry is None:
            raise TokenStoreError(f"the token store holds no token {execution_token}")
        return entry

    def apply(self, record: Mapping[str, Any]) -> None:
        """Applies a record; records about tokens never accepted change nothing."""
        op = record["op"]
        if op == "accepted":
            token = AcceptedToken.from_json(record)
            self.entries.setdefault(token.execution_token, TokenEntry(token))
            return
        entry = self.entries.get(str(record["executionToken"]))
        if op == "result":
            result = ToolResult.from_json(record["result"])
            if entry is not None and entry.result is None:
                entry.result = result
        elif op == "final":
            if entry is not None:
                entry.finished = True
        else:
            raise ValueError(f"unknown op {op!r}")

    def get(self, execution_token: str) -> TokenEntry | None:
        entry = self.entries.get(execution_token)
        return None if entry is None else _copy(entry)

    def pending(self) -> list[TokenEntry]:
        return [_copy(e) for e in self.entries.values() if not e.finished]

    def kept_records(self, now: datetime) -> tuple[list[dict[str, Any]], list[str]]:
        """The records that rebuild the entries kept, and the tokens forgotten.

        A token is forgotten once it is finished and expired: no delivery of
        it can be accepted any more (an expired delivery is refused before
        the store is asked), so forgetting it cannot let its tool run twice.
        """
        records: list[dict[str, Any]] = []
        dropped: list[str] = []
        for token, e in self.entries.items():
            if e.finished and e.accepted.expired(now):
                dropped.append(token)
                continue
            records.append({"op": "accepted", **e.accepted.to_json()})
            if e.result is not None:
                records.append(
                    {"op": "result", "executionToken": token, "result": e.result.to_json()}
                )
            if e.finished:
                records.append({"op": "final", "executionToken": token})
        return records, dropped


def _copy(entry: TokenEntry) -> TokenEntry:
    return TokenEntry(entry.accepted, entry.result, entry.finished)


class MemoryTokenStore(TokenStore):
    """A store in memory: it survives an executor's restart within a process, not the process.

    For tests, and for executors whose tools have no side effects worth
    protecting.
    """

    def __init__(self) -> None:
        self._ledger = _Ledger()

    async def accept(self, token: AcceptedToken) -> bool:
        """Records a delivered token as accepted; ``False`` when already held."""
        record = self._ledger.accept_record(token)
        if record is not None:
            self._ledger.apply(record)
        return record is not None

    async def record_result(self, execution_token: str, result: ToolResult) -> None:
        """Records an accepted token's result (the first one only)."""
        record = self._ledger.result_record(execution_token, result)
        if record is not None:
            self._ledger.apply(record)

    async def mark_finished(self, execution_token: str) -> None:
        """Records that the server has the token's finish."""
        record = self._ledger.final_record(execution_token)
        if record is not None:
            self._ledger.apply(record)

    async def get(self, execution_token: str) -> TokenEntry | None:
        """What the store holds about a token."""
        return self._ledger.get(execution_token)

    async def pending(self) -> list[TokenEntry]:
        """Every token not yet finished, in the order accepted."""
        return self._ledger.pending()


class FileTokenStore(TokenStore):
    """A store in one file of JSON lines, one change per line, fsynced before each call returns.

    The lines are those of the Rust SDK's ``FileTokenStore`` (``op``
    ``accepted``/``result``/``final``), so either can pick up the other's
    file. Creating the file fsyncs its directory too. Opening replays the
    file; a torn last line (a crash mid-write, whose call never returned) is
    cut off, while a bad line before good ones raises
    :class:`TokenStoreError` (guessing past it could run a tool twice). Once
    ``compact_after`` lines were appended, the file is rewritten without
    tokens that are finished and expired (a temporary file, fsynced, renamed
    over it, the directory fsynced). On POSIX a ``<path>.lock`` file keeps a
    second process from opening the same store; :meth:`close` releases it
    (so does the process ending, however it ends).
    """

    def __init__(self, path: str | os.PathLike[str], *, compact_after: int = 1024) -> None:
        self.path = Path(path)
        self.compact_after = max(1, compact_after)
        self._mutex = threading.Lock()
        self._ledger = _Ledger()
        self._lock_fd = self._take_lock()
        try:
            existed = self.path.exists()
            self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            if not existed:
                _sync_dir(self.path)
            self._len, self._since_compaction = self._replay()
        except BaseException:
            self._release_lock()
            raise

    def _take_lock(self) -> int | None:
        if fcntl is None:  # pragma: no cover - Windows
            return None
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            raise TokenStoreError(
                f"{self.path} is in use by another executor process ({lock_path} is locked)"
            ) from e
        return fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    def _replay(self) -> tuple[int, int]:
        with open(self.path, "rb") as f:
            data = f.read()
        good_len = 0
        count = 0
        bad: tuple[int, str] | None = None
        start = 0
        number = 0
        while start < len(data):
            number += 1
            end = data.find(b"\n", start)
            if end < 0:  # no end of line: the write that made it never finished
                bad = bad or (number, "no end of line")
                break
            text = data[start:end]
            start = end + 1
            if not text.strip():
                if bad is None:
                    good_len = start
                continue
            try:
                record = json.loads(text)
                if not isinstance(record, dict):
                    raise ValueError("not an object")
                self._ledger.apply(record)
            except (ValueError, KeyError, TypeError) as e:
                bad = bad or (number, str(e))
                continue
            if bad is not None:
                raise TokenStoreError(f"{self.path}: line {bad[0]} is not a token record: {bad[1]}")
            good_len = start
            count += 1
        if good_len < len(data):
            log.warning(
                "%s ends in a torn line; dropping %d bytes", self.path, len(data) - good_len
            )
            os.ftruncate(self._fd, good_len)
            _sync_file(self._fd)
        return good_len, count

    def close(self) -> None:
        """Closes the file and releases it to other processes."""
        with self._mutex:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._release_lock()

    def __enter__(self) -> FileTokenStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _append(self, record: Mapping[str, Any]) -> None:
        """Appends one record and syncs it, then applies it (the mutex held)."""
        if self._fd < 0:
            raise TokenStoreError(f"{self.path} is closed")
        data = json.dumps(record, separators=(",", ":")).encode() + b"\n"
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            _sync_file(self._fd)
        except OSError as e:
            # Cut off what part of it made it, so the next line starts clean.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._len)
            raise TokenStoreError(f"{self.path}: {e}") from e
        self._len += len(data)
        self._since_compaction += 1
        self._ledger.apply(record)

    def compact(self) -> int:
        """Rewrites the file without tokens that are finished and expired; how many were dropped."""
        with self._mutex:
            return self._compact(datetime.now(timezone.utc))

    def _compact(self, now: datetime) -> int:
        records, dropped = self._ledger.kept_records(now)
        data = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)
        tmp = self.path.with_name(self.path.name + ".compact")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            _sync_dir(self.path)
            new_fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        except OSError as e:
            raise TokenStoreError(f"{self.path}: compaction: {e}") from e
        os.close(self._fd)
        self._fd = new_fd
        self._len = len(data)
        self._since_compaction = 0
        for token in dropped:
            del self._ledger.entries[token]
        return len(dropped)

    def _accept(self, token: AcceptedToken) -> bool:
        with self._mutex:
            record = self._ledger.accept_record(token)
            if record is None:
                return False
            self._append(record)
            return True

    def _record_result(self, execution_token: str, result: ToolResult) -> None:
        with self._mutex:
            record = self._ledger.result_record(execution_token, result)
            if record is not None:
                self._append(record)

    def _mark_finished(self, execution_token: str) -> None:
        with self._mutex:
            record = self._ledger.final_record(execution_token)
            if record is None:
                return
            self._append(record)
            if self._since_compaction >= self.compact_after:
                try:
                    self._compact(datetime.now(timezone.utc))
                except TokenStoreError as e:  # the mark is durable; the old file stays
                    log.warning("token store compaction failed: %s", e)

    def _get(self, execution_token: str) -> TokenEntry | None:
        with self._mutex:
            return self._ledger.get(execution_token)

    def _pending(self) -> list[TokenEntry]:
        with self._mutex:
            return self._ledger.pending()

    async def accept(self, token: AcceptedToken) -> bool:
        """Records a delivered token as accepted, durably; ``False`` when already held."""
        return await asyncio.to_thread(self._accept, token)

    async def record_result(self, execution_token: str, result: ToolResult) -> None:
        """Records an accepted token's result (the first one only), durably."""
        await asyncio.to_thread(self._record_result, execution_token, result)

    async def mark_finished(self, execution_token: str) -> None:
        """Records that the server has the token's finish, durably."""
        await asyncio.to_thread(self._mark_finished, execution_token)

    async def get(self, execution_token: str) -> TokenEntry | None:
        """What the store holds about a token."""
        return self._get(execution_token)

    async def pending(self) -> list[TokenEntry]:
        """Every token not yet finished, in the order accepted."""
        return self._pending()


def _sync_file(fd: int) -> None:
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


def _sync_dir(path: Path) -> None:
    """Makes a created or renamed file's directory entry durable (POSIX)."""
    if os.name != "posix":  # pragma: no cover - a directory cannot be opened on Windows
        return
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- the executor -----------------------------------------------------------


@dataclass
class ExecutorStats:
    """What an executor did, readable while it runs."""

    attachments: int = 0
    """``client.attached`` received."""
    leases_lost: int = 0
    """Leases found superseded or lapsed (``NRD-0401``), each followed by a new attachment."""
    executions_started: int = 0
    """Tools started (each at most once per token)."""
    executions_finished: int = 0
    """Tools that returned or raised, their result stored."""
    unknown_tools: int = 0
    """Deliveries of a tool without a function, answered ``unknown_tool``."""
    duplicate_deliveries: int = 0
    """Deliveries of a token the store already held (not run again)."""
    stale_lease_refused: int = 0
    """Deliveries refused because their lease was not the current one."""
    expired_refused: int = 0
    """Deliveries refused because their token had expired."""
    misaddressed_refused: int = 0
    """Deliveries refused because they named another executor."""
    malformed_refused: int = 0
    """Controls that are not a valid ``client.tool.execute``."""
    restarted_recovered: int = 0
    """Tokens an earlier process left without a result, finished ``client_restarted``."""
    finishes_accepted: int = 0
    """Finishes the server accepted, duplicates included."""
    finishes_duplicate: int = 0
    """Of those, the ones the server had accepted before."""
    finishes_refused: int = 0
    """Finishes the server refused for good (the token is given up)."""
    finish_retries: int = 0
    """Finish attempts without a definite answer, to be sent again."""
    store_errors: int = 0
    """Token store failures while running."""


class Executor:
    """A client executor (§11) for the calls of runs started with its ``clientExecutorId``.

    ``tools`` maps tool names to functions (more with :meth:`tool`);
    ``store`` keeps accepted tokens (default: in memory, which does not
    survive the process: pass a :class:`FileTokenStore` when tools have
    side effects). ``poll_wait`` is how long one controls poll waits (at
    most 30 s); ``shutdown_grace`` how long :meth:`run`, once stopping,
    waits for running tools and their finishes; ``max_backoff`` the longest
    wait between retries; ``on_attached`` is called with each new lease.
    The client's token needs the ``executor`` role.
    """

    def __init__(
        self,
        client: Client,
        executor_id: str,
        tools: Mapping[str, Tool] | None = None,
        store: TokenStore | None = None,
        *,
        poll_wait: float = 25.0,
        shutdown_grace: float = 5.0,
        max_backoff: float = 10.0,
        on_attached: Callable[[str], object] | None = None,
    ) -> None:
        if not executor_id:
            raise ValueError("executor_id must not be empty")
        if not 0 <= poll_wait <= 30:
            raise ValueError("poll_wait is 0 to 30 seconds")
        self.client = client
        self.executor_id = executor_id
        self.tools: dict[str, Tool] = dict(tools or {})
        self.store: TokenStore = store if store is not None else MemoryTokenStore()
        self.poll_wait = poll_wait
        self.shutdown_grace = shutdown_grace
        self.max_backoff = max(0.1, max_backoff)
        self.on_attached = on_attached
        self.stats = ExecutorStats()
        self.ran: list[str] = []
        """The toolCallIds whose tool this instance started, in order."""
        self._path = f"/v1/executors/{quote(executor_id, safe='')}"
        self._lease: str | None = None
        self._stopping = asyncio.Event()
        self._started = False
        self._running: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._finishers: dict[str, asyncio.Task[None]] = {}

    @property
    def lease_id(self) -> str | None:
        """The current lease, while attached."""
        return self._lease

    def tool(self, name: str | None = None) -> Callable[[_ToolT], _ToolT]:
        """Registers the decorated ``def`` or ``async def`` as tool ``name`` (default: its name)."""

        def register(fn: _ToolT) -> _ToolT:
            self.tools[name or fn.__name__] = fn
            return fn

        return register

    def stop(self) -> None:
        """Asks :meth:`run` to end: no new poll, running tools and finishes get the grace."""
        self._stopping.set()

    async def run(self) -> None:
        """Runs until :meth:`stop`: recovers, attaches, polls, runs, re-attaches.

        Raises :class:`~narad.errors.NaradError` when the server refuses the
        executor for good (401, 403: a token without the ``executor`` role
        or whose ``executors`` claim does not name this id).
        """
        if self._started:
            raise RuntimeError("an Executor runs once; make another")
        self._started = True
        try:
            await self._recover()
            self._flush()
            backoff = 0.1
            while not self._stopping.is_set():
                try:
                    lease, interval = await self._attach()
                except NaradError as e:
                    if not _transient(e):
                        raise
                    log.warning("attaching failed (%s); again in %.1f s", e, backoff)
                    await self._sleep(max(backoff, e.retry_after or 0.0))
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                backoff = 0.1
                await self._serve(lease, interval)
        finally:
            self._lease = None
            await self._shut_down()

    # --- attachment, heartbeats, polls ---------------------------------------

    async def _attach(self) -> tuple[str, float]:
        """Attaches: the new lease and its heartbeat interval in seconds."""
        body = await self.client.request("POST", f"{self._path}/attach", json={})
        validate(body, "client.attached")
        self._lease = lease = str(body["leaseId"])
        self.stats.attachments += 1
        log.info("attached as %s under lease %s", self.executor_id, self._lease)
        if self.on_attached is not None:
            self.on_attached(lease)
        return lease, max(0.05, int(body["heartbeatIntervalMs"]) / 1000)

    async def _serve(self, lease: str, interval: float) -> None:
        """Heartbeats and polls under one lease, until it is lost or the executor stops."""
        lost = asyncio.Event()
        beats = asyncio.create_task(self._heartbeats(lease, interval, lost))
        self._flush()  # results waiting for a definite answer go again
        try:
            await self._poll(lease, lost)
        finally:
            beats.cancel()
            await asyncio.gather(beats, return_exceptions=True)
            self._lease = None
        if lost.is_set():
            self.stats.leases_lost += 1
            log.warning("lease %s was superseded or lapsed; attaching again", lease)

    async def _heartbeats(self, lease: str, interval: float, lost: asyncio.Event) -> None:
        beat = {
            "type": "client.heartbeat",
            "protocolVersion": PROTOCOL_VERSION,
            "clientExecutorId": self.executor_id,
            "leaseId": lease,
        }
        while True:
            await asyncio.sleep(interval)
            try:
                await self.client.request(
                    "POST", f"{self._path}/heartbeat", json=beat, timeout=max(interval, 5.0)
                )
            except NaradError as e:
                if _lease_not_current(e):
                    lost.set()
                    return
                # The lease lives a few intervals: the next beat may do.
                log.warning("heartbeat failed: %s", e)

    async def _poll(self, lease: str, lost: asyncio.Event) -> None:
        """Long-polls for controls and delivers them, until the lease is lost or stopping.

        Only the wait for an answer is ever abandoned, never a delivery
        being accepted. Abandoning it is safe once the lease is lost (a dead
        lease is handed nothing); when stopping, a call handed out in that
        instant is never run and expires ``client_execution_expired``.
        """
        params: dict[str, str | int | bool | None] = {
            "leaseId": lease,
            "waitMs": int(self.poll_wait * 1000),
        }
        backoff = 0.1
        while not (lost.is_set() or self._stopping.is_set()):
            request = asyncio.ensure_future(
                self.client.request(
                    "GET", f"{self._path}/controls", params=params, timeout=self.poll_wait + 15
                )
            )
            try:
                if not await _first(request, lost, self._stopping):
                    return
                body = request.result()
            except NaradError as e:
                if _lease_not_current(e):
                    lost.set()
                    return
                if not _transient(e):
                    raise
                log.warning("polling for controls failed (%s); again in %.1f s", e, backoff)
                await self._sleep(max(backoff, e.retry_after or 0.0))
                backoff = min(backoff * 2, self.max_backoff)
                continue
            finally:
                if not request.done():
                    request.cancel()
                    await asyncio.gather(request, return_exceptions=True)
            backoff = 0.1
            controls = body.get("controls") if isinstance(body, dict) else None
            for control in controls or []:
                await self._deliver(control, lease)

    # --- deliveries and tools -------------------------------------------------

    async def _deliver(self, control: Any, current_lease: str) -> None:
        """Decides what one ``client.tool.execute`` may do, and does it (§11.3)."""
        try:
            validate(control, "client.tool.execute")  # its JSON Schema, as the server's
            accepted = AcceptedToken.from_json(control)
            args = dict(control["args"])
        except (Violation, KeyError, TypeError) as e:
            self.stats.malformed_refused += 1
            log.warning("not a client.tool.execute; ignored: %s", e)
            return
        token = accepted.execution_token
        if accepted.client_executor_id != self.executor_id:
            self.stats.misaddressed_refused += 1
            log.warning("a call for executor %s; not run", accepted.client_executor_id)
            return
        try:
            known = await self.store.get(token)
        except Exception:
            # Without the store's word, running could repeat a side effect:
            # the token is left to expire.
            self.stats.store_errors += 1
            log.exception("token store unreadable; call %s not accepted", accepted.tool_call_id)
            return
        if known is not None:
            # Known: never run again, whatever the lease; only its finish may go.
            self.stats.duplicate_deliveries += 1
            if known.finished or (known.result is None and token in self._running):
                return
            if known.result is None:  # an earlier process stopped mid-call
                self.stats.restarted_recovered += 1
                await self._record(token, _restarted())
            self._finish_soon(token)
            return
        if accepted.lease_id != current_lease:
            self.stats.stale_lease_refused += 1
            log.warning("call %s under a superseded lease; not run", accepted.tool_call_id)
            return
        if accepted.expired():
            self.stats.expired_refused += 1
            log.warning("call %s with an expired token; not run", accepted.tool_call_id)
            return
        try:
            fresh = await self.store.accept(accepted)
        except Exception:
            self.stats.store_errors += 1
            log.exception("cannot record call %s as accepted; not run", accepted.tool_call_id)
            return
        if not fresh:
            self.stats.duplicate_deliveries += 1
            return
        fn = self.tools.get(accepted.tool_name)
        if fn is None:
            self.stats.unknown_tools += 1
            result = ToolResult.error(
                UNKNOWN_TOOL, f"this executor has no tool {accepted.tool_name}"
            )
            if await self._record(token, result):
                self._finish_soon(token)
            return
        self._running.add(token)
        self.ran.append(accepted.tool_call_id)
        self.stats.executions_started += 1
        task = asyncio.create_task(self._run_tool(fn, args, token))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_tool(self, fn: Tool, args: dict[str, Any], token: str) -> None:
        try:
            result = await _call(fn, args)
        except Exception as e:
            result = ToolResult.error(TOOL_ERROR, str(e) or type(e).__name__)
        self.stats.executions_finished += 1
        recorded = await self._record(token, result)
        self._running.discard(token)
        if recorded:
            self._finish_soon(token)

    async def _record(self, token: str, result: ToolResult) -> bool:
        """Stores a result; when it cannot, nothing is sent (the next start: client_restarted)."""
        try:
            await self.store.record_result(token, result)
        except Exception:
            self.stats.store_errors += 1
            log.exception("cannot store the result of token %s", token)
            return False
        return True

    async def _recover(self) -> None:
        """Before any delivery: ``client_restarted`` for tokens an earlier process left running."""
        for entry in await self.store.pending():
            if entry.result is None:
                await self.store.record_result(entry.accepted.execution_token, _restarted())
                self.stats.restarted_recovered += 1
                log.warning(
                    "call %s was accepted by an earlier process that stopped mid-call; "
                    "finishing it %s",
                    entry.accepted.tool_call_id,
                    CLIENT_RESTARTED,
                )

    # --- finishes ----------------------------------------------------------------

    def _flush(self) -> None:
        """Sends every stored result the server has no definite answer to."""
        task = asyncio.create_task(self._flush_pending())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush_pending(self) -> None:
        try:
            pending = await self.store.pending()
        except Exception:
            self.stats.store_errors += 1
            log.exception("token store unreadable; pending finishes wait")
            return
        for entry in pending:
            if entry.result is not None:
                self._finish_soon(entry.accepted.execution_token)

    def _finish_soon(self, token: str) -> None:
        if token not in self._finishers:
            self._finishers[token] = asyncio.create_task(self._finish(token))

    async def _finish(self, token: str) -> None:
        """Sends one token's finish until the server gives a definite answer."""
        backoff = 0.1
        try:
            while True:
                entry = await self.store.get(token)
                if entry is None or entry.result is None or entry.finished:
                    return
                a = entry.accepted
                body = {
                    "type": "client.tool.finish",
                    "protocolVersion": PROTOCOL_VERSION,
                    "clientExecutorId": a.client_executor_id,
                    "leaseId": a.lease_id,
                    "toolCallId": a.tool_call_id,
                    "executionToken": token,
                    **entry.result.to_json(),
                }
                path = f"/v1/executors/{quote(a.client_executor_id, safe='')}/finish"
                try:
                    got = await self.client.request("POST", path, json=body)
                except NaradError as e:
                    if _refused_for_good(e):
                        self.stats.finishes_refused += 1
                        log.warning("finish of call %s refused for good: %s", a.tool_call_id, e)
                        await self.store.mark_finished(token)
                        return
                    self.stats.finish_retries += 1
                    log.warning("finish of call %s not answered (%s); again", a.tool_call_id, e)
                    await asyncio.sleep(max(backoff, e.retry_after or 0.0))
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                self.stats.finishes_accepted += 1
                if isinstance(got, dict) and got.get("duplicate"):
                    self.stats.finishes_duplicate += 1
                await self.store.mark_finished(token)
                return
        except Exception:
            # Not marked: the next start sends it again, answered as a duplicate.
            self.stats.store_errors += 1
            log.exception("token store failed while finishing token %s", token)
        finally:
            self._finishers.pop(token, None)

    # --- stopping -----------------------------------------------------------------

    async def _shut_down(self) -> None:
        """Gives running tools and pending finishes the grace, then cancels what is left.

        A tool still running then is finished ``client_restarted`` by the
        next start; a result still unsent is sent by it.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_grace
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.shutdown_grace)
        if self._finishers:
            await asyncio.wait(
                set(self._finishers.values()), timeout=max(0.0, deadline - loop.time())
            )
        left = [*self._tasks, *self._finishers.values()]
        if left:
            log.warning(
                "%d tools or finishes still running at stop; the next start ends them", len(left)
            )
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    async def _sleep(self, seconds: float) -> None:
        """Sleeps, waking early when the executor is asked to stop."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)


async def _call(fn: Tool, args: dict[str, Any]) -> ToolResult:
    """Runs a tool (a plain function in a thread) and makes its result a ToolResult."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    ):
        got = await fn(args)
    else:
        got = await asyncio.to_thread(fn, args)
        if inspect.isawaitable(got):
            got = await got
    if isinstance(got, ToolResult):
        result = got
    else:
        result = ToolResult.ok(got)
    try:
        json.dumps(result.response, allow_nan=False)
    except (TypeError, ValueError) as e:
        return ToolResult.error(TOOL_ERROR, f"the tool's response is not JSON: {e}")
    return result


def _restarted() -> ToolResult:
    return ToolResult.error(
        CLIENT_RESTARTED,
        "the client executor restarted while the tool was running; "
        "it may or may not have taken effect",
    )


async def _first(work: asyncio.Future[Any], *events: asyncio.Event) -> bool:
    """Waits for ``work`` or any of ``events``; whether ``work`` is done."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait([work, *waiters], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
    return work.done()


def _lease_not_current(e: NaradError) -> bool:
    return e.status == 409 and e.code == "NRD-0401"


def _transient(e: NaradError) -> bool:
    """Whether the same request may succeed later: no answer, 408, 429, 5xx."""
    return e.retryable or e.status == 408


def _refused_for_good(e: NaradError) -> bool:
    """A finish refusal that sending it again cannot change (the token is given up).

    401 and 403 without ``NRD-0402`` are about the credential, not the
    token: the finish waits for a valid one.
    """
    return e.code in _FINAL_CODES or (e.status in _FINAL_STATUSES and not _transient(e))
