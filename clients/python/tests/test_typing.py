"""The public API is typed: ``mypy --strict`` accepts a program that uses it as
documented and refuses, each with its own error, a program that misspells an
argument or a field, passes a wrong type, or swaps ids.

Each program is a file of its own, checked in one mypy run against the
installed package (its ``py.typed``), outside this package's configuration.
"""

from __future__ import annotations

import re
import subprocess
import sys
from types import UnionType
from typing import Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from narad import models, typed

PRELUDE = """\
from __future__ import annotations

from typing import Literal

from narad import Client, ConflictError, RunResult, RuntimeOptions
from narad.typed import RunTerminal


async def program(client: Client) -> None:
"""

GOOD = """\
    await client.create_session("s1", title="A title", metadata={"team": "a", "n": [1, 2]})
    started = await client.start_run(
        "s1", run_id="r1", input={"prompt": "hi"}, queue="agents", on_conflict="enqueue"
    )
    print(started.run_id, started.queue_id)
    said = await client.record_user_message("s1", "hello", message_scope="session")
    duplicate: bool = said.appended.duplicate
    print(duplicate, said.message_id)
    await client.stop_run("s1", run_id="r1", reason="enough")
    try:
        await client.resolve_interrupt("s1", interrupt_id="i1", decision="approve")
    except ConflictError as e:
        decided: str | None = e.recorded_decision
        print(decided, e.code, e.details)
    async for frame in client.runs.stream("s1", message="hi", queue="agents"):
        event = frame.event
        if event is not None and event.type == "message.text.delta":
            print(event.delta, event.message_id, event.session_sequence)
        elif event is not None and event.type == "run.error":
            print(event.code, event.message, event.timestamp.isoformat())
    result: RunResult = await client.runs.wait(
        "s1",
        input={"n": 1},
        runtime=RuntimeOptions(queue="q", on_lost="fail", max_attempts=2),
        idempotency_key="7c1f9f1e-3f0e-4a47-9d1b-1f5e2f0c9a11",
    )
    status: Literal["finished", "error", "cancelled"] = result.status
    terminal: RunTerminal = result.terminal
    print(status, terminal.type, result.text, result.state["sessionSequence"])
    page = await client.history("s1", after_session_sequence=0)
    for typed in page.typed_events():
        if typed.type == "run.started":
            print(typed.run_id, typed.input)
"""

#: Each wrong program: one line in place of the good body, and the error mypy must give.
WRONG: dict[str, tuple[str, str]] = {
    "misspelt_argument": (
        'await client.start_run("s1", runid="r1")',
        r'Unexpected keyword argument "runid".*\[call-arg\]',
    ),
    "camel_case_argument": (
        'await client.start_run("s1", runId="r1")',
        r'Unexpected keyword argument "runId".*\[call-arg\]',
    ),
    "wrong_argument_type": (
        'await client.start_run("s1", run_id=5)',
        r'Argument "run_id" .* has incompatible type "int"; expected "str \| None"\s+\[arg-type\]',
    ),
    "wrong_literal": (
        'await client.start_run("s1", on_conflict="queue")',
        r'Argument "on_conflict" .* incompatible type.*\[arg-type\]',
    ),
    "wrong_json": (
        'await client.start_run("s1", input=object())',
        r'Argument "input" .* incompatible type "object".*\[arg-type\]',
    ),
    "swapped_ids": (
        'await client.resolve_interrupt("i1", "s1", "approve")',
        r"Too many positional arguments.*\[call-arg\]",
    ),
    "misspelt_option": (
        'RuntimeOptions(queue="q", onLost="fail")',
        r'Unexpected keyword argument "onLost".*\[call-arg\]',
    ),
    "misspelt_answer_field": (
        'print((await client.record_user_message("s1", "hi")).appended.duplicat)',
        r'"Appended" has no attribute "duplicat".*\[attr-defined\]',
    ),
    "wrong_answer_field_type": (
        'flag: str = (await client.record_user_message("s1", "hi")).appended.duplicate',
        r'Incompatible types in assignment \(expression has type "bool", variable has type'
        r' "str"\)\s+\[assignment\]',
    ),
    "misspelt_event_field": (
        "async for frame in client.runs.stream('s1', message='hi'):\n"
        "        event = frame.event\n"
        "        if event is not None and event.type == 'message.text.delta':\n"
        "            print(event.dleta)",
        r'"Delta" has no attribute "dleta".*\[attr-defined\]',
    ),
    "wrong_event_field_type": (
        "async for frame in client.runs.stream('s1', message='hi'):\n"
        "        event = frame.event\n"
        "        if event is not None and event.type == 'run.error':\n"
        "            n: int = event.timestamp",
        r'Incompatible types in assignment \(expression has type "datetime", variable has type'
        r' "int"\)\s+\[assignment\]',
    ),
    "wrong_event_text_type": (
        "async for frame in client.runs.stream('s1', message='hi'):\n"
        "        event = frame.event\n"
        "        if event is not None and event.type == 'message.text.delta':\n"
        "            n: int = event.delta",
        r'Incompatible types in assignment \(expression has type "str", variable has type'
        r' "int"\)\s+\[assignment\]',
    ),
    "field_of_another_event": (
        "async for frame in client.runs.stream('s1', message='hi'):\n"
        "        event = frame.event\n"
        "        if event is not None and event.type == 'run.finished':\n"
        "            print(event.delta)",
        r'"Finished" has no attribute "delta".*\[attr-defined\]',
    ),
    "wrong_status": (
        'status: Literal["done"] = (await client.runs.wait("s1")).status',
        r"Incompatible types in assignment.*\[assignment\]",
    ),
}


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """mypy --strict's output for each program (by name), from one run."""
    work = tmp_path_factory.mktemp("typing")
    programs = {"good": GOOD}
    for name, (line, _) in WRONG.items():
        programs[name] = f"    {line}\n"
    for name, body in programs.items():
        (work / f"{name}.py").write_text(PRELUDE + body)
    # Outside the package's directory: its mypy settings must not apply.
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--show-error-codes",
            "--python-version",
            "3.10",
            *sorted(f"{name}.py" for name in programs),
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "error: Cannot find implementation or library stub" not in run.stdout, run.stdout
    out: dict[str, str] = {name: "" for name in programs}
    for line in run.stdout.splitlines():
        m = re.match(r"^(\w+)\.py:\d+: (error|note): ", line)
        if m:
            out[m.group(1)] += line + "\n"
    return out


def test_mypy_strict_accepts_the_documented_use(checked: dict[str, str]) -> None:
    assert checked["good"] == "", checked["good"]


@pytest.mark.parametrize("name", sorted(WRONG))
def test_mypy_strict_refuses(checked: dict[str, str], name: str) -> None:
    _, expected = WRONG[name]
    errors = [line for line in checked[name].splitlines() if ": error: " in line]
    assert errors, f"mypy --strict accepted {name}:\n{PRELUDE}    {WRONG[name][0]}"
    assert any(re.search(expected, line) for line in errors), "\n".join(errors)


def members(annotation: object) -> set[type[BaseModel]]:
    """The model classes of a (possibly annotated, listed) union."""
    found: set[type[BaseModel]] = set()
    for arg in get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            found.add(arg)
        elif get_origin(arg) is not None or get_args(arg):
            found |= members(arg)
    return found


def test_the_typed_unions_are_the_generated_models_unions() -> None:
    """typed.AnyEvent and its siblings name every generated type: a type the
    OpenAPI document gains fails here until it is added."""
    history = models.HistoryPage.model_fields["events"].annotation
    assert members(typed.AnyEvent) == members(history)
    assert len(members(typed.AnyEvent)) == len(get_args(typed.AnyEvent))
    assert members(typed.AnyWatchEvent) == members(
        models.WatchEvent.model_fields["root"].annotation
    )
    assert members(typed.AnyHydrateRecord) == members(
        models.HydrateRecord.model_fields["root"].annotation
    )
    assert get_origin(typed.RunTerminal) in (Union, UnionType)
