//! `narad bench search`: `GET /v1/search` over a `narad serve` whose
//! database holds ten organisations of `--messages` people's messages each
//! (written straight into the journal's tables, words drawn from a
//! skewed vocabulary so that some are in half the messages and most in
//! few), one client at a time; each kind of query reported with its p50
//! and p95, beside reading one session (`GET /v1/sessions/{id}`) in the
//! same run.

use std::time::{Duration, Instant};

use crate::bench::Stats;
use crate::bench_stream::{ServerProcess, bench_token, scratch_on};

/// Options of `narad bench search`.
#[derive(clap::Args)]
pub struct SearchBench {
    /// A Postgres server the bench may create scratch databases on
    /// (default: as the tests find one).
    #[arg(long, env = "NARAD_BENCH_SERVER_URL")]
    server_url: Option<String>,
    /// People's messages per organisation (ten organisations).
    #[arg(long, default_value_t = 100_000)]
    messages: u64,
    /// Messages per session.
    #[arg(long, default_value_t = 10)]
    per_session: u64,
    /// Searches of each kind.
    #[arg(long, default_value_t = 200)]
    searches: usize,
}

/// The organisations.
const ORGS: u64 = 10;

/// Words of the vocabulary; the first are everyday English (stop words
/// among them, which the index leaves out), the rest made up.
const WORDS: u64 = 5_000;

const ENGLISH: &[&str] = &[
    "the",
    "order",
    "please",
    "refund",
    "account",
    "payment",
    "invoice",
    "delivery",
    "error",
    "customer",
    "update",
    "address",
    "password",
    "subscription",
    "shipping",
    "price",
    "report",
    "deploy",
    "cluster",
    "ticket",
    "billing",
    "contract",
    "renewal",
    "discount",
    "warranty",
    "schedule",
    "meeting",
    "budget",
    "forecast",
    "migration",
    "database",
    "latency",
    "outage",
    "incident",
    "approval",
    "review",
    "release",
    "feature",
    "request",
    "question",
];

/// A word of rank `i` (0 is the most frequent).
fn word(i: u64) -> String {
    ENGLISH
        .get(i as usize)
        .map(|w| (*w).to_owned())
        .unwrap_or_else(|| format!("w{i}"))
}

/// Fills the scratch database: per organisation, sessions of
/// `per_session` messages of 12 words each (word rank `⌊5000·u³⌋`, u
/// uniform: rank 0 is in about half the messages, a rank above 2,000 in
/// about one in 200), 50 people, 1% of sessions waiting on an approval.
async fn fill(db_url: &str, args: &SearchBench) -> anyhow::Result<Duration> {
    let (client, connection) = tokio_postgres::connect(db_url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    let started = Instant::now();
    // A word of rank r, in SQL (a made-up word past the English ones).
    let english = ENGLISH
        .iter()
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(",");
    let words = |n: u32, outer: &str| {
        format!(
            "(select string_agg(coalesce((array[{english}])[r + 1], 'w' || r), ' ') \
               from (select floor({WORDS} * random() ^ 3)::int as r \
                     from generate_series(1, {n}) k where k + 0 * {outer} > 0) ranks)"
        )
    };
    let sessions = args.messages / args.per_session;
    for org in 0..ORGS {
        client
            .batch_execute(&format!(
                "insert into sessions (tenant_id, session_id, title, created_at, session_sequence) \
                 select 'org-{org}', 's-' || s, \
                   {title}, \
                   now() - ({sessions} - s) * interval '1 minute', {per} \
                 from generate_series(0, {last}) s; \
                 insert into events (tenant_id, session_id, session_sequence, event_id, type, body, \
                   proposal_sha256, recorded_at, txid) \
                 select 'org-{org}', 's-' || s, q, 'e-{org}-' || s || '-' || q, 'message.user.recorded', \
                   jsonb_build_object('protocolVersion', 'narad/v1', 'type', 'message.user.recorded', \
                     'eventId', 'e-{org}-' || s || '-' || q, 'sessionId', 's-' || s, \
                     'sessionSequence', q, 'messageId', 'm-' || s || '-' || q, \
                     'messageScope', 'session', 'content', m.text, \
                     'actor', jsonb_build_object('kind', 'user', 'sub', 'user-' || (s % 50))), \
                   '\\x00', now() - ({sessions} - s) * interval '1 minute' + q * interval '1 second', \
                   pg_current_xact_id() \
                 from generate_series(0, {last}) s, generate_series(1, {per}) q, \
                   lateral (select {text} as text) m; \
                 insert into interrupt_deadlines (tenant_id, session_id, interrupt_id, requested_at) \
                 select 'org-{org}', 's-' || s, 'i-' || s, now() from generate_series(0, {last}, 100) s;",
                per = args.per_session,
                last = sessions - 1,
                title = words(3, "s"),
                text = words(12, "(q + s)"),
            ))
            .await?;
        eprintln!(
            "organisation {org}: {} messages in {} sessions ({:.0} s so far)",
            args.messages,
            sessions,
            started.elapsed().as_secs_f64()
        );
    }
    client.batch_execute("analyze").await?;
    Ok(started.elapsed())
}

/// `narad bench search`.
pub async fn search(args: &SearchBench) -> anyhow::Result<()> {
    narad_server::auth::install_tls_provider();
    anyhow::ensure!(
        args.per_session >= 1 && args.messages >= args.per_session,
        "--messages must hold at least one session of --per-session"
    );
    let db = scratch_on(args.server_url.as_deref()).await?;
    let filled = fill(db.url(), args).await?;
    let server = ServerProcess::start_with(db.url(), &[])?;
    let token = bench_token("org-0")?;
    let http = reqwest::Client::new();
    let sessions = args.messages / args.per_session;
    println!(
        "{} organisations × {} people's messages ({} sessions each), filled in {:.0} s; \
         searches of org-0, one client, {} of each kind",
        ORGS,
        args.messages,
        sessions,
        filled.as_secs_f64(),
        args.searches
    );
    // Each kind: a query per search (`n` varies the word).
    type Kind = (&'static str, Box<dyn Fn(u64) -> String>);
    let kinds: Vec<Kind> = vec![
        (
            "baseline: GET /v1/sessions/{id}",
            Box::new(move |n| format!("/v1/sessions/s-{}", n * 7919 % sessions)),
        ),
        (
            "a rare word (rank 2,000–4,999)",
            Box::new(|n| format!("/v1/search?q={}", word(2_000 + n * 37 % 3_000))),
        ),
        (
            "a middling word (rank 100–499)",
            Box::new(|n| format!("/v1/search?q={}", word(100 + n * 13 % 400))),
        ),
        (
            "two words, both (ranks 50–199)",
            Box::new(|n| {
                format!(
                    "/v1/search?q={}+{}",
                    word(50 + n * 7 % 150),
                    word(50 + n * 11 % 150)
                )
            }),
        ),
        (
            "a phrase of two frequent words",
            Box::new(|n| {
                format!(
                    "/v1/search?q=%22{}+{}%22",
                    word(1 + n % 10),
                    word(2 + n % 9)
                )
            }),
        ),
        (
            "a middling word, one person, last 3 days",
            Box::new(|n| {
                format!(
                    "/v1/search?q={}&actor=user-{}&since={}",
                    word(100 + n * 13 % 400),
                    n % 50,
                    (chrono::Utc::now() - chrono::Duration::days(3)).format("%Y-%m-%dT%H:%M:%SZ")
                )
            }),
        ),
        (
            "filters alone: waiting on an approval",
            Box::new(|_| "/v1/search?pendingApprovals=true".to_owned()),
        ),
        (
            "one person's messages (actor alone)",
            Box::new(|n| format!("/v1/search?actor=user-{}", n % 50)),
        ),
        (
            "a word in a tenth of the messages (rank 5–20)",
            Box::new(|n| format!("/v1/search?q={}", word(5 + n % 15))),
        ),
        (
            "the most frequent word (in about half the messages)",
            Box::new(|_| format!("/v1/search?q={}", word(1))),
        ),
    ];
    println!("| search | p50 | p95 | max | results on the page (mean) |");
    println!("|---|---|---|---|---|");
    let mut every = Stats::default();
    for (i, (name, path)) in kinds.iter().enumerate() {
        let mut stats = Stats::default();
        let mut found = 0usize;
        for n in 0..args.searches as u64 {
            let url = format!("{}{}", server.base, path(n));
            let t = Instant::now();
            let answer = http.get(&url).bearer_auth(&token).send().await?;
            let status = answer.status();
            let body: serde_json::Value = answer.json().await?;
            stats.latencies.push(t.elapsed());
            anyhow::ensure!(status.is_success(), "{url}: {status} {body}");
            found += body["results"].as_array().map_or(1, Vec::len);
        }
        let (p50, p95) = (stats.percentile(0.5), stats.percentile(0.95));
        let max = stats.latencies.last().copied().unwrap_or_default();
        println!(
            "| {name} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} |",
            p50.as_secs_f64() * 1e3,
            p95.as_secs_f64() * 1e3,
            max.as_secs_f64() * 1e3,
            found as f64 / args.searches as f64
        );
        if i > 0 {
            every.add(stats);
        }
    }
    let (p50, p95) = (every.percentile(0.5), every.percentile(0.95));
    println!(
        "| every search above (not the baseline) | {:.1} ms | {:.1} ms | {:.1} ms | |",
        p50.as_secs_f64() * 1e3,
        p95.as_secs_f64() * 1e3,
        every
            .latencies
            .last()
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3,
    );
    drop(server);
    Ok(())
}
