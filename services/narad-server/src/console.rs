//! The console (`/console`): the built files of `console/dist`, embedded in
//! the binary so that `narad serve` gives a working console on a machine
//! with no Node toolchain. Same origin as the API, so the console's calls
//! need no CORS; a strict Content-Security-Policy (scripts and styles from
//! this origin only, no `eval`: the console's schema validators are
//! compiled ahead of time); gzip when the browser takes it; `ETag`s, so a
//! reload revalidates instead of downloading again.

use std::sync::OnceLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
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

macro_rules! asset {
    ($name:literal, $type:literal) => {
        Asset {
            name: $name,
            content_type: $type,
            bytes: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../console/dist/",
                $name
            )),
        }
    };
}

const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("console.js", "text/javascript; charset=utf-8"),
    asset!("console.css", "text/css; charset=utf-8"),
];

/// The policy of every console response: this origin's scripts, styles and
/// connections only; no frames, no plugins, no base or form elsewhere.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; \
                   connect-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

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

fn serve(name: &str, headers: &HeaderMap) -> Response {
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
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
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
/// page, `/console/{file}` its files.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { Redirect::to(PATH) }))
        .route("/console", get(|| async { Redirect::permanent(PATH) }))
        .route(
            PATH,
            get(|headers: HeaderMap| async move { serve("index.html", &headers) }),
        )
        .route(
            "/console/{file}",
            get(|Path(file): Path<String>, headers: HeaderMap| async move {
                serve(&file, &headers)
            }),
        )
        .layer(CompressionLayer::new())
}
