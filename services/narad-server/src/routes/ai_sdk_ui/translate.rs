//! One top-level run's events as the parts of one AI SDK UI assistant
//! message (UI message stream v1 chunks).
//!
//! The translation is a fold of the run's stored events and nothing else,
//! so the same history always gives the same chunks: a reconnect replays
//! the message exactly as the answers that streamed it did. Its ids: the
//! message is the runId, a text part the narad messageId (with `~n` when a
//! message goes on after the answer that opened it ended), a reasoning
//! part the reasoningId, a tool part the toolCallId (an interrupt about no
//! recorded tool call: `interrupt:<interruptId>`), an approval the
//! interruptId.
//!
//! Steps: content opens a step (`start-step`) when none is open; the run
//! waiting on the front end (a client tool call of the session's front end,
//! an interrupt it pauses on) closes the open parts and the step, so that
//! the front end's continuation lands in a new step, as the AI SDK's
//! `lastAssistantMessageIsCompleteWithToolCalls` expects.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::{Value, json};

/// How the run ended, once it did.
#[derive(Debug, Clone, PartialEq)]
pub enum Ended {
    /// `run.finished`.
    Finished,
    /// `run.error`.
    Error,
    /// `run.cancelled`.
    Cancelled,
}

/// A tool part of the message.
#[derive(Debug, Clone, Default)]
struct ToolPart {
    provider_executed: bool,
    done: bool,
}

/// An interrupt of the run.
#[derive(Debug, Clone)]
pub struct Asked {
    /// The tool part it is shown on, when it concerns a tool call.
    pub tool_call_id: Option<String>,
    /// Whether that part stands for the interrupt alone (no tool call of
    /// the run has its id).
    synthetic: bool,
    /// The decision, once resolved, and who decided.
    pub decision: Option<(String, Value)>,
    /// The actions it offers.
    pub actions: Vec<String>,
}

/// The fold.
#[derive(Debug)]
pub struct Translator {
    root: String,
    front_end: String,
    /// The run's client calls go to the session's front end.
    ours: bool,
    in_step: bool,
    /// Open text parts: narad messageId → part id.
    open_text: BTreeMap<String, String>,
    /// Parts each narad message opened so far.
    text_parts: HashMap<String, u32>,
    open_reasoning: BTreeMap<String, String>,
    reasoning_parts: HashMap<String, u32>,
    tools: HashMap<String, ToolPart>,
    /// Interrupts of the run, by id.
    pub interrupts: HashMap<String, Asked>,
    /// The front end's client calls not finished yet.
    pub open_client_calls: BTreeSet<String>,
    /// The interrupt the run is paused on, not resolved yet.
    pub paused_on: Option<String>,
    /// How the run ended, once it did.
    pub ended: Option<Ended>,
    /// The last sessionSequence folded.
    pub through: u64,
}

impl Translator {
    /// A fold of run `root`, whose client calls are the front end's when
    /// its `clientExecutorId` is `front_end`.
    pub fn new(root: &str, front_end: &str) -> Translator {
        Translator {
            root: root.to_owned(),
            front_end: front_end.to_owned(),
            ours: false,
            in_step: false,
            open_text: BTreeMap::new(),
            text_parts: HashMap::new(),
            open_reasoning: BTreeMap::new(),
            reasoning_parts: HashMap::new(),
            tools: HashMap::new(),
            interrupts: HashMap::new(),
            open_client_calls: BTreeSet::new(),
            paused_on: None,
            ended: None,
            through: 0,
        }
    }

    /// Whether the run waits on the front end: a client call of its
    /// executor is open, or an interrupt it paused on is undecided.
    pub fn waits_on_front_end(&self) -> bool {
        self.ended.is_none() && (!self.open_client_calls.is_empty() || self.paused_on.is_some())
    }

    fn step(&mut self, out: &mut Vec<Value>) {
        if !self.in_step {
            out.push(json!({"type": "start-step"}));
            self.in_step = true;
        }
    }

    /// Closes the open text and reasoning parts and the step.
    pub fn close(&mut self, out: &mut Vec<Value>) {
        for (_, id) in std::mem::take(&mut self.open_text) {
            out.push(json!({"type": "text-end", "id": id}));
        }
        for (_, id) in std::mem::take(&mut self.open_reasoning) {
            out.push(json!({"type": "reasoning-end", "id": id}));
        }
        if self.in_step {
            out.push(json!({"type": "finish-step"}));
            self.in_step = false;
        }
    }

    fn open_part(
        open: &mut BTreeMap<String, String>,
        parts: &mut HashMap<String, u32>,
        id: &str,
    ) -> String {
        let n = parts.entry(id.to_owned()).or_insert(0);
        *n += 1;
        let part = if *n == 1 {
            id.to_owned()
        } else {
            format!("{id}~{n}")
        };
        open.insert(id.to_owned(), part.clone());
        part
    }

    /// Folds one stored event of the session, adding its chunks to `out`.
    pub fn event(&mut self, e: &Value, out: &mut Vec<Value>) {
        if let Some(seq) = e["sessionSequence"].as_u64() {
            self.through = self.through.max(seq);
        }
        if self.ended.is_some() || e["rootRunId"].as_str() != Some(self.root.as_str()) {
            return;
        }
        let top = e["runId"].as_str() == Some(self.root.as_str());
        let text = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
        match e["type"].as_str().unwrap_or_default() {
            "run.started" if top => {
                self.ours = e["clientExecutorId"].as_str() == Some(self.front_end.as_str());
            }
            "message.text.started" if e["role"] == "assistant" => {
                self.step(out);
                let id = Translator::open_part(
                    &mut self.open_text,
                    &mut self.text_parts,
                    &text("messageId"),
                );
                out.push(json!({"type": "text-start", "id": id}));
            }
            "message.text.delta" => {
                let message = text("messageId");
                if !self.text_parts.contains_key(&message) {
                    // A system message's, or another scope's.
                    return;
                }
                self.step(out);
                let id = match self.open_text.get(&message) {
                    Some(id) => id.clone(),
                    None => {
                        let id = Translator::open_part(
                            &mut self.open_text,
                            &mut self.text_parts,
                            &message,
                        );
                        out.push(json!({"type": "text-start", "id": id}));
                        id
                    }
                };
                out.push(json!({"type": "text-delta", "id": id, "delta": text("delta")}));
            }
            "message.text.completed" => {
                if let Some(id) = self.open_text.remove(&text("messageId")) {
                    out.push(json!({"type": "text-end", "id": id}));
                }
            }
            "reasoning.started" => {
                self.step(out);
                let id = Translator::open_part(
                    &mut self.open_reasoning,
                    &mut self.reasoning_parts,
                    &text("reasoningId"),
                );
                out.push(json!({"type": "reasoning-start", "id": id}));
            }
            "reasoning.delta" => {
                let reasoning = text("reasoningId");
                if !self.reasoning_parts.contains_key(&reasoning) {
                    return;
                }
                self.step(out);
                let id = match self.open_reasoning.get(&reasoning) {
                    Some(id) => id.clone(),
                    None => {
                        let id = Translator::open_part(
                            &mut self.open_reasoning,
                            &mut self.reasoning_parts,
                            &reasoning,
                        );
                        out.push(json!({"type": "reasoning-start", "id": id}));
                        id
                    }
                };
                out.push(json!({"type": "reasoning-delta", "id": id, "delta": text("delta")}));
            }
            "reasoning.completed" => {
                if let Some(id) = self.open_reasoning.remove(&text("reasoningId")) {
                    out.push(json!({"type": "reasoning-end", "id": id}));
                }
            }
            "tool.call.started" => {
                let id = text("toolCallId");
                let front_end = e["executor"] == "client" && self.ours;
                if !self.tools.contains_key(&id) {
                    self.step(out);
                    let mut chunk = json!({"type": "tool-input-available", "toolCallId": id,
                        "toolName": text("toolName"), "input": e["args"]});
                    if !front_end {
                        chunk["providerExecuted"] = json!(true);
                    }
                    out.push(chunk);
                    self.tools.insert(
                        id.clone(),
                        ToolPart {
                            provider_executed: !front_end,
                            done: false,
                        },
                    );
                }
                if front_end {
                    self.open_client_calls.insert(id);
                    self.close(out);
                }
            }
            "tool.call.finished" => {
                let id = text("toolCallId");
                self.open_client_calls.remove(&id);
                let Some(part) = self.tools.get_mut(&id) else {
                    return;
                };
                if part.done {
                    return;
                }
                part.done = true;
                let provider_executed = part.provider_executed;
                self.step(out);
                let mut chunk = if e["outcome"] == "success" {
                    json!({"type": "tool-output-available", "toolCallId": id, "output": e["response"]})
                } else {
                    let error = e["message"]
                        .as_str()
                        .filter(|m| !m.is_empty())
                        .or(e["code"].as_str())
                        .or(e["outcome"].as_str())
                        .unwrap_or("failed");
                    json!({"type": "tool-output-error", "toolCallId": id, "errorText": error})
                };
                if provider_executed {
                    chunk["providerExecuted"] = json!(true);
                }
                out.push(chunk);
            }
            "interrupt.requested" => self.asked(e, out),
            "interrupt.resolved" => self.resolved(e, out),
            "run.paused" if top => {
                if let Some(id) = e["interruptId"].as_str() {
                    if self.interrupts.get(id).is_none_or(|a| a.decision.is_none()) {
                        self.paused_on = Some(id.to_owned());
                        self.close(out);
                    }
                } else {
                    let mut data = json!({"state": "paused", "reason": e["reason"]});
                    for k in ["message", "retryAt"] {
                        if !e[k].is_null() {
                            data[k] = e[k].clone();
                        }
                    }
                    out.push(json!({"type": "data-narad-run", "id": "run", "data": data}));
                }
            }
            "run.resumed" if top => {
                out.push(
                    json!({"type": "data-narad-run", "id": "run", "data": {"state": "running"}}),
                );
            }
            "run.stop.requested" if top => {
                out.push(
                    json!({"type": "data-narad-run", "id": "run", "data": {"state": "stopping"}}),
                );
            }
            "progress.recorded" => {
                let mut data = json!({});
                for k in ["category", "label", "detail", "status"] {
                    if !e[k].is_null() {
                        data[k] = e[k].clone();
                    }
                }
                out.push(
                    json!({"type": "data-narad-progress", "id": text("progressId"), "data": data}),
                );
            }
            "run.custom" if top => {
                out.push(json!({"type": "data-narad-custom",
                    "data": {"name": e["name"], "value": e["value"]}}));
            }
            "run.finished" if top => {
                self.close(out);
                self.ended = Some(Ended::Finished);
            }
            "run.error" if top => {
                self.close(out);
                let text = e["message"]
                    .as_str()
                    .filter(|m| !m.is_empty())
                    .or(e["code"].as_str())
                    .unwrap_or("the run failed");
                out.push(json!({"type": "data-narad-error", "id": "error",
                    "data": {"code": e["code"], "message": e["message"]}}));
                out.push(json!({"type": "error", "errorText": text}));
                self.ended = Some(Ended::Error);
            }
            "run.cancelled" if top => {
                self.close(out);
                let reason = e["message"]
                    .as_str()
                    .filter(|m| !m.is_empty())
                    .or(e["code"].as_str())
                    .unwrap_or("cancelled");
                out.push(json!({"type": "abort", "reason": reason}));
                self.ended = Some(Ended::Cancelled);
            }
            _ => {}
        }
    }

    /// `interrupt.requested`: an approval on a tool part when it concerns
    /// a tool call, a `data-narad-interrupt` part otherwise.
    fn asked(&mut self, e: &Value, out: &mut Vec<Value>) {
        let id = e["interruptId"].as_str().unwrap_or_default().to_owned();
        let input = &e["input"];
        let member = match input["members"].as_array() {
            Some(m) if m.len() == 1 => &m[0],
            _ => &Value::Null,
        };
        let call = input["toolCallId"]
            .as_str()
            .or(member["toolCallId"].as_str())
            .map(str::to_owned);
        let tool_name = input["toolName"]
            .as_str()
            .or(member["toolName"].as_str())
            .map(str::to_owned);
        let actions: Vec<String> = e["actions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let about_a_tool = call.is_some() || tool_name.is_some() || e["kind"] == "tool.approval";
        let mut descriptor = json!({"interruptId": id, "waitId": e["waitId"],
            "kind": e["kind"], "actions": actions});
        for k in ["title", "message", "expiresAt"] {
            if !e[k].is_null() {
                descriptor[k] = e[k].clone();
            }
        }
        if !about_a_tool {
            let mut data = descriptor;
            data["input"] = input.clone();
            out.push(json!({"type": "data-narad-interrupt", "id": id, "data": data}));
            self.interrupts.insert(
                id,
                Asked {
                    tool_call_id: None,
                    synthetic: false,
                    decision: None,
                    actions,
                },
            );
            return;
        }
        let tool_call_id = call.unwrap_or_else(|| format!("interrupt:{id}"));
        let synthetic = !self.tools.contains_key(&tool_call_id);
        self.step(out);
        if synthetic {
            let args = if input["args"].is_null() {
                if input.is_null() {
                    json!({})
                } else {
                    input.clone()
                }
            } else {
                input["args"].clone()
            };
            let name = tool_name
                .unwrap_or_else(|| e["kind"].as_str().unwrap_or("narad.interrupt").to_owned());
            out.push(
                json!({"type": "tool-input-available", "toolCallId": tool_call_id,
                "toolName": name, "input": args, "providerExecuted": true}),
            );
            self.tools.insert(
                tool_call_id.clone(),
                ToolPart {
                    provider_executed: true,
                    done: false,
                },
            );
        }
        let mut chunk = json!({"type": "tool-approval-request", "approvalId": id,
            "toolCallId": tool_call_id, "approvalDescriptor": {"narad": descriptor}});
        if let Some(reason) = e["message"].as_str().or(e["title"].as_str()) {
            chunk["reason"] = json!(reason);
        }
        out.push(chunk);
        self.interrupts.insert(
            id,
            Asked {
                tool_call_id: Some(tool_call_id),
                synthetic,
                decision: None,
                actions,
            },
        );
    }

    /// `interrupt.resolved`: the decision on its approval (however it was
    /// made: here, in the console, by expiry).
    fn resolved(&mut self, e: &Value, out: &mut Vec<Value>) {
        let id = e["interruptId"].as_str().unwrap_or_default().to_owned();
        let decision = e["decision"].as_str().unwrap_or_default().to_owned();
        if self.paused_on.as_deref() == Some(id.as_str()) {
            self.paused_on = None;
        }
        let Some(asked) = self.interrupts.get_mut(&id) else {
            return;
        };
        asked.decision = Some((decision.clone(), e["actor"].clone()));
        let Some(call) = asked.tool_call_id.clone() else {
            let mut data = json!({"interruptId": id, "decision": decision});
            if !e["reason"].is_null() {
                data["reason"] = e["reason"].clone();
            }
            out.push(json!({"type": "data-narad-interrupt", "id": id, "data": data}));
            return;
        };
        let synthetic = asked.synthetic;
        let approved = decision == "approve";
        self.step(out);
        let mut chunk =
            json!({"type": "tool-approval-response", "approvalId": id, "approved": approved});
        let reason = e["reason"]
            .as_str()
            .map(str::to_owned)
            .or_else(|| (!approved).then(|| format!("decided: {decision}")));
        if let Some(reason) = reason {
            chunk["reason"] = json!(reason);
        }
        out.push(chunk);
        let done = self.tools.get(&call).is_some_and(|t| t.done);
        if done {
            return;
        }
        if !approved {
            out.push(json!({"type": "tool-output-denied", "toolCallId": call}));
            if let Some(t) = self.tools.get_mut(&call) {
                t.done = true;
            }
        } else if synthetic {
            let mut output = json!({"decision": decision});
            if !e["reason"].is_null() {
                output["reason"] = e["reason"].clone();
            }
            out.push(json!({"type": "tool-output-available", "toolCallId": call,
                "output": output, "providerExecuted": true}));
            if let Some(t) = self.tools.get_mut(&call) {
                t.done = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::routes::front_end::test_event as ev;

    fn types(out: &[Value]) -> Vec<&str> {
        out.iter().map(|c| c["type"].as_str().unwrap()).collect()
    }

    #[test]
    fn a_client_call_closes_the_step_and_its_answer_opens_the_next() {
        let mut t = Translator::new("r1", "front-end:s1");
        let mut out = Vec::new();
        for e in [
            ev(
                1,
                "run.started",
                json!({"clientExecutorId": "front-end:s1"}),
            ),
            ev(
                2,
                "message.text.started",
                json!({"messageId": "m1", "role": "assistant", "messageScope": "run"}),
            ),
            ev(
                3,
                "message.text.delta",
                json!({"messageId": "m1", "delta": "Hi"}),
            ),
            ev(
                4,
                "tool.call.started",
                json!({"toolCallId": "t1", "toolName": "ask", "executor": "client", "args": {}}),
            ),
        ] {
            t.event(&e, &mut out);
        }
        assert!(t.waits_on_front_end());
        assert_eq!(
            types(&out),
            [
                "start-step",
                "text-start",
                "text-delta",
                "tool-input-available",
                "text-end",
                "finish-step"
            ]
        );
        assert!(out[3].get("providerExecuted").is_none());
        out.clear();
        t.event(
            &ev(
                5,
                "tool.call.finished",
                json!({"toolCallId": "t1", "outcome": "success", "response": 1}),
            ),
            &mut out,
        );
        t.event(
            &ev(
                6,
                "message.text.delta",
                json!({"messageId": "m1", "delta": "!"}),
            ),
            &mut out,
        );
        t.event(&ev(7, "run.finished", json!({})), &mut out);
        assert_eq!(
            types(&out),
            [
                "start-step",
                "tool-output-available",
                "text-start",
                "text-delta",
                "text-end",
                "finish-step"
            ]
        );
        assert_eq!(out[2]["id"], "m1~2");
        assert_eq!(t.ended, Some(Ended::Finished));
    }

    #[test]
    fn an_approval_about_a_tool_is_a_tool_approval_request() {
        let mut t = Translator::new("r1", "front-end:s1");
        let mut out = Vec::new();
        t.event(
            &ev(
                1,
                "interrupt.requested",
                json!({"interruptId": "i1", "waitId": "w",
            "kind": "tool.approval", "actions": ["approve", "deny"], "message": "Delete?",
            "input": {"toolName": "fs.delete", "args": {"path": "/x"}}}),
            ),
            &mut out,
        );
        t.event(
            &ev(
                2,
                "run.paused",
                json!({"interruptId": "i1", "waitId": "w", "reason": "interrupt"}),
            ),
            &mut out,
        );
        assert!(t.waits_on_front_end());
        assert_eq!(out[1]["toolCallId"], "interrupt:i1");
        assert_eq!(out[2]["type"], "tool-approval-request");
        assert_eq!(out[2]["approvalId"], "i1");
        out.clear();
        t.event(
            &ev(
                3,
                "interrupt.resolved",
                json!({"interruptId": "i1", "waitId": "w", "decision": "deny"}),
            ),
            &mut out,
        );
        assert!(!t.waits_on_front_end());
        assert_eq!(
            types(&out),
            ["start-step", "tool-approval-response", "tool-output-denied"]
        );
        assert_eq!(out[1]["approved"], false);
    }
}
