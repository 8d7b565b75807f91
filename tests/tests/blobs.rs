//! Attachment and artifact bytes: an upload is streamed in chunks and
//! digested, a download answers with the session's authorization, ranges,
//! the digest as ETag and headers that keep a browser from running it;
//! limits refuse with nothing kept; erasure takes the bytes too. Every test
//! runs on both blob stores: Postgres, and a real S3-compatible server.

use narad_server::auth::Role;
use narad_server::quotas::{Limit, LimitValues};
use narad_server::runtime::RuntimeSettings;
use narad_tests::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// `text` percent-encoded for a query string.
fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Bytes that are not all alike (a chunk boundary shows in them).
fn bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8 ^ (i / 251) as u8).collect()
}

async fn upload(
    s: &Server,
    t: &str,
    session: &str,
    name: &str,
    media_type: &str,
    body: Vec<u8>,
) -> Answer {
    let res = s
        .http
        .post(format!(
            "{}/v1/sessions/{session}/blobs?name={}",
            s.base,
            percent(name)
        ))
        .bearer_auth(t)
        .header("content-type", media_type)
        .body(body)
        .send()
        .await
        .expect("answers");
    Answer::of(res).await
}

async fn download(s: &Server, t: &str, url: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = s.http.get(format!("{}{url}", s.base)).bearer_auth(t);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.expect("answers")
}

/// Runs each named test on both blob stores, as `NAME::postgres` and
/// `NAME::s3`.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn postgres() {
                super::$name(narad_tests::BlobBackend::Postgres).await
            }
            #[tokio::test]
            async fn s3() {
                super::$name(narad_tests::BlobBackend::S3).await
            }
        }
    )*};
}

on_both_stores!(
    a_blob_goes_up_in_chunks_and_comes_back_whole_in_parts_and_never_runs,
    blob_limits_refuse_with_nothing_kept,
    a_referenced_blob_is_followed_by_the_servers_ready_or_failed,
    a_person_uploads_an_attachment_and_sends_it_with_a_message,
    blobs_no_event_names_are_collected_and_named_ones_stay,
    a_resumable_upload_survives_a_broken_connection_and_resumes_where_it_stopped,
    an_attachment_named_during_its_upload_is_settled_when_it_completes_or_is_given_up,
);

async fn start(b: BlobBackend) -> Server {
    Server::start_with_blobs(b, RuntimeSettings::default(), LimitValues::default()).await
}

/// What `tenant`'s blobs hold: their rows, chunk rows and objects.
async fn held(s: &Server, tenant: &str) -> usize {
    blob_rows(s, tenant).await as usize + s.stored_objects(tenant).await
}

/// Waits until `tenant`'s blobs hold `expected` rows and objects (an
/// object store's objects go after the rows, by the sweeper).
async fn held_settles(s: &Server, tenant: &str, expected: usize) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let now = held(s, tenant).await;
        if now == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{tenant}'s blobs hold {now} rows and objects, not {expected}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

async fn blob_rows(s: &Server, tenant: &str) -> i64 {
    let (db, conn) = tokio_postgres::connect(s.db.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    db.query_one(
        "select (select count(*) from blobs where tenant_id = $1) \
              + (select count(*) from blob_chunks where tenant_id = $1)",
        &[&tenant],
    )
    .await
    .unwrap()
    .get(0)
}

async fn a_blob_goes_up_in_chunks_and_comes_back_whole_in_parts_and_never_runs(b: BlobBackend) {
    let s = start(b).await;
    let chunk = s.blob_chunk();
    let t = token(
        "acme",
        &[Role::Writer, Role::Reader, Role::Backend, Role::Admin],
    );
    open_session(&s, &t, "a").await;
    let data = bytes(3 * chunk + 4321);
    let up = upload(
        &s,
        &t,
        "a",
        "Q3 report – final.pdf",
        "application/pdf",
        data.clone(),
    )
    .await;
    let up = up.expect(201).clone();
    let id = up["blobId"].as_str().unwrap().to_owned();
    assert_eq!(up["uri"], format!("narad://blobs/{id}"));
    assert_eq!(up["sizeBytes"], data.len());
    assert_eq!(up["sha256"], hex::encode(Sha256::digest(&data)));
    assert_eq!(up["mediaType"], "application/pdf");
    assert_eq!(up["sessionId"], "a");
    let url = up["url"].as_str().unwrap().to_owned();

    // Whole, with the headers that keep it a download.
    let got = download(&s, &t, &url, &[]).await;
    assert_eq!(got.status(), 200);
    let h = got.headers().clone();
    assert_eq!(h["content-type"], "application/pdf");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert!(
        h["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("sandbox")
    );
    let disposition = h["content-disposition"].to_str().unwrap();
    assert!(disposition.starts_with("attachment;"), "{disposition}");
    assert!(
        disposition.contains("filename*=UTF-8''Q3%20report%20%E2%80%93%20final%2Epdf"),
        "{disposition}"
    );
    // The bytes are where the backend keeps them, and only there.
    let objects = s.stored_objects("acme").await;
    assert_eq!(objects, if b == BlobBackend::S3 { 4 } else { 0 });
    assert_eq!(blob_rows(&s, "acme").await as usize, 1 + 4 - objects);
    let etag = h["etag"].to_str().unwrap().to_owned();
    assert_eq!(etag, format!("\"{}\"", up["sha256"].as_str().unwrap()));
    assert_eq!(got.bytes().await.unwrap().to_vec(), data);

    // Ranges across chunk boundaries, a suffix, one past the end.
    for (first, last) in [(chunk - 5, chunk + 9), (chunk / 2, 2 * chunk + 1)] {
        let part = download(&s, &t, &url, &[("range", &format!("bytes={first}-{last}"))]).await;
        assert_eq!(part.status(), 206);
        assert_eq!(
            part.headers()["content-range"],
            format!("bytes {first}-{last}/{}", data.len()).as_str()
        );
        assert!(
            part.bytes().await.unwrap().to_vec() == data[first..=last],
            "bytes {first}-{last}"
        );
    }
    let tail = download(&s, &t, &url, &[("range", "bytes=-10")]).await;
    assert_eq!(tail.status(), 206);
    assert_eq!(
        tail.bytes().await.unwrap().to_vec(),
        data[data.len() - 10..]
    );
    let past = download(
        &s,
        &t,
        &url,
        &[("range", &format!("bytes={}-", data.len()))],
    )
    .await;
    assert_eq!(past.status(), 416);
    assert_eq!(
        past.headers()["content-range"],
        format!("bytes */{}", data.len()).as_str()
    );
    let past: Value = past.json().await.unwrap();
    assert_eq!(past["code"], "NRD-0010");
    // Not modified.
    let same = download(&s, &t, &url, &[("if-none-match", &etag)]).await;
    assert_eq!(same.status(), 304);

    // Raster images show in the page; SVG (scriptable) is a download.
    for (media, inline) in [
        ("image/png", true),
        ("image/svg+xml", false),
        ("text/html", false),
    ] {
        let up = upload(&s, &t, "a", "x", media, b"<svg onload=alert(1)>".to_vec()).await;
        let url = up.expect(201)["url"].as_str().unwrap().to_owned();
        let got = download(&s, &t, &url, &[]).await;
        let d = got.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(d.starts_with("inline;"), inline, "{media}: {d}");
        assert_eq!(got.headers()["x-content-type-options"], "nosniff");
    }

    // Another organisation's blob does not exist; a token limited to
    // another session may not read it.
    let globex = token("globex", &[Role::Reader]);
    assert_eq!(download(&s, &globex, &url, &[]).await.status(), 404);
    let limited = hs256(&{
        let mut c = claims("acme", "limited", &[Role::Reader]);
        c.sessions = Some(vec!["b".into()]);
        c
    });
    assert_eq!(download(&s, &limited, &url, &[]).await.status(), 403);

    // Bad input is named.
    let a = upload(&s, &t, "a", "a/b", "text/plain", b"x".to_vec()).await;
    assert_eq!(a.status, 400);
    assert!(a.body["fields"].get("name").is_some(), "{}", a.body);
    let a = upload(&s, &t, "a", "ok.txt", "not a type", b"x".to_vec()).await;
    assert_eq!(a.status, 400);
    assert!(a.body["fields"].get("Content-Type").is_some(), "{}", a.body);
    assert_eq!(
        upload(&s, &t, "nope", "x", "text/plain", b"x".to_vec())
            .await
            .status,
        404
    );

    // Erased with its session: the bytes too (an object store's by the
    // sweeper, right after).
    assert!(held(&s, "acme").await > 4);
    s.call(reqwest::Method::DELETE, "/v1/sessions/a", Some(&t), None)
        .await
        .expect(200);
    assert_eq!(download(&s, &t, &url, &[]).await.status(), 404);
    assert_eq!(blob_rows(&s, "acme").await, 0);
    held_settles(&s, "acme", 0).await;
    let gone = upload(&s, &t, "a", "x", "text/plain", b"x".to_vec()).await;
    assert_eq!(gone.status, 410, "{}", gone.body);
    s.stop().await;
}

async fn blob_limits_refuse_with_nothing_kept(b: BlobBackend) {
    let mib = 1024 * 1024;
    let s = Server::start_with_blobs(
        b,
        RuntimeSettings::default(),
        LimitValues::default()
            .with(Limit::BlobMaxBytes, Some(2 * mib as u64))
            .with(Limit::StoredBytes, Some(3 * mib as u64)),
    )
    .await;
    let t = token("acme", &[Role::Writer, Role::Reader, Role::Backend]);
    open_session(&s, &t, "a").await;
    let big = upload(
        &s,
        &t,
        "a",
        "big.bin",
        "application/octet-stream",
        bytes(2 * mib + 1),
    )
    .await;
    assert_eq!(big.status, 413, "{}", big.body);
    assert_eq!(big.body["code"], "NRD-0006");
    assert_eq!(big.body["details"]["limit"], "blobMaxBytes");
    held_settles(&s, "acme", 0).await;
    upload(
        &s,
        &t,
        "a",
        "one.bin",
        "application/octet-stream",
        bytes(2 * mib),
    )
    .await
    .expect(201);
    let full = upload(
        &s,
        &t,
        "a",
        "two.bin",
        "application/octet-stream",
        bytes(2 * mib),
    )
    .await;
    assert_eq!(full.status, 429, "{}", full.body);
    assert_eq!(full.body["code"], "NRD-0606");
    assert!(full.retry_after.is_some());
    // One blob: its row and its chunks.
    held_settles(&s, "acme", 1 + (2 * mib).div_ceil(s.blob_chunk())).await;
    // Another organisation has its own bytes.
    let g = token("globex", &[Role::Writer, Role::Reader, Role::Backend]);
    open_session(&s, &g, "g").await;
    upload(
        &s,
        &g,
        "g",
        "g.bin",
        "application/octet-stream",
        bytes(2 * mib),
    )
    .await
    .expect(201);
    s.stop().await;
}

/// The session's history, by type.
async fn typed(s: &Server, t: &str, session: &str, ty: &str) -> Vec<Value> {
    whole_history(s, t, session)
        .await
        .into_iter()
        .filter(|e| e["type"] == ty)
        .collect()
}

async fn a_referenced_blob_is_followed_by_the_servers_ready_or_failed(b: BlobBackend) {
    let s = start(b).await;
    let t = token("acme", &[Role::Writer, Role::Reader, Role::Backend]);
    open_session(&s, &t, "a").await;
    open_session(&s, &t, "b").await;
    let up = upload(&s, &t, "a", "chart.png", "image/png", bytes(5000)).await;
    let up = up.expect(201).clone();
    let uri = up["uri"].as_str().unwrap().to_owned();
    let sha = up["sha256"].as_str().unwrap().to_owned();

    // A backend adds it as an artifact of run r1 and as an attachment
    // with the wrong digest: ready for the one, failed for the other.
    let batch = json!({"events": [
        {"protocolVersion": "narad/v1", "type": "artifact.added", "eventId": "art-add",
         "rootRunId": "r1", "runId": "r1", "artifactId": "chart", "name": "chart.png",
         "mediaType": "image/png", "sizeBytes": 5000, "sha256": sha, "uri": uri},
        {"protocolVersion": "narad/v1", "type": "attachment.added", "eventId": "att-add",
         "attachmentId": "att-1", "name": "chart.png", "mediaType": "image/png",
         "sha256": "00".repeat(32), "uri": uri},
    ]});
    s.post("/v1/sessions/a/events", &t, &batch)
        .await
        .expect(201);
    // Sent again (a retry): the server's outcomes are not repeated.
    s.post("/v1/sessions/a/events", &t, &batch)
        .await
        .expect(200);
    let ready = typed(&s, &t, "a", "artifact.ready").await;
    assert_eq!(ready.len(), 1, "{ready:?}");
    assert_eq!(ready[0]["artifactId"], "chart");
    assert_eq!(ready[0]["uri"], uri);
    assert_eq!(ready[0]["runId"], "r1");
    let failed = typed(&s, &t, "a", "attachment.failed").await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["code"], "digest_mismatch");
    assert!(typed(&s, &t, "a", "attachment.ready").await.is_empty());

    // References the tenant does not hold for the session are refused,
    // with nothing written: another session's, another tenant's, none.
    let g = token("globex", &[Role::Writer, Role::Reader, Role::Backend]);
    open_session(&s, &g, "g").await;
    let theirs = upload(&s, &g, "g", "x.txt", "text/plain", b"x".to_vec()).await;
    let theirs = theirs.expect(201)["uri"].as_str().unwrap().to_owned();
    let before = whole_history(&s, &t, "b").await.len();
    for (i, reference) in [uri.clone(), theirs, "narad://blobs/nope".to_owned()]
        .into_iter()
        .enumerate()
    {
        let refused = s
            .post(
                "/v1/sessions/b/events",
                &t,
                &json!({"events": [{"protocolVersion": "narad/v1", "type": "attachment.added",
                    "eventId": format!("bad-{i}"), "attachmentId": format!("bad-{i}"),
                    "name": "x", "mediaType": "text/plain", "uri": reference}]}),
            )
            .await;
        assert_eq!(refused.status, 409, "{}", refused.body);
        assert_eq!(refused.body["code"], "NRD-0209");
        assert!(
            refused.body["fields"].get("/events/0/uri").is_some(),
            "{}",
            refused.body
        );
    }
    assert_eq!(whole_history(&s, &t, "b").await.len(), before);
    // Other references are the deployer's business, as before.
    s.post(
        "/v1/sessions/b/events",
        &t,
        &json!({"events": [{"protocolVersion": "narad/v1", "type": "attachment.added",
            "eventId": "ext", "attachmentId": "ext", "name": "x", "mediaType": "text/plain",
            "uri": "https://files.example.com/x"}]}),
    )
    .await
    .expect(201);
    s.stop().await;
}

async fn a_person_uploads_an_attachment_and_sends_it_with_a_message(b: BlobBackend) {
    let s = start(b).await;
    let t = token("acme", &[Role::Writer, Role::Reader, Role::Backend]);
    let person = token("acme", &[Role::Writer, Role::Reader]);
    s.post("/v1/sessions", &t, &json!({"sessionId": "a"}))
        .await
        .expect(201);
    let res = s
        .http
        .post(format!(
            "{}/v1/sessions/a/blobs?name=notes.txt&attachmentId=att-9",
            s.base
        ))
        .bearer_auth(&person)
        .header("content-type", "text/plain; charset=utf-8")
        .body("remember the milk")
        .send()
        .await
        .unwrap();
    let up = Answer::of(res).await;
    let up = up.expect(201).clone();
    assert_eq!(up["attachmentId"], "att-9");
    let added = typed(&s, &t, "a", "attachment.added").await;
    assert_eq!(added.len(), 1);
    assert_eq!(added[0]["uri"], up["uri"]);
    assert_eq!(added[0]["sha256"], up["sha256"]);
    assert_eq!(added[0]["sizeBytes"], 17);
    let ready = typed(&s, &t, "a", "attachment.ready").await;
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0]["attachmentId"], "att-9");
    s.post(
        "/v1/commands/record-user-message",
        &person,
        &json!({"sessionId": "a", "messageScope": "session", "content": "see attached",
                "attachmentIds": ["att-9"]}),
    )
    .await
    .expect(201);
    // The same attachmentId again: refused, and the second upload's bytes
    // are not kept.
    let again = s
        .http
        .post(format!(
            "{}/v1/sessions/a/blobs?name=n.txt&attachmentId=att-9",
            s.base
        ))
        .bearer_auth(&person)
        .body("again")
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 409);
    // One blob, one chunk.
    held_settles(&s, "acme", 2).await;
    // A backend may upload, but adds attachments by appending.
    let backend = token("acme", &[Role::Backend]);
    let res = s
        .http
        .post(format!(
            "{}/v1/sessions/a/blobs?name=n.txt&attachmentId=att-10",
            s.base
        ))
        .bearer_auth(&backend)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    s.stop().await;
}

async fn blobs_no_event_names_are_collected_and_named_ones_stay(b: BlobBackend) {
    let s = Server::start_with_blobs(
        b,
        RuntimeSettings {
            sweep_interval: std::time::Duration::from_millis(100),
            retention_sweep: std::time::Duration::from_millis(100),
            blob_unreferenced_after: std::time::Duration::from_secs(1),
            ..Default::default()
        },
        LimitValues::default(),
    )
    .await;
    let t = token("acme", &[Role::Writer, Role::Reader, Role::Backend]);
    open_session(&s, &t, "a").await;
    let unused = upload(
        &s,
        &t,
        "a",
        "unused.bin",
        "application/octet-stream",
        bytes(10),
    )
    .await;
    let unused = unused.expect(201)["url"].as_str().unwrap().to_owned();
    let used = upload(
        &s,
        &t,
        "a",
        "used.bin",
        "application/octet-stream",
        bytes(10),
    )
    .await;
    let used = used.expect(201).clone();
    s.append(
        &t,
        "a",
        &[
            json!({"protocolVersion": "narad/v1", "type": "attachment.added", "eventId": "u",
            "attachmentId": "u", "name": "used.bin", "mediaType": "application/octet-stream",
            "uri": used["uri"]}),
        ],
    )
    .await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    while download(&s, &t, &unused, &[]).await.status() != 404 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the unused blob is collected"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let url = used["url"].as_str().unwrap();
    assert_eq!(download(&s, &t, url, &[]).await.status(), 200);
    assert!(Scrape::of(&s).await.get("narad_blobs_collected_total") >= 1.0);
    // What stays: the named blob's row and its one chunk.
    held_settles(&s, "acme", 2).await;
    s.stop().await;
}

async fn a_resumable_upload_survives_a_broken_connection_and_resumes_where_it_stopped(
    b: BlobBackend,
) {
    use tokio::io::AsyncWriteExt;
    let s = start(b).await;
    let t = token("acme", &[Role::Writer, Role::Reader, Role::Backend]);
    open_session(&s, &t, "a").await;
    // Offsets in the blob's chunks: a partial chunk is topped up.
    let mib = s.blob_chunk();
    let data = bytes(3 * mib + 100);
    // Begin: the length announced, the first 1.5 MiB sent.
    let begun = s
        .http
        .post(format!("{}/v1/sessions/a/blobs?name=big.bin", s.base))
        .bearer_auth(&t)
        .header("upload-length", data.len())
        .body(data[..mib + mib / 2].to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(begun.status(), 202);
    let location = begun.headers()["location"].to_str().unwrap().to_owned();
    let begun: Value = begun.json().await.unwrap();
    assert_eq!(begun["uploadOffset"], mib + mib / 2);
    assert_eq!(begun["uploadLength"], data.len());
    assert_eq!(
        location,
        format!("/v1/blobs/{}", begun["blobId"].as_str().unwrap())
    );
    // Not readable until complete.
    assert_eq!(download(&s, &t, &location, &[]).await.status(), 404);
    let patch = |offset: usize, body: Vec<u8>| {
        s.http
            .patch(format!("{}{location}", s.base))
            .bearer_auth(&t)
            .header("upload-offset", offset)
            .body(body)
            .send()
    };
    // A wrong offset is refused with the right one.
    let wrong = patch(10, b"x".to_vec()).await.unwrap();
    assert_eq!(wrong.status(), 409);
    let wrong: Value = wrong.json().await.unwrap();
    assert_eq!(wrong["code"], "NRD-0011");
    assert_eq!(wrong["details"]["uploadOffset"], mib + mib / 2);
    // A connection that breaks mid-body: what arrived is kept.
    let at = mib + mib / 2;
    let addr = s.base.trim_start_matches("http://").to_owned();
    let mut raw = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "PATCH {location} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {t}\r\n\
         upload-offset: {at}\r\ncontent-length: {}\r\n\r\n",
        mib
    );
    raw.write_all(head.as_bytes()).await.unwrap();
    raw.write_all(&data[at..at + 300_000]).await.unwrap();
    raw.flush().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    drop(raw);
    let progress_url = format!("{}{location}/upload", s.base);
    let mut stored = 0;
    for _ in 0..50 {
        let p: Value = s
            .http
            .get(&progress_url)
            .bearer_auth(&t)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        stored = p["uploadOffset"].as_u64().unwrap() as usize;
        if stored > at {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(stored, at + 300_000, "the bytes before the break are kept");
    // Past the announced length: refused.
    let past = patch(stored, vec![0; data.len() - stored + 1])
        .await
        .unwrap();
    assert_eq!(past.status(), 413);
    // The rest, from where it stopped: the blob, digested whole.
    let done = patch(stored, data[stored..].to_vec()).await.unwrap();
    assert_eq!(done.status(), 200);
    let done: Value = done.json().await.unwrap();
    assert_eq!(done["sha256"], hex::encode(Sha256::digest(&data)));
    assert_eq!(done["sizeBytes"], data.len());
    let got = download(&s, &t, &location, &[]).await;
    assert_eq!(got.bytes().await.unwrap().to_vec(), data);
    // Complete: nothing more is taken.
    assert_eq!(
        patch(data.len(), b"x".to_vec()).await.unwrap().status(),
        409
    );
    s.stop().await;
}

#[tokio::test]
async fn an_object_store_outage_is_a_503_with_nothing_kept() {
    let s = start(BlobBackend::S3).await;
    let t = token("acme", &[Role::Writer, Role::Reader, Role::Backend]);
    open_session(&s, &t, "a").await;
    let up = upload(&s, &t, "a", "a.txt", "text/plain", b"before".to_vec()).await;
    let url = up.expect(201)["url"].as_str().unwrap().to_owned();
    s.kill_blob_store();
    let refused = upload(&s, &t, "a", "b.txt", "text/plain", b"during".to_vec()).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.body["code"], "NRD-0902");
    // Only the first blob's row: the refused upload left none.
    assert_eq!(blob_rows(&s, "acme").await, 1);
    let read = download(&s, &t, &url, &[]).await;
    assert_eq!(read.status(), 503);
    let read: Value = read.json().await.unwrap();
    assert_eq!(read["code"], "NRD-0902");
    s.stop().await;
}

#[tokio::test]
async fn a_ticket_reads_one_blob_from_a_plain_url() {
    let s = start(BlobBackend::Postgres).await;
    let t = token("acme", &[Role::Writer, Role::Reader, Role::Backend]);
    open_session(&s, &t, "a").await;
    let data = bytes(5000);
    let up = upload(&s, &t, "a", "chart.png", "image/png", data.clone()).await;
    let id = up.expect(201)["blobId"].as_str().unwrap().to_owned();
    let other = upload(&s, &t, "a", "other.png", "image/png", bytes(10)).await;
    let other = other.expect(201)["blobId"].as_str().unwrap().to_owned();
    let ticket = s
        .post(
            "/v1/stream-tickets",
            &t,
            &json!({"stream": "blob", "blobId": id}),
        )
        .await;
    let ticket = ticket.expect(201).clone();
    let url = ticket["url"].as_str().unwrap();
    assert_eq!(
        url,
        format!(
            "/v1/blobs/{id}?ticket={}",
            ticket["ticket"].as_str().unwrap()
        )
    );
    // No Authorization: the URL alone reads it, whole and in ranges.
    let plain = |path: String, range: Option<&'static str>| {
        let mut req = s.http.get(format!("{}{path}", s.base));
        if let Some(r) = range {
            req = req.header("range", r);
        }
        req.send()
    };
    let got = plain(url.to_owned(), None).await.unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap().to_vec(), data);
    let part = plain(url.to_owned(), Some("bytes=10-19")).await.unwrap();
    assert_eq!(part.status(), 206);
    assert_eq!(part.bytes().await.unwrap().to_vec(), data[10..20]);
    // Not another blob, not a stream, not without it.
    let t_only = ticket["ticket"].as_str().unwrap();
    for path in [
        format!("/v1/blobs/{other}?ticket={t_only}"),
        format!("/v1/sessions/a/stream?ticket={t_only}"),
        format!("/v1/blobs/{id}"),
    ] {
        assert_eq!(
            plain(path.clone(), None).await.unwrap().status(),
            401,
            "{path}"
        );
    }
    // A ticket only for a blob the token reaches.
    let limited = hs256(&{
        let mut c = claims("acme", "limited", &[Role::Reader]);
        c.sessions = Some(vec!["b".into()]);
        c
    });
    let refused = s
        .post(
            "/v1/stream-tickets",
            &limited,
            &json!({"stream": "blob", "blobId": id}),
        )
        .await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    let globex = token("globex", &[Role::Reader]);
    let missing = s
        .post(
            "/v1/stream-tickets",
            &globex,
            &json!({"stream": "blob", "blobId": id}),
        )
        .await;
    assert_eq!(missing.status, 404, "{}", missing.body);
    s.stop().await;
}

async fn an_attachment_named_during_its_upload_is_settled_when_it_completes_or_is_given_up(
    b: BlobBackend,
) {
    let s = Server::start_with_blobs(
        b,
        RuntimeSettings {
            sweep_interval: std::time::Duration::from_millis(100),
            retention_sweep: std::time::Duration::from_millis(100),
            blob_unreferenced_after: std::time::Duration::from_secs(2),
            ..Default::default()
        },
        LimitValues::default(),
    )
    .await;
    let t = token("acme", &[Role::Writer, Role::Reader, Role::Backend]);
    open_session(&s, &t, "a").await;
    let begin = |first: &'static [u8]| {
        s.http
            .post(format!("{}/v1/sessions/a/blobs?name=notes.txt", s.base))
            .bearer_auth(&t)
            .header("upload-length", 10)
            .body(first)
            .send()
    };
    let added = |id: &str, uri: &Value, sha: Option<String>| {
        let mut e = json!({"protocolVersion": "narad/v1", "type": "attachment.added",
            "eventId": format!("add-{id}"), "attachmentId": id, "name": "notes.txt",
            "mediaType": "text/plain", "uri": uri});
        if let Some(d) = sha {
            e["sha256"] = json!(d);
        }
        e
    };
    let data = b"0123456789";
    let up: Value = begin(&data[..4]).await.unwrap().json().await.unwrap();
    let (uri, url) = (up["uri"].clone(), up["url"].as_str().unwrap().to_owned());
    // Named while under way: accepted, no outcome yet.
    s.post(
        "/v1/sessions/a/events",
        &t,
        &json!({"events": [added("att-1", &uri, Some(hex::encode(Sha256::digest(data))))]}),
    )
    .await
    .expect(201);
    assert!(typed(&s, &t, "a", "attachment.ready").await.is_empty());
    // A ready naming bytes not there yet is refused.
    let early = s
        .post(
            "/v1/sessions/a/events",
            &t,
            &json!({"events": [{"protocolVersion": "narad/v1", "type": "attachment.ready",
                "eventId": "early", "attachmentId": "att-1", "uri": uri}]}),
        )
        .await;
    assert_eq!(
        (early.status, early.code()),
        (409, "NRD-0209"),
        "{}",
        early.body
    );
    // The rest arrives: the server's ready follows at once.
    let done = s
        .http
        .patch(format!("{}{url}", s.base))
        .bearer_auth(&t)
        .header("upload-offset", 4)
        .body(&data[4..])
        .send()
        .await
        .unwrap();
    assert_eq!(done.status(), 200);
    let ready = typed(&s, &t, "a", "attachment.ready").await;
    assert_eq!(ready.len(), 1, "{ready:?}");
    assert_eq!(ready[0]["attachmentId"], "att-1");
    assert_eq!(ready[0]["uri"], uri);

    // Another never finishes: given up after the collector's time, the
    // event that named it fails, and the upload is gone.
    let left: Value = begin(&data[..3]).await.unwrap().json().await.unwrap();
    let left_url = left["url"].as_str().unwrap().to_owned();
    s.post(
        "/v1/sessions/a/events",
        &t,
        &json!({"events": [added("att-2", &left["uri"], None)]}),
    )
    .await
    .expect(201);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    let failed = loop {
        let failed = typed(&s, &t, "a", "attachment.failed").await;
        if !failed.is_empty() {
            break failed;
        }
        assert!(tokio::time::Instant::now() < deadline, "att-2 never failed");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["attachmentId"], "att-2");
    assert_eq!(failed[0]["code"], "upload_incomplete");
    // The collector fails the events first, then deletes the upload (a
    // crash between the two loses no failure): gone right after.
    loop {
        let gone = s.get(&format!("{left_url}/upload"), &t).await;
        if gone.status == 404 {
            break;
        }
        assert_eq!(gone.status, 200, "{}", gone.body);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the abandoned upload stayed: {}",
            gone.body
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The completed one stays.
    assert_eq!(download(&s, &t, &url, &[]).await.status(), 200);
    s.stop().await;
}

/// Uploads are in the audit log like every other write: whole ones (with
/// the `attachment.added` an `attachmentId` appends), refused ones, and
/// each part of a resumable one.
#[tokio::test]
async fn uploads_are_audited_with_what_they_appended() {
    let s = start(BlobBackend::Postgres).await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "a").await;
    upload(&s, &t, "a", "plain.txt", "text/plain", b"plain".to_vec())
        .await
        .expect(201);
    let attached = s
        .http
        .post(format!(
            "{}/v1/sessions/a/blobs?name=pic.png&attachmentId=att-1",
            s.base
        ))
        .bearer_auth(&t)
        .header("content-type", "image/png")
        .header("x-request-id", "req-upload-1")
        .body(b"png".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(attached.status(), 201);
    let history = whole_history(&s, &t, "a").await;
    let added = history
        .iter()
        .find(|e| e["type"] == "attachment.added")
        .expect("the attachment was added")["eventId"]
        .clone();
    // Refused: no such session.
    let refused = upload(&s, &t, "nope", "x.txt", "text/plain", b"x".to_vec()).await;
    assert_eq!(refused.status, 404);
    // A resumable upload: begun, then finished by a PATCH.
    let begun = s
        .http
        .post(format!("{}/v1/sessions/a/blobs?name=r.bin", s.base))
        .bearer_auth(&t)
        .header("upload-length", 6)
        .body(b"abc".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(begun.status(), 202);
    let location = begun.headers()["location"].to_str().unwrap().to_owned();
    let finished = s
        .http
        .patch(format!("{}{location}", s.base))
        .bearer_auth(&t)
        .header("upload-offset", 3)
        .body(b"def".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(finished.status(), 200);

    let log = s.get("/v1/audit?limit=100", &t).await;
    let entries: Vec<&Value> = log.expect(200)["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["action"].as_str().unwrap().ends_with("upload-blob") || e["action"] == "resume-upload"
        })
        .collect();
    let summary: Vec<(String, Option<String>, u64)> = entries
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_owned(),
                e["sessionId"].as_str().map(str::to_owned),
                e["status"].as_u64().unwrap(),
            )
        })
        .collect();
    let some = |s: &str| Some(s.to_owned());
    assert_eq!(
        summary,
        [
            ("upload-blob".to_owned(), some("a"), 201),
            ("upload-blob".to_owned(), some("a"), 201),
            ("upload-blob".to_owned(), some("nope"), 404),
            ("upload-blob".to_owned(), some("a"), 202),
            ("resume-upload".to_owned(), some("a"), 200),
        ],
        "{entries:#?}"
    );
    assert_eq!(entries[1]["eventIds"], json!([added]));
    assert_eq!(entries[1]["requestId"], "req-upload-1");
    assert_eq!(entries[1]["actor"]["sub"], "tester");
    assert_eq!(entries[2]["code"], "NRD-0007");
    s.stop().await;
}

/// A download reads its query like every route: a malformed ticket or an
/// unknown parameter is refused (400 NRD-0008), not passed over.
#[tokio::test]
async fn a_download_reads_its_query() {
    let s = start(BlobBackend::Postgres).await;
    let t = token("acme", &Role::ALL);
    open_session(&s, &t, "a").await;
    let blob = upload(&s, &t, "a", "x.txt", "text/plain", b"x".to_vec())
        .await
        .expect(201)
        .clone();
    let url = format!("/v1/blobs/{}", blob["blobId"].as_str().unwrap());
    assert_eq!(download(&s, &t, &url, &[]).await.status(), 200);
    for query in ["?ticket=%00", "?tikcet=nst_x"] {
        let refused = Answer::of(download(&s, &t, &format!("{url}{query}"), &[]).await).await;
        assert_eq!(
            (refused.status, refused.code()),
            (400, "NRD-0008"),
            "{query}"
        );
    }
    s.stop().await;
}
