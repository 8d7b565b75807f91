//! A tenant's limits (`/v1/admin/tenants/{org}/limits`): the configured
//! defaults, the tenant's own overrides and what holds for it. Admins of
//! the operator organisation (`NARAD_OPERATOR_ORG`) read and set any
//! organisation's; an organisation's own admins read theirs.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use narad_journal::TenantId;
use narad_protocol::ErrorCode;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::AppState;
use crate::audit::RequestId;
use crate::auth::{Permission, Principal};
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};

/// The body of `PUT /v1/admin/tenants/{org}/limits`: overrides by name
/// (`crate::quotas::Limit` lists them); a name left out takes the
/// configured default, `null` lifts the limit for the organisation.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimitOverrides {
    /// Appended events per second, over every replica.
    #[schema(minimum = 1, maximum = 1_000_000_000)]
    pub events_per_second: Option<u64>,
    /// Events appended at once above the rate (unset: twice the rate).
    #[schema(minimum = 1, maximum = 1_000_000_000)]
    pub events_burst: Option<u64>,
    /// Commands per second, over every replica.
    #[schema(minimum = 1, maximum = 1_000_000_000)]
    pub commands_per_second: Option<u64>,
    /// Commands sent at once above the rate (unset: twice the rate).
    #[schema(minimum = 1, maximum = 1_000_000_000)]
    pub commands_burst: Option<u64>,
    /// Session and tenant streams open at once.
    #[schema(minimum = 1, maximum = 1_000_000_000)]
    pub open_streams: Option<u64>,
    /// Client executors holding live leases at once.
    #[schema(minimum = 1, maximum = 1_000_000_000)]
    pub attached_executors: Option<u64>,
    /// Sessions held (archived ones count until erased).
    #[schema(minimum = 1, maximum = 1_000_000_000)]
    pub sessions: Option<u64>,
    /// How long an interrupt that names no `expiresAt` may wait for a
    /// decision, in seconds.
    #[schema(minimum = 1, maximum = 315_360_000)]
    pub interrupt_default_expiry_seconds: Option<u64>,
    /// Days after which sessions archived, or idle, for that long are
    /// erased by the retention sweeper.
    #[schema(minimum = 1, maximum = 36_500)]
    pub retention_days: Option<u64>,
    /// The largest blob one upload may hold, in bytes.
    #[schema(minimum = 1, maximum = 1_125_899_906_842_624u64)]
    pub blob_max_bytes: Option<u64>,
    /// The bytes an organisation's blobs may hold together.
    #[schema(minimum = 1, maximum = 1_125_899_906_842_624u64)]
    pub stored_bytes: Option<u64>,
}

/// An organisation's limits.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantLimits {
    /// The organisation.
    pub org: String,
    /// The configured defaults, by name.
    #[schema(value_type = Object)]
    pub defaults: Map<String, Value>,
    /// The organisation's own overrides, by name (`null`: lifted).
    #[schema(value_type = Object)]
    pub overrides: Map<String, Value>,
    /// What holds for the organisation: the defaults with its overrides.
    #[schema(value_type = Object)]
    pub effective: Map<String, Value>,
    /// When the overrides were last set.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub updated_at: Option<String>,
    /// Who set them last.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub updated_by: Option<String>,
}

fn tenant(org: &str) -> ApiResult<TenantId> {
    TenantId::new(org).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidParameter,
            format!("path parameter org: {e}"),
        )
        .with_field("org", "1 to 256 characters")
    })
}

async fn read(state: &AppState, org: &TenantId) -> ApiResult<TenantLimits> {
    let stored = state.journal.tenant_limits(org).await?;
    let defaults = state.quotas.defaults();
    let effective = defaults.overridden(&stored.overrides).to_map();
    Ok(TenantLimits {
        org: org.to_string(),
        defaults: defaults.to_map(),
        overrides: stored.overrides,
        effective,
        updated_at: stored.updated_at,
        updated_by: stored.updated_by,
    })
}

/// An organisation's limits: the defaults, its overrides and what holds.
#[utoipa::path(get, path = "/v1/admin/tenants/{org}/limits", operation_id = "getTenantLimits", tag = "operations",
    params(("org" = String, Path, min_length = 1, max_length = 256, description = "The organisation (a token's `org`)")),
    responses(
        (status = 200, description = "The organisation's limits", body = TenantLimits),
        (status = 403, description = "NRD-0102: not an admin of the operator organisation or of this one"),
    ),
    security(("bearer" = [])))]
pub async fn get(
    State(state): State<AppState>,
    principal: Principal,
    Path(org): Path<String>,
) -> ApiResult<Json<TenantLimits>> {
    principal.require(Permission::Admin)?;
    let org = tenant(&org)?;
    if org != principal.tenant && !state.verifier.is_operator(&principal.tenant) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "only admins of the operator organisation (NARAD_OPERATOR_ORG) read another organisation's limits",
        ));
    }
    Ok(Json(read(&state, &org).await?))
}

/// Sets an organisation's overrides (the whole set: a name left out takes
/// the default again). Admins of the operator organisation only.
#[utoipa::path(put, path = "/v1/admin/tenants/{org}/limits", operation_id = "setTenantLimits", tag = "operations",
    params(("org" = String, Path, min_length = 1, max_length = 256, description = "The organisation (a token's `org`)")),
    request_body(content = LimitOverrides, description = "Overrides by name, e.g. `{\"eventsPerSecond\": 100, \"sessions\": null}` (null: no limit for this organisation)"),
    responses(
        (status = 200, description = "The organisation's limits", body = TenantLimits),
        (status = 400, description = "NRD-0003: an unknown limit, or a value it cannot take"),
        (status = 403, description = "NRD-0102: not an admin of the operator organisation"),
    ),
    security(("bearer" = [])))]
pub async fn set(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    Path(org): Path<String>,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<TenantLimits>> {
    let outcome = async {
        principal.require(Permission::Admin)?;
        if !state.verifier.is_operator(&principal.tenant) {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "only admins of the operator organisation (NARAD_OPERATOR_ORG) set limits",
            ));
        }
        let org = tenant(&org)?;
        let overrides = crate::quotas::check_overrides(&body)?;
        state
            .journal
            .set_tenant_limits(&org, &overrides, &principal.subject)
            .await?;
        state.quotas.overrides_changed(&org);
        Ok((StatusCode::OK, Json(read(&state, &org).await?)))
    }
    .await;
    crate::audit::record(
        &state,
        &principal,
        &request,
        "set-tenant-limits",
        None,
        &outcome,
        None,
    )
    .await;
    outcome.map(|(_, limits)| limits)
}
