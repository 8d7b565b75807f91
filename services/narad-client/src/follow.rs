//! A resumable stream consumer.
//!
//! Each connection is an SSE stream; when it ends (a replay block, a
//! server shutting down, a network drop, a slow-consumer drop), the next
//! connection resumes from what was delivered, on the same replica or the
//! next one, after a short backoff. Authority events already delivered are
//! skipped, so the caller sees each once, in order, whatever the transport
//! did.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use serde_json::Value;

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
        Follow {
            client,
            target,
            delivered: HashMap::new(),
            events: None,
            replica: 0,
            failures: 0,
            connections: 0,
        }
    }

    /// Starts after `session_sequence` (a session stream).
    pub fn after(mut self, session_sequence: u64) -> Follow {
        if let Target::Session { id, after } = &mut self.target {
            *after = session_sequence;
            self.delivered.insert(id.clone(), session_sequence);
        }
        self
    }

    /// Connections opened so far (more than one: the stream resumed).
    pub fn connections(&self) -> u64 {
        self.connections
    }

    /// The next item; `Ok(None)` never happens for a live stream unless
    /// the caller drops it, so loop until an error.
    pub async fn next(&mut self) -> Result<Option<Item>, ClientError> {
        loop {
            let Some(events) = self.events.as_mut() else {
                self.connect().await?;
                continue;
            };
            match events.next().await {
                Some(Ok(event)) => {
                    self.failures = 0;
                    if let Some(item) = self.item(event) {
                        return Ok(Some(item));
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
        loop {
            if self.failures > 0 {
                let backoff = FIRST_BACKOFF
                    .saturating_mul(1 << self.failures.min(6))
                    .min(MAX_BACKOFF);
                tokio::time::sleep(backoff).await;
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
                Ok(response) if response.status().is_client_error() => {
                    let status = response.status().as_u16();
                    let body = response.json().await.unwrap_or(Value::Null);
                    return Err(ClientError::Refused { status, body });
                }
                Ok(response) => {
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
