//! `POST /v1/chat` and `GET /v1/chat/{sessionId}/stream`: a narad session
//! as the chat of the AI SDK's `useChat` with an unchanged
//! `DefaultChatTransport` (`api: <server>/v1/chat`), answering the UI
//! message stream (protocol v1, the `x-vercel-ai-ui-message-stream: v1`
//! header).
//!
//! The POST body is the transport's `{id, messages, trigger, messageId?}`;
//! `id` is the session (created when new). Its last message decides:
//! - a `user` message is recorded (`record-user-message`, the UI message
//!   id as narad's messageId, so that a repeat is the same event) and a
//!   run is started for the agent runtimes of a queue (`start-run`; runId
//!   `<messageId>.run` unless too long; client tool calls go to the
//!   session's front end, [`super::front_end::executor_id`]);
//! - an `assistant` message (the transport's continuation: its id is the
//!   runId) brings the front end's answers: tool parts in
//!   `output-available`/`output-error` finish the run's client tool calls,
//!   parts in `approval-responded` resolve their interrupts with the
//!   signed-in person as actor (409 NRD-0205 with the decision when
//!   someone else decided first).
//!
//! Each write goes through the commands' own path (authorized and audited
//! as that command). The answer is the run as one assistant message (id =
//! runId, see its `translate` module) from where the client stands until the run
//! ends or waits on the front end again. The GET (the transport's
//! reconnect) answers 204 when the session has no active run (or does not
//! exist yet: a new chat's page resumes on mount), else the
//! active run's whole message from `start` (the transport treats a resumed
//! stream as a replay) and then live: read from the journal, so across
//! restarts and replicas. A client that breaks its stream off (`stop()`, a
//! reload) stops the run after the abort grace unless a front end comes
//! back to the session meanwhile ([`front_end::broken_off`]); a stop at
//! once is `POST /v1/commands/stop-run` with the runId, which is the
//! assistant message's id.

mod translate;

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_journal::{HistoryQuery, JournalError, TenantId};
use narad_protocol::ErrorCode;
use narad_protocol::primitives::SessionId;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use self::translate::{Ended, Translator};
use super::front_end::{self, Answer, frames, invalid};
use super::front_end_caller::Caller;
use super::sse::{self, Connection};
use crate::AppState;
use crate::audit::RequestId;
use crate::auth::{Permission, Principal};
use crate::body::{JsonBody, Query};
use crate::error::{ApiError, ApiResult};

/// The header that names the UI message stream protocol.
pub const PROTOCOL_HEADER: &str = "x-vercel-ai-ui-message-stream";

/// The stream a ticket for the chat routes is issued for: the session's
/// (`{stream: "session", sessionId}`).
fn ticket_stream(session_id: &str) -> String {
    format!("session:{session_id}")
}

/// The runId of the run a user message starts.
fn run_id_of(message_id: &str) -> String {
    let id = format!("{message_id}.run");
    if id.chars().count() <= 256 {
        id
    } else {
        use sha2::Digest;
        format!("{}.run", hex::encode(sha2::Sha256::digest(message_id)))
    }
}

/// An id of the protocol (1 to 256 characters) at `pointer`.
fn id_at(body: &Value, pointer: &str) -> ApiResult<String> {
    let id = body
        .pointer(pointer)
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(pointer, "must be a string"))?;
    SessionId::new(id.to_owned()).map_err(|e| invalid(pointer, e.to_string()))?;
    Ok(id.to_owned())
}

/// What a chat request asks, read from the transport's body.
struct ChatRequest {
    session_id: String,
    queue: String,
    last: Value,
    last_at: usize,
}

fn read_request(body: &Value, queue_param: Option<String>) -> ApiResult<ChatRequest> {
    if !body.is_object() {
        return Err(invalid(
            "",
            "the body is the transport's {id, messages, trigger}",
        ));
    }
    let session_id = id_at(body, "/id")?;
    match body["trigger"].as_str() {
        None | Some("submit-message") => {}
        Some("regenerate-message") => {
            return Err(invalid(
                "/trigger",
                "regenerate-message is not supported: a session's journal is append-only; \
                 send a new message instead",
            ));
        }
        Some(_) => return Err(invalid("/trigger", "must be submit-message")),
    }
    let messages = body["messages"]
        .as_array()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| invalid("/messages", "must be a non-empty array of UI messages"))?;
    let last_at = messages.len() - 1;
    let last = messages[last_at].clone();
    let at = format!("/messages/{last_at}");
    id_at(body, &format!("{at}/id"))?;
    if !last["parts"].is_array() {
        return Err(invalid(&format!("{at}/parts"), "must be an array"));
    }
    match last["role"].as_str() {
        Some("user" | "assistant") => {}
        _ => {
            return Err(invalid(
                &format!("{at}/role"),
                "the last message is the user's new message, or the assistant message the \
                 client continues",
            ));
        }
    }
    if let Some(m) = body["messageId"].as_str()
        && last["role"] == "user"
        && m == last["id"]
    {
        return Err(invalid(
            "/messageId",
            "editing a sent message is not supported: a session's journal is append-only; \
             send a new message instead",
        ));
    }
    let queue = front_end::queue_of(&body["narad"]["queue"], "/narad/queue", queue_param)?;
    Ok(ChatRequest {
        session_id,
        queue,
        last,
        last_at,
    })
}

/// A user message's text: its text parts, joined.
fn user_text(message: &Value, at: usize) -> ApiResult<String> {
    let parts = message["parts"].as_array().expect("checked");
    let mut text = String::new();
    for (n, part) in parts.iter().enumerate() {
        match part["type"].as_str() {
            Some("text") => text.push_str(part["text"].as_str().unwrap_or_default()),
            Some("file") => {
                return Err(invalid(
                    &format!("/messages/{at}/parts/{n}"),
                    "file parts are not taken here: upload the file as a blob \
                     (POST /v1/sessions/{sessionId}/blobs) and send its reference as text",
                ));
            }
            _ => {}
        }
    }
    if text.is_empty() {
        return Err(invalid(
            &format!("/messages/{at}/parts"),
            "a user message needs a text part",
        ));
    }
    Ok(text)
}

/// Starts or continues a chat: the run as a UI message stream.
#[utoipa::path(post, path = "/v1/chat", operation_id = "chat", tag = "chat",
    request_body(content = ref("#/components/schemas/ChatRequest"), description = "The body `DefaultChatTransport` sends: `{id, messages, trigger, messageId?}` and the transport's `body` extras (`narad.queue`)"),
    params(
        ("queue" = Option<String>, Query, min_length = 1, max_length = 256, description = "The runtimes' queue a new run goes to when the body's `narad.queue` names none (default `default`)"),
        ("ticket" = Option<String>, Query, description = "A stream ticket for the session's stream (`POST /v1/stream-tickets` with `{stream: \"session\", sessionId}`) instead of Authorization; it carries the roles of the token that asked for it"),
    ),
    responses(
        (status = 200, description = "The UI message stream (protocol v1, header `x-vercel-ai-ui-message-stream: v1`): `data: {json}` frames, each one UiMessageChunk, `start` first (messageId = the runId), `finish` (or `error`) last, then `data: [DONE]`; keep-alive comments between", content_type = "text/event-stream", body = ref("#/components/schemas/ChatFrame")),
        (status = 400, description = "NRD-0003: not the transport's body, a trigger or edit that does not map (regenerate, editing a sent message), a user message without text (`fields` names the pointer); NRD-0008: a bad query parameter"),
        (status = 401, description = "NRD-0101: no token, or a ticket unknown, expired or for another session"),
        (status = 403, description = "NRD-0102: no `writer` role (`approver` too for an approval), or the token does not reach the session"),
        (status = 404, description = "NRD-0007: the continued message is no run of the session"),
        (status = 409, description = "NRD-0204: the session's run is still active and the body brings a new user message; NRD-0205: an approval was decided by someone else first (`details.decision`); NRD-0404: a tool call was answered elsewhere first; NRD-0202: the user message id was used with other text"),
        (status = 429, description = "NRD-0602, NRD-0603, NRD-0604, NRD-0605: a limit of the organisation"),
    ),
    security(("bearer" = []), ("streamTicket" = [])))]
pub async fn chat(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    query: Query,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let queue_param = front_end::read_query(query)?;
    let asked = read_request(&body, queue_param)?;
    let session_id = asked.session_id.clone();
    let principal =
        front_end::writer(&state, caller, &ticket_stream(&session_id), &session_id).await?;
    let (slot, live) = front_end::open_stream(&state, &principal.tenant, &session_id).await?;
    let plan = Box::pin(plan(&state, &principal, &request, asked)).await?;
    // Accepted: a stream of this session broken off just before holds no
    // stop (a reload's second request, an approval's answer).
    let opened = front_end::returned(&state, &principal.tenant, &session_id).await;
    let (connection, rx) = front_end::connect(principal, slot);
    tokio::spawn(feed(state, connection, plan, live, opened));
    stream_response(rx)
}

/// Reconnects to the session's active run: its whole message, then live.
#[utoipa::path(get, path = "/v1/chat/{sessionId}/stream", operation_id = "resumeChat", tag = "chat",
    params(
        ("sessionId" = String, Path, description = "The session (the chat's id)"),
        ("ticket" = Option<String>, Query, description = "A stream ticket for the session's stream instead of Authorization"),
        ("queue" = Option<String>, Query, description = "Ignored: the transport reconnects with the query of the URL it posts to, `queue` included"),
    ),
    responses(
        (status = 200, description = "The active run's assistant message replayed from `start` (the same chunks the answers streamed), then live, as in `POST /v1/chat`", content_type = "text/event-stream", body = ref("#/components/schemas/ChatFrame")),
        (status = 204, description = "The session has no active run, or does not exist yet (`useChat` with `resume: true` reconnects on mount, before its first message creates the session): nothing to resume"),
        (status = 401, description = "NRD-0101: no token, or a ticket unknown, expired or for another session"),
        (status = 403, description = "NRD-0102: no `reader` role, or the token does not reach the session"),
        (status = 429, description = "NRD-0603: the organisation's open streams are at their limit"),
    ),
    security(("bearer" = []), ("streamTicket" = [])))]
pub async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    Path(session_id): Path<String>,
    query: Query,
) -> ApiResult<Response> {
    // The transport reconnects with the query of its `api`: the POST's
    // `queue` comes along, and means nothing here.
    let _ = front_end::read_query(query)?;
    // A chat not created yet is 204, so an id no session can have is
    // refused here rather than answered as one not created yet.
    SessionId::new(session_id.clone()).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidParameter,
            format!("the sessionId of the path {e}"),
        )
        .with_field("sessionId", e.to_string())
    })?;
    let principal = caller
        .principal(&state, &ticket_stream(&session_id))
        .await?;
    principal.require(Permission::Read)?;
    principal.require_session(&session_id)?;
    let tenant = principal.tenant.clone();
    // A new chat's page resumes on mount, before its first message creates
    // the session: nothing to resume, as for a session with no active run.
    let session = match state.journal.session(&tenant, &session_id).await {
        Ok(session) => session,
        Err(JournalError::SessionNotFound(_)) => {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        Err(e) => return Err(e.into()),
    };
    let Some(run_id) = front_end::active_run(&session) else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let (slot, live) = front_end::open_stream(&state, &tenant, &session_id).await?;
    let opened = front_end::returned(&state, &tenant, &session_id).await;
    let mut translator = Translator::new(&run_id, &front_end::executor_id(&session_id));
    let start = run_start(&state, &tenant, &session_id, &run_id).await?;
    translator.through = start.saturating_sub(1);
    let plan = Plan {
        session_id,
        run_id,
        translator,
        first: Vec::new(),
        replay_from: 0,
    };
    let (connection, rx) = front_end::connect(principal, slot);
    tokio::spawn(feed(state, connection, plan, live, opened));
    stream_response(rx)
}

/// The sessionSequence of a run's `run.started`; 404 when the session has
/// no such top-level run.
async fn run_start(
    state: &AppState,
    tenant: &TenantId,
    session_id: &str,
    run_id: &str,
) -> ApiResult<u64> {
    let page = state
        .journal
        .history(
            tenant,
            session_id,
            &HistoryQuery {
                root_run_id: Some(run_id.to_owned()),
                limit: Some(1),
                ..HistoryQuery::default()
            },
        )
        .await?;
    page.events
        .first()
        .filter(|e| e["type"] == "run.started" && e["runId"] == run_id)
        .and_then(|e| e["sessionSequence"].as_u64())
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!("the message {run_id} is no run of session {session_id}"),
            )
        })
}

/// What an answer streams.
struct Plan {
    session_id: String,
    run_id: String,
    /// The fold, through where the answer starts reading.
    translator: Translator,
    /// Chunks already folded that the answer sends before reading on.
    first: Vec<Value>,
    /// Events at or before this sessionSequence were sent by an earlier
    /// answer (a continuation sends what comes after).
    replay_from: u64,
}

/// Reads the session, writes what the body brings, and decides what the
/// answer streams.
async fn plan(
    state: &AppState,
    principal: &Principal,
    request: &RequestId,
    asked: ChatRequest,
) -> ApiResult<Plan> {
    let tenant = &principal.tenant;
    let session_id = asked.session_id.clone();
    let front_end = front_end::executor_id(&session_id);
    if asked.last["role"] == "user" {
        let message_id = asked.last["id"].as_str().expect("checked").to_owned();
        let text = user_text(&asked.last, asked.last_at)?;
        let run_id = run_id_of(&message_id);
        let session = front_end::open_session(state, principal, request, &session_id).await?;
        match session.as_ref().and_then(front_end::active_run) {
            // This message's run, asked again (a retried POST): its answer.
            Some(active) if active == run_id => {}
            Some(active) => {
                return Err(ApiError::new(
                    ErrorCode::SessionSlotTaken,
                    format!(
                        "the session's run {active} is still active: answer its tool calls or \
                         approvals, wait for it, or stop it (POST /v1/commands/stop-run with \
                         this runId) before sending a new message"
                    ),
                )
                .with_details(json!({"activeExecution": {"kind": "run", "runId": active}})));
            }
            None => {
                let body = json!({"sessionId": session_id, "messageScope": "session",
                    "messageId": message_id, "content": text});
                let command = super::parse_command("record-user-message", &body)?;
                let _ = super::commands::execute(state, principal, request, command).await?;
                let body = json!({"sessionId": session_id, "runId": run_id,
                    "clientExecutorId": front_end, "runtime": {"queue": asked.queue},
                    "input": {"messageId": message_id, "via": "ai-sdk-ui"}});
                let command = super::parse_command("start-run", &body)?;
                let _ = super::commands::execute(state, principal, request, command).await?;
            }
        }
        let start = run_start(state, tenant, &session_id, &run_id).await?;
        let mut translator = Translator::new(&run_id, &front_end);
        translator.through = start - 1;
        return Ok(Plan {
            session_id,
            run_id,
            translator,
            first: Vec::new(),
            replay_from: 0,
        });
    }

    // A continuation: the assistant message is the run.
    let run_id = id_at(&asked.last, "/id")?;
    state.journal.session(tenant, &session_id).await?;
    let start = run_start(state, tenant, &session_id, &run_id).await?;
    let mut translator = Translator::new(&run_id, &front_end);
    translator.through = start - 1;
    // Where the last answer ended: the message's metadata says so.
    let cursor = asked.last["metadata"]["narad"]["through"].as_u64();
    let mut first = Vec::new();
    let mut history = Vec::new();
    read_after(state, tenant, &session_id, translator.through, &mut history).await?;
    for e in &history {
        let seq = e["sessionSequence"].as_u64().unwrap_or_default();
        let mut out = Vec::new();
        translator.event(e, &mut out);
        if cursor.is_some_and(|c| seq > c) {
            first.extend(out);
        }
    }
    let replay_from = cursor.unwrap_or(translator.through);
    if cursor.is_none() {
        first.clear();
    }

    // The front end's answers.
    let mut answers: HashMap<String, Answer> = HashMap::new();
    let mut decisions: Vec<(String, String, Option<String>, usize)> = Vec::new();
    let parts = asked.last["parts"].as_array().expect("checked");
    for (n, part) in parts.iter().enumerate() {
        let kind = part["type"].as_str().unwrap_or_default();
        if !(kind.starts_with("tool-") || kind == "dynamic-tool") {
            continue;
        }
        let call = part["toolCallId"].as_str().unwrap_or_default();
        match part["state"].as_str() {
            Some("output-available") if translator.open_client_calls.contains(call) => {
                answers.insert(call.to_owned(), Answer::Output(part["output"].clone()));
            }
            Some("output-error") if translator.open_client_calls.contains(call) => {
                let text = part["errorText"].as_str().unwrap_or("the tool failed");
                answers.insert(call.to_owned(), Answer::Error(text.to_owned()));
            }
            Some("approval-responded") => {
                let approval = &part["approval"];
                let Some(id) = approval["id"].as_str() else {
                    continue;
                };
                let Some(interrupt) = translator.interrupts.get(id) else {
                    continue;
                };
                let decision = match approval["approved"].as_bool() {
                    Some(true) => "approve",
                    Some(false) => {
                        // The interrupt's word for no.
                        ["deny", "reject", "cancel", "stop"]
                            .into_iter()
                            .find(|d| interrupt.actions.iter().any(|a| a == d))
                            .unwrap_or("deny")
                    }
                    None => {
                        return Err(invalid(
                            &format!("/messages/{}/parts/{n}/approval/approved", asked.last_at),
                            "an approval response says approved: true or false",
                        ));
                    }
                };
                let reason = approval["reason"].as_str().map(str::to_owned);
                decisions.push((id.to_owned(), decision.to_owned(), reason, n));
            }
            _ => {}
        }
    }
    for (id, decision, reason, _) in &decisions {
        let interrupt = &translator.interrupts[id];
        if let Some((recorded, actor)) = &interrupt.decision {
            if recorded == decision && actor["sub"] == principal.subject.as_str() {
                // This person's own decision, sent again.
                continue;
            }
            return Err(ApiError::new(
                ErrorCode::InterruptAlreadyResolved,
                format!("the approval {id} was decided first by someone else: {recorded}"),
            )
            .with_details(json!({"interruptId": id, "decision": recorded, "actor": actor})));
        }
        let mut body = json!({"interruptId": id, "sessionId": session_id, "decision": decision});
        if let Some(reason) = reason {
            body["reason"] = json!(reason);
        }
        let command = super::parse_command("resolve-interrupt", &body)?;
        let _ = super::commands::execute(state, principal, request, command).await?;
    }
    if !answers.is_empty() {
        front_end::finish_client_calls(state, tenant, &session_id, &answers).await?;
    }
    Ok(Plan {
        session_id,
        run_id,
        translator,
        first,
        replay_from,
    })
}

/// Appends to `into` every event of the session after `after`.
async fn read_after(
    state: &AppState,
    tenant: &TenantId,
    session_id: &str,
    mut after: u64,
    into: &mut Vec<Value>,
) -> Result<u64, JournalError> {
    loop {
        let page = super::sse::history_after(state, tenant, session_id, after).await?;
        for e in page.events {
            after = e["sessionSequence"].as_u64().unwrap_or(after + 1);
            into.push(e);
        }
        if page.next_session_sequence.is_none() {
            return Ok(after);
        }
    }
}

/// The UI message stream response draining `rx`.
fn stream_response(rx: tokio::sync::mpsc::Receiver<Bytes>) -> ApiResult<Response> {
    let mut response = sse::response(rx)?;
    response
        .headers_mut()
        .insert(PROTOCOL_HEADER, HeaderValue::from_static("v1"));
    Ok(response)
}

/// The message's metadata: where the answer stands in the session.
fn metadata(plan: &Plan) -> Value {
    json!({"narad": {"sessionId": plan.session_id, "runId": plan.run_id,
        "through": plan.translator.through}})
}

/// The end of an answer: the open parts closed, `finish` (after `error`
/// for a failed run), `[DONE]`.
fn ending(plan: &mut Plan) -> Bytes {
    let mut out = Vec::new();
    plan.translator.close(&mut out);
    let reason = match plan.translator.ended {
        Some(Ended::Finished) => "stop",
        Some(Ended::Cancelled) => "interrupted",
        Some(Ended::Error) => "error",
        None => "tool-calls",
    };
    if plan.translator.ended != Some(Ended::Error) {
        out.push(
            json!({"type": "finish", "finishReason": reason, "messageMetadata": metadata(plan)}),
        );
    }
    let mut bytes = frames(&out).to_vec();
    bytes.extend_from_slice(b"data: [DONE]\n\n");
    Bytes::from(bytes)
}

/// Streams the plan (see [`answer`]); a stream the client broke off
/// before its answer ended may stop the run
/// ([`front_end::broken_off`]: the transport's abort).
async fn feed(
    state: AppState,
    connection: Connection,
    plan: Plan,
    live: broadcast::Receiver<std::sync::Arc<crate::hub::Live>>,
    opened: Option<i64>,
) {
    let (session_id, run_id) = (plan.session_id.clone(), plan.run_id.clone());
    if !answer(&state, &connection, plan, live).await {
        front_end::broken_off(&state, &connection, &session_id, &run_id, opened);
    }
}

/// Streams the plan: `start`, what was folded, then the run's events as
/// they are committed (read from history after each wake-up of the
/// session's live feed, so each is sent once, in order), until the run
/// ends or waits on the front end (`true`: answered), or the stream ends
/// first (`false`: the client went away, or the server is stopping).
async fn answer(
    state: &AppState,
    connection: &Connection,
    mut plan: Plan,
    mut live: broadcast::Receiver<std::sync::Arc<crate::hub::Live>>,
) -> bool {
    let mut out = vec![json!({"type": "start", "messageId": plan.run_id,
        "messageMetadata": metadata(&plan)})];
    out.append(&mut plan.first);
    if connection.send(frames(&out)).await.is_err() {
        return false;
    }
    let tenant = connection.principal.tenant.clone();
    let ended = connection.until_ended(state);
    tokio::pin!(ended);
    loop {
        while live.try_recv().is_ok() {}
        let mut events = Vec::new();
        if let Err(e) = read_after(
            state,
            &tenant,
            &plan.session_id,
            plan.translator.through,
            &mut events,
        )
        .await
        {
            tracing::warn!(error = %e, "a chat stream cannot read history");
            let _ = connection
                .send(frames(&[json!({"type": "error",
                    "errorText": "the stream cannot read the session; reconnect to resume"})]))
                .await;
            return true;
        }
        let mut out = Vec::new();
        for e in &events {
            let seq = e["sessionSequence"].as_u64().unwrap_or_default();
            let mut chunks = Vec::new();
            plan.translator.event(e, &mut chunks);
            if seq > plan.replay_from {
                out.extend(chunks);
            }
            if plan.translator.ended.is_some() {
                break;
            }
        }
        if plan.translator.ended.is_some() || plan.translator.waits_on_front_end() {
            let mut bytes = frames(&out).to_vec();
            bytes.extend_from_slice(&ending(&mut plan));
            let _ = connection.send(Bytes::from(bytes)).await;
            return true;
        }
        if !out.is_empty() && connection.send(frames(&out)).await.is_err() {
            return false;
        }
        if !front_end::next_commit(&mut live, &mut ended).await {
            return false;
        }
    }
}

/// The OpenAPI components of the route: its request and its chunks.
pub fn components() -> Vec<(String, Value)> {
    let text = json!({"type": "string"});
    let id_only = |t: &str| {
        json!({"type": "object", "required": ["type", "id"],
        "properties": {"type": {"const": t}, "id": text}})
    };
    let delta = |t: &str| {
        json!({"type": "object", "required": ["type", "id", "delta"],
        "properties": {"type": {"const": t}, "id": text, "delta": text}})
    };
    let chunks = vec![
        json!({"type": "object", "required": ["type"], "properties": {"type": {"const": "start"},
            "messageId": text, "messageMetadata": {"$ref": "#/components/schemas/ChatMessageMetadata"}}}),
        json!({"type": "object", "required": ["type"], "properties": {"type": {"const": "start-step"}}}),
        json!({"type": "object", "required": ["type"], "properties": {"type": {"const": "finish-step"}}}),
        id_only("text-start"),
        delta("text-delta"),
        id_only("text-end"),
        id_only("reasoning-start"),
        delta("reasoning-delta"),
        id_only("reasoning-end"),
        json!({"type": "object", "required": ["type", "toolCallId", "toolName", "input"],
            "properties": {"type": {"const": "tool-input-available"}, "toolCallId": text,
                "toolName": text, "input": true, "providerExecuted": {"type": "boolean"}}}),
        json!({"type": "object", "required": ["type", "toolCallId", "output"],
            "properties": {"type": {"const": "tool-output-available"}, "toolCallId": text,
                "output": true, "providerExecuted": {"type": "boolean"}}}),
        json!({"type": "object", "required": ["type", "toolCallId", "errorText"],
            "properties": {"type": {"const": "tool-output-error"}, "toolCallId": text,
                "errorText": text, "providerExecuted": {"type": "boolean"}}}),
        json!({"type": "object", "required": ["type", "toolCallId"],
            "properties": {"type": {"const": "tool-output-denied"}, "toolCallId": text}}),
        json!({"type": "object", "required": ["type", "approvalId", "toolCallId"],
            "properties": {"type": {"const": "tool-approval-request"}, "approvalId": text,
                "toolCallId": text, "reason": text, "approvalDescriptor": {"type": "object",
                "description": "`narad`: the interrupt (interruptId, waitId, kind, actions, title, message, expiresAt)"}}}),
        json!({"type": "object", "required": ["type", "approvalId", "approved"],
            "properties": {"type": {"const": "tool-approval-response"}, "approvalId": text,
                "approved": {"type": "boolean"}, "reason": text}}),
        json!({"type": "object", "required": ["type", "data"], "description": "narad specifics: data-narad-run (id `run`: paused, running, stopping), data-narad-progress (id: progressId), data-narad-interrupt (an interrupt about no tool call; id: interruptId), data-narad-custom, data-narad-error",
            "properties": {"type": {"type": "string", "pattern": "^data-narad-"}, "id": text,
                "data": true}}),
        json!({"type": "object", "required": ["type", "errorText"],
            "properties": {"type": {"const": "error"}, "errorText": text}}),
        json!({"type": "object", "required": ["type"],
            "properties": {"type": {"const": "abort"}, "reason": text}}),
        json!({"type": "object", "required": ["type"], "properties": {"type": {"const": "finish"},
            "finishReason": {"enum": ["stop", "tool-calls", "interrupted"]},
            "messageMetadata": {"$ref": "#/components/schemas/ChatMessageMetadata"}}}),
    ];
    vec![
        (
            "ChatRequest".to_owned(),
            json!({
                "description": "What the AI SDK's DefaultChatTransport POSTs: the chat id (the narad session), the whole client-side history (only its last message is read), the trigger, and the transport's `body` extras.",
                "type": "object",
                "required": ["id", "messages"],
                "properties": {
                    "id": {"$ref": "#/components/schemas/defs.id"},
                    "messages": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "required": ["id", "role", "parts"],
                        "properties": {
                            "id": {"$ref": "#/components/schemas/defs.id"},
                            "role": {"enum": ["system", "user", "assistant"]},
                            "metadata": true,
                            "parts": {"type": "array", "items": {"type": "object", "required": ["type"], "properties": {"type": text}}},
                        },
                    }},
                    "trigger": {"enum": ["submit-message", "regenerate-message"]},
                    "messageId": text,
                    "narad": {"type": "object", "properties": {"queue": {"$ref": "#/components/schemas/defs.id"}}},
                },
            }),
        ),
        (
            "ChatMessageMetadata".to_owned(),
            json!({"type": "object", "description": "Where the assistant message stands in the session: the message id is the runId; `through` is the last sessionSequence the answer covers (a continuation sends what comes after).",
                "properties": {"narad": {"type": "object", "properties": {
                    "sessionId": text, "runId": text, "through": {"type": "integer", "minimum": 0}}}}}),
        ),
        ("ChatFrame".to_owned(), chat_frame()),
        (
            "UiMessageChunk".to_owned(),
            json!({"description": "One chunk of the AI SDK's UI message stream (v1), as `DefaultChatTransport` parses it (`uiMessageChunkSchema` of `ai` 7); a frame `data: [DONE]` ends the stream.",
                "oneOf": chunks}),
        ),
    ]
}

/// `ChatFrame`: one server-sent event of the chat routes as a client parses
/// it (no `event:` or `id:` line): `data` one UI message chunk (JSON), or
/// `[DONE]`, the last.
fn chat_frame() -> Value {
    let mut chunk = super::openapi::frame(
        "message",
        None,
        "UiMessageChunk",
        "A UI message chunk (no `event:` or `id:` line).",
    );
    chunk["properties"]["data"]["not"] = json!({"const": "[DONE]"});
    let done = json!({
        "description": "The end of the stream: `data: [DONE]`.",
        "type": "object",
        "required": ["event", "data"],
        "properties": {"event": {"const": "message"}, "data": {"const": "[DONE]"}},
    });
    json!({
        "description": "One server-sent event of POST /v1/chat and GET /v1/chat/{sessionId}/stream, as a client parses it: `data` one UiMessageChunk (JSON), then `[DONE]`.",
        "oneOf": [chunk, done],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_that_does_not_map_is_refused_with_its_pointer() {
        let ok = json!({"id": "s1", "trigger": "submit-message",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]});
        assert!(read_request(&ok, None).is_ok());
        let mut regenerate = ok.clone();
        regenerate["trigger"] = json!("regenerate-message");
        let e = read_request(&regenerate, None).err().unwrap();
        assert_eq!(e.code(), "NRD-0003");
        let e = read_request(&json!({"id": "s1", "messages": []}), None)
            .err()
            .unwrap();
        assert_eq!(e.code(), "NRD-0003");
        let mut queue = ok.clone();
        queue["narad"] = json!({"queue": 3});
        assert!(read_request(&queue, None).is_err());
        assert_eq!(read_request(&ok, Some("q".into())).unwrap().queue, "q");
        assert_eq!(run_id_of("u1"), "u1.run");
        assert!(run_id_of(&"u".repeat(256)).chars().count() <= 256);
    }
}
