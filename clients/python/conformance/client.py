"""The Python SDK under `narad conformance client`.

For every trace the kit serves, read its stream with the SDK's SSE parser
(resuming with `Last-Event-ID` when a connection breaks), deliver each
object to the SDK's `SessionReducer` negotiated for the trace's profiles,
and report the reduced state, or the object refused and why
(`conformance/README.md`)::

    narad conformance client --faults -- python clients/python/conformance/client.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import TypedDict, cast

import httpx

from narad.reducer import ReducedState, SessionReducer
from narad.sse import SseParser
from narad.wire import Violation

#: How many connections one stream may take before the client gives up.
ATTEMPTS = 50


class TraceEntry(TypedDict):
    """One trace of `GET /traces`."""

    name: str
    profiles: list[str]
    stream: str
    report: str


class Rejected(TypedDict):
    """The object the reducer refused, and why."""

    object: object
    rule: str
    message: str


class _Report(TypedDict, total=False):
    rejected: Rejected
    state: ReducedState


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def decode(data: str) -> object:
    """A frame's data as JSON, or the text itself when it is none (the reducer refuses it)."""
    try:
        return cast(object, json.loads(data, parse_constant=_reject_constant))
    except ValueError:
        return data


async def follow(http: httpx.AsyncClient, url: str, reducer: SessionReducer) -> Rejected | None:
    """Reads a trace's stream to its end into `reducer`, resuming after a broken
    connection with `Last-Event-ID`: the refusal, if one."""
    last_id = ""
    for _ in range(ATTEMPTS):
        headers = {"Last-Event-ID": last_id} if last_id else {}
        parser = SseParser(last_id)
        try:
            async with http.stream("GET", url, headers=headers) as response:
                response.raise_for_status()
                async for chunk in response.aiter_bytes():
                    for frame in parser.feed(chunk):
                        value = decode(frame.data)
                        try:
                            reducer.deliver(value)
                        except Violation as v:
                            return {"object": value, "rule": v.rule, "message": v.message}
                        if frame.own_id:
                            last_id = frame.id
            return None
        except httpx.TransportError:
            continue  # the connection broke: resume after the last id held
    raise RuntimeError(f"{url}: the stream broke {ATTEMPTS} times")


async def main() -> int:
    """Reads, reduces and reports every trace; 0 when all were reported."""
    base = os.environ.get("NARAD_CONFORMANCE_URL")
    if not base:
        print("run me under narad conformance client (NARAD_CONFORMANCE_URL)", file=sys.stderr)
        return 2
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
        listed = await http.get(f"{base}/traces")
        listed.raise_for_status()
        traces = cast("list[TraceEntry]", listed.json()["traces"])
        for trace in traces:
            reducer = SessionReducer(profiles=trace["profiles"])
            rejected = await follow(http, trace["stream"], reducer)
            report: _Report = {"state": reducer.state()}
            if rejected is not None:
                report["rejected"] = rejected
            answer = await http.post(base + trace["report"], json=report)
            if not answer.is_success:
                print(f"reporting {trace['name']}: {answer.status_code}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
