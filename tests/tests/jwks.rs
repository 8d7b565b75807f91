//! A key set fetched from a URL: used at start, fetched again when a token
//! names a key id it lacks (key rotation), and not more often than the
//! refetch interval; fetched again every refresh interval, so that a key
//! removed at the issuer stops working. A key set file: read again when it
//! changes or a token names a key id it lacks; a file that cannot be read
//! keeps the last good set.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::routing::get;
use jsonwebtoken::Header;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use narad_server::auth::{JwksSource, Role};
use narad_tests::*;

/// A key set server whose set can be replaced; counts its fetches.
struct KeyServer {
    url: String,
    keys: Arc<std::sync::Mutex<Vec<Jwk>>>,
    fetches: Arc<AtomicUsize>,
}

async fn key_server(keys: Vec<Jwk>) -> KeyServer {
    let keys = Arc::new(std::sync::Mutex::new(keys));
    let fetches = Arc::new(AtomicUsize::new(0));
    let (k, f) = (keys.clone(), fetches.clone());
    let app = axum::Router::new().route(
        "/jwks.json",
        get(move || {
            let (k, f) = (k.clone(), f.clone());
            async move {
                f.fetch_add(1, Ordering::SeqCst);
                axum::Json(JwkSet {
                    keys: k.lock().unwrap().clone(),
                })
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    KeyServer { url, keys, fetches }
}

fn signed(key: &TestKey, kid: &str) -> String {
    let mut header = Header::new(key.algorithm);
    header.kid = Some(kid.to_owned());
    sign(&header, &claims("acme", "svc", &[Role::Reader]), &key.key)
}

#[tokio::test]
async fn a_rotated_key_is_fetched_when_a_token_names_it() {
    let keys = test_keys();
    let ks = key_server(vec![public_jwk(&keys[0], "old")]).await;
    let mut auth = test_auth();
    auth.jwks = Some(JwksSource::parse(&ks.url).unwrap());
    auth.jwks_refetch_interval = Duration::ZERO;
    let s = Server::start_with(auth).await;
    assert_eq!(ks.fetches.load(Ordering::SeqCst), 1, "fetched at start");
    s.get("/v1/sessions", &signed(&keys[0], "old"))
        .await
        .expect(200);
    assert_eq!(
        ks.fetches.load(Ordering::SeqCst),
        1,
        "a known kid fetches nothing"
    );

    // The issuer rotates to a new key.
    *ks.keys.lock().unwrap() = vec![public_jwk(&keys[1], "new")];
    s.get("/v1/sessions", &signed(&keys[1], "new"))
        .await
        .expect(200);
    assert_eq!(ks.fetches.load(Ordering::SeqCst), 2);
    // The old key is gone from the set, and with it its tokens.
    let old = s.get("/v1/sessions", &signed(&keys[0], "old")).await;
    assert_eq!(old.status, 401);
    s.stop().await;
}

#[tokio::test]
async fn unknown_key_ids_do_not_fetch_more_often_than_the_interval() {
    let keys = test_keys();
    let ks = key_server(vec![public_jwk(&keys[0], "only")]).await;
    let mut auth = test_auth();
    auth.jwks = Some(JwksSource::parse(&ks.url).unwrap());
    auth.jwks_refetch_interval = Duration::from_secs(3600);
    let s = Server::start_with(auth).await;
    for n in 0..5 {
        let a = s
            .get("/v1/sessions", &signed(&keys[0], &format!("unknown-{n}")))
            .await;
        assert_eq!(a.status, 401);
    }
    assert_eq!(
        ks.fetches.load(Ordering::SeqCst),
        1,
        "only the fetch at start: the interval has not passed"
    );
    s.stop().await;
}

/// Scrapes `GET /v1/sessions` with `token` until it answers `status`, for
/// up to `seconds`.
async fn answers_within(s: &Server, token: &str, status: u16, seconds: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    loop {
        let a = s.get("/v1/sessions", token).await;
        if a.status == status {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not {status} within {seconds} s: {} {:#}",
            a.status,
            a.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_key_removed_from_a_url_stops_working_after_the_next_refresh() {
    let keys = test_keys();
    let ks = key_server(vec![
        public_jwk(&keys[0], "old"),
        public_jwk(&keys[1], "new"),
    ])
    .await;
    let mut auth = test_auth();
    auth.jwks = Some(JwksSource::parse(&ks.url).unwrap());
    auth.jwks_refetch_interval = Duration::from_secs(3600);
    auth.jwks_refresh_interval = Duration::from_secs(1);
    let s = Server::start_with(auth).await;
    let old = signed(&keys[0], "old");
    s.get("/v1/sessions", &old).await.expect(200);

    // The issuer withdraws a key; no token names an unknown key id.
    *ks.keys.lock().unwrap() = vec![public_jwk(&keys[1], "new")];
    answers_within(&s, &old, 401, 5).await;
    s.get("/v1/sessions", &signed(&keys[1], "new"))
        .await
        .expect(200);
    s.stop().await;
}

/// A key set file of its own for one test.
fn key_file(test: &str, keys: Vec<Jwk>) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "narad-tests-jwks-{test}-{}.json",
        std::process::id()
    ));
    write_keys(&path, keys);
    path
}

fn write_keys(path: &std::path::Path, keys: Vec<Jwk>) {
    std::fs::write(path, serde_json::to_vec(&JwkSet { keys }).unwrap()).unwrap();
}

#[tokio::test]
async fn a_changed_key_set_file_is_read_again_and_removed_keys_are_refused() {
    let keys = test_keys();
    let path = key_file("changed", vec![public_jwk(&keys[0], "old")]);
    let mut auth = test_auth();
    auth.jwks = Some(JwksSource::File(path.clone()));
    // Neither an unknown key id nor the refresh interval reads it again:
    // only the change of the file does.
    auth.jwks_refetch_interval = Duration::from_secs(3600);
    auth.jwks_refresh_interval = Duration::from_secs(3600);
    let s = Server::start_with(auth).await;
    let (old, new) = (signed(&keys[0], "old"), signed(&keys[1], "new"));
    s.get("/v1/sessions", &old).await.expect(200);
    assert_eq!(s.get("/v1/sessions", &new).await.status, 401);

    // The file is rotated in place.
    write_keys(&path, vec![public_jwk(&keys[1], "new")]);
    answers_within(&s, &new, 200, 5).await;
    assert_eq!(s.get("/v1/sessions", &old).await.status, 401);

    // And replaced by a rename (as a mounted secret is): read again too.
    let staged = path.with_extension("staged");
    write_keys(&staged, vec![public_jwk(&keys[0], "old")]);
    std::fs::rename(&staged, &path).unwrap();
    answers_within(&s, &old, 200, 5).await;
    assert_eq!(s.get("/v1/sessions", &new).await.status, 401);
    s.stop().await;
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_key_set_file_is_read_again_when_a_token_names_an_unknown_key_id() {
    let keys = test_keys();
    let path = key_file("unknown-kid", vec![public_jwk(&keys[0], "old")]);
    let mut auth = test_auth();
    auth.jwks = Some(JwksSource::File(path.clone()));
    auth.jwks_refetch_interval = Duration::ZERO;
    auth.jwks_refresh_interval = Duration::from_secs(3600);
    let s = Server::start_with(auth).await;
    write_keys(&path, vec![public_jwk(&keys[1], "new")]);
    // At once, without waiting for the file check.
    s.get("/v1/sessions", &signed(&keys[1], "new"))
        .await
        .expect(200);
    assert_eq!(
        s.get("/v1/sessions", &signed(&keys[0], "old")).await.status,
        401
    );
    s.stop().await;
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_key_set_file_that_cannot_be_read_keeps_the_last_good_set() {
    let keys = test_keys();
    let path = key_file("broken", vec![public_jwk(&keys[0], "old")]);
    let mut auth = test_auth();
    auth.jwks = Some(JwksSource::File(path.clone()));
    auth.jwks_refetch_interval = Duration::ZERO;
    auth.jwks_refresh_interval = Duration::from_secs(1);
    let s = Server::start_with(auth).await;
    let old = signed(&keys[0], "old");

    std::fs::write(&path, b"{ half a key set").unwrap();
    // Reads fail (the change, the refresh, an unknown key id): the last
    // good set stays in use.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        s.get("/v1/sessions", &signed(&keys[1], "new")).await.status,
        401
    );
    s.get("/v1/sessions", &old).await.expect(200);
    std::fs::remove_file(&path).unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    s.get("/v1/sessions", &old).await.expect(200);

    // Mended: read again.
    write_keys(&path, vec![public_jwk(&keys[1], "new")]);
    answers_within(&s, &old, 401, 5).await;
    s.get("/v1/sessions", &signed(&keys[1], "new"))
        .await
        .expect(200);
    s.stop().await;
    let _ = std::fs::remove_file(&path);
}

#[test]
fn key_set_urls_travel_over_https_or_stay_on_this_machine() {
    assert!(matches!(
        JwksSource::parse("https://issuer.example/.well-known/jwks.json"),
        Ok(JwksSource::Url(_))
    ));
    assert!(matches!(
        JwksSource::parse("http://127.0.0.1:9000/jwks.json"),
        Ok(JwksSource::Url(_))
    ));
    assert!(matches!(
        JwksSource::parse("http://localhost/jwks.json"),
        Ok(JwksSource::Url(_))
    ));
    let plain = JwksSource::parse("http://issuer.example/jwks.json").unwrap_err();
    assert!(plain.contains("https"), "{plain}");
    assert!(matches!(
        JwksSource::parse("/etc/narad/jwks.json"),
        Ok(JwksSource::File(_))
    ));
}
