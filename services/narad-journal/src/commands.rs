//! Server-issued events: the authority events of commands (§2.2), built
//! from current state and appended through the same transaction as any
//! batch.
//!
//! - `start-run` honours the session slot (§3.1) with `onConflict`:
//!   `reject` (409 naming the active execution), `enqueue` (a durable queued
//!   start that becomes `run.started` in the transaction that frees the
//!   slot), or `interrupt` (stop the active run; start once it has ended).
//! - `resolve-interrupt` resolves at most once: a second resolution, from
//!   any replica or tab, is refused with the decision already recorded.
//!
//! Each runs under an [`Authorized`] caller and acts within its session
//! alone; the events it builds carry the caller as their actor (§7.7).

use narad_protocol::authority::MessageScope;
use narad_protocol::commands::{
    CancelWorkflow, OnConflict, RecordUserMessage, RedactMessage, ResolveInterrupt, StartRun,
    StartWorkflow, StopRun,
};
use narad_protocol::engine::{Owner, SessionCore, Slot};
use narad_protocol::primitives::{EventId, SessionId};
use narad_protocol::rules;
use serde::Serialize;
use serde_json::{Value, json};

use crate::runtime::WorkOrder;
use crate::{
    AppendOptions, Appended, Authorized, Journal, JournalError, SessionRecord, TenantId, in_tenant,
};

/// What a start-run command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunStart {
    /// The run's id.
    #[schema(schema_with = crate::openapi::id)]
    pub run_id: String,
    /// The appended events, when the run started now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub appended: Option<Appended>,
    /// The queued start's id, when it waits for the slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::openapi::id)]
    pub queue_id: Option<String>,
    /// The stop request appended for the active run (`onConflict=interrupt`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_requested: Option<Appended>,
}

/// What a cancel-workflow command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowCancel {
    /// The workflow's session.
    #[schema(schema_with = crate::openapi::id)]
    pub session_id: String,
    /// workflow.cancelled, when it could be appended at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<Appended>,
    /// The stop requests appended for the workflow's open runs; the
    /// workflow is cancelled in the append that leaves it idle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_requested: Option<Appended>,
}

/// A start waiting for its session's slot.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueuedStart {
    /// The queued start.
    #[schema(schema_with = crate::openapi::id)]
    pub queue_id: String,
    /// The run it will start.
    #[schema(schema_with = crate::openapi::id)]
    pub run_id: String,
    /// `interrupt` starts go first, then `enqueue` ones, each in order.
    #[schema(value_type = String, pattern = "^(interrupt|enqueue)$")]
    pub on_conflict: &'static str,
    /// The run.started it will append.
    #[schema(schema_with = crate::openapi::run_started)]
    pub proposal: Value,
}

/// A direct stop of a run: run.stop.requested in the run's own journal.
fn stop_proposal(root_run_id: &Value, run_id: &str, reason: Option<&str>) -> Value {
    let mut stop = json!({
        "protocolVersion": "narad/v1", "type": "run.stop.requested", "eventId": EventId::new_v7(),
        "rootRunId": root_run_id, "runId": run_id, "targetRunId": run_id,
    });
    if let Some(r) = reason {
        stop["reason"] = json!(r);
    }
    stop
}

/// The workflow.cancelled a cancel-workflow command appends, at once or in
/// the append that leaves the workflow idle.
pub(crate) fn cancelled_proposal(workflow_id: &str, reason: Option<&str>) -> Value {
    let mut event = json!({
        "protocolVersion": "narad/v1", "type": "workflow.cancelled", "eventId": EventId::new_v7(),
        "workflowId": workflow_id, "code": "narad.cancel-workflow",
    });
    if let Some(r) = reason {
        event["message"] = json!(r);
    }
    event
}

/// Queue priorities: interrupting starts before enqueued ones.
const PRIORITY_INTERRUPT: i16 = 0;
const PRIORITY_ENQUEUE: i16 = 1;

impl Journal {
    /// Starts a run (command `start-run`).
    pub async fn start_run(
        &self,
        auth: &Authorized,
        cmd: &StartRun,
    ) -> Result<RunStart, JournalError> {
        let (tenant, session) = (auth.tenant(), auth.session());
        let run_id = cmd
            .run_id
            .as_ref()
            .map(|r| r.to_string())
            .unwrap_or_else(|| EventId::new_v7().to_string());
        // A runId the caller chose makes the event's id its own: the same
        // start sent again is the same event (a replay, not a conflict).
        let event_id = match &cmd.run_id {
            Some(run) => repeatable_event_id(tenant, session, "run.started", run.as_str()),
            None => EventId::new_v7().to_string(),
        };
        let mut proposal = json!({
            "protocolVersion": "narad/v1", "type": "run.started",
            "eventId": event_id, "runId": run_id, "rootRunId": run_id,
        });
        if let Some(parent) = &cmd.parent_run_id {
            // A nested run keeps its parent's journal and, unless told
            // otherwise, its executor, recorded explicitly (§3.3).
            let state = self.entity(tenant, session, "run", parent.as_str()).await?;
            let Some(state) = state else {
                return Err(JournalError::NotFound(format!(
                    "run {parent} in session {session}"
                )));
            };
            proposal["rootRunId"] = state["rootRunId"].clone();
            proposal["parentRunId"] = json!(parent);
            if cmd.client_executor_id.is_none() && state.get("clientExecutorId").is_some() {
                proposal["clientExecutorId"] = state["clientExecutorId"].clone();
            }
        }
        if let Some(c) = &cmd.client_executor_id {
            proposal["clientExecutorId"] = json!(c);
        }
        if let Some(w) = &cmd.workflow_id {
            proposal["workflowId"] = json!(w);
        }
        if let Some(input) = &cmd.input {
            proposal["input"] = input.clone();
        }
        let work = match (&cmd.runtime, &cmd.parent_run_id) {
            (Some(_), Some(_)) => {
                return Err(JournalError::InvalidBody {
                    pointer: "/runtime",
                    message: "runtime applies to top-level runs; a nested run is executed by \
                              the runtime that holds its root run"
                        .to_owned(),
                });
            }
            (Some(order), None) => Some(WorkOrder::of(order, self.work_defaults)),
            (None, _) => None,
        };
        let on_conflict = cmd.on_conflict.unwrap_or_default();
        loop {
            match self
                .append(
                    tenant,
                    session,
                    std::slice::from_ref(&proposal),
                    AppendOptions {
                        work: work.clone(),
                        ..auth.options()
                    },
                )
                .await
            {
                Ok(appended) => {
                    return Ok(RunStart {
                        run_id,
                        appended: Some(appended),
                        queue_id: None,
                        stop_requested: None,
                    });
                }
                Err(JournalError::Rejected { violation, .. })
                    if violation.rule == rules::SESSION_SLOT.id && cmd.parent_run_id.is_none() =>
                {
                    let priority = match on_conflict {
                        OnConflict::Reject => {
                            let active = self
                                .session(tenant, session.as_str())
                                .await?
                                .active_execution;
                            return Err(JournalError::SlotTaken {
                                active: active.unwrap_or(Value::Null),
                            });
                        }
                        OnConflict::Enqueue => PRIORITY_ENQUEUE,
                        OnConflict::Interrupt => PRIORITY_INTERRUPT,
                    };
                    // Queue it only if the slot is still taken, under the
                    // session lock that every slot change holds.
                    let Some((queue_id, active)) = self
                        .enqueue(tenant, session, priority, &proposal, work.as_ref())
                        .await?
                    else {
                        continue; // the slot freed meanwhile: start now
                    };
                    let stop_requested = match (on_conflict, active) {
                        (OnConflict::Interrupt, Some(active_run)) => {
                            Some(self.stop(auth, &active_run).await?)
                        }
                        _ => None,
                    };
                    return Ok(RunStart {
                        run_id,
                        appended: None,
                        queue_id: Some(queue_id),
                        stop_requested,
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Queues a start if the slot is still taken; returns the queue id and
    /// the active top-level run (to stop, for `interrupt`).
    async fn enqueue(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        priority: i16,
        proposal: &Value,
        work: Option<&WorkOrder>,
    ) -> Result<Option<(String, Option<String>)>, JournalError> {
        let work = work.map(|w| serde_json::to_value(w).expect("serialises"));
        let client = self.pool.get().await?;
        let queue_id = EventId::new_v7().to_string();
        in_tenant(client, tenant, async |c| {
            let row = c
                .query_opt(
                    "select core from sessions where tenant_id = $1 and session_id = $2 for update",
                    &[&tenant.as_str(), &session.as_str()],
                )
                .await?
                .ok_or_else(|| JournalError::SessionNotFound(session.to_string()))?;
            let core: SessionCore = serde_json::from_value(row.get(0))
                .map_err(|e| JournalError::Corrupt(format!("session core: {e}")))?;
            let active_run = match &core.slot {
                None => return Ok(None),
                Some(Slot::Run { run_id }) => Some(run_id.to_string()),
                Some(Slot::Workflow { workflow_id }) => c
                    .query_opt(
                        "select state ->> 'activeTopLevelRun' from entities \
                         where tenant_id = $1 and session_id = $2 and kind = 'workflow' and id = $3",
                        &[&tenant.as_str(), &session.as_str(), &workflow_id.as_str()],
                    )
                    .await?
                    .and_then(|r| r.get::<_, Option<String>>(0)),
            };
            // The same start sent again (its runId chosen by the caller,
            // so its event id too) is the start already queued.
            if let Some(queued) = c
                .query_opt(
                    "select queue_id from queued_starts \
                     where tenant_id = $1 and session_id = $2 and proposal ->> 'eventId' = $3",
                    &[&tenant.as_str(), &session.as_str(), &proposal["eventId"].as_str()],
                )
                .await?
            {
                return Ok(Some((queued.get(0), None)));
            }
            c.execute(
                "insert into queued_starts (tenant_id, session_id, queue_id, priority, proposal, work) \
                 values ($1, $2, $3, $4, $5, $6)",
                &[&tenant.as_str(), &session.as_str(), &queue_id, &priority, proposal, &work],
            )
            .await?;
            Ok(Some((queue_id.clone(), active_run)))
        })
        .await
    }

    /// Appends run.stop.requested for a run of the session.
    async fn stop(&self, auth: &Authorized, run_id: &str) -> Result<Appended, JournalError> {
        let (tenant, session) = (auth.tenant(), auth.session());
        let state = self
            .entity(tenant, session, "run", run_id)
            .await?
            .ok_or_else(|| JournalError::NotFound(format!("run {run_id}")))?;
        let stop = stop_proposal(
            &state["rootRunId"],
            run_id,
            Some("narad.start-run.interrupt"),
        );
        let appended = self
            .append(tenant, session, &[stop], auth.options())
            .await?;
        if state["rootRunId"] == run_id {
            self.serve_unheld_stop(tenant, session.as_str(), run_id)
                .await;
        }
        Ok(appended)
    }

    /// Serves a stop of a run no runtime holds, right after the stop was
    /// appended. The stop is committed whatever happens here: should the
    /// closing fail, the runtime sweeper finishes it, so the command still
    /// succeeds.
    async fn serve_unheld_stop(&self, tenant: &TenantId, session: &str, root: &str) {
        if let Err(e) = self.stop_unheld(tenant, session, root).await {
            tracing::warn!(tenant = %tenant, session, run = root, error = %e,
                "serving a stop no runtime holds failed; the runtime sweeper finishes it");
        }
    }

    /// The starts waiting for a session's slot, in the order they will start.
    pub async fn queued_starts(
        &self,
        tenant: &TenantId,
        session: &str,
    ) -> Result<Vec<QueuedStart>, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            Ok(c.query(
                "select queue_id, priority, proposal from queued_starts \
                 where tenant_id = $1 and session_id = $2 order by priority, position",
                &[&tenant.as_str(), &session],
            )
            .await?
            .iter()
            .map(|r| {
                let proposal: Value = r.get(2);
                QueuedStart {
                    queue_id: r.get(0),
                    run_id: proposal["runId"].as_str().unwrap_or_default().to_owned(),
                    on_conflict: if r.get::<_, i16>(1) == PRIORITY_INTERRUPT {
                        "interrupt"
                    } else {
                        "enqueue"
                    },
                    proposal,
                }
            })
            .collect())
        })
        .await
    }

    /// Withdraws a queued start.
    pub async fn withdraw_start(
        &self,
        tenant: &TenantId,
        session: &str,
        queue_id: &str,
    ) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let n = c
                .execute(
                    "delete from queued_starts where tenant_id = $1 and session_id = $2 and queue_id = $3",
                    &[&tenant.as_str(), &session, &queue_id],
                )
                .await?;
            if n == 0 {
                return Err(JournalError::NotFound(format!("queued start {queue_id} in session {session}")));
            }
            Ok(())
        })
        .await
    }

    /// Resolves an interrupt of the authorized session (command
    /// `resolve-interrupt`), at most once.
    pub async fn resolve_interrupt(
        &self,
        auth: &Authorized,
        cmd: &ResolveInterrupt,
    ) -> Result<(String, Appended), JournalError> {
        let (tenant, sid) = (auth.tenant(), auth.session());
        let session = sid.to_string();
        let id = cmd.interrupt_id.as_str();
        let (interrupt, owner_run) = self.find_interrupt(tenant, sid, id).await?;
        if let Some(decision) = interrupt.get("decision").and_then(Value::as_str) {
            return Err(JournalError::InterruptAlreadyResolved {
                interrupt_id: id.to_owned(),
                decision: decision.to_owned(),
            });
        }
        let mut event = resolution(&interrupt, owner_run.as_ref(), id, cmd.decision.as_str())?;
        if let Some(reason) = &cmd.reason {
            event["reason"] = json!(reason);
        }
        if let Some(members) = &cmd.members {
            event["members"] = serde_json::to_value(members).expect("serialises");
        }
        match self.append(tenant, sid, &[event], auth.options()).await {
            Ok(appended) => Ok((session, appended)),
            // Another resolution won the race: report its decision.
            Err(JournalError::Rejected { violation, .. })
                if violation.rule == rules::INTERRUPT_RESOLVED_ONCE.id =>
            {
                let (now, _) = self.find_interrupt(tenant, sid, id).await?;
                Err(JournalError::InterruptAlreadyResolved {
                    interrupt_id: id.to_owned(),
                    decision: now["decision"].as_str().unwrap_or_default().to_owned(),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Resolves an open interrupt whose deadline passed with the decision
    /// `expired` (§7.7), as the server: the appended event, or `None` when
    /// it was decided first (the decision stands) or is gone. Whichever
    /// resolution commits first wins, here as for the command.
    pub async fn expire_interrupt(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        id: &str,
    ) -> Result<Option<Appended>, JournalError> {
        let found = match self.find_interrupt(tenant, session, id).await {
            Ok(found) => Some(found),
            Err(JournalError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        let Some((interrupt, owner_run)) = found.filter(|(i, _)| i.get("decision").is_none())
        else {
            self.forget_deadline(tenant, session, id).await?;
            return Ok(None);
        };
        let event = resolution(&interrupt, owner_run.as_ref(), id, EXPIRED)?;
        match self
            .append(tenant, session, &[event], AppendOptions::default())
            .await
        {
            Ok(appended) => Ok(Some(appended)),
            Err(JournalError::Rejected { violation, .. })
                if violation.rule == rules::INTERRUPT_RESOLVED_ONCE.id =>
            {
                self.forget_deadline(tenant, session, id).await?;
                Ok(None)
            }
            // Any other refusal is the journal's answer to this interrupt:
            // asking again each pass would get the same.
            Err(e @ JournalError::Rejected { .. }) => {
                self.forget_deadline(tenant, session, id).await?;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Drops the deadline of an interrupt that is no longer open.
    async fn forget_deadline(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        id: &str,
    ) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            c.execute(
                "delete from interrupt_deadlines where tenant_id = $1 and session_id = $2 \
                 and interrupt_id = $3",
                &[&tenant.as_str(), &session.as_str(), &id],
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// An interrupt of a session: its state and its owning run's state.
    async fn find_interrupt(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        id: &str,
    ) -> Result<(Value, Option<Value>), JournalError> {
        let client = self.pool.get().await?;
        let row = in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(
                "select i.state, r.state from entities i \
                 left join entities r on r.tenant_id = i.tenant_id and r.session_id = i.session_id \
                   and r.kind = 'run' and r.id = i.state ->> 'runId' \
                 where i.tenant_id = $1 and i.session_id = $2 and i.kind = 'interrupt' and i.id = $3",
                &[&tenant.as_str(), &session.as_str(), &id],
            )
            .await?)
        })
        .await?;
        let row = row.ok_or_else(|| {
            JournalError::NotFound(format!("interrupt {id} in session {session}"))
        })?;
        Ok((row.get(0), row.get(1)))
    }

    /// Asks a run of the authorized session to stop (command `stop-run`).
    pub async fn stop_run(
        &self,
        auth: &Authorized,
        cmd: &StopRun,
    ) -> Result<(String, Appended), JournalError> {
        let (tenant, sid) = (auth.tenant(), auth.session());
        let session = sid.to_string();
        let run_id = cmd.run_id.as_str();
        let run = self
            .entity(tenant, sid, "run", run_id)
            .await?
            .ok_or_else(|| JournalError::NotFound(format!("run {run_id} in session {sid}")))?;
        let stop = stop_proposal(&run["rootRunId"], run_id, cmd.reason.as_deref());
        let appended = self.append(tenant, sid, &[stop], auth.options()).await?;
        if run["rootRunId"] == cmd.run_id.as_str() {
            self.serve_unheld_stop(tenant, &session, cmd.run_id.as_str())
                .await;
        }
        Ok((session, appended))
    }

    /// Records what a person said (command `record-user-message`).
    pub async fn record_user_message(
        &self,
        auth: &Authorized,
        cmd: &RecordUserMessage,
    ) -> Result<(String, Appended), JournalError> {
        let (tenant, session) = (auth.tenant(), auth.session());
        let message_id = cmd
            .message_id
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_else(|| EventId::new_v7().to_string());
        // A messageId the caller chose makes the event's id its own: the
        // same message sent again is the same event (a replay).
        let event_id = match &cmd.message_id {
            Some(m) => repeatable_event_id(tenant, session, "message.user.recorded", m.as_str()),
            None => EventId::new_v7().to_string(),
        };
        let mut event = json!({
            "protocolVersion": "narad/v1", "type": "message.user.recorded", "eventId": event_id,
            "messageId": message_id, "messageScope": cmd.message_scope, "content": cmd.content,
        });
        if let Some(a) = &cmd.attachment_ids {
            event["attachmentIds"] = json!(a);
        }
        let missing = |pointer: &'static str| JournalError::InvalidBody {
            pointer,
            message: format!(
                "messageScope {:?} needs {}",
                cmd.message_scope,
                &pointer[1..]
            ),
        };
        match cmd.message_scope {
            MessageScope::Session => {}
            MessageScope::Run => {
                let run_id = cmd.run_id.as_ref().ok_or_else(|| missing("/runId"))?;
                let run = self
                    .entity(tenant, session, "run", run_id.as_str())
                    .await?
                    .ok_or_else(|| {
                        JournalError::NotFound(format!("run {run_id} in session {session}"))
                    })?;
                event["runId"] = json!(run_id);
                event["rootRunId"] = run["rootRunId"].clone();
            }
            MessageScope::Workflow => {
                event["workflowId"] = json!(
                    cmd.workflow_id
                        .as_ref()
                        .ok_or_else(|| missing("/workflowId"))?
                );
            }
        }
        let appended = self
            .append(tenant, session, &[event], auth.options())
            .await?;
        Ok((message_id, appended))
    }

    /// Starts a workflow in the session's slot (command `start-workflow`).
    pub async fn start_workflow(
        &self,
        auth: &Authorized,
        cmd: &StartWorkflow,
    ) -> Result<(String, Appended), JournalError> {
        let (tenant, session) = (auth.tenant(), auth.session());
        let workflow_id = cmd
            .workflow_id
            .as_ref()
            .map(|w| w.to_string())
            .unwrap_or_else(|| EventId::new_v7().to_string());
        let mut event = json!({
            "protocolVersion": "narad/v1", "type": "workflow.started", "eventId": EventId::new_v7(),
            "workflowId": workflow_id,
        });
        if let Some(c) = &cmd.default_client_executor_id {
            event["defaultClientExecutorId"] = json!(c);
        }
        if let Some(input) = &cmd.input {
            event["input"] = input.clone();
        }
        match self.append(tenant, session, &[event], auth.options()).await {
            Ok(appended) => Ok((workflow_id, appended)),
            Err(JournalError::Rejected { violation, .. })
                if violation.rule == rules::SESSION_SLOT.id =>
            {
                let active = self
                    .session(tenant, session.as_str())
                    .await?
                    .active_execution;
                Err(JournalError::SlotTaken {
                    active: active.unwrap_or(Value::Null),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Cancels a workflow (command `cancel-workflow`): its open runs are
    /// asked to stop, and workflow.cancelled is appended once no run or
    /// interrupt of it is open — at once if none is. Open workflow
    /// interrupts are the runtime's to resolve.
    pub async fn cancel_workflow(
        &self,
        auth: &Authorized,
        cmd: &CancelWorkflow,
    ) -> Result<WorkflowCancel, JournalError> {
        let (tenant, sid) = (auth.tenant(), auth.session());
        let session = sid.to_string();
        let workflow_id = cmd.workflow_id.as_str();
        // Under the session lock: idle now, or record the cancellation.
        let client = self.pool.get().await?;
        let open_runs = in_tenant(client, tenant, async |c| {
            c.query_opt(
                "select 1 from sessions where tenant_id = $1 and session_id = $2 for update",
                &[&tenant.as_str(), &session],
            )
            .await?;
            let state: Value = c
                .query_opt(
                    "select state from entities where tenant_id = $1 and session_id = $2 \
                     and kind = 'workflow' and id = $3",
                    &[&tenant.as_str(), &session, &workflow_id],
                )
                .await?
                .ok_or_else(|| {
                    JournalError::NotFound(format!("workflow {workflow_id} in session {session}"))
                })?
                .get(0);
            let runs: Vec<String> = state["openRuns"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r.as_str().map(str::to_owned))
                .collect();
            let busy = !runs.is_empty()
                || state["openInterrupts"].as_object().is_some_and(|i| !i.is_empty())
                || state["state"] == "paused";
            let terminal = matches!(state["state"].as_str(), Some("finished" | "error" | "cancelled"));
            if busy && !terminal {
                c.execute(
                    "insert into pending_cancellations (tenant_id, session_id, workflow_id, reason) \
                     values ($1, $2, $3, $4) on conflict do nothing",
                    &[&tenant.as_str(), &session, &workflow_id, &cmd.reason],
                )
                .await?;
                Ok(Some(runs))
            } else {
                Ok(None)
            }
        })
        .await?;
        match open_runs {
            None => {
                let event = cancelled_proposal(workflow_id, cmd.reason.as_deref());
                let cancelled = self.append(tenant, sid, &[event], auth.options()).await?;
                Ok(WorkflowCancel {
                    session_id: session,
                    cancelled: Some(cancelled),
                    stop_requested: None,
                })
            }
            Some(runs) => {
                let mut stops = Vec::new();
                for run_id in &runs {
                    if let Some(run) = self.entity(tenant, sid, "run", run_id).await?
                        && run["stopRequested"] != json!(true)
                    {
                        stops.push(stop_proposal(
                            &run["rootRunId"],
                            run_id,
                            Some("narad.cancel-workflow"),
                        ));
                    }
                }
                let stop_requested = if stops.is_empty() {
                    None
                } else {
                    Some(self.append(tenant, sid, &stops, auth.options()).await?)
                };
                Ok(WorkflowCancel {
                    session_id: session,
                    cancelled: None,
                    stop_requested,
                })
            }
        }
    }

    /// Changes how a message displays (command `redact-message`, §9.4).
    pub async fn redact_message(
        &self,
        auth: &Authorized,
        cmd: &RedactMessage,
    ) -> Result<Appended, JournalError> {
        let event = json!({
            "protocolVersion": "narad/v1", "type": "message.redacted", "eventId": EventId::new_v7(),
            "messageId": cmd.message_id, "reason": cmd.reason, "displayReplacement": cmd.display_replacement,
        });
        self.append(auth.tenant(), auth.session(), &[event], auth.options())
            .await
    }

    /// Archives a session (command `archive-session`); archiving an
    /// archived session changes nothing.
    pub async fn archive_session(&self, auth: &Authorized) -> Result<SessionRecord, JournalError> {
        let (tenant, session) = (auth.tenant(), auth.session().as_str());
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            // Archiving twice is one archive: only the first is announced.
            let row = c
                .query_opt(
                    "with before as (select archived_at, session_sequence from sessions \
                       where tenant_id = $1 and session_id = $2 for update), \
                     archived as (update sessions s set archived_at = now() from before \
                       where s.tenant_id = $1 and s.session_id = $2 \
                         and before.archived_at is null) \
                     select archived_at is null, session_sequence from before",
                    &[&tenant.as_str(), &session],
                )
                .await?
                .ok_or_else(|| JournalError::SessionNotFound(session.to_owned()))?;
            if row.get::<_, bool>(0) {
                let sequence = row.get::<_, i64>(1) as u64;
                crate::sessions::record_watch(
                    c,
                    tenant,
                    session,
                    "session.archived",
                    sequence,
                    serde_json::Map::new(),
                )
                .await?;
            }
            Ok(())
        })
        .await?;
        self.catalogue_changed();
        self.session(tenant, session).await
    }

    /// Changes a session's title and/or metadata (command
    /// `update-session`); each field given replaces the stored one. A
    /// change is announced as `session.updated` with the entry as it now
    /// is; an update that changes nothing is not announced.
    pub async fn update_session(
        &self,
        auth: &Authorized,
        cmd: &narad_protocol::commands::UpdateSession,
    ) -> Result<SessionRecord, JournalError> {
        let tenant = auth.tenant();
        if cmd.title.is_none() && cmd.metadata.is_none() {
            return Err(JournalError::InvalidBody {
                pointer: "",
                message: "update-session changes title, metadata or both: give at least one"
                    .to_owned(),
            });
        }
        let session = auth.session().as_str();
        let metadata = cmd.metadata.clone().map(Value::Object);
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let row = c
                .query_opt(
                    "with before as (select title, metadata from sessions \
                       where tenant_id = $1 and session_id = $2 for update) \
                     update sessions s set title = coalesce($3, s.title), \
                       metadata = coalesce($4, s.metadata) \
                     from before where s.tenant_id = $1 and s.session_id = $2 \
                     returning (s.title, s.metadata) is distinct from (before.title, before.metadata), \
                       s.session_sequence, s.title, s.metadata",
                    &[&tenant.as_str(), &session, &cmd.title, &metadata],
                )
                .await?
                .ok_or_else(|| JournalError::SessionNotFound(session.to_owned()))?;
            if row.get::<_, bool>(0) {
                let mut fields = serde_json::Map::new();
                if let Some(title) = row.get::<_, Option<String>>(2) {
                    fields.insert("title".into(), Value::from(title));
                }
                if let Some(metadata) = row.get::<_, Option<Value>>(3) {
                    fields.insert("metadata".into(), metadata);
                }
                crate::sessions::record_watch(
                    c,
                    tenant,
                    session,
                    "session.updated",
                    row.get::<_, i64>(1) as u64,
                    fields,
                )
                .await?;
            }
            Ok(())
        })
        .await?;
        self.catalogue_changed();
        self.session(tenant, session).await
    }

    /// One stored entity's state.
    pub(crate) async fn entity(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        kind: &str,
        id: &str,
    ) -> Result<Option<Value>, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(
                "select state from entities where tenant_id = $1 and session_id = $2 and kind = $3 and id = $4",
                &[&tenant.as_str(), &session.as_str(), &kind, &id],
            )
            .await?
            .map(|r| r.get(0)))
        })
        .await
    }
}

/// The decision of an interrupt that expired (§7.7).
pub const EXPIRED: &str = "expired";

/// The `interrupt.resolved` proposal deciding `interrupt` (its entity
/// state) with `decision`, placed where its request was.
fn resolution(
    interrupt: &Value,
    owner_run: Option<&Value>,
    id: &str,
    decision: &str,
) -> Result<Value, JournalError> {
    let owner: Owner = serde_json::from_value(interrupt.clone())
        .map_err(|e| JournalError::Corrupt(format!("interrupt {id}: {e}")))?;
    let mut event = json!({
        "protocolVersion": "narad/v1", "type": "interrupt.resolved", "eventId": EventId::new_v7(),
        "interruptId": id, "waitId": interrupt["waitId"], "decision": decision,
    });
    match owner {
        Owner::Run { run_id } => {
            event["runId"] = json!(run_id);
            event["rootRunId"] = owner_run
                .map(|r| r["rootRunId"].clone())
                .unwrap_or(Value::Null);
        }
        Owner::Workflow { workflow_id } => {
            event["scope"] = json!("workflow");
            event["workflowId"] = json!(workflow_id);
        }
    }
    Ok(event)
}

/// The event id of a command's event whose object id (`kind`, `id`) the
/// caller chose: the same in every attempt, so that the command sent again
/// appends the same event, which the journal answers as a duplicate
/// rather than a second event or a conflict.
fn repeatable_event_id(tenant: &TenantId, session: &SessionId, kind: &str, id: &str) -> String {
    crate::executors::derived_event_id(&[tenant.as_str(), session.as_str(), kind, id])
}
