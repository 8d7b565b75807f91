//! `narad bench stream`: live delivery, measured against the targets of
//! BENCHMARKS.md, each figure beside a baseline of the same run.
//!
//! The server runs as a child process (`narad serve` on a scratch
//! database), so that its memory can be read on its own; the subscribers,
//! writers and the baselines run in this process. Both share the machine's
//! cores, as they would on a small host.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use narad_journal::{AppendOptions, Journal, TenantId};
use narad_protocol::primitives::SessionId;
use narad_server::auth::Role;
use serde_json::{Value, json};

use crate::bench::{Stats, delta, measure, open_sessions};

/// Options of `narad bench stream`.
#[derive(clap::Args)]
pub struct StreamBench {
    /// A Postgres server the bench may create scratch databases on
    /// (default: as the tests find one).
    #[arg(long, env = "NARAD_BENCH_SERVER_URL")]
    server_url: Option<String>,
    /// Live subscribers (throughput and latency scenarios).
    #[arg(long, default_value_t = 1_000)]
    subscribers: usize,
    /// Idle connections held for the memory scenario.
    #[arg(long, default_value_t = 10_000)]
    idle: usize,
    /// Events replayed by the replay scenario.
    #[arg(long, default_value_t = 100_000)]
    replay_events: u64,
    /// Events per append in the latency scenario (1,000 events/s in all).
    #[arg(long, default_value_t = 10)]
    latency_batch: u64,
    /// Subscribers of the fan-out comparison.
    #[arg(long, default_value_t = 100)]
    fanout_subscribers: usize,
    /// Seconds each measured side runs.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Run only the scenarios whose name contains this text.
    #[arg(long)]
    only: Option<String>,
}

pub(crate) const SECRET: &str = "bench-secret-bench-secret-bench-secret!";

/// `narad bench stream`.
pub async fn stream(args: &StreamBench) -> anyhow::Result<()> {
    check_open_files_limit();
    let wants = |name: &str| args.only.as_ref().is_none_or(|o| name.contains(o.as_str()));
    if wants("notify") {
        notify_placement(args).await?;
    }
    let db = scratch(args).await?;
    let server = ServerProcess::start(db.url())?;
    let bench = Bench::new(&server.base)?;
    warm_up(&bench, db.url()).await?;
    if wants("throughput") {
        throughput(args, &bench).await?;
    }
    if wants("latency") {
        latency(args, &bench).await?;
    }
    if wants("lone") {
        lone(&bench, db.url(), server.pid()).await?;
    }
    if wants("idle") {
        idle(args, &bench, &server).await?;
    }
    if wants("replay") {
        replay(args, &bench).await?;
    }
    if wants("fanout") {
        fanout(args, &bench).await?;
    }
    drop(server);
    Ok(())
}

pub(crate) async fn scratch_on(
    server_url: Option<&str>,
) -> anyhow::Result<narad_testkit::TestDatabase> {
    Ok(match server_url {
        Some(url) => narad_testkit::TestDatabase::on_server(url, &narad_journal::MIGRATOR)
            .await
            .map_err(anyhow::Error::msg)?,
        None => narad_testkit::TestDatabase::new(&narad_journal::MIGRATOR).await,
    })
}

async fn scratch(args: &StreamBench) -> anyhow::Result<narad_testkit::TestDatabase> {
    scratch_on(args.server_url.as_deref()).await
}

/// Appends a few thousand events, then analyzes the database, as a
/// database in service has statistics: plans made on never-analyzed,
/// nearly empty tables scan whole tables (the append rate of the
/// throughput scenario was a fifth of an analyzed database's), and a run is
/// too short for autovacuum to analyze.
async fn warm_up(bench: &Bench, database_url: &str) -> anyhow::Result<()> {
    for _ in 0..4 {
        let session = bench.session().await?;
        for n in 0..25 {
            let events = (0..20)
                .map(|k| delta(&format!("warm-{session}-{n}-{k}"), "r", "m"))
                .collect();
            bench.append(&session, events).await?;
        }
    }
    let (admin, conn) = tokio_postgres::connect(database_url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    admin.batch_execute("analyze").await?;
    Ok(())
}

/// Thousands of connections need thousands of descriptors, here and in
/// the server child: says so when the hard limit is too low.
fn check_open_files_limit() {
    // Read through the shell: std has no getrlimit, and unsafe code is
    // forbidden here.
    let hard = Command::new("sh")
        .args(["-c", "ulimit -Hn"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_default();
    if hard.trim() != "unlimited" && hard.trim().parse::<u64>().unwrap_or(0) < 12_000 {
        eprintln!(
            "narad bench stream: the open-files hard limit is {}; the idle scenario needs a \
             descriptor per connection, in this process and in the server",
            hard.trim()
        );
    }
}

/// A token of every role for organisation `org`, an hour long, signed
/// with the secret the bench's servers take.
pub(crate) fn bench_token(org: &str) -> anyhow::Result<String> {
    narad_server::auth::mint_hs256(
        SECRET.as_bytes(),
        "narad",
        "narad",
        org,
        "bench",
        &Role::ALL,
        Duration::from_secs(3600),
    )
    .map_err(anyhow::Error::msg)
}

/// `narad serve` as a child process.
pub(crate) struct ServerProcess {
    child: Child,
    pub(crate) base: String,
}

impl ServerProcess {
    fn start(database_url: &str) -> anyhow::Result<ServerProcess> {
        ServerProcess::start_with(database_url, &[])
    }

    /// Starts `narad serve` on `database_url` with `env` besides the
    /// bench's own settings (tokens signed with [`SECRET`]).
    pub(crate) fn start_with(
        database_url: &str,
        env: &[(&str, String)],
    ) -> anyhow::Result<ServerProcess> {
        use std::io::{BufRead, BufReader};
        let exe = std::env::current_exe()?;
        // The child raises its soft open-files limit to the hard one.
        let mut child = Command::new("sh")
            .args(["-c", "ulimit -n \"$(ulimit -Hn)\"; exec \"$0\" serve"])
            .arg(&exe)
            .env("NARAD_DATABASE_URL", database_url)
            .env("NARAD_JWT_HS256_SECRET", SECRET)
            .env("NARAD_LISTEN", "127.0.0.1:0")
            .env("RUST_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let out = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(out).lines();
        let base = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(addr) = line.strip_prefix("narad is serving on ") {
                        break addr.trim().to_owned();
                    }
                }
                _ => anyhow::bail!("narad serve ended before serving"),
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Ok(ServerProcess { child, base })
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's resident memory, in KiB.
    pub(crate) fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
            })
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// The client side: an HTTP client per role and a token.
struct Bench {
    base: String,
    token: String,
    writes: reqwest::Client,
    reads: reqwest::Client,
    sessions: AtomicU64,
}

impl Bench {
    /// The server's `narad_append_duration_seconds` so far: its sum in
    /// seconds and its count.
    async fn journal_time(&self) -> anyhow::Result<(f64, f64)> {
        let text = self
            .writes
            .get(format!("{}/metrics", self.base))
            .send()
            .await?
            .text()
            .await?;
        let read = |suffix: &str| {
            text.lines()
                .filter(|l| l.starts_with(&format!("narad_append_duration_seconds{suffix}")))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>()
        };
        Ok((read("_sum"), read("_count")))
    }

    fn new(base: &str) -> anyhow::Result<Bench> {
        narad_server::auth::install_tls_provider();
        let token = bench_token("bench")?;
        Ok(Bench {
            base: base.to_owned(),
            token,
            writes: reqwest::Client::new(),
            reads: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()?,
            sessions: AtomicU64::new(0),
        })
    }

    async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let r = self
            .writes
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await?;
        let status = r.status();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        anyhow::ensure!(status.is_success(), "{path}: {status} {body}");
        Ok(body)
    }

    /// A new session with a running run and an open message.
    async fn session(&self) -> anyhow::Result<String> {
        let id = format!("s{}", self.sessions.fetch_add(1, Ordering::Relaxed));
        self.post("/v1/sessions", &json!({"sessionId": id})).await?;
        self.post(
            "/v1/commands/start-run",
            &json!({"sessionId": id, "runId": "r"}),
        )
        .await?;
        self.append(
            &id,
            vec![
                json!({"protocolVersion": "narad/v1", "type": "message.text.started",
                "eventId": format!("{id}-open"), "rootRunId": "r", "runId": "r",
                "messageId": "m", "role": "assistant", "messageScope": "run"}),
            ],
        )
        .await?;
        Ok(id)
    }

    async fn append(&self, session: &str, events: Vec<Value>) -> anyhow::Result<()> {
        self.post(
            &format!("/v1/sessions/{session}/events"),
            &json!({ "events": events }),
        )
        .await
        .map(drop)
    }

    /// Opens a session stream after `after` (no replay, no hydrate).
    async fn open(&self, session: &str, after: u64) -> anyhow::Result<reqwest::Response> {
        let r = self
            .reads
            .get(format!(
                "{}/v1/sessions/{session}/stream?afterSessionSequence={after}",
                self.base
            ))
            .bearer_auth(&self.token)
            .send()
            .await?;
        anyhow::ensure!(r.status().is_success(), "stream: {}", r.status());
        Ok(r)
    }

    async fn sequence(&self, session: &str) -> anyhow::Result<u64> {
        let r: Value = self
            .writes
            .get(format!("{}/v1/sessions/{session}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await?
            .json()
            .await?;
        Ok(r["sessionSequence"].as_u64().unwrap_or(0))
    }
}

/// Reads a stream to its end, counting authority frames.
async fn drain(response: reqwest::Response, count: Arc<AtomicU64>) {
    let finder = memchr::memmem::Finder::new(b"\"sessionSequence\"");
    let mut body = response.bytes_stream();
    let mut carry: Vec<u8> = Vec::new();
    while let Some(Ok(chunk)) = body.next().await {
        carry.extend_from_slice(&chunk);
        let found = finder.find_iter(&carry).count() as u64;
        count.fetch_add(found, Ordering::Relaxed);
        // Keep what could be the start of a key cut by the chunk's end.
        let keep = carry.len().min(16);
        carry.drain(..carry.len() - keep);
        if finder.find(&carry).is_some() {
            carry.clear();
        }
    }
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn timed_delta(id: &str) -> Value {
    let mut d = delta(id, "r", "m");
    d["delta"] = json!(now_micros().to_string());
    d
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// Append throughput with subscribers beside the same without.
async fn throughput(args: &StreamBench, bench: &Bench) -> anyhow::Result<()> {
    const WRITERS: usize = 8;
    let mut sessions = Vec::new();
    for _ in 0..WRITERS {
        sessions.push(bench.session().await?);
    }
    let sessions = Arc::new(sessions);
    let run = |tag: &'static str, round: u32| {
        let sessions = sessions.clone();
        let base = bench.base.clone();
        let token = bench.token.clone();
        let http = bench.writes.clone();
        async move {
            measure(
                WRITERS,
                Duration::from_secs(args.seconds),
                0,
                move |w, n| {
                    let (http, base, token, session) =
                        (http.clone(), base.clone(), token.clone(), sessions[w].clone());
                    async move {
                        let r = http
                            .post(format!("{base}/v1/sessions/{session}/events"))
                            .bearer_auth(&token)
                            .json(&json!({"events": [delta(&format!("{tag}{round}-{w}-{n}"), "r", "m")]}))
                            .send()
                            .await;
                        u64::from(r.is_ok_and(|r| r.status().is_success()))
                    }
                },
            )
            .await
        }
    };
    let (mut none, mut with) = (Stats::default(), Stats::default());
    let frames = Arc::new(AtomicU64::new(0));
    for round in 0..2 {
        none.add(run("none", round).await);
        let mut readers = Vec::new();
        for k in 0..args.subscribers {
            let session = &sessions[k % WRITERS];
            let after = bench.sequence(session).await?;
            readers.push(tokio::spawn(drain(
                bench.open(session, after).await?,
                frames.clone(),
            )));
        }
        with.add(run("with", round).await);
        for r in readers {
            r.abort();
        }
    }
    let (a, b) = (none.per_second(none.events), with.per_second(with.events));
    println!("\n### Append throughput with live subscribers\n");
    println!(
        "| writers | subscribers | appends/s without | appends/s with | ratio | frames delivered/s |"
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| {WRITERS} | {} | {a:.0} | {b:.0} | {:.2} | {:.0} |",
        args.subscribers,
        b / a,
        frames.load(Ordering::Relaxed) as f64 / with.elapsed.as_secs_f64()
    );
    Ok(())
}

/// One writer appending one event at a time over HTTP, nothing else
/// running: each append's round trip beside the server's cheapest request
/// (`GET /healthz`) on the same connection, the floor any request pays;
/// the mean time appends spent in the server's journal (its
/// `narad_append_duration_seconds`: queue, transaction, answer); and what
/// each append (with its `GET /healthz`) costs the Postgres cluster (when
/// local) and the server process in CPU, and in WAL.
async fn lone(bench: &Bench, database_url: &str, server: u32) -> anyhow::Result<()> {
    const APPENDS: usize = 2_000;
    let session = bench.session().await?;
    let profiler = crate::bench_profile::Profiler::connect(database_url)
        .await?
        .of_process(server);
    let (mut appends, mut floor) = (Stats::default(), Stats::default());
    let (mut used, mut before) = (crate::bench_profile::Used::default(), None);
    for n in 0..APPENDS + 200 {
        if n == 200 {
            before = Some((profiler.sample().await?, bench.journal_time().await?));
        }
        let t = Instant::now();
        let r = bench
            .writes
            .get(format!("{}/healthz", bench.base))
            .send()
            .await?;
        r.bytes().await?;
        let health = t.elapsed();
        let t = Instant::now();
        bench
            .append(&session, vec![delta(&format!("lone-{n}"), "r", "m")])
            .await?;
        // The first 200 of each warm the connection and the plans.
        if n >= 200 {
            appends.latencies.push(t.elapsed());
            floor.latencies.push(health);
        }
    }
    let mut in_journal = 0.0;
    if let Some((sample, (seconds, count))) = before {
        used.add(sample, profiler.sample().await?);
        let (seconds_after, count_after) = bench.journal_time().await?;
        in_journal = (seconds_after - seconds) / (count_after - count).max(1.0);
    }
    let mean = appends.latencies.iter().sum::<Duration>().as_secs_f64() / APPENDS as f64;
    let ms = |s: &mut Stats, p: f64| s.percentile(p).as_secs_f64() * 1000.0;
    println!(
        "| lone append over HTTP (1 writer, 1 event) | append p50 / p99 ms | mean ms (in the journal) | GET /healthz p50 / p99 ms | Postgres CPU µs | server CPU µs | WAL bytes |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {APPENDS} appends | {:.3} / {:.3} | {:.3} ({:.3}) | {:.3} / {:.3} | {} |",
        ms(&mut appends, 0.5),
        ms(&mut appends, 0.99),
        mean * 1000.0,
        in_journal * 1000.0,
        ms(&mut floor, 0.5),
        ms(&mut floor, 0.99),
        used.per_op(APPENDS as u64)
    );
    Ok(())
}

/// Append→frame latency at 1,000 events/s with many subscribers on one
/// session, sampled on some of them.
async fn latency(args: &StreamBench, bench: &Bench) -> anyhow::Result<()> {
    const SAMPLED: usize = 20;
    const RATE: u64 = 1_000;
    let session = bench.session().await?;
    let after = bench.sequence(&session).await?;
    let frames = Arc::new(AtomicU64::new(0));
    let mut drains = Vec::new();
    for _ in SAMPLED..args.subscribers.max(SAMPLED) {
        drains.push(tokio::spawn(drain(
            bench.open(&session, after).await?,
            frames.clone(),
        )));
    }
    let total = RATE * args.seconds;
    // Samplers read until the writes are over and the last frames had
    // time to arrive.
    let until = tokio::time::Instant::now() + Duration::from_secs(args.seconds + 3);
    let mut samplers = Vec::new();
    for _ in 0..SAMPLED {
        let response = bench.open(&session, after).await?;
        samplers.push(tokio::spawn(async move {
            let mut events = response.bytes_stream().eventsource();
            let mut lat = Vec::new();
            while let Ok(Some(Ok(e))) = tokio::time::timeout_at(until, events.next()).await {
                let received = now_micros();
                if let Ok(v) = serde_json::from_str::<Value>(&e.data)
                    && v["type"] == "message.text.delta"
                    && let Some(sent) = v["delta"].as_str().and_then(|s| s.parse::<u64>().ok())
                {
                    lat.push(Duration::from_micros(received.saturating_sub(sent)));
                }
            }
            lat
        }));
    }
    let batch = args.latency_batch.max(1);
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 * batch / RATE));
    let mut writes = Vec::new();
    for n in 0..total / batch {
        tick.tick().await;
        let (http, base, token, session) = (
            bench.writes.clone(),
            bench.base.clone(),
            bench.token.clone(),
            session.clone(),
        );
        writes.push(tokio::spawn(async move {
            let events: Vec<Value> = (0..batch)
                .map(|k| timed_delta(&format!("lat-{n}-{k}")))
                .collect();
            let start = Instant::now();
            let _ = http
                .post(format!("{base}/v1/sessions/{session}/events"))
                .bearer_auth(&token)
                .json(&json!({ "events": events }))
                .send()
                .await;
            start.elapsed()
        }));
    }
    let mut appends = Stats::default();
    for w in writes {
        if let Ok(took) = w.await {
            appends.latencies.push(took);
        }
    }
    let mut lat = Stats::default();
    for s in samplers {
        if let Ok(l) = s.await {
            lat.latencies.extend(l);
        }
    }
    for d in drains {
        d.abort();
    }
    let received = lat.latencies.len();
    println!("\n### Append→frame latency\n");
    println!(
        "| events/s | events per append | subscribers | frames sampled (of sent) | append→frame p50 / p99 / max ms | append request p50 / p99 ms |"
    );
    println!("|---|---|---|---|---|---|");
    let max = lat.percentile(1.0);
    println!(
        "| {RATE} | {batch} | {} | {received} ({}) | {} / {} / {} | {} / {} |",
        args.subscribers.max(SAMPLED),
        total * SAMPLED as u64,
        ms(lat.percentile(0.5)),
        ms(lat.percentile(0.99)),
        ms(max),
        ms(appends.percentile(0.5)),
        ms(appends.percentile(0.99)),
    );
    Ok(())
}

/// Server memory per idle stream.
async fn idle(args: &StreamBench, bench: &Bench, server: &ServerProcess) -> anyhow::Result<()> {
    let session = bench.session().await?;
    let after = bench.sequence(&session).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = server.rss_kib();
    let mut held = Vec::with_capacity(args.idle);
    let frames = Arc::new(AtomicU64::new(0));
    for _ in 0..args.idle {
        match bench.open(&session, after).await {
            Ok(r) => held.push(tokio::spawn(drain(r, frames.clone()))),
            Err(e) => {
                eprintln!(
                    "narad bench stream: stopped at {} connections: {e}",
                    held.len()
                );
                break;
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after_kib = server.rss_kib();
    let n = held.len().max(1) as u64;
    println!("\n### Idle connections\n");
    println!("| connections | server RSS before KiB | after KiB | KiB per connection |");
    println!("|---|---|---|---|");
    println!(
        "| {} | {before} | {after_kib} | {:.1} |",
        held.len(),
        after_kib.saturating_sub(before) as f64 / n as f64
    );
    for h in held {
        h.abort();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(())
}

/// Replay of a long session, on the session stream and the tenant stream.
async fn replay(args: &StreamBench, bench: &Bench) -> anyhow::Result<()> {
    const BATCH: u64 = 500;
    let session = bench.session().await?;
    let first_id = format!("{session}-open");
    let mut n = 0;
    while n < args.replay_events {
        let events: Vec<Value> = (n..(n + BATCH).min(args.replay_events))
            .map(|k| delta(&format!("replay-{k}"), "r", "m"))
            .collect();
        n += events.len() as u64;
        bench.append(&session, events).await?;
    }
    let last = bench.sequence(&session).await?;
    println!("\n### Replay\n");
    println!("| stream | events | seconds | events/s | connections |");
    println!("|---|---|---|---|---|");
    // The session stream, from the start.
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let response = bench.open(&session, 0).await?;
    let reader = tokio::spawn(drain(response, count.clone()));
    while count.load(Ordering::Relaxed) < last {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = start.elapsed();
    reader.abort();
    println!(
        "| session stream | {last} | {:.2} | {:.0} | 1 |",
        took.as_secs_f64(),
        last as f64 / took.as_secs_f64()
    );
    // The tenant stream, narrowed to the session, in blocks.
    let client = narad_client::Client::new(vec![bench.base.clone()], &bench.token);
    let mut follow = client.follow_tenant(Some(&session), Some(&first_id));
    let start = Instant::now();
    let mut got = 0u64;
    while got < last - 2 {
        if let Some(narad_client::Item::Authority(_)) = follow.next().await? {
            got += 1;
        }
    }
    let took = start.elapsed();
    println!(
        "| tenant stream (blocks of {}) | {got} | {:.2} | {:.0} | {} |",
        narad_server::routes::tenant_stream::REPLAY_BLOCK,
        took.as_secs_f64(),
        got as f64 / took.as_secs_f64(),
        follow.connections()
    );
    Ok(())
}

/// Events per append of the fan-out scenario's writers.
const FANOUT_BATCH: u64 = 50;

/// Fan-out frames/s of narad beside a minimal axum + broadcast SSE server.
async fn fanout(args: &StreamBench, bench: &Bench) -> anyhow::Result<()> {
    let seconds = Duration::from_secs(args.seconds);
    // narad: writers append batches to one session; subscribers count.
    let session = bench.session().await?;
    let after = bench.sequence(&session).await?;
    let narad_frames = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for _ in 0..args.fanout_subscribers {
        readers.push(tokio::spawn(drain(
            bench.open(&session, after).await?,
            narad_frames.clone(),
        )));
    }
    let sample = hub_frame_size(&session);
    let start = Instant::now();
    let mut writers = Vec::new();
    for w in 0..4 {
        let (http, base, token, session) = (
            bench.writes.clone(),
            bench.base.clone(),
            bench.token.clone(),
            session.clone(),
        );
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while start.elapsed() < seconds {
                let events: Vec<Value> = (0..FANOUT_BATCH)
                    .map(|k| delta(&format!("fan-{w}-{n}-{k}"), "r", "m"))
                    .collect();
                let _ = http
                    .post(format!("{base}/v1/sessions/{session}/events"))
                    .bearer_auth(&token)
                    .json(&json!({ "events": events }))
                    .send()
                    .await;
                n += 1;
            }
        }));
    }
    for w in writers {
        let _ = w.await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let narad_rate = narad_frames.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    // A stream that ended before the bench closed it was dropped as slow.
    let narad_dropped = readers.iter().filter(|r| r.is_finished()).count();
    for r in readers {
        r.abort();
    }
    // The baseline: the smallest SSE fan-out axum and tokio make.
    let (base_url, sender) = minimal_sse_server().await?;
    let base_frames = Arc::new(AtomicU64::new(0));
    let mut readers = Vec::new();
    for _ in 0..args.fanout_subscribers {
        let r = bench.reads.get(format!("{base_url}/sse")).send().await?;
        readers.push(tokio::spawn(drain(r, base_frames.clone())));
    }
    let frame = Bytes::from(sample);
    let start = Instant::now();
    while start.elapsed() < seconds {
        // Back-pressure: never more queued than the slowest reader holds.
        if sender.len() > 512 {
            tokio::time::sleep(Duration::from_micros(200)).await;
            continue;
        }
        for _ in 0..50 {
            let _ = sender.send(frame.clone());
        }
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base_rate = base_frames.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    let base_dropped = readers.iter().filter(|r| r.is_finished()).count();
    for r in readers {
        r.abort();
    }
    println!("\n### Fan-out\n");
    println!(
        "| subscribers | axum + broadcast frames/s | narad frames/s | ratio | streams dropped as slow (baseline / narad) |"
    );
    println!("|---|---|---|---|---|");
    println!(
        "| {} | {base_rate:.0} | {narad_rate:.0} | {:.2} | {base_dropped} / {narad_dropped} |",
        args.fanout_subscribers,
        narad_rate / base_rate
    );
    Ok(())
}

/// A frame as the hub encodes a delta of `session`, for the baseline to
/// send the same bytes.
fn hub_frame_size(session: &str) -> Vec<u8> {
    let mut e = delta("fan-0-0-0", "r", "m");
    e["sessionId"] = json!(session);
    e["sessionSequence"] = json!(1000);
    e["sequence"] = json!(1000);
    e["timestamp"] = json!("2026-11-30T00:00:00.000Z");
    narad_server::hub::frame("fan-0-0-0", &e).to_vec()
}

/// A minimal SSE server: one broadcast channel, each connection streams
/// what it receives; returns its base URL and the sender.
async fn minimal_sse_server() -> anyhow::Result<(String, tokio::sync::broadcast::Sender<Bytes>)> {
    let (tx, _) = tokio::sync::broadcast::channel::<Bytes>(1024);
    let sender = tx.clone();
    let app = axum::Router::new().route(
        "/sse",
        axum::routing::get(move || {
            let rx = tx.subscribe();
            async move {
                // Ends when the reader lags (as narad drops a slow reader).
                let stream = futures::stream::unfold(rx, |mut rx| async move {
                    rx.recv()
                        .await
                        .ok()
                        .map(|frame| (Ok::<_, std::convert::Infallible>(frame), rx))
                });
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(axum::body::Body::from_stream(stream))
                    .expect("a response")
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((format!("http://{addr}"), sender))
}

/// NOTIFY inside every append transaction beside one NOTIFY per burst
/// after commits (what the hub does), at 32 writers over 32 sessions.
async fn notify_placement(args: &StreamBench) -> anyhow::Result<()> {
    const WRITERS: usize = 32;
    let seconds = Duration::from_secs(args.seconds);
    let tenant = TenantId::new("bench").expect("valid");
    let mut rows = Vec::new();
    for (label, inside) in [
        ("one NOTIFY per burst, after commits (narad)", false),
        ("NOTIFY inside every append transaction", true),
    ] {
        let db = scratch(args).await?;
        let journal = Journal::connect(db.url(), 40)?;
        let journal = if inside {
            journal.with_notify_in_transaction(narad_journal::DEFAULT_APPEND_GROUPS)
        } else {
            journal.with_append_groups(narad_journal::DEFAULT_APPEND_GROUPS)
        };
        open_sessions(&journal, &tenant, WRITERS).await?;
        let notifier = (!inside).then(|| {
            let j = journal.clone();
            tokio::spawn(async move {
                loop {
                    j.committed().await;
                    let _ = j.notify_relays().await;
                }
            })
        });
        let j = journal.clone();
        let t = tenant.clone();
        let mut stats = measure(WRITERS, seconds, 0, move |w, n| {
            let (j, t) = (j.clone(), t.clone());
            async move {
                let sid = SessionId::new(format!("s{w}")).expect("valid");
                j.append(
                    &t,
                    &sid,
                    &[delta(
                        &format!("n-{w}-{n}"),
                        &format!("r{w}"),
                        &format!("m{w}"),
                    )],
                    AppendOptions::default(),
                )
                .await
                .map(|_| 1)
                .unwrap_or(0)
            }
        })
        .await;
        if let Some(n) = notifier {
            n.abort();
        }
        let rate = stats.per_second(stats.events);
        let (p50, p99) = (stats.percentile(0.5), stats.percentile(0.99));
        rows.push((label, rate, p50, p99));
    }
    println!("\n### NOTIFY placement (32 writers, 32 sessions, single-event appends)\n");
    println!("| placement | appends/s | ratio | p50 / p99 ms |");
    println!("|---|---|---|---|");
    let first = rows[0].1;
    for (label, rate, p50, p99) in rows {
        println!(
            "| {label} | {rate:.0} | {:.2} | {} / {} |",
            rate / first,
            ms(p50),
            ms(p99)
        );
    }
    Ok(())
}
