//! `narad`: the one binary. It wires the crates together; the work lives
//! in them.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod bench_blobs;
mod bench_commands;
mod bench_limits;
mod bench_profile;
mod bench_search;
mod bench_soak;
mod bench_stream;
mod demo_agent;
mod executor;
mod kit;
mod serve;
mod servers;
mod tail;

/// A general-purpose allocator that holds up under many threads doing
/// small JSON allocations: with the system allocator, malloc and free were
/// half of the append path's CPU time (BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use narad_protocol::{Classified, ErrorBody, IgnoreReason, ProfileSet, Reader};
use narad_server::config::Config;

/// narad: the durable journal, rule keeper and live delivery layer for
/// narad/v1 agent sessions.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the configuration narad resolves from flags and NARAD_*
    /// variables (secrets redacted), as JSON.
    Config(Config),
    /// Check wire objects, one JSON object per line, against narad/v1:
    /// each line is accepted, ignored (a profile not negotiated) or
    /// rejected with an error code and the JSON pointer of the problem.
    /// Exits 1 when any line is rejected.
    Check(CheckArgs),
    /// Golden conformance traces (conformance/README.md).
    #[command(subcommand)]
    Conformance(ConformanceCommand),
    /// Serve the HTTP API (migrations are applied first).
    Serve(Config),
    /// Sign a development token (HS256) with NARAD_JWT_HS256_SECRET.
    Token(serve::TokenArgs),
    /// Follow a session (or the tenant) live, one JSON line per frame;
    /// resumes across disconnects and fails over between `--server`s.
    Tail(tail::TailArgs),
    /// Run a demonstration client executor (§11) with two harmless tools,
    /// `echo` and `clock.now`: attaches as `--id`, runs what the server
    /// assigns, and keeps its execution tokens in a durable `--store`.
    /// Ctrl-C stops it.
    Executor(executor::ExecutorArgs),
    /// Run a demonstration agent runtime on the SDK's runtime loop: each
    /// user message starts a run that it answers (an echo, an approval
    /// before anything destructive, the `clock.now` client tool when asked
    /// for the time); it honours stops. Ctrl-C stops it.
    DemoAgent(demo_agent::DemoAgentArgs),
    /// Print the OpenAPI 3.1 document of the HTTP API (what
    /// `GET /openapi.json` serves), without a server or a database.
    Openapi,
    /// Apply the database migrations (idempotent).
    Migrate {
        /// The database to migrate.
        #[arg(long, env = "NARAD_DATABASE_URL")]
        database_url: narad_server::config::Secret,
    },
    /// Benchmarks, as ratios to a baseline measured in the same run
    /// (BENCHMARKS.md).
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Appends per second and latency at 1, 8 and 32 writers, beside a
    /// plain INSERT of the same rows.
    Append(bench::AppendBench),
    /// Live delivery: append throughput with subscribers, append→frame
    /// latency, memory per idle stream, replay rate, fan-out beside a
    /// minimal axum server, and where the NOTIFY goes.
    Stream(bench_stream::StreamBench),
    /// The noisy neighbour: one organisation's append latency while
    /// another floods at ten times its event rate, with and without
    /// per-tenant limits, beside the first alone.
    Limits(bench_limits::LimitsBench),
    /// A large blob up and down through the server, beside cp and cat of
    /// the same bytes, with the server's memory while it streams.
    Blobs(bench_blobs::BlobsBench),
    /// What an Idempotency-Key costs a command: record-user-message with
    /// no key, a fresh key and a replayed one, beside each other.
    Commands(bench_commands::CommandsBench),
    /// Whether the append rate holds on a new database nobody analyzes:
    /// writers and history readers for minutes, the rate per window beside
    /// the first's.
    Soak(bench_soak::SoakBench),
    /// Search (GET /v1/search) over ten organisations of 100,000 people's
    /// messages each: p50 and p95 of each kind of query, beside reading
    /// one session.
    Search(bench_search::SearchBench),
}

#[derive(Subcommand)]
enum ConformanceCommand {
    /// Run every trace of a directory (NAME.jsonl beside NAME.expect.json)
    /// against the rule engine and the reducer. Ends with the line
    /// "N passed, M failed"; exits 1 when any trace fails.
    Check {
        /// The directory of traces, e.g. conformance/traces.
        dir: PathBuf,
        /// Print only failures and the summary.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Check a running narad/v1 server over its HTTP API and SSE alone:
    /// the journal traces appended through it, commands and their
    /// conflicts, history cursors, live delivery and resume. One line per
    /// case, then "N passed, M failed, K skipped"; exits 1 when a case
    /// fails.
    Server(kit::ServerArgs),
    /// Check a client library's reducer: serve every delivery-mode trace
    /// as an SSE stream, run the client under test (after `--`) with
    /// NARAD_CONFORMANCE_URL set, and judge what it reports of each trace.
    /// One line per trace, then "N passed, M failed, K skipped".
    Client(kit::client::ClientArgs),
    /// The reference client of `narad conformance client`, on narad's own
    /// reducer: `narad conformance client -- narad conformance
    /// reference-client`.
    ReferenceClient(kit::reference::ReferenceArgs),
}

#[derive(clap::Args)]
struct CheckArgs {
    /// Profiles the reader negotiates, comma-separated (e.g.
    /// narad.conversation/v1,narad.graph/v1). Core is always included.
    /// Default: every profile.
    #[arg(long, value_delimiter = ',')]
    profiles: Option<Vec<String>>,

    /// Files of JSON lines; standard input when none is given.
    files: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    };
    let result = match cli.command {
        Command::Migrate { database_url } => runtime().block_on(async {
            narad_journal::migrate(database_url.expose())
                .await
                .map_err(|e| anyhow::anyhow!("migrating {database_url}: {e}"))?;
            println!("migrations applied to {database_url}");
            Ok(ExitCode::SUCCESS)
        }),
        Command::Bench(BenchCommand::Append(args)) => runtime()
            .block_on(bench::append(&args))
            .map(|()| ExitCode::SUCCESS),
        Command::Bench(BenchCommand::Stream(args)) => runtime()
            .block_on(bench_stream::stream(&args))
            .map(|()| ExitCode::SUCCESS),
        Command::Bench(BenchCommand::Limits(args)) => runtime()
            .block_on(bench_limits::limits(&args))
            .map(|()| ExitCode::SUCCESS),
        Command::Bench(BenchCommand::Blobs(args)) => runtime()
            .block_on(bench_blobs::blobs(&args))
            .map(|()| ExitCode::SUCCESS),
        Command::Bench(BenchCommand::Commands(args)) => runtime()
            .block_on(bench_commands::commands(&args))
            .map(|()| ExitCode::SUCCESS),
        Command::Bench(BenchCommand::Soak(args)) => runtime()
            .block_on(bench_soak::soak(&args))
            .map(|()| ExitCode::SUCCESS),
        Command::Bench(BenchCommand::Search(args)) => runtime()
            .block_on(bench_search::search(&args))
            .map(|()| ExitCode::SUCCESS),
        Command::Config(config) => print_config(&config),
        Command::Serve(config) => {
            init_logging();
            runtime()
                .block_on(serve::serve(config))
                .map(|()| ExitCode::SUCCESS)
        }
        Command::Token(args) => serve::token(&args).map(|()| ExitCode::SUCCESS),
        Command::Tail(args) => runtime()
            .block_on(tail::tail(args))
            .map(|()| ExitCode::SUCCESS),
        Command::DemoAgent(args) => {
            init_logging();
            runtime()
                .block_on(demo_agent::demo_agent(args))
                .map(|()| ExitCode::SUCCESS)
        }
        Command::Executor(args) => {
            init_logging();
            runtime()
                .block_on(executor::executor(args))
                .map(|()| ExitCode::SUCCESS)
        }
        Command::Check(args) => check(&args),
        Command::Openapi => {
            println!(
                "{}",
                serde_json::to_string_pretty(&narad_server::routes::openapi::document())
                    .expect("the OpenAPI document serialises")
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Conformance(ConformanceCommand::Check { dir, quiet }) => {
            conformance_check(&dir, quiet)
        }
        Command::Conformance(ConformanceCommand::Server(args)) => {
            runtime().block_on(kit::server(&args))
        }
        Command::Conformance(ConformanceCommand::Client(args)) => {
            runtime().block_on(kit::client::client(&args))
        }
        Command::Conformance(ConformanceCommand::ReferenceClient(args)) => runtime()
            .block_on(kit::reference::reference_client(&args))
            .map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("narad: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Logs to standard error: JSON lines when NARAD_LOG_FORMAT=json; the
/// level from RUST_LOG (default info).
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("NARAD_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn print_config(config: &Config) -> anyhow::Result<ExitCode> {
    println!("{}", serde_json::to_string_pretty(config)?);
    Ok(ExitCode::SUCCESS)
}

fn conformance_check(dir: &std::path::Path, quiet: bool) -> anyhow::Result<ExitCode> {
    let traces = narad_protocol::conformance::load_dir(dir).map_err(anyhow::Error::msg)?;
    if traces.is_empty() {
        anyhow::bail!(
            "no traces (NAME.jsonl with NAME.expect.json) in {}",
            dir.display()
        );
    }
    let (mut passed, mut failed) = (0u64, 0u64);
    for trace in &traces {
        match narad_protocol::conformance::check(trace) {
            Ok(()) => {
                passed += 1;
                if !quiet {
                    println!("PASS {}", trace.name);
                }
            }
            Err(why) => {
                failed += 1;
                println!("FAIL {}: {why}", trace.name);
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn check(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let profiles = match &args.profiles {
        None => ProfileSet::all(),
        Some(ids) => {
            let (set, unknown) = ProfileSet::from_ids(ids.iter().map(String::as_str));
            if !unknown.is_empty() {
                anyhow::bail!(
                    "unknown profile id(s) {}; known: {}",
                    unknown.join(", "),
                    ProfileSet::all()
                        .iter()
                        .map(|p| p.id())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            set
        }
    };
    let reader = Reader::new(profiles);
    let inputs: Vec<(String, Box<dyn Read>)> = if args.files.is_empty() {
        vec![("-".to_owned(), Box::new(std::io::stdin()))]
    } else {
        args.files
            .iter()
            .map(|f| -> anyhow::Result<(String, Box<dyn Read>)> {
                let file = std::fs::File::open(f)
                    .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", f.display()))?;
                Ok((f.display().to_string(), Box::new(file)))
            })
            .collect::<anyhow::Result<_>>()?
    };
    let (mut accepted, mut ignored, mut rejected) = (0u64, 0u64, 0u64);
    for (name, input) in inputs {
        for (i, line) in BufReader::new(input).lines().enumerate() {
            let line = line.map_err(|e| anyhow::anyhow!("cannot read {name}: {e}"))?;
            if line.trim().is_empty() {
                continue;
            }
            let at = format!("{name}:{}", i + 1);
            match reader.classify_str(&line) {
                Ok(Classified::Accepted(obj)) => {
                    accepted += 1;
                    println!("{at}: accepted {}", obj.wire_type().name());
                }
                Ok(Classified::Ignored { type_name, reason }) => {
                    ignored += 1;
                    let why = match reason {
                        IgnoreReason::NotNegotiated(p) => format!("profile {p} not negotiated"),
                        IgnoreReason::Unclaimed => {
                            "unknown type outside every negotiated profile".to_owned()
                        }
                    };
                    println!("{at}: ignored {type_name} ({why})");
                }
                Err(e) => {
                    rejected += 1;
                    let body = ErrorBody::from(&e);
                    println!("{at}: rejected {} {}", body.code, e);
                }
            }
        }
    }
    println!("{accepted} accepted, {ignored} ignored, {rejected} rejected");
    Ok(if rejected > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
