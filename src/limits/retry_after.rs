//! An upstream's `Retry-After`, which opens the route's breaker that long.

use std::time::Duration;

use super::breaker::MAX_PUSHBACK;

/// `Retry-After`'s value (RFC 9110 §10.2.3): delay-seconds, or an HTTP
/// date (`now` the wall clock); `None` when it is neither.
pub fn retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // a huge number is capped, never an error
        return Some(Duration::from_secs(v.parse().unwrap_or(u64::MAX)).min(MAX_PUSHBACK));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}
