//! Who calls a chat front-end route (`POST /v1/ag-ui`, `POST /v1/chat`,
//! `GET /v1/chat/{sessionId}/stream`): a bearer token, or a stream ticket
//! (`?ticket=`) when the request has no `Authorization`. A browser's
//! streaming client cannot always set a header, so the ticket stands in;
//! it is verified against the session once the route knows which one the
//! request is about (the body's, for a POST).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::AppState;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};

/// Who calls: a verified bearer token, or a stream ticket still to verify
/// against the stream it must have been issued for.
pub enum Caller {
    /// A verified token.
    Token(Principal),
    /// A ticket, to verify against the session.
    Ticket(String),
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, ApiError> {
        if !parts
            .headers
            .contains_key(axum::http::header::AUTHORIZATION)
            && let Some(ticket) = super::tickets::ticket_of(parts)
        {
            return Ok(Caller::Ticket(ticket));
        }
        Principal::from_request_parts(parts, state)
            .await
            .map(Caller::Token)
    }
}

impl Caller {
    /// The principal: the token's, or the ticket's when it was issued for
    /// `stream` (`ag-ui:<sessionId>`, `session:<sessionId>`); 401
    /// `NRD-0101` otherwise.
    pub async fn principal(self, state: &AppState, stream: &str) -> ApiResult<Principal> {
        match self {
            Caller::Token(p) => Ok(p),
            Caller::Ticket(t) => super::tickets::verify_for(state, &t, stream).await,
        }
    }
}
