"""Errors: every refused request raises :class:`NaradError` with the server's envelope."""

from __future__ import annotations

import json
from typing import Any

import httpx


class NaradError(Exception):
    """A request narad refused, or that no server answered.

    ``status`` is the HTTP status (0 when no server answered); ``code`` the
    catalogued ``NRD-xxxx`` code, ``rule`` the protocol rule a refused event
    broke, ``fields`` the problem found at each JSON pointer of the request
    (``{"/events/1": "..."}``) and ``details`` structured context (e.g. the
    ``activeExecution`` a start conflicts with), when the server sent its
    error envelope (``docs/errors.md``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
        request_id: str | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.code: str | None = body.get("code") if body else None
        self.title: str | None = body.get("title") if body else None
        self.rule: str | None = body.get("rule") if body else None
        fields = body.get("fields") if body else None
        self.fields: dict[str, str] = (
            {str(k): str(v) for k, v in fields.items()} if isinstance(fields, dict) else {}
        )
        details = body.get("details") if body else None
        self.details: dict[str, Any] = details if isinstance(details, dict) else {}
        self.retry_after = retry_after
        self.request_id = request_id
        self.message = f"{self.code}: {body.get('message', '')}" if body and self.code else message
        super().__init__(self.message)

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later (no server, 429, 5xx)."""
        return self.status == 0 or self.status == 429 or self.status >= 500


def error_of(response: httpx.Response) -> NaradError:
    """The error of an answer that is not a success (its body already read)."""
    text = response.text
    body: dict[str, Any] | None = None
    try:
        parsed = json.loads(text)
        if isinstance(parsed, dict) and "code" in parsed:
            body = parsed
    except ValueError:
        body = None
    retry_after: float | None = None
    header = response.headers.get("retry-after")
    if header is not None:
        try:
            seconds = float(header)
            retry_after = seconds if seconds > 0 else None
        except ValueError:
            retry_after = None
    return NaradError(
        response.status_code,
        f"narad answered {response.status_code}: {text[:200]}",
        body=body,
        retry_after=retry_after,
        request_id=response.headers.get("x-request-id"),
    )
