//! Protocol profiles (§2.1): the core set and the optional profiles a
//! client negotiates, each owning a namespace of wire type names.
//!
//! The namespaces decide how an *unknown* type is treated (§13): one that
//! falls in a negotiated profile's namespace fails closed; one in no
//! negotiated namespace is ignored.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One protocol profile. `Core` is always active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Profile {
    /// The 13 core authority and watch types, and the capability document.
    #[serde(rename = "narad.core/v1")]
    Core,
    /// Workflow lifecycle, edges and steps.
    #[serde(rename = "narad.workflow/v1")]
    Workflow,
    /// Messages, reasoning, redaction and transcript snapshots.
    #[serde(rename = "narad.conversation/v1")]
    Conversation,
    /// Attachments (admitted inputs) and artifacts (produced outputs).
    #[serde(rename = "narad.attachments/v1")]
    Attachments,
    /// Shared state documents.
    #[serde(rename = "narad.state/v1")]
    State,
    /// UI state and views.
    #[serde(rename = "narad.ui/v1")]
    Ui,
    /// Deterministic run graphs (hydrate records).
    #[serde(rename = "narad.graph/v1")]
    Graph,
    /// Run activity facts.
    #[serde(rename = "narad.progress/v1")]
    Progress,
    /// `*.custom` and `*.raw` extension events.
    #[serde(rename = "narad.extensions/v1")]
    Extensions,
    /// Workspace-level watch events and session catalogue changes.
    #[serde(rename = "narad.workspace/v1")]
    Workspace,
    /// The control messages of client execution (§11).
    #[serde(rename = "narad.client-executor/v1")]
    ClientExecutor,
}

impl Profile {
    /// Every profile, core first.
    pub const ALL: [Profile; 11] = [
        Profile::Core,
        Profile::Workflow,
        Profile::Conversation,
        Profile::Attachments,
        Profile::State,
        Profile::Ui,
        Profile::Graph,
        Profile::Progress,
        Profile::Extensions,
        Profile::Workspace,
        Profile::ClientExecutor,
    ];

    /// The id a client negotiates, e.g. `narad.graph/v1`.
    pub fn id(self) -> &'static str {
        match self {
            Profile::Core => "narad.core/v1",
            Profile::Workflow => "narad.workflow/v1",
            Profile::Conversation => "narad.conversation/v1",
            Profile::Attachments => "narad.attachments/v1",
            Profile::State => "narad.state/v1",
            Profile::Ui => "narad.ui/v1",
            Profile::Graph => "narad.graph/v1",
            Profile::Progress => "narad.progress/v1",
            Profile::Extensions => "narad.extensions/v1",
            Profile::Workspace => "narad.workspace/v1",
            Profile::ClientExecutor => "narad.client-executor/v1",
        }
    }

    /// The profile with this id.
    pub fn from_id(id: &str) -> Option<Profile> {
        Profile::ALL.into_iter().find(|p| p.id() == id)
    }

    /// The type-name prefixes this profile owns. An unknown type starting
    /// with one of them, read by a client that negotiated this profile,
    /// fails closed.
    pub fn namespaces(self) -> &'static [&'static str] {
        match self {
            Profile::Core => &["run.", "interrupt.", "tool.", "session."],
            Profile::Workflow => &["workflow."],
            Profile::Conversation => &["message.", "messages.", "reasoning."],
            Profile::Attachments => &["attachment.", "artifact."],
            Profile::State => &["state."],
            Profile::Ui => &["ui.", "view."],
            Profile::Graph => &["graph."],
            Profile::Progress => &["progress."],
            Profile::Extensions => &["node."],
            Profile::Workspace => &["workspace.", "node."],
            Profile::ClientExecutor => &["client.", "server."],
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// A set of negotiated profiles. Always contains [`Profile::Core`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProfileSet(u16);

impl ProfileSet {
    /// Core only.
    pub fn core() -> Self {
        Self(Profile::Core.bit())
    }

    /// Every profile this implementation knows.
    pub fn all() -> Self {
        Profile::ALL.into_iter().collect()
    }

    /// Whether the set holds `p`.
    pub fn contains(self, p: Profile) -> bool {
        self.0 & p.bit() != 0
    }

    /// The set with `p` added.
    pub fn with(self, p: Profile) -> Self {
        Self(self.0 | p.bit())
    }

    /// The profiles in the set, core first.
    pub fn iter(self) -> impl Iterator<Item = Profile> {
        Profile::ALL.into_iter().filter(move |p| self.contains(*p))
    }

    /// The set named by a list of profile ids. Unknown ids are returned
    /// separately so that a caller can ignore them (negotiation keeps what
    /// both sides know) or refuse them.
    pub fn from_ids<'a>(ids: impl IntoIterator<Item = &'a str>) -> (Self, Vec<&'a str>) {
        let mut set = Self::core();
        let mut unknown = Vec::new();
        for id in ids {
            match Profile::from_id(id) {
                Some(p) => set = set.with(p),
                None => unknown.push(id),
            }
        }
        (set, unknown)
    }

    /// The negotiated profile whose namespace an unknown type name claims.
    pub fn claiming(self, type_name: &str) -> Option<Profile> {
        self.iter()
            .find(|p| p.namespaces().iter().any(|ns| type_name.starts_with(ns)))
    }
}

impl FromIterator<Profile> for ProfileSet {
    fn from_iter<I: IntoIterator<Item = Profile>>(iter: I) -> Self {
        iter.into_iter().fold(Self::core(), Self::with)
    }
}

impl fmt::Debug for ProfileSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter().map(Profile::id)).finish()
    }
}

impl Default for ProfileSet {
    fn default() -> Self {
        Self::core()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_match_serde() {
        for p in Profile::ALL {
            assert_eq!(Profile::from_id(p.id()), Some(p));
            assert_eq!(serde_json::to_value(p).unwrap(), p.id());
        }
    }

    #[test]
    fn core_is_always_in_the_set() {
        let (set, unknown) = ProfileSet::from_ids(["narad.graph/v1", "acme.x/v1"]);
        assert!(set.contains(Profile::Core));
        assert!(set.contains(Profile::Graph));
        assert!(!set.contains(Profile::Workflow));
        assert_eq!(unknown, ["acme.x/v1"]);
    }

    #[test]
    fn unknown_types_are_claimed_by_negotiated_namespaces_only() {
        let set = ProfileSet::core();
        assert_eq!(set.claiming("run.teleported"), Some(Profile::Core));
        assert_eq!(set.claiming("workflow.teleported"), None);
        assert_eq!(
            set.with(Profile::Workflow).claiming("workflow.teleported"),
            Some(Profile::Workflow)
        );
        assert_eq!(set.claiming("acme.thing"), None);
    }
}
