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
use super::faults::{Fault, FaultProxy};
use super::journal::words;
use super::{Skip, Step, check};

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
    open_at(
        api,
        &api.base,
        &format!("/v1/sessions/{session}/stream{query}"),
        last_event_id,
    )
    .await
}

/// Opens the stream at `path` of `base` (the server's, or a proxy's).
async fn open_at(
    api: &Api,
    base: &str,
    path: &str,
    last_event_id: Option<&str>,
) -> Step<(u16, Option<Frames>, Value)> {
    let token = api.token(BACKEND).await?;
    let mut req = api
        .http()
        .get(format!("{base}{path}"))
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
            Err(_) => match out.last() {
                Some(e) => anyhow::bail!(
                    "the stream delivered up to sessionSequence {} of {upto} within {seconds} s",
                    words(&e["sessionSequence"])
                ),
                None => anyhow::bail!(
                    "the stream delivered no event within {seconds} s (waiting for \
                     sessionSequence {upto})"
                ),
            },
            Ok(None) => anyhow::bail!("the stream ended before sessionSequence {upto}"),
            Ok(Some(frame)) => frame?,
        };
        if frame.event == "replay-gap" || frame.data.contains("\"replay-gap\"") {
            return Err(Forgotten.into());
        }
        let Ok(data) = serde_json::from_str::<Value>(&frame.data) else {
            continue;
        };
        // §10.1: the frame id of an authority or watch event is its eventId.
        if let Some(id) = data["eventId"].as_str() {
            check(frame.id == id, || {
                format!(
                    "a frame's id `{}` is not its event's eventId `{id}` ({})",
                    frame.id,
                    words(&data["type"])
                )
            })?;
        }
        if data["sessionSequence"].is_u64() && data["eventId"].is_string() {
            out.push(data);
        }
    }
    Ok(out)
}

/// A tenant stream's replay began with (or met) a `replay-gap` frame: the
/// server forgot what the kit asked it to replay.
#[derive(Debug)]
struct Forgotten;

impl std::fmt::Display for Forgotten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the stream sent a replay-gap frame")
    }
}

impl std::error::Error for Forgotten {}

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
        format!("delivered {}, not 1..={last} once each", runs(&seqs(&got)))
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
                "resumed after {id} (sessionSequence {}): delivered {}, not {}",
                k + 1,
                runs(&seqs(&got)),
                runs(&seqs(&all[k + 1..]))
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

/// Events the slow-reader case appends, and the bytes of each one's
/// padding: 3,000 events of about 4 KiB, some 12 MiB, all for a reader
/// that reads none of it.
const SLOW_EVENTS: u64 = 3000;
const SLOW_PAD: usize = 4000;

/// A reader that reads nothing neither blocks the others nor is kept for
/// ever: while it stalls, a second reader of the session receives every
/// event; the stalled one's stream ends before the last (it was dropped),
/// having delivered an exact prefix, and resuming from its last id
/// delivers exactly the rest.
pub async fn slow_reader_dropped(api: &Api, prefix: &str) -> Step {
    let Some(upstream) = api.base.strip_prefix("http://") else {
        return Err(Skip("a slow reader is staged on http:// URLs only".into()).into());
    };
    let s = format!("{prefix}-slow");
    session_with_run(api, &s).await?;
    // The slow reader: its connection held by a proxy that reads nothing
    // and offers the server a receive window of 8 KiB.
    let proxy = FaultProxy::start_with(
        upstream.trim_end_matches('/').to_owned(),
        |_| Fault::Hold(0),
        Some(8 * 1024),
    )
    .await?;
    let path = format!("/v1/sessions/{s}/stream");
    let (base, token, http) = (
        proxy.url.clone(),
        api.token(BACKEND).await?,
        api.http().clone(),
    );
    // Its answer's head waits in the proxy too: it reads in the
    // background, from the moment the proxy lets go.
    let slow = tokio::spawn(async move {
        let res = http
            .get(format!("{base}{path}"))
            .bearer_auth(token)
            .header("accept", "text/event-stream")
            .send()
            .await
            .map_err(|e| format!("the slow reader's stream: {e}"))?;
        if res.status().as_u16() != 200 {
            return Err(format!(
                "the slow reader's stream answered {}",
                res.status()
            ));
        }
        let mut frames = res.bytes_stream().eventsource();
        let mut held: Vec<Value> = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(30), frames.next()).await {
                Err(_) => return Ok((held, false)),
                Ok(None | Some(Err(_))) => return Ok((held, true)),
                Ok(Some(Ok(frame))) => {
                    let Ok(data) = serde_json::from_str::<Value>(&frame.data) else {
                        continue;
                    };
                    if data["sessionSequence"].is_u64() && data["eventId"].is_string() {
                        held.push(data);
                    }
                }
            }
        }
    });
    // Attached before the appends begin.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, fast, body) = open(api, &s, "", None).await?;
    check(status == 200, || {
        format!("the stream answered {status} {body}")
    })?;
    let mut fast = fast.expect("200 has frames");
    let last = 1 + SLOW_EVENTS;
    // The reader beside it reads as the events come.
    let fast = tokio::spawn(async move { authority_until(&mut fast, last, 120).await });

    let pad = "x".repeat(SLOW_PAD);
    // Batches of about 40 KiB: under a 64 KiB body limit.
    let per_append = 10;
    let mut n = 0;
    while n < SLOW_EVENTS {
        let events: Vec<Value> = (n..n + per_append)
            .map(|i| {
                event(
                    &format!("{s}-e{i}"),
                    "tool.call.started",
                    "r",
                    json!({"toolCallId": format!("{s}-c{i}"), "toolName": "lookup",
                        "executor": "backend", "args": {"pad": pad}}),
                )
            })
            .collect();
        append(api, &s, events).await?;
        n += per_append;
    }
    let got = fast
        .await?
        .map_err(|e| anyhow::anyhow!("a reader beside the stalled one: {e:#}"))?;
    check(seqs(&got) == (1..=last).collect::<Vec<_>>(), || {
        "the reader beside the stalled one missed events".to_owned()
    })?;
    proxy.release();

    // The stalled reader: what it was sent before it was dropped.
    let (held, ended) = slow
        .await
        .map_err(|e| anyhow::anyhow!("the slow reader: {e}"))?
        .map_err(anyhow::Error::msg)?;
    let k = held.len() as u64;
    check(ended || k == last, || {
        format!(
            "the reader that read nothing was neither dropped nor served: it had {k} of {last} \
             events and its stream was still open 30 s later"
        )
    })?;
    check(k < last, || {
        format!(
            "the reader that read nothing was kept: the server held all {last} events (about \
             {} MiB) for it instead of dropping it",
            SLOW_EVENTS * SLOW_PAD as u64 / (1024 * 1024)
        )
    })?;
    check(seqs(&held) == (1..=k).collect::<Vec<_>>(), || {
        format!(
            "the dropped reader's events were not a prefix: {}…",
            runs(&seqs(&held)[..k.min(10) as usize])
        )
    })?;
    let from = held
        .last()
        .and_then(|e| e["eventId"].as_str())
        .map(str::to_owned);
    let (status, frames, body) = open(api, &s, "", from.as_deref()).await?;
    check(status == 200, || {
        format!("resuming the dropped reader: {status} {body}")
    })?;
    let rest = authority_until(&mut frames.expect("frames"), last, 60).await?;
    check(seqs(&rest) == (k + 1..=last).collect::<Vec<_>>(), || {
        format!(
            "resumed after sessionSequence {k}: not exactly {}..={last}",
            k + 1
        )
    })?;
    Ok(())
}

/// A replay whose start the stream forgot opens with one `replay-gap`
/// frame without an id naming `forgottenThrough`, then goes on live.
/// `retention` is how long the server keeps its tenant stream's replay.
pub async fn replay_gap(
    api: &Api,
    prefix: &str,
    retention: Option<Duration>,
    max_wait: Duration,
) -> Step {
    let Some(retention) = retention else {
        return Err(Skip(
            "give --stream-retention SECONDS (how long the server keeps GET /v1/events' replay) \
             to check replay-gap"
                .into(),
        )
        .into());
    };
    if retention > max_wait {
        return Err(Skip(format!(
            "the stream retention {} s is longer than --max-wait {} s",
            retention.as_secs(),
            max_wait.as_secs()
        ))
        .into());
    }
    let s = format!("{prefix}-gap");
    session(api, &s).await?;
    let first = format!("{s}-0");
    append(
        api,
        &s,
        vec![
            event(&first, "run.started", "r", json!({})),
            event(&format!("{s}-1"), "run.finished", "r", json!({})),
        ],
    )
    .await?;
    let path = format!("/v1/events?sessionId={s}");
    // Forgotten some time after the retention: look once a second.
    let deadline = tokio::time::Instant::now() + retention + max_wait;
    let (gap, mut frames) = loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (status, frames, body) = open_at(api, &api.base, &path, Some(&first)).await?;
        check(status == 200, || {
            format!("GET {path} after {first}: {status} {body}")
        })?;
        let mut frames = frames.expect("200 has frames");
        let mut opening = None;
        // The first frame after the capabilities, if any within a second.
        while let Ok(Some(frame)) =
            tokio::time::timeout(Duration::from_secs(1), frames.next()).await
        {
            let frame = frame?;
            if frame.event != "capabilities" {
                opening = Some(frame);
                break;
            }
        }
        if let Some(frame) =
            opening.filter(|f| f.event == "replay-gap" || f.data.contains("replay-gap"))
        {
            break (frame, frames);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{} s after the events were appended, a replay after the first of them still opens \
             without a replay-gap frame (retention {} s)",
            (retention + max_wait).as_secs(),
            retention.as_secs()
        );
    };
    let data: Value = serde_json::from_str(&gap.data).map_err(|e| {
        anyhow::anyhow!(
            "the replay-gap frame's data is not JSON ({e}): {}",
            gap.data
        )
    })?;
    check(gap.id.is_empty(), || {
        format!(
            "the replay-gap frame has an id (`{}`): it must move no cursor",
            gap.id
        )
    })?;
    check(
        data["type"] == "replay-gap" && data["forgottenThrough"].is_string(),
        || format!("a replay-gap frame names type replay-gap and forgottenThrough: {data}"),
    )?;
    // Then live: an event appended now arrives, with its id.
    let next = format!("{s}-2");
    append(api, &s, vec![event(&next, "run.started", "r2", json!({}))]).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let frame = match tokio::time::timeout_at(deadline, frames.next()).await {
            Ok(Some(frame)) => frame?,
            _ => anyhow::bail!(
                "after the replay-gap frame, an event appended was not delivered within 15 s"
            ),
        };
        let Ok(data) = serde_json::from_str::<Value>(&frame.data) else {
            continue;
        };
        if data["eventId"] == next.as_str() {
            check(frame.id == next, || {
                format!("the frame of {next} has id `{}`", frame.id)
            })?;
            return Ok(());
        }
    }
}

/// The tenant stream of one session: `GET /v1/events?sessionId=`.
fn tenant_path(session: &str) -> String {
    format!("/v1/events?sessionId={session}")
}

/// Opens the tenant stream of `session` after `last_event_id` (live from
/// now without one); fails unless it answers 200.
async fn open_tenant(api: &Api, session: &str, last_event_id: Option<&str>) -> Step<Frames> {
    let path = tenant_path(session);
    let (status, frames, body) = open_at(api, &api.base, &path, last_event_id).await?;
    check(status == 200, || {
        let after = last_event_id
            .map(|id| format!(" after {id}"))
            .unwrap_or_default();
        format!("GET {path}{after}: {status} {body}")
    })?;
    Ok(frames.expect("200 has frames"))
}

/// Waits for a live stream's opening `capabilities` frame: from then on it
/// carries what is appended.
async fn attached(frames: &mut Frames) -> Step {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        match tokio::time::timeout_at(deadline, frames.next()).await {
            Ok(Some(frame)) => {
                if frame?.event == "capabilities" {
                    return Ok(());
                }
            }
            Ok(None) => anyhow::bail!("the tenant stream ended before its capabilities frame"),
            Err(_) => anyhow::bail!("the tenant stream sent no capabilities frame within 15 s"),
        }
    }
}

/// A tenant stream's replay failing with [`Forgotten`] `since` the events
/// were appended: a failure when the server's retention (`--stream-retention`)
/// says it should still hold them, otherwise a skip that says why.
fn forgotten(
    why: anyhow::Error,
    since: tokio::time::Instant,
    retention: Option<Duration>,
) -> anyhow::Error {
    if why.downcast_ref::<Forgotten>().is_none() {
        return why;
    }
    let elapsed = since.elapsed();
    match retention {
        Some(kept) if elapsed < kept => anyhow::anyhow!(
            "a replay of events appended {} ms before began with a replay-gap frame, though the \
             stream keeps {} s",
            elapsed.as_millis(),
            kept.as_secs()
        ),
        _ => Skip(format!(
            "the tenant stream had forgotten events appended {} ms before (a replay-gap frame): \
             its retention is shorter than the case takes",
            elapsed.as_millis()
        ))
        .into(),
    }
}

/// The tenant stream (`GET /v1/events`) opened after an event while a
/// backend appends delivers every event after it once, in order, the
/// replayed and the live alike (§10.3).
pub async fn tenant_subscribe_before_replay(
    api: &Api,
    prefix: &str,
    retention: Option<Duration>,
) -> Step {
    let s = format!("{prefix}-tenant-live");
    session(api, &s).await?;
    // The first event, once the tenant stream carries it: resumable.
    let mut live = open_tenant(api, &s, None).await?;
    attached(&mut live).await?;
    let since = tokio::time::Instant::now();
    let first = format!("{s}-0");
    append(api, &s, vec![event(&first, "run.started", "r", json!({}))]).await?;
    authority_until(&mut live, 1, 15).await?;
    drop(live);
    let batches = 40u64;
    let appending = appending(api, &s, batches, Duration::ZERO, false).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut frames = open_tenant(api, &s, Some(&first)).await?;
    let last = 1 + batches * 2;
    let got = authority_until(&mut frames, last, 30)
        .await
        .map_err(|e| forgotten(e, since, retention))?;
    appended(appending).await?;
    check(seqs(&got) == (2..=last).collect::<Vec<_>>(), || {
        format!(
            "GET {} after {first}: delivered {}, not 2..={last} once each",
            tenant_path(&s),
            runs(&seqs(&got))
        )
    })?;
    Ok(())
}

/// Resuming the tenant stream from any authority event's id delivers
/// exactly the events after it; an id of no event is refused.
pub async fn tenant_resume_and_cursors(
    api: &Api,
    prefix: &str,
    retention: Option<Duration>,
) -> Step {
    let s = format!("{prefix}-tenant-resume");
    session(api, &s).await?;
    let mut live = open_tenant(api, &s, None).await?;
    attached(&mut live).await?;
    let since = tokio::time::Instant::now();
    let mut events = vec![event(&format!("{s}-0"), "run.started", "r", json!({}))];
    for i in 1..=4 {
        events.extend(tool_call(&format!("{s}-t{i}"), "r"));
    }
    events.push(event(&format!("{s}-9"), "run.finished", "r", json!({})));
    append(api, &s, events).await?;
    let last = 10;
    let all = authority_until(&mut live, last, 15).await?;
    drop(live);
    check(seqs(&all) == (1..=last).collect::<Vec<_>>(), || {
        format!(
            "the live tenant stream delivered {}, not 1..={last} once each",
            runs(&seqs(&all))
        )
    })?;
    for (k, from) in all.iter().enumerate().take(all.len() - 1) {
        let id = from["eventId"].as_str().unwrap_or_default();
        let mut frames = open_tenant(api, &s, Some(id)).await?;
        let got = authority_until(&mut frames, last, 15)
            .await
            .map_err(|e| forgotten(e, since, retention))?;
        check(seqs(&got) == seqs(&all[k + 1..]), || {
            format!(
                "GET {} resumed after {id} (sessionSequence {}): delivered {}, not {}",
                tenant_path(&s),
                k + 1,
                runs(&seqs(&got)),
                runs(&seqs(&all[k + 1..]))
            )
        })?;
    }
    let path = tenant_path(&s);
    let (status, _, body) = open_at(api, &api.base, &path, Some("no-such-event")).await?;
    check(status == 409 && body["code"] == "NRD-0303", || {
        format!(
            "GET {path} with a Last-Event-ID of no event: expected 409 NRD-0303, got {status} {body}"
        )
    })?;
    Ok(())
}

/// Sequences as a person reads them: `2..=5, 5, 6..=9`.
fn runs(seqs: &[u64]) -> String {
    if seqs.is_empty() {
        return "nothing".to_owned();
    }
    let mut parts: Vec<String> = Vec::new();
    let mut start = seqs[0];
    let mut prev = seqs[0];
    for &n in &seqs[1..] {
        if n == prev + 1 {
            prev = n;
            continue;
        }
        parts.push(span(start, prev));
        start = n;
        prev = n;
    }
    parts.push(span(start, prev));
    parts.join(", ")
}

fn span(a: u64, b: u64) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("{a}..={b}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream of authority frames at `seqs`, then silence.
    fn stalled(seqs: &[u64]) -> Frames {
        let frames: Vec<_> = seqs
            .iter()
            .map(|n| {
                Ok(eventsource_stream::Event {
                    event: "message".into(),
                    data: json!({"eventId": format!("e{n}"), "sessionSequence": n}).to_string(),
                    id: format!("e{n}"),
                    retry: None,
                })
            })
            .collect();
        futures::stream::iter(frames)
            .chain(futures::stream::pending())
            .boxed()
    }

    #[tokio::test]
    async fn a_stalled_stream_is_reported_in_words() {
        let why = authority_until(&mut stalled(&[1, 2, 3]), 5, 1)
            .await
            .unwrap_err();
        assert_eq!(
            why.to_string(),
            "the stream delivered up to sessionSequence 3 of 5 within 1 s"
        );
        let why = authority_until(&mut stalled(&[]), 5, 1).await.unwrap_err();
        assert_eq!(
            why.to_string(),
            "the stream delivered no event within 1 s (waiting for sessionSequence 5)"
        );
    }

    #[test]
    fn sequences_read_as_runs() {
        assert_eq!(runs(&[2, 4, 5, 6, 6, 7]), "2, 4..=6, 6..=7");
        assert_eq!(runs(&[]), "nothing");
    }
}
