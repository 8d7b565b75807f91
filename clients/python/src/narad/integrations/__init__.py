"""Agent frameworks journaled into narad: each module runs a framework's
agent inside the SDK's :class:`~narad.Runtime` and records what it does as
the narad events that mean the same thing, so every narad client shows it
without knowing the framework.

- :mod:`narad.integrations.langgraph`: LangGraph graphs (``pip install "narad[langgraph]"``);
- :mod:`narad.integrations.openai_agents`: the OpenAI Agents SDK (``narad[openai-agents]``);
- :mod:`narad.integrations.pydantic_ai`: Pydantic AI agents (``narad[pydantic-ai]``).

Each module imports its framework; importing ``narad`` or this package
imports none. What they share — driving the framework's work under a stop,
usage counters, the session's conversation — is :mod:`narad.integrations._drive`,
re-exported here.
"""

from __future__ import annotations

from ._drive import Turn, Usage, conversation, drive, text_of

__all__ = ["Turn", "Usage", "conversation", "drive", "text_of"]
