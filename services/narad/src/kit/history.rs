//! History (§10.2): every cursor form pages through the same events, in
//! order, without gaps or repeats; cursors naming different positions are
//! refused.

use serde_json::{Value, json};

use super::api::{Api, BACKEND};
use super::commands::{append, event, session};
use super::{Step, check, list};

/// A session of two run journals' worth of events (a run with nested runs,
/// then a second top-level run), so that run-tree sequences differ from
/// session sequences.
async fn seeded(api: &Api, prefix: &str) -> Step<String> {
    let s = format!("{prefix}-history");
    session(api, &s).await?;
    let nested = |id: &str, ty: &str, run: &str| {
        let mut e = event(&format!("{s}-{id}"), ty, run, json!({}));
        e["rootRunId"] = json!("a");
        if run != "a" {
            e["parentRunId"] = json!("a");
        }
        e
    };
    append(
        api,
        &s,
        vec![
            nested("1", "run.started", "a"),
            nested("2", "run.started", "a1"),
            nested("3", "run.finished", "a1"),
            nested("4", "run.started", "a2"),
            nested("5", "run.finished", "a2"),
            nested("6", "run.finished", "a"),
            event(&format!("{s}-7"), "run.started", "b", json!({})),
            event(&format!("{s}-8"), "run.finished", "b", json!({})),
        ],
    )
    .await?;
    Ok(s)
}

/// Pages through `path` (a history URL without its cursor) with `limit`,
/// following the answers' next cursors named `cursor` / `next`.
async fn pages(api: &Api, path: &str, cursor: &str, next: &str, limit: u32) -> Step<Vec<Value>> {
    let mut out = Vec::new();
    let mut after = 0u64;
    for _ in 0..100 {
        let sep = if path.contains('?') { '&' } else { '?' };
        let page = api
            .get(
                &format!("{path}{sep}{cursor}={after}&limit={limit}"),
                BACKEND,
            )
            .await?;
        let page = page.expect(200, &format!("{path} after {after}"))?;
        let events = page["events"].as_array().cloned().unwrap_or_default();
        check(events.len() <= limit as usize, || {
            format!("a page of {} events for limit {limit}", events.len())
        })?;
        out.extend(events);
        match page[next].as_u64() {
            Some(n) => {
                check(n > after, || {
                    format!("the next cursor {n} does not move past {after}")
                })?;
                after = n;
            }
            None => return Ok(out),
        }
    }
    anyhow::bail!("{path}: more than 100 pages")
}

fn ids(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["eventId"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Session, run-tree and cursor pages read the same events.
pub async fn cursors(api: &Api, prefix: &str) -> Step {
    let s = seeded(api, prefix).await?;
    let base = format!("/v1/sessions/{s}/events");
    let whole = pages(
        api,
        &base,
        "afterSessionSequence",
        "nextSessionSequence",
        1000,
    )
    .await?;
    let seqs: Vec<u64> = whole
        .iter()
        .filter_map(|e| e["sessionSequence"].as_u64())
        .collect();
    check(seqs == (1..=8).collect::<Vec<_>>(), || {
        format!("sessionSequence 1..8 in order, got {}", list(&seqs))
    })?;
    for limit in [1, 3] {
        let paged = pages(
            api,
            &base,
            "afterSessionSequence",
            "nextSessionSequence",
            limit,
        )
        .await?;
        check(ids(&paged) == ids(&whole), || {
            format!(
                "pages of {limit} read {}, not {}",
                list(ids(&paged)),
                list(ids(&whole))
            )
        })?;
    }
    let tree_a: Vec<Value> = whole
        .iter()
        .filter(|e| e["rootRunId"] == "a")
        .cloned()
        .collect();
    let by_run = pages(
        api,
        &format!("{base}?rootRunId=a"),
        "afterSequence",
        "nextSequence",
        2,
    )
    .await?;
    check(ids(&by_run) == ids(&tree_a), || {
        format!(
            "run-tree a read {}, not {}",
            list(ids(&by_run)),
            list(ids(&tree_a))
        )
    })?;
    let run_seqs: Vec<u64> = by_run
        .iter()
        .filter_map(|e| e["sequence"].as_u64())
        .collect();
    check(run_seqs == (1..=6).collect::<Vec<_>>(), || {
        format!("run-tree sequences 1..6, got {}", list(&run_seqs))
    })?;
    let tree_b = pages(
        api,
        &format!("{base}?rootRunId=b"),
        "afterSequence",
        "nextSequence",
        1,
    )
    .await?;
    let b_seqs: Vec<(u64, u64)> = tree_b
        .iter()
        .filter_map(|e| Some((e["sequence"].as_u64()?, e["sessionSequence"].as_u64()?)))
        .collect();
    check(b_seqs == [(1, 7), (2, 8)], || {
        format!(
            "run-tree b: (sequence, sessionSequence) (1, 7), (2, 8), got {}",
            list(b_seqs.iter().map(|(a, b)| format!("({a}, {b})")))
        )
    })?;
    let after = api
        .get(&format!("{base}?afterSessionSequence=5"), BACKEND)
        .await?;
    let after = after.expect(200, "after sessionSequence 5")?["events"].clone();
    check(
        ids(after.as_array().map(Vec::as_slice).unwrap_or_default()) == ids(&whole[5..]),
        || format!("after 5: {after}"),
    )?;
    Ok(())
}

/// Cursors that name different positions are refused; agreeing ones are
/// read.
pub async fn cursor_conflicts(api: &Api, prefix: &str) -> Step {
    let s = seeded(api, &format!("{prefix}-c")).await?;
    let base = format!("/v1/sessions/{s}/events");
    // Run-tree a's sequence 2 is sessionSequence 2: agreeing.
    let agree = api
        .get(
            &format!("{base}?rootRunId=a&afterSequence=2&afterSessionSequence=2"),
            BACKEND,
        )
        .await?;
    agree.expect(200, "agreeing cursors")?;
    let conflict = api
        .get(
            &format!("{base}?rootRunId=a&afterSequence=2&afterSessionSequence=5"),
            BACKEND,
        )
        .await?;
    check(
        conflict.status == 400 && conflict.code() == "NRD-0301",
        || {
            format!(
                "cursors naming different positions: expected 400 NRD-0301, got {} {}",
                conflict.status, conflict.body
            )
        },
    )?;
    Ok(())
}
