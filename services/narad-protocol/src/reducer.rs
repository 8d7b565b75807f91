//! The client reducer (§13): reduces what a client received — duplicates
//! and re-deliveries included (§10.1) — deterministically into session
//! state: the run tree, interrupts, tool calls, documents and the
//! transcript.
//!
//! It validates authority with the same [`SessionState`] the journal uses,
//! deduplicates by event identity before applying, refuses to apply past a
//! gap, never invents a terminal and never executes anything: control
//! messages are recorded or ignored, never acted on.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{Value, json};

use crate::authority::MessageScope;
use crate::classify::{Classified, IgnoreReason, Reader, WireError};
use crate::engine::{Applied, SessionState};
use crate::hydrate::{MessageRole, MessagesSnapshot};
use crate::primitives::{EventId, RunId};
use crate::profile::ProfileSet;
use crate::rules::{self, Violation};
use crate::wire::{AuthorityBody, AuthorityEvent, HydrateBody, WatchBody, WatchEvent, WireObject};

/// What the reducer did with one delivered object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// Authority applied to the state.
    Applied(Applied),
    /// A re-delivery of something already applied; nothing changed.
    Duplicate,
    /// A watch event or hydrate record recorded.
    Recorded,
    /// Not for this reducer: a profile not negotiated, or a control message.
    Ignored,
}

/// One entry of the transcript.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "item", rename_all = "lowercase")]
pub enum TranscriptItem {
    /// A message.
    Message(TranscriptEntry),
    /// A reasoning stream, kept even when a later message carries the
    /// final text of the same turn (§9.2).
    Reasoning(ReasoningEntry),
}

/// A transcript message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TranscriptEntry {
    /// The message.
    pub message_id: String,
    /// Who wrote it.
    pub role: MessageRole,
    /// Where it belongs.
    pub scope: MessageScope,
    /// The run, for run-scoped messages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The content: user content, or the streamed text so far.
    pub content: Value,
    /// Whether it is whole.
    pub completed: bool,
    /// A display redaction: `{reason, displayReplacement}`. The content
    /// itself is kept; redaction changes display only (§9.4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redaction: Option<Value>,
}

/// A transcript reasoning stream.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReasoningEntry {
    /// The reasoning stream.
    pub reasoning_id: String,
    /// The assistant message it is joined to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// The run, for run-scoped reasoning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The text so far.
    pub text: String,
    /// Whether it is whole.
    pub completed: bool,
}

impl TranscriptItem {
    fn run_id(&self) -> Option<&str> {
        match self {
            TranscriptItem::Message(m) => m.run_id.as_deref(),
            TranscriptItem::Reasoning(r) => r.run_id.as_deref(),
        }
    }
}

/// The reducer of one session.
#[derive(Debug, Clone)]
pub struct Reducer {
    profiles: ProfileSet,
    engine: SessionState,
    /// Authority delivered so far: eventId → sessionSequence.
    delivered: BTreeMap<EventId, u64>,
    /// Watch events seen, by eventId.
    watch_seen: BTreeSet<EventId>,
    /// The highest revision seen per watch scope.
    watch_revisions: BTreeMap<String, u64>,
    transcript: Vec<TranscriptItem>,
    /// Transcript state replaced by a snapshot through this sequence.
    transcript_covered: u64,
    /// The most recently started top-level run.
    last_top_level_run: Option<RunId>,
}

impl Reducer {
    /// A reducer for a client that negotiated `profiles`.
    pub fn new(profiles: ProfileSet) -> Self {
        Self {
            profiles,
            engine: SessionState::with_profiles(profiles),
            delivered: BTreeMap::new(),
            watch_seen: BTreeSet::new(),
            watch_revisions: BTreeMap::new(),
            transcript: Vec::new(),
            transcript_covered: 0,
            last_top_level_run: None,
        }
    }

    /// The lifecycle state the rules keep.
    pub fn state(&self) -> &SessionState {
        &self.engine
    }

    /// Reduces one delivered wire object given as JSON: classifies it for
    /// the negotiated profiles and [`deliver`](Self::deliver)s it. An
    /// authority event of a profile not negotiated is still read, so that
    /// its sequence is accounted for, and then ignored (§2.1).
    pub fn deliver_json(&mut self, value: &Value) -> Result<Delivered, Violation> {
        match Reader::new(self.profiles).classify(value) {
            Ok(Classified::Accepted(object)) => self.deliver(&object),
            Ok(Classified::Ignored {
                reason: IgnoreReason::NotNegotiated(_),
                ..
            }) => match Reader::all_profiles().classify(value) {
                Ok(Classified::Accepted(object)) if matches!(*object, WireObject::Authority(_)) => {
                    self.deliver(&object)
                }
                _ => Ok(Delivered::Ignored),
            },
            Ok(Classified::Ignored { .. }) => Ok(Delivered::Ignored),
            Err(e) => Err(wire_violation(&e)),
        }
    }

    /// Reduces one delivered object (§10.1: at least once, in order).
    pub fn deliver(&mut self, object: &WireObject) -> Result<Delivered, Violation> {
        if let WireObject::Authority(e) = object {
            return self.deliver_authority(e);
        }
        if !self.profiles.contains(object.wire_type().profile()) {
            return Ok(Delivered::Ignored);
        }
        match object {
            WireObject::Authority(e) => self.deliver_authority(e),
            WireObject::Watch(w) => self.deliver_watch(w),
            WireObject::Hydrate(h) => {
                if let HydrateBody::MessagesSnapshot(s) = &h.body {
                    // A snapshot older than what the transcript already
                    // holds would take back what later authority added.
                    let holds = self.transcript_covered.max(self.engine.session_sequence);
                    if s.covers_through_session_sequence.get() < holds {
                        return Ok(Delivered::Ignored);
                    }
                    self.replace_transcript(s);
                }
                Ok(Delivered::Recorded)
            }
            WireObject::Control(_) => Ok(Delivered::Ignored),
        }
    }

    /// Applies the next event of a journal, with no deduplication: every
    /// event must be new and next (the journal's view, for conformance).
    pub fn append(&mut self, event: &AuthorityEvent) -> Result<Applied, Violation> {
        let applied = self.engine.apply(event)?;
        self.delivered.insert(
            event.envelope.event_id.clone(),
            event.envelope.session_sequence.get(),
        );
        self.reduce_transcript(event);
        Ok(applied)
    }

    fn deliver_authority(&mut self, e: &AuthorityEvent) -> Result<Delivered, Violation> {
        let id = &e.envelope.event_id;
        let seq = e.envelope.session_sequence.get();
        if let Some(&had) = self.delivered.get(id) {
            return if had == seq {
                Ok(Delivered::Duplicate)
            } else {
                Err(Violation::new(
                    rules::DELIVERY_CONFLICT,
                    format!("event {id} was delivered at sessionSequence {had}, now at {seq}"),
                )
                .at(id))
            };
        }
        let applied_through = self.engine.session_sequence;
        if seq <= applied_through {
            let other = self
                .delivered
                .iter()
                .find(|(_, s)| **s == seq)
                .map_or("another event".to_owned(), |(e, _)| format!("event {e}"));
            return Err(Violation::new(
                rules::DELIVERY_CONFLICT,
                format!("sessionSequence {seq} was already delivered as {other}"),
            )
            .at(id));
        }
        if seq > applied_through + 1 {
            return Err(Violation::new(
                rules::DELIVERY_GAP,
                format!(
                    "sessionSequence {seq} arrived after {applied_through}: re-read history from {applied_through} before applying more"
                ),
            )
            .at(id));
        }
        if self.engine.is_outside_profiles(e) {
            // Not negotiated: ignored (§2.1), but its sequence is accounted
            // for so that it never looks like a gap.
            self.engine.skip(e)?;
            self.delivered.insert(id.clone(), seq);
            return Ok(Delivered::Ignored);
        }
        self.append(e).map(Delivered::Applied)
    }

    fn deliver_watch(&mut self, w: &WatchEvent) -> Result<Delivered, Violation> {
        let id = &w.envelope.event_id;
        if self.watch_seen.contains(id) {
            return Ok(Delivered::Duplicate);
        }
        let scope = watch_scope(&w.body);
        let revision = w.envelope.revision.get();
        if let Some(&last) = self.watch_revisions.get(&scope)
            && revision < last
        {
            return Err(Violation::new(
                rules::WATCH_REVISION_REGRESS,
                format!("{scope} went from revision {last} back to {revision}"),
            )
            .at(id));
        }
        self.watch_seen.insert(id.clone());
        self.watch_revisions.insert(scope, revision);
        Ok(Delivered::Recorded)
    }

    fn replace_transcript(&mut self, s: &MessagesSnapshot) {
        self.transcript.clear();
        for m in &s.messages {
            for r in m.reasoning.iter().flatten() {
                self.transcript
                    .push(TranscriptItem::Reasoning(ReasoningEntry {
                        reasoning_id: r.reasoning_id.to_string(),
                        message_id: Some(m.message_id.to_string()),
                        run_id: m.run_id.as_ref().map(ToString::to_string),
                        text: r.text.clone(),
                        completed: r.completed,
                    }));
            }
            self.transcript
                .push(TranscriptItem::Message(TranscriptEntry {
                message_id: m.message_id.to_string(),
                role: m.role,
                scope: m.message_scope,
                run_id: m.run_id.as_ref().map(ToString::to_string),
                content: m.content.clone(),
                completed: m.completed,
                redaction: m.redaction.as_ref().map(
                    |r| json!({"reason": r.reason, "displayReplacement": r.display_replacement}),
                ),
            }));
        }
        self.transcript_covered = s.covers_through_session_sequence.get();
    }

    fn reduce_transcript(&mut self, e: &AuthorityEvent) {
        use AuthorityBody as B;
        if let B::RunStarted(b) = &e.body
            && b.parent_run_id.is_none()
        {
            self.last_top_level_run = e.envelope.run.as_ref().map(|r| r.run_id.clone());
        }
        if e.envelope.session_sequence.get() <= self.transcript_covered {
            return;
        }
        let run_id = e.envelope.run.as_ref().map(|r| r.run_id.to_string());
        match &e.body {
            B::MessageUserRecorded(b) => {
                self.transcript
                    .push(TranscriptItem::Message(TranscriptEntry {
                        message_id: b.message_id.to_string(),
                        role: MessageRole::User,
                        scope: b.message_scope,
                        run_id,
                        content: b.content.clone(),
                        completed: true,
                        redaction: None,
                    }))
            }
            B::MessageTextStarted(b) => {
                self.transcript
                    .push(TranscriptItem::Message(TranscriptEntry {
                        message_id: b.message_id.to_string(),
                        role: match b.role {
                            crate::authority::StreamRole::Assistant => MessageRole::Assistant,
                            crate::authority::StreamRole::System => MessageRole::System,
                        },
                        scope: b.message_scope,
                        run_id,
                        content: Value::String(String::new()),
                        completed: false,
                        redaction: None,
                    }))
            }
            B::MessageTextDelta(b) => {
                if let Some(m) = self.message_mut(b.message_id.as_str())
                    && let Value::String(text) = &mut m.content
                {
                    text.push_str(&b.delta);
                }
            }
            B::MessageTextCompleted(b) => {
                if let Some(m) = self.message_mut(b.message_id.as_str()) {
                    m.completed = true;
                }
            }
            B::MessageRedacted(b) => {
                if let Some(m) = self.message_mut(b.message_id.as_str()) {
                    m.redaction = Some(
                        json!({"reason": b.reason, "displayReplacement": b.display_replacement}),
                    );
                }
            }
            B::ReasoningStarted(b) => {
                self.transcript
                    .push(TranscriptItem::Reasoning(ReasoningEntry {
                        reasoning_id: b.reasoning_id.to_string(),
                        message_id: b.message_id.as_ref().map(ToString::to_string),
                        run_id,
                        text: String::new(),
                        completed: false,
                    }))
            }
            B::ReasoningDelta(b) => {
                if let Some(r) = self.reasoning_mut(b.reasoning_id.as_str()) {
                    r.text.push_str(&b.delta);
                }
            }
            B::ReasoningCompleted(b) => {
                if let Some(r) = self.reasoning_mut(b.reasoning_id.as_str()) {
                    r.completed = true;
                }
            }
            _ => {}
        }
    }

    fn message_mut(&mut self, id: &str) -> Option<&mut TranscriptEntry> {
        self.transcript.iter_mut().rev().find_map(|i| match i {
            TranscriptItem::Message(m) if m.message_id == id => Some(m),
            _ => None,
        })
    }

    fn reasoning_mut(&mut self, id: &str) -> Option<&mut ReasoningEntry> {
        self.transcript.iter_mut().rev().find_map(|i| match i {
            TranscriptItem::Reasoning(r) if r.reasoning_id == id => Some(r),
            _ => None,
        })
    }

    /// The whole transcript as a `messages.snapshot` body (§9.3) covering
    /// authority through `covers` (the sessionSequence this reducer has
    /// reduced through), every message with its reasoning joined to it.
    /// `None` when the transcript holds reasoning not (yet) joined to a
    /// message of the transcript, which a snapshot cannot express: the
    /// caller then replays authority instead.
    pub fn messages_snapshot(
        &self,
        snapshot_id: &str,
        session_id: &str,
        covers: u64,
    ) -> Option<MessagesSnapshot> {
        let mut messages: Vec<Value> = Vec::new();
        let mut reasoning: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
        for item in &self.transcript {
            match item {
                TranscriptItem::Message(m) => {
                    let mut v = json!({
                        "messageId": m.message_id,
                        "role": m.role,
                        "messageScope": m.scope,
                        "content": m.content,
                        "completed": m.completed,
                    });
                    if let Some(r) = &m.run_id {
                        v["runId"] = json!(r);
                    }
                    if let Some(r) = &m.redaction {
                        v["redaction"] = r.clone();
                    }
                    messages.push(v);
                }
                TranscriptItem::Reasoning(r) => reasoning
                    .entry(r.message_id.as_deref()?)
                    .or_default()
                    .push(json!({
                        "reasoningId": r.reasoning_id,
                        "text": r.text,
                        "completed": r.completed,
                    })),
            }
        }
        for m in &mut messages {
            if let Some(r) = reasoning.remove(m["messageId"].as_str().unwrap_or_default()) {
                m["reasoning"] = Value::Array(r);
            }
        }
        if !reasoning.is_empty() {
            return None;
        }
        serde_json::from_value(json!({
            "snapshotId": snapshot_id,
            "sessionId": session_id,
            "coversThroughSessionSequence": covers,
            "messages": messages,
        }))
        .ok()
    }

    /// The transcript a client shows (§9.2): session- and workflow-scoped
    /// items, the items of the most recently started top-level run, and
    /// those of the runs in `opened` (nested runs a client explicitly
    /// opened).
    pub fn transcript(&self, opened: &[RunId]) -> Vec<&TranscriptItem> {
        let primary = self.last_top_level_run.as_ref().map(RunId::as_str);
        self.transcript
            .iter()
            .filter(|item| match item.run_id() {
                None => true,
                Some(r) => Some(r) == primary || opened.iter().any(|o| o.as_str() == r),
            })
            .collect()
    }

    /// The reduced state as canonical JSON, for comparison (conformance
    /// traces, determinism tests).
    pub fn to_json(&self) -> Value {
        let s = &self.engine;
        let runs: serde_json::Map<String, Value> = s
            .runs
            .iter()
            .map(|(id, r)| {
                let mut v = json!({
                    "state": status_name(&r.status),
                    "stopRequested": r.stop_requested,
                    "rootRunId": r.root_run_id,
                });
                if let Some(p) = &r.parent_run_id {
                    v["parentRunId"] = json!(p);
                }
                if let Some(w) = &r.workflow_id {
                    v["workflowId"] = json!(w);
                }
                if let Some(c) = &r.client_executor_id {
                    v["clientExecutorId"] = json!(c);
                }
                (id.to_string(), v)
            })
            .collect();
        let workflows: serde_json::Map<String, Value> = s
            .workflows
            .iter()
            .map(|(id, w)| (id.to_string(), json!({"state": status_name(&w.status)})))
            .collect();
        let interrupts: serde_json::Map<String, Value> = s
            .interrupts
            .iter()
            .map(|(id, i)| {
                let mut v = json!({"open": i.decision.is_none()});
                if let Some(d) = &i.decision {
                    v["decision"] = json!(d);
                }
                (id.to_string(), v)
            })
            .collect();
        let documents: serde_json::Map<String, Value> = s
            .documents
            .iter()
            .map(|(family, docs)| {
                let family = serde_json::to_value(family).expect("serialises");
                (
                    family.as_str().expect("a string").to_owned(),
                    serde_json::to_value(docs).expect("serialises"),
                )
            })
            .collect();
        json!({
            "sessionSequence": s.session_sequence,
            "slot": s.slot,
            "runs": runs,
            "workflows": workflows,
            "interrupts": interrupts,
            "toolCalls": s.tool_calls,
            "transcript": self.transcript(&[]),
            "documents": documents,
            "views": s.views,
            "watch": self.watch_revisions,
        })
    }
}

fn status_name(s: &crate::engine::Status) -> &'static str {
    use crate::engine::Status;
    match s {
        Status::Running => "running",
        Status::Paused { .. } => "paused",
        Status::Finished => "finished",
        Status::Error => "error",
        Status::Cancelled => "cancelled",
    }
}

/// The key of a watch event's scope, e.g. `run.revision/run-1`.
fn watch_scope(body: &WatchBody) -> String {
    let (t, id) = match body {
        WatchBody::SessionRevision(b) => ("session.revision", b.session_id.to_string()),
        WatchBody::RunRevision(b) => ("run.revision", b.run_id.to_string()),
        WatchBody::WorkflowRevision(b) => ("workflow.revision", b.workflow_id.to_string()),
        WatchBody::NodeRevision(b) => ("node.revision", b.node_id.to_string()),
        WatchBody::WorkspaceRevision(b) => ("workspace.revision", b.workspace_id.to_string()),
        WatchBody::SessionCreated(b) | WatchBody::SessionUpdated(b) => {
            ("workspace.revision", b.workspace_id.to_string())
        }
        WatchBody::SessionArchived(b) => ("workspace.revision", b.workspace_id.to_string()),
    };
    format!("{t}/{id}")
}

/// The rule a structural rejection breaks.
pub fn wire_violation(e: &WireError) -> Violation {
    let rule = match e {
        WireError::UnsupportedVersion { .. } => rules::WIRE_VERSION,
        WireError::UnknownType { .. } => rules::WIRE_UNKNOWN_TYPE,
        WireError::Malformed(_) | WireError::Invalid { .. } => rules::WIRE_INVALID,
    };
    Violation::new(rule, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::primitives::RunId;

    fn event(seq: u64, ty: &str, run: Option<(&str, &str, u64)>, body: Value) -> Value {
        let mut e = json!({"protocolVersion": "narad/v1", "type": ty, "eventId": format!("e{seq}"),
            "timestamp": "2026-08-05T04:00:00Z", "sessionId": "s", "sessionSequence": seq});
        if let Some((root, run, n)) = run {
            e["rootRunId"] = json!(root);
            e["runId"] = json!(run);
            e["sequence"] = json!(n);
        }
        for (k, v) in body.as_object().unwrap() {
            e[k] = v.clone();
        }
        e
    }

    #[test]
    fn a_messages_snapshot_rebuilds_the_same_transcript() {
        let run = Some(("r1", "r1", 0));
        let at = |n: u64| run.map(|(a, b, _)| (a, b, n));
        let lines = [
            event(
                1,
                "message.user.recorded",
                None,
                json!({"messageId": "u1", "messageScope": "session", "content": "hi"}),
            ),
            event(2, "run.started", at(1), json!({})),
            event(
                3,
                "reasoning.started",
                at(2),
                json!({"reasoningId": "reasoning:a1", "messageId": "a1"}),
            ),
            event(
                4,
                "reasoning.delta",
                at(3),
                json!({"reasoningId": "reasoning:a1", "delta": "hm"}),
            ),
            event(
                5,
                "message.text.started",
                at(4),
                json!({"messageId": "a1", "role": "assistant", "messageScope": "run"}),
            ),
            event(
                6,
                "message.text.delta",
                at(5),
                json!({"messageId": "a1", "delta": "hel"}),
            ),
        ];
        let mut whole = Reducer::new(ProfileSet::all());
        for l in &lines {
            whole.deliver_json(l).unwrap();
        }
        let snapshot = whole.messages_snapshot("snap-1", "s", 6).unwrap();
        assert_eq!(snapshot.messages.len(), 2);
        let mut record = serde_json::to_value(&snapshot).unwrap();
        record["type"] = json!("messages.snapshot");
        record["protocolVersion"] = json!("narad/v1");
        record["timestamp"] = json!("2026-08-05T04:00:00Z");
        let shown =
            |r: &Reducer| serde_json::to_value(r.transcript(&[RunId::new("r1").unwrap()])).unwrap();
        // A client hydrated with the snapshot shows the transcript at once,
        // then reduces the authority; what the snapshot covers is not
        // applied twice.
        let mut hydrated = Reducer::new(ProfileSet::all());
        hydrated.deliver_json(&record).unwrap();
        assert_eq!(shown(&hydrated), shown(&whole));
        let more = event(
            7,
            "message.text.delta",
            at(6),
            json!({"messageId": "a1", "delta": "lo"}),
        );
        whole.deliver_json(&more).unwrap();
        for l in lines.iter().chain([&more]) {
            hydrated.deliver_json(l).unwrap();
        }
        assert_eq!(shown(&hydrated), shown(&whole));

        // Reasoning not yet joined to a message of the transcript.
        let mut open = Reducer::new(ProfileSet::all());
        for l in &lines[..4] {
            open.deliver_json(l).unwrap();
        }
        assert_eq!(open.messages_snapshot("snap-2", "s", 4), None);
    }

    #[test]
    fn nested_run_messages_show_only_when_the_run_is_opened() {
        let mut r = Reducer::new(ProfileSet::all());
        let lines = [
            event(1, "run.started", Some(("r1", "r1", 1)), json!({})),
            event(
                2,
                "run.started",
                Some(("r1", "r2", 2)),
                json!({"parentRunId": "r1"}),
            ),
            event(
                3,
                "message.user.recorded",
                Some(("r1", "r2", 3)),
                json!({"messageId": "m", "messageScope": "run", "content": "nested"}),
            ),
        ];
        for l in &lines {
            r.deliver_json(l).unwrap();
        }
        assert!(r.transcript(&[]).is_empty());
        let opened = r.transcript(&[RunId::new("r2").unwrap()]);
        assert_eq!(opened.len(), 1);
    }

    #[test]
    fn control_messages_are_ignored_never_acted_on() {
        let mut r = Reducer::new(ProfileSet::all());
        let before = r.to_json();
        let execute = json!({"protocolVersion": "narad/v1", "type": "client.tool.execute",
            "clientExecutorId": "d", "leaseId": "l", "executionToken": "t",
            "executionTokenExpiresAt": "2026-08-05T04:01:00Z", "toolCallId": "tc", "toolName": "x", "args": {}});
        assert_eq!(r.deliver_json(&execute).unwrap(), Delivered::Ignored);
        assert_eq!(r.to_json(), before);
    }
}
