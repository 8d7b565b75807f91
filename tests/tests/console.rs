//! The console's files, served from inside the binary: where they are, the
//! headers that keep the page safe, revalidation and compression. What the
//! console does is tested in Chromium (tests/browser/console.test.mjs).

use narad_tests::*;
use reqwest::redirect::Policy;

fn plain() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap()
}

/// What `/console/config.json` tells the console.
async fn config_of(s: &Server) -> serde_json::Value {
    plain()
        .get(format!("{}/console/config.json", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_console_is_served_with_a_strict_policy() {
    let s = Server::start().await;
    let http = plain();

    for (from, to) in [("/", "/console/"), ("/console", "/console/")] {
        let r = http.get(format!("{}{from}", s.base)).send().await.unwrap();
        assert!(r.status().is_redirection(), "{from}: {}", r.status());
        assert_eq!(r.headers()["location"], to, "{from}");
    }

    let page = http
        .get(format!("{}/console/", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let h = page.headers().clone();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["referrer-policy"], "no-referrer");
    let csp = h["content-security-policy"].to_str().unwrap();
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{directive} in {csp}");
    }
    assert!(
        !csp.contains("unsafe"),
        "no unsafe-inline or unsafe-eval: {csp}"
    );
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"<script type="module" src="console.js">"#));

    let script = http
        .get(format!("{}/console/console.js", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(script.status(), 200);
    assert_eq!(
        script.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    assert!(script.bytes().await.unwrap().len() > 10_000);

    let missing = http
        .get(format!("{}/console/nothing.js", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let body: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(body["code"], "NRD-0007");
}

#[tokio::test]
async fn console_files_revalidate_by_etag_and_travel_compressed() {
    let s = Server::start().await;
    let http = plain();
    let url = format!("{}/console/console.js", s.base);

    let first = http.get(&url).send().await.unwrap();
    let tag = first.headers()["etag"].to_str().unwrap().to_owned();
    assert_eq!(first.headers()["cache-control"], "no-cache");
    let whole = first.bytes().await.unwrap().len();

    let again = http
        .get(&url)
        .header("if-none-match", &tag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 304);
    assert!(again.bytes().await.unwrap().is_empty());

    let gzipped = http
        .get(&url)
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(gzipped.status(), 200);
    assert_eq!(gzipped.headers()["content-encoding"], "gzip");
    let sent = gzipped.bytes().await.unwrap().len();
    assert!(
        sent * 4 < whole,
        "gzip sends {sent} bytes of {whole}: less than a quarter"
    );
}

#[tokio::test]
async fn the_console_learns_how_people_sign_in() {
    let s = Server::start().await;
    let none = config_of(&s).await;
    assert_eq!(none, serde_json::json!({"oidc": null, "prices": null}));

    let oidc = narad_server::console::Oidc::from_settings(
        Some("https://id.example.com/realms/acme/"),
        Some("narad-console"),
        " openid   narad ",
        "https://narad.example.com/api",
    )
    .unwrap()
    .unwrap();
    let s = Server::start_with_console_oidc(oidc).await;
    let answer = plain()
        .get(format!("{}/console/config.json", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.headers()["cache-control"], "no-store");
    let config: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(
        config["oidc"],
        serde_json::json!({
            "issuer": "https://id.example.com/realms/acme/",
            "clientId": "narad-console",
            "scopes": "openid narad",
            "audience": "https://narad.example.com/api",
        })
    );
    // The page may talk to the issuer (discovery, the token exchange), and
    // to nothing else.
    let csp = csp_of(&s.base).await;
    assert!(
        csp.contains("connect-src 'self' https://id.example.com;"),
        "{csp}"
    );
}

#[tokio::test]
async fn the_console_learns_the_operators_prices() {
    let prices = narad_server::prices::Prices::from_settings(
        Some(r#"{"small-1": {"inputTokens": 0.15, "outputTokens": 0.6}, "*": {"inputTokens": 3}}"#),
        "EUR",
    )
    .unwrap()
    .unwrap();
    let s = Server::start_with_console_prices(prices).await;
    let config = config_of(&s).await;
    assert_eq!(
        config["prices"],
        serde_json::json!({
            "currency": "EUR",
            "perMillion": {"*": {"inputTokens": 3.0}, "small-1": {"inputTokens": 0.15, "outputTokens": 0.6}},
        })
    );
}

#[test]
fn console_sign_in_settings_are_checked() {
    use narad_server::console::Oidc;
    assert_eq!(Oidc::from_settings(None, None, "openid", "narad"), Ok(None));
    assert!(
        Oidc::from_settings(Some("http://id.example.com"), Some("c"), "openid", "narad")
            .unwrap_err()
            .contains("https")
    );
    assert!(
        Oidc::from_settings(Some("https://id.example.com"), None, "openid", "narad")
            .unwrap_err()
            .contains("NARAD_CONSOLE_CLIENT_ID")
    );
    assert!(
        Oidc::from_settings(Some("http://127.0.0.1:9000"), Some("c"), "openid", "narad")
            .unwrap()
            .is_some(),
        "http on the loopback is for development"
    );
}

/// The Content-Security-Policy the console's page is served with.
async fn csp_of(base: &str) -> String {
    let page = plain()
        .get(format!("{base}/console/"))
        .send()
        .await
        .unwrap();
    page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned()
}

/// An identity provider's discovery document on this machine: its issuer
/// is `http://127.0.0.1:<port>`, its token endpoint on `token_origin`.
async fn discovery(token_origin: &str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    let document = serde_json::json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{issuer}/auth"),
        "token_endpoint": format!("{token_origin}/oauth2/token"),
        "jwks_uri": format!("{issuer}/jwks"),
    });
    let app = axum::Router::new().route(
        "/.well-known/openid-configuration",
        axum::routing::get(move || async move { axum::Json(document) }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    issuer
}

#[tokio::test]
async fn the_console_may_reach_a_token_endpoint_on_another_origin() {
    // Many providers exchange codes at another origin than the issuer's
    // (accounts.google.com → oauth2.googleapis.com): the policy names the
    // token endpoint's origin once the discovery document is read.
    let token_origin = "http://localhost:7";
    let issuer = discovery(token_origin).await;
    let oidc =
        narad_server::console::Oidc::from_settings(Some(&issuer), Some("c"), "openid", "narad")
            .unwrap()
            .unwrap();
    let s = Server::start_with_console_oidc(oidc).await;
    let expected = format!("connect-src 'self' {issuer} {token_origin};");
    let mut seen = String::new();
    for _ in 0..100 {
        seen = csp_of(&s.base).await;
        if seen.contains(&expected) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("the policy never named the token endpoint's origin: {seen}");
}

#[tokio::test]
async fn a_discovery_document_of_another_issuer_adds_nothing() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let issuer = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/.well-known/openid-configuration",
        axum::routing::get(|| async {
            axum::Json(serde_json::json!({
                "issuer": "https://elsewhere.example.com",
                "token_endpoint": "https://elsewhere.example.com/token",
            }))
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let oidc =
        narad_server::console::Oidc::from_settings(Some(&issuer), Some("c"), "openid", "narad")
            .unwrap()
            .unwrap();
    let s = Server::start_with_console_oidc(oidc).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let csp = csp_of(&s.base).await;
    assert!(
        csp.contains(&format!("connect-src 'self' {issuer};")),
        "{csp}"
    );
    assert!(!csp.contains("elsewhere"), "{csp}");
}
