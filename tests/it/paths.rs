//! Paths (SPEC §4, "Paths"; issue 20): routes match the RFC 3986 normal form
//! of the request's path, and the forwarded request carries that form (the
//! query unchanged), on the guarded path, the read-whole unguarded path and
//! pingora's streaming path alike. A path without a normal form gets 400
//! `invalid-path` and reaches no route. Against the real binary, a real
//! consumer and a real SQLite store.

use crate::common;
use crate::core_util;

use common::*;
use core_util::problem_type;
use idemgate::verify::sign;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};

const SECRET: &str = "paths-test-secret";

/// A signed route (`/hooks/stripe`) and a catch-all pass-through (`/` to the consumer's `/all`).
fn signed_and_catch_all(tag: &str) -> Harness {
    Harness::sqlite(tag)
        .route(
            "stripe",
            "/hooks/stripe",
            "    verify:\n      scheme: hmac-sha256\n      header: X-Signature\n      secrets: [env:HOOK_SECRET]\n",
        )
        .yaml_with(|up| route("all", "/", &format!("{up}/all"), "    guard_methods: []\n"))
        .env("HOOK_SECRET", SECRET)
        .start()
}

/// A signed route and a catch-all pass-through: the issue's attack. Every
/// spelling of `/hooks/stripe` a consumer's framework would decode to its
/// Stripe handler is the signed route's, so an unsigned delivery gets 401
/// and never reaches the consumer; a signed one arrives as `/hooks/stripe`.
#[test]
fn every_spelling_of_a_signed_path_is_verified_not_passed_through() {
    let h = signed_and_catch_all("paths-spellings");
    let body = br#"{"type":"payout.paid"}"#;
    let signature = sign::hmac_hex(SECRET.as_bytes(), body);
    let spellings = [
        "/hooks/%73tripe",
        "/hooks/%73%74%72%69%70%65",
        "/%68ooks/stripe",
        "/hooks//stripe",
        "//hooks/stripe",
        "/hooks/./stripe",
        "/hooks/x/../stripe",
        "/hooks/x/%2E%2e/stripe",
        "/other/../hooks/stripe",
        "/hooks/stripe/.",
    ];
    let mut c = h.client();
    for path in spellings {
        let id = eid("forged");
        let r = c
            .request("POST", path, &[("X-Event-ID", &id)], body)
            .unwrap();
        assert_eq!(r.status, 401, "{path}: {r:?}");
        assert_eq!(problem_type(&r), "invalid-signature", "{path}");
        assert_eq!(
            h.up.total(),
            0,
            "{path}: the forged delivery reached the consumer"
        );
        let (code, _, _) = cli(&[
            "events", "show", "--store", &h.store, "--route", "stripe", &id,
        ]);
        assert_eq!(code, 3, "{path}: nothing claimed");
    }
    for path in spellings {
        let id = eid("signed");
        let r = c
            .request(
                "POST",
                path,
                &[("X-Event-ID", &id), ("X-Signature", &signature)],
                body,
            )
            .unwrap();
        assert_eq!(r.status, 200, "{path}: {r:?}");
        assert_eq!(r.header("Idempotency-Status"), Some("forwarded"), "{path}");
        let got = h.up.received().pop().unwrap();
        let want = if path.ends_with("/.") {
            "/hooks/stripe/"
        } else {
            "/hooks/stripe"
        };
        assert_eq!(got.path, want, "{path}");
        assert_eq!(got.key(), Some(id.as_str()));
        assert_eq!(
            show(&h.store, "stripe", &id)["state"],
            "delivered",
            "{path}"
        );
    }
}

/// An encoded `/`, `\` or NUL (either case), a literal `\`, a `..` above the
/// root, a malformed escape or a path parameter: 400 `invalid-path`, counted
/// with `route=""`, nothing forwarded, and the connection stays usable.
#[test]
fn paths_without_a_normal_form_get_400_invalid_path() {
    let h = signed_and_catch_all("paths-invalid");
    let bad = [
        "/hooks%2Fstripe",
        "/hooks%2fstripe",
        "/hooks/%5Cstripe",
        "/hooks/%5cstripe",
        "/hooks\\stripe",
        "/hooks/stripe%00",
        "/..",
        "/../hooks/stripe",
        "/a/../..",
        "/%2e%2E",
        "/hooks/x/%2E%2E/%2e%2e/%2E%2E/stripe",
        "/hooks;jsessionid=1/stripe",
        "/hooks/stri%pe",
        "/hooks/stripe%4",
    ];
    let mut c = h.client();
    for (i, path) in bad.iter().enumerate() {
        let method = if i % 2 == 0 { "POST" } else { "GET" };
        let id = eid("bad");
        let r = c
            .request(method, path, &[("X-Event-ID", &id)], b"{\"x\":1}")
            .unwrap();
        assert_eq!(r.status, 400, "{method} {path}: {r:?}");
        assert_eq!(problem_type(&r), "invalid-path", "{path}");
        assert_eq!(
            r.header("Idempotency-Status"),
            Some("invalid_path"),
            "{path}"
        );
        assert_ne!(
            r.header("Connection"),
            Some("close"),
            "{path}: the body was read"
        );
    }
    // still the same connection
    let ok = c.request("GET", "/fine", &[], b"").unwrap();
    assert_eq!(ok.status, 200);
    assert_eq!(
        h.up.total(),
        1,
        "only the last request reached the consumer"
    );
    assert_eq!(h.requests("", "invalid_path"), bad.len() as f64);
}

/// The forwarded request carries the normal form and the query unchanged,
/// on each of the three ways a request goes upstream: the guarded path, an
/// unguarded method read whole, and pingora's streaming path (a chunked
/// body), with `strip_prefix` and an upstream base path applied to the
/// normal form.
#[test]
fn the_forwarded_path_is_the_normal_one_on_every_path() {
    let dir = TempDir::new("paths-forwarded");
    let up = Consumer::start().unwrap();
    let routes = [
        route(
            "g",
            "/g",
            &format!("{}/base", up.url()),
            "    verify: none\n",
        ),
        route(
            "p",
            "/p",
            &up.url(),
            "    guard_methods: []\n    strip_prefix: true\n",
        ),
    ]
    .concat();
    let px = Proxy::start(&dir, &dir.sqlite_url("p.db"), &routes);
    let mut c = px.client();
    let raw = "/g/./x//%7Ey%3a/%61?q=%2F..//&a=%7e";
    let want = "/base/g/x/~y%3A/a?q=%2F..//&a=%7e";
    let id = eid("guarded");
    let r = c
        .request("POST", raw, &[("X-Event-ID", &id)], b"{}")
        .unwrap();
    assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
    assert_eq!(up.received().pop().unwrap().path, want, "guarded");
    let r = c.request("GET", raw, &[], b"").unwrap();
    assert_eq!(r.header("Idempotency-Status"), Some("unguarded"));
    assert_eq!(
        up.received().pop().unwrap().path,
        want,
        "unguarded, read whole"
    );
    c.send_raw(
        b"POST /p/a/../b//%63/?x=%41 HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .unwrap();
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Idempotency-Status"), Some("unguarded"));
    let got = up.received().pop().unwrap();
    assert_eq!(got.path, "/b/c/?x=%41", "streamed");
    assert_eq!(got.body, b"hello");
}

// ------------------------------------------------------------ the property

/// The routes of the property test: (name, prefix, upstream base path, strip_prefix, guarded).
const ROUTES: [(&str, &str, &str, bool, bool); 6] = [
    ("root", "/", "/root", false, false),
    ("a", "/a", "/ra", false, false),
    ("ab", "/a/b", "/rab", true, false),
    ("x", "/x~y.z", "/rx", false, false),
    ("sp", "/a%20b", "/rsp", false, false),
    ("g", "/g/h", "/rg", false, true),
];

/// What the proxy must do with a normal path: the route's upstream path.
fn expected_upstream_path(normal: &str, query: &str) -> String {
    let matches = |prefix: &str| {
        prefix == "/"
            || normal
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    let (_, prefix, base, strip, _) = ROUTES
        .iter()
        .filter(|r| matches(r.1))
        .max_by_key(|r| r.1.len())
        .expect("the root route matches everything");
    let rest = if *strip && *prefix != "/" {
        match &normal[prefix.len()..] {
            "" => "/",
            r => r,
        }
    } else {
        normal
    };
    format!("{base}{rest}{query}")
}

/// One piece of a normal segment.
fn atom() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select("abcxyzAB09-._~".chars().collect::<Vec<_>>()).prop_map(String::from),
        1 => prop::sample::select("!$&'()*+,=:@".chars().collect::<Vec<_>>()).prop_map(String::from),
        1 => prop::sample::select(vec!["%20", "%3A", "%2B", "%25", "%C3%A9", "%7F"]).prop_map(String::from),
    ]
}

/// A segment of a normal path: never empty, `.` or `..`; often one the
/// routes' prefixes use.
fn normal_segment() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::sample::select(vec!["a", "b", "x~y.z", "a%20b", "g", "h", "c"]).prop_map(String::from),
        1 => prop::collection::vec(atom(), 1..4)
            .prop_map(|a| a.concat())
            .prop_filter("not a dot segment", |s| s != "." && s != ".."),
    ]
}

/// The same segment written another way: unreserved bytes percent-encoded
/// at random (hex digits in random case), kept escapes in random case.
fn respell(seg: &str, coin: &mut impl FnMut() -> u8) -> String {
    let mut out = String::new();
    let bytes = seg.as_bytes();
    let mut i = 0;
    let case = |h: &str, c: u8| {
        if c.is_multiple_of(2) {
            h.to_ascii_lowercase()
        } else {
            h.to_string()
        }
    };
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let c = coin();
            out.push('%');
            out.push_str(&case(&seg[i + 1..i + 3], c));
            i += 3;
            continue;
        }
        let b = bytes[i];
        let unreserved = b.is_ascii_alphanumeric() || b"-._~".contains(&b);
        let c = coin();
        if unreserved && c.is_multiple_of(3) {
            out.push_str(&case(&format!("%{b:02X}"), c / 3));
        } else {
            out.push(b as char);
        }
        i += 1;
    }
    out
}

/// Junk that normalises away, placed right after a `/`.
const JUNK: [&str; 8] = ["", "", "/", "./", "%2e/", "j/../", "j/%2E%2e/", "j//./../"];
/// Endings that keep a trailing slash.
const TRAILING: [&str; 5] = ["/", "//", "/.", "/./", "/j/.."];
/// What no normal form exists for, put right after a `/` of the path.
const POISON: [&str; 8] = ["%2F", "%2f", "%5C", "%5c", "%00", "\\", ";", "%zz"];

#[derive(Debug, Clone)]
struct Case {
    /// The path as sent.
    raw: String,
    /// Its normal form; `None` when it has none.
    normal: Option<String>,
    query: &'static str,
    /// 0: GET (read whole), 1: chunked POST (pingora's streaming path),
    /// 2: POST with an event ID (guarded on route `g`).
    mode: u8,
}

fn arb_case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(normal_segment(), 0..5),
        any::<bool>(),
        prop::collection::vec(any::<u8>(), 64),
        prop::sample::select(vec!["", "?q=1", "?a=%2F..//&b=%7e", "?x=;y&z=%00"]),
        0u8..3,
        prop::option::weighted(0.2, (0usize..POISON.len() + 2, any::<u8>())),
    )
        .prop_map(|(segs, trailing, coins, query, mode, poison)| {
            let mut coins = coins.into_iter().cycle();
            let mut coin = move || coins.next().unwrap_or(0);
            let mut normal = String::new();
            let mut raw = String::new();
            for seg in &segs {
                normal.push('/');
                normal.push_str(seg);
                raw.push('/');
                raw.push_str(JUNK[usize::from(coin()) % JUNK.len()]);
                raw.push_str(&respell(seg, &mut coin));
            }
            if segs.is_empty() {
                normal.push('/');
                raw.push('/');
                raw.push_str(JUNK[usize::from(coin()) % JUNK.len()]);
            } else if trailing {
                normal.push('/');
                raw.push_str(TRAILING[usize::from(coin()) % TRAILING.len()]);
            }
            let mut normal = Some(normal);
            if let Some((which, at)) = poison {
                normal = None;
                if which < POISON.len() {
                    let slashes: Vec<usize> = raw.match_indices('/').map(|(i, _)| i).collect();
                    let after = slashes[usize::from(at) % slashes.len()] + 1;
                    raw.insert_str(after, POISON[which]);
                } else if which == POISON.len() {
                    raw.push_str("%4"); // a cut-off escape, at the end
                } else {
                    let climb = if at % 2 == 0 { "/.." } else { "/j/../.." };
                    raw.insert_str(0, climb);
                }
            }
            Case {
                raw,
                normal,
                query,
                mode,
            }
        })
}

/// Sends `path` (with `query`) the way `mode` says; the answer, and the
/// request-target the consumer got when it got one.
fn send(
    c: &mut Client,
    up: &Consumer,
    path: &str,
    query: &str,
    mode: u8,
) -> (Response, Option<String>) {
    let before = up.total();
    let target = format!("{path}{query}");
    let r = match mode {
        0 => c.request("GET", &target, &[], b"").unwrap(),
        1 => {
            let id = eid("prop");
            c.send_raw(
                format!(
                    "POST {target} HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                )
                .as_bytes(),
            )
            .unwrap();
            c.read_response(false).unwrap()
        }
        _ => {
            let id = eid("prop");
            c.request("POST", &target, &[("X-Event-ID", &id)], b"{}")
                .unwrap()
        }
    };
    let got = (up.total() > before).then(|| up.received().pop().unwrap().path);
    (r, got)
}

/// Random paths built from segments, `.` and `..`, repeated slashes and
/// percent-encodings: the route chosen is the route of the normal path, and
/// the forwarded path is the normal one (through the route's prefix
/// handling, query unchanged) — the same as for the normal path sent as
/// is. A path with no normal form gets 400 `invalid-path` and reaches no
/// route. Case count: `PROPTEST_CASES` (default 256).
#[test]
fn routes_and_forwarded_paths_follow_the_normal_form() {
    let dir = TempDir::new("paths-property");
    let up = Consumer::start().unwrap();
    let routes: String = ROUTES
        .iter()
        .map(|(name, prefix, base, strip, guarded)| {
            let mut extra = String::new();
            if *strip {
                extra.push_str("    strip_prefix: true\n");
            }
            extra.push_str(if *guarded {
                "    verify: none\n"
            } else {
                "    guard_methods: []\n"
            });
            route(name, prefix, &format!("{}{base}", up.url()), &extra)
        })
        .collect();
    let px = Proxy::start(&dir, &dir.sqlite_url("prop.db"), &routes);
    let c = std::cell::RefCell::new(px.client());
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256);
    let mut runner = TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    runner
        .run(&arb_case(), |case| {
            let c = &mut *c.borrow_mut();
            let (r, got) = send(c, &up, &case.raw, case.query, case.mode);
            let Some(normal) = &case.normal else {
                prop_assert_eq!(r.status, 400, "{:?}: {:?}", case, r);
                prop_assert_eq!(problem_type(&r), "invalid-path");
                prop_assert!(got.is_none(), "{:?} reached the consumer", case);
                return Ok(());
            };
            let want = expected_upstream_path(normal, case.query);
            prop_assert_eq!(r.status, 200, "{:?}: {:?}", case, r);
            prop_assert_eq!(got.as_deref(), Some(want.as_str()), "{:?}", case);
            // the normal form itself, as is: the same route, the same path
            let (r2, got2) = send(c, &up, normal, case.query, case.mode);
            prop_assert_eq!(r2.status, 200);
            prop_assert_eq!(got2, got);
            Ok(())
        })
        .map_err(|e| TestCaseError::fail(e.to_string()))
        .unwrap();
}
