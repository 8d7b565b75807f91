//! The kit's view of a server: its HTTP API and nothing else. Tokens come
//! from the command the operator gives (`--token-command`), run once per
//! set of roles with `{org}`, `{sub}` and `{roles}` filled in.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use tokio::sync::Mutex;

/// A server under test and the tokens the kit holds for it.
pub struct Api {
    /// The server's base URL, without a trailing slash.
    pub base: String,
    /// The organisation the kit works in.
    pub org: String,
    http: reqwest::Client,
    token_command: String,
    tokens: Mutex<HashMap<String, String>>,
    /// The sessions the kit created, in order.
    created: std::sync::Mutex<Vec<String>>,
}

/// A server's answer.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body as JSON (`null` when it is not JSON).
    pub body: Value,
    /// Whether the answer says it replays a kept one
    /// (`Idempotent-Replayed: true`).
    pub replayed: bool,
}

impl Answer {
    /// The `code` of an error answer, or "".
    pub fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or_default()
    }

    /// Fails with what came unless the status is `status`.
    pub fn expect(&self, status: u16, what: &str) -> anyhow::Result<&Value> {
        anyhow::ensure!(
            self.status == status,
            "{what}: expected {status}, got {} {}",
            self.status,
            self.body
        );
        Ok(&self.body)
    }
}

impl Api {
    /// The API at `base`, with tokens from `token_command` for `org`.
    pub fn new(base: &str, org: &str, token_command: &str) -> Api {
        Api {
            base: base.trim_end_matches('/').to_owned(),
            org: org.to_owned(),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .build()
                .expect("an HTTP client"),
            token_command: token_command.to_owned(),
            tokens: Mutex::new(HashMap::new()),
            created: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The HTTP client (for streams).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// A token of the kit's organisation with `roles`.
    pub async fn token(&self, roles: &[&str]) -> anyhow::Result<String> {
        let key = roles.join(",");
        if let Some(t) = self.tokens.lock().await.get(&key) {
            return Ok(t.clone());
        }
        let command = self
            .token_command
            .replace("{org}", &self.org)
            .replace("{sub}", "conformance-kit")
            .replace("{roles}", &key);
        let out = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&command)
            .env("NARAD_KIT_ORG", &self.org)
            .env("NARAD_KIT_ROLES", &key)
            .output()
            .await
            .with_context(|| format!("running the token command `{command}`"))?;
        anyhow::ensure!(
            out.status.success(),
            "the token command `{command}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let token = String::from_utf8(out.stdout)?.trim().to_owned();
        anyhow::ensure!(
            !token.is_empty() && !token.contains(char::is_whitespace),
            "the token command `{command}` printed no single token"
        );
        self.tokens.lock().await.insert(key, token.clone());
        Ok(token)
    }

    /// Sends `method path` with a token of `roles` and a JSON body.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        roles: &[&str],
        body: Option<&Value>,
    ) -> anyhow::Result<Answer> {
        self.call_keyed(method, path, roles, body, None).await
    }

    /// POST of a JSON body with an `Idempotency-Key`.
    pub async fn post_keyed(
        &self,
        path: &str,
        roles: &[&str],
        body: &Value,
        key: &str,
    ) -> anyhow::Result<Answer> {
        self.call_keyed(reqwest::Method::POST, path, roles, Some(body), Some(key))
            .await
    }

    async fn call_keyed(
        &self,
        method: reqwest::Method,
        path: &str,
        roles: &[&str],
        body: Option<&Value>,
        key: Option<&str>,
    ) -> anyhow::Result<Answer> {
        let token = self.token(roles).await?;
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .bearer_auth(token)
            .timeout(Duration::from_secs(30));
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = res.status().as_u16();
        let replayed = res
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true");
        let text = res.text().await.unwrap_or_default();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if method == reqwest::Method::POST
            && path == "/v1/sessions"
            && status == 201
            && let Some(id) = body["sessionId"].as_str()
        {
            self.created
                .lock()
                .expect("not poisoned")
                .push(id.to_owned());
        }
        Ok(Answer {
            status,
            body,
            replayed,
        })
    }

    /// The sessions the kit created so far.
    pub fn created_sessions(&self) -> Vec<String> {
        self.created.lock().expect("not poisoned").clone()
    }

    /// Erases every session the kit created (`DELETE /v1/sessions/{id}`
    /// with a token of role `admin`): what it erased and why it could not
    /// erase the others, in words.
    pub async fn erase_created(&self) -> anyhow::Result<String> {
        let sessions = self.created_sessions();
        let (mut erased, mut events) = (0, 0);
        let mut refused: Vec<String> = Vec::new();
        for id in &sessions {
            let answer = self
                .call(
                    reqwest::Method::DELETE,
                    &format!("/v1/sessions/{id}"),
                    ADMIN,
                    None,
                )
                .await?;
            if answer.status == 200 {
                erased += 1;
                events += answer.body["eventsErased"].as_u64().unwrap_or(0);
            } else {
                refused.push(format!(
                    "{id}: {} {} {}",
                    answer.status,
                    answer.code(),
                    answer.body["message"].as_str().unwrap_or_default()
                ));
            }
        }
        let mut said = format!(
            "cleanup: erased {erased} of the {} sessions the kit created ({events} events)",
            sessions.len()
        );
        if let Some(first) = refused.first() {
            said.push_str(&format!(
                "; {} were not erased, the first {first}",
                refused.len()
            ));
        }
        Ok(said)
    }

    /// `GET path` with a token of `roles`.
    pub async fn get(&self, path: &str, roles: &[&str]) -> anyhow::Result<Answer> {
        self.call(reqwest::Method::GET, path, roles, None).await
    }

    /// `POST path` with a token of `roles`.
    pub async fn post(&self, path: &str, roles: &[&str], body: &Value) -> anyhow::Result<Answer> {
        self.call(reqwest::Method::POST, path, roles, Some(body))
            .await
    }
}

/// Roles of a backend that appends and reads.
pub const BACKEND: &[&str] = &["reader", "writer", "backend"];

/// Roles of a client executor.
pub const EXECUTOR: &[&str] = &["executor"];

/// Roles of an organisation's administrator, who erases sessions.
pub const ADMIN: &[&str] = &["admin"];

/// Roles of a person who commands and approves.
pub const PERSON: &[&str] = &["reader", "writer", "approver"];
