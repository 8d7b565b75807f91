//! The append transaction: a batch of proposed authority events for one
//! session becomes durable, with its sequences, or nothing does.
//!
//! A proposal is an authority event without its sequences: the journal
//! assigns `sessionSequence`, the run-tree `sequence` and the
//! `workflowSequence` (§4.2), fills `sessionId`, a missing `timestamp`, and
//! the `workflowId` of a workflow-owned run's events.

use std::collections::{BTreeMap, BTreeSet};

use narad_protocol::engine::{
    EntityKey, SessionCore, SessionState, Status, WorkflowState, referenced_keys,
};
use narad_protocol::envelope::WorkflowPosition;
use narad_protocol::primitives::{Sequence, SessionId, Timestamp};
use narad_protocol::wire::AuthorityBody;
use narad_protocol::{AuthorityEvent, Classified, Reader, WireError, WireObject};
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::{BEGIN_SCOPED, Journal, JournalError, SET_TENANT, TenantId};

/// The largest batch one append takes.
pub const MAX_BATCH: usize = 1000;

/// Options of an append.
#[derive(Debug, Clone, Copy, Default)]
pub struct AppendOptions {
    /// Append only if the session is at exactly this sequence (optimistic
    /// concurrency); otherwise [`JournalError::SequenceMismatch`].
    pub expected_session_sequence: Option<u64>,
}

/// One appended event's identity and sequences.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AppendedEvent {
    /// The event.
    pub event_id: String,
    /// Its sessionSequence.
    pub session_sequence: u64,
    /// Its run-tree sequence, for run-tree events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// Its workflowSequence, for workflow events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow_sequence: Option<u64>,
}

/// The result of an append.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Appended {
    /// The batch's events, in order.
    pub events: Vec<AppendedEvent>,
    /// The whole batch had been appended before with the same bodies:
    /// nothing was written, and these are the stored sequences.
    pub duplicate: bool,
    /// The session's top-level slot became free.
    #[serde(skip)]
    pub slot_freed: bool,
    /// A queued start that became run.started in this transaction (its
    /// event is the last of `events`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dequeued: Option<String>,
}

/// A proposal made ready for the engine.
struct Prepared {
    event: AuthorityEvent,
    body: Value,
    sha256: Vec<u8>,
}

const SEQUENCE_FIELDS: [&str; 3] = ["sessionSequence", "sequence", "workflowSequence"];

/// Checks a proposal and parses it as an authority event, with
/// placeholder sequences the journal replaces once it holds the lock.
fn prepare(
    index: usize,
    proposal: &Value,
    session_id: &SessionId,
) -> Result<Prepared, JournalError> {
    let invalid = |pointer: &str, message: String| JournalError::Invalid {
        index,
        error: WireError::Invalid {
            pointer: pointer.to_owned(),
            message,
        },
    };
    let Some(object) = proposal.as_object() else {
        return Err(invalid(
            "",
            "a proposed event must be a JSON object".to_owned(),
        ));
    };
    if let Some(field) = SEQUENCE_FIELDS.iter().find(|f| object.contains_key(**f)) {
        return Err(invalid(
            &format!("/{field}"),
            "sequences are assigned by the journal: omit this field".to_owned(),
        ));
    }
    if !object.contains_key("eventId") {
        return Err(invalid(
            "/eventId",
            "missing field: a proposed event names its eventId, which makes retries idempotent"
                .to_owned(),
        ));
    }
    match object.get("sessionId") {
        Some(Value::String(s)) if s != session_id.as_str() => {
            return Err(invalid(
                "/sessionId",
                format!("names session {s:?}, but the batch is appended to {session_id}"),
            ));
        }
        _ => {}
    }
    let sha256 = Sha256::digest(
        serde_jcs::to_vec(proposal)
            .map_err(|e| invalid("", format!("cannot canonicalise: {e}")))?,
    )
    .to_vec();
    let mut body = proposal.clone();
    body["sessionId"] = json!(session_id);
    if !object.contains_key("timestamp") {
        body["timestamp"] = json!(Timestamp::now());
    }
    body["sessionSequence"] = json!(1);
    if object.contains_key("rootRunId") || object.contains_key("runId") {
        body["sequence"] = json!(1);
    }
    if object.contains_key("workflowId") {
        body["workflowSequence"] = json!(1);
    }
    let event = match Reader::all_profiles().classify(&body) {
        Ok(Classified::Accepted(object)) => match *object {
            WireObject::Authority(e) => e,
            other => {
                return Err(invalid(
                    "/type",
                    format!("{} is not an authority event", other.wire_type().name()),
                ));
            }
        },
        Ok(Classified::Ignored { type_name, .. }) => {
            return Err(JournalError::Invalid {
                index,
                error: WireError::Invalid {
                    pointer: "/type".to_owned(),
                    message: format!("{type_name:?} is not a narad/v1 type"),
                },
            });
        }
        Err(error) => return Err(JournalError::Invalid { index, error }),
    };
    Ok(Prepared {
        event,
        body,
        sha256,
    })
}

/// Loads the entities a batch can touch: those its events name, the open
/// runs of the run journals they name, and the workflows of those runs.
const LOAD_ENTITIES: &str = "
with wanted as (select * from unnest($3::text[], $4::text[]) as w(kind, id)),
direct as (
  select e.kind, e.id, e.state from entities e join wanted w on e.kind = w.kind and e.id = w.id
  where e.tenant_id = $1 and e.session_id = $2
),
open_runs as (
  select kind, id, state from entities
  where tenant_id = $1 and session_id = $2 and kind = 'run' and open and root_run_id = any($5::text[])
),
runs as (select * from direct where kind = 'run' union all select * from open_runs),
their_workflows as (
  select e.kind, e.id, e.state from entities e
  where e.tenant_id = $1 and e.session_id = $2 and e.kind = 'workflow'
    and e.id in (select state ->> 'workflowId' from runs where state ? 'workflowId')
)
select kind, id, state from direct
union select kind, id, state from open_runs
union select kind, id, state from their_workflows";

const LOCK_SESSION: &str = "select core, session_sequence from sessions \
    where tenant_id = $1 and session_id = $2 for update";

const FIND_EVENT_IDS: &str = "select event_id, session_id, session_sequence, run_sequence, \
    workflow_sequence, proposal_sha256 from events where tenant_id = $1 and event_id = any($2::text[])";

/// The first queued start of the session, with the entities its run.started
/// names (the run and its journal, should they exist, and its workflow).
const QUEUE_HEAD: &str = "
with head as (
  select queue_id, proposal from queued_starts
  where tenant_id = $1 and session_id = $2 order by priority, position limit 1
)
select head.queue_id, head.proposal,
  (select coalesce(jsonb_agg(jsonb_build_array(e.kind, e.id, e.state)), '[]') from entities e
   where e.tenant_id = $1 and e.session_id = $2
     and ((e.kind in ('run', 'run_journal') and e.id = head.proposal ->> 'runId')
       or (e.kind = 'workflow' and e.id = head.proposal ->> 'workflowId')))
from head";

const PENDING_CANCELLATIONS: &str = "select workflow_id, reason from pending_cancellations \
    where tenant_id = $1 and session_id = $2 and workflow_id = any($3::text[])";

const DELETE_CANCELLATIONS: &str = "delete from pending_cancellations \
    where tenant_id = $1 and session_id = $2 and workflow_id = any($3::text[])";

const DELETE_QUEUED: &str =
    "delete from queued_starts where tenant_id = $1 and session_id = $2 and queue_id = $3";

/// Round trip 2 in one statement: the events, their outbox rows, the
/// changed entities and the session's core.
const WRITE: &str = "
with inserted as (
  insert into events (tenant_id, session_id, session_sequence, event_id, type, root_run_id, run_id,
                      run_sequence, workflow_id, workflow_sequence, body, proposal_sha256)
  select $1, $2, * from unnest($3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[],
                               $8::bigint[], $9::text[], $10::bigint[], $11::jsonb[], $12::bytea[])
  returning session_sequence, event_id
), outboxed as (
  insert into outbox (tenant_id, session_id, session_sequence, event_id)
  select $1, $2, session_sequence, event_id from inserted
), upserted as (
  insert into entities (tenant_id, session_id, kind, id, state)
  select $1, $2, * from unnest($13::text[], $14::text[], $15::jsonb[])
  on conflict (tenant_id, session_id, kind, id) do update set state = excluded.state
)
update sessions set session_sequence = $16, core = $17 where tenant_id = $1 and session_id = $2";

impl Journal {
    /// Appends a batch of proposed authority events to a session: all of
    /// them, with contiguous sequences, or none.
    ///
    /// A batch whose eventIds were all appended before with the same
    /// bodies is an idempotent success returning the stored sequences; an
    /// eventId reused with another body is [`JournalError::EventIdConflict`].
    /// A batch breaking a rule is [`JournalError::Rejected`] with the index
    /// of the offending event and the rule.
    #[tracing::instrument(skip_all, fields(tenant = %tenant, session = %session_id, events = proposals.len()))]
    pub async fn append(
        &self,
        tenant: &TenantId,
        session_id: &SessionId,
        proposals: &[Value],
        options: AppendOptions,
    ) -> Result<Appended, JournalError> {
        if proposals.is_empty() || proposals.len() > MAX_BATCH {
            return Err(JournalError::InvalidParameter {
                parameter: "events",
                message: format!(
                    "a batch holds 1 to {MAX_BATCH} events, this one {}",
                    proposals.len()
                ),
            });
        }
        let mut prepared = proposals
            .iter()
            .enumerate()
            .map(|(i, p)| prepare(i, p, session_id))
            .collect::<Result<Vec<_>, _>>()?;

        let mut keys = BTreeSet::new();
        let mut roots = BTreeSet::new();
        for p in &prepared {
            for key in referenced_keys(&p.event) {
                if let EntityKey::RunJournal(root) = &key {
                    roots.insert(root.as_str().to_owned());
                }
                keys.insert(key);
            }
        }
        let kinds: Vec<&str> = keys.iter().map(EntityKey::kind).collect();
        let ids: Vec<&str> = keys.iter().map(EntityKey::id).collect();
        let roots: Vec<String> = roots.into_iter().collect();
        let event_ids: Vec<String> = prepared
            .iter()
            .map(|p| p.event.envelope.event_id.to_string())
            .collect();

        let client = self.pool.get().await?;
        let (set, lock, load, find) = futures::try_join!(
            client.prepare_cached(SET_TENANT),
            client.prepare_cached(LOCK_SESSION),
            client.prepare_cached(LOAD_ENTITIES),
            client.prepare_cached(FIND_EVENT_IDS),
        )?;
        let write = client.prepare_cached(WRITE).await?;
        let t = tenant.as_str();
        let s = session_id.as_str();

        // Round trip 1: begin, scope, lock, read.
        let set_params: [&Param<'_>; 1] = [&t];
        let lock_params: [&Param<'_>; 2] = [&t, &s];
        let load_params: [&Param<'_>; 5] = [&t, &s, &kinds, &ids, &roots];
        let find_params: [&Param<'_>; 2] = [&t, &event_ids];
        let read = futures::try_join!(
            client.batch_execute(BEGIN_SCOPED),
            client.query(&set, &set_params),
            client.query_opt(&lock, &lock_params),
            client.query(&load, &load_params),
            client.query(&find, &find_params),
        );
        let outcome = async {
            let (_, _, session, entities, existing) = read?;
            let Some(session) = session else {
                return Err(JournalError::SessionNotFound(s.to_owned()));
            };
            if !existing.is_empty() {
                return Ok(Step::Duplicate(duplicate(&prepared, s, &existing)?));
            }
            let mut core: SessionCore = serde_json::from_value(session.get::<_, Value>(0))
                .map_err(|e| JournalError::Corrupt(format!("session core: {e}")))?;
            // The column is the authority on the session's sequence.
            core.session_sequence = session.get::<_, i64>(1) as u64;
            let mut state = SessionState::from_core(core);
            for row in &entities {
                let (kind, id): (&str, &str) = (row.get(0), row.get(1));
                let key = EntityKey::from_parts(kind, id)
                    .ok_or_else(|| JournalError::Corrupt(format!("entity kind {kind}")))?;
                state
                    .load_entity(key, row.get(2))
                    .map_err(|e| JournalError::Corrupt(format!("entity {kind} {id}: {e}")))?;
            }
            if let Some(expected) = options.expected_session_sequence
                && expected != state.session_sequence
            {
                return Err(JournalError::SequenceMismatch {
                    expected,
                    actual: state.session_sequence,
                });
            }
            let mut before: BTreeMap<EntityKey, Value> = state.entities().into_iter().collect();
            let workflows_before = state.workflows.clone();
            let mut slot_freed = false;
            for (index, p) in prepared.iter_mut().enumerate() {
                assign(&state, p);
                let applied = state
                    .apply(&p.event)
                    .map_err(|violation| JournalError::Rejected { index, violation })?;
                slot_freed |= applied.slot_freed;
            }
            // A workflow asked to cancel that this batch left idle is
            // cancelled in this same transaction.
            let idle: Vec<String> = state
                .workflows
                .iter()
                .filter(|(id, w)| {
                    is_idle(w) && workflows_before.get(*id).is_some_and(|b| !is_idle(b))
                })
                .map(|(id, _)| id.to_string())
                .collect();
            let mut cancelled = Vec::new();
            if !idle.is_empty() {
                let pending = client.prepare_cached(PENDING_CANCELLATIONS).await?;
                for row in client.query(&pending, &[&t, &s, &idle]).await? {
                    let (workflow_id, reason): (String, Option<String>) = (row.get(0), row.get(1));
                    let proposal =
                        crate::commands::cancelled_proposal(&workflow_id, reason.as_deref());
                    match prepare(prepared.len(), &proposal, session_id) {
                        Ok(mut p) => {
                            assign(&state, &mut p);
                            match state.apply(&p.event) {
                                Ok(a) => {
                                    slot_freed |= a.slot_freed;
                                    prepared.push(p);
                                }
                                Err(v) => tracing::warn!(
                                    workflow_id,
                                    "a pending cancellation cannot apply: {v}"
                                ),
                            }
                        }
                        Err(e) => {
                            tracing::warn!(workflow_id, "a pending cancellation is invalid: {e}")
                        }
                    }
                    cancelled.push(workflow_id);
                }
            }
            // The slot freed: the first queued start becomes run.started in
            // this same transaction.
            let mut dequeued = None;
            if slot_freed && state.slot.is_none() {
                let head = client.prepare_cached(QUEUE_HEAD).await?;
                if let Some(row) = client.query_opt(&head, &[&t, &s]).await? {
                    let queue_id: String = row.get(0);
                    let proposal: Value = row.get(1);
                    let entities: Value = row.get(2);
                    for e in entities.as_array().into_iter().flatten() {
                        let (kind, id) = (e[0].as_str().unwrap_or(""), e[1].as_str().unwrap_or(""));
                        if let Some(key) = EntityKey::from_parts(kind, id) {
                            if !before.contains_key(&key) {
                                before.insert(key.clone(), e[2].clone());
                            }
                            state.load_entity(key, e[2].clone()).map_err(|err| {
                                JournalError::Corrupt(format!("entity {kind} {id}: {err}"))
                            })?;
                        }
                    }
                    match prepare(prepared.len(), &proposal, session_id) {
                        Ok(mut p) => {
                            assign(&state, &mut p);
                            match state.apply(&p.event) {
                                Ok(_) => prepared.push(p),
                                Err(v) => tracing::warn!(
                                    queue_id,
                                    rule = v.rule,
                                    "a queued start can no longer start and is dropped: {v}"
                                ),
                            }
                        }
                        Err(e) => tracing::warn!(
                            queue_id,
                            "a queued start is invalid and is dropped: {e}"
                        ),
                    }
                    dequeued = Some(queue_id);
                }
            }
            let changed: Vec<(EntityKey, Value)> = state
                .entities()
                .into_iter()
                .filter(|(k, v)| before.get(k) != Some(v))
                .collect();

            // Round trip 2: write and commit.
            let rows = EventRows::of(&prepared);
            let (ekinds, eids, estates) = (
                changed.iter().map(|(k, _)| k.kind()).collect::<Vec<_>>(),
                changed.iter().map(|(k, _)| k.id()).collect::<Vec<_>>(),
                changed.iter().map(|(_, v)| v).collect::<Vec<_>>(),
            );
            let core = serde_json::to_value(state.core()).expect("serialises");
            let last = state.session_sequence as i64;
            let write_params: [&Param<'_>; 17] = [
                &t,
                &s,
                &rows.session_sequence,
                &rows.event_id,
                &rows.type_name,
                &rows.root_run_id,
                &rows.run_id,
                &rows.run_sequence,
                &rows.workflow_id,
                &rows.workflow_sequence,
                &rows.body,
                &rows.sha256,
                &ekinds,
                &eids,
                &estates,
                &last,
                &core,
            ];
            let delete = client.prepare_cached(DELETE_QUEUED).await?;
            let dequeued_id = dequeued.clone().unwrap_or_default();
            let delete_params: [&Param<'_>; 3] = [&t, &s, &dequeued_id];
            let uncancel = client.prepare_cached(DELETE_CANCELLATIONS).await?;
            let uncancel_params: [&Param<'_>; 3] = [&t, &s, &cancelled];
            futures::try_join!(
                client.execute(&write, &write_params),
                async {
                    if dequeued.is_some() {
                        client.execute(&delete, &delete_params).await.map(|_| ())
                    } else {
                        Ok(())
                    }
                },
                async {
                    if cancelled.is_empty() {
                        Ok(())
                    } else {
                        client
                            .execute(&uncancel, &uncancel_params)
                            .await
                            .map(|_| ())
                    }
                },
                client.batch_execute("commit"),
            )
            .map_err(|e| event_id_conflict(e, &prepared))?;
            Ok(Step::Appended(Appended {
                events: prepared.iter().map(|p| appended(&p.event)).collect(),
                duplicate: false,
                slot_freed,
                dequeued,
            }))
        }
        .await;
        match outcome {
            Ok(Step::Appended(a)) => Ok(a),
            Ok(Step::Duplicate(a)) => {
                client.batch_execute("rollback").await?;
                Ok(a)
            }
            Err(e) => {
                // The transaction may be open or already ended; either way
                // the connection goes back to the pool outside one.
                let _ = client.batch_execute("rollback").await;
                Err(e)
            }
        }
    }
}

/// A statement parameter.
type Param<'a> = dyn tokio_postgres::types::ToSql + Sync + 'a;

/// A workflow with no open run, interrupt or pause: one that a pending
/// cancellation may end.
fn is_idle(w: &WorkflowState) -> bool {
    matches!(w.status, Status::Running) && w.open_runs.is_empty() && w.open_interrupts.is_empty()
}

enum Step {
    Appended(Appended),
    Duplicate(Appended),
}

/// Replaces the placeholder sequences with the next ones of the state,
/// and fills the workflow position of a workflow-owned run's event.
fn assign(state: &SessionState, p: &mut Prepared) {
    let env = &mut p.event.envelope;
    if env.workflow.is_none()
        && let Some(run) = &env.run
    {
        let owner = match &p.event.body {
            AuthorityBody::RunStarted(b) => b.parent_run_id.as_ref(),
            _ => Some(&run.run_id),
        };
        if let Some(w) = owner
            .and_then(|r| state.runs.get(r))
            .and_then(|r| r.workflow_id.clone())
        {
            p.body["workflowId"] = json!(w);
            env.workflow = Some(WorkflowPosition {
                workflow_id: w,
                workflow_sequence: Sequence::FIRST,
            });
        }
    }
    let seq = state.next_session_sequence();
    env.session_sequence = Sequence::new(seq).expect("in range");
    p.body["sessionSequence"] = json!(seq);
    if let Some(run) = &mut env.run {
        let n = state.next_run_sequence(&run.root_run_id);
        run.sequence = Sequence::new(n).expect("in range");
        p.body["sequence"] = json!(n);
    }
    if let Some(w) = &mut env.workflow {
        let n = state.next_workflow_sequence(&w.workflow_id);
        w.workflow_sequence = Sequence::new(n).expect("in range");
        p.body["workflowSequence"] = json!(n);
    }
}

fn appended(e: &AuthorityEvent) -> AppendedEvent {
    AppendedEvent {
        event_id: e.envelope.event_id.to_string(),
        session_sequence: e.envelope.session_sequence.get(),
        sequence: e.envelope.run.as_ref().map(|r| r.sequence.get()),
        workflow_sequence: e
            .envelope
            .workflow
            .as_ref()
            .map(|w| w.workflow_sequence.get()),
    }
}

/// A retried batch: the stored sequences when every event was appended
/// before, to this session, with the same body; a conflict otherwise.
fn duplicate(
    prepared: &[Prepared],
    session_id: &str,
    existing: &[tokio_postgres::Row],
) -> Result<Appended, JournalError> {
    let stored: BTreeMap<&str, &tokio_postgres::Row> =
        existing.iter().map(|r| (r.get::<_, &str>(0), r)).collect();
    let mut events = Vec::with_capacity(prepared.len());
    for p in prepared {
        let id = p.event.envelope.event_id.as_str();
        let same = stored.get(id).filter(|r| {
            r.get::<_, &str>(1) == session_id && r.get::<_, &[u8]>(5) == p.sha256.as_slice()
        });
        let Some(row) = same else {
            return Err(JournalError::EventIdConflict {
                event_id: stored
                    .keys()
                    .find(|k| {
                        let r = stored[*k];
                        r.get::<_, &str>(1) != session_id
                            || prepared.iter().any(|q| {
                                q.event.envelope.event_id.as_str() == **k
                                    && r.get::<_, &[u8]>(5) != q.sha256.as_slice()
                            })
                    })
                    .copied()
                    .unwrap_or(id)
                    .to_owned(),
            });
        };
        events.push(AppendedEvent {
            event_id: id.to_owned(),
            session_sequence: row.get::<_, i64>(2) as u64,
            sequence: row.get::<_, Option<i64>>(3).map(|n| n as u64),
            workflow_sequence: row.get::<_, Option<i64>>(4).map(|n| n as u64),
        });
    }
    Ok(Appended {
        events,
        duplicate: true,
        slot_freed: false,
        dequeued: None,
    })
}

/// A unique violation on the event id, which a concurrent append to
/// another session can cause, is a conflict; anything else a database error.
fn event_id_conflict(e: tokio_postgres::Error, prepared: &[Prepared]) -> JournalError {
    let on_event_id = e
        .as_db_error()
        .and_then(|d| d.constraint())
        .is_some_and(|c| c == "events_event_id_key");
    if on_event_id {
        JournalError::EventIdConflict {
            event_id: prepared
                .first()
                .map(|p| p.event.envelope.event_id.to_string())
                .unwrap_or_default(),
        }
    } else {
        JournalError::Database(e)
    }
}

/// The batch's events as the columns of one `unnest` insert.
struct EventRows<'a> {
    session_sequence: Vec<i64>,
    event_id: Vec<&'a str>,
    type_name: Vec<&'static str>,
    root_run_id: Vec<Option<&'a str>>,
    run_id: Vec<Option<&'a str>>,
    run_sequence: Vec<Option<i64>>,
    workflow_id: Vec<Option<&'a str>>,
    workflow_sequence: Vec<Option<i64>>,
    body: Vec<&'a Value>,
    sha256: Vec<&'a [u8]>,
}

impl<'a> EventRows<'a> {
    fn of(prepared: &'a [Prepared]) -> Self {
        let env = |p: &'a Prepared| &p.event.envelope;
        EventRows {
            session_sequence: prepared
                .iter()
                .map(|p| env(p).session_sequence.get() as i64)
                .collect(),
            event_id: prepared.iter().map(|p| env(p).event_id.as_str()).collect(),
            type_name: prepared
                .iter()
                .map(|p| p.event.body.wire_type().name())
                .collect(),
            root_run_id: prepared
                .iter()
                .map(|p| env(p).run.as_ref().map(|r| r.root_run_id.as_str()))
                .collect(),
            run_id: prepared
                .iter()
                .map(|p| env(p).run.as_ref().map(|r| r.run_id.as_str()))
                .collect(),
            run_sequence: prepared
                .iter()
                .map(|p| env(p).run.as_ref().map(|r| r.sequence.get() as i64))
                .collect(),
            workflow_id: prepared
                .iter()
                .map(|p| env(p).workflow.as_ref().map(|w| w.workflow_id.as_str()))
                .collect(),
            workflow_sequence: prepared
                .iter()
                .map(|p| {
                    env(p)
                        .workflow
                        .as_ref()
                        .map(|w| w.workflow_sequence.get() as i64)
                })
                .collect(),
            body: prepared.iter().map(|p| &p.body).collect(),
            sha256: prepared.iter().map(|p| p.sha256.as_slice()).collect(),
        }
    }
}
