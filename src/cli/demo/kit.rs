//! What `demo` needs around the proxy, and no more: a sample consumer on a
//! loopback port (answers scripted per event, requests counted per event),
//! a one-shot client, and the proxy's own process on free ports. Blocking
//! std I/O on threads: the demo sends a dozen requests. (The test kit,
//! `tests/testkit`, is the tests' and benches' and not a dependency of the
//! shipped binary.)

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every socket read or write of the demo is bounded by this.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// One scripted answer of the consumer.
#[derive(Debug, Clone)]
pub struct Reply {
    status: u16,
    body: Vec<u8>,
    delay: Duration,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        let (body, delay) = (b"ok".to_vec(), Duration::ZERO);
        Reply {
            status,
            body,
            delay,
        }
    }

    pub fn body(self, body: &[u8]) -> Reply {
        let body = body.to_vec();
        Reply { body, ..self }
    }

    pub fn delay(self, delay: Duration) -> Reply {
        Reply { delay, ..self }
    }
}

#[derive(Default)]
struct Book {
    /// Answers still to give, per event (the last one repeats).
    scripts: HashMap<String, VecDeque<Reply>>,
    /// Requests seen, per event.
    seen: HashMap<String, usize>,
}

/// The sample consumer: its requests are keyed by `Idempotency-Key` (what
/// idemgate sends), else `X-Event-ID`. Runs until the process ends.
pub struct Consumer {
    addr: SocketAddr,
    book: Arc<Mutex<Book>>,
}

impl Consumer {
    pub fn start() -> io::Result<Consumer> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let book = Arc::new(Mutex::new(Book::default()));
        let own = book.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let book = own.clone();
                std::thread::spawn(move || serve(stream, &book));
            }
        });
        Ok(Consumer { addr, book })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn script(&self, key: &str, replies: Vec<Reply>) {
        self.book().scripts.insert(key.to_string(), replies.into());
    }

    /// Requests of event `key` seen so far.
    pub fn count(&self, key: &str) -> usize {
        self.book().seen.get(key).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.book().seen.values().sum()
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Answers the requests of one kept-alive connection until it closes.
fn serve(stream: TcpStream, book: &Mutex<Book>) {
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    while let Ok(Some(msg)) = read_message(&mut reader) {
        let key = msg.header("idempotency-key").or(msg.header("x-event-id"));
        let reply = match key {
            Some(k) => {
                let mut book = book.lock().unwrap_or_else(|e| e.into_inner());
                *book.seen.entry(k.to_string()).or_default() += 1;
                let queue = book.scripts.get_mut(k);
                queue.and_then(|q| {
                    if q.len() > 1 {
                        q.pop_front()
                    } else {
                        q.front().cloned()
                    }
                })
            }
            None => None,
        };
        let reply = reply.unwrap_or_else(|| Reply::status(200));
        std::thread::sleep(reply.delay);
        let head = format!(
            "HTTP/1.1 {} X\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n",
            reply.status,
            reply.body.len()
        );
        if out
            .write_all(&[head.as_bytes(), &reply.body].concat())
            .is_err()
        {
            return;
        }
    }
}

/// An HTTP/1.1 message as the demo reads it: the start line's second word
/// (a response's status), the header fields, and a body of
/// `Content-Length` bytes (the demo's peers send no other framing).
pub struct Message {
    pub status: u16,
    headers: Vec<(String, String)>,
}

impl Message {
    pub fn header(&self, name: &str) -> Option<&str> {
        let found = self
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name));
        found.map(|(_, v)| v.as_str())
    }
}

/// The next message on `reader` (`None` when the connection closed first).
fn read_message(reader: &mut impl BufRead) -> io::Result<Option<Message>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let field = line.trim_end();
        let Some((name, value)) = field.split_once(':') else {
            break;
        };
        headers.push((name.to_string(), value.trim().to_string()));
    }
    let msg = Message { status, headers };
    let len = msg.header("content-length").and_then(|v| v.parse().ok());
    io::copy(&mut reader.take(len.unwrap_or(0)), &mut io::sink())?;
    Ok(Some(msg))
}

/// POSTs `body` to `path` on `addr` with `X-Event-ID: id`, on a connection
/// of its own: the answer's status and headers.
pub fn deliver(addr: SocketAddr, path: &str, id: &str, body: &[u8]) -> io::Result<Message> {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nx-event-id: {id}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(&[head.as_bytes(), body].concat())?;
    let read = read_message(&mut BufReader::new(stream))?;
    read.ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "no answer"))
}

/// Two free loopback ports: the proxy's listener and its admin listener.
pub fn free_ports() -> io::Result<(SocketAddr, SocketAddr)> {
    let (a, b) = (
        TcpListener::bind("127.0.0.1:0")?,
        TcpListener::bind("127.0.0.1:0")?,
    );
    Ok((a.local_addr()?, b.local_addr()?))
}

/// The proxy's process, stopped (SIGTERM, then killed) on drop.
pub struct Process(Child);

impl Process {
    pub fn spawn(cmd: &mut Command) -> io::Result<Process> {
        cmd.spawn().map(Process)
    }

    /// Waits until `GET /readyz` on `admin` answers 200.
    pub fn wait_ready(&mut self, admin: SocketAddr, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.0.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("idemgate exited with {status} before ready"));
            }
            if readyz(admin).is_ok_and(|status| status == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("idemgate not ready within {}s", timeout.as_secs()))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // a graceful stop first, as an operator's would be
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn readyz(admin: SocketAddr) -> io::Result<u16> {
    let mut stream = TcpStream::connect_timeout(&admin, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.write_all(b"GET /readyz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")?;
    let read = read_message(&mut BufReader::new(stream))?;
    Ok(read.map_or(0, |m| m.status))
}
