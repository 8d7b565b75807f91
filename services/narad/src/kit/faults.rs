//! Faults between the kit and a server: a TCP proxy the kit runs, which
//! forwards each connection and breaks the server's side of it as a plan
//! says (cut mid-frame, reset, stalled, slowed). A case then checks that a
//! client resuming through it ends with what history holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What happens to one connection's answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Forwarded as it comes.
    None,
    /// Closed after this many bytes of the answer (mid-frame, mostly).
    Cut(usize),
    /// Reset (RST) after this many bytes.
    Reset(usize),
    /// Stalled for a while after this many bytes, then forwarded.
    Stall(usize, Duration),
    /// Every read of the answer held back this long.
    Delay(Duration),
    /// Nothing read of the answer after this many bytes until the proxy is
    /// released ([`FaultProxy::release`]): with the proxy's small receive
    /// buffer toward the server, the server meets a reader that reads
    /// nothing.
    Hold(usize),
}

/// How many connections met each kind of fault (counted when it struck:
/// a cut planned past the end of an answer is a clean connection).
#[derive(Debug, Default)]
pub struct Tally {
    /// Connections forwarded without a fault.
    pub clean: AtomicU64,
    /// Connections cut.
    pub cut: AtomicU64,
    /// Connections reset.
    pub reset: AtomicU64,
    /// Connections stalled.
    pub stalled: AtomicU64,
    /// Connections slowed.
    pub delayed: AtomicU64,
}

impl Tally {
    fn count(&self, fault: Fault) {
        let counter = match fault {
            Fault::None => &self.clean,
            Fault::Cut(_) => &self.cut,
            Fault::Reset(_) => &self.reset,
            Fault::Stall(..) => &self.stalled,
            Fault::Delay(_) | Fault::Hold(_) => &self.delayed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// `cut 3, reset 2, …` of the connections so far.
    pub fn describe(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "{} clean, {} cut, {} reset, {} stalled, {} slowed",
            n(&self.clean),
            n(&self.cut),
            n(&self.reset),
            n(&self.stalled),
            n(&self.delayed)
        )
    }
}

/// A running proxy.
pub struct FaultProxy {
    /// Its base URL (`http://127.0.0.1:PORT`), standing for the server's.
    pub url: String,
    /// What its connections met.
    pub tally: Arc<Tally>,
    /// Ends every [`Fault::Hold`].
    released: Arc<tokio::sync::watch::Sender<bool>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl FaultProxy {
    /// Forwards to `upstream` (`host:port`), the n-th connection (from 0)
    /// meeting `plan(n)`.
    pub async fn start(
        upstream: String,
        plan: impl Fn(u64) -> Fault + Send + Sync + 'static,
    ) -> anyhow::Result<FaultProxy> {
        FaultProxy::start_with(upstream, plan, None).await
    }

    /// As [`FaultProxy::start`], its sockets toward the server receiving
    /// into at most `receive_buffer` bytes when given (no autotuning: what
    /// the proxy does not read backs up into the server at once).
    pub async fn start_with(
        upstream: String,
        plan: impl Fn(u64) -> Fault + Send + Sync + 'static,
        receive_buffer: Option<u32>,
    ) -> anyhow::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let tally = Arc::new(Tally::default());
        let counted = tally.clone();
        let released = Arc::new(tokio::sync::watch::channel(false).0);
        let release = released.clone();
        let accepting = tokio::spawn(async move {
            let mut n = 0u64;
            while let Ok((client, _)) = listener.accept().await {
                let fault = plan(n);
                n += 1;
                let (upstream, tally) = (upstream.clone(), counted.clone());
                let released = release.subscribe();
                tokio::spawn(async move {
                    if let Ok(server) = connect(&upstream, receive_buffer).await {
                        // Counted when it strikes (a stalled connection
                        // the client gave up on may end long after), or
                        // as planned when the connection failed first.
                        let mut counted = false;
                        let struck = forward(client, server, fault, released, |f| {
                            counted = true;
                            tally.count(f);
                        })
                        .await;
                        if !counted {
                            tally.count(struck.unwrap_or(fault));
                        }
                    }
                });
            }
        });
        Ok(FaultProxy {
            url,
            tally,
            released,
            accepting,
        })
    }

    /// Lets every held connection go on.
    pub fn release(&self) {
        self.released.send_replace(true);
    }
}

/// A connection to `upstream` (`host:port`), receiving into at most
/// `receive_buffer` bytes when given.
async fn connect(upstream: &str, receive_buffer: Option<u32>) -> std::io::Result<TcpStream> {
    let Some(size) = receive_buffer else {
        return TcpStream::connect(upstream).await;
    };
    let mut last = std::io::Error::other(format!("{upstream} resolves to no address"));
    for addr in tokio::net::lookup_host(upstream).await? {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // Set before connecting, so that the window offered is small.
        socket.set_recv_buffer_size(size)?;
        match socket.connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Pipes one connection, breaking the answer as `fault` says: the fault
/// that struck ([`Fault::None`] when the answer ended before it), also
/// handed to `struck` the moment it strikes.
async fn forward(
    client: TcpStream,
    server: TcpStream,
    fault: Fault,
    mut released: tokio::sync::watch::Receiver<bool>,
    mut struck: impl FnMut(Fault),
) -> std::io::Result<Fault> {
    if let Fault::Reset(_) = fault {
        // Closed with SO_LINGER 0, the socket sends RST instead of FIN.
        client.set_zero_linger()?;
    }
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        let _ = server_write.shutdown().await;
    });
    let mut sent = 0usize;
    let mut buf = vec![0u8; 16 * 1024];
    let mut stalled = false;
    loop {
        let n = server_read.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        let mut chunk = &buf[..n];
        match fault {
            Fault::Cut(at) | Fault::Reset(at) if sent + chunk.len() >= at => {
                struck(fault);
                client_write.write_all(&chunk[..at - sent]).await?;
                // Both halves dropped: the client's socket closes (FIN, or
                // RST with the linger above), mid-answer.
                requests.abort();
                return Ok(fault);
            }
            Fault::Stall(at, pause) if !stalled && sent + chunk.len() >= at => {
                struck(fault);
                let head = at - sent;
                client_write.write_all(&chunk[..head]).await?;
                sent = at;
                chunk = &chunk[head..];
                stalled = true;
                tokio::time::sleep(pause).await;
            }
            Fault::Hold(at) if !stalled && sent + chunk.len() >= at => {
                struck(fault);
                let head = at - sent;
                client_write.write_all(&chunk[..head]).await?;
                sent = at;
                chunk = &chunk[head..];
                stalled = true;
                // Released, or the proxy gone: go on either way.
                let _ = released.wait_for(|r| *r).await;
            }
            Fault::Delay(each) => tokio::time::sleep(each).await,
            _ => {}
        }
        client_write.write_all(chunk).await?;
        sent += chunk.len();
    }
    let _ = client_write.shutdown().await;
    let _ = requests.await;
    let ended = match fault {
        Fault::Stall(..) | Fault::Hold(_) if stalled => return Ok(fault),
        Fault::Delay(_) => fault,
        _ => Fault::None,
    };
    struck(ended);
    Ok(ended)
}

/// The faults of the n-th connection of the resume case: every kind
/// first (so each is met), then clean ones; offsets and pauses drawn
/// from the seed. Offsets fall between 800 and 6,000 bytes: past the
/// answer's headers and its first frame, so that every broken connection
/// is resumed with a Last-Event-ID (a fault inside the headers resumes
/// nothing, and a server that mishandles resumes went unseen), and early
/// enough that the first three connections each reach theirs before the
/// case's stream (some 30 KB) is through.
fn plan_of(seed: u64) -> impl Fn(u64) -> Fault + Send + Sync + 'static {
    use rand::{Rng, SeedableRng};
    let rng = std::sync::Mutex::new(rand::rngs::StdRng::seed_from_u64(seed));
    move |n| {
        let mut rng = rng.lock().expect("not poisoned");
        let at = rng.random_range(800..6000);
        match n {
            0 | 3 | 7 => Fault::Cut(at),
            1 | 5 => Fault::Reset(at),
            2 | 6 => Fault::Stall(at, Duration::from_millis(rng.random_range(1500..2500))),
            4 => Fault::Delay(Duration::from_millis(15)),
            _ => Fault::None,
        }
    }
}

/// The faults of the client suite's streams: two connections in three
/// cut or reset somewhere in the first 600 bytes (a trace's stream is a
/// few KiB), the third clean, so that every trace is read to its end.
pub fn cuts(seed: u64) -> impl Fn(u64) -> Fault + Send + Sync + 'static {
    use rand::{Rng, SeedableRng};
    let rng = std::sync::Mutex::new(rand::rngs::StdRng::seed_from_u64(seed));
    move |n| {
        let at = rng.lock().expect("not poisoned").random_range(1..600);
        match n % 3 {
            0 => Fault::Cut(at),
            1 => Fault::Reset(at),
            _ => Fault::None,
        }
    }
}

/// Follows a session through the fault proxy while a backend appends to
/// it directly: every broken, reset or stalled connection is resumed with
/// `Last-Event-ID`, the id of the last frame received, as a browser's
/// EventSource does. Each frame's id must be its eventId, and a resumed
/// stream must go on exactly after it: an event delivered again, or one
/// skipped, fails the case with the event and the connection. At the end
/// the follower's events, history and what the backend appended (with
/// the sequences its answers gave) must agree; the first event where they
/// do not is named, with the side that is wrong.
pub async fn resume_through_faults(api: &super::api::Api, prefix: &str, seed: u64) -> super::Step {
    use futures::StreamExt;
    use serde_json::Value;

    use super::api::BACKEND;
    use super::commands::{appended, appending, event, history, session};
    use eventsource_stream::Eventsource;

    let Some(upstream) = api.base.strip_prefix("http://").map(str::to_owned) else {
        anyhow::bail!("faults are injected on http:// URLs only; run the kit against one");
    };
    let upstream = upstream.trim_end_matches('/').to_owned();
    let s = format!("{prefix}-faults");
    session(api, &s).await?;
    let mut sent = super::commands::append(
        api,
        &s,
        vec![event(
            &format!("{s}-0"),
            "run.started",
            "r",
            serde_json::json!({}),
        )],
    )
    .await?;
    let proxy = FaultProxy::start(upstream, plan_of(seed)).await?;

    let batches = 40u64;
    let total = 1 + batches * 2 + 1;
    let appending = appending(api, &s, batches, Duration::from_millis(25), true).await?;

    let token = api.token(BACKEND).await?;
    let mut held: Vec<Value> = Vec::new();
    let mut last_id: Option<String> = None;
    let mut connections = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while (held.len() as u64) < total {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "after 90 s and {connections} connections the follower holds {} of {total} events \
             (faults: {})",
            held.len(),
            proxy.tally.describe()
        );
        connections += 1;
        let mut req = api
            .http()
            .get(format!("{}/v1/sessions/{s}/stream", proxy.url))
            .bearer_auth(&token)
            .timeout(Duration::from_secs(60));
        if let Some(last) = &last_id {
            req = req.header("last-event-id", last);
        }
        let after = match &last_id {
            Some(id) => format!("resumed after {id} (sessionSequence {})", held.len()),
            None => "the first".to_owned(),
        };
        let Ok(res) = req.send().await else { continue };
        if res.status().as_u16() != 200 {
            anyhow::bail!(
                "connection {connections}, {after}, answered {}",
                res.status()
            );
        }
        let mut frames = res.bytes_stream().eventsource();
        // A stalled connection is given up after a second of silence.
        while let Ok(Some(Ok(frame))) =
            tokio::time::timeout(Duration::from_secs(1), frames.next()).await
        {
            let Ok(data) = serde_json::from_str::<Value>(&frame.data) else {
                continue;
            };
            let Some(seq) = data["sessionSequence"].as_u64() else {
                continue;
            };
            let id = data["eventId"].as_str().unwrap_or_default();
            anyhow::ensure!(
                frame.id == id,
                "on connection {connections} ({after}), the frame of {id} (sessionSequence \
                 {seq}) has {}: a frame's id is its event's eventId, and what a client resumes \
                 from (§10.1)",
                if frame.id.is_empty() {
                    "no id".to_owned()
                } else {
                    format!("id {}", frame.id)
                }
            );
            let next = held.len() as u64 + 1;
            anyhow::ensure!(
                seq >= next,
                "connection {connections} ({after}) delivered {id} (sessionSequence {seq}) \
                 again: a resumed stream goes on exactly after its Last-Event-ID"
            );
            anyhow::ensure!(
                seq == next,
                "connection {connections} ({after}) delivered {id} (sessionSequence {seq}) \
                 next: sessionSequence {} to {} are missing (a gap)",
                next,
                seq - 1
            );
            last_id = Some(frame.id.clone());
            held.push(data);
            if held.len() as u64 == total {
                break;
            }
        }
    }
    sent.extend(appended(appending).await?);
    let faulted = proxy.tally.cut.load(Ordering::Relaxed)
        + proxy.tally.reset.load(Ordering::Relaxed)
        + proxy.tally.stalled.load(Ordering::Relaxed);
    anyhow::ensure!(
        faulted >= 3,
        "the follower needed only {connections} connections: too few faults were met ({})",
        proxy.tally.describe()
    );
    let h = history(api, &s).await?;
    if let Some(why) = first_difference(&held, &h, &sent) {
        anyhow::bail!("{why} (faults: {}, seed {seed})", proxy.tally.describe());
    }
    Ok(())
}

/// Where the follower's events and history first differ, and which side
/// is wrong: the one that does not hold what the backend appended there
/// (`sent`: each event sent, with the sequences its answer gave).
fn first_difference(
    follower: &[serde_json::Value],
    history: &[serde_json::Value],
    sent: &[serde_json::Value],
) -> Option<String> {
    use super::journal::words;
    use serde_json::Value;

    // Whether `e` holds every member the backend sent and was answered.
    let as_sent = |e: Option<&Value>, s: Option<&Value>| match (e, s.and_then(Value::as_object)) {
        (Some(e), Some(s)) => s.iter().all(|(k, v)| e[k] == *v),
        _ => e.is_none() && s.is_none(),
    };
    let describe = |e: Option<&Value>| match e {
        Some(e) => format!("{} ({})", words(&e["eventId"]), words(&e["type"])),
        None => "nothing".to_owned(),
    };
    let n = follower.len().max(history.len());
    for k in 0..n {
        let (f, h, s) = (follower.get(k), history.get(k), sent.get(k));
        if f == h {
            continue;
        }
        let at = format!("at sessionSequence {}", k + 1);
        return Some(match (as_sent(f, s), as_sent(h, s)) {
            (false, true) => format!(
                "the stream is wrong {at}: the follower holds {}, where history holds {} as it \
                 was appended{}",
                describe(f),
                describe(h),
                member_difference((f, "the stream"), (h, "history"))
            ),
            (true, false) => format!(
                "history is wrong {at}: it holds {}, where the stream delivered {} as it was \
                 appended{}",
                describe(h),
                describe(f),
                member_difference((h, "history"), (f, "the stream"))
            ),
            _ => format!(
                "the stream and history differ {at}: the follower holds {}, history {}{}",
                describe(f),
                describe(h),
                member_difference((f, "the stream"), (h, "history"))
            ),
        });
    }
    None
}

/// `: its M is A in the stream, B in history`, for the first member two
/// versions of one event differ in, each given with where it was read.
fn member_difference(
    (wrong, here): (Option<&serde_json::Value>, &str),
    (right, there): (Option<&serde_json::Value>, &str),
) -> String {
    use super::journal::words;

    let (Some(w), Some(r)) = (wrong, right) else {
        return String::new();
    };
    if w["eventId"] != r["eventId"] {
        return String::new();
    }
    let mut members: Vec<&String> = w
        .as_object()
        .into_iter()
        .chain(r.as_object())
        .flat_map(|o| o.keys())
        .collect();
    members.sort();
    members.dedup();
    match members.into_iter().find(|m| w[m.as_str()] != r[m.as_str()]) {
        Some(m) => format!(
            ": its {m} is {} in {here}, {} in {there}",
            words(&w[m.as_str()]),
            words(&r[m.as_str()])
        ),
        None => String::new(),
    }
}
