//! A raw TCP upstream for fault tests: it reads each request (head and
//! `Content-Length` or chunked body) as bytes and then does what the test's script says
//! for that request — answer and keep the connection, answer and close, send
//! part of an answer and reset (RST), or send part of an answer and go
//! silent. Loopback only; stops when dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the upstream does after reading a request.
#[derive(Debug, Clone)]
pub enum Behavior {
    /// Write the bytes and wait for the next request on the connection.
    Respond(Vec<u8>),
    /// Write the bytes, then close the connection (FIN).
    Close(Vec<u8>),
    /// Write the bytes, then abort the connection (RST).
    Reset(Vec<u8>),
    /// Write the bytes, then hold the connection open and write nothing more.
    Stall(Vec<u8>),
    /// Write the first bytes at once, then the second one by one, `Duration`
    /// apart; then wait for the next request.
    Trickle(Vec<u8>, Vec<u8>, Duration),
}

/// A complete response with a `Content-Length` body.
pub fn response(status: u16, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// A request as the upstream read it.
#[derive(Debug, Clone)]
pub struct RawRequest {
    /// The request line and headers, up to and including the blank line.
    pub head: Vec<u8>,
    pub body: Vec<u8>,
    /// Socket reads it took to gather this request (0: it was already
    /// buffered behind the previous one).
    pub reads: usize,
}

impl RawRequest {
    /// The first value of a header (case-insensitive name), as raw bytes.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.head
            .split(|&b| b == b'\n')
            .skip(1)
            .filter_map(|line| {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let colon = line.iter().position(|&b| b == b':')?;
                let (k, v) = line.split_at(colon);
                k.eq_ignore_ascii_case(name.as_bytes())
                    .then(|| v[1..].trim_ascii())
            })
            .next()
    }

    /// The `Idempotency-Key` header as text.
    pub fn key(&self) -> Option<String> {
        self.header("Idempotency-Key")
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

type Script = dyn Fn(&RawRequest, usize) -> Behavior + Send + Sync;

pub struct RawUpstream {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<RawRequest>>>,
    /// Connections accepted so far.
    connections: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RawUpstream {
    /// Starts on a free loopback port. `script(request, n)` decides what to
    /// do with the `n`th request (0-based, over all connections).
    pub fn start(
        script: impl Fn(&RawRequest, usize) -> Behavior + Send + Sync + 'static,
    ) -> RawUpstream {
        Self::start_on("127.0.0.1:0".parse().unwrap(), script)
    }

    pub fn start_on(
        addr: SocketAddr,
        script: impl Fn(&RawRequest, usize) -> Behavior + Send + Sync + 'static,
    ) -> RawUpstream {
        let std_listener = std::net::TcpListener::bind(addr).expect("bind raw upstream");
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let script: Arc<Script> = Arc::new(script);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (rec, conns) = (received.clone(), connections.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("raw upstream runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).expect("listener");
                let counter = Arc::new(AtomicUsize::new(0));
                tokio::select! {
                    _ = stopped => {}
                    _ = async {
                        loop {
                            let Ok((sock, _)) = listener.accept().await else { continue };
                            conns.fetch_add(1, Ordering::SeqCst);
                            let (rec, script, counter) = (rec.clone(), script.clone(), counter.clone());
                            tokio::spawn(async move {
                                let _ = serve(sock, rec, script, counter).await;
                            });
                        }
                    } => {}
                }
            });
            // Stalled connections are dropped with the runtime.
            rt.shutdown_timeout(Duration::from_millis(100));
        });
        RawUpstream {
            addr,
            received,
            connections,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn received(&self) -> Vec<RawRequest> {
        self.received.lock().unwrap().clone()
    }

    /// Requests received carrying this `Idempotency-Key`.
    pub fn count(&self, key: &str) -> usize {
        self.received()
            .iter()
            .filter(|r| r.key().as_deref() == Some(key))
            .count()
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(
    mut sock: TcpStream,
    received: Arc<Mutex<Vec<RawRequest>>>,
    script: Arc<Script>,
    counter: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let mut reads = 0;
        // The head, then a Content-Length body.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            let n = sock.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            reads += 1;
            buf.extend_from_slice(&chunk[..n]);
        };
        let head: Vec<u8> = buf.drain(..head_end).collect();
        let mut req = RawRequest {
            head,
            body: Vec::new(),
            reads: 0,
        };
        let chunked = req
            .header("Transfer-Encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case(b"chunked"));
        if chunked {
            // the whole chunked body (no trailers), decoded
            loop {
                let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
                    if !fill(&mut sock, &mut buf, &mut reads).await? {
                        return Ok(());
                    }
                    continue;
                };
                let size = std::str::from_utf8(&buf[..end])
                    .ok()
                    .and_then(|l| usize::from_str_radix(l.split(';').next()?.trim(), 16).ok())
                    .unwrap_or(0);
                if buf.len() < end + 2 + size + 2 {
                    if !fill(&mut sock, &mut buf, &mut reads).await? {
                        return Ok(());
                    }
                    continue;
                }
                req.body.extend_from_slice(&buf[end + 2..end + 2 + size]);
                buf.drain(..end + 2 + size + 2);
                if size == 0 {
                    break;
                }
            }
        } else {
            let len: usize = req
                .header("Content-Length")
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            while buf.len() < len {
                if !fill(&mut sock, &mut buf, &mut reads).await? {
                    return Ok(());
                }
            }
            req.body = buf.drain(..len).collect();
        }
        req.reads = reads;
        let n = counter.fetch_add(1, Ordering::SeqCst);
        let behavior = script(&req, n);
        received.lock().unwrap().push(req);
        match behavior {
            Behavior::Respond(bytes) => sock.write_all(&bytes).await?,
            Behavior::Close(bytes) => {
                sock.write_all(&bytes).await?;
                sock.flush().await?;
                let _ = sock.shutdown().await;
                return Ok(());
            }
            Behavior::Reset(bytes) => {
                sock.write_all(&bytes).await?;
                sock.flush().await?;
                // Let the bytes leave before the abortive close discards the send buffer.
                tokio::time::sleep(Duration::from_millis(50)).await;
                sock.set_zero_linger()?;
                drop(sock);
                return Ok(());
            }
            Behavior::Stall(bytes) => {
                sock.write_all(&bytes).await?;
                sock.flush().await?;
                // Silent until the peer goes away (or the upstream stops).
                let mut sink = [0u8; 1024];
                while sock.read(&mut sink).await? > 0 {}
                return Ok(());
            }
            Behavior::Trickle(head, bytes, every) => {
                sock.write_all(&head).await?;
                for b in bytes {
                    tokio::time::sleep(every).await;
                    sock.write_all(&[b]).await?;
                    sock.flush().await?;
                }
            }
        }
    }
}

/// One more read into `buf`; false at the end of the stream.
async fn fill(sock: &mut TcpStream, buf: &mut Vec<u8>, reads: &mut usize) -> std::io::Result<bool> {
    let mut chunk = [0u8; 65536];
    let n = sock.read(&mut chunk).await?;
    *reads += 1;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n > 0)
}

/// Sends `bytes` on a fresh connection to `addr` and reads everything until
/// the peer closes or `wait` passes. Returns what was read and whether the
/// connection was closed (FIN or reset) within `wait`.
pub fn send_and_read_to_close(addr: SocketAddr, bytes: &[u8], wait: Duration) -> (Vec<u8>, bool) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.write_all(bytes).expect("send");
    let deadline = std::time::Instant::now() + wait;
    let mut out = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return (out, false);
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut chunk) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return (out, false)
            }
            Err(_) => return (out, true),
        }
    }
}

/// The status code of the first response in `bytes`, if its line arrived.
pub fn status_of(bytes: &[u8]) -> Option<u16> {
    let line = bytes.split(|&b| b == b'\n').next()?;
    std::str::from_utf8(line)
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
