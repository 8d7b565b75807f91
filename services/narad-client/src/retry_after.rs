//! `Retry-After` (RFC 9110 §10.2.3): how long a server that answered 429
//! (a limit) or 503 asked the client to wait before trying again. The SDK
//! waits at least that long, and never less than its own backoff.

use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};

/// The longest wait a `Retry-After` can impose on one retry.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The wait `Retry-After` asks for, in delta-seconds, capped at
/// [`MAX_RETRY_AFTER`]; `None` when absent or not a number of seconds (an
/// HTTP-date is left to the caller's own backoff).
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

/// The wait before the next try: the backoff, or longer when the server
/// asked for longer.
pub fn next_wait(backoff: Duration, asked: Option<Duration>) -> Duration {
    asked.map_or(backoff, |asked| asked.max(backoff))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, value.parse().unwrap());
        h
    }

    #[test]
    fn seconds_are_read_and_capped() {
        assert_eq!(retry_after(&headers("3")), Some(Duration::from_secs(3)));
        assert_eq!(retry_after(&headers(" 0 ")), Some(Duration::ZERO));
        assert_eq!(retry_after(&headers("86400")), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_after(&headers("Wed, 21 Oct 2026 07:28:00 GMT")), None);
        assert_eq!(retry_after(&headers("-1")), None);
        assert_eq!(retry_after(&HeaderMap::new()), None);
    }

    #[test]
    fn the_wait_is_never_shorter_than_the_backoff() {
        let b = Duration::from_millis(200);
        assert_eq!(next_wait(b, None), b);
        assert_eq!(next_wait(b, Some(Duration::ZERO)), b);
        assert_eq!(
            next_wait(b, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
    }
}
