"""LangGraph graphs journaled into narad.

``handler(graph)`` turns a compiled LangGraph graph into a run handler for
:class:`~narad.Runtime`: a claimed run streams the graph (thread id = the run
id) and journals what it does as the narad events that mean the same thing::

    from narad.integrations.langgraph import handler

    runtime = Runtime(client, handler(graph, client_tools=("fs.delete",)), queue="agents")

The graph runs under ``graph.astream(..., stream_mode=["messages", "updates",
"tasks", "values"], subgraphs=True)``:

- ``messages``: the model's ``AIMessageChunk`` s become ``message.text.*``
  (one message per model message, keyed by its node task and order), its
  reasoning blocks ``reasoning.*``, and its ``usage_metadata`` the run's usage;
- ``tasks``: each node task becomes ``progress.recorded`` (``active``, then
  ``completed`` or ``failed``, keyed by LangGraph's task id);
- ``values``: the graph state, less ``messages`` and what is not JSON, becomes
  the state document (``state.snapshot``, then RFC 6902 ``state.delta``);
- ``updates``: an ``interrupt()`` becomes ``interrupt.requested`` +
  ``run.paused`` (keyed by LangGraph's interrupt id); its decision goes back
  as ``Command(resume=...)``;
- subgraphs: a node that runs a subgraph runs it in a nested run
  (``run.started`` with ``parentRunId``, ``input`` ``{"subgraph": node}``,
  keyed by the node's task id), started when the subgraph first journals
  something and ended when the node's task ends; the subgraph's tool calls,
  node steps and interrupts are journaled in it (a subgraph's subgraph in a
  run nested in that one). Its model's text and reasoning are journaled in
  the top run by default, as the conversation the user reads (a default
  transcript shows a nested run's messages only when a person opens it,
  §9.2); ``subgraph_messages="nested"`` keeps them in the nested run. The
  state document is the top graph's.

Tool calls are not observed but run through narad: every ``ToolNode`` of the
graph (``langgraph.prebuilt.ToolNode``, as ``create_react_agent`` builds) gets
an interceptor (its ``awrap_tool_call``, around the one it had) that, inside a
narad run, runs each call as :meth:`~narad.RunContext.tool` keyed by the
model's tool-call id — ``tool.call.started`` / ``finished`` with its
arguments and result, or outcome ``error`` — and each call of a tool named in
``client_tools`` as :meth:`~narad.RunContext.client_tool` on the run's client
executor, its result handed back to the graph as the ``ToolMessage``. A
replayed call (a takeover) answers its journaled result without running the
tool again. Outside a narad run the interceptor does what the node did before.

Takeover: with a checkpointer the graph resumes from its last checkpoint of
the run's thread (input ``None``), and the keyed steps it takes again find
themselves in the journal: nothing journaled is written twice.
:class:`NaradSaver` (``builder.compile(checkpointer=NaradSaver())``) keeps the
checkpoints in the run's own journal, so a run survives a takeover with no
other store (see :mod:`narad.integrations.langgraph_checkpoint`). Without a
checkpoint to resume from, a run that an earlier holder had started writing
ends ``run.error`` with code ``no_checkpoint``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import jsonpatch
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import GraphBubbleUp, GraphRecursionError
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.pregel import Pregel
from langgraph.types import Command, Interrupt, StateSnapshot, StreamMode
from pydantic import BaseModel

from ..runtime import (
    LeaseLost,
    ReplayDiverged,
    RunContext,
    RunHandler,
    RunStopped,
    ToolFailed,
    _Waiting,
)
from ._drive import Turn, Usage, conversation, drive, text_of
from .langgraph_checkpoint import NaradSaver, NotInARun, checkpoints_in

__all__ = ["NO_CHECKPOINT", "NaradSaver", "NotInARun", "checkpoints_in", "client_tool", "handler"]

log = logging.getLogger("narad.integrations.langgraph")

#: The code of a taken-over run that has no checkpoint to resume from.
NO_CHECKPOINT = "no_checkpoint"
#: The code of a run whose graph raised.
GRAPH_ERROR = "graph_error"
#: The code of a run whose graph hit its recursion limit.
RECURSION_LIMIT = "recursion_limit"
#: The code of a run a backend tool's exception ended (``handle_tool_errors`` off).
TOOL_ERROR = "tool_error"

#: The code of a tool call an ``interrupt()`` in its tool ended (it runs again on resume).
INTERRUPTED = "interrupted"

#: The stream modes the adapter reads.
STREAM_MODES: list[StreamMode] = ["messages", "updates", "tasks", "values"]

#: Events that say an earlier holder of the run did work.
_WORK = frozenset(
    {
        "message.text.started",
        "reasoning.started",
        "tool.call.started",
        "interrupt.requested",
        "progress.recorded",
        "state.snapshot",
        "state.delta",
    }
)

_CONTROL = (RunStopped, LeaseLost, ReplayDiverged, _Waiting)

#: A graph's place in the run: ``()`` for the top graph, then one
#: ``"node:taskId"`` per subgraph level (LangGraph's checkpoint namespace).
Namespace = tuple[str, ...]

Graph = Pregel[Any, Any, Any, Any]
InputFactory = Callable[[RunContext, list[Turn]], Any]
ResumeFactory = Callable[[str, Interrupt], Any]
StateView = Callable[[Any], Any]


# ------------------------------------------------------------------ tools


class _Escape(GraphBubbleUp):
    """Carries a narad control exception out of the graph untouched:
    ``ToolNode`` and Pregel let a ``GraphBubbleUp`` through whatever their
    error handling says."""

    def __init__(self, inner: BaseException) -> None:
        super().__init__(str(inner))
        self.inner = inner


class _Bubbling(BaseException):
    """A ``GraphBubbleUp`` (an ``interrupt()`` in the tool) carried past the
    step's error handling: the call stays open and runs again on resume."""

    def __init__(self, inner: GraphBubbleUp) -> None:
        super().__init__(str(inner))
        self.inner = inner


class _HandledToolError(Exception):
    """A tool call the ``ToolNode`` answered with an error ``ToolMessage``."""

    def __init__(self, message: ToolMessage) -> None:
        super().__init__(_content_text(message.content) or "tool error")
        self.message = message


#: The narad run the current graph task belongs to (none outside narad).
_ACTIVE: contextvars.ContextVar[_Run | None] = contextvars.ContextVar(
    "narad_langgraph_run", default=None
)


def client_tool(
    name: str,
    description: str,
    args_schema: type[BaseModel] | dict[str, Any],
) -> BaseTool:
    """A tool the run's client executor runs: put it in the graph's ``ToolNode``
    (and bind it to the model) and list ``name`` in ``handler(client_tools=...)``.

    Inside a narad run the adapter routes its calls to the executor; its own
    body only runs outside narad, where it raises.
    """

    def unavailable(**_: Any) -> Any:
        raise RuntimeError(f"{name} runs on a narad client executor, inside a narad run")

    return StructuredTool.from_function(
        func=unavailable, name=name, description=description, args_schema=args_schema
    )


def _intercept(node: ToolNode) -> None:
    """Puts the narad interceptor around ``node``'s tool calls (once)."""
    if getattr(node, "_narad_intercepted", False):
        return
    original_async = node._awrap_tool_call
    original_sync = node._wrap_tool_call

    async def plain(request: ToolCallRequest, execute: Callable[..., Any]) -> Any:
        """What the node did before: its own wrapper, or the call."""
        if original_async is not None:
            return await original_async(request, execute)
        if original_sync is not None:
            config = request.runtime.config

            def run_sync(req: ToolCallRequest) -> Any:
                if isinstance(req.state, list):
                    return node._execute_tool_sync(req, "list", config)
                return node._execute_tool_sync(req, "dict", config)

            return original_sync(request, run_sync)
        return await execute(request)

    async def intercepted(request: ToolCallRequest, execute: Callable[..., Any]) -> Any:
        run = _ACTIVE.get()
        if run is None:
            return await plain(request, execute)
        return await run.tool_call(request, execute, plain)

    node._awrap_tool_call = intercepted
    node._narad_intercepted = True  # type: ignore[attr-defined]


def _tool_nodes(graph: Any, seen: set[int] | None = None) -> list[ToolNode]:
    """The ``ToolNode`` s of a compiled graph and of its compiled subgraphs."""
    seen = set() if seen is None else seen
    if id(graph) in seen:
        return []
    seen.add(id(graph))
    found: list[ToolNode] = []
    for node in getattr(graph, "nodes", {}).values():
        for runnable in (getattr(node, "bound", None), getattr(node, "node", None)):
            if isinstance(runnable, ToolNode) and runnable not in found:
                found.append(runnable)
            elif isinstance(runnable, Pregel):
                found.extend(n for n in _tool_nodes(runnable, seen) if n not in found)
    return found


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return text_of(content) or json.dumps(content, default=str)


def _jsonable(value: Any) -> Any:
    """``value`` when it is JSON, else its text."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def _tool_message(call: Mapping[str, Any], response: Any, *, error: bool = False) -> ToolMessage:
    """The ``ToolMessage`` of a journaled result."""
    if isinstance(response, str) or (
        isinstance(response, list) and all(isinstance(p, (str, dict)) for p in response)
    ):
        content: Any = response
    else:
        content = json.dumps(response)
    return ToolMessage(
        content=content,
        name=call.get("name"),
        tool_call_id=str(call.get("id")),
        status="error" if error else "success",
    )


# ------------------------------------------------------------------ the run


@dataclass
class _Said:
    """A model message being journaled: its narad message and reasoning so far."""

    key: str
    #: The run the message is journaled in (the top run, or a subgraph's).
    ctx: RunContext
    message: Any = None
    serial: int = 1
    reasoning: str = ""
    thoughts: int = 0


@dataclass
class _Counts:
    """Token usage per LangGraph message id (chunks added up; a whole message wins)."""

    streamed: dict[str, dict[str, int]] = field(default_factory=dict)
    whole: dict[str, dict[str, int]] = field(default_factory=dict)

    def chunk(self, message_id: str, usage: Mapping[str, Any] | None) -> None:
        if not usage:
            return
        counts = self.streamed.setdefault(message_id, {})
        for name in ("input_tokens", "output_tokens", "total_tokens"):
            value = usage.get(name)
            if isinstance(value, int):
                counts[name] = counts.get(name, 0) + value

    def message(self, message: BaseMessage) -> None:
        usage = getattr(message, "usage_metadata", None)
        if isinstance(message, AIMessage) and usage and message.id:
            self.whole[message.id] = {
                k: int(v)
                for k, v in usage.items()
                if k in ("input_tokens", "output_tokens", "total_tokens") and isinstance(v, int)
            }

    def usage(self) -> Usage:
        total = Usage()
        for message_id, counts in {**self.streamed, **self.whole}.items():
            del message_id
            total.add(
                inputTokens=counts.get("input_tokens"),
                outputTokens=counts.get("output_tokens"),
                totalTokens=counts.get("total_tokens"),
            )
        return total


class _LiveUsage(Usage):
    """The run's usage as :func:`drive` reads it: the counts at that moment."""

    def __init__(self, counts: _Counts) -> None:
        super().__init__()
        self._source = counts

    def as_dict(self) -> dict[str, float] | None:
        return self._source.usage().as_dict()


class _Run:
    """One claimed run of the graph."""

    def __init__(self, adapter: _Adapter, ctx: RunContext) -> None:
        self.adapter = adapter
        self.ctx = ctx
        self.counts = _Counts()
        self.said: dict[tuple[str, str], _Said] = {}
        self.per_task: dict[str, int] = {}
        self.state_base: Any = None
        self.state_revision = 0
        self.tool_exceptions: set[int] = set()
        self.input_ids: set[str] = set()
        #: The subgraphs' nested runs: their contexts and what leaves them.
        self.nested: dict[Namespace, tuple[RunContext, contextlib.AsyncExitStack]] = {}
        #: Where each interrupt was raised (the deepest graph that reported it).
        self.raised_in: dict[str, Namespace] = {}
        #: Held while nested runs are entered or left: the graph runs ahead of
        #: its stream, so a tool call may need a subgraph's run while the
        #: stream's reader is entering it.
        self.entering = asyncio.Lock()

    # --- subgraphs -----------------------------------------------------------

    async def at(self, ns: Namespace) -> RunContext:
        """The run graph ``ns`` journals in: the top run, or its subgraph's
        nested run (entered when first needed: again, on replay, without a
        second ``run.started``)."""
        if not ns:
            return self.ctx
        known = self.nested.get(ns)
        if known is not None:
            return known[0]
        async with self.entering:
            return await self._enter(ns)

    async def _enter(self, ns: Namespace) -> RunContext:
        if not ns:
            return self.ctx
        known = self.nested.get(ns)
        if known is not None:
            return known[0]
        parent = await self._enter(ns[:-1])
        node, _, task = ns[-1].partition(":")
        stack = contextlib.AsyncExitStack()
        child = await stack.enter_async_context(
            parent.nested(f"subgraph.{task or node}", input={"subgraph": node})
        )
        self.nested[ns] = (child, stack)
        return child

    async def leave(self, ns: Namespace, error: BaseException | None = None) -> None:
        """Ends the nested runs of graph ``ns`` and of what is nested in it,
        deepest first: ``run.finished``, or as ``error`` says (see :meth:`RunContext.nested`)."""
        async with self.entering:
            await self._leave(ns, error)

    async def _leave(self, ns: Namespace, error: BaseException | None) -> None:
        inside = sorted((k for k in self.nested if k[: len(ns)] == ns), key=len, reverse=True)
        for key in inside:
            child, stack = self.nested.pop(key)
            for said in [s for s in self.said.values() if s.ctx is child]:
                await self._complete(said)
            if error is None:
                await stack.aclose()
            else:
                await stack.__aexit__(type(error), error, error.__traceback__)

    # --- tools ---------------------------------------------------------------

    async def tool_call(
        self,
        request: ToolCallRequest,
        execute: Callable[..., Any],
        plain: Callable[..., Any],
    ) -> Any:
        call = request.tool_call
        name, call_id = str(call["name"]), str(call.get("id") or "")
        args = dict(call.get("args") or {})
        if not call_id:
            return await plain(request, execute)
        runtime = getattr(request, "runtime", None)
        config = getattr(runtime, "config", None)
        metadata = config.get("metadata") if isinstance(config, Mapping) else None
        try:
            ctx = await self.at(_graph_of(metadata))
            if name in self.adapter.client_tools:
                return await self._client_call(ctx, call, name, args, call_id)
            return await self._backend_call(ctx, request, execute, plain, name, args, call_id)
        except _CONTROL as e:
            raise _Escape(e) from e

    async def _client_call(
        self,
        ctx: RunContext,
        call: Mapping[str, Any],
        name: str,
        args: dict[str, Any],
        call_id: str,
    ) -> ToolMessage:
        try:
            result = await ctx.client_tool(name, args, key=call_id)
        except ToolFailed as e:
            return _tool_message(call, e.message or e.code or e.outcome, error=True)
        return _tool_message(call, result)

    async def _backend_call(
        self,
        ctx: RunContext,
        request: ToolCallRequest,
        execute: Callable[..., Any],
        plain: Callable[..., Any],
        name: str,
        args: dict[str, Any],
        call_id: str,
    ) -> Any:
        outcome: list[Any] = []

        async def run(_: dict[str, Any]) -> Any:
            try:
                result = await plain(request, execute)
            except GraphBubbleUp as e:
                raise _Bubbling(e) from e
            outcome.append(result)
            if isinstance(result, ToolMessage):
                if result.status == "error":
                    raise _HandledToolError(result)
                return _jsonable(result.content)
            if isinstance(result, Command):
                return _jsonable(
                    [
                        _jsonable(m.content)
                        for m in _update_messages(result)
                        if isinstance(m, ToolMessage)
                    ]
                )
            return _jsonable(result)

        try:
            response = await ctx.tool(name, args, run, key=call_id)
        except _Bubbling as e:
            await self._close_interrupted(ctx, call_id)
            raise e.inner from None
        except ToolFailed as e:
            cause = e.__cause__
            if isinstance(cause, _HandledToolError):
                return cause.message
            if cause is not None:
                self.tool_exceptions.add(id(cause))
                raise cause from None
            # Replayed: an earlier holder's call ended in an error the graph handled.
            return _tool_message(request.tool_call, e.message or e.code or "tool error", error=True)
        if outcome:
            return outcome[0]
        return _tool_message(request.tool_call, response)

    async def _close_interrupted(self, ctx: RunContext, key: str) -> None:
        """Closes the call an ``interrupt()`` in its tool left open (``cancelled``,
        code ``interrupted``): the tool runs again, as a new call, on resume."""
        base = f"{ctx.run_id}.{key}.tool"
        started = [
            str(e.get("toolCallId"))
            for e in ctx.journal
            if e.get("type") == "tool.call.started" and str(e.get("toolCallId")).startswith(base)
        ]
        finished = {
            str(e.get("toolCallId")) for e in ctx.journal if e.get("type") == "tool.call.finished"
        }
        open_calls = [c for c in started if c not in finished]
        if open_calls:
            closing = ctx.event(
                "tool.call.finished",
                toolCallId=open_calls[-1],
                outcome="cancelled",
                response=None,
                code=INTERRUPTED,
                message="the tool asked a person (interrupt); it runs again once answered",
            )
            await ctx.append([closing])

    # --- the stream ----------------------------------------------------------

    async def on_message(self, message: BaseMessage, meta: Mapping[str, Any]) -> None:
        if not isinstance(message, (AIMessage, AIMessageChunk)):
            return
        message_id = str(message.id or "")
        if message_id in self.input_ids:
            return
        ns = str(meta.get("langgraph_checkpoint_ns") or meta.get("langgraph_node") or "graph")
        said = self.said.get((ns, message_id))
        if said is None:
            nested = self.adapter.subgraph_messages == "nested"
            ctx = await self.at(_graph_of(meta)) if nested else self.ctx
            index = self.per_task.get(ns, 0)
            self.per_task[ns] = index + 1
            said = self.said[(ns, message_id)] = _Said(key=f"{ns}.{index}", ctx=ctx)
        if isinstance(message, AIMessageChunk):
            self.counts.chunk(message_id, message.usage_metadata)
        else:
            self.counts.message(message)
        reasoning, text = _parts(message)
        if reasoning:
            said.reasoning += reasoning
        if text:
            await self._think(said)
            await self._say(said, text)
        last = not isinstance(message, AIMessageChunk) or message.chunk_position == "last"
        if last:
            await self._complete(said)

    async def _think(self, said: _Said) -> None:
        if said.reasoning:
            said.thoughts += 1
            text, said.reasoning = said.reasoning, ""
            await said.ctx.think(text, key=f"{said.key}.thought{said.thoughts}")

    async def _say(self, said: _Said, text: str) -> None:
        message = said.message
        if message is not None and message.completed:
            # Another step came between its pieces: the rest goes in a message of its own.
            said.serial += 1
            message = None
        if message is None:
            key = said.key if said.serial == 1 else f"{said.key}.{said.serial}"
            message = said.message = said.ctx.message(key=key)
        await message.say(text)

    async def _complete(self, said: _Said) -> None:
        await self._think(said)
        if said.message is not None:
            await said.message.complete()

    async def on_task(self, ns: Namespace, task: Mapping[str, Any]) -> None:
        name, task_id = str(task.get("name")), str(task.get("id"))
        ended = "result" in task or "error" in task
        if ended and not task.get("interrupts"):
            await self.leave((*ns, f"{name}:{task_id}"))
        if not self.adapter.progress or name.startswith("__"):
            return
        ctx = await self.at(ns)
        key = f"task.{task_id}"
        if not ended:
            await ctx.progress(name, status="active", category="node", key=key)
            return
        for said in [s for (n, _), s in self.said.items() if n.endswith(task_id)]:
            await self._complete(said)
        if task.get("interrupts"):
            return
        status = "failed" if task.get("error") else "completed"
        await ctx.progress(name, status=status, category="node", key=key)

    async def on_values(self, values: Any) -> None:
        messages = values.get("messages") if isinstance(values, Mapping) else None
        if isinstance(messages, Sequence):
            for message in messages:
                if isinstance(message, BaseMessage) and message.id not in self.input_ids:
                    self.counts.message(message)
        view = self.adapter.state
        if view is False:
            return
        document = view(values) if callable(view) else _state_document(values)
        if document is None or document == self.state_base:
            return
        key = f"state.r{self.state_revision + 1}"
        scope = self.adapter.state_scope
        if self.state_base is None:
            self.state_revision = await self.ctx.put_state(document, scope=scope, key=key)
        else:
            patch = jsonpatch.make_patch(self.state_base, document).patch
            if not patch:
                return
            self.state_revision = await self.ctx.patch_state(patch, scope=scope, key=key)
        self.state_base = document

    # --- interrupts ----------------------------------------------------------

    async def decide(self, interrupts: Sequence[Interrupt]) -> Command[Any]:
        resume: dict[str, Any] = {}
        for interrupt in interrupts:
            value = interrupt.value
            fields = value if isinstance(value, Mapping) else {}
            message = fields.get("message")
            if not isinstance(message, str):
                message = value if isinstance(value, str) else json.dumps(value, default=str)
            actions = fields.get("actions")
            if not (isinstance(actions, Sequence) and actions and not isinstance(actions, str)):
                actions = ("approve", "deny")
            title = fields.get("title")
            ctx = await self.at(self.raised_in.get(interrupt.id, ()))
            decision = await ctx.approve(
                message or "Continue?",
                title=title if isinstance(title, str) else None,
                actions=[str(a) for a in actions],
                input=_jsonable(value) if fields else None,
                reason="langgraph.interrupt",
                key=interrupt.id,
            )
            resume[interrupt.id] = self.adapter.resume(decision, interrupt)
        return Command(resume=resume)


def _graph_of(metadata: Mapping[str, Any] | None) -> Namespace:
    """The graph a node ran in, from its ``langgraph_checkpoint_ns``
    (``"sub:task|node:task"``: the node ``node`` of subgraph ``sub``)."""
    ns = metadata.get("langgraph_checkpoint_ns") if isinstance(metadata, Mapping) else None
    if not isinstance(ns, str) or not ns:
        return ()
    return tuple(ns.split("|")[:-1])


def _raised_in(snapshot: StateSnapshot, ns: Namespace = ()) -> dict[str, Namespace]:
    """Where each pending interrupt of ``snapshot`` was raised: the deepest
    subgraph whose state (read with ``subgraphs=True``) lists it."""
    found: dict[str, Namespace] = {}
    for task in snapshot.tasks:
        for interrupt in task.interrupts:
            found.setdefault(interrupt.id, ns)
        if isinstance(task.state, StateSnapshot):
            inner = _raised_in(task.state, (*ns, f"{task.name}:{task.id}"))
            found.update(inner)
    return found


def _update_messages(command: Command[Any]) -> list[Any]:
    update = command.update
    if isinstance(update, Mapping):
        messages = update.get("messages")
        return list(messages) if isinstance(messages, Sequence) else []
    return []


def _parts(message: BaseMessage) -> tuple[str, str]:
    """A model message's (or chunk's) reasoning and text."""
    reasoning, text = "", ""
    content = message.content
    if isinstance(content, str):
        text = content
    else:
        for part in content:
            if isinstance(part, str):
                text += part
            elif isinstance(part, Mapping):
                kind = part.get("type")
                if kind == "text" and isinstance(part.get("text"), str):
                    text += part["text"]
                elif kind == "reasoning" and isinstance(part.get("reasoning"), str):
                    reasoning += part["reasoning"]
                elif kind == "thinking" and isinstance(part.get("thinking"), str):
                    reasoning += part["thinking"]
    extra = message.additional_kwargs.get("reasoning_content")
    if isinstance(extra, str):
        reasoning += extra
    return reasoning, text


def _state_document(values: Any) -> Any:
    """The state document of a graph state: its JSON entries but ``messages``."""
    if isinstance(values, BaseModel):
        values = values.model_dump()
    if not isinstance(values, Mapping):
        return None
    document: dict[str, Any] = {}
    for name, value in values.items():
        if name == "messages":
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        document[str(name)] = value
    return document


def _default_input(ctx: RunContext, turns: list[Turn]) -> Any:
    return {
        "messages": [HumanMessage(t.text) if t.role == "user" else AIMessage(t.text) for t in turns]
    }


def _default_resume(decision: str, interrupt: Interrupt) -> Any:
    del interrupt
    return decision


def _has_checkpointer(graph: Graph) -> bool:
    return isinstance(getattr(graph, "checkpointer", None), BaseCheckpointSaver)


class _Adapter:
    def __init__(
        self,
        graph: Graph,
        *,
        client_tools: Collection[str],
        input: InputFactory | None,
        config: RunnableConfig | None,
        resume: ResumeFactory | None,
        state: bool | StateView,
        state_scope: str,
        progress: bool,
        durability: str,
        subgraph_messages: str,
    ) -> None:
        self.graph = graph
        self.client_tools = frozenset(client_tools)
        self.input = input or _default_input
        self.config = dict(config or {})
        self.resume = resume or _default_resume
        self.state = state
        self.state_scope = state_scope
        self.progress = progress
        self.subgraph_messages = subgraph_messages
        self.durability = durability
        for node in _tool_nodes(graph):
            _intercept(node)

    def config_of(self, ctx: RunContext) -> RunnableConfig:
        given = self.config.get("configurable")
        configurable = {**(given if isinstance(given, Mapping) else {}), "thread_id": ctx.run_id}
        return cast("RunnableConfig", {**self.config, "configurable": configurable})

    async def __call__(self, ctx: RunContext) -> None:
        run = _Run(self, ctx)
        config = self.config_of(ctx)

        def error_code(error: BaseException) -> str:
            if isinstance(error, _NoCheckpoint):
                return NO_CHECKPOINT
            if isinstance(error, GraphRecursionError):
                return RECURSION_LIMIT
            if id(error) in run.tool_exceptions:
                return TOOL_ERROR
            return GRAPH_ERROR

        usage = _LiveUsage(run.counts)
        with checkpoints_in(ctx):
            await drive(ctx, lambda: self._work(run, config), usage=usage, error_code=error_code)

    async def _work(self, run: _Run, config: RunnableConfig) -> None:
        ctx = run.ctx
        if self.state is not False:
            run.state_revision, run.state_base = await ctx.read_state(self.state_scope)
        pending: Any = None
        snapshot = (
            await self.graph.aget_state(config, subgraphs=True)
            if _has_checkpointer(self.graph)
            else None
        )
        if snapshot is not None and snapshot.created_at is not None:
            # Taken over (or given back and claimed again): from the checkpoint.
            if isinstance(snapshot.values, Mapping):
                for message in snapshot.values.get("messages") or ():
                    if isinstance(message, BaseMessage):
                        run.counts.message(message)
            interrupts = [i for task in snapshot.tasks for i in task.interrupts]
            if interrupts:
                run.raised_in.update(_raised_in(snapshot))
                pending = await run.decide(interrupts)
            elif not snapshot.next:
                return
        elif any(e.get("type") in _WORK or e.get("parentRunId") for e in ctx.journal):
            raise _NoCheckpoint(
                f"run {ctx.run_id} was taken over and its graph has no checkpoint to resume "
                "from (compile it with checkpointer=NaradSaver(), or another durable one)"
            )
        else:
            pending = self.input(ctx, await conversation(ctx))
            messages = pending.get("messages") if isinstance(pending, Mapping) else None
            for message in messages or ():
                if isinstance(message, BaseMessage) and message.id:
                    run.input_ids.add(message.id)
        token = _ACTIVE.set(run)
        try:
            while True:
                interrupts = await self._stream(run, pending, config)
                if not interrupts:
                    await run.leave(())
                    return
                pending = await run.decide(interrupts)
        except BaseException as error:
            await run.leave((), error)
            raise
        finally:
            _ACTIVE.reset(token)

    async def _stream(self, run: _Run, pending: Any, config: RunnableConfig) -> list[Interrupt]:
        interrupts: list[Interrupt] = []
        options: dict[str, Any] = {}
        if _has_checkpointer(self.graph):
            options["durability"] = self.durability
        try:
            parts = self.graph.astream(
                pending, config, stream_mode=STREAM_MODES, subgraphs=True, **options
            )
            async for part in parts:
                ns, mode, data = cast("tuple[Namespace, str, Any]", part)
                if mode == "messages":
                    message, meta = data
                    await run.on_message(message, meta)
                elif mode == "tasks":
                    await run.on_task(ns, data)
                elif mode == "values" and not ns:
                    await run.on_values(data)
                elif mode == "updates" and isinstance(data, Mapping):
                    # An interrupt is reported by its graph and each one above it.
                    for interrupt in data.get("__interrupt__") or ():
                        if interrupt.id not in run.raised_in:
                            run.raised_in[interrupt.id] = ns
                            interrupts.append(interrupt)
        except _Escape as e:
            raise e.inner from None
        for said in list(run.said.values()):
            await run._complete(said)
        return interrupts


class _NoCheckpoint(Exception):
    """A taken-over run with no checkpoint to resume from."""


def handler(
    graph: Graph,
    *,
    client_tools: Collection[str] = (),
    input: InputFactory | None = None,
    config: RunnableConfig | None = None,
    resume: ResumeFactory | None = None,
    state: bool | StateView = True,
    state_scope: str = "session",
    progress: bool = True,
    subgraph_messages: Literal["top", "nested"] = "top",
    checkpointer_required: bool = False,
    durability: str = "sync",
) -> RunHandler:
    """A run handler that runs ``graph`` (a compiled LangGraph graph) for each claimed run.

    - ``client_tools``: names of tools of the graph's ``ToolNode`` s that the
      run's client executor runs (see :func:`client_tool`);
    - ``input``: the graph's input from the run and the session's conversation
      (default ``{"messages": [HumanMessage/AIMessage, ...]}``);
    - ``config``: LangGraph config for each run (its ``thread_id`` is the run id);
    - ``resume``: the ``Command(resume=...)`` value of an interrupt's decision
      (default: the decision, e.g. ``"approve"``);
    - ``state``: ``False`` to keep the graph state out of the state document,
      or a function of the state values to the document; ``state_scope`` its scope;
    - ``progress``: node tasks as ``progress.recorded``;
    - ``subgraph_messages``: where a subgraph's model text goes: the top run
      (``"top"``, the conversation) or the subgraph's nested run (``"nested"``);
    - ``checkpointer_required``: refuse a graph compiled without a checkpointer;
    - ``durability``: LangGraph's ``durability`` (``"sync"``: each step's
      checkpoint is saved before the next step starts, so that a takeover
      repeats no step whose effects were journaled).
    """
    if not isinstance(graph, Pregel):
        raise TypeError("handler() takes a compiled LangGraph graph (StateGraph(...).compile())")
    if checkpointer_required and not _has_checkpointer(graph):
        raise ValueError("the graph has no checkpointer: compile it with one")
    adapter = _Adapter(
        graph,
        client_tools=client_tools,
        input=input,
        config=config,
        resume=resume,
        state=state,
        state_scope=state_scope,
        progress=progress,
        subgraph_messages=subgraph_messages,
        durability=durability,
    )

    return adapter
