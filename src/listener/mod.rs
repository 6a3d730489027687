//! The proxy listener's connections (SPEC §9): what one client connection
//! may hold, and how many there may be.
//!
//! pingora accepts each connection and hands it to [`Downstream`], which
//! owns it from then on: it admits it against `max_connections` (closing the
//! oldest idle kept-alive connection to make room), runs the TLS handshake
//! when the listener has `tls`, reads each request head itself
//! ([`head`]), and only then gives the connection to pingora's HTTP/1 proxy
//! for that one request; a kept-alive connection comes back here to wait for
//! the next. The connection table ([`table`]) enforces the header and
//! keep-alive timeouts; body and write timeouts are enforced where those
//! happen (the guarded body read, pingora's response writes).
//!
//! - [`table`]: admission, phases, the reaper, the connection metrics.
//! - [`head`]: reading a request head without holding buffers while idle.
//! - [`framed`]: the stream pingora reads one request's body from: checked
//!   chunked framing, and nothing past the body.
//! - [`fds`]: the open-files limit.
//!
//! Every head is checked by [`crate::strict::check`] before pingora sees
//! it, and refused here in idemgate's own words (problem+json,
//! `Idempotency-Status`, `Connection: close`): pingora never answers a
//! malformed head by itself. Pipelined requests are served in order: the
//! bytes read past one request's body are the start of the next head.

pub mod fds;
pub mod framed;
pub mod head;
pub mod table;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::BytesMut;
use pingora::apps::{HttpServerApp, ServerApp};
use pingora::listeners::tls::Acceptor;
use pingora::protocols::http::ServerSession;
use pingora::protocols::l4::stream::Stream as L4Stream;
use pingora::protocols::Stream;
use pingora::proxy::HttpProxy;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::config;
use crate::metrics::Metrics;
use crate::problem::{Problem, ProblemKind};
use crate::proxy::Gate;
use crate::source::Ranges;
use crate::strict::{self, chunked::Chunked, BadHead, Body};
use framed::{Framed, Left};
use head::Head;
pub use table::{Conn, ConnectionLimits, Reason, Table};

/// pingora's L4 read buffer for the listener: none. Heads are read into a
/// buffer of their own ([`head`]) and bodies into pingora's body buffer, so
/// a 64 KiB buffer per connection (pingora's default) would only copy bytes
/// once more — and stay allocated for as long as the connection is open.
pub const L4_READ_BUFFER: usize = 0;

/// The `ServerApp` of the proxy listener: see the module comment.
pub struct Downstream {
    proxy: Arc<HttpProxy<Gate>>,
    table: Arc<Table>,
    tls: Option<Acceptor>,
    limits: config::Downstream,
    metrics: Metrics,
    /// Who may have a small body read here before routing ([`Senders`]).
    senders: Senders,
}

/// SPEC §22: a sender a route's `allow_from` refuses is refused on its
/// head, its body unread; but this listener reads a small body before the
/// request is routed. So it does so only for a peer that no `allow_from`
/// of any route refuses (and that is no trusted proxy, whose client only
/// the head's `X-Forwarded-For` names); any other request's body is left
/// to pingora, which reads none before the route's check.
pub struct Senders {
    /// Each distinct `allow_from` of the routes.
    lists: Vec<Arc<Ranges>>,
    trusted: Arc<Ranges>,
}

impl Senders {
    pub fn of(config: &config::Config) -> Senders {
        let mut lists: Vec<Arc<Ranges>> = Vec::new();
        for list in config.routes.iter().filter_map(|r| r.allow_from.as_ref()) {
            if !lists.iter().any(|l| Arc::ptr_eq(l, list)) {
                lists.push(list.clone());
            }
        }
        Senders {
            lists,
            trusted: config.trusted_proxies.clone(),
        }
    }

    /// Whether a body from `peer` may be read before routing.
    fn preread(&self, peer: Option<std::net::IpAddr>) -> bool {
        if self.lists.is_empty() {
            return true;
        }
        peer.is_some_and(|ip| {
            !self.trusted.contains(ip) && self.lists.iter().all(|l| l.contains(ip))
        })
    }
}

impl Downstream {
    pub fn new(
        proxy: HttpProxy<Gate>,
        limits: &config::Downstream,
        tls: Option<&config::Tls>,
        metrics: &Metrics,
        senders: Senders,
    ) -> Downstream {
        let table = Table::new(
            ConnectionLimits {
                header_timeout: limits.header_timeout,
                keepalive_timeout: limits.keepalive_timeout,
                max_connections: limits.max_connections,
            },
            metrics,
        );
        Downstream {
            proxy: Arc::new(proxy),
            table,
            tls: tls.map(|t| Acceptor::from_server_config(t.server_config.clone())),
            limits: limits.clone(),
            metrics: metrics.clone(),
            senders,
        }
    }

    /// The background task that closes connections past their header or
    /// keep-alive time.
    pub fn reaper(&self) -> Reaper {
        Reaper {
            table: self.table.clone(),
        }
    }

    /// pingora's keep-alive for a session, in whole seconds: it bounds
    /// each read pingora itself makes on a kept-alive session (a streamed
    /// body), a backstop to this module's own timeouts.
    fn keepalive_secs(&self) -> u64 {
        self.limits.keepalive_timeout.as_secs().max(1)
    }

    /// Answers a request refused before pingora saw it (a head over
    /// [`head::MAX_HEAD`] bytes, one [`strict::check`] refuses, a chunked
    /// body malformed in its first bytes), and closes: counted with
    /// `route=""`, written by the same writer as every closing problem.
    async fn refuse(&self, stream: &mut Stream, p: Problem) {
        let outcome = p.kind.outcome();
        self.metrics.request("", outcome);
        let out = crate::proxy::respond::problem_closing_wire(&p, outcome.as_str());
        let write = async {
            stream.write_all(&out).await?;
            stream.flush().await?;
            stream.shutdown().await
        };
        if let Ok(Ok(())) = tokio::time::timeout(self.limits.write_timeout, write).await {
            // A lingering close, as nginx's: closing with the rest of the
            // request unread would reset the connection, and a sender's
            // stack may drop the answer it has not read yet on a reset.
            // What it still sends is read and dropped, for a short while.
            let _ = tokio::time::timeout(LINGER, drain(stream)).await;
        }
    }
}

/// How long a refused connection is read from after its answer (see
/// `Downstream::refuse`), and how many bytes at most.
const LINGER: std::time::Duration = std::time::Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024;

/// Reads and drops what the peer sends, up to [`LINGER_BYTES`], until it
/// closes.
async fn drain(stream: &mut Stream) {
    let mut buf = [0u8; 4096];
    let mut read = 0;
    while read < LINGER_BYTES {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => read += n,
        }
    }
}

/// The problem for a head [`strict::check`] refused.
fn refusal_problem(r: BadHead) -> Problem {
    match r {
        BadHead::BadRequest(why) => Problem::new(ProblemKind::InvalidRequest, why),
        BadHead::NotImplemented(why) => Problem::new(ProblemKind::NotImplemented, why),
        BadHead::TooManyFields => Problem::new(
            ProblemKind::HeadersTooLarge,
            format!(
                "the request has more than {} header fields",
                strict::MAX_FIELDS
            ),
        ),
    }
}

/// Parts `prefix` (a head of `end` bytes and what was read after it) into
/// this request's bytes, which stay in `prefix`, and the next request's,
/// returned with what is left of this one's body on the stream.
fn split_body(
    prefix: &mut BytesMut,
    end: usize,
    body: Body,
) -> Result<(Left, BytesMut), strict::chunked::ChunkError> {
    let have = prefix.len() - end;
    let (left, at) = match body {
        Body::None => (Left::Done, end),
        Body::Length(n) => match usize::try_from(n) {
            Ok(n) if n <= have => (Left::Done, end + n),
            _ => (Left::Length(n - have as u64), prefix.len()),
        },
        Body::Chunked => {
            let mut chunked = Chunked::new();
            let used = chunked.feed(&prefix[end..])?;
            match chunked.is_done() {
                true => (Left::Done, end + used),
                false => (Left::Chunked(chunked), prefix.len()),
            }
        }
    };
    let next = match at < prefix.len() {
        true => prefix.split_off(at),
        false => BytesMut::new(),
    };
    Ok((left, next))
}

impl Downstream {
    /// The TLS handshake when the listener has `tls` (pingora gave the TCP
    /// stream as it accepted it, no TLS on its side); `None` when it failed
    /// or the header timeout cut it.
    async fn accept_tls(&self, stream: Stream, conn: &table::Conn) -> Option<Stream> {
        let Some(acceptor) = &self.tls else {
            return Some(stream);
        };
        let tcp = stream.into_any().downcast::<L4Stream>().ok()?;
        // boxed: inline, the handshake's state would make every
        // connection's future as large as a TLS handshake's
        match Box::pin(acceptor.tls_handshake(*tcp)).await {
            Ok(tls) => Some(Box::new(tls)),
            Err(e) => {
                if conn.closed() {
                    tracing::debug!(error = %e, "TLS handshake cut by the header timeout");
                } else {
                    tracing::debug!(error = %e, "TLS handshake failed");
                }
                None
            }
        }
    }
}

impl Downstream {
    /// The next request's head: from the socket, or from the bytes of it
    /// read with the last request (`next`, a pipelined request). `None`
    /// when the connection is to close without an answer.
    async fn next_head(
        &self,
        stream: &mut Stream,
        conn: &table::Conn,
        next: BytesMut,
        first: bool,
    ) -> Option<(BytesMut, usize)> {
        // empty lines after a body (old senders add a CRLF after a POST's
        // body; RFC 9112 §2.2) are no head: wait for one as on a fresh read
        let blank = next.iter().all(|&b| b == b'\r' || b == b'\n');
        let mut got = match blank {
            true => head::first_bytes(stream).await,
            false => head::started(next),
        };
        if let Head::Started(buf) = got {
            // a kept-alive connection's next head: the header timeout
            // runs from here (for a first request, it runs from the accept)
            if !first && !conn.head_started() {
                return None;
            }
            got = head::read_rest(stream, buf).await;
        }
        match got {
            Head::Complete(buf, end) => Some((buf, end)),
            Head::TooLarge => {
                let p = Problem::new(
                    ProblemKind::HeadersTooLarge,
                    format!("the request head is larger than {} bytes", head::MAX_HEAD),
                );
                Box::pin(self.refuse(stream, p)).await;
                None
            }
            Head::Closed | Head::Started(_) => None,
        }
    }

    /// One request on the connection, from its head to pingora's answer:
    /// the stream back, with the bytes of the next request read with this
    /// one; `None` when the connection closes.
    async fn one_request(
        &self,
        mut stream: Stream,
        conn: &table::Conn,
        (mut prefix, end): (BytesMut, usize),
        shutdown: &ShutdownWatch,
    ) -> Option<(Stream, BytesMut)> {
        let framing = match strict::check(&prefix[..end]) {
            Ok(framing) => framing,
            Err(r) => {
                Box::pin(self.refuse(&mut stream, refusal_problem(r))).await;
                return None;
            }
        };
        if !conn.activate() {
            return None; // closed here while its head arrived: nothing began
        }
        // a small body is read here, within body_timeout; what is left of
        // that time bounds pingora's reading (the guard answers 408)
        let mut body_time = self.limits.body_timeout;
        if let Body::Length(len) = framing.body {
            let want = end as u64 + len;
            if !framing.expect
                && len <= head::MAX_PREREAD_BODY as u64
                && self.senders.preread(peer_ip(&stream))
                && (prefix.len() as u64) < want
            {
                let started = std::time::Instant::now();
                let read = head::read_body(&mut stream, &mut prefix, want as usize);
                // short (the sender closed) or late, pingora's reading
                // finds it so too, and the answer says which
                let _ = tokio::time::timeout(body_time, read).await;
                body_time = body_time
                    .saturating_sub(started.elapsed())
                    .max(std::time::Duration::from_millis(1));
            }
        }
        let (left, next) = match split_body(&mut prefix, end, framing.body) {
            Ok(parts) => parts,
            Err(e) => {
                let p = Problem::new(ProblemKind::InvalidRequest, e.to_string());
                Box::pin(self.refuse(&mut stream, p)).await;
                return None;
            }
        };
        let mut session = ServerSession::new_http1(Box::new(Framed::new(stream, left)));
        session.set_pipelined_prefix(prefix);
        if *shutdown.borrow() {
            session.set_keepalive(None);
        } else {
            session.set_keepalive(Some(self.keepalive_secs()));
        }
        session.set_write_timeout(Some(self.limits.write_timeout));
        // per read of a body that streams through pingora; bodies
        // idemgate reads whole have the whole body_timeout
        session.set_read_timeout(Some(body_time));
        let reused = self.proxy.process_new_http(session, shutdown).await?;
        let (framed, _settings) = reused.consume();
        // the stream given to the session above comes back
        let (stream, mut read_on) = framed.into_any().downcast::<Framed>().ok()?.into_parts();
        if !next.is_empty() {
            // past a body that ended inside the head's read: read_on is empty
            read_on = next;
        }
        Some((stream, read_on))
    }
}

/// The connection's peer address, if it is an IP one.
fn peer_ip(stream: &Stream) -> Option<std::net::IpAddr> {
    let digest = stream.get_socket_digest()?;
    Some(digest.peer_addr()?.as_inet()?.ip())
}

#[async_trait]
impl ServerApp for Downstream {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        // counted from the accept: pingora calls this right after it
        let conn = self.table.admit(stream.id())?;
        let mut stream = self.accept_tls(stream, &conn).await?;
        let mut first = true;
        let mut next = BytesMut::new();
        loop {
            let head = self.next_head(&mut stream, &conn, next, first).await?;
            (stream, next) = self.one_request(stream, &conn, head, shutdown).await?;
            if *shutdown.borrow() || !conn.idle() {
                return None;
            }
            first = false;
        }
    }

    async fn cleanup(&self) {
        // Not pingora's `http_cleanup`: it makes pingora drop a request
        // whose head it has not parsed yet, and every request this listener
        // gives pingora has its head read already (a stop must answer it).
        self.table.close_idle();
    }
}

/// Runs [`Table::reap`] every few milliseconds (see [`Table::tick`]).
/// At shutdown it closes the idle kept-alive connections, and goes on
/// closing those that become idle (a response written as the shutdown
/// began) and reaping the rest until the process ends: the header timeout
/// bounds the requests still expected on the connections left open.
pub struct Reaper {
    table: Arc<Table>,
}

impl Reaper {
    /// The connections of the proxy listener, for the drain at shutdown.
    pub fn table(&self) -> Arc<Table> {
        self.table.clone()
    }
}

#[async_trait]
impl BackgroundService for Reaper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let tick = self.table.tick();
        let mut interval = tokio::time::interval(tick);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stopping = false;
        loop {
            tokio::select! {
                _ = interval.tick() => {
                    if stopping {
                        self.table.close_idle();
                    }
                    self.table.reap();
                }
                changed = shutdown.changed(), if !stopping => {
                    stopping = changed.is_err() || *shutdown.borrow();
                    if stopping {
                        self.table.close_idle();
                    }
                }
            }
        }
    }
}
