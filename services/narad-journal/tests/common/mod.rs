//! What the journal's test binaries share: a fixture on a fresh database
//! and builders of proposals.
#![allow(dead_code)]

use narad_journal::{
    AppendOptions, HistoryQuery, Journal, JournalError, MIGRATOR, NewSession, TenantId,
};
use narad_protocol::primitives::SessionId;
use narad_testkit::TestDatabase;
use serde_json::{Value, json};

pub struct Fixture {
    pub db: TestDatabase,
    pub journal: Journal,
    pub tenant: TenantId,
}

pub async fn fixture() -> Fixture {
    fixture_with(40, narad_journal::DEFAULT_APPEND_GROUPS).await
}

/// A fixture whose journal has a pool of `connections` and runs at most
/// `groups` append transactions at a time.
pub async fn fixture_with(connections: usize, groups: usize) -> Fixture {
    let db = TestDatabase::new(&MIGRATOR).await;
    let journal = Journal::connect(db.url(), connections)
        .unwrap()
        .with_append_groups(groups);
    Fixture {
        db,
        journal,
        tenant: TenantId::new("org-a").unwrap(),
    }
}

impl Fixture {
    /// A caller of the fixture's tenant allowed to act on `session`, as a
    /// command's authorization yields it.
    pub fn on(&self, session: &str) -> narad_journal::Authorized {
        narad_journal::Caller {
            tenant: self.tenant.clone(),
            actor: serde_json::from_value(json!({"kind": "user", "sub": "tester"})).unwrap(),
            sessions: None,
        }
        .authorize(&SessionId::new(session).unwrap())
        .unwrap()
    }

    pub async fn session(&self, id: &str) -> SessionId {
        let sid = SessionId::new(id).unwrap();
        self.journal
            .create_session(
                &self.tenant,
                NewSession {
                    session_id: Some(sid.clone()),
                    ..NewSession::default()
                },
            )
            .await
            .unwrap();
        sid
    }

    pub async fn append(
        &self,
        session: &SessionId,
        events: &[Value],
    ) -> Result<narad_journal::Appended, JournalError> {
        self.journal
            .append(&self.tenant, session, events, AppendOptions::default())
            .await
    }

    pub async fn history(
        &self,
        session: &str,
        q: HistoryQuery,
    ) -> Result<narad_journal::HistoryPage, JournalError> {
        self.journal.history(&self.tenant, session, &q).await
    }
}

/// A connection of its own to `url` (another transaction than the
/// journal's), its connection task spawned.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// Whether the database at `url` is a Citus coordinator (the test harness
/// distributes every test database there: `scripts/citus-cluster`).
#[allow(dead_code)]
pub async fn distributed(url: &str) -> bool {
    connect(url)
        .await
        .query_one(
            "select exists (select 1 from pg_extension where extname = 'citus')",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

pub fn ev(id: &str, ty: &str, run: Option<(&str, &str)>, body: Value) -> Value {
    let mut e = json!({"protocolVersion": "narad/v1", "type": ty, "eventId": id});
    if let Some((root, run)) = run {
        e["rootRunId"] = json!(root);
        e["runId"] = json!(run);
    }
    for (k, v) in body.as_object().unwrap() {
        e[k] = v.clone();
    }
    e
}

pub fn user_message(id: &str) -> Value {
    ev(
        id,
        "message.user.recorded",
        None,
        json!({"messageId": id, "messageScope": "session", "content": "hi"}),
    )
}

/// A generated valid session as proposals: sequences stripped.
pub fn proposals(session: &str, choices: &[u8]) -> Vec<Value> {
    narad_protocol::testing::session_with_id(session, choices)
        .into_iter()
        .map(|mut e| {
            let o = e.as_object_mut().unwrap();
            for f in ["sessionSequence", "sequence", "workflowSequence"] {
                o.remove(f);
            }
            e
        })
        .collect()
}
