//! The console (`/console`): the built files of `console/dist`, embedded in
//! the binary so that `narad serve` gives a working console on a machine
//! with no Node toolchain. Same origin as the API, so the console's calls
//! need no CORS; a strict Content-Security-Policy (scripts and styles from
//! this origin only, no `eval`: the console's schema validators are
//! compiled ahead of time); gzip when the browser takes it; `ETag`s, so a
//! reload revalidates instead of downloading again. `config.json` tells
//! the page how people sign in: with the OpenID Connect issuer of
//! `NARAD_CONSOLE_*` (authorization code with PKCE, from the page itself),
//! or with a pasted token; and the operator's price table for usage.

use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use tower_http::compression::CompressionLayer;

use narad_protocol::ErrorCode;

use crate::error::ApiError;

/// The address the console is served at.
pub const PATH: &str = "/console/";

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

/// One file of `console/`: the page and its styles are served as written
/// (`src/`), the script as built (`dist/`).
macro_rules! asset {
    ($dir:literal, $name:literal, $type:literal) => {
        Asset {
            name: $name,
            content_type: $type,
            bytes: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../console/",
                $dir,
                "/",
                $name
            )),
        }
    };
}

const ASSETS: &[Asset] = &[
    asset!("src", "index.html", "text/html; charset=utf-8"),
    asset!("dist", "console.js", "text/javascript; charset=utf-8"),
    asset!("src", "console.css", "text/css; charset=utf-8"),
];

/// The identity provider the console signs people in with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Oidc {
    /// The issuer (its discovery document is `/.well-known/openid-configuration` under it).
    pub issuer: String,
    /// The console's client id there (a public client).
    pub client_id: String,
    /// The scopes asked for, separated by spaces.
    pub scopes: String,
    /// The audience narad's tokens must name: asked for as the `resource`
    /// (RFC 8707) when it is a URL.
    pub audience: String,
}

impl Oidc {
    /// The settings `NARAD_CONSOLE_ISSUER`, `NARAD_CONSOLE_CLIENT_ID` and
    /// `NARAD_CONSOLE_SCOPES` give, checked; none without an issuer.
    pub fn from_settings(
        issuer: Option<&str>,
        client_id: Option<&str>,
        scopes: &str,
        audience: &str,
    ) -> Result<Option<Oidc>, String> {
        let Some(issuer) = issuer.map(str::trim).filter(|i| !i.is_empty()) else {
            return Ok(None);
        };
        if !crate::auth::https_or_loopback(issuer) {
            return Err(format!(
                "NARAD_CONSOLE_ISSUER={issuer}: an issuer is an https URL (http only on this machine's loopback)"
            ));
        }
        let client_id = client_id
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .ok_or("NARAD_CONSOLE_ISSUER needs NARAD_CONSOLE_CLIENT_ID: the console's client id at the issuer")?;
        Ok(Some(Oidc {
            // As the provider writes it: discovery compares it with the
            // document's `issuer` (a trailing slash on a path matters).
            issuer: issuer.to_owned(),
            client_id: client_id.to_owned(),
            scopes: scopes.split_whitespace().collect::<Vec<_>>().join(" "),
            audience: audience.to_owned(),
        }))
    }

    /// The issuer's discovery document.
    fn discovery_url(&self) -> String {
        format!(
            "{}/.well-known/openid-configuration",
            self.issuer.trim_end_matches('/')
        )
    }
}

/// `scheme://host[:port]` of a URL.
fn origin(url: &str) -> &str {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    &url[..end]
}

/// The policy of every console response: this origin's scripts, styles and
/// connections only (and the identity provider's `origins`, for discovery
/// and the token exchange); no frames, no plugins, no base or form
/// elsewhere.
fn csp(origins: &[String]) -> HeaderValue {
    let connect: String = origins.iter().map(|o| format!(" {o}")).collect();
    HeaderValue::from_str(&format!(
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; \
         connect-src 'self'{connect}; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ))
    .expect("the policy is a header value")
}

/// The console's Content-Security-Policy, kept current with the identity
/// provider: the page talks to the issuer (discovery) and to the token
/// endpoint its discovery document names, which many providers serve from
/// another origin. The document is read in the background at start and
/// every hour (after a failure: again within minutes); until it is read,
/// the issuer's origin alone is allowed.
struct Policy {
    current: RwLock<HeaderValue>,
}

/// The endpoints of a discovery document the page calls from the browser.
const PAGE_ENDPOINTS: [&str; 2] = ["token_endpoint", "userinfo_endpoint"];

impl Policy {
    fn new(oidc: Option<&Oidc>) -> Arc<Policy> {
        let origins: Vec<String> = oidc
            .map(|o| origin(&o.issuer).to_owned())
            .into_iter()
            .collect();
        let policy = Arc::new(Policy {
            current: RwLock::new(csp(&origins)),
        });
        if let (Some(oidc), Ok(runtime)) = (oidc, tokio::runtime::Handle::try_current()) {
            runtime.spawn(keep_current(Arc::downgrade(&policy), oidc.clone()));
        }
        policy
    }

    fn get(&self) -> HeaderValue {
        self.current.read().expect("the policy lock").clone()
    }
}

/// The origins the page needs at the issuer: its own and those of the
/// endpoints it calls, from the discovery document (which must name the
/// configured issuer).
fn origins_of(oidc: &Oidc, document: &serde_json::Value) -> Result<Vec<String>, String> {
    if document["issuer"].as_str() != Some(oidc.issuer.as_str()) {
        return Err(format!(
            "the discovery document names issuer {} instead of {}",
            document["issuer"], oidc.issuer
        ));
    }
    let mut origins = vec![origin(&oidc.issuer).to_owned()];
    for endpoint in PAGE_ENDPOINTS {
        let Some(url) = document[endpoint].as_str() else {
            continue;
        };
        if !crate::auth::https_or_loopback(url) {
            return Err(format!(
                "{endpoint} {url} is neither https nor on this machine's loopback"
            ));
        }
        let o = origin(url).to_owned();
        if !origins.contains(&o) {
            origins.push(o);
        }
    }
    Ok(origins)
}

/// Reads the issuer's discovery document now and then, while the policy
/// lives.
async fn keep_current(policy: std::sync::Weak<Policy>, oidc: Oidc) {
    crate::auth::install_tls_provider();
    let Ok(client) = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()
    else {
        return;
    };
    let url = oidc.discovery_url();
    let mut retry = Duration::from_secs(2);
    loop {
        let read = async {
            let response = client
                .get(&url)
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .map_err(|e| format!("cannot fetch {url}: {e}"))?;
            let document: serde_json::Value = response
                .json()
                .await
                .map_err(|e| format!("{url} is not JSON: {e}"))?;
            origins_of(&oidc, &document)
        };
        let wait = match read.await {
            Ok(origins) => {
                let Some(policy) = policy.upgrade() else {
                    return;
                };
                *policy.current.write().expect("the policy lock") = csp(&origins);
                retry = Duration::from_secs(2);
                Duration::from_secs(3600)
            }
            Err(e) => {
                tracing::warn!(
                    "console sign-in: {e}; the console may reach the issuer's origin only until it is read"
                );
                retry = (retry * 2).min(Duration::from_secs(300));
                retry
            }
        };
        tokio::time::sleep(wait).await;
        if policy.strong_count() == 0 {
            return;
        }
    }
}

fn etag(asset: &Asset) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| format!("\"{}\"", &hex::encode(Sha256::digest(a.bytes))[..32]))
            .collect()
    });
    let i = ASSETS
        .iter()
        .position(|a| a.name == asset.name)
        .expect("an embedded asset");
    &tags[i]
}

fn serve(name: &str, headers: &HeaderMap, csp: &HeaderValue) -> Response {
    let Some(asset) = ASSETS.iter().find(|a| a.name == name) else {
        return ApiError::new(
            ErrorCode::NotFound,
            format!("the console has no file {name:?}: open {PATH}"),
        )
        .into_response();
    };
    let tag = etag(asset);
    let mut response = if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag))
    {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, asset.content_type)], asset.bytes).into_response()
    };
    let h = response.headers_mut();
    h.insert(header::ETAG, HeaderValue::from_static(tag));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::CONTENT_SECURITY_POLICY, csp.clone());
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// The console's routes: `/` and `/console` lead to it, `/console/` is its
/// page, `/console/config.json` how people sign in and what usage costs,
/// `/console/{file}` its files.
pub fn router<S: Clone + Send + Sync + 'static>(
    oidc: Option<Oidc>,
    prices: Option<crate::prices::Prices>,
) -> Router<S> {
    let policy = Policy::new(oidc.as_ref());
    let config = Arc::new(json!({ "oidc": oidc, "prices": prices }));
    let page_policy = policy.clone();
    Router::new()
        .route("/", get(|| async { Redirect::to(PATH) }))
        .route("/console", get(|| async { Redirect::permanent(PATH) }))
        .route(
            PATH,
            get(move |headers: HeaderMap| async move {
                serve("index.html", &headers, &page_policy.get())
            }),
        )
        .route(
            "/console/config.json",
            get(move || async move {
                (
                    [(header::CACHE_CONTROL, "no-store")],
                    Json(config.as_ref().clone()),
                )
            }),
        )
        .route(
            "/console/{file}",
            get(
                move |Path(file): Path<String>, headers: HeaderMap| async move {
                    serve(&file, &headers, &policy.get())
                },
            ),
        )
        .layer(CompressionLayer::new())
}
