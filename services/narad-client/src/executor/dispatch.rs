//! What a delivery may do, and doing it.
//!
//! [`decide`] is the whole policy of §11.3 as a pure function of the
//! delivery, the connection's lease, the clock and what the token store
//! holds; [`Core`] carries the decision out (accept, run, record, ask for
//! the finish).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use narad_protocol::control::ClientToolExecute;
use narad_protocol::primitives::{ClientExecutorId, ExecutionToken, LeaseId};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::task::TaskTracker;

use super::finish::FinishRequest;
use super::store::{AcceptedToken, StoreError, TokenEntry, TokenStore};
use super::{ExecutorStats, Handler, ToolResult, blocking, bump, codes};

/// Why a delivery is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It names another clientExecutorId.
    Misaddressed,
    /// Its lease is not the connection's current one: a superseded lease
    /// accepts no new executions (§11.1).
    StaleLease,
    /// Its token has expired.
    Expired,
    /// The token store could not be read: without its word, running could
    /// repeat a side effect, so the token is left to expire.
    StoreFailed,
}

/// What to do with one `client.tool.execute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Accept nothing, run nothing.
    Refuse(Refusal),
    /// A new token for a known tool: accept it durably, then run it.
    Execute,
    /// A new token for a tool without a handler: accept it and finish it
    /// with `unknown_tool`, running nothing.
    UnknownTool,
    /// A known token with a stored result not yet final: resend the finish.
    Resend,
    /// A known token whose tool is running in this process: nothing to do.
    StillRunning,
    /// A known token accepted without a result and not running here: an
    /// earlier process stopped mid-call. Finish it `client_restarted`.
    Orphaned,
    /// A known token whose finish already had a definite answer.
    AlreadyFinal,
}

/// Decides what a delivery may do.
///
/// `known` is what the store holds about its token, `running_here` whether
/// this process is running it, `has_tool` whether a handler is registered
/// for its toolName.
pub(crate) fn decide(
    execute: &ClientToolExecute,
    me: &ClientExecutorId,
    current_lease: &LeaseId,
    now: DateTime<Utc>,
    known: Option<&TokenEntry>,
    running_here: bool,
    has_tool: bool,
) -> Decision {
    if &execute.client_executor_id != me {
        return Decision::Refuse(Refusal::Misaddressed);
    }
    // A token the store holds never runs again, whatever the lease: only
    // its finish may go (again), under the lease it was delivered under.
    if let Some(entry) = known {
        return match (&entry.result, entry.is_final) {
            (_, true) => Decision::AlreadyFinal,
            (Some(_), false) => Decision::Resend,
            (None, false) if running_here => Decision::StillRunning,
            (None, false) => Decision::Orphaned,
        };
    }
    if &execute.lease_id != current_lease {
        return Decision::Refuse(Refusal::StaleLease);
    }
    if execute.execution_token_expires_at.to_utc() <= now {
        return Decision::Refuse(Refusal::Expired);
    }
    if has_tool {
        Decision::Execute
    } else {
        Decision::UnknownTool
    }
}

/// The result recorded for a token an earlier process left running.
pub(crate) fn restarted_result() -> ToolResult {
    ToolResult::error(
        codes::CLIENT_RESTARTED,
        "the client executor restarted while the tool was running; it may or may not have taken effect",
    )
}

/// Carries out decisions: the executor's tools, its store, the tokens
/// running in this process and the queue of finishes to send.
pub(crate) struct Core {
    id: ClientExecutorId,
    tools: HashMap<String, Handler>,
    store: Arc<dyn TokenStore>,
    running: Mutex<HashSet<ExecutionToken>>,
    tasks: TaskTracker,
    pub(crate) stats: ExecutorStats,
    finishes: UnboundedSender<FinishRequest>,
}

impl Core {
    pub(crate) fn new(
        id: ClientExecutorId,
        tools: HashMap<String, Handler>,
        store: Arc<dyn TokenStore>,
        stats: ExecutorStats,
        finishes: UnboundedSender<FinishRequest>,
    ) -> Core {
        Core {
            id,
            tools,
            store,
            running: Mutex::new(HashSet::new()),
            tasks: TaskTracker::new(),
            stats,
            finishes,
        }
    }

    pub(crate) fn id(&self) -> &ClientExecutorId {
        &self.id
    }

    /// The queue of finishes to send.
    pub(crate) fn finishes_sender(&self) -> &UnboundedSender<FinishRequest> {
        &self.finishes
    }

    fn running(&self) -> MutexGuard<'_, HashSet<ExecutionToken>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// At start-up, before any delivery: records `client_restarted` for
    /// every token an earlier process accepted without recording a result
    /// (their finishes go out with the other pending ones). Returns how
    /// many there were.
    pub(crate) async fn recover(&self) -> Result<usize, StoreError> {
        blocking(&self.store, |store| {
            let orphans: Vec<_> = store
                .pending()?
                .into_iter()
                .filter(|e| e.result.is_none())
                .collect();
            for entry in &orphans {
                store.record_result(&entry.accepted.execution_token, &restarted_result())?;
            }
            Ok(orphans.len())
        })
        .await
        .inspect(|n| {
            let counter = &self.stats.counters.restarted_recovered;
            counter.fetch_add(*n as u64, std::sync::atomic::Ordering::Relaxed);
        })
    }

    /// Handles one delivery received under `current_lease`; returns what
    /// was decided. The caller awaits it before reading the next frame, so
    /// deliveries are handled one at a time.
    #[tracing::instrument(skip_all, fields(
        tool_call_id = %execute.tool_call_id,
        tool_name = %execute.tool_name,
        lease_id = %execute.lease_id,
    ))]
    pub(crate) async fn deliver(
        self: &Arc<Self>,
        execute: ClientToolExecute,
        current_lease: &LeaseId,
    ) -> Decision {
        let token = execute.execution_token.clone();
        let known = {
            let token = token.clone();
            blocking(&self.store, move |s| s.get(&token)).await
        };
        let known = match known {
            Ok(k) => k,
            Err(e) => {
                bump(&self.stats.counters.store_errors);
                tracing::error!(error = %e, "token store unreadable; delivery not accepted");
                return Decision::Refuse(Refusal::StoreFailed);
            }
        };
        let running_here = self.running().contains(&token);
        let has_tool = self.tools.contains_key(execute.tool_name.as_str());
        let decision = decide(
            &execute,
            &self.id,
            current_lease,
            Utc::now(),
            known.as_ref(),
            running_here,
            has_tool,
        );
        let counters = &self.stats.counters;
        match decision {
            Decision::Refuse(refusal) => {
                let counter = match refusal {
                    Refusal::Misaddressed => &counters.misaddressed_refused,
                    Refusal::StaleLease => &counters.stale_lease_refused,
                    Refusal::Expired => &counters.expired_refused,
                    Refusal::StoreFailed => &counters.store_errors,
                };
                bump(counter);
                tracing::warn!(?refusal, current_lease = %current_lease, "delivery not accepted");
            }
            Decision::Execute => {
                if self.accept(&execute).await {
                    self.running().insert(token.clone());
                    bump(&counters.executions_started);
                    tracing::info!("running tool");
                    self.spawn_handler(execute);
                }
            }
            Decision::UnknownTool => {
                bump(&counters.unknown_tools);
                tracing::warn!("no handler for this tool; answering unknown_tool");
                if self.accept(&execute).await {
                    let result = ToolResult::error(
                        codes::UNKNOWN_TOOL,
                        format!("this executor has no tool {:?}", execute.tool_name.as_str()),
                    );
                    self.record_and_finish(token, result).await;
                }
            }
            Decision::Resend => {
                bump(&counters.duplicate_deliveries);
                tracing::info!("duplicate delivery of a finished token; resending its finish");
                let _ = self.finishes.send(FinishRequest::One(token));
            }
            Decision::StillRunning | Decision::AlreadyFinal => {
                bump(&counters.duplicate_deliveries);
                tracing::info!(?decision, "duplicate delivery; not run again");
            }
            Decision::Orphaned => {
                bump(&counters.duplicate_deliveries);
                bump(&counters.restarted_recovered);
                tracing::warn!("a token accepted earlier never got a result; client_restarted");
                self.record_and_finish(token, restarted_result()).await;
            }
        }
        decision
    }

    /// Records the token as accepted; `false` (nothing may run) when the
    /// store already held it or could not record it.
    async fn accept(&self, execute: &ClientToolExecute) -> bool {
        let accepted = AcceptedToken::from(execute);
        match blocking(&self.store, move |s| s.accept(&accepted)).await {
            Ok(true) => true,
            Ok(false) => {
                bump(&self.stats.counters.duplicate_deliveries);
                tracing::info!("the token was already accepted; not run again");
                false
            }
            Err(e) => {
                bump(&self.stats.counters.store_errors);
                tracing::error!(error = %e, "could not record the token as accepted; not running");
                false
            }
        }
    }

    /// Runs the handler in its own task (a panic becomes a
    /// `tool_panicked` error), then records the result and asks for the
    /// finish.
    fn spawn_handler(self: &Arc<Self>, execute: ClientToolExecute) {
        let handler = self.tools[execute.tool_name.as_str()].clone();
        let core = self.clone();
        let token = execute.execution_token;
        let span = tracing::Span::current();
        self.tasks.spawn(async move {
            let result = match tokio::spawn(handler(execute.args)).await {
                Ok(result) => result,
                Err(e) => {
                    tracing::error!(parent: &span, error = %e, "the tool's handler failed");
                    ToolResult::error(codes::TOOL_PANICKED, "the tool's handler failed")
                }
            };
            bump(&core.stats.counters.executions_finished);
            tracing::info!(parent: &span, outcome = ?result.outcome, "tool finished");
            core.record_and_finish(token.clone(), result).await;
            core.running().remove(&token);
        });
    }

    /// Stores the result, then asks for the finish. When the result cannot
    /// be stored nothing is sent: the token stays accepted without a
    /// result, and the next start finishes it `client_restarted`.
    async fn record_and_finish(&self, token: ExecutionToken, result: ToolResult) {
        let t = token.clone();
        match blocking(&self.store, move |s| s.record_result(&t, &result)).await {
            Ok(()) => {
                let _ = self.finishes.send(FinishRequest::One(token));
            }
            Err(e) => {
                bump(&self.stats.counters.store_errors);
                tracing::error!(error = %e, "could not store the tool's result");
            }
        }
    }

    /// Waits until no handler runs; no new one starts after this is called.
    pub(crate) async fn wait_idle(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::MemoryTokenStore;
    use narad_protocol::authority::Outcome;
    use narad_protocol::primitives::Timestamp;
    use serde_json::json;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;
    use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

    const FUTURE: &str = "2999-01-01T00:00:00Z";
    const PAST: &str = "2000-01-01T00:00:00Z";

    fn execute(token: &str, lease: &str, tool: &str, expires_at: &str) -> ClientToolExecute {
        serde_json::from_value(json!({
            "clientExecutorId": "exec-1",
            "leaseId": lease,
            "executionToken": token,
            "executionTokenExpiresAt": expires_at,
            "toolCallId": format!("tc-{token}"),
            "toolName": tool,
            "args": {"n": 1},
        }))
        .unwrap()
    }

    fn me() -> ClientExecutorId {
        ClientExecutorId::new("exec-1").unwrap()
    }

    fn lease(s: &str) -> LeaseId {
        LeaseId::new(s).unwrap()
    }

    fn entry(e: &ClientToolExecute, result: Option<ToolResult>, is_final: bool) -> TokenEntry {
        TokenEntry {
            accepted: AcceptedToken::from(e),
            result,
            is_final,
        }
    }

    #[test]
    fn a_new_token_under_the_current_lease_runs() {
        let e = execute("t1", "L1", "echo", FUTURE);
        let d = decide(&e, &me(), &lease("L1"), Utc::now(), None, false, true);
        assert_eq!(d, Decision::Execute);
    }

    #[test]
    fn a_delivery_under_a_superseded_lease_is_not_run() {
        let e = execute("t1", "L1", "echo", FUTURE);
        let d = decide(&e, &me(), &lease("L2"), Utc::now(), None, false, true);
        assert_eq!(d, Decision::Refuse(Refusal::StaleLease));
    }

    #[test]
    fn an_expired_token_is_not_run() {
        let e = execute("t1", "L1", "echo", PAST);
        let d = decide(&e, &me(), &lease("L1"), Utc::now(), None, false, true);
        assert_eq!(d, Decision::Refuse(Refusal::Expired));
        let at_expiry = Timestamp::parse(FUTURE).unwrap().to_utc();
        let e = execute("t2", "L1", "echo", FUTURE);
        let d = decide(&e, &me(), &lease("L1"), at_expiry, None, false, true);
        assert_eq!(d, Decision::Refuse(Refusal::Expired));
    }

    #[test]
    fn a_delivery_for_another_executor_is_not_run() {
        let e = execute("t1", "L1", "echo", FUTURE);
        let other = ClientExecutorId::new("exec-2").unwrap();
        let d = decide(&e, &other, &lease("L1"), Utc::now(), None, false, true);
        assert_eq!(d, Decision::Refuse(Refusal::Misaddressed));
    }

    #[test]
    fn an_unknown_tool_is_answered_without_running() {
        let e = execute("t1", "L1", "rm.rf", FUTURE);
        let d = decide(&e, &me(), &lease("L1"), Utc::now(), None, false, false);
        assert_eq!(d, Decision::UnknownTool);
    }

    #[test]
    fn a_known_token_never_runs_again() {
        let e = execute("t1", "L1", "echo", FUTURE);
        let now = Utc::now();
        let l1 = lease("L1");
        let running = entry(&e, None, false);
        assert_eq!(
            decide(&e, &me(), &l1, now, Some(&running), true, true),
            Decision::StillRunning
        );
        assert_eq!(
            decide(&e, &me(), &l1, now, Some(&running), false, true),
            Decision::Orphaned
        );
        let done = entry(&e, Some(ToolResult::ok(json!(1))), false);
        assert_eq!(
            decide(&e, &me(), &l1, now, Some(&done), false, true),
            Decision::Resend
        );
        // Even after a reconnect, under another lease: the finish may go,
        // the tool does not run.
        assert_eq!(
            decide(&e, &me(), &lease("L2"), now, Some(&done), false, true),
            Decision::Resend
        );
        let answered = entry(&e, Some(ToolResult::ok(json!(1))), true);
        assert_eq!(
            decide(&e, &me(), &l1, now, Some(&answered), false, true),
            Decision::AlreadyFinal
        );
    }

    /// A core with one `echo` tool that counts its runs, and the queue of
    /// finishes it asks for.
    fn core(
        store: Arc<MemoryTokenStore>,
        gate: Option<Arc<tokio::sync::Semaphore>>,
    ) -> (Arc<Core>, Arc<AtomicU64>, UnboundedReceiver<FinishRequest>) {
        let runs = Arc::new(AtomicU64::new(0));
        let counted = runs.clone();
        let handler: Handler = Arc::new(move |args| {
            let counted = counted.clone();
            let gate = gate.clone();
            Box::pin(async move {
                counted.fetch_add(1, Ordering::SeqCst);
                if let Some(gate) = gate {
                    let _ = gate.acquire().await;
                }
                ToolResult::ok(args.into())
            })
        });
        let panics: Handler = Arc::new(|_| Box::pin(async { panic!("tool bug") }));
        let tools = HashMap::from([("echo".to_owned(), handler), ("panics".to_owned(), panics)]);
        let (tx, rx) = unbounded_channel();
        let core = Core::new(me(), tools, store, ExecutorStats::default(), tx);
        (Arc::new(core), runs, rx)
    }

    async fn next_finish(rx: &mut UnboundedReceiver<FinishRequest>) -> ExecutionToken {
        let request = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a finish within 5 s")
            .expect("the queue is open");
        match request {
            FinishRequest::One(token) => token,
            _ => panic!("expected a finish of one token"),
        }
    }

    #[tokio::test]
    async fn duplicate_delivery_never_runs_the_handler_twice() {
        let store = Arc::new(MemoryTokenStore::new());
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (core, runs, mut finishes) = core(store.clone(), Some(gate.clone()));
        let l1 = lease("L1");
        let e = execute("t1", "L1", "echo", FUTURE);

        assert_eq!(core.deliver(e.clone(), &l1).await, Decision::Execute);
        // Delivered again while running: nothing.
        assert_eq!(core.deliver(e.clone(), &l1).await, Decision::StillRunning);
        gate.add_permits(1);
        assert_eq!(next_finish(&mut finishes).await, e.execution_token);
        core.wait_idle().await;
        let stored = store.get(&e.execution_token).unwrap().unwrap();
        assert_eq!(stored.result, Some(ToolResult::ok(json!({"n": 1}))));

        // Delivered again once finished, even under a new lease: the
        // finish is resent, the tool does not run.
        let l2 = lease("L2");
        assert_eq!(core.deliver(e.clone(), &l2).await, Decision::Resend);
        assert_eq!(next_finish(&mut finishes).await, e.execution_token);
        store.mark_final(&e.execution_token).unwrap();
        assert_eq!(core.deliver(e, &l2).await, Decision::AlreadyFinal);

        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let stats = core.stats.snapshot();
        assert_eq!(stats.executions_started, 1);
        assert_eq!(stats.duplicate_deliveries, 3);
        assert!(finishes.try_recv().is_err());
    }

    #[tokio::test]
    async fn stale_and_expired_deliveries_are_not_accepted() {
        let store = Arc::new(MemoryTokenStore::new());
        let (core, runs, mut finishes) = core(store.clone(), None);
        let stale = execute("t1", "L1", "echo", FUTURE);
        assert_eq!(
            core.deliver(stale.clone(), &lease("L2")).await,
            Decision::Refuse(Refusal::StaleLease)
        );
        let expired = execute("t2", "L2", "echo", PAST);
        assert_eq!(
            core.deliver(expired.clone(), &lease("L2")).await,
            Decision::Refuse(Refusal::Expired)
        );
        core.wait_idle().await;
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        assert!(store.get(&stale.execution_token).unwrap().is_none());
        assert!(store.get(&expired.execution_token).unwrap().is_none());
        assert!(finishes.try_recv().is_err());
        let stats = core.stats.snapshot();
        assert_eq!((stats.stale_lease_refused, stats.expired_refused), (1, 1));
    }

    #[tokio::test]
    async fn an_unknown_tool_is_finished_unknown_tool_once() {
        let store = Arc::new(MemoryTokenStore::new());
        let (core, runs, mut finishes) = core(store.clone(), None);
        let l1 = lease("L1");
        let e = execute("t1", "L1", "format.disk", FUTURE);
        assert_eq!(core.deliver(e.clone(), &l1).await, Decision::UnknownTool);
        assert_eq!(next_finish(&mut finishes).await, e.execution_token);
        let result = store.get(&e.execution_token).unwrap().unwrap().result;
        let result = result.expect("a stored result");
        assert_eq!(result.outcome, Outcome::Error);
        assert_eq!(result.code.unwrap().as_str(), codes::UNKNOWN_TOOL);
        assert_eq!(core.deliver(e, &l1).await, Decision::Resend);
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_panicking_tool_is_finished_as_an_error() {
        let store = Arc::new(MemoryTokenStore::new());
        let (core, _, mut finishes) = core(store.clone(), None);
        let e = execute("t1", "L1", "panics", FUTURE);
        assert_eq!(
            core.deliver(e.clone(), &lease("L1")).await,
            Decision::Execute
        );
        assert_eq!(next_finish(&mut finishes).await, e.execution_token);
        let result = store.get(&e.execution_token).unwrap().unwrap().result;
        assert_eq!(result.unwrap().code.unwrap().as_str(), codes::TOOL_PANICKED);
    }

    #[tokio::test]
    async fn a_restart_mid_call_finishes_client_restarted_without_running() {
        let store = Arc::new(MemoryTokenStore::new());
        let e = execute("t1", "L1", "echo", FUTURE);
        // An earlier process accepted the token and died.
        store.accept(&AcceptedToken::from(&e)).unwrap();
        let (core, runs, mut finishes) = core(store.clone(), None);
        assert_eq!(core.recover().await.unwrap(), 1);
        let entry = store.get(&e.execution_token).unwrap().unwrap();
        let result = entry.result.expect("a result is recorded at start-up");
        assert_eq!(result.outcome, Outcome::Error);
        assert_eq!(result.code.unwrap().as_str(), codes::CLIENT_RESTARTED);
        assert_eq!(entry.accepted.lease_id, lease("L1"), "its original lease");
        // Delivered again to the new process, under its new lease: the
        // finish is resent, the tool does not run.
        assert_eq!(
            core.deliver(e.clone(), &lease("L2")).await,
            Decision::Resend
        );
        assert_eq!(next_finish(&mut finishes).await, e.execution_token);
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        assert_eq!(core.stats.snapshot().restarted_recovered, 1);
    }

    #[tokio::test]
    async fn an_accepted_token_found_without_result_is_finished_when_redelivered() {
        let store = Arc::new(MemoryTokenStore::new());
        let (core, runs, mut finishes) = core(store.clone(), None);
        let e = execute("t1", "L1", "echo", FUTURE);
        // Accepted by a process that died after this one started.
        store.accept(&AcceptedToken::from(&e)).unwrap();
        assert_eq!(
            core.deliver(e.clone(), &lease("L1")).await,
            Decision::Orphaned
        );
        assert_eq!(next_finish(&mut finishes).await, e.execution_token);
        let result = store.get(&e.execution_token).unwrap().unwrap().result;
        assert_eq!(
            result.unwrap().code.unwrap().as_str(),
            codes::CLIENT_RESTARTED
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}
