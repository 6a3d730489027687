//! Upstream faults (issue 8): connection refused, a reset in the middle of
//! the response header or body, a response that never ends, an upstream
//! slower than `upstream_timeout`, and a storm of 5xx. Each gives the SPEC §4
//! status, leaves the record as SPEC §3 says (released → `failed`, or
//! `delivered` once a settling status was seen), and the sender's retry goes
//! through: forwarded again after a release, replayed after a delivery.
//!
//! What SPEC implies for a response that breaks after its header: the settle
//! commits when the status is known, before anything is passed on, so a 2xx
//! header has settled the event `delivered` even if the body then breaks or
//! never ends. The sender gets that header, whatever body arrived, and a
//! closed connection at most `upstream_timeout` after the upstream went
//! silent; its retry is a replay. A non-settling status (5xx) broken the same
//! way leaves the record `failed`, and the retry is forwarded.

use crate::common;
use crate::raw_upstream;

use std::time::{Duration, Instant};

use common::*;
use raw_upstream::{response, send_and_read_to_close, status_of, upstream, Behavior};

/// `upstream_timeout` on every route here.
const TIMEOUT: Duration = Duration::from_secs(1);
const ROUTE_EXTRA: &str = "    upstream_timeout: 1s\n    lease: 5s\n";

fn start_proxy(tag: &str, upstream: &str) -> Harness {
    Harness::sqlite(tag)
        .route_to("r", "/r", upstream, ROUTE_EXTRA)
        .start()
}

fn problem_type(r: &Response) -> String {
    r.json()["type"].as_str().unwrap_or_default().to_string()
}

/// The record after a released attempt: `failed`, no lease, the attempt counted.
#[track_caller]
fn assert_released(store: &str, id: &str, attempts: i64) -> serde_json::Value {
    let rec = show(store, "r", id);
    assert_eq!(rec["state"], "failed", "{rec}");
    assert_eq!(rec["lease_until"], serde_json::Value::Null, "{rec}");
    assert_eq!(rec["attempts"], attempts, "{rec}");
    assert!(
        rec["last_error"].is_string() || rec["last_status"].is_number(),
        "{rec}"
    );
    rec
}

#[track_caller]
fn assert_delivered(store: &str, id: &str, attempts: i64, status: i64) {
    let rec = show(store, "r", id);
    assert_eq!(rec["state"], "delivered", "{rec}");
    assert_eq!(rec["attempts"], attempts, "{rec}");
    assert_eq!(rec["last_status"], status, "{rec}");
}

/// A raw POST with a Content-Length body and an event ID.
fn raw_post(id: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /r HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Nothing listens: 502 `upstream-unreachable`, released; once the consumer
/// is up on that port the retry is forwarded and delivered.
#[test]
fn connection_refused_gives_502_then_the_retry_goes_through() {
    let port = free_port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let h = start_proxy("faults-refused", &format!("http://{addr}"));
    let id = eid("refused");
    let t = Instant::now();
    let r = h.deliver("/r", Some(&id), b"{\"a\":1}");
    assert_eq!(r.status, 502, "{r:?}");
    assert!(t.elapsed() < TIMEOUT + Duration::from_secs(1));
    assert_eq!(
        problem_type(&r),
        "urn:idemgate:problem:upstream-unreachable"
    );
    assert_eq!(r.json()["event_id"], id.as_str());
    assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
    assert_released(&h.store, &id, 1);

    let up = Consumer::start_on(addr).expect("the consumer takes the port");
    let r = h.deliver("/r", Some(&id), b"{\"a\":1}");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(up.count(&id), 1);
    assert_delivered(&h.store, &id, 2, 200);
    assert_eq!(
        h.metric("idemgate_upstream_responses_total{class=\"connect_error\",route=\"r\"}"),
        1.0
    );
}

/// Tells the first attempt at each event from the later ones.
#[derive(Default)]
struct Attempts(std::sync::Mutex<std::collections::HashMap<String, usize>>);

impl Attempts {
    /// 0 for the first request carrying this key, 1 for the second, …
    fn next(&self, req: &Request) -> usize {
        let key = req
            .header("Idempotency-Key")
            .unwrap_or_default()
            .to_string();
        let mut seen = self.0.lock().unwrap();
        let n = seen.entry(key).or_insert(0);
        *n += 1;
        *n - 1
    }
}

/// Starts a raw upstream whose first answer for each event is `first(key)`
/// and whose later answers are a plain 200.
fn first_then_ok(first: impl Fn(&str) -> Behavior + Send + Sync + 'static) -> Server {
    let attempts = Attempts::default();
    upstream(move |req, _| {
        if attempts.next(req) == 0 {
            first(req.header("Idempotency-Key").unwrap_or_default())
        } else {
            Behavior::Respond(response(200, b"ok"))
        }
    })
}

/// `first_then_ok` whose first answer is `matching` for an event whose key
/// starts with `prefix`, and `other` for the rest.
fn first_by_prefix(prefix: &'static str, matching: Behavior, other: Behavior) -> Server {
    first_then_ok(move |key| {
        if key.starts_with(prefix) {
            matching.clone()
        } else {
            other.clone()
        }
    })
}

/// The upstream resets (RST) or closes (FIN) in the middle of its response
/// header: 502, released, and the retry is forwarded — with the same
/// `Idempotency-Key` both times.
#[test]
fn reset_or_close_mid_header_gives_502_and_the_retry_is_forwarded() {
    let up = first_by_prefix(
        "reset",
        Behavior::Reset(b"HTTP/1.1 200 OK\r\nContent-Le".to_vec()),
        Behavior::Close(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n".to_vec()),
    );
    let h = start_proxy("faults-mid-header", &up.url());
    for kind in ["reset", "close"] {
        let id = eid(kind);
        let r = h.deliver("/r", Some(&id), b"{}");
        assert_eq!(r.status, 502, "{kind}: {r:?}");
        assert_eq!(
            problem_type(&r),
            "urn:idemgate:problem:upstream-unreachable"
        );
        assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
        assert_released(&h.store, &id, 1);

        let r = h.deliver("/r", Some(&id), b"{}");
        assert_eq!(r.status, 200, "{kind} retry: {r:?}");
        assert_eq!(r.body, b"ok");
        assert_eq!(
            up.count(&id),
            2,
            "{kind}: both attempts reached the upstream"
        );
        assert_delivered(&h.store, &id, 2, 200);
    }
}

/// The upstream resets after a complete header and part of the body. A 2xx
/// header settled the event `delivered` before it was passed on: the sender
/// gets the 200 and a broken body, and its retry is a replay (the upstream
/// is not contacted again). A 503 header broken the same way is released and
/// the retry is forwarded.
#[test]
fn reset_mid_body_settles_by_the_status_already_seen() {
    let up = first_then_ok(|key| {
        let status = if key.starts_with("ok") { 200 } else { 503 };
        Behavior::Reset(
            format!("HTTP/1.1 {status} X\r\nContent-Length: 100\r\n\r\npartial").into_bytes(),
        )
    });
    let h = start_proxy("faults-mid-body", &up.url());

    let id = eid("ok");
    let (got, closed) =
        send_and_read_to_close(h.addr, &raw_post(&id, "{}"), Duration::from_secs(5));
    let text = String::from_utf8_lossy(&got);
    assert!(closed, "the connection is closed: {text}");
    assert_eq!(status_of(&got), Some(200), "{text}");
    assert!(
        text.ends_with("partial"),
        "what arrived of the body is passed on: {text}"
    );
    assert_delivered(&h.store, &id, 1, 200);
    let r = h.deliver("/r", Some(&id), b"{}");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(up.count(&id), 1, "a delivered event is not forwarded again");

    let id = eid("err");
    let (got, closed) =
        send_and_read_to_close(h.addr, &raw_post(&id, "{}"), Duration::from_secs(5));
    assert!(closed);
    assert_eq!(
        status_of(&got),
        Some(503),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert_released(&h.store, &id, 1);
    let r = h.deliver("/r", Some(&id), b"{}");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(up.count(&id), 2);
    assert_delivered(&h.store, &id, 2, 200);
}

/// A response that never ends. Header incomplete: 504 within
/// `upstream_timeout`, released, retry forwarded. Header complete, body
/// stalled: the header (and what came of the body) is passed on and the
/// connection closed `upstream_timeout` after the upstream went silent; the
/// record is settled by the status (200 → delivered, retry replayed; 503 →
/// failed, retry forwarded).
#[test]
fn a_response_that_never_ends_is_cut_off_after_upstream_timeout() {
    let up = first_then_ok(|key| {
        if key.starts_with("header") {
            Behavior::Stall(b"HTTP/1.1 200 OK\r\nContent-".to_vec())
        } else {
            let status = if key.starts_with("ok") { 200 } else { 503 };
            Behavior::Stall(
                format!("HTTP/1.1 {status} X\r\nContent-Length: 100\r\n\r\npartial").into_bytes(),
            )
        }
    });
    let h = start_proxy("faults-never-ends", &up.url());
    let bound = TIMEOUT + Duration::from_millis(1500);

    // The header never completes.
    let id = eid("header");
    let t = Instant::now();
    let r = h.deliver("/r", Some(&id), b"{}");
    let took = t.elapsed();
    assert_eq!(r.status, 504, "{r:?}");
    assert!(took >= TIMEOUT && took < bound, "504 after {took:?}");
    assert_eq!(problem_type(&r), "urn:idemgate:problem:upstream-timeout");
    assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
    assert_released(&h.store, &id, 1);
    let r = h.deliver("/r", Some(&id), b"{}");
    assert_eq!(r.status, 200, "retry: {r:?}");
    assert_delivered(&h.store, &id, 2, 200);
    eprintln!("never-ending header: 504 after {took:?}");

    // The header arrives, the body never completes.
    for (kind, status) in [("ok", 200u16), ("err", 503)] {
        let id = eid(kind);
        let t = Instant::now();
        let (got, closed) =
            send_and_read_to_close(h.addr, &raw_post(&id, "{}"), Duration::from_secs(10));
        let took = t.elapsed();
        let text = String::from_utf8_lossy(&got);
        eprintln!("never-ending {status} body: closed={closed} after {took:?}");
        assert!(
            closed,
            "{kind}: the connection is closed, not left hanging: {text}"
        );
        assert!(took < bound, "{kind}: closed after {took:?}");
        assert_eq!(status_of(&got), Some(status), "{text}");
        assert!(text.ends_with("partial"), "{text}");
        let r = h.deliver("/r", Some(&id), b"{}");
        assert_eq!(r.status, 200, "{kind} retry: {r:?}");
        if status == 200 {
            assert_eq!(r.header("Idempotent-Replayed"), Some("true"));
            assert_eq!(up.count(&id), 1);
            assert_delivered(&h.store, &id, 1, 200);
        } else {
            assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
            assert_eq!(up.count(&id), 2);
            assert_delivered(&h.store, &id, 2, 200);
        }
    }
}

/// An upstream slower than `upstream_timeout`: 504 after the timeout (not
/// after the upstream's delay), released; the retry is forwarded and
/// delivered. The slow attempt did reach the upstream (the ambiguity SPEC
/// leaves to the `Idempotency-Key`).
#[test]
fn a_slow_upstream_gives_504_then_the_retry_goes_through() {
    let up = Consumer::start().unwrap();
    let h = start_proxy("faults-slow", &up.url());
    let id = eid("slow");
    up.script(
        &id,
        vec![
            Reply::status(200).delay(Duration::from_secs(4)),
            Reply::status(201),
        ],
    );
    let t = Instant::now();
    let r = h.deliver("/r", Some(&id), b"{}");
    let took = t.elapsed();
    eprintln!("slow upstream: 504 after {took:?}");
    assert_eq!(r.status, 504, "{r:?}");
    assert!(
        took >= TIMEOUT && took < TIMEOUT + Duration::from_millis(1500),
        "{took:?}"
    );
    assert_eq!(problem_type(&r), "urn:idemgate:problem:upstream-timeout");
    assert_eq!(r.json()["event_id"], id.as_str());
    assert_released(&h.store, &id, 1);
    assert_eq!(up.count(&id), 1);

    let r = h.deliver("/r", Some(&id), b"{}");
    assert_eq!(r.status, 201, "{r:?}");
    assert_delivered(&h.store, &id, 2, 201);
    let keys: Vec<_> = up
        .received()
        .iter()
        .filter_map(|q| q.header("Idempotency-Key").map(str::to_owned))
        .collect();
    assert_eq!(
        keys,
        vec![id.clone(), id.clone()],
        "the same key on both attempts"
    );
    assert_eq!(
        h.metric("idemgate_upstream_responses_total{class=\"timeout\",route=\"r\"}"),
        1.0
    );
}

/// A 5xx storm: 50 events, sent concurrently, all answered 503 — passed
/// through, every claim released; the retries are all forwarded and
/// delivered; a third round is all replays.
#[test]
fn a_5xx_storm_releases_every_claim_and_the_retries_go_through() {
    const N: usize = 50;
    let up = Consumer::start().unwrap();
    let h = start_proxy("faults-storm", &up.url());
    let ids: Vec<String> = (0..N).map(|i| eid(&format!("storm{i}"))).collect();
    for id in &ids {
        up.script(
            id,
            vec![Reply::status(503).body(b"busy"), Reply::status(200)],
        );
    }
    let round = |ids: &[String]| -> Vec<Response> {
        let addr = h.addr;
        let handles: Vec<_> = ids
            .chunks(5)
            .map(|chunk| {
                let chunk = chunk.to_vec();
                std::thread::spawn(move || {
                    chunk
                        .iter()
                        .map(|id| kit::deliver(addr, "/r", Some(id), b"{\"storm\":true}").unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    };
    let t = Instant::now();
    let first = round(&ids);
    eprintln!("5xx storm: {N} x 503 in {:?}", t.elapsed());
    for r in &first {
        assert_eq!(r.status, 503, "{r:?}");
        assert_eq!(r.body, b"busy", "the upstream's own 503 is passed through");
        assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
    }
    for id in &ids {
        let rec = assert_released(&h.store, id, 1);
        assert_eq!(rec["last_status"], 503);
    }
    let second = round(&ids);
    for r in &second {
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
    }
    let third = round(&ids);
    for r in &third {
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.header("Idempotent-Replayed"), Some("true"));
    }
    for id in &ids {
        assert_eq!(up.count(id), 2, "{id}: one failed attempt and one delivery");
        assert_delivered(&h.store, id, 2, 200);
    }
    assert_eq!(
        h.metric("idemgate_settles_total{result=\"released\",route=\"r\"}"),
        N as f64
    );
    assert_eq!(
        h.metric("idemgate_settles_total{result=\"delivered\",route=\"r\"}"),
        N as f64
    );
}

/// A body that keeps coming, slowly (each gap shorter than
/// `upstream_timeout`, the whole longer): relayed to its end, not cut —
/// `upstream_timeout` bounds the wait for the header and each silence, not a
/// live stream. (pingora's downstream writer buffers up to 1460 bytes until
/// the body ends, as on its own proxy path, so these few bytes arrive
/// together at the end.)
#[test]
fn a_slow_but_live_body_is_relayed_to_its_end() {
    use std::io::{Read, Write};
    let body = b"0123456789abcdef";
    // The header at once, then one body byte every 200 ms (3.2 s in all).
    let trickle = upstream(move |_, _| {
        Behavior::Trickle(
            b"HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n".to_vec(),
            body.to_vec(),
            Duration::from_millis(200),
        )
    });
    let h = start_proxy("faults-trickle", &trickle.url());
    let id = eid("trickle");
    let mut s = std::net::TcpStream::connect(h.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t = Instant::now();
    s.write_all(&raw_post(&id, "{}")).unwrap();
    let mut got = Vec::new();
    let mut first_byte = None;
    let mut chunk = [0u8; 1024];
    while !got.ends_with(body) {
        let n = s.read(&mut chunk).expect("the relay keeps going");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&got));
        first_byte.get_or_insert(t.elapsed());
        got.extend_from_slice(&chunk[..n]);
    }
    let took = t.elapsed();
    eprintln!(
        "trickled body: first bytes after {:?}, whole body after {took:?}",
        first_byte.unwrap_or_default()
    );
    assert_eq!(status_of(&got), Some(200));
    assert!(
        took > TIMEOUT * 2,
        "the stream outlived upstream_timeout: {took:?}"
    );
    assert_delivered(&h.store, &id, 1, 200);
}

/// With `replay_body`, the body is read (up to `replay_body_limit`) before
/// the settle commits. A 2xx whose body then breaks (reset) or stalls has
/// still been accepted by the upstream: the event must be settled
/// `delivered` (without a stored body), never left `processing` until its
/// lease runs out — which would forward it a second time.
#[test]
fn with_replay_body_a_broken_2xx_body_still_settles_delivered() {
    let up = first_then_ok(|key| {
        let partial = b"HTTP/1.1 200 X\r\nContent-Length: 100\r\n\r\npartial".to_vec();
        if key.starts_with("reset") {
            Behavior::Reset(partial)
        } else {
            Behavior::Stall(partial)
        }
    });
    let extra = format!("{ROUTE_EXTRA}    replay_body: true\n");
    let h = Harness::sqlite("faults-replay-body")
        .route_to("r", "/r", &up.url(), &extra)
        .start();
    for kind in ["reset", "stall"] {
        let id = eid(kind);
        let t = Instant::now();
        let (got, closed) =
            send_and_read_to_close(h.addr, &raw_post(&id, "{}"), Duration::from_secs(10));
        let took = t.elapsed();
        eprintln!(
            "replay_body, {kind}: closed={closed} after {took:?}: {:?}",
            String::from_utf8_lossy(&got)
        );
        assert!(closed, "{kind}: the sender's connection is closed");
        assert!(
            took < TIMEOUT + Duration::from_millis(1500),
            "{kind}: {took:?}"
        );
        let rec = show(&h.store, "r", &id);
        assert_eq!(rec["state"], "delivered", "{kind}: {rec}");
        let r = h.deliver("/r", Some(&id), b"{}");
        assert_eq!(r.status, 200, "{kind} retry: {r:?}");
        assert_eq!(r.header("Idempotent-Replayed"), Some("true"), "{kind}");
        assert_eq!(up.count(&id), 1, "{kind}: forwarded once");
    }
}

/// Garbage instead of a status line: 502, released, retry forwarded. A 200
/// whose body ends with the connection (no length, no chunking) is an
/// ordinary delivery, relayed whole.
#[test]
fn garbage_and_close_delimited_responses() {
    let up = first_by_prefix(
        "garbage",
        Behavior::Close(b"HELLO THERE\r\n\r\n".to_vec()),
        Behavior::Close(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nthe body ends with the connection"
                .to_vec(),
        ),
    );
    let h = start_proxy("faults-garbage", &up.url());

    let id = eid("garbage");
    let r = h.deliver("/r", Some(&id), b"{}");
    assert_eq!(r.status, 502, "{r:?}");
    assert_eq!(
        problem_type(&r),
        "urn:idemgate:problem:upstream-unreachable"
    );
    assert_released(&h.store, &id, 1);
    let r = h.deliver("/r", Some(&id), b"{}");
    assert_eq!(r.status, 200, "retry: {r:?}");
    assert_delivered(&h.store, &id, 2, 200);

    let id = eid("until-close");
    let r = h.deliver("/r", Some(&id), b"{}");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, b"the body ends with the connection");
    assert_delivered(&h.store, &id, 1, 200);
    assert_eq!(up.count(&id), 1);
}
