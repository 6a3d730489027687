//! A scripted HTTP/1.1 server on loopback: it reads each request (head,
//! then a `Content-Length` or chunked body) with the kit's core, records it,
//! and does what its script says for that request — answer and keep the
//! connection, answer late, answer and close, send part of an answer and
//! reset (RST), send part of an answer and go silent, or drip one. The
//! sample [`Consumer`](super::Consumer) and the tests' fault upstreams are
//! this server with different scripts. Stops when dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::http::{self, Body, Request};

/// What the server does after reading a request.
#[derive(Debug, Clone)]
pub enum Behavior {
    /// Write the bytes and wait for the next request on the connection.
    Respond(Vec<u8>),
    /// Wait, then write the bytes and wait for the next request.
    Late(Duration, Vec<u8>),
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

/// A complete `text/plain` response with a `Content-Length` body.
pub fn response(status: u16, body: &[u8]) -> Vec<u8> {
    http::response(status, "text/plain", body)
}

/// The script: what to do with the `n`th request (0-based, over all connections).
type Script = dyn Fn(&Request, usize) -> Behavior + Send + Sync;

/// The running server.
pub struct Server {
    pub addr: SocketAddr,
    /// Every request read so far, in order.
    received: Arc<Mutex<Vec<Request>>>,
    /// Connections accepted so far.
    connections: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Server {
    /// Starts on a free loopback port.
    pub fn start(
        script: impl Fn(&Request, usize) -> Behavior + Send + Sync + 'static,
    ) -> std::io::Result<Server> {
        Self::start_on("127.0.0.1:0".parse().expect("loopback address"), script)
    }

    /// Starts on `addr` (a port a test reserved, or one it frees and takes again).
    pub fn start_on(
        addr: SocketAddr,
        script: impl Fn(&Request, usize) -> Behavior + Send + Sync + 'static,
    ) -> std::io::Result<Server> {
        let std_listener = std::net::TcpListener::bind(addr)?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
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
                .expect("test server runtime");
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
        Ok(Server {
            addr,
            received,
            connections,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request read so far, in order.
    pub fn received(&self) -> Vec<Request> {
        lock(&self.received).clone()
    }

    /// Requests read so far whose [`Request::key`] is `key`.
    pub fn count(&self, key: &str) -> usize {
        lock(&self.received)
            .iter()
            .filter(|r| r.key() == Some(key))
            .count()
    }

    /// Requests read so far.
    pub fn total(&self) -> usize {
        lock(&self.received).len()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
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

/// The next request on the connection; `None` when the peer closed between requests.
async fn read_request(sock: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<Request>> {
    let mut reads = 0;
    let mut req = loop {
        if let Some((req, n)) = http::request_head(buf)? {
            buf.drain(..n);
            break req;
        }
        if !fill(sock, buf, &mut reads).await? {
            return Ok(None);
        }
    };
    let mut body = Body::of_request(&req.headers);
    let mut eof = false;
    req.body = loop {
        if let Some(bytes) = body.take(buf, eof)? {
            break bytes;
        }
        eof = !fill(sock, buf, &mut reads).await?;
    };
    req.reads = reads;
    Ok(Some(req))
}

async fn serve(
    mut sock: TcpStream,
    received: Arc<Mutex<Vec<Request>>>,
    script: Arc<Script>,
    counter: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    let mut buf: Vec<u8> = Vec::new();
    while let Some(req) = read_request(&mut sock, &mut buf).await? {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        let behavior = script(&req, n);
        lock(&received).push(req);
        match behavior {
            Behavior::Respond(bytes) => sock.write_all(&bytes).await?,
            Behavior::Late(delay, bytes) => {
                tokio::time::sleep(delay).await;
                sock.write_all(&bytes).await?;
            }
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
                // Silent until the peer goes away (or the server stops).
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
    Ok(())
}
