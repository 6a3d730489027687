//! Core behaviour of a guarded route against a real consumer and a real
//! SQLite file (SPEC §3–§4): forwarding, replay, digest mismatch, in-flight
//! duplicates, persistence across a restart. Retries and failures are in
//! `core_retry.rs`, connection handling and bodies in `core_http.rs`, routing,
//! unguarded traffic and metrics in `core_routes.rs`.

use crate::common;
use crate::core_util;

use std::time::Duration;

use common::*;
use core_util::*;

#[test]
fn first_delivery_then_replay_then_mismatch() {
    let h = Harness::guarded("core", "");
    let id = eid("evt");
    let first = h.deliver("/hooks/r", Some(&id), br#"{"a":1}"#);
    assert_eq!(first.status, 200);
    assert_eq!(first.header("Idempotency-Status"), Some("forwarded"));
    let got = h.up.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header("Idempotency-Key"), Some(id.as_str()));
    assert_eq!(got[0].body, br#"{"a":1}"#);

    let dup = h.deliver("/hooks/r", Some(&id), br#"{"a":1}"#);
    assert_eq!(
        (dup.status, dup.header("Idempotent-Replayed")),
        (200, Some("true"))
    );
    let other = h.deliver("/hooks/r", Some(&id), br#"{"a":2}"#);
    assert_eq!(other.status, 422);
    assert_eq!(other.json()["type"], "urn:idemgate:problem:digest-mismatch");
    assert_eq!(h.up.count(&id), 1);
    assert_state(&h.store, "r", &id, "delivered", 1);
}

/// Method, path and query, every header, the body: the consumer gets the
/// request as sent, with idemgate's `Idempotency-Key` instead of the
/// sender's; the upstream's answer comes back as it was.
#[test]
fn first_delivery_is_forwarded_byte_for_byte() {
    let h = Harness::guarded("core-bytes", "    guard_methods: [POST, PUT]\n");
    let id = eid("bytes");
    h.up.script(&id, vec![Reply::status(201).body(b"created, thanks")]);
    let body = payload(3000, 1);
    let path = "/hooks/r/sub/path?x=1&y=two%20words&x=3";
    let sent: [(&str, &str); 7] = [
        ("X-Event-ID", &id),
        ("Content-Type", "application/octet-stream"),
        ("X-Custom", "a  b, c;d=\"e\""),
        ("X-Multi", "one"),
        ("X-Multi", "two"),
        ("User-Agent", "core-test/1.0"),
        ("Idempotency-Key", "chosen-by-the-sender"),
    ];
    let resp = h.client().request("PUT", path, &sent, &body).unwrap();
    assert_eq!(resp.status, 201);
    assert_eq!(resp.body, b"created, thanks");
    assert_eq!(resp.header("Content-Type"), Some("text/plain"));
    assert_eq!(resp.header("Idempotency-Status"), Some("forwarded"));
    assert_eq!(resp.header("Idempotent-Replayed"), None);

    let got = h.up.received();
    let seen: Vec<(&str, &str, Option<&str>)> = got
        .iter()
        .map(|r| (r.method.as_str(), r.path.as_str(), r.key()))
        .collect();
    assert_eq!(
        got.len(),
        1,
        "the consumer saw {seen:?}\nproxy log:\n{}",
        h.log()
    );
    let got = &got[0];
    assert_eq!(got.method, "PUT");
    assert_eq!(got.path, path);
    assert_eq!(got.body, body, "the body arrives byte for byte");
    let all = |name: &str| -> Vec<&str> {
        got.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    };
    for (name, _) in &sent[..6] {
        let expected: Vec<&str> = sent
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| *v)
            .collect();
        assert_eq!(all(name), expected, "header {name}");
    }
    assert_eq!(all("Host"), ["localhost"]);
    assert_eq!(all("Content-Length"), [body.len().to_string().as_str()]);
    assert_eq!(
        all("Idempotency-Key"),
        [id.as_str()],
        "the sender's Idempotency-Key is replaced, not duplicated"
    );
    assert!(all("Transfer-Encoding").is_empty());

    // PUT is guarded on this route: its duplicate is answered by idemgate.
    let dup = h.client().request("PUT", path, &sent, &body).unwrap();
    assert_eq!(dup.status, 201);
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(h.up.count(&id), 1);
}

/// A duplicate of a delivered event gets the recorded status, marked as a
/// replay, with an empty body (no `replay_body`); the consumer is not called.
#[test]
fn duplicates_replay_the_recorded_status() {
    let h = Harness::guarded("core-replay", "");
    for status in [200u16, 202, 204] {
        let id = eid(&format!("replay{status}"));
        h.up.script(&id, vec![Reply::status(status).body(b"the first answer")]);
        let first = h.deliver("/hooks/r", Some(&id), b"payload");
        assert_eq!(first.status, status);
        let expected_first: &[u8] = if status == 204 {
            b""
        } else {
            b"the first answer"
        };
        assert_eq!(first.body, expected_first);
        assert_eq!(first.header("Idempotent-Replayed"), None);

        for _ in 0..2 {
            let dup = h.deliver("/hooks/r", Some(&id), b"payload");
            assert_eq!(dup.status, status, "replay of {status}");
            assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));
            assert_eq!(dup.header("Idempotency-Status"), Some("replayed"));
            assert!(dup.body.is_empty(), "replay of {status} has no body");
            if status != 204 {
                assert_eq!(dup.header("Content-Length"), Some("0"));
            }
        }
        assert_eq!(h.up.count(&id), 1, "upstream called once for {status}");
        let rec = show(&h.store, "r", &id);
        assert_eq!(rec["state"], "delivered");
        assert_eq!(rec["last_status"], status);
    }
}

/// The same ID with another payload is refused while the first delivery is
/// still processing and after it was delivered; the original still replays.
#[test]
fn digest_mismatch_while_processing_and_after_delivery() {
    let h = Harness::guarded("core-mismatch", "");
    let id = eid("mismatch");
    h.up.hold(&id, 200, Duration::from_secs(3));
    let first = deliver_in_flight(&h, "/hooks/r", &id, b"original");
    assert_eq!(show(&h.store, "r", &id)["state"], "processing");

    let other = h.deliver("/hooks/r", Some(&id), b"changed");
    assert_eq!(other.status, 422, "mismatch while processing: {other:?}");
    assert_eq!(problem_type(&other), "digest-mismatch");
    assert_eq!(other.json()["event_id"], id.as_str());
    assert_eq!(other.json()["status"], 422);
    assert_eq!(other.header("Idempotency-Status"), Some("digest_mismatch"));

    let first = first.join().unwrap().expect("first delivery answered");
    assert_eq!(first.status, 200);
    assert_eq!(first.header("Idempotency-Status"), Some("forwarded"));

    let other = h.deliver("/hooks/r", Some(&id), b"changed");
    assert_eq!(other.status, 422, "mismatch after delivery");
    assert_eq!(problem_type(&other), "digest-mismatch");
    let dup = h.deliver("/hooks/r", Some(&id), b"original");
    assert_eq!(dup.status, 200);
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(h.up.count(&id), 1);
    assert_state(&h.store, "r", &id, "delivered", 1);
}

/// A duplicate while the first delivery is at the consumer: 409 at once with
/// `Retry-After` in whole seconds within the lease (10 s in the harness).
#[test]
fn in_flight_duplicate_gets_409_with_retry_after() {
    let h = Harness::guarded("core-inflight", "");
    let id = eid("inflight");
    h.up.hold(&id, 200, Duration::from_secs(3));
    let first = deliver_in_flight(&h, "/hooks/r", &id, b"same");

    let dup = h.deliver("/hooks/r", Some(&id), b"same");
    assert_eq!(dup.status, 409, "{dup:?}");
    assert_eq!(problem_type(&dup), "in-flight");
    assert_eq!(dup.json()["event_id"], id.as_str());
    assert_eq!(dup.header("Idempotency-Status"), Some("in_flight"));
    let retry_after = dup.header("Retry-After").expect("Retry-After");
    let secs: u64 = retry_after
        .parse()
        .unwrap_or_else(|_| panic!("Retry-After is whole seconds: {retry_after:?}"));
    assert!(
        (1..=10).contains(&secs),
        "Retry-After {secs} within the lease"
    );

    let first = first.join().unwrap().expect("first delivery answered");
    assert_eq!(first.status, 200);
    let dup = h.deliver("/hooks/r", Some(&id), b"same");
    assert_eq!(dup.status, 200);
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(h.up.count(&id), 1, "the consumer saw the event once");
}

/// Records survive a graceful restart: the duplicate is replayed and another
/// payload under the same ID is still refused.
#[test]
fn records_persist_across_a_restart() {
    let mut h = Harness::guarded("core-restart", "");
    let id = eid("restart");
    h.up.script(&id, vec![Reply::status(202)]);
    assert_eq!(h.deliver("/hooks/r", Some(&id), b"kept").status, 202);
    assert_eq!(
        h.stop(Duration::from_secs(10)),
        Some(0),
        "SIGTERM stops cleanly; log:\n{}",
        h.log()
    );
    assert!(kit::get(h.addr, "/").is_err(), "the proxy is down");
    h.spawn();

    let dup = h.deliver("/hooks/r", Some(&id), b"kept");
    assert_eq!(dup.status, 202);
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));
    let other = h.deliver("/hooks/r", Some(&id), b"not what was delivered");
    assert_eq!(other.status, 422);
    assert_eq!(problem_type(&other), "digest-mismatch");
    assert_eq!(h.up.count(&id), 1);
}
