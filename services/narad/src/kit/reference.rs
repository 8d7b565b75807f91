//! `narad conformance reference-client`: the client side of the client
//! suite, built on narad's own reducer (`narad-protocol`, the one the Rust
//! SDK follows sessions with). For each trace the kit serves, it reads
//! the stream (resuming with `Last-Event-ID` when a connection breaks),
//! delivers each frame to a reducer that negotiated the trace's profiles,
//! and reports the reduced state, or the frame it refused and why.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use narad_protocol::reducer::Reducer;
use narad_protocol::{Classified, ProfileSet, Reader, WireObject};
use serde_json::{Value, json};

/// Options of `narad conformance reference-client`.
#[derive(clap::Args)]
pub struct ReferenceArgs {
    /// Apply authority events without deduplicating them first: a broken
    /// client, to show that the client suite catches one.
    #[arg(long, hide = true)]
    skip_dedup: bool,
}

/// `narad conformance reference-client` (run by `narad conformance
/// client`, which sets `NARAD_CONFORMANCE_URL`).
pub async fn reference_client(args: &ReferenceArgs) -> anyhow::Result<()> {
    let base = std::env::var("NARAD_CONFORMANCE_URL").map_err(|_| {
        anyhow::anyhow!("run me under narad conformance client (NARAD_CONFORMANCE_URL)")
    })?;
    let http = reqwest::Client::new();
    let listed: Value = http
        .get(format!("{base}/traces"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    for trace in listed["traces"].as_array().cloned().unwrap_or_default() {
        let profiles: Vec<String> = serde_json::from_value(trace["profiles"].clone())?;
        let (set, _) = ProfileSet::from_ids(profiles.iter().map(String::as_str));
        let mut reducer = Reducer::new(set);
        let stream_url = trace["stream"].as_str().unwrap_or_default().to_owned();
        let outcome = follow(&http, &stream_url, &mut reducer, args.skip_dedup).await?;
        let report = match outcome {
            None => json!({"state": reducer.to_json()}),
            Some((object, rule, message)) => json!({
                "rejected": {"object": object, "rule": rule, "message": message},
                "state": reducer.to_json(),
            }),
        };
        http.post(format!(
            "{base}{}",
            trace["report"].as_str().unwrap_or_default()
        ))
        .json(&report)
        .send()
        .await?
        .error_for_status()?;
    }
    Ok(())
}

/// Reads a trace's stream to its end into `reducer`, resuming after a
/// broken connection: the refused frame and why, if one was.
async fn follow(
    http: &reqwest::Client,
    url: &str,
    reducer: &mut Reducer,
    skip_dedup: bool,
) -> anyhow::Result<Option<(Value, String, String)>> {
    let mut last_id: Option<String> = None;
    for _ in 0..50 {
        let mut req = http.get(url).timeout(Duration::from_secs(30));
        if let Some(id) = &last_id {
            req = req.header("last-event-id", id);
        }
        let Ok(res) = req.send().await else { continue };
        let mut frames = res.bytes_stream().eventsource();
        let mut broke = false;
        while let Some(frame) = frames.next().await {
            let Ok(frame) = frame else {
                broke = true;
                break;
            };
            let value: Value = serde_json::from_str(&frame.data)
                .unwrap_or_else(|_| Value::String(frame.data.clone()));
            let step = if skip_dedup {
                apply_without_dedup(reducer, &value)
            } else {
                reducer.deliver_json(&value).map(|_| ())
            };
            if let Err(v) = step {
                return Ok(Some((value, v.rule.to_owned(), v.message)));
            }
            if !frame.id.is_empty() {
                last_id = Some(frame.id);
            }
        }
        if !broke {
            return Ok(None);
        }
    }
    anyhow::bail!("{url}: the stream broke 50 times")
}

/// The broken client: authority events applied as a journal applies
/// them, with no deduplication of what was delivered before.
fn apply_without_dedup(
    reducer: &mut Reducer,
    value: &Value,
) -> Result<(), narad_protocol::rules::Violation> {
    let text = value.to_string();
    if let Ok(Classified::Accepted(object)) = Reader::all_profiles().classify_str(&text)
        && let WireObject::Authority(event) = *object
    {
        return reducer.append(&event).map(|_| ());
    }
    reducer.deliver_json(value).map(|_| ())
}
