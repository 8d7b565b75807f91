//! Client executors (§11): the WebSocket channel, and its HTTP form for
//! executors that cannot hold a socket (attach, heartbeat, finish, and a
//! long poll for controls).

use std::time::Duration;

use axum::Json;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use narad_journal::FinishAccepted;
use narad_protocol::primitives::ClientExecutorId;
use narad_protocol::wire::ControlBody;
use narad_protocol::{Classified, ErrorCode, Reader, WireObject};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::AppState;
use crate::auth::{Permission, Principal};
use crate::body::{JsonBody, Query};
use crate::error::{ApiError, ApiResult};
use crate::executors::{Channel, attached, control};
use crate::quotas::Limit;

/// The longest a controls poll waits, in milliseconds.
pub const MAX_POLL_WAIT_MS: u64 = 30_000;

/// Checks that the principal may attach as `executor_id`: the `executor`
/// role, and the id among its `executors` claim when it has one.
fn authorize(principal: &Principal, executor_id: &str) -> ApiResult<()> {
    principal.require(Permission::Execute)?;
    ClientExecutorId::new(executor_id.to_owned()).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidParameter,
            format!("clientExecutorId: {e}"),
        )
        .with_field("clientExecutorId", e)
    })?;
    if let Some(allowed) = &principal.executors
        && !allowed.iter().any(|a| a == executor_id)
    {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "this token may attach as [{}], not {executor_id:?}; ask for a token whose \
                 `executors` claim names it",
                allowed.join(", ")
            ),
        ));
    }
    Ok(())
}

/// Refuses a message naming another endpoint than the path's.
fn same_endpoint(named: Option<&ClientExecutorId>, executor_id: &str) -> ApiResult<()> {
    if named.is_some_and(|c| c.as_str() != executor_id) {
        return Err(ApiError::new(
            ErrorCode::InvalidObject,
            "clientExecutorId differs from the endpoint in the path",
        )
        .with_field(
            "/clientExecutorId",
            "must equal the path's clientExecutorId",
        ));
    }
    Ok(())
}

/// Reads a control message of the client executor profile.
fn control_body(body: &Value, expected: &str) -> ApiResult<ControlBody> {
    let wrong = || {
        ApiError::new(
            ErrorCode::InvalidObject,
            format!("the body is a {expected} control message"),
        )
        .with_field("/type", format!("must be {expected:?}"))
    };
    match Reader::all_profiles().classify(body) {
        Ok(Classified::Accepted(object)) => match *object {
            WireObject::Control(m) if m.body.wire_type().name() == expected => Ok(m.body),
            _ => Err(wrong()),
        },
        Ok(Classified::Ignored { .. }) => Err(wrong()),
        Err(e) => Err(ApiError::from_body((&e).into())),
    }
}

/// The headers of a WebSocket handshake (RFC 6455 §4.1), which a WebSocket
/// client sends for you: without them `connect` answers 400.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(
    dead_code,
    reason = "documents the headers axum's WebSocketUpgrade reads"
)]
pub struct Handshake {
    /// `websocket`.
    #[serde(rename = "Upgrade")]
    #[param(pattern = "^websocket$")]
    upgrade: String,
    /// `Upgrade` (HTTP/1.1).
    #[serde(rename = "Connection")]
    #[param(pattern = "^[Uu]pgrade$")]
    connection: String,
    /// `13`.
    #[serde(rename = "Sec-WebSocket-Version")]
    #[param(pattern = "^13$")]
    version: String,
    /// 16 random bytes in base64.
    #[serde(rename = "Sec-WebSocket-Key")]
    #[param(pattern = "^[A-Za-z0-9+/]{21}[AQgw]==$")]
    key: String,
    /// From a browser, whose WebSocket cannot send Authorization: `narad,
    /// narad.bearer.<JWT>` (the server selects `narad`).
    #[serde(rename = "Sec-WebSocket-Protocol")]
    protocol: Option<String>,
}

/// Attaches over a WebSocket: `client.attached`, then heartbeats both ways
/// and `client.tool.execute` for each call assigned to the executor; the
/// client sends `client.heartbeat` and `client.tool.finish` as JSON text
/// frames. Close codes: 1001 server stopping, 1008 not a control, 4001
/// lease superseded or lapsed, 4002 heartbeats missing, 4003 token
/// expired, 1011 server error. A browser, whose `WebSocket` cannot send
/// `Authorization`, offers its token as a subprotocol instead:
/// `new WebSocket(url, ["narad", "narad.bearer." + token])`. A finish on
/// the socket has no answer (a
/// refused one is only logged): executors that need to know send it over
/// HTTP (`POST /v1/executors/{id}/finish`), as the SDK's runtime does.
#[utoipa::path(get, path = "/v1/executors/{clientExecutorId}/connect", operation_id = "connectExecutor", tag = "executors",
    params(("clientExecutorId" = String, Path, description = "The endpoint to attach as", example = "desktop-worker-123"), Handshake),
    responses(
        (status = 101, description = "Switching to the executor channel (WebSocket). Each message is one JSON text frame: the server sends `client.attached` first, then `server.heartbeat` and `client.tool.execute`; the client sends `client.heartbeat` and `client.tool.finish` (the `x-websocket-messages` of this operation name their schemas)"),
        (status = 400, description = "NRD-0008: not a WebSocket handshake (`fields` names the header: Upgrade, Sec-WebSocket-Version or Sec-WebSocket-Key)"),
        (status = 403, description = "NRD-0102: no `executor` role, or the `executors` claim does not name this id"),
    ),
    extensions(("x-websocket-messages" = json!({
        "server": [
            {"$ref": "#/components/schemas/control.client.attached"},
            {"$ref": "#/components/schemas/control.server.heartbeat"},
            {"$ref": "#/components/schemas/control.client.tool.execute"},
        ],
        "client": [
            {"$ref": "#/components/schemas/control.client.heartbeat"},
            {"$ref": "#/components/schemas/control.client.tool.finish"},
        ],
        "closeCodes": {
            "1001": "the server is stopping",
            "1008": "a message that is not a control of this profile",
            "1011": "a server error",
            "4001": "the lease was superseded or lapsed",
            "4002": "heartbeats missing",
            "4003": "the token expired",
        },
    }))),
    security(("bearer" = [])))]
pub async fn connect(
    State(state): State<AppState>,
    SocketCaller(principal): SocketCaller,
    Path(executor_id): Path<String>,
    headers: axum::http::HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    authorize(&principal, &executor_id)?;
    let upgrade = upgrade.map_err(not_a_handshake)?;
    websocket_key(&headers)?;
    // Refused before the switch, with the status a client can read; the
    // attach on the socket counts again under the tenant's lock.
    let max_executors = state
        .quotas
        .limit(&principal.tenant, Limit::AttachedExecutors)
        .await?;
    state
        .journal
        .executor_room(&principal.tenant, &executor_id, max_executors)
        .await?;
    // A browser that offered its token as a subprotocol also offered
    // `narad`, the one the server selects (never the token's).
    let upgrade = upgrade.protocols([SUBPROTOCOL]);
    let channel = Channel {
        journal: state.journal.clone(),
        hub: state.hub.clone(),
        settings: state.executors.clone(),
        tenant: principal.tenant.clone(),
        executor_id,
        credential_valid_until: principal.valid_until,
        max_executors,
    };
    Ok(upgrade.on_upgrade(move |socket| channel.serve(socket)))
}

/// The subprotocol the executor channel speaks, selected when offered.
pub const SUBPROTOCOL: &str = "narad";

/// The prefix of the subprotocol entry that carries a token from a browser
/// (`narad.bearer.<JWT>`), whose `WebSocket` cannot send `Authorization`.
pub const BEARER_SUBPROTOCOL: &str = "narad.bearer.";

/// The caller of the executor socket: the `Authorization` header's token,
/// or a browser's, offered as the subprotocol `narad.bearer.<JWT>` beside
/// `narad` (`new WebSocket(url, ["narad", "narad.bearer." + token])`),
/// verified the same way.
pub struct SocketCaller(pub Principal);

impl axum::extract::FromRequestParts<AppState> for SocketCaller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> Result<SocketCaller, ApiError> {
        if !parts
            .headers
            .contains_key(axum::http::header::AUTHORIZATION)
            && let Some(token) = offered_token(&parts.headers)
        {
            return Ok(SocketCaller(Principal::from_token(state, &token).await?));
        }
        Principal::from_request_parts(parts, state)
            .await
            .map(SocketCaller)
    }
}

/// The token a browser offered as a subprotocol, when it did.
fn offered_token(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(BEARER_SUBPROTOCOL).map(str::to_owned))
        .filter(|t| !t.is_empty())
}

/// Refuses a `Sec-WebSocket-Key` that is not what RFC 6455 §4.1 makes it,
/// 16 bytes in base64 (axum only checks that there is one).
fn websocket_key(headers: &axum::http::HeaderMap) -> ApiResult<()> {
    use base64::Engine;
    let decoded = headers.get("sec-websocket-key").and_then(|k| {
        base64::engine::general_purpose::STANDARD
            .decode(k.as_bytes())
            .ok()
    });
    if decoded.is_some_and(|k| k.len() == 16) {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorCode::InvalidParameter,
        "Sec-WebSocket-Key must be 16 random bytes in base64 (RFC 6455); a WebSocket client \
         makes one for you",
    )
    .with_field("Sec-WebSocket-Key", "must be 16 bytes in base64"))
}

/// The answer to a `connect` that is not a WebSocket handshake: 400 in the
/// envelope, naming the header at fault (426 Upgrade Required was weighed:
/// it would need a code of its own for the one route, and a client that
/// sends no upgrade is not asking to negotiate one).
fn not_a_handshake(rejection: WebSocketUpgradeRejection) -> ApiError {
    let (header, problem) = match rejection {
        WebSocketUpgradeRejection::InvalidWebSocketVersionHeader(_) => {
            ("Sec-WebSocket-Version", "must be 13")
        }
        WebSocketUpgradeRejection::WebSocketKeyHeaderMissing(_) => ("Sec-WebSocket-Key", "missing"),
        _ => (
            "Upgrade",
            "must be websocket, with Connection: upgrade (over HTTP/1.1)",
        ),
    };
    ApiError::new(
        ErrorCode::InvalidParameter,
        format!(
            "this route is a WebSocket: connect with a WebSocket client ({header} {problem}), \
             or use the HTTP form (POST /v1/executors/{{id}}/attach)"
        ),
    )
    .with_field(header, problem)
}

/// Attaches without a socket: a new lease (superseding any earlier one),
/// answered as `client.attached`. Runs paused while the executor was away
/// resume.
#[utoipa::path(post, path = "/v1/executors/{clientExecutorId}/attach", operation_id = "attachExecutor", tag = "executors",
    params(("clientExecutorId" = String, Path, description = "The endpoint to attach as", example = "desktop-worker-123")),
    responses(
        (status = 201, description = "`client.attached` with the new lease", body = ref("#/components/schemas/control.client.attached")),
        (status = 403, description = "NRD-0102: no `executor` role, or the `executors` claim does not name this id"),
    ),
    security(("bearer" = [])))]
pub async fn attach(
    State(state): State<AppState>,
    principal: Principal,
    Path(executor_id): Path<String>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    authorize(&principal, &executor_id)?;
    let s = &state.executors;
    let max = state
        .quotas
        .limit(&principal.tenant, Limit::AttachedExecutors)
        .await?;
    let lease = state
        .journal
        .attach_executor_within(&principal.tenant, &executor_id, s.lease_ttl, max)
        .await?;
    state.hub.wake_executors(&principal.tenant);
    if let Err(e) = state
        .journal
        .resume_executor_runs(&principal.tenant, &executor_id)
        .await
    {
        tracing::warn!(executor = %executor_id, error = %e, "cannot resume the executor's runs yet; the sweeper will");
    }
    Ok((StatusCode::CREATED, Json(attached(&executor_id, &lease, s))))
}

/// Renews a lease (`client.heartbeat`); answers the lease's new expiry.
#[utoipa::path(post, path = "/v1/executors/{clientExecutorId}/heartbeat", operation_id = "renewExecutorLease", tag = "executors",
    params(("clientExecutorId" = String, Path, description = "The endpoint: the `clientExecutorId` of the body, when it names one", example = "desktop-worker-123")),
    request_body(content = ref("#/components/schemas/control.client.heartbeat"), description = "`client.heartbeat` {clientExecutorId, leaseId}"),
    responses(
        (status = 200, description = "The lease's new expiry", body = LeaseRenewal),
        (status = 400, description = "NRD-0003: not a client.heartbeat, or for another endpoint than the path's"),
        (status = 403, description = "NRD-0102: no `executor` role, or the `executors` claim does not name this id"),
        (status = 409, description = "NRD-0401: the lease was superseded or lapsed; attach again"),
    ),
    security(("bearer" = [])))]
pub async fn heartbeat(
    State(state): State<AppState>,
    principal: Principal,
    Path(executor_id): Path<String>,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<LeaseRenewal>> {
    authorize(&principal, &executor_id)?;
    let ControlBody::ClientHeartbeat(beat) = control_body(&body, "client.heartbeat")? else {
        unreachable!("control_body checks the type");
    };
    same_endpoint(Some(&beat.client_executor_id), &executor_id)?;
    let lease = state
        .journal
        .renew_lease(
            &principal.tenant,
            &executor_id,
            beat.lease_id.as_str(),
            state.executors.lease_ttl,
        )
        .await?;
    Ok(Json(LeaseRenewal {
        lease_id: lease.lease_id,
        lease_expires_at: lease.expires_at,
    }))
}

/// A renewed client executor lease.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseRenewal {
    /// The lease.
    #[schema(schema_with = narad_journal::openapi::id)]
    pub lease_id: String,
    /// When it lapses unless renewed again.
    #[schema(schema_with = narad_journal::openapi::timestamp)]
    pub lease_expires_at: String,
}

/// The calls a controls poll hands over.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecutorControls {
    /// A `client.tool.execute` for each call; empty when none arrived in
    /// time.
    #[schema(schema_with = tool_executes)]
    pub controls: Vec<Value>,
}

fn tool_executes() -> utoipa::openapi::Array {
    utoipa::openapi::schema::ArrayBuilder::new()
        .items(utoipa::openapi::Ref::from_schema_name(
            "control.client.tool.execute",
        ))
        .build()
}

/// Finishes a client tool call (`client.tool.finish`, §11.3): validated
/// against its token, then recorded as `tool.call.finished` with exactly
/// its outcome and response. The same finish again is an idempotent
/// success (`duplicate: true`). `leaseId` is the lease the token was
/// delivered under, even after a later attachment.
#[utoipa::path(post, path = "/v1/executors/{clientExecutorId}/finish", operation_id = "finishClientToolCall", tag = "executors",
    params(("clientExecutorId" = String, Path, description = "The endpoint: the `clientExecutorId` of the body, when it names one", example = "desktop-worker-123")),
    request_body(content = ref("#/components/schemas/HttpToolFinish"), description = "`client.tool.finish` {executionToken, outcome, response, code?, message?, leaseId, toolCallId?}; `leaseId` is required over HTTP"),
    responses(
        (status = 200, description = "Recorded as tool.call.finished (`duplicate: true` when the same finish was recorded before)", body = FinishAccepted),
        (status = 400, description = "NRD-0003: not a client.tool.finish, or no leaseId"),
        (status = 403, description = "NRD-0402: a token not issued to this executor"),
        (status = 409, description = "NRD-0401: not the token's lease; NRD-0404: finished before with other data, or closed otherwise"),
        (status = 410, description = "NRD-0403: the token expired"),
    ),
    security(("bearer" = [])))]
pub async fn finish(
    State(state): State<AppState>,
    principal: Principal,
    Path(executor_id): Path<String>,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<FinishAccepted>> {
    authorize(&principal, &executor_id)?;
    let ControlBody::ClientToolFinish(finish) = control_body(&body, "client.tool.finish")? else {
        unreachable!("control_body checks the type");
    };
    let Some(lease) = finish.lease_id.clone() else {
        return Err(ApiError::new(
            ErrorCode::InvalidObject,
            "a finish over HTTP names the lease its token was delivered under",
        )
        .with_field("/leaseId", "missing"));
    };
    same_endpoint(finish.client_executor_id.as_ref(), &executor_id)?;
    Ok(Json(
        state
            .journal
            .finish_client_call(&principal.tenant, &executor_id, lease.as_str(), &finish)
            .await?,
    ))
}

/// Long-polls for controls: the `client.tool.execute` of every call
/// waiting for the executor, handed to the lease named (each call once,
/// ever). Waits up to `waitMs` (default 0, at most 30,000) for one to
/// arrive. A client's own timeout must exceed `waitMs`: calls answered to
/// a client that gave up are lost to it until their tokens expire.
#[utoipa::path(get, path = "/v1/executors/{clientExecutorId}/controls", operation_id = "pollExecutorControls", tag = "executors",
    params(
        ("clientExecutorId" = String, Path, description = "The endpoint: the `clientExecutorId` of the body, when it names one", example = "desktop-worker-123"),
        ("leaseId" = String, Query, description = "The live lease the calls are handed to"),
        ("waitMs" = Option<u64>, Query, minimum = 0, maximum = 30000, description = "How long to wait for a call, in milliseconds (default 0)"),
    ),
    responses(
        (status = 200, description = "`{controls: [client.tool.execute…]}`, empty when none arrived in time", body = ExecutorControls),
        (status = 400, description = "NRD-0008: leaseId missing, or waitMs above 30,000"),
        (status = 403, description = "NRD-0102: no `executor` role, or the `executors` claim does not name this id"),
        (status = 409, description = "NRD-0401: the lease was superseded or lapsed"),
    ),
    security(("bearer" = [])))]
pub async fn controls(
    State(state): State<AppState>,
    principal: Principal,
    Path(executor_id): Path<String>,
    mut query: Query,
) -> ApiResult<Json<ExecutorControls>> {
    authorize(&principal, &executor_id)?;
    let lease_id = query.text("leaseId").ok_or_else(|| {
        ApiError::new(ErrorCode::InvalidParameter, "leaseId: missing")
            .with_field("leaseId", "the lease of client.attached")
    })?;
    let wait = query.number("waitMs")?.unwrap_or(0);
    query.finish()?;
    if wait > MAX_POLL_WAIT_MS {
        return Err(ApiError::new(
            ErrorCode::InvalidParameter,
            format!("waitMs: at most {MAX_POLL_WAIT_MS}"),
        )
        .with_field("waitMs", format!("at most {MAX_POLL_WAIT_MS}")));
    }
    let tenant = &principal.tenant;
    let mut calls = state.hub.client_calls(tenant);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait);
    loop {
        let delivered = state
            .journal
            .deliver_client_calls(
                tenant,
                &executor_id,
                &lease_id,
                state.executors.token_ttl,
                64,
            )
            .await?;
        if !delivered.is_empty() {
            let controls: Vec<Value> = delivered
                .iter()
                .map(|d| control("client.tool.execute", &d.execute))
                .collect();
            return Ok(Json(ExecutorControls { controls }));
        }
        if !state
            .journal
            .lease_is_live(tenant, &executor_id, &lease_id)
            .await?
        {
            return Err(ApiError::new(
                ErrorCode::LeaseNotCurrent,
                format!("lease {lease_id} was superseded or lapsed; attach again"),
            ));
        }
        // The lease is looked at again at least every heartbeat interval:
        // it may lapse, or be superseded on another replica, whose attach
        // wakes only its own polls.
        let recheck = tokio::time::Instant::now() + state.executors.heartbeat_interval;
        let woken = tokio::select! {
            _ = tokio::time::sleep_until(deadline.min(recheck)) => recheck < deadline,
            _ = state.hub.closed() => false,
            changed = calls.changed() => changed.is_ok(),
        };
        if !woken {
            return Ok(Json(ExecutorControls {
                controls: Vec::new(),
            }));
        }
    }
}
