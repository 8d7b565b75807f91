"""``Client.search_sessions`` against a real ``narad serve``: words, a filter,
paging, words with nothing to find, and a refused state."""

from __future__ import annotations

import pytest
from conftest import NaradServer

from narad.client import Client
from narad.errors import NaradError


async def test_search_sessions_finds_words_filters_and_pages(
    narad_server: NaradServer, org: str
) -> None:
    token = narad_server.token("reader,writer", org=org, sub="ana")
    async with Client(narad_server.base, token) as client:
        for n, text in enumerate(["refund order 7", "where is my parcel", "refunding takes long"]):
            session = await client.create_session(title=f"ticket {n}")
            await client.command(
                "record-user-message",
                {"sessionId": session.session_id, "messageScope": "session", "content": text},
            )

        page = await client.search_sessions("refunds")
        assert [r.session.title for r in page.results] == ["ticket 2", "ticket 0"]
        first = page.results[1].matches[0]
        assert first.field.value == "message"
        assert [p.text for p in first.snippet if p.matched] == ["refund"]

        assert (await client.search_sessions("refund", actor="someone-else")).results == []
        mine = await client.search_sessions(actor="ana", limit=2)
        assert len(mine.results) == 2 and mine.next_after is not None
        rest = await client.search_sessions(actor="ana", limit=2, after=mine.next_after)
        assert [r.session.title for r in rest.results] == ["ticket 0"]

        nothing = await client.search_sessions("the")
        assert nothing.results == []
        assert nothing.notice is not None and "no searchable word" in nothing.notice

        with pytest.raises(NaradError) as refused:
            await client.search_sessions(state="sleeping")
        assert refused.value.code == "NRD-0008"
