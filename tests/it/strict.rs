//! HTTP strictness (SPEC §4, "Strictness"; issue 44), with the raw bytes:
//! heads RFC 9112 says a server must reject, transfer codings other than
//! exactly `chunked`, lenient chunked framing, header names with `_`,
//! `obs-text`, bodies that stall or break off on a streamed pass-through
//! route, and pipelined requests. Every refusal is idemgate's own:
//! problem+json, `Idempotency-Status`, `Connection: close`, and never a
//! word of the engine underneath.

use crate::common::*;
use crate::raw_upstream::{response, upstream, Behavior};

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// A guarded route `/h` (event ID in `X-Event-ID`) and a pass-through
/// route `/pass`, both to the harness's consumer, with `downstream` lines.
fn start(tag: &str, downstream: &str) -> Harness {
    let h = Harness::sqlite(tag);
    let up = h.upstream();
    h.route_to("r", "/h", &up, "")
        .yaml(&format!(
            "  - name: pass\n    match:\n      path_prefix: /pass\n    upstream: \"{up}\"\n    guard_methods: []\n\
             downstream:\n  body_timeout: 1s\n{downstream}"
        ))
        .start()
}

/// One response as read from a raw connection.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// The head as text, for messages and `contains` checks.
    head: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        kit::http::find(&self.headers, name)
    }

    /// NAME of a problem+json `urn:idemgate:problem:NAME`.
    fn problem(&self) -> String {
        let doc: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_default();
        doc["type"]
            .as_str()
            .and_then(|t| t.strip_prefix("urn:idemgate:problem:"))
            .unwrap_or_default()
            .to_string()
    }
}

/// Reads one response (head and `Content-Length` body); `None` when the
/// connection closed first. Waits at most `wait`.
fn read_answer(s: &mut TcpStream, buf: &mut Vec<u8>, wait: Duration) -> Option<Answer> {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(head) = kit::http::response_head(buf).expect("a response head") {
            let len = kit::http::find(&head.headers, "content-length")
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= head.len + len {
                let rest = buf.split_off(head.len + len);
                let body = buf[head.len..].to_vec();
                let text = String::from_utf8_lossy(&buf[..head.len]).into_owned();
                *buf = rest;
                return Some(Answer {
                    status: head.status,
                    head: text,
                    headers: head.headers,
                    body,
                });
            }
        }
        match s.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if timed_out(&e) => panic!("no answer within {wait:?}; read {buf:?}"),
            Err(_) => return None,
        }
    }
}

/// Sends `bytes` on a fresh connection; the one answer.
fn exchange(addr: SocketAddr, bytes: &[u8]) -> Option<Answer> {
    let mut s = TcpStream::connect(addr).unwrap();
    let _ = s.write_all(bytes); // a refusal may close before all is sent
    read_answer(&mut s, &mut Vec::new(), Duration::from_secs(10))
}

/// A refusal in idemgate's words: `status`, problem `name`, problem+json,
/// `Idempotency-Status`, `Connection: close`, and no engine named.
#[track_caller]
fn assert_own_refusal(what: &str, got: &Option<Answer>, status: u16, name: &str, outcome: &str) {
    let Some(a) = got else {
        panic!("{what}: the connection closed without an answer")
    };
    assert_eq!(a.status, status, "{what}: {}", a.head);
    assert_eq!(a.problem(), name, "{what}: {}", a.head);
    assert_eq!(
        a.header("content-type"),
        Some("application/problem+json"),
        "{what}"
    );
    assert_eq!(a.header("idempotency-status"), Some(outcome), "{what}");
    assert!(kit::http::says_close(&a.headers), "{what}: {}", a.head);
    assert!(a.header("server").is_none(), "{what}: {}", a.head);
    assert!(
        !a.head.to_ascii_lowercase().contains("pingora"),
        "{what}: {}",
        a.head
    );
}

fn post(extra: &str, body: &str) -> Vec<u8> {
    format!(
        "POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {}\r\n{extra}\r\n{body}",
        eid("strict")
    )
    .into_bytes()
}

/// Heads RFC 9112 says a server must reject, among them every form pingora
/// answered by itself (an empty 400 naming itself): each gets idemgate's
/// own 400, 431 or 501, closes, reaches nothing, and is counted with
/// `route=""`.
#[test]
fn malformed_heads_get_idemgates_own_refusal() {
    let h = start("strict-heads", "");
    let cases = malformed_heads();
    for (what, bytes, status) in &cases {
        let got = exchange(h.addr, bytes);
        let name = match status {
            431 => "headers-too-large",
            _ => "invalid-request",
        };
        assert_own_refusal(what, &got, *status, name, "invalid_request");
    }
    assert_eq!(h.up.total(), 0, "a refused request reached the consumer");
    assert_eq!(h.requests("", "invalid_request"), cases.len() as f64);
    // the proxy serves others all along
    assert_eq!(h.deliver("/h", Some(&eid("after")), b"{}").status, 200);
}

/// (what, the bytes, the status idemgate answers)
// long: one table, a line per case
fn malformed_heads() -> Vec<(&'static str, Vec<u8>, u16)> {
    let cl = "Content-Length: 2\r\n";
    let mut cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "HTTP/1.1 without Host",
            b"POST /h HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}".to_vec(),
            400,
        ),
        (
            "two Hosts",
            post(&format!("Host: other\r\n{cl}"), "{}"),
            400,
        ),
        (
            "stray spaces in the target",
            b"POST /g/ HGET /h HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
            400,
        ),
        (
            "two spaces",
            b"GET  /pass HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
            400,
        ),
        (
            "control byte in the target",
            b"GET /pass\x01 HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
            400,
        ),
        (
            "DEL in the target",
            b"GET /pass\x7f HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
            400,
        ),
        (
            "obs-text in the target",
            b"GET /pass\xe9 HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
            400,
        ),
        (
            "bad version",
            b"GET /pass HTTP/1.2\r\nHost: a\r\n\r\n".to_vec(),
            400,
        ),
        (
            "garbage version",
            b"GET /pass HTTX/1.1\r\nHost: a\r\n\r\n".to_vec(),
            400,
        ),
        (
            "method not a token",
            b"G{T /pass HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
            400,
        ),
        ("bare CR", post(&format!("X-A: 1\r2\r\n{cl}"), "{}"), 400),
        (
            "NUL in a value",
            post(&format!("X-A: 1\x002\r\n{cl}"), "{}"),
            400,
        ),
        (
            "control byte in a value",
            post(&format!("X-A: \x01\r\n{cl}"), "{}"),
            400,
        ),
        (
            "non-tchar name",
            post(&format!("X(A): 1\r\n{cl}"), "{}"),
            400,
        ),
        (
            "non-UTF-8 name",
            b"GET /pass HTTP/1.1\r\nHost: a\r\nX-\xff\xfe: 1\r\n\r\n".to_vec(),
            400,
        ),
        (
            "obs-fold",
            post(&format!("X-A: 1\r\n 2\r\n{cl}"), "{}"),
            400,
        ),
        (
            "space before the colon",
            post("Content-Length : 2\r\n", "{}"),
            400,
        ),
        ("no colon", post(&format!("X-A 1\r\n{cl}"), "{}"), 400),
        (
            "Content-Length not a number",
            post("Content-Length: 2x\r\n", "{}"),
            400,
        ),
        (
            "Content-Length list",
            post("Content-Length: 2, 2\r\n", "{}"),
            400,
        ),
        (
            "two different Content-Lengths",
            post("Content-Length: 2\r\nContent-Length: 3\r\n", "{}x"),
            400,
        ),
        (
            "Content-Length and Transfer-Encoding",
            post(
                "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
                "0\r\n\r\n",
            ),
            400,
        ),
        (
            "Host and target differ",
            b"GET http://other/pass HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
            400,
        ),
        (
            "userinfo in the Host",
            b"GET /pass HTTP/1.1\r\nHost: u@a\r\n\r\n".to_vec(),
            400,
        ),
        (
            "Transfer-Encoding in HTTP/1.0",
            b"POST /pass HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n".to_vec(),
            400,
        ),
        (
            "chunked not last",
            post("Transfer-Encoding: chunked, gzip\r\n", "0\r\n\r\n"),
            400,
        ),
        (
            "chunked twice",
            post(
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                "0\r\n\r\n",
            ),
            400,
        ),
        (
            "empty coding",
            post("Transfer-Encoding: ,chunked\r\n", "0\r\n\r\n"),
            400,
        ),
        (
            "unknown coding",
            post("Transfer-Encoding: gzip, chunked\r\n", "0\r\n\r\n"),
            501,
        ),
        (
            "CONNECT",
            b"CONNECT localhost:443 HTTP/1.1\r\nHost: localhost:443\r\n\r\n".to_vec(),
            501,
        ),
    ];
    let mut many = "GET /pass HTTP/1.1\r\nHost: a\r\n".to_string();
    for i in 0..300 {
        many.push_str(&format!("X-{i}: 1\r\n"));
    }
    cases.push(("300 header fields", format!("{many}\r\n").into_bytes(), 431));
    cases
}

/// Lenient chunked framing that pingora's parser accepts: refused with 400
/// `invalid-request` on a guarded route and on a streamed pass-through
/// route, nothing reaching the consumer when the fault is in the first
/// bytes; a fault later in a streamed body still gets an answer.
#[test]
fn lenient_chunked_framing_is_refused() {
    let h = start("strict-chunked", "");
    let cases: [(&str, &[u8]); 8] = [
        ("empty chunk-size line", b"\r\nhello\r\n0\r\n\r\n"),
        (
            "trailer without a colon",
            b"2\r\n{}\r\n0\r\nno colon here\r\n\r\n",
        ),
        ("folded trailer", b"2\r\n{}\r\n0\r\nA: 1\r\n 2\r\n\r\n"),
        ("size with a sign", b"+2\r\n{}\r\n0\r\n\r\n"),
        ("size with 0x", b"0x2\r\n{}\r\n0\r\n\r\n"),
        ("size with a space", b"2 \r\n{}\r\n0\r\n\r\n"),
        (
            "size over 16 digits",
            b"10000000000000002\r\n{}\r\n0\r\n\r\n",
        ),
        ("bare LF", b"2\n{}\n0\n\n"),
    ];
    for path in ["/h", "/pass/x"] {
        for (what, body) in cases {
            let mut bytes = format!(
                "POST {path} HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
                eid("chunk")
            )
            .into_bytes();
            bytes.extend_from_slice(body);
            let got = exchange(h.addr, &bytes);
            assert_own_refusal(
                &format!("{path}: {what}"),
                &got,
                400,
                "invalid-request",
                "invalid_request",
            );
        }
    }
    assert_eq!(h.up.total(), 0);

    // a fault after the first read: the guarded route reads the body whole
    // and refuses it; the streamed route has sent the head on, and still
    // answers the sender before any response byte
    for (path, outcome) in [("/h", "invalid_request"), ("/pass/x", "unguarded")] {
        let mut s = TcpStream::connect(h.addr).unwrap();
        s.set_nodelay(true).unwrap();
        s.write_all(
            format!(
                "POST {path} HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {}\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{{}}\r\n",
                eid("late")
            )
            .as_bytes(),
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let _ = s.write_all(b"\r\n0\r\n\r\n");
        let got = read_answer(&mut s, &mut Vec::new(), Duration::from_secs(10));
        assert_own_refusal(
            &format!("{path}: a late empty size line"),
            &got,
            400,
            "invalid-request",
            outcome,
        );
    }
    assert_eq!(
        h.up.received().iter().filter(|r| r.path == "/h").count(),
        0,
        "the guarded route forwards nothing it refused"
    );
}

/// Header names holding `_` are dropped before forwarding, on every path,
/// and counted; `obs-text` in a value is refused, but in the route's
/// event-ID header it is the route's `invalid-event-id`.
#[test]
fn underscores_are_dropped_and_obs_text_refused() {
    let h = start("strict-fields", "");
    let id = eid("underscore");
    let bytes = format!(
        "POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\nContent-Length: 2\r\n\
         Transfer_Encoding: chunked\r\nContent_Length: 99\r\nX_Custom: 1\r\n\r\n{{}}"
    );
    assert_eq!(exchange(h.addr, bytes.as_bytes()).unwrap().status, 200);
    let pass = b"GET /pass/u HTTP/1.1\r\nHost: localhost\r\nX_Forwarded_For: 1.2.3.4\r\n\r\n";
    assert_eq!(exchange(h.addr, pass).unwrap().status, 200);
    let got = h.up.received();
    assert_eq!(got.len(), 2);
    for r in &got {
        for (name, _) in &r.headers {
            assert!(!name.contains('_'), "{name} was forwarded: {r:?}");
        }
    }
    assert_eq!(got[0].body, b"{}");
    assert_eq!(
        h.metric("idemgate_headers_dropped_total{reason=\"underscore\"}"),
        4.0
    );

    let note = post("X-Note: caf\u{e9}\r\nContent-Length: 2\r\n", "{}");
    let mut latin1 = post("Content-Length: 2\r\nX-Note: caf", "");
    latin1.truncate(latin1.len() - 2);
    latin1.extend_from_slice(b"\xe9\r\n\r\n{}");
    for (what, bytes) in [("UTF-8 value", note), ("latin-1 value", latin1)] {
        let got = exchange(h.addr, &bytes);
        assert_own_refusal(what, &got, 400, "invalid-request", "invalid_request");
    }
    let bytes =
        b"POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: \xe9vt\r\nContent-Length: 2\r\n\r\n{}";
    let got = exchange(h.addr, bytes).unwrap();
    assert_eq!(
        (got.status, got.problem().as_str()),
        (400, "invalid-event-id")
    );
    assert_eq!(h.up.total(), 2);
}

/// A streamed pass-through body (chunked, or longer than idemgate reads
/// whole) that stalls past `body_timeout` is 408 `invalid-body`, counted as
/// a body timeout and never as an upstream one; one that breaks off
/// before its end is 400 `invalid-body`; both before any response byte.
#[test]
fn streamed_bodies_that_stall_or_break_off_are_answered() {
    let h = start("strict-streamed", "");
    let big = 100 * 1024;
    let heads = [
        "POST /pass/c HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n".to_string(),
        format!("POST /pass/l HTTP/1.1\r\nHost: localhost\r\nContent-Length: {big}\r\n\r\nhello"),
    ];
    for head in &heads {
        let mut s = TcpStream::connect(h.addr).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        let t = Instant::now();
        let got = read_answer(&mut s, &mut Vec::new(), Duration::from_secs(10));
        assert!(
            t.elapsed() >= Duration::from_millis(900),
            "{:?}",
            t.elapsed()
        );
        assert_own_refusal(
            "a stalled streamed body",
            &got,
            408,
            "invalid-body",
            "unguarded",
        );
    }
    assert_eq!(
        h.metric("idemgate_connections_closed_total{reason=\"body_timeout\"}"),
        2.0
    );
    assert_eq!(
        h.metric("idemgate_upstream_responses_total{class=\"timeout\",route=\"pass\"}"),
        0.0
    );
    for head in &heads {
        let mut s = TcpStream::connect(h.addr).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        s.shutdown(Shutdown::Write).unwrap();
        let got = read_answer(&mut s, &mut Vec::new(), Duration::from_secs(10));
        assert_own_refusal(
            "a streamed body cut short",
            &got,
            400,
            "invalid-body",
            "unguarded",
        );
    }
}

/// Pipelined requests — bodiless, with a length, chunked, streamed — sent
/// in one write are each answered, in order, on the one connection.
#[test]
fn pipelined_requests_are_answered_in_order() {
    let raw = upstream(|req, _| Behavior::Respond(response(200, req.path.as_bytes())));
    let h = Harness::sqlite("strict-pipelined");
    let h = h
        .route_to("r", "/h", &raw.url(), "")
        .yaml(&format!(
            "  - name: pass\n    match:\n      path_prefix: /pass\n    upstream: \"{}\"\n    guard_methods: []\n",
            raw.url()
        ))
        .start();
    let big = vec![b'b'; 70 * 1024];
    let mut burst = Vec::new();
    burst.extend_from_slice(b"GET /pass/1 HTTP/1.1\r\nHost: a\r\n\r\n");
    burst.extend_from_slice(
        format!(
            "POST /h/2 HTTP/1.1\r\nHost: a\r\nX-Event-ID: {}\r\nContent-Length: 2\r\n\r\n{{}}",
            eid("p2")
        )
        .as_bytes(),
    );
    burst.extend_from_slice(
        format!("POST /h/3 HTTP/1.1\r\nHost: a\r\nX-Event-ID: {}\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n", eid("p3")).as_bytes(),
    );
    burst.extend_from_slice(b"POST /pass/4 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
    burst.extend_from_slice(
        format!(
            "POST /pass/5 HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\n\r\n",
            big.len()
        )
        .as_bytes(),
    );
    burst.extend_from_slice(&big);
    burst.extend_from_slice(b"GET /pass/6 HTTP/1.1\r\nHost: a\r\n\r\n");
    let mut s = TcpStream::connect(h.addr).unwrap();
    let writer = {
        let mut w = s.try_clone().unwrap();
        std::thread::spawn(move || w.write_all(&burst).is_ok())
    };
    let mut buf = Vec::new();
    for n in 1..=6 {
        let a = read_answer(&mut s, &mut buf, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("request {n}: the connection closed"));
        assert_eq!(a.status, 200, "request {n}: {}", a.head);
        assert!(
            String::from_utf8_lossy(&a.body).ends_with(&n.to_string()),
            "request {n}: {a:?}"
        );
        assert!(
            !kit::http::says_close(&a.headers),
            "request {n}: {}",
            a.head
        );
    }
    assert!(writer.join().unwrap());
    let paths: Vec<String> = raw.received().into_iter().map(|r| r.path).collect();
    assert_eq!(
        paths,
        ["/pass/1", "/h/2", "/h/3", "/pass/4", "/pass/5", "/pass/6"]
    );
    assert_eq!(raw.received()[4].body.len(), big.len());
}
