"""narad's HTTP API: sessions, commands, appends and history, over httpx (asyncio)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from .errors import NaradError, error_of
from .models import (
    Appended,
    InterruptPage,
    OpenInterrupt,
    SessionPage,
    SessionRecord,
    StreamTicket,
)

Event = dict[str, Any]
"""An event as it travels: a JSON object (``type``, ``eventId``, sequences, fields)."""

TokenSource = str | Callable[[], str | Awaitable[str]]
"""A bearer token, or a function (plain or async) that gives the current one."""


_UNAVAILABLE = {502, 503, 504}


def _segment(value: str) -> str:
    return quote(value, safe="")


@dataclass
class HistoryPage:
    """One page of a session's history: its events and the cursors of the next page."""

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


@dataclass
class _Budget:
    """How long one request has waited on 429s so far."""

    waited: float = 0.0


class Client:
    """A client of one narad deployment: one or several replicas' URLs and a token.

    Requests go to the first server that answers; a server that cannot be
    reached or answers 502-504 is left for the next (and the next request
    starts from the one that answered). A 429 (a limit of the tenant) is
    sent again once its ``Retry-After`` has passed, within
    ``max_rate_limit_wait`` seconds in all; beyond that it is raised.
    Every refusal raises :class:`~narad.errors.NaradError` with its
    ``NRD-xxxx`` code. Use it as ``async with Client(...) as client:``.
    """

    def __init__(
        self,
        servers: str | Sequence[str],
        token: TokenSource,
        *,
        max_rate_limit_wait: float = 60.0,
        timeout: float = 60.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        urls = [servers] if isinstance(servers, str) else list(servers)
        if not urls:
            raise ValueError("give at least one server URL")
        self.servers: tuple[str, ...] = tuple(u.rstrip("/") for u in urls)
        self._token = token
        self._preferred = 0
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
    ) -> httpx.Response:
        """Sends a request; answers the first server's successful response (body read)."""
        all_headers = {"Authorization": f"Bearer {await self.bearer()}", **(headers or {})}
        query = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        last: NaradError | None = None
        budget = _Budget()
        servers = self.servers_in_turn()
        i = 0
        while i < len(servers):
            server = servers[i]
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
            except httpx.TransportError as e:
                last = NaradError(0, f"{server} cannot be reached: {e!r}")
                i += 1
                continue
            if response.status_code in _UNAVAILABLE:
                last = error_of(response)
                i += 1
                continue
            if response.status_code == 429:
                # Over a limit, refused before any effect: sent again once
                # the server's Retry-After has passed, within the budget.
                limited = error_of(response)
                wait = max(0.25, limited.retry_after or 0.0)
                if budget.waited + wait > self.max_rate_limit_wait:
                    raise limited
                await asyncio.sleep(wait)
                budget.waited += wait
                continue
            self.prefer(server)
            if response.status_code >= 400:
                raise error_of(response)
            return response
        raise last or NaradError(0, "no server answered")

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str | int | bool | None] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Sends a request and answers its JSON (``None`` for 204)."""
        response = await self.send(
            method, path, json=json, params=params, headers=headers, timeout=timeout
        )
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    # --- sessions ---------------------------------------------------------

    async def capabilities(self, session_id: str | None = None) -> dict[str, Any]:
        """What the server speaks (§10.4): version, profiles, limits, a session's sequence."""
        got: dict[str, Any] = await self.request(
            "GET", "/v1/capabilities", params={"sessionId": session_id}
        )
        return got

    async def create_session(self, session_id: str | None = None, **fields: Any) -> SessionRecord:
        """Creates a session (``title``, ``metadata``, ... as keyword arguments)."""
        body = {**fields}
        if session_id is not None:
            body["sessionId"] = session_id
        return SessionRecord.model_validate(await self.request("POST", "/v1/sessions", json=body))

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

    # --- appends and history ---------------------------------------------

    async def append(
        self,
        session_id: str,
        events: Sequence[Event],
        *,
        expected_session_sequence: int | None = None,
        lease: str | None = None,
        retries: int = 5,
    ) -> Appended:
        """Appends a batch atomically (role backend); ``lease`` is a claimed run's runtime lease.

        The batch is sent again when no answer came (a server unreachable,
        503): the same eventIds and bodies make a retry idempotent, and a
        batch that had been written answers ``duplicate: true``.
        """
        body: dict[str, Any] = {"events": list(events)}
        if expected_session_sequence is not None:
            body["expectedSessionSequence"] = expected_session_sequence
        headers = {"Narad-Runtime-Lease": lease} if lease is not None else None
        path = f"/v1/sessions/{_segment(session_id)}/events"
        for attempt in range(retries + 1):
            try:
                got = await self.request("POST", path, json=body, headers=headers)
                return Appended.model_validate(got)
            except NaradError as e:
                if not e.retryable or e.status == 429 or attempt == retries:
                    raise
                await asyncio.sleep(max(e.retry_after or 0.0, min(0.2 * 2**attempt, 5.0)))
        raise AssertionError("unreachable")

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

    # --- commands ----------------------------------------------------------

    async def command(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Sends command ``name`` (``start-run``, ``resolve-interrupt``, ...)."""
        got: dict[str, Any] = await self.request(
            "POST", f"/v1/commands/{_segment(name)}", json=dict(body)
        )
        return got

    async def start_run(self, session_id: str, **fields: Any) -> dict[str, Any]:
        """Starts a run (``runId``, ``queue``, ``input``, ``onConflict``, ... as keywords)."""
        return await self.command("start-run", {"sessionId": session_id, **fields})

    async def stop_run(self, session_id: str, run_id: str, **fields: Any) -> dict[str, Any]:
        """Asks a run to stop (``run.stop.requested``)."""
        return await self.command("stop-run", {"sessionId": session_id, "runId": run_id, **fields})

    async def resolve_interrupt(
        self, session_id: str, interrupt_id: str, decision: str, **fields: Any
    ) -> dict[str, Any]:
        """Records a person's decision on an interrupt (at most once)."""
        body = {"sessionId": session_id, "interruptId": interrupt_id, "decision": decision}
        return await self.command("resolve-interrupt", {**body, **fields})

    async def record_user_message(
        self, session_id: str, content: Any, *, message_scope: str = "session", **fields: Any
    ) -> dict[str, Any]:
        """Records what a person said (``messageId``, ``runId``, ... as keywords)."""
        body = {"sessionId": session_id, "messageScope": message_scope, "content": content}
        return await self.command("record-user-message", {**body, **fields})

    async def stream_ticket(self, request: Mapping[str, Any]) -> StreamTicket:
        """A stream ticket: a URL that opens a stream (or reads a blob) for a minute."""
        got = await self.request("POST", "/v1/stream-tickets", json=dict(request))
        return StreamTicket.model_validate(got)


def _param(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
