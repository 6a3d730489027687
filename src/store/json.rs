//! A record as JSON: the one document that `events show|list --json` and the
//! admin API (SPEC §11) both print, so the two never disagree.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::{json, Value};

use super::{Attempt, Record};
use crate::claim::Millis;

/// RFC 3339 UTC with milliseconds.
pub fn timestamp(ms: Millis) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(t).to_string()
}

/// An RFC 3339 time in UTC (`2026-12-06T10:00:00Z`, with or without
/// fractions of a second, as [`timestamp`] writes it) in the store's
/// milliseconds: the time windows of `events release` and the admin API.
pub fn parse_time(text: &str) -> Result<Millis, String> {
    // humantime's weak form takes `T` or a space; past the seconds it
    // overlooks what follows a `Z`, and takes `+00:00`: one final `Z` only
    let utc = text.strip_suffix('Z').unwrap_or(text);
    if utc.contains(['Z', '+']) {
        return Err(format!("{text:?} is not an RFC 3339 time in UTC"));
    }
    let t = humantime::parse_rfc3339_weak(utc)
        .map_err(|e| format!("{text:?} is not an RFC 3339 time in UTC ({e})"))?;
    let ms = t
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{text:?} is before 1970"))?
        .as_millis();
    Millis::try_from(ms).map_err(|_| format!("{text:?} is too far ahead"))
}

/// A record as JSON: the SPEC §3 field names (and §19's `trace_id` and
/// `span_id`); `null` where unset. The
/// replay body itself is never part of it, only its size.
pub fn record_json(r: &Record) -> Value {
    let ts = |v: Option<Millis>| v.map(timestamp);
    let mut doc = json!({
        "route": r.route,
        "event_id": r.event_id,
        "body_sha256": r.body_sha256,
        "state": r.state.as_str(),
        "attempts": r.attempts,
        "lease_until": ts(r.lease_until),
        "last_status": r.last_status,
        "last_error": r.last_error,
        "first_seen_at": timestamp(r.first_seen_at),
        "updated_at": timestamp(r.updated_at),
        "delivered_at": ts(r.delivered_at),
        "expires_at": timestamp(r.expires_at),
        // SPEC §19: the latest send's IDs, hex; null when it was not traced
        "trace_id": r.trace_id,
        "span_id": r.span_id,
    });
    if r.replay_status.is_some() {
        doc["replay_status"] = json!(r.replay_status);
        doc["replay_content_type"] = json!(r.replay_content_type);
        doc["replay_body_bytes"] = json!(r.replay_body_bytes);
    }
    if let Some(history) = &r.history {
        doc["history"] = Value::Array(history.iter().map(attempt_json).collect());
    }
    doc
}

/// One attempt (SPEC §13) as JSON, times as the record's are.
pub fn attempt_json(a: &Attempt) -> Value {
    json!({
        "attempt": a.attempt,
        "started_at": timestamp(a.started_at),
        "ended_at": a.ended_at.map(timestamp),
        "status": a.status,
        "result": a.result,
        "error": a.error,
        "duration_ms": a.duration_ms,
        "instance": a.instance,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ClaimRequest;

    /// SPEC §19: the latest send's IDs are always printed, `null` when the
    /// send was not traced.
    #[test]
    fn the_latest_sends_ids_are_printed_or_null() {
        let mut r = Record::claimed(&ClaimRequest {
            route: "r",
            event_id: "e",
            digest: "d",
            now: 1,
            lease_ms: 1,
            retention_ms: 2,
            hold: false,
            instance: "test",
            token: 0,
            trace: None,
        });
        let doc = record_json(&r);
        assert_eq!(doc["trace_id"], Value::Null, "{doc}");
        assert_eq!(doc["span_id"], Value::Null, "{doc}");
        assert!(doc.as_object().unwrap().contains_key("trace_id"));
        let send = crate::store::TraceRef {
            trace_id: [0xab; 16],
            span_id: [0x01; 8],
        };
        (r.trace_id, r.span_id) = crate::store::TraceRef::record_ids(Some(send));
        let doc = record_json(&r);
        assert_eq!(doc["trace_id"], json!("ab".repeat(16)));
        assert_eq!(doc["span_id"], json!("01".repeat(8)));
    }

    #[test]
    fn times_read_back_what_timestamp_writes() {
        for ms in [0, 1_700_000_000_123, 1_800_000_000_000] {
            assert_eq!(parse_time(&timestamp(ms)), Ok(ms), "{}", timestamp(ms));
        }
        assert_eq!(parse_time("2026-12-06T10:00:00Z"), Ok(1_796_551_200_000));
        assert_eq!(parse_time("2026-12-06T10:00:00"), Ok(1_796_551_200_000));
        for bad in [
            "",
            "yesterday",
            "2026-12-06T10:00:00+02:00",
            "2026-12-06T10:00:00ZZ",
            "2026-12-06T10:00:00Zjunk",
            "2026-12-06T10:00:00.5Zjunk",
            "2026-13-01T00:00:00Z",
            "1969-12-31T23:59:59Z",
        ] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
    }
}
