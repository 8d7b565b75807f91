//! A session's history folded into what the AG-UI route decides with: the
//! transcript as AG-UI messages (for `MESSAGES_SNAPSHOT`), the active
//! top-level run (what it waits on, its open client calls and open
//! messages), the interrupts asked, and the state document of one scope.
//!
//! One fold reads the session's history once, page by page (one round trip
//! per page of up to the journal's largest page).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Value, json};

/// What a session's history says, through `covers`.
#[derive(Debug, Default)]
pub struct Thread {
    /// The sessionSequence the fold covers.
    pub covers: u64,
    /// The transcript, oldest first, as AG-UI messages.
    messages: Vec<Value>,
    /// Where each message id stands in `messages`.
    index: HashMap<String, usize>,
    /// Every top-level run started in the session.
    pub runs: HashSet<String>,
    /// The active top-level run, if any.
    pub active: Option<ActiveRun>,
    /// Every interrupt asked (its `interrupt.requested`), with `decision`
    /// set once resolved.
    pub interrupts: HashMap<String, Value>,
    /// The state document of the chosen scope, when the session has one.
    pub state: Option<Value>,
    /// The scope of `state`.
    state_scope: String,
}

/// The session's active top-level run.
#[derive(Debug, Default, Clone)]
pub struct ActiveRun {
    /// Its runId (its own root).
    pub run_id: String,
    /// The blocking interrupt it is paused on, if any.
    pub waiting_on: Option<String>,
    /// Its client tool calls not finished yet: toolCallId → toolName.
    pub open_client_calls: BTreeMap<String, String>,
    /// Its text messages started and not completed: messageId → role.
    pub open_text: BTreeMap<String, String>,
}

/// A tool result's message id in snapshots, unless the client named it.
pub fn result_message_id(tool_call_id: &str) -> String {
    format!("{tool_call_id}:result")
}

/// narad content as AG-UI user content: text stays text; AG-UI content
/// parts stay parts; anything else becomes its JSON text.
pub fn user_content(content: &Value) -> Value {
    match content {
        Value::String(_) => content.clone(),
        Value::Array(parts)
            if !parts.is_empty()
                && parts.iter().all(|p| {
                    matches!(
                        p["type"].as_str(),
                        Some("text" | "image" | "audio" | "video" | "document")
                    )
                }) =>
        {
            content.clone()
        }
        other => json!(other.to_string()),
    }
}

/// A tool response as AG-UI tool content: a string as it is, anything
/// else as its JSON text.
pub fn tool_content(response: &Value) -> String {
    match response {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Thread {
    /// An empty thread whose state is that of `state_scope`.
    pub fn new(state_scope: &str) -> Thread {
        Thread {
            state_scope: state_scope.to_owned(),
            ..Thread::default()
        }
    }

    /// Whether the journal holds a message with this id.
    pub fn has_message(&self, id: &str) -> bool {
        self.index.contains_key(id)
    }

    fn push(&mut self, message: Value) {
        let id = message["id"].as_str().unwrap_or_default().to_owned();
        if let Some(&at) = self.index.get(&id) {
            self.messages[at] = message;
            return;
        }
        self.index.insert(id, self.messages.len());
        self.messages.push(message);
    }

    fn message_mut(&mut self, id: &str) -> Option<&mut Value> {
        let at = *self.index.get(id)?;
        self.messages.get_mut(at)
    }

    fn append_text(&mut self, id: &str, delta: &str) {
        if let Some(m) = self.message_mut(id) {
            let text = format!("{}{delta}", m["content"].as_str().unwrap_or_default());
            m["content"] = json!(text);
        }
    }

    /// Folds one stored event.
    pub fn fold(&mut self, e: &Value) {
        if let Some(seq) = e["sessionSequence"].as_u64() {
            self.covers = self.covers.max(seq);
        }
        let text = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
        let root = e["rootRunId"].as_str();
        let ours = |t: &Thread| {
            t.active
                .as_ref()
                .is_some_and(|a| Some(a.run_id.as_str()) == root)
        };
        match e["type"].as_str().unwrap_or_default() {
            "run.started" if e.get("parentRunId").is_none() => {
                self.runs.insert(text("runId"));
                self.active = Some(ActiveRun {
                    run_id: text("runId"),
                    ..ActiveRun::default()
                });
            }
            "run.finished" | "run.error" | "run.cancelled"
                if ours(self) && e["runId"].as_str() == root =>
            {
                self.active = None;
            }
            "run.paused" if ours(self) => {
                if let (Some(active), Some(id)) = (&mut self.active, e["interruptId"].as_str()) {
                    active.waiting_on = Some(id.to_owned());
                }
            }
            "run.resumed" if ours(self) => {
                if let Some(active) = &mut self.active {
                    active.waiting_on = None;
                }
            }
            "interrupt.requested" => {
                self.interrupts.insert(text("interruptId"), e.clone());
            }
            "interrupt.resolved" => {
                if let Some(asked) = self.interrupts.get_mut(&text("interruptId")) {
                    asked["decision"] = e["decision"].clone();
                    asked["actor"] = e["actor"].clone();
                }
            }
            "message.user.recorded" => self.push(json!({
                "id": text("messageId"), "role": "user", "content": user_content(&e["content"]),
            })),
            "message.text.started" => {
                let role = match e["role"].as_str() {
                    Some("system") => "system",
                    _ => "assistant",
                };
                self.push(json!({"id": text("messageId"), "role": role, "content": ""}));
                if ours(self)
                    && let Some(active) = &mut self.active
                {
                    active.open_text.insert(text("messageId"), role.to_owned());
                }
            }
            "message.text.delta" => self.append_text(&text("messageId"), &text("delta")),
            "message.text.completed" => {
                if let Some(active) = &mut self.active {
                    active.open_text.remove(&text("messageId"));
                }
            }
            "message.redacted" => {
                let replacement = e["displayReplacement"].as_str().unwrap_or_default();
                if let Some(m) = self.message_mut(&text("messageId")) {
                    m["content"] = json!(replacement);
                }
            }
            "reasoning.started" => self.push(json!({
                "id": text("reasoningId"), "role": "reasoning", "content": "",
            })),
            "reasoning.delta" => self.append_text(&text("reasoningId"), &text("delta")),
            "tool.call.started" => {
                let id = text("toolCallId");
                self.push(json!({
                    "id": id, "role": "assistant",
                    "toolCalls": [{"id": id, "type": "function", "function": {
                        "name": text("toolName"), "arguments": e["args"].to_string(),
                    }}],
                }));
                if e["executor"] == "client"
                    && ours(self)
                    && let Some(active) = &mut self.active
                {
                    active.open_client_calls.insert(id, text("toolName"));
                }
            }
            "tool.call.finished" => {
                let id = text("toolCallId");
                let mut m = json!({
                    "id": result_message_id(&id), "role": "tool", "toolCallId": id,
                    "content": tool_content(&e["response"]),
                });
                if e["outcome"] != "success" {
                    m["error"] = json!(
                        e["message"]
                            .as_str()
                            .or(e["code"].as_str())
                            .unwrap_or("failed")
                    );
                }
                self.push(m);
                if let Some(active) = &mut self.active {
                    active.open_client_calls.remove(&id);
                }
            }
            "state.snapshot" if e["scope"].as_str() == Some(self.state_scope.as_str()) => {
                self.state = Some(e["state"].clone());
            }
            "state.delta" if e["scope"].as_str() == Some(self.state_scope.as_str()) => {
                if let (Some(state), Ok(patch)) = (
                    &mut self.state,
                    serde_json::from_value::<json_patch::Patch>(e["patch"].clone()),
                ) && json_patch::patch(state, &patch).is_err()
                {
                    tracing::debug!("a stored state delta does not apply to the folded state");
                }
            }
            _ => {}
        }
    }

    /// The transcript as AG-UI messages, the tool results of calls the
    /// client answered under the ids of its own tool messages
    /// (`client_results`: toolCallId → message id).
    pub fn messages(&self, client_results: &HashMap<String, String>) -> Vec<Value> {
        self.messages
            .iter()
            .map(|m| {
                let mut m = m.clone();
                if m["role"] == "tool"
                    && let Some(id) = m["toolCallId"].as_str().and_then(|c| client_results.get(c))
                {
                    m["id"] = json!(id);
                }
                m
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::routes::front_end::test_event as ev;

    #[test]
    fn a_fold_keeps_the_transcript_and_the_active_run() {
        let mut t = Thread::new("session");
        for e in [
            json!({"type": "message.user.recorded", "sessionSequence": 1, "messageId": "u1",
                   "messageScope": "session", "content": "hi"}),
            ev(2, "run.started", json!({})),
            ev(
                3,
                "message.text.started",
                json!({"messageId": "m1", "role": "assistant", "messageScope": "run"}),
            ),
            ev(
                4,
                "message.text.delta",
                json!({"messageId": "m1", "delta": "Hel"}),
            ),
            ev(
                5,
                "tool.call.started",
                json!({"toolCallId": "t1", "toolName": "ask", "executor": "client", "args": {"q": 1}}),
            ),
        ] {
            t.fold(&e);
        }
        assert_eq!(t.covers, 5);
        let active = t.active.as_ref().expect("active");
        assert_eq!(
            active.open_text.get("m1").map(String::as_str),
            Some("assistant")
        );
        assert!(active.open_client_calls.contains_key("t1"));
        let ms = t.messages(&HashMap::new());
        assert_eq!(ms[0], json!({"id": "u1", "role": "user", "content": "hi"}));
        assert_eq!(ms[1]["content"], "Hel");
        assert_eq!(ms[2]["toolCalls"][0]["function"]["arguments"], "{\"q\":1}");
        t.fold(&ev(
            6,
            "tool.call.finished",
            json!({"toolCallId": "t1", "outcome": "success", "response": {"ok": true}}),
        ));
        let answered = HashMap::from([("t1".to_owned(), "client-msg".to_owned())]);
        assert_eq!(t.messages(&answered)[3]["id"], "client-msg");
        assert!(t.active.as_ref().unwrap().open_client_calls.is_empty());
        t.fold(&ev(7, "run.finished", json!({})));
        assert!(t.active.is_none());
    }
}
