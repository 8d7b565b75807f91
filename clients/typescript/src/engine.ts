/**
 * The lifecycle rules of narad/v1 (`docs/rules.md`) over one session's
 * authority: the same rules, ids and readings as the server's rule engine,
 * so that a client validates what it reduces (§13). The `issuer.*` rules
 * are not here: who may write what is known only to the server that
 * journals an event.
 */
import { applyPatch, type Json, type PatchOperation, PatchError } from "./jsonpatch.js";
import { type ProfileId, Violation, type WireObject, WIRE_TYPE_INFO } from "./wire.js";

/** A run's or workflow's state. */
export type Status = "running" | "paused" | "finished" | "error" | "cancelled";

const TERMINAL: ReadonlySet<Status> = new Set(["finished", "error", "cancelled"]);

/** One run of the session. */
export interface RunState {
  rootRunId: string;
  parentRunId?: string;
  workflowId?: string;
  clientExecutorId?: string;
  state: Status;
  /** The open pause: its waitId and the interrupt it waits on. */
  pause?: { waitId: string; interruptId?: string };
  stopRequested: boolean;
  openChildren: Set<string>;
  openToolCalls: Set<string>;
  /** Open interrupts of the run: interruptId → blocking. */
  openInterrupts: Map<string, boolean>;
}

/** One workflow of the session. */
export interface WorkflowState {
  sequence: number;
  state: Status;
  pause?: { waitId: string; interruptId?: string };
  activeTopLevelRun?: string;
  openRuns: Set<string>;
  openInterrupts: Map<string, boolean>;
  pendingPause?: PendingPause;
}

/** The pause a blocking interrupt owes next in its journal (§7.6). */
export interface PendingPause {
  runId?: string;
  interruptId: string;
  waitId: string;
}

/** Who owns an interrupt. */
export type Owner = { scope: "run"; runId: string } | { scope: "workflow"; workflowId: string };

/** One interrupt of the session. */
export interface InterruptState {
  owner: Owner;
  waitId: string;
  actions: string[];
  blocking: boolean;
  members: string[];
  decision?: string;
}

/** One tool call of the session. */
export interface ToolCallState {
  runId: string;
  toolName: string;
  executor: string;
  outcome?: string;
}

/** A state or UI document. */
export interface DocumentState {
  revision: number;
  state: Json;
}

/** A view. */
export interface ViewState {
  open: boolean;
  state: Json;
}

/** The session's active top-level execution. */
export type Slot = { kind: "run"; runId: string } | { kind: "workflow"; workflowId: string };

/** An authority event, as it travels. */
export interface AuthorityEvent extends WireObject {
  readonly eventId: string;
  readonly sessionId: string;
  readonly sessionSequence: number;
  readonly rootRunId?: string;
  readonly runId?: string;
  readonly sequence?: number;
  readonly workflowId?: string;
  readonly workflowSequence?: number;
}

interface Placed {
  runId: string | undefined;
  workflowId: string | undefined;
}

interface StreamState {
  placed: Placed;
  completed: boolean;
}

/** The pack fold of §7.7: stop wins; else all approve; else all expired; otherwise deny. */
export function foldMembers(decisions: readonly string[]): string {
  if (decisions.includes("stop")) return "stop";
  if (decisions.every((d) => d === "approve")) return "approve";
  if (decisions.every((d) => d === "expired")) return "expired";
  return "deny";
}

const fail = (rule: string, message: string): never => {
  throw new Violation(rule, message);
};

const str = (e: AuthorityEvent, member: string): string => e[member] as string;

/** The lifecycle state of one session journal, and the rules over it. */
export class SessionState {
  readonly profiles: ReadonlySet<ProfileId>;
  sessionId: string | undefined;
  sessionSequence = 0;
  readonly eventIds = new Set<string>();
  slot: Slot | undefined;
  readonly runs = new Map<string, RunState>();
  /** Run journals by rootRunId: the last sequence and the pause owed next. */
  readonly runJournals = new Map<string, { sequence: number; pendingPause?: PendingPause }>();
  readonly workflows = new Map<string, WorkflowState>();
  readonly interrupts = new Map<string, InterruptState>();
  readonly toolCalls = new Map<string, ToolCallState>();
  readonly documents = { state: new Map<string, DocumentState>(), ui: new Map<string, DocumentState>() };
  readonly views = new Map<string, ViewState>();
  private readonly messages = new Map<string, StreamState>();
  private readonly reasoning = new Map<string, StreamState>();
  private readonly attachments = new Map<string, boolean>();
  private readonly artifacts = new Set<string>();

  constructor(profiles: ReadonlySet<ProfileId>) {
    this.profiles = profiles;
  }

  /** Whether the event lies outside the negotiated profiles (it is then only accounted for). */
  isOutsideProfiles(e: AuthorityEvent): boolean {
    const info = WIRE_TYPE_INFO[e.type];
    return (
      info === undefined ||
      !this.profiles.has(info.profile) ||
      (!this.profiles.has("narad.workflow/v1") && e.runId === undefined && e.workflowId !== undefined)
    );
  }

  /** Accounts for an event outside the negotiated profiles: its identity and sequences only. */
  skip(e: AuthorityEvent): void {
    this.at(e, () => {
      this.checkIdentity(e);
      this.checkSessionSequence(e);
      if (e.rootRunId !== undefined && this.runJournals.has(e.rootRunId)) {
        this.checkRunSequence(e.rootRunId, e.sequence ?? 0);
      }
    });
    this.recordIdentity(e);
    const journal = e.rootRunId === undefined ? undefined : this.runJournals.get(e.rootRunId);
    if (journal !== undefined) journal.sequence = e.sequence ?? 0;
  }

  /** Applies the next event of the journal, or throws the {@link Violation} it commits. */
  apply(e: AuthorityEvent): { slotFreed: boolean } {
    let applied = { slotFreed: false };
    this.at(e, () => {
      this.checkIdentity(e);
      this.checkOrder(e);
      applied = this.applyBody(e);
    });
    this.advance(e);
    return applied;
  }

  private at(e: AuthorityEvent, f: () => void): void {
    try {
      f();
    } catch (err) {
      if (err instanceof Violation) err.eventId = e.eventId;
      throw err;
    }
  }

  private workflowPosition(e: AuthorityEvent): { workflowId: string; workflowSequence: number } | undefined {
    return this.profiles.has("narad.workflow/v1") && e.workflowId !== undefined
      ? { workflowId: e.workflowId, workflowSequence: e.workflowSequence ?? 0 }
      : undefined;
  }

  private checkIdentity(e: AuthorityEvent): void {
    if (this.sessionId !== undefined && this.sessionId !== e.sessionId) {
      fail("event.session", `the event names session ${e.sessionId} but this journal is session ${this.sessionId}`);
    }
    if (this.eventIds.has(e.eventId)) {
      fail("event.id.unique", `eventId ${e.eventId} was already used in this session; a new fact needs a new id`);
    }
  }

  private checkSessionSequence(e: AuthorityEvent): void {
    const next = this.sessionSequence + 1;
    if (e.sessionSequence !== next) {
      fail("sequence.session.contiguous", `sessionSequence ${e.sessionSequence} where ${next} comes next`);
    }
  }

  private checkRunSequence(root: string, sequence: number): void {
    const next = (this.runJournals.get(root)?.sequence ?? 0) + 1;
    if (sequence !== next) {
      fail("sequence.run.contiguous", `sequence ${sequence} in run journal ${root} where ${next} comes next`);
    }
  }

  private recordIdentity(e: AuthorityEvent): void {
    this.sessionId ??= e.sessionId;
    this.eventIds.add(e.eventId);
    this.sessionSequence = e.sessionSequence;
  }

  private checkOrder(e: AuthorityEvent): void {
    const t = e.type;
    this.checkSessionSequence(e);
    const wp = this.workflowPosition(e);
    if (wp !== undefined) {
      const wf = this.workflows.get(wp.workflowId);
      if (wf !== undefined && t === "workflow.started") {
        fail("workflow.started.once", `workflow ${wp.workflowId} has already started`);
      }
      if (wf === undefined && t !== "workflow.started") {
        fail("workflow.unknown", `workflow ${wp.workflowId} has not started`);
      }
      const next = (wf?.sequence ?? 0) + 1;
      if (wp.workflowSequence !== next) {
        fail(
          "sequence.workflow.contiguous",
          `workflowSequence ${wp.workflowSequence} of workflow ${wp.workflowId} where ${next} comes next`,
        );
      }
      const p = wf?.pendingPause;
      if (p !== undefined && !isPauseFor(e, p)) {
        fail(
          "interrupt.pause.consecutive",
          `workflow ${wp.workflowId} owes workflow.paused for interrupt ${p.interruptId} (waitId ${p.waitId}) before any other workflow event; got ${t}`,
        );
      }
    }
    if (e.rootRunId !== undefined && e.runId !== undefined) {
      const root = e.rootRunId;
      const journal = this.runJournals.get(root);
      const startsRoot = t === "run.started" && e.runId === root;
      if (journal !== undefined && startsRoot) fail("run.started.once", `run ${e.runId} has already started`);
      if (journal === undefined && !startsRoot) {
        fail(
          t === "run.started" ? "run.started.root" : "run.unknown",
          `no run journal ${root} has started in this session`,
        );
      }
      this.checkRunSequence(root, e.sequence ?? 0);
      const p = journal?.pendingPause;
      if (p !== undefined && !isPauseFor(e, p)) {
        const interloper = t === "progress.recorded" ? " (progress may not interleave either, §9.8)" : "";
        fail(
          "interrupt.pause.consecutive",
          `run journal ${root} owes run.paused of run ${p.runId ?? "?"} for interrupt ${p.interruptId} (waitId ${p.waitId}) next; got ${t}${interloper}`,
        );
      }
    }
  }

  private advance(e: AuthorityEvent): void {
    this.recordIdentity(e);
    const wp = this.workflowPosition(e);
    const wf = wp === undefined ? undefined : this.workflows.get(wp.workflowId);
    if (wp !== undefined && wf !== undefined) {
      wf.sequence = wp.workflowSequence;
      if (wf.pendingPause !== undefined && isPauseFor(e, wf.pendingPause)) delete wf.pendingPause;
    }
    if (e.rootRunId !== undefined) {
      let journal = this.runJournals.get(e.rootRunId);
      if (journal === undefined) {
        journal = { sequence: 0 };
        this.runJournals.set(e.rootRunId, journal);
      }
      journal.sequence = e.sequence ?? 0;
      if (journal.pendingPause !== undefined && isPauseFor(e, journal.pendingPause)) delete journal.pendingPause;
    }
  }

  private applyBody(e: AuthorityEvent): { slotFreed: boolean } {
    const none = { slotFreed: false };
    switch (e.type) {
      case "run.started":
        this.runStarted(e);
        return none;
      case "run.paused":
        this.runPaused(e);
        return none;
      case "run.resumed":
        this.runResumed(e);
        return none;
      case "run.stop.requested":
        this.runStopRequested(e);
        return none;
      case "run.finished":
        return this.runTerminal(e, "finished");
      case "run.error":
        return this.runTerminal(e, "error");
      case "run.cancelled":
        return this.runTerminal(e, "cancelled");
      case "interrupt.requested":
        this.interruptRequested(e);
        return none;
      case "interrupt.resolved":
        this.interruptResolved(e);
        return none;
      case "tool.call.started":
        this.toolCallStarted(e);
        return none;
      case "tool.call.finished":
        this.toolCallFinished(e);
        return none;
      case "workflow.started":
        this.workflowStarted(e);
        return none;
      case "workflow.paused":
        this.workflowPaused(e);
        return none;
      case "workflow.resumed":
        this.workflowResumed(e);
        return none;
      case "workflow.finished":
        return this.workflowTerminal(e, "finished");
      case "workflow.error":
        return this.workflowTerminal(e, "error");
      case "workflow.cancelled":
        return this.workflowTerminal(e, "cancelled");
      case "workflow.edge.taken":
        return none;
      case "workflow.step.started":
        this.workflowOpen(e);
        return none;
      case "progress.recorded": {
        const [runId, run] = this.placedRun(e)!;
        if (TERMINAL.has(run.state)) {
          fail("progress.after-terminal", `run ${runId} has ended; progress is not recorded after a terminal`);
        }
        return none;
      }
      case "run.custom":
      case "run.raw":
        this.placedRun(e);
        return none;
      default:
        this.content(e);
        return none;
    }
  }

  private placedRun(e: AuthorityEvent): [string, RunState] | undefined {
    if (e.runId === undefined) return undefined;
    const run = this.runs.get(e.runId);
    if (run === undefined) return fail("run.unknown", `run ${e.runId} has not started`);
    if (run.rootRunId !== e.rootRunId) {
      fail("run.unknown", `run ${e.runId} belongs to run journal ${run.rootRunId}, not ${e.rootRunId ?? "?"}`);
    }
    this.checkWorkflowPosition(e, run.workflowId, e.runId);
    return [e.runId, run];
  }

  private checkWorkflowPosition(e: AuthorityEvent, workflowId: string | undefined, runId: string): void {
    const carried = this.workflowPosition(e)?.workflowId;
    if (carried === workflowId) return;
    const message =
      carried === undefined
        ? `run ${runId} belongs to workflow ${workflowId}: its events carry workflowId and workflowSequence`
        : workflowId === undefined
          ? `run ${runId} belongs to no workflow, yet the event names ${carried}`
          : `run ${runId} belongs to workflow ${workflowId}, not ${carried}`;
    fail("workflow.run.position", message);
  }

  private workflowOpen(e: AuthorityEvent): [string, WorkflowState] | undefined {
    const wp = this.workflowPosition(e);
    if (wp === undefined) return undefined;
    const wf = this.workflows.get(wp.workflowId)!;
    if (TERMINAL.has(wf.state)) fail("workflow.terminal.final", `workflow ${wp.workflowId} has ended; it takes no ${e.type}`);
    return [wp.workflowId, wf];
  }

  private run(runId: string): RunState {
    return this.runs.get(runId)!;
  }

  private runStarted(e: AuthorityEvent): void {
    const runId = e.runId!;
    const root = e.rootRunId!;
    const parentId = e.parentRunId as string | undefined;
    if (this.runs.has(runId)) fail("run.started.once", `run ${runId} has already started`);
    const workflow = this.workflowPosition(e)?.workflowId;
    if (parentId === undefined) {
      if (runId !== root) {
        fail(
          "run.started.root",
          `top-level run ${runId} names rootRunId ${root}; a top-level run is its own root (or name its parentRunId)`,
        );
      }
      this.checkTopLevelSlot(runId, workflow);
    } else {
      if (runId === root) fail("run.started.root", `nested run ${runId} cannot be its own rootRunId`);
      const parent = this.runs.get(parentId);
      if (parent === undefined) return fail("run.nested.parent", `parent run ${parentId} has not started`);
      if (parent.rootRunId !== root) {
        fail(
          "run.started.root",
          `nested run ${runId} names rootRunId ${root} but its parent ${parentId} belongs to ${parent.rootRunId}`,
        );
      }
      noNewWork(parentId, parent, "child runs");
      this.checkWorkflowPosition(e, parent.workflowId, runId);
    }
    const run: RunState = {
      rootRunId: root,
      state: "running",
      stopRequested: false,
      openChildren: new Set(),
      openToolCalls: new Set(),
      openInterrupts: new Map(),
    };
    if (parentId !== undefined) run.parentRunId = parentId;
    if (workflow !== undefined) run.workflowId = workflow;
    if (typeof e.clientExecutorId === "string") run.clientExecutorId = e.clientExecutorId;
    this.runs.set(runId, run);
    if (parentId !== undefined) this.run(parentId).openChildren.add(runId);
    if (workflow !== undefined) {
      const wf = this.workflows.get(workflow)!;
      wf.openRuns.add(runId);
      if (parentId === undefined) wf.activeTopLevelRun = runId;
    } else if (parentId === undefined) {
      this.slot = { kind: "run", runId };
    }
  }

  private checkTopLevelSlot(runId: string, workflow: string | undefined): void {
    if (workflow === undefined) {
      if (this.slot !== undefined) {
        fail("session.slot.single", `top-level run ${runId} cannot start while ${describeSlot(this.slot)} holds the session's slot`);
      }
      return;
    }
    const wf = this.workflows.get(workflow)!;
    if (TERMINAL.has(wf.state)) fail("workflow.terminal.final", `workflow ${workflow} has ended; it starts no runs`);
    if (wf.activeTopLevelRun !== undefined) {
      fail(
        "workflow.run.single-top-level",
        `top-level run ${runId} cannot start while run ${wf.activeTopLevelRun} is workflow ${workflow}'s active top-level run`,
      );
    }
  }

  private runPaused(e: AuthorityEvent): void {
    const [runId, run] = this.placedRun(e)!;
    if (TERMINAL.has(run.state)) throw ended(runId, "run.paused");
    if (run.state === "paused") {
      fail("run.pause.single", `run ${runId} is already paused (waitId ${run.pause?.waitId}); resume it first`);
    }
    const waitId = str(e, "waitId");
    const interruptId = e.interruptId as string | undefined;
    if (interruptId !== undefined) {
      const i = this.interrupts.get(interruptId);
      const ok = i !== undefined && i.owner.scope === "run" && i.owner.runId === runId && i.decision === undefined && i.waitId === waitId;
      if (!ok) {
        fail(
          "run.paused.interrupt",
          `run ${runId} pauses on interrupt ${interruptId}, which is not an open interrupt of this run with waitId ${waitId}`,
        );
      }
    }
    run.state = "paused";
    run.pause = interruptId === undefined ? { waitId } : { waitId, interruptId };
  }

  private runResumed(e: AuthorityEvent): void {
    const [runId, run] = this.placedRun(e)!;
    if (TERMINAL.has(run.state)) throw ended(runId, "run.resumed");
    if (run.state !== "paused" || run.pause === undefined) return fail("run.resume.not-paused", `run ${runId} is not paused`);
    const waitId = str(e, "waitId");
    if (run.pause.waitId !== waitId) {
      fail("run.resume.wait-mismatch", `run ${runId} is paused on waitId ${run.pause.waitId}, not ${waitId}`);
    }
    const i = run.pause.interruptId;
    if (i !== undefined && run.openInterrupts.has(i)) {
      fail("run.resume.interrupt-open", `run ${runId} waits on interrupt ${i}, which is not resolved yet`);
    }
    run.state = "running";
    delete run.pause;
  }

  private runStopRequested(e: AuthorityEvent): void {
    const [, owner] = this.placedRun(e)!;
    const target = str(e, "targetRunId");
    const t = this.runs.get(target);
    if (t !== undefined && TERMINAL.has(t.state)) {
      fail("run.stop.target", `run ${target} has already ended; there is nothing to stop`);
    }
    if (t === undefined || t.rootRunId !== owner.rootRunId) {
      return fail("run.stop.target", `targetRunId ${target} is not a run of run journal ${owner.rootRunId}`);
    }
    t.stopRequested = true;
  }

  private runTerminal(e: AuthorityEvent, state: Status): { slotFreed: boolean } {
    const [runId, run] = this.placedRun(e)!;
    if (TERMINAL.has(run.state)) {
      fail("run.terminal.once", `run ${runId} has already ended; ${e.type} would be a second terminal`);
    }
    if (run.state === "paused") {
      fail("run.terminal.paused", `run ${runId} is paused (waitId ${run.pause?.waitId}); emit run.resumed before ${e.type}`);
    }
    const open = [
      ...[...run.openChildren].sort().map((c) => `child run ${c}`),
      ...[...run.openToolCalls].sort().map((t) => `tool call ${t}`),
      ...[...run.openInterrupts.keys()].sort().map((i) => `interrupt ${i}`),
    ];
    if (open.length > 0) {
      fail(
        "run.terminal.open-work",
        `${e.type} of run ${runId} while it owns open work (${open.join(", ")}): close, cancel or fail it first`,
      );
    }
    run.state = state;
    if (run.parentRunId !== undefined) this.run(run.parentRunId).openChildren.delete(runId);
    if (run.workflowId !== undefined) {
      const wf = this.workflows.get(run.workflowId)!;
      wf.openRuns.delete(runId);
      if (wf.activeTopLevelRun === runId) delete wf.activeTopLevelRun;
    }
    const frees = this.slot?.kind === "run" && this.slot.runId === runId;
    if (frees) this.slot = undefined;
    return { slotFreed: frees };
  }

  private interruptRequested(e: AuthorityEvent): void {
    const id = str(e, "interruptId");
    if (this.interrupts.has(id)) fail("interrupt.id.unique", `interrupt ${id} was already requested`);
    const blocking = e.blocking !== false;
    const waitId = str(e, "waitId");
    let owner: Owner;
    const placed = this.placedRun(e);
    if (placed !== undefined) {
      const [runId, run] = placed;
      if (TERMINAL.has(run.state)) throw ended(runId, "interrupt.requested");
      if (blocking) {
        noOpenBlocking(run.openInterrupts, `run ${runId}`);
        if (run.state === "paused") {
          fail("interrupt.requested.running", `run ${runId} is paused; a blocking interrupt needs a running run to pause`);
        }
      }
      owner = { scope: "run", runId };
    } else {
      const [w, wf] = this.workflowOpen(e)!;
      if (blocking) {
        noOpenBlocking(wf.openInterrupts, `workflow ${w}`);
        if (wf.state === "paused") {
          fail("interrupt.requested.running", `workflow ${w} is paused; a blocking interrupt needs a running workflow to pause`);
        }
      }
      owner = { scope: "workflow", workflowId: w };
    }
    const input = e.input as { members?: unknown } | undefined;
    const members = Array.isArray(input?.members)
      ? input.members.flatMap((m: unknown) => {
          const r = (m as { requestId?: unknown } | null)?.requestId;
          return typeof r === "string" ? [r] : [];
        })
      : [];
    if (owner.scope === "run") {
      const run = this.run(owner.runId);
      run.openInterrupts.set(id, blocking);
      if (blocking) this.runJournals.get(run.rootRunId)!.pendingPause = { runId: owner.runId, interruptId: id, waitId };
    } else {
      const wf = this.workflows.get(owner.workflowId)!;
      wf.openInterrupts.set(id, blocking);
      if (blocking) wf.pendingPause = { interruptId: id, waitId };
    }
    this.interrupts.set(id, { owner, waitId, actions: (e.actions as string[] | undefined) ?? [], blocking, members });
  }

  private interruptResolved(e: AuthorityEvent): void {
    const id = str(e, "interruptId");
    const req = this.interrupts.get(id);
    if (req === undefined) return fail("interrupt.unknown", `interrupt ${id} was never requested`);
    if (req.decision !== undefined) {
      fail("interrupt.resolved.once", `interrupt ${id} was already resolved with decision ${JSON.stringify(req.decision)}`);
    }
    const waitId = str(e, "waitId");
    if (req.waitId !== waitId) fail("interrupt.resolved.wait-mismatch", `interrupt ${id} belongs to waitId ${req.waitId}, not ${waitId}`);
    const placed = this.placedRun(e)?.[0];
    const inOwner =
      req.owner.scope === "run"
        ? placed === req.owner.runId
        : placed === undefined && this.workflowPosition(e)?.workflowId === req.owner.workflowId;
    if (!inOwner) {
      fail("interrupt.resolved.owner", `interrupt ${id} belongs to ${describeOwner(req.owner)}; resolve it in that journal`);
    }
    const decision = str(e, "decision");
    const allowed = (d: string) => d === "expired" || req.actions.includes(d);
    if (!allowed(decision)) {
      fail(
        "interrupt.decision.allowed",
        `decision ${JSON.stringify(decision)} is not among interrupt ${id}'s actions ${JSON.stringify(req.actions)} (or expired)`,
      );
    }
    const members = e.members as { requestId: string; decision: string }[] | undefined;
    if (members !== undefined) {
      const bad = members.find((m) => !allowed(m.decision));
      if (bad !== undefined) {
        fail(
          "interrupt.members.decision",
          `member ${bad.requestId} decided ${JSON.stringify(bad.decision)}, which is not among the actions ${JSON.stringify(req.actions)} (or expired)`,
        );
      }
      const given = members.map((m) => m.requestId);
      const unique = new Set(given);
      const listed = new Set(req.members);
      if (unique.size !== given.length || unique.size !== listed.size || [...unique].some((g) => !listed.has(g))) {
        fail(
          "interrupt.members.match",
          `members ${JSON.stringify(given)} do not match, one each, the members the request listed ${JSON.stringify(req.members)}`,
        );
      }
      const fold = foldMembers(members.map((m) => m.decision));
      if (fold !== decision) {
        fail(
          "interrupt.members.fold",
          `the members fold to ${JSON.stringify(fold)} (stop wins; else all approve; else all expired; otherwise deny), not ${JSON.stringify(decision)}`,
        );
      }
    }
    req.decision = decision;
    if (req.owner.scope === "run") this.run(req.owner.runId).openInterrupts.delete(id);
    else this.workflows.get(req.owner.workflowId)!.openInterrupts.delete(id);
  }

  private toolCallStarted(e: AuthorityEvent): void {
    const [runId, run] = this.placedRun(e)!;
    const id = str(e, "toolCallId");
    if (this.toolCalls.has(id)) fail("tool.call.id.unique", `tool call ${id} was already started; a retry uses a new toolCallId`);
    noNewWork(runId, run, "tool calls");
    const executor = str(e, "executor");
    if (executor === "client" && run.clientExecutorId === undefined) {
      fail(
        "tool.client.unbound",
        `run ${runId} has no clientExecutorId of its own, so it cannot start client tool call ${id}`,
      );
    }
    run.openToolCalls.add(id);
    this.toolCalls.set(id, { runId, toolName: str(e, "toolName"), executor });
  }

  private toolCallFinished(e: AuthorityEvent): void {
    const [runId] = this.placedRun(e)!;
    const id = str(e, "toolCallId");
    const call = this.toolCalls.get(id);
    if (call === undefined) return fail("tool.call.unknown", `tool call ${id} was never started`);
    if (call.outcome !== undefined) fail("tool.call.finished.once", `tool call ${id} already finished (${call.outcome})`);
    if (call.runId !== runId) fail("tool.call.owner", `tool call ${id} belongs to run ${call.runId}, not ${runId}`);
    call.outcome = str(e, "outcome");
    this.run(call.runId).openToolCalls.delete(id);
  }

  private workflowStarted(e: AuthorityEvent): void {
    const w = e.workflowId!;
    if (this.slot !== undefined) {
      fail("session.slot.single", `workflow ${w} cannot start while ${describeSlot(this.slot)} holds the session's slot`);
    }
    this.workflows.set(w, { sequence: 0, state: "running", openRuns: new Set(), openInterrupts: new Map() });
    this.slot = { kind: "workflow", workflowId: w };
  }

  private workflowPaused(e: AuthorityEvent): void {
    const [w, wf] = this.workflowOpen(e)!;
    if (wf.state === "paused") fail("workflow.pause.single", `workflow ${w} is already paused (waitId ${wf.pause?.waitId})`);
    const interruptId = str(e, "interruptId");
    const waitId = str(e, "waitId");
    const i = this.interrupts.get(interruptId);
    const ok = i !== undefined && i.owner.scope === "workflow" && i.owner.workflowId === w && i.decision === undefined && i.waitId === waitId;
    if (!ok) {
      fail(
        "workflow.paused.interrupt",
        `workflow ${w} pauses on interrupt ${interruptId}, which is not an open interrupt of this workflow with waitId ${waitId}`,
      );
    }
    wf.state = "paused";
    wf.pause = { waitId, interruptId };
  }

  private workflowResumed(e: AuthorityEvent): void {
    const [w, wf] = this.workflowOpen(e)!;
    if (wf.state !== "paused" || wf.pause === undefined) return fail("workflow.resume.not-paused", `workflow ${w} is not paused`);
    const waitId = str(e, "waitId");
    const i = wf.pause.interruptId;
    const interruptOpen = i !== undefined && wf.openInterrupts.has(i);
    if (wf.pause.waitId !== waitId || interruptOpen) {
      fail(
        "workflow.resume.wait-mismatch",
        `workflow ${w} is paused on waitId ${wf.pause.waitId}${interruptOpen ? " and its interrupt is unresolved" : ""}; resumed with ${waitId}`,
      );
    }
    wf.state = "running";
    delete wf.pause;
  }

  private workflowTerminal(e: AuthorityEvent, state: Status): { slotFreed: boolean } {
    const w = e.workflowId!;
    const wf = this.workflows.get(w)!;
    if (TERMINAL.has(wf.state)) fail("workflow.terminal.once", `workflow ${w} has already ended; ${e.type} would be a second terminal`);
    if (wf.state === "paused") fail("workflow.terminal.paused", `workflow ${w} is paused (waitId ${wf.pause?.waitId}); resume it before ${e.type}`);
    const open = [
      ...[...wf.openRuns].sort().map((r) => `run ${r}`),
      ...[...wf.openInterrupts.keys()].sort().map((i) => `interrupt ${i}`),
    ];
    if (open.length > 0) fail("workflow.terminal.open-work", `${e.type} of workflow ${w} while ${open.join(", ")} is open`);
    wf.state = state;
    const frees = this.slot?.kind === "workflow" && this.slot.workflowId === w;
    if (frees) this.slot = undefined;
    return { slotFreed: frees };
  }

  private content(e: AuthorityEvent): void {
    const placedRun = this.placedRun(e);
    if (placedRun === undefined && e.type !== "workflow.custom" && e.type !== "workflow.raw") this.workflowOpen(e);
    const streamed = STREAMED.has(e.type);
    if (placedRun !== undefined && TERMINAL.has(placedRun[1].state) && streamed) throw ended(placedRun[0], e.type);
    const placed: Placed = { runId: e.runId, workflowId: e.workflowId };
    switch (e.type) {
      case "message.user.recorded":
        this.newMessage(str(e, "messageId"), placed, true);
        break;
      case "message.text.started":
        this.newMessage(str(e, "messageId"), placed, false);
        break;
      case "message.text.delta":
        this.messageStep(str(e, "messageId"), placed, false);
        break;
      case "message.text.completed":
        this.messageStep(str(e, "messageId"), placed, true);
        break;
      case "reasoning.started": {
        const id = str(e, "reasoningId");
        if (this.reasoning.has(id)) fail("reasoning.id.unique", `reasoning ${id} was already started`);
        this.reasoning.set(id, { placed, completed: false });
        break;
      }
      case "reasoning.delta":
      case "reasoning.completed": {
        const id = str(e, "reasoningId");
        const r = this.reasoning.get(id);
        if (r === undefined) return fail("reasoning.not-started", `reasoning ${id} has not started`);
        if (r.completed) fail("reasoning.completed.final", `reasoning ${id} is already complete`);
        if (e.type === "reasoning.completed") r.completed = true;
        break;
      }
      case "message.redacted": {
        const id = str(e, "messageId");
        if (!this.messages.has(id)) fail("message.unknown", `message ${id} was never recorded or started`);
        break;
      }
      case "attachment.added": {
        const id = str(e, "attachmentId");
        if (this.attachments.has(id)) fail("attachment.id.unique", `attachment ${id} was already added`);
        this.attachments.set(id, true);
        break;
      }
      case "attachment.ready":
      case "attachment.failed":
      case "attachment.removed": {
        const id = str(e, "attachmentId");
        const present = this.attachments.get(id);
        if (present === undefined) fail("attachment.unknown", `attachment ${id} was never added`);
        if (present === false) fail("attachment.unknown", `attachment ${id} was removed`);
        if (e.type === "attachment.removed") this.attachments.set(id, false);
        break;
      }
      case "artifact.added": {
        const id = str(e, "artifactId");
        if (this.artifacts.has(id)) fail("artifact.id.unique", `artifact ${id} was already added`);
        this.artifacts.add(id);
        break;
      }
      case "artifact.ready":
      case "artifact.failed": {
        const id = str(e, "artifactId");
        if (!this.artifacts.has(id)) fail("artifact.unknown", `artifact ${id} was never added`);
        break;
      }
      case "state.snapshot":
      case "ui.state.snapshot":
        this.snapshot(e.type === "state.snapshot" ? this.documents.state : this.documents.ui, e);
        break;
      case "state.delta":
      case "ui.state.delta":
        this.delta(e.type === "state.delta" ? this.documents.state : this.documents.ui, e);
        break;
      case "state.compacted": {
        const scope = str(e, "scope");
        const revision = this.documents.state.get(scope)?.revision ?? 0;
        const snapshotRevision = e.snapshotRevision as number;
        const covers = e.coversThroughSessionSequence as number;
        if (snapshotRevision > revision || covers >= e.sessionSequence) {
          fail(
            "state.compacted.bounds",
            `compaction of ${scope} to revision ${snapshotRevision} through sessionSequence ${covers} must stay within revision ${revision} and before sessionSequence ${e.sessionSequence}`,
          );
        }
        break;
      }
      case "view.opened": {
        const id = str(e, "viewId");
        if (this.views.has(id)) fail("view.id.unique", `view ${id} was already opened`);
        this.views.set(id, { open: true, state: (e.state as Json | undefined) ?? {} });
        break;
      }
      case "view.updated": {
        const id = str(e, "viewId");
        const view = this.openView(id);
        view.state =
          e.operation === "patch"
            ? patched(view.state, e.patch as PatchOperation[], "view.patch.applies", "the view's state")
            : (e.state as Json);
        break;
      }
      case "view.closed":
        this.openView(str(e, "viewId")).open = false;
        break;
      default:
        break;
    }
  }

  private newMessage(id: string, placed: Placed, completed: boolean): void {
    if (this.messages.has(id)) fail("message.id.unique", `message ${id} was already recorded or started`);
    this.messages.set(id, { placed, completed });
  }

  private messageStep(id: string, placed: Placed, completes: boolean): void {
    const m = this.messages.get(id);
    if (m === undefined) return fail("message.text.not-started", `message ${id} has not started`);
    if (m.completed) fail("message.text.completed.final", `message ${id} is already complete`);
    if (m.placed.runId !== placed.runId || m.placed.workflowId !== placed.workflowId) {
      fail("message.scope.match", `message ${id} started in ${describePlaced(m.placed)}; its events carry the same ordering fields`);
    }
    if (completes) m.completed = true;
  }

  private snapshot(docs: Map<string, DocumentState>, e: AuthorityEvent): void {
    const scope = str(e, "scope");
    const revision = e.revision as number;
    const current = docs.get(scope)?.revision ?? 0;
    if (revision < current) {
      fail("state.revision.regress", `snapshot revision ${revision} of ${scope} is below its current revision ${current}`);
    }
    docs.set(scope, { revision, state: e.state as Json });
  }

  private delta(docs: Map<string, DocumentState>, e: AuthorityEvent): void {
    const scope = str(e, "scope");
    const revision = e.revision as number;
    const base = e.baseRevision as number;
    if (revision !== base + 1) {
      fail("state.revision.contiguous", `revision ${revision} follows baseRevision ${base}; it must be ${base + 1}`);
    }
    const doc = docs.get(scope) ?? { revision: 0, state: {} };
    if (base !== doc.revision) fail("state.revision.base", `baseRevision ${base} of ${scope}, whose current revision is ${doc.revision}`);
    docs.set(scope, { revision, state: patched(doc.state, e.patch as PatchOperation[], "state.patch.applies", scope) });
  }

  private openView(id: string): ViewState {
    const v = this.views.get(id);
    if (v === undefined) return fail("view.unknown", `view ${id} was never opened`);
    if (!v.open) fail("view.unknown", `view ${id} is closed`);
    return v;
  }
}

const STREAMED = new Set([
  "message.user.recorded",
  "message.text.started",
  "message.text.delta",
  "message.text.completed",
  "reasoning.started",
  "reasoning.delta",
  "reasoning.completed",
]);

function isPauseFor(e: AuthorityEvent, p: PendingPause): boolean {
  if (e.type === "run.paused") return p.runId === e.runId && e.waitId === p.waitId && e.interruptId === p.interruptId;
  if (e.type === "workflow.paused") return p.runId === undefined && e.waitId === p.waitId && e.interruptId === p.interruptId;
  return false;
}

function noNewWork(runId: string, run: RunState, what: string): void {
  if (TERMINAL.has(run.state)) throw ended(runId, what);
  if (run.state === "paused") fail("run.paused.no-new-work", `run ${runId} is paused; it starts no ${what} until it resumes`);
  if (run.stopRequested) fail("run.stop.no-new-work", `run ${runId} was asked to stop; it starts no new ${what}`);
}

function noOpenBlocking(open: Map<string, boolean>, who: string): void {
  const blocking = [...open].filter(([, b]) => b).map(([i]) => i).sort()[0];
  if (blocking !== undefined) fail("interrupt.single-open", `${who} already has open blocking interrupt ${blocking}`);
}

function ended(runId: string, what: string): Violation {
  return new Violation("run.terminal.final", `run ${runId} has ended; it takes no ${what}`);
}

function patched(state: Json, patch: readonly PatchOperation[], rule: string, what: string): Json {
  try {
    return applyPatch(state, patch);
  } catch (e) {
    if (e instanceof PatchError) fail(rule, `the patch does not apply to ${what}: ${e.message}`);
    throw e;
  }
}

function describeSlot(slot: Slot): string {
  return slot.kind === "run" ? `run ${slot.runId}` : `workflow ${slot.workflowId}`;
}

function describeOwner(owner: Owner): string {
  return owner.scope === "run" ? `run ${owner.runId}` : `workflow ${owner.workflowId}`;
}

function describePlaced(p: Placed): string {
  if (p.runId !== undefined) return `run ${p.runId}`;
  if (p.workflowId !== undefined) return `workflow ${p.workflowId}`;
  return "the session";
}
