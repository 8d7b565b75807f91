//! A key set fetched from a URL: used at start, fetched again when a token
//! names a key id it lacks (key rotation), and not more often than the
//! refetch interval.

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
