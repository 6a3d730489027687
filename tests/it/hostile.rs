//! Hostile input against a running proxy on SQLite (issue 8): malformed
//! chunked encoding, `Content-Length` together with `Transfer-Encoding`,
//! oversized header sections, non-UTF-8 header values, absurd event IDs,
//! bodies at `max_body` ± 1, a slowloris sender, and 10,000 distinct events
//! on one keep-alive connection.
//!
//! Each hostile request must get a clear 4xx or a closed connection, must
//! never change a record (`idemgate events list --json`), must never reach the
//! consumer, and must leave other clients unaffected (a bystander delivery
//! after each one is forwarded at once).

use crate::common;
use crate::raw_upstream;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use raw_upstream::{upstream, Behavior};

const SMALL_MAX: usize = 1024;
const BIG_MAX: usize = 100 * 1024;

/// A proxy with two guarded routes in front of the sample consumer:
/// `small` (/h, max_body 1KiB) and `big` (/big, max_body 100KiB, past
/// pingora's 64 KiB retry buffer).
fn setup(tag: &str) -> Harness {
    Harness::sqlite(tag)
        .route("small", "/h", "    max_body: 1KiB\n")
        .route("big", "/big", "    max_body: 100KiB\n")
        .start()
}

/// `events list --json` for one route, as (event_id, state) pairs.
fn records(store: &str, route: &str) -> Vec<(String, String)> {
    let (code, out, err) = cli(&[
        "events", "list", "--store", store, "--route", route, "--limit", "100000", "--json",
    ]);
    assert_eq!(code, 0, "events list: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("events list --json is JSON");
    v.as_array()
        .expect("an array")
        .iter()
        .map(|r| {
            (
                r["event_id"].as_str().unwrap().to_string(),
                r["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// What a raw exchange came to.
#[derive(Debug)]
enum Got {
    /// A response: status, head text, body.
    Response(u16, String, Vec<u8>),
    /// The connection closed (or reset) without a response.
    Closed,
}

/// A short description of an outcome, for the log.
fn brief(got: &Got) -> String {
    match got {
        Got::Closed => "connection closed".into(),
        Got::Response(status, _, body) => {
            format!(
                "{status} {}",
                String::from_utf8_lossy(&body[..body.len().min(120)])
            )
        }
    }
}

/// Sends `bytes` on a fresh connection (optionally half-closing after them)
/// and reads one response, or notes the close. Never waits longer than `wait`.
fn exchange(addr: SocketAddr, bytes: &[u8], half_close: bool, wait: Duration) -> Got {
    let mut s = TcpStream::connect(addr).expect("connect to proxy");
    s.set_read_timeout(Some(wait)).unwrap();
    // The proxy may refuse and close before we finish writing: that is an answer too.
    let _ = s.write_all(bytes);
    if half_close {
        let _ = s.shutdown(Shutdown::Write);
    }
    read_one(&mut s)
}

/// Reads one response (head + Content-Length body) from a raw stream.
fn read_one(s: &mut TcpStream) -> Got {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let status: u16 = head
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if (100..200).contains(&status) {
                buf.drain(..end + 4);
                continue;
            }
            let len = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.trim()
                        .eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            let mut body = buf[end + 4..].to_vec();
            while body.len() < len {
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => body.extend_from_slice(&chunk[..n]),
                }
            }
            body.truncate(len);
            return Got::Response(status, head, body);
        }
        match s.read(&mut chunk) {
            Ok(0) => return Got::Closed,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if timed_out(&e) => {
                panic!("no answer and no close within the wait; got so far: {buf:?}")
            }
            Err(_) => return Got::Closed, // reset
        }
    }
}

/// A 4xx, or the connection closed without an answer.
#[track_caller]
fn assert_refused(what: &str, got: &Got) {
    match got {
        Got::Closed => {}
        Got::Response(status, head, _) => assert!(
            (400..500).contains(status),
            "{what}: expected a 4xx or a closed connection, got {status}:\n{head}"
        ),
    }
}

/// The problem type of a problem+json body.
fn problem_type(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["type"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// A normal delivery on its own connection is forwarded at once.
#[track_caller]
fn bystander(s: &Harness, after: &str) {
    let id = eid("bystander");
    let t = Instant::now();
    let r = s.px.deliver("/h", Some(&id), b"{\"ok\":1}");
    assert_eq!(r.status, 200, "bystander after {after}: {r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "bystander after {after} took {:?}",
        t.elapsed()
    );
    assert_eq!(s.up.count(&id), 1);
}

/// Nothing about `ids` reached the consumer or the store.
#[track_caller]
fn untouched(s: &Harness, route: &str, ids: &[&str]) {
    let recs = records(&s.store, route);
    for id in ids {
        assert_eq!(s.up.count(id), 0, "{id} reached the consumer");
        assert!(
            !recs.iter().any(|(e, _)| e == id),
            "{id} has a record: {recs:?}"
        );
    }
}

fn chunked_head(path: &str, id: &str) -> String {
    format!("POST {path} HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\nTransfer-Encoding: chunked\r\n\r\n")
}

#[test]
fn malformed_chunked_encoding_is_refused() {
    let s = setup("hostile-chunked");
    // (name, chunked body, half-close after sending)
    let cases: [(&str, &[u8], bool); 8] = [
        ("bad-hex-size", b"zz\r\nabc\r\n0\r\n\r\n", false),
        ("negative-size", b"-3\r\nabc\r\n0\r\n\r\n", false),
        (
            "overflowing-size",
            b"fffffffffffffffffffffff\r\nabc\r\n0\r\n\r\n",
            false,
        ),
        ("data-longer-than-size", b"3\r\nabcdef\r\n0\r\n\r\n", false),
        ("truncated-chunk", b"a\r\nabc", true),
        ("no-last-chunk", b"3\r\nabc\r\n", true),
        ("size-over-max-body", b"100000\r\nabc", true),
        ("size-line-without-crlf", b"3abc", true),
    ];
    let mut ids = Vec::new();
    for (name, body, half_close) in cases {
        let id = eid(name);
        let mut bytes = chunked_head("/h", &id).into_bytes();
        bytes.extend_from_slice(body);
        let got = exchange(s.px.addr, &bytes, half_close, Duration::from_secs(15));
        assert_refused(name, &got);
        eprintln!("{name}: {}", brief(&got));
        bystander(&s, name);
        ids.push(id);
    }
    untouched(
        &s,
        "small",
        &ids.iter().map(String::as_str).collect::<Vec<_>>(),
    );
}

/// Both `Content-Length` and `Transfer-Encoding` (RFC 9112 §6.1: a request
/// smuggling vector), and two different `Content-Length`s: refused, and the
/// bytes hidden behind the declared length never become a request.
#[test]
fn conflicting_framing_is_refused() {
    let s = setup("hostile-framing");
    let smuggled_id = eid("smuggled");
    let smuggled = format!(
        "POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {smuggled_id}\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    let cl_te = eid("cl-then-te");
    let te_cl = eid("te-then-cl");
    let two_cl = eid("two-cl");
    let cases: Vec<(&str, String, Vec<u8>)> = vec![
        (
            "content-length then transfer-encoding",
            cl_te.clone(),
            format!(
                "POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {cl_te}\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n{smuggled}"
            )
            .into_bytes(),
        ),
        (
            "transfer-encoding then a longer content-length",
            te_cl.clone(),
            format!(
                "POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {te_cl}\r\nTransfer-Encoding: chunked\r\nContent-Length: 60\r\n\r\n5\r\nhello\r\n0\r\n\r\n{smuggled}"
            )
            .into_bytes(),
        ),
        (
            "two different content-lengths",
            two_cl.clone(),
            format!(
                "POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {two_cl}\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nhello{smuggled}"
            )
            .into_bytes(),
        ),
    ];
    for (name, _, bytes) in &cases {
        let got = exchange(s.px.addr, bytes, false, Duration::from_secs(15));
        eprintln!("{name}: {}", brief(&got));
        assert_refused(name, &got);
        bystander(&s, name);
    }
    let ids: Vec<&str> = cases.iter().map(|(_, id, _)| id.as_str()).collect();
    untouched(&s, "small", &ids);
    untouched(&s, "small", &[&smuggled_id]);
}

/// A POST to `/h` with `fields` padding header fields of `width` bytes
/// each is refused as `what`, and a bystander is served after it.
fn padded_is_refused(s: &Harness, id: &str, fields: usize, width: usize, what: &str) {
    let mut bytes = format!("POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\n");
    for i in 0..fields {
        bytes.push_str(&format!("X-Pad-{i}: {}\r\n", "p".repeat(width)));
    }
    bytes.push_str("Content-Length: 2\r\n\r\n{}");
    let got = exchange(s.px.addr, bytes.as_bytes(), false, Duration::from_secs(15));
    assert_refused(what, &got);
    bystander(s, what);
}

/// Header sections far past what a webhook needs. pingora refuses more than
/// 256 header fields and more than 1 MiB of header; idemgate should refuse a
/// 100 KB section however it is split.
#[test]
fn oversized_header_sections_are_refused() {
    let s = setup("hostile-headers");
    let many = eid("many-fields");
    padded_is_refused(&s, &many, 1000, 90, "1000 header fields (100 KB)");

    let huge = eid("two-mib-field");
    padded_is_refused(&s, &huge, 1, 2 << 20, "a 2 MiB header field");
    untouched(&s, "small", &[&many, &huge]);
}

/// 100 KB of header in ten 10 KB fields: under pingora's limits, so only
/// idemgate can refuse it.
#[test]
fn a_100_kb_header_section_in_few_fields_is_refused() {
    let s = setup("hostile-headers-few");
    let id = eid("ten-big-fields");
    padded_is_refused(&s, &id, 10, 10_000, "ten 10 KB header fields");
    untouched(&s, "small", &[&id]);
}

/// Event IDs that are not visible ASCII (raw bytes, UTF-8, control
/// characters), empty, blank or 10 KB long: 400 `invalid-event-id` with the
/// connection still usable, no record; a 255-byte ID is fine. Control bytes
/// and DEL break the head's grammar itself (SPEC §4, "Strictness", checked
/// first): 400 `invalid-request`, and the connection closes. Bytes outside
/// ASCII are the event-ID header's own to judge: `invalid-event-id`.
#[test]
fn absurd_and_non_utf8_event_ids_get_400() {
    let s = setup("hostile-ids");
    const ID: &str = "urn:idemgate:problem:invalid-event-id";
    const HEAD: &str = "urn:idemgate:problem:invalid-request";
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("raw bytes 0xff 0xfe", b"evt-\xff\xfe".to_vec(), ID),
        ("UTF-8 e-acute", "évt-1".as_bytes().to_vec(), ID),
        ("latin-1 e-acute", b"\xe9vt-2".to_vec(), ID),
        ("control char 0x01", b"evt\x01x".to_vec(), HEAD),
        ("DEL", b"evt\x7f".to_vec(), HEAD),
        ("inner tab", b"evt\tx".to_vec(), ID),
        ("inner space", b"evt x".to_vec(), ID),
        ("empty", b"".to_vec(), ID),
        ("blank", b"   ".to_vec(), ID),
        ("256 bytes", vec![b'x'; 256], ID),
        ("10 KB", vec![b'y'; 10 * 1024], ID),
    ];
    for (name, id, problem) in &cases {
        let mut bytes = b"POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: ".to_vec();
        bytes.extend_from_slice(id);
        bytes.extend_from_slice(b"\r\nContent-Length: 9\r\n\r\n{\"id\":42}");
        let got = exchange(s.px.addr, &bytes, false, Duration::from_secs(10));
        eprintln!("{name}: {}", brief(&got));
        let Got::Response(400, head, body) = got else {
            panic!("{name}: expected a 400, got {got:?}");
        };
        assert!(head.contains("application/problem+json"), "{name}: {head}");
        assert_eq!(problem_type(&body), *problem, "{name}");
        let text = String::from_utf8_lossy(&body);
        assert!(!text.contains("yyyyyyyy"), "{name}: the ID is echoed");
        assert_eq!(
            head.contains("Connection: close"),
            *problem == HEAD,
            "{name}: only a head refused as a whole closes"
        );
    }
    bystander(&s, "absurd IDs");
    assert_eq!(records(&s.store, "small").len(), 1, "only the bystander");
    assert_eq!(s.up.total(), 1, "only the bystander reached the consumer");

    // On one keep-alive connection: a 10 KB ID is refused, and the longest
    // valid ID after it is forwarded.
    let mut c = TcpStream::connect(s.px.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut bytes = b"POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: ".to_vec();
    bytes.extend_from_slice(&[b'q'; 10 * 1024]);
    bytes.extend_from_slice(b"\r\nContent-Length: 2\r\n\r\n{}");
    c.write_all(&bytes).unwrap();
    assert!(matches!(read_one(&mut c), Got::Response(400, _, _)));
    let longest = "z".repeat(255);
    let mut bytes =
        format!("POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {longest}\r\n").into_bytes();
    bytes.extend_from_slice(b"Content-Length: 2\r\n\r\n{}");
    c.write_all(&bytes).unwrap();
    assert!(matches!(read_one(&mut c), Got::Response(200, _, _)));
    assert_eq!(s.up.count(&longest), 1);
}

/// Two `X-Event-ID` fields with different values: which delivery is this?
/// Refused rather than guessed.
#[test]
fn two_different_event_id_fields_are_refused() {
    let s = setup("hostile-two-ids");
    let (a, b) = (eid("first"), eid("second"));
    let bytes = format!(
        "POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {a}\r\nX-Event-ID: {b}\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    let got = exchange(s.px.addr, bytes.as_bytes(), false, Duration::from_secs(10));
    assert_refused("two X-Event-ID fields", &got);
    untouched(&s, "small", &[&a, &b]);
}

/// Non-UTF-8 bytes elsewhere in the header: an invalid field name is a 400;
/// a non-UTF-8 value (obs-text, which RFC 9110 keeps only for old senders)
/// in another field is refused too, 400 `invalid-request` (SPEC §4,
/// "Strictness"), and reaches no upstream.
#[test]
fn non_utf8_bytes_in_other_header_fields() {
    let s = setup("hostile-non-utf8");
    let id = eid("bad-name");
    let mut bytes =
        format!("POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\n").into_bytes();
    bytes.extend_from_slice(b"X-\xff\xfeName: 1\r\nContent-Length: 2\r\n\r\n{}");
    let got = exchange(s.px.addr, &bytes, false, Duration::from_secs(10));
    assert_refused("a non-UTF-8 field name", &got);
    bystander(&s, "a non-UTF-8 field name");
    untouched(&s, "small", &[&id]);

    // A raw upstream sees nothing of it.
    let dir = TempDir::new("hostile-non-utf8-raw");
    let raw = upstream(|_, _| Behavior::Respond(raw_upstream::response(200, b"ok")));
    let store = dir.sqlite_url("raw.db");
    let px = Proxy::start(&dir, &store, &route("raw", "/raw", &raw.url(), ""));
    let id = eid("latin1-value");
    let mut bytes =
        format!("POST /raw HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\n").into_bytes();
    bytes.extend_from_slice(b"X-Note: caf\xe9 \xff\xfe\r\nContent-Length: 2\r\n\r\n{}");
    match exchange(px.addr, &bytes, false, Duration::from_secs(10)) {
        Got::Response(400, _, body) => {
            assert_eq!(problem_type(&body), "urn:idemgate:problem:invalid-request")
        }
        other => panic!("expected the delivery refused, got {other:?}"),
    }
    assert!(raw.received().is_empty());
    let (code, _, _) = cli(&["events", "show", "--store", &store, "--route", "raw", &id]);
    assert_eq!(code, 3, "no record");
}

fn post_cl(path: &str, id: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\nContent-Length: {}\r\n\r\n",
        body.len(),
    )
    .into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

fn post_chunked(path: &str, id: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes = chunked_head(path, id).into_bytes();
    for chunk in body.chunks(7_000) {
        bytes.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        bytes.extend_from_slice(chunk);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"0\r\n\r\n");
    bytes
}

/// Bodies at `max_body` − 1 and `max_body` are forwarded byte for byte;
/// `max_body` + 1 gets 413 (or a close) and no record — with Content-Length
/// and chunked, under and over pingora's 64 KiB retry buffer.
#[test]
fn bodies_around_max_body() {
    let s = setup("hostile-max-body");
    for (route, path, max) in [("small", "/h", SMALL_MAX), ("big", "/big", BIG_MAX)] {
        for chunked in [false, true] {
            let framing = if chunked { "chunked" } else { "content-length" };
            for len in [max - 1, max, max + 1] {
                let id = eid(&format!("{route}-{framing}-{len}"));
                let body: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
                let bytes = if chunked {
                    post_chunked(path, &id, &body)
                } else {
                    post_cl(path, &id, &body)
                };
                let got = exchange(s.px.addr, &bytes, false, Duration::from_secs(15));
                let what = format!("{route} {framing} {len} bytes (max {max})");
                if len <= max {
                    assert!(matches!(got, Got::Response(200, _, _)), "{what}: {got:?}");
                    let seen: Vec<_> =
                        s.up.received()
                            .into_iter()
                            .filter(|r| r.key() == Some(id.as_str()))
                            .collect();
                    assert_eq!(seen.len(), 1, "{what}");
                    assert!(seen[0].body == body, "{what}: the body arrived changed");
                    assert_eq!(show(&s.store, route, &id)["state"], "delivered");
                } else {
                    eprintln!("{what}: {}", brief(&got));
                    if let Got::Response(status, _, body) = &got {
                        assert_eq!(*status, 413, "{what}");
                        assert_eq!(problem_type(body), "urn:idemgate:problem:body-too-large");
                    }
                    untouched(&s, route, &[&id]);
                }
                bystander(&s, &what);
            }
        }
        // Expect: 100-continue with a Content-Length over the limit: 413 at once.
        let id = eid(&format!("{route}-expect"));
        let t = Instant::now();
        let bytes = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
            max + 1
        );
        let got = exchange(s.px.addr, bytes.as_bytes(), false, Duration::from_secs(5));
        assert!(matches!(got, Got::Response(413, _, _)), "{got:?}");
        assert!(t.elapsed() < Duration::from_secs(2));
        untouched(&s, route, &[&id]);
    }
}

/// Slowloris: connections trickling a request header one byte at a time
/// (never finishing it) while 100 normal deliveries go through, each in
/// under 2 s. The trickled requests leave no record.
#[test]
fn slowloris_does_not_hold_up_other_senders() {
    let s = setup("hostile-slowloris");
    let stop = Arc::new(AtomicBool::new(false));
    let trickled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut slow = Vec::new();
    let mut slow_ids = Vec::new();
    for i in 0..20 {
        let id = eid(&format!("slowloris{i}"));
        slow_ids.push(id.clone());
        let (stop, trickled, addr) = (stop.clone(), trickled.clone(), s.px.addr);
        slow.push(std::thread::spawn(move || {
            let head = format!(
                "POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\nX-Slow: {}\r\nContent-Length: 2\r\n",
                "s".repeat(4096)
            );
            let mut c = TcpStream::connect(addr).unwrap();
            c.set_nodelay(true).unwrap();
            for b in head.bytes() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if c.write_all(&[b]).is_err() {
                    break;
                }
                trickled.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
            // Never sends the blank line; the connection just goes away.
        }));
    }
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut ids = Vec::new();
    for i in 0..100 {
        let id = eid(&format!("normal{i}"));
        let t = Instant::now();
        let r = s.px.deliver("/h", Some(&id), b"{\"n\":1}");
        let took = t.elapsed();
        assert_eq!(r.status, 200, "delivery {i}: {r:?}");
        assert!(took < Duration::from_secs(2), "delivery {i} took {took:?}");
        slowest = slowest.max(took);
        ids.push(id);
        // Spread the deliveries over the trickle (~3 s).
        std::thread::sleep(Duration::from_millis(25));
    }
    let total = started.elapsed();
    let bytes_trickled = trickled.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for t in slow {
        t.join().unwrap();
    }
    eprintln!(
        "slowloris: 100 deliveries in {total:?} (slowest {slowest:?}) while 20 connections trickled {bytes_trickled} header bytes"
    );
    assert!(
        bytes_trickled > 100,
        "the slow senders were trickling meanwhile"
    );
    for id in &ids {
        assert_eq!(s.up.count(id), 1);
    }
    let recs = records(&s.store, "small");
    assert_eq!(recs.len(), 100);
    assert!(recs.iter().all(|(_, state)| state == "delivered"));
    untouched(
        &s,
        "small",
        &slow_ids.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    bystander(&s, "slowloris");
}

/// A sender that stops sending its body in the middle: answered (400, the
/// body did not arrive in time, connection closed) within the body-read
/// bounds, with no record. Takes the per-read timeout (10 s).
#[test]
fn a_body_that_stops_arriving_is_refused_in_bounded_time() {
    let s = setup("hostile-stalled-body");
    let id = eid("stalled-body");
    let mut c = TcpStream::connect(s.px.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(45))).unwrap();
    c.write_all(
        format!("POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\nContent-Length: 100\r\n\r\n{{\"half\":")
            .as_bytes(),
    )
    .unwrap();
    let t = Instant::now();
    // Meanwhile others are served.
    bystander(&s, "a stalled body (while it stalls)");
    let got = read_one(&mut c);
    let took = t.elapsed();
    eprintln!("stalled body: {} after {took:?}", brief(&got));
    assert_refused("a stalled body", &got);
    assert!(took < Duration::from_secs(35), "took {took:?}");
    untouched(&s, "small", &[&id]);
}

/// 10,000 distinct events from one keep-alive connection: every one
/// forwarded exactly once and recorded delivered, and the proxy is healthy
/// afterwards.
#[test]
fn ten_thousand_distinct_events_on_one_connection() {
    let s = setup("hostile-10k");
    const N: usize = 10_000;
    let mut c = s.px.client();
    let started = Instant::now();
    let prefix = eid("bulk");
    for i in 0..N {
        let id = format!("{prefix}-{i}");
        let r = c
            .request(
                "POST",
                "/h",
                &[("X-Event-ID", &id), ("Content-Type", "application/json")],
                format!("{{\"i\":{i}}}").as_bytes(),
            )
            .unwrap_or_else(|e| panic!("request {i} on the keep-alive connection: {e}"));
        assert_eq!(r.status, 200, "request {i}: {r:?}");
    }
    let took = started.elapsed();
    eprintln!(
        "10k: {N} deliveries on one connection in {took:?} ({:.0}/s)",
        N as f64 / took.as_secs_f64()
    );
    let received = s.up.received();
    assert_eq!(received.len(), N, "each forwarded once");
    let mut keys: Vec<&str> = received.iter().filter_map(|r| r.key()).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), N, "no event forwarded twice");
    let recs = records(&s.store, "small");
    assert_eq!(recs.len(), N);
    assert!(recs.iter().all(|(_, state)| state == "delivered"));
    // A duplicate of the first is still a replay; the proxy is healthy.
    let r = c
        .request(
            "POST",
            "/h",
            &[("X-Event-ID", &format!("{prefix}-0"))],
            b"{\"i\":0}",
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(kit::get(s.px.admin, "/healthz").unwrap().status, 200);
    assert_eq!(kit::get(s.px.admin, "/readyz").unwrap().status, 200);
    bystander(&s, "10,000 deliveries");
}

/// An unguarded request whose body is read before it is forwarded (a small
/// declared length) but never arrives whole gets the same `invalid-body`
/// answer as a guarded one, marked unguarded, and never reaches the
/// consumer; it is counted once.
#[test]
fn a_short_body_on_an_unguarded_route_is_refused() {
    let h = Harness::sqlite("hostile-unguarded-short")
        .route("plain", "/plain", "    guard_methods: []\n")
        .start();
    let bytes = b"POST /plain HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\nshort";
    let got = exchange(h.addr, bytes, true, Duration::from_secs(15));
    let Got::Response(status, head, body) = &got else {
        panic!("expected an answer, got {}", brief(&got));
    };
    assert_eq!(*status, 400, "{head}");
    assert_eq!(problem_type(body), "urn:idemgate:problem:invalid-body");
    assert!(
        head.lines()
            .any(|l| l.eq_ignore_ascii_case("idempotency-status: unguarded")),
        "{head}"
    );
    assert_eq!(h.up.total(), 0, "the short request reached the consumer");
    assert_eq!(h.requests("plain", "unguarded"), 1.0);
}
