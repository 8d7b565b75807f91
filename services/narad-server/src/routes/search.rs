//! Search: the tenant's sessions found by what people said and answered in
//! them, their titles, and filters (state, open interrupts, actor, time).

use axum::Json;
use axum::extract::State;
use narad_journal::{SearchCursor, SearchQuery, SearchResult, SessionState};
use serde::Serialize;
use utoipa::ToSchema;

use super::{page_limit, query_time};
use crate::AppState;
use crate::auth::{Permission, Principal};
use crate::body::{Query, invalid};
use crate::error::ApiResult;

/// The default and largest page of `GET /v1/search`.
pub const SEARCH_PAGE: (u32, u32) = (20, 100);

/// The longest `q` (characters).
pub const LONGEST_WORDS: usize = 1_000;

/// A page of search results.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchPage {
    /// The sessions found, newest match first (with neither `q` nor
    /// `actor`: newest session first).
    pub results: Vec<SearchResult>,
    /// The `after` of the next page, when more remain.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub next_after: Option<String>,
    /// Why nothing was looked for, when nothing was: `q` held no
    /// searchable word (only common words such as "the", or punctuation),
    /// which as a query would match everything.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub notice: Option<String>,
}

/// Searches the tenant's sessions by what people said in them (their
/// messages), what interrupts asked and how they were answered, and their
/// titles; narrowed by state, open interrupts, actor and time. Each result
/// is a session with its newest matching passages, matched words marked.
/// Words use web-search syntax (`"a phrase"`, `or`, `-word`) with English
/// stemming ("refunds" finds "refund"). Streamed assistant text is not
/// searched. A redacted message is not found by the words it no longer
/// shows.
#[utoipa::path(get, path = "/v1/search", operation_id = "searchSessions", tag = "sessions",
    params(
        ("q" = Option<String>, Query, max_length = 1000, description = "Words to find (web-search syntax); absent: the filters alone, newest session first"),
        ("state" = inline(Option<SessionState>), Query, description = "Only sessions `open` (not archived), `archived`, `running` (an active top-level execution) or `idle` (open, none active)"),
        ("pendingApprovals" = Option<bool>, Query, description = "Only sessions with (`true`) or without (`false`) interrupts waiting for an answer"),
        ("actor" = Option<String>, Query, min_length = 1, description = "Only messages and answers of this subject (the actor's `sub`)"),
        ("since" = Option<String>, Query, format = DateTime, description = "Only matches recorded at or after this time (with neither q nor actor: sessions created at or after it)"),
        ("until" = Option<String>, Query, format = DateTime, description = "Only matches recorded before this time (with neither q nor actor: sessions created before it); not after since: nothing"),
        ("after" = Option<String>, Query, pattern = r"^-?[0-9]{1,18}\..+$", description = "The `nextAfter` of the previous page"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 100, description = "The page size (default 20)"),
    ),
    responses(
        (status = 200, description = "A page of sessions found", body = SearchPage),
        (status = 400, description = "NRD-0008: a parameter is malformed"),
        (status = 403, description = "NRD-0102: no `read` role"),
    ),
    security(("bearer" = [])))]
pub async fn search(
    State(state): State<AppState>,
    principal: Principal,
    mut query: Query,
) -> ApiResult<Json<SearchPage>> {
    principal.require(Permission::Read)?;
    let words = query.text("q");
    if words
        .as_ref()
        .is_some_and(|w| w.chars().count() > LONGEST_WORDS)
    {
        return Err(invalid(
            "q",
            &format!("is longer than {LONGEST_WORDS} characters"),
        ));
    }
    let session_state = match query.text("state") {
        None => None,
        Some(name) => Some(SessionState::parse(&name).ok_or_else(|| {
            invalid(
                "state",
                &format!("must be open, archived, running or idle, got {name:?}"),
            )
        })?),
    };
    let pending_approvals = query.boolean("pendingApprovals")?;
    let actor = query.text("actor");
    if actor.as_deref() == Some("") {
        return Err(invalid("actor", "is empty"));
    }
    let since = query_time(&mut query, "since")?;
    let until = query_time(&mut query, "until")?;
    let after = match query.text("after") {
        None => None,
        Some(text) => Some(SearchCursor::decode(&text).ok_or_else(|| {
            invalid(
                "after",
                &format!("is not a nextAfter of GET /v1/search: {text:?}"),
            )
        })?),
    };
    let limit = page_limit(query.number("limit")?, SEARCH_PAGE)?;
    query.finish()?;
    let search = SearchQuery {
        words,
        state: session_state,
        pending_approvals,
        actor,
        since,
        until,
        after,
    };
    let found = state
        .journal
        .search(&principal.tenant, &search, limit + 1)
        .await?;
    let notice = found.unsearchable_words.then(|| {
        "q holds no searchable word (only common words such as \"the\", or punctuation), \
         so nothing was looked for: name what to find, or leave q out to filter alone"
            .to_owned()
    });
    let mut results = found.results;
    let next_after = if results.len() > limit as usize {
        results.truncate(limit as usize);
        results.last().map(|r| r.cursor().encode())
    } else {
        None
    };
    // A token limited to sessions finds only those.
    results.retain(|r| principal.may_see(&r.session.session_id));
    Ok(Json(SearchPage {
        results,
        next_after,
        notice,
    }))
}
