//! Headers and connections to the upstream (SPEC §2, §4 "Hop-by-hop";
//! issue 20): hop-by-hop headers dropped both ways on every path, no
//! protocol upgrade tunnelled past the router, HTTP/1.1 to the upstream
//! whatever the client speaks, `100 Continue` only to HTTP/1.1 clients, one
//! retry (same `Idempotency-Key`, counted) when a kept upstream connection
//! closes before answering, and the headers `idempotency_key_header` may not
//! name. Against the real binary, real consumers (a raw TCP upstream that
//! shows every byte, and Python's http.server), a real SQLite store.

use crate::common;
use crate::core_util;
use crate::raw_upstream;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use core_util::Raw;
use raw_upstream::{response, upstream, Behavior, Request};

/// Every header name in a raw request or response head, lower-cased.
fn names(head: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(head)
        .lines()
        .skip(1)
        .filter_map(|l| {
            l.split_once(':')
                .map(|(k, _)| k.trim().to_ascii_lowercase())
        })
        .collect()
}

/// Hop-by-hop headers a sender might send, and what `Connection` names.
const SENDER_HOP: &str = "Connection: keep-alive, X-Sender-Secret\r\n\
Keep-Alive: timeout=5\r\n\
Proxy-Authorization: Basic c2VjcmV0OnBhc3N3b3Jk\r\n\
Proxy-Connection: keep-alive\r\n\
TE: trailers\r\n\
Trailer: X-Checksum\r\n\
X-Sender-Secret: for-the-first-hop-only\r\n\
X-End-To-End: kept\r\n";

/// What the upstream answers: hop-by-hop headers of its own.
fn upstream_answer(body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         Connection: X-Internal-Host\r\nX-Internal-Host: consumer-7.internal:8443\r\n\
         Proxy-Authenticate: Basic realm=\"internal\"\r\nKeep-Alive: timeout=30\r\n\
         Trailer: X-Checksum\r\nX-Answer: kept\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

const DROPPED_UPSTREAM: [&str; 6] = [
    "keep-alive",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "x-sender-secret",
];
const DROPPED_DOWNSTREAM: [&str; 4] = [
    "x-internal-host",
    "proxy-authenticate",
    "keep-alive",
    "trailer",
];

/// On the guarded path, the read-whole unguarded path and pingora's
/// streaming path (a chunked body): the forwarded request has none of the
/// sender's hop-by-hop headers (nor what its `Connection` names), and the
/// sender gets none of the upstream's.
#[test]
fn hop_by_hop_headers_are_dropped_both_ways_on_every_path() {
    let dir = TempDir::new("hop");
    let up = upstream(|_, _| Behavior::Respond(upstream_answer(b"ok")));
    let px = guarded_and_plain(&dir, &dir.sqlite_url("h.db"), &up.url(), "/plain");
    let id = eid("hop");
    let requests = [
        (
            "guarded",
            format!(
                "POST /hooks/g HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\n{SENDER_HOP}Content-Length: 2\r\n\r\n{{}}"
            ),
        ),
        (
            "unguarded, read whole",
            format!("GET /hooks/g HTTP/1.1\r\nHost: localhost\r\n{SENDER_HOP}\r\n"),
        ),
        (
            "streamed",
            format!(
                "POST /plain HTTP/1.1\r\nHost: localhost\r\n{SENDER_HOP}Transfer-Encoding: chunked\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n"
            ),
        ),
    ];
    let mut c = Raw::connect(px.addr);
    for (n, (what, request)) in requests.iter().enumerate() {
        c.send(request.as_bytes()).unwrap();
        let head = c.head().unwrap();
        let body = c.body(&head).unwrap();
        assert_eq!((head.status, body.as_slice()), (200, &b"ok"[..]), "{what}");
        let got: Vec<String> = head
            .headers
            .iter()
            .map(|(k, _)| k.to_ascii_lowercase())
            .collect();
        for h in DROPPED_DOWNSTREAM {
            assert!(
                !got.contains(&h.to_string()),
                "{what}: the sender got {h}: {got:?}"
            );
        }
        assert_eq!(head.header("X-Answer"), Some("kept"), "{what}");
        let sent = &up.received()[n];
        let sent_names = names(&sent.head);
        for h in DROPPED_UPSTREAM {
            assert!(
                !sent_names.contains(&h.to_string()),
                "{what}: upstream got {h}:\n{}",
                String::from_utf8_lossy(&sent.head)
            );
        }
        assert!(
            sent.header_bytes("Connection")
                .is_none_or(|v| !v.to_ascii_lowercase().windows(6).any(|w| w == b"secret")),
            "{what}"
        );
        assert_eq!(
            sent.header_bytes("X-End-To-End"),
            Some(&b"kept"[..]),
            "{what}"
        );
        assert_eq!(sent.body, b"{}".repeat(usize::from(n != 1)), "{what}");
    }
}

/// An upgrade handshake (WebSocket, h2c) is forwarded as a plain request:
/// a tunnel after `101` would carry requests past every route, signature
/// and claim. An upstream that answers 101 anyway is an upstream failure.
#[test]
fn upgrades_are_never_tunnelled() {
    let dir = TempDir::new("hop-upgrade");
    // the upstream switches to anything it is offered
    let up = upstream(|req: &Request, _| {
        if req.header("Upgrade").is_some() {
            Behavior::Stall(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
                    .to_vec(),
            )
        } else {
            Behavior::Respond(response(200, b"plain"))
        }
    });
    let routes = [
        route("p", "/ws", &up.url(), "    guard_methods: []\n"),
        route("g", "/hooks/g", &up.url(), "    verify: none\n"),
    ]
    .concat();
    let px = Proxy::start(&dir, &dir.sqlite_url("u.db"), &routes);
    let handshakes = [
        "GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            .to_string(),
        "GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\n\
         HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
            .to_string(),
        format!(
            "POST /hooks/g HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {}\r\nUpgrade: h2c\r\n\
             Connection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nContent-Length: 2\r\n\r\n{{}}",
            eid("h2c")
        ),
    ];
    for (n, hs) in handshakes.iter().enumerate() {
        let mut c = Raw::connect(px.addr);
        c.send(hs.as_bytes()).unwrap();
        let head = c.head().unwrap();
        assert_eq!(head.status, 200, "{n}: {head:?}");
        assert_eq!(c.body(&head).unwrap(), b"plain", "{n}");
        let sent = &up.received()[n];
        let sent_names = names(&sent.head);
        for h in ["upgrade", "connection", "http2-settings"] {
            assert!(
                !sent_names.contains(&h.to_string()),
                "{n}: upstream got {h}"
            );
        }
    }

    // an upstream that switches protocols unasked
    let rogue = upstream(|_, _| {
        Behavior::Stall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".to_vec())
    });
    let px = guarded_and_plain(&dir, &dir.sqlite_url("u2.db"), &rogue.url(), "/ws");
    let id = eid("rogue");
    for (what, request) in [
        ("streamed", handshakes[0].clone()),
        (
            "read whole",
            "GET /ws HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n".to_string(),
        ),
        (
            "guarded",
            format!("POST /hooks/g HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\nContent-Length: 2\r\n\r\n{{}}"),
        ),
    ] {
        let mut c = Raw::connect(px.addr);
        c.send(request.as_bytes()).unwrap();
        let head = c.head().unwrap();
        assert_eq!(head.status, 502, "{what}: {head:?}");
    }
    assert_eq!(show(&dir.sqlite_url("u2.db"), "g", &id)["state"], "failed");
}

/// The idempotency key may not ride in a framing, hop-by-hop or `Host`
/// header: `check` and `serve` exit 2 with file:line:col at the value, on a
/// route or in `defaults`. (With `Transfer-Encoding` and an event ID of
/// `chunked`, the forwarded request would carry both framings.)
#[test]
fn idempotency_key_header_cannot_be_framing_hop_by_hop_or_host() {
    let dir = TempDir::new("hop-keyheader");
    for name in [
        "Transfer-Encoding",
        "content-length",
        "Host",
        "Connection",
        "Keep-Alive",
        "TE",
        "Trailer",
        "Upgrade",
        "Proxy-Authorization",
        "Proxy-Anything",
        "Expect",
    ] {
        for in_defaults in [false, true] {
            let key = format!("idempotency_key_header: {name}\n");
            let (defaults, extra) = if in_defaults {
                (format!("  {key}"), String::new())
            } else {
                (String::new(), format!("    {key}"))
            };
            let text = format!(
                "listen: \"127.0.0.1:{}\"\nadmin_listen: \"127.0.0.1:{}\"\nstore:\n  url: \"{}\"\ndefaults:\n{defaults}  lease: 10s\n  upstream_timeout: 5s\nroutes:\n{}",
                free_port(),
                free_port(),
                dir.sqlite_url("k.db"),
                route("r", "/hooks/r", "http://127.0.0.1:9", &format!("    verify: none\n{extra}"))
            );
            let path = dir.path().join("key.yaml");
            std::fs::write(&path, &text).unwrap();
            let line = text
                .lines()
                .position(|l| l.contains("idempotency_key_header"))
                .unwrap()
                + 1;
            let col = text.lines().nth(line - 1).unwrap().find(name).unwrap() + 1;
            for cmd in ["check", "serve"] {
                let (code, _, err) = cli(&[cmd, "--config", &path.display().to_string()]);
                assert_eq!(code, 2, "{cmd} {name} (defaults: {in_defaults}): {err}");
                assert!(
                    err.contains(&format!("key.yaml:{line}:{col}: "))
                        && err.contains("idempotency key"),
                    "{cmd} {name}: {err}"
                );
            }
        }
    }
}

// ------------------------------------------------------------ HTTP versions

/// A consumer on Python's http.server (tests/consumers/http_server.py): it
/// answers an HTTP/1.0 request in HTTP/1.1 without `Connection: close` and
/// then closes, as Go's net/http does. Killed when dropped.
struct PyConsumer {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl PyConsumer {
    fn start(dir: &TempDir, close_delay: &str) -> PyConsumer {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/it/consumers/http_server.py"
        );
        let log = dir.path().join(format!("py-{}.jsonl", free_port()));
        let mut child = Command::new("python3")
            .arg(script)
            .arg(&log)
            .arg(close_delay)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        let mut out = child.stdout.take().unwrap();
        let mut byte = [0u8; 1];
        while out.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
            line.push(byte[0] as char);
        }
        let port = line.trim().parse().expect("the consumer prints its port");
        PyConsumer { child, port, log }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request it got, oldest first.
    fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for PyConsumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.0 request on its own connection; the whole answer.
fn http10(px: &Proxy, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(px.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    (raw_upstream::status_of(&out).unwrap_or(0), text)
}

/// A proxy on `store` with a guarded route `g` (`/hooks/g`) and an unguarded
/// `p` (at `plain`), both to `url`.
fn guarded_and_plain(dir: &TempDir, store: &str, url: &str, plain: &str) -> Proxy {
    let routes = [
        route("g", "/hooks/g", url, "    verify: none\n"),
        route("p", plain, url, "    guard_methods: []\n"),
    ]
    .concat();
    Proxy::start(dir, store, &routes)
}

/// HTTP/1.0 senders (some webhook senders and health checkers still are)
/// through a consumer that, like Go's, closes after answering an HTTP/1.0
/// request without saying so. idemgate speaks HTTP/1.1 upstream whatever
/// the sender speaks, so the consumer keeps the connection and the next
/// delivery on it succeeds — it was a spurious 502 when the HTTP/1.0
/// request line was passed on. A `Host` is added for a sender without one.
#[test]
fn http_1_0_senders_go_upstream_as_http_1_1() {
    let dir = TempDir::new("hop-http10");
    let consumer = PyConsumer::start(&dir, "0.5");
    let store = dir.sqlite_url("v.db");
    let px = guarded_and_plain(&dir, &store, &consumer.url(), "/plain");
    let ids: Vec<String> = (0..3).map(|i| eid(&format!("v10-{i}"))).collect();
    for id in &ids {
        let (status, text) = http10(
            &px,
            &format!("POST /hooks/g HTTP/1.0\r\nX-Event-ID: {id}\r\nContent-Length: 2\r\n\r\n{{}}"),
        );
        assert_eq!(status, 200, "{id}: {text}");
        assert_eq!(show(&store, "g", id)["state"], "delivered");
    }
    let (status, text) = http10(&px, "GET /plain/x HTTP/1.0\r\n\r\n");
    assert_eq!(status, 200, "{text}");
    // past 64 KiB an unguarded body streams through pingora's path
    let big = "x".repeat(70_000);
    let (status, text) = http10(
        &px,
        &format!(
            "POST /plain/y HTTP/1.0\r\nContent-Length: {}\r\n\r\n{big}",
            big.len()
        ),
    );
    assert_eq!(status, 200, "streamed: {text}");
    let got = consumer.requests();
    assert_eq!(got.len(), 5, "{got:?}");
    for r in &got {
        assert_eq!(r["version"], "HTTP/1.1", "{r}");
        let host = r["headers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h[0].as_str().unwrap().eq_ignore_ascii_case("host"));
        assert!(host.is_some(), "a Host header: {r}");
    }
    assert_eq!(
        px.metric(r#"idemgate_upstream_responses_total{class="connect_error",route="g"}"#),
        0.0
    );
}

/// `Expect: 100-continue` from an HTTP/1.0 sender is ignored (RFC 9110
/// §10.1.1): no `100 Continue` reaches it — neither idemgate's own (guarded
/// path) nor the consumer's (pingora's streaming path); the body is read and
/// the final answer sent. An HTTP/1.1 sender still gets its 100.
#[test]
fn only_http_1_1_senders_get_100_continue() {
    let dir = TempDir::new("hop-continue");
    let consumer = PyConsumer::start(&dir, "0");
    let px = guarded_and_plain(&dir, &dir.sqlite_url("c.db"), &consumer.url(), "/plain");
    for path in ["/hooks/g", "/plain"] {
        let id = eid("continue");
        let mut s = TcpStream::connect(px.addr).unwrap();
        s.write_all(
            format!("POST {path} HTTP/1.0\r\nHost: localhost\r\nX-Event-ID: {id}\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
        // an HTTP/1.1 sender would get its 100 now; this one gets nothing yet
        s.set_read_timeout(Some(Duration::from_millis(700)))
            .unwrap();
        let mut early = [0u8; 64];
        let n = s.read(&mut early).unwrap_or(0);
        assert_eq!(n, 0, "{path}: {:?}", String::from_utf8_lossy(&early[..n]));
        s.write_all(b"{}").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 200"), "{path}: {text}");
        assert!(!text.contains("100 Continue"), "{path}: {text}");
    }
    // HTTP/1.1: the 100 comes, then the answer
    for path in ["/hooks/g", "/plain"] {
        let mut c = Raw::connect(px.addr);
        c.send(
            format!(
                "POST {path} HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {}\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
                eid("continue11")
            )
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(c.head().unwrap().status, 100, "{path}");
        c.send(b"{}").unwrap();
        let head = c.head().unwrap();
        assert_eq!(head.status, 200, "{path}");
    }
}

// ------------------------------------------------------------ the retry

/// A kept upstream connection that the consumer closes (FIN) or resets
/// (RST) after reading the next request, before any byte of an answer: the
/// request goes once more, on a new connection, with the same
/// `Idempotency-Key`, and is counted in `idemgate_upstream_retries_total`.
/// Guarded, read whole and streamed alike.
#[test]
fn a_kept_connection_closed_before_answering_is_retried_once() {
    let dir = TempDir::new("hop-retry");
    // A request marked `X-Kill-Once` is dropped unanswered the first time
    // it arrives; its retry (same headers) is answered.
    let killed = std::sync::Mutex::new(std::collections::HashSet::<Vec<u8>>::new());
    let up = upstream(move |req: &Request, _| {
        let id = req.header_bytes("X-Event-ID").unwrap_or_default().to_vec();
        match req.header_bytes("X-Kill-Once") {
            Some(how) if killed.lock().unwrap().insert(id) => {
                if how == b"reset" {
                    Behavior::Reset(Vec::new())
                } else {
                    Behavior::Close(Vec::new())
                }
            }
            _ => Behavior::Respond(response(200, b"ok")),
        }
    });
    let routes = [
        route("g", "/hooks/g", &up.url(), "    verify: none\n"),
        route("p", "/plain", &up.url(), "    guard_methods: []\n"),
    ]
    .concat();
    let store = dir.sqlite_url("r.db");
    let px = Proxy::start(&dir, &store, &routes);
    let mut counted = std::collections::HashMap::<&str, f64>::new();
    for (what, route_name, request) in [
        ("guarded", "g", "POST /hooks/g HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\n{kill}Content-Length: 2\r\n\r\n{}"),
        ("read whole", "p", "GET /plain HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\n{kill}\r\n"),
        ("streamed", "p", "POST /plain HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\n{kill}Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"),
    ] {
        for how in ["close", "reset"] {
            let mut c = Raw::connect(px.addr);
            // a first request leaves a kept upstream connection
            let warm = eid("warm");
            c.send(request.replace("{id}", &warm).replace("{kill}", "").as_bytes())
                .unwrap();
            let head = c.head().unwrap();
            assert_eq!(head.status, 200, "{what}/{how}: warm-up");
            c.body(&head).unwrap();
            let conns = up.connections();
            let id = eid("retry");
            let kill = format!("X-Kill-Once: {how}\r\n");
            c.send(request.replace("{id}", &id).replace("{kill}", &kill).as_bytes())
                .unwrap();
            let head = c.head().unwrap();
            assert_eq!(head.status, 200, "{what}/{how}: {head:?}\n{}", px.log());
            assert_eq!(c.body(&head).unwrap(), b"ok", "{what}/{how}");
            let n = counted.entry(route_name).or_default();
            *n += 1.0;
            assert_eq!(
                px.metric(&format!("idemgate_upstream_retries_total{{route=\"{route_name}\"}}")),
                *n,
                "{what}/{how}"
            );
            let sent: Vec<Request> = up
                .received()
                .into_iter()
                .filter(|r| r.header_bytes("X-Event-ID") == Some(id.as_bytes()))
                .collect();
            assert_eq!(sent.len(), 2, "{what}/{how}: the request and its one retry");
            assert_eq!(sent[0].body, sent[1].body, "{what}/{how}: the same body");
            if route_name == "g" {
                assert!(
                    sent.iter().all(|r| r.header("Idempotency-Key") == Some(id.as_str())),
                    "{what}/{how}: the same Idempotency-Key"
                );
                let rec = show(&store, "g", &id);
                assert_eq!(rec["state"], "delivered", "{what}/{how}");
                assert_eq!(rec["attempts"], 1, "{what}/{how}: the same attempt");
            }
            assert_eq!(
                up.connections(),
                conns + 1,
                "{what}/{how}: the retry went on a new connection"
            );
        }
    }
}

/// Not retried: a kept connection that broke after part of an answer came,
/// and a new connection that closes before answering — 502, claim released.
/// (A guard against retrying too much; main, which never retried, passes it.)
#[test]
fn no_retry_once_a_byte_came_or_on_a_new_connection() {
    let dir = TempDir::new("hop-noretry");
    let up = upstream(|req: &Request, _| match req.header_bytes("X-Kill") {
        Some(b"half") => Behavior::Close(b"HTTP/1.1 200 OK\r\nContent-Le".to_vec()),
        Some(b"close") => Behavior::Close(Vec::new()),
        _ => Behavior::Respond(response(200, b"ok")),
    });
    let store = dir.sqlite_url("n.db");
    let px = Proxy::start(
        &dir,
        &store,
        &route("g", "/hooks/g", &up.url(), "    verify: none\n"),
    );
    let post = |c: &mut Raw, id: &str, kill: &str| {
        c.send(
            format!("POST /hooks/g HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\n{kill}Content-Length: 2\r\n\r\n{{}}")
                .as_bytes(),
        )
        .unwrap();
        let head = c.head().unwrap();
        let _ = c.body(&head);
        head.status
    };
    let mut c = Raw::connect(px.addr);
    assert_eq!(post(&mut c, &eid("warm"), ""), 200);
    let half = eid("half");
    assert_eq!(post(&mut c, &half, "X-Kill: half\r\n"), 502);
    // the next one goes on a new connection, which closes unanswered
    let fresh = eid("fresh");
    let mut c = Raw::connect(px.addr);
    assert_eq!(post(&mut c, &fresh, "X-Kill: close\r\n"), 502);
    for id in [&half, &fresh] {
        let sent = up
            .received()
            .iter()
            .filter(|r| r.header_bytes("X-Event-ID") == Some(id.as_bytes()))
            .count();
        assert_eq!(sent, 1, "{id}: sent once");
        assert_eq!(show(&store, "g", id)["state"], "failed");
    }
    assert_eq!(
        px.metric(r#"idemgate_upstream_retries_total{route="g"}"#),
        0.0
    );
}
