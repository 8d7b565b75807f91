//! The `narad` binary, driven as a user would.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

fn narad(args: &[&str], stdin: &str, env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_narad"));
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("NARAD_")) {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("narad runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn version_names_the_binary() {
    let (code, out, _) = narad(&["--version"], "", &[]);
    assert_eq!(code, 0);
    assert!(out.starts_with("narad "), "{out}");
}

#[test]
fn config_prints_defaults_and_env_overrides_with_secrets_redacted() {
    let (code, out, err) = narad(
        &["config"],
        "",
        &[
            ("NARAD_LISTEN", "0.0.0.0:9000"),
            ("NARAD_DATABASE_URL", "postgres://narad:hunter2@db/narad"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let config: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(config["listen"], "0.0.0.0:9000");
    assert_eq!(config["databaseUrl"], "postgres://narad:***@db/narad");
    assert_eq!(config["maxBodyBytes"], 1_048_576);
    assert!(!out.contains("hunter2"));
}

#[test]
fn config_refuses_a_bad_listen_address_with_a_clear_message() {
    let (code, _, err) = narad(&["config", "--listen", "nowhere"], "", &[]);
    assert_ne!(code, 0);
    assert!(err.contains("--listen"), "{err}");
}

#[test]
fn serve_refuses_a_wildcard_cors_origin_before_anything_else() {
    let (code, _, err) = narad(
        &["serve"],
        "",
        &[
            ("NARAD_CORS_ORIGINS", "https://ok.example,*"),
            ("NARAD_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none"),
        ],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("NARAD_CORS_ORIGINS") && err.contains("wildcard"),
        "{err}"
    );
}

/// A pool too small for the background tasks and requests is refused at
/// start, with the number needed (it once started and hung).
#[test]
fn serve_refuses_a_pool_too_small_to_run() {
    let (code, _, err) = narad(
        &["serve"],
        "",
        &[
            ("NARAD_DATABASE_POOL", "2"),
            ("NARAD_DATABASE_URL", "postgres://nobody@127.0.0.1:1/none"),
        ],
    );
    assert_ne!(code, 0);
    let needed =
        narad_journal::BACKGROUND_CONNECTIONS + narad_server::config::MIN_REQUEST_CONNECTIONS;
    assert!(
        err.contains("NARAD_DATABASE_POOL is 2") && err.contains(&format!("at least {needed}")),
        "{err}"
    );
}

#[test]
fn check_classifies_each_line_and_fails_on_a_rejection() {
    let lines = [
        r#"{"protocolVersion":"narad/v1","type":"run.started","eventId":"e1","timestamp":"2026-08-05T04:00:00Z","sessionId":"s","sessionSequence":1,"rootRunId":"r","runId":"r","sequence":1}"#,
        r#"{"protocolVersion":"narad/v1","type":"workflow.started","eventId":"e2","timestamp":"2026-08-05T04:00:00Z","sessionId":"s","sessionSequence":2,"workflowId":"w","workflowSequence":1}"#,
        "",
        r#"{"protocolVersion":"narad/v1","type":"run.paused","eventId":"e3","timestamp":"2026-08-05T04:00:00Z","sessionId":"s","sessionSequence":3,"rootRunId":"r","runId":"r","sequence":2,"waitId":"w","reason":"x"}"#,
        r#"{"protocolVersion":"narad/v2","type":"run.started"}"#,
    ]
    .join("\n");
    let (code, out, _) = narad(
        &["check", "--profiles", "narad.conversation/v1"],
        &lines,
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("-:1: accepted run.started"), "{out}");
    assert!(
        out.contains("-:2: ignored workflow.started (profile narad.workflow/v1 not negotiated)"),
        "{out}"
    );
    assert!(out.contains("-:4: rejected NRD-0003 /resumeMode"), "{out}");
    assert!(out.contains("-:5: rejected NRD-0004"), "{out}");
    assert!(
        out.trim_end()
            .ends_with("1 accepted, 1 ignored, 2 rejected"),
        "{out}"
    );
}

#[test]
fn check_accepts_every_schema_example() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schema");
    let mut lines = Vec::new();
    for dir in ["events", "watch", "hydrate", "control"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let schema: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap())
                    .unwrap();
            for ex in schema["examples"].as_array().unwrap() {
                lines.push(ex.to_string());
            }
        }
    }
    let (code, out, _) = narad(&["check"], &lines.join("\n"), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.trim_end()
            .ends_with(&format!("{} accepted, 0 ignored, 0 rejected", lines.len()))
    );
}

#[test]
fn openapi_prints_the_document_the_server_serves() {
    let (code, out, err) = narad(&["openapi"], "", &[]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("the document is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/v1/commands/start-run"]["post"].is_object());
    assert!(doc["components"]["schemas"]["commands.start-run"].is_object());
}

#[test]
fn check_names_unknown_profiles() {
    let (code, _, err) = narad(&["check", "--profiles", "narad.teleport/v1"], "", &[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("unknown profile id(s) narad.teleport/v1"),
        "{err}"
    );
}

#[test]
fn the_readme_run_command_accepts_the_example_file() {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/examples/first-run.jsonl");
    let (code, out, err) = narad(&["check", example.to_str().unwrap()], "", &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.trim_end()
            .ends_with("9 accepted, 0 ignored, 0 rejected"),
        "{out}"
    );
}

#[test]
fn conformance_check_passes_the_shipped_traces() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/traces");
    let (code, out, err) = narad(&["conformance", "check", dir.to_str().unwrap()], "", &[]);
    assert_eq!(code, 0, "{out}{err}");
    let last = out.lines().last().unwrap();
    assert!(last.ends_with(" passed, 0 failed"), "{last}");
    assert!(
        out.contains("PASS run-terminal-with-open-tool-call"),
        "{out}"
    );
}

#[test]
fn conformance_check_reports_a_wrong_expectation_and_exits_1() {
    let dir = std::env::temp_dir().join(format!("narad-conformance-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let started = r#"{"protocolVersion":"narad/v1","type":"run.started","eventId":"e1","timestamp":"2026-08-05T04:00:00Z","sessionId":"s","sessionSequence":1,"rootRunId":"r","runId":"r","sequence":1}"#;
    let tool = r#"{"protocolVersion":"narad/v1","type":"tool.call.started","eventId":"e2","timestamp":"2026-08-05T04:00:01Z","sessionId":"s","sessionSequence":2,"rootRunId":"r","runId":"r","sequence":2,"toolCallId":"t","toolName":"x","executor":"backend","args":{}}"#;
    let finished = r#"{"protocolVersion":"narad/v1","type":"run.finished","eventId":"e3","timestamp":"2026-08-05T04:00:02Z","sessionId":"s","sessionSequence":3,"rootRunId":"r","runId":"r","sequence":3}"#;
    std::fs::write(
        dir.join("claims-accept.jsonl"),
        format!("{started}\n{tool}\n{finished}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("claims-accept.expect.json"),
        r#"{"spec":"§6.2","description":"wrongly expects acceptance","profiles":[],"mode":"journal","outcome":"accept"}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("right-rule.jsonl"),
        format!("{started}\n{tool}\n{finished}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("right-rule.expect.json"),
        r#"{"spec":"§6.2","description":"open work","profiles":[],"mode":"journal","outcome":"reject","rejectAt":3,"rule":"run.terminal.open-work"}"#,
    )
    .unwrap();
    let (code, out, _) = narad(
        &["conformance", "check", "--quiet", dir.to_str().unwrap()],
        "",
        &[],
    );
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL claims-accept: line 3 was rejected: [run.terminal.open-work]"),
        "{out}"
    );
    assert!(!out.contains("PASS"), "--quiet prints failures only: {out}");
    assert_eq!(out.lines().last(), Some("1 passed, 1 failed"));
}

#[tokio::test]
async fn migrate_applies_the_migrations_and_applying_them_again_changes_nothing() {
    let db = narad_testkit::TestDatabase::empty().await;
    for _ in 0..2 {
        let (code, out, err) = narad(&["migrate", "--database-url", db.url()], "", &[]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.starts_with("migrations applied to "), "{out}");
    }
    let (code, _, err) = narad(&["migrate"], "", &[]);
    assert_ne!(code, 0);
    assert!(err.contains("--database-url"), "{err}");
}

// ---------------------------------------------------------------- serve

/// A `narad serve` child process, stopped (SIGTERM) when dropped.
struct Served {
    child: std::process::Child,
    base: String,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    stopped: bool,
}

impl Drop for Served {
    /// A test that failed midway still stops its server (SIGTERM, so that
    /// an embedded database stops too).
    fn drop(&mut self) {
        if !self.stopped {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let _ = self.child.wait();
        }
    }
}

impl Served {
    /// Starts `narad serve` on a free port with `env`, and waits for its
    /// "serving" line.
    fn start(env: &[(&str, &str)]) -> Result<Served, String> {
        use std::io::{BufRead, BufReader};
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_narad"));
        cmd.arg("serve")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("NARAD_")) {
            cmd.env_remove(k);
        }
        cmd.env("NARAD_LISTEN", "127.0.0.1:0");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("narad runs");
        // Its log, read as it comes (a pipe nobody reads would block it).
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let err = child.stderr.take().unwrap();
        let copy = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                copy.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        let stdout = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().unwrap();
        let copy = stdout.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("narad is serving on ") {
                    let _ = tx.send(addr.to_owned());
                }
                copy.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        match rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(base) => Ok(Served {
                child,
                base,
                stdout,
                stderr,
                stopped: false,
            }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                std::thread::sleep(std::time::Duration::from_millis(100));
                Err(format!(
                    "narad serve did not start: {}{}",
                    stdout.lock().unwrap(),
                    stderr.lock().unwrap()
                ))
            }
        }
    }

    /// Sends SIGTERM and waits; returns everything it printed.
    fn stop(mut self) -> String {
        self.stopped = true;
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let status = self.child.wait().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            status.success(),
            "narad serve exits cleanly on SIGTERM: {status:?}"
        );
        self.stdout.lock().unwrap().clone()
    }
}

const DEV_SECRET: &str = "a-test-secret-of-at-least-32-bytes-for-hs256";

impl Served {
    /// `narad serve` on `db`, with tokens signed by [`DEV_SECRET`].
    fn on(db: &narad_testkit::TestDatabase) -> Served {
        Served::start(&[
            ("NARAD_DATABASE_URL", db.url()),
            ("NARAD_JWT_HS256_SECRET", DEV_SECRET),
        ])
        .expect("serves")
    }
}

/// A development token of org `dev` (`narad token`, signed by [`DEV_SECRET`]).
fn dev_token(sub: &str, roles: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["token", "--org", "dev", "--sub", sub, "--roles", roles])
        .env("NARAD_JWT_HS256_SECRET", DEV_SECRET)
        .output()
        .unwrap();
    assert!(out.status.success(), "narad token: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[tokio::test]
async fn the_readme_quickstart_runs_as_written() {
    let db = narad_testkit::TestDatabase::new(&narad_journal::MIGRATOR).await;
    let served = Served::on(&db);
    let stdout = run_readme_block("quickstart", &served);
    // The last answer is the history: the run and the streamed answer, in order.
    let history: serde_json::Value =
        serde_json::from_str(stdout.lines().rfind(|l| !l.trim().is_empty()).unwrap())
            .expect("the last line is the history page");
    let types: Vec<&str> = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "run.started",
            "message.text.started",
            "message.text.delta",
            "message.text.completed",
            "run.finished"
        ]
    );
    let printed = served.stop();
    assert!(printed.contains("narad stopped"), "{printed}");
}

#[tokio::test]
async fn the_readme_runtime_loop_runs_as_written() {
    let db = narad_testkit::TestDatabase::new(&narad_journal::MIGRATOR).await;
    let served = Served::on(&db);
    let stdout = run_readme_block("runtime-http", &served);
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    let json = |l: &str| serde_json::from_str::<serde_json::Value>(l).expect("a JSON answer");
    let claim = lines
        .iter()
        .map(|l| json(l))
        .find(|v| v.get("lease").is_some())
        .expect("the claim is printed");
    assert_eq!(
        (claim["runId"].as_str(), claim["queue"].as_str()),
        (Some("run-q"), Some("agents"))
    );
    assert_eq!(json(lines[lines.len() - 1])["released"], "ended");
    let printed = served.stop();
    assert!(printed.contains("narad stopped"), "{printed}");
}

#[tokio::test]
async fn the_readme_tour_runs_as_written_with_the_demo_agent_and_an_executor() {
    let db = narad_testkit::TestDatabase::new(&narad_journal::MIGRATOR).await;
    let served = Served::on(&db);
    let token = dev_token;
    let workdir = std::env::temp_dir().join(format!("narad-tour-{}", std::process::id()));
    std::fs::create_dir_all(&workdir).unwrap();
    // The programs of terminals 2 and 3, as the tour starts them.
    let spawn = |args: &[&str], token: String| {
        Command::new(env!("CARGO_BIN_EXE_narad"))
            .args(args)
            .args(["--server", &served.base])
            .env("NARAD_TOKEN", token)
            .current_dir(&workdir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut agent = spawn(
        &["demo-agent", "--executor", "desk-1"],
        token("agent", "reader,writer,backend"),
    );
    // As a person would, talk once the agent listens.
    let mut lines = BufReader::new(agent.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.contains("listening for user messages"))),
        "the demo agent never listened"
    );
    let mut executor = spawn(&["executor", "--id", "desk-1"], token("desk", "executor"));
    let stdout = run_readme_block("tour", &served);
    let _ = agent.kill();
    let _ = executor.kill();
    let _ = agent.wait();
    let _ = executor.wait();
    let _ = std::fs::remove_dir_all(&workdir);
    let types: Vec<&str> = stdout
        .lines()
        .rfind(|l| !l.trim().is_empty())
        .unwrap()
        .split_whitespace()
        .collect();
    let count = |t: &str| types.iter().filter(|x| **x == t).count();
    assert_eq!(count("run.started"), 5, "{types:?}");
    assert_eq!(count("run.finished"), 4, "{types:?}");
    assert_eq!(count("artifact.added"), 1, "{types:?}");
    assert_eq!(count("artifact.ready"), 1, "{types:?}");
    assert_eq!(count("run.cancelled"), 1, "{types:?}");
    assert_eq!(count("interrupt.requested"), 1, "{types:?}");
    assert_eq!(count("interrupt.resolved"), 1, "{types:?}");
    assert_eq!(count("tool.call.finished"), 1, "{types:?}");
    assert_eq!(count("reasoning.completed"), 5, "{types:?}");
    // The report's bytes came back by its reference.
    assert!(stdout.contains("# Session report"), "{stdout}");
    // The executor's answer reached the agent's reply.
    let history = std::process::Command::new("curl")
        .args([
            "-s",
            &format!("{}/v1/sessions/tour/events?limit=1000", served.base),
        ])
        .arg("-H")
        .arg(format!("Authorization: Bearer {}", token("me", "reader")))
        .output()
        .unwrap();
    let history: serde_json::Value = serde_json::from_slice(&history.stdout).unwrap();
    let finished = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "tool.call.finished")
        .unwrap();
    assert_eq!(finished["outcome"], "success", "{finished}");
    assert!(finished["response"]["now"].is_string(), "{finished}");
    let printed = served.stop();
    assert!(printed.contains("narad stopped"), "{printed}");
}

/// Runs the README's `sh` block after `<!-- {marker} -->` with bash
/// against `served` and this build's binary; its standard output.
fn run_readme_block(marker: &str, served: &Served) -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let block = readme
        .split(&format!("<!-- {marker} -->\n```sh\n"))
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .unwrap_or_else(|| panic!("README has the {marker} block"));
    // The block as written, with the server's address and this build's binary.
    let script = block
        .replace("http://127.0.0.1:8080", &served.base)
        .replace("./target/release/narad", env!("CARGO_BIN_EXE_narad"));
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .env("NARAD_JWT_HS256_SECRET", DEV_SECRET)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the {marker} block failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test]
async fn serve_without_a_database_url_runs_the_embedded_default() {
    let home = std::env::temp_dir().join(format!("narad-home-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let home_str = home.display().to_string();
    if narad_localpg::bindir().is_none() {
        // No Postgres binaries: the way out is spelled out.
        let (code, _, err) = narad(&["serve"], "", &[("NARAD_HOME", &home_str)]);
        assert_ne!(code, 0);
        assert!(
            err.contains("install PostgreSQL")
                && err.contains("NARAD_DATABASE_URL")
                && err.contains("docker compose up"),
            "{err}"
        );
        return;
    }
    let served = Served::start(&[("NARAD_HOME", &home_str)]).expect("serves");
    let printed = served.stdout.lock().unwrap().clone();
    let token = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix("export NARAD_TOKEN="))
        .expect("a ready token is printed")
        .to_owned();
    assert!(printed.contains("curl -s -X POST"), "{printed}");
    // The printed token works, and `narad token` mints from the same secret.
    let (code, minted, err) = narad(
        &["token", "--org", "dev", "--sub", "me", "--roles", "reader"],
        "",
        &[("NARAD_HOME", &home_str)],
    );
    assert_eq!(code, 0, "{err}");
    let base = served.base.clone();
    let created = tokio::task::spawn_blocking(move || {
        let post = Command::new("curl")
            .args([
                "-s",
                "--fail-with-body",
                "-X",
                "POST",
                &format!("{base}/v1/sessions"),
            ])
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .args(["-d", r#"{"sessionId": "kept"}"#])
            .output()
            .unwrap();
        let get = Command::new("curl")
            .args([
                "-s",
                "--fail-with-body",
                &format!("{base}/v1/sessions/kept"),
            ])
            .args(["-H", &format!("Authorization: Bearer {}", minted.trim())])
            .output()
            .unwrap();
        (
            post.status.success(),
            String::from_utf8_lossy(&get.stdout).into_owned(),
        )
    })
    .await
    .unwrap();
    assert!(created.0, "the session was created");
    assert!(
        created.1.contains("\"sessionId\":\"kept\""),
        "{}",
        created.1
    );
    let printed = served.stop();
    assert!(
        printed.contains(&format!(
            "the embedded database in {home_str}/postgres stopped"
        )),
        "{printed}"
    );

    // Kept across restarts.
    let again = Served::start(&[("NARAD_HOME", &home_str)]).expect("serves again");
    let printed = again.stdout.lock().unwrap().clone();
    let token = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix("export NARAD_TOKEN="))
        .unwrap()
        .to_owned();
    let base = again.base.clone();
    let read = tokio::task::spawn_blocking(move || {
        Command::new("curl")
            .args([
                "-s",
                "--fail-with-body",
                &format!("{base}/v1/sessions/kept"),
            ])
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(read.status.success(), "the session survived the restart");
    again.stop();
    let _ = std::fs::remove_dir_all(&home);
}

/// Two `narad serve` processes on one fresh database, a token of tenant
/// acme with every role, and an HTTP client.
async fn two_processes() -> (
    narad_testkit::TestDatabase,
    Served,
    Served,
    String,
    reqwest::Client,
) {
    let db = narad_testkit::TestDatabase::new(&narad_journal::MIGRATOR).await;
    let env = [
        ("NARAD_DATABASE_URL", db.url()),
        ("NARAD_JWT_HS256_SECRET", DEV_SECRET),
    ];
    let a = Served::start(&env).expect("a serves");
    let b = Served::start(&env).expect("b serves");
    let token = acme_token();
    (db, a, b, token, reqwest::Client::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_resumes_on_another_server_after_kill_9_and_misses_nothing() {
    use narad_tests::SseStream;
    use serde_json::{Value, json};

    let (_db, a, b, token, http) = two_processes().await;
    let post = {
        let (http, token) = (http.clone(), token.clone());
        move |base: String, path: &'static str, body: Value| {
            let (http, token) = (http.clone(), token.clone());
            async move {
                let res = http
                    .post(format!("{base}{path}"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert!(
                    res.status().is_success(),
                    "{path}: {}",
                    res.text().await.unwrap()
                );
            }
        }
    };
    post(a.base.clone(), "/v1/sessions", json!({"sessionId": "s1"})).await;
    post(
        a.base.clone(),
        "/v1/commands/start-run",
        json!({"sessionId": "s1", "runId": "r1"}),
    )
    .await;
    post(
        a.base.clone(),
        "/v1/sessions/s1/events",
        json!({"events": [{"protocolVersion": "narad/v1", "type": "message.text.started",
            "eventId": "m1-start", "rootRunId": "r1", "runId": "r1", "messageId": "m1",
            "role": "assistant", "messageScope": "run"}]}),
    )
    .await;

    // A client reads from A while a runtime appends through B.
    let mut on_a = SseStream::open(
        &http,
        &format!("{}/v1/sessions/s1/stream?afterSessionSequence=0", a.base),
        &token,
        &[],
    )
    .await;
    assert_eq!(
        on_a.next().await.unwrap().event.as_deref(),
        Some("capabilities")
    );
    const BATCHES: usize = 60;
    let writer = {
        let base = b.base.clone();
        let post = post.clone();
        tokio::spawn(async move {
            for n in 0..BATCHES {
                post(
                    base.clone(),
                    "/v1/sessions/s1/events",
                    json!({"events": [{"protocolVersion": "narad/v1", "type": "message.text.delta",
                        "eventId": format!("d{n}"), "rootRunId": "r1", "runId": "r1",
                        "messageId": "m1", "delta": format!("{n} ")}]}),
                )
                .await;
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
    };
    let mut received: Vec<Value> = Vec::new();
    // Authority only: watch events carry a revision, not a sequence.
    let authority = |f: &narad_tests::Frame| f.data.get("sessionSequence").is_some();
    while received.len() < 12 {
        let frame = on_a.next().await.expect("A streams");
        if authority(&frame) {
            received.push(frame.data);
        }
    }
    // kill -9: no graceful end, no last frame.
    let mut a = a;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    a.stopped = true;
    while let Some(frame) = on_a.next().await {
        if authority(&frame) {
            received.push(frame.data);
        }
    }
    writer.await.unwrap();

    // Resume on B from the last id received.
    let last_id = received.last().unwrap()["eventId"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut on_b = SseStream::open(
        &http,
        &format!("{}/v1/sessions/s1/stream", b.base),
        &token,
        &[("last-event-id", &last_id)],
    )
    .await;
    on_b.next().await.unwrap();
    let last = 2 + BATCHES as u64;
    received.extend(on_b.events_until(last, 30).await);
    let sequences: Vec<u64> = received
        .iter()
        .map(|e| e["sessionSequence"].as_u64().unwrap())
        .collect();
    assert_eq!(
        sequences,
        (1..=last).collect::<Vec<_>>(),
        "nothing missed, nothing twice"
    );

    // The state reduced from the stream equals the state reduced from history.
    let history: Value = http
        .get(format!("{}/v1/sessions/s1/events?limit=1000", b.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let reduce = |events: &[Value]| {
        let mut r = narad_protocol::reducer::Reducer::new(narad_protocol::ProfileSet::all());
        for e in events {
            r.deliver_json(e).expect("a valid journal");
        }
        r.to_json()
    };
    assert_eq!(
        reduce(&received),
        reduce(history["events"].as_array().unwrap())
    );
    b.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tail_prints_a_sessions_events_as_json_lines_live() {
    use narad_server::auth::Role;
    use serde_json::{Value, json};
    use std::io::{BufRead, BufReader};
    let s = narad_tests::Server::start().await;
    let t = narad_tests::token("acme", &Role::ALL);
    s.post("/v1/sessions", &t, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    s.post(
        "/v1/commands/record-user-message",
        &t,
        &json!({"sessionId": "s1", "messageScope": "session", "content": "first"}),
    )
    .await
    .expect(201);
    let mut child = Command::new(env!("CARGO_BIN_EXE_narad"))
        .args(["tail", "s1", "--authority-only", "--server", &s.base])
        .env("NARAD_TOKEN", &t)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("narad runs");
    let (tx, rx) = std::sync::mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    s.post(
        "/v1/commands/record-user-message",
        &t,
        &json!({"sessionId": "s1", "messageScope": "session", "content": "second"}),
    )
    .await
    .expect(201);
    let mut contents = Vec::new();
    while contents.len() < 2 {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("tail prints each event");
        let event: Value = serde_json::from_str(&line).expect("one JSON object per line");
        assert_eq!(event["type"], "message.user.recorded");
        contents.push(event["content"].as_str().unwrap().to_owned());
    }
    assert_eq!(contents, ["first", "second"], "history, then live");
    child.kill().unwrap();
    child.wait().unwrap();
    s.stop().await;
}

#[tokio::test]
async fn token_mints_executor_and_session_limits() {
    use narad_server::auth::{AuthSettings, Verifier};
    let secret = "a-development-secret-of-32-bytes-or-more";
    let (code, minted, err) = narad(
        &[
            "token",
            "--org",
            "acme",
            "--sub",
            "desk",
            "--roles",
            "executor",
            "--executors",
            "desk-1,desk-2",
            "--sessions",
            "s1",
            "--secret",
            secret,
        ],
        "",
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let verifier = Verifier::new(AuthSettings {
        issuer: "narad".into(),
        audience: "narad".into(),
        hs256_secret: Some(secret.as_bytes().to_vec()),
        jwks: None,
        jwks_refetch_interval: std::time::Duration::from_secs(60),
        jwks_refresh_interval: std::time::Duration::from_secs(300),
        operator_org: None,
    })
    .await
    .expect("a verifier");
    let principal = verifier.verify(minted.trim()).await.expect("verifies");
    assert_eq!(
        principal.executors,
        Some(vec!["desk-1".to_owned(), "desk-2".to_owned()])
    );
    assert_eq!(principal.sessions, Some(vec!["s1".to_owned()]));
}

#[tokio::test]
async fn two_server_processes_send_the_same_graph_records() {
    use narad_tests::SseStream;
    use serde_json::{Value, json};

    let (_db, a, b, token, http) = two_processes().await;
    let post = |path: &str, body: Value| {
        let req = http
            .post(format!("{}{path}", a.base))
            .bearer_auth(&token)
            .json(&body);
        async move {
            let res = req.send().await.unwrap();
            assert!(res.status().is_success(), "{}", res.text().await.unwrap());
        }
    };
    post("/v1/sessions", json!({"sessionId": "s1"})).await;
    post(
        "/v1/commands/start-run",
        json!({"sessionId": "s1", "runId": "r1"}),
    )
    .await;
    let ev = |id: &str, ty: &str, run: &str, extra: Value| {
        let mut e = json!({"protocolVersion": "narad/v1", "type": ty, "eventId": id,
            "rootRunId": "r1", "runId": run});
        for (k, v) in extra.as_object().unwrap() {
            e[k] = v.clone();
        }
        e
    };
    post(
        "/v1/sessions/s1/events",
        json!({"events": [
            ev("t1", "tool.call.started", "r1", json!({"toolCallId": "t1", "toolName": "x", "executor": "backend", "args": {"q": 1}})),
            ev("r2", "run.started", "r2", json!({"parentRunId": "r1"})),
            ev("t1f", "tool.call.finished", "r1", json!({"toolCallId": "t1", "outcome": "success", "response": [1, 2]})),
            ev("r2f", "run.finished", "r2", json!({})),
        ]}),
    )
    .await;
    // The graph records each process sends, from the start and resumed
    // mid-way, without their timestamps (the only field that is the
    // sender's own).
    let mut records = Vec::new();
    for base in [&a.base, &b.base] {
        for cursor in ["0", "2"] {
            let url = format!("{base}/v1/sessions/s1/stream?afterSessionSequence={cursor}");
            let mut stream = SseStream::open(&http, &url, &token, &[]).await;
            let mut got = Vec::new();
            let mut done = false;
            loop {
                let wait = std::time::Duration::from_millis(if done { 300 } else { 10_000 });
                let Ok(Some(frame)) = tokio::time::timeout(wait, stream.next()).await else {
                    break;
                };
                if frame.data["sessionSequence"] == 5 {
                    done = true;
                }
                if frame.event.as_deref() == Some("hydrate")
                    && frame.data["type"]
                        .as_str()
                        .is_some_and(|t| t.starts_with("graph."))
                {
                    let mut record = frame.data.clone();
                    record.as_object_mut().unwrap().remove("timestamp");
                    got.push(serde_jcs::to_string(&record).unwrap());
                }
            }
            assert!(!got.is_empty(), "graph records from {base} after {cursor}");
            records.push(got);
        }
    }
    // From the start: r1's snapshot when it starts, then four deltas.
    assert_eq!(records[0].len(), 5, "{:#?}", records[0]);
    assert!(records[0][0].contains("graph.snapshot"));
    assert_eq!(
        records[0], records[2],
        "from the start: the same bytes on both processes"
    );
    assert_eq!(
        records[1], records[3],
        "resumed: the same bytes on both processes"
    );
}

/// SIGTERM under load loses nothing: writers append while the server is
/// told to stop; every append it acknowledged is in the history a
/// restarted server reads, an open stream ends at a frame boundary, and
/// the process exits cleanly well within its grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_under_load_loses_no_acknowledged_append() {
    use std::sync::{Arc, Mutex};
    let db = narad_testkit::TestDatabase::new(&narad_journal::MIGRATOR).await;
    let served = Served::on(&db);
    let base = served.base.clone();
    let jwt = dev_token("load", "reader,writer,backend");
    narad_server::auth::install_tls_provider();
    let http = reqwest::Client::new();
    let post = |path: String, body: serde_json::Value| {
        http.post(format!("{base}{path}"))
            .bearer_auth(&jwt)
            .json(&body)
            .send()
    };
    let writers = 8;
    for w in 0..writers {
        let session = format!("s{w}");
        let ok = |r: reqwest::Response| assert!(r.status().is_success(), "{r:?}");
        ok(post(
            "/v1/sessions".into(),
            serde_json::json!({ "sessionId": session }),
        )
        .await
        .unwrap());
        ok(post(
            "/v1/commands/start-run".into(),
            serde_json::json!({"sessionId": session, "runId": "r1"}),
        )
        .await
        .unwrap());
        ok(post(
            format!("/v1/sessions/{session}/events"),
            serde_json::json!({"events": [{"protocolVersion": "narad/v1",
                "type": "message.text.started", "eventId": format!("start-{w}"),
                "rootRunId": "r1", "runId": "r1", "messageId": "m1", "role": "assistant",
                "messageScope": "run"}]}),
        )
        .await
        .unwrap());
    }
    // A stream open through the shutdown.
    let stream = http
        .get(format!("{base}/v1/sessions/s0/stream"))
        .bearer_auth(&jwt)
        .send()
        .await
        .unwrap();
    let streamed = tokio::spawn(async move { stream.bytes().await });
    let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (http, base, jwt, acknowledged) = (
                http.clone(),
                base.clone(),
                jwt.clone(),
                acknowledged.clone(),
            );
            tokio::spawn(async move {
                for n in 0.. {
                    let id = format!("w{w}-{n}");
                    let sent = http
                        .post(format!("{base}/v1/sessions/s{w}/events"))
                        .bearer_auth(&jwt)
                        .json(
                            &serde_json::json!({"events": [{"protocolVersion": "narad/v1",
                            "type": "message.text.delta", "eventId": id, "rootRunId": "r1",
                            "runId": "r1", "messageId": "m1", "delta": "x"}]}),
                        )
                        .send()
                        .await;
                    match sent {
                        Ok(r) if r.status().as_u16() == 201 => {
                            acknowledged.lock().unwrap().push(id)
                        }
                        // Refused or cut off: the server is going away.
                        _ => return n,
                    }
                }
                unreachable!()
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let started = std::time::Instant::now();
    let printed = tokio::task::spawn_blocking(move || served.stop())
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(printed.contains("narad stopped"), "{printed}");
    assert!(
        took < std::time::Duration::from_secs(15),
        "stopped in {took:?}"
    );
    let attempted: u64 = futures::future::join_all(tasks)
        .await
        .into_iter()
        .map(|n| n.unwrap())
        .sum();
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() > 50,
        "the writers got going: {}",
        acknowledged.len()
    );
    // The stream ended cleanly, after a whole frame.
    let body = streamed
        .await
        .unwrap()
        .expect("the stream ends without an error");
    assert!(body.ends_with(b"\n\n"), "ends at a frame boundary");

    // A restarted server has every acknowledged append, once.
    let served = Served::on(&db);
    let mut stored = std::collections::BTreeSet::new();
    for w in 0..writers {
        let mut after = 0;
        loop {
            let page: serde_json::Value = http
                .get(format!(
                    "{}/v1/sessions/s{w}/events?limit=1000&afterSessionSequence={after}",
                    served.base
                ))
                .bearer_auth(&jwt)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            for e in page["events"].as_array().unwrap() {
                assert!(stored.insert(e["eventId"].as_str().unwrap().to_owned()));
            }
            match page["nextSessionSequence"].as_u64() {
                Some(n) => after = n,
                None => break,
            }
        }
    }
    let missing: Vec<_> = acknowledged
        .iter()
        .filter(|id| !stored.contains(*id))
        .collect();
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
    // Nothing beyond what was attempted (an append cut off may or may not
    // have committed; it was not acknowledged, and that is all).
    let deltas = stored.iter().filter(|id| id.starts_with('w')).count() as u64;
    assert!(deltas >= acknowledged.len() as u64 && deltas <= attempted + writers as u64);
    let _ = served.stop();
}

/// With NARAD_LOG_FORMAT=json every log line is one JSON object, and the
/// lines of a request carry its request id (the client's x-request-id,
/// or one the server made, which the answer names).
#[tokio::test]
async fn json_logs_name_the_request_on_every_line_of_it() {
    let db = narad_testkit::TestDatabase::new(&narad_journal::MIGRATOR).await;
    let served = Served::start(&[
        ("NARAD_DATABASE_URL", db.url()),
        ("NARAD_JWT_HS256_SECRET", DEV_SECRET),
        ("NARAD_LOG_FORMAT", "json"),
        ("RUST_LOG", "info,tower_http=debug"),
    ])
    .expect("serves");
    narad_server::auth::install_tls_provider();
    let answer = reqwest::Client::new()
        .get(format!("{}/v1/sessions/nope", served.base))
        .header("x-request-id", "req-tour-42")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 401);
    assert_eq!(answer.headers()["x-request-id"], "req-tour-42");
    let stderr = served.stderr.clone();
    let _ = served.stop();
    let log = stderr.lock().unwrap().clone();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let of_request: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["span"]["name"] == "request" && l["span"]["path"] == "/v1/sessions/nope")
        .collect();
    assert!(of_request.len() >= 2, "the request's lines: {log}");
    for line in of_request {
        assert_eq!(line["span"]["request_id"], "req-tour-42", "{line}");
    }
}

/// `NARAD_BLOB_MAX_BYTES` and `NARAD_LIMIT_STORED_BYTES` hold on
/// `narad serve`: whole and resumable uploads past them are refused
/// before more than the limit is kept (they were read and never used).
#[tokio::test]
async fn serve_enforces_the_server_wide_blob_limits() {
    let mib = 1024 * 1024;
    let db = narad_testkit::TestDatabase::new(&narad_journal::MIGRATOR).await;
    let served = Served::start(&[
        ("NARAD_DATABASE_URL", db.url()),
        ("NARAD_JWT_HS256_SECRET", DEV_SECRET),
        ("NARAD_BLOB_MAX_BYTES", &(4 * mib).to_string()),
        ("NARAD_LIMIT_STORED_BYTES", &(6 * mib).to_string()),
    ])
    .expect("serves");
    let token = acme_token();
    let http = reqwest::Client::new();
    let base = served.base.clone();
    let answer = |res: reqwest::Response| async move {
        let status = res.status().as_u16();
        let body: serde_json::Value = res.json().await.unwrap_or_default();
        (status, body["code"].as_str().unwrap_or("").to_owned(), body)
    };
    let created = http
        .post(format!("{base}/v1/sessions"))
        .bearer_auth(&token)
        .json(&serde_json::json!({"sessionId": "s1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let upload = |size: usize| {
        http.post(format!("{base}/v1/sessions/s1/blobs?name=b.bin"))
            .bearer_auth(&token)
            .body(vec![7u8; size])
            .send()
    };
    // A whole upload past the largest blob, and a resumable one announcing
    // more: refused on what they announce, before their bytes are read (a
    // client sending the body meanwhile meets a closed connection, so the
    // answer is read after the headers alone).
    for (headers, announced) in [
        (vec![("content-length", 5 * mib)], "5 MiB body"),
        (
            vec![("content-length", mib), ("upload-length", 5 * mib)],
            "a 5 MiB resumable upload",
        ),
    ] {
        let (status, body) = announce(&base, "/v1/sessions/s1/blobs?name=b.bin", &token, &headers);
        assert_eq!(
            (status, body["code"].as_str()),
            (413, Some("NRD-0006")),
            "{announced}: {body}"
        );
        assert_eq!(body["details"]["value"], 4 * mib);
    }
    // A body larger than it said, streamed: refused once past the limit.
    let streamed = http
        .post(format!("{base}/v1/sessions/s1/blobs?name=b.bin"))
        .bearer_auth(&token)
        .body(reqwest::Body::wrap_stream(futures::stream::iter(
            (0..5).map(move |_| Ok::<_, std::io::Error>(vec![7u8; mib])),
        )))
        .send()
        .await;
    if let Ok(res) = streamed {
        let (status, code, _) = answer(res).await;
        assert_eq!((status, code.as_str()), (413, "NRD-0006"));
    }
    // Within: kept; then the organisation's stored bytes are spent.
    let (status, _, body) = answer(upload(4 * mib).await.unwrap()).await;
    assert_eq!(status, 201, "{body}");
    let (status, code, _) = answer(upload(3 * mib).await.unwrap()).await;
    assert_eq!((status, code.as_str()), (429, "NRD-0606"));
    // Nothing of the refused uploads is kept: one blob holds 4 MiB.
    let (client, conn) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let held: i64 = client
        .query_one(
            "select coalesce(sum(size_bytes), 0)::bigint from blobs",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 4 * mib as i64);
    // Counted, each under its limit's label.
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (label, at_least) in [("blob_bytes", 2.0), ("stored_bytes", 1.0)] {
        let series = format!("narad_limit_refusals_total{{limit=\"{label}\"}}");
        let value: f64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&series))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{series} is exported: {metrics}"));
        assert!(value >= at_least, "{series} = {value}");
    }
    served.stop();
}

/// Sends a POST's headers alone (a body announced by `headers`, none
/// sent) and reads the answer: what a server that refuses on the announced
/// length says.
fn announce(
    base: &str,
    path: &str,
    token: &str,
    headers: &[(&str, usize)],
) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let addr = base.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Connection: close\r\n"
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    conn.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = conn.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP answer: {answer}"));
    let body = answer
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or_default();
    (status, body)
}

/// On the smallest pool it takes, `narad serve` answers requests while its
/// background tasks run: sessions, appends, streams and readiness, none
/// hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_the_smallest_pool_answers_every_request() {
    let needed =
        narad_journal::BACKGROUND_CONNECTIONS + narad_server::config::MIN_REQUEST_CONNECTIONS;
    let db = narad_testkit::TestDatabase::new(&narad_journal::MIGRATOR).await;
    let served = Served::start(&[
        ("NARAD_DATABASE_URL", db.url()),
        ("NARAD_JWT_HS256_SECRET", DEV_SECRET),
        ("NARAD_DATABASE_POOL", &needed.to_string()),
        // Sweepers as busy as they get.
        ("NARAD_RUNTIME_SWEEP_MS", "50"),
    ])
    .expect("serves");
    let token = acme_token();
    let http = reqwest::Client::new();
    let base = served.base.clone();
    // Streams that hold their requests open meanwhile.
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(
            http.get(format!("{base}/v1/events"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap(),
        );
    }
    let work = (0..16).map(|i| {
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        async move {
            let session = format!("s{i}");
            let created = http
                .post(format!("{base}/v1/sessions"))
                .bearer_auth(&token)
                .json(&serde_json::json!({"sessionId": session}))
                .send()
                .await
                .unwrap();
            assert_eq!(created.status(), 201);
            let started = http
                .post(format!("{base}/v1/commands/start-run"))
                .bearer_auth(&token)
                .json(&serde_json::json!({"sessionId": session, "runId": format!("r{i}")}))
                .send()
                .await
                .unwrap();
            assert_eq!(started.status(), 201);
            let history = http
                .get(format!("{base}/v1/sessions/{session}/events"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap();
            assert_eq!(history.status(), 200);
        }
    });
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        futures::future::join_all(work),
    )
    .await
    .expect("every request answered");
    let ready = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        http.get(format!("{base}/readyz")).send(),
    )
    .await
    .expect("readiness answered")
    .unwrap();
    assert_eq!(ready.status(), 200);
    for s in &streams {
        assert_eq!(s.status(), 200);
    }
    drop(streams);
    served.stop();
}

/// A token of tenant acme with every role, signed by [`DEV_SECRET`], for ten
/// minutes; the TLS provider installed for the HTTP client.
fn acme_token() -> String {
    narad_server::auth::install_tls_provider();
    narad_server::auth::mint_hs256(
        DEV_SECRET.as_bytes(),
        "narad",
        "narad",
        "acme",
        "tester",
        &narad_server::auth::Role::ALL,
        std::time::Duration::from_secs(600),
    )
    .unwrap()
}
