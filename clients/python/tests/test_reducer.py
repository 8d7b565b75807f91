"""The client reading stack: the SSE parser, the classifier and the
SessionReducer, against hand-made streams, narad's golden traces
(`conformance/traces`), and — when `NARAD_BIN` names a narad binary — the
conformance kit's client suite with faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from narad.reducer import SessionReducer
from narad.sse import SseEvent, SseParser, parse_sse
from narad.wire import ALL_PROFILES, Accepted, Ignored, Violation, classify, profile_set

PYTHON_SDK = Path(__file__).resolve().parents[1]
REPO = PYTHON_SDK.parents[1]
TRACES = Path(os.environ.get("NARAD_TRACES", REPO / "conformance" / "traces"))
EVERY = [p for p in ALL_PROFILES if p != "narad.core/v1"]


def event(type_name: str, seq: int, event_id: str | None = None, **members: Any) -> dict[str, Any]:
    """An authority event of session `ses-1` at sessionSequence `seq`."""
    return {
        "protocolVersion": "narad/v1",
        "type": type_name,
        "eventId": event_id or f"e{seq:03}",
        "timestamp": "2026-08-05T04:00:00Z",
        "sessionId": "ses-1",
        "sessionSequence": seq,
        **members,
    }


def run_event(type_name: str, seq: int, sequence: int, **members: Any) -> dict[str, Any]:
    """An event of run journal `run-1`."""
    return event(type_name, seq, rootRunId="run-1", runId="run-1", sequence=sequence, **members)


def conversation() -> list[dict[str, Any]]:
    """A user message, then a run that streams "Hello there" and finishes."""
    return [
        event("message.user.recorded", 1, messageId="m-1", messageScope="session", content="hi"),
        run_event("run.started", 2, 1),
        run_event(
            "message.text.started", 3, 2, messageId="m-2", role="assistant", messageScope="run"
        ),
        run_event("message.text.delta", 4, 3, messageId="m-2", delta="Hello"),
        run_event("message.text.delta", 5, 4, messageId="m-2", delta=" there"),
        run_event("message.text.completed", 6, 5, messageId="m-2"),
        run_event("run.finished", 7, 6),
    ]


def refused(reducer: SessionReducer, value: object) -> Violation:
    """Delivers `value`, which must be refused without changing the state."""
    before = reducer.state()
    with pytest.raises(Violation) as caught:
        reducer.deliver(value)
    assert reducer.state() == before, "a refused object changed the state"
    return caught.value


# --- the reducer -------------------------------------------------------------


def test_duplicates_are_applied_once() -> None:
    r = SessionReducer(profiles=EVERY)
    events = conversation()
    outcomes = []
    for e in events[:4] + events[1:4] + events[4:] + [events[0], events[6]]:
        outcomes.append(r.deliver(e))
    assert outcomes.count("applied") == 7
    assert outcomes.count("duplicate") == 5
    state = r.state()
    assert state["sessionSequence"] == 7
    assert state["runs"]["run-1"]["state"] == "finished"
    assert [i.get("content") for i in state["transcript"]] == ["hi", "Hello there"]


def test_a_gap_is_refused_and_nothing_past_it_applied() -> None:
    r = SessionReducer(profiles=EVERY)
    events = conversation()
    r.deliver(events[0])
    r.deliver(events[1])
    v = refused(r, events[3])
    assert v.rule == "delivery.gap"
    assert v.event_id == "e004"
    assert r.session_sequence == 2
    # Re-reading from the last sequence held mends it.
    assert [r.deliver(e) for e in events[2:]] == ["applied"] * 5


def test_one_event_id_at_two_sequences_conflicts() -> None:
    r = SessionReducer(profiles=EVERY)
    events = conversation()
    for e in events[:3]:
        r.deliver(e)
    moved = {**events[3], "eventId": "e001"}
    assert refused(r, moved).rule == "delivery.conflict"


def test_two_events_at_one_sequence_conflict() -> None:
    r = SessionReducer(profiles=EVERY)
    events = conversation()
    for e in events[:3]:
        r.deliver(e)
    other = {**events[2], "eventId": "e-other"}
    v = refused(r, other)
    assert v.rule == "delivery.conflict"
    assert "e003" in v.message


def test_a_snapshot_replaces_the_transcript_through_its_sequence() -> None:
    r = SessionReducer(profiles=EVERY)
    snapshot = {
        "protocolVersion": "narad/v1",
        "type": "messages.snapshot",
        "timestamp": "2026-08-05T04:00:40Z",
        "snapshotId": "snap-1",
        "sessionId": "ses-1",
        "coversThroughSessionSequence": 4,
        "messages": [
            {
                "messageId": "m-1",
                "role": "user",
                "messageScope": "session",
                "content": "hi",
                "completed": True,
            },
            {
                "messageId": "m-2",
                "role": "assistant",
                "messageScope": "run",
                "runId": "run-1",
                "content": "Hello",
                "completed": False,
                "reasoning": [{"reasoningId": "r-1", "text": "Greet.", "completed": True}],
            },
        ],
    }
    assert r.deliver(snapshot) == "recorded"
    for e in conversation():
        r.deliver(e)
    transcript = r.state()["transcript"]
    # The events the snapshot covers were not appended a second time.
    assert [(i["item"], i.get("messageId")) for i in transcript] == [
        ("message", "m-1"),
        ("reasoning", "m-2"),
        ("message", "m-2"),
    ]
    assert transcript[2].get("content") == "Hello there"
    assert transcript[2]["completed"] is True


def test_a_watch_revision_never_regresses() -> None:
    r = SessionReducer(profiles=EVERY)

    def watch(event_id: str, revision: int) -> dict[str, Any]:
        return {
            "protocolVersion": "narad/v1",
            "type": "session.revision",
            "eventId": event_id,
            "timestamp": "2026-08-05T04:00:50Z",
            "revision": revision,
            "sessionId": "ses-1",
        }

    assert r.deliver(watch("w-7", 7)) == "recorded"
    assert r.deliver(watch("w-7", 7)) == "duplicate"
    assert r.deliver(watch("w-7b", 7)) == "recorded"
    assert refused(r, watch("w-5", 5)).rule == "watch.revision.regress"
    assert r.state()["watch"] == {"session.revision/ses-1": 7}


def test_a_profile_not_negotiated_is_accounted_for_not_applied() -> None:
    r = SessionReducer(profiles=[])
    assert [r.deliver(e) for e in conversation()] == [
        "ignored",
        "applied",
        "ignored",
        "ignored",
        "ignored",
        "ignored",
        "applied",
    ]
    state = r.state()
    assert state["sessionSequence"] == 7
    assert state["transcript"] == []
    assert state["runs"]["run-1"]["state"] == "finished"


def test_unknown_types_fail_closed_only_inside_a_negotiated_namespace() -> None:
    r = SessionReducer(profiles=["narad.conversation/v1"])
    outside = {"protocolVersion": "narad/v1", "type": "acme.telemetry", "cpu": 3}
    assert r.deliver(outside) == "ignored"
    assert r.deliver({"protocolVersion": "narad/v1", "type": "workflow.teleported"}) == "ignored"
    inside = {"protocolVersion": "narad/v1", "type": "message.text.teleported"}
    v = refused(r, inside)
    assert (v.rule, v.pointer) == ("wire.unknown-type", "/type")


def test_structural_problems_name_the_rule_and_the_field() -> None:
    r = SessionReducer(profiles=EVERY)
    r.deliver(run_event("run.started", 1, 1))
    paused = run_event("run.paused", 2, 2, waitId="w-1", reason="interrupt")
    v = refused(r, paused)
    assert (v.rule, v.pointer) == ("wire.invalid", "/resumeMode")
    bad_time = {**run_event("run.finished", 2, 2), "timestamp": "2026-08-05 04:00:02"}
    assert refused(r, bad_time).pointer == "/timestamp"
    assert refused(r, {**bad_time, "protocolVersion": "narad/v2"}).rule == "wire.version"
    assert refused(r, "not an object").rule == "wire.invalid"
    assert refused(r, {**run_event("run.finished", 2, 2), "sessionSequence": True}).pointer == (
        "/sessionSequence"
    )


def test_lifecycle_rules_refuse_and_name_the_event() -> None:
    r = SessionReducer(profiles=EVERY)
    r.deliver(run_event("run.started", 1, 1))
    r.deliver(
        run_event(
            "tool.call.started",
            2,
            2,
            toolCallId="tc-1",
            toolName="fs.read",
            executor="backend",
            args={"path": "README.md"},
        )
    )
    v = refused(r, run_event("run.finished", 3, 3))
    assert v.rule == "run.terminal.open-work"
    assert v.event_id == "e003"
    assert "tc-1" in v.message
    assert r.state()["toolCalls"] == {
        "tc-1": {"runId": "run-1", "toolName": "fs.read", "executor": "backend"}
    }


def test_control_messages_execute_nothing() -> None:
    r = SessionReducer(profiles=EVERY)
    execute = {
        "protocolVersion": "narad/v1",
        "type": "client.tool.execute",
        "clientExecutorId": "desktop-1",
        "leaseId": "l-1",
        "executionToken": "tok-1",
        "executionTokenExpiresAt": "2026-08-05T04:01:00Z",
        "toolCallId": "tc-1",
        "toolName": "open.file",
        "args": {},
    }
    assert r.deliver(execute) == "ignored"
    assert r.session_sequence == 0


def test_state_is_a_copy() -> None:
    r = SessionReducer(profiles=EVERY)
    for e in conversation()[:4]:
        r.deliver(e)
    item = r.state()["transcript"][1]
    assert item["item"] == "message"
    item["content"] = "changed"
    r.state()["runs"].clear()
    assert r.state()["transcript"][1].get("content") == "Hello"
    assert "run-1" in r.state()["runs"]


def test_an_unknown_profile_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"narad\.nonsense/v1"):
        SessionReducer(profiles=["narad.nonsense/v1"])


def test_classify_tells_accepted_from_ignored() -> None:
    core = profile_set([])
    assert isinstance(classify(run_event("run.started", 1, 1), core), Accepted)
    message = event("message.user.recorded", 1, messageId="m", messageScope="session", content=1)
    assert classify(message, core) == Ignored("message.user.recorded", "not-negotiated")


# --- the SSE parser -----------------------------------------------------------


async def test_the_parser_follows_the_html_standard() -> None:
    chunks = [
        ": keep-alive\n\n",
        'event: capabilities\r\ndata: {"a":1}\r\n\r\n',
        'id: e1\ndata: {"x":\n',
        "data: 2}\n\n",
        "event: hydrate\ndata: {}\r",
        "\n\r\n",
        "data:no-space\n\n",
        "id: e2\ndata: half",  # no blank line: never dispatched
    ]

    async def body() -> Any:
        for c in chunks:
            yield c.encode()

    frames = [f async for f in parse_sse(body(), "start")]
    assert frames == [
        SseEvent("capabilities", '{"a":1}', "start", own_id=False),
        SseEvent("message", '{"x":\n2}', "e1", own_id=True),
        # A frame without an id keeps the last one (the last event ID buffer).
        SseEvent("hydrate", "{}", "e1", own_id=False),
        SseEvent("message", "no-space", "e1", own_id=False),
    ]


def test_the_parser_takes_bytes_split_anywhere() -> None:
    text = "\ufeffid: é1\r\ndata: héllo\r\n\r\nid: bad\0id\ndata: x\n\n"
    data = text.encode()
    for size in (1, 2, 3, 7):
        parser = SseParser()
        frames: list[SseEvent] = []
        for i in range(0, len(data), size):
            frames += parser.feed(data[i : i + size])
        assert frames == [
            SseEvent("message", "héllo", "é1", own_id=True),
            # An id holding NUL is ignored.
            SseEvent("message", "x", "é1", own_id=False),
        ], size
        assert parser.last_event_id == "é1"


# --- the golden traces --------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    """A trace of `conformance/traces`: its lines (number, text) and its manifest."""

    name: str
    lines: list[tuple[int, str]]
    manifest: dict[str, Any]


def load_traces() -> Iterator[Trace]:
    """The traces a client can check: every delivery-mode one, and the journal
    ones whose rule is not an `issuer.*` rule (which only a server can check)."""
    if not TRACES.is_dir():
        return
    for path in sorted(TRACES.glob("*.jsonl")):
        name = path.name.removesuffix(".jsonl")
        manifest = json.loads((TRACES / f"{name}.expect.json").read_text())
        if manifest["mode"] == "journal" and str(manifest.get("rule", "")).startswith("issuer."):
            continue
        lines = [
            (n, line) for n, line in enumerate(path.read_text().split("\n"), 1) if line.strip()
        ]
        yield Trace(name, lines, manifest)


def contains(actual: object, expected: object, at: str = "") -> None:
    """`actual` holds `expected` (conformance/README.md: a subset; null may be absent)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{at} is {actual!r}; expected an object"
        for k, v in expected.items():
            if k not in actual:
                assert v is None, f"{at}/{k} is missing; expected {v!r}"
                continue
            contains(actual[k], v, f"{at}/{k}")
        return
    if isinstance(expected, list) and isinstance(actual, list) and len(actual) == len(expected):
        for i, (a, v) in enumerate(zip(actual, expected, strict=True)):
            contains(a, v, f"{at}/{i}")
        return
    assert actual == expected, f"{at} is {actual!r}; expected {expected!r}"


def read_trace(trace: Trace, mode: str) -> tuple[SessionReducer, tuple[int, Violation] | None]:
    """Reads a trace into a new reducer: as a journal (`append`) or a delivery."""
    r = SessionReducer(profiles=trace.manifest["profiles"])
    for n, text in trace.lines:
        before = r.state()
        try:
            value = json.loads(text)
            if mode == "journal":
                r.append(value)
            else:
                r.deliver(value)
        except Violation as v:
            assert r.state() == before, f"line {n} was refused but changed the state"
            return r, (n, v)
    return r, None


TRACE_LIST = list(load_traces())


def test_the_traces_are_there() -> None:
    if not TRACE_LIST:
        pytest.skip(f"no traces at {TRACES} (set NARAD_TRACES)")
    assert sum(t.manifest["mode"] == "delivery" for t in TRACE_LIST) >= 19
    assert len(TRACE_LIST) > 100


@pytest.mark.parametrize("trace", TRACE_LIST, ids=[t.name for t in TRACE_LIST])
def test_golden_trace(trace: Trace) -> None:
    m = trace.manifest
    reducer, rejection = read_trace(trace, m["mode"])
    if m["outcome"] == "accept":
        assert rejection is None, f"line {rejection[0]} was refused: {rejection[1]!r}"
    else:
        assert rejection is not None, f"every line was accepted; line {m['rejectAt']} should not"
        line, v = rejection
        assert line == m["rejectAt"], f"line {line} was refused ({v!r}), not line {m['rejectAt']}"
        if "rule" in m:
            assert v.rule == m["rule"], f"line {line}: {v.message}"
    if "state" in m:
        contains(reducer.state(), m["state"])


def test_a_reducer_without_deduplication_would_fail_the_duplicate_trace() -> None:
    # Read as a journal (no deduplication), the duplicate trace must be
    # refused, or passing it would prove nothing.
    trace = next((t for t in TRACE_LIST if t.name == "delivery-duplicates-deduplicated"), None)
    if trace is None:
        pytest.skip(f"no traces at {TRACES} (set NARAD_TRACES)")
    _, rejection = read_trace(trace, "journal")
    assert rejection is not None
    assert rejection[1].rule == "event.id.unique"


# --- the package and the kit ----------------------------------------------------


def test_the_package_ships_the_repository_schemas() -> None:
    if not (REPO / "schema").is_dir():
        pytest.skip("not in narad's repository")
    script = PYTHON_SDK / "scripts" / "sync_schema.py"
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_the_conformance_kit_client_suite_passes_with_faults(narad_binary: Path) -> None:
    narad = str(narad_binary)
    adapter = PYTHON_SDK / "conformance" / "client.py"
    done = subprocess.run(
        [narad, "conformance", "client", "--faults", "--", sys.executable, str(adapter)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 failed" in done.stdout, done.stdout
