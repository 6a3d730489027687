//! A sample webhook consumer and a small blocking HTTP/1.1 client, both on
//! loopback: what `idemgate demo`, the integration tests and the load harness
//! put around the real proxy. The consumer records every request it gets and
//! answers from a script keyed by `Idempotency-Key` (or `X-Event-ID`).

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as AsyncBufReader};
use tokio::net::TcpListener;

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    pub delay: Duration,
    pub content_type: &'static str,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            body: b"ok".to_vec(),
            delay: Duration::ZERO,
            content_type: "text/plain",
        }
    }
    pub fn body(mut self, body: &[u8]) -> Reply {
        self.body = body.to_vec();
        self
    }
    pub fn delay(mut self, d: Duration) -> Reply {
        self.delay = d;
        self
    }
}

/// A request as the consumer received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// The event's key: `Idempotency-Key`, else `X-Event-ID`.
    pub fn key(&self) -> Option<&str> {
        self.header("Idempotency-Key")
            .or_else(|| self.header("X-Event-ID"))
    }
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    /// Per key, answers consumed in order; the last one repeats.
    script: HashMap<String, VecDeque<Reply>>,
}

/// The sample consumer; stops when dropped.
pub struct Consumer {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Consumer {
    /// Starts on a free loopback port.
    pub fn start() -> std::io::Result<Consumer> {
        Self::start_on("127.0.0.1:0".parse().expect("loopback address"))
    }

    pub fn start_on(addr: SocketAddr) -> std::io::Result<Consumer> {
        let std_listener = std::net::TcpListener::bind(addr)?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("consumer runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).expect("listener");
                tokio::select! {
                    _ = stopped => {}
                    _ = async {
                        loop {
                            let Ok((sock, _)) = listener.accept().await else { continue };
                            let st = st.clone();
                            tokio::spawn(async move { let _ = serve_conn(sock, st).await; });
                        }
                    } => {}
                }
            });
            rt.shutdown_timeout(Duration::from_millis(100));
        });
        Ok(Consumer {
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers for `key`, in order; the last repeats. Default: 200 "ok".
    pub fn script(&self, key: &str, replies: Vec<Reply>) {
        self.state
            .lock()
            .expect("consumer state")
            .script
            .insert(key.to_string(), replies.into());
    }

    /// A handle that scripts answers from other threads.
    pub fn scripter(&self) -> impl Fn(&str, Vec<Reply>) + Send + Sync + 'static {
        let state = self.state.clone();
        move |key, replies| {
            state
                .lock()
                .expect("consumer state")
                .script
                .insert(key.to_string(), replies.into());
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.lock().expect("consumer state").received.clone()
    }

    pub fn count(&self, key: &str) -> usize {
        self.state
            .lock()
            .expect("consumer state")
            .received
            .iter()
            .filter(|r| r.key() == Some(key))
            .count()
    }

    pub fn total(&self) -> usize {
        self.state.lock().expect("consumer state").received.len()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve_conn(sock: tokio::net::TcpStream, state: Arc<Mutex<State>>) -> std::io::Result<()> {
    let (r, mut w) = sock.into_split();
    let mut r = AsyncBufReader::new(r);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let path = parts.next().unwrap_or_default().to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            r.read_line(&mut h).await?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let get = |name: &str| {
            headers
                .iter()
                .find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        let mut body = Vec::new();
        if get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
            loop {
                let mut size = String::new();
                r.read_line(&mut size).await?;
                let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                    .unwrap_or(0);
                if n == 0 {
                    let mut end = String::new();
                    while r.read_line(&mut end).await? > 2 {
                        end.clear();
                    }
                    break;
                }
                let mut chunk = vec![0; n + 2];
                r.read_exact(&mut chunk).await?;
                body.extend_from_slice(&chunk[..n]);
            }
        } else if let Some(n) = get("content-length").and_then(|v| v.parse::<usize>().ok()) {
            body.resize(n, 0);
            r.read_exact(&mut body).await?;
        }
        let rec = Received {
            method,
            path,
            headers,
            body,
        };
        let reply = {
            let mut st = state.lock().expect("consumer state");
            let reply = rec
                .key()
                .and_then(|k| st.script.get_mut(k))
                .map(|q| {
                    if q.len() > 1 {
                        q.pop_front().expect("non-empty")
                    } else {
                        q[0].clone()
                    }
                })
                .unwrap_or_else(|| Reply::status(200));
            st.received.push(rec);
            reply
        };
        if !reply.delay.is_zero() {
            tokio::time::sleep(reply.delay).await;
        }
        let mut out = format!("HTTP/1.1 {} X\r\n", reply.status);
        if reply.status != 204 && reply.status != 304 {
            out.push_str(&format!(
                "Content-Type: {}\r\nContent-Length: {}\r\n",
                reply.content_type,
                reply.body.len()
            ));
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        if reply.status != 204 && reply.status != 304 {
            bytes.extend_from_slice(&reply.body);
        }
        w.write_all(&bytes).await?;
    }
}

/// A response as the client read it.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// One client connection, usable for several requests (keep-alive).
pub struct Client {
    reader: BufReader<TcpStream>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> std::io::Result<Client> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.set_nodelay(true)?;
        Ok(Client {
            reader: BufReader::new(s),
        })
    }

    /// Sends raw bytes (a whole request, or part of one).
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.reader.get_mut().write_all(bytes)
    }

    /// A request with a Content-Length body.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Response> {
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body);
        self.send_raw(&bytes)?;
        self.read_response(method == "HEAD")
    }

    /// Reads one final response (skipping 1xx), framed by Content-Length,
    /// chunked encoding, or the end of the connection.
    pub fn read_response(&mut self, head_only: bool) -> std::io::Result<Response> {
        loop {
            let (status, headers) = read_head(&mut self.reader)?;
            if (100..200).contains(&status) {
                continue;
            }
            let mut resp = Response {
                status,
                headers,
                body: Vec::new(),
            };
            if head_only || status == 204 || status == 304 {
                return Ok(resp);
            }
            if resp
                .header("transfer-encoding")
                .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
            {
                loop {
                    let mut size = String::new();
                    self.reader.read_line(&mut size)?;
                    let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
                    let mut chunk = vec![0; n + 2];
                    self.reader.read_exact(&mut chunk)?;
                    if n == 0 {
                        break;
                    }
                    resp.body.extend_from_slice(&chunk[..n]);
                }
            } else if let Some(n) = resp
                .header("content-length")
                .and_then(|v| v.parse::<usize>().ok())
            {
                resp.body.resize(n, 0);
                self.reader.read_exact(&mut resp.body)?;
            } else {
                self.reader.read_to_end(&mut resp.body)?;
            }
            return Ok(resp);
        }
    }
}

/// A free loopback port, never one this process was given before: the
/// kernel can hand out a closed probe's port again at once, and two
/// listeners meant to be apart (a proxy and its admin) would then share it.
pub fn free_port() -> std::io::Result<u16> {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
}

/// Reads one response head: the status code (0 if unreadable) and the
/// header fields in wire order.
pub fn read_head(reader: &mut impl BufRead) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            return Ok((status, headers));
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
}

/// POSTs `body` with an event ID header on a fresh connection.
pub fn deliver(
    addr: SocketAddr,
    path: &str,
    event_id: Option<&str>,
    body: &[u8],
) -> std::io::Result<Response> {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(id) = event_id {
        headers.push(("X-Event-ID", id));
    }
    Client::connect(addr)?.request("POST", path, &headers, body)
}

/// GET on a fresh connection (admin endpoints).
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    Client::connect(addr)?.request("GET", path, &[], b"")
}

/// Waits until `GET path` answers 200, up to `timeout`.
pub fn wait_ready(addr: SocketAddr, path: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if get(addr, path).is_ok_and(|r| r.status == 200) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    false
}
