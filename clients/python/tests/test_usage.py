"""``Client.usage`` against a real ``narad serve``: usage per session and per
day, split by the model each run named, another organisation's left out, and
an unknown time zone refused."""

from __future__ import annotations

import pytest
from conftest import NaradServer

from narad.client import Client
from narad.errors import NaradError


async def test_usage_sums_run_terminals_per_session_and_day_by_model(
    narad_server: NaradServer, org: str
) -> None:
    token = narad_server.token("reader,writer,backend", org=org, sub="ana")
    async with Client(narad_server.base, token) as client:
        session = await client.create_session(title="priced")
        sid = session.session_id

        def event(kind: str, run: str, **extra: object) -> dict[str, object]:
            return {
                "protocolVersion": "narad/v1",
                "type": kind,
                "eventId": f"{sid}-{run}-{kind}",
                "rootRunId": run,
                "runId": run,
                **extra,
            }

        await client.append(sid, [event("run.started", "a", input={"model": "small"})])
        await client.append(
            sid, [event("run.finished", "a", usage={"inputTokens": 10, "outputTokens": 2})]
        )
        await client.append(sid, [event("run.started", "b", input={"model": "small"})])
        await client.append(
            sid,
            [event("run.error", "b", code="failed", message="it failed", usage={"inputTokens": 5})],
        )

        page = await client.usage(by="session", sessions=[sid])
        assert [(b.key, b.model, b.runs, b.usage) for b in page.buckets] == [
            (sid, "small", 2, {"inputTokens": 15.0, "outputTokens": 2.0})
        ]
        days = await client.usage(zone="Asia/Tokyo")
        assert days.zone == "Asia/Tokyo"
        assert [(b.model, b.runs) for b in days.buckets] == [("small", 2)]

        other = narad_server.token("reader", org=f"{org}-other", sub="bo")
        async with Client(narad_server.base, other) as stranger:
            assert (await stranger.usage()).buckets == []

        with pytest.raises(NaradError) as refused:
            await client.usage(zone="Nowhere/Atlantis")
        assert refused.value.code == "NRD-0008"
