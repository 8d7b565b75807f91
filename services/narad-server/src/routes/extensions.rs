//! Registering extensions (role `admin`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use narad_journal::ExtensionRecord;
use narad_protocol::ErrorCode;
use serde_json::{Value, json};

use crate::AppState;
use crate::auth::{Permission, Principal};
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};

/// Registers an extension and mints its signing secret, shown this once.
#[utoipa::path(post, path = "/v1/extensions", tag = "extensions",
    request_body(content = Object, description = "`{publisher, name}`: each 1 to 64 of A-Z a-z 0-9 . _ -"),
    responses(
        (status = 201, description = "The registration and its `secret` (hex), shown only now", body = Object),
        (status = 409, description = "NRD-0207: the name is taken"),
    ),
    security(("bearer" = [])))]
pub async fn register(
    State(state): State<AppState>,
    principal: Principal,
    JsonBody(body): JsonBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
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
    let mut answer = serde_json::to_value(record).expect("serialises");
    answer["secret"] = json!(secret);
    Ok((StatusCode::CREATED, Json(answer)))
}

/// Lists the organisation's extensions (never their secrets).
#[utoipa::path(get, path = "/v1/extensions", tag = "extensions",
    responses((status = 200, description = "`{extensions: [...]}`", body = Object)),
    security(("bearer" = [])))]
pub async fn list(State(state): State<AppState>, principal: Principal) -> ApiResult<Json<Value>> {
    principal.require(Permission::Admin)?;
    let extensions: Vec<ExtensionRecord> = state.journal.extensions(&principal.tenant).await?;
    Ok(Json(json!({ "extensions": extensions })))
}

/// Enables or disables an extension: `{enabled: false}` refuses its signed
/// calls from now on (403), `{enabled: true}` accepts them again.
#[utoipa::path(patch, path = "/v1/extensions/{publisher}/{name}", tag = "extensions",
    params(
        ("publisher" = String, Path, description = "Its publisher"),
        ("name" = String, Path, description = "Its name"),
    ),
    request_body(content = Object, description = "`{enabled: bool}`"),
    responses(
        (status = 200, description = "The registration", body = Object),
        (status = 404, description = "NRD-0007: no such extension in this organisation"),
    ),
    security(("bearer" = [])))]
pub async fn update(
    State(state): State<AppState>,
    principal: Principal,
    Path((publisher, name)): Path<(String, String)>,
    JsonBody(body): JsonBody,
) -> ApiResult<Json<ExtensionRecord>> {
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
    Ok(Json(
        state
            .journal
            .set_extension_enabled(&principal.tenant, &publisher, &name, enabled)
            .await?,
    ))
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
