//! A resumable stream consumer.
//!
//! Each connection is an SSE stream; when it ends (a replay block, a
//! server shutting down, a network drop, a slow-consumer drop), the next
//! connection resumes from what was delivered, on the same replica or the
//! next one, after a short backoff. Authority events already delivered are
//! skipped, so the caller sees each once, in order, whatever the transport
//! did.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use narad_protocol::ProfileSet;
use narad_protocol::reducer::Reducer;
use serde_json::Value;

use crate::graph::{GraphUpdate, GraphView};
use crate::{Client, ClientError};

/// One item of a stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// The capability document a connection opens with (§10.4).
    Capabilities(Value),
    /// A hydrate record (`messages.snapshot`, …).
    Hydrate(Value),
    /// An authority event, delivered once.
    Authority(Value),
    /// A watch event ("this scope changed").
    Watch(Value),
    /// The tenant stream forgot part of the range asked for: re-read
    /// history for the sessions you follow.
    ReplayGap(Value),
}

/// Consecutive failed connection attempts before [`ClientError::Unavailable`].
const MAX_ATTEMPTS: u32 = 30;
/// The first backoff; doubled per failure up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

type Events = Pin<
    Box<
        dyn Stream<
                Item = Result<
                    eventsource_stream::Event,
                    eventsource_stream::EventStreamError<reqwest::Error>,
                >,
            > + Send,
    >,
>;

enum Target {
    Session {
        id: String,
        after: u64,
    },
    Tenant {
        session: Option<String>,
        last_id: Option<String>,
    },
}

/// A followed stream; [`Follow::next`] yields its items.
pub struct Follow {
    client: Client,
    target: Target,
    /// The highest sessionSequence delivered, per session.
    delivered: HashMap<String, u64>,
    events: Option<Events>,
    replica: usize,
    failures: u32,
    connections: u64,
    /// Items read from history after a replay gap, delivered first.
    pending: VecDeque<Item>,
    /// A session stream's reduced state.
    reducer: Option<Reducer>,
    /// A session stream's run graphs.
    graphs: Option<GraphView>,
    /// Connections dropped to recover a graph from a gap.
    graph_gaps: u64,
}

impl Follow {
    pub(crate) fn session(client: Client, id: &str) -> Follow {
        Follow::new(
            client,
            Target::Session {
                id: id.to_owned(),
                after: 0,
            },
        )
    }

    pub(crate) fn tenant(client: Client, session: Option<&str>, last_id: Option<&str>) -> Follow {
        Follow::new(
            client,
            Target::Tenant {
                session: session.map(str::to_owned),
                last_id: last_id.map(str::to_owned),
            },
        )
    }

    fn new(client: Client, target: Target) -> Follow {
        let session = matches!(target, Target::Session { .. });
        let reducer = session.then(|| Reducer::new(ProfileSet::all()));
        Follow {
            graphs: session.then(GraphView::new),
            graph_gaps: 0,
            client,
            pending: VecDeque::new(),
            reducer,
            target,
            delivered: HashMap::new(),
            events: None,
            replica: 0,
            failures: 0,
            connections: 0,
        }
    }

    /// Starts after `session_sequence` (a session stream). The reducer
    /// ([`Follow::reducer`]) then holds only what follows, so it is
    /// dropped: a reducer needs the session from its start.
    /// A client that starts after a position holds the graphs of what
    /// precedes it only through the snapshots the stream sends when it
    /// attaches.
    pub fn after(mut self, session_sequence: u64) -> Follow {
        if let Target::Session { id, after } = &mut self.target {
            *after = session_sequence;
            self.delivered.insert(id.clone(), session_sequence);
        }
        if session_sequence > 0 {
            self.reducer = None;
        }
        self
    }

    /// The session's state as the client reducer has reduced it from the
    /// start (session streams followed from their start).
    pub fn reducer(&self) -> Option<&Reducer> {
        self.reducer.as_ref()
    }

    /// The session's run graphs, from the stream's graph records (session
    /// streams). On a gap a journal's graph waits for a snapshot, and the
    /// stream is reopened to get one.
    pub fn graphs(&self) -> Option<&GraphView> {
        self.graphs.as_ref()
    }

    /// Times the stream was reopened because a graph record did not follow
    /// what the client held.
    pub fn graph_gaps(&self) -> u64 {
        self.graph_gaps
    }

    /// Connections opened so far (more than one: the stream resumed).
    pub fn connections(&self) -> u64 {
        self.connections
    }

    /// The next item; `Ok(None)` never happens for a live stream unless
    /// the caller drops it, so loop until an error.
    pub async fn next(&mut self) -> Result<Option<Item>, ClientError> {
        let item = self.next_item().await?;
        if let (Some(graphs), Some(item)) = (&mut self.graphs, &item) {
            match item {
                Item::Authority(v) => graphs.held(v),
                Item::Hydrate(v) if v["type"].as_str().is_some_and(|t| t.starts_with("graph.")) => {
                    if let GraphUpdate::Gap { root_run_id } = graphs.apply(v) {
                        // Stop applying and ask for a snapshot: a stream
                        // sends one for every journal when it attaches.
                        tracing::debug!(root_run_id, "a graph gap; reopening the stream");
                        self.graph_gaps += 1;
                        self.events = None;
                    }
                }
                _ => {}
            }
        }
        if let (Some(reducer), Some(item)) = (&mut self.reducer, &item) {
            let value = match item {
                Item::Authority(v) | Item::Watch(v) | Item::Hydrate(v) => Some(v),
                _ => None,
            };
            if let Some(v) = value {
                reducer.deliver_json(v).map_err(ClientError::Protocol)?;
            }
        }
        Ok(item)
    }

    async fn next_item(&mut self) -> Result<Option<Item>, ClientError> {
        if let Some(item) = self.pending.pop_front() {
            return Ok(Some(item));
        }
        loop {
            let Some(events) = self.events.as_mut() else {
                self.connect().await?;
                continue;
            };
            match events.next().await {
                Some(Ok(event)) => {
                    self.failures = 0;
                    match self.item(event) {
                        // What retention forgot, history still holds: the
                        // sessions this client follows are re-read from
                        // where it stood, before the stream goes on.
                        Some(Item::ReplayGap(gap)) => {
                            self.reread_history().await?;
                            return Ok(Some(Item::ReplayGap(gap)));
                        }
                        Some(item) => return Ok(Some(item)),
                        None => {}
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "the stream broke; resuming");
                    self.events = None;
                }
                // An ordinary end (a replay block, a server stopping): the
                // next connection resumes, on the next replica.
                None => {
                    self.events = None;
                    self.replica += 1;
                }
            }
        }
    }

    /// Queues, for every session delivered so far, the events history
    /// holds after the last one delivered.
    async fn reread_history(&mut self) -> Result<(), ClientError> {
        let base = self.client.bases[self.replica % self.client.bases.len()].clone();
        let sessions: Vec<(String, u64)> = self
            .delivered
            .iter()
            .map(|(s, n)| (s.clone(), *n))
            .collect();
        for (session, mut after) in sessions {
            loop {
                let mut url = reqwest::Url::parse(&base)
                    .map_err(|e| ClientError::Unavailable(format!("{base}: {e}")))?;
                url.path_segments_mut()
                    .map_err(|()| ClientError::Unavailable(base.clone()))?
                    .pop_if_empty()
                    .extend(["v1", "sessions", &session, "events"]);
                url.query_pairs_mut()
                    .append_pair("afterSessionSequence", &after.to_string())
                    .append_pair("limit", "1000");
                let response = self
                    .client
                    .http
                    .get(url)
                    .bearer_auth(&self.client.token)
                    .send()
                    .await
                    .map_err(|e| ClientError::Unavailable(e.to_string()))?;
                let status = response.status().as_u16();
                let page: Value = response
                    .json()
                    .await
                    .map_err(|e| ClientError::Unavailable(e.to_string()))?;
                if status != 200 {
                    return Err(ClientError::Refused { status, body: page });
                }
                for event in page["events"].as_array().into_iter().flatten() {
                    let n = event["sessionSequence"].as_u64().unwrap_or(after + 1);
                    let seen = self.delivered.entry(session.clone()).or_insert(0);
                    if n > *seen {
                        *seen = n;
                        self.pending.push_back(Item::Authority(event.clone()));
                    }
                    after = n;
                }
                let empty = page["events"].as_array().is_none_or(Vec::is_empty);
                if empty || page["nextSessionSequence"].is_null() {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Classifies a frame, skipping authority already delivered.
    fn item(&mut self, event: eventsource_stream::Event) -> Option<Item> {
        let data: Value = serde_json::from_str(&event.data).ok()?;
        match event.event.as_str() {
            "capabilities" => return Some(Item::Capabilities(data)),
            "hydrate" => return Some(Item::Hydrate(data)),
            "replay-gap" => return Some(Item::ReplayGap(data)),
            _ => {}
        }
        if let Target::Tenant { last_id, .. } = &mut self.target
            && !event.id.is_empty()
        {
            *last_id = Some(event.id.clone());
        }
        let Some(sequence) = data["sessionSequence"].as_u64() else {
            return Some(Item::Watch(data));
        };
        let session = data["sessionId"].as_str().unwrap_or_default().to_owned();
        let seen = self.delivered.entry(session).or_insert(0);
        if sequence <= *seen {
            return None;
        }
        *seen = sequence;
        if let Target::Session { after, .. } = &mut self.target {
            *after = sequence;
        }
        Some(Item::Authority(data))
    }

    /// Opens the next connection, resuming from what was delivered; tries
    /// the replicas in turn with a growing backoff.
    async fn connect(&mut self) -> Result<(), ClientError> {
        // What the last answer's Retry-After asked for (429, 503).
        let mut asked = None;
        loop {
            if self.failures > 0 {
                let backoff = FIRST_BACKOFF
                    .saturating_mul(1 << self.failures.min(6))
                    .min(MAX_BACKOFF);
                tokio::time::sleep(crate::retry_after::next_wait(backoff, asked.take())).await;
            }
            let base = &self.client.bases[self.replica % self.client.bases.len()];
            let mut request = match url(base, &self.target) {
                Ok((url, last_id)) => {
                    let mut r = self.client.http.get(url);
                    if let Some(id) = last_id {
                        r = r.header("last-event-id", id);
                    }
                    r
                }
                // A base that is not a URL fails the same way every time.
                Err(e) => return Err(ClientError::Unavailable(format!("{base}: {e}"))),
            };
            request = request.bearer_auth(&self.client.token);
            match request.send().await {
                Ok(response) if response.status().is_success() => {
                    self.connections += 1;
                    self.events = Some(Box::pin(response.bytes_stream().eventsource()));
                    return Ok(());
                }
                // Over a limit: refused at open, retried when the server says.
                Ok(response) if response.status() == reqwest::StatusCode::TOO_MANY_REQUESTS => {
                    asked = crate::retry_after::retry_after(response.headers());
                    tracing::debug!(base, wait = ?asked, "over a limit; trying again later");
                }
                Ok(response) if response.status().is_client_error() => {
                    let status = response.status().as_u16();
                    let body = response.json().await.unwrap_or(Value::Null);
                    return Err(ClientError::Refused { status, body });
                }
                Ok(response) => {
                    asked = crate::retry_after::retry_after(response.headers());
                    tracing::debug!(status = %response.status(), base, "a replica is unavailable")
                }
                Err(e) => tracing::debug!(error = %e, base, "a replica does not answer"),
            }
            self.failures += 1;
            self.replica += 1;
            if self.failures >= MAX_ATTEMPTS {
                return Err(ClientError::Unavailable(format!(
                    "{} attempts over {} replica(s)",
                    self.failures,
                    self.client.bases.len()
                )));
            }
        }
    }
}

/// The URL of a connection to `base` and the `Last-Event-ID` it sends.
fn url<'a>(base: &str, target: &'a Target) -> Result<(reqwest::Url, Option<&'a str>), String> {
    let mut url = reqwest::Url::parse(base).map_err(|e| format!("not a base URL: {e}"))?;
    let (segments, last_id): (Vec<&str>, Option<&str>) = match target {
        Target::Session { id, .. } => (vec!["v1", "sessions", id, "stream"], None),
        Target::Tenant { last_id, .. } => (vec!["v1", "events"], last_id.as_deref()),
    };
    url.path_segments_mut()
        .map_err(|()| "not a base URL that takes a path".to_owned())?
        .pop_if_empty()
        .extend(segments);
    match target {
        Target::Session { after, .. } => {
            url.query_pairs_mut()
                .append_pair("afterSessionSequence", &after.to_string());
        }
        Target::Tenant {
            session: Some(s), ..
        } => {
            url.query_pairs_mut().append_pair("sessionId", s);
        }
        Target::Tenant { .. } => {}
    }
    Ok((url, last_id))
}
