//! `narad bench commands`: what an `Idempotency-Key` costs a command.
//! `record-user-message` through a `narad serve` over HTTP, each command
//! without a key (the baseline), with a fresh key (the key is claimed,
//! then its answer kept), and sent again with a key already answered (the
//! replay), in alternating rounds in one run; reported as ratios to the
//! baseline.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;

use crate::bench::{Stats, measure};
use crate::bench_stream::{ServerProcess, bench_token, scratch_on};

/// Options of `narad bench commands`.
#[derive(clap::Args)]
pub struct CommandsBench {
    /// A Postgres server the bench may create scratch databases on
    /// (default: as the tests find one).
    #[arg(long, env = "NARAD_BENCH_SERVER_URL")]
    server_url: Option<String>,
    /// Concurrent clients, each with a session of its own.
    #[arg(long, default_value_t = 16)]
    writers: usize,
    /// Seconds each round of each kind runs.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Rounds of each kind, alternating (the machine's drift falls on
    /// each kind alike).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
}

/// How each command of a round is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    NoKey,
    FreshKey,
    Replay,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::NoKey => "no key (baseline)",
            Kind::FreshKey => "a fresh key each",
            Kind::Replay => "a key answered before (replay)",
        }
    }
}

/// Keys per client the replay rounds resend.
const REPLAY_KEYS: u64 = 64;

/// The command every client sends to its own session.
fn say(writer: usize) -> serde_json::Value {
    json!({"sessionId": format!("s-{writer}"), "messageScope": "session", "content": "hello"})
}

/// `narad bench commands`.
pub async fn commands(args: &CommandsBench) -> anyhow::Result<()> {
    narad_server::auth::install_tls_provider();
    let db = scratch_on(args.server_url.as_deref()).await?;
    let server = ServerProcess::start_with(db.url(), &[])?;
    let token = Arc::new(bench_token("org-bench")?);
    let http = reqwest::Client::new();
    let base = Arc::new(server.base.clone());
    for w in 0..args.writers {
        let status = http
            .post(format!("{base}/v1/sessions"))
            .bearer_auth(token.as_str())
            .json(&json!({"sessionId": format!("s-{w}")}))
            .send()
            .await?
            .status();
        anyhow::ensure!(status.as_u16() == 201, "a session: {status}");
    }
    println!(
        "record-user-message over HTTP, {} clients, {} rounds of {} s of each kind",
        args.writers, args.rounds, args.seconds
    );
    // The keys the replay rounds resend, answered once beforehand.
    for w in 0..args.writers {
        for k in 0..REPLAY_KEYS {
            let status = http
                .post(format!("{base}/v1/commands/record-user-message"))
                .bearer_auth(token.as_str())
                .header("idempotency-key", format!("replay-{w}-{k}"))
                .json(&say(w))
                .send()
                .await?
                .status();
            anyhow::ensure!(status.as_u16() == 201, "a first answer: {status}");
        }
    }
    let kinds = [Kind::NoKey, Kind::FreshKey, Kind::Replay];
    let mut totals: Vec<Stats> = kinds.iter().map(|_| Stats::default()).collect();
    let counter = Arc::new(AtomicU64::new(0));
    for round in 0..args.rounds {
        for (i, kind) in kinds.iter().copied().enumerate() {
            let (http, base, token) = (http.clone(), base.clone(), token.clone());
            let counter = counter.clone();
            let stats = measure(
                args.writers,
                Duration::from_secs(args.seconds),
                0,
                move |w, n| {
                    let (http, base, token) = (http.clone(), base.clone(), token.clone());
                    let counter = counter.clone();
                    async move {
                        let key = match kind {
                            Kind::NoKey => None,
                            Kind::FreshKey => {
                                Some(format!("k-{}", counter.fetch_add(1, Ordering::Relaxed)))
                            }
                            Kind::Replay => Some(format!("replay-{w}-{}", n % REPLAY_KEYS)),
                        };
                        let mut request = http
                            .post(format!("{base}/v1/commands/record-user-message"))
                            .bearer_auth(token.as_str())
                            .json(&say(w));
                        if let Some(key) = key {
                            request = request.header("idempotency-key", key);
                        }
                        let ok = match request.send().await {
                            Ok(r) => r.status().as_u16() == 201,
                            Err(_) => false,
                        };
                        u64::from(ok)
                    }
                },
            )
            .await;
            anyhow::ensure!(
                stats.events == stats.ops,
                "{} of {} commands of kind {:?} failed (round {round})",
                stats.ops - stats.events,
                stats.ops,
                kind.name()
            );
            totals[i].add(stats);
        }
    }
    let mut rows = Vec::new();
    for (kind, stats) in kinds.iter().zip(totals.iter_mut()) {
        let rate = stats.ops as f64 / stats.elapsed.as_secs_f64();
        rows.push((
            kind.name(),
            rate,
            stats.percentile(0.5),
            stats.percentile(0.99),
        ));
    }
    let (base_rate, base_p50) = (rows[0].1, rows[0].2);
    println!("| commands sent with | commands/s | ÷ baseline | p50 | p50 ÷ baseline | p99 |");
    println!("|---|---|---|---|---|---|");
    for (name, rate, p50, p99) in rows {
        println!(
            "| {name} | {rate:.0} | {:.2} | {:.2} ms | {:.2} | {:.2} ms |",
            rate / base_rate,
            p50.as_secs_f64() * 1e3,
            p50.as_secs_f64() / base_p50.as_secs_f64(),
            p99.as_secs_f64() * 1e3,
        );
    }
    drop(server);
    Ok(())
}
