//! What the chat front-end routes share (`POST /v1/chat` for the AI SDK's
//! `useChat`, `POST /v1/ag-ui` for AG-UI clients): the one client executor
//! a session's front ends answer tool calls as, whichever toolkit they
//! speak, and the finish of those calls when a front end sends its answers.
//!
//! A front end is not an executor that holds a lease: it answers in its
//! next request. The route attaches as the session's front-end executor
//! only while it records those answers (attach, take delivery, finish each
//! call under its own execution token, let the lease go), so the journal's
//! fencing (one lease, one token per call, a finish recorded once) holds
//! for them as for any executor. Between two requests the executor is
//! away: a run waiting on its calls is paused as for any executor that is
//! away, resumed when the answers come, and a call nobody answers within
//! the executors' delivery timeout is closed `client_unavailable`.
//!
//! A front end's abort (`useChat`'s `stop()`, AG-UI's `abortRun()`) is the
//! client breaking its stream off, as a reload or a closed tab is: a
//! stream broken off before its answer ended asks the run to stop
//! (`stop-run`, reason `front_end.abort`, the caller as actor) after the
//! grace `NARAD_CHAT_ABORT_GRACE_MS`, unless a front end opened a stream on
//! the session meanwhile on any replica ([`returned`]: a reload with
//! `resume: true`, an AG-UI rejoin). The grace is kept by the replica that
//! held the stream: one that dies within it stops nothing (the run goes on,
//! as if the client had not aborted).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use narad_journal::{JournalError, SessionRecord, TenantId};
use narad_protocol::ErrorCode;
use narad_protocol::profile::ProfileSet;
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, mpsc};

use super::front_end_caller::Caller;
use super::sse::Connection;
use crate::AppState;
use crate::audit::RequestId;
use crate::auth::{Permission, Principal};
use crate::body::Query;
use crate::error::{ApiError, ApiResult};
use crate::quotas::StreamSlot;

/// 400 `NRD-0003` naming the body's member at `pointer` (in `fields`) with
/// `message`.
pub fn invalid(pointer: &str, message: impl Into<String>) -> ApiError {
    let message = message.into();
    ApiError::new(ErrorCode::InvalidObject, message.clone()).with_field(pointer, message)
}

/// Reads a front-end route's query: `queue` (returned, for a route that
/// starts runs) and `ticket` (read by the caller's extractor); any other
/// parameter is 400 `NRD-0008`.
pub fn read_query(mut query: Query) -> ApiResult<Option<String>> {
    let queue = query.text("queue");
    let _ = query.text(super::tickets::PARAMETER);
    query.finish()?;
    Ok(queue)
}

/// Records that a front end opens a stream on `session_id` now: an
/// earlier stream of the session broken off within the abort grace stops
/// nothing ([`broken_off`]). Answers when (the database's clock), for this
/// stream's own [`broken_off`]; `None` (and a warning) when the database
/// did not answer: the stream is served all the same, and its abort stops
/// nothing.
pub async fn returned(state: &AppState, tenant: &TenantId, session_id: &str) -> Option<i64> {
    state.runtime.front_end_abort_grace?;
    match state.journal.front_end_returned(tenant, session_id).await {
        Ok(at) => Some(at),
        Err(e) => {
            tracing::warn!(error = %e, session = session_id, "cannot record a front end's return");
            None
        }
    }
}

/// After a front end's stream on `session_id`, opened at `opened` (what
/// [`returned`] answered), ended before its answer did: when the client
/// broke it off (not the server stopping), asks run `run_id` to stop once
/// the abort grace has passed with no front end back on the session since
/// and the run still active (see the module documentation).
pub fn broken_off(
    state: &AppState,
    connection: &Connection,
    session_id: &str,
    run_id: &str,
    opened: Option<i64>,
) {
    let (Some(grace), Some(opened)) = (state.runtime.front_end_abort_grace, opened) else {
        return;
    };
    if !connection.client_gone() || state.hub.is_closing() {
        return;
    }
    let (state, principal) = (state.clone(), connection.principal.clone());
    let (session_id, run_id) = (session_id.to_owned(), run_id.to_owned());
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        let tenant = &principal.tenant;
        match state
            .journal
            .front_end_returned_since(tenant, &session_id, opened)
            .await
        {
            Ok(false) => {}
            Ok(true) => return,
            Err(e) => {
                tracing::warn!(error = %e, session = session_id, run = run_id,
                    "cannot tell whether a front end came back; its run is not stopped");
                return;
            }
        }
        let active = match state.journal.session(tenant, &session_id).await {
            Ok(s) => active_run(&s).is_some_and(|r| r == run_id),
            Err(_) => false,
        };
        if !active {
            return;
        }
        let stop = json!({"sessionId": session_id, "runId": run_id, "reason": ABORT_REASON});
        let outcome = match super::parse_command("stop-run", &stop) {
            Ok(command) => super::commands::execute(&state, &principal, &RequestId(None), command)
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => tracing::info!(
                session = session_id,
                run = run_id,
                "a front end broke its stream off: its run was asked to stop"
            ),
            Err(e) => tracing::info!(
                session = session_id,
                run = run_id,
                code = e.code(),
                "a front end broke its stream off; its run could not be asked to stop"
            ),
        }
    });
}

/// The session's active top-level run, if its active execution is one.
pub fn active_run(session: &SessionRecord) -> Option<String> {
    let active = session.active_execution.as_ref()?;
    (active["kind"] == "run")
        .then(|| active["runId"].as_str().map(str::to_owned))
        .flatten()
}

/// The `reason` of the stop a front end's abort asks for.
pub const ABORT_REASON: &str = "front_end.abort";

/// The principal of a front end's POST, which writes to the session: the
/// caller's (a ticket must have been issued for `stream`), with the
/// `writer` role and reach to `session_id`, and one command taken from
/// the organisation's rate (401, 403, 429 otherwise).
pub async fn writer(
    state: &AppState,
    caller: Caller,
    stream: &str,
    session_id: &str,
) -> ApiResult<Principal> {
    let principal = caller.principal(state, stream).await?;
    principal.require(Permission::Command)?;
    principal.require_session(session_id)?;
    state.quotas.take_command(&principal.tenant).await?;
    Ok(principal)
}

/// The place of a front end's answer under the organisation's open-stream
/// limit (429 `NRD-0603` over it, before any write), and the session's
/// live feed, subscribed before the history is read so that nothing
/// committed after it is missed.
pub async fn open_stream(
    state: &AppState,
    tenant: &TenantId,
    session_id: &str,
) -> ApiResult<(StreamSlot, broadcast::Receiver<Arc<crate::hub::Live>>)> {
    let slot = state.quotas.open_stream(tenant).await?;
    Ok((slot, state.hub.subscribe(tenant, session_id)))
}

/// The session as it stood before this request, after creating it
/// (`create-session`, through the commands' own path) when it did not
/// exist: `None` when it is new, or was created by a request that came at
/// the same time.
pub async fn open_session(
    state: &AppState,
    principal: &Principal,
    request: &RequestId,
    session_id: &str,
) -> ApiResult<Option<SessionRecord>> {
    let session = match state.journal.session(&principal.tenant, session_id).await {
        Ok(s) => Some(s),
        Err(JournalError::SessionNotFound(_)) => None,
        Err(e) => return Err(e.into()),
    };
    if session.is_none() {
        let create = super::parse_command("create-session", &json!({"sessionId": session_id}))?;
        match super::commands::execute(state, principal, request, create).await {
            Ok(_) => {}
            // Created by a request that came at the same time.
            Err(e) if e.code() == ErrorCode::SessionExists.code() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(session)
}

/// The connection of a front end's answer (a session stream, every
/// profile), holding `slot` (its place under the organisation's
/// open-stream limit), and the receiver its response drains.
pub fn connect(principal: Principal, slot: StreamSlot) -> (Connection, mpsc::Receiver<Bytes>) {
    let (mut connection, rx) = Connection::new(
        crate::metrics::StreamKind::Session,
        ProfileSet::all(),
        principal,
    );
    connection.hold(slot);
    (connection, rx)
}

/// Items as SSE frames, one `data: {json}` line each.
pub fn frames<T: Serialize>(items: &[T]) -> Bytes {
    let mut out = String::new();
    for item in items {
        out.push_str("data: ");
        out.push_str(&serde_json::to_string(item).expect("frames serialise"));
        out.push_str("\n\n");
    }
    Bytes::from(out)
}

/// Waits for the session's next commit: `true` on a wake-up of its live
/// feed (or one missed by a lagging receiver), `false` when the feed
/// closed or the stream must end (`ended`, the connection's
/// `until_ended`).
pub async fn next_commit(
    live: &mut broadcast::Receiver<Arc<crate::hub::Live>>,
    ended: &mut (impl Future<Output = ()> + Unpin),
) -> bool {
    tokio::select! {
        received = live.recv() => {
            !matches!(received, Err(broadcast::error::RecvError::Closed))
        }
        () = ended => false,
    }
}

/// The runtimes' queue of a front end's new run: `given`, the body's member
/// at `pointer` (`forwardedProps.narad.queue`, `narad.queue`), else the
/// query's `queue`, else the runtimes' default queue; a queue that is not 1 to 256
/// characters is refused naming where it came from (the member: 400
/// `NRD-0003`; the query parameter: 400 `NRD-0008`).
pub fn queue_of(given: &Value, pointer: &str, query: Option<String>) -> ApiResult<String> {
    let fits = |q: &str| !q.is_empty() && q.chars().count() <= 256;
    match given {
        Value::String(q) if fits(q) => Ok(q.clone()),
        Value::Null => match query {
            None => Ok(narad_journal::runtime::DEFAULT_QUEUE.to_owned()),
            Some(q) if fits(&q) => Ok(q),
            Some(_) => Err(ApiError::new(
                ErrorCode::InvalidParameter,
                "the query parameter queue is 1 to 256 characters",
            )
            .with_field("queue", "a queue is 1 to 256 characters")),
        },
        _ => Err(ApiError::new(
            ErrorCode::InvalidObject,
            format!(
                "the body at {pointer:?} is no queue: a queue is a string of 1 to 256 characters"
            ),
        )
        .with_field(pointer, "a queue is a string of 1 to 256 characters")),
    }
}

/// The client executor a session's front end answers tool calls as:
/// `front-end:<sessionId>` (or `front-end:` and the session id's SHA-256,
/// for a session id too long for an id). A run started by a front-end
/// route names it as its `clientExecutorId`.
pub fn executor_id(session_id: &str) -> String {
    let id = format!("front-end:{session_id}");
    if id.chars().count() <= 256 {
        id
    } else {
        format!(
            "front-end:{}",
            hex::encode(Sha256::digest(session_id.as_bytes()))
        )
    }
}

/// A front end's answer to one tool call: its result, or the error it
/// reports.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The tool's output.
    Output(Value),
    /// The tool failed, with this text.
    Error(String),
}

/// Finishes the session's client tool calls the front end answered
/// (`answers`, by toolCallId), as its executor: attach (a lease), take
/// delivery (one execution token per call), finish each answered call
/// under its token, let the lease go. The calls finished; a call that
/// another answer closed first is NRD-0404.
pub async fn finish_client_calls(
    state: &AppState,
    tenant: &TenantId,
    session_id: &str,
    answers: &HashMap<String, Answer>,
) -> ApiResult<HashSet<String>> {
    let executor = executor_id(session_id);
    let max = state
        .quotas
        .limit(tenant, crate::quotas::Limit::AttachedExecutors)
        .await?;
    let settings = &state.executors;
    let lease = state
        .journal
        .attach_executor_within(tenant, &executor, settings.lease_ttl, max)
        .await?;
    let deliveries = state
        .journal
        .deliver_client_calls(tenant, &executor, &lease.lease_id, settings.token_ttl, 64)
        .await?;
    let mut finished = HashSet::new();
    let mut failure = None;
    for delivery in deliveries {
        let execute = serde_json::to_value(&delivery.execute).expect("serialises");
        let call = execute["toolCallId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let Some(answer) = answers.get(&call) else {
            continue;
        };
        let mut finish = json!({
            "executionToken": execute["executionToken"], "toolCallId": call,
        });
        match answer {
            Answer::Output(output) => {
                finish["outcome"] = json!("success");
                finish["response"] = output.clone();
            }
            Answer::Error(text) => {
                finish["outcome"] = json!("error");
                finish["response"] = Value::Null;
                finish["code"] = json!("client_error");
                finish["message"] = json!(text);
            }
        }
        let finish = serde_json::from_value(finish).map_err(ApiError::internal)?;
        match state
            .journal
            .finish_client_call(tenant, &executor, &lease.lease_id, &finish)
            .await
        {
            Ok(_) => {
                finished.insert(call);
            }
            Err(e) => failure = Some(e),
        }
    }
    if let Err(e) = state.journal.resume_executor_runs(tenant, &executor).await {
        tracing::warn!(error = %e, "cannot resume a front end's run yet; the sweeper will");
    }
    state
        .journal
        .expire_lease(tenant, &executor, &lease.lease_id)
        .await?;
    state.hub.wake_executors(tenant);
    if let Some(e) = failure {
        return Err(e.into());
    }
    if let Some(call) = answers.keys().find(|c| !finished.contains(*c)) {
        return Err(ApiError::new(
            ErrorCode::FinishConflict,
            format!(
                "tool call {call} was answered elsewhere first, or closed before the answer \
                 came; its result is in the session"
            ),
        ));
    }
    Ok(finished)
}

/// A journal event of run `r1` for the front ends' unit tests: `type` `ty`
/// at `sessionSequence` `seq`, with the members of `extra`.
#[cfg(test)]
pub fn test_event(seq: u64, ty: &str, extra: Value) -> Value {
    let mut e = json!({"type": ty, "sessionSequence": seq, "rootRunId": "r1", "runId": "r1"});
    for (k, v) in extra.as_object().expect("an object") {
        e[k] = v.clone();
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_front_end_executor_id_is_an_id_for_any_session() {
        assert_eq!(executor_id("s1"), "front-end:s1");
        let long = "s".repeat(256);
        let id = executor_id(&long);
        assert!(id.starts_with("front-end:") && id.chars().count() <= 256);
        assert_ne!(id, executor_id(&"t".repeat(256)));
    }
}
