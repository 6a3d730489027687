//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>), the two
//! things idemgate does with it: read a sender's `traceparent` (only for a
//! route with `trust_inbound_trace`) and write the one the consumer gets.
//! Pure functions, tested here.

use opentelemetry::trace::TraceState;
use std::str::FromStr;

use crate::store::TraceRef;

/// A sender's `traceparent`, if it is valid: version 00 exactly, or a
/// later version read by its first four fields (as the specification asks);
/// never version `ff`, an all-zero ID, or uppercase hex. Several
/// `traceparent` fields are invalid together. `tracestate` goes with it
/// when it parses (else an empty one, as the specification allows).
pub fn inbound(headers: &http::HeaderMap) -> Option<Parent> {
    let mut values = headers.get_all("traceparent").iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let (trace_id, span_id, flags) = parse_traceparent(value.as_bytes())?;
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags & 0x01 == 0x01,
        state: tracestate(headers),
    })
}

/// A sender's span context, as its valid `traceparent` and `tracestate`
/// gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
    /// The `tracestate` list, normalised ("" for none).
    pub state: String,
}

impl Parent {
    /// Its `traceparent`, written back (version 00, the sampled flag only).
    pub fn traceparent(&self) -> String {
        traceparent(&self.trace_id, &self.span_id, self.sampled)
    }
}

/// The sender's `tracestate`, several fields joined as the specification
/// says; an unparsable one is dropped ("").
fn tracestate(headers: &http::HeaderMap) -> String {
    let mut joined = String::new();
    for v in headers.get_all("tracestate") {
        let Ok(text) = v.to_str() else {
            return String::new();
        };
        if !joined.is_empty() {
            joined.push(',');
        }
        joined.push_str(text);
    }
    if joined.len() > 512 || !valid_tracestate(&joined) {
        // 512: the specification's bound for what a participant must carry
        return String::new();
    }
    TraceState::from_str(&joined).map_or_else(|_| String::new(), |s| s.header())
}

/// W3C's list: at most 32 `key=value` members (empty ones allowed), a key
/// of lowercase letters, digits and `_-*/` (one `@` for a tenant), a value
/// of printable ASCII without `,` and `=` that does not end in a space.
fn valid_tracestate(list: &str) -> bool {
    let mut members = 0;
    for member in list.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        members += 1;
        let Some((key, value)) = member.split_once('=') else {
            return false;
        };
        let key_ok = (1..=256).contains(&key.len())
            && key.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && key.matches('@').count() <= 1
            && key
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-*/@".contains(&b));
        let value_ok = (1..=256).contains(&value.len())
            && !value.ends_with(' ')
            && value
                .bytes()
                .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=');
        if !key_ok || !value_ok {
            return false;
        }
    }
    members <= 32
}

/// `version-traceid-parentid-flags` → (trace ID, span ID, flags).
pub fn parse_traceparent(v: &[u8]) -> Option<([u8; 16], [u8; 8], u8)> {
    if v.len() < 55 {
        return None;
    }
    let version = hex_byte(&v[0..2])?;
    if version == 0xff || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    match (version, v.len()) {
        (0, 55) => {}
        (0, _) => return None,
        // a later version may add fields after a dash
        (_, 55) => {}
        (_, _) if v[55] == b'-' => {}
        _ => return None,
    }
    // the IDs' rules (lowercase hex, neither all zero) are a stored
    // TraceRef's: `traceid-spanid` sits at 3..52
    let ids = TraceRef::from_stored(std::str::from_utf8(&v[3..52]).ok()?)?;
    let flags = hex_byte(&v[53..55])?;
    Some((ids.trace_id, ids.span_id, flags))
}

/// Two lowercase hex digits.
fn hex_byte(two: &[u8]) -> Option<u8> {
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(nibble(two[0])? << 4 | nibble(two[1])?)
}

/// The `traceparent` for a span: version 00, its IDs and its sampled flag.
pub fn traceparent(trace_id: &[u8; 16], span_id: &[u8; 8], sampled: bool) -> String {
    let ids = TraceRef {
        trace_id: *trace_id,
        span_id: *span_id,
    };
    let mut header = String::with_capacity(55);
    header.push_str("00-");
    ids.push_to(&mut header);
    header.push_str(if sampled { "-01" } else { "-00" });
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_valid_traceparent_is_read_and_written_back_the_same() {
        let cx = inbound(&headers(&[("traceparent", VALID)])).unwrap();
        assert!(cx.sampled);
        assert_eq!(cx.traceparent(), VALID);
        let unsampled = VALID.replace("-01", "-00");
        let cx = inbound(&headers(&[("traceparent", &unsampled)])).unwrap();
        assert!(!cx.sampled);
        // other flag bits are not carried on
        let other = VALID.replace("-01", "-ff");
        let cx = inbound(&headers(&[("traceparent", &other)])).unwrap();
        assert_eq!(cx.traceparent(), VALID);
    }

    #[test]
    fn every_invalid_form_is_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert!(
                inbound(&headers(&[("traceparent", bad)])).is_none(),
                "{bad:?}"
            );
        }
        // two of them
        assert!(inbound(&headers(&[("traceparent", VALID), ("traceparent", VALID)])).is_none());
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields() {
        let v = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        let cx = inbound(&headers(&[("traceparent", v)])).unwrap();
        assert_eq!(cx.traceparent(), VALID);
    }

    #[test]
    fn tracestate_goes_with_a_valid_parent() {
        let cx = inbound(&headers(&[
            ("traceparent", VALID),
            ("tracestate", "vendor=abc"),
            ("tracestate", "other=1"),
        ]))
        .unwrap();
        assert_eq!(cx.state, "vendor=abc,other=1");
        let cx = inbound(&headers(&[("traceparent", VALID), ("tracestate", "=,=")])).unwrap();
        assert_eq!(cx.state, "");
    }
}
