//! Agent runtimes: claim queued runs, renew and release runtime leases,
//! and long-poll for a stop (role `backend`).
//!
//! A run started by `start-run` with `runtime` waits in the work queue
//! until a runtime claims it. The claim's lease must accompany every
//! append to the run's journal (header `Narad-Runtime-Lease`); a lease
//! that lapsed is refused (`NRD-0501`), and the run is repaired by the
//! server (retried or closed, per its policy).

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use narad_journal::{Claim, LeaseStanding, Released};
use narad_protocol::ErrorCode;
use narad_protocol::primitives::{QueueName, RuntimeName, UInt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::AppState;
use crate::auth::{Permission, Principal};
use crate::body::{OptionalJsonBody, Query};
use crate::error::{ApiError, ApiResult};

/// The longest a claim or control poll waits, in milliseconds.
pub const MAX_POLL_WAIT_MS: u64 = 30_000;

/// The header that carries a runtime lease on appends.
pub const LEASE_HEADER: &str = "narad-runtime-lease";

/// How often a waiting claim looks again without a wake-up (a run queued
/// again by another replica's sweeper appends nothing that wakes it).
const RECHECK: Duration = Duration::from_secs(1);

/// A claim request.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ClaimRequest {
    /// Only runs of this queue.
    #[schema(schema_with = narad_journal::openapi::id)]
    queue: Option<QueueName>,
    /// A name for the claiming runtime (for operators; default: the
    /// token's subject).
    #[schema(schema_with = narad_journal::openapi::id)]
    runtime_id: Option<RuntimeName>,
    /// How long to wait for a run, in milliseconds (default 0).
    #[schema(value_type = u64, minimum = 0, maximum = 30000, required = false)]
    wait_ms: Option<u64>,
}

/// A release request.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ReleaseRequest {
    /// The last sessionSequence the runtime read or wrote (at most
    /// 2^53 − 1, like every sequence).
    #[schema(schema_with = narad_journal::openapi::uint)]
    handled_through: Option<UInt>,
}

/// Reads an optional JSON object body (empty means `{}`); the body was
/// read as JSON by [`OptionalJsonBody`], so only its structure is left to
/// refuse here.
fn optional_body<T: Default + serde::de::DeserializeOwned>(body: Option<Value>) -> ApiResult<T> {
    let Some(body) = body else {
        return Ok(T::default());
    };
    crate::body::typed(body)
}

/// A runtime serves runs of any session of its tenant: a token limited to
/// sessions may not claim or hold them.
fn require_runtime(principal: &Principal) -> ApiResult<()> {
    principal.require(Permission::Append)?;
    if principal.sessions.is_some() {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "agent runtimes claim runs of every session of their tenant, and this token is \
             limited to sessions; use a token without a `sessions` claim",
        ));
    }
    Ok(())
}

/// Refuses a `waitMs` over [`MAX_POLL_WAIT_MS`], as a member of the body
/// (NRD-0003) or as a query parameter (NRD-0008).
fn check_wait(wait: u64, in_body: bool) -> ApiResult<Duration> {
    if wait > MAX_POLL_WAIT_MS {
        let (code, field) = if in_body {
            (ErrorCode::InvalidObject, "/waitMs")
        } else {
            (ErrorCode::InvalidParameter, "waitMs")
        };
        return Err(
            ApiError::new(code, format!("waitMs: at most {MAX_POLL_WAIT_MS}"))
                .with_field(field, format!("at most {MAX_POLL_WAIT_MS}")),
        );
    }
    Ok(Duration::from_millis(wait))
}

/// Claims the oldest ready run (of `queue`, when given), waiting up to
/// `waitMs` (default 0, at most 30,000) for one. The answer holds the run,
/// its session, the cursor to read history after, and the lease to present
/// on every append to the run. A client's own timeout must exceed `waitMs`.
#[utoipa::path(post, path = "/v1/runtime/claims", operation_id = "claimRun", tag = "runtime",
    request_body(content = ClaimRequest, description = "`{queue?, runtimeId?, waitMs?}`; an empty body claims from any queue without waiting"),
    responses(
        (status = 200, description = "The run claimed, the cursor to read its history after, and the lease to present on every append", body = Claim),
        (status = 204, description = "No run was ready in time"),
        (status = 400, description = "NRD-0002: not JSON; NRD-0003: a bad body; NRD-0008: waitMs above 30,000"),
        (status = 403, description = "NRD-0102: not role backend, or a token limited to sessions"),
    ),
    security(("bearer" = [])))]
pub async fn claim(
    State(state): State<AppState>,
    principal: Principal,
    OptionalJsonBody(body): OptionalJsonBody,
) -> ApiResult<Response> {
    require_runtime(&principal)?;
    let request: ClaimRequest = optional_body(body)?;
    let wait = check_wait(request.wait_ms.unwrap_or(0), true)?;
    let runtime_id = request
        .runtime_id
        .map_or_else(|| principal.subject.clone(), |r| r.as_str().to_owned());
    let queue = request.queue.as_ref().map(QueueName::as_str);
    let tenant = &principal.tenant;
    let mut wakes = state.hub.runtime_work(tenant);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some((claim, waited)) = state
            .journal
            .claim_run(tenant, queue, &runtime_id, state.runtime.lease_ttl)
            .await?
        {
            metrics::histogram!("narad_runtime_claim_wait_seconds").record(waited);
            metrics::counter!("narad_runtime_claims_total").increment(1);
            return Ok(Json(claim).into_response());
        }
        if !next_look(&state, &mut wakes, deadline).await {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
    }
}

/// Renews a runtime lease for another lease lifetime; says whether the run
/// was asked to stop.
#[utoipa::path(post, path = "/v1/runtime/leases/{leaseId}/heartbeat", operation_id = "renewRuntimeLease", tag = "runtime",
    params(("leaseId" = String, Path, description = "The lease of the claim")),
    responses(
        (status = 200, description = "The lease's standing; `ended` once the run has ended under this lease", body = LeaseStanding),
        (status = 403, description = "NRD-0102: not role backend, or a token limited to sessions"),
        (status = 409, description = "NRD-0501: the lease lapsed or was released; stop working on the run"),
    ),
    security(("bearer" = [])))]
pub async fn heartbeat(
    State(state): State<AppState>,
    principal: Principal,
    Path(lease_id): Path<String>,
) -> ApiResult<Json<Value>> {
    require_runtime(&principal)?;
    let standing = state
        .journal
        .renew_runtime_lease(&principal.tenant, &lease_id, state.runtime.lease_ttl)
        .await?;
    Ok(Json(json!(standing)))
}

/// Gives a run back while it waits (an interrupt, a client tool), or after
/// it ended. `handledThrough` (required while the run goes on) is the last
/// sessionSequence through which the runtime read or wrote every event of
/// the run's journal: a later event queues it again at once; otherwise the
/// next one does.
#[utoipa::path(post, path = "/v1/runtime/leases/{leaseId}/release", operation_id = "releaseRun", tag = "runtime",
    params(("leaseId" = String, Path, description = "The lease of the claim")),
    request_body(content = ReleaseRequest, description = "`{handledThrough?}`; an empty body is `{}`"),
    responses(
        (status = 200, description = "`{released: idle | ready | ended}`", body = ReleaseAnswer),
        (status = 400, description = "NRD-0003: a bad body; NRD-0008: handledThrough missing while the run goes on"),
        (status = 403, description = "NRD-0102: not role backend, or a token limited to sessions"),
        (status = 409, description = "NRD-0501: the lease lapsed or was released before"),
    ),
    security(("bearer" = [])))]
pub async fn release(
    State(state): State<AppState>,
    principal: Principal,
    Path(lease_id): Path<String>,
    OptionalJsonBody(body): OptionalJsonBody,
) -> ApiResult<Json<Value>> {
    require_runtime(&principal)?;
    let request: ReleaseRequest = optional_body(body)?;
    let released = state
        .journal
        .release_run(
            &principal.tenant,
            &lease_id,
            request.handled_through.map(UInt::get),
        )
        .await?;
    Ok(Json(json!(ReleaseAnswer { released })))
}

/// What a release did.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReleaseAnswer {
    /// `idle`: the run waits, and the next event of its journal queues it
    /// again; `ready`: queued again now; `ended`: the run has ended.
    pub released: Released,
}

/// Long-polls for a stop of the lease's run: answers at once when the run
/// was asked to stop, otherwise when it is, or after `waitMs` (default 0,
/// at most 30,000) with `stopRequested: false`.
#[utoipa::path(get, path = "/v1/runtime/leases/{leaseId}/controls", operation_id = "pollRuntimeControls", tag = "runtime",
    params(
        ("leaseId" = String, Path, description = "The lease of the claim"),
        ("waitMs" = Option<u64>, Query, minimum = 0, maximum = 30000, description = "How long to wait for a stop, in milliseconds (default 0)"),
    ),
    responses(
        (status = 200, description = "The lease's standing", body = LeaseStanding),
        (status = 400, description = "NRD-0008: waitMs above 30,000"),
        (status = 403, description = "NRD-0102: not role backend, or a token limited to sessions"),
        (status = 409, description = "NRD-0501: the lease lapsed or was released"),
    ),
    security(("bearer" = [])))]
pub async fn controls(
    State(state): State<AppState>,
    principal: Principal,
    Path(lease_id): Path<String>,
    mut query: Query,
) -> ApiResult<Json<Value>> {
    require_runtime(&principal)?;
    let wait = check_wait(query.number("waitMs")?.unwrap_or(0), false)?;
    query.finish()?;
    let tenant = &principal.tenant;
    let mut wakes = state.hub.runtime_work(tenant);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let standing = state.journal.runtime_lease(tenant, &lease_id).await?;
        if standing.stop_requested
            || standing.ended
            || !next_look(&state, &mut wakes, deadline).await
        {
            return Ok(Json(json!(standing)));
        }
    }
}

/// Waits until a poll should look again: a wake-up of the tenant's
/// runtimes, or the recheck interval. `false` once `deadline` has passed
/// or the server is stopping: the poll answers with what it has.
async fn next_look(
    state: &AppState,
    wakes: &mut tokio::sync::watch::Receiver<u64>,
    deadline: tokio::time::Instant,
) -> bool {
    let now = tokio::time::Instant::now();
    if now >= deadline {
        return false;
    }
    tokio::select! {
        _ = tokio::time::sleep_until(deadline.min(now + RECHECK)) => true,
        _ = state.hub.closed() => false,
        _ = wakes.changed() => true,
    }
}
