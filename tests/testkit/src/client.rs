//! A small blocking HTTP/1.1 client on the kit's core: one connection for
//! several requests (keep-alive), every response head visible when asked
//! (interim `1xx` included), raw bytes when a test needs to send what no
//! client would.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::http::{self, Body, Response};

/// One client connection.
pub struct Client {
    stream: TcpStream,
    /// Bytes read from the socket and not yet taken by a response.
    buf: Vec<u8>,
}

impl Client {
    /// Connects within 5 s; reads time out after 30 s.
    pub fn connect(addr: SocketAddr) -> io::Result<Client> {
        Self::connect_with(addr, Duration::from_secs(30))
    }

    /// Like [`Client::connect`], with reads timing out after `read_timeout`.
    pub fn connect_with(addr: SocketAddr, read_timeout: Duration) -> io::Result<Client> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(read_timeout))?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            buf: Vec::new(),
        })
    }

    /// Like [`Client::connect`], from the local address `source` (a
    /// loopback address other than 127.0.0.1, to stand for another sender).
    pub fn connect_from(source: std::net::IpAddr, addr: SocketAddr) -> io::Result<Client> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let stream = rt.block_on(async {
            let socket = match source {
                std::net::IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                std::net::IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
            };
            socket.bind(SocketAddr::new(source, 0))?;
            tokio::time::timeout(Duration::from_secs(5), socket.connect(addr))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))?
        })?;
        let stream = stream.into_std()?;
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            buf: Vec::new(),
        })
    }

    /// Sends raw bytes (a whole request, or part of one).
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// A second handle on the socket, for writing from another thread.
    pub fn writer(&self) -> io::Result<TcpStream> {
        self.stream.try_clone()
    }

    /// A request with a `Content-Length` body; the final response.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> io::Result<Response> {
        self.send_raw(&http::request(method, path, headers, body))?;
        self.read_response(method == "HEAD")
    }

    /// One more read into the buffer; false at the end of the stream.
    fn fill(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 16384];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    /// The next response head, interim or final: its status and header fields.
    pub fn head(&mut self) -> io::Result<(u16, Vec<(String, String)>)> {
        loop {
            if let Some(head) = http::response_head(&self.buf)? {
                self.buf.drain(..head.len);
                return Ok((head.status, head.headers));
            }
            if !self.fill()? {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed",
                ));
            }
        }
    }

    /// The body that follows a head, framed as `body` says.
    pub fn body(&mut self, mut body: Body) -> io::Result<Vec<u8>> {
        let mut eof = false;
        loop {
            if let Some(bytes) = body.take(&mut self.buf, eof)? {
                return Ok(bytes);
            }
            eof = !self.fill()?;
        }
    }

    /// Reads one final response (skipping 1xx), framed by `Content-Length`,
    /// chunked coding, or the end of the connection.
    pub fn read_response(&mut self, head_only: bool) -> io::Result<Response> {
        loop {
            let (status, headers) = self.head()?;
            if (100..200).contains(&status) {
                continue;
            }
            let body = self.body(Body::of_response(status, &headers, head_only))?;
            return Ok(Response {
                status,
                headers,
                body,
            });
        }
    }
}

/// A free loopback port for a listener the caller binds later: never one
/// this process was given before (two listeners meant to be apart, a proxy
/// and its admin, would otherwise share it), and from below the kernel's
/// ephemeral range. The kernel picks the local port of every outgoing
/// connection, and of every `:0` bind, from that range, so a probed port
/// from there can be taken by a client connection before its listener binds
/// it (seen in CI as `AddrInUse` starting a test upstream).
pub fn free_port() -> io::Result<u16> {
    static NEXT: Mutex<Option<(u16, Vec<u16>)>> = Mutex::new(None);
    let (low, high) = reserved_range();
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let (cursor, given) = next.get_or_insert_with(|| (first_port(low, high), Vec::new()));
    for _ in low..high {
        let port = *cursor;
        *cursor = if port + 1 >= high { low } else { port + 1 };
        if given.contains(&port) {
            continue;
        }
        // Skips ports another process listens on (the machine's services).
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrNotAvailable,
        format!("no free loopback port in {low}..{high}"),
    ))
}

/// Starts a listener on a port from [`free_port`], taking another port when
/// the one given was taken between the probe and `start`'s bind (another
/// process on the machine may bind below the ephemeral range too; seen in
/// CI as `AddrInUse` starting a test upstream).
pub fn on_free_port<T>(mut start: impl FnMut(u16) -> io::Result<T>) -> io::Result<T> {
    let mut last = None;
    for _ in 0..8 {
        match start(free_port()?) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
            other => return other,
        }
    }
    Err(last.expect("eight tries"))
}

/// Ports from 10000 up to the kernel's ephemeral range (Linux's default
/// range starts at 32768): above the well-known services, below what the
/// kernel hands out by itself.
fn reserved_range() -> (u16, u16) {
    const LOW: u16 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    (LOW, ephemeral_low.max(LOW + 1_000))
}

/// Where this process starts looking: spread by process ID and clock, so
/// that two test processes running at once seldom probe the same ports.
fn first_port(low: u16, high: u16) -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let spread = (std::process::id() ^ nanos) % u32::from(high - low);
    low + spread as u16
}

/// POSTs `body` (as JSON) with an `X-Event-ID` header on a fresh connection.
pub fn deliver(
    addr: SocketAddr,
    path: &str,
    event_id: Option<&str>,
    body: &[u8],
) -> io::Result<Response> {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(id) = event_id {
        headers.push(("X-Event-ID", id));
    }
    Client::connect(addr)?.request("POST", path, &headers, body)
}

/// GET on a fresh connection (admin endpoints).
pub fn get(addr: SocketAddr, path: &str) -> io::Result<Response> {
    Client::connect(addr)?.request("GET", path, &[], b"")
}

/// Polls `check` every 10 ms until it holds; false after `timeout`.
pub fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until `GET path` answers 200, up to `timeout`.
pub fn wait_ready(addr: SocketAddr, path: &str, timeout: Duration) -> bool {
    wait_until(timeout, || get(addr, path).is_ok_and(|r| r.status == 200))
}
