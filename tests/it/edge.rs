//! Who may send, and what a replay carries (SPEC §22): `allow_from` by the
//! sender's address (loopback sources 127.0.0.2 and 127.0.0.3), refused
//! before anything is read, claimed or asked of the store; `trusted_proxies`
//! and `X-Forwarded-For` (forged, chained, garbage); a `file:` list read
//! again by a reload; `replay_headers` on both stores; `check`'s positioned
//! refusals. And a stalled streamed body or trailer section: 408, never 504
//! (SPEC §9).

use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::core_util::problem_type;
use crate::upgrade::Setup;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A delivery of `event_id` to `path` from the local address `source`,
/// with more header fields; the answer.
fn post_from(
    addr: SocketAddr,
    source: &str,
    path: &str,
    event_id: &str,
    headers: &[(&str, &str)],
) -> Response {
    let mut c = Client::connect_from(ip(source), addr).expect("connect from a loopback source");
    let mut all = vec![("X-Event-ID", event_id)];
    all.extend_from_slice(headers);
    c.request("POST", path, &all, b"{}").expect("an answer")
}

#[track_caller]
fn assert_refused(r: &Response, what: &str) {
    assert_eq!(r.status, 403, "{what}: {r:?}");
    assert_eq!(problem_type(r), "source-not-allowed", "{what}");
    assert_eq!(
        r.header("Idempotency-Status"),
        Some("source_refused"),
        "{what}"
    );
}

#[test]
fn only_listed_sources_reach_a_route_and_a_refusal_reads_nothing() {
    let h = Harness::sqlite("edge-allow")
        .route(
            "r",
            "/hooks/r",
            "    verify: none\n    allow_from: [127.0.0.2/32, \"2001:db8::/32\"]\n",
        )
        .route("open", "/hooks/open", "    verify: none\n")
        .start();
    let ok = post_from(h.addr, "127.0.0.2", "/hooks/r", "e1", &[]);
    assert_eq!((ok.status, h.up.count("e1")), (200, 1), "{ok:?}");
    let refused = post_from(h.addr, "127.0.0.3", "/hooks/r", "e2", &[]);
    assert_refused(&refused, "127.0.0.3");
    assert!(kit::http::says_close(&refused.headers), "{refused:?}");
    // X-Forwarded-For from a peer that is no trusted proxy is not believed
    let xff = [("X-Forwarded-For", "127.0.0.2")];
    assert_refused(
        &post_from(h.addr, "127.0.0.3", "/hooks/r", "e3", &xff),
        "forged",
    );
    // a route without allow_from takes any source
    let open = post_from(h.addr, "127.0.0.3", "/hooks/open", "e4", &[]);
    assert_eq!(open.status, 200, "{open:?}");

    // refused on the head alone: a body announced and never sent, small
    // (which the listener reads with the head for other senders) or large,
    // is not waited for (body_timeout is 30 s)
    for (id, length) in [("e5", 1_000_000), ("e6", 10)] {
        let mut c = Client::connect_from(ip("127.0.0.3"), h.addr).unwrap();
        let head = format!(
            "POST /hooks/r HTTP/1.1\r\nHost: x\r\nX-Event-ID: {id}\r\nContent-Length: {length}\r\n\r\n"
        );
        c.send_raw(head.as_bytes()).unwrap();
        let started = Instant::now();
        let r = c.read_response(false).unwrap();
        assert_refused(&r, &format!("a body of {length} never sent"));
        let took = started.elapsed();
        assert!(took < Duration::from_secs(1), "{length}: {took:?}");
    }

    let ids = ["e2", "e3", "e5", "e6"];
    assert_eq!(ids.iter().map(|id| h.up.count(id)).sum::<usize>(), 0);
    assert_eq!(h.requests("r", "source_refused"), 4.0);
    for id in ids {
        let (code, _, _) = cli(&["events", "show", "--store", &h.store, "--route", "r", id]);
        assert_eq!(code, 3, "{id}: nothing was claimed");
    }
    let said = || h.log().contains("client=127.0.0.2");
    assert!(wait_until(Duration::from_secs(5), said), "{}", h.log());
}

#[test]
fn behind_a_trusted_proxy_the_right_most_untrusted_entry_is_the_client() {
    let h = Harness::sqlite("edge-trusted")
        .route(
            "r",
            "/hooks/r",
            "    verify: none\n    allow_from: [192.0.2.0/24]\n",
        )
        .yaml("trusted_proxies: [127.0.0.3/32, 10.0.0.0/8]\n")
        .start();
    let xff = "X-Forwarded-For";
    // (peer, X-Forwarded-For fields, allowed)
    let cases: &[(&str, &[&str], bool)] = &[
        ("127.0.0.3", &["198.51.100.1, 192.0.2.7, 10.1.2.3"], true),
        ("127.0.0.3", &["192.0.2.7", "10.0.0.9"], true),
        ("127.0.0.3", &["192.0.2.7:4711,"], true),
        ("127.0.0.3", &["192.0.2.7, 198.51.100.1"], false),
        ("127.0.0.3", &["192.0.2.7, not-an-address"], false),
        (
            "127.0.0.3",
            &["192.0.2.7", "192.0.2.8 junk, 10.0.0.1"],
            false,
        ),
        ("127.0.0.3", &[], false),
        ("127.0.0.2", &["192.0.2.7"], false),
    ];
    for (i, (peer, fields, allowed)) in cases.iter().enumerate() {
        let id = format!("t{i}");
        let headers: Vec<(&str, &str)> = fields.iter().map(|f| (xff, *f)).collect();
        let r = post_from(h.addr, peer, "/hooks/r", &id, &headers);
        let what = format!("{peer} {fields:?}");
        if *allowed {
            assert_eq!((r.status, h.up.count(&id)), (200, 1), "{what}: {r:?}");
        } else {
            assert_refused(&r, &what);
            assert_eq!(h.up.count(&id), 0, "{what}");
        }
    }
    // the log line shows the client, not the proxy
    let said = || h.log().contains("client=192.0.2.7");
    assert!(wait_until(Duration::from_secs(5), said), "{}", h.log());
}

/// The admin API's action log names the client behind a trusted proxy,
/// and only there believes `X-Forwarded-For`.
#[test]
fn the_admin_api_shows_the_client_behind_a_trusted_proxy() {
    let dir = TempDir::new("edge-admin");
    let store = dir.sqlite_url("a.db");
    let up = Consumer::start().unwrap();
    let routes = route("r", "/hooks/r", &up.url(), "    verify: none\n")
        + "trusted_proxies: [127.0.0.3/32]\n";
    let px = crate::admin_util::start_with_token(&dir, &store, &routes);
    let auth = format!("Bearer {}", crate::admin_util::TOKEN);
    for (id, source, forwarded, shown) in [
        ("a1", "127.0.0.3", "192.0.2.44", "peer=\"192.0.2.44\""),
        ("a2", "127.0.0.2", "192.0.2.55", "peer=\"127.0.0.2\""),
    ] {
        assert_eq!(px.deliver("/hooks/r", Some(id), b"{}").status, 200);
        let mut c = Client::connect_from(ip(source), px.admin).unwrap();
        let path = format!("/api/events/r/{id}/release?force=true");
        let headers = [("Authorization", &*auth), ("X-Forwarded-For", forwarded)];
        let r = c.request("POST", &path, &headers, b"").unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let said = || {
            px.log()
                .lines()
                .any(|l| l.contains(id) && l.contains(shown))
        };
        assert!(
            wait_until(Duration::from_secs(5), said),
            "{shown}: {}",
            px.log()
        );
    }
    assert!(
        !px.log().contains("192.0.2.55"),
        "a forged chain is not believed"
    );
}

#[test]
fn a_file_list_is_read_again_on_reload() {
    let up = Consumer::start().unwrap();
    let dir = TempDir::new("edge-reload");
    let (store, list) = (dir.sqlite_url("u.db"), dir.path().join("senders.txt"));
    std::fs::write(&list, "# the senders\n127.0.0.2/32\n").unwrap();
    let mut s = Setup::new(dir, store);
    let extra = format!(
        "    verify: none\n    allow_from: file:{}\n",
        list.display()
    );
    s.write(&route("r", "/hooks/r", &up.url(), &extra));
    let mut old = s.start();
    assert_eq!(
        post_from(s.addr, "127.0.0.2", "/hooks/r", "a1", &[]).status,
        200
    );
    assert_refused(
        &post_from(s.addr, "127.0.0.3", "/hooks/r", "a2", &[]),
        "before",
    );

    std::fs::write(&list, "127.0.0.3   # moved\n").unwrap();
    let (new, _) = s.upgrade(&mut old);
    assert_refused(
        &post_from(s.addr, "127.0.0.2", "/hooks/r", "b1", &[]),
        "after",
    );
    let r = post_from(s.addr, "127.0.0.3", "/hooks/r", "b2", &[]);
    assert_eq!(
        (r.status, up.count("b2")),
        (200, 1),
        "after: {r:?}; {}",
        new.log()
    );
}

/// `check` refuses each bad range, list and header name at its position:
/// in the config, or in the `file:` list (its own file:line:col).
#[test]
fn check_refuses_bad_ranges_and_headers_at_their_position() {
    let dir = TempDir::new("edge-check");
    let list = dir.path().join("list.txt");
    std::fs::write(
        &list,
        "# ok\n192.0.2.0/24\n\n  10.1.0.0/8 # host bits\n2001:db8::/129\n",
    )
    .unwrap();
    let up = "http://127.0.0.1:9";
    let routes = route(
        "a",
        "/a",
        up,
        "    verify: none\n    allow_from: [192.0.2.0/24, 300.1.1.1]\n    replay_headers: [Location, Set-Cookie]\n",
    ) + &route(
        "b",
        "/b",
        up,
        &format!(
            "    verify: none\n    allow_from: file:{}\n    replay_headers: [A, B, C, D, E, F, G, H, I]\n",
            list.display()
        ),
    ) + &route(
        "c",
        "/c",
        up,
        "    verify: none\n    replay_headers: [Transfer-Encoding, Proxy-Authenticate]\n    allow_from: []\n",
    ) + "trusted_proxies: [10.0.0.0/33]\n";
    let config = dir.path().join("c.yaml");
    let text = config_text(free_port(), free_port(), &dir.sqlite_url("c.db"), &routes);
    std::fs::write(&config, text).unwrap();
    let (code, _, err) = cli(&["check", "--config", config.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    let c = config.display().to_string();
    let l = list.display().to_string();
    for want in [
        format!("{c}:16:32: routes[0].allow_from[1]: invalid address range `300.1.1.1`"),
        format!("{c}:17:32: routes[0].replay_headers[1]: `Set-Cookie` cannot be replayed"),
        format!("{l}:4:3: routes[1].allow_from: invalid address range `10.1.0.0/8`: the address has bits set past the prefix length"),
        format!("{l}:5:1: routes[1].allow_from: invalid address range `2001:db8::/129`: an IPv6 prefix length is at most 128"),
        format!("{c}:26:21: routes[1].replay_headers: replay_headers names at most 8 headers"),
        format!("{c}:34:22: routes[2].replay_headers[0]: `Transfer-Encoding` cannot be replayed: a framing header"),
        format!("{c}:34:41: routes[2].replay_headers[1]: `Proxy-Authenticate` cannot be replayed: a hop-by-hop header"),
        format!("{c}:35:17: routes[2].allow_from: allow_from holds no range"),
        format!("{c}:36:19: trusted_proxies[0]: invalid address range `10.0.0.0/33`: an IPv4 prefix length is at most 32"),
    ] {
        assert!(err.lines().any(|line| line.starts_with(&want)), "missing {want}\nin:\n{err}");
    }
}

/// A 201 with `Location` and `ETag`: every replay carries both beside
/// `Idempotent-Replayed: true`; a value over 1 KiB is not kept, and the
/// settle's log line says so; a header not named is not kept.
fn replay_with_headers(store: TestStore) {
    let h = Harness::on(store)
        .route(
            "r",
            "/hooks/r",
            "    verify: none\n    replay_headers: [Location, ETag, X-Long]\n",
        )
        .start();
    let long = "x".repeat(1025);
    let reply = Reply::status(201)
        .header("Location", "/orders/17")
        .header("ETag", "\"v1\"")
        .header("X-Long", &long)
        .header("X-Other", "not named");
    h.up.script("e1", vec![reply]);
    let first = h.deliver("/hooks/r", Some("e1"), b"{}");
    assert_eq!(first.status, 201, "{first:?}");
    assert_eq!(first.header("Location"), Some("/orders/17"));
    for i in 0..2 {
        let again = h.deliver("/hooks/r", Some("e1"), b"{}");
        let got = (
            again.status,
            again.header("Idempotent-Replayed"),
            again.header("Location"),
            again.header("ETag"),
        );
        assert_eq!(
            got,
            (201, Some("true"), Some("/orders/17"), Some("\"v1\"")),
            "replay {i}: {again:?}"
        );
        assert_eq!(
            (again.header("X-Long"), again.header("X-Other")),
            (None, None)
        );
    }
    assert_eq!(h.up.count("e1"), 1);
    // the log is written off the request's path: it may lag the answer
    let said = || {
        let log = h.log();
        log.contains("a replay header is not kept") && log.contains("header=\"x-long\"")
    };
    assert!(wait_until(Duration::from_secs(5), said), "{}", h.log());
}

on_both_stores!(replay_with_headers("edge-replay"): replay_headers_sqlite, replay_headers_postgres);

/// The smuggling probe's input: a chunked body whose trailer section never
/// ends. On a streamed (unguarded) route and on a guarded one (read whole):
/// 408 `invalid-body`, never 504, whether the route's `upstream_timeout` is
/// as long as `body_timeout` (the probe's 2 s each) or shorter.
#[test]
fn a_stalled_trailer_is_408_never_504() {
    let h = Harness::sqlite("edge-stall")
        .route(
            "s2",
            "/s2",
            "    guard_methods: []\n    upstream_timeout: 2s\n",
        )
        .route(
            "s1",
            "/s1",
            "    guard_methods: []\n    upstream_timeout: 1s\n",
        )
        .route("g", "/g", "    verify: none\n    upstream_timeout: 1s\n")
        .yaml("downstream:\n  body_timeout: 2s\n")
        .start();
    for path in ["/s2", "/s1", "/g"] {
        let mut c = Client::connect(h.addr).unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nX-Event-ID: stall\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nTrailer-Is: This"
        );
        c.send_raw(head.as_bytes()).unwrap();
        let started = Instant::now();
        let r = c.read_response(false).unwrap();
        let took = started.elapsed();
        assert_eq!(r.status, 408, "{path}: {r:?}");
        assert_eq!(problem_type(&r), "invalid-body", "{path}");
        assert!(took < Duration::from_secs(4), "{path}: {took:?}");
        // and the connection closes
        let mut rest = Vec::new();
        let mut stream = c.writer().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(
            stream.read_to_end(&mut rest).map(|_| rest.len()).ok(),
            Some(0),
            "{path}"
        );
    }
    assert_eq!(h.up.total(), 0, "the consumer never got a whole request");
    let timeouts = "idemgate_upstream_responses_total{class=\"timeout\",route=\"s2\"}";
    assert_eq!(h.metric(timeouts), 0.0, "no upstream timeout counted");
    assert_eq!(
        h.metric("idemgate_connections_closed_total{reason=\"body_timeout\"}"),
        3.0
    );
}

/// Every `idemgate_store_duration_seconds_count` series, summed.
fn store_operations(px: &Proxy) -> (f64, String) {
    let text = px.metrics();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("idemgate_store_duration_seconds_count"))
        .collect();
    let sum = lines
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    (sum, lines.join("\n"))
}

/// The must-show: 1,000 refused deliveries cost the store nothing. The
/// sweeper's gauge reads the store every 5 s, so the count is taken just
/// after one of its reads, and the refusals must fit before the next.
#[test]
fn a_thousand_refused_deliveries_cost_no_store_operation() {
    let h = Harness::sqlite("edge-cost")
        .route(
            "r",
            "/hooks/r",
            "    verify: none\n    allow_from: [192.0.2.0/24]\n",
        )
        .start();
    for _try in 0..3 {
        let (start, _) = store_operations(&h);
        assert!(wait_until(Duration::from_secs(7), || store_operations(&h)
            .0
            != start));
        let (before, shown_before) = store_operations(&h);
        let t = Instant::now();
        for i in 0..1000 {
            let r = h.deliver("/hooks/r", Some(&format!("x{i}")), b"{}");
            assert_eq!(r.status, 403, "{r:?}");
        }
        let (after, shown_after) = store_operations(&h);
        if t.elapsed() > Duration::from_millis(4500) {
            continue; // the gauge's next read may have come meanwhile
        }
        eprintln!(
            "1000 refused in {:?}\nbefore:\n{shown_before}\nafter:\n{shown_after}",
            t.elapsed()
        );
        assert_eq!(
            after, before,
            "before:\n{shown_before}\nafter:\n{shown_after}"
        );
        assert_eq!(h.requests("r", "source_refused"), 1000.0);
        assert_eq!(h.up.total(), 0);
        return;
    }
    panic!("1000 refusals never fitted between two of the gauge's reads");
}
