//! `POST /v1/commands/<name>`: every command of §2.2, each at a route of
//! its own with its own body and answer. A command is accepted (2xx, with
//! the ids and sequences of the events it caused) or refused (4xx) before
//! any durable change.
//!
//! Every command route (and the spec's resolve-interrupt path) runs
//! `execute`: one authorization step, which finds the session a
//! command acts on and checks the caller against it (tenant, role,
//! `sessions` claim). The journal's command functions take the
//! [`narad_journal::Authorized`] it yields, the only way to act on a
//! session.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use narad_journal::{Appended, RunStart, SessionRecord, WorkflowCancel};
use narad_protocol::ErrorCode;
use narad_protocol::commands::{Command, Target};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::parse_command;
use crate::AppState;
use crate::audit::RequestId;
use crate::auth::{Permission, Principal};
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};

/// Runs the command named in the path, whichever it is. The router
/// registers it under `/v1/commands/{command}`, undocumented: each command
/// has a route of its own below (which the router prefers), so this one
/// only answers names that are not commands (404, naming the commands).
pub async fn run(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    Path(name): Path<String>,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let Some(parsed) = Command::parse(&name, &body) else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!(
                "no command is named {name:?}; the commands are {}",
                Command::NAMES.join(", ")
            ),
        ));
    };
    state.quotas.take_command(&principal.tenant).await?;
    let command = parsed.map_err(|e| ApiError::from_body((&e).into()))?;
    execute(&state, &principal, &request, command).await
}

/// Runs command `name` with `body`: what each command's route does.
async fn run_named(
    state: &AppState,
    principal: &Principal,
    request: &RequestId,
    name: &str,
    body: &Value,
) -> ApiResult<(StatusCode, Json<Value>)> {
    // Over the command rate: refused before anything, and counted in
    // /metrics rather than written to the audit log one by one (a flood
    // must not cost a row each).
    state.quotas.take_command(&principal.tenant).await?;
    let command = match parse_command(name, body) {
        Ok(command) => command,
        Err(refused) => {
            let outcome: ApiResult<(StatusCode, Json<Value>)> = Err(refused);
            crate::audit::record(state, principal, request, name, None, &outcome, None).await;
            return outcome;
        }
    };
    execute(state, principal, request, command).await
}

/// The answer of a command that appended events to a session.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommandAnswer {
    /// The session the command acted on.
    #[schema(schema_with = narad_journal::openapi::id)]
    pub session_id: String,
    /// The events it appended, with their sequences.
    pub appended: Appended,
}

/// The answer of `start-run`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunStartAnswer {
    /// The run's session.
    #[schema(schema_with = narad_journal::openapi::id)]
    pub session_id: String,
    /// What the start did: appended now, queued, or a stop requested first.
    #[serde(flatten)]
    pub start: RunStart,
}

/// The answer of `record-user-message`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserMessageAnswer {
    /// The session.
    #[schema(schema_with = narad_journal::openapi::id)]
    pub session_id: String,
    /// The recorded message.
    #[schema(schema_with = narad_journal::openapi::id)]
    pub message_id: String,
    /// The `message.user.recorded` appended.
    pub appended: Appended,
}

/// The answer of `start-workflow`.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowStartAnswer {
    /// The session.
    #[schema(schema_with = narad_journal::openapi::id)]
    pub session_id: String,
    /// The workflow started.
    #[schema(schema_with = narad_journal::openapi::id)]
    pub workflow_id: String,
    /// The `workflow.started` appended.
    pub appended: Appended,
}

/// `create-session`: creates a session, as `POST /v1/sessions` does.
#[utoipa::path(post, path = "/v1/commands/create-session", operation_id = "createSessionCommand", tag = "commands",
    request_body(content = ref("#/components/schemas/commands.create-session"), description = "schema/commands/create-session.json"),
    responses(
        (status = 201, description = "The session", body = SessionRecord),
        (status = 403, description = "NRD-0102: no `command` role, or a token limited to sessions (it could not name the new one)"),
        (status = 409, description = "NRD-0206: a session with this id exists"),
    ),
    security(("bearer" = [])))]
pub async fn create_session(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    run_named(&state, &principal, &request, "create-session", &body).await
}

/// `start-run`: starts a top-level or nested run, or queues it, or stops
/// the active run first (`onConflict`).
#[utoipa::path(post, path = "/v1/commands/start-run", operation_id = "startRun", tag = "commands",
    request_body(content = ref("#/components/schemas/commands.start-run"), description = "schema/commands/start-run.json"),
    responses(
        (status = 201, description = "Started: the run.started appended (and the stop requested first, with onConflict interrupt)", body = RunStartAnswer),
        (status = 202, description = "onConflict enqueue: queued until the slot frees (`queueId`)", body = RunStartAnswer),
        (status = 403, description = "NRD-0102: no `command` role, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such session, or no such parent run"),
        (status = 409, description = "NRD-0204: the slot is taken (`details.activeExecution`); NRD-0201 with the rule"),
    ),
    security(("bearer" = [])))]
pub async fn start_run(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    run_named(&state, &principal, &request, "start-run", &body).await
}

/// `stop-run`: asks a run to stop (`run.stop.requested`).
#[utoipa::path(post, path = "/v1/commands/stop-run", operation_id = "stopRun", tag = "commands",
    request_body(content = ref("#/components/schemas/commands.stop-run"), description = "schema/commands/stop-run.json"),
    responses(
        (status = 200, description = "The stop request appended", body = CommandAnswer),
        (status = 400, description = "NRD-0003: the body; NRD-0008: a run id used in several sessions without sessionId"),
        (status = 403, description = "NRD-0102: no `command` role, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such run"),
        (status = 409, description = "NRD-0201 with the rule (the run has ended)"),
    ),
    security(("bearer" = [])))]
pub async fn stop_run(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    run_named(&state, &principal, &request, "stop-run", &body).await
}

/// `resolve-interrupt`: decides an interrupt (role `approver`).
#[utoipa::path(post, path = "/v1/commands/resolve-interrupt", operation_id = "resolveInterrupt", tag = "commands",
    request_body(content = ref("#/components/schemas/commands.resolve-interrupt"), description = "schema/commands/resolve-interrupt.json"),
    responses(
        (status = 200, description = "Resolved: the interrupt.resolved appended", body = CommandAnswer),
        (status = 400, description = "NRD-0003: the body; NRD-0008: the interrupt id is used in several sessions; add sessionId"),
        (status = 403, description = "NRD-0102: no `approver` role, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such interrupt"),
        (status = 409, description = "NRD-0205: resolved before (`details.decision`); NRD-0201 with the rule"),
    ),
    security(("bearer" = [])))]
pub async fn resolve_interrupt(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    run_named(&state, &principal, &request, "resolve-interrupt", &body).await
}

/// `record-user-message`: records what a user said
/// (`message.user.recorded`).
#[utoipa::path(post, path = "/v1/commands/record-user-message", operation_id = "recordUserMessage", tag = "commands",
    request_body(content = ref("#/components/schemas/commands.record-user-message"), description = "schema/commands/record-user-message.json"),
    responses(
        (status = 201, description = "Recorded", body = UserMessageAnswer),
        (status = 403, description = "NRD-0102: no `command` role, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such session or run"),
        (status = 409, description = "NRD-0201 with the rule; NRD-0202: the messageId was used with another body"),
    ),
    security(("bearer" = [])))]
pub async fn record_user_message(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    run_named(&state, &principal, &request, "record-user-message", &body).await
}

/// `start-workflow`: starts a workflow (`workflow.started`).
#[utoipa::path(post, path = "/v1/commands/start-workflow", operation_id = "startWorkflow", tag = "commands",
    request_body(content = ref("#/components/schemas/commands.start-workflow"), description = "schema/commands/start-workflow.json"),
    responses(
        (status = 201, description = "Started", body = WorkflowStartAnswer),
        (status = 403, description = "NRD-0102: no `command` role, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such session"),
        (status = 409, description = "NRD-0204: the slot is taken (`details.activeExecution`); NRD-0201 with the rule"),
    ),
    security(("bearer" = [])))]
pub async fn start_workflow(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    run_named(&state, &principal, &request, "start-workflow", &body).await
}

/// `cancel-workflow`: cancels a workflow, stopping its open runs first.
#[utoipa::path(post, path = "/v1/commands/cancel-workflow", operation_id = "cancelWorkflow", tag = "commands",
    request_body(content = ref("#/components/schemas/commands.cancel-workflow"), description = "schema/commands/cancel-workflow.json"),
    responses(
        (status = 200, description = "workflow.cancelled appended, or the stops of its open runs requested first", body = WorkflowCancel),
        (status = 400, description = "NRD-0003: the body; NRD-0008: a workflow id used in several sessions without sessionId"),
        (status = 403, description = "NRD-0102: no `command` role, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such workflow"),
        (status = 409, description = "NRD-0201 with the rule (the workflow has ended)"),
    ),
    security(("bearer" = [])))]
pub async fn cancel_workflow(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    run_named(&state, &principal, &request, "cancel-workflow", &body).await
}

/// `redact-message`: redacts a message (`message.redacted`).
#[utoipa::path(post, path = "/v1/commands/redact-message", operation_id = "redactMessage", tag = "commands",
    request_body(content = ref("#/components/schemas/commands.redact-message"), description = "schema/commands/redact-message.json"),
    responses(
        (status = 200, description = "The message.redacted appended", body = CommandAnswer),
        (status = 403, description = "NRD-0102: no `command` role, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such session or message"),
        (status = 409, description = "NRD-0201 with the rule"),
    ),
    security(("bearer" = [])))]
pub async fn redact_message(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    run_named(&state, &principal, &request, "redact-message", &body).await
}

/// `update-session`: changes a session's title or metadata.
#[utoipa::path(post, path = "/v1/commands/update-session", operation_id = "updateSession", tag = "commands",
    request_body(content = ref("#/components/schemas/commands.update-session"), description = "schema/commands/update-session.json"),
    responses(
        (status = 200, description = "The session as updated", body = SessionRecord),
        (status = 403, description = "NRD-0102: no `command` role, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such session"),
    ),
    security(("bearer" = [])))]
pub async fn update_session(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    run_named(&state, &principal, &request, "update-session", &body).await
}

/// `archive-session`: archives a session.
#[utoipa::path(post, path = "/v1/commands/archive-session", operation_id = "archiveSession", tag = "commands",
    request_body(content = ref("#/components/schemas/commands.archive-session"), description = "schema/commands/archive-session.json"),
    responses(
        (status = 200, description = "The session as archived", body = SessionRecord),
        (status = 403, description = "NRD-0102: no `command` role, or the token is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such session"),
    ),
    security(("bearer" = [])))]
pub async fn archive_session(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    run_named(&state, &principal, &request, "archive-session", &body).await
}

/// `POST /api/narad/v1/commands/resolve-interrupt`: the spec's own path
/// (§2.2). The interrupt id alone locates its session and owning journal;
/// the command is then run exactly as `POST /v1/commands/resolve-interrupt`.
#[utoipa::path(post, path = "/api/narad/v1/commands/resolve-interrupt", operation_id = "resolveInterruptAtSpecPath", tag = "commands",
    request_body(content = ref("#/components/schemas/commands.resolve-interrupt"), description = "schema/commands/resolve-interrupt.json"),
    responses(
        (status = 200, description = "Resolved: the interrupt.resolved appended", body = CommandAnswer),
        (status = 400, description = "NRD-0003: the body; NRD-0008: the interrupt id is used in several sessions; add sessionId"),
        (status = 403, description = "NRD-0102: the token lacks the approver role, or is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such interrupt"),
        (status = 409, description = "NRD-0205: resolved before, with the decision recorded; NRD-0201 with the rule"),
    ),
    security(("bearer" = [])))]
pub async fn resolve_interrupt_alias(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    run_named(&state, &principal, &request, "resolve-interrupt", &body).await
}

/// Creates a session within the tenant's session limit: what both
/// `create-session` routes do.
pub(crate) async fn create_session_within_limit(
    state: &AppState,
    principal: &Principal,
    cmd: narad_protocol::commands::CreateSession,
) -> ApiResult<SessionRecord> {
    let max = state
        .quotas
        .limit(&principal.tenant, crate::quotas::Limit::Sessions)
        .await?;
    state
        .journal
        .create_session_within(&principal.tenant, cmd.into(), max)
        .await
        .map_err(ApiError::from)
}

/// Runs a command for `principal` and records it in the audit log with its
/// outcome: the one path of every command route.
pub(crate) async fn execute(
    state: &AppState,
    principal: &Principal,
    request: &RequestId,
    command: Command,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let action = command.name();
    let named = match command.target() {
        Target::Session(s)
        | Target::Located {
            session: Some(s), ..
        } => Some(s.to_string()),
        _ => None,
    };
    let outcome = authorize_and_run(state, principal, command).await;
    let answer = outcome.as_ref().ok().map(|(_, Json(answer))| answer);
    crate::audit::record(
        state,
        principal,
        request,
        action,
        named.as_deref(),
        &outcome,
        answer,
    )
    .await;
    outcome
}

/// Runs a command: the role first; then the session the command acts on
/// (the one it names, or the one holding the object it names by id),
/// against which the caller is authorized before anything is written.
async fn authorize_and_run(
    state: &AppState,
    principal: &Principal,
    command: Command,
) -> ApiResult<(StatusCode, Json<Value>)> {
    principal.require(match command {
        Command::ResolveInterrupt(_) => Permission::Approve,
        _ => Permission::Command,
    })?;
    let journal = &state.journal;
    let caller = principal.caller();
    let auth = match command.target() {
        Target::Session(session) => Some(caller.authorize(session)?),
        Target::Located {
            kind,
            id,
            field,
            session,
        } => {
            // A limited caller naming another session is refused before
            // the session is looked into.
            if let Some(s) = session {
                caller.authorize(s)?;
            }
            let owner = journal
                .owning_session(&principal.tenant, kind, id, field, session)
                .await?;
            Some(caller.authorize(&owner)?)
        }
        Target::NewSession => {
            if principal.sessions.is_some() {
                return Err(ApiError::new(
                    ErrorCode::Forbidden,
                    "this token is limited to sessions, and create-session without a sessionId \
                     would make one it does not name; name a session it lists",
                ));
            }
            None
        }
    };
    Ok(match (command, auth) {
        (Command::CreateSession(cmd), _) => {
            let record = create_session_within_limit(state, principal, cmd).await?;
            created(to_json(&record))
        }
        (_, None) => unreachable!("every command but create-session acts on a session"),
        (Command::StartRun(cmd), Some(auth)) => {
            let started = journal.start_run(&auth, &cmd).await?;
            let status = if started.appended.is_some() {
                StatusCode::CREATED
            } else {
                StatusCode::ACCEPTED
            };
            let answer = RunStartAnswer {
                session_id: auth.session().to_string(),
                start: started,
            };
            (status, Json(to_json(&answer)))
        }
        (Command::StopRun(cmd), Some(auth)) => {
            let (session_id, appended) = journal.stop_run(&auth, &cmd).await?;
            ok(to_json(&CommandAnswer {
                session_id,
                appended,
            }))
        }
        (Command::ResolveInterrupt(cmd), Some(auth)) => {
            let (session_id, appended) = journal.resolve_interrupt(&auth, &cmd).await?;
            ok(to_json(&CommandAnswer {
                session_id,
                appended,
            }))
        }
        (Command::RecordUserMessage(cmd), Some(auth)) => {
            let (message_id, appended) = journal.record_user_message(&auth, &cmd).await?;
            created(to_json(&UserMessageAnswer {
                session_id: auth.session().to_string(),
                message_id,
                appended,
            }))
        }
        (Command::StartWorkflow(cmd), Some(auth)) => {
            let (workflow_id, appended) = journal.start_workflow(&auth, &cmd).await?;
            created(to_json(&WorkflowStartAnswer {
                session_id: auth.session().to_string(),
                workflow_id,
                appended,
            }))
        }
        (Command::CancelWorkflow(cmd), Some(auth)) => {
            ok(to_json(&journal.cancel_workflow(&auth, &cmd).await?))
        }
        (Command::RedactMessage(cmd), Some(auth)) => {
            let appended = journal.redact_message(&auth, &cmd).await?;
            ok(to_json(&CommandAnswer {
                session_id: auth.session().to_string(),
                appended,
            }))
        }
        (Command::UpdateSession(cmd), Some(auth)) => {
            ok(to_json(&journal.update_session(&auth, &cmd).await?))
        }
        (Command::ArchiveSession(_), Some(auth)) => {
            ok(to_json(&journal.archive_session(&auth).await?))
        }
    })
}

fn to_json(v: &impl serde::Serialize) -> Value {
    serde_json::to_value(v).expect("answers serialise")
}

fn ok(v: Value) -> (StatusCode, Json<Value>) {
    (StatusCode::OK, Json(v))
}

fn created(v: Value) -> (StatusCode, Json<Value>) {
    (StatusCode::CREATED, Json(v))
}
