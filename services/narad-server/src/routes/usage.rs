//! Token usage over time: what run terminals carried, summed per day or per
//! session and split by model (role `reader`).

use axum::Json;
use axum::extract::State;
use narad_journal::usage::MAX_SESSIONS;
use narad_journal::{UsageBucket, UsageGrouping, UsageQuery};
use serde::Serialize;
use utoipa::ToSchema;

use super::query_time;
use crate::AppState;
use crate::auth::{Permission, Principal};
use crate::body::{Query, invalid};
use crate::error::ApiResult;

/// The window read when `since` is not given: this many days before `until`.
pub const DEFAULT_DAYS: i64 = 30;

/// The longest window one read sums (days).
pub const LONGEST_DAYS: i64 = 400;

const DAY_MICROS: i64 = 86_400_000_000;

/// 0000-01-01T00:00:00Z and 9999-12-31T23:59:59.999999Z, the first and
/// last times RFC 3339 writes, in microseconds since the epoch.
const FIRST_MICROS: i64 = -62_167_219_200_000_000;
const LAST_MICROS: i64 = 253_402_300_799_999_999;

/// Usage summed over a window.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsagePage {
    /// The window's start (RFC 3339).
    #[schema(value_type = String, format = DateTime)]
    pub since: String,
    /// The window's end, not included (RFC 3339).
    #[schema(value_type = String, format = DateTime)]
    pub until: String,
    /// The time zone days are counted in.
    pub zone: String,
    /// One entry per day (or session) and model with usage, ordered by day
    /// (or session id), then model (runs that named none last). Days
    /// without runs are left out.
    pub buckets: Vec<UsageBucket>,
}

/// The token usage of the tenant's runs, from the `usage` of their
/// terminals (`run.finished`, `run.error`, `run.cancelled`; nested runs
/// count too), summed per day in a time zone or per session, and split by
/// the model each run named (`input.model` of its `run.started`). The
/// console prices it with the operator's price table. A token limited to
/// sessions sums those alone.
#[utoipa::path(get, path = "/v1/usage", operation_id = "getUsage", tag = "sessions",
    params(
        ("by" = inline(Option<UsageGrouping>), Query, description = "Sum per `day` (the default) or per `session`"),
        ("since" = Option<String>, Query, format = DateTime, description = "Runs ended at or after this time (default: 30 days before until)"),
        ("until" = Option<String>, Query, format = DateTime, description = "Runs ended before this time (default: now); at most 400 days after since"),
        ("zone" = Option<String>, Query, min_length = 1, max_length = 64, pattern = r"^[A-Za-z][A-Za-z0-9_+/-]*$", description = "The time zone days are counted in: an IANA name such as `Europe/Paris` (default `UTC`)"),
        ("sessions" = Option<String>, Query, min_length = 1, description = "Only these sessions, comma-separated (at most 100)"),
    ),
    responses(
        (status = 200, description = "Usage per day or session and model", body = UsagePage),
        (status = 400, description = "NRD-0008: a parameter is malformed (an unknown zone, a window longer than 400 days)"),
        (status = 403, description = "NRD-0102: no `read` role"),
    ),
    security(("bearer" = [])))]
pub async fn read(
    State(state): State<AppState>,
    principal: Principal,
    mut query: Query,
) -> ApiResult<Json<UsagePage>> {
    principal.require(Permission::Read)?;
    let by = match query.text("by") {
        None => UsageGrouping::Day,
        Some(name) => UsageGrouping::parse(&name)
            .ok_or_else(|| invalid("by", &format!("must be day or session, got {name:?}")))?,
    };
    // Within the years RFC 3339 writes (an offset may carry a time past
    // them): no run ended outside them, and the answer names its window.
    let within = |micros: i64| micros.clamp(FIRST_MICROS, LAST_MICROS);
    let since = query_time(&mut query, "since")?;
    let until = within(
        query_time(&mut query, "until")?.unwrap_or_else(|| chrono::Utc::now().timestamp_micros()),
    );
    let since = within(since.unwrap_or(until.saturating_sub(DEFAULT_DAYS * DAY_MICROS)));
    if until.saturating_sub(since) > LONGEST_DAYS * DAY_MICROS {
        return Err(invalid(
            "until",
            &format!("is more than {LONGEST_DAYS} days after since: read a longer time in parts"),
        ));
    }
    let zone = query.text("zone").unwrap_or_else(|| "UTC".to_owned());
    if !is_zone_name(&zone) {
        return Err(invalid(
            "zone",
            &format!("{zone:?} is not a time zone name: an IANA name such as Europe/Paris, or UTC"),
        ));
    }
    let named = match query.text("sessions") {
        None => None,
        Some(list) => {
            let ids: Vec<String> = list.split(',').map(str::to_owned).collect();
            if ids.len() > MAX_SESSIONS || ids.iter().any(String::is_empty) {
                return Err(invalid(
                    "sessions",
                    &format!("must be 1 to {MAX_SESSIONS} session ids, comma-separated"),
                ));
            }
            Some(ids)
        }
    };
    query.finish()?;
    // A token limited to sessions sums those alone.
    let sessions = match (named, &principal.sessions) {
        (named, None) => named,
        (None, Some(allowed)) => Some(allowed.clone()),
        (Some(named), Some(_)) => {
            Some(named.into_iter().filter(|s| principal.may_see(s)).collect())
        }
    };
    let buckets = state
        .journal
        .usage(
            &principal.tenant,
            &UsageQuery {
                by,
                since,
                until,
                zone: zone.clone(),
                sessions,
            },
        )
        .await?;
    Ok(Json(UsagePage {
        since: rfc3339(since),
        until: rfc3339(until),
        zone,
        buckets,
    }))
}

/// Whether `zone` is written as a time zone name (what the document's
/// pattern says): a letter, then letters, digits, `_`, `+`, `-` or `/`, at
/// most 64 in all. Whether it names a zone is the database's to say.
/// Numeric offsets (`3`, `-0.5`), which Postgres reads with POSIX's
/// inverted sign, are not names.
fn is_zone_name(zone: &str) -> bool {
    zone.len() <= 64
        && zone.starts_with(|c: char| c.is_ascii_alphabetic())
        && zone
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_+/-".contains(c))
}

/// A time in microseconds since the epoch as RFC 3339 (UTC, microseconds).
fn rfc3339(micros: i64) -> String {
    chrono::DateTime::from_timestamp_micros(micros)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}
