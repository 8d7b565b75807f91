//! The approvals inbox (`GET /v1/interrupts`): every open interrupt of the
//! tenant (or of one session), the longest waiting first, paged; resolved
//! ones leave it; a token limited to sessions sees only theirs; another
//! tenant sees none.

use narad_server::auth::Role;
use narad_tests::*;
use serde_json::{Value, json};

/// A session whose run waits on interrupt `interrupt`.
async fn waiting(s: &Server, t: &str, session: &str, interrupt: &str) {
    waiting_on_interrupt(
        s,
        t,
        session,
        json!({"title": format!("{session} title")}),
        interrupt,
        json!({"title": format!("may {session} go on?")}),
    )
    .await;
}

fn ids(page: &Value) -> Vec<String> {
    page["interrupts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["interruptId"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_inbox_lists_open_interrupts_oldest_first() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    for (session, interrupt) in [("s-a", "i-1"), ("s-b", "i-2"), ("s-c", "i-3")] {
        waiting(&s, &t, session, interrupt).await;
    }

    let listed = s.get("/v1/interrupts", &t).await;
    let all = listed.expect(200);
    assert_eq!(ids(all), ["i-1", "i-2", "i-3"]);
    let first = &all["interrupts"][0];
    assert_eq!(first["sessionId"], "s-a");
    assert_eq!(first["sessionTitle"], "s-a title");
    assert_eq!(first["request"]["type"], "interrupt.requested");
    assert_eq!(first["request"]["title"], "may s-a go on?");
    assert_eq!(first["request"]["actions"], json!(["approve", "deny"]));
    assert!(first["requestedAt"].as_str().unwrap().ends_with('Z'));
    assert!(all.get("nextAfter").is_none());

    // Paged: one at a time, nothing repeated or skipped.
    let mut seen = Vec::new();
    let mut path = "/v1/interrupts?limit=1".to_owned();
    loop {
        let answer = s.get(&path, &t).await;
        let page = answer.expect(200);
        seen.extend(ids(page));
        match page["nextAfter"].as_str() {
            Some(after) => path = format!("/v1/interrupts?limit=1&after={after}"),
            None => break,
        }
    }
    assert_eq!(seen, ["i-1", "i-2", "i-3"]);

    // Resolved: gone from the inbox.
    s.post(
        "/v1/commands/resolve-interrupt",
        &t,
        &json!({"interruptId": "i-2", "decision": "approve"}),
    )
    .await
    .expect(200);
    let left = s.get("/v1/interrupts", &t).await;
    assert_eq!(ids(left.expect(200)), ["i-1", "i-3"]);

    // A token limited to one session sees its interrupt alone; another
    // tenant sees none.
    let mut limited = claims("acme", "guest", &[Role::Reader]);
    limited.sessions = Some(vec!["s-c".to_owned()]);
    let theirs = s.get("/v1/interrupts", &hs256(&limited)).await;
    assert_eq!(ids(theirs.expect(200)), ["i-3"]);
    let other = s
        .get("/v1/interrupts", &token("other", &[Role::Reader]))
        .await;
    assert!(ids(other.expect(200)).is_empty());

    // One session's: its open interrupts alone (none once resolved); a
    // token limited to other sessions is refused that filter.
    let one = s.get("/v1/interrupts?sessionId=s-c", &t).await;
    assert_eq!(ids(one.expect(200)), ["i-3"]);
    let resolved = s.get("/v1/interrupts?sessionId=s-b", &t).await;
    assert!(ids(resolved.expect(200)).is_empty());
    let elsewhere = s
        .get("/v1/interrupts?sessionId=s-a", &hs256(&limited))
        .await;
    assert_eq!((elsewhere.status, elsewhere.code()), (403, "NRD-0102"));
    let empty = s.get("/v1/interrupts?sessionId=", &t).await;
    assert_eq!((empty.status, empty.code()), (400, "NRD-0008"));
    assert!(
        empty.body["fields"].get("sessionId").is_some(),
        "{}",
        empty.body
    );

    // Bad paging is a client error naming the parameter.
    let bad = s.get("/v1/interrupts?after=nonsense", &t).await;
    bad.expect(400);
    assert_eq!(bad.code(), "NRD-0008");
    let too_many = s.get("/v1/interrupts?limit=501", &t).await;
    too_many.expect(400);
    assert_eq!(too_many.code(), "NRD-0008");
}
