//! `GET /v1/sessions/{sessionId}/stream`: a session, live, over SSE.
//!
//! First a `capabilities` frame (§10.4; no id) naming the negotiated
//! profiles, then every authority event after the client's position, in
//! sessionSequence order, each frame's id its eventId (§10.1), and the
//! session's watch events (`session.revision`, `run.revision`,
//! `workflow.revision`, `session.archived`), each right after the authority
//! it covers and only there (a watch that would go out after later frames is
//! stale and left out), so that resuming from ANY frame's id gives exactly
//! the frames after it. The stream subscribes before it replays (§10.3): events
//! committed during the replay wait in the subscription, and the stream
//! delivers each sessionSequence exactly once, reading history whenever the
//! live feed skips ahead. Frames of profiles the client did not negotiate
//! are not sent (their sequences still count).
//!
//! A client that does not keep up is dropped, never waited for: when its
//! connection's queue is full, or it fell further behind the live feed than
//! the hub keeps, the stream ends (counted), and the client resumes with
//! `Last-Event-ID`. A stream ends too when its token expires.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use narad_protocol::ErrorCode;
use narad_protocol::watch::WatchId;
use tokio::sync::broadcast;

use super::graph_feed::{GraphFeed, graph_event};
use super::sse::{self, Connection, Progress, Take};
use crate::AppState;
use crate::auth::Permission;
use crate::body::Query;
use crate::error::{ApiError, ApiResult};
use crate::hub::{LiveKind, frame, profile_of};
use crate::signature::StreamCaller;
use narad_protocol::profile::Profile;

/// Streams a session.
#[utoipa::path(get, path = "/v1/sessions/{sessionId}/stream", operation_id = "streamSession", tag = "events",
    params(
        ("sessionId" = String, Path, description = "The session"),
        ("afterSessionSequence" = Option<u64>, Query, maximum = 9007199254740991.0, description = "Start after this sessionSequence (default: the beginning)"),
        ("profiles" = Option<String>, Query, description = "The profiles the client negotiates, comma-separated (default: every profile); frames of other profiles are not sent"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this eventId, of an authority or a watch event (wins over afterSessionSequence)"),
        ("lastEventId" = Option<String>, Query, description = "As Last-Event-ID, for a client that cannot send the header (a new EventSource); the header wins"),
        ("ticket" = Option<String>, Query, description = "A stream ticket (POST /v1/stream-tickets) instead of Authorization, for a browser's EventSource"),
        super::openapi::SignatureHeaders,
    ),
    responses(
        (status = 200, description = "text/event-stream: a `capabilities` frame, then authority and watch events with `id` = eventId, and `hydrate` graph records (no id); each frame is one of SessionStreamFrame", content_type = "text/event-stream", body = ref("#/components/schemas/SessionStreamFrame")),
        (status = 400, description = "NRD-0008: a bad parameter, or a Last-Event-ID that is not printable text"),
        (status = 403, description = "NRD-0102: the token does not reach this session"),
        (status = 404, description = "NRD-0007: no such session"),
        (status = 409, description = "NRD-0302: a cursor past the session's last event (the store was replaced); NRD-0303: a Last-Event-ID of no event of this session; reconnect without it"),
    ),
    security(("bearer" = []), ("streamTicket" = []), ("extensionSignature" = [])))]
pub async fn stream(
    State(state): State<AppState>,
    StreamCaller(principal): StreamCaller,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    mut query: Query,
) -> ApiResult<Response> {
    principal.require(Permission::Read)?;
    principal.require_session(&session_id)?;
    let after = query.number("afterSessionSequence")?;
    let profiles = sse::negotiated(&mut query);
    let last_event_id = sse::last_event_id(&headers, &mut query);
    query.finish()?;
    let tenant = principal.tenant.clone();
    let session = state.journal.session(&tenant, &session_id).await?;
    // A client that names no position is hydrated: the transcript as one
    // messages.snapshot first, then the authority from the start.
    let hydrate = last_event_id.is_none()
        && after.is_none()
        && profiles.contains(narad_protocol::profile::Profile::Conversation);
    let after = match last_event_id {
        Some(id) => match WatchId::decode(&id) {
            Some(watch) if watch.session_id.as_deref() == Some(session_id.as_str()) => {
                watch.covers.unwrap_or(0)
            }
            _ => state
                .journal
                .event_sequence(&tenant, &session_id, &id)
                .await?
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::CursorUnknown,
                        format!(
                            "Last-Event-ID {id:?} is no event of this session; \
                             reconnect without it (or with afterSessionSequence)"
                        ),
                    )
                    .with_field("Last-Event-ID", "unknown event")
                })?,
        },
        None => after.unwrap_or(0),
    };
    if after > session.session_sequence {
        return Err(ApiError::new(
            ErrorCode::CursorAhead,
            format!(
                "the cursor names sessionSequence {after}, and this session holds {} events: \
                 the store under the client changed; reconnect without a cursor and re-read history",
                session.session_sequence
            ),
        ));
    }
    // Refused at open over the tenant's limit, never cut later.
    let slot = state.quotas.open_stream(&tenant).await?;
    // Subscribe first: what commits from here on waits in `live`.
    let live = state.hub.subscribe(&tenant, &session_id);
    let mut capabilities =
        super::meta::capability_document(&state, &tenant, Some(&session_id)).await?;
    capabilities["activeProfiles"] = serde_json::json!(
        profiles
            .iter()
            .map(narad_protocol::profile::Profile::id)
            .collect::<Vec<_>>()
    );
    let (mut connection, rx) =
        Connection::new(crate::metrics::StreamKind::Session, profiles, principal);
    connection.hold(slot);
    let first = sse::capabilities_frame(&capabilities);
    tokio::spawn(feed(
        state, connection, session_id, after, hydrate, live, first,
    ));
    sse::response(rx)
}

/// Writes one connection's frames until the client goes away.
async fn feed(
    state: AppState,
    connection: Connection,
    session_id: String,
    after: u64,
    hydrate: bool,
    mut live: broadcast::Receiver<std::sync::Arc<crate::hub::Live>>,
    first: axum::body::Bytes,
) {
    if connection.send(first).await.is_err() {
        return;
    }
    let mut progress = Progress::after(after);
    if hydrate {
        // The authority still follows from the start, for the lifecycle
        // state; the client's transcript skips what the snapshot covers
        // (§9.3), so a UI draws the conversation before the replay ends.
        match Box::pin(transcript_snapshot(&state, &connection, &session_id)).await {
            Ok(Some(frame)) => {
                if connection.send(frame).await.is_err() {
                    return;
                }
            }
            // Not expressible as a snapshot: the authority alone follows.
            Ok(None) => {}
            Err(()) => return,
        }
    }
    // A client of the graph profile first gets the graphs of the journals
    // it already holds authority of, then each change after the event
    // that made it.
    let mut graphs = connection
        .profiles
        .contains(Profile::Graph)
        .then(|| GraphFeed::new(&session_id));
    if let Some(feed) = &mut graphs
        && after > 0
    {
        if Box::pin(fold_history(&state, &connection, &session_id, after, feed))
            .await
            .is_err()
        {
            return;
        }
        for frame in feed.snapshots() {
            if connection.send(frame).await.is_err() {
                return;
            }
        }
    }
    // History reads are boxed: their state, sized for a database round
    // trip, would otherwise be part of every idle stream's task.
    if Box::pin(catch_up(
        &state,
        &connection,
        &session_id,
        &mut progress,
        &mut graphs,
    ))
    .await
    .is_err()
    {
        return;
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
                    let seq = event.session_sequence;
                    match event.kind {
                        // A watch event goes out only right after the
                        // authority it covers (a client resuming from its id
                        // resumes there).
                        LiveKind::Watch | LiveKind::StoredWatch => Take::send_if(
                            connection.wants(event.profile, Some(&session_id))
                                && progress.watch_sent(seq),
                        ),
                        LiveKind::Authority if seq <= progress.through => Take::Skip,
                        LiveKind::Authority if seq == progress.through + 1 => {
                            let derived = match (&mut graphs, &event.graph_event) {
                                (Some(feed), Some(e)) => feed.follow(e),
                                _ => None,
                            };
                            let wanted = connection.wants(event.profile, Some(&session_id));
                            progress.handled(seq, wanted);
                            match derived {
                                _ if !wanted => Take::Skip,
                                Some(after) => Take::SendWith(after),
                                None => Take::Send,
                            }
                        }
                        // The feed skipped ahead (a relay that started later
                        // than this stream's replay ended, say): read history.
                        LiveKind::Authority => Take::Stop,
                    }
                });
                if gathered_until == sse::Gather::Dropped {
                    return;
                }
                let behind = gathered_until == sse::Gather::Ahead;
                if !gathered.flush(&state, &connection, &live).await {
                    return;
                }
                if behind
                    && Box::pin(catch_up(&state, &connection, &session_id, &mut progress, &mut graphs))
                        .await
                        .is_err()
                {
                    return;
                }
            }
            () = &mut ended => return,
        }
    }
}

/// The page of history after `after`, as large as pages go; `Err` (logged)
/// when history cannot be read.
async fn history_page(
    state: &AppState,
    tenant: &narad_journal::TenantId,
    session_id: &str,
    after: u64,
) -> Result<narad_journal::HistoryPage, ()> {
    sse::history_after(state, tenant, session_id, after)
        .await
        .map_err(|e| tracing::warn!(error = %e, "a stream cannot read history"))
}

/// Sends every event after `progress` that history holds; `Err` when the
/// client went away or history cannot be read (the stream then ends, and
/// the client resumes from its last id).
async fn catch_up(
    state: &AppState,
    connection: &Connection,
    session_id: &str,
    progress: &mut Progress<u64>,
    graphs: &mut Option<GraphFeed>,
) -> Result<(), ()> {
    let tenant = &connection.principal.tenant;
    loop {
        let page = history_page(state, tenant, session_id, progress.through).await?;
        for event in &page.events {
            let derived = graphs
                .as_mut()
                .and_then(|feed| graph_event(event).and_then(|e| feed.follow(&e)));
            let wanted = connection.wants(profile_of(event), Some(session_id));
            if wanted {
                let id = event["eventId"].as_str().unwrap_or("");
                connection.send(frame(id, event)).await?;
                if let Some(after) = derived {
                    connection.send(after).await?;
                }
            }
            let seq = event["sessionSequence"]
                .as_u64()
                .unwrap_or(progress.through + 1);
            progress.handled(seq, wanted);
        }
        if page.next_session_sequence.is_none() {
            return Ok(());
        }
    }
}

/// Folds the session's authority through `through` into `graphs` (the
/// client holds it already: nothing is sent).
async fn fold_history(
    state: &AppState,
    connection: &Connection,
    session_id: &str,
    through: u64,
    graphs: &mut GraphFeed,
) -> Result<(), ()> {
    let tenant = &connection.principal.tenant;
    let mut at = 0;
    while at < through {
        let page = history_page(state, tenant, session_id, at).await?;
        for event in &page.events {
            let seq = event["sessionSequence"].as_u64().unwrap_or(at + 1);
            if seq > through {
                return Ok(());
            }
            if let Some(e) = graph_event(event) {
                graphs.fold(&e);
            }
            at = seq;
        }
        if page.next_session_sequence.is_none() {
            return Ok(());
        }
    }
    Ok(())
}

/// The session's transcript as a `messages.snapshot` hydrate frame (no
/// id); `None` when the transcript cannot be expressed as one (reasoning
/// not yet joined to a message).
async fn transcript_snapshot(
    state: &AppState,
    connection: &Connection,
    session_id: &str,
) -> Result<Option<axum::body::Bytes>, ()> {
    let tenant = &connection.principal.tenant;
    let mut reducer = narad_protocol::reducer::Reducer::new(connection.profiles);
    let mut covers = 0;
    loop {
        let page = history_page(state, tenant, session_id, covers).await?;
        for event in &page.events {
            // The journal holds only what the rules accepted.
            if let Err(v) = reducer.deliver_json(event) {
                tracing::warn!(rule = ?v, "a stored event does not reduce; replaying instead");
                return Ok(None);
            }
            covers = event["sessionSequence"].as_u64().unwrap_or(covers + 1);
        }
        if page.next_session_sequence.is_none() {
            break;
        }
    }
    let snapshot_id = narad_protocol::primitives::EventId::new_v7();
    let Some(snapshot) = reducer.messages_snapshot(snapshot_id.as_str(), session_id, covers) else {
        return Ok(None);
    };
    let mut record = serde_json::to_value(&snapshot).expect("serialises");
    record["type"] = serde_json::json!("messages.snapshot");
    record["protocolVersion"] = serde_json::json!("narad/v1");
    record["timestamp"] = serde_json::json!(narad_protocol::primitives::Timestamp::now());
    let frame = axum::body::Bytes::from(format!(
        "event: hydrate\ndata: {}\n\n",
        serde_json::to_string(&record).expect("serialises")
    ));
    Ok(Some(frame))
}
