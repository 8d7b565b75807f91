//! Server base URLs and the endpoints under them, shared by the SDK's
//! clients.

use reqwest::Url;

/// A base URL (`http://host:8080` or `https://…`, possibly with a path
/// prefix) that takes a path; the reason it is not one otherwise.
pub(crate) fn base_url(base: &str) -> Result<Url, String> {
    let url = Url::parse(base.trim_end_matches('/'))
        .map_err(|e| format!("{base}: not a base URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return Err(format!("{base}: not an http:// or https:// base URL"));
    }
    Ok(url)
}

/// `base` with these path segments appended (each one percent-encoded).
pub(crate) fn endpoint(base: &Url, segments: &[&str]) -> Url {
    let mut url = base.clone();
    url.path_segments_mut()
        .expect("checked by base_url")
        .pop_if_empty()
        .extend(segments);
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_encode_their_segments() {
        let base = base_url("http://h:1/prefix/").unwrap();
        assert_eq!(
            endpoint(&base, &["v1", "executors", "a/b c", "finish"]).as_str(),
            "http://h:1/prefix/v1/executors/a%2Fb%20c/finish"
        );
        assert!(base_url("ftp://h").is_err());
        assert!(base_url("mailto:x@y").is_err());
    }
}
