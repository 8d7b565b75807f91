//! The executor's WebSocket: `GET {base}/v1/executors/{id}/connect`,
//! `client.attached` first, then `server.heartbeat` and
//! `client.tool.execute` from the server and `client.heartbeat` from us,
//! each every heartbeat interval. A connection closed by the server, or
//! silent for three intervals, is replaced with backoff (doubling per
//! failed attempt and per short-lived connection); every replacement is a
//! new attachment with a new lease.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use narad_protocol::control::{ClientAttached, ClientHeartbeat};
use narad_protocol::envelope::ControlEnvelope;
use narad_protocol::primitives::LeaseId;
use narad_protocol::{Classified, ControlBody, ControlMessage, Reader, WireObject};
use serde_json::Value;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::header::{AUTHORIZATION, HeaderValue};
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;

use super::dispatch::Core;
use super::finish::FinishRequest;
use super::{ExecutorError, Timings, bump};
use crate::urls::endpoint;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The shortest heartbeat interval honoured, whatever the server says.
const MIN_HEARTBEAT: Duration = Duration::from_millis(50);

/// Why a connection attempt or a connection ended.
enum Ended {
    /// Asked to stop.
    Stopped,
    /// Refused for good.
    Refused(ExecutorError),
    /// Lost or never made: try again.
    Lost(String),
}

/// Keeps a connection open (to the replicas in turn) until `stop`, or
/// until the server refuses the executor for good.
pub(crate) async fn run(
    core: Arc<Core>,
    bases: Vec<reqwest::Url>,
    jwt: String,
    timings: Timings,
    stop: CancellationToken,
) -> Result<(), ExecutorError> {
    let mut replica = 0usize;
    let mut backoff = timings.first_backoff;
    loop {
        let base = &bases[replica % bases.len()];
        let ended = match connect(&core, base, &jwt, &timings, &stop).await {
            Ok((socket, attached)) => {
                let attached_at = Instant::now();
                let ended = serve(&core, socket, attached, &stop).await;
                // A connection that lived a while starts the backoff over; one
                // that was closed at once (say, by another process attaching
                // as the same executor) keeps it growing.
                if attached_at.elapsed() >= timings.max_backoff {
                    backoff = timings.first_backoff;
                }
                ended
            }
            Err(ended) => ended,
        };
        core.stats.set_lease(None);
        match ended {
            Ended::Stopped => return Ok(()),
            Ended::Refused(e) => return Err(e),
            Ended::Lost(why) => {
                tracing::info!(%why, base = %base, reconnect_in = ?backoff, "executor connection lost");
            }
        }
        replica += 1;
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(timings.max_backoff);
    }
}

/// The WebSocket URL of `base`'s connect endpoint.
fn connect_url(base: &reqwest::Url, id: &str) -> reqwest::Url {
    let mut url = endpoint(base, &["v1", "executors", id, "connect"]);
    let scheme = if url.scheme() == "https" { "wss" } else { "ws" };
    url.set_scheme(scheme)
        .expect("http(s) and ws(s) are all special schemes");
    url
}

/// Opens a connection and reads its `client.attached`.
async fn connect(
    core: &Core,
    base: &reqwest::Url,
    jwt: &str,
    timings: &Timings,
    stop: &CancellationToken,
) -> Result<(Socket, ClientAttached), Ended> {
    let url = connect_url(base, core.id().as_str());
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| Ended::Refused(ExecutorError::Config(format!("{url}: {e}"))))?;
    let bearer = HeaderValue::from_str(&format!("Bearer {jwt}")).map_err(|_| {
        Ended::Refused(ExecutorError::Config(
            "the token is not a valid header value".to_owned(),
        ))
    })?;
    request.headers_mut().insert(AUTHORIZATION, bearer);
    let attempt = async {
        let (mut socket, _) = match tokio_tungstenite::connect_async(request).await {
            Ok(s) => s,
            Err(tungstenite::Error::Http(response)) => {
                let status = response.status().as_u16();
                let body = response
                    .body()
                    .as_deref()
                    .and_then(|b| serde_json::from_slice(b).ok())
                    .unwrap_or(Value::Null);
                return Err(if matches!(status, 401 | 403) {
                    Ended::Refused(ExecutorError::Refused { status, body })
                } else {
                    Ended::Lost(format!("HTTP {status} {body}"))
                });
            }
            Err(e) => return Err(Ended::Lost(e.to_string())),
        };
        let attached = loop {
            match socket.next().await {
                Some(Ok(Message::Text(text))) => match control(&text) {
                    Some(ControlBody::ClientAttached(a)) => break a,
                    _ => return Err(Ended::Lost(format!("expected client.attached: {text}"))),
                },
                Some(Ok(Message::Close(frame))) => {
                    return Err(Ended::Lost(format!("closed before attaching: {frame:?}")));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(Ended::Lost(e.to_string())),
                None => return Err(Ended::Lost("closed before attaching".to_owned())),
            }
        };
        Ok((socket, attached))
    };
    tokio::select! {
        () = stop.cancelled() => Err(Ended::Stopped),
        r = tokio::time::timeout(timings.request_timeout, attempt) => match r {
            Ok(r) => r,
            Err(_) => Err(Ended::Lost("no client.attached in time".to_owned())),
        },
    }
}

/// Serves one attached connection until it is lost or `stop`.
#[tracing::instrument(skip_all, fields(lease_id = %attached.lease_id))]
async fn serve(
    core: &Arc<Core>,
    socket: Socket,
    attached: ClientAttached,
    stop: &CancellationToken,
) -> Ended {
    if &attached.client_executor_id != core.id() {
        tracing::warn!(
            attached_as = %attached.client_executor_id,
            "the server attached another clientExecutorId"
        );
    }
    let mut lease: LeaseId = attached.lease_id;
    let interval = Duration::from_millis(attached.heartbeat_interval_ms.get()).max(MIN_HEARTBEAT);
    bump(&core.stats.counters.attachments);
    core.stats.set_lease(Some(lease.clone()));
    tracing::info!(heartbeat = ?interval, lease_expires_at = attached.lease_expires_at.as_str(), "executor attached");
    // What earlier connections left unanswered goes again now.
    let _ = core.finishes_sender().send(FinishRequest::AllPending);

    let (mut sink, mut stream) = socket.split();
    let mut heartbeat = tokio::time::interval_at(Instant::now() + interval, interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_heard = Instant::now();
    loop {
        let silent_until = last_heard + interval * 3;
        tokio::select! {
            () = stop.cancelled() => {
                let close = sink.send(Message::Close(None));
                let _ = tokio::time::timeout(Duration::from_secs(1), close).await;
                return Ended::Stopped;
            }
            () = tokio::time::sleep_until(silent_until) => {
                return Ended::Lost(format!("no word from the server for {:?}", interval * 3));
            }
            _ = heartbeat.tick() => {
                let beat = ControlBody::ClientHeartbeat(ClientHeartbeat {
                    client_executor_id: core.id().clone(),
                    lease_id: lease.clone(),
                });
                if let Err(e) = sink.send(Message::text(encode(beat))).await {
                    return Ended::Lost(format!("sending a heartbeat: {e}"));
                }
            }
            frame = stream.next() => {
                last_heard = Instant::now();
                match frame {
                    Some(Ok(Message::Text(text))) => match control(&text) {
                        Some(ControlBody::ClientToolExecute(execute)) => {
                            core.deliver(execute, &lease).await;
                        }
                        Some(ControlBody::ServerHeartbeat(beat)) => {
                            tracing::trace!(lease_expires_at = ?beat.lease_expires_at, "server.heartbeat");
                        }
                        Some(ControlBody::ClientAttached(again)) => {
                            tracing::info!(lease_id = %again.lease_id, "a new lease on the same connection");
                            lease = again.lease_id;
                            core.stats.set_lease(Some(lease.clone()));
                        }
                        Some(other) => {
                            tracing::debug!(r#type = other.wire_type().name(), "control message ignored");
                        }
                        None => tracing::debug!(%text, "frame ignored"),
                    },
                    Some(Ok(Message::Close(frame))) => {
                        return Ended::Lost(format!("closed by the server: {frame:?}"));
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Ended::Lost(e.to_string()),
                    None => return Ended::Lost("closed".to_owned()),
                }
            }
        }
    }
}

/// A control message's body, when `text` is a valid one (anything else is
/// logged and ignored: only `client.tool.execute` runs tools).
fn control(text: &str) -> Option<ControlBody> {
    match Reader::all_profiles().classify_str(text) {
        Ok(Classified::Accepted(object)) => match *object {
            WireObject::Control(message) => Some(message.body),
            other => {
                tracing::debug!(r#type = other.wire_type().name(), "not a control message");
                None
            }
        },
        Ok(Classified::Ignored { type_name, .. }) => {
            tracing::debug!(%type_name, "frame of an unknown type ignored");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "invalid frame from the server");
            None
        }
    }
}

/// A control message as text, with its type and protocolVersion.
fn encode(body: ControlBody) -> String {
    WireObject::Control(ControlMessage {
        envelope: ControlEnvelope::default(),
        body,
    })
    .to_json()
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_protocol::primitives::ClientExecutorId;
    use serde_json::json;

    #[test]
    fn the_connect_url_is_the_websocket_form_of_the_base() {
        let http = reqwest::Url::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            connect_url(&http, "desktop 1").as_str(),
            "ws://127.0.0.1:8080/v1/executors/desktop%201/connect"
        );
        let https = reqwest::Url::parse("https://narad.example/api").unwrap();
        assert_eq!(
            connect_url(&https, "d").as_str(),
            "wss://narad.example/api/v1/executors/d/connect"
        );
    }

    #[test]
    fn heartbeats_are_narad_control_messages() {
        let beat = encode(ControlBody::ClientHeartbeat(ClientHeartbeat {
            client_executor_id: ClientExecutorId::new("exec-1").unwrap(),
            lease_id: LeaseId::new("L1").unwrap(),
        }));
        let value: Value = serde_json::from_str(&beat).unwrap();
        assert_eq!(
            value,
            json!({
                "type": "client.heartbeat",
                "protocolVersion": "narad/v1",
                "clientExecutorId": "exec-1",
                "leaseId": "L1",
            })
        );
    }

    #[test]
    fn only_valid_control_messages_are_read() {
        let attached = json!({
            "type": "client.attached",
            "protocolVersion": "narad/v1",
            "clientExecutorId": "exec-1",
            "leaseId": "L1",
            "heartbeatIntervalMs": 15000,
            "leaseExpiresAt": "2026-08-05T04:00:00Z",
        });
        assert!(matches!(
            control(&attached.to_string()),
            Some(ControlBody::ClientAttached(_))
        ));
        // A tool.call.started is authority, not an order to run anything.
        assert!(control(r#"{"type":"tool.call.started"}"#).is_none());
        assert!(control("not json").is_none());
        let missing_token = json!({
            "type": "client.tool.execute",
            "protocolVersion": "narad/v1",
            "clientExecutorId": "exec-1",
            "leaseId": "L1",
            "toolCallId": "tc-1",
            "toolName": "echo",
            "args": {},
        });
        assert!(control(&missing_token.to_string()).is_none());
    }
}
