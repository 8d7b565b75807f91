"""narad's HTTP API: sessions, commands, appends and history, over httpx (asyncio).

Every command, session creation, blob upload and stream ticket carries an
``Idempotency-Key`` (a uuid4 made once per call, or the caller's
``idempotency_key=``), kept across every resend of that call: a server that
acted on a request whose answer was lost answers the resend with the first
answer (``Idempotent-Replayed: true``) instead of acting twice. See
:meth:`Client.send` for what is resent, where and for how long.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, TypeAlias
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from .errors import NaradError, UnavailableError, error_of
from .models import (
    Appended,
    Blob,
    CommandAnswer,
    InterruptPage,
    OpenInterrupt,
    QueuedStarts,
    RunStartAnswer,
    SearchPage,
    SessionPage,
    SessionRecord,
    StreamTicket,
    UsagePage,
    UserMessageAnswer,
    WorkflowCancel,
    WorkflowStartAnswer,
)

if TYPE_CHECKING:
    from .runs import Runs
    from .typed import AnyEvent

log = logging.getLogger("narad.client")

Event = dict[str, Any]
"""An event as it travels: a JSON object (``type``, ``eventId``, sequences, fields)."""

JsonValue: TypeAlias = (
    "Mapping[str, JsonValue] | Sequence[JsonValue] | str | int | float | bool | None"
)
"""A JSON value a request carries (``input``, ``content``, ``metadata``, ...)."""

TokenSource = str | Callable[[], str | Awaitable[str]]
"""A bearer token, or a function (plain or async) that gives the current one."""

OnConflict: TypeAlias = Literal["reject", "enqueue", "interrupt"]
"""What ``start-run`` does when the session's top-level slot is taken."""

OnLost: TypeAlias = Literal["retry", "fail"]
"""What happens to a run when its agent runtime's lease lapses."""

MessageScope: TypeAlias = Literal["session", "workflow", "run"]
"""Where a message belongs."""

#: The request header that makes a request safe to send again.
IDEMPOTENCY_KEY = "Idempotency-Key"
#: The answer header that marks a replayed answer.
IDEMPOTENT_REPLAYED = "Idempotent-Replayed"
#: The code of a request whose key is in flight (409, with ``Retry-After``).
KEY_IN_FLIGHT = "NRD-0212"

_UNAVAILABLE = {502, 503, 504}
#: Transport errors raised before a request left: no server saw it.
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_BACKOFF_BASE = 0.1
_BACKOFF_CAP = 5.0
_MIN_RATE_LIMIT_WAIT = 0.25

_APPEND = re.compile(r"^/v1/sessions/[^/]+/events$")
_LEASE = re.compile(r"^/v1/runtime/leases/[^/]+/(heartbeat|controls|release)$")
_EXECUTOR = re.compile(r"^/v1/executors/[^/]+/(heartbeat|controls|finish)$")
#: What the server takes as an Idempotency-Key: 1 to 255 visible ASCII characters.
_KEY = re.compile(r"^[!-~]{1,255}$")


def _segment(value: str) -> str:
    return quote(value, safe="")


def new_idempotency_key() -> str:
    """A fresh idempotency key: a uuid4."""
    return str(uuid.uuid4())


def _key(given: str | None) -> str:
    if given is None:
        return new_idempotency_key()
    if not _KEY.match(given):
        raise ValueError(
            f"an idempotency key is 1 to 255 visible ASCII characters (no spaces), not {given!r}"
        )
    return given


def _json(value: Any) -> Any:
    """A value with its pydantic models as their JSON (wire names, fields given only)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True, exclude_unset=True)
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    return value


def _body(**fields: Any) -> dict[str, Any]:
    """A command body from wire-named fields; ``None`` means absent."""
    return {k: _json(v) for k, v in fields.items() if v is not None}


@dataclass
class HistoryPage:
    """One page of a session's history: its events and the cursors of the next page.

    ``events`` are the wire's JSON objects; :meth:`typed_events` gives them as
    the generated models (:data:`narad.typed.AnyEvent`).
    """

    events: list[Event]
    next_session_sequence: int | None = None
    next_sequence: int | None = None
    next_workflow_sequence: int | None = None

    @staticmethod
    def of(body: Mapping[str, Any]) -> HistoryPage:
        """The page of a history answer."""
        return HistoryPage(
            events=list(body.get("events") or []),
            next_session_sequence=body.get("nextSessionSequence"),
            next_sequence=body.get("nextSequence"),
            next_workflow_sequence=body.get("nextWorkflowSequence"),
        )

    def typed_events(self) -> list[AnyEvent]:
        """The page's events as typed models (``event.type`` narrows the union)."""
        from .typed import parse_event

        return [parse_event(e) for e in self.events]


@dataclass(frozen=True)
class RuntimeOptions:
    """How a run started for agent runtimes is handed out (``start-run``'s ``runtime``).

    ``queue`` is the work queue runtimes claim from (the server's default
    ``default`` when ``None``); ``on_lost`` what happens when the holder's
    lease lapses (``retry``: another runtime, up to ``max_attempts`` claims;
    ``fail``: ``run.error`` ``runtime_lost``).
    """

    queue: str | None = None
    on_lost: OnLost | None = None
    max_attempts: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return _body(queue=self.queue, onLost=self.on_lost, maxAttempts=self.max_attempts)


@dataclass(frozen=True)
class MemberDecision:
    """One member's decision of a grouped interrupt (``resolve-interrupt``'s ``members``)."""

    request_id: str
    decision: str
    tool_call_id: str | None = None
    tool_name: str | None = None
    tool_type: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return _body(
            requestId=self.request_id,
            decision=self.decision,
            toolCallId=self.tool_call_id,
            toolName=self.tool_name,
            toolType=self.tool_type,
        )


class Client:
    """A client of one narad deployment: one or several replicas' URLs and a token.

    Requests go to the first server that answers, starting with the one that
    answered last. What is sent again, where, and for how long is
    :meth:`send`'s policy: in short, a request that is safe to repeat
    (``GET``, an append whose events all carry eventIds, anything with an
    ``Idempotency-Key``, a lease's heartbeat, controls and release) is sent
    to the next server and again through a restart of the only one, within
    ``retry_budget`` seconds; any other only when it never reached a
    server. A 429 is sent again once its ``Retry-After`` has passed, within
    ``max_rate_limit_wait`` seconds in all. Every refusal raises a
    :class:`~narad.errors.NaradError` (a subclass per class of answer) with
    its ``NRD-xxxx`` code. Use it as ``async with Client(...) as client:``.
    """

    def __init__(
        self,
        servers: str | Sequence[str],
        token: TokenSource,
        *,
        retry_budget: float = 30.0,
        max_rate_limit_wait: float = 60.0,
        timeout: float = 60.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        urls = [servers] if isinstance(servers, str) else list(servers)
        if not urls:
            raise ValueError("give at least one server URL")
        if retry_budget < 0:
            raise ValueError("retry_budget must not be negative")
        self.servers: tuple[str, ...] = tuple(u.rstrip("/") for u in urls)
        self._token = token
        self._preferred = 0
        self.retry_budget = retry_budget
        self.max_rate_limit_wait = max_rate_limit_wait
        self._own_http = http is None
        self.http = http or httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0))

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the connections (when the client made its own httpx client)."""
        if self._own_http:
            await self.http.aclose()

    @cached_property
    def runs(self) -> Runs:
        """The run-level API: :meth:`~narad.runs.Runs.stream`, ``wait``, ``join``."""
        from .runs import Runs

        return Runs(self)

    async def bearer(self) -> str:
        """The current bearer token."""
        if isinstance(self._token, str):
            return self._token
        got = self._token()
        if inspect.isawaitable(got):
            return await got
        return got

    def servers_in_turn(self) -> list[str]:
        """The servers, starting with the one that answered last."""
        n = len(self.servers)
        return [self.servers[(self._preferred + i) % n] for i in range(n)]

    def prefer(self, server: str) -> None:
        """Marks ``server`` as the one to try first."""
        if server in self.servers:
            self._preferred = self.servers.index(server)

    # --- the retry policy ----------------------------------------------------

    @staticmethod
    def idempotent(
        method: str, path: str, json: Any = None, headers: Mapping[str, str] | None = None
    ) -> bool:
        """Whether a request may be sent again after it reached a server.

        ``GET`` and ``HEAD``; a request with an ``Idempotency-Key``; an append
        (``POST /v1/sessions/{id}/events``) whose events all carry an
        ``eventId`` (the server answers a repeat ``duplicate: true``); a
        runtime lease's ``heartbeat``, ``controls`` and ``release``; a client
        executor's ``heartbeat``, ``controls`` and ``finish`` (a finish is
        one per execution token, §11.3).
        """
        method = method.upper()
        if method in ("GET", "HEAD"):
            return True
        if headers and any(k.lower() == IDEMPOTENCY_KEY.lower() for k in headers):
            return True
        if _LEASE.match(path) or _EXECUTOR.match(path):
            return True
        if method == "POST" and _APPEND.match(path) and isinstance(json, Mapping):
            events = json.get("events")
            return (
                isinstance(events, list) and bool(events) and all(_has_event_id(e) for e in events)
            )
        return False

    async def send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: Mapping[str, str | int | bool | None] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        idempotent: bool | None = None,
        retry_budget: float | None = None,
    ) -> httpx.Response:
        """Sends a request; answers the first successful response (body read).

        The policy, one for every request of this client:

        - **Retryable** requests are those :meth:`idempotent` says (or
          ``idempotent=True``). One that gets no answer (the server cannot
          be reached, the connection breaks before the answer, a timeout),
          answers 502, 503 or 504, or 409 ``NRD-0212`` (its key is in
          flight) is sent to the next server at once; once every server
          failed in a round, it waits (exponential backoff with full
          jitter: a random time up to 0.1 s * 2^n, at most 5 s; at least
          the server's ``Retry-After``) and starts another round — so a
          restart of the only server is waited out. It stops when
          ``retry_budget`` seconds (the client's, 30 by default) have
          passed since the first attempt, or when the wait asked for would
          end past them, and raises the last failure.
        - **Any other** request is sent again, to another server or after
          the same backoff, only when it never reached a server
          (``httpx.ConnectError``, ``ConnectTimeout``, ``PoolTimeout``).
          A broken connection, a read timeout or a 502-504 after it was
          sent raises :class:`~narad.errors.UnavailableError` at once
          (``maybe_applied`` when no answer came).
        - A **429** (over a limit, refused before any effect) is sent again
          once its ``Retry-After`` has passed, whatever the request, within
          ``max_rate_limit_wait`` seconds in all; beyond that it raises
          :class:`~narad.errors.RateLimitedError`.

        Any other answer of 400 or above raises its
        :class:`~narad.errors.NaradError` subclass at once.
        """
        all_headers = {"Authorization": f"Bearer {await self.bearer()}", **(headers or {})}
        query = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        retryable = (
            idempotent if idempotent is not None else self.idempotent(method, path, json, headers)
        )
        budget = self.retry_budget if retry_budget is None else retry_budget
        deadline = time.monotonic() + budget
        rate_limited_for = 0.0
        servers = self.servers_in_turn()
        index = 0
        failed_in_round = 0
        rounds = 0
        # The longest Retry-After a server of this round asked for.
        wait_at_least = 0.0
        while True:
            server = servers[index % len(servers)]
            try:
                response = await self.http.request(
                    method,
                    server + path,
                    json=json,
                    content=content,
                    params=query,
                    headers=all_headers,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except _NEVER_SENT as e:
                last: NaradError = UnavailableError(0, f"{server} cannot be reached: {e!r}")
            except httpx.TransportError as e:
                last = UnavailableError(0, f"{server} sent no answer: {e!r}", maybe_applied=True)
                if not retryable:
                    raise last from e
            else:
                status = response.status_code
                if status == 429:
                    # Over a limit, refused before any effect: sent again once
                    # the server's Retry-After has passed, within its budget.
                    limited = error_of(response)
                    wait = max(_MIN_RATE_LIMIT_WAIT, limited.retry_after or 0.0)
                    if rate_limited_for + wait > self.max_rate_limit_wait:
                        raise limited
                    await asyncio.sleep(wait)
                    rate_limited_for += wait
                    continue
                in_flight = status == 409 and _code_of(response) == KEY_IN_FLIGHT
                if status in _UNAVAILABLE or (in_flight and retryable):
                    last = error_of(response)
                    if not retryable:
                        raise last
                    wait_at_least = max(wait_at_least, last.retry_after or 0.0)
                    if in_flight:
                        # The key is held, by this server or another: wait, same server.
                        failed_in_round = len(servers) - 1
                        index -= 1
                else:
                    self.prefer(server)
                    if status >= 400:
                        raise error_of(response)
                    if response.headers.get(IDEMPOTENT_REPLAYED, "").lower() == "true":
                        log.debug("%s %s: the answer of an earlier send, replayed", method, path)
                    return response
            index += 1
            failed_in_round += 1
            if failed_in_round < len(servers):
                continue  # the next server, at once
            failed_in_round = 0
            delay = max(wait_at_least, _jitter(rounds))
            wait_at_least = 0.0
            rounds += 1
            if time.monotonic() + delay > deadline:
                raise last
            log.debug("%s %s: %s; again in %.2f s", method, path, last, delay)
            await asyncio.sleep(delay)

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str | int | bool | None] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        idempotent: bool | None = None,
        retry_budget: float | None = None,
    ) -> Any:
        """Sends a request (see :meth:`send`) and answers its JSON (``None`` for 204)."""
        response = await self.send(
            method,
            path,
            json=json,
            params=params,
            headers=headers,
            timeout=timeout,
            idempotent=idempotent,
            retry_budget=retry_budget,
        )
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    async def _keyed(
        self,
        path: str,
        body: Any,
        idempotency_key: str | None,
        *,
        params: Mapping[str, str | int | bool | None] | None = None,
    ) -> Any:
        """A POST of ``body`` with an idempotency key, its JSON answer."""
        return await self.request(
            "POST",
            path,
            json=body,
            params=params,
            headers={IDEMPOTENCY_KEY: _key(idempotency_key)},
        )

    # --- sessions ---------------------------------------------------------

    async def capabilities(self, session_id: str | None = None) -> dict[str, Any]:
        """What the server speaks (§10.4): version, profiles, limits, a session's sequence."""
        got: dict[str, Any] = await self.request(
            "GET", "/v1/capabilities", params={"sessionId": session_id}
        )
        return got

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        title: str | None = None,
        metadata: Mapping[str, JsonValue] | None = None,
        idempotency_key: str | None = None,
    ) -> SessionRecord:
        """Creates a session (narad issues the id when ``session_id`` is ``None``)."""
        body = _body(sessionId=session_id, title=title, metadata=metadata)
        got = await self._keyed("/v1/sessions", body, idempotency_key)
        return SessionRecord.model_validate(got)

    async def get_session(self, session_id: str) -> SessionRecord:
        """Reads a session: its sequence and its active execution."""
        got = await self.request("GET", f"/v1/sessions/{_segment(session_id)}")
        return SessionRecord.model_validate(got)

    async def list_sessions(
        self, *, after: str | None = None, limit: int | None = None
    ) -> SessionPage:
        """One page of the tenant's sessions, oldest first."""
        got = await self.request("GET", "/v1/sessions", params={"after": after, "limit": limit})
        return SessionPage.model_validate(got)

    async def search_sessions(
        self,
        q: str | None = None,
        *,
        state: str | None = None,
        pending_approvals: bool | None = None,
        actor: str | None = None,
        since: str | None = None,
        until: str | None = None,
        after: str | None = None,
        limit: int | None = None,
    ) -> SearchPage:
        """Sessions found by what people said and answered in them and by their
        titles (``q``, web-search syntax), narrowed by ``state`` (open,
        archived, running, idle), ``pending_approvals``, ``actor`` (a sub) and
        ``since``/``until`` (RFC 3339); newest match first, each with its
        newest matching passages. ``after``: the previous page's ``next_after``."""
        params: dict[str, Any] = {
            "q": q,
            "state": state,
            "actor": actor,
            "since": since,
            "until": until,
            "after": after,
            "limit": limit,
        }
        if pending_approvals is not None:
            params["pendingApprovals"] = "true" if pending_approvals else "false"
        got = await self.request("GET", "/v1/search", params=params)
        return SearchPage.model_validate(got)

    async def usage(
        self,
        *,
        by: Literal["day", "session"] | None = None,
        since: str | None = None,
        until: str | None = None,
        zone: str | None = None,
        sessions: Sequence[str] | None = None,
    ) -> UsagePage:
        """The token usage of the tenant's runs (the ``usage`` of their
        terminals), summed per day in ``zone`` (an IANA name, default UTC) or
        per session (``by="session"``; ``sessions``: only these, at most 100),
        split by the model each run named (``input.model`` of its
        ``run.started``); over ``since``..``until`` (RFC 3339; default: the
        last 30 days)."""
        params: dict[str, Any] = {"by": by, "since": since, "until": until, "zone": zone}
        if sessions is not None:
            params["sessions"] = ",".join(sessions)
        got = await self.request("GET", "/v1/usage", params=params)
        return UsagePage.model_validate(got)

    async def queued_starts(self, session_id: str) -> QueuedStarts:
        """The starts waiting for the session's top-level slot, in the order they will start."""
        got = await self.request("GET", f"/v1/sessions/{_segment(session_id)}/queued-starts")
        return QueuedStarts.model_validate(got)

    # --- appends and history ---------------------------------------------

    async def append(
        self,
        session_id: str,
        events: Sequence[Mapping[str, Any] | BaseModel],
        *,
        expected_session_sequence: int | None = None,
        lease: str | None = None,
        retry_budget: float | None = None,
    ) -> Appended:
        """Appends a batch atomically (role backend); ``lease`` is a claimed run's runtime lease.

        ``events`` are JSON objects or the generated models of proposed
        events (``narad.models.proposed``). A batch whose events all carry
        an eventId is sent again when no answer came (see :meth:`send`):
        the same eventIds and bodies make the resend idempotent, and a
        batch that had been written answers ``duplicate: true``.
        """
        body: dict[str, Any] = {"events": [_json(e) for e in events]}
        if expected_session_sequence is not None:
            body["expectedSessionSequence"] = expected_session_sequence
        headers = {"Narad-Runtime-Lease": lease} if lease is not None else None
        path = f"/v1/sessions/{_segment(session_id)}/events"
        got = await self.request(
            "POST", path, json=body, headers=headers, retry_budget=retry_budget
        )
        return Appended.model_validate(got)

    async def history(
        self,
        session_id: str,
        *,
        after_session_sequence: int | None = None,
        root_run_id: str | None = None,
        after_sequence: int | None = None,
        workflow_id: str | None = None,
        after_workflow_sequence: int | None = None,
        limit: int | None = None,
    ) -> HistoryPage:
        """One page of a session's history, after a cursor of one form (§10.2)."""
        got = await self.request(
            "GET",
            f"/v1/sessions/{_segment(session_id)}/events",
            params={
                "afterSessionSequence": after_session_sequence,
                "rootRunId": root_run_id,
                "afterSequence": after_sequence,
                "workflowId": workflow_id,
                "afterWorkflowSequence": after_workflow_sequence,
                "limit": limit,
            },
        )
        return HistoryPage.of(got)

    async def all_history(
        self,
        session_id: str,
        *,
        after_session_sequence: int = 0,
        root_run_id: str | None = None,
        workflow_id: str | None = None,
    ) -> AsyncIterator[Event]:
        """Every event of a session's history after a cursor, page by page."""
        cursor = after_session_sequence
        after_sequence: int | None = 0 if root_run_id else None
        after_workflow: int | None = 0 if workflow_id else None
        while True:
            page = await self.history(
                session_id,
                after_session_sequence=cursor if not (root_run_id or workflow_id) else None,
                root_run_id=root_run_id,
                after_sequence=after_sequence,
                workflow_id=workflow_id,
                after_workflow_sequence=after_workflow,
            )
            for event in page.events:
                yield event
            if root_run_id:
                after_sequence = page.next_sequence
                more = after_sequence is not None
            elif workflow_id:
                after_workflow = page.next_workflow_sequence
                more = after_workflow is not None
            else:
                more = page.next_session_sequence is not None
                cursor = page.next_session_sequence or cursor
            if not more or not page.events:
                return

    async def open_interrupts(
        self, *, session_id: str | None = None, limit: int | None = None
    ) -> AsyncIterator[OpenInterrupt]:
        """The open interrupts (requested, not yet resolved), the longest waiting
        first, page by page: the tenant's, or one session's with ``session_id``."""
        after: str | None = None
        while True:
            got = await self.request(
                "GET",
                "/v1/interrupts",
                params={"sessionId": session_id, "limit": limit, "after": after},
            )
            page = InterruptPage.model_validate(got)
            for interrupt in page.interrupts:
                yield interrupt
            after = page.next_after
            if after is None:
                return

    # --- blobs -------------------------------------------------------------

    async def upload_blob(
        self,
        session_id: str,
        data: bytes,
        *,
        name: str,
        media_type: str = "application/octet-stream",
        attachment_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Blob:
        """Uploads ``data`` as a blob of the session (``POST /v1/sessions/{id}/blobs``).

        Put the answer's ``uri`` in an ``attachment.added`` or
        ``artifact.added``; with ``attachment_id`` the server appends the
        person's ``attachment.added`` itself (role ``writer``).
        """
        response = await self.send(
            "POST",
            f"/v1/sessions/{_segment(session_id)}/blobs",
            content=data,
            params={"name": name, "attachmentId": attachment_id},
            headers={"Content-Type": media_type, IDEMPOTENCY_KEY: _key(idempotency_key)},
        )
        return Blob.model_validate(response.json())

    async def download_blob(self, blob_id: str) -> bytes:
        """A blob's bytes (``GET /v1/blobs/{blobId}``)."""
        response = await self.send("GET", f"/v1/blobs/{_segment(blob_id)}")
        return response.content

    # --- commands ----------------------------------------------------------

    async def command(
        self, name: str, body: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Sends command ``name`` (``start-run``, ``resolve-interrupt``, ...) with its
        wire body as is, under an idempotency key (``idempotency_key``, or a new one)."""
        got: dict[str, Any] = await self._keyed(
            f"/v1/commands/{_segment(name)}", _json(dict(body)), idempotency_key
        )
        return got

    async def start_run(
        self,
        session_id: str,
        *,
        run_id: str | None = None,
        input: JsonValue = None,
        queue: str | None = None,
        runtime: RuntimeOptions | None = None,
        on_conflict: OnConflict | None = None,
        parent_run_id: str | None = None,
        client_executor_id: str | None = None,
        workflow_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> RunStartAnswer:
        """Starts a run (``start-run``).

        ``queue`` (or ``runtime``, for more settings) hands it to agent
        runtimes claiming from that queue; without either, the backend that
        appends its events drives it. ``on_conflict`` decides what happens
        when the session's top-level slot is taken (``reject``, the
        server's default: :class:`~narad.errors.ConflictError`
        ``NRD-0204``; ``enqueue``; ``interrupt``). ``run_id`` is issued by
        narad when ``None``.
        """
        if queue is not None:
            runtime = RuntimeOptions(
                queue=queue,
                on_lost=runtime.on_lost if runtime else None,
                max_attempts=runtime.max_attempts if runtime else None,
            )
        body = _body(
            sessionId=session_id,
            runId=run_id,
            input=input,
            runtime=runtime.to_json() if runtime is not None else None,
            onConflict=on_conflict,
            parentRunId=parent_run_id,
            clientExecutorId=client_executor_id,
            workflowId=workflow_id,
        )
        got = await self.command("start-run", body, idempotency_key=idempotency_key)
        return RunStartAnswer.model_validate(got)

    async def stop_run(
        self,
        session_id: str | None,
        *,
        run_id: str,
        reason: str | None = None,
        idempotency_key: str | None = None,
    ) -> CommandAnswer:
        """Asks a run to stop (``run.stop.requested``); ``session_id`` may be ``None``
        when the run id alone names the run."""
        body = _body(sessionId=session_id, runId=run_id, reason=reason)
        got = await self.command("stop-run", body, idempotency_key=idempotency_key)
        return CommandAnswer.model_validate(got)

    async def resolve_interrupt(
        self,
        session_id: str | None,
        *,
        interrupt_id: str,
        decision: str,
        reason: str | None = None,
        members: Sequence[MemberDecision] | None = None,
        idempotency_key: str | None = None,
    ) -> CommandAnswer:
        """Records a person's decision on an interrupt, at most once.

        An interrupt decided before raises :class:`~narad.errors.ConflictError`
        (``NRD-0205``) whose :attr:`~narad.errors.ConflictError.recorded_decision`
        is the decision that stands.
        """
        body = _body(
            sessionId=session_id,
            interruptId=interrupt_id,
            decision=decision,
            reason=reason,
            members=[m.to_json() for m in members] if members is not None else None,
        )
        got = await self.command("resolve-interrupt", body, idempotency_key=idempotency_key)
        return CommandAnswer.model_validate(got)

    async def record_user_message(
        self,
        session_id: str,
        content: JsonValue,
        *,
        message_scope: MessageScope = "session",
        message_id: str | None = None,
        run_id: str | None = None,
        workflow_id: str | None = None,
        attachment_ids: Sequence[str] | None = None,
        idempotency_key: str | None = None,
    ) -> UserMessageAnswer:
        """Records what a person said (``message.user.recorded``)."""
        body = _body(
            sessionId=session_id,
            messageScope=message_scope,
            content=content,
            messageId=message_id,
            runId=run_id,
            workflowId=workflow_id,
            attachmentIds=list(attachment_ids) if attachment_ids is not None else None,
        )
        if content is None:
            body["content"] = None
        got = await self.command("record-user-message", body, idempotency_key=idempotency_key)
        return UserMessageAnswer.model_validate(got)

    async def start_workflow(
        self,
        session_id: str,
        *,
        workflow_id: str | None = None,
        input: JsonValue = None,
        default_client_executor_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> WorkflowStartAnswer:
        """Starts a workflow in the session's top-level slot (``workflow.started``)."""
        body = _body(
            sessionId=session_id,
            workflowId=workflow_id,
            input=input,
            defaultClientExecutorId=default_client_executor_id,
        )
        got = await self.command("start-workflow", body, idempotency_key=idempotency_key)
        return WorkflowStartAnswer.model_validate(got)

    async def cancel_workflow(
        self,
        session_id: str | None,
        *,
        workflow_id: str,
        reason: str | None = None,
        idempotency_key: str | None = None,
    ) -> WorkflowCancel:
        """Cancels a workflow's runs, then the workflow."""
        body = _body(sessionId=session_id, workflowId=workflow_id, reason=reason)
        got = await self.command("cancel-workflow", body, idempotency_key=idempotency_key)
        return WorkflowCancel.model_validate(got)

    async def update_session(
        self,
        session_id: str,
        *,
        title: str | None = None,
        metadata: Mapping[str, JsonValue] | None = None,
        idempotency_key: str | None = None,
    ) -> SessionRecord:
        """Replaces a session's title and/or metadata (at least one of them)."""
        if title is None and metadata is None:
            raise ValueError("give a title, metadata or both")
        body = _body(sessionId=session_id, title=title, metadata=metadata)
        got = await self.command("update-session", body, idempotency_key=idempotency_key)
        return SessionRecord.model_validate(got)

    async def archive_session(
        self, session_id: str, *, idempotency_key: str | None = None
    ) -> SessionRecord:
        """Takes a session out of the active catalogue (``session.archived``)."""
        body = _body(sessionId=session_id)
        got = await self.command("archive-session", body, idempotency_key=idempotency_key)
        return SessionRecord.model_validate(got)

    async def redact_message(
        self,
        session_id: str,
        *,
        message_id: str,
        reason: str,
        display_replacement: str | None,
        idempotency_key: str | None = None,
    ) -> CommandAnswer:
        """Changes how a message displays (``message.redacted``); the journal keeps its bytes."""
        body = _body(sessionId=session_id, messageId=message_id, reason=reason)
        body["displayReplacement"] = display_replacement
        got = await self.command("redact-message", body, idempotency_key=idempotency_key)
        return CommandAnswer.model_validate(got)

    async def stream_ticket(
        self,
        *,
        session_id: str | None = None,
        tenant: bool = False,
        blob_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> StreamTicket:
        """A stream ticket: a URL that opens a session's stream (``session_id``), the
        tenant's (``tenant=True``) or reads a blob (``blob_id``) for a minute."""
        chosen = [session_id is not None, tenant, blob_id is not None]
        if sum(chosen) != 1:
            raise ValueError("give exactly one of session_id, tenant=True and blob_id")
        if session_id is not None:
            body: dict[str, Any] = {"stream": "session", "sessionId": session_id}
        elif blob_id is not None:
            body = {"stream": "blob", "blobId": blob_id}
        else:
            body = {"stream": "events"}
        got = await self._keyed("/v1/stream-tickets", body, idempotency_key)
        return StreamTicket.model_validate(got)


def _has_event_id(event: object) -> bool:
    return isinstance(event, Mapping) and isinstance(event.get("eventId"), str)


def _jitter(rounds: int) -> float:
    """Full jitter: a random time up to the exponential backoff of round ``rounds``."""
    return random.uniform(0, min(_BACKOFF_CAP, _BACKOFF_BASE * 2**rounds))


def _code_of(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, str) else None


def _param(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
