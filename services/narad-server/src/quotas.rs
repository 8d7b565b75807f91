//! Per-tenant limits: what each is, the configured defaults, an
//! organisation's overrides (cached a few seconds on each replica), and
//! their enforcement on every replica through the database.
//!
//! - Rates (`eventsPerSecond`, `commandsPerSecond`, each with a burst) are
//!   token buckets in Postgres. A replica takes tokens in chunks of a
//!   twentieth of the rate and spends them locally, so a tenant's bucket
//!   row is touched once per chunk; a refusal is remembered locally until
//!   the bucket refills, so a flood costs the database nothing more.
//! - Counts (`openStreams`, `attachedExecutors`, `sessions`) are counted in
//!   Postgres under a per-tenant lock when something new would be one more.
//!
//! Over a limit: 429, `Retry-After`, and the limit's own `NRD-06xx` code.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use narad_journal::{Journal, JournalError, Rate, Taken, TenantId};
use narad_protocol::ErrorCode;
use serde_json::{Map, Value, json};

use crate::error::{ApiError, ApiResult};

/// How long a replica uses an organisation's overrides before reading
/// them again: a change reaches every replica within this.
pub const OVERRIDES_TTL: Duration = Duration::from_secs(5);

/// How often a replica says it is alive; streams of a replica silent for
/// [`REPLICA_DEAD_AFTER`] count no more.
pub const REPLICA_HEARTBEAT: Duration = Duration::from_secs(10);

/// See [`REPLICA_HEARTBEAT`].
pub const REPLICA_DEAD_AFTER: Duration = Duration::from_secs(30);

/// Tokens a replica took but did not spend within this are given up.
const ALLOWANCE_LIFETIME: Duration = Duration::from_secs(1);

/// What a client is told to wait when a count limit (streams, executors)
/// refuses it: places free up when others close.
const COUNT_RETRY_AFTER: Duration = Duration::from_secs(5);

/// What a client is told to wait when it holds as many sessions as it may.
const SESSIONS_RETRY_AFTER: Duration = Duration::from_secs(60);

/// A limit an organisation may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// Appended events per second (every append route, on every replica).
    EventsPerSecond,
    /// Events that may be appended at once above the rate.
    EventsBurst,
    /// Commands per second.
    CommandsPerSecond,
    /// Commands that may be sent at once above the rate.
    CommandsBurst,
    /// Session and tenant streams open at once.
    OpenStreams,
    /// Client executors holding live leases at once.
    AttachedExecutors,
    /// Sessions held (archived ones count until erased).
    Sessions,
    /// How long an interrupt that names no `expiresAt` may wait.
    InterruptDefaultExpirySeconds,
    /// Days after which archived or idle sessions are erased.
    RetentionDays,
    /// The largest blob (attachment or artifact bytes) one upload may hold.
    BlobMaxBytes,
    /// The bytes an organisation's blobs may hold together.
    StoredBytes,
}

impl Limit {
    /// Every limit, in the order the API lists them.
    pub const ALL: [Limit; 11] = [
        Limit::EventsPerSecond,
        Limit::EventsBurst,
        Limit::CommandsPerSecond,
        Limit::CommandsBurst,
        Limit::OpenStreams,
        Limit::AttachedExecutors,
        Limit::Sessions,
        Limit::InterruptDefaultExpirySeconds,
        Limit::RetentionDays,
        Limit::BlobMaxBytes,
        Limit::StoredBytes,
    ];

    /// Its name in the admin API.
    pub fn name(self) -> &'static str {
        match self {
            Limit::EventsPerSecond => "eventsPerSecond",
            Limit::EventsBurst => "eventsBurst",
            Limit::CommandsPerSecond => "commandsPerSecond",
            Limit::CommandsBurst => "commandsBurst",
            Limit::OpenStreams => "openStreams",
            Limit::AttachedExecutors => "attachedExecutors",
            Limit::Sessions => "sessions",
            Limit::InterruptDefaultExpirySeconds => "interruptDefaultExpirySeconds",
            Limit::RetentionDays => "retentionDays",
            Limit::BlobMaxBytes => "blobMaxBytes",
            Limit::StoredBytes => "storedBytes",
        }
    }

    /// Its label in `narad_limit_refusals_total`.
    pub fn label(self) -> &'static str {
        match self {
            Limit::EventsPerSecond | Limit::EventsBurst => "events_per_second",
            Limit::CommandsPerSecond | Limit::CommandsBurst => "commands_per_second",
            Limit::OpenStreams => "open_streams",
            Limit::AttachedExecutors => "attached_executors",
            Limit::Sessions => "sessions",
            Limit::InterruptDefaultExpirySeconds => "interrupt_default_expiry",
            Limit::RetentionDays => "retention_days",
            Limit::BlobMaxBytes => "blob_bytes",
            Limit::StoredBytes => "stored_bytes",
        }
    }

    /// What it means, for people.
    pub fn about(self) -> &'static str {
        match self {
            Limit::EventsPerSecond => "appended events per second, over every replica",
            Limit::EventsBurst => {
                "events appended at once above the rate (unset: twice eventsPerSecond)"
            }
            Limit::CommandsPerSecond => "commands per second, over every replica",
            Limit::CommandsBurst => {
                "commands sent at once above the rate (unset: twice commandsPerSecond)"
            }
            Limit::OpenStreams => "session and tenant streams open at once",
            Limit::AttachedExecutors => "client executors holding live leases at once",
            Limit::Sessions => "sessions held (archived ones count until erased)",
            Limit::InterruptDefaultExpirySeconds => {
                "seconds an interrupt that names no expiresAt waits for a decision"
            }
            Limit::RetentionDays => "days after which archived or idle sessions are erased",
            Limit::BlobMaxBytes => "the largest blob one upload may hold, in bytes",
            Limit::StoredBytes => "the bytes an organisation's blobs may hold together",
        }
    }

    /// The largest value it takes (the smallest is 1).
    pub fn max(self) -> u64 {
        match self {
            Limit::InterruptDefaultExpirySeconds => 315_360_000,
            Limit::RetentionDays => 36_500,
            Limit::BlobMaxBytes | Limit::StoredBytes => 1 << 50,
            _ => 1_000_000_000,
        }
    }

    /// Whether the server's value bounds every organisation's: the largest
    /// blob (what one upload may cost the server), where the smaller of
    /// the two holds.
    pub fn is_ceiling(self) -> bool {
        matches!(self, Limit::BlobMaxBytes)
    }

    /// The limit with this API name.
    pub fn named(name: &str) -> Option<Limit> {
        Limit::ALL.into_iter().find(|l| l.name() == name)
    }

    /// The code a refusal by this limit carries.
    fn code(self) -> ErrorCode {
        match self {
            Limit::EventsPerSecond | Limit::EventsBurst => ErrorCode::EventRateLimited,
            Limit::CommandsPerSecond | Limit::CommandsBurst => ErrorCode::CommandRateLimited,
            Limit::OpenStreams => ErrorCode::OpenStreamLimitReached,
            Limit::AttachedExecutors => ErrorCode::ExecutorLimitReached,
            Limit::StoredBytes => ErrorCode::StoredBytesLimitReached,
            Limit::BlobMaxBytes => ErrorCode::PayloadTooLarge,
            Limit::Sessions | Limit::InterruptDefaultExpirySeconds | Limit::RetentionDays => {
                ErrorCode::SessionLimitReached
            }
        }
    }
}

/// A value of every limit: `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimitValues([Option<u64>; 11]);

impl LimitValues {
    /// The value of `limit`.
    pub fn get(&self, limit: Limit) -> Option<u64> {
        self.0[Self::index(limit)]
    }

    /// Sets `limit`.
    pub fn set(&mut self, limit: Limit, value: Option<u64>) {
        self.0[Self::index(limit)] = value;
    }

    /// With `limit` set.
    pub fn with(mut self, limit: Limit, value: Option<u64>) -> LimitValues {
        self.set(limit, value);
        self
    }

    fn index(limit: Limit) -> usize {
        Limit::ALL
            .iter()
            .position(|l| *l == limit)
            .expect("every limit is listed")
    }

    /// By API name (`null`: no limit).
    pub fn to_map(self) -> Map<String, Value> {
        Limit::ALL
            .into_iter()
            .map(|l| (l.name().to_owned(), json!(self.get(l))))
            .collect()
    }

    /// These values with `overrides` (checked by [`check_overrides`])
    /// applied. A server-wide ceiling ([`Limit::is_ceiling`]) stays one: an
    /// override may lower it, never raise or lift it.
    pub fn overridden(mut self, overrides: &Map<String, Value>) -> LimitValues {
        for (name, value) in overrides {
            if let Some(limit) = Limit::named(name) {
                let value = match (limit.is_ceiling(), self.get(limit), value.as_u64()) {
                    (true, Some(ceiling), Some(v)) => Some(v.min(ceiling)),
                    (true, Some(ceiling), None) => Some(ceiling),
                    (_, _, v) => v,
                };
                self.set(limit, value);
            }
        }
        self
    }
}

/// Checks an admin's overrides: known names only, each a whole number in
/// its range, or `null` (no limit for the organisation).
pub fn check_overrides(body: &Value) -> ApiResult<Map<String, Value>> {
    let Some(object) = body.as_object() else {
        return Err(ApiError::new(
            ErrorCode::InvalidObject,
            "the body is an object of limits by name, e.g. {\"eventsPerSecond\": 100}",
        ));
    };
    for (name, value) in object {
        let pointer = format!("/{}", name.replace('~', "~0").replace('/', "~1"));
        let Some(limit) = Limit::named(name) else {
            let known: Vec<&str> = Limit::ALL.iter().map(|l| l.name()).collect();
            return Err(ApiError::new(
                ErrorCode::InvalidObject,
                format!(
                    "no limit is named {name:?}; the limits are {}",
                    known.join(", ")
                ),
            )
            .with_field(pointer, "unknown limit"));
        };
        let ok = value.is_null()
            || value
                .as_u64()
                .is_some_and(|v| (1..=limit.max()).contains(&v));
        if !ok {
            return Err(ApiError::new(
                ErrorCode::InvalidObject,
                format!(
                    "{name} is a whole number from 1 to {}, or null for no limit",
                    limit.max()
                ),
            )
            .with_field(pointer, format!("1 to {}, or null", limit.max())));
        }
    }
    Ok(object.clone())
}

/// A token bucket's local side on one replica.
#[derive(Debug)]
struct Allowance {
    /// Tokens taken from the shared bucket, not yet spent.
    tokens: f64,
    taken_at: Instant,
    /// The shared bucket refused until then.
    empty_until: Option<Instant>,
}

/// The two rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Bucket {
    Events,
    Commands,
}

impl Bucket {
    fn name(self) -> &'static str {
        match self {
            Bucket::Events => "events",
            Bucket::Commands => "commands",
        }
    }

    fn limits(self) -> (Limit, Limit) {
        match self {
            Bucket::Events => (Limit::EventsPerSecond, Limit::EventsBurst),
            Bucket::Commands => (Limit::CommandsPerSecond, Limit::CommandsBurst),
        }
    }
}

type Allowances = HashMap<(TenantId, Bucket), Arc<tokio::sync::Mutex<Allowance>>>;

/// What holds for each tenant, with when its overrides were read.
type CachedLimits = HashMap<TenantId, (Instant, LimitValues)>;

/// Every tenant's limits on this replica.
pub struct Quotas {
    journal: Journal,
    defaults: LimitValues,
    replica: String,
    effective: Mutex<CachedLimits>,
    allowances: Mutex<Allowances>,
}

impl Quotas {
    /// Limits with `defaults` for every organisation, kept in `journal`.
    pub fn new(journal: Journal, defaults: LimitValues) -> Quotas {
        Quotas {
            journal,
            defaults,
            replica: uuid::Uuid::now_v7().to_string(),
            effective: Mutex::new(HashMap::new()),
            allowances: Mutex::new(HashMap::new()),
        }
    }

    /// The configured defaults.
    pub fn defaults(&self) -> LimitValues {
        self.defaults
    }

    /// Says this replica is alive every [`REPLICA_HEARTBEAT`], so that its
    /// streams count for open-stream limits; runs until aborted.
    pub async fn heartbeat(self: Arc<Self>) {
        let mut tick = tokio::time::interval(REPLICA_HEARTBEAT);
        loop {
            tick.tick().await;
            if let Err(e) = self
                .journal
                .replica_alive(&self.replica, REPLICA_DEAD_AFTER.as_secs_f64())
                .await
            {
                tracing::warn!(error = %e, "cannot say this replica is alive");
            }
        }
    }

    /// Forgets `tenant`'s cached overrides: the next request reads them.
    pub fn overrides_changed(&self, tenant: &TenantId) {
        self.effective.lock().expect("not poisoned").remove(tenant);
    }

    /// What holds for `tenant`: the defaults with its overrides (read
    /// again every [`OVERRIDES_TTL`]).
    pub async fn effective(&self, tenant: &TenantId) -> Result<LimitValues, JournalError> {
        let cached = self
            .effective
            .lock()
            .expect("not poisoned")
            .get(tenant)
            .filter(|(at, _)| at.elapsed() < OVERRIDES_TTL)
            .map(|(_, values)| *values);
        if let Some(values) = cached {
            return Ok(values);
        }
        let overrides = self.journal.tenant_limits(tenant).await?.overrides;
        let values = self.defaults.overridden(&overrides);
        self.effective
            .lock()
            .expect("not poisoned")
            .insert(tenant.clone(), (Instant::now(), values));
        Ok(values)
    }

    /// The value of `limit` for `tenant` (`None`: no limit).
    pub async fn limit(
        &self,
        tenant: &TenantId,
        limit: Limit,
    ) -> Result<Option<u64>, JournalError> {
        Ok(self.effective(tenant).await?.get(limit))
    }

    /// Takes `n` appended events from `tenant`'s event rate.
    pub async fn take_events(&self, tenant: &TenantId, n: usize) -> ApiResult<()> {
        self.take(tenant, Bucket::Events, n as f64).await
    }

    /// Takes one command from `tenant`'s command rate.
    pub async fn take_command(&self, tenant: &TenantId) -> ApiResult<()> {
        self.take(tenant, Bucket::Commands, 1.0).await
    }

    async fn take(&self, tenant: &TenantId, bucket: Bucket, n: f64) -> ApiResult<()> {
        let limits = self.effective(tenant).await?;
        let (rate_limit, burst_limit) = bucket.limits();
        let Some(rate) = limits.get(rate_limit) else {
            return Ok(());
        };
        let rate = rate as f64;
        let burst = limits
            .get(burst_limit)
            .map_or(rate * 2.0, |b| b as f64)
            .max(1.0);
        let allowance = self
            .allowances
            .lock()
            .expect("not poisoned")
            .entry((tenant.clone(), bucket))
            .or_insert_with(|| {
                Arc::new(tokio::sync::Mutex::new(Allowance {
                    tokens: 0.0,
                    taken_at: Instant::now(),
                    empty_until: None,
                }))
            })
            .clone();
        let mut local = allowance.lock().await;
        let now = Instant::now();
        if let Some(until) = local.empty_until {
            if now < until {
                return Err(limited(rate_limit, until - now, rate, burst));
            }
            local.empty_until = None;
        }
        if now.duration_since(local.taken_at) > ALLOWANCE_LIFETIME {
            local.tokens = 0.0;
        }
        if local.tokens >= n {
            local.tokens -= n;
            return Ok(());
        }
        let need = n - local.tokens;
        let chunk = (rate.min(burst) / 20.0).max(1.0);
        let taken = self
            .journal
            .take_tokens(
                tenant,
                bucket.name(),
                Rate {
                    per_second: rate,
                    burst,
                },
                need,
                need.max(chunk),
            )
            .await?;
        match taken {
            Taken::Granted(granted) => {
                local.tokens = (local.tokens + granted - n).max(0.0);
                local.taken_at = now;
                Ok(())
            }
            Taken::Refused { wait_seconds } => {
                let wait = Duration::from_secs_f64(wait_seconds.clamp(0.001, 3600.0));
                local.empty_until = Some(now + wait);
                Err(limited(rate_limit, wait, rate, burst))
            }
        }
    }

    /// A place for one more open stream of `tenant`, held until the
    /// returned slot is dropped; refused at open when the tenant has
    /// `openStreams` open on the replicas alive.
    pub async fn open_stream(&self, tenant: &TenantId) -> ApiResult<StreamSlot> {
        let Some(max) = self.effective(tenant).await?.get(Limit::OpenStreams) else {
            return Ok(StreamSlot(None));
        };
        let id = uuid::Uuid::now_v7().to_string();
        let registered = self
            .journal
            .open_stream(
                tenant,
                &id,
                &self.replica,
                max,
                REPLICA_DEAD_AFTER.as_secs_f64(),
            )
            .await?;
        if !registered {
            crate::metrics::limit_refused(Limit::OpenStreams.label());
            return Err(with_retry(
                ApiError::new(
                    ErrorCode::OpenStreamLimitReached,
                    format!(
                        "this organisation has {max} streams open, its limit; close one (or \
                         retry after Retry-After). Streams already open are never cut"
                    ),
                )
                .with_details(json!({"limit": Limit::OpenStreams.name(), "value": max})),
                COUNT_RETRY_AFTER,
            ));
        }
        Ok(StreamSlot(Some((self.journal.clone(), id))))
    }
}

/// A registered open stream; dropping it frees the place.
pub struct StreamSlot(Option<(Journal, String)>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        if let Some((journal, id)) = self.0.take()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            handle.spawn(async move {
                if let Err(e) = journal.close_stream(&id).await {
                    // The place frees itself when this replica is next
                    // declared dead; until then it counts.
                    tracing::warn!(error = %e, "cannot free a stream's place");
                }
            });
        }
    }
}

/// The refusal of a spent rate.
fn limited(limit: Limit, wait: Duration, rate: f64, burst: f64) -> ApiError {
    crate::metrics::limit_refused(limit.label());
    let what = match limit {
        Limit::EventsPerSecond => "appended events",
        _ => "commands",
    };
    with_retry(
        ApiError::new(
            limit.code(),
            format!(
                "this organisation's rate of {what} ({rate} a second, bursts of {burst}) is \
                 spent; nothing was done: retry after Retry-After"
            ),
        )
        .with_details(json!({
            "limit": limit.name(),
            "value": rate,
            "retryAfterMs": wait.as_millis() as u64,
        })),
        wait,
    )
}

/// `error` with `Retry-After` of `wait`, rounded up to whole seconds.
fn with_retry(error: ApiError, wait: Duration) -> ApiError {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    error.with_retry_after(seconds.max(1))
}

/// The `Retry-After` a quota the journal enforces (sessions, executors)
/// answers with, and its refusal counted: applied by the conversion of every
/// `JournalError::LimitReached` into an answer.
pub(crate) fn journal_refusal(error: ApiError) -> ApiError {
    let code = ErrorCode::from_code(error.code());
    let (limit, wait) = match code {
        Some(ErrorCode::SessionLimitReached) => (Limit::Sessions, SESSIONS_RETRY_AFTER),
        Some(ErrorCode::ExecutorLimitReached) => (Limit::AttachedExecutors, COUNT_RETRY_AFTER),
        _ => return error,
    };
    crate::metrics::limit_refused(limit.label());
    with_retry(error.with_details(json!({"limit": limit.name()})), wait)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_is_named_once_and_found_by_its_name() {
        let mut names: Vec<&str> = Limit::ALL.iter().map(|l| l.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Limit::ALL.len());
        for l in Limit::ALL {
            assert_eq!(Limit::named(l.name()), Some(l));
        }
    }

    #[test]
    fn overrides_replace_defaults_and_null_lifts_a_limit() {
        let defaults = LimitValues::default()
            .with(Limit::EventsPerSecond, Some(100))
            .with(Limit::Sessions, Some(10));
        let o = check_overrides(&json!({"eventsPerSecond": 5, "sessions": null})).unwrap();
        let v = defaults.overridden(&o);
        assert_eq!(v.get(Limit::EventsPerSecond), Some(5));
        assert_eq!(v.get(Limit::Sessions), None);
        assert_eq!(v.get(Limit::OpenStreams), None);
    }

    /// The server's largest blob bounds every organisation's: the smaller
    /// of the two holds, and `null` does not lift it.
    #[test]
    fn the_largest_blob_is_the_smaller_of_server_and_organisation() {
        let defaults = LimitValues::default().with(Limit::BlobMaxBytes, Some(4 << 20));
        for (override_, effective) in [
            (json!(1 << 20), 1 << 20),
            (json!(64 << 20), 4 << 20),
            (json!(null), 4 << 20),
        ] {
            let o = check_overrides(&json!({ "blobMaxBytes": override_ })).unwrap();
            assert_eq!(
                defaults.overridden(&o).get(Limit::BlobMaxBytes),
                Some(effective),
                "{override_}"
            );
        }
    }

    #[test]
    fn overrides_out_of_range_or_unknown_are_refused_with_the_pointer() {
        for (body, pointer) in [
            (json!({"eventsPerSecond": 0}), "/eventsPerSecond"),
            (json!({"eventsPerSecond": 1.5}), "/eventsPerSecond"),
            (json!({"eventsPerSecond": "9"}), "/eventsPerSecond"),
            (
                json!({"interruptDefaultExpirySeconds": 315_360_001u64}),
                "/interruptDefaultExpirySeconds",
            ),
            (json!({"a/b": 1}), "/a~1b"),
        ] {
            let e = check_overrides(&body).unwrap_err();
            assert_eq!(e.code(), "NRD-0003");
            assert!(format!("{e:?}").contains(pointer), "{body}: {e:?}");
        }
        assert!(check_overrides(&json!([1])).is_err());
    }
}
