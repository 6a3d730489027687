//! The HTTP pieces the admin API and the console share: percent-decoding of
//! path segments and query strings, the `Host` check, the response headers
//! every answer carries, and problem+json refusals.

use http::{header, HeaderValue, Method, Response, StatusCode};
use serde_json::Value;

use crate::problem::{AdminKind, Problem, ProblemKind};

/// The parts of a request the API looks at (a seam for unit tests).
pub struct ApiRequest<'a> {
    pub method: &'a Method,
    /// Still percent-encoded.
    pub path: &'a str,
    pub query: Option<&'a str>,
    /// Every `Authorization` header's value.
    pub authorization: Vec<&'a [u8]>,
    /// For the log line of an action.
    pub peer: String,
    /// The body, read whole (at most [`super::MAX_BODY`] bytes): an
    /// action's JSON document.
    pub body: &'a [u8],
}

/// What every API and console answer carries: nothing is cached, nothing is
/// sniffed into another type, nothing is framed, no referrer leaves.
const COMMON_HEADERS: &[(&str, &str)] = &[
    ("cache-control", "no-store"),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
    ("cross-origin-resource-policy", "same-origin"),
];

/// A JSON document is never a page: it may load nothing and run nothing.
const DATA_CSP: &str = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'";

/// One answer with the common headers and a Content-Security-Policy.
pub fn response(
    status: StatusCode,
    content_type: &'static str,
    csp: &'static str,
    body: Vec<u8>,
) -> Response<Vec<u8>> {
    let mut b = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CONTENT_LENGTH, body.len())
        .header(header::CONTENT_SECURITY_POLICY, csp);
    for (k, v) in COMMON_HEADERS {
        b = b.header(*k, *v);
    }
    b.body(body).expect("static response parts are valid")
}

pub fn json(status: StatusCode, doc: &Value) -> Response<Vec<u8>> {
    let body = serde_json::to_vec(doc).expect("a JSON value always serialises");
    response(status, "application/json", DATA_CSP, body)
}

/// The admin API's problems, as its handlers give them.
impl Problem {
    pub fn bad_query(detail: impl Into<String>) -> Problem {
        Problem::admin(AdminKind::InvalidQuery, detail)
    }

    pub fn no_endpoint(detail: impl Into<String>) -> Problem {
        Problem::admin(AdminKind::NoEndpoint, detail)
    }

    /// 400: an action's body is missing, not JSON, or not what it takes.
    pub fn bad_body(detail: impl Into<String>) -> Problem {
        Problem::new(ProblemKind::InvalidBody, detail)
    }

    /// 404 for a record that does not exist.
    pub fn not_found(route: &str, id: &str) -> Problem {
        let detail = format!("route `{}` has no record of this event ID", shown(route));
        Problem::admin(AdminKind::NotFound, detail).with_event_id(Some(id))
    }

    /// 503 for a store that failed; its own error text goes to the log, not
    /// to the client.
    pub fn store(e: crate::store::StoreError) -> Problem {
        tracing::warn!(error = %e, "admin API: store operation failed");
        Problem::new(
            ProblemKind::StoreUnavailable,
            "the claim store did not answer; idemgate's log says why",
        )
    }

    /// 405 with the methods the resource takes.
    pub fn method_not_allowed(allow: &'static str) -> Problem {
        let detail = format!("this resource answers {allow}");
        Problem {
            allow: Some(allow),
            ..Problem::admin(AdminKind::MethodNotAllowed, detail)
        }
    }

    /// The admin API's answer: the problem+json document with the common
    /// headers, and `WWW-Authenticate` (401), `Retry-After` (503) or
    /// `Allow` (405).
    pub fn into_response(self) -> Response<Vec<u8>> {
        let status = StatusCode::from_u16(self.status()).expect("problem statuses are valid");
        let mut resp = response(status, crate::problem::CONTENT_TYPE, DATA_CSP, self.body());
        match status {
            StatusCode::UNAUTHORIZED => {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"idemgate admin\""),
                );
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        if let Some(allow) = self.allow {
            resp.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        resp
    }
}

/// 405 with the methods the resource takes.
pub fn method_not_allowed(allow: &'static str) -> Response<Vec<u8>> {
    Problem::method_not_allowed(allow).into_response()
}

/// Decodes `%XX` escapes (and `+` as a space when `plus_is_space`, as in a
/// query string). `None` for a malformed escape or text that is not UTF-8:
/// `percent-encoding` (and `form_urlencoded`, which also decodes lossily)
/// would pass a malformed escape on as text, and a name that is a guess
/// must not reach a record.
pub fn percent_decode(s: &str, plus_is_space: bool) -> Option<String> {
    let bytes = s.as_bytes();
    let escapes_whole = bytes.iter().enumerate().all(|(i, &b)| {
        b != b'%'
            || bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    });
    if !escapes_whole {
        return None;
    }
    let spaced;
    let s = if plus_is_space && s.contains('+') {
        spaced = s.replace('+', " ");
        &spaced
    } else {
        s
    };
    let decoded = percent_encoding::percent_decode_str(s).decode_utf8().ok()?;
    Some(decoded.into_owned())
}

/// The path's segments after `prefix`, each percent-decoded (so `%2F` is a
/// `/` inside a segment, never a separator). A segment with a control
/// character (NUL included) cannot name a record: `Err`.
pub fn segments(path: &str, prefix: &str) -> Option<Result<Vec<String>, Problem>> {
    let rest = path.strip_prefix(prefix)?;
    let mut out = Vec::new();
    for raw in rest.split('/') {
        let Some(seg) = percent_decode(raw, false) else {
            return Some(Err(invalid_path(
                "a path segment has a malformed %-escape or is not UTF-8",
            )));
        };
        if seg.chars().any(char::is_control) {
            return Some(Err(invalid_path(
                "a path segment holds a control character",
            )));
        }
        out.push(seg);
    }
    Some(Ok(out))
}

fn invalid_path(detail: &str) -> Problem {
    Problem::admin(AdminKind::InvalidPath, detail)
}

/// The query string as decoded pairs; a repeated name is refused (which of
/// two values would count is a guess).
pub fn query_pairs(query: Option<&str>) -> Result<Vec<(String, String)>, Problem> {
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (Some(k), Some(v)) = (percent_decode(k, true), percent_decode(v, true)) else {
            return Err(Problem::bad_query(
                "the query string has a malformed %-escape or is not UTF-8",
            ));
        };
        if out.iter().any(|(name, _)| *name == k) {
            return Err(Problem::bad_query(format!(
                "`{}` is given twice",
                shown(&k)
            )));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// A parameter name or value for a message: bounded, and only as JSON text
/// (the message is JSON and read as text; nothing here is ever markup).
pub fn shown(s: &str) -> String {
    let mut t: String = s.chars().take(64).collect();
    if t.len() < s.len() {
        t.push('…');
    }
    t
}

/// True for a `Host` that names the loopback interface: `localhost`, an
/// IPv4 literal in 127.0.0.0/8 or `[::1]`, with or without a port. A page
/// from another site that points its own name at 127.0.0.1 (DNS rebinding)
/// sends its own name here, so it is refused.
/// Whether `req`'s `Host` names loopback ([`loopback_host`]); a request
/// without one passes.
pub fn loopback_host_of(req: &pingora::http::RequestHeader) -> bool {
    let host = req.headers.get(http::header::HOST);
    host.map(|h| h.to_str().unwrap_or("\u{fffd}"))
        .is_none_or(loopback_host)
}

pub fn loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((ip, "")) => ip,
            Some((ip, port)) if port.strip_prefix(':').is_some_and(is_port) => ip,
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return false,
            None => host,
        }
    };
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    name.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

fn is_port(p: &str) -> bool {
    p.parse::<u16>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_escapes_and_refuses_broken_ones() {
        assert_eq!(percent_decode("a%2Fb", false).unwrap(), "a/b");
        assert_eq!(percent_decode("a%2fb%25", false).unwrap(), "a/b%");
        assert_eq!(percent_decode("a+b", false).unwrap(), "a+b");
        assert_eq!(percent_decode("a+b", true).unwrap(), "a b");
        assert_eq!(percent_decode("%3Cimg%3E", false).unwrap(), "<img>");
        assert_eq!(percent_decode("%E2%82%AC", false).unwrap(), "€");
        for bad in ["%", "%2", "%zz", "a%G0", "%FF", "%C3"] {
            assert_eq!(percent_decode(bad, false), None, "{bad}");
        }
    }

    #[test]
    fn segments_keep_an_encoded_slash_inside() {
        let segs = segments("/api/events/r/a%2Fb%2Fc", "/api/events/")
            .unwrap()
            .unwrap();
        assert_eq!(segs, ["r", "a/b/c"]);
        let segs = segments("/api/events/r/x/release", "/api/events/")
            .unwrap()
            .unwrap();
        assert_eq!(segs, ["r", "x", "release"]);
        assert!(segments("/api/other", "/api/events/").is_none());
        assert!(segments("/api/events/r/a%00", "/api/events/")
            .unwrap()
            .is_err());
        assert!(segments("/api/events/r/%0A", "/api/events/")
            .unwrap()
            .is_err());
        assert!(segments("/api/events/r/%zz", "/api/events/")
            .unwrap()
            .is_err());
    }

    #[test]
    fn query_pairs_decode_and_refuse_repeats() {
        let q = query_pairs(Some("route=a&prefix=evt%5F1+x&limit=5&flag")).unwrap();
        assert_eq!(
            q,
            [
                ("route".to_string(), "a".to_string()),
                ("prefix".to_string(), "evt_1 x".to_string()),
                ("limit".to_string(), "5".to_string()),
                ("flag".to_string(), String::new()),
            ]
        );
        assert!(query_pairs(None).unwrap().is_empty());
        assert!(query_pairs(Some("&&")).unwrap().is_empty());
        assert_eq!(query_pairs(Some("a=1&a=2")).unwrap_err().status(), 400);
        assert_eq!(query_pairs(Some("a=%")).unwrap_err().status(), 400);
    }

    #[test]
    fn loopback_hosts() {
        for ok in [
            "localhost",
            "LOCALHOST:9090",
            "127.0.0.1",
            "127.0.0.1:9090",
            "127.1.2.3:1",
            "[::1]",
            "[::1]:9090",
        ] {
            assert!(loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:9090",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "10.0.0.1:9090",
            "[::2]:80",
            "[::1]x",
            "[::1]9090",
            "127.0.0.1:x",
            "",
        ] {
            assert!(!loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn problems_are_problem_json_with_their_headers() {
        let r = Problem::admin(AdminKind::Unauthorized, "d")
            .with_event_id(Some("e"))
            .into_response();
        assert_eq!(r.status(), 401);
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        assert!(r.headers().contains_key("www-authenticate"));
        let doc: Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(doc["type"], "urn:idemgate:problem:unauthorized");
        assert_eq!(doc["status"], 401);
        assert_eq!(doc["event_id"], "e");
        let r = method_not_allowed("POST");
        assert_eq!(r.status(), 405);
        assert_eq!(r.headers()["allow"], "POST");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    }
}
