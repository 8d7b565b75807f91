//! The narad journal: the durable memory of narad/v1 sessions on Postgres.
//!
//! An append batch is written by one transaction that does everything —
//! tenant scoping, the session lock, deduplication, the rule engine,
//! sequence assignment, the events, the engine's state and the outbox — or
//! nothing of that batch. Concurrent batches share such transactions (each
//! decided alone), which take two pipelined round trips whatever their
//! size: one that begins, scopes, locks and reads what the batches can
//! touch; one that writes and commits. Batches to sessions this process
//! appended to last take one: decided on what it knows of them, written
//! behind a guard that finds that knowledge current.
//!
//! The same journal runs on a Citus coordinator whose tables
//! [`DISTRIBUTE`] distributed by tenant (docs/scale-out.md): there each
//! transaction holds one tenant's work, so that it stays on one shard group.
//!
//! Modules:
//! - [`access`]: which session a command may act on ([`Authorized`]);
//! - [`append`]: appending a batch to a session (concurrent appends share
//!   transactions, each still decided alone);
//! - `combine`: the append queue and the workers that group it into
//!   transactions; `group`: one such transaction (`group::one_trip`: in one
//!   round trip; `group::distributed`: its write on a Citus coordinator);
//!   `known`: what the process knows of the sessions it appended to;
//! - [`audit`]: the audit log of who did what;
//! - [`blobs`], [`blob_store`]: attachments' bytes, in Postgres or an
//!   S3-compatible store, and the references events make to them;
//!   [`references`]: checking those references;
//! - [`commands`]: server-issued events of commands (start-run, resolve-interrupt);
//! - [`erasure`]: erasing sessions and tenants;
//! - [`executors`]: client executors, their leases and deliveries under
//!   single-use execution tokens;
//! - [`extensions`]: registered extensions, which sign their requests;
//! - [`front_ends`]: when chat front ends come back to a session (their aborts stop runs);
//! - [`history`]: history reads with every cursor form of §10.2;
//! - [`idempotency`]: the first answers to requests with an `Idempotency-Key`;
//! - [`interrupts`]: the approvals inbox of open interrupts;
//! - [`limits`], [`quotas`]: a tenant's own limits, and rate limits and
//!   quotas shared by every replica;
//! - [`operations`]: what runs on a tenant's behalf now (executors, runtime
//!   work queues, held runs);
//! - [`relay`], [`tenant_relay`]: the outbox read in commit order, for
//!   session and tenant streams;
//! - [`sessions`]: creating, reading and listing sessions;
//! - [`search`]: sessions found by what was said in them, and by filters;
//! - [`usage`]: token usage of run terminals summed per day or per session, by model;
//! - [`statistics`]: statistics kept current on the tables the journal grows;
//! - [`rebuild`]: deriving the engine's state from the events alone;
//! - [`runtime`]: the work queue of agent runtimes, runtime leases, orphan repair;
//! - [`tickets`]: short-lived stream tickets;
//! - [`error`]: failures and their client-facing envelopes;
//! - [`openapi`]: how the answers above appear in the OpenAPI document.

pub mod access;
pub mod append;
pub mod audit;
pub mod blob_store;
pub mod blobs;
mod combine;
pub mod commands;
pub mod erasure;
pub mod error;
pub mod executors;
pub mod extensions;
pub mod front_ends;
mod group;
pub mod history;
pub mod idempotency;
pub mod interrupts;
mod known;
pub mod limits;
pub mod openapi;
pub mod operations;
pub mod quotas;
pub mod rebuild;
pub mod references;
pub mod relay;
pub mod runtime;
pub mod search;
pub mod sessions;
pub mod statistics;
pub mod tenant_relay;
pub mod tickets;
pub mod usage;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;

pub use access::{Authorized, Caller};
pub use append::{AppendOptions, Appended, AppendedEvent, Fence};
pub use audit::{AuditEntry, AuditFilter, AuditRecord};
pub use blob_store::BlobStore;
pub use blobs::BlobRecord;
pub use combine::AppendStats;
pub use commands::{QueuedStart, RunStart, WorkflowCancel};
pub use erasure::{DueSession, ErasureReason, TenantErasure};
pub use error::JournalError;
pub use executors::{Delivery, ExecutorPause, FinishAccepted, Lease, SweepItem, SweepKind};
pub use extensions::{ExtensionRecord, SigningKey};
pub use history::{HistoryPage, HistoryQuery};
pub use idempotency::{KeptAnswer, KeyClaim};
pub use interrupts::{DueInterrupt, InterruptCursor, OpenInterrupt};
pub use limits::StoredLimits;
pub use operations::{ClaimStanding, ExecutorStanding, Operations, QueueStanding};
pub use quotas::{Rate, Taken};
pub use relay::{AttachSnapshot, RelayCursor, Relayed};
pub use runtime::{
    Claim, LeaseStanding, Released, Repair, RuntimeDue, RuntimeLease, WorkDefaults, WorkOrder,
};
pub use search::{
    MatchField, SearchCursor, SearchMatch, SearchQuery, SearchResult, SessionState, SnippetPart,
};
pub use sessions::{Document, NewSession, SessionDocuments, SessionRecord};
pub use statistics::STATISTICS_CHECK;
pub use tenant_relay::{Horizon, RelayPage, StreamPosition};
pub use usage::{UsageBucket, UsageGrouping, UsageQuery};

/// The migrations of `migrations/`, embedded.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// Applies the migrations to the database at `url`, then, on a Citus
/// coordinator, distributes every table not yet distributed
/// ([`DISTRIBUTE`]); applying them to a migrated database changes
/// nothing.
pub async fn migrate(url: &str) -> Result<(), sqlx::migrate::MigrateError> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    MIGRATOR.run(&mut conn).await?;
    sqlx::query(DISTRIBUTE).execute(&mut conn).await?;
    conn.close()
        .await
        .map_err(sqlx::migrate::MigrateError::from)
}

/// Distributes the schema by tenant when the database is a Citus
/// coordinator, and does nothing on one Postgres (migration
/// `20261214000001_citus`; docs/scale-out.md): run after the migrations.
pub const DISTRIBUTE: &str = "select narad_distribute()";

/// A tenant (an organisation): every row narad stores belongs to one.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(String);

impl TenantId {
    /// Wraps a tenant id: 1 to 256 characters.
    pub fn new(s: impl Into<String>) -> Result<Self, String> {
        let s = s.into();
        if s.is_empty() || s.chars().count() > 256 {
            return Err("a tenant id has 1 to 256 characters".to_owned());
        }
        Ok(Self(s))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The journal: a pool of connections to its database, and the queue
/// through which concurrent appends share transactions.
#[derive(Clone)]
pub struct Journal {
    pool: Pool,
    config: std::sync::Arc<tokio_postgres::Config>,
    combiner: std::sync::Arc<combine::Combiner>,
    work_defaults: runtime::WorkDefaults,
    blob_store: blob_store::BlobStore,
    /// Names this journal's notifications to relays (their payload), so
    /// that its own listener skips them: its relay is woken in-process.
    origin: std::sync::Arc<str>,
}

/// How many append transactions a journal runs at a time by default (each
/// combining every append waiting when it began).
pub const DEFAULT_APPEND_GROUPS: usize = 2;

/// How long a caller waits for a pooled connection by default before it is
/// refused ([`JournalError::Pool`], which a server answers 503 `NRD-0901`):
/// an exhausted pool is an answer, never a hang.
pub const DEFAULT_POOL_WAIT: Duration = Duration::from_secs(5);

/// The connections a server's background tasks share, in a pool of their
/// own ([`Journal::background`]): the relay, the three sweepers (executors,
/// runtimes, erasure), the outbox's retention, the gauges and the list of
/// closed organisations. A sweeper holds one connection for its advisory
/// lock while its work takes one more at a time: with four, work goes on
/// when all three hold their locks, and requests never wait for them.
pub const BACKGROUND_CONNECTIONS: usize = 4;

/// A pool of at most `size` connections configured by `config`, whose
/// callers wait at most `wait` for one.
fn pool_of(
    config: &tokio_postgres::Config,
    size: usize,
    wait: Duration,
) -> Result<Pool, JournalError> {
    let manager = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig {
            // Connections come back clean: a transaction abandoned
            // mid-way closes its connection (see `in_tenant`), and
            // append transactions run in tasks nobody cancels.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .wait_timeout(Some(wait))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .post_create(Hook::async_fn(|client, _| {
            Box::pin(async move {
                client
                    .batch_execute(CONNECTION_SETUP)
                    .await
                    .map_err(HookError::Backend)
            })
        }))
        .build()
        .map_err(|e| JournalError::Corrupt(format!("cannot build the pool: {e}")))
}

/// A name no other journal has (16 random bytes, in hex).
fn origin() -> Result<String, JournalError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| JournalError::Corrupt(format!("no randomness for the journal's name: {e}")))?;
    Ok(hex::encode(bytes))
}

impl Journal {
    /// Connects to the database at `url` with a pool of at most
    /// `max_connections`, each caller waiting at most [`DEFAULT_POOL_WAIT`]
    /// for one.
    pub fn connect(url: &str, max_connections: usize) -> Result<Journal, JournalError> {
        Journal::connect_waiting(url, max_connections, DEFAULT_POOL_WAIT)
    }

    /// [`Journal::connect`], each caller waiting at most `wait` for a
    /// connection.
    pub fn connect_waiting(
        url: &str,
        max_connections: usize,
        wait: Duration,
    ) -> Result<Journal, JournalError> {
        let config = tokio_postgres::Config::from_str(url)?;
        let pool = pool_of(&config, max_connections, wait)?;
        let combiner = std::sync::Arc::new(combine::Combiner::new(
            pool.clone(),
            DEFAULT_APPEND_GROUPS,
            false,
        ));
        Ok(Journal {
            pool,
            config: std::sync::Arc::new(config),
            combiner,
            work_defaults: runtime::WorkDefaults::default(),
            blob_store: blob_store::BlobStore::Postgres,
            origin: origin()?.into(),
        })
    }

    /// The same journal on a pool of its own of `size` connections (waits
    /// bounded as this one's), for a server's background tasks: they and
    /// requests never wait for each other's connections. Appends still
    /// share this journal's transactions.
    pub fn background(&self, size: usize) -> Result<Journal, JournalError> {
        let wait = self.pool.timeouts().wait.unwrap_or(DEFAULT_POOL_WAIT);
        Ok(Journal {
            pool: pool_of(&self.config, size, wait)?,
            ..self.clone()
        })
    }

    /// The same journal writing new blobs' bytes to `store` (blobs written
    /// before are read where they are).
    pub fn with_blob_store(mut self, store: blob_store::BlobStore) -> Journal {
        self.blob_store = store;
        self
    }

    /// The same journal filling in `defaults` where a start-run's
    /// `runtime` leaves a setting out.
    pub fn with_work_defaults(mut self, defaults: runtime::WorkDefaults) -> Journal {
        self.work_defaults = defaults;
        self
    }

    /// The same journal running at most `groups` append transactions at a
    /// time (at least 1).
    pub fn with_append_groups(self, groups: usize) -> Journal {
        self.with_combiner(groups, false)
    }

    /// The same journal sending `NOTIFY narad_outbox` inside every append
    /// transaction: for measurement only (`narad bench stream`). Postgres
    /// serialises the commits of notifying transactions on one lock; the
    /// server notifies once per burst after commits instead.
    pub fn with_notify_in_transaction(self, groups: usize) -> Journal {
        self.with_combiner(groups, true)
    }

    fn with_combiner(self, groups: usize, notify_in_transaction: bool) -> Journal {
        let combiner = std::sync::Arc::new(combine::Combiner::new(
            self.pool.clone(),
            groups,
            notify_in_transaction,
        ));
        Journal { combiner, ..self }
    }

    /// Counters of the append path since this journal was connected.
    pub fn append_stats(&self) -> AppendStats {
        self.combiner.stats()
    }

    /// Whether the database holds every migration of this build (and the
    /// database answers at all: `Err` when it does not).
    pub async fn migrations_applied(&self) -> Result<bool, JournalError> {
        let client = self.pool.get().await?;
        let rows = client
            .query("select version from _sqlx_migrations where success", &[])
            .await?;
        let applied: std::collections::BTreeSet<i64> = rows.iter().map(|r| r.get(0)).collect();
        Ok(MIGRATOR.iter().all(|m| applied.contains(&m.version)))
    }

    /// The connection pool, for the server's own queries (and its
    /// status, for the pool's gauges).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// How far a relay standing at `cursor` is behind: the outbox rows it
    /// could read now and has not (counted up to `max`), and the age of
    /// the oldest of them. Rows behind a transaction still running are not
    /// readable yet, so not counted.
    ///
    /// Two short statements: the count reads through `relay_after` (each
    /// row's body too: measured 0.3 ms with nothing behind, 4 ms with
    /// 1,000 rows behind, 40 ms with 10,000), and the age is one row's
    /// `created_at`, read by its index within its tenant.
    pub async fn relay_backlog(
        &self,
        cursor: RelayCursor,
        max: u32,
    ) -> Result<RelayBacklog, JournalError> {
        let client = self.pool.get().await?;
        let first = client
            .query_opt(
                "select r.relay_txid, r.relay_position, r.tenant_id, count(*) over () \
                 from relay_after($1, $2, $3) as r \
                 order by r.relay_txid, r.relay_position limit 1",
                &[&cursor.txid, &cursor.position, &(max as i32)],
            )
            .await?;
        let Some(first) = first else {
            return Ok(RelayBacklog::default());
        };
        let (txid, position): (i64, i64) = (first.get(0), first.get(1));
        let tenant = TenantId::new(first.get::<_, String>(2)).map_err(JournalError::Corrupt)?;
        let rows = first.get::<_, i64>(3) as u64;
        let age = in_tenant(client, &tenant, async |c| {
            Ok(c.query_opt(
                "select extract(epoch from now() - created_at)::float8 from outbox \
                 where tenant_id = $1 and txid = ($2::bigint)::text::xid8 and position = $3",
                &[&tenant.as_str(), &txid, &position],
            )
            .await?
            .map(|r| r.get::<_, f64>(0)))
        })
        .await?;
        Ok(RelayBacklog {
            rows,
            // Gone meanwhile (retention), or a clock step: no age.
            oldest_age: age
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(std::time::Duration::from_secs_f64),
        })
    }
}

/// How far a relay is behind (see [`Journal::relay_backlog`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RelayBacklog {
    /// Readable outbox rows after the relay's cursor (at most the `max`
    /// asked for).
    pub rows: u64,
    /// How long ago the oldest of them was written; `None` when there is
    /// none.
    pub oldest_age: Option<std::time::Duration>,
}

/// Run once on every new connection of the pool: every query on it runs
/// as the role `narad_app`, which owns nothing, so that row-level security
/// applies even when narad connects as a superuser, and even to a query
/// that forgot to scope itself (it then sees no tenant's rows at all). The
/// connection then attaches to the stream clock (migration
/// `20261201000001_stream_clock`): stream positions are transaction ids
/// plus an offset that grows when the database was moved to a cluster
/// whose counter is lower, so that positions never go back.
///
/// On a Citus cluster, `set local` commands go with the transaction to
/// every worker it touches (`citus.propagate_set_commands`), so that the
/// tenant a transaction is scoped to (`set local narad.tenant_id`) is the one row-level
/// security reads on the shards; on one Postgres the setting is inert.
pub const CONNECTION_SETUP: &str = "set role narad_app; \
     set citus.propagate_set_commands = local; \
     select stream_clock_attach()";

/// Statements that open a tenant-scoped transaction: the tenant is set for
/// that transaction only. (Every pooled connection already runs as the
/// role `narad_app`: see [`CONNECTION_SETUP`].)
const BEGIN_SCOPED: &str = "begin";

/// The statement that scopes the open transaction to `tenant`: row-level
/// security reads `narad.tenant_id`. A `set local` command rather than
/// `set_config()`, because a command is what a Citus coordinator sends on
/// to the workers of the transaction (a function's effect stays on the
/// coordinator). The id is written as an escaped string constant, which
/// means the same whatever `standard_conforming_strings` says.
pub(crate) fn scope(tenant: &TenantId) -> String {
    let mut sql = String::with_capacity(tenant.as_str().len() + 40);
    sql.push_str("set local narad.tenant_id = E'");
    for c in tenant.as_str().chars() {
        match c {
            '\'' => sql.push_str("''"),
            '\\' => sql.push_str("\\\\"),
            c => sql.push(c),
        }
    }
    sql.push('\'');
    sql
}

/// Runs `body` in a tenant-scoped transaction on `client`: commits when it
/// returns `Ok`, rolls back otherwise.
///
/// If the caller stops waiting mid-way (an HTTP client that went away
/// drops the request's future), the connection is closed instead of going
/// back to the pool with its transaction open, where the next holder's
/// commit would commit it; closing it rolls the transaction back.
pub(crate) async fn in_tenant<T, F>(
    client: deadpool_postgres::Client,
    tenant: &TenantId,
    body: F,
) -> Result<T, JournalError>
where
    F: AsyncFnOnce(&deadpool_postgres::Client) -> Result<T, JournalError>,
{
    let mut guard = Abandoned(Some(client));
    let client = guard.0.as_ref().expect("held");
    let result = scoped(client, tenant, body).await;
    // Finished: the transaction is over, the connection goes back.
    drop(guard.0.take());
    result
}

/// Runs one statement in a tenant-scoped transaction in one round trip:
/// begin, the tenant's scope, the statement and commit are sent together
/// (the statement prepared once per connection). A failing statement
/// aborts the transaction and the commit then rolls it back; every answer
/// is read before the connection goes back to the pool.
///
/// Unless `durable`, the commit does not wait for its WAL to reach disk
/// (`synchronous_commit = off`): for writes that a crash may lose because
/// anything that depends on them commits durably after them (which
/// flushes the WAL written before it), or because losing them only costs
/// a later retry.
pub(crate) async fn in_tenant_at_once(
    client: deadpool_postgres::Client,
    tenant: &TenantId,
    durable: bool,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, JournalError> {
    let mut guard = Abandoned(Some(client));
    let c = guard.0.as_ref().expect("held");
    let statement = c.prepare_cached(sql).await?;
    // Polled in order on their first poll, so sent in this order (the
    // scope a message of its own: Citus sends a `set local` command's whole
    // query string on to the workers).
    let begin = if durable {
        BEGIN_SCOPED
    } else {
        "begin; set local synchronous_commit = off"
    };
    let scope = scope(tenant);
    let (begun, scoped, rows, committed) = futures::join!(
        c.batch_execute(begin),
        c.batch_execute(&scope),
        c.query(&statement, params),
        c.batch_execute("commit"),
    );
    drop(guard.0.take());
    begun?;
    scoped?;
    let rows = rows?;
    committed?;
    Ok(rows)
}

/// A connection inside a transaction; dropped before [`in_tenant`] ends
/// it, the connection is closed rather than returned to the pool.
pub(crate) struct Abandoned(pub(crate) Option<deadpool_postgres::Client>);

impl Drop for Abandoned {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            // Detached from the pool and dropped: its connection ends, and
            // Postgres rolls the transaction back.
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

async fn scoped<T, F>(
    client: &deadpool_postgres::Client,
    tenant: &TenantId,
    body: F,
) -> Result<T, JournalError>
where
    F: AsyncFnOnce(&deadpool_postgres::Client) -> Result<T, JournalError>,
{
    // Two messages, not one string: Citus sends a `set local` command's
    // whole query string on to the workers.
    let scope = scope(tenant);
    let begun = futures::try_join!(
        client.batch_execute(BEGIN_SCOPED),
        client.batch_execute(&scope)
    );
    if let Err(e) = begun {
        let _ = client.batch_execute("rollback").await;
        return Err(e.into());
    }
    match body(client).await {
        Ok(v) => {
            client.batch_execute("commit").await?;
            Ok(v)
        }
        Err(JournalError::SessionNotFound(id)) => {
            // One answer for every route: a session that was erased says so.
            let erased = erasure::was_erased(client, tenant, &id)
                .await
                .unwrap_or(false);
            let _ = client.batch_execute("rollback").await;
            Err(if erased {
                JournalError::SessionErased(id)
            } else {
                JournalError::SessionNotFound(id)
            })
        }
        Err(e) => {
            let _ = client.batch_execute("rollback").await;
            Err(e)
        }
    }
}
