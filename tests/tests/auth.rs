//! Access control end to end: every way a token can fail, roles, tenants.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use narad_server::auth::Role;
use narad_tests::*;
use serde_json::json;

const READ: &str = "/v1/sessions";

async fn refused(server: &Server, token: &str, why: &str) {
    let a = server.get(READ, token).await;
    assert_eq!(a.status, 401, "{why}: {:#}", a.body);
    assert_eq!(a.code(), "NRD-0101", "{why}");
    assert!(
        a.request_id.is_some(),
        "{why}: every answer carries x-request-id"
    );
}

#[tokio::test]
async fn tokens_that_must_not_pass_are_refused() {
    let server = Server::start().await;
    let good = claims("acme", "alice", &[Role::Reader]);
    server.get(READ, &hs256(&good)).await.expect(200);

    let missing = server.call(reqwest::Method::GET, READ, None, None).await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.code(), "NRD-0101");

    let mut expired = good.clone();
    expired.exp = good.iat.unwrap() - 3600;
    refused(&server, &hs256(&expired), "expired").await;

    let mut early = good.clone();
    early.nbf = Some(good.iat.unwrap() + 3600);
    refused(&server, &hs256(&early), "not valid yet").await;

    let mut issuer = good.clone();
    issuer.iss = "https://someone-else.test".to_owned();
    refused(&server, &hs256(&issuer), "wrong issuer").await;

    let mut audience = good.clone();
    audience.aud = narad_server::auth::Audience::One("another-service".to_owned());
    refused(&server, &hs256(&audience), "wrong audience").await;

    let wrong_secret = sign(
        &Header::new(Algorithm::HS256),
        &good,
        &EncodingKey::from_secret(b"another-secret-that-is-also-32-bytes-long").unwrap(),
    );
    refused(&server, &wrong_secret, "bad signature").await;

    // A token whose payload was changed after signing.
    let honest = hs256(&good);
    let parts: Vec<&str> = honest.split('.').collect();
    let mut admin = good.clone();
    admin.roles = vec!["admin".to_owned(), "reader".to_owned()];
    let forged_payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&admin).unwrap());
    refused(
        &server,
        &format!("{}.{}.{}", parts[0], forged_payload, parts[2]),
        "tampered payload",
    )
    .await;

    // alg: none, with and without a signature part.
    let none_header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&good).unwrap());
    refused(&server, &format!("{none_header}.{payload}."), "alg none").await;
    refused(
        &server,
        &format!("{none_header}.{payload}"),
        "alg none, two parts",
    )
    .await;

    // Algorithm confusion: an HS256 token whose secret is the RSA public key.
    let public_pem = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/keys/rsa.pub.pem"),
    )
    .unwrap();
    let mut confused = Header::new(Algorithm::HS256);
    confused.kid = Some("rsa-1".to_owned());
    refused(
        &server,
        &sign(
            &confused,
            &good,
            &EncodingKey::from_secret(&public_pem).unwrap(),
        ),
        "HS256 signed with the RSA public key",
    )
    .await;

    let mut no_org = good.clone();
    no_org.org = String::new();
    refused(&server, &hs256(&no_org), "no org").await;

    let mut no_sub = good.clone();
    no_sub.sub = String::new();
    refused(&server, &hs256(&no_sub), "no sub").await;

    refused(&server, "not-a-jwt", "garbage").await;
    let basic = server
        .http
        .get(format!("{}{READ}", server.base))
        .header("authorization", "Basic YWxpY2U6c2VjcmV0")
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), 401, "basic auth is not a bearer token");
    server.stop().await;
}

#[tokio::test]
async fn key_set_tokens_pass_with_their_own_algorithm_only() {
    let server = Server::start().await;
    let good = claims("acme", "svc", &[Role::Reader]);
    for key in test_keys() {
        let mut header = Header::new(key.algorithm);
        header.kid = Some(key.kid.to_owned());
        let token = sign(&header, &good, &key.key);
        server.get(READ, &token).await.expect(200);

        // The same key under a kid the server does not know.
        header.kid = Some("unknown-kid".to_owned());
        refused(&server, &sign(&header, &good, &key.key), "unknown kid").await;
    }
    // An RSA key claiming to be another key id of another algorithm.
    let keys = test_keys();
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("ec-1".to_owned());
    refused(
        &server,
        &sign(&header, &good, &keys[0].key),
        "kid of an EC key",
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn roles_grant_permissions_and_other_tenants_objects_are_not_found() {
    let server = Server::start().await;
    let writer = token("acme", &[Role::Writer]);
    let reader = token("acme", &[Role::Reader]);
    let other = token("globex", &[Role::Reader, Role::Writer, Role::Backend]);

    server
        .post("/v1/sessions", &writer, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    // Reading needs reader (or backend); writing needs writer.
    server.get("/v1/sessions/s1", &writer).await.expect(403);
    assert_eq!(
        server.get("/v1/sessions/s1", &writer).await.code(),
        "NRD-0102"
    );
    server.get("/v1/sessions/s1", &reader).await.expect(200);
    let forbidden = server
        .post("/v1/sessions", &reader, &json!({"sessionId": "s2"}))
        .await;
    forbidden.expect(403);
    assert!(
        forbidden.body["message"]
            .as_str()
            .unwrap()
            .contains("writer"),
        "{:#}",
        forbidden.body
    );
    // Appending needs backend; resolving needs approver.
    server
        .post("/v1/sessions/s1/events", &writer, &json!({"events": []}))
        .await
        .expect(403);
    server
        .post(
            "/v1/commands/resolve-interrupt",
            &writer,
            &json!({"interruptId": "i1", "decision": "approve"}),
        )
        .await
        .expect(403);
    // A token without roles may do nothing.
    server.get(READ, &token("acme", &[])).await.expect(403);

    // Another tenant: the session does not exist for it, whatever it tries.
    let theirs = server.get("/v1/sessions/s1", &other).await;
    theirs.expect(404);
    assert_eq!(theirs.code(), "NRD-0007");
    server
        .get("/v1/sessions/s1/events", &other)
        .await
        .expect(404);
    server
        .get("/v1/capabilities?sessionId=s1", &other)
        .await
        .expect(404);
    server
        .post(
            "/v1/commands/start-run",
            &other,
            &json!({"sessionId": "s1", "runId": "r1"}),
        )
        .await
        .expect(404);
    let listed = server.get("/v1/sessions", &other).await;
    assert_eq!(listed.expect(200)["sessions"], json!([]));
    // And the same id is free for them.
    server
        .post("/v1/sessions", &other, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    server.stop().await;
}

/// A stream ends when its token stops being accepted: `exp` plus the
/// leeway the verifier grants a new request, counted once. Here the token
/// is past its `exp` and inside the leeway for about 3 s more.
#[tokio::test]
async fn a_stream_ends_when_its_token_stops_being_accepted() {
    let server = Server::start().await;
    open_session(&server, &token("acme", &Role::ALL), "s1").await;
    let mut late = claims("acme", "alice", &[Role::Reader]);
    late.exp = late.iat.unwrap() + 3 - narad_server::auth::LEEWAY_SECONDS;
    let jwt = hs256(&late);

    let opened = std::time::Instant::now();
    let response = server
        .http
        .get(format!("{}/v1/sessions/s1/stream", server.base))
        .bearer_auth(&jwt)
        .send()
        .await
        .expect("the server answers");
    assert_eq!(response.status(), 200);
    // Still accepted while the stream is open.
    server.get(READ, &jwt).await.expect(200);
    let body = tokio::time::timeout(std::time::Duration::from_secs(20), response.text())
        .await
        .expect("the stream ended")
        .expect("a body");
    let lasted = opened.elapsed();
    assert!(
        lasted <= std::time::Duration::from_millis(3_500),
        "ended {lasted:?} after it opened: the token was accepted for 3 s at most"
    );
    assert!(
        body.ends_with("\n\n"),
        "ended at a frame boundary: {body:?}"
    );
    // The token is refused within the second after the stream's end.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    refused(&server, &jwt, "once its stream ended").await;
}
