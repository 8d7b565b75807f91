"""Idempotency keys and the retry policy of ``Client.send``.

Against a real server, through a recording transport (``helpers.Recorder``):
every keyed call (each command, session creation, blob upload, stream ticket)
sends one uuid4 ``Idempotency-Key`` and keeps it when it fails over; when its
answer is lost after the server acted, the call is sent again with the same
key (to the same server, or to the next) and the server's replay is its
answer: the same body, one effect in the journal. A request without a key is
sent again only when it never reached a server. Then the policy itself, on
an in-process transport: backoff within the budget, ``Retry-After``, a key
in flight, 429.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx
import pytest
from conftest import NaradServer
from helpers import Fault, FaultProxy, Recorder, dead_url, to_path

from narad import (
    Client,
    ConflictError,
    NaradError,
    RateLimitedError,
    UnavailableError,
)

ROLES = "reader,writer,backend,approver"


def session_name() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"


async def count(client: Client, session_id: str, kind: str) -> int:
    """How many events of type ``kind`` the session's history holds."""
    return sum(1 for e in [e async for e in client.all_history(session_id)] if e["type"] == kind)


async def open_interrupt(client: Client, session_id: str) -> None:
    """Run ``r1`` of the session, asking a person (interrupt ``i1``)."""
    await client.start_run(session_id, run_id="r1")
    base = {"protocolVersion": "narad/v1", "rootRunId": "r1", "runId": "r1"}
    await client.append(
        session_id,
        [
            {
                **base,
                "type": "interrupt.requested",
                "eventId": f"{session_id}-ask",
                "interruptId": "i1",
                "waitId": "w1",
                "kind": "approval",
                "actions": ["approve", "deny"],
                "message": "May I?",
            },
            {
                **base,
                "type": "run.paused",
                "eventId": f"{session_id}-pause",
                "waitId": "w1",
                "interruptId": "i1",
                "reason": "approval",
                "resumeMode": "command",
            },
        ],
    )


@dataclass
class Case:
    """A keyed call: where it goes, what it needs first, what it leaves in the journal."""

    path: Callable[[str], str]
    call: Callable[[Client, str], Awaitable[object]]
    setup: Callable[[Client, str], Awaitable[object]] | None = None
    #: The event type it appends once (``None``: nothing to count in history).
    effect: str | None = None


async def _session(client: Client, session_id: str) -> object:
    return await client.create_session(session_id)


async def _session_and_run(client: Client, session_id: str) -> object:
    await client.create_session(session_id)
    return await client.start_run(session_id, run_id="r1")


async def _session_and_interrupt(client: Client, session_id: str) -> object:
    await client.create_session(session_id)
    await open_interrupt(client, session_id)
    return None


async def _session_and_workflow(client: Client, session_id: str) -> object:
    await client.create_session(session_id)
    return await client.start_workflow(session_id, workflow_id="w1")


async def _session_and_message(client: Client, session_id: str) -> object:
    await client.create_session(session_id)
    return await client.record_user_message(session_id, "my number is 555", message_id="m1")


CASES: dict[str, Case] = {
    "create-session": Case(
        path=lambda _: "/v1/sessions",
        call=lambda c, s: c.create_session(title="made once"),
    ),
    "record-user-message": Case(
        path=lambda _: "/v1/commands/record-user-message",
        setup=_session,
        call=lambda c, s: c.record_user_message(s, "said once"),
        effect="message.user.recorded",
    ),
    "start-run": Case(
        path=lambda _: "/v1/commands/start-run",
        setup=_session,
        call=lambda c, s: c.start_run(s, on_conflict="enqueue", input={"n": 1}),
        effect="run.started",
    ),
    "stop-run": Case(
        path=lambda _: "/v1/commands/stop-run",
        setup=_session_and_run,
        call=lambda c, s: c.stop_run(s, run_id="r1", reason="enough"),
        effect="run.stop.requested",
    ),
    "resolve-interrupt": Case(
        path=lambda _: "/v1/commands/resolve-interrupt",
        setup=_session_and_interrupt,
        call=lambda c, s: c.resolve_interrupt(s, interrupt_id="i1", decision="approve"),
        effect="interrupt.resolved",
    ),
    "start-workflow": Case(
        path=lambda _: "/v1/commands/start-workflow",
        setup=_session,
        call=lambda c, s: c.start_workflow(s, input={"n": 1}),
        effect="workflow.started",
    ),
    "cancel-workflow": Case(
        path=lambda _: "/v1/commands/cancel-workflow",
        setup=_session_and_workflow,
        call=lambda c, s: c.cancel_workflow(s, workflow_id="w1", reason="enough"),
        effect="workflow.cancelled",
    ),
    "update-session": Case(
        path=lambda _: "/v1/commands/update-session",
        setup=_session,
        call=lambda c, s: c.update_session(s, title="renamed once"),
    ),
    "archive-session": Case(
        path=lambda _: "/v1/commands/archive-session",
        setup=_session,
        call=lambda c, s: c.archive_session(s),
    ),
    "redact-message": Case(
        path=lambda _: "/v1/commands/redact-message",
        setup=_session_and_message,
        call=lambda c, s: c.redact_message(
            s, message_id="m1", reason="pii", display_replacement="[removed]"
        ),
        effect="message.redacted",
    ),
    "upload-blob": Case(
        path=lambda s: f"/v1/sessions/{s}/blobs",
        setup=_session,
        call=lambda c, s: c.upload_blob(s, b"some bytes", name="a.txt", media_type="text/plain"),
    ),
    "stream-ticket": Case(
        path=lambda _: "/v1/stream-tickets",
        setup=_session,
        call=lambda c, s: c.stream_ticket(session_id=s),
    ),
}


@pytest.fixture
async def writer(narad_server: NaradServer, org: str) -> AsyncIterator[Client]:
    async with Client(narad_server.base, narad_server.token(ROLES, org=org)) as client:
        yield client


def is_uuid4(key: str | None) -> bool:
    try:
        return key is not None and uuid.UUID(key).version == 4 and str(uuid.UUID(key)) == key
    except ValueError:
        return False


@pytest.mark.parametrize("name", sorted(CASES))
async def test_a_keyed_call_keeps_its_key_across_failover(
    narad_server: NaradServer, org: str, writer: Client, name: str
) -> None:
    case, session_id = CASES[name], session_name()
    if case.setup is not None:
        await case.setup(writer, session_id)
    recorder = Recorder()
    async with recorder.client(
        [dead_url(), narad_server.base], narad_server.token(ROLES, org=org)
    ) as c:
        await case.call(c, session_id)
    sent = recorder.to(case.path(session_id))
    assert [s.outcome for s in sent] == ["unreachable", "answered"], sent
    assert sent[1].status is not None and sent[1].status < 300, sent[1].answer
    assert is_uuid4(sent[0].key), sent[0].key
    assert sent[0].key == sent[1].key
    assert sent[0].body == sent[1].body


@pytest.mark.parametrize("servers", ["one", "two"])
@pytest.mark.parametrize("name", sorted(CASES))
async def test_a_call_whose_answer_is_lost_has_one_effect(
    narad_server: NaradServer, org: str, writer: Client, name: str, servers: str
) -> None:
    """The server acts, the answer never arrives: the call is sent again with
    its key (to the same server, or to the next) and answered with the replay."""
    case, session_id = CASES[name], session_name()
    if case.setup is not None:
        await case.setup(writer, session_id)
    path = case.path(session_id)
    proxy = FaultProxy(narad_server.base)
    urls = [narad_server.base] if servers == "one" else [narad_server.base, await proxy.start()]
    recorder = Recorder(Fault(to_path(path), "drop-answer"))
    try:
        async with recorder.client(urls, narad_server.token(ROLES, org=org)) as c:
            await case.call(c, session_id)
    finally:
        await proxy.close()
    sent = recorder.to(path)
    assert [s.outcome for s in sent] == ["dropped", "answered"], sent
    first, again = sent
    assert first.status is not None and first.status < 300, first.answer
    assert first.key is not None and first.key == again.key
    assert (first.url == again.url) == (servers == "one")
    assert again.status == first.status
    assert json.loads(again.answer) == json.loads(first.answer)
    assert again.replayed, again.answer_headers
    if case.effect is not None:
        assert await count(writer, session_id, case.effect) == 1
    if name == "create-session":
        assert len((await writer.list_sessions()).sessions) == 1
    if name == "start-run":
        assert (await writer.queued_starts(session_id)).queued_starts == []


async def test_the_callers_key_is_sent_and_a_repeat_is_answered_by_the_replay(
    narad_server: NaradServer, org: str, writer: Client
) -> None:
    session_id = session_name()
    await writer.create_session(session_id)
    recorder = Recorder()
    key = f"my-key-{uuid.uuid4()}"
    async with recorder.client(narad_server.base, narad_server.token(ROLES, org=org)) as c:
        first = await c.record_user_message(session_id, "once", idempotency_key=key)
        again = await c.record_user_message(session_id, "once", idempotency_key=key)
        with pytest.raises(NaradError) as reused:
            await c.record_user_message(session_id, "another text", idempotency_key=key)
    assert [s.key for s in recorder.to("/v1/commands/record-user-message")] == [key] * 3
    assert again.message_id == first.message_id
    assert (reused.value.status, reused.value.code) == (422, "NRD-0211")
    assert await count(writer, session_id, "message.user.recorded") == 1
    for bad in ("no\nnewlines", "no spaces", "", "k" * 256):
        with pytest.raises(ValueError):
            await writer.record_user_message(session_id, "x", idempotency_key=bad)


async def test_a_request_without_a_key_is_not_sent_again_after_a_read_error(
    narad_server: NaradServer, org: str, writer: Client
) -> None:
    session_id = session_name()
    await writer.create_session(session_id)
    path = "/v1/commands/record-user-message"
    body = {"sessionId": session_id, "messageScope": "session", "content": "unkeyed"}
    proxy = FaultProxy(narad_server.base)
    recorder = Recorder(Fault(to_path(path), "drop-answer"))
    try:
        urls = [narad_server.base, await proxy.start()]
        async with recorder.client(urls, narad_server.token(ROLES, org=org)) as c:
            assert not c.idempotent("POST", path, body, {})
            with pytest.raises(UnavailableError) as lost:
                await c.send("POST", path, json=body)
    finally:
        await proxy.close()
    assert lost.value.status == 0 and lost.value.maybe_applied
    assert [s.outcome for s in recorder.to(path)] == ["dropped"]
    assert "idempotency-key" not in recorder.to(path)[0].headers
    # It had acted, once; the client left it to the caller to find out.
    assert await count(writer, session_id, "message.user.recorded") == 1


async def test_a_request_without_a_key_is_not_sent_again_after_a_502(
    narad_server: NaradServer, org: str, writer: Client
) -> None:
    session_id = session_name()
    await writer.create_session(session_id)
    path = "/v1/commands/record-user-message"
    body = {"sessionId": session_id, "messageScope": "session", "content": "unkeyed"}
    recorder = Recorder(Fault(to_path(path), "answer", status=502))
    urls = [narad_server.base, narad_server.base]
    async with recorder.client(urls, narad_server.token(ROLES, org=org)) as c:
        with pytest.raises(UnavailableError) as refused:
            await c.send("POST", path, json=body)
    assert refused.value.status == 502
    assert [s.outcome for s in recorder.to(path)] == ["faked"]
    assert await count(writer, session_id, "message.user.recorded") == 0


async def test_a_request_without_a_key_goes_to_the_next_server_when_it_reached_none(
    narad_server: NaradServer, org: str, writer: Client
) -> None:
    session_id = session_name()
    await writer.create_session(session_id)
    path = "/v1/commands/record-user-message"
    body = {"sessionId": session_id, "messageScope": "session", "content": "unkeyed"}
    recorder = Recorder()
    async with recorder.client(
        [dead_url(), narad_server.base], narad_server.token(ROLES, org=org)
    ) as c:
        response = await c.send("POST", path, json=body)
    assert response.status_code == 201
    assert [s.outcome for s in recorder.to(path)] == ["unreachable", "answered"]
    assert await count(writer, session_id, "message.user.recorded") == 1


async def test_an_append_whose_answer_is_lost_is_sent_again_and_written_once(
    narad_server: NaradServer, org: str, writer: Client
) -> None:
    session_id = session_name()
    await writer.create_session(session_id)
    path = f"/v1/sessions/{session_id}/events"
    events = [
        {
            "protocolVersion": "narad/v1",
            "type": "session.custom",
            "eventId": f"{session_id}-{n}",
            "name": "pytest.counter",
            "value": {"n": n},
        }
        for n in range(3)
    ]
    recorder = Recorder(Fault(to_path(path), "drop-answer"))
    async with recorder.client(narad_server.base, narad_server.token(ROLES, org=org)) as c:
        appended = await c.append(session_id, events)
    assert [s.outcome for s in recorder.to(path)] == ["dropped", "answered"]
    assert appended.duplicate
    assert await count(writer, session_id, "session.custom") == 3


# --- the policy, on an in-process transport ------------------------------------


def scripted(*answers: httpx.Response | type[Exception]) -> tuple[Client, list[httpx.Request]]:
    """A client of ``http://a`` and ``http://b`` whose requests get ``answers`` in turn
    (the last one again once they run out)."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        got = answers[min(len(seen), len(answers)) - 1]
        if isinstance(got, httpx.Response):
            return got
        raise got("scripted", request=request)  # type: ignore[call-arg]

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return Client(["http://a", "http://b"], "t", http=http, retry_budget=3.0), seen


def envelope(status: int, code: str, **headers: str) -> httpx.Response:
    body = {"code": code, "title": "t", "message": "m"}
    return httpx.Response(status, json=body, headers=headers)


OK = httpx.Response(200, json={"ok": True})


async def test_a_get_fails_over_then_waits_out_503s_honouring_retry_after() -> None:
    client, seen = scripted(
        envelope(503, "NRD-0901", **{"Retry-After": "1"}),
        envelope(503, "NRD-0901", **{"Retry-After": "1"}),
        OK,
    )
    began = time.monotonic()
    assert await client.request("GET", "/v1/sessions") == {"ok": True}
    took = time.monotonic() - began
    # a, then b at once; both failed: at least the 1 s asked for, then a again.
    assert [r.url.host for r in seen] == ["a", "b", "a"]
    assert 0.95 <= took < 2.5, took


async def test_the_budget_bounds_the_resends() -> None:
    client, seen = scripted(httpx.ConnectError)
    client.retry_budget = 1.0
    began = time.monotonic()
    with pytest.raises(UnavailableError) as failed:
        await client.request("POST", "/v1/commands/stop-run", json={}, headers={"x": "y"})
    took = time.monotonic() - began
    assert failed.value.status == 0 and not failed.value.maybe_applied
    assert len(seen) >= 4, len(seen)  # a connect error is safe to resend: any request
    assert took <= 1.2, took


async def test_a_retry_after_past_the_budget_is_not_waited_for() -> None:
    client, seen = scripted(envelope(503, "NRD-0901", **{"Retry-After": "30"}))
    began = time.monotonic()
    with pytest.raises(UnavailableError):
        await client.request("GET", "/v1/sessions")
    assert time.monotonic() - began < 1.0
    assert len(seen) == 2  # both servers once


async def test_a_key_in_flight_is_waited_for_and_sent_again_with_the_same_key() -> None:
    client, seen = scripted(envelope(409, "NRD-0212", **{"Retry-After": "1"}), OK)
    got = await client.request("POST", "/v1/commands/x", json={}, headers={"Idempotency-Key": "k"})
    assert got == {"ok": True}
    assert [r.headers["idempotency-key"] for r in seen] == ["k", "k"]
    assert [r.url.host for r in seen] == ["a", "a"]


async def test_a_read_error_is_resent_only_when_the_request_is_idempotent() -> None:
    client, seen = scripted(httpx.ReadError, OK)
    assert await client.request("GET", "/v1/sessions") == {"ok": True}
    assert len(seen) == 2
    client, seen = scripted(httpx.ReadError, OK)
    with pytest.raises(UnavailableError) as lost:
        await client.request("POST", "/v1/runtime/claims", json={})
    assert lost.value.maybe_applied and len(seen) == 1
    client, seen = scripted(httpx.ReadError, OK)
    heartbeat = "/v1/runtime/leases/l1/heartbeat"
    assert await client.request("POST", heartbeat) == {"ok": True}
    assert len(seen) == 2


async def test_a_429_is_sent_again_after_its_retry_after_within_its_own_budget() -> None:
    client, seen = scripted(envelope(429, "NRD-0602", **{"Retry-After": "1"}), OK)
    assert await client.request("POST", "/v1/runtime/claims", json={}) == {"ok": True}
    assert len(seen) == 2
    client, seen = scripted(envelope(429, "NRD-0602", **{"Retry-After": "5"}))
    client.max_rate_limit_wait = 1.0
    with pytest.raises(RateLimitedError) as limited:
        await client.request("POST", "/v1/runtime/claims", json={})
    assert (limited.value.status, limited.value.retry_after) == (429, 5.0)
    assert isinstance(limited.value, NaradError)


async def test_a_refusal_is_not_sent_again() -> None:
    client, seen = scripted(envelope(409, "NRD-0205"))
    with pytest.raises(ConflictError):
        await client.request("POST", "/v1/commands/x", json={}, headers={"Idempotency-Key": "k"})
    assert len(seen) == 1


async def test_the_round_waits_the_longest_retry_after_any_server_asked_for() -> None:
    client, seen = scripted(
        envelope(503, "NRD-0901", **{"Retry-After": "1"}), httpx.ConnectError, OK
    )
    began = time.monotonic()
    assert await client.request("GET", "/v1/sessions") == {"ok": True}
    assert [r.url.host for r in seen] == ["a", "b", "a"]
    assert time.monotonic() - began >= 0.95
