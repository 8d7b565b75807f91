"""The OpenAI Agents SDK in narad: a run handler that drives an ``Agent`` with
``Runner.run_streamed`` and journals what it does as narad events.

Use it as ``Runtime(client, handler(agent), queue="agents")``
(``pip install "narad[openai-agents]"``). What maps to what:

- text: the model's ``response.output_text.delta`` (and refusal) events →
  ``message.text.started/delta/completed``, one message per output item,
  completed at its ``response.output_item.done``;
- reasoning: a reasoning output item's summary and text → ``reasoning.*``;
- function tools run by the SDK → ``tool.call.started/finished`` keyed by the
  model's ``call_id``: each :class:`~agents.FunctionTool` of the agent (and of
  the agents it hands off to) is wrapped so that its invocation goes through
  :meth:`RunContext.tool`. A tool that raises finishes ``error``
  (``tool_error``) and the model gets what the tool's
  ``failure_error_function`` makes of it, as without narad;
- tools named in ``client_tools`` → client tool calls on the run's executor,
  their result handed back to the model;
- tools with ``needs_approval`` pause the run (the SDK's interruptions) →
  ``interrupt.requested`` + ``run.paused``; ``approve`` → ``RunState.approve``,
  anything else (``deny``, ``expired``) → ``RunState.reject``; the run goes on
  with ``Runner.run_streamed(agent, state)``;
- handoffs → nested runs: the agent handed off to works in a nested run of
  the run (``run.started`` with ``parentRunId``, keyed by the handoff's call
  id, ``input`` ``{"agent", "from"}``), which ends ``run.finished`` at the next
  handoff or at the end of the run; its tool calls, client tool calls and
  approvals are journaled in it. Its text and reasoning are journaled in the
  run itself: a handoff hands the conversation over, and a default
  transcript shows a nested run's messages only when a person opens it (§9.2);
- usage: the run's ``context_wrapper.usage`` → the terminal's ``usage``
  (partial on error and cancellation);
- a stop cancels the streamed run (``result.cancel()`` and its task) →
  ``run.cancelled``; an exception of the SDK or the model → ``run.error`` with
  a code made of its class (``MaxTurnsExceeded`` → ``max_turns_exceeded``).

**Waits and takeover.** The SDK never waits on narad inside a tool: a client
tool is run as a tool that needs approval, so the SDK pauses there as it does
for an approval. At every pause the serialised ``RunState`` is put in the
run's state document (scope ``openai-agents/{runId}``) before anything is
waited for. A later holder of the run (after a lost runtime, or a runtime
with ``release_when_waiting=True``) resumes from it: approvals and client
calls already in the journal answer at once, and tool calls already finished
answer their recorded result without running again. A holder that finds no
state although the journal holds earlier work (the runtime was lost
mid-answer), or finds that the model answered past the state it keeps, ends
the run ``run.error`` with code ``no_resumable_state``: nothing is written
twice and the run does not hang. A run lost before it wrote anything starts
over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from agents import Agent, FunctionTool, Runner, RunResultStreaming, RunState
from agents.items import ToolApprovalItem, TResponseInputItem
from agents.run_config import DEFAULT_MAX_TURNS, RunConfig
from agents.run_context import RunContextWrapper
from agents.stream_events import RawResponsesStreamEvent, RunItemStreamEvent
from agents.tool import (
    maybe_invoke_function_tool_failure_error_function,
    set_function_tool_failure_error_function,
)
from agents.tool_context import ToolContext
from pydantic import BaseModel

from ..runtime import (
    LeaseLost,
    Message,
    ReplayDiverged,
    RunContext,
    RunHandler,
    RunStopped,
    ToolFailed,
    _Waiting,
)
from ._drive import Usage, conversation, drive

__all__ = ["NoResumableState", "error_code", "handler", "state_scope"]

log = logging.getLogger("narad.integrations.openai_agents")

#: What the state document holds: the SDK's serialised ``RunState``.
STATE_FORMAT = "openai-agents.run-state"

_CONTROL = (RunStopped, LeaseLost, ReplayDiverged, _Waiting)

#: Events a holder writes for the work it does (what a takeover must not repeat).
_WORK = ("message.", "reasoning.", "tool.call.", "interrupt.", "progress.", "state.")

#: Events that are the model's output (what a resumed state cannot replay).
_MODEL_OUTPUT = ("message.text.", "reasoning.")


class NoResumableState(Exception):
    """A later holder finds earlier work in the run's journal and no ``RunState``
    to resume from (or one the run went past): the run ends ``no_resumable_state``."""


def state_scope(run_id: str) -> str:
    """The scope of the state document that keeps run ``run_id``'s ``RunState``."""
    return f"openai-agents/{run_id}"


def handler(
    agent: Agent[Any],
    *,
    client_tools: Collection[str] = (),
    run_config: RunConfig | None = None,
    max_turns: int | None = DEFAULT_MAX_TURNS,
    context: Any = None,
) -> RunHandler:
    """A run handler that runs ``agent`` on each claimed run.

    The input is the session's conversation before the run and the run's
    ``input`` prompt (:func:`~narad.integrations.conversation`).
    ``client_tools`` names function tools of the agent that the run's client
    executor runs (their Python body never runs here; the agent's tool gives
    the model its name and schema). ``run_config``, ``max_turns`` and
    ``context`` go to ``Runner.run_streamed``.
    """
    names = frozenset(client_tools)
    known = {t.name for t in _function_tools(agent)}
    missing = sorted(names - known)
    if missing:
        raise ValueError(f"client_tools names no function tool of the agent: {missing}")

    async def handle(ctx: RunContext) -> None:
        usage = _Counters()
        run = _Run(ctx, agent, names, run_config, max_turns, context, usage)
        await drive(ctx, run.work, usage=usage, error_code=error_code)

    return handle


def error_code(error: BaseException) -> str:
    """The ``run.error`` code of an exception: its class name in snake case."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", type(error).__name__)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower() or "framework_error"


# ------------------------------------------------------------------ usage


class _Counters(Usage):
    """The terminal's usage: the SDK's own counters of the run (cumulative
    across pauses, as the ``RunState`` carries them)."""

    def __init__(self) -> None:
        super().__init__()
        self.wrapper: RunContextWrapper[Any] | None = None

    def as_dict(self) -> dict[str, float] | None:
        if self.wrapper is None:
            return None
        u = self.wrapper.usage
        counts: dict[str, float] = {
            "inputTokens": u.input_tokens,
            "outputTokens": u.output_tokens,
            "totalTokens": u.total_tokens,
            "requests": u.requests,
        }
        cached = getattr(u.input_tokens_details, "cached_tokens", 0) or 0
        reasoning = getattr(u.output_tokens_details, "reasoning_tokens", 0) or 0
        if cached:
            counts["cachedInputTokens"] = cached
        if reasoning:
            counts["reasoningTokens"] = reasoning
        return counts if any(counts.values()) else None


# ------------------------------------------------------------------ tools


def _function_tools(agent: Agent[Any]) -> list[FunctionTool]:
    """The function tools of ``agent`` and of the agents it hands off to."""
    found: list[FunctionTool] = []
    for each in _agents(agent):
        found.extend(t for t in each.tools if isinstance(t, FunctionTool))
    return found


def _agents(agent: Agent[Any]) -> list[Agent[Any]]:
    seen: dict[int, Agent[Any]] = {}
    todo = [agent]
    while todo:
        at = todo.pop()
        if id(at) in seen:
            continue
        seen[id(at)] = at
        todo.extend(h for h in at.handoffs if isinstance(h, Agent))
    return list(seen.values())


def _arguments(text: str | None) -> dict[str, Any]:
    """A tool call's arguments as an object (``{"input": text}`` when they are not one)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"input": text}
    return value if isinstance(value, dict) else {"input": value}


def _jsonable(value: Any) -> Any:
    """A tool's output as JSON for the journal (pydantic models dumped, others as text)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list) and any(isinstance(v, BaseModel) for v in value):
        return [_jsonable(v) for v in value]
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def _for_model(value: Any) -> Any:
    """A client tool's JSON result as the SDK hands it to the model."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


async def _failure_text(tool: FunctionTool, tool_ctx: ToolContext[Any], failed: ToolFailed) -> Any:
    """What the model is told of a failed call: the tool's ``failure_error_function``'s
    text (raises the failure when the tool has none, as the SDK does)."""
    cause = failed.__cause__
    error = cause if isinstance(cause, Exception) else failed
    text = await maybe_invoke_function_tool_failure_error_function(
        function_tool=tool, context=tool_ctx, error=error
    )
    if text is None:
        raise error
    return text


def _backend(tool: FunctionTool, at: Callable[[], RunContext]) -> FunctionTool:
    """``tool`` invoked through :meth:`RunContext.tool` of the run the current
    agent writes (``at()``), keyed by the model's call id."""
    inner = dataclasses.replace(tool)  # its own invoker, failures raised
    set_function_tool_failure_error_function(inner, None)

    async def invoke(tool_ctx: ToolContext[Any], input_json: str) -> Any:
        async def run(_: dict[str, Any]) -> Any:
            return _jsonable(await inner.on_invoke_tool(tool_ctx, input_json))

        try:
            return await at().tool(
                tool.name, _arguments(input_json), run, key=str(tool_ctx.tool_call_id)
            )
        except ToolFailed as failed:
            return await _failure_text(tool, tool_ctx, failed)

    return dataclasses.replace(tool, on_invoke_tool=invoke)


def _client(tool: FunctionTool, at: Callable[[], RunContext]) -> FunctionTool:
    """``tool`` run by the run's client executor: it needs approval, so that the
    SDK pauses at it; the pause runs the call (:meth:`_Run.settle`) and the
    resumed SDK reads its result from the journal here."""

    async def invoke(tool_ctx: ToolContext[Any], input_json: str) -> Any:
        try:
            result = await at().client_tool(
                tool.name, _arguments(input_json), key=str(tool_ctx.tool_call_id)
            )
        except ToolFailed as failed:
            return await _failure_text(tool, tool_ctx, failed)
        return _for_model(result)

    return dataclasses.replace(tool, on_invoke_tool=invoke, needs_approval=True)


def _bind(
    agent: Agent[Any], at: Callable[[], RunContext], client_tools: frozenset[str]
) -> tuple[Agent[Any], dict[str, FunctionTool]]:
    """A copy of ``agent`` (and of the agents it hands off to) whose function
    tools journal into the run the current agent writes (``at()``); and the
    client tools by name, as the agent had them."""
    copies: dict[int, Agent[Any]] = {}
    clients: dict[str, FunctionTool] = {}
    for original in _agents(agent):
        tools: list[Any] = []
        for tool in original.tools:
            if isinstance(tool, FunctionTool) and tool.name in client_tools:
                clients[tool.name] = tool
                tools.append(_client(tool, at))
            elif isinstance(tool, FunctionTool):
                tools.append(_backend(tool, at))
            else:
                tools.append(tool)
        copies[id(original)] = original.clone(tools=tools)
    for original in _agents(agent):
        copy = copies[id(original)]
        copy.handoffs = [
            copies[id(h)] if isinstance(h, Agent) and id(h) in copies else h
            for h in original.handoffs
        ]
    return copies[id(agent)], clients


async def _needs_approval(
    tool: FunctionTool, wrapper: RunContextWrapper[Any], args: dict[str, Any], call_id: str
) -> bool:
    """Whether the developer's own ``needs_approval`` of ``tool`` asks a person for this call."""
    setting = tool.needs_approval
    if isinstance(setting, bool):
        return setting
    return bool(await setting(wrapper, args, call_id))


def _control(error: BaseException) -> BaseException | None:
    """The runtime's control exception (a stop, a lost lease, a wait...) that
    ``error`` carries; the SDK wraps what a tool raises (``UserError``)."""
    seen: set[int] = set()
    at: BaseException | None = error
    while at is not None and id(at) not in seen:
        if isinstance(at, _CONTROL):
            return at
        seen.add(id(at))
        at = at.__cause__ or at.__context__
    return None


# ------------------------------------------------------------------ the run


class _Run:
    """One claimed run: the agent bound to it, the SDK driven segment by segment
    (a segment ends at the SDK's interruptions), their events journaled."""

    def __init__(
        self,
        ctx: RunContext,
        agent: Agent[Any],
        client_tools: frozenset[str],
        run_config: RunConfig | None,
        max_turns: int | None,
        context: Any,
        usage: _Counters,
    ) -> None:
        self.ctx = ctx
        #: The run the current agent writes: the run, or the nested run of
        #: the agent last handed off to.
        self.at = ctx
        #: Leaves that nested run (ends it as the exception passed says).
        self.leave: contextlib.AsyncExitStack | None = None
        #: The key and input of that nested run (kept with the RunState).
        self.handed: tuple[str, dict[str, Any]] | None = None
        self.agent, self.clients = _bind(agent, lambda: self.at, client_tools)
        self.run_config = run_config
        self.max_turns = max_turns
        self.context = context
        self.usage = usage
        self.scope = state_scope(ctx.run_id)

    async def work(self) -> None:
        """Drives the agent until its final output (``drive`` ends the run),
        the nested run of the agent last handed off to ended before."""
        try:
            await self.segments()
        except BaseException as error:
            if self.leave is not None:
                await self.leave.__aexit__(type(error), error, error.__traceback__)
            raise
        if self.leave is not None:
            await self.leave.aclose()

    async def enter(self, key: str, agent: dict[str, Any]) -> None:
        """Ends the nested run of the agent handed off to before (if any) and
        enters the nested run ``key`` of the agent handed off to now."""
        leave = self.leave
        if leave is not None:
            self.leave, self.at = None, self.ctx
            await leave.aclose()
        stack = contextlib.AsyncExitStack()
        self.at = await stack.enter_async_context(self.ctx.nested(key, input=agent))
        self.leave, self.handed = stack, (key, agent)

    async def segments(self) -> None:
        state = await self.stored_state()
        run_input: str | list[TResponseInputItem] | RunState[Any]
        if state is not None:
            self.usage.wrapper = state._context
            await self.settle(state)
            run_input = state
        else:
            self.check_fresh()
            run_input = await self.input()
        while True:
            result = Runner.run_streamed(
                self.agent,
                run_input,
                context=self.context,
                max_turns=self.max_turns,
                run_config=self.run_config,
            )
            self.usage.wrapper = result.context_wrapper
            await self.stream(result)
            if not result.interruptions:
                return
            state = result.to_state()
            await self.keep(state, result.interruptions)
            await self.settle(state)
            run_input = state

    # --- the input and the state document -----------------------------------

    async def input(self) -> list[TResponseInputItem]:
        """The session's conversation before the run, with the run's prompt."""
        items: list[TResponseInputItem] = []
        for turn in await conversation(self.ctx):
            items.append({"role": turn.role, "content": turn.text})
        return items

    def check_fresh(self) -> None:
        """Raises :class:`NoResumableState` when an earlier holder journaled work."""
        earlier = [
            e
            for e in self.ctx.journal
            if str(e.get("type")).startswith(_WORK) or e.get("parentRunId") is not None
        ]
        if earlier:
            raise NoResumableState(
                f"run {self.ctx.run_id} was taken over after an earlier holder journaled "
                f"{len(earlier)} events, and no RunState was kept to resume from"
            )

    async def stored_state(self) -> RunState[Any] | None:
        """The ``RunState`` the run's journal keeps in its state document, if any.

        Read from the run's own journal (written under its lease), never from a
        document a client could have written. Raises :class:`NoResumableState`
        when the model answered after it was kept: the state is behind the journal.
        """
        kept: Mapping[str, Any] | None = None
        after: list[Mapping[str, Any]] = []
        for event in self.ctx.journal:
            if event.get("type") == "state.snapshot" and event.get("scope") == self.scope:
                kept, after = event, []
            elif kept is not None:
                after.append(event)
        if kept is None:
            return None
        document = kept.get("state")
        if not isinstance(document, Mapping) or document.get("format") != STATE_FORMAT:
            return None
        if any(str(e.get("type")).startswith(_MODEL_OUTPUT) for e in after):
            raise NoResumableState(
                f"run {self.ctx.run_id}: the model answered after the RunState kept in "
                f"{self.scope}; it cannot be resumed without writing that answer again"
            )
        log.info("run %s resumes from the RunState in %s", self.ctx.run_id, self.scope)
        handed = document.get("handedOff")
        if isinstance(handed, Mapping):
            await self.enter(str(handed["key"]), dict(handed["input"]))
        return await RunState.from_json(self.agent, dict(document["runState"]))

    async def keep(self, state: RunState[Any], items: Sequence[ToolApprovalItem]) -> None:
        """Puts ``state`` in the run's state document, before anything waits on it."""
        key = "state." + "+".join(str(i.call_id) for i in items)
        document: dict[str, Any] = {"format": STATE_FORMAT, "runState": state.to_json()}
        if self.handed is not None:
            document["handedOff"] = {"key": self.handed[0], "input": self.handed[1]}
        await self.ctx.put_state(document, scope=self.scope, key=key)

    # --- interruptions --------------------------------------------------------

    async def settle(self, state: RunState[Any]) -> None:
        """Decides each interruption of ``state``: a person's approval for a tool
        that needs one, the executor's call for a client tool."""
        wrapper = state._context
        for item in state.get_interruptions():
            call_id = str(item.call_id)
            name = str(item.name)
            args = _arguments(item.arguments)
            client = self.clients.get(name)
            if client is None or (
                wrapper is not None and await _needs_approval(client, wrapper, args, call_id)
            ):
                decision = await self.at.approve(
                    f"{item.agent.name} wants to call {name}",
                    title=name,
                    input={"tool": name, "args": args},
                    key=call_id,
                )
                if decision != "approve":
                    state.reject(item)
                    continue
            if client is not None:
                try:
                    await self.at.client_tool(name, args, key=call_id)
                except ToolFailed:
                    pass  # the resumed SDK reads the failure again and tells the model
            state.approve(item)

    # --- the stream -----------------------------------------------------------

    async def stream(self, result: RunResultStreaming) -> None:
        """Journals the events of one streamed segment."""
        messages: dict[str, Message] = {}
        thoughts: dict[str, list[str]] = {}
        try:
            async for event in result.stream_events():
                if isinstance(event, RawResponsesStreamEvent):
                    await self.raw(result, event.data, messages, thoughts)
                elif isinstance(event, RunItemStreamEvent) and event.name == "handoff_occured":
                    await self.handoff(event, result.current_turn)
        except Exception as error:
            control = _control(error)
            if control is not None:
                raise control from None
            raise
        finally:
            if not result.is_complete:
                result.cancel()
        for message in messages.values():
            await message.complete()

    def key(self, result: RunResultStreaming, data: Any) -> str:
        """A step key of an output item: the turn, its index and the model's id
        (chat-completions models give every item the same placeholder id)."""
        return f"{result.current_turn}.{getattr(data, 'output_index', 0)}.{data.item_id}"

    async def raw(
        self,
        result: RunResultStreaming,
        data: Any,
        messages: dict[str, Message],
        thoughts: dict[str, list[str]],
    ) -> None:
        kind = getattr(data, "type", None)
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            if not data.delta:
                return
            key = self.key(result, data)
            message = messages.get(key)
            if message is None:
                message = messages[key] = self.ctx.message(key=key)
            await message.say(data.delta)
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            thoughts.setdefault(self.key(result, data), []).append(data.delta)
        elif kind == "response.output_item.done":
            item = data.item
            key = f"{result.current_turn}.{data.output_index}.{getattr(item, 'id', None)}"
            if item.type == "message" and key in messages:
                await messages[key].complete()
            elif item.type == "reasoning":
                text = "".join(thoughts.pop(key, [])) or _reasoning_text(item)
                if text:
                    await self.ctx.think(text, key=key)

    async def handoff(self, event: RunItemStreamEvent, turn: int) -> None:
        """The agent handed off to works in a nested run of its own from now on."""
        item = event.item
        source = getattr(getattr(item, "source_agent", None), "name", "?")
        target = getattr(getattr(item, "target_agent", None), "name", "?")
        call_id = getattr(item.raw_item, "call_id", None)
        if call_id is None and isinstance(item.raw_item, Mapping):
            call_id = item.raw_item.get("call_id")
        # Chat-completions models may give every call the same placeholder
        # id: the turn keeps the key of each handoff its own.
        await self.enter(f"handoff.{turn}.{call_id or target}", {"agent": target, "from": source})


def _reasoning_text(item: Any) -> str:
    """The text of a reasoning output item: its summary, else its content."""
    parts = [getattr(s, "text", "") for s in (getattr(item, "summary", None) or [])]
    if not any(parts):
        parts = [getattr(c, "text", "") for c in (getattr(item, "content", None) or [])]
    return "\n".join(p for p in parts if p)
