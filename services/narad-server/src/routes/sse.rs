//! What the session stream and the tenant stream share: the response, the
//! negotiated profiles, the connection's bounded queue, keep-alives, and
//! the end of a stream whose credential expired.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use narad_protocol::profile::{Profile, ProfileSet};
use tokio::sync::{broadcast, mpsc};

use crate::AppState;
use crate::auth::Principal;
use crate::body::Query;
use crate::error::ApiResult;
use crate::hub::Live;
use crate::metrics::{Held, StreamKind};

/// How often an idle stream sends an SSE comment.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Frames a connection may hold unsent.
pub const CONNECTION_BUFFER: usize = 64;
/// How often an extension's stream checks that its registration is still
/// enabled.
pub const EXTENSION_RECHECK: Duration = Duration::from_secs(5);
/// How often a stream waiting on its client checks how far behind it is.
const LAG_CHECK: Duration = Duration::from_millis(100);

/// The profiles a stream's client negotiated: `?profiles=a,b` (core is
/// always in); every profile when the parameter is absent. Unknown ids are
/// ignored: negotiation keeps what both sides know (§2.1).
pub fn negotiated(query: &mut Query) -> ProfileSet {
    match query.text("profiles") {
        None => ProfileSet::all(),
        Some(list) => {
            ProfileSet::from_ids(list.split(',').map(str::trim).filter(|s| !s.is_empty())).0
        }
    }
}

/// Where a stream resumes: the `Last-Event-ID` header, or else the
/// `lastEventId` query parameter (for a page that opens a new
/// `EventSource`, which cannot set the header, with a new ticket).
pub fn last_event_id(headers: &HeaderMap, query: &mut Query) -> Option<String> {
    // UTF-8, not only visible ASCII: eventIds are any strings (the
    // `input::headers` layer refused what is not text before this).
    let from_query = query.text("lastEventId");
    // The stream's ticket was read by the caller's extractor; it is a
    // known parameter of the streams, not an unknown one.
    let _ = query.text("ticket");
    headers
        .get("last-event-id")
        .and_then(|v| std::str::from_utf8(v.as_bytes()).ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .or(from_query.filter(|v| !v.is_empty()))
}

/// The `capabilities` frame (control class, no id).
pub fn capabilities_frame(document: &serde_json::Value) -> Bytes {
    Bytes::from(format!(
        "event: capabilities\ndata: {}\n\n",
        serde_json::to_string(document).expect("serialises")
    ))
}

/// Bytes of waiting frames joined into one body chunk at most.
const CHUNK: usize = 32 * 1024;

/// An SSE response whose frames come from `rx`. Frames waiting together
/// leave as one chunk: one write instead of one per frame.
pub fn response(mut rx: mpsc::Receiver<Bytes>) -> ApiResult<Response> {
    let stream = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx).map(|first| {
            let first = first?;
            let mut joined: Option<Vec<u8>> = None;
            while joined.as_ref().map_or(first.len(), Vec::len) < CHUNK {
                let Ok(next) = rx.try_recv() else { break };
                joined
                    .get_or_insert_with(|| first.to_vec())
                    .extend_from_slice(&next);
            }
            Some(Ok::<_, std::convert::Infallible>(
                joined.map_or(first, Bytes::from),
            ))
        })
    });
    let mut response = Body::from_stream(stream).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// A live event, or `None` when the stream must end: the client fell
/// further behind than the hub keeps (dropped as slow, counted), or the hub
/// is gone.
pub fn received(
    state: &AppState,
    received: Result<std::sync::Arc<Live>, broadcast::error::RecvError>,
) -> Option<std::sync::Arc<Live>> {
    match received {
        Ok(event) => Some(event),
        Err(broadcast::error::RecvError::Lagged(_)) => {
            state.hub.dropped_slow_consumer();
            None
        }
        Err(broadcast::error::RecvError::Closed) => None,
    }
}

/// How far a stream has come, in its own order of positions
/// (sessionSequence on a session stream, relay order on the tenant
/// stream). A client resumes from the id of the last frame it got, so every
/// frame with an id must stand exactly where resuming from it starts: after
/// every frame sent before it, and before every frame sent after it.
/// Authority frames go out in order and stand where they are; a watch frame
/// stands at the authority it covers, so it goes out only while that is
/// exactly where the stream stands ([`Progress::watch_fits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress<P> {
    /// Everything through here was handled: sent, or not for this client.
    pub through: P,
    /// Where the last frame with an id that went out stands.
    pub sent: P,
}

impl<P: Ord + Copy> Progress<P> {
    /// A stream resuming after `at`.
    pub fn after(at: P) -> Progress<P> {
        Progress {
            through: at,
            sent: at,
        }
    }

    /// Records that the frame at `at` was handled, and whether it went out.
    pub fn handled(&mut self, at: P, sent: bool) {
        self.through = self.through.max(at);
        if sent {
            self.sent = at;
        }
    }

    /// Whether a watch frame covering the authority at `covers` may go
    /// out now: the stream has handled everything through it and sent
    /// nothing after it. A watch that does not fit is stale for this
    /// client (a later one covers what it has), and is not sent:
    /// otherwise a client resuming from its id would get again what came
    /// after the authority it covers.
    pub fn watch_fits(&self, covers: P) -> bool {
        self.sent <= covers && covers <= self.through
    }

    /// Whether a watch frame covering `covers` goes out
    /// ([`Progress::watch_fits`]); recorded as sent when it does.
    pub fn watch_sent(&mut self, covers: P) -> bool {
        let fits = self.watch_fits(covers);
        if fits {
            self.sent = covers;
        }
        fits
    }
}

/// Live events a connection takes from the hub at a time before it hands
/// their frames on as one.
const GATHER: usize = 256;

/// What a feed does with one live event.
pub enum Take {
    /// Its frame goes to the client.
    Send,
    /// Its frame goes to the client, followed by these frames (records
    /// derived from it, such as a graph delta).
    SendWith(Bytes),
    /// It is not for this client, or the client has it already.
    Skip,
    /// It is ahead of the client: gathering stops before it (the feed
    /// reads history instead).
    Stop,
}

impl Take {
    /// [`Take::Send`] when `send`, else [`Take::Skip`].
    pub fn send_if(send: bool) -> Take {
        if send { Take::Send } else { Take::Skip }
    }
}

/// How a [`Gathered::gather`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gather {
    /// Nothing more waits (or a burst's worth was taken).
    Done,
    /// `take` stopped at an event ahead of the client.
    Ahead,
    /// The client fell further behind than the hub keeps: the stream ends
    /// (dropped as slow, counted); the client resumes with `Last-Event-ID`.
    Dropped,
}

/// The frames of the live events a connection took at once, handed to its
/// queue as one: one wake-up and one write for a burst instead of one per
/// event and connection.
#[derive(Default)]
pub struct Gathered {
    frames: Vec<u8>,
    /// How many frames `frames` holds.
    count: u64,
}

impl Gathered {
    /// Takes `first` and the live events already waiting behind it (at
    /// most `GATHER`, 256), keeping the frames of those `take` sends.
    pub fn gather(
        &mut self,
        state: &AppState,
        live: &mut broadcast::Receiver<std::sync::Arc<Live>>,
        first: std::sync::Arc<Live>,
        mut take: impl FnMut(&Live) -> Take,
    ) -> Gather {
        let mut event = first;
        let mut taken = 0;
        loop {
            match take(&event) {
                Take::Send => {
                    self.frames.extend_from_slice(&event.frame);
                    self.count += 1;
                }
                Take::SendWith(after) => {
                    self.frames.extend_from_slice(&event.frame);
                    self.frames.extend_from_slice(&after);
                    self.count += 2;
                }
                Take::Skip => {}
                Take::Stop => return Gather::Ahead,
            }
            taken += 1;
            // Full: stop before taking another event off the channel (one
            // taken and not handled would be lost to this stream).
            if taken == GATHER {
                return Gather::Done;
            }
            event = match live.try_recv() {
                Ok(next) => next,
                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    state.hub.dropped_slow_consumer();
                    return Gather::Dropped;
                }
                Err(_) => return Gather::Done,
            };
        }
    }

    /// Hands the gathered frames on (see [`Connection::deliver`]) and
    /// starts over; `false` when the stream must end.
    pub async fn flush(
        &mut self,
        state: &AppState,
        connection: &Connection,
        live: &broadcast::Receiver<std::sync::Arc<Live>>,
    ) -> bool {
        if self.frames.is_empty() {
            return true;
        }
        let frames = Bytes::from(std::mem::take(&mut self.frames));
        let count = std::mem::take(&mut self.count);
        let delivered = connection.deliver(state, live, &frames).await;
        if delivered {
            connection.frames.increment(count);
        }
        delivered
    }
}

/// The connection of one stream: its queue, its client's profiles and
/// credential. It counts as an open stream of its kind
/// (`narad_streams_open`) until it is dropped, with its feed.
pub struct Connection {
    /// The queue the response drains.
    pub tx: mpsc::Sender<Bytes>,
    /// The negotiated profiles.
    pub profiles: ProfileSet,
    /// The caller.
    pub principal: Principal,
    /// Frames handed to the queue (`narad_stream_frames_total`).
    frames: metrics::Counter,
    _open: Held,
    /// The stream's place under its tenant's open-stream limit.
    _slot: Option<crate::quotas::StreamSlot>,
}

impl Connection {
    /// Holds `slot` (the stream's place under its tenant's open-stream
    /// limit) until the connection ends.
    pub fn hold(&mut self, slot: crate::quotas::StreamSlot) {
        self._slot = Some(slot);
    }

    /// A connection of a stream of `kind`, and the receiver its response
    /// drains.
    pub fn new(
        kind: StreamKind,
        profiles: ProfileSet,
        principal: Principal,
    ) -> (Connection, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(CONNECTION_BUFFER);
        (
            Connection {
                tx,
                profiles,
                principal,
                frames: kind.frames(),
                _open: Held::stream(kind),
                _slot: None,
            },
            rx,
        )
    }

    /// Whether the client may receive a frame of this profile and session
    /// (per-frame authorisation and negotiation).
    pub fn wants(&self, profile: Profile, session_id: Option<&str>) -> bool {
        self.profiles.contains(profile)
            && match session_id {
                Some(s) => self.principal.may_see(s),
                // Workspace-wide frames only for an unlimited token.
                None => self.principal.sessions.is_none(),
            }
    }

    /// Whether the client went away (its response was dropped).
    pub fn client_gone(&self) -> bool {
        self.tx.is_closed()
    }

    /// Sends a frame, waiting while the client keeps up; `Err` when the
    /// client went away.
    pub async fn send(&self, frame: Bytes) -> Result<(), ()> {
        self.tx.send(frame).await.map_err(|_| ())?;
        self.frames.increment(1);
        Ok(())
    }

    /// Hands a live frame to the client, waiting while it keeps up;
    /// `false` when the stream must end: the client went away, or it fell
    /// [`SUBSCRIBER_BACKLOG`](crate::hub::SUBSCRIBER_BACKLOG) events
    /// behind the live feed (it is dropped, counted, and resumes with
    /// `Last-Event-ID`).
    pub async fn deliver(
        &self,
        state: &AppState,
        live: &broadcast::Receiver<std::sync::Arc<Live>>,
        frame: &Bytes,
    ) -> bool {
        // The common case, a queue with room, arms no timer: one timer per
        // frame and connection was most of the hub's cost at 1,000
        // subscribers (BENCHMARKS.md).
        let frame = match self.tx.try_send(frame.clone()) {
            Ok(()) => return true,
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
            Err(mpsc::error::TrySendError::Full(frame)) => frame,
        };
        loop {
            tokio::select! {
                sent = self.tx.send(frame.clone()) => return sent.is_ok(),
                () = tokio::time::sleep(LAG_CHECK) => {
                    if live.len() >= crate::hub::SUBSCRIBER_BACKLOG {
                        state.hub.dropped_slow_consumer();
                        return false;
                    }
                }
            }
        }
    }

    /// Sends a keep-alive comment unless the queue is full (a connection
    /// with frames waiting needs none); `false` when the client went away.
    fn keep_alive(&self) -> bool {
        !matches!(
            self.tx.try_send(Bytes::from_static(b": keep-alive\n\n")),
            Err(mpsc::error::TrySendError::Closed(_))
        )
    }

    /// Sends a keep-alive every [`KEEP_ALIVE`] and completes when the
    /// stream must end: the client went away, the server is stopping, or
    /// the caller may no longer read ([`Connection::revoked`]). A feed pins
    /// it once for the stream's life: futures made anew for every frame
    /// registered with waiter lists that every connection shares.
    pub async fn until_ended(&self, state: &AppState) {
        let mut keep_alive = tokio::time::interval(KEEP_ALIVE);
        keep_alive.tick().await;
        let revoked = self.revoked(state);
        tokio::pin!(revoked);
        let client_gone = self.tx.closed();
        tokio::pin!(client_gone);
        let hub_closed = state.hub.closed();
        tokio::pin!(hub_closed);
        loop {
            tokio::select! {
                _ = keep_alive.tick() => {
                    if !self.keep_alive() {
                        return;
                    }
                }
                () = &mut client_gone => return,
                () = &mut hub_closed => return,
                () = &mut revoked => return,
            }
        }
    }

    /// Completes when the caller may no longer read: its token is no
    /// longer accepted (at [`Principal::valid_until`]: `exp` plus the
    /// verifier's leeway, counted once; the client reconnects with a fresh
    /// one), or, for a signed extension call, its registration was
    /// disabled or removed (checked every [`EXTENSION_RECHECK`]).
    pub async fn revoked(&self, state: &AppState) {
        if let Some((publisher, name)) = &self.principal.extension {
            loop {
                tokio::time::sleep(EXTENSION_RECHECK).await;
                // Boxed: the query's state would otherwise sit in every
                // stream's task for the stream's life.
                match Box::pin(
                    state
                        .journal
                        .signing_key(&self.principal.tenant, publisher, name),
                )
                .await
                {
                    Ok(Some(key)) if key.enabled => {}
                    Ok(_) => return,
                    // The database is away: keep serving; the next check
                    // decides.
                    Err(e) => tracing::debug!(error = %e, "cannot recheck an extension"),
                }
            }
        }
        crate::auth::until_invalid(self.principal.valid_until).await;
    }
}

/// One page of a session's history after `after` (a sessionSequence), as
/// large as pages go: what every stream reads to catch up or fill a gap.
pub async fn history_after(
    state: &AppState,
    tenant: &narad_journal::TenantId,
    session_id: &str,
    after: u64,
) -> Result<narad_journal::HistoryPage, narad_journal::JournalError> {
    state
        .journal
        .history(
            tenant,
            session_id,
            &narad_journal::HistoryQuery {
                after_session_sequence: Some(after),
                limit: Some(narad_journal::history::MAX_LIMIT),
                ..narad_journal::HistoryQuery::default()
            },
        )
        .await
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, OnceLock};

    use narad_journal::{Journal, TenantId};

    use super::*;

    /// A state whose database is never reached: these checks need none.
    async fn state() -> AppState {
        let journal = Journal::connect("postgres://nobody@127.0.0.1:1/none", 1).expect("a pool");
        let verifier = crate::auth::Verifier::new(crate::auth::AuthSettings {
            issuer: "narad".into(),
            audience: "narad".into(),
            hs256_secret: Some(vec![7; 32]),
            jwks: None,
            jwks_refetch_interval: Duration::from_secs(60),
            jwks_refresh_interval: Duration::from_secs(300),
            operator_org: None,
        })
        .await
        .expect("a verifier");
        AppState {
            hub: crate::hub::Hub::new(journal.clone(), Duration::from_millis(50)),
            quotas: Arc::new(crate::quotas::Quotas::new(
                journal.clone(),
                Default::default(),
            )),
            journal,
            verifier: Arc::new(verifier),
            openapi: Arc::new(OnceLock::new()),
            executors: Default::default(),
            runtime: Default::default(),
            closed: Default::default(),
        }
    }

    /// A burst longer than one gather is handed on whole, over several
    /// gathers: none of its events is taken off the channel and dropped.
    #[tokio::test]
    async fn a_burst_longer_than_a_gather_loses_no_event() {
        let state = state().await;
        let (tx, mut rx) = broadcast::channel::<Arc<Live>>(4 * GATHER);
        let total = 2 * GATHER + 10;
        for n in 0..total {
            let _ = tx.send(Arc::new(Live {
                kind: crate::hub::LiveKind::Authority,
                cursor: narad_journal::RelayCursor {
                    txid: 1,
                    position: n as i64,
                },
                session_id: Some("s1".into()),
                session_sequence: n as u64 + 1,
                profile: Profile::Core,
                frame: Bytes::from(format!("id: {n}\n\n")),
                graph_event: None,
            }));
        }
        let mut gathered = Gathered::default();
        let mut seen = Vec::new();
        while let Ok(first) = rx.try_recv() {
            let outcome = gathered.gather(&state, &mut rx, first, |_| Take::Send);
            assert_eq!(outcome, Gather::Done);
            assert!(gathered.count <= GATHER as u64);
            let frames = std::mem::take(&mut gathered.frames);
            gathered.count = 0;
            seen.extend(
                String::from_utf8(frames)
                    .unwrap()
                    .split("\n\n")
                    .filter(|f| !f.is_empty())
                    .map(|f| f.trim_start_matches("id: ").parse::<usize>().unwrap()),
            );
        }
        assert_eq!(seen, (0..total).collect::<Vec<_>>());
    }

    fn connection() -> (Connection, mpsc::Receiver<Bytes>) {
        let principal = Principal {
            tenant: TenantId::new("acme").expect("an id"),
            subject: "u".into(),
            roles: Default::default(),
            executors: None,
            sessions: None,
            valid_until: None,
            extension: None,
        };
        Connection::new(StreamKind::Session, ProfileSet::all(), principal)
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_stream_gets_a_keep_alive_every_15_seconds_until_it_ends() {
        let state = state().await;
        let (stream, mut rx) = connection();
        let start = tokio::time::Instant::now();
        let ended = tokio::spawn({
            let state = state.clone();
            async move { stream.until_ended(&state).await }
        });
        let ms = Duration::from_millis(1);
        for n in 1..=3 {
            tokio::time::sleep_until(start + KEEP_ALIVE * n - ms).await;
            assert!(rx.try_recv().is_err(), "not before {n} × 15 s");
            tokio::time::sleep_until(start + KEEP_ALIVE * n + ms).await;
            assert_eq!(rx.try_recv().expect("a keep-alive"), ": keep-alive\n\n");
        }
        assert!(!ended.is_finished());
        // The server stops: the stream ends (the client resumes elsewhere).
        state.hub.close();
        tokio::time::timeout(Duration::from_secs(1), ended)
            .await
            .expect("ended when the hub closed")
            .expect("no panic");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_ends_when_its_client_goes_away_or_its_token_expires() {
        let state = state().await;
        let (stream, rx) = connection();
        let gone = tokio::spawn({
            let state = state.clone();
            async move { stream.until_ended(&state).await }
        });
        drop(rx);
        tokio::time::timeout(Duration::from_secs(1), gone)
            .await
            .expect("ended when the client went away")
            .expect("no panic");

        let (mut stream, _rx) = connection();
        stream.principal = verified(&state, 60).await;
        let expired = tokio::spawn(async move { stream.until_ended(&state).await });
        let leeway = crate::auth::LEEWAY_SECONDS;
        tokio::time::sleep(Duration::from_secs(59 + leeway)).await;
        assert!(!expired.is_finished(), "not before the token expires");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(expired.is_finished(), "ended once the token expired");
    }

    /// A watch goes out only while it stands where the stream stands:
    /// never after a later frame, never ahead of what was handled.
    #[test]
    fn a_watch_fits_only_where_the_stream_stands() {
        let mut p = Progress::after(10u64);
        assert!(!p.watch_fits(9), "older than the resume position");
        assert!(p.watch_sent(10), "exactly at the resume position");
        assert!(!p.watch_fits(11), "ahead of what was handled");
        p.handled(11, true);
        p.handled(12, false);
        assert!(!p.watch_fits(10), "a frame went out after it");
        assert!(p.watch_fits(11) && p.watch_fits(12));
        assert!(p.watch_sent(12));
        assert!(!p.watch_fits(11), "a watch at 12 went out after it");
        assert_eq!((p.through, p.sent), (12, 12));
    }

    /// A principal the verifier accepts, from an HS256 token whose `exp` is
    /// `exp_in` seconds from now (negative: in the past).
    async fn verified(state: &AppState, exp_in: i64) -> Principal {
        let mut claims = crate::auth::Claims::new(
            "narad",
            "narad",
            "acme",
            "u",
            &[crate::auth::Role::Reader],
            Duration::ZERO,
        )
        .expect("claims");
        claims.exp = claims.exp.saturating_add_signed(exp_in);
        let token = crate::auth::sign_hs256(&[7; 32], &claims).expect("signs");
        state.verifier.verify(&token).await.expect("accepted")
    }

    /// A token already past its `exp` but inside the leeway: the stream
    /// ends when the leeway runs out (the moment a new request with it is
    /// refused), counted once, not a whole leeway after it opened.
    #[tokio::test(start_paused = true)]
    async fn a_stream_opened_inside_the_leeway_ends_when_the_leeway_runs_out() {
        let state = state().await;
        let leeway = crate::auth::LEEWAY_SECONDS as i64;
        let (mut stream, _rx) = connection();
        // Accepted for about 5 s more.
        stream.principal = verified(&state, 5 - leeway).await;
        let ended = tokio::spawn(async move { stream.until_ended(&state).await });
        tokio::time::sleep(Duration::from_millis(3_900)).await;
        assert!(!ended.is_finished(), "still valid");
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        assert!(
            ended.is_finished(),
            "ended within 5 s, when the token stops being accepted"
        );
    }
}
