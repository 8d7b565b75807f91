//! Commands and their conflicts (§2.2, §3.1, §6.3, §7.4, §7.7): the
//! session's one top-level slot (reject, enqueue, interrupt), a decision
//! recorded at most once, a stop of a run and of an ended run.

use std::time::Duration;

use serde_json::{Value, json};

use super::api::{Api, BACKEND, PERSON};
use super::journal::words;
use super::{Step, check, list};

/// A run event a backend proposes.
pub fn event(id: &str, ty: &str, run: &str, extra: Value) -> Value {
    let mut e = json!({
        "protocolVersion": "narad/v1", "type": ty, "eventId": id,
        "runId": run, "rootRunId": run,
    });
    if let (Some(o), Some(x)) = (e.as_object_mut(), extra.as_object()) {
        o.extend(x.clone());
    }
    e
}

/// A backend tool call of `run`, started and finished: two core events.
pub fn tool_call(id: &str, run: &str) -> Vec<Value> {
    vec![
        event(
            &format!("{id}-s"),
            "tool.call.started",
            run,
            json!({
            "toolCallId": id, "toolName": "lookup", "executor": "backend", "args": {"q": id}}),
        ),
        event(
            &format!("{id}-f"),
            "tool.call.finished",
            run,
            json!({
            "toolCallId": id, "outcome": "success", "response": {"ok": true}}),
        ),
    ]
}

/// What was appended: the events sent, each with the sequences its
/// append's answer gave it; or why not, when an answer does not name the
/// events sent in order.
fn as_answered(sent: Vec<Value>, answer: &Value) -> Result<Vec<Value>, String> {
    sent.into_iter()
        .enumerate()
        .map(|(i, mut e)| {
            let a = &answer["events"][i];
            if a["eventId"] != e["eventId"] {
                return Err(format!(
                    "the answer of an append names {} where the event sent was {}",
                    super::journal::words(&a["eventId"]),
                    super::journal::words(&e["eventId"])
                ));
            }
            for f in ["sessionSequence", "sequence", "workflowSequence"] {
                if !a[f].is_null() {
                    e[f] = a[f].clone();
                }
            }
            Ok(e)
        })
        .collect()
}

/// Appends, in the background and straight to the server, `batches`
/// backend tool calls of run `r` (two events each), `pause` apart, then
/// (when `finish`) `run.finished`: the appends a stream case reads
/// while they happen. The task answers what it appended (see
/// [`appended`]).
pub async fn appending(
    api: &Api,
    session: &str,
    batches: u64,
    pause: Duration,
    finish: bool,
) -> Step<tokio::task::JoinHandle<Result<Vec<Value>, String>>> {
    let (base, token, s) = (
        api.base.clone(),
        api.token(BACKEND).await?,
        session.to_owned(),
    );
    let http = api.http().clone();
    Ok(tokio::spawn(async move {
        let mut done = Vec::new();
        for i in 0..batches + u64::from(finish) {
            let events = if i < batches {
                tool_call(&format!("{s}-t{i}"), "r")
            } else {
                vec![event(&format!("{s}-end"), "run.finished", "r", json!({}))]
            };
            let res = http
                .post(format!("{base}/v1/sessions/{s}/events"))
                .bearer_auth(&token)
                .json(&json!({ "events": events }))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if res.status().as_u16() != 201 {
                return Err(format!("an append answered {}", res.status()));
            }
            let answer: Value = res.json().await.map_err(|e| e.to_string())?;
            done.extend(as_answered(events, &answer)?);
            tokio::time::sleep(pause).await;
        }
        Ok(done)
    }))
}

/// Waits for an appender of [`appending`]: what it appended, or what it
/// met.
pub async fn appended(
    task: tokio::task::JoinHandle<Result<Vec<Value>, String>>,
) -> Step<Vec<Value>> {
    task.await
        .map_err(|e| anyhow::anyhow!("the appender: {e}"))?
        .map_err(|e| anyhow::anyhow!("the appender: {e}"))
}

/// Appends `events` as a backend; fails unless accepted with an answer
/// naming them. Answers them with the sequences the answer gave them.
pub async fn append(api: &Api, session: &str, events: Vec<Value>) -> Step<Vec<Value>> {
    let answer = api
        .post(
            &format!("/v1/sessions/{session}/events"),
            BACKEND,
            &json!({ "events": events }),
        )
        .await?;
    let answer = answer.expect(201, "appending")?;
    as_answered(events, answer).map_err(anyhow::Error::msg)
}

/// Creates session `id`.
pub async fn session(api: &Api, id: &str) -> Step {
    api.post("/v1/sessions", BACKEND, &json!({ "sessionId": id }))
        .await?
        .expect(201, "creating a session")?;
    Ok(())
}

/// Session `id` with run `r` started by a backend: what the stream cases
/// append to.
pub async fn session_with_run(api: &Api, id: &str) -> Step {
    session(api, id).await?;
    append(
        api,
        id,
        vec![event(&format!("{id}-0"), "run.started", "r", json!({}))],
    )
    .await?;
    Ok(())
}

/// Every event of a session's history, page by page.
pub async fn history(api: &Api, session: &str) -> Step<Vec<Value>> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = api
            .get(
                &format!("/v1/sessions/{session}/events?afterSessionSequence={after}&limit=500"),
                BACKEND,
            )
            .await?;
        let page = page.expect(200, "reading history")?;
        out.extend(page["events"].as_array().cloned().unwrap_or_default());
        match page["nextSessionSequence"].as_u64() {
            Some(next) if next > after => after = next,
            _ => return Ok(out),
        }
    }
}

/// The runs a history started, in order.
fn started(h: &[Value]) -> Vec<String> {
    h.iter()
        .filter(|e| e["type"] == "run.started")
        .filter_map(|e| e["runId"].as_str().map(str::to_owned))
        .collect()
}

/// Waits (up to 10 s) until `session`'s history satisfies `done`.
async fn until(
    api: &Api,
    session: &str,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Step<Vec<Value>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let h = history(api, session).await?;
        if done(&h) {
            return Ok(h);
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "{what} did not happen within 10 s; history: {}",
                list(h.iter().map(|e| words(&e["type"])))
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn start_run(api: &Api, session: &str, run: &str, on_conflict: &str) -> Step<Value> {
    let a = api
        .post(
            "/v1/commands/start-run",
            PERSON,
            &json!({"sessionId": session, "runId": run, "onConflict": on_conflict}),
        )
        .await?;
    Ok(json!({"status": a.status, "body": a.body}))
}

/// The slot: one top-level run; a second start is refused, queued, or
/// interrupts, and the queue starts in priority order as the slot frees.
pub async fn slot(api: &Api, prefix: &str) -> Step {
    let s = format!("{prefix}-slot");
    session(api, &s).await?;
    let r1 = start_run(api, &s, "r1", "reject").await?;
    check(r1["status"] == 201, || format!("start-run r1: {r1}"))?;
    let refused = start_run(api, &s, "r2", "reject").await?;
    check(
        refused["status"] == 409
            && refused["body"]["code"] == "NRD-0204"
            && refused["body"]["details"]["activeExecution"]["runId"] == "r1",
        || {
            format!(
                "a second start with onConflict reject: expected 409 NRD-0204 naming r1, got {refused}"
            )
        },
    )?;
    let queued = start_run(api, &s, "r3", "enqueue").await?;
    check(
        queued["status"] == 202 && queued["body"]["queueId"].is_string(),
        || format!("onConflict enqueue: expected 202 with a queueId, got {queued}"),
    )?;
    let interrupting = start_run(api, &s, "r4", "interrupt").await?;
    check(
        interrupting["status"] == 202 || interrupting["status"] == 201,
        || format!("onConflict interrupt: expected 202, got {interrupting}"),
    )?;
    until(api, &s, "r1's stop request", |h| {
        h.iter()
            .any(|e| e["type"] == "run.stop.requested" && e["runId"] == "r1")
    })
    .await?;
    let h = history(api, &s).await?;
    check(started(&h) == ["r1"], || {
        format!(
            "only r1 may have started while it holds the slot: {}",
            list(started(&h))
        )
    })?;
    // The backend ends r1: the interrupting start goes first, then the
    // queued one once r4 ends.
    append(
        api,
        &s,
        vec![event(
            &format!("{s}-c1"),
            "run.cancelled",
            "r1",
            json!({"code": "stopped"}),
        )],
    )
    .await?;
    until(api, &s, "r4's start", |h| started(h).len() >= 2).await?;
    let h = history(api, &s).await?;
    check(started(&h) == ["r1", "r4"], || {
        format!(
            "the interrupting start goes before the queued one: {}",
            list(started(&h))
        )
    })?;
    append(
        api,
        &s,
        vec![event(&format!("{s}-f4"), "run.finished", "r4", json!({}))],
    )
    .await?;
    let h = until(api, &s, "r3's start", |h| started(h).len() >= 3).await?;
    check(started(&h) == ["r1", "r4", "r3"], || {
        format!("the queued start follows: {}", list(started(&h)))
    })?;
    Ok(())
}

/// A decision is recorded once: the second is refused with the first.
pub async fn resolve_once(api: &Api, prefix: &str) -> Step {
    let s = format!("{prefix}-resolve");
    session(api, &s).await?;
    let r = start_run(api, &s, "r1", "reject").await?;
    check(r["status"] == 201, || format!("start-run: {r}"))?;
    append(api, &s, vec![
        event(&format!("{s}-ir"), "interrupt.requested", "r1",
            json!({"interruptId": format!("{s}-i1"), "waitId": "w1", "kind": "approval", "actions": ["approve", "deny"]})),
        event(&format!("{s}-p"), "run.paused", "r1",
            json!({"waitId": "w1", "interruptId": format!("{s}-i1"), "reason": "approval", "resumeMode": "command"})),
    ]).await?;
    let resolve = |decision: &str| json!({"sessionId": s, "interruptId": format!("{s}-i1"), "decision": decision});
    api.post(
        "/v1/commands/resolve-interrupt",
        PERSON,
        &resolve("approve"),
    )
    .await?
    .expect(200, "the first decision")?;
    let second = api
        .post("/v1/commands/resolve-interrupt", PERSON, &resolve("deny"))
        .await?;
    check(
        second.status == 409
            && second.code() == "NRD-0205"
            && second.body["details"]["decision"] == "approve",
        || {
            format!(
                "a second decision: expected 409 NRD-0205 with the recorded decision approve, got {} {}",
                second.status, second.body
            )
        },
    )?;
    let h = history(api, &s).await?;
    let resolved: Vec<&Value> = h
        .iter()
        .filter(|e| e["type"] == "interrupt.resolved")
        .collect();
    check(
        resolved.len() == 1 && resolved[0]["decision"] == "approve",
        || format!("one interrupt.resolved with approve: {}", list(resolved)),
    )?;
    Ok(())
}

/// A command sent again with its `Idempotency-Key` is answered its first
/// answer again (`Idempotent-Replayed: true`) and acts once; the key with
/// another request is refused 422 NRD-0211; a command naming its own
/// `messageId` sent again exactly is the same message, key or not.
pub async fn idempotency_key(api: &Api, prefix: &str) -> Step {
    let s = format!("{prefix}-keys");
    session(api, &s).await?;
    let key = format!("{s}-k1");
    let say =
        |content: &str| json!({"sessionId": s, "messageScope": "session", "content": content});
    let path = "/v1/commands/record-user-message";
    let first = api.post_keyed(path, PERSON, &say("hello"), &key).await?;
    first.expect(201, "record-user-message with a key")?;
    let again = api.post_keyed(path, PERSON, &say("hello"), &key).await?;
    check(
        again.status == 201 && again.replayed && again.body == first.body,
        || {
            format!(
                "the same command with the same key: expected the first answer again (201, \
                 Idempotent-Replayed: true, the same body {}), got {} replayed={} {}",
                first.body, again.status, again.replayed, again.body
            )
        },
    )?;
    let other = api.post_keyed(path, PERSON, &say("bye"), &key).await?;
    check(other.status == 422 && other.code() == "NRD-0211", || {
        format!(
            "the key with another body: expected 422 NRD-0211, got {} {}",
            other.status, other.body
        )
    })?;
    let own = json!({"sessionId": s, "messageScope": "session", "messageId": format!("{s}-m"), "content": "once"});
    api.post(path, PERSON, &own)
        .await?
        .expect(201, "a message naming its id")?;
    let repeat = api.post(path, PERSON, &own).await?;
    check(repeat.status == 201, || {
        format!(
            "the same message naming its id, sent again: expected 201 (a replay), got {} {}",
            repeat.status, repeat.body
        )
    })?;
    let h = history(api, &s).await?;
    let recorded: Vec<&Value> = h
        .iter()
        .filter(|e| e["type"] == "message.user.recorded")
        .collect();
    check(recorded.len() == 2, || {
        format!(
            "two messages recorded (the keyed one once, the named one once): {}",
            list(recorded)
        )
    })?;
    Ok(())
}

/// A stop is recorded for the run; an ended run cannot be stopped.
pub async fn stop(api: &Api, prefix: &str) -> Step {
    let s = format!("{prefix}-stop");
    session(api, &s).await?;
    let r = start_run(api, &s, "r1", "reject").await?;
    check(r["status"] == 201, || format!("start-run: {r}"))?;
    api.post(
        "/v1/commands/stop-run",
        PERSON,
        &json!({"sessionId": s, "runId": "r1", "reason": "enough"}),
    )
    .await?
    .expect(200, "stop-run")?;
    let h = history(api, &s).await?;
    check(
        h.iter()
            .any(|e| e["type"] == "run.stop.requested" && e["runId"] == "r1"),
        || "no run.stop.requested for r1 in history".to_owned(),
    )?;
    append(
        api,
        &s,
        vec![event(
            &format!("{s}-c"),
            "run.cancelled",
            "r1",
            json!({"code": "stopped"}),
        )],
    )
    .await?;
    let late = api
        .post(
            "/v1/commands/stop-run",
            PERSON,
            &json!({"sessionId": s, "runId": "r1"}),
        )
        .await?;
    check(
        late.status == 409 && late.code() == "NRD-0201" && late.body["rule"].is_string(),
        || {
            format!(
                "stopping an ended run: expected 409 NRD-0201 with a rule, got {} {}",
                late.status, late.body
            )
        },
    )?;
    Ok(())
}
