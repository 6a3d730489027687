//! Helpers shared by the behaviour tests: deliveries that run in the
//! background while the test pokes at the in-flight claim, a raw HTTP/1.1
//! connection that shows what `Client::request` hides (interim `100
//! Continue` answers, bodies written while the answer arrives), problem
//! types, and deterministic payloads.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::common::Harness;
pub use testkit::http::says_close;
pub use testkit::wait_until;
use testkit::{self as kit, http::Body, Client, Response};

/// A delivery on its own connection and thread (for the in-flight cases).
pub fn deliver_in_background(
    addr: SocketAddr,
    path: &str,
    event_id: &str,
    body: &[u8],
) -> JoinHandle<std::io::Result<Response>> {
    let (path, id, body) = (path.to_string(), event_id.to_string(), body.to_vec());
    std::thread::spawn(move || kit::deliver(addr, &path, Some(&id), &body))
}

/// How many responses had each status.
pub fn tally(statuses: impl IntoIterator<Item = u16>) -> std::collections::BTreeMap<u16, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for s in statuses {
        *counts.entry(s).or_insert(0) += 1;
    }
    counts
}

/// A delivery on its own connection and thread, returned once the
/// consumer has it: the claim is then in flight, the consumer holding its
/// answer as scripted.
pub fn deliver_in_flight(
    h: &Harness,
    path: &str,
    event_id: &str,
    body: &[u8],
) -> JoinHandle<std::io::Result<Response>> {
    let delivery = deliver_in_background(h.addr, path, event_id, body);
    assert!(
        wait_until(Duration::from_secs(10), || h.up.count(event_id) > 0),
        "never reached the consumer; log:\n{}",
        h.log()
    );
    delivery
}

/// `len` bytes of a deterministic pseudo-random sequence (every byte value
/// occurs, no structure a proxy could accidentally normalise).
pub fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

/// `body` in chunked transfer coding, with uneven chunk sizes (some of them
/// crossing the 64 KiB mark).
pub fn chunked(body: &[u8]) -> Vec<u8> {
    let sizes = [1usize, 7000, 65536, 16384, 100_003, 4096];
    let mut out = Vec::with_capacity(body.len() + 1024);
    let (mut at, mut i) = (0, 0);
    while at < body.len() {
        let n = sizes[i % sizes.len()].min(body.len() - at);
        out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
        out.extend_from_slice(&body[at..at + n]);
        out.extend_from_slice(b"\r\n");
        at += n;
        i += 1;
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// The head of a chunked POST to `path` with an `X-Event-ID`.
pub fn chunked_head(path: &str, event_id: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {event_id}\r\n\
         Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes()
}

/// A raw HTTP/1.1 connection that shows every response head, 1xx included.
pub struct Raw(Client);

/// One response head (status line and headers), as received.
#[derive(Debug)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        kit::http::find(&self.headers, name)
    }
}

impl Raw {
    pub fn connect(addr: SocketAddr) -> Raw {
        Raw(Client::connect_with(addr, Duration::from_secs(10)).expect("connect"))
    }

    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.0.send_raw(bytes)
    }

    /// A second handle on the socket, for writing from another thread.
    pub fn writer(&self) -> TcpStream {
        self.0.writer().expect("clone socket")
    }

    /// The next response head, interim or final.
    pub fn head(&mut self) -> std::io::Result<Head> {
        let (status, headers) = self.0.head()?;
        Ok(Head { status, headers })
    }

    /// The body of a final response whose head was read (Content-Length framing).
    pub fn body(&mut self, head: &Head) -> std::io::Result<Vec<u8>> {
        let n = head
            .header("content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        self.0.body(Body::Length(n))
    }
}

/// One response read from `s` (a head and a `Content-Length` body): its
/// status and everything read, as text.
pub fn read_response_text(s: &mut impl Read) -> (u16, String) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(head) = kit::http::response_head(&got).expect("a response head") {
            let len = kit::http::find(&head.headers, "content-length")
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if got.len() >= head.len + len {
                return (head.status, String::from_utf8_lossy(&got).into());
            }
        }
        let n = s.read(&mut buf).expect("a response");
        assert!(n > 0, "closed before a whole response: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
}

/// The problem type's NAME, from `urn:idemgate:problem:NAME`.
pub fn problem_type(r: &Response) -> String {
    assert_eq!(
        r.header("Content-Type"),
        Some("application/problem+json"),
        "a problem response: {r:?}"
    );
    r.json()["type"]
        .as_str()
        .and_then(|t| t.strip_prefix("urn:idemgate:problem:"))
        .unwrap_or_default()
        .to_string()
}
