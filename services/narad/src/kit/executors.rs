//! Client executors (§11), through the HTTP form of the executor API: a
//! lease by attachment, heartbeats, a call handed out once with the
//! started call's name and arguments, a token that finishes once
//! (idempotently when repeated the same, refused when changed), and
//! tokens and leases nobody issued refused.

use std::time::Duration;

use serde_json::{Value, json};

use super::api::{Api, EXECUTOR, PERSON};
use super::commands::{append, event, history, session};
use super::{Skip, Step, check, list};

/// Session `s` with run r1 bound to executor `desk`.
async fn bound_run(api: &Api, s: &str, desk: &str) -> Step {
    session(api, s).await?;
    api.post(
        "/v1/commands/start-run",
        PERSON,
        &json!({"sessionId": s, "runId": "r1", "clientExecutorId": desk}),
    )
    .await?
    .expect(201, "start-run bound to the executor")?;
    Ok(())
}

/// Attaches `desk`: its lease.
async fn attach(api: &Api, desk: &str) -> Step<String> {
    let attached = api
        .post(
            &format!("/v1/executors/{desk}/attach"),
            EXECUTOR,
            &json!({}),
        )
        .await?;
    let attached = attached.expect(201, "attaching")?.clone();
    check(attached["type"] == "client.attached", || {
        format!("the attachment answers client.attached: {attached}")
    })?;
    let lease = attached["leaseId"].as_str().unwrap_or_default().to_owned();
    check(!lease.is_empty(), || format!("no leaseId in {attached}"))?;
    Ok(lease)
}

/// Starts client tool call `{s}-tc1` of r1 with `args`.
async fn start_call(api: &Api, s: &str, args: &Value) -> Step {
    append(
        api,
        s,
        vec![event(
            &format!("{s}-tc"),
            "tool.call.started",
            "r1",
            json!({
            "toolCallId": format!("{s}-tc1"), "toolName": "open.file", "executor": "client",
            "args": args}),
        )],
    )
    .await?;
    Ok(())
}

/// One call through its executor: attach, execute once, finish once.
pub async fn execute_and_finish_once(api: &Api, prefix: &str) -> Step {
    let s = format!("{prefix}-exec");
    let desk = format!("{prefix}-desk");
    bound_run(api, &s, &desk).await?;
    let lease = attach(api, &desk).await?;
    let args = json!({"path": "/tmp/report.txt", "lines": [1, 2, 3]});
    start_call(api, &s, &args).await?;
    let controls = |wait: u32| {
        let path = format!("/v1/executors/{desk}/controls?leaseId={lease}&waitMs={wait}");
        async move { api.get(&path, EXECUTOR).await }
    };
    let got = controls(10_000).await?;
    let got = got.expect(200, "polling for calls")?["controls"].clone();
    let execute = got
        .as_array()
        .and_then(|c| c.first())
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no call handed out within 10 s: {got}"))?;
    check(
        execute["type"] == "client.tool.execute"
            && execute["toolName"] == "open.file"
            && execute["args"] == args
            && execute["executionToken"].is_string()
            && execute["executionTokenExpiresAt"].is_string(),
        || {
            format!(
                "client.tool.execute with the started call's name and args, a token and its expiry: {execute}"
            )
        },
    )?;
    let again = controls(0).await?;
    check(
        again.expect(200, "polling again")?["controls"] == json!([]),
        || format!("a call is handed out once: {}", again.body),
    )?;
    let beat = json!({"type": "client.heartbeat", "protocolVersion": "narad/v1",
        "clientExecutorId": desk, "leaseId": lease});
    let renewed = api
        .post(&format!("/v1/executors/{desk}/heartbeat"), EXECUTOR, &beat)
        .await?;
    check(
        renewed.expect(200, "a heartbeat")?["leaseId"] == lease.as_str(),
        || format!("a heartbeat renews the lease: {}", renewed.body),
    )?;
    let finish = |token: &Value, response: Value| {
        json!({"type": "client.tool.finish", "protocolVersion": "narad/v1",
            "executionToken": token, "outcome": "success", "response": response,
            "clientExecutorId": desk, "leaseId": lease, "toolCallId": execute["toolCallId"]})
    };
    let token = execute["executionToken"].clone();
    let finish_path = format!("/v1/executors/{desk}/finish");
    api.post(
        &finish_path,
        EXECUTOR,
        &finish(&token, json!({"bytes": 42})),
    )
    .await?
    .expect(200, "the finish")?;
    // The same finish again: idempotent, no second terminal (§11.3.8).
    api.post(
        &finish_path,
        EXECUTOR,
        &finish(&token, json!({"bytes": 42})),
    )
    .await?
    .expect(200, "the same finish repeated")?;
    let changed = api
        .post(
            &finish_path,
            EXECUTOR,
            &finish(&token, json!({"bytes": 43})),
        )
        .await?;
    check(
        changed.status == 409 && changed.code() == "NRD-0404",
        || {
            format!(
                "the token finished again with another response: expected 409 NRD-0404, got {} {}",
                changed.status, changed.body
            )
        },
    )?;
    let forged = api
        .post(
            &finish_path,
            EXECUTOR,
            &finish(&json!("forged-token"), json!({})),
        )
        .await?;
    check(forged.status == 403 && forged.code() == "NRD-0402", || {
        format!(
            "a token nobody issued: expected 403 NRD-0402, got {} {}",
            forged.status, forged.body
        )
    })?;
    let stale = api
        .get(
            &format!("/v1/executors/{desk}/controls?leaseId=no-such-lease&waitMs=0"),
            EXECUTOR,
        )
        .await?;
    check(stale.status == 409 && stale.code() == "NRD-0401", || {
        format!(
            "a lease nobody issued: expected 409 NRD-0401, got {} {}",
            stale.status, stale.body
        )
    })?;
    let h = history(api, &s).await?;
    let finished: Vec<&Value> = h
        .iter()
        .filter(|e| e["type"] == "tool.call.finished")
        .collect();
    check(
        finished.len() == 1
            && finished[0]["outcome"] == "success"
            && finished[0]["response"] == json!({"bytes": 42}),
        || {
            format!(
                "one tool.call.finished equal to the accepted finish: {}",
                list(finished)
            )
        },
    )?;
    Ok(())
}

/// A new attachment supersedes the lease (§11.1): the old lease polls
/// nothing, yet finishes the token it was handed (§11.3.8), which the new
/// lease cannot claim.
pub async fn superseded_lease(api: &Api, prefix: &str) -> Step {
    let s = format!("{prefix}-lease");
    let desk = format!("{prefix}-desk2");
    bound_run(api, &s, &desk).await?;
    let first = attach(api, &desk).await?;
    start_call(api, &s, &json!({})).await?;
    let got = api
        .get(
            &format!("/v1/executors/{desk}/controls?leaseId={first}&waitMs=10000"),
            EXECUTOR,
        )
        .await?;
    let execute = got.expect(200, "polling for calls")?["controls"][0].clone();
    check(execute["type"] == "client.tool.execute", || {
        format!("no call handed out within 10 s: {}", got.body)
    })?;
    let second = attach(api, &desk).await?;
    check(second != first, || {
        "a new attachment gives a new lease".to_owned()
    })?;
    let old = api
        .get(
            &format!("/v1/executors/{desk}/controls?leaseId={first}&waitMs=0"),
            EXECUTOR,
        )
        .await?;
    check(old.status == 409 && old.code() == "NRD-0401", || {
        format!(
            "the superseded lease polling: expected 409 NRD-0401, got {} {}",
            old.status, old.body
        )
    })?;
    let finish = |lease: &str| {
        json!({"type": "client.tool.finish", "protocolVersion": "narad/v1",
            "executionToken": execute["executionToken"], "outcome": "success",
            "response": {"ok": true}, "clientExecutorId": desk, "leaseId": lease,
            "toolCallId": execute["toolCallId"]})
    };
    let path = format!("/v1/executors/{desk}/finish");
    let claimed = api.post(&path, EXECUTOR, &finish(&second)).await?;
    check(
        claimed.status == 409 && claimed.code() == "NRD-0401",
        || {
            format!(
                "the new lease claiming the old lease's token: expected 409 NRD-0401, got {} {}",
                claimed.status, claimed.body
            )
        },
    )?;
    api.post(&path, EXECUTOR, &finish(&first)).await?.expect(
        200,
        "the token finished under its originating, superseded lease",
    )?;
    let h = history(api, &s).await?;
    let finished = h
        .iter()
        .filter(|e| e["type"] == "tool.call.finished")
        .count();
    check(finished == 1, || {
        format!("one tool.call.finished, not {finished}")
    })?;
    Ok(())
}

/// The longest the lease of a new attachment lives, from the server's
/// capabilities (`heartbeat.leaseTtlMs`), unless it is longer than the
/// kit waits.
async fn lease_ttl(api: &Api, max_wait: Duration) -> Step<Duration> {
    let caps = api.get("/v1/capabilities", PERSON).await?;
    let caps = caps.expect(200, "GET /v1/capabilities")?;
    let Some(ms) = caps["heartbeat"]["leaseTtlMs"].as_u64() else {
        anyhow::bail!("the capabilities name no heartbeat.leaseTtlMs (§10.4): {caps}");
    };
    let ttl = Duration::from_millis(ms);
    if ttl > max_wait {
        return Err(Skip(format!(
            "the server's executor lease lives {ms} ms, longer than --max-wait {} s",
            max_wait.as_secs()
        ))
        .into());
    }
    Ok(ttl)
}

/// A lease without heartbeats lapses (§11.1, §11.2): it accepts no new
/// execution, and the missing heartbeats do not by themselves end the run;
/// a new attachment gets the call the lapsed lease was never handed.
pub async fn lease_lapse(api: &Api, prefix: &str, max_wait: Duration) -> Step {
    let ttl = lease_ttl(api, max_wait).await?;
    let s = format!("{prefix}-lapse");
    let desk = format!("{prefix}-desk3");
    bound_run(api, &s, &desk).await?;
    let lease = attach(api, &desk).await?;
    let poll = |lease: String| {
        let path = format!("/v1/executors/{desk}/controls?leaseId={lease}&waitMs=0");
        async move { api.get(&path, EXECUTOR).await }
    };
    poll(lease.clone())
        .await?
        .expect(200, "polling under a fresh lease")?;
    // No heartbeat: lapsed after its lifetime (and a sweep, at most).
    let deadline = tokio::time::Instant::now() + ttl + Duration::from_secs(10);
    tokio::time::sleep(ttl).await;
    loop {
        let polled = poll(lease.clone()).await?;
        if polled.status == 409 {
            check(polled.code() == "NRD-0401", || {
                format!(
                    "a lapsed lease: expected 409 NRD-0401, got 409 {}",
                    polled.body
                )
            })?;
            break;
        }
        polled.expect(200, "polling")?;
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "a lease without heartbeats still accepted polls {} s after its {} ms lifetime",
            (deadline - tokio::time::Instant::now() + Duration::from_secs(10)).as_secs(),
            ttl.as_millis()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    start_call(api, &s, &json!({"after": "lapse"})).await?;
    let lapsed = poll(lease.clone()).await?;
    check(lapsed.status == 409 && lapsed.code() == "NRD-0401", || {
        format!(
            "a lapsed lease is handed a new call: expected 409 NRD-0401, got {} {}",
            lapsed.status, lapsed.body
        )
    })?;
    let h = history(api, &s).await?;
    let ended: Vec<&Value> = h
        .iter()
        .filter(|e| {
            matches!(
                e["type"].as_str(),
                Some("run.finished" | "run.failed" | "run.cancelled")
            )
        })
        .collect();
    check(ended.is_empty(), || {
        format!("missing heartbeats ended the run (§11.2): {}", list(ended))
    })?;
    let again = attach(api, &desk).await?;
    let got = api
        .get(
            &format!("/v1/executors/{desk}/controls?leaseId={again}&waitMs=10000"),
            EXECUTOR,
        )
        .await?;
    let execute = got.expect(200, "polling under the new lease")?["controls"][0].clone();
    check(
        execute["type"] == "client.tool.execute" && execute["args"] == json!({"after": "lapse"}),
        || format!("the new lease is handed the call within 10 s: {}", got.body),
    )?;
    Ok(())
}

/// A token not finished by its `executionTokenExpiresAt` (§11.3.9): the
/// server closes the call `error` / `client_execution_expired`, once, and
/// refuses the token afterwards.
pub async fn token_expiry(api: &Api, prefix: &str, max_wait: Duration) -> Step {
    let ttl = lease_ttl(api, max_wait).await?;
    let s = format!("{prefix}-expiry");
    let desk = format!("{prefix}-desk4");
    bound_run(api, &s, &desk).await?;
    let lease = attach(api, &desk).await?;
    start_call(api, &s, &json!({})).await?;
    let got = api
        .get(
            &format!("/v1/executors/{desk}/controls?leaseId={lease}&waitMs=10000"),
            EXECUTOR,
        )
        .await?;
    let execute = got.expect(200, "polling for calls")?["controls"][0].clone();
    check(execute["type"] == "client.tool.execute", || {
        format!("no call handed out within 10 s: {}", got.body)
    })?;
    let expires = execute["executionTokenExpiresAt"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .ok_or_else(|| anyhow::anyhow!("no RFC 3339 executionTokenExpiresAt in {execute}"))?;
    let left = (expires.with_timezone(&chrono::Utc) - chrono::Utc::now())
        .to_std()
        .unwrap_or_default();
    if left > max_wait {
        return Err(Skip(format!(
            "the server's execution tokens live {} s, longer than --max-wait {} s",
            left.as_secs(),
            max_wait.as_secs()
        ))
        .into());
    }
    // The executor stays attached (heartbeats) but never finishes.
    let beat = json!({"type": "client.heartbeat", "protocolVersion": "narad/v1",
        "clientExecutorId": desk, "leaseId": lease});
    let deadline = tokio::time::Instant::now() + left + Duration::from_secs(10);
    let closed = loop {
        api.post(&format!("/v1/executors/{desk}/heartbeat"), EXECUTOR, &beat)
            .await?
            .expect(200, "a heartbeat")?;
        let h = history(api, &s).await?;
        if let Some(finished) = h.iter().find(|e| e["type"] == "tool.call.finished") {
            break finished.clone();
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the call was not closed within 10 s after its token expired"
        );
        tokio::time::sleep((ttl / 4).min(Duration::from_millis(500))).await;
    };
    check(
        closed["outcome"] == "error" && closed["code"] == "client_execution_expired",
        || format!("the expired call closes error / client_execution_expired: {closed}"),
    )?;
    check(
        chrono::Utc::now() >= expires.with_timezone(&chrono::Utc),
        || format!("the call was closed before its token expired ({expires}): {closed}"),
    )?;
    let late = api
        .post(
            &format!("/v1/executors/{desk}/finish"),
            EXECUTOR,
            &json!({"type": "client.tool.finish", "protocolVersion": "narad/v1",
                "executionToken": execute["executionToken"], "outcome": "success",
                "response": {}, "clientExecutorId": desk, "leaseId": lease,
                "toolCallId": execute["toolCallId"]}),
        )
        .await?;
    check(late.status == 410 || late.status == 409, || {
        format!(
            "a finish after expiry is refused (410 NRD-0403 or 409 NRD-0404), got {} {}",
            late.status, late.body
        )
    })?;
    let h = history(api, &s).await?;
    let n = h
        .iter()
        .filter(|e| e["type"] == "tool.call.finished")
        .count();
    check(n == 1, || format!("one tool.call.finished, not {n}"))?;
    Ok(())
}
