"""Each class of refusal raises its own subclass of ``NaradError`` (which still
catches them all), with the envelope's code and details, against a real server."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from conftest import NaradServer
from helpers import dead_url
from test_retries import open_interrupt

from narad import (
    AuthError,
    Client,
    ConflictError,
    GoneError,
    NaradError,
    NotFoundError,
    RateLimitedError,
    UnavailableError,
)

ROLES = "reader,writer,backend,approver,admin"


def session_name() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"


def test_every_class_is_a_narad_error() -> None:
    for cls in (
        AuthError,
        ConflictError,
        GoneError,
        NotFoundError,
        RateLimitedError,
        UnavailableError,
    ):
        assert issubclass(cls, NaradError)


async def test_not_found(narad_server: NaradServer, org: str) -> None:
    async with Client(narad_server.base, narad_server.token(ROLES, org=org)) as client:
        with pytest.raises(NotFoundError) as missing:
            await client.get_session(session_name())
        with pytest.raises(NotFoundError):
            await client.stop_run(None, run_id=f"r-{uuid.uuid4().hex[:8]}")
    assert missing.value.status == 404 and (missing.value.code or "").startswith("NRD-")


async def test_a_busy_session_is_a_conflict_naming_the_active_run(
    narad_server: NaradServer, org: str
) -> None:
    session_id = session_name()
    async with Client(narad_server.base, narad_server.token(ROLES, org=org)) as client:
        await client.create_session(session_id)
        await client.start_run(session_id, run_id="r1")
        with pytest.raises(ConflictError) as busy:
            await client.start_run(session_id, run_id="r2")
        with pytest.raises(NaradError):  # caught as a NaradError too
            await client.start_run(session_id, run_id="r3", on_conflict="reject")
    assert (busy.value.status, busy.value.code) == (409, "NRD-0204")
    assert busy.value.active_execution == {"kind": "run", "runId": "r1"}


async def test_an_interrupt_decided_before_is_a_conflict_with_the_recorded_decision(
    narad_server: NaradServer, org: str
) -> None:
    session_id = session_name()
    async with Client(narad_server.base, narad_server.token(ROLES, org=org)) as client:
        await client.create_session(session_id)
        await open_interrupt(client, session_id)
        await client.resolve_interrupt(session_id, interrupt_id="i1", decision="approve")
        with pytest.raises(ConflictError) as decided:
            await client.resolve_interrupt(session_id, interrupt_id="i1", decision="deny")
    assert (decided.value.status, decided.value.code) == (409, "NRD-0205")
    assert decided.value.recorded_decision == "approve", decided.value.details


async def test_a_bad_token_and_a_missing_role_are_auth_errors(
    narad_server: NaradServer, org: str
) -> None:
    session_id = session_name()
    async with Client(narad_server.base, narad_server.token(ROLES, org=org)) as client:
        await client.create_session(session_id)
    async with Client(narad_server.base, "not-a-token") as client:
        with pytest.raises(AuthError) as unknown:
            await client.get_session(session_id)
    async with Client(narad_server.base, narad_server.token("reader", org=org)) as client:
        with pytest.raises(AuthError) as forbidden:
            await client.record_user_message(session_id, "a reader may not")
    assert unknown.value.status == 401
    assert forbidden.value.status == 403


async def test_an_erased_session_is_gone(narad_server: NaradServer, org: str) -> None:
    session_id = session_name()
    async with Client(narad_server.base, narad_server.token(ROLES, org=org)) as client:
        await client.create_session(session_id)
        await client.request("DELETE", f"/v1/sessions/{session_id}")
        with pytest.raises(GoneError) as gone:
            await client.record_user_message(session_id, "too late")
    assert (gone.value.status, gone.value.code) == (410, "NRD-0208")


async def test_over_a_limit_is_rate_limited_once_the_wait_is_spent(
    start_server: Callable[..., NaradServer], org: str
) -> None:
    server = start_server(NARAD_LIMIT_SESSIONS="1")
    async with Client(server.base, server.token(ROLES, org=org), max_rate_limit_wait=1) as client:
        await client.create_session(session_name())
        with pytest.raises(RateLimitedError) as limited:
            await client.create_session(session_name())
    assert limited.value.status == 429 and limited.value.code == "NRD-0605"
    assert limited.value.retry_after is not None and limited.value.retry_after > 1


async def test_no_server_is_unavailable() -> None:
    async with Client(dead_url(), "t", retry_budget=0.3) as client:
        with pytest.raises(UnavailableError) as down:
            await client.get_session("s1")
    assert down.value.status == 0 and not down.value.maybe_applied
