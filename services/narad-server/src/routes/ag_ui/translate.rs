//! narad events of one run, as AG-UI 1.0 events: what each maps to, what
//! is open (text and reasoning messages, tool calls, steps) so that it is
//! closed before `RUN_FINISHED` (the client refuses a run that finishes
//! with anything open), and when the AG-UI run ends.

use std::collections::{BTreeMap, HashMap, HashSet};

use ag_ui::{
    Event, Interrupt, JsonObject, PatchOperation, RunErrorEvent, RunFinishedEvent, RunOutcome,
    TextMessageRole, TokenUsage,
};
use serde_json::{Value, json};

use super::thread::{result_message_id, tool_content, user_content};

/// How an AG-UI run ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// `RUN_FINISHED` with this outcome and usage.
    Finished(RunOutcome, Vec<TokenUsage>),
    /// `RUN_ERROR`.
    Error {
        /// The narad code.
        code: String,
        /// The message.
        message: String,
    },
}

/// The translation of one AG-UI run's stream.
#[derive(Debug)]
pub struct Translator {
    /// The narad run (its own root) streamed.
    run_id: String,
    /// Message ids the client holds already (its input's).
    known: HashSet<String>,
    /// Tool calls the client answered itself: their results are not sent.
    answered: HashSet<String>,
    /// The names of the client's tools.
    client_tools: HashSet<String>,
    /// The state scope that is AG-UI's state.
    state_scope: String,
    /// Roles of the text messages seen (to reopen one).
    roles: HashMap<String, TextMessageRole>,
    open_text: BTreeMap<String, ()>,
    open_reasoning: BTreeMap<String, ()>,
    /// Open steps: progressId → stepName.
    steps: BTreeMap<String, String>,
    /// Client tool calls sent and not answered.
    pending: Vec<String>,
    /// Interrupts asked in this stream: interruptId → request.
    asked: HashMap<String, Value>,
}

/// `{"narad": value}`, the only place narad's extras go.
pub fn narad(value: Value) -> JsonObject {
    let mut m = JsonObject::new();
    m.insert("narad".to_owned(), value);
    m
}

/// The AG-UI role of a narad text message role.
fn role(narad: &str) -> TextMessageRole {
    match narad {
        "system" => TextMessageRole::System,
        "user" => TextMessageRole::User,
        _ => TextMessageRole::Assistant,
    }
}

/// narad usage as AG-UI usage: the counters AG-UI names; nothing when
/// none is given.
fn usage(e: &Value) -> Vec<TokenUsage> {
    let Some(u) = e["usage"].as_object() else {
        return Vec::new();
    };
    let n = |k: &str| u.get(k).and_then(Value::as_f64).map(|v| v as u64);
    let mut t = TokenUsage::new();
    t.input_tokens = n("inputTokens");
    t.output_tokens = n("outputTokens");
    t.total_tokens = n("totalTokens");
    t.reasoning_tokens = n("reasoningTokens");
    t.cached_input_tokens = n("cachedInputTokens");
    if t == TokenUsage::new() {
        Vec::new()
    } else {
        vec![t]
    }
}

/// The AG-UI interrupt of a narad `interrupt.requested`.
pub fn interrupt(asked: &Value) -> Interrupt {
    let text = |k: &str| asked[k].as_str().map(str::to_owned);
    let mut i = Interrupt::new(
        text("interruptId").unwrap_or_default(),
        text("kind").unwrap_or_else(|| "narad:interrupt".to_owned()),
    );
    i.message = text("message").or_else(|| text("title"));
    i.expires_at = text("expiresAt");
    i.tool_call_id = asked["input"]["toolCallId"].as_str().map(Into::into);
    let schema = json!({
        "type": "object",
        "properties": {
            "decision": {"enum": asked["actions"]},
            "reason": {"type": "string"},
        },
        "required": ["decision"],
    });
    i.response_schema = schema.as_object().cloned();
    let mut extra = json!({
        "waitId": asked["waitId"], "kind": asked["kind"], "actions": asked["actions"],
    });
    for k in ["title", "input", "scope"] {
        if let Some(v) = asked.get(k).filter(|v| !v.is_null()) {
            extra[k] = v.clone();
        }
    }
    i.metadata = Some(narad(extra));
    i
}

impl Translator {
    /// The translation of narad run `run_id` for a client holding the
    /// messages `known`, whose tools are `client_tools`, and which answered
    /// the tool calls `answered` itself.
    pub fn new(
        run_id: &str,
        known: HashSet<String>,
        answered: HashSet<String>,
        client_tools: HashSet<String>,
        state_scope: &str,
    ) -> Translator {
        Translator {
            run_id: run_id.to_owned(),
            known,
            answered,
            client_tools,
            state_scope: state_scope.to_owned(),
            roles: HashMap::new(),
            open_text: BTreeMap::new(),
            open_reasoning: BTreeMap::new(),
            steps: BTreeMap::new(),
            pending: Vec::new(),
            asked: HashMap::new(),
        }
    }

    /// Knows a request asked before the stream began (an interrupt the run
    /// waits on, for a rejoin).
    pub fn remember(&mut self, asked: &Value) {
        if let Some(id) = asked["interruptId"].as_str() {
            self.asked.insert(id.to_owned(), asked.clone());
        }
    }

    /// Reopens text message `id` (a rejoin: the snapshot holds what came
    /// so far, the rest follows).
    pub fn reopen(&mut self, id: &str, narad_role: &str, out: &mut Vec<Event>) {
        self.roles.insert(id.to_owned(), role(narad_role));
        self.open_text.insert(id.to_owned(), ());
        out.push(Event::text_message_start(id, role(narad_role)));
    }

    /// Client calls sent and awaiting their answers (a rejoin lists the
    /// run's open ones).
    pub fn pending(&mut self, ids: impl IntoIterator<Item = String>) {
        self.pending.extend(ids);
    }

    /// The pending client calls, when the AG-UI run must end for them
    /// (checked after each batch of events: parallel calls come together).
    pub fn awaiting_client(&self) -> Option<Ending> {
        (!self.pending.is_empty()).then(|| {
            Ending::Finished(
                RunOutcome::success_with_pending_tool_calls(self.pending.clone()),
                Vec::new(),
            )
        })
    }

    fn ours(&self, e: &Value) -> bool {
        match e["rootRunId"].as_str() {
            Some(root) => root == self.run_id,
            // Session-scoped events (no run): for every viewer.
            None => e.get("workflowId").is_none(),
        }
    }

    fn text_open(&mut self, id: &str, out: &mut Vec<Event>) {
        if !self.open_text.contains_key(id) {
            let r = self
                .roles
                .get(id)
                .copied()
                .unwrap_or(TextMessageRole::Assistant);
            self.open_text.insert(id.to_owned(), ());
            out.push(Event::text_message_start(id, r));
        }
    }

    fn reasoning_open(&mut self, id: &str, out: &mut Vec<Event>) {
        if !self.open_reasoning.contains_key(id) {
            self.open_reasoning.insert(id.to_owned(), ());
            out.push(Event::reasoning_start(id));
            out.push(Event::reasoning_message_start(id));
        }
    }

    /// Translates one narad event into `out`; `Some` when the AG-UI run
    /// ends with it.
    pub fn event(&mut self, e: &Value, out: &mut Vec<Event>) -> Option<Ending> {
        if !self.ours(e) {
            return None;
        }
        let text = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
        let ty = e["type"].as_str().unwrap_or_default();
        match ty {
            "run.started" | "run.resumed" | "state.compacted" => {}
            "message.user.recorded" => {
                let id = text("messageId");
                if self.known.insert(id.clone()) {
                    // Said elsewhere (another page, the console) mid-run.
                    let content = match user_content(&e["content"]) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    out.push(Event::text_message_start(
                        id.as_str(),
                        TextMessageRole::User,
                    ));
                    out.push(Event::text_message_content(id.as_str(), content));
                    out.push(Event::text_message_end(id.as_str()));
                }
            }
            "message.text.started" => {
                let id = text("messageId");
                self.roles.insert(id.clone(), role(&text("role")));
                self.text_open(id.as_str(), out);
            }
            "message.text.delta" => {
                let id = text("messageId");
                self.text_open(id.as_str(), out);
                out.push(Event::text_message_content(id.as_str(), text("delta")));
            }
            "message.text.completed" => {
                let id = text("messageId");
                if self.open_text.remove(id.as_str()).is_some() {
                    out.push(Event::text_message_end(id.as_str()));
                }
            }
            "reasoning.started" => self.reasoning_open(&text("reasoningId"), out),
            "reasoning.delta" => {
                let id = text("reasoningId");
                self.reasoning_open(id.as_str(), out);
                out.push(Event::reasoning_message_content(id.as_str(), text("delta")));
            }
            "reasoning.completed" => {
                let id = text("reasoningId");
                if self.open_reasoning.remove(id.as_str()).is_some() {
                    out.push(Event::reasoning_message_end(id.as_str()));
                    out.push(Event::reasoning_end(id.as_str()));
                }
            }
            "tool.call.started" => {
                let id = text("toolCallId");
                let name = text("toolName");
                out.push(
                    Event::tool_call_start(id.as_str(), &name)
                        .with_metadata(narad(json!({"executor": e["executor"]}))),
                );
                out.push(Event::tool_call_args(id.as_str(), e["args"].to_string()));
                out.push(Event::tool_call_end(id.as_str()));
                if e["executor"] == "client" && self.client_tools.contains(&name) {
                    self.pending.push(id);
                }
            }
            "tool.call.finished" => {
                let id = text("toolCallId");
                self.pending.retain(|p| *p != id);
                if !self.answered.contains(id.as_str()) {
                    let mut result = Event::tool_call_result(
                        result_message_id(id.as_str()),
                        id.as_str(),
                        tool_content(&e["response"]),
                    );
                    if e["outcome"] != "success" {
                        let mut extra = json!({"outcome": e["outcome"]});
                        for k in ["code", "message"] {
                            if let Some(v) = e.get(k) {
                                extra[k] = v.clone();
                            }
                        }
                        result = result.with_metadata(narad(extra));
                    }
                    out.push(result);
                }
            }
            "progress.recorded" if e["privacy"] == "public" => {
                let id = text("progressId");
                match e["status"].as_str() {
                    Some("active") if !self.steps.contains_key(id.as_str()) => {
                        let label = text("label");
                        let name = if self.steps.values().any(|s| *s == label) {
                            format!("{label} ({id})")
                        } else {
                            label
                        };
                        out.push(Event::step_started(name.as_str()));
                        self.steps.insert(id, name);
                    }
                    Some("active") => {}
                    Some(status) => {
                        if let Some(name) = self.steps.remove(id.as_str()) {
                            out.push(
                                Event::step_finished(name)
                                    .with_metadata(narad(json!({"status": status}))),
                            );
                        }
                    }
                    None => {}
                }
            }
            "progress.recorded" => {}
            "state.snapshot" if e["scope"].as_str() == Some(self.state_scope.as_str()) => {
                out.push(
                    Event::state_snapshot(e["state"].clone())
                        .with_metadata(narad(json!({"revision": e["revision"]}))),
                );
            }
            "state.delta" if e["scope"].as_str() == Some(self.state_scope.as_str()) => {
                match serde_json::from_value::<Vec<PatchOperation>>(e["patch"].clone()) {
                    Ok(patch) => out.push(
                        Event::state_delta(patch)
                            .with_metadata(narad(json!({"revision": e["revision"]}))),
                    ),
                    Err(_) => out.push(Event::custom("narad.state.delta", e.clone())),
                }
            }
            "session.custom" | "run.custom" | "workflow.custom" | "node.custom" => {
                out.push(
                    Event::custom(text("name"), e["value"].clone())
                        .with_metadata(narad(json!({"type": ty}))),
                );
            }
            t if t.ends_with(".raw") => {
                let mut raw = ag_ui::RawEvent::new(e["payload"].clone());
                raw.source = e["contentType"].as_str().map(str::to_owned);
                out.push(Event::Raw(raw).with_metadata(narad(json!({"type": ty}))));
            }
            "interrupt.requested" => {
                self.asked.insert(text("interruptId"), e.clone());
            }
            "run.paused" => {
                if let Some(asked) = e["interruptId"].as_str().and_then(|i| self.asked.get(i)) {
                    let outcome = RunOutcome::interrupt(vec![interrupt(asked)]);
                    return Some(Ending::Finished(outcome, Vec::new()));
                }
                out.push(Event::custom("narad.run.paused", e.clone()));
            }
            "run.finished" | "run.error" | "run.cancelled"
                if e["runId"].as_str() == Some(self.run_id.as_str()) =>
            {
                let u = usage(e);
                return Some(match ty {
                    "run.finished" => Ending::Finished(RunOutcome::Success, u),
                    "run.cancelled" => Ending::Finished(RunOutcome::Cancelled, u),
                    _ => Ending::Error {
                        code: text("code"),
                        message: text("message"),
                    },
                });
            }
            // Nested runs' lifecycle, stops, interrupts decided, artifacts,
            // attachments, views, UI state, other state scopes, redactions:
            // no AG-UI event of their own.
            other => out.push(Event::custom(format!("narad.{other}"), e.clone())),
        }
        None
    }

    /// The events that end the AG-UI run `run_id` of `thread_id`: what is
    /// open closed first (except before `RUN_ERROR`, which needs nothing
    /// closed), then `RUN_FINISHED` or `RUN_ERROR`.
    pub fn end(&mut self, thread_id: &str, run_id: &str, ending: Ending, out: &mut Vec<Event>) {
        match ending {
            Ending::Finished(outcome, usage) => {
                for id in std::mem::take(&mut self.open_text).into_keys() {
                    out.push(Event::text_message_end(id));
                }
                for id in std::mem::take(&mut self.open_reasoning).into_keys() {
                    out.push(Event::reasoning_message_end(id.as_str()));
                    out.push(Event::reasoning_end(id));
                }
                for (_, name) in std::mem::take(&mut self.steps) {
                    out.push(Event::step_finished(name));
                }
                let mut finished = RunFinishedEvent::new(thread_id, run_id).with_outcome(outcome);
                if !usage.is_empty() {
                    finished = finished.with_usage(usage);
                }
                out.push(finished.into());
            }
            Ending::Error { code, message } => {
                let message = if message.is_empty() {
                    "the run failed".to_owned()
                } else {
                    message
                };
                let mut error = RunErrorEvent::new(message);
                if !code.is_empty() {
                    error = error.with_code(code);
                }
                out.push(error.into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ty: &str, extra: Value) -> Value {
        let mut e = json!({"type": ty, "rootRunId": "r1", "runId": "r1"});
        for (k, v) in extra.as_object().unwrap() {
            e[k] = v.clone();
        }
        e
    }

    fn types(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| {
                serde_json::to_value(e).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn open_messages_and_steps_close_before_run_finished() {
        let mut t = Translator::new(
            "r1",
            HashSet::new(),
            HashSet::new(),
            HashSet::new(),
            "session",
        );
        let mut out = Vec::new();
        for e in [
            ev(
                "progress.recorded",
                json!({"progressId": "p", "category": "c", "label": "Plan", "status": "active", "privacy": "public"}),
            ),
            ev(
                "message.text.started",
                json!({"messageId": "m", "role": "assistant"}),
            ),
            ev(
                "message.text.delta",
                json!({"messageId": "m", "delta": "hi"}),
            ),
            ev(
                "reasoning.delta",
                json!({"reasoningId": "q", "delta": "hm"}),
            ),
            ev(
                "run.started",
                json!({"runId": "other", "rootRunId": "other"}),
            ),
        ] {
            assert!(t.event(&e, &mut out).is_none());
        }
        let ending = t
            .event(
                &ev("run.finished", json!({"usage": {"inputTokens": 3}})),
                &mut out,
            )
            .expect("ends");
        t.end("s", "a1", ending, &mut out);
        assert_eq!(
            types(&out),
            [
                "STEP_STARTED",
                "TEXT_MESSAGE_START",
                "TEXT_MESSAGE_CONTENT",
                "REASONING_START",
                "REASONING_MESSAGE_START",
                "REASONING_MESSAGE_CONTENT",
                "TEXT_MESSAGE_END",
                "REASONING_MESSAGE_END",
                "REASONING_END",
                "STEP_FINISHED",
                "RUN_FINISHED"
            ]
        );
        let last = serde_json::to_value(out.last().unwrap()).unwrap();
        assert_eq!(last["usage"], json!([{"inputTokens": 3}]));
        assert_eq!(last["outcome"], json!({"type": "success"}));
    }
}
