//! `POST /v1/commands/{command}`: every command of §2.2. A command is
//! accepted (2xx, with the ids and sequences of the events it caused) or
//! refused (4xx) before any durable change.
//!
//! Both command routes (this one and the spec's resolve-interrupt path)
//! run `execute`: one authorization step, which finds the session a
//! command acts on and checks the caller against it (tenant, role,
//! `sessions` claim). The journal's command functions take the
//! [`narad_journal::Authorized`] it yields, the only way to act on a
//! session.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use narad_protocol::ErrorCode;
use narad_protocol::commands::{Command, Target};
use serde_json::{Value, json};

use super::parse_command;
use crate::AppState;
use crate::auth::{Permission, Principal};
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};

/// Runs a command.
#[utoipa::path(post, path = "/v1/commands/{command}", tag = "commands",
    params(("command" = String, Path, description = "start-run, stop-run, resolve-interrupt, record-user-message, start-workflow, cancel-workflow, redact-message, create-session, update-session or archive-session")),
    request_body(content = Object, description = "The command's body (schema/commands/{command}.json)"),
    responses(
        (status = 200, description = "Accepted: the events it caused, with their sequences", body = Object),
        (status = 201, description = "Accepted, and a run, workflow or session was created", body = Object),
        (status = 202, description = "start-run with onConflict enqueue: queued until the slot frees", body = Object),
        (status = 400, description = "NRD-0002, NRD-0003: the body; NRD-0008: an id used in several sessions without sessionId"),
        (status = 403, description = "NRD-0102: the token lacks the role, or is limited to other sessions"),
        (status = 404, description = "NRD-0007: unknown command, or what it names does not exist"),
        (status = 409, description = "NRD-0201 (with the rule), NRD-0204 (with the active execution), NRD-0205 (with the decision)"),
    ),
    security(("bearer" = [])))]
pub async fn run(
    State(state): State<AppState>,
    principal: Principal,
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
    let command = parsed.map_err(|e| ApiError::from_body((&e).into()))?;
    execute(&state, &principal, command).await
}

/// `POST /api/narad/v1/commands/resolve-interrupt`: the spec's own path
/// (§2.2). The interrupt id alone locates its session and owning journal;
/// the command is then run exactly as `POST /v1/commands/resolve-interrupt`.
#[utoipa::path(post, path = "/api/narad/v1/commands/resolve-interrupt", tag = "commands",
    request_body(content = Object, description = "`{interruptId, sessionId?, decision, reason?, members?}` (schema/commands/resolve-interrupt.json)"),
    responses(
        (status = 200, description = "Resolved: the interrupt.resolved appended", body = Object),
        (status = 400, description = "NRD-0008: the interrupt id is used in several sessions; add sessionId"),
        (status = 403, description = "NRD-0102: the token lacks the approver role, or is limited to other sessions"),
        (status = 404, description = "NRD-0007: no such interrupt"),
        (status = 409, description = "NRD-0205: resolved before, with the decision recorded; NRD-0201 with the rule"),
    ),
    security(("bearer" = [])))]
pub async fn resolve_interrupt_alias(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let command = parse_command("resolve-interrupt", &body)?;
    execute(&state, &principal, command).await
}

/// Runs a command for `principal`: the one path of every command route.
/// The role first; then the session the command acts on (the one it
/// names, or the one holding the object it names by id), against which
/// the caller is authorized before anything is written.
async fn execute(
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
            let record = journal
                .create_session(&principal.tenant, cmd.into())
                .await?;
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
            let mut answer = to_json(&started);
            answer["sessionId"] = json!(auth.session());
            (status, Json(answer))
        }
        (Command::StopRun(cmd), Some(auth)) => {
            let (session, appended) = journal.stop_run(&auth, &cmd).await?;
            ok(json!({"sessionId": session, "appended": appended}))
        }
        (Command::ResolveInterrupt(cmd), Some(auth)) => {
            let (session, appended) = journal.resolve_interrupt(&auth, &cmd).await?;
            ok(json!({"sessionId": session, "appended": appended}))
        }
        (Command::RecordUserMessage(cmd), Some(auth)) => {
            let (message_id, appended) = journal.record_user_message(&auth, &cmd).await?;
            created(
                json!({"sessionId": auth.session(), "messageId": message_id, "appended": appended}),
            )
        }
        (Command::StartWorkflow(cmd), Some(auth)) => {
            let (workflow_id, appended) = journal.start_workflow(&auth, &cmd).await?;
            created(
                json!({"sessionId": auth.session(), "workflowId": workflow_id, "appended": appended}),
            )
        }
        (Command::CancelWorkflow(cmd), Some(auth)) => {
            ok(to_json(&journal.cancel_workflow(&auth, &cmd).await?))
        }
        (Command::RedactMessage(cmd), Some(auth)) => {
            let appended = journal.redact_message(&auth, &cmd).await?;
            ok(json!({"sessionId": auth.session(), "appended": appended}))
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
