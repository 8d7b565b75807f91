//! Reading request bodies and query strings, with the API's errors: a body
//! over the limit is 413 (`NRD-0006`), a body that is not JSON is 400
//! (`NRD-0002`) naming where it broke, a query parameter that is unknown
//! or malformed is 400 (`NRD-0008`) naming it.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use narad_protocol::ErrorCode;
use serde_json::Value;

use crate::error::ApiError;

/// A JSON request body (any content type: `curl -d` sends a form type).
#[derive(Debug)]
pub struct JsonBody(pub Value);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<JsonBody, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    ErrorCode::PayloadTooLarge,
                    "the request body exceeds this server's limit (NARAD_MAX_BODY_BYTES); \
                     send smaller batches",
                )
            } else {
                ApiError::new(
                    ErrorCode::MalformedJson,
                    format!("the request body could not be read: {e}"),
                )
            }
        })?;
        if bytes.is_empty() {
            return Err(ApiError::new(
                ErrorCode::MalformedJson,
                "the request body is empty; send a JSON object",
            )
            .with_field("", "empty body"));
        }
        serde_json::from_slice(&bytes).map(JsonBody).map_err(|e| {
            ApiError::new(
                ErrorCode::MalformedJson,
                format!(
                    "the request body is not JSON: {e} (line {}, column {})",
                    e.line(),
                    e.column()
                ),
            )
            .with_field("", format!("line {}, column {}", e.line(), e.column()))
        })
    }
}

/// A query string as name → value, read strictly by [`Query::text`], [`Query::number`] and
/// [`Query::finish`].
#[derive(Debug, Default)]
pub struct Query(BTreeMap<String, String>);

impl<S: Send + Sync> FromRequestParts<S> for Query {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Query, ApiError> {
        let axum::extract::Query(pairs) =
            axum::extract::Query::<Vec<(String, String)>>::from_request_parts(parts, state)
                .await
                .map_err(|e| {
                    ApiError::new(
                        ErrorCode::InvalidParameter,
                        format!("the query string cannot be read: {e}"),
                    )
                })?;
        let mut map = BTreeMap::new();
        for (name, value) in pairs {
            if map.insert(name.clone(), value).is_some() {
                return Err(invalid(&name, "is given twice"));
            }
        }
        Ok(Query(map))
    }
}

impl Query {
    /// The text of parameter `name`, if given.
    pub fn text(&mut self, name: &str) -> Option<String> {
        self.0.remove(name)
    }

    /// Parameter `name` as a non-negative integer, if given.
    pub fn number(&mut self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.0.remove(name) {
            None => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .map(Some)
                .map_err(|_| invalid(name, &format!("must be a non-negative integer, got {v:?}"))),
        }
    }

    /// Fails on any parameter not taken: a misspelt cursor must not be
    /// silently ignored.
    pub fn finish(self) -> Result<(), ApiError> {
        match self.0.keys().next() {
            Some(name) => Err(invalid(name, "is not a parameter of this route")),
            None => Ok(()),
        }
    }
}

fn invalid(name: &str, problem: &str) -> ApiError {
    ApiError::new(
        ErrorCode::InvalidParameter,
        format!("query parameter {name} {problem}"),
    )
    .with_field(name, problem)
}
