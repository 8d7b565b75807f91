//! Registered extensions and their signed calls, end to end.

use narad_server::auth::Role;
use narad_server::signature::REFUSED;
use narad_tests::*;
use reqwest::Method;
use serde_json::json;

const HISTORY: &str = "/v1/sessions/s1/events?limit=10";

/// A server with session s1 of acme holding one event, and the extension
/// acme-tools/indexer registered (signing as acme/acme-tools/indexer); returns the server, an admin token and
/// the secret.
async fn setup() -> (Server, String, String) {
    let s = Server::start().await;
    let admin = token("acme", &[Role::Admin, Role::Writer]);
    s.post("/v1/sessions", &admin, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    s.post(
        "/v1/commands/record-user-message",
        &admin,
        &json!({"sessionId": "s1", "messageScope": "session", "content": "hi"}),
    )
    .await
    .expect(201);
    let registered = s
        .post(
            "/v1/extensions",
            &admin,
            &json!({"publisher": "acme-tools", "name": "indexer"}),
        )
        .await;
    let secret = registered.expect(201)["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(secret.len(), 64);
    (s, admin, secret)
}

#[tokio::test]
async fn a_registered_extension_reads_history_with_signed_calls() {
    let (s, admin, secret) = setup().await;
    let ok = s
        .signed_get(HISTORY, &Signed::now("acme/acme-tools/indexer", &secret))
        .await;
    assert_eq!(ok.expect(200)["events"][0]["type"], "message.user.recorded");

    // The secret is shown once: listings never carry it.
    let listed = s.get("/v1/extensions", &admin).await;
    let listed = listed.expect(200);
    assert_eq!(listed["extensions"][0]["name"], "indexer");
    assert!(listed["extensions"][0].get("secret").is_none());
    assert!(!listed.to_string().contains(&secret));

    // Names are unique; registering needs admin.
    s.post(
        "/v1/extensions",
        &admin,
        &json!({"publisher": "acme-tools", "name": "indexer"}),
    )
    .await
    .expect(409);
    s.post(
        "/v1/extensions",
        &token("acme", &[Role::Writer]),
        &json!({"publisher": "acme-tools", "name": "other"}),
    )
    .await
    .expect(403);
    s.post(
        "/v1/extensions",
        &admin,
        &json!({"publisher": "acme tools", "name": "x"}),
    )
    .await
    .expect(400);
    s.stop().await;
}

#[tokio::test]
async fn every_bad_signature_gets_the_same_sentence() {
    let (s, _, secret) = setup().await;
    let good = Signed::now("acme/acme-tools/indexer", &secret);
    let mut refusals = Vec::new();

    let mut stale = good.clone();
    stale.timestamp -= 61;
    refusals.push(("stale timestamp", s.signed_get(HISTORY, &stale).await));
    let mut future = good.clone();
    future.timestamp += 61;
    refusals.push(("future timestamp", s.signed_get(HISTORY, &future).await));

    let mut wrong_secret = good.clone();
    wrong_secret.secret = b"not-the-secret".to_vec();
    refusals.push(("wrong secret", s.signed_get(HISTORY, &wrong_secret).await));

    let mut other_path = good.clone();
    other_path.signed_path = Some("/v1/sessions/s1/events?limit=11".to_owned());
    refusals.push(("tampered query", s.signed_get(HISTORY, &other_path).await));

    let mut unknown = good.clone();
    unknown.extension = "acme/acme-tools/nobody".to_owned();
    refusals.push(("unknown extension", s.signed_get(HISTORY, &unknown).await));

    let mut malformed = good.clone();
    malformed.extension = "no-slash".to_owned();
    refusals.push((
        "malformed extension",
        s.signed_get(HISTORY, &malformed).await,
    ));
    let mut no_org = good.clone();
    no_org.extension = "acme-tools/indexer".to_owned();
    refusals.push(("no organisation", s.signed_get(HISTORY, &no_org).await));
    let mut other_org = good.clone();
    other_org.extension = "globex/acme-tools/indexer".to_owned();
    refusals.push((
        "another organisation",
        s.signed_get(HISTORY, &other_org).await,
    ));

    // Accepted once, refused as a replay.
    s.signed_get(HISTORY, &good).await.expect(200);
    refusals.push(("replayed request id", s.signed_get(HISTORY, &good).await));

    // A header missing altogether.
    let partial = s
        .http
        .get(format!("{}{HISTORY}", s.base))
        .header("narad-extension", "acme/acme-tools/indexer")
        .send()
        .await
        .unwrap();
    assert_eq!(partial.status(), 401, "a header missing");
    // A companion header alone makes a signed call too, refused as one:
    // never a bearer call that ignores it.
    let bearer = token("acme", &[Role::Reader]);
    for (name, value) in [("narad-timestamp", "91ZE"), ("narad-request-id", "")] {
        let stray = s
            .http
            .get(format!("{}{HISTORY}", s.base))
            .bearer_auth(&bearer)
            .header(name, value)
            .send()
            .await
            .unwrap();
        refusals.push((name, Answer::of(stray).await));
    }

    // Another replica refuses the same request id: ids live in Postgres.
    let replica = s.replica().await;
    let once = Signed::now("acme/acme-tools/indexer", &secret);
    s.signed_get(HISTORY, &once).await.expect(200);
    refusals.push((
        "replayed on another replica",
        replica.signed_get(HISTORY, &once).await,
    ));
    replica.stop().await;

    for (why, a) in &refusals {
        assert_eq!(a.status, 401, "{why}: {:#}", a.body);
        assert_eq!(a.code(), "NRD-0101", "{why}");
        assert_eq!(
            a.body["message"], REFUSED,
            "{why}: one sentence for every cause"
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn a_tampered_body_is_refused() {
    // Streaming endpoints take no body: a MAC over any body other than the
    // empty one does not verify.
    let (s, _, secret) = setup().await;
    let signed = Signed::now("acme/acme-tools/indexer", &secret);
    let tampered = s
        .signed_call(HISTORY, &signed, b"{\"x\":2}", b"{\"x\":1}")
        .await;
    assert_eq!(tampered.status, 401);
    assert_eq!(tampered.body["message"], REFUSED);
    // Even a body the MAC covers: streaming calls carry none.
    let covered = s
        .signed_call(
            HISTORY,
            &Signed::now("acme/acme-tools/indexer", &secret),
            b"{}",
            b"{}",
        )
        .await;
    assert_eq!(covered.status, 401);
    s.stop().await;
}

#[tokio::test]
async fn disabled_extensions_and_other_routes_are_forbidden() {
    let (s, admin, secret) = setup().await;
    // A signed call anywhere but a streaming endpoint: 403.
    let elsewhere = s
        .signed_get(
            "/v1/sessions",
            &Signed::now("acme/acme-tools/indexer", &secret),
        )
        .await;
    elsewhere.expect(403);
    assert_eq!(elsewhere.code(), "NRD-0102");
    for path in ["/healthz", "/openapi.json", "/v1/no-such-route"] {
        let a = s
            .signed_get(path, &Signed::now("acme/acme-tools/indexer", &secret))
            .await;
        assert_eq!(a.status, 403, "a signed call to {path}: {:#}", a.body);
    }

    // Disabled: a verified call is 403; enabled again, it passes.
    let patch = |enabled: bool| {
        s.call(
            Method::PATCH,
            "/v1/extensions/acme-tools/indexer",
            Some(&admin),
            Some(serde_json::to_vec(&json!({"enabled": enabled})).unwrap()),
        )
    };
    assert_eq!(patch(false).await.expect(200)["enabled"], false);
    let disabled = s
        .signed_get(HISTORY, &Signed::now("acme/acme-tools/indexer", &secret))
        .await;
    disabled.expect(403);
    assert_eq!(disabled.code(), "NRD-0102");
    patch(true).await.expect(200);
    s.signed_get(HISTORY, &Signed::now("acme/acme-tools/indexer", &secret))
        .await
        .expect(200);

    // Another organisation's admin cannot see or change it.
    let theirs = token("globex", &[Role::Admin]);
    s.call(
        Method::PATCH,
        "/v1/extensions/acme-tools/indexer",
        Some(&theirs),
        Some(br#"{"enabled": false}"#.to_vec()),
    )
    .await
    .expect(404);
    assert_eq!(
        s.get("/v1/extensions", &theirs).await.expect(200)["extensions"],
        json!([])
    );
    // And the extension reads only its own organisation's sessions.
    let globex = token("globex", &[Role::Writer]);
    s.post("/v1/sessions", &globex, &json!({"sessionId": "g1"}))
        .await
        .expect(201);
    s.signed_get(
        "/v1/sessions/g1/events",
        &Signed::now("acme/acme-tools/indexer", &secret),
    )
    .await
    .expect(404);
    s.stop().await;
}

/// The README's Python example, run as written against a server: the
/// signed string, the header formats and the hex-decoded key it documents
/// are the ones narad verifies. Needs `python3` (`.ci/run` installs it).
#[tokio::test]
async fn the_readme_python_example_signs_a_call_narad_accepts() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let script = readme
        .split("<!-- extension-signing -->\n```python\n")
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .expect("README has the extension-signing block")
        .to_owned();
    assert!(
        std::process::Command::new("python3")
            .arg("--version")
            .output()
            .is_ok(),
        "the README's Python example needs python3 on PATH (apt-get install python3)"
    );
    let (s, _admin, secret) = setup().await;
    let base = s.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["-c", &script])
            .env("NARAD_URL", base)
            .env("NARAD_EXTENSION", "acme/acme-tools/indexer")
            .env("NARAD_EXTENSION_SECRET", secret)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the example failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("200 "), "{stdout}");
    assert!(stdout.contains("message.user.recorded"), "{stdout}");
    s.stop().await;
}

#[tokio::test]
async fn two_organisations_hold_the_same_name_each_its_own() {
    let (s, admin, acme_secret) = setup().await;
    // globex registers the very name acme holds: no conflict, no hint.
    let globex_admin = token("globex", &[Role::Admin, Role::Writer]);
    s.post("/v1/sessions", &globex_admin, &json!({"sessionId": "s1"}))
        .await
        .expect(201);
    let registered = s
        .post(
            "/v1/extensions",
            &globex_admin,
            &json!({"publisher": "acme-tools", "name": "indexer"}),
        )
        .await;
    let globex_secret = registered.expect(201)["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(globex_secret, acme_secret);
    let listed = s.get("/v1/extensions", &globex_admin).await;
    assert_eq!(
        listed.expect(200)["extensions"].as_array().unwrap().len(),
        1
    );

    // Each reads its own organisation's session s1, with its own secret.
    let acme = s
        .signed_get(
            HISTORY,
            &Signed::now("acme/acme-tools/indexer", &acme_secret),
        )
        .await;
    assert_eq!(acme.expect(200)["events"].as_array().unwrap().len(), 1);
    let globex = s
        .signed_get(
            HISTORY,
            &Signed::now("globex/acme-tools/indexer", &globex_secret),
        )
        .await;
    assert_eq!(globex.expect(200)["events"].as_array().unwrap().len(), 0);
    // A secret under the other organisation's name is refused like any.
    for (extension, secret) in [
        ("globex/acme-tools/indexer", &acme_secret),
        ("acme/acme-tools/indexer", &globex_secret),
    ] {
        let crossed = s.signed_get(HISTORY, &Signed::now(extension, secret)).await;
        assert_eq!(crossed.status, 401, "{extension}");
        assert_eq!(crossed.body["message"], REFUSED);
    }
    // Disabling acme's leaves globex's working.
    s.call(
        Method::PATCH,
        "/v1/extensions/acme-tools/indexer",
        Some(&admin),
        Some(serde_json::to_vec(&json!({"enabled": false})).unwrap()),
    )
    .await
    .expect(200);
    assert_eq!(
        s.signed_get(
            HISTORY,
            &Signed::now("acme/acme-tools/indexer", &acme_secret)
        )
        .await
        .status,
        403
    );
    s.signed_get(
        HISTORY,
        &Signed::now("globex/acme-tools/indexer", &globex_secret),
    )
    .await
    .expect(200);
    s.stop().await;
}
