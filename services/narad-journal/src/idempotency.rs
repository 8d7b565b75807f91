//! Idempotency keys: the first answer to a request that carried an
//! `Idempotency-Key`, kept per tenant and key with a fingerprint of the
//! request, so that the same request sent again (its answer was lost)
//! gets the same answer instead of a second effect.
//!
//! A key's life: [`Journal::idempotency_begin`] claims it for a request
//! (in flight, held by the caller until a deadline it keeps pushing with
//! [`Journal::idempotency_hold`]); [`Journal::idempotency_complete`] keeps
//! the answer, or [`Journal::idempotency_abandon`] lets the key go when the
//! answer must not be kept (the server failed, a limit refused it before
//! anything was done). A holder that dies leaves the key in flight until
//! its deadline passes; the next request with the key then runs again.

use std::time::Duration;

use crate::{Journal, JournalError, TenantId, in_tenant_at_once};

/// What a request with a key may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyClaim {
    /// The key is the caller's now: run the request, then complete or
    /// abandon it.
    Claimed,
    /// The same request was answered before: answer this again.
    Answered(KeptAnswer),
    /// The first request with the key is still running (for about
    /// `held_for` more).
    InFlight {
        /// How long its holder holds it at most, unless it pushes on.
        held_for: Duration,
    },
    /// The key was used with another request (its fingerprint differs).
    Reused,
}

/// The first answer to a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptAnswer {
    /// Its HTTP status.
    pub status: u16,
    /// Its body.
    pub body: Vec<u8>,
    /// Its `Content-Type`.
    pub content_type: Option<String>,
}

impl Journal {
    /// Claims `key` of `tenant` for a request with `fingerprint`, held for
    /// `hold`, kept for `keep` once answered; or says what became of it
    /// before.
    pub async fn idempotency_begin(
        &self,
        tenant: &TenantId,
        key: &str,
        fingerprint: &[u8],
        hold: Duration,
        keep: Duration,
    ) -> Result<KeyClaim, JournalError> {
        let (hold, keep) = (hold.as_secs_f64(), keep.as_secs_f64());
        // A new key, an expired one, or one whose holder died with the
        // same request in hand, is claimed in one statement and one round
        // trip.
        // Not waited onto disk: whatever the request then does commits
        // durably after it, which flushes it too; a claim lost to a crash
        // before that guarded nothing.
        let claimed = in_tenant_at_once(
            self.pool.get().await?,
            tenant,
            false,
            "insert into idempotency_keys \
               (tenant_id, key, fingerprint, held_until, expires_at) \
             values ($1, $2, $3, now() + $4 * interval '1 second', \
                     now() + $5 * interval '1 second') \
             on conflict (tenant_id, key) do update \
               set fingerprint = excluded.fingerprint, held_until = excluded.held_until, \
                   expires_at = excluded.expires_at, status = null, answer = null, \
                   content_type = null, session_id = null, created_at = now() \
               where idempotency_keys.expires_at < now() \
                  or (idempotency_keys.status is null \
                      and idempotency_keys.held_until < now() \
                      and idempotency_keys.fingerprint = excluded.fingerprint) \
             returning 1",
            &[&tenant.as_str(), &key, &fingerprint, &hold, &keep],
        )
        .await?;
        if !claimed.is_empty() {
            return Ok(KeyClaim::Claimed);
        }
        let rows = in_tenant_at_once(
            self.pool.get().await?,
            tenant,
            false,
            "select fingerprint, status, answer, content_type, \
               greatest(extract(epoch from held_until - now()), 0)::float8 \
             from idempotency_keys where tenant_id = $1 and key = $2",
            &[&tenant.as_str(), &key],
        )
        .await?;
        let Some(row) = rows.first() else {
            // Let go between the two statements: claim it again.
            return Box::pin(self.idempotency_begin(
                tenant,
                key,
                fingerprint,
                Duration::from_secs_f64(hold),
                Duration::from_secs_f64(keep),
            ))
            .await;
        };
        if row.get::<_, Vec<u8>>(0) != fingerprint {
            return Ok(KeyClaim::Reused);
        }
        Ok(match row.get::<_, Option<i16>>(1) {
            None => KeyClaim::InFlight {
                held_for: Duration::from_secs_f64(row.get::<_, f64>(4)),
            },
            Some(status) => KeyClaim::Answered(KeptAnswer {
                status: u16::try_from(status).unwrap_or_default(),
                body: row.get::<_, Option<Vec<u8>>>(2).unwrap_or_default(),
                content_type: row.get(3),
            }),
        })
    }

    /// Pushes the deadline of a key in flight to `hold` from now.
    pub async fn idempotency_hold(
        &self,
        tenant: &TenantId,
        key: &str,
        hold: Duration,
    ) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        in_tenant_at_once(
            client,
            tenant,
            false,
            "update idempotency_keys set held_until = now() + $3 * interval '1 second' \
             where tenant_id = $1 and key = $2 and status is null",
            &[&tenant.as_str(), &key, &hold.as_secs_f64()],
        )
        .await?;
        Ok(())
    }

    /// Keeps `answer` as the answer to `key`, erased with `session` (when
    /// the request acted on one).
    pub async fn idempotency_complete(
        &self,
        tenant: &TenantId,
        key: &str,
        answer: &KeptAnswer,
        session: Option<&str>,
    ) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        in_tenant_at_once(
            client,
            tenant,
            true,
            "update idempotency_keys \
             set status = $3, answer = $4, content_type = $5, session_id = $6 \
             where tenant_id = $1 and key = $2 and status is null",
            &[
                &tenant.as_str(),
                &key,
                &i16::try_from(answer.status).unwrap_or(i16::MAX),
                &answer.body,
                &answer.content_type,
                &session,
            ],
        )
        .await?;
        Ok(())
    }

    /// Lets a key in flight go: the next request with it runs.
    pub async fn idempotency_abandon(
        &self,
        tenant: &TenantId,
        key: &str,
    ) -> Result<(), JournalError> {
        let client = self.pool.get().await?;
        in_tenant_at_once(
            client,
            tenant,
            false,
            "delete from idempotency_keys where tenant_id = $1 and key = $2 and status is null",
            &[&tenant.as_str(), &key],
        )
        .await?;
        Ok(())
    }

    /// Deletes up to `max` expired keys of every tenant; the number deleted.
    pub async fn forget_idempotency_keys(&self, max: i32) -> Result<i64, JournalError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one("select idempotency_keys_forget($1)", &[&max])
            .await?;
        Ok(row.get(0))
    }
}
