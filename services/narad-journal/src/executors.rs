//! Client executors (§11) in the journal: leases, the delivery of client
//! tool calls under single-use execution tokens, finishes, and the work a
//! sweeper does when tokens lapse or executors go away.
//!
//! A `client_calls` row is written in the append transaction of every
//! `tool.call.started` with `executor=client` (see `group.rs`), and
//! closed in the one of its `tool.call.finished`, whoever appends it. A
//! token is issued once, when the call is handed to a live lease, and
//! stored as its SHA-256 only. Every terminal the server appends for a
//! client call has one eventId, derived from the call: a finish, an expiry
//! and a second replica's sweeper racing for the same call meet in the
//! journal's eventId deduplication, so exactly one terminal lands.

use std::time::Duration;

use narad_protocol::control::ClientToolExecute;
use narad_protocol::engine::{Issuer, RunState};
use narad_protocol::primitives::{EventId, SessionId};
use narad_protocol::rules;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{AppendOptions, Journal, JournalError, TenantId, in_tenant};

/// The pause reason of a run whose client executor is away (§11.2).
pub const EXECUTOR_UNAVAILABLE: &str = "client_executor_unavailable";

/// How often a finish is retried while its run journal owes a blocking
/// interrupt's pause, and how long apart.
const PAUSE_OWED_RETRIES: usize = 20;
const PAUSE_OWED_WAIT: Duration = Duration::from_millis(100);

/// The advisory lock that makes one replica at a time the sweeper.
const SWEEPER_LOCK: i64 = 0x6e61_7261_645f_7377; // "narad_sw"

/// A lease of a client executor (§11.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The fencing token of this attachment.
    pub lease_id: String,
    /// When it lapses without a heartbeat (RFC 3339).
    pub expires_at: String,
}

/// A client call handed to a lease: the control to send, and the call's
/// session.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The session of the call.
    pub session_id: String,
    /// The `client.tool.execute` to send.
    pub execute: ClientToolExecute,
}

/// An accepted `client.tool.finish`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FinishAccepted {
    /// The call it finished.
    #[schema(schema_with = crate::openapi::id)]
    pub tool_call_id: String,
    /// The session of the call.
    #[schema(schema_with = crate::openapi::id)]
    pub session_id: String,
    /// The `tool.call.finished` that records it.
    #[schema(schema_with = crate::openapi::id)]
    pub event_id: String,
    /// Its sessionSequence.
    #[schema(schema_with = crate::openapi::sequence)]
    pub session_sequence: u64,
    /// The same finish had been accepted before: nothing new was appended.
    pub duplicate: bool,
}

/// What a sweeper found due (see `executor_work` in the migrations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepKind {
    /// A delivered call whose token lapsed without a finish.
    Expired,
    /// A call that waited for delivery longer than allowed.
    Undelivered,
    /// A call waiting for delivery whose run was asked to stop.
    Stopping,
    /// A run with an open client call whose executor holds no live lease.
    Away,
    /// A run paused for its executor, whose executor is back.
    Back,
}

/// A pause of a run for its executor, planned on what was read
/// ([`Journal::plan_executor_pause`]).
#[derive(Debug, Clone, Copy)]
pub struct ExecutorPause {
    /// The session's sequence when the run was read.
    seen: u64,
}

/// One item of a sweeper's work.
#[derive(Debug, Clone)]
pub struct SweepItem {
    /// What is due.
    pub kind: SweepKind,
    /// The tenant.
    pub tenant: TenantId,
    /// The session.
    pub session_id: String,
    /// The call (`Expired`, `Undelivered`, `Stopping`).
    pub tool_call_id: Option<String>,
    /// The run's journal.
    pub root_run_id: String,
    /// The run.
    pub run_id: String,
    /// The executor.
    pub executor_id: String,
    /// The pause cycle to resume (`Back`).
    pub wait_id: Option<String>,
}

/// The SHA-256 of an execution token, as stored.
fn token_digest(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// An eventId derived from `parts` (a UUIDv8 of their SHA-256), so that
/// every replica proposing the same server event proposes the same id.
pub(crate) fn derived_event_id(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for p in parts {
        hash.update(p.as_bytes());
        hash.update([0]);
    }
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// The eventId of the `tool.call.finished` the server appends for a
/// client call (a finish, an expiry, a failed delivery, a stop).
pub fn client_terminal_event_id(tenant: &TenantId, session_id: &str, tool_call_id: &str) -> String {
    derived_event_id(&[
        "narad/client-call-terminal",
        tenant.as_str(),
        session_id,
        tool_call_id,
    ])
}

/// What the journal holds of one client call.
struct CallRow {
    session_id: String,
    tool_call_id: String,
    root_run_id: String,
    run_id: String,
    executor_id: String,
    lease_id: Option<String>,
    live: bool,
    closed: bool,
    /// A token was issued for it and has expired.
    expired: bool,
}

const CALL_COLUMNS: &str = "session_id, tool_call_id, root_run_id, run_id, executor_id, lease_id, \
    coalesce(token_expires_at > now(), false), closed, coalesce(token_expires_at <= now(), false)";

impl CallRow {
    fn of(r: &tokio_postgres::Row) -> CallRow {
        CallRow {
            session_id: r.get(0),
            tool_call_id: r.get(1),
            root_run_id: r.get(2),
            run_id: r.get(3),
            executor_id: r.get(4),
            lease_id: r.get(5),
            live: r.get(6),
            closed: r.get(7),
            expired: r.get(8),
        }
    }
}

/// A `tool.call.finished` proposal for a client call.
fn terminal_proposal(
    tenant: &TenantId,
    call: &CallRow,
    outcome: &str,
    response: &Value,
    code: Option<&str>,
    message: Option<&str>,
) -> Value {
    let mut event = json!({
        "protocolVersion": "narad/v1", "type": "tool.call.finished",
        "eventId": client_terminal_event_id(tenant, &call.session_id, &call.tool_call_id),
        "rootRunId": call.root_run_id, "runId": call.run_id, "toolCallId": call.tool_call_id,
        "outcome": outcome, "response": response,
    });
    if let Some(c) = code {
        event["code"] = json!(c);
    }
    if let Some(m) = message {
        event["message"] = json!(m);
    }
    event
}

fn session(id: &str) -> Result<SessionId, JournalError> {
    SessionId::new(id.to_owned()).map_err(JournalError::Corrupt)
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl Journal {
    /// Attaches a client executor: a new lease that supersedes any earlier
    /// one of the same endpoint (§11.1).
    pub async fn attach_executor(
        &self,
        tenant: &TenantId,
        executor_id: &str,
        ttl: Duration,
    ) -> Result<Lease, JournalError> {
        self.attach_executor_within(tenant, executor_id, ttl, None)
            .await
    }

    /// Refuses, as [`Journal::attach_executor_within`] would, when `tenant`
    /// has `max` executors other than `executor_id` holding live leases:
    /// a check before a WebSocket switches protocols (the attach on the
    /// socket checks again, under the tenant's lock).
    pub async fn executor_room(
        &self,
        tenant: &TenantId,
        executor_id: &str,
        max: Option<u64>,
    ) -> Result<(), JournalError> {
        let Some(max) = max else {
            return Ok(());
        };
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            within_executor_limit(c, tenant, executor_id, max).await
        })
        .await
    }

    /// Attaches an executor if `tenant` has fewer than `max` others (when
    /// given) holding live leases: re-attaching one that holds a lease is
    /// always allowed; at the limit, [`JournalError::LimitReached`].
    pub async fn attach_executor_within(
        &self,
        tenant: &TenantId,
        executor_id: &str,
        ttl: Duration,
        max: Option<u64>,
    ) -> Result<Lease, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            if let Some(max) = max {
                within_executor_limit(c, tenant, executor_id, max).await?;
            }
            let row = c
                .query_one(
                    "insert into executors (tenant_id, executor_id, lease_id, lease_expires_at) \
                     values ($1, $2, gen_random_uuid()::text, now() + make_interval(secs => $3)) \
                     on conflict (tenant_id, executor_id) do update set \
                       lease_id = excluded.lease_id, lease_expires_at = excluded.lease_expires_at, \
                       attached_at = now() \
                     returning lease_id, rfc3339(lease_expires_at)",
                    &[&tenant.as_str(), &executor_id, &seconds(ttl)],
                )
                .await?;
            Ok(Lease {
                lease_id: row.get(0),
                expires_at: row.get(1),
            })
        })
        .await
    }

    /// Renews a live lease (`client.heartbeat`, §11.2). A superseded or
    /// lapsed lease is [`JournalError::LeaseNotCurrent`]: attach again.
    pub async fn renew_lease(
        &self,
        tenant: &TenantId,
        executor_id: &str,
        lease_id: &str,
        ttl: Duration,
    ) -> Result<Lease, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            let row = c
                .query_opt(
                    "update executors set lease_expires_at = now() + make_interval(secs => $4) \
                     where tenant_id = $1 and executor_id = $2 and lease_id = $3 \
                       and lease_expires_at > now() \
                     returning rfc3339(lease_expires_at)",
                    &[&tenant.as_str(), &executor_id, &lease_id, &seconds(ttl)],
                )
                .await?;
            match row {
                Some(row) => Ok(Lease {
                    lease_id: lease_id.to_owned(),
                    expires_at: row.get(0),
                }),
                None => Err(JournalError::LeaseNotCurrent(format!(
                    "lease {lease_id} of executor {executor_id} is superseded or has lapsed; \
                     attach again for a new lease"
                ))),
            }
        })
        .await
    }

    /// Whether `lease_id` is the executor's current lease and has not
    /// lapsed.
    pub async fn lease_is_live(
        &self,
        tenant: &TenantId,
        executor_id: &str,
        lease_id: &str,
    ) -> Result<bool, JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(
                "select 1 from executors where tenant_id = $1 and executor_id = $2 \
                 and lease_id = $3 and lease_expires_at > now()",
                &[&tenant.as_str(), &executor_id, &lease_id],
            )
            .await?
            .is_some())
        })
        .await
    }

    /// Ends a lease at once (its executor said goodbye): runs that need
    /// the executor are paused at the next sweep instead of after the
    /// lease's lifetime. A superseded lease is left as it is.
    pub async fn expire_lease(
        &self,
        tenant: &TenantId,
        executor_id: &str,
        lease_id: &str,
    ) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        in_tenant(client, tenant, async |c| {
            c.execute(
                "update executors set lease_expires_at = least(lease_expires_at, now()) \
                 where tenant_id = $1 and executor_id = $2 and lease_id = $3",
                &[&tenant.as_str(), &executor_id, &lease_id],
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// Deletes up to `max` closed client calls started more than
    /// `older_than` ago, across tenants; the number deleted.
    pub async fn forget_client_calls(
        &self,
        older_than: Duration,
        max: i32,
    ) -> Result<i64, JournalError> {
        self.forget("select client_calls_forget($1, $2)", older_than, max)
            .await
    }

    /// Runs a retention function `select f(older_than_seconds, max_rows)`
    /// (security definer, across tenants); the number of rows it deleted.
    pub(crate) async fn forget(
        &self,
        call: &str,
        older_than: Duration,
        max: i32,
    ) -> Result<i64, JournalError> {
        let client = self.pool.get().await?;
        Ok(client
            .query_one(call, &[&older_than.as_secs_f64(), &max])
            .await?
            .get(0))
    }

    /// Hands the calls waiting for `executor_id` to its live lease
    /// `lease_id`: each gets its one execution token, valid for
    /// `token_ttl`, and comes back as the `client.tool.execute` to send
    /// (§11.3). A lease that is not live gets nothing. A call is handed out
    /// once, ever: a second caller finds it taken.
    pub async fn deliver_client_calls(
        &self,
        tenant: &TenantId,
        executor_id: &str,
        lease_id: &str,
        token_ttl: Duration,
        max: i64,
    ) -> Result<Vec<Delivery>, JournalError> {
        let client = self.pool.get().await?;
        let rows = in_tenant(client, tenant, async |c| {
            Ok(c.query(
                "with lease as (
                   select 1 from executors
                   where tenant_id = $1 and executor_id = $2 and lease_id = $3
                     and lease_expires_at > now()
                   for share
                 ), due as (
                   select c.session_id, c.tool_call_id from client_calls c
                   where c.tenant_id = $1 and c.executor_id = $2 and c.token_sha256 is null
                     and not c.closed and not c.withdrawn and exists (select 1 from lease)
                     and not exists (
                       select 1 from entities e
                       where e.tenant_id = $1 and e.session_id = c.session_id and e.kind = 'run'
                         and e.id = c.run_id
                         and coalesce((e.state ->> 'stopRequested')::boolean, false))
                   order by c.started_at limit $5
                   for update of c skip locked
                 ), issued as materialized (
                   select d.session_id, d.tool_call_id,
                          replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '') as token
                   from due d
                 )
                 update client_calls c set token_sha256 = sha256(convert_to(i.token, 'UTF8')),
                   lease_id = $3, token_expires_at = now() + make_interval(secs => $4)
                 from issued i
                 where c.tenant_id = $1 and c.session_id = i.session_id
                   and c.tool_call_id = i.tool_call_id
                 returning i.token, c.tool_call_id, c.tool_name, c.args, rfc3339(c.token_expires_at),
                   c.session_id",
                &[
                    &tenant.as_str(),
                    &executor_id,
                    &lease_id,
                    &seconds(token_ttl),
                    &max,
                ],
            )
            .await?)
        })
        .await?;
        if !rows.is_empty() {
            metrics::counter!("narad_executor_deliveries_total").increment(rows.len() as u64);
        }
        rows.iter()
            .map(|r| {
                let control = json!({
                    "clientExecutorId": executor_id, "leaseId": lease_id,
                    "executionToken": r.get::<_, String>(0),
                    "executionTokenExpiresAt": r.get::<_, String>(4),
                    "toolCallId": r.get::<_, String>(1), "toolName": r.get::<_, String>(2),
                    "args": r.get::<_, Value>(3),
                });
                Ok(Delivery {
                    session_id: r.get(5),
                    execute: serde_json::from_value(control)
                        .map_err(|e| JournalError::Corrupt(format!("a client call: {e}")))?,
                })
            })
            .collect()
    }

    /// Records a `client.tool.finish` (§11.3 rules 6–8): the token must be
    /// one this tenant issued to `executor_id`, `lease_id` the lease it was
    /// issued under (a later lease cannot claim it, §11.1), and unexpired;
    /// then `tool.call.finished` is appended with exactly the finish's
    /// outcome and response. The same finish again is an idempotent
    /// success; another one for the same token is
    /// [`JournalError::FinishConflict`].
    pub async fn finish_client_call(
        &self,
        tenant: &TenantId,
        executor_id: &str,
        lease_id: &str,
        finish: &narad_protocol::control::ClientToolFinish,
    ) -> Result<FinishAccepted, JournalError> {
        let digest = token_digest(finish.execution_token.as_str());
        let call = self.call(tenant, CallKey::Token(&digest)).await?;
        let invalid = || {
            JournalError::TokenInvalid(
                "this execution token was not issued to this executor; \
                 finish only tokens received in client.tool.execute"
                    .to_owned(),
            )
        };
        let Some(call) = call else {
            return Err(invalid());
        };
        if call.executor_id != executor_id
            || finish
                .tool_call_id
                .as_ref()
                .is_some_and(|t| t.as_str() != call.tool_call_id)
        {
            return Err(invalid());
        }
        if call.lease_id.as_deref() != Some(lease_id) {
            return Err(JournalError::LeaseNotCurrent(format!(
                "the token of tool call {} was issued under another lease; finish it under the \
                 lease it was delivered with (a later lease cannot claim it)",
                call.tool_call_id
            )));
        }
        let expired = || {
            JournalError::TokenExpired(format!(
                "the token of tool call {} expired; the call is closed as \
                 client_execution_expired (or cancelled, under a stop)",
                call.tool_call_id
            ))
        };
        if !call.live && !call.closed {
            return Err(expired());
        }
        let outcome = serde_json::to_value(finish.outcome).expect("serialises");
        let proposal = terminal_proposal(
            tenant,
            &call,
            outcome.as_str().unwrap_or("error"),
            &finish.response,
            finish.code.as_ref().map(|c| c.as_str()),
            finish.message.as_deref(),
        );
        let sid = session(&call.session_id)?;
        // A run journal that owes a blocking interrupt's pause takes no
        // other event until its runtime appends it: a moment's wait, not a
        // refusal of the finish.
        let mut waits = 0;
        let appended = loop {
            let appended = self
                .append(
                    tenant,
                    &sid,
                    std::slice::from_ref(&proposal),
                    AppendOptions {
                        issuer: Issuer::Executor,
                        ..AppendOptions::default()
                    },
                )
                .await;
            match &appended {
                Err(JournalError::Rejected { violation, .. })
                    if violation.rule == rules::INTERRUPT_PAUSE_CONSECUTIVE.id
                        && waits < PAUSE_OWED_RETRIES =>
                {
                    waits += 1;
                    tokio::time::sleep(PAUSE_OWED_WAIT).await;
                }
                _ => break appended,
            }
        };
        if !call.live {
            // Past expiry only the same finish, accepted before, answers
            // (as the idempotent success it was).
            if !appended.as_ref().is_ok_and(|a| a.duplicate) {
                return Err(expired());
            }
        }
        match appended {
            Ok(appended) => {
                if !appended.duplicate {
                    // A run paused for its executor may need it no longer.
                    self.resume_if_unneeded(tenant, &call.session_id, &call.run_id)
                        .await?;
                }
                let event = &appended.events[0];
                Ok(FinishAccepted {
                    tool_call_id: call.tool_call_id,
                    session_id: call.session_id,
                    event_id: event.event_id.clone(),
                    session_sequence: event.session_sequence,
                    duplicate: appended.duplicate,
                })
            }
            Err(JournalError::EventIdConflict { .. }) => {
                Err(JournalError::FinishConflict(format!(
                    "tool call {} was already closed with another outcome or response; \
                 a token finishes once",
                    call.tool_call_id
                )))
            }
            Err(JournalError::Rejected { violation, .. })
                if violation.rule == rules::TOOL_CALL_FINISHED_ONCE.id =>
            {
                Err(JournalError::FinishConflict(format!(
                    "tool call {} was already closed: {}",
                    call.tool_call_id, violation.message
                )))
            }
            Err(e) => Err(e),
        }
    }

    /// Closes a client call the executor will not finish (expiry, failed
    /// delivery, stop): `tool.call.finished` with `outcome` and `code`, then
    /// the run resumed if it was paused for its executor and needs it no
    /// longer. `false` when the call was closed already, or (with
    /// `undelivered`) when a token was issued for it meanwhile: a call
    /// closed as never delivered is first withdrawn, so that no executor
    /// receives it after all.
    pub async fn close_client_call(
        &self,
        tenant: &TenantId,
        session_id: &str,
        tool_call_id: &str,
        undelivered: bool,
        terminal: (&str, &str, &str),
    ) -> Result<bool, JournalError> {
        let (outcome, code, message) = terminal;
        let call = if undelivered {
            self.call(tenant, CallKey::Withdraw(session_id, tool_call_id))
                .await?
        } else {
            self.call(tenant, CallKey::Id(session_id, tool_call_id))
                .await?
        };
        let Some(call) = call.filter(|c| !c.closed) else {
            return Ok(false);
        };
        // An expiry close is a fact about the token: only once one was
        // issued and its expiry has passed (§11.3 rule 9).
        if code == narad_protocol::engine::CLIENT_EXECUTION_EXPIRED && !call.expired {
            return Ok(false);
        }
        let proposal = terminal_proposal(
            tenant,
            &call,
            outcome,
            &Value::Null,
            Some(code),
            Some(message),
        );
        let sid = session(&call.session_id)?;
        let closed = match self
            .append(tenant, &sid, &[proposal], AppendOptions::default())
            .await
        {
            Ok(a) => !a.duplicate,
            Err(JournalError::EventIdConflict { .. }) => false,
            Err(JournalError::Rejected { violation, .. })
                if violation.rule == rules::TOOL_CALL_FINISHED_ONCE.id =>
            {
                false
            }
            Err(e) => return Err(e),
        };
        self.resume_if_unneeded(tenant, &call.session_id, &call.run_id)
            .await?;
        Ok(closed)
    }

    /// The stop request and status of a run, from its entity.
    pub async fn run_state(
        &self,
        tenant: &TenantId,
        session_id: &str,
        run_id: &str,
    ) -> Result<Option<RunState>, JournalError> {
        let state = self
            .entity(tenant, &session(session_id)?, "run", run_id)
            .await?;
        state
            .map(|s| {
                serde_json::from_value(s)
                    .map_err(|e| JournalError::Corrupt(format!("run {run_id}: {e}")))
            })
            .transpose()
    }

    /// Pauses a running run whose client executor is away (`run.paused`,
    /// reason `client_executor_unavailable`, resumeMode `automatic`;
    /// §11.2). `false` when the run is not running (paused for another
    /// reason, stopping, ended), which is left as it is, and when the
    /// session moved on between the read and the pause (the next sweep
    /// looks again): [`Journal::plan_executor_pause`], then
    /// [`Journal::apply_executor_pause`].
    pub async fn pause_for_executor(
        &self,
        tenant: &TenantId,
        item: &SweepItem,
    ) -> Result<bool, JournalError> {
        match self.plan_executor_pause(tenant, item).await? {
            Some(plan) => self.apply_executor_pause(tenant, item, plan).await,
            None => Ok(false),
        }
    }

    /// Reads whether `item`'s run may be paused for its executor: `None`
    /// when it is not running; otherwise the session's sequence read
    /// before the run, which the pause then expects.
    pub async fn plan_executor_pause(
        &self,
        tenant: &TenantId,
        item: &SweepItem,
    ) -> Result<Option<ExecutorPause>, JournalError> {
        let seen = self
            .session(tenant, &item.session_id)
            .await?
            .session_sequence;
        let Some(run) = self
            .run_state(tenant, &item.session_id, &item.run_id)
            .await?
        else {
            return Ok(None);
        };
        if run.status.is_paused() || run.status.is_terminal() || run.stop_requested {
            return Ok(None);
        }
        Ok(Some(ExecutorPause { seen }))
    }

    /// Appends the pause [`Journal::plan_executor_pause`] planned, only if
    /// nothing was appended to the session since (a stop asked for in
    /// between must not be followed by the server's pause, which would
    /// make the backend resume the run before it may end it).
    pub async fn apply_executor_pause(
        &self,
        tenant: &TenantId,
        item: &SweepItem,
        plan: ExecutorPause,
    ) -> Result<bool, JournalError> {
        let pause = json!({
            "protocolVersion": "narad/v1", "type": "run.paused", "eventId": EventId::new_v7(),
            "rootRunId": item.root_run_id, "runId": item.run_id,
            "waitId": format!("executor-{}", EventId::new_v7()),
            "reason": EXECUTOR_UNAVAILABLE, "resumeMode": "automatic",
            "message": format!(
                "client executor {} is unavailable; the run resumes when it attaches again",
                item.executor_id
            ),
        });
        let sid = session(&item.session_id)?;
        let options = AppendOptions {
            expected_session_sequence: Some(plan.seen),
            ..AppendOptions::default()
        };
        match self.append(tenant, &sid, &[pause], options).await {
            Ok(_) => Ok(true),
            Err(JournalError::Rejected { .. } | JournalError::SequenceMismatch { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Resumes a run paused for its executor (`run.resumed` of that pause
    /// cycle). Every replica proposes the same eventId, so a second resume
    /// is a duplicate; a run no longer paused is left alone.
    pub async fn resume_for_executor(
        &self,
        tenant: &TenantId,
        session_id: &str,
        root_run_id: &str,
        run_id: &str,
        wait_id: &str,
    ) -> Result<bool, JournalError> {
        let resume = json!({
            "protocolVersion": "narad/v1", "type": "run.resumed",
            "eventId": derived_event_id(&["narad/executor-resume", tenant.as_str(), session_id, run_id, wait_id]),
            "rootRunId": root_run_id, "runId": run_id, "waitId": wait_id,
        });
        let sid = session(session_id)?;
        match self
            .append(tenant, &sid, &[resume], AppendOptions::default())
            .await
        {
            Ok(a) => Ok(!a.duplicate),
            Err(JournalError::Rejected { violation, .. })
                if violation.rule == rules::RUN_RESUME_NOT_PAUSED.id
                    || violation.rule == rules::RUN_RESUME_WAIT.id
                    || violation.rule == rules::RUN_TERMINAL_ONCE.id =>
            {
                // Not paused on this cycle (any more): the record is stale.
                let client = self.pool.get().await?;
                in_tenant(client, tenant, async |c| {
                    c.execute(
                        "delete from executor_pauses where tenant_id = $1 and session_id = $2 \
                         and run_id = $3 and wait_id = $4",
                        &[&tenant.as_str(), &session_id, &run_id, &wait_id],
                    )
                    .await?;
                    Ok(())
                })
                .await?;
                Ok(false)
            }
            Err(JournalError::Rejected { .. } | JournalError::EventIdConflict { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Resumes every run paused for `executor_id` (it has just attached).
    pub async fn resume_executor_runs(
        &self,
        tenant: &TenantId,
        executor_id: &str,
    ) -> Result<usize, JournalError> {
        let client = self.pool.get().await?;
        let paused = in_tenant(client, tenant, async |c| {
            Ok(c.query(
                "select session_id, root_run_id, run_id, wait_id from executor_pauses \
                 where tenant_id = $1 and executor_id = $2",
                &[&tenant.as_str(), &executor_id],
            )
            .await?)
        })
        .await?;
        let mut resumed = 0;
        for r in &paused {
            if self
                .resume_for_executor(tenant, r.get(0), r.get(1), r.get(2), r.get(3))
                .await?
            {
                resumed += 1;
            }
        }
        Ok(resumed)
    }

    /// Resumes a run paused for its executor when nothing of it still
    /// waits on an absent executor: no open client call, or a live lease.
    async fn resume_if_unneeded(
        &self,
        tenant: &TenantId,
        session_id: &str,
        run_id: &str,
    ) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        let pause = in_tenant(client, tenant, async |c| {
            Ok(c.query_opt(
                "select p.root_run_id, p.wait_id from executor_pauses p \
                 where p.tenant_id = $1 and p.session_id = $2 and p.run_id = $3 \
                   and (not exists (select 1 from client_calls c \
                                    where c.tenant_id = $1 and c.session_id = $2 \
                                      and c.run_id = $3 and not c.closed) \
                        or exists (select 1 from executors x \
                                   where x.tenant_id = $1 and x.executor_id = p.executor_id \
                                     and x.lease_expires_at > now()))",
                &[&tenant.as_str(), &session_id, &run_id],
            )
            .await?)
        })
        .await?;
        if let Some(p) = pause {
            self.resume_for_executor(tenant, session_id, p.get(0), run_id, p.get(1))
                .await?;
        }
        Ok(())
    }

    /// What is due across tenants: lapsed tokens, calls that waited too
    /// long for delivery or whose run is stopping, runs whose executor is
    /// away, runs whose executor is back; at most `max` of each kind.
    pub async fn executor_work(
        &self,
        max_wait: Duration,
        max: i32,
    ) -> Result<Vec<SweepItem>, JournalError> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "select kind, tenant_id, session_id, tool_call_id, root_run_id, run_id, \
                 executor_id, wait_id from executor_work($1, $2)",
                &[&max_wait.as_secs_f64(), &max],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let kind = match r.get::<_, &str>(0) {
                    "expired" => SweepKind::Expired,
                    "undelivered" => SweepKind::Undelivered,
                    "stopping" => SweepKind::Stopping,
                    "away" => SweepKind::Away,
                    "back" => SweepKind::Back,
                    other => return Err(JournalError::Corrupt(format!("sweep kind {other}"))),
                };
                Ok(SweepItem {
                    kind,
                    tenant: TenantId::new(r.get::<_, String>(1)).map_err(JournalError::Corrupt)?,
                    session_id: r.get(2),
                    tool_call_id: r.get(3),
                    root_run_id: r.get(4),
                    run_id: r.get(5),
                    executor_id: r.get(6),
                    wait_id: r.get(7),
                })
            })
            .collect()
    }

    /// Runs `body` if this process holds the sweeper's advisory lock (one
    /// replica at a time); `None` when another holds it. A lock holder that
    /// dies loses it with its connection.
    pub async fn as_sweeper<T>(
        &self,
        body: impl AsyncFnOnce() -> T,
    ) -> Result<Option<T>, JournalError> {
        self.with_advisory_lock(SWEEPER_LOCK, body).await
    }

    /// Runs `body` holding the session-level advisory lock `lock`, if it
    /// can be had now; `None` when another session holds it.
    pub(crate) async fn with_advisory_lock<T>(
        &self,
        lock: i64,
        body: impl AsyncFnOnce() -> T,
    ) -> Result<Option<T>, JournalError> {
        let client = self.pool.get().await?;
        let got: bool = client
            .query_one("select pg_try_advisory_lock($1)", &[&lock])
            .await?
            .get(0);
        if !got {
            return Ok(None);
        }
        // Should the caller give up mid-way, the connection is closed (and
        // the lock with it) rather than pooled while holding it.
        let mut guard = crate::Abandoned(Some(client));
        let out = body().await;
        // Should the unlock fail, the guard closes the connection (and the
        // lock goes with it) rather than pooling it with the lock held.
        guard
            .0
            .as_ref()
            .expect("held")
            .query_one("select pg_advisory_unlock($1)", &[&lock])
            .await?;
        drop(guard.0.take());
        Ok(Some(out))
    }

    /// A client call by its token's digest, or by session and id.
    async fn call(
        &self,
        tenant: &TenantId,
        key: CallKey<'_>,
    ) -> Result<Option<CallRow>, JournalError> {
        let client = self.pool.get().await?;
        let t = tenant.as_str();
        let row = in_tenant(client, tenant, async |c| {
            Ok(match key {
                CallKey::Token(digest) => {
                    c.query_opt(
                        &format!("select {CALL_COLUMNS} from client_calls where tenant_id = $1 and token_sha256 = $2"),
                        &[&t, &digest],
                    )
                    .await?
                }
                CallKey::Withdraw(session_id, tool_call_id) => {
                    c.query_opt(
                        &format!("update client_calls set withdrawn = true where tenant_id = $1 and session_id = $2 and tool_call_id = $3 and token_sha256 is null and not closed returning {CALL_COLUMNS}"),
                        &[&t, &session_id, &tool_call_id],
                    )
                    .await?
                }
                CallKey::Id(session_id, tool_call_id) => {
                    c.query_opt(
                        &format!("select {CALL_COLUMNS} from client_calls where tenant_id = $1 and session_id = $2 and tool_call_id = $3"),
                        &[&t, &session_id, &tool_call_id],
                    )
                    .await?
                }
            })
        })
        .await?;
        Ok(row.as_ref().map(CallRow::of))
    }
}

/// How a client call is looked up.
#[derive(Clone, Copy)]
enum CallKey<'a> {
    /// By its token's SHA-256.
    Token(&'a [u8]),
    /// By session and toolCallId.
    Id(&'a str, &'a str),
    /// By session and toolCallId, withdrawn from delivery in the same
    /// statement; none if a token was issued for it.
    Withdraw(&'a str, &'a str),
}

/// Refuses when `tenant` has `max` executors other than `executor_id`
/// holding live leases (counted under the tenant's lock).
async fn within_executor_limit(
    c: &deadpool_postgres::Client,
    tenant: &TenantId,
    executor_id: &str,
    max: u64,
) -> Result<(), JournalError> {
    crate::quotas::within_quota(
        c,
        tenant,
        "executors",
        "select count(*) from executors where tenant_id = $1 \
           and executor_id <> $2 and lease_expires_at > now()",
        &[&tenant.as_str(), &executor_id],
        max,
        |max| JournalError::LimitReached {
            code: narad_protocol::ErrorCode::ExecutorLimitReached,
            message: format!(
                "this organisation has {max} client executors attached, its limit; \
                 detach one or let its lease lapse, then attach again"
            ),
        },
    )
    .await
}
