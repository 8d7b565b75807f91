//! `narad bench`: throughput and latency of the journal, each scenario
//! beside a baseline measured in the same run on the same database, pool
//! and concurrency. Results are ratios; absolute numbers vary with the
//! machine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bench_profile::{Profiler, Sample, Used};
use narad_journal::{AppendOptions, Journal, NewSession, TenantId};
use narad_protocol::primitives::SessionId;
use serde_json::{Value, json};

/// Options of `narad bench append`.
#[derive(clap::Args)]
pub struct AppendBench {
    /// A Postgres server the bench may create a scratch database on
    /// (default: as the tests find one: NARAD_TEST_DATABASE_URL, else
    /// local binaries).
    #[arg(long, env = "NARAD_BENCH_SERVER_URL")]
    server_url: Option<String>,
    /// Seconds each side of a scenario runs in all.
    #[arg(long, default_value_t = 6)]
    seconds: u64,
    /// Rounds each scenario's time is cut into; each round measures the
    /// baseline, then the journal.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Connections in the pool (shared by baseline and journal).
    #[arg(long, default_value_t = 40)]
    pool: usize,
    /// Append transactions the journal runs at a time (each combining the
    /// appends waiting when it began).
    #[arg(long, default_value_t = narad_journal::DEFAULT_APPEND_GROUPS)]
    groups: usize,
    /// Run only the scenario of this name, or else those whose name
    /// contains this text.
    #[arg(long)]
    only: Option<String>,
    /// Fail (a non-zero exit) when a scenario's events ratio to its in-run
    /// baseline is below this: the CI's smoke (`.ci/bench-smoke`).
    #[arg(long)]
    min_ratio: Option<f64>,
    /// Also print what each side costs per operation (Postgres CPU when the
    /// server runs on this machine, this process's CPU, WAL bytes) and,
    /// when the server preloads `pg_stat_statements`, each statement of
    /// the journal's side per append.
    #[arg(long)]
    profile: bool,
}

#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) ops: u64,
    pub(crate) events: u64,
    pub(crate) elapsed: Duration,
    pub(crate) latencies: Vec<Duration>,
}

impl Stats {
    pub(crate) fn add(&mut self, other: Stats) {
        self.ops += other.ops;
        self.events += other.events;
        self.elapsed += other.elapsed;
        self.latencies.extend(other.latencies);
    }

    pub(crate) fn per_second(&self, n: u64) -> f64 {
        n as f64 / self.elapsed.as_secs_f64()
    }

    pub(crate) fn percentile(&mut self, p: f64) -> Duration {
        self.latencies.sort_unstable();
        let i = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies.get(i).copied().unwrap_or_default()
    }
}

/// Runs `writers` tasks, each calling `op(writer, n)` back to back until
/// `duration` has passed, with `n` counting from `first`; `op` returns the
/// number of events it wrote.
pub(crate) async fn measure<F, Fut>(writers: usize, duration: Duration, first: u64, op: F) -> Stats
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = u64> + Send,
{
    let op = Arc::new(op);
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut events, mut n) = (Vec::new(), 0u64, first);
            while Instant::now() < deadline {
                let t = Instant::now();
                events += op(w, n).await;
                lat.push(t.elapsed());
                n += 1;
            }
            (lat, events)
        }));
    }
    let mut stats = Stats {
        ops: 0,
        events: 0,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
    };
    for t in tasks {
        let (lat, events) = t.await.expect("a writer task");
        stats.ops += lat.len() as u64;
        stats.events += events;
        stats.latencies.extend(lat);
    }
    stats.elapsed = start.elapsed();
    stats
}

pub(crate) fn delta(id: &str, run: &str, message: &str) -> Value {
    json!({
        "protocolVersion": "narad/v1", "type": "message.text.delta", "eventId": id,
        "rootRunId": run, "runId": run, "messageId": message,
        "delta": "the quick brown fox jumps over the lazy dog ",
    })
}

/// Creates sessions `s0`… with, in each `sN`, run `rN` running and message
/// `mN` open, so that [`delta`]s of `rN`/`mN` can be appended to it.
pub(crate) async fn open_sessions(
    journal: &Journal,
    tenant: &TenantId,
    count: usize,
) -> anyhow::Result<()> {
    for n in 0..count {
        let sid = SessionId::new(format!("s{n}")).expect("valid");
        journal
            .create_session(
                tenant,
                NewSession {
                    session_id: Some(sid.clone()),
                    ..NewSession::default()
                },
            )
            .await?;
        let run = format!("r{n}");
        let open = [
            json!({"protocolVersion": "narad/v1", "type": "run.started", "eventId": format!("start-{n}"), "rootRunId": run, "runId": run}),
            json!({"protocolVersion": "narad/v1", "type": "message.text.started", "eventId": format!("msg-{n}"), "rootRunId": run, "runId": run, "messageId": format!("m{n}"), "role": "assistant", "messageScope": "run"}),
        ];
        journal
            .append(tenant, &sid, &open, AppendOptions::default())
            .await?;
    }
    Ok(())
}

/// One scenario: `writers` writers over `sessions` sessions, `batch`
/// events per append.
struct Scenario {
    name: &'static str,
    writers: usize,
    one_session: bool,
    batch: usize,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "1 writer",
        writers: 1,
        one_session: false,
        batch: 1,
    },
    Scenario {
        name: "8 writers, 8 sessions",
        writers: 8,
        one_session: false,
        batch: 1,
    },
    Scenario {
        name: "32 writers, 32 sessions",
        writers: 32,
        one_session: false,
        batch: 1,
    },
    Scenario {
        name: "32 writers, 1 session",
        writers: 32,
        one_session: true,
        batch: 1,
    },
    Scenario {
        name: "32 writers, 32 sessions, batches of 16",
        writers: 32,
        one_session: false,
        batch: 16,
    },
];

/// `narad bench append`.
pub async fn append(args: &AppendBench) -> anyhow::Result<()> {
    let duration = Duration::from_secs(args.seconds);
    println!(
        "| scenario | baseline ops/s | narad ops/s | narad events/s | ops ratio | events ratio | baseline p50 / p99 ms | narad p50 / p99 ms | appends per transaction |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let exact = args
        .only
        .as_ref()
        .is_some_and(|o| SCENARIOS.iter().any(|s| s.name == o));
    let mut below = Vec::new();
    // --profile: a row of costs and a table of statements per scenario.
    let (mut costs, mut statement_tables) = (Vec::new(), Vec::new());
    for s in SCENARIOS {
        if args.only.as_ref().is_some_and(|o| {
            if exact {
                s.name != o
            } else {
                !s.name.contains(o.as_str())
            }
        }) {
            continue;
        }
        let db = match &args.server_url {
            Some(url) => narad_testkit::TestDatabase::on_server(url, &narad_journal::MIGRATOR)
                .await
                .map_err(anyhow::Error::msg)?,
            None => narad_testkit::TestDatabase::new(&narad_journal::MIGRATOR).await,
        };
        let journal = Journal::connect(db.url(), args.pool)?.with_append_groups(args.groups);
        let tenant = TenantId::new("bench").expect("valid");
        let sessions = if s.one_session { 1 } else { s.writers };
        open_sessions(&journal, &tenant, sessions).await?;
        // The baseline: a plain INSERT of the same JSON row, committed, with
        // as many connections (see `baseline_pool`).
        {
            // Created by the database's owner; written as narad_app, like
            // the journal's tables.
            let (admin, conn) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            admin
                .batch_execute(
                    "create table bench_baseline (id bigint generated always as identity primary key, \
                     tenant_id text not null, session_id text not null, body jsonb not null); \
                     grant insert on bench_baseline to narad_app",
                )
                .await?;
        }
        // Warm up, then take statistics as a database in service has
        // them: plans made on never-analyzed, nearly empty tables scan
        // whole tables, and a run is too short for autovacuum to analyze.
        warm_up(&journal, &tenant, s).await;
        {
            let (admin, conn) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            admin.batch_execute("analyze").await?;
        }
        let sample = {
            let mut e = delta("w0-0-0", "r0", "m0");
            e["sessionId"] = json!("s0");
            e["timestamp"] = json!("2026-08-05T04:00:00.000Z");
            e["sessionSequence"] = json!(3);
            e["sequence"] = json!(3);
            e
        };
        let batch = s.batch;
        let pool = baseline_pool(db.url(), args.pool)?;
        let baseline = move |w: usize, _: u64| {
            let (pool, body) = (pool.clone(), sample.clone());
            async move {
                let client = pool.get().await.expect("a connection");
                let stmt = client
                    .prepare_cached(
                        "insert into bench_baseline (tenant_id, session_id, body) \
                         select 'bench', $1, b from unnest($2::jsonb[]) as b",
                    )
                    .await
                    .expect("prepares");
                let bodies = vec![body; batch];
                client
                    .execute(&stmt, &[&format!("s{w}"), &bodies])
                    .await
                    .expect("inserts");
                batch as u64
            }
        };
        let appends = {
            let (j, t, one) = (journal.clone(), tenant.clone(), s.one_session);
            move |w: usize, n: u64| {
                let (j, t) = (j.clone(), t.clone());
                async move {
                    let k = if one { 0 } else { w };
                    let sid = SessionId::new(format!("s{k}")).expect("valid");
                    let events: Vec<Value> = (0..batch)
                        .map(|b| {
                            delta(&format!("w{w}-{n}-{b}"), &format!("r{k}"), &format!("m{k}"))
                        })
                        .collect();
                    j.append(&t, &sid, &events, AppendOptions::default())
                        .await
                        .expect("appends");
                    batch as u64
                }
            }
        };
        let profiler = match args.profile {
            true => Some(Profiler::connect(db.url()).await?),
            false => None,
        };
        let statements = match &profiler {
            Some(p) => p.statements_reset().await,
            None => false,
        };
        let (mut base_used, mut ours_used) = (Used::default(), Used::default());
        let before = journal.append_stats();
        let (mut base, mut ours) = (Stats::default(), Stats::default());
        let slice = duration / args.rounds.max(1);
        // Rounds alternate baseline and journal, so that a change in the
        // machine's load weighs on both alike.
        for round in 0..args.rounds.max(1) as u64 {
            let first = round * 1_000_000_000;
            let t0 = used_so_far(&profiler).await?;
            base.add(measure(s.writers, slice, first, baseline.clone()).await);
            let t1 = used_so_far(&profiler).await?;
            ours.add(measure(s.writers, slice, first, appends.clone()).await);
            let t2 = used_so_far(&profiler).await?;
            if profiler.is_some() {
                base_used.add(t0, t1);
                ours_used.add(t1, t2);
            }
        }
        if let Some(p) = &profiler {
            let table = match statements {
                true => p.statements(ours.ops).await?,
                false => "(pg_stat_statements is not preloaded by the server: no statements)\n"
                    .to_string(),
            };
            costs.push(format!(
                "| {} | {} | {} |",
                s.name,
                base_used.per_op(base.ops),
                ours_used.per_op(ours.ops)
            ));
            statement_tables.push(format!(
                "\n{}, the journal's statements:\n\n{table}",
                s.name
            ));
        }
        let after = journal.append_stats();
        let per_transaction =
            (after.grouped - before.grouped) as f64 / (after.groups - before.groups).max(1) as f64;
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.1} |",
            s.name,
            base.per_second(base.ops),
            ours.per_second(ours.ops),
            ours.per_second(ours.events),
            ours.per_second(ours.ops) / base.per_second(base.ops),
            ours.per_second(ours.events) / base.per_second(base.events),
            ms(base.percentile(0.5)),
            ms(base.percentile(0.99)),
            ms(ours.percentile(0.5)),
            ms(ours.percentile(0.99)),
            per_transaction,
        );
        let ratio = ours.per_second(ours.events) / base.per_second(base.events);
        if args.min_ratio.is_some_and(|floor| ratio < floor) {
            below.push(format!("{}: {ratio:.2}", s.name));
        }
        drop(journal);
        drop(db);
    }
    if !costs.is_empty() {
        println!(
            "\n| scenario | baseline: Postgres CPU µs / op | baseline: bench CPU µs / op | baseline: WAL bytes / op | narad: Postgres CPU µs / append | narad: bench CPU µs / append | narad: WAL bytes / append |"
        );
        println!("|---|---|---|---|---|---|---|");
        for row in costs.iter().chain(&statement_tables) {
            println!("{row}");
        }
    }
    if !below.is_empty() {
        anyhow::bail!(
            "below the floor of {:.2} (events ratio to the in-run baseline): {}",
            args.min_ratio.unwrap_or_default(),
            below.join(", ")
        );
    }
    Ok(())
}

/// A sample of the resources used so far, or nothing without a profiler.
async fn used_so_far(profiler: &Option<Profiler>) -> anyhow::Result<Sample> {
    match profiler {
        Some(p) => p.sample().await,
        None => Ok(Sample::default()),
    }
}

/// Appends `WARM_UP` batches per writer under ids of their own, so that the
/// measured run starts on tables that hold data.
async fn warm_up(journal: &Journal, tenant: &TenantId, s: &Scenario) {
    let mut tasks = Vec::new();
    for w in 0..s.writers {
        let (j, t, batch, one) = (journal.clone(), tenant.clone(), s.batch, s.one_session);
        tasks.push(tokio::spawn(async move {
            let k = if one { 0 } else { w };
            let sid = SessionId::new(format!("s{k}")).expect("valid");
            for n in 0..WARM_UP {
                let events: Vec<Value> = (0..batch)
                    .map(|b| {
                        delta(
                            &format!("warm-w{w}-{n}-{b}"),
                            &format!("r{k}"),
                            &format!("m{k}"),
                        )
                    })
                    .collect();
                j.append(&t, &sid, &events, AppendOptions::default())
                    .await
                    .expect("appends");
            }
        }));
    }
    for t in tasks {
        t.await.expect("a warm-up task");
    }
}

/// Batches each writer appends before a measurement.
const WARM_UP: u64 = 50;

/// The baseline's pool: as large as the journal's, its connections running
/// as the same role and handed out the same way, but its own, so that the
/// two never queue behind each other.
fn baseline_pool(url: &str, size: usize) -> anyhow::Result<deadpool_postgres::Pool> {
    use deadpool_postgres::{Hook, HookError, Manager, ManagerConfig, Pool, RecyclingMethod};
    let config: tokio_postgres::Config = url.parse()?;
    let manager = Manager::from_config(
        config,
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Ok(Pool::builder(manager)
        .max_size(size)
        .post_create(Hook::async_fn(|client, _| {
            Box::pin(async move {
                client
                    .batch_execute(narad_journal::CONNECTION_SETUP)
                    .await
                    .map_err(HookError::Backend)
            })
        }))
        .build()?)
}
