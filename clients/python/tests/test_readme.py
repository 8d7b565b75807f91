"""The READMEs' Python blocks, run as written against a real server.

Every ``python`` block of the package README (clients/python/README.md) is
run, each as its own process: a test fails when one has no marker or no
test. ``<!-- quickstart-python -->`` runs to its end: it appends, sees its
retry recognised, reads history and prints a refusal's code and rule.
``<!-- retries-python -->`` sends a keyed command twice and prints that the
replay answered, then two refusals' classes. ``<!-- follow-python -->``
follows a session until its transcript holds the message it recorded.
``<!-- runs-python -->`` streams a run of the agent of ``<!-- agent-python
-->``, approving its question; the agent's client tool runs on the
executor of ``<!-- fs-executor-python -->``: the three run together.

In the repository README:

``<!-- runtime-python -->`` is an agent runtime serving queue ``agents``: a
run started for that queue must end ``run.finished`` with the block's tool
call and its answer. ``<!-- executor-python -->`` is a client executor
``desk-1`` with an ``echo`` tool: a client call of a run bound to it must
finish with the echoed arguments. Each block runs as its own process.

The framework agents of "Bring your agent", ``<!-- langgraph-python -->``,
``<!-- openai-agents-python -->`` and ``<!-- pydantic-ai-python -->``, each
at most 30 lines of code, serve the queue they name on the framework's
offline test model: a run started there with a prompt must end
``run.finished``, its ``weather`` tool call journaled, with an assistant
message in the reduced transcript whose text is the one the block's fake
model is scripted to say (read from the block). Each framework's doc
(docs/integrations/) shows its block under the same marker, the same text.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, NaradServer

from narad import Client, Event, SessionReducer

README = REPO / "README.md"
PACKAGE_README = REPO / "clients" / "python" / "README.md"
WAIT = 30.0
READER_APPROVER = "reader,writer,backend,approver"

#: The package README's blocks the tests below run.
PACKAGE_BLOCKS = {
    "quickstart-python",
    "retries-python",
    "follow-python",
    "runs-python",
    "agent-python",
    "fs-executor-python",
}


def block(marker: str, readme: Path = README) -> str:
    """The fenced code block right after ``<!-- marker -->`` in ``readme``."""
    text = readme.read_text()
    start = text.index(f"<!-- {marker} -->")
    opening = text.index("```python\n", start) + len("```python\n")
    return text[opening : text.index("```\n", opening)]


def markers(readme: Path) -> list[str | None]:
    """The marker of each ``python`` block of ``readme`` (``None``: it has none)."""
    lines = readme.read_text().splitlines()
    found: list[str | None] = []
    for n, line in enumerate(lines):
        if line.strip() == "```python":
            above = lines[n - 1].strip() if n else ""
            m = re.fullmatch(r"<!-- (\S+) -->", above)
            found.append(m.group(1) if m else None)
    return found


def run_block(
    marker: str, work: Path, server: NaradServer, env: dict[str, str], readme: Path = README
) -> subprocess.Popen[bytes]:
    """Starts a README block as a program in ``work``."""
    program = work / f"{marker}.py"
    program.write_text(block(marker, readme))
    with open(work / f"{marker}.out", "wb") as out:
        return subprocess.Popen(
            [sys.executable, str(program)],
            cwd=work,
            env={**os.environ, "NARAD": server.base, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def output(path: Path) -> str:
    """What a program printed so far."""
    return path.read_text(errors="replace")


@pytest.fixture
def program(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The README programs a test started; stopped at its end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def until_event(
    client: Client, session_id: str, kind: str, process: subprocess.Popen[bytes], out: Path
) -> list[Event]:
    """The session's history once it holds an event of type ``kind``."""
    deadline = time.monotonic() + WAIT
    while True:
        history = [e async for e in client.all_history(session_id)]
        if any(e["type"] == kind for e in history):
            return history
        assert process.poll() is None, f"the README block exited:\n{output(out)}"
        assert time.monotonic() < deadline, (
            f"no {kind} within {WAIT:.0f} s: {[e['type'] for e in history]}\n{output(out)}"
        )
        await asyncio.sleep(0.1)


def text_of(history: list[Event]) -> str:
    return "".join(e["delta"] for e in history if e["type"] == "message.text.delta")


async def test_the_readme_python_runtime_runs_as_written(
    narad_server: NaradServer, org: str, tmp_path: Path, program: list[subprocess.Popen[bytes]]
) -> None:
    token = narad_server.token(org=org, sub="readme-runtime")
    process = run_block("runtime-python", tmp_path, narad_server, {"NARAD_TOKEN": token})
    program.append(process)
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    async with Client(narad_server.base, token) as client:
        await client.create_session(session_id)
        await client.start_run(session_id, run_id="run-readme", queue="agents")
        history = await until_event(
            client, session_id, "run.finished", process, tmp_path / "runtime-python.out"
        )
    started = [e for e in history if e["type"] == "tool.call.started"]
    finished = [e for e in history if e["type"] == "tool.call.finished"]
    assert [(e["toolName"], e["args"]) for e in started] == [("weather.lookup", {"city": "Oslo"})]
    assert [(e["toolCallId"], e["outcome"], e["response"]) for e in finished] == [
        (started[0]["toolCallId"], "success", {"city": "Oslo", "sky": "clear"})
    ]
    assert text_of(history) == "Let me look that up. The sky over Oslo is clear."


async def test_the_readme_python_executor_runs_as_written(
    narad_server: NaradServer, org: str, tmp_path: Path, program: list[subprocess.Popen[bytes]]
) -> None:
    executor_token = narad_server.token("executor", org=org, sub="readme-desk")
    process = run_block(
        "executor-python", tmp_path, narad_server, {"NARAD_EXECUTOR_TOKEN": executor_token}
    )
    program.append(process)
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    args: dict[str, Any] = {"say": "hello", "n": 3}
    async with Client(narad_server.base, narad_server.token(org=org)) as client:
        await client.create_session(session_id)
        await client.start_run(session_id, run_id="r1", client_executor_id="desk-1")
        await client.append(
            session_id,
            [
                {
                    "protocolVersion": "narad/v1",
                    "type": "tool.call.started",
                    "eventId": f"{session_id}-call",
                    "runId": "r1",
                    "rootRunId": "r1",
                    "toolCallId": "call-1",
                    "toolName": "echo",
                    "executor": "client",
                    "args": args,
                }
            ],
        )
        history = await until_event(
            client, session_id, "tool.call.finished", process, tmp_path / "executor-python.out"
        )
    finished = next(e for e in history if e["type"] == "tool.call.finished")
    assert (finished["outcome"], finished["response"]) == ("success", args)
    # The token store the block names holds the call's token, in the cwd.
    assert (tmp_path / "desk-1.tokens").stat().st_size > 0


def test_the_package_readme_first_steps_run_as_written(
    narad_server: NaradServer, org: str, tmp_path: Path
) -> None:
    token = narad_server.token(org=org, sub="readme-quickstart")
    process = run_block(
        "quickstart-python", tmp_path, narad_server, {"NARAD_TOKEN": token}, PACKAGE_README
    )
    process.wait(timeout=WAIT)
    printed = output(tmp_path / "quickstart-python.out")
    assert process.returncode == 0, printed
    lines = printed.splitlines()
    assert lines[0] == "appended at [2, 3, 4]", printed
    assert lines[1] == (
        "['run.started', 'message.text.started', 'message.text.delta', 'message.text.completed']"
    ), printed
    status, code, rule, fields = lines[2].split(" ", 3)
    assert (status, code, rule) == ("409", "NRD-0201", "run.terminal.once"), printed
    assert fields.startswith("{'/events/1': "), printed


def test_every_python_block_of_the_package_readme_is_run() -> None:
    found = markers(PACKAGE_README)
    assert None not in found, "a python block of the package README has no <!-- marker -->"
    assert set(found) == PACKAGE_BLOCKS, set(found) ^ PACKAGE_BLOCKS
    assert len(found) == len(set(found)), found


def test_the_package_readme_agent_is_at_most_25_lines_of_code() -> None:
    """The agent the issue's first paragraph asks for (a streamed answer, a
    backend tool, an approval, a client tool, finish), whole, in 25 lines of
    code at most: blank lines and comments do not count."""
    code = [
        line
        for line in block("agent-python", PACKAGE_README).splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert len(code) <= 25, "\n".join(code)
    for step in ("ctx.say(", "ctx.approve(", "ctx.client_tool(", "ctx.finish("):
        assert any(step in line for line in code), step


def run_to_end(
    marker: str, work: Path, server: NaradServer, env: dict[str, str], wait: float = WAIT
) -> list[str]:
    """Runs a package README block to its end; the lines it printed."""
    process = run_block(marker, work, server, env, PACKAGE_README)
    try:
        process.wait(timeout=wait)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    printed = output(work / f"{marker}.out")
    assert process.returncode == 0, printed
    return printed.splitlines()


def test_the_package_readme_retries_block_runs_as_written(
    narad_server: NaradServer, org: str, tmp_path: Path
) -> None:
    token = narad_server.token(org=org, sub="readme-retries")
    lines = run_to_end("retries-python", tmp_path, narad_server, {"NARAD_TOKEN": token})
    assert lines[0] == "True", lines
    assert lines[1] == "NRD-0204 {'kind': 'run', 'runId': 'run-1'}", lines
    status, code = lines[2].split(" ")
    assert status == "404" and code.startswith("NRD-"), lines


def test_the_package_readme_follow_block_runs_as_written(
    narad_server: NaradServer, org: str, tmp_path: Path
) -> None:
    token = narad_server.token(org=org, sub="readme-follow")
    lines = run_to_end("follow-python", tmp_path, narad_server, {"NARAD_TOKEN": token})
    assert lines == ["['Hello, whoever reads this']"], lines


def test_the_package_readme_runs_agent_and_executor_run_together_as_written(
    narad_server: NaradServer, org: str, tmp_path: Path, program: list[subprocess.Popen[bytes]]
) -> None:
    agent_env = {"NARAD_TOKEN": narad_server.token(org=org, sub="readme-agent")}
    desk_env = {"NARAD_EXECUTOR_TOKEN": narad_server.token("executor", org=org, sub="desk")}
    program.append(run_block("agent-python", tmp_path, narad_server, agent_env, PACKAGE_README))
    program.append(
        run_block("fs-executor-python", tmp_path, narad_server, desk_env, PACKAGE_README)
    )
    person = {"NARAD_TOKEN": narad_server.token(READER_APPROVER, org=org, sub="readme-person")}
    lines = run_to_end("runs-python", tmp_path, narad_server, person, wait=60)
    for process in program:
        assert process.poll() is None, output(tmp_path / "agent-python.out")
    assert lines == [
        "Looking... Deleted /var/log/app.log.",
        "finished ['message', 'message', 'message']",
    ], lines
    assert "would delete /var/log/app.log" in output(tmp_path / "fs-executor-python.out")
    assert (tmp_path / "desk-1.tokens").stat().st_size > 0


#: The framework agents of "Bring your agent": marker → where the block's
#: fake model's last answer is written (its text is the first group).
FRAMEWORK_BLOCKS = {
    "langgraph-python": r'AIMessage\("([^"]+)"\)',
    "openai-agents-python": r'assistant_message\("([^"]+)"\)',
    "pydantic-ai-python": r'custom_output_text="([^"]+)"',
}
FRAMEWORK_MAX_LINES = 30
#: The framework docs that show the README's block, the same text.
FRAMEWORK_DOCS = {
    "langgraph-python": REPO / "docs" / "integrations" / "langgraph.md",
    "openai-agents-python": REPO / "docs" / "integrations" / "openai_agents.md",
    "pydantic-ai-python": REPO / "docs" / "integrations" / "pydantic_ai.md",
}


def code_lines(code: str) -> list[str]:
    """The lines of code of a block: neither blank nor only a comment."""
    return [line for line in code.splitlines() if line.strip() and not line.strip().startswith("#")]


@pytest.mark.parametrize("marker", sorted(FRAMEWORK_BLOCKS))
def test_each_framework_agent_is_at_most_30_lines_of_code(marker: str) -> None:
    code = code_lines(block(marker))
    assert len(code) <= FRAMEWORK_MAX_LINES, f"{len(code)} lines of code:\n" + "\n".join(code)


@pytest.mark.parametrize("marker", sorted(FRAMEWORK_BLOCKS))
def test_each_framework_doc_shows_the_readme_agent(marker: str) -> None:
    assert block(marker, FRAMEWORK_DOCS[marker]) == block(marker), FRAMEWORK_DOCS[marker]


@pytest.mark.parametrize("marker", sorted(FRAMEWORK_BLOCKS))
async def test_each_framework_agent_runs_as_written(
    marker: str,
    narad_server: NaradServer,
    org: str,
    tmp_path: Path,
    program: list[subprocess.Popen[bytes]],
) -> None:
    code = block(marker)
    said = re.findall(FRAMEWORK_BLOCKS[marker], code)
    assert said, f"{marker}: no scripted answer matching {FRAMEWORK_BLOCKS[marker]}"
    queue = re.findall(r'queue="([^"]+)"', code)
    assert len(queue) == 1, f"{marker} names no queue, or several: {queue}"
    token = narad_server.token(org=org, sub=f"readme-{marker}")
    env = {"NARAD_URL": narad_server.base, "NARAD_TOKEN": token}
    process = run_block(marker, tmp_path, narad_server, env)
    program.append(process)
    session_id = f"s-{uuid.uuid4().hex[:12]}"
    async with Client(narad_server.base, token) as client:
        await client.create_session(session_id)
        await client.start_run(
            session_id,
            run_id="run-readme",
            queue=queue[0],
            input={"prompt": "What is the weather in Paris?"},
        )
        history = await until_event(
            client, session_id, "run.finished", process, tmp_path / f"{marker}.out"
        )
    assert not [e for e in history if e["type"] in ("run.error", "run.cancelled")], history
    started = [e for e in history if e["type"] == "tool.call.started"]
    finished = [e for e in history if e["type"] == "tool.call.finished"]
    assert [e["toolName"] for e in started] == ["weather"], started
    assert [(e["toolCallId"], e["outcome"]) for e in finished] == [
        (started[0]["toolCallId"], "success")
    ], finished
    reducer = SessionReducer()
    for event in history:
        assert reducer.deliver(event) in ("applied", "recorded"), event
    answers = [
        item.get("content")
        for item in reducer.transcript()
        if item["item"] == "message" and item["role"] == "assistant" and item["completed"]
    ]
    assert answers == [said[-1]], (answers, output(tmp_path / f"{marker}.out"))
