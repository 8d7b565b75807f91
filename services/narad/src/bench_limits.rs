//! `narad bench limits`: the noisy neighbour. Organisation B appends at a
//! steady rate, alone (the baseline), then while organisation A floods at
//! ten times its event rate, on a server with per-tenant limits and on one
//! without. Reports B's append latency as ratios to B alone, and what A
//! was answered.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::bench::{Stats, delta};
use crate::bench_stream::{ServerProcess, bench_token, scratch_on};

/// Options of `narad bench limits`.
#[derive(clap::Args)]
pub struct LimitsBench {
    /// A Postgres server the bench may create scratch databases on
    /// (default: as the tests find one).
    #[arg(long, env = "NARAD_BENCH_SERVER_URL")]
    server_url: Option<String>,
    /// Each organisation's event rate (NARAD_LIMIT_EVENTS_PER_SECOND).
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// B's steady rate, in appends (of one event) per second; B is never
    /// limited (its rate is below the limit).
    #[arg(long, default_value_t = 50)]
    b_rate: u64,
    /// A's offered load, as a multiple of its rate.
    #[arg(long, default_value_t = 10)]
    flood: u64,
    /// Events in each of A's appends.
    #[arg(long, default_value_t = 20)]
    a_batch: u64,
    /// Seconds each phase runs.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

/// What A's flood was answered.
#[derive(Default)]
struct Answers {
    accepted: AtomicU64,
    limited: AtomicU64,
    other: AtomicU64,
}

struct Org {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Org {
    fn new(base: &str, org: &str) -> anyhow::Result<Org> {
        let token = bench_token(org)?;
        Ok(Org {
            base: base.to_owned(),
            token,
            http: reqwest::Client::new(),
        })
    }

    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<u16> {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .json(body)
            .timeout(Duration::from_secs(30))
            .send()
            .await?;
        let status = r.status().as_u16();
        let _ = r.bytes().await;
        Ok(status)
    }

    /// A session with a running run and an open message.
    async fn session(&self, id: &str) -> anyhow::Result<()> {
        for (path, body) in [
            ("/v1/sessions".to_owned(), json!({"sessionId": id})),
            (
                "/v1/commands/start-run".to_owned(),
                json!({"sessionId": id, "runId": "r"}),
            ),
            (
                format!("/v1/sessions/{id}/events"),
                json!({"events": [{"protocolVersion": "narad/v1", "type": "message.text.started",
                    "eventId": format!("{id}-open"), "rootRunId": "r", "runId": "r",
                    "messageId": "m", "role": "assistant", "messageScope": "run"}]}),
            ),
        ] {
            let status = self.post(&path, &body).await?;
            anyhow::ensure!((200..300).contains(&status), "{path}: {status}");
        }
        Ok(())
    }

    async fn append(&self, session: &str, id: &str, n: u64) -> anyhow::Result<u16> {
        let events: Vec<Value> = (0..n)
            .map(|k| delta(&format!("{id}-{k}"), "r", "m"))
            .collect();
        self.post(
            &format!("/v1/sessions/{session}/events"),
            &json!({ "events": events }),
        )
        .await
    }
}

/// `narad bench limits`.
pub async fn limits(args: &LimitsBench) -> anyhow::Result<()> {
    narad_server::auth::install_tls_provider();
    let phase = Duration::from_secs(args.seconds);
    println!(
        "noisy neighbour: B appends {} events/s one by one; A offers {}× its limit of {} events/s \
         in batches of {}; {} s a phase",
        args.b_rate, args.flood, args.rate, args.a_batch, args.seconds
    );
    let limited_env = [
        ("NARAD_LIMIT_EVENTS_PER_SECOND", args.rate.to_string()),
        ("NARAD_LIMIT_EVENTS_BURST", args.rate.to_string()),
    ];
    let mut rows = Vec::new();
    for (name, env, flood) in [
        ("B alone (limits on)", &limited_env[..], 0),
        ("B while A appends at its limit", &limited_env[..], 1),
        ("B while A floods (limits on)", &limited_env[..], args.flood),
        ("B while A floods (no limits)", &[][..], args.flood),
    ] {
        let db = scratch_on(args.server_url.as_deref()).await?;
        let server = ServerProcess::start_with(db.url(), env)?;
        let (mut b, a) = run_phase(args, &server.base, flood, phase).await?;
        rows.push((name, b.percentile(0.5), b.percentile(0.99), b.ops, a));
        drop(server);
    }
    let base_p99 = rows[0].2;
    println!(
        "| phase | B appends | B p50 | B p99 | B p99 ÷ alone | A appends accepted | A 429 | A other |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, p50, p99, ops, a) in &rows {
        println!(
            "| {name} | {ops} | {:.1} ms | {:.1} ms | {:.2} | {} | {} | {} |",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            p99.as_secs_f64() / base_p99.as_secs_f64(),
            a.accepted.load(Ordering::Relaxed),
            a.limited.load(Ordering::Relaxed),
            a.other.load(Ordering::Relaxed),
        );
    }
    Ok(())
}

/// One phase: B paced at its rate for `phase`, with A offering `flood`
/// times its limit (none when 0). Answers B's latencies and A's answers.
async fn run_phase(
    args: &LimitsBench,
    base: &str,
    flood: u64,
    phase: Duration,
) -> anyhow::Result<(Stats, Arc<Answers>)> {
    let b = Org::new(base, "org-b")?;
    let a = Org::new(base, "org-a")?;
    b.session("b").await?;
    a.session("a").await?;
    // Warm B's connection and bucket.
    for i in 0..5 {
        b.append("b", &format!("warm-{i}"), 1).await?;
    }
    let answers = Arc::new(Answers::default());
    let deadline = Instant::now() + phase;
    // A floods from a thread and a runtime of its own: B's measured
    // appends never wait behind A's tasks in this process.
    let flooder = (flood > 0).then(|| {
        let (base, answers) = (base.to_owned(), answers.clone());
        let per_second = (args.rate * flood) as f64 / args.a_batch as f64;
        let batch = args.a_batch;
        std::thread::spawn(move || -> anyhow::Result<()> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(flood_until(&base, answers, per_second, batch, deadline))
        })
    });
    let interval = Duration::from_secs_f64(1.0 / args.b_rate as f64);
    let mut stats = Stats::default();
    let start = Instant::now();
    let mut next = start;
    let mut n = 0u64;
    while Instant::now() < deadline {
        n += 1;
        let t = Instant::now();
        let status = b.append("b", &format!("b-{n}"), 1).await?;
        anyhow::ensure!(status == 201, "B was answered {status}");
        stats.latencies.push(t.elapsed());
        stats.ops += 1;
        next += interval;
        tokio::time::sleep_until(next.into()).await;
    }
    stats.elapsed = start.elapsed();
    if let Some(flooder) = flooder {
        flooder
            .join()
            .map_err(|_| anyhow::anyhow!("the flooding thread panicked"))??;
    }
    Ok((stats, answers))
}

/// A's flood: `per_second` appends of `batch` events over 16 writers,
/// each sending its next append at its due time (never waiting for a
/// `Retry-After`: a flood does not), until `deadline`.
async fn flood_until(
    base: &str,
    answers: Arc<Answers>,
    per_second: f64,
    batch: u64,
    deadline: Instant,
) -> anyhow::Result<()> {
    let a = Arc::new(Org::new(base, "org-a")?);
    let writers = 16u64;
    let per_writer = Duration::from_secs_f64(writers as f64 / per_second);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (a, answers) = (a.clone(), answers.clone());
        tasks.push(tokio::spawn(async move {
            let mut next = Instant::now();
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                match a.append("a", &format!("a-{w}-{n}"), batch).await {
                    Ok(201) => answers.accepted.fetch_add(1, Ordering::Relaxed),
                    Ok(429) => answers.limited.fetch_add(1, Ordering::Relaxed),
                    _ => answers.other.fetch_add(1, Ordering::Relaxed),
                };
                next += per_writer;
                tokio::time::sleep_until(next.into()).await;
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    Ok(())
}
