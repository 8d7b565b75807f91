//! Conversation, attachments, artifacts, state and UI documents, views and
//! extensions (§9.2–§9.6, §9.9). Checks first, mutates last.

use serde_json::Value;

use super::lifecycle::ended;
use super::{Document, DocumentFamily, Placed, SessionState, StreamState, ViewState, violation};
use crate::authority::{DocumentDelta, DocumentSnapshot, Patch, StateCompacted, ViewUpdate};
use crate::rules::{self, Rule, Violation};
use crate::wire::{AuthorityBody as B, AuthorityEvent};

impl SessionState {
    pub(super) fn content(&mut self, event: &AuthorityEvent) -> Result<(), Violation> {
        let run = self
            .placed_run(event)?
            .map(|(id, r)| (id.clone(), r.status.is_terminal()));
        if run.is_none() {
            // A workflow-scoped item needs its workflow open; the extension
            // events may still annotate an ended workflow.
            if !matches!(event.body, B::WorkflowCustom(_) | B::WorkflowRaw(_)) {
                self.workflow_open(event)?;
            }
        }
        let streamed = matches!(
            event.body,
            B::MessageUserRecorded(_)
                | B::MessageTextStarted(_)
                | B::MessageTextDelta(_)
                | B::MessageTextCompleted(_)
                | B::ReasoningStarted(_)
                | B::ReasoningDelta(_)
                | B::ReasoningCompleted(_)
        );
        if let Some((run_id, true)) = &run
            && streamed
        {
            return Err(ended(run_id, event.body.wire_type().name()));
        }
        let placed = Placed::of(event);
        match &event.body {
            B::MessageUserRecorded(b) => {
                self.new_message(&b.message_id, placed, true)?;
            }
            B::MessageTextStarted(b) => {
                self.new_message(&b.message_id, placed, false)?;
            }
            B::MessageTextDelta(b) => self.message_step(&b.message_id, &placed, false)?,
            B::MessageTextCompleted(b) => self.message_step(&b.message_id, &placed, true)?,
            B::ReasoningStarted(b) => {
                if self.reasoning.contains_key(&b.reasoning_id) {
                    return Err(violation(
                        rules::REASONING_ID_UNIQUE,
                        format!("reasoning {} was already started", b.reasoning_id),
                    ));
                }
                self.reasoning.insert(
                    b.reasoning_id.clone(),
                    StreamState {
                        placed,
                        completed: false,
                    },
                );
            }
            B::ReasoningDelta(b) => self.reasoning_step(b.reasoning_id.as_str(), false)?,
            B::ReasoningCompleted(b) => self.reasoning_step(b.reasoning_id.as_str(), true)?,
            B::MessageRedacted(b) => {
                if !self.messages.contains_key(&b.message_id) {
                    return Err(violation(
                        rules::MESSAGE_UNKNOWN,
                        format!("message {} was never recorded or started", b.message_id),
                    ));
                }
            }
            B::AttachmentAdded(b) => {
                if self.attachments.contains_key(&b.attachment_id) {
                    return Err(violation(
                        rules::ATTACHMENT_ID_UNIQUE,
                        format!("attachment {} was already added", b.attachment_id),
                    ));
                }
                self.attachments.insert(b.attachment_id.clone(), true);
            }
            B::AttachmentReady(b) => self.attachment_step(b.attachment_id.as_str(), false)?,
            B::AttachmentFailed(b) => self.attachment_step(b.attachment_id.as_str(), false)?,
            B::AttachmentRemoved(b) => self.attachment_step(b.attachment_id.as_str(), true)?,
            B::ArtifactAdded(b) => {
                if !self.artifacts.insert(b.artifact_id.clone()) {
                    return Err(violation(
                        rules::ARTIFACT_ID_UNIQUE,
                        format!("artifact {} was already added", b.artifact_id),
                    ));
                }
            }
            B::ArtifactReady(b) => self.artifact_known(b.artifact_id.as_str())?,
            B::ArtifactFailed(b) => self.artifact_known(b.artifact_id.as_str())?,
            B::StateSnapshot(b) => self.snapshot(DocumentFamily::State, b)?,
            B::UiStateSnapshot(b) => self.snapshot(DocumentFamily::Ui, b)?,
            B::StateDelta(b) => self.delta(DocumentFamily::State, b)?,
            B::UiStateDelta(b) => self.delta(DocumentFamily::Ui, b)?,
            B::StateCompacted(b) => self.compacted(event, b)?,
            B::ViewOpened(b) => {
                if self.views.contains_key(&b.view_id) {
                    return Err(violation(
                        rules::VIEW_ID_UNIQUE,
                        format!("view {} was already opened", b.view_id),
                    ));
                }
                let state = b
                    .state
                    .clone()
                    .unwrap_or_else(|| Value::Object(Default::default()));
                self.views
                    .insert(b.view_id.clone(), ViewState { open: true, state });
            }
            B::ViewUpdated(b) => {
                let view = self.open_view(b.view_id.as_str())?;
                let state = match &b.update {
                    ViewUpdate::Replace { state } => state.clone(),
                    ViewUpdate::Patch { patch } => patched(
                        &view.state,
                        patch,
                        rules::VIEW_PATCH_APPLIES,
                        "the view's state",
                    )?,
                };
                self.views.get_mut(&b.view_id).expect("open").state = state;
            }
            B::ViewClosed(b) => {
                self.open_view(b.view_id.as_str())?;
                self.views.get_mut(&b.view_id).expect("open").open = false;
            }
            // Extensions never change lifecycle; unknown names are ignored.
            B::SessionCustom(_)
            | B::SessionRaw(_)
            | B::WorkflowCustom(_)
            | B::WorkflowRaw(_)
            | B::NodeCustom(_)
            | B::NodeRaw(_) => {}
            other => unreachable!(
                "{} is handled by the lifecycle rules",
                other.wire_type().name()
            ),
        }
        Ok(())
    }

    fn new_message(
        &mut self,
        id: &crate::primitives::MessageId,
        placed: Placed,
        completed: bool,
    ) -> Result<(), Violation> {
        if self.messages.contains_key(id) {
            return Err(violation(
                rules::MESSAGE_ID_UNIQUE,
                format!("message {id} was already recorded or started"),
            ));
        }
        self.messages
            .insert(id.clone(), StreamState { placed, completed });
        Ok(())
    }

    fn message_step(
        &mut self,
        id: &crate::primitives::MessageId,
        placed: &Placed,
        completes: bool,
    ) -> Result<(), Violation> {
        let Some(m) = self.messages.get(id) else {
            return Err(violation(
                rules::MESSAGE_TEXT_NOT_STARTED,
                format!("message {id} has not started"),
            ));
        };
        if m.completed {
            return Err(violation(
                rules::MESSAGE_TEXT_COMPLETED,
                format!("message {id} is already complete"),
            ));
        }
        if &m.placed != placed {
            return Err(violation(
                rules::MESSAGE_SCOPE_MATCH,
                format!(
                    "message {id} started in {}; its events carry the same ordering fields",
                    describe(&m.placed)
                ),
            ));
        }
        if completes {
            self.messages.get_mut(id).expect("exists").completed = true;
        }
        Ok(())
    }

    fn reasoning_step(&mut self, id: &str, completes: bool) -> Result<(), Violation> {
        let Some((key, r)) = self.reasoning.iter().find(|(k, _)| k.as_str() == id) else {
            return Err(violation(
                rules::REASONING_NOT_STARTED,
                format!("reasoning {id} has not started"),
            ));
        };
        if r.completed {
            return Err(violation(
                rules::REASONING_COMPLETED,
                format!("reasoning {id} is already complete"),
            ));
        }
        if completes {
            let key = key.clone();
            self.reasoning.get_mut(&key).expect("exists").completed = true;
        }
        Ok(())
    }

    fn attachment_step(&mut self, id: &str, removes: bool) -> Result<(), Violation> {
        match self.attachments.iter_mut().find(|(k, _)| k.as_str() == id) {
            Some((_, present)) if *present => {
                if removes {
                    *present = false;
                }
                Ok(())
            }
            Some(_) => Err(violation(
                rules::ATTACHMENT_UNKNOWN,
                format!("attachment {id} was removed"),
            )),
            None => Err(violation(
                rules::ATTACHMENT_UNKNOWN,
                format!("attachment {id} was never added"),
            )),
        }
    }

    fn artifact_known(&self, id: &str) -> Result<(), Violation> {
        if self.artifacts.iter().any(|a| a.as_str() == id) {
            Ok(())
        } else {
            Err(violation(
                rules::ARTIFACT_UNKNOWN,
                format!("artifact {id} was never added"),
            ))
        }
    }

    fn document(&self, family: DocumentFamily, scope: &str) -> Option<&Document> {
        self.documents.get(&family).and_then(|d| d.get(scope))
    }

    fn snapshot(&mut self, family: DocumentFamily, b: &DocumentSnapshot) -> Result<(), Violation> {
        let scope = b.scope.as_str();
        let current = self.document(family, scope).map_or(0, |d| d.revision);
        if b.revision.get() < current {
            return Err(violation(
                rules::STATE_REVISION_REGRESS,
                format!(
                    "snapshot revision {} of {scope} is below its current revision {current}",
                    b.revision
                ),
            ));
        }
        self.documents.entry(family).or_default().insert(
            scope.to_owned(),
            Document {
                revision: b.revision.get(),
                state: b.state.clone(),
            },
        );
        Ok(())
    }

    fn delta(&mut self, family: DocumentFamily, b: &DocumentDelta) -> Result<(), Violation> {
        let scope = b.scope.as_str();
        if b.revision.get() != b.base_revision.get() + 1 {
            return Err(violation(
                rules::STATE_REVISION_CONTIGUOUS,
                format!(
                    "revision {} follows baseRevision {}; it must be {}",
                    b.revision,
                    b.base_revision,
                    b.base_revision.get() + 1
                ),
            ));
        }
        let empty = Document::default();
        let doc = self.document(family, scope).unwrap_or(&empty);
        if b.base_revision.get() != doc.revision {
            return Err(violation(
                rules::STATE_REVISION_BASE,
                format!(
                    "baseRevision {} of {scope}, whose current revision is {}",
                    b.base_revision, doc.revision
                ),
            ));
        }
        let state = patched(&doc.state, &b.patch, rules::STATE_PATCH_APPLIES, scope)?;
        self.documents.entry(family).or_default().insert(
            scope.to_owned(),
            Document {
                revision: b.revision.get(),
                state,
            },
        );
        Ok(())
    }

    fn compacted(&self, event: &AuthorityEvent, b: &StateCompacted) -> Result<(), Violation> {
        let scope = b.scope.as_str();
        let revision = self
            .document(DocumentFamily::State, scope)
            .map_or(0, |d| d.revision);
        let seq = event.envelope.session_sequence.get();
        if b.snapshot_revision.get() > revision || b.covers_through_session_sequence.get() >= seq {
            return Err(violation(
                rules::STATE_COMPACTED_BOUNDS,
                format!(
                    "compaction of {scope} to revision {} through sessionSequence {} must stay within revision {revision} and before sessionSequence {seq}",
                    b.snapshot_revision, b.covers_through_session_sequence
                ),
            ));
        }
        Ok(())
    }

    fn open_view(&self, id: &str) -> Result<&ViewState, Violation> {
        match self.views.iter().find(|(k, _)| k.as_str() == id) {
            Some((_, v)) if v.open => Ok(v),
            Some(_) => Err(violation(
                rules::VIEW_UNKNOWN,
                format!("view {id} is closed"),
            )),
            None => Err(violation(
                rules::VIEW_UNKNOWN,
                format!("view {id} was never opened"),
            )),
        }
    }
}

/// `state` with `patch` applied, or a violation of `rule`.
fn patched(state: &Value, patch: &Patch, rule: Rule, what: &str) -> Result<Value, Violation> {
    let mut next = state.clone();
    json_patch::patch(&mut next, patch)
        .map_err(|e| violation(rule, format!("the patch does not apply to {what}: {e}")))?;
    Ok(next)
}

fn describe(p: &Placed) -> String {
    match (&p.run_id, &p.workflow_id) {
        (Some(r), _) => format!("run {r}"),
        (None, Some(w)) => format!("workflow {w}"),
        (None, None) => "the session".to_owned(),
    }
}
