//! A tenant's limits (`/v1/admin/tenants/{org}/limits`): admins of the
//! operator organisation set them, an organisation's admins read theirs,
//! bad values are refused with the field named, and the expiry sweep
//! honours a tenant's own default expiry.

use std::time::Duration;

use narad_server::auth::Role;
use narad_server::runtime::RuntimeSettings;
use narad_tests::*;
use serde_json::{Value, json};

async fn put(s: &Server, token: &str, org: &str, body: &Value) -> Answer {
    s.call(
        reqwest::Method::PUT,
        &format!("/v1/admin/tenants/{org}/limits"),
        Some(token),
        Some(serde_json::to_vec(body).unwrap()),
    )
    .await
}

/// Whether the session's interrupt was resolved within `wait`.
async fn expired_within(s: &Server, t: &str, session: &str, wait: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let history = s
            .get(&format!("/v1/sessions/{session}/events?limit=100"), t)
            .await;
        let resolved = history.expect(200)["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "interrupt.resolved" && e["decision"] == "expired");
        if resolved || tokio::time::Instant::now() >= deadline {
            return resolved;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_operator_sets_limits_and_each_organisation_reads_its_own() {
    let s = Server::start().await;
    let operator = token(OPERATOR_ORG, &[Role::Admin]);
    let acme_admin = token("acme", &[Role::Admin]);

    // Nothing set: the defaults hold.
    let fresh = s.get("/v1/admin/tenants/acme/limits", &acme_admin).await;
    let fresh = fresh.expect(200);
    assert_eq!(fresh["org"], "acme");
    assert_eq!(fresh["overrides"], json!({}));
    assert_eq!(fresh["effective"], fresh["defaults"]);
    assert_eq!(
        fresh["defaults"]["interruptDefaultExpirySeconds"],
        Value::Null
    );

    let set = put(
        &s,
        &operator,
        "acme",
        &json!({"interruptDefaultExpirySeconds": 3600}),
    )
    .await;
    let set = set.expect(200);
    assert_eq!(
        set["overrides"],
        json!({"interruptDefaultExpirySeconds": 3600})
    );
    assert_eq!(set["effective"]["interruptDefaultExpirySeconds"], 3600);
    assert_eq!(set["updatedBy"], "tester");
    let read = s.get("/v1/admin/tenants/acme/limits", &acme_admin).await;
    assert_eq!(
        read.expect(200)["effective"]["interruptDefaultExpirySeconds"],
        3600
    );

    // Who may: an organisation reads only its own and sets nothing; a
    // non-admin of the operator neither.
    assert_eq!(
        s.get("/v1/admin/tenants/globex/limits", &acme_admin)
            .await
            .status,
        403
    );
    assert_eq!(put(&s, &acme_admin, "acme", &json!({})).await.status, 403);
    let operator_reader = token(OPERATOR_ORG, &[Role::Reader, Role::Writer]);
    assert_eq!(
        put(&s, &operator_reader, "acme", &json!({})).await.status,
        403
    );
    assert_eq!(
        s.get("/v1/admin/tenants/globex/limits", &operator)
            .await
            .status,
        200
    );

    // Bad values: the field named, nothing changed.
    for (body, pointer) in [
        (
            json!({"interruptDefaultExpirySeconds": 0}),
            "/interruptDefaultExpirySeconds",
        ),
        (
            json!({"interruptDefaultExpirySeconds": "1h"}),
            "/interruptDefaultExpirySeconds",
        ),
        (
            json!({"interruptDefaultExpirySeconds": 1.5}),
            "/interruptDefaultExpirySeconds",
        ),
        (json!({"openStreams": 0}), "/openStreams"),
        (json!({"eventsPerSecondd": 10}), "/eventsPerSecondd"),
    ] {
        let refused = put(&s, &operator, "acme", &body).await;
        assert_eq!(refused.status, 400, "{body}: {}", refused.body);
        assert_eq!(refused.body["code"], "NRD-0003");
        assert!(
            refused.body["fields"].get(pointer).is_some(),
            "{}",
            refused.body
        );
    }
    assert_eq!(put(&s, &operator, "acme", &json!([1])).await.status, 400);
    let unchanged = s.get("/v1/admin/tenants/acme/limits", &acme_admin).await;
    assert_eq!(
        unchanged.expect(200)["overrides"],
        json!({"interruptDefaultExpirySeconds": 3600})
    );

    // The operator's audit log says who set what.
    let log = s.get("/v1/audit?action=set-tenant-limits", &operator).await;
    let entries = log.expect(200)["entries"].as_array().unwrap().clone();
    let statuses: Vec<u64> = entries
        .iter()
        .map(|e| e["status"].as_u64().unwrap())
        .collect();
    // Set; its non-admin refused; six bad bodies (acme's own try is in acme's log).
    assert_eq!(statuses, [200, 403, 400, 400, 400, 400, 400, 400]);
    assert_eq!(entries[0]["actor"]["sub"], "tester");
}

#[tokio::test]
async fn the_expiry_sweep_honours_each_tenants_own_default() {
    // Configured default: 1 s. acme lifts it; globex shortens nothing and
    // takes it; initech sets 5 s of its own.
    let s = Server::start_with_runtime(RuntimeSettings {
        interrupt_default_expiry: Some(Duration::from_secs(1)),
        ..RuntimeSettings::default()
    })
    .await;
    let operator = token(OPERATOR_ORG, &[Role::Admin]);
    put(
        &s,
        &operator,
        "acme",
        &json!({"interruptDefaultExpirySeconds": null}),
    )
    .await
    .expect(200);
    put(
        &s,
        &operator,
        "initech",
        &json!({"interruptDefaultExpirySeconds": 5}),
    )
    .await
    .expect(200);
    let mut tokens = Vec::new();
    for org in ["acme", "globex", "initech"] {
        let t = token(org, &Role::ALL);
        waiting_on_interrupt(&s, &t, "s1", json!({}), "i1", json!({})).await;
        tokens.push(t);
    }
    assert!(
        expired_within(&s, &tokens[1], "s1", Duration::from_secs(10)).await,
        "globex: the default"
    );
    assert!(
        !expired_within(&s, &tokens[2], "s1", Duration::ZERO).await,
        "initech waits its own 5 s"
    );
    assert!(
        expired_within(&s, &tokens[2], "s1", Duration::from_secs(10)).await,
        "initech: its own"
    );
    assert!(
        !expired_within(&s, &tokens[0], "s1", Duration::from_secs(2)).await,
        "acme lifted the default"
    );
}
