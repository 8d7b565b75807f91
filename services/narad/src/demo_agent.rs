//! `narad demo-agent`: a small agent runtime built only on the SDK's
//! public API (the tenant stream and the runtime loop), so that a
//! newcomer sees every part of the protocol with real traffic.
//!
//! - It follows the tenant stream; each user message recorded at session
//!   scope (`record-user-message`) becomes a start-run for its queue, with
//!   the message as the run's input (bound to `--executor` when given).
//!   It follows live from its start: a message recorded while no demo
//!   agent listens starts no run (the runs already queued are served
//!   whenever it comes back).
//! - Its runtime loop claims those runs (and any other run started for its
//!   queue with `input.prompt`) and answers each from the run's history
//!   alone, so that any holder — after a release, a lost runtime, a
//!   restart — carries on where the journal stands:
//!   - a prompt that asks to delete or drop something first raises an
//!     approval interrupt (`interrupt.requested` + `run.paused`) and gives
//!     the run back; the resolution brings it back, and it resumes and
//!     says what it did (or did not);
//!   - a prompt that asks for the time calls the client tool `clock.now`
//!     on the run's executor (`narad executor` runs one) and gives the run
//!     back; the tool's result brings it back, and it answers with it (or,
//!     when the call failed, says so and why);
//!   - a prompt asking for a report gets one: a short Markdown file of the
//!     session, uploaded as the run's artifact (the server appends its
//!     `artifact.ready`);
//!   - anything else is echoed, word by word, after a little reasoning.
//! - It honours stops: between words, and whenever it is claimed again, a
//!   run asked to stop is closed (open work first) with `run.cancelled`.

use std::time::Duration;

use narad_client::runtime::{RunContext, RunHandler, Runtime, RuntimeError};
use narad_client::{Client, Item};
use narad_protocol::engine::{SessionState, Status};
use narad_protocol::primitives::RunId;
use narad_protocol::repair::{self, Closing};
use narad_protocol::{Classified, Reader, WireObject};
use serde_json::{Value, json};

/// What `narad demo-agent` serves, and how.
#[derive(clap::Args)]
pub struct DemoAgentArgs {
    #[command(flatten)]
    pub server: crate::servers::Servers,
    /// A bearer token with roles reader, writer and backend (`narad token`
    /// mints a development one).
    #[arg(long, env = "NARAD_TOKEN", hide_env_values = true)]
    pub token: String,
    /// The work queue its runs go to and come from.
    #[arg(long, default_value = "demo")]
    pub queue: String,
    /// The client executor to bind its runs to (for the `clock.now` tool).
    #[arg(long)]
    pub executor: Option<String>,
    /// Pause between streamed words, in milliseconds.
    #[arg(long, default_value_t = 60)]
    pub word_delay_ms: u64,
}

/// Runs the demo agent until Ctrl-C.
pub async fn demo_agent(args: DemoAgentArgs) -> anyhow::Result<()> {
    let runtime = Runtime::builder(args.server.servers.clone(), args.token.clone())
        .queue(args.queue.clone())
        .runtime_id("narad-demo-agent")
        .build()?;
    let handler = Agent {
        client: Client::new(args.server.servers.clone(), args.token.clone()),
        delay: Duration::from_millis(args.word_delay_ms),
    };
    let watcher = tokio::spawn(start_runs_for_messages(args));
    tracing::info!("demo agent running; Ctrl-C stops it");
    let served = runtime
        .run(handler, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    watcher.abort();
    served?;
    Ok(())
}

/// Follows the tenant stream and starts a run for each user message
/// recorded at session scope.
async fn start_runs_for_messages(args: DemoAgentArgs) {
    let client = Client::new(args.server.servers.clone(), args.token.clone());
    let http = reqwest::Client::new();
    let mut follow = client.follow_tenant(None, None);
    let mut attached = false;
    loop {
        let event = match follow.next().await {
            Ok(Some(Item::Authority(e))) => e,
            Ok(Some(Item::Capabilities(_))) => {
                // Attached: from here on no message is missed (the stream
                // resumes across disconnects by itself).
                if !attached {
                    attached = true;
                    println!("narad demo-agent is listening for user messages");
                }
                continue;
            }
            Ok(Some(_)) => continue,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(error = %e, "the tenant stream failed; no more runs are started");
                return;
            }
        };
        if event["type"] != "message.user.recorded" || event["messageScope"] != "session" {
            continue;
        }
        let mut start = json!({
            "sessionId": event["sessionId"],
            "onConflict": "enqueue",
            "runtime": {"queue": args.queue},
            "input": {"prompt": text_of(&event["content"]), "messageId": event["messageId"]},
        });
        if let Some(executor) = &args.executor {
            start["clientExecutorId"] = json!(executor);
        }
        for base in &args.server.servers {
            let sent = http
                .post(format!(
                    "{}/v1/commands/start-run",
                    base.trim_end_matches('/')
                ))
                .bearer_auth(&args.token)
                .json(&start)
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => {
                    tracing::info!(session = %event["sessionId"], "a run starts for the message");
                    break;
                }
                Ok(r) => {
                    let status = r.status();
                    let body = r.text().await.unwrap_or_default();
                    tracing::warn!(%status, body, "start-run was refused");
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, base, "start-run failed; trying the next server")
                }
            }
        }
    }
}

/// The text of a message's content: a string, or the text parts of an
/// array of parts.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str().or_else(|| p.as_str()))
            .collect::<Vec<_>>()
            .join(" "),
        other => other.to_string(),
    }
}

/// The demo agent's run handler.
struct Agent {
    /// Its client, for the bytes of the reports it writes.
    client: Client,
    delay: Duration,
}

/// Where a run stands, read from its journal.
enum Phase {
    /// Asked to stop: close it.
    Stop,
    /// Waiting on a person or a client tool: give it back.
    Waiting,
    /// Paused on a decided approval: resume and report.
    Decided(String),
    /// The clock tool's call finished: its `tool.call.finished`.
    ToolDone(Value),
    /// Nothing done yet.
    Fresh,
    /// Over.
    Ended,
}

impl RunHandler for Agent {
    async fn handle(&self, ctx: RunContext) -> Result<(), RuntimeError> {
        let history = ctx.history_after(0).await?;
        let state = engine_state(&history)?;
        let run = ctx.run_id().clone();
        let prompt = history
            .iter()
            .find(|e| e["type"] == "run.started" && e["runId"] == run.as_str())
            .and_then(|e| e["input"]["prompt"].as_str())
            .unwrap_or("hello")
            .to_owned();
        match phase(&state, &history, &run) {
            Phase::Ended | Phase::Waiting => Ok(()),
            Phase::Stop => stop(&ctx, &state, &run).await,
            Phase::Decided(decision) => {
                let mut wait_id = Value::Null;
                if let Some(Status::Paused { wait_id: w, .. }) =
                    state.runs.get(&run).map(|r| &r.status)
                {
                    wait_id = json!(w);
                }
                ctx.append(vec![ctx.event("run.resumed", json!({"waitId": wait_id}))])
                    .await?;
                let answer = if decision == "approve" {
                    format!("Approved. Pretending to {prompt} now: done, and nothing was harmed.")
                } else {
                    format!("Denied ({decision}). I did not {prompt}.")
                };
                self.say(&ctx, "reply", &answer).await
            }
            Phase::ToolDone(finished) => self.say(&ctx, "reply", &clock_reply(&finished)).await,
            Phase::Fresh => self.start(&ctx, &prompt).await,
        }
    }
}

impl Agent {
    /// The first turn: a little reasoning, then an approval, a client tool
    /// call, or an echo.
    async fn start(&self, ctx: &RunContext, prompt: &str) -> Result<(), RuntimeError> {
        let run = ctx.run_id().as_str();
        let message = format!("m-{run}-{}", ctx.attempt());
        let reasoning = format!("reasoning:{message}");
        let lower = prompt.to_lowercase();
        let dangerous = ["delete", "drop", "remove", "rm "]
            .iter()
            .any(|w| lower.contains(w));
        let clock = ["time", "clock"].iter().any(|w| lower.contains(w));
        let report = lower.contains("report");
        let thought = if dangerous {
            "This changes things for good: a person should approve it first."
        } else if clock {
            "The time is best read on the user's own machine: a client tool."
        } else if report {
            "A short report of this session, written as a file: an artifact."
        } else {
            "A friendly echo will do."
        };
        ctx.append(vec![
            ctx.event(
                "reasoning.started",
                json!({"reasoningId": reasoning, "messageId": message}),
            ),
            ctx.event(
                "reasoning.delta",
                json!({"reasoningId": reasoning, "messageId": message, "delta": thought}),
            ),
            ctx.event(
                "reasoning.completed",
                json!({"reasoningId": reasoning, "messageId": message}),
            ),
        ])
        .await?;
        if dangerous {
            let interrupt = format!("i-{run}");
            let wait = format!("w-{run}");
            ctx.append(vec![
                ctx.event(
                    "interrupt.requested",
                    json!({
                        "interruptId": interrupt, "waitId": wait, "kind": "approval",
                        "actions": ["approve", "deny"], "title": "Approve a destructive action",
                        "message": format!("The agent wants to: {prompt}"),
                    }),
                ),
                ctx.event(
                    "run.paused",
                    json!({
                        "waitId": wait, "interruptId": interrupt,
                        "reason": "narad.approval", "resumeMode": "command",
                    }),
                ),
            ])
            .await?;
            return Ok(());
        }
        if clock && has_executor(ctx).await? {
            ctx.append(vec![ctx.event(
                "tool.call.started",
                json!({
                    "toolCallId": format!("t-{run}"), "toolName": "clock.now",
                    "executor": "client", "args": {},
                }),
            )])
            .await?;
            return Ok(());
        }
        if report {
            let name = self.write_report(ctx).await?;
            return self
                .say(
                    ctx,
                    "reply",
                    &format!("I wrote {name}: it is attached to this run."),
                )
                .await;
        }
        self.say(ctx, "echo", &format!("You said: {prompt}")).await
    }

    /// Writes a short Markdown report of the session so far, uploads it to
    /// the session and adds it as the run's artifact (the server appends
    /// its `artifact.ready`); answers its file name.
    async fn write_report(&self, ctx: &RunContext) -> Result<String, RuntimeError> {
        let history = ctx.history_after(0).await?;
        let count = |ty: &str| history.iter().filter(|e| e["type"] == ty).count();
        let text = format!(
            "# Session report\n\n- events so far: {}\n- messages from people: {}\n- runs \
             started: {}\n- approvals asked for: {}\n",
            history.len(),
            count("message.user.recorded"),
            count("run.started"),
            count("interrupt.requested"),
        );
        let name = "report.md";
        let session = history
            .first()
            .and_then(|e| e["sessionId"].as_str())
            .unwrap_or_default()
            .to_owned();
        let blob = self
            .client
            .upload_blob(
                &session,
                text.clone().into_bytes(),
                name,
                "text/markdown; charset=utf-8",
            )
            .await
            .map_err(|e| RuntimeError::Unavailable(format!("the report's upload: {e}")))?;
        let run = ctx.run_id().as_str();
        ctx.append(vec![ctx.event(
            "artifact.added",
            json!({
                "artifactId": format!("report-{run}"), "name": name,
                "mediaType": blob["mediaType"], "sizeBytes": blob["sizeBytes"],
                "sha256": blob["sha256"], "uri": blob["uri"],
            }),
        )])
        .await?;
        Ok(name.to_owned())
    }

    /// Streams `text` word by word as an assistant message, then ends the
    /// run; a stop between words completes the message and cancels.
    async fn say(&self, ctx: &RunContext, kind: &str, text: &str) -> Result<(), RuntimeError> {
        let message = format!("{kind}-{}-{}", ctx.run_id(), ctx.attempt());
        ctx.append(vec![ctx.event(
            "message.text.started",
            json!({"messageId": message, "role": "assistant", "messageScope": "run"}),
        )])
        .await?;
        let mut stopped = false;
        for (n, word) in text.split(' ').enumerate() {
            if ctx.is_stop_requested() {
                stopped = true;
                break;
            }
            let delta = if n == 0 {
                word.to_owned()
            } else {
                format!(" {word}")
            };
            ctx.append(vec![ctx.event(
                "message.text.delta",
                json!({"messageId": message, "delta": delta}),
            )])
            .await?;
            tokio::time::sleep(self.delay).await;
        }
        let end = if stopped || ctx.is_stop_requested() {
            ctx.event(
                "run.cancelled",
                json!({"code": "stopped", "message": "stopped on request"}),
            )
        } else {
            ctx.event("run.finished", json!({}))
        };
        ctx.append(vec![
            ctx.event("message.text.completed", json!({"messageId": message})),
            end,
        ])
        .await?;
        Ok(())
    }
}

/// Whether the run is bound to a client executor (read from its start).
async fn has_executor(ctx: &RunContext) -> Result<bool, RuntimeError> {
    let history = ctx.history_after(0).await?;
    Ok(history.iter().any(|e| {
        e["type"] == "run.started"
            && e["runId"] == ctx.run_id().as_str()
            && e.get("clientExecutorId").is_some()
    }))
}

/// The reply to the clock tool's `tool.call.finished`: the time it read,
/// or, when the call failed or was cancelled (no executor took it, its
/// token lapsed, the tool failed), that it did not, with the code and
/// message the finish gave.
fn clock_reply(finished: &Value) -> String {
    let response = &finished["response"];
    if finished["outcome"] == "success" {
        let now = response["now"]
            .as_str()
            .map_or_else(|| response.to_string(), str::to_owned);
        return format!("Your executor's clock says {now}.");
    }
    let outcome = finished["outcome"].as_str().unwrap_or("error");
    let why = match (finished["code"].as_str(), finished["message"].as_str()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        (None, Some(message)) => format!("{outcome}: {message}"),
        (None, None) => outcome.to_owned(),
    };
    format!("I could not read your executor's clock: the clock.now call ended {outcome} ({why}).")
}

/// Closes a run asked to stop: its open work, then `run.cancelled`.
async fn stop(ctx: &RunContext, state: &SessionState, run: &RunId) -> Result<(), RuntimeError> {
    let how = Closing::Cancelled {
        code: "stopped".to_owned(),
        message: "stopped on request".to_owned(),
    };
    let events = repair::close_journal(state, run, &how);
    if !events.is_empty() {
        ctx.append(events).await?;
    }
    Ok(())
}

/// The engine's state after the session's history.
fn engine_state(history: &[Value]) -> Result<SessionState, RuntimeError> {
    let reader = Reader::all_profiles();
    let mut state = SessionState::new();
    for event in history {
        if let Ok(Classified::Accepted(object)) = reader.classify(event)
            && let WireObject::Authority(a) = *object
        {
            state.apply(&a).map_err(|v| {
                RuntimeError::handler(format!(
                    "the session's history breaks {}: {}",
                    v.rule, v.message
                ))
            })?;
        }
    }
    Ok(state)
}

/// Where run `run` stands.
fn phase(state: &SessionState, history: &[Value], run: &RunId) -> Phase {
    let Some(r) = state.runs.get(run) else {
        return Phase::Fresh;
    };
    if r.status.is_terminal() {
        return Phase::Ended;
    }
    if r.stop_requested {
        return Phase::Stop;
    }
    if let Status::Paused {
        interrupt_id: Some(i),
        ..
    } = &r.status
    {
        return match state.interrupts.get(i).and_then(|s| s.decision.clone()) {
            Some(decision) => Phase::Decided(decision),
            None => Phase::Waiting,
        };
    }
    if !r.open_tool_calls.is_empty() || matches!(r.status, Status::Paused { .. }) {
        return Phase::Waiting;
    }
    let mine = |e: &&Value| e["runId"] == run.as_str();
    if let Some(finished) = history
        .iter()
        .filter(mine)
        .find(|e| e["type"] == "tool.call.finished")
    {
        return Phase::ToolDone(finished.clone());
    }
    // Nothing decided yet (or a lost holder left a turn unfinished: this
    // attempt starts it again, under ids of its own).
    Phase::Fresh
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(fields: Value) -> Value {
        let mut event = json!({"type": "tool.call.finished", "toolCallId": "t-1"});
        event
            .as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        event
    }

    #[test]
    fn a_clock_that_answered_is_quoted() {
        let done =
            finished(json!({"outcome": "success", "response": {"now": "2026-12-02T12:34:56Z"}}));
        assert_eq!(
            clock_reply(&done),
            "Your executor's clock says 2026-12-02T12:34:56Z."
        );
    }

    #[test]
    fn a_clock_tool_that_failed_is_reported_as_a_failure_not_as_a_time() {
        // As the executor sweeper closes a call no executor took.
        let failed = finished(json!({
            "outcome": "error", "response": null, "code": "client_unavailable",
            "message": "no executor took the call in time",
        }));
        let reply = clock_reply(&failed);
        assert!(!reply.contains("clock says"), "{reply}");
        assert!(!reply.contains("null"), "{reply}");
        assert!(reply.contains("client_unavailable"), "{reply}");
        assert!(
            reply.contains("no executor took the call in time"),
            "{reply}"
        );
        // Cancelled under a stop, with neither code nor message.
        let cancelled = finished(json!({"outcome": "cancelled", "response": null}));
        let reply = clock_reply(&cancelled);
        assert!(
            !reply.contains("clock says") && !reply.contains("null"),
            "{reply}"
        );
        assert!(reply.contains("cancelled"), "{reply}");
    }
}
