//! The registry of wire types and the typed wire objects built from it.
//!
//! One table below lists every type the protocol names: its wire name,
//! profile, kind and (for authority) placement. The [`WireType`] enum, the
//! four body enums and the typed parse are all generated from that table,
//! so a type cannot be half-registered.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::authority::*;
use crate::control::*;
use crate::envelope::{
    AuthorityEnvelope, ControlEnvelope, FieldProblem, HydrateEnvelope, Kind, Placement,
    RawAuthorityEnvelope, WatchEnvelope,
};
use crate::hydrate::*;
use crate::profile::Profile;
use crate::watch::*;

macro_rules! wire_types {
    (
        authority { $($a_var:ident($a_ty:ty) = $a_name:literal, $a_prof:ident, $a_place:ident;)* }
        watch { $($w_var:ident($w_ty:ty) = $w_name:literal, $w_prof:ident;)* }
        hydrate { $($h_var:ident($h_ty:ty) = $h_name:literal, $h_prof:ident;)* }
        control { $($c_var:ident($c_ty:ty) = $c_name:literal, $c_prof:ident;)* }
    ) => {
        /// Every wire type narad/v1 names, across all profiles and kinds.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(missing_docs)] // each variant is documented by its body type
        pub enum WireType {
            $($a_var,)* $($w_var,)* $($h_var,)* $($c_var,)*
        }

        impl WireType {
            /// All wire types, in registry order.
            pub const ALL: &'static [WireType] = &[
                $(WireType::$a_var,)* $(WireType::$w_var,)*
                $(WireType::$h_var,)* $(WireType::$c_var,)*
            ];

            /// The wire name, e.g. `run.started`.
            pub fn name(self) -> &'static str {
                match self {
                    $(WireType::$a_var => $a_name,)* $(WireType::$w_var => $w_name,)*
                    $(WireType::$h_var => $h_name,)* $(WireType::$c_var => $c_name,)*
                }
            }

            /// The type with this wire name.
            pub fn from_name(name: &str) -> Option<WireType> {
                match name {
                    $($a_name => Some(WireType::$a_var),)* $($w_name => Some(WireType::$w_var),)*
                    $($h_name => Some(WireType::$h_var),)* $($c_name => Some(WireType::$c_var),)*
                    _ => None,
                }
            }

            /// The profile that defines the type.
            pub fn profile(self) -> Profile {
                match self {
                    $(WireType::$a_var => Profile::$a_prof,)* $(WireType::$w_var => Profile::$w_prof,)*
                    $(WireType::$h_var => Profile::$h_prof,)* $(WireType::$c_var => Profile::$c_prof,)*
                }
            }

            /// Authority, watch, hydrate or control.
            pub fn kind(self) -> Kind {
                match self {
                    $(WireType::$a_var => Kind::Authority,)* $(WireType::$w_var => Kind::Watch,)*
                    $(WireType::$h_var => Kind::Hydrate,)* $(WireType::$c_var => Kind::Control,)*
                }
            }

            /// For authority types, which ordering positions the type
            /// carries; [`Placement::SCOPED`] when its body decides.
            pub fn placement(self) -> Option<Placement> {
                match self {
                    $(WireType::$a_var => Some(Placement::$a_place),)*
                    _ => None,
                }
            }
        }

        /// The type-specific part of an authority event, tagged by `type`.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(tag = "type")]
        #[allow(missing_docs)]
        pub enum AuthorityBody {
            $(#[serde(rename = $a_name)] $a_var($a_ty),)*
        }

        impl AuthorityBody {
            /// The body's wire type.
            pub fn wire_type(&self) -> WireType {
                match self { $(AuthorityBody::$a_var(_) => WireType::$a_var,)* }
            }

            fn parse(t: WireType, v: &Value) -> Result<Self, FieldProblem> {
                match t {
                    $(WireType::$a_var => deserialize(v).map(AuthorityBody::$a_var),)*
                    _ => unreachable!("{} is not an authority type", t.name()),
                }
            }
        }

        /// The type-specific part of a watch event, tagged by `type`.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(tag = "type")]
        #[allow(missing_docs)]
        pub enum WatchBody {
            $(#[serde(rename = $w_name)] $w_var($w_ty),)*
        }

        impl WatchBody {
            /// The body's wire type.
            pub fn wire_type(&self) -> WireType {
                match self { $(WatchBody::$w_var(_) => WireType::$w_var,)* }
            }

            fn parse(t: WireType, v: &Value) -> Result<Self, FieldProblem> {
                match t {
                    $(WireType::$w_var => deserialize(v).map(WatchBody::$w_var),)*
                    _ => unreachable!("{} is not a watch type", t.name()),
                }
            }
        }

        /// The type-specific part of a hydrate record, tagged by `type`.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(tag = "type")]
        #[allow(missing_docs)]
        pub enum HydrateBody {
            $(#[serde(rename = $h_name)] $h_var($h_ty),)*
        }

        impl HydrateBody {
            /// The body's wire type.
            pub fn wire_type(&self) -> WireType {
                match self { $(HydrateBody::$h_var(_) => WireType::$h_var,)* }
            }

            fn parse(t: WireType, v: &Value) -> Result<Self, FieldProblem> {
                match t {
                    $(WireType::$h_var => deserialize(v).map(HydrateBody::$h_var),)*
                    _ => unreachable!("{} is not a hydrate type", t.name()),
                }
            }
        }

        /// The type-specific part of a control message, tagged by `type`.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(tag = "type")]
        #[allow(missing_docs)]
        pub enum ControlBody {
            $(#[serde(rename = $c_name)] $c_var($c_ty),)*
        }

        impl ControlBody {
            /// The body's wire type.
            pub fn wire_type(&self) -> WireType {
                match self { $(ControlBody::$c_var(_) => WireType::$c_var,)* }
            }

            fn parse(t: WireType, v: &Value) -> Result<Self, FieldProblem> {
                match t {
                    $(WireType::$c_var => deserialize(v).map(ControlBody::$c_var),)*
                    _ => unreachable!("{} is not a control type", t.name()),
                }
            }
        }
    };
}

wire_types! {
    authority {
        RunStarted(RunStarted) = "run.started", Core, RUN_TREE;
        RunPaused(RunPaused) = "run.paused", Core, RUN_TREE;
        RunResumed(Resumed) = "run.resumed", Core, RUN_TREE;
        RunStopRequested(RunStopRequested) = "run.stop.requested", Core, RUN_TREE;
        RunFinished(Finished) = "run.finished", Core, RUN_TREE;
        RunError(Failed) = "run.error", Core, RUN_TREE;
        RunCancelled(Cancelled) = "run.cancelled", Core, RUN_TREE;
        InterruptRequested(InterruptRequested) = "interrupt.requested", Core, SCOPED;
        InterruptResolved(InterruptResolved) = "interrupt.resolved", Core, SCOPED;
        ToolCallStarted(ToolCallStarted) = "tool.call.started", Core, RUN_TREE;
        ToolCallFinished(ToolCallFinished) = "tool.call.finished", Core, RUN_TREE;

        WorkflowStarted(WorkflowStarted) = "workflow.started", Workflow, WORKFLOW;
        WorkflowPaused(WorkflowPaused) = "workflow.paused", Workflow, WORKFLOW;
        WorkflowResumed(Resumed) = "workflow.resumed", Workflow, WORKFLOW;
        WorkflowFinished(Finished) = "workflow.finished", Workflow, WORKFLOW;
        WorkflowError(Failed) = "workflow.error", Workflow, WORKFLOW;
        WorkflowCancelled(Cancelled) = "workflow.cancelled", Workflow, WORKFLOW;
        WorkflowEdgeTaken(WorkflowEdgeTaken) = "workflow.edge.taken", Workflow, WORKFLOW;
        WorkflowStepStarted(WorkflowStepStarted) = "workflow.step.started", Workflow, WORKFLOW;

        MessageUserRecorded(MessageUserRecorded) = "message.user.recorded", Conversation, SCOPED;
        MessageTextStarted(MessageTextStarted) = "message.text.started", Conversation, SCOPED;
        MessageTextDelta(MessageTextDelta) = "message.text.delta", Conversation, SCOPED;
        MessageTextCompleted(MessageTextCompleted) = "message.text.completed", Conversation, SCOPED;
        ReasoningStarted(ReasoningStarted) = "reasoning.started", Conversation, SCOPED;
        ReasoningDelta(ReasoningDelta) = "reasoning.delta", Conversation, SCOPED;
        ReasoningCompleted(ReasoningCompleted) = "reasoning.completed", Conversation, SCOPED;
        MessageRedacted(MessageRedacted) = "message.redacted", Conversation, SCOPED;

        AttachmentAdded(AttachmentAdded) = "attachment.added", Attachments, SCOPED;
        AttachmentReady(AttachmentReady) = "attachment.ready", Attachments, SCOPED;
        AttachmentFailed(AttachmentFailed) = "attachment.failed", Attachments, SCOPED;
        AttachmentRemoved(AttachmentRemoved) = "attachment.removed", Attachments, SCOPED;
        ArtifactAdded(ArtifactAdded) = "artifact.added", Attachments, RUN_TREE;
        ArtifactReady(ArtifactReady) = "artifact.ready", Attachments, RUN_TREE;
        ArtifactFailed(ArtifactFailed) = "artifact.failed", Attachments, RUN_TREE;

        StateSnapshot(DocumentSnapshot) = "state.snapshot", State, SCOPED;
        StateDelta(DocumentDelta) = "state.delta", State, SCOPED;
        StateCompacted(StateCompacted) = "state.compacted", State, SCOPED;

        UiStateSnapshot(DocumentSnapshot) = "ui.state.snapshot", Ui, SCOPED;
        UiStateDelta(DocumentDelta) = "ui.state.delta", Ui, SCOPED;
        ViewOpened(ViewOpened) = "view.opened", Ui, SCOPED;
        ViewUpdated(ViewUpdated) = "view.updated", Ui, SCOPED;
        ViewClosed(ViewClosed) = "view.closed", Ui, SCOPED;

        ProgressRecorded(ProgressRecorded) = "progress.recorded", Progress, RUN_TREE;

        SessionCustom(Custom) = "session.custom", Extensions, SESSION;
        SessionRaw(Raw) = "session.raw", Extensions, SESSION;
        WorkflowCustom(Custom) = "workflow.custom", Extensions, WORKFLOW;
        WorkflowRaw(Raw) = "workflow.raw", Extensions, WORKFLOW;
        RunCustom(Custom) = "run.custom", Extensions, RUN_TREE;
        RunRaw(Raw) = "run.raw", Extensions, RUN_TREE;
        NodeCustom(NodeCustom) = "node.custom", Extensions, SCOPED;
        NodeRaw(NodeRaw) = "node.raw", Extensions, SCOPED;
    }
    watch {
        SessionRevision(SessionRevision) = "session.revision", Core;
        RunRevision(RunRevision) = "run.revision", Core;
        WorkflowRevision(WorkflowRevision) = "workflow.revision", Workflow;
        NodeRevision(NodeRevision) = "node.revision", Workspace;
        WorkspaceRevision(WorkspaceRevision) = "workspace.revision", Workspace;
        SessionCreated(SessionChanged) = "session.created", Workspace;
        SessionUpdated(SessionChanged) = "session.updated", Workspace;
        SessionArchived(SessionArchived) = "session.archived", Workspace;
    }
    hydrate {
        MessagesSnapshot(MessagesSnapshot) = "messages.snapshot", Conversation;
        GraphSnapshot(GraphSnapshot) = "graph.snapshot", Graph;
        GraphDelta(GraphDelta) = "graph.delta", Graph;
    }
    control {
        Capabilities(Capabilities) = "capabilities", Core;
        ClientAttach(ClientAttach) = "client.attach", ClientExecutor;
        ClientAttached(ClientAttached) = "client.attached", ClientExecutor;
        ServerHeartbeat(ServerHeartbeat) = "server.heartbeat", ClientExecutor;
        ClientHeartbeat(ClientHeartbeat) = "client.heartbeat", ClientExecutor;
        ClientToolExecute(ClientToolExecute) = "client.tool.execute", ClientExecutor;
        ClientToolFinish(ClientToolFinish) = "client.tool.finish", ClientExecutor;
    }
}

/// An authority event: an immutable fact of the journal.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuthorityEvent {
    /// The class fields and ordering positions.
    #[serde(flatten)]
    pub envelope: AuthorityEnvelope,
    /// The type and its fields.
    #[serde(flatten)]
    pub body: AuthorityBody,
}

/// A watch event: a scoped revision notification.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WatchEvent {
    /// The class fields.
    #[serde(flatten)]
    pub envelope: WatchEnvelope,
    /// The type and its scope ids.
    #[serde(flatten)]
    pub body: WatchBody,
}

/// A hydrate record: a derived projection.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HydrateRecord {
    /// The class fields.
    #[serde(flatten)]
    pub envelope: HydrateEnvelope,
    /// The type and its fields.
    #[serde(flatten)]
    pub body: HydrateBody,
}

/// A control message: transport traffic.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ControlMessage {
    /// The class fields.
    #[serde(flatten)]
    pub envelope: ControlEnvelope,
    /// The type and its fields.
    #[serde(flatten)]
    pub body: ControlBody,
}

/// Any wire object, by kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum WireObject {
    /// An authority event.
    Authority(AuthorityEvent),
    /// A watch event.
    Watch(WatchEvent),
    /// A hydrate record.
    Hydrate(HydrateRecord),
    /// A control message.
    Control(ControlMessage),
}

impl WireObject {
    /// The object's wire type.
    pub fn wire_type(&self) -> WireType {
        match self {
            WireObject::Authority(e) => e.body.wire_type(),
            WireObject::Watch(e) => e.body.wire_type(),
            WireObject::Hydrate(r) => r.body.wire_type(),
            WireObject::Control(m) => m.body.wire_type(),
        }
    }

    /// The object as JSON.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("wire objects always serialise")
    }

    /// Parses an object already known to be of type `t` (its version and
    /// type having been checked by the classifier).
    pub(crate) fn parse(t: WireType, v: &Value) -> Result<WireObject, FieldProblem> {
        let kind = t.kind();
        if let Some(field) = kind
            .forbidden_fields()
            .iter()
            .find(|f| v.get(**f).is_some())
        {
            let what = match kind {
                Kind::Watch => "watch events consume no authority sequence",
                _ => "hydrate records and control messages carry no eventId or sequence",
            };
            return Err((format!("/{field}"), format!("must be absent: {what}")));
        }
        Ok(match kind {
            Kind::Authority => {
                let raw: RawAuthorityEnvelope = deserialize(v)?;
                let body = AuthorityBody::parse(t, v)?;
                let (placement, why) = match t.placement() {
                    Some(p) if p != Placement::SCOPED => {
                        (p, format!("{} events have a fixed placement", t.name()))
                    }
                    _ => (
                        crate::authority::scoped_placement(&body),
                        format!("the {} event's own scope decides its placement", t.name()),
                    ),
                };
                let envelope = raw.place(placement, &why)?;
                WireObject::Authority(AuthorityEvent { envelope, body })
            }
            Kind::Watch => WireObject::Watch(WatchEvent {
                envelope: deserialize(v)?,
                body: WatchBody::parse(t, v)?,
            }),
            Kind::Hydrate => WireObject::Hydrate(HydrateRecord {
                envelope: deserialize(v)?,
                body: HydrateBody::parse(t, v)?,
            }),
            Kind::Control => WireObject::Control(ControlMessage {
                envelope: deserialize(v)?,
                body: ControlBody::parse(t, v)?,
            }),
        })
    }
}

/// Deserialises `T` from a JSON value, reporting the JSON pointer of the
/// first problem. A missing field is reported at the pointer it should
/// have had.
///
/// serde is more lenient than the wire: it reads a struct from a JSON
/// array (positional fields), and inside buffered (flattened or tagged)
/// content it reads an enum from its variant index. So the result is
/// re-serialised and compared with the input: every value the typed form
/// has must be of the same JSON type in the input, and every string equal
/// (the wire model never rewrites a string).
pub(crate) fn deserialize<'a, T: Deserialize<'a> + Serialize>(
    v: &'a Value,
) -> Result<T, FieldProblem> {
    let parsed = deserialize_lenient::<T>(v)?;
    let canonical = serde_json::to_value(&parsed).expect("wire types always serialise");
    let mut pointer = String::new();
    same_shape(v, &canonical, &mut pointer)?;
    Ok(parsed)
}

/// Checks that `input` has a value of the same JSON type wherever `typed`,
/// its typed re-serialisation, has one, and the same text wherever `typed`
/// has a string. `pointer` is the position being compared.
fn same_shape(input: &Value, typed: &Value, pointer: &mut String) -> Result<(), FieldProblem> {
    let at = pointer.len();
    match (typed, input) {
        (Value::Object(t), Value::Object(i)) => {
            for (k, tv) in t {
                if let Some(iv) = i.get(k) {
                    pointer.push('/');
                    pointer.push_str(&escape_pointer_token(k));
                    same_shape(iv, tv, pointer)?;
                    pointer.truncate(at);
                }
            }
            Ok(())
        }
        (Value::Array(t), Value::Array(i)) => {
            for (n, (tv, iv)) in t.iter().zip(i).enumerate() {
                pointer.push('/');
                pointer.push_str(&n.to_string());
                same_shape(iv, tv, pointer)?;
                pointer.truncate(at);
            }
            Ok(())
        }
        (Value::String(t), Value::String(i)) if t != i => Err((
            pointer.clone(),
            format!("invalid value {i:?}, expected {t:?}"),
        )),
        (t, i) if json_type(t) != json_type(i) => Err((
            pointer.clone(),
            format!("invalid type: {}, expected {}", json_type(i), json_type(t)),
        )),
        _ => Ok(()),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// serde's own reading, with the pointer of the first problem.
fn deserialize_lenient<'a, T: Deserialize<'a>>(v: &'a Value) -> Result<T, FieldProblem> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let mut pointer = String::new();
        for segment in e.path().iter() {
            use serde_path_to_error::Segment;
            match segment {
                Segment::Seq { index } => {
                    pointer.push('/');
                    pointer.push_str(&index.to_string());
                }
                Segment::Map { key } => {
                    pointer.push('/');
                    pointer.push_str(&escape_pointer_token(key));
                }
                Segment::Enum { .. } | Segment::Unknown => {}
            }
        }
        let message = e.inner().to_string();
        if let Some(field) = missing_field(&message) {
            pointer.push('/');
            pointer.push_str(&escape_pointer_token(field));
        }
        (pointer, message)
    })
}

/// The field name in serde's "missing field `x`" message.
fn missing_field(message: &str) -> Option<&str> {
    message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next())
}

/// Escapes one JSON pointer reference token (RFC 6901).
pub fn escape_pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}
