"""The client reducer (§10, §13): reduces what a client received — duplicates
and re-deliveries included — into session state: the run tree, interrupts,
tool calls, documents, views and the transcript.

It keeps the client obligations of §10: deduplicates by eventId before
applying; applies nothing past a gap in sessionSequence (`delivery.gap`:
re-read history from :attr:`SessionReducer.session_sequence`); refuses one
eventId at two sequences, or two events at one (`delivery.conflict`); never
lets a watch revision regress (`watch.revision.regress`); replaces the
transcript with a `messages.snapshot`; validates the authority of the
profiles it negotiated with the lifecycle rules (:class:`SessionState`);
never invents a terminal and never executes anything (control messages are
ignored). An object refused with a :class:`Violation` leaves the state as it
was.

:meth:`SessionReducer.state` gives the reduced state in the form of the
conformance traces' `state` (`conformance/README.md`), with the wire's
camelCase member names.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Literal, TypeAlias, TypedDict, cast

from .engine import AuthorityEvent, RunSlot, SessionState, Status
from .graph import RunGraphs
from .jsonpatch import Json
from .wire import (
    ALL_PROFILES,
    Accepted,
    Ignored,
    ProfileId,
    Violation,
    WireObject,
    classify,
    profile_set,
)

__all__ = [
    "Delivered",
    "DocumentSummary",
    "DocumentsSummary",
    "InterruptSummary",
    "Redaction",
    "ReducedState",
    "RunSlotJson",
    "RunSummary",
    "SessionReducer",
    "SlotJson",
    "ToolCallSummary",
    "TranscriptItem",
    "TranscriptMessage",
    "TranscriptReasoning",
    "ViewSummary",
    "WorkflowSlotJson",
    "WorkflowSummary",
]

#: What the reducer did with one delivered object.
Delivered: TypeAlias = Literal["applied", "duplicate", "recorded", "ignored"]

#: Who wrote a message.
Role: TypeAlias = Literal["user", "assistant", "system"]
#: Where a message belongs.
MessageScope: TypeAlias = Literal["session", "workflow", "run"]


class Redaction(TypedDict):
    """A display redaction (§9.4); the content itself is kept."""

    reason: str
    displayReplacement: Json


class _TranscriptMessage(TypedDict):
    item: Literal["message"]
    messageId: str
    role: Role
    scope: MessageScope
    #: User content, or the streamed text so far.
    content: Json
    completed: bool


class TranscriptMessage(_TranscriptMessage, total=False):
    """A transcript message (§9.2)."""

    runId: str
    redaction: Redaction


class _TranscriptReasoning(TypedDict):
    item: Literal["reasoning"]
    reasoningId: str
    text: str
    completed: bool


class TranscriptReasoning(_TranscriptReasoning, total=False):
    """A reasoning stream, kept even when a later message carries the turn's final text (§9.2)."""

    messageId: str
    runId: str


#: One entry of the transcript.
TranscriptItem: TypeAlias = TranscriptMessage | TranscriptReasoning


class RunSlotJson(TypedDict):
    """The slot held by a top-level run."""

    kind: Literal["run"]
    runId: str


class WorkflowSlotJson(TypedDict):
    """The slot held by a workflow."""

    kind: Literal["workflow"]
    workflowId: str


#: The session's active top-level execution, as the state gives it.
SlotJson: TypeAlias = RunSlotJson | WorkflowSlotJson


class _RunSummary(TypedDict):
    state: Status
    stopRequested: bool
    rootRunId: str


class RunSummary(_RunSummary, total=False):
    """A run in the reduced state."""

    parentRunId: str
    workflowId: str
    clientExecutorId: str


class WorkflowSummary(TypedDict):
    """A workflow in the reduced state."""

    state: Status


class _InterruptSummary(TypedDict):
    open: bool


class InterruptSummary(_InterruptSummary, total=False):
    """An interrupt in the reduced state: open, or its decision."""

    decision: str


class _ToolCallSummary(TypedDict):
    runId: str
    toolName: str
    executor: str


class ToolCallSummary(_ToolCallSummary, total=False):
    """A tool call in the reduced state."""

    outcome: str


class DocumentSummary(TypedDict):
    """A state or UI document at a revision."""

    revision: int
    state: Json


class DocumentsSummary(TypedDict, total=False):
    """The state and UI documents by scope (a family with none is absent)."""

    state: dict[str, DocumentSummary]
    ui: dict[str, DocumentSummary]


class ViewSummary(TypedDict):
    """A view in the reduced state."""

    open: bool
    state: Json


class ReducedState(TypedDict):
    """The reduced state of a session, in the form of the conformance traces' `state`."""

    sessionSequence: int
    slot: SlotJson | None
    runs: dict[str, RunSummary]
    workflows: dict[str, WorkflowSummary]
    interrupts: dict[str, InterruptSummary]
    toolCalls: dict[str, ToolCallSummary]
    transcript: list[TranscriptItem]
    documents: DocumentsSummary
    views: dict[str, ViewSummary]
    watch: dict[str, int]


#: Watch event type → the scope family and the member naming the scope.
_WATCH_ID: Mapping[str, tuple[str, str]] = {
    "session.revision": ("session.revision", "sessionId"),
    "run.revision": ("run.revision", "runId"),
    "workflow.revision": ("workflow.revision", "workflowId"),
    "node.revision": ("node.revision", "nodeId"),
    "workspace.revision": ("workspace.revision", "workspaceId"),
    "session.created": ("workspace.revision", "workspaceId"),
    "session.updated": ("workspace.revision", "workspaceId"),
    "session.archived": ("workspace.revision", "workspaceId"),
}

_EVERY_PROFILE = profile_set(ALL_PROFILES)


def _at(v: Violation, o: WireObject) -> Violation:
    event_id = o.get("eventId")
    if isinstance(event_id, str):
        v.event_id = event_id
    return v


class SessionReducer:
    """The reducer of one session's delivered stream."""

    def __init__(self, *, profiles: Iterable[str] | None = None) -> None:
        """A reducer for a client that negotiated `profiles` (core is implied;
        default: every profile). Raises `ValueError` for an unknown profile id."""
        self._profiles: frozenset[ProfileId] = (
            _EVERY_PROFILE if profiles is None else profile_set(profiles)
        )
        self._engine = SessionState(self._profiles)
        #: Authority delivered so far: eventId → sessionSequence.
        self._delivered: dict[str, int] = {}
        self._by_sequence: dict[int, str] = {}
        self._watch_seen: set[str] = set()
        self._watch_revisions: dict[str, int] = {}
        self._transcript: list[TranscriptItem] = []
        #: Transcript replaced by a snapshot through this sequence.
        self._transcript_covered = 0
        self._last_top_level_run: str | None = None
        #: The run graphs (`narad.graph/v1`) from the stream's graph records.
        self.graphs = RunGraphs()

    @property
    def profiles(self) -> frozenset[ProfileId]:
        """The negotiated profiles, core included."""
        return self._profiles

    @property
    def session_sequence(self) -> int:
        """The last sessionSequence applied (0 before any): resume history or a stream after it."""
        return self._engine.session_sequence

    @property
    def lifecycle(self) -> SessionState:
        """The lifecycle state the rules keep (runs, interrupts, tool calls, documents, views)."""
        return self._engine

    def deliver(self, value: object) -> Delivered:
        """Reduces one delivered wire object (§10.1: at least once, in order).

        Raises a :class:`Violation` for an object that breaks a rule; the
        state is then as it was before it.
        """
        c = classify(value, self._profiles)
        if isinstance(c, Ignored):
            if c.reason != "not-negotiated":
                return "ignored"
            # Authority of a profile not negotiated is still read, so that its
            # sequence is accounted for and never looks like a gap (§2.1).
            try:
                every = classify(value, _EVERY_PROFILE)
            except Violation:
                return "ignored"
            if not isinstance(every, Accepted) or every.info.kind != "authority":
                return "ignored"
            return self._deliver_authority(AuthorityEvent(every.object))
        match c.info.kind:
            case "authority":
                return self._deliver_authority(AuthorityEvent(c.object))
            case "watch":
                return self._deliver_watch(c.object)
            case "hydrate":
                if c.object.get("type") == "messages.snapshot":
                    # A snapshot older than what the transcript already
                    # holds would take back what later authority added.
                    holds = max(self._transcript_covered, self._engine.session_sequence)
                    covers = c.object.get("coversThroughSessionSequence")
                    if isinstance(covers, int) and covers < holds:
                        return "ignored"
                    self._replace_transcript(c.object)
                else:
                    self.graphs.apply(c.object)
                return "recorded"
            case "control":
                return "ignored"

    def append(self, value: object) -> None:
        """Applies the next event of a journal with no deduplication: every event
        must be new and next, of a negotiated profile (`profile.not-active`
        otherwise). The view of a writer checking what it is about to append."""
        c = classify(value, _EVERY_PROFILE)
        if isinstance(c, Ignored):
            raise Violation(
                "wire.unknown-type",
                f"{json.dumps(c.type)} is no narad/v1 type; a journal holds only known types",
                "/type",
            )
        type_name = c.object.get("type")
        if c.info.profile not in self._profiles:
            raise Violation(
                "profile.not-active",
                f"{type_name} belongs to {c.info.profile}, which is not active",
                "/type",
            )
        if c.info.kind != "authority":
            raise Violation(
                "wire.invalid", f"a journal holds authority events only, not {type_name}", "/type"
            )
        self._apply_authority(AuthorityEvent(c.object))

    def _deliver_authority(self, e: AuthorityEvent) -> Delivered:
        had = self._delivered.get(e.event_id)
        seq = e.session_sequence
        if had is not None:
            if had == seq:
                return "duplicate"
            raise _at(
                Violation(
                    "delivery.conflict",
                    f"event {e.event_id} was delivered at sessionSequence {had}, now at {seq}",
                ),
                e.raw,
            )
        through = self._engine.session_sequence
        if seq <= through:
            other = self._by_sequence.get(seq)
            held = "another event" if other is None else f"event {other}"
            raise _at(
                Violation(
                    "delivery.conflict", f"sessionSequence {seq} was already delivered as {held}"
                ),
                e.raw,
            )
        if seq > through + 1:
            raise _at(
                Violation(
                    "delivery.gap",
                    f"sessionSequence {seq} arrived after {through}: "
                    f"re-read history from {through} before applying more",
                ),
                e.raw,
            )
        if self._engine.is_outside_profiles(e):
            self._engine.skip(e)
            self._remember(e)
            return "ignored"
        self._apply_authority(e)
        return "applied"

    def _apply_authority(self, e: AuthorityEvent) -> None:
        self._engine.apply(e)
        self._remember(e)
        self._reduce_transcript(e)

    def _remember(self, e: AuthorityEvent) -> None:
        self._delivered[e.event_id] = e.session_sequence
        self._by_sequence[e.session_sequence] = e.event_id

    def _deliver_watch(self, w: WireObject) -> Delivered:
        watch_id = str(w.get("eventId"))
        if watch_id in self._watch_seen:
            return "duplicate"
        type_name = str(w.get("type"))
        family, member = _WATCH_ID.get(type_name, (type_name, "id"))
        scope = f"{family}/{_js_string(w.get(member))}"
        revision = w.get("revision")
        if isinstance(revision, bool) or not isinstance(revision, (int, float)):
            raise _at(Violation("wire.invalid", "/revision: not a number", "/revision"), w)
        last = self._watch_revisions.get(scope)
        if last is not None and revision < last:
            raise _at(
                Violation(
                    "watch.revision.regress",
                    f"{scope} went from revision {last} back to {revision}",
                ),
                w,
            )
        self._watch_seen.add(watch_id)
        self._watch_revisions[scope] = int(revision)
        return "recorded"

    def _replace_transcript(self, snapshot: WireObject) -> None:
        items: list[TranscriptItem] = []
        messages = snapshot.get("messages")
        for m in messages if isinstance(messages, list) else []:
            if not isinstance(m, Mapping):
                continue
            run_id = m.get("runId")
            run = run_id if isinstance(run_id, str) else None
            message_id = str(m.get("messageId"))
            reasoning = m.get("reasoning")
            for r in reasoning if isinstance(reasoning, list) else []:
                if not isinstance(r, Mapping):
                    continue
                thought: TranscriptReasoning = {
                    "item": "reasoning",
                    "reasoningId": str(r.get("reasoningId")),
                    "messageId": message_id,
                    "text": str(r.get("text")),
                    "completed": r.get("completed") is True,
                }
                items.append(_with_run(thought, run))
            message: TranscriptMessage = {
                "item": "message",
                "messageId": message_id,
                "role": cast("Role", m.get("role")),
                "scope": cast("MessageScope", m.get("messageScope")),
                "content": copy.deepcopy(cast("Json", m.get("content"))),
                "completed": m.get("completed") is True,
            }
            _with_run(message, run)
            redaction = m.get("redaction")
            if isinstance(redaction, Mapping):
                message["redaction"] = _redaction(redaction)
            items.append(message)
        self._transcript = items
        covers = snapshot.get("coversThroughSessionSequence")
        self._transcript_covered = covers if isinstance(covers, int) else 0

    def _reduce_transcript(self, e: AuthorityEvent) -> None:
        if e.type == "run.started" and not e.has("parentRunId"):
            self._last_top_level_run = e.run_id
        if e.session_sequence <= self._transcript_covered:
            return
        run_id = e.run_id
        match e.type:
            case "message.user.recorded":
                user: TranscriptMessage = {
                    "item": "message",
                    "messageId": e.text("messageId"),
                    "role": "user",
                    "scope": cast("MessageScope", e.text("messageScope")),
                    "content": copy.deepcopy(e.json("content")),
                    "completed": True,
                }
                self._transcript.append(_with_run(user, run_id))
            case "message.text.started":
                started: TranscriptMessage = {
                    "item": "message",
                    "messageId": e.text("messageId"),
                    "role": cast("Role", e.text("role")),
                    "scope": cast("MessageScope", e.text("messageScope")),
                    "content": "",
                    "completed": False,
                }
                self._transcript.append(_with_run(started, run_id))
            case "message.text.delta":
                m = self._message(e.text("messageId"))
                if m is not None and isinstance(m["content"], str):
                    m["content"] += e.text("delta")
            case "message.text.completed":
                m = self._message(e.text("messageId"))
                if m is not None:
                    m["completed"] = True
            case "message.redacted":
                m = self._message(e.text("messageId"))
                if m is not None:
                    m["redaction"] = _redaction(e.raw)
            case "reasoning.started":
                r: TranscriptReasoning = {
                    "item": "reasoning",
                    "reasoningId": e.text("reasoningId"),
                    "text": "",
                    "completed": False,
                }
                message_id = e.raw.get("messageId")
                if isinstance(message_id, str):
                    r["messageId"] = message_id
                self._transcript.append(_with_run(r, run_id))
            case "reasoning.delta":
                found = self._reasoning(e.text("reasoningId"))
                if found is not None:
                    found["text"] += e.text("delta")
            case "reasoning.completed":
                found = self._reasoning(e.text("reasoningId"))
                if found is not None:
                    found["completed"] = True
            case _:
                pass

    def _message(self, message_id: str) -> TranscriptMessage | None:
        for item in reversed(self._transcript):
            if item["item"] == "message" and item["messageId"] == message_id:
                return item
        return None

    def _reasoning(self, reasoning_id: str) -> TranscriptReasoning | None:
        for item in reversed(self._transcript):
            if item["item"] == "reasoning" and item["reasoningId"] == reasoning_id:
                return item
        return None

    def transcript(self, opened: Iterable[str] = ()) -> list[TranscriptItem]:
        """The default transcript (§9.2): session- and workflow-scoped items and
        those of the most recently started top-level run, in order; items of
        the runs in `opened` (e.g. a nested run a person expanded) as well.
        The items are the reducer's own: copy them before changing them."""
        shown = set(opened)
        return [
            i
            for i in self._transcript
            if "runId" not in i or i["runId"] == self._last_top_level_run or i["runId"] in shown
        ]

    def state(self) -> ReducedState:
        """The reduced state, in the form of the conformance traces' `state`
        (`conformance/README.md`): a fresh copy, camelCase members."""
        s = self._engine
        runs: dict[str, RunSummary] = {}
        for run_id, r in s.runs.items():
            run: RunSummary = {
                "state": r.state,
                "stopRequested": r.stop_requested,
                "rootRunId": r.root_run_id,
            }
            if r.parent_run_id is not None:
                run["parentRunId"] = r.parent_run_id
            if r.workflow_id is not None:
                run["workflowId"] = r.workflow_id
            if r.client_executor_id is not None:
                run["clientExecutorId"] = r.client_executor_id
            runs[run_id] = run
        interrupts: dict[str, InterruptSummary] = {}
        for interrupt_id, i in s.interrupts.items():
            interrupts[interrupt_id] = (
                {"open": True} if i.decision is None else {"open": False, "decision": i.decision}
            )
        tool_calls: dict[str, ToolCallSummary] = {}
        for call_id, t in s.tool_calls.items():
            call: ToolCallSummary = {
                "runId": t.run_id,
                "toolName": t.tool_name,
                "executor": t.executor,
            }
            if t.outcome is not None:
                call["outcome"] = t.outcome
            tool_calls[call_id] = call
        documents: DocumentsSummary = {}
        for family in ("state", "ui"):
            held = s.documents[family]
            if held:
                documents[family] = {
                    scope: {"revision": d.revision, "state": copy.deepcopy(d.state)}
                    for scope, d in held.items()
                }
        slot: SlotJson | None
        if s.slot is None:
            slot = None
        elif isinstance(s.slot, RunSlot):
            slot = {"kind": "run", "runId": s.slot.run_id}
        else:
            slot = {"kind": "workflow", "workflowId": s.slot.workflow_id}
        return {
            "sessionSequence": s.session_sequence,
            "slot": slot,
            "runs": runs,
            "workflows": {w: {"state": wf.state} for w, wf in s.workflows.items()},
            "interrupts": interrupts,
            "toolCalls": tool_calls,
            "transcript": copy.deepcopy(self.transcript()),
            "documents": documents,
            "views": {
                v: {"open": view.open, "state": copy.deepcopy(view.state)}
                for v, view in s.views.items()
            },
            "watch": dict(self._watch_revisions),
        }


def _with_run(item: TranscriptItem, run_id: str | None) -> TranscriptItem:
    if run_id is not None:
        item["runId"] = run_id
    return item


def _redaction(source: Mapping[str, object]) -> Redaction:
    return {
        "reason": str(source.get("reason")),
        "displayReplacement": copy.deepcopy(cast("Json", source.get("displayReplacement"))),
    }


def _js_string(value: object) -> str:
    """`value` as JavaScript's `String()` writes it, so that scope keys match
    the TypeScript SDK's (`undefined` for a member that is absent)."""
    if value is None:
        return "undefined"
    if isinstance(value, str):
        return value
    return json.dumps(value)
