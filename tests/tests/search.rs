//! Search (`GET /v1/search`): sessions found by what people said in them,
//! what interrupts asked and how they were answered, and their titles;
//! filtered by state, open interrupts, actor and time; newest match first,
//! paged; one tenant's alone, a limited token's sessions alone; a redacted
//! message not found by its words; bad parameters refused with their name.

use narad_server::auth::Role;
use narad_tests::*;
use serde_json::{Value, json};

/// Session `session` (titled `title`) where `sub` said `text`.
async fn said(s: &Server, org: &str, sub: &str, session: &str, title: &str, text: &str) {
    let t = hs256(&claims(org, sub, &Role::ALL));
    let created = s
        .post(
            "/v1/sessions",
            &t,
            &json!({"sessionId": session, "title": title}),
        )
        .await;
    assert!(matches!(created.status, 201 | 409), "{created:?}");
    say(s, &t, session, text).await;
}

async fn say(s: &Server, t: &str, session: &str, text: &str) -> Value {
    s.post(
        "/v1/commands/record-user-message",
        t,
        &json!({"sessionId": session, "messageScope": "session", "content": text}),
    )
    .await
    .expect(201)
    .clone()
}

fn sessions(page: &Value) -> Vec<String> {
    page["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results in {page}"))
        .iter()
        .map(|r| r["session"]["sessionId"].as_str().unwrap().to_owned())
        .collect()
}

/// The passage of a match as text, matched words in brackets.
fn passage(m: &Value) -> String {
    m["snippet"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let text = p["text"].as_str().unwrap();
            if p["matched"] == true {
                format!("[{text}]")
            } else {
                text.to_owned()
            }
        })
        .collect()
}

async fn search(s: &Server, t: &str, query: &str) -> Value {
    s.get(&format!("/v1/search?{query}"), t)
        .await
        .expect(200)
        .clone()
}

#[tokio::test]
async fn finds_sessions_by_what_was_said_newest_match_first_with_marked_passages() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    said(
        &s,
        "acme",
        "alice",
        "s-1",
        "Billing",
        "Please refund order 42, it arrived broken",
    )
    .await;
    said(&s, "acme", "bob", "s-2", "Shipping", "Where is my parcel?").await;
    said(
        &s,
        "acme",
        "carol",
        "s-3",
        "Refund policy",
        "What is the policy?",
    )
    .await;
    said(
        &s,
        "acme",
        "dave",
        "s-4",
        "Other",
        "Refunding takes too long",
    )
    .await;

    // Stemmed: "refunds" finds refund, refunding and the title "Refund
    // policy"; the newest match first (s-4 said it last; s-3's title
    // dates from its creation, before s-4's message).
    let page = search(&s, &t, "q=refunds").await;
    assert_eq!(sessions(&page), ["s-4", "s-3", "s-1"]);
    let first = &page["results"][2];
    assert_eq!(first["matchCount"], 1);
    let m = &first["matches"][0];
    assert_eq!(m["field"], "message");
    assert_eq!(m["actor"]["sub"], "alice");
    assert!(m["eventId"].is_string() && m["sessionSequence"].as_u64().unwrap() >= 1);
    assert!(m["at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(passage(m), "Please [refund] order 42, it arrived broken");
    let title = &page["results"][1]["matches"][0];
    assert_eq!(title["field"], "title");
    assert!(title.get("eventId").is_none());
    assert_eq!(passage(title), "[Refund] policy");

    // Several words: all of them; a phrase; or; a word left out.
    assert_eq!(sessions(&search(&s, &t, "q=refund+broken").await), ["s-1"]);
    assert_eq!(sessions(&search(&s, &t, "q=%22order+42%22").await), ["s-1"]);
    assert_eq!(
        sessions(&search(&s, &t, "q=parcel+or+broken").await),
        ["s-2", "s-1"]
    );
    assert_eq!(
        sessions(&search(&s, &t, "q=refund+-broken").await),
        ["s-4", "s-3"]
    );
    assert!(sessions(&search(&s, &t, "q=nowhere").await).is_empty());

    // A second message moves its session to the front and counts.
    say(&s, &t, "s-1", "Still waiting for the refund").await;
    let page = search(&s, &t, "q=refund").await;
    assert_eq!(sessions(&page), ["s-1", "s-4", "s-3"]);
    assert_eq!(page["results"][0]["matchCount"], 2);
    assert_eq!(page["results"][0]["matches"].as_array().unwrap().len(), 2);
    assert_eq!(
        passage(&page["results"][0]["matches"][0]),
        "Still waiting for the [refund]"
    );
}

#[tokio::test]
async fn questions_and_answers_are_found_and_the_filters_narrow() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    waiting_on_interrupt(
        &s,
        &t,
        "s-wait",
        json!({"title": "Deploy"}),
        "i-1",
        json!({"title": "Deploy to production?", "message": "The canary is green"}),
    )
    .await;
    waiting_on_interrupt(
        &s,
        &t,
        "s-done",
        json!({"title": "Rollback"}),
        "i-2",
        json!({"title": "Roll back production?"}),
    )
    .await;
    let approver = hs256(&claims("acme", "erin", &Role::ALL));
    s.post(
        "/v1/commands/resolve-interrupt",
        &approver,
        &json!({"interruptId": "i-2", "decision": "deny", "reason": "the canary recovered"}),
    )
    .await
    .expect(200);
    said(&s, "acme", "frank", "s-idle", "Notes", "production notes").await;
    s.post(
        "/v1/commands/archive-session",
        &t,
        &json!({"sessionId": "s-idle"}),
    )
    .await
    .expect(200);

    // The question and the answer are both found, each with its field.
    let page = search(&s, &t, "q=canary").await;
    assert_eq!(sessions(&page), ["s-done", "s-wait"]);
    let answer = &page["results"][0]["matches"][0];
    assert_eq!(answer["field"], "answer");
    assert_eq!(answer["actor"]["sub"], "erin");
    assert_eq!(passage(answer), "deny the [canary] recovered");
    assert_eq!(page["results"][1]["matches"][0]["field"], "question");
    assert_eq!(page["results"][1]["openInterrupts"], 1);
    assert_eq!(page["results"][0]["openInterrupts"], 0);

    // Open interrupts, state, actor.
    let q = "q=production";
    assert_eq!(
        sessions(&search(&s, &t, q).await),
        ["s-idle", "s-done", "s-wait"]
    );
    let pending = search(&s, &t, &format!("{q}&pendingApprovals=true")).await;
    assert_eq!(sessions(&pending), ["s-wait"]);
    let none_pending = search(&s, &t, &format!("{q}&pendingApprovals=false")).await;
    assert_eq!(sessions(&none_pending), ["s-idle", "s-done"]);
    assert_eq!(
        sessions(&search(&s, &t, &format!("{q}&state=archived")).await),
        ["s-idle"]
    );
    assert_eq!(
        sessions(&search(&s, &t, &format!("{q}&state=open")).await),
        ["s-done", "s-wait"]
    );
    // Both runs are paused, not ended: their sessions' slots are taken.
    assert_eq!(
        sessions(&search(&s, &t, &format!("{q}&state=running")).await),
        ["s-done", "s-wait"]
    );
    assert!(sessions(&search(&s, &t, &format!("{q}&state=idle")).await).is_empty());
    assert_eq!(sessions(&search(&s, &t, "actor=erin").await), ["s-done"]);
    assert_eq!(
        sessions(&search(&s, &t, "actor=frank&q=notes").await),
        ["s-idle"]
    );
    assert!(sessions(&search(&s, &t, "actor=frank&q=canary").await).is_empty());
    // An actor's search finds their words, never a title.
    assert!(sessions(&search(&s, &t, "actor=erin&q=rollback").await).is_empty());

    // Filters alone: sessions newest first.
    let all = search(&s, &t, "").await;
    assert_eq!(sessions(&all), ["s-idle", "s-done", "s-wait"]);
    assert_eq!(all["results"][0]["matches"], json!([]));
    assert_eq!(
        sessions(&search(&s, &t, "pendingApprovals=true").await),
        ["s-wait"]
    );
    assert_eq!(
        sessions(&search(&s, &t, "state=archived").await),
        ["s-idle"]
    );

    // Time: everything was said just now.
    let hour_ago = "2000-01-01T00:00:00Z";
    let later = "2999-01-01T00:00:00Z";
    assert_eq!(
        sessions(&search(&s, &t, &format!("{q}&since={hour_ago}&until={later}")).await).len(),
        3
    );
    assert!(sessions(&search(&s, &t, &format!("{q}&until={hour_ago}")).await).is_empty());
    assert!(sessions(&search(&s, &t, &format!("since={later}")).await).is_empty());
}

#[tokio::test]
async fn pages_hold_every_session_once() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    for i in 0..7 {
        said(
            &s,
            "acme",
            "alice",
            &format!("s-{i}"),
            "t",
            &format!("invoice number {i}"),
        )
        .await;
    }
    for query in ["q=invoice", ""] {
        let mut seen = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let path = match &after {
                Some(a) => format!("{query}&limit=3&after={a}"),
                None => format!("{query}&limit=3"),
            };
            let page = search(&s, &t, &path).await;
            seen.extend(sessions(&page));
            match page["nextAfter"].as_str() {
                Some(a) => after = Some(a.to_owned()),
                None => break,
            }
        }
        let expected: Vec<String> = (0..7).rev().map(|i| format!("s-{i}")).collect();
        assert_eq!(seen, expected, "{query}");
    }
}

#[tokio::test]
async fn one_tenant_and_a_limited_tokens_sessions_alone_and_no_redacted_words() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    said(&s, "acme", "alice", "s-a", "a", "the secret launch date").await;
    said(&s, "acme", "alice", "s-b", "b", "another launch").await;
    said(&s, "other", "olga", "s-o", "o", "our launch date").await;

    assert_eq!(sessions(&search(&s, &t, "q=launch").await), ["s-b", "s-a"]);
    let theirs = token("other", &[Role::Reader]);
    assert_eq!(sessions(&search(&s, &theirs, "q=launch").await), ["s-o"]);
    assert!(sessions(&search(&s, &theirs, "q=secret").await).is_empty());
    assert!(sessions(&search(&s, &theirs, "actor=alice").await).is_empty());

    let mut limited = claims("acme", "guest", &[Role::Reader]);
    limited.sessions = Some(vec!["s-a".to_owned()]);
    let page = search(&s, &hs256(&limited), "q=launch").await;
    assert_eq!(sessions(&page), ["s-a"]);

    // Redacted: its words are no longer found (§9.4: what it shows now is
    // the replacement).
    let said_it = say(&s, &t, "s-a", "my card is 4111 1111").await;
    let message_id = said_it["messageId"].as_str().unwrap().to_owned();
    assert_eq!(sessions(&search(&s, &t, "q=4111").await), ["s-a"]);
    s.post(
        "/v1/commands/redact-message",
        &t,
        &json!({"sessionId": "s-a", "messageId": message_id, "reason": "card number",
            "displayReplacement": null}),
    )
    .await
    .expect(200);
    assert!(sessions(&search(&s, &t, "q=4111").await).is_empty());

    // Erased: gone from search.
    s.call(reqwest::Method::DELETE, "/v1/sessions/s-b", Some(&t), None)
        .await
        .expect(200);
    assert_eq!(sessions(&search(&s, &t, "q=launch").await), ["s-a"]);

    // A credential without the read role is refused.
    let runtime = token("acme", &[Role::Executor]);
    assert_eq!(s.get("/v1/search?q=launch", &runtime).await.status, 403);
}

#[tokio::test]
async fn words_with_nothing_to_find_find_nothing_and_say_why() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    said(&s, "acme", "alice", "s-1", "The title", "the the the").await;
    // As a query they would match everything: nothing is looked for, and
    // the answer says so (a schema-valid request is not refused).
    for query in ["q=the", "q=%21%21", "q=the+or+a"] {
        let page = search(&s, &t, query).await;
        assert_eq!(page["results"], json!([]), "{query}");
        assert!(
            page["notice"]
                .as_str()
                .unwrap()
                .contains("no searchable word"),
            "{query}: {page}"
        );
    }
    // A range that holds no instant holds no match.
    let empty = search(
        &s,
        &t,
        "q=title&since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z",
    )
    .await;
    assert_eq!(empty["results"], json!([]));
    assert!(empty.get("notice").is_none());
}

#[tokio::test]
async fn a_cursor_at_either_end_of_time_pages_without_failing() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    said(&s, "acme", "alice", "s-1", "Billing", "refund please").await;
    // Any cursor of the document's pattern: before anything Postgres can
    // hold there is nothing older; far ahead, everything is (schemathesis
    // sent the first: a 500, the time out of Postgres's range).
    for (after, found) in [
        ("-656802300397904918.x", 0),
        ("-999999999999999999.x", 0),
        ("999999999999999999.x", 1),
    ] {
        for query in [
            format!("q=refund&after={after}"),
            format!("state=open&after={after}"),
        ] {
            let page = search(&s, &t, &query).await;
            assert_eq!(
                page["results"].as_array().unwrap().len(),
                found,
                "{query}: {page}"
            );
        }
    }
}

#[tokio::test]
async fn bad_parameters_are_refused_with_their_name() {
    let s = Server::start().await;
    let t = token("acme", &Role::ALL);
    let long = "w".repeat(1001);
    for (query, field) in [
        (&*format!("q={long}"), "q"),
        ("state=sleeping", "state"),
        ("pendingApprovals=yes", "pendingApprovals"),
        ("actor=", "actor"),
        ("since=yesterday", "since"),
        ("after=xyz", "after"),
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("sort=new", "sort"),
    ] {
        let answer = s.get(&format!("/v1/search?{query}"), &t).await;
        assert_eq!(answer.status, 400, "{query}: {answer:?}");
        assert_eq!(answer.code(), "NRD-0008", "{query}");
        let body = answer.expect(400);
        assert!(body["fields"].get(field).is_some(), "{query}: {body}");
    }
}

#[tokio::test]
async fn a_message_of_more_words_than_a_search_document_holds_is_recorded_and_found_by_its_start() {
    // The default body limit (NARAD_MAX_BODY_BYTES) is a megabyte.
    let s = Server::start_with_max_body(1024 * 1024).await;
    let t = token("acme", &Role::ALL);
    s.post(
        "/v1/sessions",
        &t,
        &json!({"sessionId": "big", "title": "big"}),
    )
    .await
    .expect(201);
    // 160,000 distinct words in under a megabyte: their text-search
    // document would pass Postgres's 1 MB limit for one.
    let words: Vec<String> = (0..160_000u32)
        .map(|i| format!("q{:0>4}", radix36(i)))
        .collect();
    let text = words.join(" ");
    assert!(text.len() < 1_000_000);
    let said = s
        .post(
            "/v1/commands/record-user-message",
            &t,
            &json!({"sessionId": "big", "messageScope": "session", "content": text}),
        )
        .await;
    said.expect(201);
    // The start of the message is searchable; the whole stays in history.
    assert_eq!(
        sessions(&search(&s, &t, &format!("q={}", words[10])).await),
        ["big"]
    );
    let history = s.get("/v1/sessions/big/events", &t).await;
    assert_eq!(history.expect(200)["events"][0]["content"], json!(text));
}

fn radix36(mut n: u32) -> String {
    let mut digits = Vec::new();
    loop {
        digits.push(std::char::from_digit(n % 36, 36).unwrap());
        n /= 36;
        if n == 0 {
            break;
        }
    }
    digits.iter().rev().collect()
}
