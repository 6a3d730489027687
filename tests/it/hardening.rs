//! Request-level hardening (SPEC §2, §4, §5, §8; issue 20): every method of
//! a `verify` route is verified (`unverified_methods` the opt-out), nothing
//! internal reaches a sender (502/504 details, `/readyz`, store URLs in
//! messages), `check` warns about guarded routes anyone can fill, a
//! `match.host` with a port is refused, and `max_waiters` counts per route
//! as documented. Against the real binary, a real consumer and a real
//! SQLite store.

use crate::common;
use crate::core_util;
use crate::raw_upstream;

use std::time::{Duration, Instant};

use common::*;
use core_util::{payload, problem_type, wait_until};
use idemgate::verify::sign;
use raw_upstream::{upstream, Behavior};

const SECRET: &str = "hardening-secret";

fn signed(extra: &str, up: &str) -> String {
    route(
        "s",
        "/hooks/s",
        up,
        &format!(
            "    verify:\n      scheme: hmac-sha256\n      header: X-Signature\n      secrets: [env:HOOK_SECRET]\n{extra}"
        ),
    )
}

/// A harness whose one route `s` (`/hooks/s`) verifies an HMAC signature.
fn start_signed(tag: &str, extra: &str) -> Harness {
    let h = Harness::sqlite(tag);
    let route = signed(extra, &h.upstream());
    h.yaml(&route).env("HOOK_SECRET", SECRET).start()
}

/// `idemgate check --config path` with `HOOK_SECRET` set: (code, stdout, stderr).
fn check_with_secret(path: &std::path::Path) -> (i32, String, String) {
    let path = path.display().to_string();
    cli_env(&["check", "--config", &path], &[("HOOK_SECRET", SECRET)])
}

/// `method` to `/hooks/s` with event ID `id` and this `X-Signature`.
fn with_signature(c: &mut Client, method: &str, id: &str, sig: &str, body: &[u8]) -> Response {
    let headers = [("X-Event-ID", id), ("X-Signature", sig)];
    c.request(method, "/hooks/s", &headers, body).unwrap()
}

// ------------------------------------------------------------ every method

/// On a route with `verify`, a method outside `guard_methods` is verified
/// too: a forged PUT, PATCH, DELETE or GET gets 401 and reaches nothing
/// (most consumers' handlers ignore the method). A signed one is forwarded
/// unguarded: no claim, `Idempotency-Status: unguarded`.
#[test]
fn every_method_on_a_verify_route_is_verified() {
    let h = start_signed("hard-methods", "");
    let body = br#"{"type":"refund.created"}"#;
    let mut c = h.client();
    for method in ["PUT", "PATCH", "DELETE", "GET", "OPTIONS"] {
        let id = eid("forged");
        let r = c
            .request(method, "/hooks/s", &[("X-Event-ID", &id)], body)
            .unwrap();
        assert_eq!(r.status, 401, "{method}: {r:?}");
        assert_eq!(problem_type(&r), "invalid-signature", "{method}");
        let forged = sign::hmac_hex(b"not the secret", body);
        let r = with_signature(&mut c, method, &id, &forged, body);
        assert_eq!(r.status, 401, "{method}, wrong key");
    }
    // a big chunked body is read and checked too, not streamed through
    let big = payload(200_000, 7);
    let mut raw =
        b"PUT /hooks/s HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    raw.extend_from_slice(&core_util::chunked(&big));
    c.send_raw(&raw).unwrap();
    assert_eq!(c.read_response(false).unwrap().status, 401, "chunked PUT");
    assert_eq!(h.up.total(), 0, "nothing forged reached the consumer");
    assert_eq!(h.requests("s", "invalid_signature"), 11.0);

    let signature = sign::hmac_hex(SECRET.as_bytes(), body);
    for method in ["PUT", "PATCH", "DELETE"] {
        let id = eid("signed");
        let r = with_signature(&mut c, method, &id, &signature, body);
        assert_eq!(r.status, 200, "{method}: {r:?}");
        assert_eq!(
            r.header("Idempotency-Status"),
            Some("unguarded"),
            "{method}"
        );
        let got = h.up.received().pop().unwrap();
        assert_eq!(
            (got.method.as_str(), got.body.as_slice()),
            (method, &body[..])
        );
        assert_eq!(got.header("Idempotency-Key"), None, "{method}: not claimed");
        let (code, _, _) = cli(&["events", "show", "--store", &h.store, "--route", "s", &id]);
        assert_eq!(code, 3, "{method}: no record");
    }
    let empty = sign::hmac_hex(SECRET.as_bytes(), b"");
    let r = c
        .request("GET", "/hooks/s/status", &[("X-Signature", &empty)], b"")
        .unwrap();
    assert_eq!(r.status, 200, "a signed GET");
    // the guarded method is as before: verified, claimed, forwarded once
    let id = eid("post");
    for _ in 0..2 {
        let r = with_signature(&mut c, "POST", &id, &signature, body);
        assert_eq!(r.status, 200);
    }
    assert_eq!(h.up.count(&id), 1);
}

/// `unverified_methods` (on the route or in `defaults`) lets the listed
/// methods through unguarded without a signature — for providers' unsigned
/// GET challenges — and nothing else. A guarded method cannot be listed.
#[test]
fn unverified_methods_pass_without_a_signature_and_nothing_else_does() {
    let mut h = start_signed("hard-unverified", "    unverified_methods: [get, HEAD]\n");
    let mut c = h.client();
    let r = c
        .request("GET", "/hooks/s?challenge=abc", &[], b"")
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Idempotency-Status"), Some("unguarded"));
    assert_eq!(
        h.up.received().pop().unwrap().path,
        "/hooks/s?challenge=abc"
    );
    let r = c.request("HEAD", "/hooks/s", &[], b"").unwrap();
    assert_eq!(r.status, 200);
    for method in ["PUT", "DELETE"] {
        let r = c.request(method, "/hooks/s", &[], b"{}").unwrap();
        assert_eq!(r.status, 401, "{method}");
    }
    assert_eq!(h.up.total(), 2);
    drop(c);
    h.stop(Duration::from_secs(10));

    // from defaults
    let text = format!(
        "listen: \"127.0.0.1:{}\"\nadmin_listen: \"127.0.0.1:{}\"\nstore:\n  url: \"{}\"\ndefaults:\n  unverified_methods: [GET]\nroutes:\n{}",
        free_port(),
        free_port(),
        h.dir().sqlite_url("d.db"),
        signed("", &h.up.url())
    );
    let path = h.dir().path().join("defaults.yaml");
    std::fs::write(&path, &text).unwrap();
    let (code, out, err) = check_with_secret(&path);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("unverified_methods=[GET]"), "{out}");

    // a guarded method is always verified
    let bad = text.replace(
        "unverified_methods: [GET]",
        "unverified_methods: [GET, post]",
    );
    std::fs::write(&path, &bad).unwrap();
    let (code, _, err) = check_with_secret(&path);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("defaults.yaml:6:23: defaults.unverified_methods: POST is in guard_methods"),
        "{err}"
    );
}

// ------------------------------------------------------------ nothing internal

/// The text of a problem's `detail`.
fn detail(r: &Response) -> String {
    r.json()["detail"].as_str().unwrap_or_default().to_string()
}

/// Nothing in a problem (its type, title and detail) that names the
/// upstream or the connector's words.
fn assert_tells_nothing(r: &Response, port: u16, what: &str) {
    let doc = r.json();
    let text = format!("{} {} {}", doc["type"], doc["title"], doc["detail"]);
    for leak in [
        "127.0.0.1".to_string(),
        port.to_string(),
        "refused".into(),
        "Refused".into(),
        "Peer".into(),
        "context".into(),
        "os error".into(),
    ] {
        assert!(!text.contains(&leak), "{what}: `{leak}` in {text:?}");
    }
}

/// A 502 and a 504 say what happened and nothing of where: no address, no
/// port, no connector error — on the guarded, read-whole and streamed
/// paths. The address and the error go to the warn log, and for a guarded
/// delivery to the record's `last_error`.
#[test]
fn upstream_failures_tell_the_sender_nothing_internal() {
    let closed = free_port(); // nothing listens there
    let dead = format!("http://127.0.0.1:{closed}");
    let stall = upstream(|_, _| Behavior::Stall(Vec::new()));
    let h = Harness::sqlite("hard-internal")
        .route_to("dead", "/hooks/dead", &dead, "    verify: none\n")
        .route_to(
            "slow",
            "/hooks/slow",
            &stall.url(),
            "    verify: none\n    upstream_timeout: 1s\n    lease: 5s\n",
        )
        .route_to("plain", "/plain", &dead, "    guard_methods: []\n")
        .start();

    let id = eid("dead");
    let r = h.deliver("/hooks/dead", Some(&id), b"{}");
    assert_eq!(
        (r.status, problem_type(&r)),
        (502, "upstream-unreachable".into())
    );
    assert_eq!(r.json()["event_id"], id.as_str());
    assert_tells_nothing(&r, closed, "guarded 502");
    let rec = show(&h.store, "dead", &id);
    assert_eq!(rec["state"], "failed");
    let last_error = rec["last_error"].as_str().unwrap_or_default();
    assert!(
        last_error.contains("refused") || last_error.contains("Refused"),
        "last_error keeps the cause: {rec}"
    );

    let id = eid("slow");
    let r = h.deliver("/hooks/slow", Some(&id), b"{}");
    assert_eq!(
        (r.status, problem_type(&r)),
        (504, "upstream-timeout".into())
    );
    assert_tells_nothing(&r, stall.addr.port(), "guarded 504");
    assert!(show(&h.store, "slow", &id)["last_error"]
        .as_str()
        .unwrap_or_default()
        .contains("no response within"));

    let mut c = h.client();
    let r = c.request("GET", "/plain/x", &[], b"").unwrap();
    assert_eq!(r.status, 502, "read whole");
    assert_tells_nothing(&r, closed, "unguarded 502");
    let mut c = h.client();
    c.send_raw(b"POST /plain/y HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n")
        .unwrap();
    let r = c.read_response(false).unwrap();
    assert_eq!(
        (r.status, problem_type(&r)),
        (502, "upstream-unreachable".into()),
        "streamed"
    );
    assert_tells_nothing(&r, closed, "streamed 502");
    assert!(!detail(&r).is_empty());

    // the operator learns where and why
    let addr = format!("127.0.0.1:{closed}");
    assert!(
        wait_until(Duration::from_secs(5), || {
            let log = h.log();
            log.lines()
                .filter(|l| l.contains("WARN") && l.contains(&addr))
                .count()
                >= 3
        }),
        "warn lines naming the upstream:\n{}",
        h.log()
    );
}

/// `/readyz` says the store does not answer, and nothing else (no path, no
/// driver message); the log has the error.
#[test]
fn readyz_names_no_store_error() {
    let h = Harness::guarded("hard-readyz", "    verify: none\n");
    let db = h.sqlite_path();
    assert_eq!(h.deliver("/hooks/r", Some(&eid("x")), b"{}").status, 200);
    // the file turns to noise under the running proxy
    for suffix in ["", "-wal", "-shm"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let len = std::fs::metadata(&name).unwrap().len() as usize;
        std::fs::write(&name, payload(len, 3)).unwrap();
    }
    let r = h.deliver("/hooks/r", Some(&eid("y")), b"{}");
    assert_eq!(r.status, 503);
    assert_eq!(detail(&r), "the claim store did not answer; retry later");
    let ready = kit::get(h.admin, "/readyz").unwrap();
    assert_eq!(ready.status, 503);
    assert_eq!(ready.text(), "store: not answering\n");
    assert!(
        wait_until(Duration::from_secs(5), || h
            .log()
            .contains("/readyz: the store")),
        "{}",
        h.log()
    );
}

/// A store URL in a message hides its password, even one holding `@` (the
/// userinfo ends at the last `@`), and a `password=` parameter.
#[test]
fn store_urls_in_messages_hide_passwords_holding_at_signs() {
    for (url, secret) in [
        ("mysql://idemgate:p@ss-w0rd@127.0.0.1/db", "ss-w0rd"),
        (
            "postgres://idemgate:p@ss-w0rd@127.0.0.1:notaport/db",
            "ss-w0rd",
        ),
        (
            "postgres://idemgate@127.0.0.1:notaport/db?password=hunter2",
            "hunter2",
        ),
    ] {
        for cmd in [
            &["migrate", "--store", url][..],
            &["events", "list", "--store", url][..],
        ] {
            let (code, out, err) = cli(cmd);
            assert_eq!(code, 1, "{cmd:?}: {out}{err}");
            assert!(
                err.contains("***"),
                "{cmd:?}: the URL is shown, redacted: {err}"
            );
            assert!(
                !err.contains(secret) && !out.contains(secret),
                "{cmd:?}: {err}"
            );
        }
    }
}

// ------------------------------------------------------------ config

/// `check` warns (exit 0, one line naming file:line:col) about a guarded
/// route without `verify` — anyone who reaches the listener can occupy its
/// event IDs — unless it says `verify: none`. Verified and pass-through
/// routes, and `verify: none`, are quiet; `serve` prints the same warning.
#[test]
fn check_warns_about_guarded_routes_without_verify() {
    let dir = TempDir::new("hard-warn");
    let up = Consumer::start().unwrap();
    let routes = [
        route("open", "/hooks/open", &up.url(), ""),
        route("acked", "/hooks/acked", &up.url(), "    verify: none\n"),
        route("plain", "/plain", &up.url(), "    guard_methods: []\n"),
        "  - name: gh\n    match:\n      path_prefix: /hooks/gh\n    upstream: \"http://127.0.0.1:9\"\n    provider: github\n".to_string(),
        signed("", &up.url()),
    ]
    .concat();
    let text = config_text(free_port(), free_port(), &dir.sqlite_url("w.db"), &routes);
    let path = dir.path().join("warn.yaml");
    std::fs::write(&path, &text).unwrap();
    let (code, out, err) = check_with_secret(&path);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 5, "{out}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning: ")).collect();
    let line_of = |name: &str| {
        text.lines()
            .position(|l| l.trim() == format!("- name: {name}"))
            .unwrap()
            + 1
    };
    let want: Vec<String> = ["open", "gh"]
        .iter()
        .map(|n| format!("warning: warn.yaml:{}:5: routes[", line_of(n)))
        .collect();
    assert_eq!(warnings.len(), 2, "{err}");
    for (w, prefix) in warnings.iter().zip(&want) {
        assert!(
            w.contains(prefix.trim_start_matches("warning: ")),
            "{w} vs {prefix}"
        );
        assert!(
            w.contains("anyone who can reach the listener can occupy event IDs"),
            "{w}"
        );
        assert!(w.contains("verify: none"), "{w}");
    }
    // `serve` says it too, then serves
    let px = Proxy::start_with_env(
        &dir,
        &dir.sqlite_url("w.db"),
        &routes,
        &[("HOOK_SECRET", SECRET)],
    );
    assert!(
        px.log().contains("guarded route without `verify`"),
        "{}",
        px.log()
    );
    // `verify: none` is a word, not any word
    let typo = text.replace("verify: none", "verify: nothing");
    std::fs::write(&path, &typo).unwrap();
    let (code, _, err) = check_with_secret(&path);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("routes[1].verify") && err.contains("`none`"),
        "{err}"
    );
}

/// `match.host` is compared with the request's host name, never its port:
/// a host with a port could never match, so it is a config error. A request
/// host with a port or a trailing dot matches the route.
#[test]
fn match_host_with_a_port_is_a_config_error() {
    let dir = TempDir::new("hard-host");
    let up = Consumer::start().unwrap();
    for host in ["hooks.example.com:8443", "[::1]:8080", "127.0.0.1:80"] {
        let routes = route("h", "/hooks/h", &up.url(), "    verify: none\n").replace(
            "      path_prefix: /hooks/h\n",
            &format!("      host: \"{host}\"\n      path_prefix: /hooks/h\n"),
        );
        let text = config_text(free_port(), free_port(), &dir.sqlite_url("m.db"), &routes);
        let path = dir.path().join("host.yaml");
        std::fs::write(&path, &text).unwrap();
        let line = text.lines().position(|l| l.contains("host:")).unwrap() + 1;
        for cmd in ["check", "serve"] {
            let (code, _, err) = cli(&[cmd, "--config", &path.display().to_string()]);
            assert_eq!(code, 2, "{cmd} {host}: {err}");
            assert!(
                err.contains(&format!(
                    "host.yaml:{line}:13: routes[0].match.host: host `{host}` has a port"
                )),
                "{cmd} {host}: {err}"
            );
        }
    }
    let routes = [
        route("h", "/hooks/h", &up.url(), "    verify: none\n").replace(
            "      path_prefix: /hooks/h\n",
            "      host: Hooks.Example.com\n      path_prefix: /hooks/h\n",
        ),
        route("v6", "/hooks/h", &up.url(), "    verify: none\n").replace(
            "      path_prefix: /hooks/h\n",
            "      host: \"[::1]\"\n      path_prefix: /hooks/h\n",
        ),
    ]
    .concat();
    let store = dir.sqlite_url("m.db");
    let px = Proxy::start(&dir, &store, &routes);
    for (host, route_name) in [
        ("hooks.example.com:8443", "h"),
        ("HOOKS.example.com.", "h"),
        ("hooks.example.com.:80", "h"),
        ("[::1]:9000", "v6"),
    ] {
        let id = eid("host");
        let mut c = px.client();
        c.send_raw(
            format!("POST /hooks/h HTTP/1.1\r\nHost: {host}\r\nX-Event-ID: {id}\r\nContent-Length: 2\r\n\r\n{{}}")
                .as_bytes(),
        )
        .unwrap();
        let r = c.read_response(false).unwrap();
        assert_eq!(r.status, 200, "{host}: {r:?}");
        assert_eq!(
            show(&store, route_name, &id)["state"],
            "delivered",
            "{host}"
        );
    }
}

/// `max_waiters` bounds the duplicates held on a route, all its events
/// together (docs/routes.md, reference.yaml, the model), not per event: with one
/// slot held by a duplicate of event A, a duplicate of event B gets 409 at
/// once. (Behaviour unchanged by issue 20; its docs said "per event".)
#[test]
fn max_waiters_counts_held_duplicates_per_route() {
    let h = Harness::sqlite("hard-waiters")
        .route(
            "w",
            "/hooks/w",
            "    verify: none\n    in_flight: wait\n    max_waiters: 1\n",
        )
        .start();
    let (a, b) = (eid("wait-a"), eid("wait-b"));
    for id in [&a, &b] {
        h.up.hold(id, 200, Duration::from_millis(2500));
    }
    let addr = h.addr;
    let bg = |id: &str| {
        let id = id.to_string();
        std::thread::spawn(move || kit::deliver(addr, "/hooks/w", Some(&id), b"{}").unwrap())
    };
    let first_a = bg(&a);
    let first_b = bg(&b);
    assert!(wait_until(Duration::from_secs(10), || h.up.count(&a) == 1
        && h.up.count(&b) == 1));
    let held_a = bg(&a); // takes the route's one slot
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let refused = h.deliver("/hooks/w", Some(&b), b"{}");
    assert_eq!(refused.status, 409, "{refused:?}");
    assert!(
        detail(&refused).contains("too many deliveries of this route"),
        "{refused:?}"
    );
    assert!(
        t.elapsed() < Duration::from_millis(2000),
        "refused at once, not held"
    );
    for h in [first_a, first_b, held_a] {
        assert_eq!(h.join().unwrap().status, 200);
    }
    assert_eq!((h.up.count(&a), h.up.count(&b)), (1, 1));
}
