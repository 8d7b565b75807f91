//! The conformance kit, server suite: `narad conformance server --url URL
//! --token-command CMD` checks any narad/v1 server over its HTTP API and
//! SSE alone (no database, no narad internals): journal traces, commands,
//! history, live delivery and resumption (through injected faults with
//! `--faults`), client executors. It prints one line per
//! case with its specification sections and rule, then `N passed, M
//! failed, K skipped`; `--junit FILE` writes the cases as JUnit XML; the
//! exit status is 1 when a case failed. See `conformance/README.md`.

pub mod api;
pub mod client;
mod commands;
mod executors;
mod faults;
mod history;
mod journal;
pub mod reference;
pub mod report;
mod streams;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use narad_protocol::conformance::{self, Trace};
use report::{Case, Report, Verdict};

/// What a case answers: nothing when it holds, why otherwise.
pub type Step<T = ()> = anyhow::Result<T>;

/// Why a case was not run (a server timing longer than the kit waits,
/// say): returned as its error, it is reported as skipped.
#[derive(Debug)]
pub struct Skip(pub String);

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Skip {}

/// Items as a person reads them, comma-separated (`none` when there are
/// none): strings without quotes, JSON values as JSON text.
pub fn list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let items: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

/// Fails with `why()` unless `holds`.
pub fn check(holds: bool, why: impl FnOnce() -> String) -> Step {
    if holds {
        Ok(())
    } else {
        Err(anyhow::anyhow!(why()))
    }
}

/// The traces built into this binary (`conformance/traces` when it was
/// built).
static TRACES: include_dir::Dir<'_> =
    include_dir::include_dir!("$CARGO_MANIFEST_DIR/../../conformance/traces");

/// The built-in traces, by name.
pub fn builtin_traces() -> anyhow::Result<Vec<Trace>> {
    let mut traces = Vec::new();
    for file in TRACES.files() {
        let path = file.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".jsonl"))
        else {
            continue;
        };
        let expect = TRACES
            .get_file(format!("{name}.expect.json"))
            .ok_or_else(|| anyhow::anyhow!("built-in trace {name} has no manifest"))?;
        let text = |f: &include_dir::File<'_>| String::from_utf8_lossy(f.contents()).into_owned();
        traces.push(
            conformance::parse(name, &text(file), &text(expect))
                .map_err(|e| anyhow::anyhow!("built-in trace {name}: {e}"))?,
        );
    }
    traces.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(traces)
}

/// Options of `narad conformance server`.
#[derive(clap::Args)]
pub struct ServerArgs {
    /// The server's base URL, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    url: String,
    /// A shell command that prints a bearer token for the kit's
    /// organisation: `{org}`, `{sub}` and `{roles}` (comma-separated) are
    /// filled in, and also given as NARAD_KIT_ORG and NARAD_KIT_ROLES. For
    /// narad: 'narad token --org {org} --sub {sub} --roles {roles}'.
    #[arg(long)]
    token_command: String,
    /// The organisation the kit works in (default: a new one per run,
    /// `conformance-<random>`, so runs never meet).
    #[arg(long)]
    org: Option<String>,
    #[command(flatten)]
    common: Common,
    /// Run only the cases whose name contains this text.
    #[arg(long)]
    only: Option<String>,
    /// Also follow a session through a proxy that cuts, resets, stalls
    /// and slows the server's answers (http:// URLs).
    #[arg(long)]
    faults: bool,
    /// The seed of the faults' offsets and pauses (default: random,
    /// printed), to replay a run's faults.
    #[arg(long)]
    seed: Option<u64>,
    /// The longest the kit waits for a server's timing (an executor
    /// lease's lapse, a token's expiry, the stream's retention); a case
    /// that would wait longer is skipped and says so.
    #[arg(long, default_value_t = 20)]
    max_wait: u64,
    /// After the run, erase every session the kit created (DELETE
    /// /v1/sessions/{id}, with a token of role admin). Otherwise a run
    /// leaves its sessions behind: about 140, some 12 MiB.
    #[arg(long)]
    cleanup: bool,
    /// How long the server keeps the replay of its tenant stream (GET
    /// /v1/events), in seconds: given, the kit checks `replay-gap` (for
    /// narad: NARAD_OUTBOX_RETENTION_SECONDS).
    #[arg(long)]
    stream_retention: Option<u64>,
}

/// The options both suites take.
#[derive(clap::Args)]
pub struct Common {
    /// A directory of traces to use instead of the built-in ones.
    #[arg(long)]
    pub traces: Option<PathBuf>,
    /// Write the cases as JUnit XML to this file.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Print only failures and the summary.
    #[arg(long, short)]
    pub quiet: bool,
}

impl Common {
    /// The traces: the directory's, or the built-in ones.
    pub fn load(&self) -> anyhow::Result<Vec<Trace>> {
        match &self.traces {
            Some(dir) => conformance::load_dir(dir).map_err(anyhow::Error::msg),
            None => builtin_traces(),
        }
    }

    /// Writes the JUnit file when asked, prints the summary, and answers
    /// the exit status.
    pub fn finish(&self, report: &Report, suite: &str) -> anyhow::Result<ExitCode> {
        if let Some(path) = &self.junit {
            std::fs::write(path, report.junit(suite)?)?;
        }
        println!("{}", report.summary());
        Ok(if report.failed() > 0 {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    }
}

/// A case running.
type CaseFuture<'a> = std::pin::Pin<Box<dyn Future<Output = Step> + 'a>>;

/// A case of the suite beyond the traces: its name, sections and rule.
struct Named {
    name: &'static str,
    spec: &'static str,
    rule: Option<&'static str>,
}

/// `narad conformance server`.
pub async fn server(args: &ServerArgs) -> anyhow::Result<ExitCode> {
    narad_server::auth::install_tls_provider();
    let run_id = {
        let mut b = [0u8; 4];
        getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
        hex::encode(b)
    };
    let org = args
        .org
        .clone()
        .unwrap_or_else(|| format!("conformance-{run_id}"));
    let api = api::Api::new(&args.url, &org, &args.token_command);
    let traces = args.common.load()?;
    let only = |name: &str| args.only.as_deref().is_none_or(|o| name.contains(o));

    // What the server claims.
    let caps = api.get("/v1/capabilities", api::BACKEND).await?;
    let caps = caps.expect(200, "GET /v1/capabilities")?.clone();
    anyhow::ensure!(
        caps["protocolVersion"] == "narad/v1",
        "the server does not speak narad/v1: {caps}"
    );
    let claimed: Vec<String> = caps["activeProfiles"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_str())
                .filter(|p| *p != "narad.core/v1")
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    println!(
        "narad conformance server: {} as organisation {org}; profiles claimed: {}",
        api.base,
        if claimed.is_empty() {
            "core only".to_owned()
        } else {
            claimed.join(", ")
        }
    );

    let mut report = Report::new(args.common.quiet);
    let not_for_api = journal::run(&api, &traces, &claimed, &run_id, &mut report, only).await;

    let prefix = format!("kit-{run_id}");
    let seed = args
        .seed
        .unwrap_or_else(|| u64::from_str_radix(&run_id, 16).unwrap_or(7));
    let max_wait = std::time::Duration::from_secs(args.max_wait);
    let retention = args.stream_retention.map(std::time::Duration::from_secs);
    let mut cases: Vec<(Named, CaseFuture<'_>)> = vec![
        (
            Named {
                name: "commands/slot-reject-enqueue-interrupt",
                spec: "§2.2, §3.1",
                rule: None,
            },
            Box::pin(commands::slot(&api, &prefix)),
        ),
        (
            Named {
                name: "commands/resolve-interrupt-once",
                spec: "§7.7",
                rule: None,
            },
            Box::pin(commands::resolve_once(&api, &prefix)),
        ),
        (
            Named {
                name: "commands/idempotency-key",
                spec: "narad: Idempotency-Key",
                rule: None,
            },
            Box::pin(commands::idempotency_key(&api, &prefix)),
        ),
        (
            Named {
                name: "commands/stop-run",
                spec: "§6.3, §7.4",
                rule: None,
            },
            Box::pin(commands::stop(&api, &prefix)),
        ),
        (
            Named {
                name: "history/cursors",
                spec: "§10.2",
                rule: None,
            },
            Box::pin(history::cursors(&api, &prefix)),
        ),
        (
            Named {
                name: "history/cursor-conflicts",
                spec: "§10.2",
                rule: None,
            },
            Box::pin(history::cursor_conflicts(&api, &prefix)),
        ),
        (
            Named {
                name: "streams/subscribe-before-replay",
                spec: "§10.1, §10.3",
                rule: None,
            },
            Box::pin(streams::subscribe_before_replay(&api, &prefix)),
        ),
        (
            Named {
                name: "streams/resume-and-cursors",
                spec: "§10.1, §10.3",
                rule: None,
            },
            Box::pin(streams::resume_and_cursors(&api, &prefix)),
        ),
        (
            Named {
                name: "streams/tenant-subscribe-before-replay",
                spec: "§10.1, §10.3",
                rule: None,
            },
            Box::pin(streams::tenant_subscribe_before_replay(
                &api, &prefix, retention,
            )),
        ),
        (
            Named {
                name: "streams/tenant-resume-and-cursors",
                spec: "§10.1, §10.3",
                rule: None,
            },
            Box::pin(streams::tenant_resume_and_cursors(&api, &prefix, retention)),
        ),
        (
            Named {
                name: "streams/slow-reader-dropped",
                spec: "§10.1",
                rule: None,
            },
            Box::pin(streams::slow_reader_dropped(&api, &prefix)),
        ),
        (
            Named {
                name: "streams/replay-gap",
                spec: "§10.1, §10.3",
                rule: None,
            },
            Box::pin(streams::replay_gap(&api, &prefix, retention, max_wait)),
        ),
        (
            Named {
                name: "executors/execute-and-finish-once",
                spec: "§11.1, §11.2, §11.3",
                rule: None,
            },
            Box::pin(executors::execute_and_finish_once(&api, &prefix)),
        ),
        (
            Named {
                name: "executors/superseded-lease",
                spec: "§11.1, §11.3",
                rule: None,
            },
            Box::pin(executors::superseded_lease(&api, &prefix)),
        ),
        (
            Named {
                name: "executors/lease-lapse",
                spec: "§11.1, §11.2",
                rule: None,
            },
            Box::pin(executors::lease_lapse(&api, &prefix, max_wait)),
        ),
        (
            Named {
                name: "executors/token-expiry",
                spec: "§11.3",
                rule: None,
            },
            Box::pin(executors::token_expiry(&api, &prefix, max_wait)),
        ),
    ];
    if args.faults {
        println!("faults: seed {seed} (--seed {seed} replays them)");
        cases.push((
            Named {
                name: "faults/resume-through-cut-reset-stalled-slow-connections",
                spec: "§10.1, §10.3",
                rule: None,
            },
            Box::pin(faults::resume_through_faults(&api, &prefix, seed)),
        ));
    }
    for (named, case) in cases {
        if !only(named.name) {
            continue;
        }
        let started = Instant::now();
        let verdict = match case.await {
            Ok(()) => Verdict::Pass,
            Err(why) => match why.downcast_ref::<Skip>() {
                Some(skip) => Verdict::Skip(skip.0.clone()),
                None => Verdict::Fail(format!("{why:#}")),
            },
        };
        report.record(Case {
            name: named.name.to_owned(),
            spec: named.spec.to_owned(),
            rule: named.rule.map(str::to_owned),
            verdict,
            time: started.elapsed(),
        });
    }

    if not_for_api > 0 && !args.common.quiet {
        let (n, are) = match not_for_api {
            1 => ("1 trace".to_owned(), "is"),
            n => (format!("{n} traces"), "are"),
        };
        println!(
            "({n} {are} not about a server's API: delivery traces, traces about what the \
             journal assigns, and client results only an executor gives; conformance/README.md \
             says why)"
        );
    }
    let created = api.created_sessions().len();
    if args.cleanup {
        match api.erase_created().await {
            Ok(said) => println!("{said}"),
            Err(e) => println!("cleanup: {e:#}"),
        }
    } else if created > 0 && !args.common.quiet {
        println!("the kit left {created} sessions in organisation {org} (--cleanup erases them)");
    }
    args.common.finish(&report, "narad conformance server")
}

#[cfg(test)]
mod tests {
    /// Every set of roles the kit asks the token command for is in the
    /// README's paragraph on tokens.
    #[test]
    fn the_readme_names_every_role_the_kit_asks_for() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/README.md"),
        )
        .unwrap();
        let tokens = readme
            .split("**Tokens.**")
            .nth(1)
            .and_then(|t| t.split("\n\n").next())
            .expect("a paragraph on tokens");
        let tokens = tokens.replace('\n', " ");
        for roles in [
            super::api::BACKEND,
            super::api::PERSON,
            super::api::EXECUTOR,
            super::api::ADMIN,
        ] {
            let named = format!("`{}`", roles.join(","));
            assert!(tokens.contains(&named), "{named} in: {tokens}");
        }
    }

    /// The binary carries the traces of the repository, as they are.
    #[test]
    fn the_builtin_traces_are_the_repository_s() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/traces");
        let on_disk = narad_protocol::conformance::load_dir(&dir).unwrap();
        let built_in = super::builtin_traces().unwrap();
        assert!(on_disk.len() > 100);
        assert_eq!(on_disk.len(), built_in.len());
        for (a, b) in on_disk.iter().zip(&built_in) {
            assert_eq!(a.name, b.name);
            assert_eq!(a.lines, b.lines, "{}", a.name);
            assert_eq!(a.manifest.rule, b.manifest.rule, "{}", a.name);
        }
    }
}
