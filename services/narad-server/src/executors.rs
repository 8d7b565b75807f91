//! Client executors (§11) on the server: their timing settings, the
//! WebSocket channel of one attached executor, and the sweeper that closes
//! lapsed tokens and pauses and resumes runs as executors come and go.
//!
//! Leases, calls and tokens live in Postgres (`narad_journal::executors`),
//! so any replica validates a finish and any replica may hold an
//! executor's socket: a call started through one replica reaches the
//! executor attached to another through the relay, which wakes the
//! channels of the call's tenant ([`crate::hub::Hub::client_calls`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use narad_journal::{Delivery, Journal, JournalError, SweepItem, SweepKind, TenantId};
use narad_protocol::control::{ClientHeartbeat, ClientToolFinish};
use narad_protocol::primitives::Timestamp;
use serde::Serialize;
use serde_json::{Value, json};

use crate::hub::Hub;
use crate::metrics::{Held, StreamKind};

/// How executors are timed.
#[derive(Debug, Clone)]
pub struct ExecutorSettings {
    /// How often each side sends a heartbeat.
    pub heartbeat_interval: Duration,
    /// How long a lease lives without a heartbeat.
    pub lease_ttl: Duration,
    /// How long an execution token is valid after delivery.
    pub token_ttl: Duration,
    /// How long a call may wait for its executor before it is closed as
    /// `client_unavailable`.
    pub delivery_timeout: Duration,
    /// How often the sweeper looks for due work.
    pub sweep_interval: Duration,
}

impl ExecutorSettings {
    /// Checks that the settings make sense together: every duration
    /// positive, and heartbeats well inside a lease (at least two per
    /// lease), or healthy executors would flap between away and back.
    pub fn validate(&self) -> Result<(), String> {
        for (name, d) in [
            ("executor heartbeat interval", self.heartbeat_interval),
            ("executor lease lifetime", self.lease_ttl),
            ("execution token lifetime", self.token_ttl),
            ("executor delivery timeout", self.delivery_timeout),
            ("executor sweep interval", self.sweep_interval),
        ] {
            if d.is_zero() {
                return Err(format!("the {name} must be more than 0 ms"));
            }
        }
        if self.heartbeat_interval * 2 > self.lease_ttl {
            return Err(format!(
                "the executor lease lifetime ({} ms) must be at least two heartbeat intervals ({} ms)",
                self.lease_ttl.as_millis(),
                self.heartbeat_interval.as_millis()
            ));
        }
        Ok(())
    }
}

impl Default for ExecutorSettings {
    fn default() -> Self {
        ExecutorSettings {
            heartbeat_interval: Duration::from_secs(15),
            lease_ttl: Duration::from_secs(45),
            token_ttl: Duration::from_secs(60),
            delivery_timeout: Duration::from_secs(120),
            sweep_interval: Duration::from_secs(1),
        }
    }
}

/// The most calls handed to an executor in one delivery.
const DELIVERY_BATCH: i64 = 64;
/// The most items of each kind one sweep takes.
const SWEEP_BATCH: i32 = 200;
/// How long a socket write may take before the peer counts as gone.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long closed client calls are kept (for a late duplicate finish).
const CLOSED_CALL_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Closed calls deleted per sweep, at most.
const FORGET_BATCH: i32 = 1000;

/// WebSocket close codes of an executor channel.
pub mod close {
    /// The server is stopping: attach again (to another replica).
    pub const GOING_AWAY: u16 = 1001;
    /// A message that is not a `client.*` control of narad/v1.
    pub const PROTOCOL: u16 = 1008;
    /// The lease was superseded by a later attachment, or lapsed.
    pub const LEASE_LOST: u16 = 4001;
    /// The client sent no heartbeat for a whole lease.
    pub const HEARTBEATS_MISSING: u16 = 4002;
    /// The server failed (the database is unreachable).
    pub const SERVER_ERROR: u16 = 1011;
    /// The token that opened the channel expired.
    pub const CREDENTIAL_EXPIRED: u16 = 4003;
}

/// A control message as sent: its body with `type` and `protocolVersion`.
pub fn control(type_name: &str, body: &impl Serialize) -> Value {
    let mut v = serde_json::to_value(body).expect("control messages serialise");
    v["type"] = json!(type_name);
    v["protocolVersion"] = json!("narad/v1");
    v
}

/// The `client.attached` of a lease.
pub fn attached(executor_id: &str, lease: &narad_journal::Lease, s: &ExecutorSettings) -> Value {
    json!({
        "type": "client.attached", "protocolVersion": "narad/v1",
        "clientExecutorId": executor_id, "leaseId": lease.lease_id,
        "heartbeatIntervalMs": s.heartbeat_interval.as_millis() as u64,
        "leaseExpiresAt": lease.expires_at,
    })
}

/// One attached executor's socket, from `client.attached` to its end.
pub struct Channel {
    /// The server's journal.
    pub journal: Journal,
    /// The relay's hub (wake-ups for new calls, shutdown).
    pub hub: Arc<Hub>,
    /// Timing.
    pub settings: Arc<ExecutorSettings>,
    /// The executor's tenant.
    pub tenant: TenantId,
    /// The endpoint.
    pub executor_id: String,
    /// The last second in which the credential that opened the channel is
    /// accepted ([`Principal::valid_until`](crate::auth::Principal)): the
    /// channel ends when it begins.
    pub credential_valid_until: Option<u64>,
    /// The tenant's attached-executor limit, if any.
    pub max_executors: Option<u64>,
}

/// Why a channel ended, as the close frame says it.
struct Ended(u16, &'static str);

impl Channel {
    /// Attaches (a new lease superseding any earlier one), then serves the
    /// socket: heartbeats both ways, each waiting call delivered once as
    /// `client.tool.execute`, finishes recorded. Ends with a close frame
    /// saying why.
    pub async fn serve(self, mut socket: WebSocket) {
        let _open = Held::stream(StreamKind::Executor);
        let _socket = self.hub.socket_opened();
        let ended = match self.attach_and_serve(&mut socket).await {
            Ok(ended) => ended,
            Err(e) => {
                tracing::warn!(executor = %self.executor_id, error = %e, "an executor channel failed");
                Ended(close::SERVER_ERROR, "the server failed; attach again")
            }
        };
        let _ = socket
            .send(Message::Close(Some(CloseFrame {
                code: ended.0,
                reason: ended.1.into(),
            })))
            .await;
    }

    async fn attach_and_serve(&self, socket: &mut WebSocket) -> Result<Ended, JournalError> {
        let s = &self.settings;
        let mut calls = self.hub.client_calls(&self.tenant);
        let lease = self
            .journal
            .attach_executor_within(
                &self.tenant,
                &self.executor_id,
                s.lease_ttl,
                self.max_executors,
            )
            .await?;
        // A control poll under the lease this one superseded answers now.
        self.hub.wake_executors(&self.tenant);
        let _lease = Held::executor_lease();
        let mut expires_at = lease.expires_at.clone();
        if send(socket, &attached(&self.executor_id, &lease, s))
            .await
            .is_err()
        {
            return Ok(Ended(close::GOING_AWAY, "gone"));
        }
        tracing::info!(executor = %self.executor_id, lease = %lease.lease_id, "executor attached");
        // Runs paused while it was away resume now.
        if let Err(e) = self
            .journal
            .resume_executor_runs(&self.tenant, &self.executor_id)
            .await
        {
            tracing::warn!(executor = %self.executor_id, error = %e, "cannot resume the executor's runs yet");
        }
        let mut heartbeat = tokio::time::interval(s.heartbeat_interval);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_heartbeat = Instant::now();
        let mut deliver = true;
        let credential_ends = crate::auth::until_invalid(self.credential_valid_until);
        tokio::pin!(credential_ends);
        loop {
            if deliver {
                deliver = false;
                if let Some(ended) = self.deliver(socket, &lease.lease_id).await? {
                    return Ok(ended);
                }
            }
            tokio::select! {
                _ = self.hub.closed() => {
                    return Ok(Ended(close::GOING_AWAY, "the server is stopping; attach again"));
                }
                () = &mut credential_ends => {
                    return Ok(Ended(close::CREDENTIAL_EXPIRED, "the token expired; attach again with a fresh one"));
                }
                changed = calls.changed() => {
                    if changed.is_err() {
                        calls = self.hub.client_calls(&self.tenant);
                    }
                    deliver = true;
                }
                _ = heartbeat.tick() => {
                    if last_heartbeat.elapsed() > s.lease_ttl {
                        return Ok(Ended(close::HEARTBEATS_MISSING, "no client.heartbeat for a whole lease; attach again"));
                    }
                    let beat = json!({
                        "type": "server.heartbeat", "protocolVersion": "narad/v1",
                        "clientExecutorId": self.executor_id, "leaseId": lease.lease_id,
                        "leaseExpiresAt": expires_at, "timestamp": Timestamp::now(),
                    });
                    if send(socket, &beat).await.is_err() {
                        return Ok(Ended(close::GOING_AWAY, "gone"));
                    }
                    // A call whose wake-up was missed is delivered here.
                    deliver = true;
                }
                message = socket.recv() => {
                    let text = match message {
                        Some(Ok(Message::Close(_))) => {
                            // A goodbye: the executor is unavailable from
                            // now, not only once its lease would lapse.
                            self.journal
                                .expire_lease(&self.tenant, &self.executor_id, &lease.lease_id)
                                .await?;
                            return Ok(Ended(close::GOING_AWAY, "closed"));
                        }
                        None | Some(Err(_)) => {
                            return Ok(Ended(close::GOING_AWAY, "closed"));
                        }
                        Some(Ok(Message::Text(text))) => text,
                        Some(Ok(Message::Binary(_))) => {
                            return Ok(Ended(close::PROTOCOL, "controls are JSON text frames"));
                        }
                        Some(Ok(_)) => continue,
                    };
                    match self.received(text.as_str(), &lease.lease_id).await {
                        Ok(Some(renewed)) => {
                            // Only a heartbeat renews: a finish says
                            // nothing of the lease.
                            last_heartbeat = Instant::now();
                            expires_at = renewed;
                        }
                        Ok(None) => {}
                        Err(Refused::Close(ended)) => return Ok(ended),
                        Err(Refused::Journal(e)) => return Err(e),
                    }
                }
            }
        }
    }

    /// Delivers every call waiting for this executor. A call whose control
    /// cannot be written is closed as `delivery_failed` (§11.3 rule 11).
    async fn deliver(
        &self,
        socket: &mut WebSocket,
        lease_id: &str,
    ) -> Result<Option<Ended>, JournalError> {
        loop {
            let calls = self
                .journal
                .deliver_client_calls(
                    &self.tenant,
                    &self.executor_id,
                    lease_id,
                    self.settings.token_ttl,
                    DELIVERY_BATCH,
                )
                .await?;
            let full = calls.len() as i64 == DELIVERY_BATCH;
            for (n, call) in calls.iter().enumerate() {
                let execute = control("client.tool.execute", &call.execute);
                if send(socket, &execute).await.is_err() {
                    for failed in &calls[n..] {
                        self.delivery_failed(failed).await;
                    }
                    return Ok(Some(Ended(close::GOING_AWAY, "gone")));
                }
                tracing::debug!(executor = %self.executor_id, tool_call = %call.execute.tool_call_id, "client.tool.execute sent");
            }
            if !full {
                return Ok(None);
            }
        }
    }

    async fn delivery_failed(&self, call: &Delivery) {
        let tool_call_id = call.execute.tool_call_id.as_str();
        if let Err(e) = self
            .journal
            .close_client_call(
                &self.tenant,
                &call.session_id,
                tool_call_id,
                false,
                (
                    "error",
                    narad_protocol::engine::DELIVERY_FAILED,
                    "the executor's connection failed while the call was being delivered",
                ),
            )
            .await
        {
            tracing::warn!(tool_call = tool_call_id, error = %e, "cannot close an undelivered call; its token expires instead");
        }
    }

    /// Handles one message of the client: a heartbeat renews the lease
    /// (its new expiry comes back), a finish is recorded.
    async fn received(&self, text: &str, lease_id: &str) -> Result<Option<String>, Refused> {
        let value: Value = serde_json::from_str(text)
            .map_err(|_| Refused::Close(Ended(close::PROTOCOL, "a control must be JSON")))?;
        // What narad cannot keep exactly (U+0000, an integer beyond 64
        // bits) is refused like any other refused finish on the socket
        // (logged; the HTTP form answers it).
        if let Some((pointer, problem)) = crate::body::unstorable(text.as_bytes(), &value) {
            tracing::info!(executor = %self.executor_id, pointer, problem, "a control was refused");
            return Ok(None);
        }
        if value["protocolVersion"] != "narad/v1" {
            return Err(Refused::Close(Ended(
                close::PROTOCOL,
                "unsupported protocolVersion; narad/v1 only",
            )));
        }
        match value["type"].as_str() {
            Some("client.heartbeat") => {
                let beat: ClientHeartbeat = serde_json::from_value(value).map_err(|_| {
                    Refused::Close(Ended(close::PROTOCOL, "a malformed client.heartbeat"))
                })?;
                if beat.lease_id.as_str() != lease_id
                    || beat.client_executor_id.as_str() != self.executor_id
                {
                    return Err(Refused::Close(Ended(
                        close::LEASE_LOST,
                        "the heartbeat names another lease than this connection's",
                    )));
                }
                match self
                    .journal
                    .renew_lease(
                        &self.tenant,
                        &self.executor_id,
                        lease_id,
                        self.settings.lease_ttl,
                    )
                    .await
                {
                    Ok(lease) => Ok(Some(lease.expires_at)),
                    Err(JournalError::LeaseNotCurrent(_)) => Err(Refused::Close(Ended(
                        close::LEASE_LOST,
                        "this lease was superseded or lapsed; attach again",
                    ))),
                    Err(e) => Err(Refused::Journal(e)),
                }
            }
            Some("client.tool.finish") => {
                let finish: ClientToolFinish = serde_json::from_value(value).map_err(|_| {
                    Refused::Close(Ended(close::PROTOCOL, "a malformed client.tool.finish"))
                })?;
                let lease = finish
                    .lease_id
                    .as_ref()
                    .map_or(lease_id, |l| l.as_str())
                    .to_owned();
                match self
                    .journal
                    .finish_client_call(&self.tenant, &self.executor_id, &lease, &finish)
                    .await
                {
                    Ok(_) => Ok(None),
                    Err(e @ (JournalError::Database(_) | JournalError::Pool(_))) => {
                        Err(Refused::Journal(e))
                    }
                    Err(e) => {
                        // Refusals travel on the HTTP form's answer; a
                        // socket has no answer to carry them.
                        tracing::info!(executor = %self.executor_id, error = %e, "a client.tool.finish was refused");
                        Ok(None)
                    }
                }
            }
            _ => Err(Refused::Close(Ended(
                close::PROTOCOL,
                "an executor sends client.heartbeat and client.tool.finish only",
            ))),
        }
    }
}

enum Refused {
    Close(Ended),
    Journal(JournalError),
}

/// Sends a control; a peer that takes longer than [`SEND_TIMEOUT`] to
/// accept it counts as gone.
async fn send(socket: &mut WebSocket, v: &Value) -> Result<(), ()> {
    match tokio::time::timeout(
        SEND_TIMEOUT,
        socket.send(Message::Text(v.to_string().into())),
    )
    .await
    {
        Ok(Ok(())) => {
            metrics::counter!("narad_stream_frames_total", "kind" => "executor").increment(1);
            Ok(())
        }
        _ => Err(()),
    }
}

/// Runs the sweeper until the hub closes: every `sweep_interval`, on the
/// one replica holding the sweeper's lock, closes lapsed tokens
/// (`client_execution_expired`, or `cancelled` under a stop), calls that
/// waited too long (`client_unavailable`) or whose run is stopping
/// (`cancelled`), pauses runs whose executor is away, resumes those whose
/// executor is back.
pub async fn sweep(journal: Journal, hub: Arc<Hub>, settings: Arc<ExecutorSettings>) {
    loop {
        tokio::select! {
            _ = hub.closed() => return,
            _ = tokio::time::sleep(settings.sweep_interval) => {}
        }
        let pass = journal
            .as_sweeper(async || {
                let done = sweep_once(&journal, &settings).await;
                if let Err(e) = journal
                    .forget_client_calls(CLOSED_CALL_RETENTION, FORGET_BATCH)
                    .await
                {
                    tracing::warn!(error = %e, "cannot forget closed client calls yet");
                }
                done
            })
            .await;
        match pass {
            Ok(Some(Err(e))) | Err(e) => {
                tracing::warn!(error = %e, "an executor sweep failed; it runs again")
            }
            Ok(_) => {}
        }
    }
}

/// One pass of the sweeper (whoever holds the lock); the number of actions.
pub async fn sweep_once(
    journal: &Journal,
    settings: &ExecutorSettings,
) -> Result<usize, JournalError> {
    let items = journal
        .executor_work(settings.delivery_timeout, SWEEP_BATCH)
        .await?;
    let mut done = 0;
    for item in &items {
        match act(journal, item).await {
            Ok(true) => done += 1,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(kind = ?item.kind, run = %item.run_id, error = %e, "a sweep action failed")
            }
        }
    }
    Ok(done)
}

async fn act(journal: &Journal, item: &SweepItem) -> Result<bool, JournalError> {
    let t = &item.tenant;
    let stopping = || async {
        Ok::<_, JournalError>(
            journal
                .run_state(t, &item.session_id, &item.run_id)
                .await?
                .is_some_and(|r| r.stop_requested),
        )
    };
    // Expired calls had a token; the others are withdrawn from delivery
    // before they close, so that no executor receives them after all.
    let undelivered = item.kind != SweepKind::Expired;
    let close = async |outcome: &str, code: &str, message: &str| {
        let call = item.tool_call_id.as_deref().unwrap_or_default();
        journal
            .close_client_call(
                t,
                &item.session_id,
                call,
                undelivered,
                (outcome, code, message),
            )
            .await
    };
    match item.kind {
        SweepKind::Expired if stopping().await? => {
            close(
                "cancelled",
                "stopped",
                "the run was asked to stop and the executor did not finish the call in time",
            )
            .await
        }
        SweepKind::Expired => {
            let closed = close(
                "error",
                narad_protocol::engine::CLIENT_EXECUTION_EXPIRED,
                "the client executor did not finish the call before its token expired",
            )
            .await?;
            if closed {
                metrics::counter!("narad_executor_token_expiries_total").increment(1);
            }
            Ok(closed)
        }
        SweepKind::Stopping => {
            close(
                "cancelled",
                "stopped",
                "the run was asked to stop before the call reached its executor",
            )
            .await
        }
        SweepKind::Undelivered if stopping().await? => {
            close(
                "cancelled",
                "stopped",
                "the run was asked to stop before the call reached its executor",
            )
            .await
        }
        SweepKind::Undelivered => {
            close(
                "error",
                narad_protocol::engine::CLIENT_UNAVAILABLE,
                "the run's client executor did not attach in time to take the call",
            )
            .await
        }
        SweepKind::Away => journal.pause_for_executor(t, item).await,
        SweepKind::Back => {
            journal
                .resume_for_executor(
                    t,
                    &item.session_id,
                    &item.root_run_id,
                    &item.run_id,
                    item.wait_id.as_deref().unwrap_or_default(),
                )
                .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        assert!(ExecutorSettings::default().validate().is_ok());
        let zero = ExecutorSettings {
            heartbeat_interval: Duration::ZERO,
            ..ExecutorSettings::default()
        };
        assert!(zero.validate().unwrap_err().contains("heartbeat interval"));
        let flapping = ExecutorSettings {
            heartbeat_interval: Duration::from_secs(30),
            lease_ttl: Duration::from_secs(45),
            ..ExecutorSettings::default()
        };
        assert!(flapping.validate().unwrap_err().contains("two heartbeat"));
    }
}
