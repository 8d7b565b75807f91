//! Live delivery (§10.1, §10.3): a stream opened while events are being
//! appended delivers every one, once, in order (subscribe before replay);
//! a stream resumed from any event's id delivers exactly the events after
//! it; cursors the server cannot honour are refused, not guessed at.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};

use super::api::{Api, BACKEND};
use super::commands::{append, appended, appending, event, session, session_with_run, tool_call};
use super::{Step, check};

/// An open session stream.
type Frames = std::pin::Pin<
    Box<
        dyn futures::Stream<
                Item = Result<
                    eventsource_stream::Event,
                    eventsource_stream::EventStreamError<reqwest::Error>,
                >,
            > + Send,
    >,
>;

/// Opens `session`'s stream with `query` and `last_event_id`: the
/// status, and the frames when it is 200.
async fn open(
    api: &Api,
    session: &str,
    query: &str,
    last_event_id: Option<&str>,
) -> Step<(u16, Option<Frames>, Value)> {
    let token = api.token(BACKEND).await?;
    let mut req = api
        .http()
        .get(format!("{}/v1/sessions/{session}/stream{query}", api.base))
        .bearer_auth(token)
        .header("accept", "text/event-stream");
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id);
    }
    let res = req.send().await?;
    let status = res.status().as_u16();
    if status != 200 {
        let body = res.json::<Value>().await.unwrap_or(Value::Null);
        return Ok((status, None, body));
    }
    Ok((
        status,
        Some(res.bytes_stream().eventsource().boxed()),
        Value::Null,
    ))
}

/// Reads authority events (frames whose data carries a sessionSequence)
/// until the one at `upto`, within `seconds`; every frame of an event
/// (authority or watch) must have its eventId as its id.
async fn authority_until(frames: &mut Frames, upto: u64, seconds: u64) -> Step<Vec<Value>> {
    let mut out: Vec<Value> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    while out.last().and_then(|e| e["sessionSequence"].as_u64()) < Some(upto) {
        let next = tokio::time::timeout_at(deadline, frames.next()).await;
        let frame = match next {
            Err(_) => anyhow::bail!(
                "the stream delivered up to {:?} of {upto} within {seconds} s",
                out.last().map(|e| &e["sessionSequence"])
            ),
            Ok(None) => anyhow::bail!("the stream ended before sessionSequence {upto}"),
            Ok(Some(frame)) => frame?,
        };
        let Ok(data) = serde_json::from_str::<Value>(&frame.data) else {
            continue;
        };
        // §10.1: the frame id of an authority or watch event is its eventId.
        if let Some(id) = data["eventId"].as_str() {
            check(frame.id == id, || {
                format!(
                    "a frame's id {:?} is not its event's eventId {id:?} ({})",
                    frame.id, data["type"]
                )
            })?;
        }
        if data["sessionSequence"].is_u64() && data["eventId"].is_string() {
            out.push(data);
        }
    }
    Ok(out)
}

/// The session sequences of `events`.
fn seqs(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| e["sessionSequence"].as_u64())
        .collect()
}

/// A stream opened while a backend appends delivers every event once, in
/// order, the replayed and the live alike.
pub async fn subscribe_before_replay(api: &Api, prefix: &str) -> Step {
    let s = format!("{prefix}-live");
    session_with_run(api, &s).await?;
    let batches = 40u64;
    let appending = appending(api, &s, batches, Duration::ZERO, false).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (status, frames, body) = open(api, &s, "", None).await?;
    check(status == 200, || {
        format!("the stream answered {status} {body}")
    })?;
    let mut frames = frames.expect("200 has frames");
    let last = 1 + batches * 2;
    let got = authority_until(&mut frames, last, 30).await?;
    appended(appending).await?;
    check(seqs(&got) == (1..=last).collect::<Vec<_>>(), || {
        format!("delivered {:?}, not 1..={last} once each", seqs(&got))
    })?;
    Ok(())
}

/// Resuming from any authority event's id delivers exactly the events
/// after it; cursors past the end or of no event are refused.
pub async fn resume_and_cursors(api: &Api, prefix: &str) -> Step {
    let s = format!("{prefix}-resume");
    session(api, &s).await?;
    let mut events = vec![event(&format!("{s}-0"), "run.started", "r", json!({}))];
    for i in 1..=4 {
        events.extend(tool_call(&format!("{s}-t{i}"), "r"));
    }
    events.push(event(&format!("{s}-9"), "run.finished", "r", json!({})));
    append(api, &s, events).await?;
    let last = 10;
    let (_, frames, _) = open(api, &s, "", None).await?;
    let all = authority_until(&mut frames.expect("frames"), last, 15).await?;
    for (k, from) in all.iter().enumerate() {
        let id = from["eventId"].as_str().unwrap_or_default();
        if k + 1 == all.len() {
            break;
        }
        let (status, frames, body) = open(api, &s, "", Some(id)).await?;
        check(status == 200, || {
            format!("resuming after {id}: {status} {body}")
        })?;
        let got = authority_until(&mut frames.expect("frames"), last, 15).await?;
        check(seqs(&got) == seqs(&all[k + 1..]), || {
            format!(
                "resumed after {id} (sessionSequence {}): delivered {:?}, not {:?}",
                k + 1,
                seqs(&got),
                seqs(&all[k + 1..])
            )
        })?;
    }
    let (status, _, body) = open(api, &s, "?afterSessionSequence=1000", None).await?;
    check(status == 409 && body["code"] == "NRD-0302", || {
        format!("a cursor past the end: expected 409 NRD-0302, got {status} {body}")
    })?;
    let (status, _, body) = open(api, &s, "", Some("no-such-event")).await?;
    check(status == 409 && body["code"] == "NRD-0303", || {
        format!("a Last-Event-ID of no event: expected 409 NRD-0303, got {status} {body}")
    })?;
    Ok(())
}
