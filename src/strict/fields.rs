//! Request header fields judged after routing (SPEC §4, "Strictness"):
//! names holding `_`, which are dropped before anything is forwarded;
//! values holding bytes outside ASCII (`obs-text`), which are refused —
//! but for one exempt field, the route's own event-ID header, whose
//! invalid values are the route's `invalid-event-id` (SPEC §4's table);
//! and the section's size. The caller knows the route; the rules are here.
//! Also the two classes of fields that no route setting may name and no
//! replay repeats, each written once: hop-by-hop and framing fields.

use http::HeaderName;
use pingora::http::RequestHeader;

/// Largest request header section accepted (pingora's own limit is far higher).
pub const MAX_HEADER_SECTION: usize = 64 * 1024;

/// Largest head the listener reads: [`MAX_HEADER_SECTION`] plus room for
/// the request line.
pub const MAX_HEAD: usize = MAX_HEADER_SECTION + 8 * 1024;

/// What the header fields break once the route (if any) is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldFault {
    /// The section is over [`MAX_HEADER_SECTION`] (431).
    TooLarge,
    /// A value other than the exempt field's holds a byte outside ASCII (400).
    ObsText,
}

/// Judges the fields: one walk for both the size and whether any value is
/// not ASCII at all; `exempt` (the field whose values the route judges
/// itself) is looked up only then.
pub fn judge<'r>(
    req: &'r RequestHeader,
    exempt: impl FnOnce() -> Option<&'r HeaderName>,
) -> Option<FieldFault> {
    let (mut bytes, mut obs_text) = (0, false);
    for (k, v) in req.headers.iter() {
        bytes += k.as_str().len() + v.len() + 4;
        obs_text |= !v.as_bytes().is_ascii();
    }
    if bytes > MAX_HEADER_SECTION {
        return Some(FieldFault::TooLarge);
    }
    (obs_text && has_obs_text(req, exempt())).then_some(FieldFault::ObsText)
}

/// Drops the fields whose names hold `_`: a consumer stack that reads `_`
/// as `-` (CGI-style frameworks do) would see a second `Content-Length` or
/// `Transfer-Encoding` beside idemgate's framing. nginx drops them too
/// (`underscores_in_headers off`). How many fields were dropped.
pub fn drop_underscored(req: &mut RequestHeader) -> u64 {
    let underscored = |k: &HeaderName| k.as_str().bytes().any(|b| b == b'_');
    if !req.headers.keys().any(underscored) {
        return 0; // the common case: no allocation
    }
    let names: Vec<HeaderName> = req
        .headers
        .keys()
        .filter(|k| underscored(k))
        .cloned()
        .collect();
    let mut dropped = 0;
    for name in names {
        dropped += req.headers.get_all(&name).iter().count() as u64;
        req.remove_header(&name);
    }
    dropped
}

/// A hop-by-hop field of either direction (RFC 9110 §7.6.1), by its
/// lowercase name: it describes one connection. `HTTP2-Settings` is not
/// here: only a request carries it (h2c's upgrade).
pub fn is_hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection" | "keep-alive" | "te" | "trailer" | "upgrade"
    ) || name.starts_with("proxy-")
}

/// A framing field, by its lowercase name: it describes one message.
pub fn is_framing(name: &str) -> bool {
    matches!(name, "content-length" | "transfer-encoding")
}

/// Whether a field other than `exempt` has a byte outside ASCII in its value.
pub fn has_obs_text(req: &RequestHeader, exempt: Option<&HeaderName>) -> bool {
    req.headers
        .iter()
        .any(|(name, value)| Some(name) != exempt && !value.as_bytes().is_ascii())
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_framing_fields_are_told_apart() {
        for name in [
            "connection",
            "keep-alive",
            "te",
            "trailer",
            "upgrade",
            "proxy-authorization",
        ] {
            assert!(is_hop_by_hop(name) && !is_framing(name), "{name}");
        }
        for name in ["content-length", "transfer-encoding"] {
            assert!(is_framing(name) && !is_hop_by_hop(name), "{name}");
        }
        for name in ["host", "content-type", "http2-settings", "set-cookie"] {
            assert!(!is_hop_by_hop(name) && !is_framing(name), "{name}");
        }
    }

    #[test]
    fn underscored_fields_are_dropped_and_counted() {
        let mut req = RequestHeader::build("POST", b"/h", None).unwrap();
        req.append_header("Transfer_Encoding", "chunked").unwrap();
        req.append_header("content_length", "5").unwrap();
        req.append_header("Content_Length", "6").unwrap();
        req.append_header("X-Event-ID", "e").unwrap();
        assert_eq!(drop_underscored(&mut req), 3);
        let names: Vec<&str> = req.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-event-id"]);
        assert_eq!(drop_underscored(&mut req), 0);
    }

    #[test]
    fn obs_text_outside_the_exempt_field() {
        let mut req = RequestHeader::build("POST", b"/h", None).unwrap();
        req.append_header(
            "X-Event-ID",
            http::HeaderValue::from_bytes(b"\xe9vt").unwrap(),
        )
        .unwrap();
        let id = HeaderName::from_static("x-event-id");
        assert!(has_obs_text(&req, None));
        assert!(!has_obs_text(&req, Some(&id)));
        req.append_header("X-Note", http::HeaderValue::from_bytes(b"caf\xe9").unwrap())
            .unwrap();
        assert!(has_obs_text(&req, Some(&id)));
    }

    #[test]
    fn the_section_s_size_is_judged_before_its_bytes() {
        let mut req = RequestHeader::build("POST", b"/h", None).unwrap();
        req.append_header("X-Note", http::HeaderValue::from_bytes(b"caf\xe9").unwrap())
            .unwrap();
        assert_eq!(judge(&req, || None), Some(FieldFault::ObsText));
        let note = HeaderName::from_static("x-note");
        assert_eq!(judge(&req, || Some(&note)), None);
        req.append_header("X-Big", "a".repeat(MAX_HEADER_SECTION))
            .unwrap();
        assert_eq!(judge(&req, || Some(&note)), Some(FieldFault::TooLarge));
    }
}
