"""The lifecycle rules of narad/v1 (`docs/rules.md`) over one session's
authority: the same rules, ids and readings as the server's rule engine, so
that a client validates what it reduces (§13). The `issuer.*` rules are not
here: who may write what is known only to the server that journals an event.

:class:`SessionState` checks each event before it changes anything: an
event refused with a :class:`~narad.wire.Violation` leaves the state as it
was.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Literal, NoReturn, TypeAlias, cast

from .jsonpatch import Json, PatchError, PatchOperation, apply_patch
from .wire import WIRE_TYPE_INFO, ProfileId, Violation, WireObject

__all__ = [
    "TERMINAL",
    "Applied",
    "AuthorityEvent",
    "DocumentState",
    "InterruptState",
    "Owner",
    "PendingPause",
    "RunJournal",
    "RunOwner",
    "RunSlot",
    "RunState",
    "SessionState",
    "Slot",
    "Status",
    "ToolCallState",
    "ViewState",
    "WaitPause",
    "WorkflowOwner",
    "WorkflowSlot",
    "WorkflowState",
    "fold_members",
]

#: A run's or workflow's state.
Status: TypeAlias = Literal["running", "paused", "finished", "error", "cancelled"]

#: The states a run or workflow ends in.
TERMINAL: frozenset[Status] = frozenset({"finished", "error", "cancelled"})


@dataclass(slots=True)
class WaitPause:
    """An open pause cycle: its waitId and the interrupt it waits on, if one."""

    wait_id: str
    interrupt_id: str | None = None


@dataclass(frozen=True, slots=True)
class PendingPause:
    """The pause a blocking interrupt owes next in its journal (§7.6)."""

    interrupt_id: str
    wait_id: str
    #: The run to pause; None for a workflow's pause.
    run_id: str | None = None


@dataclass(slots=True)
class RunState:
    """One run of the session."""

    root_run_id: str
    state: Status = "running"
    parent_run_id: str | None = None
    workflow_id: str | None = None
    client_executor_id: str | None = None
    #: The open pause cycle.
    pause: WaitPause | None = None
    stop_requested: bool = False
    open_children: set[str] = field(default_factory=set)
    open_tool_calls: set[str] = field(default_factory=set)
    #: Open interrupts of the run: interruptId → blocking.
    open_interrupts: dict[str, bool] = field(default_factory=dict)


@dataclass(slots=True)
class WorkflowState:
    """One workflow of the session."""

    sequence: int = 0
    state: Status = "running"
    pause: WaitPause | None = None
    active_top_level_run: str | None = None
    open_runs: set[str] = field(default_factory=set)
    open_interrupts: dict[str, bool] = field(default_factory=dict)
    pending_pause: PendingPause | None = None


@dataclass(slots=True)
class RunJournal:
    """One run journal (by rootRunId): its last sequence and the pause owed next."""

    sequence: int = 0
    pending_pause: PendingPause | None = None


@dataclass(frozen=True, slots=True)
class RunOwner:
    """An interrupt owned by a run."""

    run_id: str


@dataclass(frozen=True, slots=True)
class WorkflowOwner:
    """An interrupt owned by a workflow."""

    workflow_id: str


#: Who owns an interrupt.
Owner: TypeAlias = RunOwner | WorkflowOwner


@dataclass(slots=True)
class InterruptState:
    """One interrupt of the session."""

    owner: Owner
    wait_id: str
    actions: list[str]
    blocking: bool
    members: list[str]
    decision: str | None = None


@dataclass(slots=True)
class ToolCallState:
    """One tool call of the session."""

    run_id: str
    tool_name: str
    executor: str
    outcome: str | None = None


@dataclass(slots=True)
class DocumentState:
    """A state or UI document at a revision."""

    revision: int
    state: Json


@dataclass(slots=True)
class ViewState:
    """A view: whether it is open, and its state."""

    open: bool
    state: Json


@dataclass(frozen=True, slots=True)
class RunSlot:
    """The session's slot held by a top-level run."""

    run_id: str


@dataclass(frozen=True, slots=True)
class WorkflowSlot:
    """The session's slot held by a workflow."""

    workflow_id: str


#: The session's active top-level execution.
Slot: TypeAlias = RunSlot | WorkflowSlot


@dataclass(frozen=True, slots=True)
class Applied:
    """What applying an event did beyond the state: whether it freed the session's slot."""

    slot_freed: bool = False


_NONE = Applied()


def _fail(rule: str, message: str) -> NoReturn:
    raise Violation(rule, message)


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


class AuthorityEvent:
    """An authority event, as it travels: typed access to its envelope and members.

    The envelope (`eventId`, `sessionId`, `sessionSequence`, the run and
    workflow positions) is read once; member accessors raise a
    `wire.invalid` :class:`Violation` for a member missing or ill-typed
    (which an object that passed its schema never is).
    """

    __slots__ = (
        "event_id",
        "raw",
        "root_run_id",
        "run_id",
        "sequence",
        "session_id",
        "session_sequence",
        "type",
        "workflow_id",
        "workflow_sequence",
    )

    def __init__(self, raw: WireObject) -> None:
        """Reads the envelope of `raw`, a wire object of an authority type."""
        self.raw = raw
        self.type = self.text("type")
        self.event_id = self.text("eventId")
        self.session_id = self.text("sessionId")
        self.session_sequence = self.integer("sessionSequence")
        self.root_run_id = self.opt_text("rootRunId")
        self.run_id = self.opt_text("runId")
        self.sequence = self.opt_integer("sequence")
        self.workflow_id = self.opt_text("workflowId")
        self.workflow_sequence = self.opt_integer("workflowSequence")

    def __repr__(self) -> str:
        return f"AuthorityEvent({self.type} {self.event_id} @{self.session_sequence})"

    def has(self, member: str) -> bool:
        """Whether the event carries `member`."""
        return member in self.raw

    def text(self, member: str) -> str:
        """A required string member."""
        value = self.raw.get(member)
        if not isinstance(value, str):
            raise Violation("wire.invalid", f"/{member}: missing or not a string", f"/{member}")
        return value

    def opt_text(self, member: str) -> str | None:
        """An optional string member (None when absent)."""
        if member not in self.raw:
            return None
        return self.text(member)

    def integer(self, member: str) -> int:
        """A required integer member."""
        value = _as_int(self.raw.get(member))
        if value is None:
            raise Violation("wire.invalid", f"/{member}: missing or not an integer", f"/{member}")
        return value

    def opt_integer(self, member: str) -> int | None:
        """An optional integer member (None when absent)."""
        if member not in self.raw:
            return None
        return self.integer(member)

    def json(self, member: str) -> Json:
        """A member holding any JSON (None when absent or null)."""
        return cast("Json", self.raw.get(member))

    def patch(self, member: str = "patch") -> list[PatchOperation]:
        """A JSON Patch member."""
        value = self.raw.get(member)
        if not isinstance(value, list):
            raise Violation("wire.invalid", f"/{member}: missing or not an array", f"/{member}")
        return cast("list[PatchOperation]", value)


def _event(e: AuthorityEvent | WireObject) -> AuthorityEvent:
    return e if isinstance(e, AuthorityEvent) else AuthorityEvent(e)


def fold_members(decisions: Sequence[str]) -> str:
    """The pack fold of §7.7: stop wins; else all approve; else all expired; otherwise deny."""
    if "stop" in decisions:
        return "stop"
    if all(d == "approve" for d in decisions):
        return "approve"
    if all(d == "expired" for d in decisions):
        return "expired"
    return "deny"


@dataclass(slots=True)
class _Placed:
    run_id: str | None
    workflow_id: str | None


@dataclass(slots=True)
class _Stream:
    placed: _Placed
    completed: bool


_STREAMED = frozenset(
    {
        "message.user.recorded",
        "message.text.started",
        "message.text.delta",
        "message.text.completed",
        "reasoning.started",
        "reasoning.delta",
        "reasoning.completed",
    }
)


class SessionState:
    """The lifecycle state of one session journal, and the rules over it."""

    def __init__(self, profiles: AbstractSet[ProfileId]) -> None:
        """An empty session for a reader that negotiated `profiles` (core included)."""
        self.profiles: frozenset[ProfileId] = frozenset(profiles)
        self.session_id: str | None = None
        #: The last sessionSequence applied or accounted for (0 before any).
        self.session_sequence = 0
        self.event_ids: set[str] = set()
        self.slot: Slot | None = None
        self.runs: dict[str, RunState] = {}
        #: Run journals by rootRunId: the last sequence and the pause owed next.
        self.run_journals: dict[str, RunJournal] = {}
        self.workflows: dict[str, WorkflowState] = {}
        self.interrupts: dict[str, InterruptState] = {}
        self.tool_calls: dict[str, ToolCallState] = {}
        #: The state (`state`) and UI (`ui`) documents, by scope.
        self.documents: dict[Literal["state", "ui"], dict[str, DocumentState]] = {
            "state": {},
            "ui": {},
        }
        self.views: dict[str, ViewState] = {}
        self._messages: dict[str, _Stream] = {}
        self._reasoning: dict[str, _Stream] = {}
        self._attachments: dict[str, bool] = {}
        self._artifacts: set[str] = set()

    # --- entry points ----------------------------------------------------

    def is_outside_profiles(self, event: AuthorityEvent | WireObject) -> bool:
        """Whether the event lies outside the negotiated profiles (then only accounted for)."""
        e = _event(event)
        info = WIRE_TYPE_INFO.get(e.type)
        return (
            info is None
            or info.profile not in self.profiles
            or (
                "narad.workflow/v1" not in self.profiles
                and e.run_id is None
                and e.workflow_id is not None
            )
        )

    def skip(self, event: AuthorityEvent | WireObject) -> None:
        """Accounts for an event outside the negotiated profiles: its identity and sequences."""
        e = _event(event)

        def check() -> None:
            self._check_identity(e)
            self._check_session_sequence(e)
            if e.root_run_id is not None and e.root_run_id in self.run_journals:
                self._check_run_sequence(e.root_run_id, e.sequence or 0)

        self._at(e, check)
        self._record_identity(e)
        journal = None if e.root_run_id is None else self.run_journals.get(e.root_run_id)
        if journal is not None:
            journal.sequence = e.sequence or 0

    def apply(self, event: AuthorityEvent | WireObject) -> Applied:
        """Applies the next event of the journal, or raises the :class:`Violation` it commits."""
        e = _event(event)
        applied: list[Applied] = []

        def check_and_apply() -> None:
            self._check_identity(e)
            self._check_order(e)
            applied.append(self._apply_body(e))

        self._at(e, check_and_apply)
        self._advance(e)
        return applied[0]

    @staticmethod
    def _at(e: AuthorityEvent, f: Callable[[], None]) -> None:
        try:
            f()
        except Violation as v:
            v.event_id = e.event_id
            raise

    # --- identity and order ------------------------------------------------

    def _workflow_position(self, e: AuthorityEvent) -> tuple[str, int] | None:
        if "narad.workflow/v1" in self.profiles and e.workflow_id is not None:
            return e.workflow_id, e.workflow_sequence or 0
        return None

    def _check_identity(self, e: AuthorityEvent) -> None:
        if self.session_id is not None and self.session_id != e.session_id:
            _fail(
                "event.session",
                f"the event names session {e.session_id} "
                f"but this journal is session {self.session_id}",
            )
        if e.event_id in self.event_ids:
            _fail(
                "event.id.unique",
                f"eventId {e.event_id} was already used in this session; a new fact needs a new id",
            )

    def _check_session_sequence(self, e: AuthorityEvent) -> None:
        following = self.session_sequence + 1
        if e.session_sequence != following:
            _fail(
                "sequence.session.contiguous",
                f"sessionSequence {e.session_sequence} where {following} comes next",
            )

    def _check_run_sequence(self, root: str, sequence: int) -> None:
        journal = self.run_journals.get(root)
        following = (journal.sequence if journal is not None else 0) + 1
        if sequence != following:
            _fail(
                "sequence.run.contiguous",
                f"sequence {sequence} in run journal {root} where {following} comes next",
            )

    def _record_identity(self, e: AuthorityEvent) -> None:
        if self.session_id is None:
            self.session_id = e.session_id
        self.event_ids.add(e.event_id)
        self.session_sequence = e.session_sequence

    def _check_order(self, e: AuthorityEvent) -> None:
        t = e.type
        self._check_session_sequence(e)
        wp = self._workflow_position(e)
        if wp is not None:
            workflow_id, workflow_sequence = wp
            wf = self.workflows.get(workflow_id)
            if wf is not None and t == "workflow.started":
                _fail("workflow.started.once", f"workflow {workflow_id} has already started")
            if wf is None and t != "workflow.started":
                _fail("workflow.unknown", f"workflow {workflow_id} has not started")
            following = (wf.sequence if wf is not None else 0) + 1
            if workflow_sequence != following:
                _fail(
                    "sequence.workflow.contiguous",
                    f"workflowSequence {workflow_sequence} of workflow {workflow_id} "
                    f"where {following} comes next",
                )
            p = wf.pending_pause if wf is not None else None
            if p is not None and not _is_pause_for(e, p):
                _fail(
                    "interrupt.pause.consecutive",
                    f"workflow {workflow_id} owes workflow.paused for interrupt "
                    f"{p.interrupt_id} (waitId {p.wait_id}) before any other workflow event; "
                    f"got {t}",
                )
        if e.root_run_id is not None and e.run_id is not None:
            root = e.root_run_id
            journal = self.run_journals.get(root)
            starts_root = t == "run.started" and e.run_id == root
            if journal is not None and starts_root:
                _fail("run.started.once", f"run {e.run_id} has already started")
            if journal is None and not starts_root:
                _fail(
                    "run.started.root" if t == "run.started" else "run.unknown",
                    f"no run journal {root} has started in this session",
                )
            self._check_run_sequence(root, e.sequence or 0)
            p = journal.pending_pause if journal is not None else None
            if p is not None and not _is_pause_for(e, p):
                interloper = (
                    " (progress may not interleave either, §9.8)"
                    if t == "progress.recorded"
                    else ""
                )
                _fail(
                    "interrupt.pause.consecutive",
                    f"run journal {root} owes run.paused of run {p.run_id or '?'} for interrupt "
                    f"{p.interrupt_id} (waitId {p.wait_id}) next; got {t}{interloper}",
                )

    def _advance(self, e: AuthorityEvent) -> None:
        self._record_identity(e)
        wp = self._workflow_position(e)
        wf = None if wp is None else self.workflows.get(wp[0])
        if wp is not None and wf is not None:
            wf.sequence = wp[1]
            if wf.pending_pause is not None and _is_pause_for(e, wf.pending_pause):
                wf.pending_pause = None
        if e.root_run_id is not None:
            journal = self.run_journals.setdefault(e.root_run_id, RunJournal())
            journal.sequence = e.sequence or 0
            if journal.pending_pause is not None and _is_pause_for(e, journal.pending_pause):
                journal.pending_pause = None

    # --- bodies ------------------------------------------------------------

    def _apply_body(self, e: AuthorityEvent) -> Applied:
        match e.type:
            case "run.started":
                self._run_started(e)
            case "run.paused":
                self._run_paused(e)
            case "run.resumed":
                self._run_resumed(e)
            case "run.stop.requested":
                self._run_stop_requested(e)
            case "run.finished":
                return self._run_terminal(e, "finished")
            case "run.error":
                return self._run_terminal(e, "error")
            case "run.cancelled":
                return self._run_terminal(e, "cancelled")
            case "interrupt.requested":
                self._interrupt_requested(e)
            case "interrupt.resolved":
                self._interrupt_resolved(e)
            case "tool.call.started":
                self._tool_call_started(e)
            case "tool.call.finished":
                self._tool_call_finished(e)
            case "workflow.started":
                self._workflow_started(e)
            case "workflow.paused":
                self._workflow_paused(e)
            case "workflow.resumed":
                self._workflow_resumed(e)
            case "workflow.finished":
                return self._workflow_terminal(e, "finished")
            case "workflow.error":
                return self._workflow_terminal(e, "error")
            case "workflow.cancelled":
                return self._workflow_terminal(e, "cancelled")
            case "workflow.edge.taken":
                pass
            case "workflow.step.started":
                self._workflow_open(e)
            case "progress.recorded":
                run_id, run = self._run_of(e)
                if run.state in TERMINAL:
                    _fail(
                        "progress.after-terminal",
                        f"run {run_id} has ended; progress is not recorded after a terminal",
                    )
            case "run.custom" | "run.raw":
                self._placed_run(e)
            case _:
                self._content(e)
        return _NONE

    def _placed_run(self, e: AuthorityEvent) -> tuple[str, RunState] | None:
        if e.run_id is None:
            return None
        run = self.runs.get(e.run_id)
        if run is None:
            _fail("run.unknown", f"run {e.run_id} has not started")
        if run.root_run_id != e.root_run_id:
            _fail(
                "run.unknown",
                f"run {e.run_id} belongs to run journal {run.root_run_id}, "
                f"not {e.root_run_id or '?'}",
            )
        self._check_workflow_position(e, run.workflow_id, e.run_id)
        return e.run_id, run

    def _run_of(self, e: AuthorityEvent) -> tuple[str, RunState]:
        """The run of a run-tree event (its schema requires the run position)."""
        placed = self._placed_run(e)
        if placed is None:
            raise Violation("wire.invalid", f"/runId: {e.type} needs a run position", "/runId")
        return placed

    def _check_workflow_position(
        self, e: AuthorityEvent, workflow_id: str | None, run_id: str
    ) -> None:
        wp = self._workflow_position(e)
        carried = None if wp is None else wp[0]
        if carried == workflow_id:
            return
        if carried is None:
            message = (
                f"run {run_id} belongs to workflow {workflow_id}: "
                "its events carry workflowId and workflowSequence"
            )
        elif workflow_id is None:
            message = f"run {run_id} belongs to no workflow, yet the event names {carried}"
        else:
            message = f"run {run_id} belongs to workflow {workflow_id}, not {carried}"
        _fail("workflow.run.position", message)

    def _workflow_open(self, e: AuthorityEvent) -> tuple[str, WorkflowState] | None:
        wp = self._workflow_position(e)
        if wp is None:
            return None
        wf = self.workflows[wp[0]]
        if wf.state in TERMINAL:
            _fail("workflow.terminal.final", f"workflow {wp[0]} has ended; it takes no {e.type}")
        return wp[0], wf

    def _workflow_of(self, e: AuthorityEvent) -> tuple[str, WorkflowState]:
        """The open workflow of a workflow event (its schema requires the workflow position)."""
        opened = self._workflow_open(e)
        if opened is None:
            raise Violation(
                "wire.invalid", f"/workflowId: {e.type} needs a workflow position", "/workflowId"
            )
        return opened

    def _run_started(self, e: AuthorityEvent) -> None:
        run_id = e.text("runId")
        root = e.text("rootRunId")
        parent_id = e.opt_text("parentRunId")
        if run_id in self.runs:
            _fail("run.started.once", f"run {run_id} has already started")
        wp = self._workflow_position(e)
        workflow = None if wp is None else wp[0]
        if parent_id is None:
            if run_id != root:
                _fail(
                    "run.started.root",
                    f"top-level run {run_id} names rootRunId {root}; "
                    "a top-level run is its own root (or name its parentRunId)",
                )
            self._check_top_level_slot(run_id, workflow)
        else:
            if run_id == root:
                _fail("run.started.root", f"nested run {run_id} cannot be its own rootRunId")
            parent = self.runs.get(parent_id)
            if parent is None:
                _fail("run.nested.parent", f"parent run {parent_id} has not started")
            if parent.root_run_id != root:
                _fail(
                    "run.started.root",
                    f"nested run {run_id} names rootRunId {root} "
                    f"but its parent {parent_id} belongs to {parent.root_run_id}",
                )
            _no_new_work(parent_id, parent, "child runs")
            self._check_workflow_position(e, parent.workflow_id, run_id)
        executor = e.raw.get("clientExecutorId")
        self.runs[run_id] = RunState(
            root_run_id=root,
            parent_run_id=parent_id,
            workflow_id=workflow,
            client_executor_id=executor if isinstance(executor, str) else None,
        )
        if parent_id is not None:
            self.runs[parent_id].open_children.add(run_id)
        if workflow is not None:
            wf = self.workflows[workflow]
            wf.open_runs.add(run_id)
            if parent_id is None:
                wf.active_top_level_run = run_id
        elif parent_id is None:
            self.slot = RunSlot(run_id)

    def _check_top_level_slot(self, run_id: str, workflow: str | None) -> None:
        if workflow is None:
            if self.slot is not None:
                _fail(
                    "session.slot.single",
                    f"top-level run {run_id} cannot start while {_describe_slot(self.slot)} "
                    "holds the session's slot",
                )
            return
        wf = self.workflows[workflow]
        if wf.state in TERMINAL:
            _fail("workflow.terminal.final", f"workflow {workflow} has ended; it starts no runs")
        if wf.active_top_level_run is not None:
            _fail(
                "workflow.run.single-top-level",
                f"top-level run {run_id} cannot start while run {wf.active_top_level_run} "
                f"is workflow {workflow}'s active top-level run",
            )

    def _run_paused(self, e: AuthorityEvent) -> None:
        run_id, run = self._run_of(e)
        if run.state in TERMINAL:
            raise _ended(run_id, "run.paused")
        if run.state == "paused":
            wait = run.pause.wait_id if run.pause is not None else None
            _fail(
                "run.pause.single",
                f"run {run_id} is already paused (waitId {wait}); resume it first",
            )
        wait_id = e.text("waitId")
        interrupt_id = e.opt_text("interruptId")
        if interrupt_id is not None:
            i = self.interrupts.get(interrupt_id)
            ok = (
                i is not None
                and i.owner == RunOwner(run_id)
                and i.decision is None
                and i.wait_id == wait_id
            )
            if not ok:
                _fail(
                    "run.paused.interrupt",
                    f"run {run_id} pauses on interrupt {interrupt_id}, which is not an open "
                    f"interrupt of this run with waitId {wait_id}",
                )
        run.state = "paused"
        run.pause = WaitPause(wait_id, interrupt_id)

    def _run_resumed(self, e: AuthorityEvent) -> None:
        run_id, run = self._run_of(e)
        if run.state in TERMINAL:
            raise _ended(run_id, "run.resumed")
        if run.state != "paused" or run.pause is None:
            _fail("run.resume.not-paused", f"run {run_id} is not paused")
        wait_id = e.text("waitId")
        if run.pause.wait_id != wait_id:
            _fail(
                "run.resume.wait-mismatch",
                f"run {run_id} is paused on waitId {run.pause.wait_id}, not {wait_id}",
            )
        i = run.pause.interrupt_id
        if i is not None and i in run.open_interrupts:
            _fail(
                "run.resume.interrupt-open",
                f"run {run_id} waits on interrupt {i}, which is not resolved yet",
            )
        run.state = "running"
        run.pause = None

    def _run_stop_requested(self, e: AuthorityEvent) -> None:
        _, owner = self._run_of(e)
        target = e.text("targetRunId")
        t = self.runs.get(target)
        if t is not None and t.state in TERMINAL:
            _fail("run.stop.target", f"run {target} has already ended; there is nothing to stop")
        if t is None or t.root_run_id != owner.root_run_id:
            _fail(
                "run.stop.target",
                f"targetRunId {target} is not a run of run journal {owner.root_run_id}",
            )
        t.stop_requested = True

    def _run_terminal(self, e: AuthorityEvent, state: Status) -> Applied:
        run_id, run = self._run_of(e)
        if run.state in TERMINAL:
            _fail(
                "run.terminal.once",
                f"run {run_id} has already ended; {e.type} would be a second terminal",
            )
        if run.state == "paused":
            wait = run.pause.wait_id if run.pause is not None else None
            _fail(
                "run.terminal.paused",
                f"run {run_id} is paused (waitId {wait}); emit run.resumed before {e.type}",
            )
        open_work = (
            [f"child run {c}" for c in sorted(run.open_children)]
            + [f"tool call {t}" for t in sorted(run.open_tool_calls)]
            + [f"interrupt {i}" for i in sorted(run.open_interrupts)]
        )
        if open_work:
            _fail(
                "run.terminal.open-work",
                f"{e.type} of run {run_id} while it owns open work ({', '.join(open_work)}): "
                "close, cancel or fail it first",
            )
        run.state = state
        if run.parent_run_id is not None:
            self.runs[run.parent_run_id].open_children.discard(run_id)
        if run.workflow_id is not None:
            wf = self.workflows[run.workflow_id]
            wf.open_runs.discard(run_id)
            if wf.active_top_level_run == run_id:
                wf.active_top_level_run = None
        frees = self.slot == RunSlot(run_id)
        if frees:
            self.slot = None
        return Applied(slot_freed=frees)

    def _interrupt_requested(self, e: AuthorityEvent) -> None:
        interrupt_id = e.text("interruptId")
        if interrupt_id in self.interrupts:
            _fail("interrupt.id.unique", f"interrupt {interrupt_id} was already requested")
        blocking = e.raw.get("blocking") is not False
        wait_id = e.text("waitId")
        owner: Owner
        placed = self._placed_run(e)
        if placed is not None:
            run_id, run = placed
            if run.state in TERMINAL:
                raise _ended(run_id, "interrupt.requested")
            if blocking:
                _no_open_blocking(run.open_interrupts, f"run {run_id}")
                if run.state == "paused":
                    _fail(
                        "interrupt.requested.running",
                        f"run {run_id} is paused; "
                        "a blocking interrupt needs a running run to pause",
                    )
            owner = RunOwner(run_id)
        else:
            w, wf = self._workflow_of(e)
            if blocking:
                _no_open_blocking(wf.open_interrupts, f"workflow {w}")
                if wf.state == "paused":
                    _fail(
                        "interrupt.requested.running",
                        f"workflow {w} is paused; "
                        "a blocking interrupt needs a running workflow to pause",
                    )
            owner = WorkflowOwner(w)
        members: list[str] = []
        given = e.raw.get("input")
        listed = given.get("members") if isinstance(given, Mapping) else None
        if isinstance(listed, list):
            for m in listed:
                request_id = m.get("requestId") if isinstance(m, Mapping) else None
                if isinstance(request_id, str):
                    members.append(request_id)
        actions = e.raw.get("actions")
        if isinstance(owner, RunOwner):
            run = self.runs[owner.run_id]
            run.open_interrupts[interrupt_id] = blocking
            if blocking:
                self.run_journals[run.root_run_id].pending_pause = PendingPause(
                    interrupt_id, wait_id, owner.run_id
                )
        else:
            wf = self.workflows[owner.workflow_id]
            wf.open_interrupts[interrupt_id] = blocking
            if blocking:
                wf.pending_pause = PendingPause(interrupt_id, wait_id)
        self.interrupts[interrupt_id] = InterruptState(
            owner=owner,
            wait_id=wait_id,
            actions=[a for a in actions if isinstance(a, str)] if isinstance(actions, list) else [],
            blocking=blocking,
            members=members,
        )

    def _interrupt_resolved(self, e: AuthorityEvent) -> None:
        interrupt_id = e.text("interruptId")
        req = self.interrupts.get(interrupt_id)
        if req is None:
            _fail("interrupt.unknown", f"interrupt {interrupt_id} was never requested")
        if req.decision is not None:
            _fail(
                "interrupt.resolved.once",
                f"interrupt {interrupt_id} was already resolved with decision "
                f"{_dumps(req.decision)}",
            )
        wait_id = e.text("waitId")
        if req.wait_id != wait_id:
            _fail(
                "interrupt.resolved.wait-mismatch",
                f"interrupt {interrupt_id} belongs to waitId {req.wait_id}, not {wait_id}",
            )
        placed_run = self._placed_run(e)
        placed = None if placed_run is None else placed_run[0]
        if isinstance(req.owner, RunOwner):
            in_owner = placed == req.owner.run_id
        else:
            wp = self._workflow_position(e)
            in_owner = placed is None and wp is not None and wp[0] == req.owner.workflow_id
        if not in_owner:
            _fail(
                "interrupt.resolved.owner",
                f"interrupt {interrupt_id} belongs to {_describe_owner(req.owner)}; "
                "resolve it in that journal",
            )
        decision = e.text("decision")
        actions = req.actions

        def allowed(d: str) -> bool:
            return d == "expired" or d in actions

        if not allowed(decision):
            _fail(
                "interrupt.decision.allowed",
                f"decision {_dumps(decision)} is not among interrupt {interrupt_id}'s actions "
                f"{_dumps(actions)} (or expired)",
            )
        raw_members = e.raw.get("members")
        if isinstance(raw_members, list):
            members = [
                (str(m.get("requestId")), str(m.get("decision")))
                for m in raw_members
                if isinstance(m, Mapping)
            ]
            for request_id, d in members:
                if not allowed(d):
                    _fail(
                        "interrupt.members.decision",
                        f"member {request_id} decided {_dumps(d)}, which is not among the actions "
                        f"{_dumps(actions)} (or expired)",
                    )
            given = [r for r, _ in members]
            unique = set(given)
            listed = set(req.members)
            if len(unique) != len(given) or unique != listed:
                _fail(
                    "interrupt.members.match",
                    f"members {_dumps(given)} do not match, one each, the members the request "
                    f"listed {_dumps(req.members)}",
                )
            fold = fold_members([d for _, d in members])
            if fold != decision:
                _fail(
                    "interrupt.members.fold",
                    f"the members fold to {_dumps(fold)} (stop wins; else all approve; "
                    f"else all expired; otherwise deny), not {_dumps(decision)}",
                )
        req.decision = decision
        if isinstance(req.owner, RunOwner):
            self.runs[req.owner.run_id].open_interrupts.pop(interrupt_id, None)
        else:
            self.workflows[req.owner.workflow_id].open_interrupts.pop(interrupt_id, None)

    def _tool_call_started(self, e: AuthorityEvent) -> None:
        run_id, run = self._run_of(e)
        call_id = e.text("toolCallId")
        if call_id in self.tool_calls:
            _fail(
                "tool.call.id.unique",
                f"tool call {call_id} was already started; a retry uses a new toolCallId",
            )
        _no_new_work(run_id, run, "tool calls")
        executor = e.text("executor")
        if executor == "client" and run.client_executor_id is None:
            _fail(
                "tool.client.unbound",
                f"run {run_id} has no clientExecutorId of its own, "
                f"so it cannot start client tool call {call_id}",
            )
        run.open_tool_calls.add(call_id)
        self.tool_calls[call_id] = ToolCallState(run_id, e.text("toolName"), executor)

    def _tool_call_finished(self, e: AuthorityEvent) -> None:
        run_id, _ = self._run_of(e)
        call_id = e.text("toolCallId")
        call = self.tool_calls.get(call_id)
        if call is None:
            _fail("tool.call.unknown", f"tool call {call_id} was never started")
        if call.outcome is not None:
            _fail(
                "tool.call.finished.once", f"tool call {call_id} already finished ({call.outcome})"
            )
        if call.run_id != run_id:
            _fail(
                "tool.call.owner", f"tool call {call_id} belongs to run {call.run_id}, not {run_id}"
            )
        call.outcome = e.text("outcome")
        self.runs[call.run_id].open_tool_calls.discard(call_id)

    def _workflow_started(self, e: AuthorityEvent) -> None:
        w = e.text("workflowId")
        if self.slot is not None:
            _fail(
                "session.slot.single",
                f"workflow {w} cannot start while {_describe_slot(self.slot)} "
                "holds the session's slot",
            )
        self.workflows[w] = WorkflowState()
        self.slot = WorkflowSlot(w)

    def _workflow_paused(self, e: AuthorityEvent) -> None:
        w, wf = self._workflow_of(e)
        if wf.state == "paused":
            wait = wf.pause.wait_id if wf.pause is not None else None
            _fail("workflow.pause.single", f"workflow {w} is already paused (waitId {wait})")
        interrupt_id = e.text("interruptId")
        wait_id = e.text("waitId")
        i = self.interrupts.get(interrupt_id)
        ok = (
            i is not None
            and i.owner == WorkflowOwner(w)
            and i.decision is None
            and i.wait_id == wait_id
        )
        if not ok:
            _fail(
                "workflow.paused.interrupt",
                f"workflow {w} pauses on interrupt {interrupt_id}, which is not an open "
                f"interrupt of this workflow with waitId {wait_id}",
            )
        wf.state = "paused"
        wf.pause = WaitPause(wait_id, interrupt_id)

    def _workflow_resumed(self, e: AuthorityEvent) -> None:
        w, wf = self._workflow_of(e)
        if wf.state != "paused" or wf.pause is None:
            _fail("workflow.resume.not-paused", f"workflow {w} is not paused")
        wait_id = e.text("waitId")
        i = wf.pause.interrupt_id
        interrupt_open = i is not None and i in wf.open_interrupts
        if wf.pause.wait_id != wait_id or interrupt_open:
            unresolved = " and its interrupt is unresolved" if interrupt_open else ""
            _fail(
                "workflow.resume.wait-mismatch",
                f"workflow {w} is paused on waitId {wf.pause.wait_id}{unresolved}; "
                f"resumed with {wait_id}",
            )
        wf.state = "running"
        wf.pause = None

    def _workflow_terminal(self, e: AuthorityEvent, state: Status) -> Applied:
        w = e.text("workflowId")
        wf = self.workflows[w]
        if wf.state in TERMINAL:
            _fail(
                "workflow.terminal.once",
                f"workflow {w} has already ended; {e.type} would be a second terminal",
            )
        if wf.state == "paused":
            wait = wf.pause.wait_id if wf.pause is not None else None
            _fail(
                "workflow.terminal.paused",
                f"workflow {w} is paused (waitId {wait}); resume it before {e.type}",
            )
        open_work = [f"run {r}" for r in sorted(wf.open_runs)] + [
            f"interrupt {i}" for i in sorted(wf.open_interrupts)
        ]
        if open_work:
            _fail(
                "workflow.terminal.open-work",
                f"{e.type} of workflow {w} while {', '.join(open_work)} is open",
            )
        wf.state = state
        frees = self.slot == WorkflowSlot(w)
        if frees:
            self.slot = None
        return Applied(slot_freed=frees)

    def _content(self, e: AuthorityEvent) -> None:
        placed_run = self._placed_run(e)
        if placed_run is None and e.type not in ("workflow.custom", "workflow.raw"):
            self._workflow_open(e)
        if placed_run is not None and placed_run[1].state in TERMINAL and e.type in _STREAMED:
            raise _ended(placed_run[0], e.type)
        placed = _Placed(e.run_id, e.workflow_id)
        match e.type:
            case "message.user.recorded":
                self._new_message(e.text("messageId"), placed, completed=True)
            case "message.text.started":
                self._new_message(e.text("messageId"), placed, completed=False)
            case "message.text.delta":
                self._message_step(e.text("messageId"), placed, completes=False)
            case "message.text.completed":
                self._message_step(e.text("messageId"), placed, completes=True)
            case "reasoning.started":
                reasoning_id = e.text("reasoningId")
                if reasoning_id in self._reasoning:
                    _fail("reasoning.id.unique", f"reasoning {reasoning_id} was already started")
                self._reasoning[reasoning_id] = _Stream(placed, completed=False)
            case "reasoning.delta" | "reasoning.completed":
                reasoning_id = e.text("reasoningId")
                r = self._reasoning.get(reasoning_id)
                if r is None:
                    _fail("reasoning.not-started", f"reasoning {reasoning_id} has not started")
                if r.completed:
                    _fail(
                        "reasoning.completed.final", f"reasoning {reasoning_id} is already complete"
                    )
                if e.type == "reasoning.completed":
                    r.completed = True
            case "message.redacted":
                message_id = e.text("messageId")
                if message_id not in self._messages:
                    _fail("message.unknown", f"message {message_id} was never recorded or started")
            case "attachment.added":
                attachment_id = e.text("attachmentId")
                if attachment_id in self._attachments:
                    _fail("attachment.id.unique", f"attachment {attachment_id} was already added")
                self._attachments[attachment_id] = True
            case "attachment.ready" | "attachment.failed" | "attachment.removed":
                attachment_id = e.text("attachmentId")
                present = self._attachments.get(attachment_id)
                if present is None:
                    _fail("attachment.unknown", f"attachment {attachment_id} was never added")
                if present is False:
                    _fail("attachment.unknown", f"attachment {attachment_id} was removed")
                if e.type == "attachment.removed":
                    self._attachments[attachment_id] = False
            case "artifact.added":
                artifact_id = e.text("artifactId")
                if artifact_id in self._artifacts:
                    _fail("artifact.id.unique", f"artifact {artifact_id} was already added")
                self._artifacts.add(artifact_id)
            case "artifact.ready" | "artifact.failed":
                artifact_id = e.text("artifactId")
                if artifact_id not in self._artifacts:
                    _fail("artifact.unknown", f"artifact {artifact_id} was never added")
            case "state.snapshot":
                self._snapshot(self.documents["state"], e)
            case "ui.state.snapshot":
                self._snapshot(self.documents["ui"], e)
            case "state.delta":
                self._delta(self.documents["state"], e)
            case "ui.state.delta":
                self._delta(self.documents["ui"], e)
            case "state.compacted":
                scope = e.text("scope")
                doc = self.documents["state"].get(scope)
                revision = doc.revision if doc is not None else 0
                snapshot_revision = e.integer("snapshotRevision")
                covers = e.integer("coversThroughSessionSequence")
                if snapshot_revision > revision or covers >= e.session_sequence:
                    _fail(
                        "state.compacted.bounds",
                        f"compaction of {scope} to revision {snapshot_revision} through "
                        f"sessionSequence {covers} must stay within revision {revision} "
                        f"and before sessionSequence {e.session_sequence}",
                    )
            case "view.opened":
                view_id = e.text("viewId")
                if view_id in self.views:
                    _fail("view.id.unique", f"view {view_id} was already opened")
                state = e.json("state")
                self.views[view_id] = ViewState(open=True, state={} if state is None else state)
            case "view.updated":
                view = self._open_view(e.text("viewId"))
                if e.raw.get("operation") == "patch":
                    view.state = _patched(
                        view.state, e.patch(), "view.patch.applies", "the view's state"
                    )
                else:
                    view.state = e.json("state")
            case "view.closed":
                self._open_view(e.text("viewId")).open = False
            case _:
                pass

    def _new_message(self, message_id: str, placed: _Placed, *, completed: bool) -> None:
        if message_id in self._messages:
            _fail("message.id.unique", f"message {message_id} was already recorded or started")
        self._messages[message_id] = _Stream(placed, completed)

    def _message_step(self, message_id: str, placed: _Placed, *, completes: bool) -> None:
        m = self._messages.get(message_id)
        if m is None:
            _fail("message.text.not-started", f"message {message_id} has not started")
        if m.completed:
            _fail("message.text.completed.final", f"message {message_id} is already complete")
        if m.placed != placed:
            _fail(
                "message.scope.match",
                f"message {message_id} started in {_describe_placed(m.placed)}; "
                "its events carry the same ordering fields",
            )
        if completes:
            m.completed = True

    @staticmethod
    def _snapshot(docs: dict[str, DocumentState], e: AuthorityEvent) -> None:
        scope = e.text("scope")
        revision = e.integer("revision")
        held = docs.get(scope)
        current = held.revision if held is not None else 0
        if revision < current:
            _fail(
                "state.revision.regress",
                f"snapshot revision {revision} of {scope} is below its current revision {current}",
            )
        docs[scope] = DocumentState(revision, e.json("state"))

    @staticmethod
    def _delta(docs: dict[str, DocumentState], e: AuthorityEvent) -> None:
        scope = e.text("scope")
        revision = e.integer("revision")
        base = e.integer("baseRevision")
        if revision != base + 1:
            _fail(
                "state.revision.contiguous",
                f"revision {revision} follows baseRevision {base}; it must be {base + 1}",
            )
        doc = docs.get(scope) or DocumentState(0, {})
        if base != doc.revision:
            _fail(
                "state.revision.base",
                f"baseRevision {base} of {scope}, whose current revision is {doc.revision}",
            )
        docs[scope] = DocumentState(
            revision, _patched(doc.state, e.patch(), "state.patch.applies", scope)
        )

    def _open_view(self, view_id: str) -> ViewState:
        v = self.views.get(view_id)
        if v is None:
            _fail("view.unknown", f"view {view_id} was never opened")
        if not v.open:
            _fail("view.unknown", f"view {view_id} is closed")
        return v


def _is_pause_for(e: AuthorityEvent, p: PendingPause) -> bool:
    if e.type == "run.paused":
        return (
            p.run_id == e.run_id
            and e.raw.get("waitId") == p.wait_id
            and e.raw.get("interruptId") == p.interrupt_id
        )
    if e.type == "workflow.paused":
        return (
            p.run_id is None
            and e.raw.get("waitId") == p.wait_id
            and e.raw.get("interruptId") == p.interrupt_id
        )
    return False


def _no_new_work(run_id: str, run: RunState, what: str) -> None:
    if run.state in TERMINAL:
        raise _ended(run_id, what)
    if run.state == "paused":
        _fail(
            "run.paused.no-new-work",
            f"run {run_id} is paused; it starts no {what} until it resumes",
        )
    if run.stop_requested:
        _fail("run.stop.no-new-work", f"run {run_id} was asked to stop; it starts no new {what}")


def _no_open_blocking(open_interrupts: Mapping[str, bool], who: str) -> None:
    blocking = sorted(i for i, b in open_interrupts.items() if b)
    if blocking:
        _fail("interrupt.single-open", f"{who} already has open blocking interrupt {blocking[0]}")


def _ended(run_id: str, what: str) -> Violation:
    return Violation("run.terminal.final", f"run {run_id} has ended; it takes no {what}")


def _patched(state: Json, patch: Sequence[PatchOperation], rule: str, what: str) -> Json:
    try:
        return apply_patch(state, patch)
    except PatchError as e:
        _fail(rule, f"the patch does not apply to {what}: {e}")


def _describe_slot(slot: Slot) -> str:
    return f"run {slot.run_id}" if isinstance(slot, RunSlot) else f"workflow {slot.workflow_id}"


def _describe_owner(owner: Owner) -> str:
    return f"run {owner.run_id}" if isinstance(owner, RunOwner) else f"workflow {owner.workflow_id}"


def _describe_placed(p: _Placed) -> str:
    if p.run_id is not None:
        return f"run {p.run_id}"
    if p.workflow_id is not None:
        return f"workflow {p.workflow_id}"
    return "the session"
