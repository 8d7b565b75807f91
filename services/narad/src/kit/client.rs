//! The conformance kit, client suite: `narad conformance client --
//! COMMAND…` serves every delivery-mode trace as a real SSE stream and
//! runs COMMAND, a client under test, with `NARAD_CONFORMANCE_URL` set.
//! The client reads each trace's stream, reduces what it receives, and
//! reports its reduced state (or the frame it refused, and why); the kit
//! judges the reports against the traces' manifests. The protocol between
//! the two is in `conformance/README.md`.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use narad_protocol::conformance::{self, Expected, Mode, Trace};
use serde_json::{Value, json};

use super::report::{Case, Report, Verdict};

/// Options of `narad conformance client`.
#[derive(clap::Args)]
pub struct ClientArgs {
    #[command(flatten)]
    common: super::Common,
    /// How long the client under test may take, in seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Serve the streams through a proxy that cuts and resets their
    /// connections mid-frame: the client must resume with Last-Event-ID.
    #[arg(long)]
    faults: bool,
    /// The seed of the faults' offsets (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// The client under test and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// The traces served and the reports received.
#[derive(Clone)]
struct Served {
    traces: Arc<HashMap<String, Trace>>,
    reports: Arc<Mutex<HashMap<String, Value>>>,
    /// Where the streams are read: this server, or a fault proxy before it.
    streams: Arc<Mutex<String>>,
}

/// `GET /traces`: what to read and where to report.
async fn list(State(s): State<Served>) -> Json<Value> {
    let mut names: Vec<&String> = s.traces.keys().collect();
    names.sort();
    let streams = s.streams.lock().expect("not poisoned").clone();
    Json(json!({"traces": names.iter().map(|n| json!({
        "name": n,
        "profiles": s.traces[*n].manifest.profiles,
        "stream": format!("{streams}/traces/{n}/stream"),
        "report": format!("/traces/{n}/report"),
    })).collect::<Vec<_>>()}))
}

/// `GET /traces/{name}/stream`: one SSE frame per line, `id` = the
/// object's eventId where it has one; resumed after the first line with
/// the `Last-Event-ID` (delivery is at least once: what follows it may
/// repeat what the client holds).
async fn stream(State(s): State<Served>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    let Some(trace) = s.traces.get(&name) else {
        return (StatusCode::NOT_FOUND, "no such trace").into_response();
    };
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let id_of = |line: &str| {
        serde_json::from_str::<Value>(line)
            .ok()
            .and_then(|v| v["eventId"].as_str().map(str::to_owned))
    };
    // After the first line with that id; an id the trace does not hold:
    // everything again.
    let from = last
        .and_then(|last| {
            trace
                .lines
                .iter()
                .position(|(_, l)| id_of(l).as_deref() == Some(last.as_str()))
        })
        .map_or(0, |i| i + 1);
    let mut body = String::new();
    for (_, line) in &trace.lines[from..] {
        if let Some(id) = id_of(line) {
            body.push_str(&format!("id: {id}\n"));
        }
        body.push_str(&format!("data: {line}\n\n"));
    }
    // One connection per stream, so that each meets its own fault.
    (
        [
            ("content-type", "text/event-stream"),
            ("connection", "close"),
        ],
        body,
    )
        .into_response()
}

/// `POST /traces/{name}/report`: the client's report of a trace.
async fn report(
    State(s): State<Served>,
    Path(name): Path<String>,
    Json(body): Json<Value>,
) -> StatusCode {
    if !s.traces.contains_key(&name) {
        return StatusCode::NOT_FOUND;
    }
    s.reports.lock().expect("not poisoned").insert(name, body);
    StatusCode::NO_CONTENT
}

/// Judges a client's report of `trace`.
fn judge(trace: &Trace, report: Option<&Value>) -> Verdict {
    let m = &trace.manifest;
    let Some(report) = report else {
        return Verdict::Fail("the client reported nothing for this trace".to_owned());
    };
    let rejected = &report["rejected"];
    match (m.outcome, rejected.is_object()) {
        (Expected::Accept, true) => {
            return Verdict::Fail(format!(
                "the client refused {} ({}: {}); every frame should be accepted",
                rejected["object"], rejected["rule"], rejected["message"]
            ));
        }
        (Expected::Reject, false) => {
            return Verdict::Fail(format!(
                "the client accepted every frame; line {} should be refused{}",
                m.reject_at.unwrap_or_default(),
                m.rule
                    .as_ref()
                    .map(|r| format!(" with {r}"))
                    .unwrap_or_default()
            ));
        }
        (Expected::Reject, true) => {
            let at = m.reject_at.unwrap_or_default();
            let expected: Option<Value> = trace
                .lines
                .iter()
                .find(|(n, _)| *n == at)
                .and_then(|(_, l)| serde_json::from_str(l).ok());
            if expected.as_ref() != Some(&rejected["object"]) {
                return Verdict::Fail(format!(
                    "the client refused {}, not line {at} ({})",
                    rejected["object"],
                    expected.unwrap_or(Value::Null)
                ));
            }
            if let Some(rule) = &m.rule
                && rejected["rule"] != rule.as_str()
            {
                return Verdict::Fail(format!(
                    "line {at} was refused with {}, not {rule}",
                    rejected["rule"]
                ));
            }
        }
        (Expected::Accept, false) => {}
    }
    if let Some(expected) = &m.state
        && let Err(why) = conformance::contains(&report["state"], expected, "")
    {
        return Verdict::Fail(format!("the reduced state differs: {why}"));
    }
    Verdict::Pass
}

/// `narad conformance client`.
pub async fn client(args: &ClientArgs) -> anyhow::Result<ExitCode> {
    let traces = args.common.load()?;
    let delivery: HashMap<String, Trace> = traces
        .into_iter()
        .filter(|t| t.manifest.mode == Mode::Delivery)
        .map(|t| (t.name.clone(), t))
        .collect();
    anyhow::ensure!(!delivery.is_empty(), "no delivery-mode traces to serve");
    let served = Served {
        traces: Arc::new(delivery),
        reports: Arc::new(Mutex::new(HashMap::new())),
        streams: Arc::new(Mutex::new(String::new())),
    };
    let app = axum::Router::new()
        .route("/traces", axum::routing::get(list))
        .route("/traces/{name}/stream", axum::routing::get(stream))
        .route("/traces/{name}/report", axum::routing::post(report))
        .with_state(served.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let serving = tokio::spawn(async move { axum::serve(listener, app).await });
    *served.streams.lock().expect("not poisoned") = url.clone();
    let proxy = if args.faults {
        let seed = match args.seed {
            Some(s) => s,
            None => {
                let mut b = [0u8; 8];
                getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
                u64::from_le_bytes(b) >> 1
            }
        };
        println!("faults: seed {seed} (--seed {seed} replays them)");
        let upstream = url.trim_start_matches("http://").to_owned();
        let proxy = super::faults::FaultProxy::start(upstream, super::faults::cuts(seed)).await?;
        *served.streams.lock().expect("not poisoned") = proxy.url.clone();
        Some(proxy)
    } else {
        None
    };
    println!(
        "narad conformance client: {} delivery traces at {url}; running {}",
        served.traces.len(),
        args.command.join(" ")
    );
    let started = Instant::now();
    let mut child = tokio::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("NARAD_CONFORMANCE_URL", &url)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", args.command[0]))?;
    let status = tokio::time::timeout(Duration::from_secs(args.timeout), child.wait()).await;
    serving.abort();
    let mut report = Report::new(args.common.quiet);
    if let Some(p) = &proxy {
        println!("faults met by the streams: {}", p.tally.describe());
    }
    let exited = match status {
        Ok(Ok(s)) if s.success() => Verdict::Pass,
        Ok(Ok(s)) => Verdict::Fail(format!("the client exited with {s}")),
        Ok(Err(e)) => Verdict::Fail(format!("the client could not be awaited: {e}")),
        Err(_) => Verdict::Fail(format!("the client ran past {} s", args.timeout)),
    };
    let reports = served.reports.lock().expect("not poisoned").clone();
    let mut names: Vec<&String> = served.traces.keys().collect();
    names.sort();
    for name in names {
        let trace = &served.traces[name];
        report.record(Case {
            name: format!("client/{name}"),
            spec: trace.manifest.spec.clone(),
            rule: trace.manifest.rule.clone(),
            verdict: judge(trace, reports.get(name)),
            time: Duration::ZERO,
        });
    }
    report.record(Case {
        name: "client/exit".to_owned(),
        spec: "§13".to_owned(),
        rule: None,
        verdict: exited,
        time: started.elapsed(),
    });
    args.common.finish(&report, "narad conformance client")
}
