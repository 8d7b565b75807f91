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
    let none: serde_json::Value = plain()
        .get(format!("{}/console/config.json", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(none, serde_json::json!({"oidc": null}));

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
    let page = plain()
        .get(format!("{}/console/", s.base))
        .send()
        .await
        .unwrap();
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("connect-src 'self' https://id.example.com;"),
        "{csp}"
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
