//! Registering extensions (role `admin`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use narad_journal::ExtensionRecord;
use narad_protocol::ErrorCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::AppState;
use crate::audit::RequestId;
use crate::auth::{Permission, Principal};
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};

/// Registers an extension and mints its signing secret, shown this once.
#[utoipa::path(post, path = "/v1/extensions", operation_id = "registerExtension", tag = "extensions",
    request_body(content = ExtensionName, description = "`{publisher, name}`: each 1 to 64 of A-Z a-z 0-9 . _ -"),
    responses(
        (status = 201, description = "The registration and its `secret` (hex), shown only now", body = ExtensionRegistration),
        (status = 403, description = "NRD-0102: no `admin` role"),
        (status = 409, description = "NRD-0207: this organisation registered the name before"),
    ),
    security(("bearer" = [])))]
pub async fn register(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<ExtensionRegistration>)> {
    let outcome = async {
        principal.require(Permission::Admin)?;
        let publisher = segment(&body, "publisher")?;
        let name = segment(&body, "name")?;
        if let Some(field) = body
            .as_object()
            .and_then(|o| o.keys().find(|k| *k != "publisher" && *k != "name"))
        {
            return Err(ApiError::new(
                ErrorCode::InvalidObject,
                format!("unknown field {field}: the body is {{publisher, name}}"),
            )
            .with_field(format!("/{field}"), "unknown field"));
        }
        let (record, secret) = state
            .journal
            .register_extension(&principal.tenant, publisher, name, &principal.subject)
            .await?;
        Ok((
            StatusCode::CREATED,
            Json(ExtensionRegistration { record, secret }),
        ))
    }
    .await;
    crate::audit::record(
        &state,
        &principal,
        &request,
        "register-extension",
        None,
        &outcome,
        None,
    )
    .await;
    outcome
}

/// The body of a registration, as `register` reads it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtensionName {
    /// Who publishes it: 1 to 64 of `A-Z a-z 0-9 . _ -`.
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9._-]+$")]
    pub publisher: String,
    /// Its name: 1 to 64 of `A-Z a-z 0-9 . _ -`.
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9._-]+$")]
    pub name: String,
}

/// A new registration, with its signing secret (shown this once).
#[derive(Debug, Serialize, ToSchema)]
pub struct ExtensionRegistration {
    /// The registration.
    #[serde(flatten)]
    pub record: ExtensionRecord,
    /// The signing secret, hex: keep it, it is never shown again.
    pub secret: String,
}

/// The organisation's extensions.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExtensionList {
    /// Every registration, never with its secret.
    pub extensions: Vec<ExtensionRecord>,
}

/// The body of an update.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtensionUpdate {
    /// `false` refuses the extension's signed calls from now on; `true`
    /// accepts them again.
    pub enabled: bool,
}

/// Lists the organisation's extensions (never their secrets).
#[utoipa::path(get, path = "/v1/extensions", operation_id = "listExtensions", tag = "extensions",
    responses(
        (status = 200, description = "Every registration of the organisation", body = ExtensionList),
        (status = 403, description = "NRD-0102: no `admin` role"),
    ),
    security(("bearer" = [])))]
pub async fn list(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<ExtensionList>> {
    principal.require(Permission::Admin)?;
    let extensions = state.journal.extensions(&principal.tenant).await?;
    Ok(Json(ExtensionList { extensions }))
}

/// Enables or disables an extension: `{enabled: false}` refuses its signed
/// calls from now on (403), `{enabled: true}` accepts them again.
#[utoipa::path(patch, path = "/v1/extensions/{publisher}/{name}", operation_id = "updateExtension", tag = "extensions",
    params(
        ("publisher" = String, Path, description = "Its publisher"),
        ("name" = String, Path, description = "Its name"),
    ),
    request_body(content = ExtensionUpdate, description = "`{enabled: bool}`"),
    responses(
        (status = 200, description = "The registration", body = ExtensionRecord),
        (status = 403, description = "NRD-0102: no `admin` role"),
        (status = 404, description = "NRD-0007: no such extension in this organisation"),
    ),
    security(("bearer" = [])))]
pub async fn update(
    State(state): State<AppState>,
    principal: Principal,
    request: RequestId,
    Path((publisher, name)): Path<(String, String)>,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<ExtensionRecord>> {
    let outcome = async {
        principal.require(Permission::Admin)?;
        let enabled = match body.as_object() {
            Some(o) if o.len() == 1 && o.get("enabled").is_some_and(Value::is_boolean) => {
                o["enabled"] == Value::Bool(true)
            }
            _ => {
                return Err(ApiError::new(
                    ErrorCode::InvalidObject,
                    "the body is {\"enabled\": true} or {\"enabled\": false}",
                )
                .with_field("/enabled", "a boolean, and the only field"));
            }
        };
        Ok((
            StatusCode::OK,
            Json(
                state
                    .journal
                    .set_extension_enabled(&principal.tenant, &publisher, &name, enabled)
                    .await?,
            ),
        ))
    }
    .await;
    crate::audit::record(
        &state,
        &principal,
        &request,
        "update-extension",
        None,
        &outcome,
        None,
    )
    .await;
    outcome.map(|(_, record)| record)
}

/// A publisher or name: 1 to 64 of `A-Z a-z 0-9 . _ -`.
fn segment<'a>(body: &'a Value, field: &str) -> Result<&'a str, ApiError> {
    let value = body.get(field).and_then(Value::as_str).unwrap_or("");
    let ok = (1..=64).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(value)
    } else {
        Err(ApiError::new(
            ErrorCode::InvalidObject,
            format!("{field} must be 1 to 64 of A-Z a-z 0-9 . _ -"),
        )
        .with_field(format!("/{field}"), "1 to 64 of A-Z a-z 0-9 . _ -"))
    }
}
