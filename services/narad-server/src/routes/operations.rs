//! What runs on the tenant's behalf: client executors, runtime queues,
//! held runs (role `admin`).

use axum::Json;
use axum::extract::State;
use narad_journal::Operations;

use crate::AppState;
use crate::auth::{Permission, Principal};
use crate::error::ApiResult;

/// The tenant's client executors with their leases and calls, its runtime
/// work queues, and the runs runtimes hold now: what an operator watches.
#[utoipa::path(get, path = "/v1/operations", operation_id = "getOperations", tag = "operations",
    responses(
        (status = 200, description = "Executors, queues and held runs", body = Operations),
    ),
    security(("bearer" = [])))]
pub async fn read(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<Operations>> {
    principal.require(Permission::Admin)?;
    Ok(Json(state.journal.operations(&principal.tenant).await?))
}
