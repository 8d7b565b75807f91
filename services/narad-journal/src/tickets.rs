//! Stream tickets: short-lived credentials for one stream, which a browser
//! page puts in the stream's URL (its `EventSource` cannot send an
//! `Authorization` header). A ticket is 32 random bytes; only their SHA-256
//! is stored, with what the issuing token allowed and the stream it names.

use std::time::Duration;

use base64::Engine;
use sha2::{Digest, Sha256};

use crate::{Journal, JournalError, TenantId, in_tenant};

/// The prefix of every ticket, so that one is recognisable in a leak scan.
pub const PREFIX: &str = "nst_";

/// Random bytes in a ticket.
const TICKET_BYTES: usize = 32;

/// What a ticket allows: the issuing token's subject, roles and sessions,
/// for one stream, until the token's own end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TicketGrant {
    /// The tenant.
    pub tenant: TenantId,
    /// The subject of the token that asked for it.
    pub subject: String,
    /// Its roles, by name.
    pub roles: Vec<String>,
    /// The sessions it was limited to, when it was.
    pub sessions: Option<Vec<String>>,
    /// The stream: `session:<id>` or `events`.
    pub stream: String,
    /// The last second (since the epoch) the token is accepted.
    pub valid_until: Option<u64>,
}

fn digest(ticket: &str) -> Vec<u8> {
    Sha256::digest(ticket.as_bytes()).to_vec()
}

impl Journal {
    /// Issues a ticket for `grant`, usable for `lifetime` (to open the
    /// stream and to reconnect to it) and never past the issuing token's
    /// end (`valid_until`): a ticket is refused from the second its token
    /// would be. Returns the ticket and when it expires (RFC 3339). Expired tickets of the tenant are forgotten on
    /// the way.
    pub async fn issue_stream_ticket(
        &self,
        grant: &TicketGrant,
        lifetime: Duration,
    ) -> Result<(String, String), JournalError> {
        let mut bytes = [0u8; TICKET_BYTES];
        getrandom::fill(&mut bytes)
            .map_err(|e| JournalError::Corrupt(format!("no randomness for a ticket: {e}")))?;
        let ticket = format!(
            "{PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
        );
        let hash = digest(&ticket);
        let valid_until = grant.valid_until.map(|v| v.min(i64::MAX as u64) as i64);
        let millis = lifetime.as_millis() as i64;
        let client = self.pool.get().await?;
        let expires_at = in_tenant(client, &grant.tenant, async |c| {
            c.execute(
                "delete from stream_tickets where tenant_id = $1 and expires_at < now()",
                &[&grant.tenant.as_str()],
            )
            .await?;
            let row = c
                .query_one(
                "insert into stream_tickets \
                 (ticket_hash, tenant_id, subject, roles, sessions, stream, valid_until, expires_at) \
                 values ($1, $2, $3, $4, $5, $6, $7, \
                         least(now() + $8 * interval '1 millisecond', to_timestamp($7::bigint))) \
                 returning rfc3339(expires_at)",
                &[
                    &hash,
                    &grant.tenant.as_str(),
                    &grant.subject,
                    &grant.roles,
                    &grant.sessions,
                    &grant.stream,
                    &valid_until,
                    &(millis as f64),
                ],
            )
            .await?;
            Ok(row.get::<_, String>(0))
        })
        .await?;
        Ok((ticket, expires_at))
    }

    /// What a live ticket allows; `None` for one that is unknown, expired
    /// or not a ticket at all.
    pub async fn stream_ticket(&self, ticket: &str) -> Result<Option<TicketGrant>, JournalError> {
        if !ticket.starts_with(PREFIX) {
            return Ok(None);
        }
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "select tenant_id, subject, roles, sessions, stream, valid_until \
                 from stream_ticket($1)",
                &[&digest(ticket)],
            )
            .await?;
        row.map(|r| {
            Ok(TicketGrant {
                tenant: TenantId::new(r.get::<_, String>(0)).map_err(JournalError::Corrupt)?,
                subject: r.get(1),
                roles: r.get(2),
                sessions: r.get(3),
                stream: r.get(4),
                valid_until: r.get::<_, Option<i64>>(5).map(|v| v.max(0) as u64),
            })
        })
        .transpose()
    }
}
