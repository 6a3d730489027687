//! Hop-by-hop header fields (RFC 9110 §7.6.1): they describe one connection,
//! so the forwarded request and the relayed response drop them on every path
//! (guarded, read-whole unguarded, and pingora's streaming path): `Connection`,
//! `Keep-Alive`, `Proxy-Connection`, `Proxy-Authorization`,
//! `Proxy-Authenticate`, `TE`, `Trailer`, `Upgrade`, `HTTP2-Settings`, and
//! every header that `Connection` names. A sender's proxy credentials never
//! reach the consumer, and a consumer's connection details never reach the
//! sender. Without `Upgrade` no request is ever turned into a tunnel past the
//! router (an `Upgrade: h2c` or WebSocket handshake is forwarded as a plain
//! request, and a 101 from the upstream is an upstream failure).
//!
//! A nomination never removes the framing (`Content-Length`,
//! `Transfer-Encoding`) or `Host`: each path sets those itself.

use http::header::{HeaderMap, HeaderName};
use pingora::http::{RequestHeader, ResponseHeader};

/// Dropped in both directions whatever `Connection` says.
const ALWAYS: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "http2-settings",
];

/// Never removed because `Connection` names them.
const KEPT: [&str; 3] = ["host", "content-length", "transfer-encoding"];

/// The extension headers `Connection` names (beyond [`ALWAYS`]), for removal.
fn nominated(headers: &HeaderMap) -> Vec<HeaderName> {
    let mut out = Vec::new();
    for value in headers.get_all(http::header::CONNECTION) {
        for token in value.as_bytes().split(|&b| b == b',') {
            let Ok(name) = HeaderName::from_bytes(token.trim_ascii()) else {
                continue; // not a token: names no header
            };
            if !KEPT.contains(&name.as_str()) && !ALWAYS.contains(&name.as_str()) {
                out.push(name);
            }
        }
    }
    out
}

/// Drops the hop-by-hop headers from a request about to go upstream.
pub fn strip_request(req: &mut RequestHeader) {
    for name in nominated(&req.headers) {
        req.remove_header(&name);
    }
    for name in ALWAYS {
        req.remove_header(name);
    }
}

/// Drops the hop-by-hop headers from a response about to go to the sender.
pub fn strip_response(resp: &mut ResponseHeader) {
    for name in nominated(&resp.headers) {
        resp.remove_header(&name);
    }
    for name in ALWAYS {
        resp.remove_header(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> RequestHeader {
        let mut req = RequestHeader::build("POST", b"/x", None).unwrap();
        for (k, v) in headers {
            req.append_header(k.to_string(), *v).unwrap();
        }
        req
    }

    #[test]
    fn requests_lose_every_hop_by_hop_header_and_what_connection_names() {
        let mut req = request(&[
            ("Host", "h"),
            ("Content-Length", "5"),
            ("Connection", "keep-alive, X-Secret , Host, content-length"),
            ("Connection", "x-other"),
            ("Keep-Alive", "timeout=5"),
            ("Proxy-Authorization", "Basic c2VjcmV0"),
            ("Proxy-Connection", "keep-alive"),
            ("TE", "trailers"),
            ("Trailer", "X-T"),
            ("Upgrade", "h2c"),
            ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"),
            ("X-Secret", "s"),
            ("X-Other", "o"),
            ("X-Kept", "k"),
        ]);
        strip_request(&mut req);
        let names: Vec<&str> = req.headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["host", "content-length", "x-kept"]);
    }

    #[test]
    fn responses_lose_them_too() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        for (k, v) in [
            ("Content-Type", "text/plain"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "X-Internal, transfer-encoding"),
            ("X-Internal", "10.0.0.7"),
            ("Proxy-Authenticate", "Basic realm=x"),
            ("Keep-Alive", "timeout=5"),
            ("Upgrade", "websocket"),
        ] {
            resp.append_header(k.to_string(), v).unwrap();
        }
        strip_response(&mut resp);
        let names: Vec<&str> = resp.headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["content-type", "transfer-encoding"]);
    }

    #[test]
    fn malformed_nominations_name_nothing() {
        let mut req = request(&[("Connection", "\"x-a\", ,, x b"), ("X-A", "1")]);
        strip_request(&mut req);
        assert!(req.headers.contains_key("x-a"));
        assert!(!req.headers.contains_key("connection"));
    }
}
