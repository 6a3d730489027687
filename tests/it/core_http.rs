//! The HTTP side of a guarded route (SPEC §4 "Connections"): keep-alive after
//! every response idemgate writes itself, bodies past pingora's 64 KiB retry
//! buffer both ways, `Expect: 100-continue`, and a small request's single
//! write to the upstream.

use crate::common;
use crate::core_util;
use crate::raw_upstream;

use std::io::Write;
use std::time::Duration;

use common::*;
use core_util::*;
use raw_upstream::{response, upstream, Behavior};

/// Every short-circuit answer leaves the connection usable: 422, 400 (missing
/// ID), 400 (invalid ID), 409, replay and 404 on one connection, then a
/// delivery that is forwarded on it.
#[test]
fn keep_alive_survives_every_short_circuit() {
    let h = Harness::guarded("http-keepalive", "");
    let done = eid("done");
    assert_eq!(h.deliver("/hooks/r", Some(&done), b"delivered").status, 200);
    let held = eid("held");
    h.up.hold(&held, 200, Duration::from_secs(4));
    let first = deliver_in_flight(&h, "/hooks/r", &held, b"held");

    let long_id = "x".repeat(300);
    let fresh = eid("fresh");
    // (path, event ID, body, expected status, expected problem type or "")
    type Step<'a> = (&'a str, Option<&'a str>, &'a [u8], u16, &'a str);
    let steps: [Step; 7] = [
        (
            "/hooks/r",
            Some(&done),
            b"another payload",
            422,
            "digest_mismatch",
        ),
        ("/hooks/r", None, b"no id at all", 400, "missing_id"),
        (
            "/hooks/r",
            Some(&long_id),
            b"id too long",
            400,
            "invalid_id",
        ),
        ("/hooks/r", Some(&held), b"held", 409, "in_flight"),
        ("/hooks/r", Some(&done), b"delivered", 200, "replayed"),
        ("/nowhere", Some(&fresh), b"no route", 404, "no_route"),
        ("/hooks/r", Some(&fresh), b"fresh", 200, "forwarded"),
    ];
    let mut c = h.client();
    for (path, id, body, status, outcome) in steps {
        let mut headers = vec![("Content-Type", "application/octet-stream")];
        if let Some(id) = id {
            headers.push(("X-Event-ID", id));
        }
        let r = c
            .request("POST", path, &headers, body)
            .unwrap_or_else(|e| panic!("{outcome} on the same connection: {e}"));
        assert_eq!(r.status, status, "{outcome}: {r:?}");
        assert_eq!(r.header("Idempotency-Status"), Some(outcome));
        assert!(!says_close(&r.headers), "{outcome} keeps the connection");
    }
    assert_eq!(h.up.count(&fresh), 1, "the last one was forwarded");
    assert_eq!(first.join().unwrap().unwrap().status, 200);
    assert_eq!(h.up.total(), 3);
}

/// A Content-Length over `max_body` is refused from the header: 413, and the
/// connection is either closed (and says so) or still usable.
#[test]
fn content_length_over_max_body_gets_413() {
    let h = Harness::guarded("http-413", "    max_body: 1KiB\n");
    let mut c = h.client();
    let id = eid("big");
    let r = c
        .request(
            "POST",
            "/hooks/r",
            &[("X-Event-ID", &id)],
            &payload(5000, 2),
        )
        .unwrap();
    assert_eq!(r.status, 413);
    assert_eq!(problem_type(&r), "body-too-large");
    assert_eq!(r.header("Idempotency-Status"), Some("body_too_large"));
    let next = c.request("POST", "/hooks/r", &[("X-Event-ID", &id)], b"small");
    if says_close(&r.headers) {
        assert!(
            next.is_err(),
            "Connection: close, yet the connection answered"
        );
    } else {
        assert_eq!(next.expect("the connection is still usable").status, 200);
    }
    // Under the limit on a fresh connection, the event was not spoiled.
    let ok = h.deliver("/hooks/r", Some(&id), b"small");
    assert!(ok.status == 200, "{ok:?}");
    assert_eq!(h.up.count(&id), 1);
}

/// Bodies past pingora's 64 KiB retry buffer reach the consumer byte for
/// byte, with Content-Length and chunked, on one keep-alive connection; the
/// digest covers the whole body (a change in the last byte is a mismatch).
#[test]
fn large_bodies_are_forwarded_whole() {
    let h = Harness::guarded("http-large", "    max_body: 2MiB\n");
    let mut c = h.client();
    for (n, len) in [200_000usize, 1_000_000].into_iter().enumerate() {
        let body = payload(len, 10 + n as u64);
        let id = eid("cl");
        let r = c
            .request("POST", "/hooks/r", &[("X-Event-ID", &id)], &body)
            .unwrap();
        assert_eq!(r.status, 200, "{len} bytes with Content-Length");
        let got = h.up.received().into_iter().find(|g| g.key() == Some(&id));
        assert!(
            got.unwrap().body == body,
            "{len} bytes arrive byte for byte"
        );

        let body = payload(len, 20 + n as u64);
        let id = eid("chunked");
        c.send_raw(&chunked_head("/hooks/r", &id)).unwrap();
        c.send_raw(&chunked(&body)).unwrap();
        let r = c.read_response(false).unwrap();
        assert_eq!(r.status, 200, "{len} bytes chunked: {r:?}");
        assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
        let got = h.up.received().into_iter().find(|g| g.key() == Some(&id));
        let got = got.expect("the chunked request reached the consumer");
        assert!(got.body == body, "{len} chunked bytes arrive byte for byte");
        assert_eq!(got.header("Content-Length"), Some(len.to_string().as_str()));

        c.send_raw(&chunked_head("/hooks/r", &id)).unwrap();
        c.send_raw(&chunked(&body)).unwrap();
        let dup = c.read_response(false).unwrap();
        assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));
        let mut changed = body.clone();
        *changed.last_mut().unwrap() ^= 1;
        c.send_raw(&chunked_head("/hooks/r", &id)).unwrap();
        c.send_raw(&chunked(&changed)).unwrap();
        let other = c.read_response(false).unwrap();
        assert_eq!(other.status, 422, "the last byte is part of the digest");
        assert_eq!(h.up.count(&id), 1);
    }
    assert_eq!(h.up.total(), 4);
}

/// A chunked body that grows past `max_body` gets 413 (the body is written
/// from another thread: the proxy may answer before it has all been sent).
#[test]
fn chunked_body_over_max_body_gets_413() {
    let h = Harness::guarded("http-chunked-413", "    max_body: 2MiB\n");
    let id = eid("huge");
    let mut raw = Raw::connect(h.addr);
    let mut writer = raw.writer();
    let bytes = [chunked_head("/hooks/r", &id), chunked(&payload(3 << 20, 3))].concat();
    let sending = std::thread::spawn(move || {
        // A write error is fine once the proxy has answered and closed.
        let _ = writer.write_all(&bytes);
    });
    let head = raw.head().expect("an answer");
    assert_eq!(head.status, 413);
    let body = raw.body(&head).unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["type"], "urn:idemgate:problem:body-too-large");
    sending.join().unwrap();
    assert_eq!(h.up.total(), 0, "nothing forwarded");
    // The event is not claimed: a body within the limit goes through.
    assert_eq!(h.deliver("/hooks/r", Some(&id), b"small").status, 200);
    assert_eq!(h.up.count(&id), 1);
}

/// `Expect: 100-continue`: `100 Continue` before the body, then the final
/// answer; when the headers already decide (Content-Length over `max_body`,
/// no event ID) the final status comes at once.
#[test]
fn expect_100_continue() {
    let h = Harness::guarded("http-expect", "    max_body: 1KiB\n");
    let head_to = |path: &str, id: Option<&str>, len: usize| {
        let id = id
            .map(|i| format!("X-Event-ID: {i}\r\n"))
            .unwrap_or_default();
        format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\n{id}Content-Length: {len}\r\n\
             Expect: 100-continue\r\n\r\n"
        )
    };
    let head = |id: Option<&str>, len: usize| head_to("/hooks/r", id, len);

    let id = eid("expect");
    let body = b"{\"after\":\"continue\"}";
    let mut raw = Raw::connect(h.addr);
    raw.send(head(Some(&id), body.len()).as_bytes()).unwrap();
    let interim = raw.head().expect("an interim answer before the body");
    assert_eq!(interim.status, 100);
    assert_eq!(h.up.total(), 0);
    raw.send(body).unwrap();
    let fin = raw.head().unwrap();
    assert_eq!(fin.status, 200);
    assert_eq!(fin.header("Idempotency-Status"), Some("forwarded"));
    assert!(
        !says_close(&fin.headers),
        "the 100 does not cost the keep-alive"
    );
    raw.body(&fin).unwrap();
    let got = only_request(&h, body);
    assert_eq!(got.header("Expect"), None, "idemgate answered the Expect");
    // The same connection goes on: the duplicate, with its own 100.
    raw.send(head(Some(&id), body.len()).as_bytes()).unwrap();
    assert_eq!(raw.head().unwrap().status, 100);
    raw.send(body).unwrap();
    let dup = raw.head().unwrap();
    assert_eq!(
        (dup.status, dup.header("Idempotent-Replayed")),
        (200, Some("true"))
    );

    let refused = [
        ("/hooks/r", Some(id.as_str()), 5000, 413),
        ("/hooks/r", None, 10, 400),
        ("/nowhere", Some(id.as_str()), 10, 404),
    ];
    for (path, id, len, status) in refused {
        let mut raw = Raw::connect(h.addr);
        raw.send(head_to(path, id, len).as_bytes()).unwrap();
        let t = std::time::Instant::now();
        let fin = raw.head().expect("the final answer without the body");
        assert_eq!(fin.status, status, "no 100 Continue for a refused request");
        // Not after the proxy gave up waiting for a body it never asked for.
        assert!(t.elapsed() < Duration::from_secs(5), "{status} at once");
    }
    assert_eq!(h.up.total(), 1);
}

/// A raw upstream answering 200 `ok` to everything, and a harness whose one
/// route `name` (at `prefix`, with `extra` lines) goes to it.
fn to_a_raw_200(tag: &str, name: &str, prefix: &str, extra: &str) -> (Server, Harness) {
    let up = upstream(|_, _| Behavior::Respond(response(200, b"ok")));
    let h = Harness::sqlite(tag)
        .route_to(name, prefix, &up.url(), extra)
        .start();
    (up, h)
}

/// A guarded request with a small body reaches the upstream in one piece:
/// the header and the body in one write, so one read of the upstream's
/// holds the whole request (one segment and one wake-up of the consumer,
/// not two), on a new upstream connection and on a pooled one. A larger
/// body still arrives whole, after its header.
#[test]
fn small_requests_reach_the_upstream_in_one_write() {
    let (up, h) = to_a_raw_200("http-one-write", "r", "/hooks/r", "    max_body: 1MiB\n");
    let bodies = [payload(1024, 1), payload(3000, 2), payload(200_000, 3)];
    for body in &bodies {
        let r = h.deliver("/hooks/r", Some(&eid("one-write")), body);
        assert_eq!(r.status, 200, "{r:?}");
    }
    let got = up.received();
    assert_eq!(got.len(), 3);
    assert_eq!(
        up.connections(),
        1,
        "the later requests went on the pooled connection"
    );
    for (request, body) in got.iter().zip(&bodies) {
        assert!(&request.body == body, "the body arrives byte for byte");
        if body.len() <= 3000 {
            assert_eq!(
                request.reads,
                1,
                "a {}-byte body came in the same read as its header",
                body.len()
            );
        }
    }
}

/// Unguarded requests with a small body of known length go out as guarded
/// ones do: header and body in one write, on the route's kept connection,
/// counted once each. A GET without a body goes on without a length; a body
/// past 64 KiB still streams through pingora's path (on a connection of its
/// own pool).
#[test]
fn small_unguarded_requests_reach_the_upstream_in_one_write() {
    let (up, h) = to_a_raw_200(
        "http-one-write-unguarded",
        "p",
        "/plain",
        "    guard_methods: []\n",
    );
    let mut c = h.client();
    let small = [payload(1024, 4), payload(3000, 5)];
    for body in &small {
        let r = c.request("POST", "/plain", &[], body).unwrap();
        assert_eq!(
            (r.status, r.header("Idempotency-Status")),
            (200, Some("unguarded"))
        );
    }
    c.send_raw(b"GET /plain/x?q=1 HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let r = c.read_response(false).unwrap();
    assert_eq!(
        (r.status, r.header("Idempotency-Status")),
        (200, Some("unguarded"))
    );
    let big = payload(200_000, 6);
    let r = c.request("POST", "/plain", &[], &big).unwrap();
    assert_eq!(r.status, 200);

    let got = up.received();
    assert_eq!(got.len(), 4);
    for (request, body) in got.iter().zip(&small) {
        assert!(&request.body == body, "the body arrives byte for byte");
        assert_eq!(
            request.reads,
            1,
            "a {}-byte body came in the same read as its header",
            body.len()
        );
    }
    assert!(got[2].head.starts_with(b"GET /plain/x?q=1 "));
    assert_eq!(got[2].header("Content-Length"), None, "no body, no length");
    assert!(got[3].body == big, "the large body arrives whole");
    assert_eq!(
        up.connections(),
        2,
        "the small requests and the GET on one kept connection, the large one on its own"
    );
    assert_eq!(h.requests("p", "unguarded"), 4.0);
}
