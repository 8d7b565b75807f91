"""Pydantic AI agents journaled into narad.

``handler(agent)`` is a run handler for :class:`~narad.Runtime`: each claimed
run drives ``agent`` with :meth:`pydantic_ai.Agent.iter` and journals what it
does as the narad events that mean the same thing::

    runtime = Runtime(client, handler(agent, client_tools=["clock.now"]), queue="agents")

- The model's streamed response, part by part: a ``TextPart`` is a message
  (``message.text.started`` / ``.delta`` / ``.completed``), a
  ``ThinkingPart`` a reasoning block. Each is keyed by the response's place
  in the message history and the part's index (``r{n}.p{i}``), so a rerun
  from the same history finds it in the journal.
- Each call of a function tool goes through a capability of the run's own
  (``wrap_tool_execute``) as ``ctx.tool(key=tool_call_id)``: started,
  run, finished; on replay a finished call answers its recorded result and
  the tool does not run again. Tools named in ``client_tools`` never run
  here: the call goes to the run's client executor
  (``ctx.client_tool(key=tool_call_id)``) and its result goes back to the
  model. Tool calls run one at a time, in the model's order.
- A tool that needs approval ends Pydantic AI's run with
  ``DeferredToolRequests``; each call becomes ``ctx.approve(key=tool_call_id)``
  (an interrupt and a pause), and the agent runs again with
  ``DeferredToolResults`` (``ToolApproved`` / ``ToolDenied``). Calls of
  external tools (``CallDeferred``) become client tool calls the same way.
- The run's ``RunUsage`` is the terminal's ``usage``; a stop cancels the
  agent's task; an error ends the run ``run.error`` with a code made of the
  exception's class (``UsageLimitExceeded`` → ``usage_limit_exceeded``).
- Agent delegation (an agent called from a tool of another): inside a
  tool, ``await delegate(agent, prompt, usage=ctx.usage)`` runs ``agent`` in a
  nested run of the run (``run.started`` with ``parentRunId``, keyed by the
  tool call, ``input`` ``{"agent", "prompt"}``), journaled as the run is
  (its text, reasoning, tools and approvals in the nested run, which a
  default transcript shows only when opened, §9.2), and answers its output;
  the calling tool's result is what the tool makes of it.
- Takeover: the message history (``ModelMessagesTypeAdapter`` JSON) and the
  usage so far are the state document of scope ``pydantic_ai.{runId}``,
  written at every step boundary. A later holder resumes from it; the steps
  between the last boundary and the loss are found in the journal by their
  keys and not written again.
"""

from __future__ import annotations

import builtins
import contextvars
import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied
from pydantic_ai import exceptions as pai
from pydantic_ai.agent import AbstractAgent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.capabilities.abstract import ValidatedToolArgs, WrapToolExecuteHandler
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ThinkingPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.tools import RunContext as AgentContext
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.usage import RunUsage
from pydantic_core import to_jsonable_python

from ..runtime import (
    LeaseLost,
    Message,
    ReplayDiverged,
    RunContext,
    RunHandler,
    RunStopped,
    ToolError,
    _Waiting,
)
from ..runtime import ToolFailed as NaradToolFailed
from ._drive import Turn, Usage, conversation, drive

__all__ = [
    "NO_RESUMABLE_STATE",
    "RETRY",
    "TOOL_FAILED",
    "delegate",
    "error_code",
    "handler",
    "state_scope",
]

#: The code of a run taken over whose state document cannot be read back.
NO_RESUMABLE_STATE = "no_resumable_state"

#: The code of a tool call's journaled error, by what the tool raised: a
#: ``ModelRetry`` (the model is asked again) or a ``ToolFailed`` (the model is
#: told). Anything else a tool raises is ``tool_error`` and fails the run.
RETRY = "retry"
TOOL_FAILED = "tool_failed"

_CONTROL = (RunStopped, LeaseLost, ReplayDiverged, _Waiting)

#: ``BaseExceptionGroup`` (Python 3.11 and later).
_GROUP: type[BaseException] | None = getattr(builtins, "BaseExceptionGroup", None)


def state_scope(run_id: str) -> str:
    """The scope of the state document that keeps run ``run_id``'s message history."""
    return f"pydantic_ai.{run_id}"


def error_code(error: BaseException) -> str:
    """The ``run.error`` code of an exception: its (first public) class in snake
    case (``UsageLimitExceeded`` → ``usage_limit_exceeded``)."""
    if isinstance(error, _Unresumable):
        return NO_RESUMABLE_STATE
    for kind in type(error).__mro__:
        if not kind.__name__.startswith("_"):
            name = kind.__name__
            break
    else:  # pragma: no cover - object is public
        name = "Error"
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def handler(
    agent: AbstractAgent[Any, Any],
    *,
    client_tools: Collection[str] = (),
    deps: Any = None,
    model: Any = None,
    model_settings: Any = None,
    usage_limits: Any = None,
) -> RunHandler:
    """A run handler that drives ``agent`` on each claimed run.

    ``client_tools``: names of the agent's tools that the run's client
    executor runs instead of this process (their Python function never runs
    here; it declares the tool to the model). ``deps``, ``model``,
    ``model_settings`` and ``usage_limits`` go to every ``agent.iter``.
    The agent's ``output_type`` gets ``DeferredToolRequests`` added when it
    lacks it (an agent with output validators must list it itself).
    """
    names = frozenset(client_tools)
    options: dict[str, Any] = {"deps": deps}
    if model is not None:
        options["model"] = model
    if model_settings is not None:
        options["model_settings"] = model_settings
    if usage_limits is not None:
        options["usage_limits"] = usage_limits

    async def run(ctx: RunContext) -> None:
        driver = _Run(ctx, agent, names, options)
        await drive(ctx, driver.work, usage=driver.usage, error_code=error_code)

    return run


async def delegate(
    agent: AbstractAgent[Any, Any], prompt: str, *, usage: RunUsage | None = None, **options: Any
) -> Any:
    """Runs ``agent`` on ``prompt`` and answers its output; called from a tool
    of an agent that :func:`handler` drives, in a nested run of the narad run.

    The nested run is keyed by the calling tool call (a replay enters it
    again and finds its steps in the journal) and journaled as the run is;
    it ends ``run.finished`` when the agent is done, ``run.error`` when it
    raises (the exception goes on to the tool). ``usage``: the calling
    agent's ``ctx.usage``, so that the run's terminal counts the delegate's
    tokens, as Pydantic AI's agent delegation does. ``options`` (``deps``,
    ``model``, ``usage_limits``...) go to the agent's ``iter``. Outside a
    narad-driven tool it is ``(await agent.run(prompt, usage=usage, **options)).output``.
    """
    calling = _CALLING.get()
    if calling is None:
        return (await agent.run(prompt, usage=usage, **options)).output
    parent, call_id = calling
    entered = {"agent": agent.name or "agent", "prompt": prompt}
    async with parent.ctx.nested(f"delegate.{call_id}", input=entered) as child:
        run = _Run(child, agent, frozenset(), options)
        return await run.work(prompt=prompt, usage=usage)


#: The driven run and the model's id of the tool call running now (for :func:`delegate`).
_CALLING: contextvars.ContextVar[tuple[_Run, str] | None] = contextvars.ContextVar(
    "narad_pydantic_ai_calling", default=None
)


# ------------------------------------------------------------------ the run


class _LiveUsage(Usage):
    """The run's counters, read from Pydantic AI's ``RunUsage`` when the terminal is written."""

    def __init__(self) -> None:
        super().__init__()
        self.read: Callable[[], RunUsage] = RunUsage

    def as_dict(self) -> dict[str, float] | None:
        u = self.read()
        counts = {
            "inputTokens": u.input_tokens,
            "outputTokens": u.output_tokens,
            "totalTokens": u.input_tokens + u.output_tokens,
            "requests": u.requests,
            "toolCalls": u.tool_calls,
            "cacheReadTokens": u.cache_read_tokens,
            "cacheWriteTokens": u.cache_write_tokens,
        }
        shown = {k: float(v) for k, v in counts.items() if v}
        return shown or None


@dataclass
class _Saved:
    """What the state document holds: the message history and the usage so far."""

    messages: list[ModelMessage]
    usage: RunUsage = field(default_factory=RunUsage)


class _Run:
    """One claimed run of the agent."""

    def __init__(
        self,
        ctx: RunContext,
        agent: AbstractAgent[Any, Any],
        client_tools: frozenset[str],
        options: dict[str, Any],
    ) -> None:
        self.ctx = ctx
        self.agent = agent
        self.client_tools = client_tools
        self.options = options
        self.usage = _LiveUsage()
        self.scope = state_scope(ctx.run_id)
        self.saved_through = -1

    # --- the work --------------------------------------------------------

    async def work(self, *, prompt: str | None = None, usage: RunUsage | None = None) -> Any:
        """Drives the agent to its output (answered): from the state document
        an earlier holder wrote, else from ``prompt`` (a delegate's) or the
        session's conversation. ``usage``: counters to add to (a delegate's caller's)."""
        saved = await self._load()
        if saved is None and prompt is not None:
            saved = _Saved([], usage or RunUsage())
        elif saved is None:
            turns = await conversation(self.ctx)
            history, prompt = _history_of(turns)
            saved = _Saved(history)
        else:
            prompt = None
        # The history given is written again only once it grew: the
        # session's conversation (and the prompt) can be read again.
        self.saved_through = len(saved.messages)
        history, usage = saved.messages, saved.usage
        results: DeferredToolResults | None = None
        journaling = _Journaling(self)
        while True:
            output, history, usage = await self._agent_run(
                prompt, history, results, usage, journaling
            )
            prompt = None
            if not isinstance(output, DeferredToolRequests):
                if not isinstance(output, str):
                    await self._say_output(output, history)
                return output
            results = await self._resolve(output)

    async def _agent_run(
        self,
        prompt: str | None,
        history: list[ModelMessage],
        results: DeferredToolResults | None,
        usage: RunUsage,
        journaling: _Journaling,
    ) -> tuple[Any, list[ModelMessage], RunUsage]:
        """One run of the agent (to its output, or to the calls it defers)."""
        options = dict(self.options)
        output_type = _with_deferred(self.agent.output_type)
        if output_type is not None:
            options["output_type"] = output_type
        with Agent.parallel_tool_call_execution_mode("sequential"):
            try:
                async with self.agent.iter(
                    prompt,
                    message_history=history,
                    deferred_tool_results=results,
                    usage=usage,
                    capabilities=[journaling],
                    **options,
                ) as agent_run:
                    self.usage.read = lambda: agent_run.usage
                    async for node in agent_run:
                        if Agent.is_end_node(node):
                            continue
                        messages = agent_run.all_messages()
                        await self._save(messages, agent_run.usage)
                        if Agent.is_model_request_node(node):
                            step = sum(isinstance(m, ModelResponse) for m in messages)
                            async with node.stream(agent_run.ctx) as stream:
                                await self._stream(step, stream)
                        elif Agent.is_call_tools_node(node):
                            async with node.stream(agent_run.ctx) as stream:
                                async for _ in stream:
                                    pass
                    result = agent_run.result
                    assert result is not None
                    return result.output, agent_run.all_messages(), agent_run.usage
            except BaseException as error:
                unwrapped = _unwrap(error)
                if unwrapped is error:
                    raise
                raise unwrapped from None

    async def _stream(self, step: int, stream: Any) -> None:
        """Journals one model response as it streams."""
        messages: dict[int, Message] = {}
        thoughts: dict[int, str] = {}
        async for event in stream:
            if isinstance(event, PartStartEvent):
                if isinstance(event.part, TextPart):
                    # A part started again at the same index replaces what
                    # was streamed; what was said stays said.
                    if event.index not in messages:
                        opened = self.ctx.message(key=f"r{step}.p{event.index}")
                        messages[event.index] = opened
                        if event.part.content:
                            await opened.say(event.part.content)
                elif isinstance(event.part, ThinkingPart):
                    thoughts[event.index] = event.part.content
            elif isinstance(event, PartDeltaEvent):
                delta = event.delta
                if isinstance(delta, TextPartDelta) and delta.content_delta:
                    streaming = messages.get(event.index)
                    if streaming is not None:
                        await streaming.say(delta.content_delta)
            elif isinstance(event, PartEndEvent):
                await self._part_done(step, event.index, event.part, messages)
                thoughts.pop(event.index, None)
        for message in messages.values():
            await message.complete()

    async def _part_done(
        self, step: int, index: int, part: Any, messages: Mapping[int, Message]
    ) -> None:
        if isinstance(part, TextPart) and index in messages:
            await messages[index].complete()
        elif isinstance(part, ThinkingPart) and part.content:
            await self.ctx.think(part.content, key=f"r{step}.p{index}")

    async def _say_output(self, output: Any, history: list[ModelMessage]) -> None:
        """A structured output (no text of its own) said as the run's last message."""
        step = sum(isinstance(m, ModelResponse) for m in history)
        message = self.ctx.message(key=f"r{step}.output")
        await message.say(json.dumps(to_jsonable_python(output, fallback=str)))
        await message.complete()

    # --- deferred calls ----------------------------------------------------

    async def _resolve(self, requests: DeferredToolRequests) -> DeferredToolResults:
        """Asks for each approval and runs each external call on the client executor."""
        results = DeferredToolResults()
        for call in requests.approvals:
            decision = await self.ctx.approve(
                f"The agent wants to call {call.tool_name}",
                title=f"Approve {call.tool_name}",
                input={"toolName": call.tool_name, "args": _args_of(call)},
                key=call.tool_call_id,
            )
            if decision == "approve":
                results.approvals[call.tool_call_id] = ToolApproved()
            else:
                results.approvals[call.tool_call_id] = ToolDenied(
                    f"The tool call was denied ({decision})."
                )
        for call in requests.calls:
            try:
                results.calls[call.tool_call_id] = await self._client_call(
                    call.tool_name, _args_of(call), call.tool_call_id
                )
            except pai.ToolFailed as failed:
                results.calls[call.tool_call_id] = failed
        return results

    async def _client_call(self, name: str, args: dict[str, Any], key: str) -> Any:
        try:
            return await self.ctx.client_tool(name, args, key=key)
        except NaradToolFailed as e:
            raise pai.ToolFailed(e.message or str(e)) from None

    # --- tools -------------------------------------------------------------

    async def tool(
        self, call: ToolCallPart, tool_def: ToolDefinition, args: dict[str, Any], run: Any
    ) -> Any:
        """Runs one tool call through the journal (see the module documentation)."""
        if tool_def.kind not in ("function", "unapproved"):
            return await run(args)
        key = call.tool_call_id
        if call.tool_name in self.client_tools:
            return await self._client_call(call.tool_name, args, key)
        live: list[Any] = []

        async def execute(arguments: dict[str, Any]) -> Any:
            calling = _CALLING.set((self, key))
            try:
                result = await run(args)
            except (pai.ModelRetry, pai.ToolRetryError) as e:
                raise ToolError(RETRY, str(e)) from e
            except (pai.ToolFailed, pai.ToolFailedError) as e:
                raise ToolError(TOOL_FAILED, str(e)) from e
            finally:
                _CALLING.reset(calling)
            live.append(result)
            return to_jsonable_python(result, fallback=str)

        try:
            recorded = await self.ctx.tool(call.tool_name, args, execute, key=key)
        except NaradToolFailed as e:
            cause = e.__cause__
            if isinstance(cause, ToolError):
                cause = cause.__cause__
            if cause is not None:
                raise cause from None
            # Replayed: what the tool raised then, from its journaled code.
            text = e.message or ""
            if e.code == RETRY:
                raise pai.ModelRetry(text) from None
            if e.code == TOOL_FAILED:
                raise pai.ToolFailed(text) from None
            raise _ToolError(text) from None
        return live[0] if live else recorded

    # --- the state document --------------------------------------------------

    async def _load(self) -> _Saved | None:
        """The state document of an earlier holder of the run, if it wrote one."""
        _, state = await self.ctx.read_state(self.scope)
        if state is None:
            return None
        try:
            messages = ModelMessagesTypeAdapter.validate_python(state["messages"])
            usage = RunUsage(**state.get("usage", {}))
        except Exception as e:
            raise _Unresumable(
                f"the state document {self.scope} cannot be read back: {e}"
            ) from None
        return _Saved(list(messages), usage)

    async def _save(self, messages: list[ModelMessage], usage: RunUsage) -> None:
        """Writes the history when it grew since the last write (a step boundary)."""
        if len(messages) <= self.saved_through:
            return
        state = {
            "messages": ModelMessagesTypeAdapter.dump_python(messages, mode="json"),
            "usage": {
                "requests": usage.requests,
                "tool_calls": usage.tool_calls,
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "cache_read_tokens": usage.cache_read_tokens,
                "cache_write_tokens": usage.cache_write_tokens,
            },
        }
        await self.ctx.put_state(state, scope=self.scope, key=f"history.{len(messages)}")
        self.saved_through = len(messages)


class _Journaling(AbstractCapability[Any]):
    """The run's capability: every tool call goes through the narad journal."""

    def __init__(self, run: _Run) -> None:
        self._run = run

    async def wrap_tool_execute(
        self,
        ctx: AgentContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: ValidatedToolArgs,
        handler: WrapToolExecuteHandler,
    ) -> Any:
        return await self._run.tool(call, tool_def, args, handler)


class _ToolError(Exception):
    """A tool's error, as a replay finds it in the journal."""


class _Unresumable(Exception):
    """The run cannot be taken over (code ``no_resumable_state``)."""


def _unwrap(error: BaseException) -> BaseException:
    """The exception that matters in an exception group (a narad control
    exception first); any other exception as it is."""
    if _GROUP is None or not isinstance(error, _GROUP):
        return error
    flat: list[BaseException] = []
    groups: list[BaseException] = [error]
    while groups:
        e = groups.pop(0)
        if isinstance(e, _GROUP):
            groups.extend(getattr(e, "exceptions", ()))
        else:
            flat.append(e)
    for e in flat:
        if isinstance(e, _CONTROL):
            return e
    return flat[0] if flat else error


def _history_of(turns: Sequence[Turn]) -> tuple[list[ModelMessage], str | None]:
    """The session's conversation as a message history, and the prompt (its last user turn)."""
    prompt: str | None = None
    if turns and turns[-1].role == "user":
        prompt = turns[-1].text
        turns = turns[:-1]
    history: list[ModelMessage] = []
    for turn in turns:
        if turn.role == "user":
            history.append(ModelRequest(parts=[UserPromptPart(turn.text)]))
        else:
            history.append(ModelResponse(parts=[TextPart(turn.text)]))
    return history, prompt


def _with_deferred(spec: Any) -> Any:
    """The output type with ``DeferredToolRequests`` among its choices (``None``: already)."""
    if spec is DeferredToolRequests:
        return None
    if isinstance(spec, (list, tuple)):
        if DeferredToolRequests in spec:
            return None
        return [*spec, DeferredToolRequests]
    return [spec, DeferredToolRequests]


def _args_of(call: ToolCallPart) -> dict[str, Any]:
    args = call.args_as_dict()
    return dict(args) if isinstance(args, Mapping) else {"args": args}
