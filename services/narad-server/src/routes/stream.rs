//! `GET /v1/sessions/{sessionId}/stream`: a session, live, over SSE.
//!
//! First a `capabilities` frame (§10.4; no id), then every authority event
//! after the client's position, in sessionSequence order, each frame's id
//! its eventId (§10.1). The stream subscribes before it replays (§10.3):
//! events committed during the replay wait in the subscription, and the
//! stream delivers each sessionSequence exactly once, reading history
//! whenever the live feed skips ahead.
//!
//! A client that does not keep up is dropped, never waited for: when its
//! connection's queue is full, or it fell further behind the live feed than
//! the hub keeps, the stream ends (counted), and the client resumes with
//! `Last-Event-ID`.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use narad_journal::HistoryQuery;
use narad_protocol::ErrorCode;
use tokio::sync::{broadcast, mpsc};

use crate::AppState;
use crate::auth::Permission;
use crate::body::Query;
use crate::error::{ApiError, ApiResult};
use crate::hub::frame;
use crate::signature::StreamCaller;

/// How often an idle stream sends an SSE comment.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Frames a connection may hold unsent.
const CONNECTION_BUFFER: usize = 64;

/// Streams a session.
#[utoipa::path(get, path = "/v1/sessions/{sessionId}/stream", tag = "events",
    params(
        ("sessionId" = String, Path, description = "The session"),
        ("afterSessionSequence" = Option<u64>, Query, description = "Start after this sessionSequence (default: the beginning)"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this eventId (wins over afterSessionSequence)"),
    ),
    responses(
        (status = 200, description = "text/event-stream: a `capabilities` frame, then authority events with `id` = eventId", content_type = "text/event-stream"),
        (status = 400, description = "NRD-0008: an unknown Last-Event-ID, or a bad parameter"),
        (status = 404, description = "NRD-0007: no such session"),
    ),
    security(("bearer" = []), ("extensionSignature" = [])))]
pub async fn stream(
    State(state): State<AppState>,
    StreamCaller(principal): StreamCaller,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    mut query: Query,
) -> ApiResult<Response> {
    principal.require(Permission::Read)?;
    let after = query.number("afterSessionSequence")?;
    query.finish()?;
    let tenant = principal.tenant.clone();
    state.journal.session(&tenant, &session_id).await?;
    let after = match headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
    {
        Some(id) => state
            .journal
            .event_sequence(&tenant, &session_id, id)
            .await?
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InvalidParameter,
                    format!(
                        "Last-Event-ID {id:?} is no event of this session; \
                         reconnect without it (or with afterSessionSequence)"
                    ),
                )
                .with_field("Last-Event-ID", "unknown event")
            })?,
        None => after.unwrap_or(0),
    };
    // Subscribe first: what commits from here on waits in `live`.
    let live = state.hub.subscribe(&tenant, &session_id);
    let capabilities = super::meta::capability_document(&state, &tenant, Some(&session_id)).await?;
    let (tx, rx) = mpsc::channel::<Bytes>(CONNECTION_BUFFER);
    let first = Bytes::from(format!(
        "event: capabilities\ndata: {}\n\n",
        serde_json::to_string(&capabilities).expect("serialises")
    ));
    tokio::spawn(feed(state, tenant, session_id, after, live, first, tx));
    let body = Body::from_stream(tokio_stream_of(rx));
    let mut response = body.into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

fn tokio_stream_of(
    mut rx: mpsc::Receiver<Bytes>,
) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|f| f.map(Ok)))
}

/// Writes one connection's frames until the client goes away.
async fn feed(
    state: AppState,
    tenant: narad_journal::TenantId,
    session_id: String,
    mut last: u64,
    mut live: broadcast::Receiver<std::sync::Arc<crate::hub::Live>>,
    first: Bytes,
    tx: mpsc::Sender<Bytes>,
) {
    if tx.send(first).await.is_err() {
        return;
    }
    if catch_up(&state, &tenant, &session_id, &mut last, &tx)
        .await
        .is_err()
    {
        return;
    }
    let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
    keep_alive.tick().await;
    loop {
        tokio::select! {
            received = live.recv() => {
                let behind = match received {
                    Ok(event) if event.session_sequence <= last => continue,
                    Ok(event) if event.session_sequence == last + 1 => {
                        if !deliver(&state, &tx, &live, &event.frame).await {
                            return;
                        }
                        last += 1;
                        continue;
                    }
                    // The client fell further behind than the hub keeps.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        state.hub.dropped_slow_consumer();
                        return;
                    }
                    // The feed skipped ahead (a relay that started later
                    // than this stream's replay ended, say): read history.
                    Ok(_) => true,
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if behind
                    && catch_up(&state, &tenant, &session_id, &mut last, &tx)
                        .await
                        .is_err()
                {
                    return;
                }
            }
            _ = keep_alive.tick() => {
                // A connection whose queue is full needs no keep-alive.
                if let Err(mpsc::error::TrySendError::Closed(_)) =
                    tx.try_send(Bytes::from_static(b": keep-alive\n\n"))
                {
                    return;
                }
            }
            () = tx.closed() => return,
            () = state.hub.closed() => return,
        }
    }
}

/// Hands a live frame to the connection, waiting while the client keeps
/// up; `false` when the stream must end: the client went away, or it fell
/// [`SUBSCRIBER_BACKLOG`](crate::hub::SUBSCRIBER_BACKLOG) events behind the
/// live feed (it is dropped, counted, and resumes with `Last-Event-ID`).
async fn deliver(
    state: &AppState,
    tx: &mpsc::Sender<Bytes>,
    live: &broadcast::Receiver<std::sync::Arc<crate::hub::Live>>,
    frame: &Bytes,
) -> bool {
    loop {
        tokio::select! {
            sent = tx.send(frame.clone()) => return sent.is_ok(),
            () = tokio::time::sleep(LAG_CHECK) => {
                if live.len() >= crate::hub::SUBSCRIBER_BACKLOG {
                    state.hub.dropped_slow_consumer();
                    return false;
                }
            }
        }
    }
}

/// How often a stream waiting on its client checks how far behind it is.
const LAG_CHECK: Duration = Duration::from_millis(100);

/// Sends every event after `last` that history holds; `Err` when the client
/// went away or history cannot be read (the stream then ends, and the
/// client resumes from its last id).
async fn catch_up(
    state: &AppState,
    tenant: &narad_journal::TenantId,
    session_id: &str,
    last: &mut u64,
    tx: &mpsc::Sender<Bytes>,
) -> Result<(), ()> {
    loop {
        let page = state
            .journal
            .history(
                tenant,
                session_id,
                &HistoryQuery {
                    after_session_sequence: Some(*last),
                    limit: Some(narad_journal::history::MAX_LIMIT),
                    ..HistoryQuery::default()
                },
            )
            .await
            .map_err(|e| tracing::warn!(error = %e, "a stream cannot read history"))?;
        for event in &page.events {
            let id = event["eventId"].as_str().unwrap_or("");
            tx.send(frame(id, event)).await.map_err(|_| ())?;
            *last = event["sessionSequence"].as_u64().unwrap_or(*last + 1);
        }
        if page.next_session_sequence.is_none() {
            return Ok(());
        }
    }
}
