//! Who may write what (§7.7, §11.3, §12). The lifecycle rules say whether
//! an event may come next; these say whether its issuer may write it:
//!
//! - a backend's proposal never carries actor provenance (the server
//!   stamps it on the events of commands), resolves an interrupt only with
//!   `expired`, and closes a client tool call only as cancelled under a
//!   stop: a result comes from the executor's finish, and the error closes
//!   of §11.3 (token expired, delivery not accepted) from the server, which
//!   issues the token and delivers the call and so alone knows either;
//! - a person's (or extension's) command never decides `expired`, which is
//!   the backend's expiry;
//! - a client executor's finish under its execution token, and the
//!   server's own sweepers and repair, are bound by the lifecycle rules
//!   alone.
//!
//! The journal checks these inside the append transaction, after
//! [`SessionState::apply`] accepted the event, on the state it left: the
//! tool call's executor and the interrupt's actions are the engine's.

use super::{EXPIRED, SessionState};
use crate::authority::{Actor, Executor, Outcome};
use crate::primitives::RunId;
use crate::rules::{self, Violation};
use crate::wire::{AuthorityBody as B, AuthorityEvent};

/// The code of a client call closed because its token expired (§11.3
/// rule 9): written by the server, once the token it issued has expired.
pub const CLIENT_EXECUTION_EXPIRED: &str = "client_execution_expired";

/// The code of a client call closed because no executor took its delivery
/// in time (§11.3 rule 11): written by the server that delivers.
pub const CLIENT_UNAVAILABLE: &str = "client_unavailable";

/// The code of a client call closed because its delivery could not be
/// made (§11.3 rule 11): written by the server that delivers.
pub const DELIVERY_FAILED: &str = "delivery_failed";

/// Who appends a batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Issuer {
    /// The server itself: its sweepers (executor expiry, absent
    /// executors), the repair of run journals whose runtime is gone, the
    /// bookkeeping of queued starts and cancellations.
    #[default]
    Server,
    /// A backend (an agent runtime) proposing events over the API.
    Backend,
    /// A command, on behalf of the caller it names; the events it builds
    /// carry this actor.
    Command(Actor),
    /// A client executor's finish under its execution token (§11.3).
    Executor,
}

impl SessionState {
    /// Whether `issuer` may write `event`. Call it on the state
    /// [`apply`](Self::apply) left after accepting the event.
    pub fn check_issuer(&self, event: &AuthorityEvent, issuer: &Issuer) -> Result<(), Violation> {
        let id = &event.envelope.event_id;
        match issuer {
            Issuer::Backend => self.check_backend(event),
            Issuer::Command(_) => check_person(event),
            Issuer::Server | Issuer::Executor => Ok(()),
        }
        .map_err(|v| v.at(id))
    }

    fn check_backend(&self, event: &AuthorityEvent) -> Result<(), Violation> {
        let actor = match &event.body {
            B::InterruptResolved(b) => b.actor.is_some(),
            B::RunStopRequested(b) => b.actor.is_some(),
            B::MessageUserRecorded(b) => b.actor.is_some(),
            _ => false,
        };
        if actor {
            return Err(Violation::new(
                rules::ISSUER_ACTOR,
                "actor provenance is stamped by the server on the events of commands; \
                 omit actor from a proposed event",
            )
            .field("/actor"));
        }
        match &event.body {
            B::InterruptResolved(b) if b.decision.as_str() != EXPIRED => Err(Violation::new(
                rules::ISSUER_BACKEND_DECISION,
                format!(
                    "a backend resolves an interrupt only with {EXPIRED:?} (its expiry); \
                     {:?} is a person's decision, sent as the resolve-interrupt command",
                    b.decision.as_str()
                ),
            )
            .field("/decision")),
            B::ToolCallFinished(b) => {
                let Some(call) = self.tool_calls.get(&b.tool_call_id) else {
                    return Ok(());
                };
                if call.executor != Executor::Client {
                    return Ok(());
                }
                let refuse = |problem: String, field: &str| {
                    Err(Violation::new(
                        rules::ISSUER_CLIENT_RESULT,
                        format!(
                            "tool call {} is executed by the client: {problem}",
                            b.tool_call_id
                        ),
                    )
                    .field(field))
                };
                match b.outcome {
                    Outcome::Success => {
                        return refuse(
                            "its result comes only from the executor's finish under its \
                             execution token, not from a backend"
                                .to_owned(),
                            "/outcome",
                        );
                    }
                    Outcome::Cancelled if !self.stopping(&call.run_id) => {
                        return refuse(
                            format!(
                                "a backend cancels it only after a stop of run {} (or of a run \
                                 above it)",
                                call.run_id
                            ),
                            "/outcome",
                        );
                    }
                    Outcome::Error => {
                        return refuse(
                            format!(
                                "its error closes belong to the server, which issues its token \
                                 and delivers it: {CLIENT_EXECUTION_EXPIRED:?} once the token \
                                 expires, {CLIENT_UNAVAILABLE:?} or {DELIVERY_FAILED:?} when \
                                 delivery is not accepted (§11.3 rules 9 and 11); a backend \
                                 closes it only as cancelled under a stop"
                            ),
                            "/outcome",
                        );
                    }
                    Outcome::Cancelled => {}
                }
                if !b.response.is_null() {
                    return refuse(
                        "a backend closing it has no result to give: send response null".to_owned(),
                        "/response",
                    );
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Whether a stop was requested of the run or of a run above it.
    fn stopping(&self, run_id: &RunId) -> bool {
        let mut at = Some(run_id);
        while let Some(run) = at.and_then(|r| self.runs.get(r)) {
            if run.stop_requested {
                return true;
            }
            at = run.parent_run_id.as_ref();
        }
        false
    }
}

/// A person's (or extension's) resolution never decides `expired`. Its
/// members may report some as expired (a pack partly decided when they
/// lapsed); the fold then decides `deny`, never `expired` (§7.7).
fn check_person(event: &AuthorityEvent) -> Result<(), Violation> {
    match &event.body {
        B::InterruptResolved(b) if b.decision.as_str() == EXPIRED => Err(Violation::new(
            rules::ISSUER_PERSON_EXPIRED,
            format!(
                "{EXPIRED:?} is the backend's decision when an interrupt expires (§7.7); \
                 decide one of the request's actions"
            ),
        )
        .field("/decision")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Classified, Reader, WireObject};
    use serde_json::{Value, json};

    fn parse_authority(v: &Value) -> AuthorityEvent {
        match Reader::all_profiles().classify(v) {
            Ok(Classified::Accepted(o)) => match *o {
                WireObject::Authority(e) => e,
                other => panic!("not authority: {other:?}"),
            },
            other => panic!("not accepted: {other:?}"),
        }
    }

    fn ev(seq: u64, run_seq: u64, ty: &str, extra: Value) -> AuthorityEvent {
        let mut e = json!({
            "protocolVersion": "narad/v1", "type": ty, "eventId": format!("e{seq}"),
            "timestamp": "2026-08-05T04:00:00Z", "sessionId": "s", "sessionSequence": seq,
            "rootRunId": "r", "runId": "r", "sequence": run_seq,
        });
        for (k, v) in extra.as_object().unwrap() {
            e[k] = v.clone();
        }
        parse_authority(&e)
    }

    /// A run bound to an executor with a client call open.
    fn with_client_call() -> SessionState {
        let mut s = SessionState::new();
        for e in [
            ev(1, 1, "run.started", json!({"clientExecutorId": "desk"})),
            ev(
                2,
                2,
                "tool.call.started",
                json!({"toolCallId": "c", "toolName": "t", "executor": "client", "args": {}}),
            ),
        ] {
            s.apply(&e).unwrap();
        }
        s
    }

    fn finish_at(seq: u64, extra: Value) -> AuthorityEvent {
        let mut body = json!({"toolCallId": "c", "response": null});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        ev(seq, seq, "tool.call.finished", body)
    }

    fn finish(extra: Value) -> AuthorityEvent {
        finish_at(3, extra)
    }

    fn verdict(s: &SessionState, e: &AuthorityEvent, issuer: &Issuer) -> Result<(), &'static str> {
        let mut after = s.clone();
        after.apply(e).expect("the lifecycle rules accept it");
        after.check_issuer(e, issuer).map_err(|v| v.rule)
    }

    #[test]
    fn a_backend_gives_no_client_result_but_may_cancel_under_a_stop_or_expire() {
        let s = with_client_call();
        let b = Issuer::Backend;
        let success = finish(json!({"outcome": "success", "response": {"ok": true}}));
        assert_eq!(
            verdict(&s, &success, &b),
            Err(rules::ISSUER_CLIENT_RESULT.id)
        );
        assert_eq!(verdict(&s, &success, &Issuer::Executor), Ok(()));
        let cancelled = finish(json!({"outcome": "cancelled"}));
        assert_eq!(
            verdict(&s, &cancelled, &b),
            Err(rules::ISSUER_CLIENT_RESULT.id)
        );
        let mut stopped = s.clone();
        stopped
            .apply(&ev(3, 3, "run.stop.requested", json!({"targetRunId": "r"})))
            .unwrap();
        let cancelled = finish_at(4, json!({"outcome": "cancelled"}));
        assert_eq!(verdict(&stopped, &cancelled, &b), Ok(()));
        // The error closes of §11.3 are the server's, which issues the
        // token and delivers the call; a backend writes none of them.
        for code in [
            CLIENT_EXECUTION_EXPIRED,
            CLIENT_UNAVAILABLE,
            DELIVERY_FAILED,
            "oops",
        ] {
            let closed = finish(json!({"outcome": "error", "code": code}));
            assert_eq!(
                verdict(&s, &closed, &b),
                Err(rules::ISSUER_CLIENT_RESULT.id),
                "{code}"
            );
            assert_eq!(verdict(&s, &closed, &Issuer::Server), Ok(()), "{code}");
        }
        let with_response = finish_at(4, json!({"outcome": "cancelled", "response": 1}));
        assert_eq!(
            verdict(&stopped, &with_response, &b),
            Err(rules::ISSUER_CLIENT_RESULT.id)
        );
    }

    #[test]
    fn decisions_belong_to_people_and_expiry_to_the_backend() {
        let mut s = SessionState::new();
        for e in [
            ev(1, 1, "run.started", json!({})),
            ev(
                2,
                2,
                "interrupt.requested",
                json!({"interruptId": "i", "waitId": "w",
                "kind": "k", "actions": ["approve", "deny"]}),
            ),
            ev(
                3,
                3,
                "run.paused",
                json!({"waitId": "w", "interruptId": "i",
                "reason": "interrupt", "resumeMode": "command"}),
            ),
        ] {
            s.apply(&e).unwrap();
        }
        let resolve = |decision: &str, extra: Value| {
            let mut body = json!({"interruptId": "i", "waitId": "w", "decision": decision});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            ev(4, 4, "interrupt.resolved", body)
        };
        let actor = json!({"actor": {"kind": "user", "sub": "alice"}});
        let person = Issuer::Command(serde_json::from_value(actor["actor"].clone()).unwrap());
        let b = Issuer::Backend;
        assert_eq!(
            verdict(&s, &resolve("approve", json!({})), &b),
            Err(rules::ISSUER_BACKEND_DECISION.id)
        );
        assert_eq!(verdict(&s, &resolve("expired", json!({})), &b), Ok(()));
        assert_eq!(
            verdict(&s, &resolve("expired", actor.clone()), &b),
            Err(rules::ISSUER_ACTOR.id)
        );
        assert_eq!(
            verdict(&s, &resolve("approve", actor.clone()), &person),
            Ok(())
        );
        assert_eq!(
            verdict(&s, &resolve("expired", actor), &person),
            Err(rules::ISSUER_PERSON_EXPIRED.id)
        );
        assert_eq!(
            verdict(&s, &resolve("approve", json!({})), &Issuer::Server),
            Ok(())
        );
    }
}
