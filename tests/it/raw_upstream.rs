//! Raw upstreams for fault tests: the test kit's scripted [`Server`], which
//! reads each request (head and `Content-Length` or chunked body) as bytes
//! and then does what the test's script says for that request — answer and
//! keep the connection, answer and close, send part of an answer and reset
//! (RST), or send part of an answer and go silent — and a raw client that
//! reads until the peer closes. Loopback only; stops when dropped.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub use testkit::http::status_of;
pub use testkit::{response, Behavior, Request, Server};

/// Starts a scripted upstream on a free loopback port: `script(request, n)`
/// decides what to do with the `n`th request (0-based, over all connections).
pub fn upstream(script: impl Fn(&Request, usize) -> Behavior + Send + Sync + 'static) -> Server {
    Server::start(script).expect("bind a raw upstream")
}

/// Sends `bytes` on a fresh connection to `addr` and reads everything until
/// the peer closes or `wait` passes. Returns what was read and whether the
/// connection was closed (FIN or reset) within `wait`.
pub fn send_and_read_to_close(addr: SocketAddr, bytes: &[u8], wait: Duration) -> (Vec<u8>, bool) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.write_all(bytes).expect("send");
    let deadline = Instant::now() + wait;
    let mut out = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (out, false);
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut chunk) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if crate::common::timed_out(&e) => return (out, false),
            Err(_) => return (out, true),
        }
    }
}
