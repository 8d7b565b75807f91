//! Which session a command may act on. Every command of a session runs
//! under an [`Authorized`]: the one proof that its caller may act on that
//! session, which only [`Caller::authorize`] makes. The journal's command
//! functions take it instead of a tenant and act within its session alone,
//! so that no route can reach a session its caller may not see.
//!
//! A command that names its object by id (stop-run, resolve-interrupt,
//! cancel-workflow) finds the owning session first with
//! [`Journal::owning_session`] — by the `sessionId` it gives, else by the
//! id — and is then authorized against that session like any other.

use narad_protocol::authority::Actor;
use narad_protocol::engine::Issuer;
use narad_protocol::primitives::SessionId;

use crate::{AppendOptions, Journal, JournalError, TenantId, in_tenant};

/// Who calls a command, as the journal needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The tenant.
    pub tenant: TenantId,
    /// Who, as the events the command builds record it.
    pub actor: Actor,
    /// The sessions the caller is limited to, when its credential limits
    /// them.
    pub sessions: Option<Vec<String>>,
}

/// A caller allowed to act on one session of its tenant: made only by
/// [`Caller::authorize`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorized {
    tenant: TenantId,
    session: SessionId,
    actor: Actor,
}

/// The answer to a caller limited to other sessions: the same wherever a
/// session is refused.
pub fn session_refused(session: &str) -> String {
    format!(
        "this token is limited to other sessions (its `sessions` claim does not name \
         {session:?}); ask for a token that names it"
    )
}

impl Caller {
    /// Whether the caller may see the session at all.
    pub fn may_see(&self, session: &str) -> bool {
        self.sessions
            .as_ref()
            .is_none_or(|allowed| allowed.iter().any(|s| s == session))
    }

    /// The caller, allowed to act on `session`; refused when its
    /// credential is limited to other sessions.
    pub fn authorize(&self, session: &SessionId) -> Result<Authorized, JournalError> {
        if !self.may_see(session.as_str()) {
            return Err(JournalError::Forbidden(session_refused(session.as_str())));
        }
        Ok(Authorized {
            tenant: self.tenant.clone(),
            session: session.clone(),
            actor: self.actor.clone(),
        })
    }
}

impl Authorized {
    /// The tenant.
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    /// The session the caller may act on.
    pub fn session(&self) -> &SessionId {
        &self.session
    }

    /// Who acts.
    pub fn actor(&self) -> &Actor {
        &self.actor
    }

    /// The options of an append on the caller's behalf: the events it
    /// builds carry the caller as their actor.
    pub(crate) fn options(&self) -> AppendOptions {
        AppendOptions {
            issuer: Issuer::Command(self.actor.clone()),
            ..AppendOptions::default()
        }
    }
}

impl Journal {
    /// The session that holds the `kind` entity `id` (`run`, `interrupt`,
    /// `workflow`): `session` when the command names one (the entity is
    /// then looked up there alone, by the command), else the one session
    /// using the id. An id used in several sessions is refused, naming
    /// none of them, with `field` pointing at `sessionId`.
    pub async fn owning_session(
        &self,
        tenant: &TenantId,
        kind: &str,
        id: &str,
        field: &str,
        session: Option<&SessionId>,
    ) -> Result<SessionId, JournalError> {
        if let Some(session) = session {
            return Ok(session.clone());
        }
        let client = self.pool.get().await?;
        let rows = in_tenant(client, tenant, async |c| {
            Ok(c.query(
                "select session_id from entities where tenant_id = $1 and kind = $2 and id = $3 \
                 limit 2",
                &[&tenant.as_str(), &kind, &id],
            )
            .await?)
        })
        .await?;
        match rows.as_slice() {
            [] => Err(JournalError::NotFound(format!("{kind} {id}"))),
            [row] => SessionId::new(row.get::<_, String>(0)).map_err(JournalError::Corrupt),
            _ => Err(JournalError::Ambiguous {
                pointer: "/sessionId",
                message: format!(
                    "{field} {id:?} is used in several sessions; add sessionId to name the \
                     session of the {kind} meant"
                ),
            }),
        }
    }
}
