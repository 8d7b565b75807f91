//! `narad bench blobs`: a large blob up and down through `narad serve`
//! (Postgres chunks, or objects of an S3-compatible server with `--store
//! s3`), beside `cp` and `cat` of the same bytes on this machine (and,
//! with `--store s3`, beside a PUT and a GET of them straight to the S3
//! server), with the server's resident memory sampled while it streams.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

use crate::bench_stream::{ServerProcess, bench_token, scratch_on};

/// Options of `narad bench blobs`.
#[derive(clap::Args)]
pub struct BlobsBench {
    /// A Postgres server the bench may create scratch databases on
    /// (default: as the tests find one).
    #[arg(long, env = "NARAD_BENCH_SERVER_URL")]
    server_url: Option<String>,
    /// The blob's size, in MiB.
    #[arg(long, default_value_t = 100)]
    mib: u64,
    /// Where the server keeps the bytes: `postgres`, or `s3` (moto's
    /// S3-compatible server, started for the bench as the tests start it).
    #[arg(long, default_value = "postgres", value_parser = ["postgres", "s3"])]
    store: String,
}

/// `narad bench blobs`.
pub async fn blobs(args: &BlobsBench) -> anyhow::Result<()> {
    narad_server::auth::install_tls_provider();
    let size = args.mib * 1024 * 1024;
    let dir = std::env::temp_dir().join(format!("narad-bench-blobs-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let source = dir.join("blob.bin");
    let data: Vec<u8> = (0..size)
        .map(|i| (i % 251) as u8 ^ (i >> 20) as u8)
        .collect();
    std::fs::write(&source, &data)?;
    drop(data);

    // Baselines: the same bytes copied and read on this machine.
    let copy = dir.join("copy.bin");
    let cp = timed(|| Command::new("cp").arg(&source).arg(&copy).status())?;
    let cat = timed(|| {
        Command::new("sh")
            .arg("-c")
            .arg(format!("cat '{}' > /dev/null", copy.display()))
            .status()
    })?;

    let http = reqwest::Client::new();
    let mut env = vec![("NARAD_BLOB_MAX_BYTES".to_owned(), (size * 2).to_string())];
    let s3 = if args.store == "s3" {
        let s3 = narad_testkit::S3Server::start().await;
        s3.create_bucket("narad-bench").await;
        env.extend(s3.env());
        env.push((
            "NARAD_BLOB_STORE".to_owned(),
            "s3://narad-bench/blobs".to_owned(),
        ));
        Some(s3)
    } else {
        None
    };
    // The S3 server's own throughput: the file PUT and read back directly.
    let direct = match &s3 {
        Some(s3) => Some(direct_to_s3(s3, &source, size).await?),
        None => None,
    };
    let db = scratch_on(args.server_url.as_deref()).await?;
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let server = ServerProcess::start_with(db.url(), &env)?;
    let token = bench_token("bench")?;
    http.post(format!("{}/v1/sessions", server.base))
        .bearer_auth(&token)
        .json(&json!({"sessionId": "b"}))
        .send()
        .await?
        .error_for_status()?;
    let idle_kib = server.rss_kib();

    // The server's memory, sampled every 20 ms while it streams.
    let peak = Arc::new(AtomicU64::new(idle_kib));
    let sampling = Arc::new(AtomicBool::new(true));
    let pid_rss = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        let status = format!("/proc/{}/status", server.pid());
        std::thread::spawn(move || {
            while sampling.load(Ordering::Relaxed) {
                let kib = std::fs::read_to_string(&status)
                    .ok()
                    .and_then(|s| {
                        s.lines()
                            .find(|l| l.starts_with("VmRSS:"))
                            .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
                    })
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
                peak.fetch_max(kib, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    // Upload: the file streamed from disk, as curl --data-binary @file does.
    let file = tokio::fs::File::open(&source).await?;
    let body =
        reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(file, 64 * 1024));
    let started = Instant::now();
    let up: Value = http
        .post(format!("{}/v1/sessions/b/blobs?name=blob.bin", server.base))
        .bearer_auth(&token)
        .header("content-type", "application/octet-stream")
        .header("content-length", size)
        .body(body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let upload = started.elapsed();
    let upload_peak = peak.swap(idle_kib, Ordering::Relaxed);

    // Download, read as it comes.
    let started = Instant::now();
    let mut stream = http
        .get(format!(
            "{}{}",
            server.base,
            up["url"].as_str().unwrap_or_default()
        ))
        .bearer_auth(&token)
        .send()
        .await?
        .error_for_status()?
        .bytes_stream();
    let mut received = 0u64;
    while let Some(chunk) = stream.next().await {
        received += chunk?.len() as u64;
    }
    let download = started.elapsed();
    let download_peak = peak.load(Ordering::Relaxed);
    sampling.store(false, Ordering::Relaxed);
    let _ = pid_rss.join();
    anyhow::ensure!(received == size, "downloaded {received} of {size} bytes");
    drop(server);
    drop(s3);
    let _ = std::fs::remove_dir_all(&dir);

    let mibs = |d: Duration| args.mib as f64 / d.as_secs_f64();
    match args.store.as_str() {
        "s3" => println!(
            "blob of {} MiB (objects of 8 MiB in moto's S3-compatible server)",
            args.mib
        ),
        _ => println!("blob of {} MiB (Postgres chunks of 1 MiB)", args.mib),
    }
    println!("| what | time | MiB/s | ÷ baseline |");
    println!("|---|---|---|---|");
    println!(
        "| cp (baseline of upload) | {:.2} s | {:.0} | 1.00 |",
        cp.as_secs_f64(),
        mibs(cp)
    );
    println!(
        "| upload through narad | {:.2} s | {:.0} | {:.2} |",
        upload.as_secs_f64(),
        mibs(upload),
        upload.as_secs_f64() / cp.as_secs_f64()
    );
    println!(
        "| cat (baseline of download) | {:.2} s | {:.0} | 1.00 |",
        cat.as_secs_f64(),
        mibs(cat)
    );
    println!(
        "| download through narad | {:.2} s | {:.0} | {:.2} |",
        download.as_secs_f64(),
        mibs(download),
        download.as_secs_f64() / cat.as_secs_f64()
    );
    if let Some((put, get)) = direct {
        println!(
            "| PUT straight to the S3 server (its own upload) | {:.2} s | {:.0} | {:.2} |",
            put.as_secs_f64(),
            mibs(put),
            put.as_secs_f64() / cp.as_secs_f64()
        );
        println!(
            "| GET straight from the S3 server (its own download) | {:.2} s | {:.0} | {:.2} |",
            get.as_secs_f64(),
            mibs(get),
            get.as_secs_f64() / cat.as_secs_f64()
        );
    }
    println!(
        "server resident memory: {} MiB idle, {} MiB at most while uploading, {} MiB at most while downloading",
        idle_kib / 1024,
        upload_peak / 1024,
        download_peak / 1024
    );
    Ok(())
}

/// One PUT of the file straight to the S3 server and one GET of it back,
/// signed by the same S3 client library narad uses: how long each took.
async fn direct_to_s3(
    s3: &narad_testkit::S3Server,
    source: &std::path::Path,
    size: u64,
) -> anyhow::Result<(Duration, Duration)> {
    use object_store::ObjectStoreExt;
    let mut builder = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name("narad-bench")
        .with_allow_http(true);
    for (key, value) in s3.env() {
        builder = builder.with_config(key.to_ascii_lowercase().parse()?, value);
    }
    let store = builder.build()?;
    let path = object_store::path::Path::from("direct/blob.bin");
    let bytes = tokio::fs::read(source).await?;
    let started = Instant::now();
    store.put(&path, bytes.into()).await?;
    let put = started.elapsed();
    let started = Instant::now();
    let mut stream = store.get(&path).await?.into_stream();
    let mut received = 0u64;
    while let Some(chunk) = stream.next().await {
        received += chunk?.len() as u64;
    }
    let get = started.elapsed();
    anyhow::ensure!(received == size, "read back {received} of {size} bytes");
    store.delete(&path).await?;
    Ok((put, get))
}

/// How long `run` takes; its exit must be a success.
fn timed(
    run: impl FnOnce() -> std::io::Result<std::process::ExitStatus>,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let status = run()?;
    anyhow::ensure!(status.success(), "a baseline command failed: {status}");
    Ok(started.elapsed())
}
