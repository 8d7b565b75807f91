//! `POST /v1/ag-ui`: a narad session as an AG-UI 1.0 agent, for an
//! unmodified `@ag-ui/client` `HttpAgent` (CopilotKit and the like).
//!
//! The body is a `RunAgentInput`; `threadId` is the session (created when
//! new). What the input brings that the journal does not hold yet is
//! written through the commands' own path (authorized and audited as each
//! command is): new `user` messages (`record-user-message`, the AG-UI
//! message id as narad's, so that the history the client sends again is
//! recognised), `resume` entries (`resolve-interrupt`, the signed-in person
//! the actor), `tool` messages answering the run's client tool calls (a
//! finish under the session's front-end executor, the one every chat front
//! end answers as, see [`front_end::executor_id`]); then a run is started
//! for the agent runtimes of a queue (`start-run`, its runId the input's,
//! bound to that executor). The answer is the run as AG-UI events over SSE until the
//! AG-UI run ends: the narad run finishes, fails or is cancelled, pauses
//! on an interrupt, or waits on the client's tools.
//!
//! Modules: `thread` folds a session's history (transcript, active run);
//! `translate` maps narad events to AG-UI events.

mod thread;
mod translate;

use std::collections::{HashMap, HashSet};

use ag_ui::{Event, Message, RunAgentInput, RunOutcome};
use axum::extract::State;
use axum::response::Response;
use narad_journal::TenantId;
use narad_protocol::ErrorCode;
use narad_protocol::primitives::SessionId;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use self::thread::Thread;
use self::translate::{Ending, Translator, narad};
use super::front_end::{self, Answer, frames, invalid};
use super::front_end_caller::Caller;
use super::sse::{self, Connection};
use crate::AppState;
use crate::audit::RequestId;
use crate::auth::Principal;
use crate::body::{JsonBody, Query};
use crate::error::{ApiError, ApiResult};

/// The members of a `RunAgentInput` the route reads.
const INPUT_MEMBERS: [&str; 10] = [
    "threadId",
    "runId",
    "protocolVersion",
    "parentRunId",
    "state",
    "messages",
    "tools",
    "context",
    "forwardedProps",
    "resume",
];

/// The state scope that is AG-UI's state unless
/// `forwardedProps.narad.stateScope` names another.
pub const DEFAULT_STATE_SCOPE: &str = "session";
/// The decisions an AG-UI `cancelled` resume takes, the first the
/// interrupt offers.
pub const CANCEL_DECISIONS: [&str; 4] = ["cancel", "deny", "reject", "stop"];

/// What the input brings, against what the journal holds.
struct Plan {
    thread_id: String,
    /// The AG-UI run this answer is.
    ag_run_id: String,
    /// The narad run streamed, if any.
    run_id: Option<String>,
    /// Where the stream starts.
    after: u64,
    /// The events before the live ones.
    first: Vec<Event>,
    /// The AG-UI run ends before any live event.
    ending: Option<Ending>,
    translator: Translator,
    /// The state scope that is AG-UI's state.
    scope: String,
    /// Client tool calls answered under the ids of the client's tool
    /// messages: toolCallId → message id.
    client_results: HashMap<String, String>,
}

/// Runs an AG-UI agent turn on a narad session.
#[utoipa::path(post, path = "/v1/ag-ui", operation_id = "runAgUi", tag = "ag-ui",
    request_body(content = ref("#/components/schemas/AgUiRunAgentInput"), description = "An AG-UI 1.0 `RunAgentInput`, as `HttpAgent` sends it"),
    params(
        ("queue" = Option<String>, Query, min_length = 1, max_length = 256, description = "The runtimes' queue a new run goes to when `forwardedProps.narad.queue` names none (default `default`)"),
        ("ticket" = Option<String>, Query, description = "A stream ticket (`POST /v1/stream-tickets` with `{stream: \"ag-ui\", sessionId}`) instead of Authorization"),
    ),
    responses(
        (status = 200, description = "text/event-stream of AG-UI 1.0 events (`data: {json}` frames; keep-alive comments): `RUN_STARTED` first, then the run's text, reasoning, tool calls and results, state, steps and custom events, and `RUN_FINISHED` (outcome success, success with `pendingToolCallIds` for the client's tools, `interrupt`, or `cancelled`) or `RUN_ERROR` last", content_type = "text/event-stream", body = ref("#/components/schemas/AgUiFrame")),
        (status = 400, description = "NRD-0003: the body is no RunAgentInput, or a resume entry cannot be decided (`fields` names the pointer); NRD-0008: a bad query parameter"),
        (status = 401, description = "NRD-0101: no token, or a ticket unknown, expired or for another thread"),
        (status = 403, description = "NRD-0102: no `writer` role (`approver` too for `resume`), or the token does not reach the thread"),
        (status = 404, description = "NRD-0007: a resume names no interrupt of the thread"),
        (status = 409, description = "NRD-0204: the thread's run is still active and the input brings new user messages; NRD-0205: an interrupt was decided by someone else first (`details.decision`, `details.actor`); NRD-0404: a tool call was answered elsewhere first"),
        (status = 429, description = "NRD-0602, NRD-0603, NRD-0604, NRD-0605: a limit of the organisation"),
    ),
    security(("bearer" = []), ("streamTicket" = [])))]
pub async fn run(
    State(state): State<AppState>,
    caller: Caller,
    request: RequestId,
    query: Query,
    JsonBody(mut body): JsonBody,
) -> ApiResult<Response> {
    let queue_param = front_end::read_query(query)?;
    // AG-UI reads a null state as absent; members the input does not
    // name are not read, whatever their value.
    if let Some(o) = body.as_object_mut() {
        o.retain(|name, value| {
            !(value.is_null() && (name == "state" || !INPUT_MEMBERS.contains(&name.as_str())))
        });
    }
    // The history is read leniently (see `ClientMessage`): the typed
    // input is read without it.
    let messages = match body.as_object_mut().and_then(|o| o.get_mut("messages")) {
        Some(raw) => read_messages(&std::mem::replace(raw, json!([])))?,
        None => Vec::new(),
    };
    let input: RunAgentInput = crate::body::typed(body)?;
    let thread_id = input.thread_id.as_str().to_owned();
    SessionId::new(thread_id.clone()).map_err(|e| invalid("/threadId", e.to_string()))?;
    let ag_run_id = input.run_id.as_str().to_owned();
    if ag_run_id.is_empty() || ag_run_id.chars().count() > 256 {
        return Err(invalid("/runId", "a runId is 1 to 256 characters"));
    }
    // A ticket is issued for `{stream: "ag-ui", sessionId}`.
    let principal =
        front_end::writer(&state, caller, &format!("ag-ui:{thread_id}"), &thread_id).await?;
    let props = &input.forwarded_props["narad"];
    let queue = front_end::queue_of(&props["queue"], "/forwardedProps/narad/queue", queue_param)?;
    let scope = props["stateScope"]
        .as_str()
        .unwrap_or(DEFAULT_STATE_SCOPE)
        .to_owned();
    let (slot, live) = front_end::open_stream(&state, &principal.tenant, &thread_id).await?;
    let plan = Box::pin(plan(
        &state, &principal, &request, input, &messages, queue, &scope,
    ))
    .await?;
    // Accepted: a stream of this thread broken off just before holds no
    // stop (a rejoin, the answers of the front end's tools).
    let opened = front_end::returned(&state, &principal.tenant, &thread_id).await;
    let (connection, rx) = front_end::connect(principal, slot);
    tokio::spawn(feed(state, connection, plan, live, opened));
    sse::response(rx)
}

/// Reads the thread, writes what the input brings, and decides what the
/// answer streams.
async fn plan(
    state: &AppState,
    principal: &Principal,
    request: &RequestId,
    input: RunAgentInput,
    messages: &[ClientMessage],
    queue: String,
    scope: &str,
) -> ApiResult<Plan> {
    let tenant = &principal.tenant;
    let thread_id = input.thread_id.as_str().to_owned();
    let ag_run_id = input.run_id.as_str().to_owned();
    front_end::open_session(state, principal, request, &thread_id).await?;
    let thread = Box::pin(fold(state, tenant, &thread_id, scope)).await?;

    // What the client holds, and what of it is new.
    let mut known = HashSet::new();
    let mut new_users: Vec<(String, Value, Option<String>)> = Vec::new();
    let mut client_results: HashMap<String, String> = HashMap::new();
    let mut answers: HashMap<String, Answer> = HashMap::new();
    let open_calls = thread
        .active
        .as_ref()
        .map(|a| a.open_client_calls.clone())
        .unwrap_or_default();
    for m in messages {
        let id = m.id.clone();
        known.insert(id.clone());
        match m.role.as_str() {
            "user" if !thread.has_message(&id) => {
                new_users.push((id, m.content.clone(), text_of(&m.content)));
            }
            "tool" => {
                let call = m.tool_call_id.clone().unwrap_or_default();
                client_results.insert(call.clone(), id);
                if open_calls.contains_key(&call) {
                    let response = m
                        .content
                        .as_str()
                        .and_then(|s| serde_json::from_str::<Value>(s).ok())
                        .unwrap_or_else(|| m.content.clone());
                    let answer = match &m.error {
                        Some(text) => Answer::Error(text.clone()),
                        None => Answer::Output(response),
                    };
                    answers.insert(call, answer);
                }
            }
            _ => {}
        }
    }
    let client_tools: HashSet<String> = input.tools.iter().map(|t| t.name.clone()).collect();
    let resume = input.resume.clone().unwrap_or_default();
    let mut answered = HashSet::new();

    // Interrupts answered.
    for (n, entry) in resume.iter().enumerate() {
        let id = entry.interrupt_id.as_str().to_owned();
        let entry = serde_json::to_value(entry).expect("serialises");
        let asked = thread.interrupts.get(&id);
        if asked.is_none() && entry["status"] == "cancelled" {
            // Which decision a cancel takes depends on the interrupt: one
            // the thread does not hold is not found, as for `resolved`.
            return Err(ApiError::new(
                ErrorCode::NotFound,
                format!("no interrupt {id} in thread {thread_id}"),
            )
            .with_field(
                format!("/resume/{n}/interruptId"),
                "names no interrupt of the thread",
            ));
        }
        let decision = if entry["status"] == "cancelled" {
            let actions = asked.map(|a| a["actions"].clone()).unwrap_or_default();
            CANCEL_DECISIONS
                .iter()
                .find(|d| {
                    actions
                        .as_array()
                        .is_some_and(|a| a.iter().any(|x| x == **d))
                })
                .map(|d| (*d).to_owned())
                .ok_or_else(|| {
                    invalid(
                        &format!("/resume/{n}/status"),
                        format!(
                            "interrupt {id} offers no action of {}; resolve it with \
                             payload.decision instead",
                            CANCEL_DECISIONS.join(", ")
                        ),
                    )
                })?
        } else {
            let payload = &entry["payload"];
            payload["decision"]
                .as_str()
                .or(payload.as_str())
                .map(str::to_owned)
                .ok_or_else(|| {
                    invalid(
                        &format!("/resume/{n}/payload/decision"),
                        "a resolved resume names its decision: payload {\"decision\": <one of the interrupt's actions>}",
                    )
                })?
        };
        let mut body = json!({"interruptId": id, "sessionId": thread_id, "decision": decision});
        if let Some(reason) = entry["payload"]["reason"].as_str() {
            body["reason"] = json!(reason);
        }
        // Decided before this input came: this person's own decision sent
        // again (a retried POST) is done; anyone else's is the 409 with
        // the recorded decision and who made it.
        if let Some(asked) = asked
            && !asked["decision"].is_null()
        {
            if asked["decision"] == decision.as_str()
                && asked["actor"]["sub"] == principal.subject.as_str()
            {
                continue;
            }
            return Err(ApiError::new(
                ErrorCode::InterruptAlreadyResolved,
                format!(
                    "interrupt {id} was already resolved with decision {}",
                    asked["decision"]
                ),
            )
            .with_details(
                json!({"interruptId": id, "decision": asked["decision"], "actor": asked["actor"]}),
            ));
        }
        let command = super::parse_command("resolve-interrupt", &body)?;
        match super::commands::execute(state, principal, request, command).await {
            Ok(_) => {}
            // This person's own decision, sent again (a retried POST).
            Err(e)
                if e.code() == ErrorCode::InterruptAlreadyResolved.code()
                    && asked.is_some_and(|a| {
                        a["decision"] == decision.as_str()
                            && a["actor"]["sub"] == principal.subject.as_str()
                    }) => {}
            Err(e) => return Err(e),
        }
    }

    // The client's tools answered.
    if !answers.is_empty() {
        answered = front_end::finish_client_calls(state, tenant, &thread_id, &answers).await?;
    }

    let mut first = vec![
        Event::run_started(thread_id.as_str(), ag_run_id.as_str()).with_metadata(narad(
            json!({"sessionId": thread_id, "runId": thread.active.as_ref().map(|a| a.run_id.clone()).unwrap_or_else(|| ag_run_id.clone())}),
        )),
    ];
    let snapshot = |first: &mut Vec<Event>| first.extend(snapshots(&thread, &client_results));
    let mut ending = None;
    let run_id = match &thread.active {
        Some(active) => {
            if !new_users.is_empty() {
                return Err(ApiError::new(
                    ErrorCode::SessionSlotTaken,
                    format!(
                        "the thread's run {} is still active: answer its pending tool calls or \
                         interrupts (resume), wait for it, or stop it (POST \
                         /v1/commands/stop-run) before sending a new message",
                        active.run_id
                    ),
                )
                .with_details(
                    json!({"activeExecution": {"kind": "run", "runId": active.run_id}}),
                ));
            }
            if resume.is_empty() && answered.is_empty() {
                // A rejoin: what came so far, then the rest live.
                snapshot(&mut first);
                first[0] = Event::run_started(thread_id.as_str(), ag_run_id.as_str())
                    .with_metadata(narad(
                        json!({"sessionId": thread_id, "runId": active.run_id, "rejoined": true}),
                    ));
            }
            Some(active.run_id.clone())
        }
        None if !new_users.is_empty() => {
            for (id, content, _) in &new_users {
                let body = json!({"sessionId": thread_id, "messageScope": "session",
                    "messageId": id, "content": content});
                let command = super::parse_command("record-user-message", &body)?;
                let _ = super::commands::execute(state, principal, request, command).await?;
            }
            let (last_id, last_content, last_text) = new_users.last().expect("not empty");
            let mut ag_ui = json!({
                "runId": ag_run_id, "tools": input.tools, "context": input.context,
                "forwardedProps": input.forwarded_props,
            });
            if !input.state.is_null() {
                ag_ui["state"] = input.state.clone();
            }
            let mut run_input = json!({
                "prompt": last_text.clone().unwrap_or_else(|| last_content.to_string()),
                "messageId": last_id, "agUi": ag_ui,
            });
            if last_text.is_none() {
                run_input["content"] = last_content.clone();
            }
            // Bound to the session's front end whatever tools this input
            // lists: a client call of the run is answered under the same
            // executor from any front-end route.
            let body = json!({"sessionId": thread_id, "runId": ag_run_id,
                "input": run_input, "runtime": {"queue": queue},
                "clientExecutorId": front_end::executor_id(&thread_id)});
            let command = super::parse_command("start-run", &body)?;
            let _ = super::commands::execute(state, principal, request, command).await?;
            Some(ag_run_id.clone())
        }
        None => {
            // Nothing to run: the transcript, and the end.
            snapshot(&mut first);
            ending = Some(Ending::Finished(RunOutcome::Success, Vec::new()));
            None
        }
    };
    let mut translator = Translator::new(
        run_id.as_deref().unwrap_or_default(),
        known,
        answered,
        client_tools.clone(),
        scope,
    );
    if let (Some(active), None) = (&thread.active, &ending)
        && resume.is_empty()
        && translator_rejoins(&first)
    {
        for (id, role) in &active.open_text {
            translator.reopen(id, role, &mut first);
        }
        if let Some(waiting) = active
            .waiting_on
            .as_ref()
            .and_then(|i| thread.interrupts.get(i))
            && waiting["decision"].is_null()
        {
            translator.remember(waiting);
            ending = Some(Ending::Finished(
                RunOutcome::interrupt(vec![translate::interrupt(waiting)]),
                Vec::new(),
            ));
        } else {
            translator.pending(
                active
                    .open_client_calls
                    .iter()
                    .filter(|(_, name)| client_tools.contains(*name))
                    .map(|(id, _)| id.clone()),
            );
        }
    }
    Ok(Plan {
        thread_id,
        ag_run_id,
        run_id,
        after: thread.covers,
        first,
        ending,
        translator,
        scope: scope.to_owned(),
        client_results,
    })
}

/// The thread as snapshots: its messages (the client's tool answers under
/// the ids of its tool messages), and its state when it has one.
fn snapshots(thread: &Thread, client_results: &HashMap<String, String>) -> Vec<Event> {
    let messages: Vec<Message> = thread
        .messages(client_results)
        .into_iter()
        .filter_map(|m| serde_json::from_value(m).ok())
        .collect();
    let mut out = vec![Event::messages_snapshot(messages)];
    if let Some(s) = &thread.state {
        out.push(Event::state_snapshot(s.clone()));
    }
    out
}

/// Whether the first events are a rejoin's (they hold a snapshot).
fn translator_rejoins(first: &[Event]) -> bool {
    first
        .iter()
        .any(|e| matches!(e, Event::MessagesSnapshot(_)))
}

/// Folds the session's history.
async fn fold(
    state: &AppState,
    tenant: &TenantId,
    thread_id: &str,
    scope: &str,
) -> ApiResult<Thread> {
    let mut thread = Thread::new(scope);
    loop {
        let page = super::sse::history_after(state, tenant, thread_id, thread.covers).await?;
        for e in &page.events {
            thread.fold(e);
        }
        if page.next_session_sequence.is_none() {
            return Ok(thread);
        }
    }
}

/// Streams the plan (see [`answer`]); a stream the client broke off
/// before its AG-UI run ended may stop the narad run
/// ([`front_end::broken_off`]: `abortRun()`).
async fn feed(
    state: AppState,
    connection: Connection,
    plan: Plan,
    live: broadcast::Receiver<std::sync::Arc<crate::hub::Live>>,
    opened: Option<i64>,
) {
    let (thread_id, run_id) = (plan.thread_id.clone(), plan.run_id.clone());
    if !answer(&state, &connection, plan, live).await
        && let Some(run_id) = run_id
    {
        front_end::broken_off(&state, &connection, &thread_id, &run_id, opened);
    }
}

/// Streams the plan: its first events, then the run's events as they are
/// committed (read from history after each wake-up of the session's live
/// feed, so that each is sent once, in order), until the AG-UI run ends
/// (`true`: answered), or the stream ends first (`false`: the client went
/// away, or the server is stopping).
async fn answer(
    state: &AppState,
    connection: &Connection,
    mut plan: Plan,
    mut live: broadcast::Receiver<std::sync::Arc<crate::hub::Live>>,
) -> bool {
    let (thread_id, ag_run_id) = (plan.thread_id.clone(), plan.ag_run_id.clone());
    let mut out = std::mem::take(&mut plan.first);
    if let Some(ending) = plan.ending.take() {
        plan.translator
            .end(&thread_id, &ag_run_id, ending, &mut out);
        let _ = connection.send(frames(&out)).await;
        return true;
    }
    if plan.run_id.is_none() {
        return true;
    }
    if connection.send(frames(&out)).await.is_err() {
        return false;
    }
    let tenant = connection.principal.tenant.clone();
    let mut after = plan.after;
    let ended = connection.until_ended(state);
    tokio::pin!(ended);
    loop {
        // Everything committed so far.
        loop {
            while live.try_recv().is_ok() {}
            let page = match super::sse::history_after(state, &tenant, &thread_id, after).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, "an AG-UI stream cannot read history");
                    let mut out = Vec::new();
                    plan.translator.end(
                        &thread_id,
                        &ag_run_id,
                        Ending::Error {
                            code: ErrorCode::DatabaseUnavailable.code().to_owned(),
                            message:
                                "the stream cannot read the thread; send the input again to rejoin"
                                    .to_owned(),
                        },
                        &mut out,
                    );
                    let _ = connection.send(frames(&out)).await;
                    return true;
                }
            };
            let mut out = Vec::new();
            for e in &page.events {
                after = e["sessionSequence"].as_u64().unwrap_or(after + 1);
                if let Some(ending) = plan.translator.event(e, &mut out) {
                    let interrupted =
                        matches!(&ending, Ending::Finished(RunOutcome::Interrupt { .. }, _));
                    plan.translator
                        .end(&thread_id, &ag_run_id, ending, &mut out);
                    if interrupted {
                        // What a resume needs, before the interrupt outcome
                        // (AG-UI's interrupt lifecycle asks for both).
                        match fold(state, &tenant, &thread_id, &plan.scope).await {
                            Ok(thread) => {
                                let at = out.len() - 1;
                                out.splice(at..at, snapshots(&thread, &plan.client_results));
                            }
                            Err(e) => {
                                tracing::warn!(
                                    code = e.code(),
                                    "an AG-UI stream cannot snapshot the thread"
                                );
                            }
                        }
                    }
                    let _ = connection.send(frames(&out)).await;
                    return true;
                }
            }
            if !out.is_empty() && connection.send(frames(&out)).await.is_err() {
                return false;
            }
            if page.next_session_sequence.is_none() {
                break;
            }
        }
        if let Some(ending) = plan.translator.awaiting_client() {
            let mut out = Vec::new();
            plan.translator
                .end(&thread_id, &ag_run_id, ending, &mut out);
            let _ = connection.send(frames(&out)).await;
            return true;
        }
        if !front_end::next_commit(&mut live, &mut ended).await {
            return false;
        }
    }
}

/// One message of the client's history, as the route reads it. HttpAgent
/// sends its whole history with every input; only new `user` messages and
/// `tool` messages answering the run's client calls are read, so the rest
/// is taken as it comes (another client's message kinds, its metadata)
/// rather than refused for a shape the route never uses.
struct ClientMessage {
    id: String,
    role: String,
    content: Value,
    tool_call_id: Option<String>,
    error: Option<String>,
}

/// Reads `messages`: each an object with an `id` (1 to 256 characters) and
/// a `role`; a `user` message with its `content`, a `tool` message with its
/// `toolCallId` and `content` (and `error` if it failed). 400 `NRD-0003`
/// with the pointer otherwise.
fn read_messages(raw: &Value) -> ApiResult<Vec<ClientMessage>> {
    let Some(items) = raw.as_array() else {
        return Err(invalid("/messages", "messages is an array"));
    };
    let mut out = Vec::with_capacity(items.len());
    for (n, m) in items.iter().enumerate() {
        let at = |member: &str| format!("/messages/{n}/{member}");
        let text = |member: &str| -> ApiResult<Option<String>> {
            match &m[member] {
                Value::Null => Ok(None),
                Value::String(s) => Ok(Some(s.clone())),
                _ => Err(invalid(&at(member), format!("{member} is a string"))),
            }
        };
        if !m.is_object() {
            return Err(invalid(&format!("/messages/{n}"), "a message is an object"));
        }
        let id = text("id")?.ok_or_else(|| invalid(&at("id"), "a message has an id"))?;
        SessionId::new(id.clone()).map_err(|e| invalid(&at("id"), format!("a message id {e}")))?;
        let role = text("role")?.ok_or_else(|| invalid(&at("role"), "a message has a role"))?;
        let content = m["content"].clone();
        if matches!(role.as_str(), "user" | "tool") && content.is_null() {
            return Err(invalid(
                &at("content"),
                format!("a {role} message has content"),
            ));
        }
        let tool_call_id = text("toolCallId")?;
        if role == "tool" && tool_call_id.is_none() {
            return Err(invalid(
                &at("toolCallId"),
                "a tool message names its toolCallId",
            ));
        }
        let error = text("error")?;
        out.push(ClientMessage {
            id,
            role,
            content,
            tool_call_id,
            error,
        });
    }
    Ok(out)
}

/// The text of a user message's `content`: the string, or its text parts'.
fn text_of(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter(|p| p["type"] == "text")
                .filter_map(|p| p["text"].as_str())
                .collect();
            (!texts.is_empty()).then(|| texts.concat())
        }
        _ => None,
    }
}

/// The OpenAPI components of the route: `AgUiRunAgentInput` (AG-UI 1.0's
/// `RunAgentInput`, with the `AgUi*` parts it names) and `AgUiEvent` (one
/// AG-UI event of the answer).
pub fn schemas() -> Vec<(String, Value)> {
    let component = |name: &str| json!({"$ref": format!("#/components/schemas/{name}")});
    // Members AG-UI types as any value but null (JSON Schema `{}` would
    // admit null, which the input's reading refuses): no U+0000 either.
    let not_null = json!({"not": {"anyOf": [{"type": "null"}, component("HoldsU0000")]}});
    let part = json!({
        "description": "An AG-UI content part: text, or an image, audio, video or document source.",
        "type": "object",
        "required": ["type"],
        "properties": {"type": component("AgUiContentPartType"), "text": {"type": "string"}, "source": {"type": "object"}},
    });
    let message = json!({
        "description": "An AG-UI message, by role: developer, system, assistant (`toolCalls`), user, tool (`toolCallId`, `error`), activity, reasoning. Only new `user` messages (by id) and `tool` messages answering the run's client tool calls are read; the rest is the client's history.",
        "type": "object",
        "required": ["id", "role"],
        "allOf": [
            {"if": {"properties": {"role": {"enum": ["user", "tool"]}}}, "then": {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}}},
            {"if": {"properties": {"role": {"const": "tool"}}}, "then": {"required": ["toolCallId"]}},
        ],
        "properties": {
            "id": {"type": "string", "minLength": 1, "maxLength": 256},
            "role": {"description": "The role (AgUiRole names AG-UI 1.0's): only `user` and `tool` messages are read, the others taken as they come.", "type": "string"},
            "content": {"description": "A user message's text or content parts (AgUiContentPart), recorded as its content; a tool message's result (JSON text is parsed); not null in those two. Other messages' content is not read (any value).", "not": component("HoldsU0000")},
            "toolCallId": {"description": "A tool message's call; null is taken as absent (a tool message without one is refused).", "type": ["string", "null"]},
            "error": {"description": "A failed tool message's error; null is taken as absent.", "type": ["string", "null"]},
        },
        "additionalProperties": {"description": "Not read (`name`, `toolCalls`, `metadata`, ...): taken as they come."},
    });
    let tool = json!({
        "description": "A tool of the client (a frontend tool).",
        "type": "object",
        "required": ["name", "description"],
        "properties": {"name": {"type": "string"}, "description": {"type": "string"}, "parameters": not_null.clone(), "metadata": {"type": "object"}},
    });
    let context = json!({
        "description": "An AG-UI context entry, handed to the runtime.",
        "type": "object",
        "required": ["description", "value"],
        "properties": {"description": {"type": "string"}, "value": {"type": "string"}},
    });
    let resume = json!({
        "description": "An answer to an interrupt: `resolved` with `payload.decision` (one of its actions) and optional `payload.reason`; `cancelled` decides the first of `cancel`, `deny`, `reject`, `stop` the interrupt offers.",
        "type": "object",
        "required": ["interruptId", "status"],
        "properties": {"interruptId": {"type": "string"}, "status": component("AgUiResumeStatus"), "payload": not_null.clone(), "metadata": {"type": "object"}},
    });
    let input = json!({
        "description": "AG-UI 1.0 RunAgentInput. `threadId` is the narad session (created when new); `runId` names the AG-UI run, and the narad run a new message starts (a repeated POST starts nothing twice). `forwardedProps.narad.queue` names the runtimes' queue, `forwardedProps.narad.stateScope` the state scope that is AG-UI's state (default `session`). `tools` are the client's (frontend) tools; every run the route starts is bound to the session's front-end executor `front-end:<threadId>` (the one `POST /v1/chat` uses), so a client tool call is answered from either route. `resume` answers the interrupts the last AG-UI run finished with. `state` and `context` are handed to the runtime in the run's input (`input.agUi`), not recorded as state.",
        "type": "object",
        "required": ["threadId", "runId", "messages"],
        "properties": {
            "threadId": {"type": "string", "minLength": 1, "maxLength": 256},
            "runId": {"type": "string", "minLength": 1, "maxLength": 256},
            "protocolVersion": {"type": "string"},
            "parentRunId": {"type": "string"},
            "state": {},
            "messages": {"type": "array", "items": component("AgUiMessage")},
            "tools": {"type": "array", "items": component("AgUiTool")},
            "context": {"type": "array", "items": component("AgUiContext")},
            "forwardedProps": {"description": "Anything but null (AG-UI's own schema): `narad.queue` and `narad.stateScope` are read.", "not": not_null["not"].clone()},
            "resume": {"type": "array", "items": component("AgUiResumeEntry")},
        },
    });
    let event = json!({
        "description": "One AG-UI 1.0 event (`@ag-ui/core`'s EventSchema), sent as `data: {json}`. Optional fields are left out, never null; narad's own ids and extras are in `metadata.narad`.",
        "type": "object",
        "required": ["type"],
        "properties": {"type": component("AgUiEventType"), "metadata": {"type": "object"}},
        "additionalProperties": true,
    });
    let enumeration = |description: &str, values: &[&str]| json!({"description": description, "type": "string", "enum": values});
    vec![
        ("AgUiRunAgentInput".to_owned(), input),
        ("AgUiMessage".to_owned(), message),
        ("AgUiContentPart".to_owned(), part),
        ("AgUiTool".to_owned(), tool),
        ("AgUiContext".to_owned(), context),
        ("AgUiResumeEntry".to_owned(), resume),
        ("AgUiEvent".to_owned(), event),
        (
            "AgUiFrame".to_owned(),
            super::openapi::frame(
                "message",
                None,
                "AgUiEvent",
                "One server-sent event of POST /v1/ag-ui, as a client parses it: no `event:` or `id:` line, `data` one AG-UI event (JSON).",
            ),
        ),
        (
            "AgUiRole".to_owned(),
            enumeration(
                "An AG-UI message role.",
                &[
                    "developer",
                    "system",
                    "assistant",
                    "user",
                    "tool",
                    "activity",
                    "reasoning",
                ],
            ),
        ),
        (
            "AgUiContentPartType".to_owned(),
            enumeration(
                "An AG-UI content part type.",
                &["text", "image", "audio", "video", "document"],
            ),
        ),
        (
            "AgUiResumeStatus".to_owned(),
            enumeration("How an interrupt is answered.", &["resolved", "cancelled"]),
        ),
        (
            "AgUiEventType".to_owned(),
            enumeration(
                "The AG-UI event types narad sends.",
                &[
                    "RUN_STARTED",
                    "RUN_FINISHED",
                    "RUN_ERROR",
                    "STEP_STARTED",
                    "STEP_FINISHED",
                    "TEXT_MESSAGE_START",
                    "TEXT_MESSAGE_CONTENT",
                    "TEXT_MESSAGE_END",
                    "TOOL_CALL_START",
                    "TOOL_CALL_ARGS",
                    "TOOL_CALL_END",
                    "TOOL_CALL_RESULT",
                    "STATE_SNAPSHOT",
                    "STATE_DELTA",
                    "MESSAGES_SNAPSHOT",
                    "REASONING_START",
                    "REASONING_MESSAGE_START",
                    "REASONING_MESSAGE_CONTENT",
                    "REASONING_MESSAGE_END",
                    "REASONING_END",
                    "CUSTOM",
                    "RAW",
                ],
            ),
        ),
    ]
}
