//! Parsers for single values with their own grammar. Each returns a message
//! fit for `file:line:col: path: message`.

use super::model::UpstreamUrl;
use crate::claim::json_pointer::{JsonPointer, PointerError};
use crate::strict::fields::{is_framing, is_hop_by_hop};

/// `[a-z0-9_-]{1,64}`.
pub fn route_name(name: &str) -> Result<(), String> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if name.is_empty() || name.len() > 64 || !ok_chars {
        return Err(format!(
            "invalid route name `{name}`: use 1 to 64 characters from a-z, 0-9, `_` and `-`"
        ));
    }
    Ok(())
}

/// Must start with `/`; one trailing `/` is removed except for `/` itself.
pub fn path_prefix(prefix: &str) -> Result<String, String> {
    if !prefix.starts_with('/') {
        return Err(format!("path_prefix `{prefix}` must start with `/`"));
    }
    if prefix.contains(['?', '#']) || prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "path_prefix `{prefix}` must be a plain path (no query, fragment or whitespace)"
        ));
    }
    // Requests are matched in their normal form: a prefix in any other form
    // could never match.
    match crate::path::normalise(prefix) {
        Ok(normal) if normal == prefix => {}
        Ok(normal) => {
            return Err(format!(
                "path_prefix `{prefix}` is not in normal form: requests are matched after RFC 3986 normalisation, write `{normal}`"
            ))
        }
        Err(e) => return Err(format!("path_prefix `{prefix}`: {e}")),
    }
    let normalised = match prefix.strip_suffix('/') {
        Some(p) if !p.is_empty() => p,
        _ => prefix,
    };
    Ok(normalised.to_string())
}

/// A host to match against the request's host: lowercased, no port (the
/// request's port is never compared, so a route with one would never
/// match), one trailing dot dropped as in the request's. An IPv6 literal
/// keeps its brackets.
pub fn match_host(host: &str) -> Result<String, String> {
    let h = host.trim();
    let ok = !h.is_empty()
        && h.chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-_:[]".contains(c));
    if !ok {
        return Err(format!(
            "invalid host `{host}`: expected a host name such as hooks.example.com (no scheme or path)"
        ));
    }
    let port = match h.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((addr, "")) if addr.parse::<std::net::Ipv6Addr>().is_ok() => false,
            Some((addr, after))
                if addr.parse::<std::net::Ipv6Addr>().is_ok() && after.starts_with(':') =>
            {
                true
            }
            _ => {
                return Err(format!(
                    "invalid host `{host}`: expected an IPv6 address in brackets such as [::1]"
                ))
            }
        },
        None if h.contains(['[', ']']) => {
            return Err(format!(
                "invalid host `{host}`: brackets only enclose an IPv6 address"
            ))
        }
        None => h.contains(':'),
    };
    if port {
        return Err(format!(
            "host `{host}` has a port: match.host matches the host name only (the request's port is not compared), write it without `:port`"
        ));
    }
    let h = h.strip_suffix('.').filter(|h| !h.is_empty()).unwrap_or(h);
    Ok(h.to_ascii_lowercase())
}

/// A header name (stored in canonical lowercase).
pub fn header_name(name: &str) -> Result<http::HeaderName, String> {
    http::HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("`{name}` is not a valid HTTP header name"))
}

/// `idempotency_key_header`: a header name idemgate may set on the forwarded
/// request. Not a framing, hop-by-hop or `Host` header: idemgate drops or
/// rewrites those itself, and an event ID there (`Transfer-Encoding:
/// chunked`) would change how the upstream reads the request. Not `Expect`
/// either, which idemgate answers and strips.
pub fn idempotency_key_header(name: &str) -> Result<http::HeaderName, String> {
    let h = header_name(name)?;
    let s = h.as_str();
    let reserved =
        is_framing(s) || is_hop_by_hop(s) || matches!(s, "host" | "expect" | "http2-settings");
    if reserved {
        return Err(format!(
            "`{name}` cannot carry the idempotency key: idemgate sets the framing, hop-by-hop and Host headers of the forwarded request itself (use e.g. Idempotency-Key)"
        ));
    }
    Ok(h)
}

/// A `replay_headers` name (SPEC §22): a header of the delivered response
/// that a replay repeats. Never `Set-Cookie` (a session handed out twice),
/// a hop-by-hop or framing header (they belong to one connection and one
/// message), or one idemgate writes on a replay itself (`Content-Type`
/// with `replay_body`, `Idempotent-Replayed`, `Idempotency-Status`).
pub fn replay_header(name: &str) -> Result<http::HeaderName, String> {
    let h = header_name(name)?;
    let s = h.as_str();
    let why = match s {
        "set-cookie" => "a replay must not hand out the first delivery's cookie again",
        _ if is_hop_by_hop(s) => "a hop-by-hop header belongs to one connection",
        _ if is_framing(s) => "a framing header belongs to one message",
        "content-type" | "idempotent-replayed" | "idempotency-status" => {
            "idemgate writes it on a replay itself (Content-Type with replay_body)"
        }
        _ => return Ok(h),
    };
    Err(format!("`{name}` cannot be replayed: {why}"))
}

/// An RFC 6901 JSON pointer: `""` or `/…`, where `~` is followed by `0` or
/// `1`; parsed once, here.
pub fn json_pointer(p: &str) -> Result<JsonPointer, String> {
    JsonPointer::parse(p).map_err(|e| match e {
        PointerError::NoLeadingSlash => {
            format!("invalid JSON pointer `{p}`: must be empty or start with `/` (e.g. /id)")
        }
        PointerError::BadEscape { .. } => format!(
            "invalid JSON pointer `{p}`: `~` must be followed by 0 or 1 (~0 is `~`, ~1 is `/`)"
        ),
    })
}

/// An HTTP method token, uppercased.
pub fn method(m: &str) -> Result<http::Method, String> {
    let upper = m.trim().to_ascii_uppercase();
    if upper.is_empty() {
        return Err("empty method name".to_string());
    }
    http::Method::from_bytes(upper.as_bytes())
        .map_err(|_| format!("`{m}` is not a valid HTTP method"))
}

/// `http(s)://host[:port][/path]`; no userinfo, query or fragment.
pub fn upstream(text: &str) -> Result<UpstreamUrl, String> {
    let original = text.trim().to_string();
    let bad = |why: &str| Err(format!("malformed upstream URL `{original}`: {why}"));
    let Some((scheme, rest)) = original.split_once("://") else {
        return bad("must start with http:// or https://");
    };
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "http" => false,
        "https" => true,
        _ => return bad("must start with http:// or https://"),
    };
    if rest.contains('?') || rest.contains('#') {
        return bad("a query or fragment is not allowed");
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return bad("user info is not allowed (put credentials elsewhere)");
    }
    if authority.is_empty() {
        return bad("the host is missing");
    }
    let (host, port) = match host_and_port(authority, tls) {
        Ok(hp) => hp,
        Err(why) => return bad(why),
    };
    if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("the path may not contain whitespace");
    }
    let base_path = path.trim_end_matches('/').to_string();
    let host = host.to_ascii_lowercase();
    let Ok(host_header) = http::HeaderValue::from_str(&host_header(&host, port, tls)) else {
        return bad("the host is not a header value");
    };
    Ok(UpstreamUrl {
        tls,
        host,
        port,
        base_path,
        original,
        host_header,
    })
}

/// The host and port of an upstream URL's authority (the port the scheme's
/// default when absent); the error says what is wrong with it.
fn host_and_port(authority: &str, tls: bool) -> Result<(String, u16), &'static str> {
    // IPv6 literals lose their brackets here: callers resolve `(host, port)`.
    let (host, port, ipv6) = if let Some(v6) = authority.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return Err("unterminated IPv6 address");
        };
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("invalid IPv6 address");
        }
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.to_string()),
            None if after.is_empty() => None,
            None => return Err("only `:port` may follow an IPv6 address"),
        };
        (addr.to_string(), port, true)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p.to_string()), false),
            None => (authority.to_string(), None, false),
        }
    };
    let host_ok = ipv6
        || !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_');
    if !host_ok {
        return Err("invalid or missing host");
    }
    let port = match port {
        None => default_port(tls),
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err("the port must be a number from 1 to 65535"),
        },
    };
    Ok((host, port))
}

/// The upstream's `Host`: brackets around an IPv6 literal, the port unless
/// it is the scheme's default.
fn host_header(host: &str, port: u16, tls: bool) -> String {
    match (host.contains(':'), port == default_port(tls)) {
        (true, true) => format!("[{host}]"),
        (true, false) => format!("[{host}]:{port}"),
        (false, true) => host.to_string(),
        (false, false) => format!("{host}:{port}"),
    }
}

/// 443 for `https://`, 80 for `http://`.
fn default_port(tls: bool) -> u16 {
    if tls {
        443
    } else {
        80
    }
}
