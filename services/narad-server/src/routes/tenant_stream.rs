//! `GET /v1/events`: the tenant stream, every session of the caller's
//! tenant (or one, with `?sessionId=`) in relay order, over SSE.
//!
//! - First a `capabilities` frame (no id).
//! - Without `Last-Event-ID` the stream is live from now: it carries
//!   exactly the rows whose transactions had not committed when it
//!   attached (a snapshot taken after subscribing), however late the relay
//!   reaches the rows committed before. With one, it
//!   replays what the outbox holds after that event, then goes live; it
//!   subscribes before it replays, and skips live rows the replay sent.
//! - A replay that starts below what retention already forgot begins with
//!   one `replay-gap` frame without an id, naming `forgottenThrough` (the
//!   last forgotten eventId): the client re-reads history
//!   (`GET /v1/sessions/{id}/events`) from what it holds. Retention may run
//!   while a slow replay is under way: every page of the replay is read
//!   together with the tenant's horizon (one statement, one snapshot), and
//!   when retention forgot rows the replay had not sent yet, a `replay-gap`
//!   frame says so before the rows after them.
//! - Every frame with an id stands exactly where resuming from that id
//!   starts: authority rows in relay order, and a watch event right after
//!   the row it covers and only there (see [`Progress`]); a resumed stream
//!   gets exactly the frames after the id, none again, none missing.
//! - A long backlog is served in blocks of [`REPLAY_BLOCK`] frames, each
//!   ending the connection; the client resumes from the last id it got.
//! - A `Last-Event-ID` past anything the store holds is refused with 409
//!   (NRD-0302): a stream from there could never carry a frame. Another id
//!   the store never held is 409 too (NRD-0303).
//! - Within a session, relay order is sessionSequence order. This relies
//!   on an append transaction's first write being the lock of its
//!   sessions' rows (true of the journal's append path), so that a
//!   transaction that appends to a session after another got its
//!   transaction id after it too (groups lock with SKIP LOCKED and never
//!   wait; an append that waits for a lock does so alone, before any other
//!   write). A change that lets a transaction write before it waits for a
//!   session lock breaks this, and clients that skip sequences they
//!   already hold would then skip events.
//! - Every frame is authorised for the caller: only its tenant's rows
//!   reach the stream, only sessions its token may see, only profiles it
//!   negotiated. Signed extension calls may use this stream.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use narad_journal::{AttachSnapshot, RelayCursor, StreamPosition, TenantId};
use narad_protocol::ErrorCode;
use narad_protocol::watch::WatchId;
use serde_json::json;
use tokio::sync::broadcast;

use super::sse::{self, Connection, Progress, Take};
use crate::AppState;
use crate::auth::Permission;
use crate::body::Query;
use crate::error::{ApiError, ApiResult};
use crate::hub::{Live, LiveKind, frame, profile_of};
use crate::signature::StreamCaller;

/// Frames one connection replays at most before it ends (the client
/// resumes from the last id it got).
pub const REPLAY_BLOCK: usize = 5_000;
/// Rows read from the outbox at a time.
const PAGE: u32 = 500;
/// How much later than the newest row an unknown time-ordered id may be
/// before it counts as from another store.
const CLOCK_SLACK_MS: i64 = 1_000;

/// Streams the tenant's events.
#[utoipa::path(get, path = "/v1/events", operation_id = "streamTenantEvents", tag = "events",
    params(
        ("sessionId" = Option<String>, Query, description = "Only this session's events"),
        ("profiles" = Option<String>, Query, description = "The profiles the client negotiates, comma-separated (default: every profile)"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this eventId (default: live from now)"),
        ("lastEventId" = Option<String>, Query, description = "As Last-Event-ID, for a client that cannot send the header (a new EventSource); the header wins"),
        ("ticket" = Option<String>, Query, description = "A stream ticket (POST /v1/stream-tickets) instead of Authorization, for a browser's EventSource"),
        super::openapi::SignatureHeaders,
    ),
    responses(
        (status = 200, description = "text/event-stream: `capabilities`, an optional `replay-gap` (no id), then authority and watch events in relay order, `id` = eventId; a long replay ends the connection after a block; each frame is one of TenantStreamFrame", content_type = "text/event-stream", body = ref("#/components/schemas/TenantStreamFrame")),
        (status = 400, description = "NRD-0008: a bad parameter, or a Last-Event-ID that is not printable text"),
        (status = 403, description = "NRD-0102: the token does not reach this session"),
        (status = 404, description = "NRD-0007: no such session"),
        (status = 409, description = "NRD-0302: a Last-Event-ID past anything this store holds; NRD-0303: one this store never held for you; reconnect without it"),
    ),
    security(("bearer" = []), ("streamTicket" = []), ("extensionSignature" = [])))]
pub async fn events(
    State(state): State<AppState>,
    StreamCaller(principal): StreamCaller,
    headers: HeaderMap,
    mut query: Query,
) -> ApiResult<Response> {
    principal.require(Permission::Read)?;
    let session_id = query.text("sessionId");
    let profiles = sse::negotiated(&mut query);
    let last_event_id = sse::last_event_id(&headers, &mut query);
    query.finish()?;
    let tenant = principal.tenant.clone();
    if let Some(s) = &session_id {
        principal.require_session(s)?;
        state.journal.session(&tenant, s).await?;
    }
    // Refused at open over the tenant's limit, never cut later.
    let slot = state.quotas.open_stream(&tenant).await?;
    let start = match last_event_id {
        Some(id) => Start::After(position_of(&state, &tenant, &id).await?),
        None => Start::Live,
    };
    // Subscribe first: what commits from here on waits in `live`.
    let live = match &session_id {
        Some(s) => state.hub.subscribe(&tenant, s),
        None => state.hub.subscribe_tenant(&tenant),
    };
    let mut capabilities = super::meta::capability_document(&state, &tenant, None).await?;
    capabilities["activeProfiles"] = json!(
        profiles
            .iter()
            .map(narad_protocol::profile::Profile::id)
            .collect::<Vec<_>>()
    );
    let mut first = vec![sse::capabilities_frame(&capabilities)];
    // Live from now: after the subscription, what had committed is left
    // out, whenever the relay gets to it.
    let attached = match start {
        Start::Live => Some(state.journal.attach_snapshot().await?),
        Start::After(_) => None,
    };
    let cursor = match start {
        Start::Live => attached.as_ref().expect("taken for Live").cursor(),
        Start::After(position) => {
            let found = matches!(position, StreamPosition::At(_));
            let horizon = state.journal.horizon(&tenant).await?;
            // A cursor below the horizon is found by the replay's first
            // page, which reads the horizon with its rows.
            let (cursor, forgotten) = match (position, horizon) {
                (StreamPosition::At(c), _) => (c, None),
                (_, Some(h)) => (h.cursor, Some(h.event_id)),
                (_, None) => (
                    RelayCursor {
                        txid: 0,
                        position: 0,
                    },
                    None,
                ),
            };
            if forgotten.is_some() || !found {
                first.push(replay_gap(forgotten.as_deref(), session_id.as_deref()));
            }
            cursor
        }
    };
    let (mut connection, rx) =
        Connection::new(crate::metrics::StreamKind::Tenant, profiles, principal);
    connection.hold(slot);
    tokio::spawn(feed(
        state, connection, session_id, cursor, attached, live, first,
    ));
    sse::response(rx)
}

enum Start {
    /// Live from now.
    Live,
    /// A replay after a client's event.
    After(StreamPosition),
}

/// The `replay-gap` frame: no id, so that it moves no cursor.
fn replay_gap(forgotten_through: Option<&str>, session_id: Option<&str>) -> Bytes {
    let mut body = json!({
        "type": "replay-gap",
        "protocolVersion": "narad/v1",
        "forgottenThrough": forgotten_through,
        "message": "part of the range after Last-Event-ID was forgotten by outbox retention; \
                    re-read history (GET /v1/sessions/{sessionId}/events) from what you hold",
    });
    if let Some(s) = session_id {
        body["sessionId"] = json!(s);
    }
    Bytes::from(format!(
        "event: replay-gap\ndata: {}\n\n",
        serde_json::to_string(&body).expect("serialises")
    ))
}

/// Where a `Last-Event-ID` stands, or the error that refuses it.
async fn position_of(state: &AppState, tenant: &TenantId, id: &str) -> ApiResult<StreamPosition> {
    let journal = &state.journal;
    let ahead = || {
        ApiError::new(
            ErrorCode::CursorAhead,
            format!(
                "Last-Event-ID {id:?} is past anything this store holds (the store under the \
                 client changed); reconnect without Last-Event-ID and re-read history"
            ),
        )
    };
    let position = match WatchId::decode(id) {
        Some(watch) if watch.txid.is_some() || watch.type_name == "workspace.revision" => {
            let txid = watch.txid.unwrap_or(watch.revision as i64);
            if txid >= journal.current_txid().await? {
                return Err(ahead());
            }
            match watch.txid {
                Some(txid) => journal.stream_position(tenant, id, Some(txid)).await?,
                // After every row of its transaction: the catalogue change
                // it covers is the one row of a transaction that records
                // one (`record_watch`).
                None => StreamPosition::At(RelayCursor {
                    txid,
                    position: i64::MAX,
                }),
            }
        }
        Some(WatchId {
            session_id: Some(session),
            covers: Some(covers),
            ..
        }) => match journal.session(tenant, &session).await {
            Ok(s) if covers > s.session_sequence => return Err(ahead()),
            Ok(_) => journal.stream_position_at(tenant, &session, covers).await?,
            Err(_) => StreamPosition::Unknown,
        },
        _ => journal.stream_position(tenant, id, None).await?,
    };
    if position != StreamPosition::Unknown {
        return Ok(position);
    }
    // An id this store never held: from a newer store, if it is a
    // time-ordered id later than anything recorded here.
    if let Some(at) = uuid_v7_millis(id) {
        let newest = journal.newest_recorded_ms(tenant).await?.unwrap_or(0);
        if at > newest + CLOCK_SLACK_MS {
            return Err(ahead());
        }
    }
    Err(ApiError::new(
        ErrorCode::CursorUnknown,
        format!(
            "Last-Event-ID {id:?} is no event of this tenant; reconnect without it \
             (and re-read history)"
        ),
    )
    .with_field("Last-Event-ID", "unknown event"))
}

/// The milliseconds of a UUIDv7 (narad's server-issued ids).
fn uuid_v7_millis(id: &str) -> Option<i64> {
    let uuid = uuid::Uuid::parse_str(id).ok()?;
    if uuid.get_version_num() != 7 {
        return None;
    }
    let (secs, nanos) = uuid.get_timestamp()?.to_unix();
    Some(secs as i64 * 1000 + i64::from(nanos / 1_000_000))
}

/// Writes one connection's frames until the client goes away (or, after a
/// long replay, until a block was written).
async fn feed(
    state: AppState,
    connection: Connection,
    session_id: Option<String>,
    after: RelayCursor,
    attached: Option<AttachSnapshot>,
    mut live: broadcast::Receiver<std::sync::Arc<Live>>,
    first: Vec<Bytes>,
) {
    for f in first {
        if connection.send(f).await.is_err() {
            return;
        }
    }
    let mut progress = Progress::after(after);
    // Without a snapshot of its attach, the stream replays first.
    if attached.is_none() {
        // Boxed, as the session stream's history reads are.
        match Box::pin(replay_block(
            &state,
            &connection,
            session_id.as_deref(),
            &mut progress,
        ))
        .await
        {
            Ok(true) => {}
            // A block was written, or the client went away: the connection
            // ends, and the client resumes from its last id.
            Ok(false) | Err(()) => return,
        }
    }
    // Keep-alives and the stream's end, one future for the stream's life
    // (so that its checks keep their schedule however often frames arrive).
    let ended = connection.until_ended(&state);
    tokio::pin!(ended);
    let mut gathered = sse::Gathered::default();
    loop {
        tokio::select! {
            received = live.recv() => {
                let Some(event) = sse::received(&state, received) else { return };
                // This event and those already waiting behind it leave as
                // one.
                let gathered_until = gathered.gather(&state, &mut live, event, |event| {
                    // Live from now: what had committed at attach is left out.
                    if attached.as_ref().is_some_and(|a| a.saw(event.cursor.txid)) {
                        return Take::Skip;
                    }
                    let wanted = connection.wants(event.profile, event.session_id.as_deref());
                    Take::send_if(match event.kind {
                        // Right after the authority it covers only.
                        LiveKind::Watch => wanted && progress.watch_sent(event.cursor),
                        LiveKind::Authority | LiveKind::StoredWatch => {
                            let new = event.cursor > progress.through;
                            progress.handled(event.cursor, new && wanted);
                            new && wanted
                        }
                    })
                });
                if gathered_until == sse::Gather::Dropped {
                    return;
                }
                if !gathered.flush(&state, &connection, &live).await {
                    return;
                }
            }
            () = &mut ended => return,
        }
    }
}

/// Replays the rows after `progress`: `Ok(true)` when the replay caught
/// up (the stream goes live), `Ok(false)` when a full block was written and
/// more remain (the connection ends), `Err` when the client went away or
/// the outbox cannot be read.
async fn replay_block(
    state: &AppState,
    connection: &Connection,
    session_id: Option<&str>,
    progress: &mut Progress<RelayCursor>,
) -> Result<bool, ()> {
    let tenant = connection.principal.tenant.clone();
    let mut sent = 0;
    loop {
        let page = state
            .journal
            .tenant_relay_after(&tenant, session_id, progress.through, PAGE)
            .await
            .map_err(|e| tracing::warn!(error = %e, "a tenant stream cannot read the outbox"))?;
        // Retention forgot rows this replay had not reached: say so before
        // the rows after them.
        if let Some(h) = page.horizon
            && h.cursor > progress.through
        {
            connection
                .send(replay_gap(Some(&h.event_id), session_id))
                .await?;
            progress.handled(h.cursor, false);
        }
        let full = page.rows.len() == PAGE as usize;
        for row in page.rows {
            let wanted = connection.wants(profile_of(&row.body), Some(&row.session_id));
            if wanted {
                connection.send(frame(&row.event_id, &row.body)).await?;
                sent += 1;
            }
            progress.handled(row.cursor, wanted);
        }
        if !full {
            return Ok(true);
        }
        if sent >= REPLAY_BLOCK {
            return Ok(false);
        }
    }
}
