"""Fixtures of the framework adapters' tests: those of ``tests/test_runtime.py``."""

from __future__ import annotations

from test_runtime import client, short_client, short_server

__all__ = ["client", "short_client", "short_server"]
