"""Errors: every refused request raises :class:`NaradError` with the server's envelope.

A subclass says which class of answer it was, so that a program can catch
the cases it handles and let the rest through::

    try:
        await client.resolve_interrupt(session_id, interrupt_id=i, decision="approve")
    except ConflictError as e:
        print("decided before:", e.recorded_decision)

========================  ===========================================================
:class:`AuthError`        401, 403: the token is not valid, or may not do this
:class:`NotFoundError`    404: no such session, run, interrupt, blob, ...
:class:`ConflictError`    409: the request conflicts with what is recorded
                          (``details`` says with what)
:class:`GoneError`        410: the session or the organisation was erased
:class:`RateLimitedError` 429: over a limit of the organisation (``retry_after``)
:class:`UnavailableError` no server answered (``status`` 0), or 502, 503, 504
========================  ===========================================================

Anything else (400, 413, 422, 500, ...) is a plain :class:`NaradError`;
``except NaradError`` catches every one of them.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

__all__ = [
    "AuthError",
    "ConflictError",
    "GoneError",
    "NaradError",
    "NotFoundError",
    "RateLimitedError",
    "UnavailableError",
    "error_of",
]


class NaradError(Exception):
    """A request narad refused, or that no server answered.

    ``status`` is the HTTP status (0 when no server answered); ``code`` the
    catalogued ``NRD-xxxx`` code, ``rule`` the protocol rule a refused event
    broke, ``fields`` the problem found at each JSON pointer of the request
    (``{"/events/1": "..."}``) and ``details`` structured context (e.g. the
    ``activeExecution`` a start conflicts with), when the server sent its
    error envelope (``docs/errors.md``). ``retry_after`` is the server's
    ``Retry-After`` in seconds, ``request_id`` its ``x-request-id``.
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


class AuthError(NaradError):
    """401 or 403: the token is missing, invalid or expired, or lacks a role or a scope."""


class NotFoundError(NaradError):
    """404: the session, run, interrupt, blob, lease or route named does not exist
    (or is not this caller's to see)."""


class ConflictError(NaradError):
    """409: the request conflicts with what the journal holds; nothing was done.

    ``code`` says which conflict (``NRD-0201`` a protocol rule, ``NRD-0204``
    the session busy, ``NRD-0205`` the interrupt decided before, ...) and
    ``details`` what is recorded: ``activeExecution`` for a busy session,
    ``decision`` for an interrupt resolved before (see
    :attr:`recorded_decision`).
    """

    @property
    def recorded_decision(self) -> str | None:
        """The decision an interrupt was resolved with before (``NRD-0205``), if known."""
        decision = self.details.get("decision")
        if isinstance(decision, str):
            return decision
        if isinstance(decision, dict) and isinstance(decision.get("decision"), str):
            return str(decision["decision"])
        return None

    @property
    def active_execution(self) -> dict[str, Any] | None:
        """The execution holding the session's slot (``NRD-0204``), if known."""
        active = self.details.get("activeExecution")
        return active if isinstance(active, dict) else None


class GoneError(NaradError):
    """410: the session (``NRD-0208``) or the organisation (``NRD-0210``) was erased."""


class RateLimitedError(NaradError):
    """429: over a limit of the organisation, refused before any effect.

    :class:`~narad.client.Client` waits ``retry_after`` and sends it again
    within its ``max_rate_limit_wait``; this is raised beyond that.
    """


class UnavailableError(NaradError):
    """No server answered (``status`` 0: it could not be reached, or the connection
    broke before an answer), or one answered 502, 503 or 504.

    ``maybe_applied`` is true when the request reached a server and its
    answer was lost: the server may have acted on it. The client resends
    such a request only when it is idempotent (see
    :meth:`~narad.client.Client.send`), so a non-idempotent one that raises
    this with ``maybe_applied`` needs the caller to look (history, the
    session) before sending it again.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
        request_id: str | None = None,
        maybe_applied: bool = False,
    ) -> None:
        super().__init__(status, message, body=body, retry_after=retry_after, request_id=request_id)
        self.maybe_applied = maybe_applied


_BY_STATUS: dict[int, type[NaradError]] = {
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    429: RateLimitedError,
    502: UnavailableError,
    503: UnavailableError,
    504: UnavailableError,
}


def error_class(status: int) -> type[NaradError]:
    """The class of error an answer of ``status`` raises."""
    return _BY_STATUS.get(status, NaradError)


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
    cls = error_class(response.status_code)
    return cls(
        response.status_code,
        f"narad answered {response.status_code}: {text[:200]}",
        body=body,
        retry_after=retry_after,
        request_id=response.headers.get("x-request-id"),
    )
