//! `POST /v1/commands/{command}`: every command of §2.2. A command is
//! accepted (2xx, with the ids and sequences of the events it caused) or
//! refused (4xx) before any durable change.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use narad_protocol::ErrorCode;
use narad_protocol::commands::{Command, ResolveInterrupt};
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
        (status = 400, description = "NRD-0002, NRD-0003: the body"),
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
    principal.require(match command {
        Command::ResolveInterrupt(_) => Permission::Approve,
        _ => Permission::Command,
    })?;
    // A token limited to sessions acts only on a session it names.
    match command.session_id() {
        Some(session) => principal.require_session(session)?,
        None if principal.sessions.is_some() => {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "{name} finds its session from the id it names, and this token is limited \
                     to sessions; use a token without a `sessions` claim"
                ),
            ));
        }
        None => {}
    }
    let journal = &state.journal;
    let tenant = &principal.tenant;
    Ok(match command {
        Command::StartRun(cmd) => {
            let started = journal.start_run(tenant, &cmd).await?;
            let status = if started.appended.is_some() {
                StatusCode::CREATED
            } else {
                StatusCode::ACCEPTED
            };
            let mut answer = to_json(&started);
            answer["sessionId"] = json!(cmd.session_id);
            (status, Json(answer))
        }
        Command::StopRun(cmd) => {
            let (session, appended) = journal.stop_run(tenant, &cmd).await?;
            ok(json!({"sessionId": session, "appended": appended}))
        }
        Command::ResolveInterrupt(cmd) => resolve(&state, &principal, &cmd).await?,
        Command::RecordUserMessage(cmd) => {
            let (message_id, appended) = journal.record_user_message(tenant, &cmd).await?;
            created(
                json!({"sessionId": cmd.session_id, "messageId": message_id, "appended": appended}),
            )
        }
        Command::StartWorkflow(cmd) => {
            let (workflow_id, appended) = journal.start_workflow(tenant, &cmd).await?;
            created(
                json!({"sessionId": cmd.session_id, "workflowId": workflow_id, "appended": appended}),
            )
        }
        Command::CancelWorkflow(cmd) => ok(to_json(&journal.cancel_workflow(tenant, &cmd).await?)),
        Command::RedactMessage(cmd) => {
            let appended = journal.redact_message(tenant, &cmd).await?;
            ok(json!({"sessionId": cmd.session_id, "appended": appended}))
        }
        Command::CreateSession(cmd) => {
            let record = journal.create_session(tenant, cmd.into()).await?;
            created(to_json(&record))
        }
        Command::UpdateSession(cmd) => ok(to_json(&journal.update_session(tenant, &cmd).await?)),
        Command::ArchiveSession(cmd) => ok(to_json(
            &journal
                .archive_session(tenant, cmd.session_id.as_str())
                .await?,
        )),
    })
}

/// `POST /api/narad/v1/commands/resolve-interrupt`: the spec's own path
/// (§2.2). The interrupt id alone locates its session and owning journal.
#[utoipa::path(post, path = "/api/narad/v1/commands/resolve-interrupt", tag = "commands",
    request_body(content = Object, description = "`{interruptId, decision, reason?, members?}` (schema/commands/resolve-interrupt.json)"),
    responses(
        (status = 200, description = "Resolved: the interrupt.resolved appended", body = Object),
        (status = 404, description = "NRD-0007: no such interrupt"),
        (status = 409, description = "NRD-0205: resolved before, with the decision recorded"),
    ),
    security(("bearer" = [])))]
pub async fn resolve_interrupt_alias(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let Command::ResolveInterrupt(cmd) = parse_command("resolve-interrupt", &body)? else {
        unreachable!("resolve-interrupt parses as itself")
    };
    principal.require(Permission::Approve)?;
    resolve(&state, &principal, &cmd).await
}

async fn resolve(
    state: &AppState,
    principal: &Principal,
    cmd: &ResolveInterrupt,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let (session, appended) = state
        .journal
        .resolve_interrupt(&principal.tenant, cmd)
        .await?;
    Ok(ok(json!({"sessionId": session, "appended": appended})))
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
