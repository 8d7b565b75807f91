//! `narad bench soak`: whether the append rate holds on a new database
//! whose statistics nobody refreshes. Writers append batches of deltas
//! across sessions while readers follow sessions through history, on a
//! fresh database that is never analyzed by hand (the machine's own
//! cluster runs with autovacuum off; a production database's automatic
//! `ANALYZE` lags a table that grows fast). The rate of each window is
//! printed beside the first's; the journal's statistics keeper
//! ([`Journal::keep_statistics`], run by the server's sweeper) runs at the
//! server's cadence unless `--no-keeper`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use narad_journal::{AppendOptions, HistoryQuery, Journal, TenantId};
use narad_protocol::primitives::SessionId;
use serde_json::Value;

use crate::bench::{delta, open_sessions};

/// Options of `narad bench soak`.
#[derive(clap::Args)]
pub struct SoakBench {
    /// A Postgres server the bench may create a scratch database on
    /// (default: as the tests find one: NARAD_TEST_DATABASE_URL, else
    /// local binaries).
    #[arg(long, env = "NARAD_BENCH_SERVER_URL")]
    server_url: Option<String>,
    /// Seconds the soak runs.
    #[arg(long, default_value_t = 240)]
    seconds: u64,
    /// Seconds per reported window.
    #[arg(long, default_value_t = 20)]
    window: u64,
    /// Writers, each appending batches back to back.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Events per append.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Sessions the writers spread over.
    #[arg(long, default_value_t = 50)]
    sessions: usize,
    /// Readers, each following one session through history.
    #[arg(long, default_value_t = 20)]
    readers: usize,
    /// Runs no statistics keeper: the database keeps the statistics it
    /// was created with (none), as before the keeper.
    #[arg(long)]
    no_keeper: bool,
    /// Runs `ANALYZE` by hand once, this many seconds in.
    #[arg(long)]
    analyze_at: Option<u64>,
}

/// `narad bench soak`.
pub async fn soak(args: &SoakBench) -> anyhow::Result<()> {
    let db = match &args.server_url {
        Some(url) => narad_testkit::TestDatabase::on_server(url, &narad_journal::MIGRATOR)
            .await
            .map_err(anyhow::Error::msg)?,
        None => narad_testkit::TestDatabase::new(&narad_journal::MIGRATOR).await,
    };
    let journal = Journal::connect(db.url(), 40)?;
    let tenant = TenantId::new("bench").expect("valid");
    open_sessions(&journal, &tenant, args.sessions).await?;
    let appended = Arc::new(AtomicU64::new(0));
    let read = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let mut tasks = Vec::new();
    for w in 0..args.writers {
        let (j, t, appended) = (journal.clone(), tenant.clone(), appended.clone());
        let (batch, sessions) = (args.batch, args.sessions);
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                let k = (w + n as usize * stride(sessions)) % sessions;
                let sid = SessionId::new(format!("s{k}")).expect("valid");
                let events: Vec<Value> = (0..batch)
                    .map(|b| delta(&format!("w{w}-{n}-{b}"), &format!("r{k}"), &format!("m{k}")))
                    .collect();
                j.append(&t, &sid, &events, AppendOptions::default())
                    .await
                    .expect("appends");
                appended.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
        }));
    }
    for r in 0..args.readers {
        let (j, t, read) = (journal.clone(), tenant.clone(), read.clone());
        let session = format!("s{}", r % args.sessions);
        tasks.push(tokio::spawn(async move {
            let mut after = 0u64;
            while Instant::now() < deadline {
                let query = HistoryQuery {
                    after_session_sequence: Some(after),
                    ..HistoryQuery::default()
                };
                let page = j.history(&t, &session, &query).await.expect("reads");
                for e in &page.events {
                    after = e["sessionSequence"].as_u64().unwrap_or(after);
                }
                read.fetch_add(page.events.len() as u64, Ordering::Relaxed);
                if page.next_session_sequence.is_none() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }));
    }
    if !args.no_keeper {
        let j = journal.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                tokio::time::sleep(narad_journal::STATISTICS_CHECK).await;
                if let Err(e) = j.keep_statistics().await {
                    eprintln!("the statistics keeper failed: {e}");
                }
            }
        }));
    }
    println!(
        "| seconds | appends/s | events/s | history events read/s | ratio to the first window |"
    );
    println!("|---|---|---|---|---|");
    let start = Instant::now();
    let window = Duration::from_secs(args.window);
    let (mut first, mut last_a, mut last_r, mut at) = (None, 0u64, 0u64, Duration::ZERO);
    let mut analyzed = false;
    while Instant::now() < deadline {
        tokio::time::sleep(window.min(deadline.saturating_duration_since(Instant::now()))).await;
        if let Some(s) = args.analyze_at
            && !analyzed
            && start.elapsed() >= Duration::from_secs(s)
        {
            let (admin, conn) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            admin.batch_execute("analyze").await?;
            analyzed = true;
            println!("| {} | ANALYZE by hand | | | |", start.elapsed().as_secs());
        }
        let elapsed = start.elapsed() - at;
        at = start.elapsed();
        let (a, r) = (
            appended.load(Ordering::Relaxed),
            read.load(Ordering::Relaxed),
        );
        let rate = (a - last_a) as f64 / elapsed.as_secs_f64();
        let reads = (r - last_r) as f64 / elapsed.as_secs_f64();
        (last_a, last_r) = (a, r);
        let base = *first.get_or_insert(rate);
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.2} |",
            at.as_secs(),
            rate,
            rate * args.batch as f64,
            reads,
            rate / base
        );
    }
    for t in tasks {
        t.await?;
    }
    Ok(())
}

/// Sessions a writer skips between appends: spreads writers over the sessions.
fn stride(sessions: usize) -> usize {
    if sessions > 7 { 7 } else { 1 }
}
