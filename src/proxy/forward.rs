//! Forwarding a request whose body idemgate has already read: used for every
//! guarded request (and for the unguarded fallbacks after a body was read).
//! pingora's own proxy path cannot carry a pre-read body over 64 KiB, and the
//! claim must be settled between the upstream's answer and the response to the
//! sender, so this path drives pingora's client connector directly.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora::connectors::http::Connector;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::client::HttpSession;
use pingora::protocols::http::v1::client::{http_req_header_to_wire, HttpSession as Http1Session};
use pingora::proxy::Session;
use pingora::upstreams::peer::HttpPeer;
use pingora::ErrorType;

use super::hop;
use super::idle::IdleConnections;
use super::respond::IDEMPOTENCY_STATUS;
use super::routes::RouteRt;
use super::shared::Shared;
use crate::otel::{RequestTrace, SendSpan};
use crate::problem::ProblemKind;
use crate::store::TraceRef;

/// Dropped from a request whose body idemgate read, besides the hop-by-hop
/// headers ([`hop`]): the framing, which is rewritten from the body read,
/// and `Expect`, which idemgate answered.
const REFRAMED: [&str; 2] = ["transfer-encoding", "expect"];

/// Why the upstream gave no usable answer, and whether the consumer may
/// have acted on the request all the same (SPEC §12).
#[derive(Debug)]
pub enum UpstreamFailure {
    /// Not reached, or the connection broke before the request's last byte
    /// was written, or the answer was unusable: the consumer cannot have
    /// acted on an incomplete request. `why` is the attempt's record of it
    /// (no address); `error` the connector's words, for the log.
    Failed { why: &'static str, error: String },
    /// No response header within `upstream_timeout`; `written`: the
    /// request's last byte had been written by then (ambiguous).
    Timeout { written: bool },
    /// The connection closed or reset after the request's last byte was
    /// written and before a complete response head arrived (ambiguous).
    Lost { why: &'static str, error: String },
}

impl UpstreamFailure {
    pub fn class(&self) -> &'static str {
        match self {
            UpstreamFailure::Failed { .. } | UpstreamFailure::Lost { .. } => "connect_error",
            UpstreamFailure::Timeout { .. } => "timeout",
        }
    }

    /// The problem a sender gets for it.
    pub fn kind(&self) -> ProblemKind {
        match self {
            UpstreamFailure::Failed { .. } | UpstreamFailure::Lost { .. } => {
                ProblemKind::UpstreamUnreachable
            }
            UpstreamFailure::Timeout { .. } => ProblemKind::UpstreamTimeout,
        }
    }

    /// Whether the consumer may have acted without idemgate learning the
    /// answer (SPEC §12).
    pub fn ambiguous(&self) -> bool {
        matches!(
            self,
            UpstreamFailure::Lost { .. } | UpstreamFailure::Timeout { written: true }
        )
    }

    /// What the attempt's row says happened: never the upstream's address.
    pub fn attempt_error(&self) -> &'static str {
        match self {
            UpstreamFailure::Failed { why, .. } | UpstreamFailure::Lost { why, .. } => why,
            UpstreamFailure::Timeout { written: true } => "timeout after the request was written",
            UpstreamFailure::Timeout { written: false } => "timeout before the request was written",
        }
    }
}

/// The `detail` of a 502 or 504: what happened, never where or the
/// connector's words (SPEC §4: the upstream's address and the error text go
/// to the warn log and the record's `last_error`, not to senders).
pub fn failure_detail(kind: ProblemKind) -> &'static str {
    match kind {
        ProblemKind::UpstreamTimeout => "the upstream did not answer in time",
        _ => "the upstream could not be reached, or closed the connection before answering",
    }
}

/// An upstream that has answered with a final response header.
pub struct Answered {
    pub client: HttpSession,
    pub header: ResponseHeader,
    pub elapsed: Duration,
    /// The body broke (reset, closed early, went silent past the timeout)
    /// while [`read_prefix`] read it; [`relay`] passes on what arrived and
    /// then fails with this instead of reading on.
    broken: Option<Box<pingora::Error>>,
}

/// The request as the upstream gets it: the sender's header in HTTP/1.1
/// whatever the sender spoke (an HTTP/1.0 request without `Connection`
/// would let the consumer close after answering, and the next request on
/// the kept connection would fail), with the path rewritten, hop-by-hop
/// headers dropped ([`hop`]), an exact `Content-Length` (none if the sender
/// sent neither body nor length), `Host` (the upstream's, `host`, when the
/// sender gave none, as HTTP/1.0 allows), and the idempotency key (replacing
/// any the sender set).
fn build_request(
    original: &RequestHeader,
    path_and_query: &str,
    body_len: usize,
    idempotency_key: Option<(&http::HeaderName, &str)>,
    host: &http::HeaderValue,
) -> pingora::Result<RequestHeader> {
    let mut req = original.clone();
    let uri: http::Uri = path_and_query.parse().map_err(|_| {
        pingora::Error::explain(ErrorType::InvalidHTTPHeader, "rewritten path is not a URI")
    })?;
    req.set_uri(uri);
    req.set_version(http::Version::HTTP_11);
    hop::strip_request(&mut req);
    for h in REFRAMED {
        req.remove_header(h);
    }
    if !req.headers.contains_key(http::header::HOST) {
        req.insert_header(http::header::HOST, host.clone())?;
    }
    // A request that came with neither body nor length (a GET) goes on
    // without one: no body is what an absent length means (RFC 9112 §6.3).
    if body_len > 0 || original.headers.contains_key(http::header::CONTENT_LENGTH) {
        req.insert_header(http::header::CONTENT_LENGTH, body_len)?;
    }
    if let Some((name, key)) = idempotency_key {
        req.insert_header(name.clone(), key)?;
    }
    Ok(req)
}

/// Bodies up to this size go out in the same write as the request header:
/// one loopback or network segment and one wake-up of the upstream instead
/// of two, and one system call fewer (pingora writes and flushes the header
/// on its own). Larger bodies follow the header, as pingora writes them.
const COALESCE_LIMIT: usize = 64 * 1024;

/// A route's upstream as idemgate's own path reaches it: the route's kept
/// connections and peer, the shared connector, and the metrics its answers
/// and failures are counted in.
#[derive(Clone, Copy)]
pub struct Upstream<'a> {
    shared: &'a Shared,
    route: &'a RouteRt,
    /// The request's trace: each send gets a CLIENT span and its
    /// `traceparent` (SPEC §19).
    trace: Option<&'a RequestTrace>,
    /// The first send's span, chosen before the claim (its record keeps it).
    planned: Option<TraceRef>,
}

impl<'a> Upstream<'a> {
    pub fn of(shared: &'a Shared, route: &'a RouteRt) -> Self {
        Upstream {
            shared,
            route,
            trace: None,
            planned: None,
        }
    }

    /// Each send traced as a child of `trace`, the first with `planned`'s
    /// span ID.
    pub fn traced(self, trace: Option<&'a RequestTrace>, planned: Option<TraceRef>) -> Self {
        Upstream {
            trace,
            planned,
            ..self
        }
    }

    /// The request as this upstream gets it ([`build_request`]): the
    /// sender's, its path rewritten for the route, with `key` as the
    /// idempotency key.
    pub fn request(
        &self,
        session: &Session,
        body_len: usize,
        key: Option<(&http::HeaderName, &str)>,
    ) -> pingora::Result<RequestHeader> {
        let original = session.req_header();
        let pq = original
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let host = &self.route.cfg.upstream.host_header;
        build_request(original, &self.route.upstream_path(pq), body_len, key, host)
    }

    /// Sends the request and waits for the final response header, all
    /// within `upstream_timeout`, on one of the route's idle connections or
    /// a new one ([`Upstream::attempt`]); counts the answer, or the
    /// failure.
    pub async fn exchange(
        &self,
        req: RequestHeader,
        body: Bytes,
        hold: bool,
    ) -> Result<Answered, UpstreamFailure> {
        let (name, metrics) = (self.route.name(), &self.shared.metrics);
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.route.cfg.upstream_timeout;
        // set once the request's last byte is written, read if the time runs out
        let written = AtomicBool::new(false);
        let mut req = req;
        let attempt = self.attempt(&mut req, &body, hold, &written);
        let exchanged = match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok((client, header))) => Ok(Answered {
                client,
                header,
                elapsed: started.elapsed(),
                broken: None,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(UpstreamFailure::Timeout {
                written: written.load(Ordering::Relaxed),
            }),
        };
        match &exchanged {
            Ok(answered) => {
                metrics.upstream_answered(name, answered.header.status.as_u16(), answered.elapsed)
            }
            Err(failure) => metrics.upstream_outcome(name, failure.class()),
        }
        exchanged
    }

    /// The request on a kept connection, or a new one. A kept connection
    /// that fails before any byte of an answer arrived — it was closed or
    /// reset while idle, or the consumer closed it after the liveness check
    /// ([`IdleConnections::take`]) — gets the request once more, on a new
    /// connection, with the same header (so the same idempotency key),
    /// counted as a retry. With `hold` (SPEC §12) only while the request's
    /// last byte was not written yet: after that the consumer may have
    /// acted. Nothing is retried once the upstream has answered anything,
    /// nor on a new connection.
    async fn attempt(
        &self,
        req: &mut RequestHeader,
        body: &Bytes,
        hold: bool,
        written: &AtomicBool,
    ) -> Result<(HttpSession, ResponseHeader), UpstreamFailure> {
        let (route, peer) = (self.route, &self.route.peer);
        let mut retried = false;
        loop {
            written.store(false, Ordering::Relaxed);
            let send = self.send_span(req, retried);
            let kept = if retried { None } else { route.idle.take() };
            let (client, reused) = match kept {
                Some(stream) => (
                    HttpSession::H1(Http1Session::new_with_options(stream, peer)),
                    true,
                ),
                None => match self.shared.connector.get_http_session(peer).await {
                    Ok(connected) => connected,
                    Err(e) => return sent(send, Err(connect_failure(&e))),
                },
            };
            let timeout = route.cfg.upstream_timeout;
            match try_once(client, peer, req, body, timeout, written).await {
                Ok(client) => return sent(send, final_header(client)),
                Err(Try::Gone(_))
                    if reused && !retried && !(hold && written.load(Ordering::Relaxed)) =>
                {
                    if let Some(send) = send {
                        send.failed("connection_closed");
                    }
                    retried = true;
                    self.shared.metrics.upstream_retry(route.name());
                }
                Err(Try::Gone(e) | Try::Failed(e)) => {
                    return sent(send, Err(failure(&e, written.load(Ordering::Relaxed))))
                }
            }
        }
    }

    /// A traced send's CLIENT span, its `traceparent` put on `req` (any the
    /// sender sent is replaced); the first send takes the planned span ID.
    fn send_span(&self, req: &mut RequestHeader, resent: bool) -> Option<SendSpan> {
        let trace = self.trace?;
        let planned = if resent { None } else { self.planned };
        let send = trace.send(planned, &req.method, send_attributes(self.route, resent));
        if put_trace_headers(req, &send).is_err() {
            tracing::debug!("traceparent could not be set");
        }
        Some(send)
    }

    /// Passes the upstream's answer on to the sender ([`relay`]) and keeps
    /// the connection among the route's idle ones when it is reusable.
    pub async fn relay(
        &self,
        session: &mut Session,
        answered: Answered,
        prefix: Option<Bytes>,
        status_header: &str,
    ) -> pingora::Result<()> {
        let (connector, route) = (&self.shared.connector, self.route);
        relay(
            session,
            connector,
            &route.idle,
            &route.peer,
            answered,
            prefix,
            status_header,
        )
        .await
    }
}

/// A send's end on its CLIENT span: the status, or the failure's class.
fn sent<T>(
    send: Option<SendSpan>,
    result: Result<(T, ResponseHeader), UpstreamFailure>,
) -> Result<(T, ResponseHeader), UpstreamFailure> {
    if let Some(send) = send {
        match &result {
            Ok((_, header)) => send.answered(header.status.as_u16()),
            Err(f) => send.failed(f.class()),
        }
    }
    result
}

/// The CLIENT span's attributes (SPEC §19): the upstream's address and
/// port, and `http.request.resend_count` on a send made again.
pub fn send_attributes(route: &RouteRt, resent: bool) -> Vec<opentelemetry::KeyValue> {
    use opentelemetry::KeyValue;
    let u = &route.cfg.upstream;
    let mut attributes = vec![
        KeyValue::new("server.address", u.host.clone()),
        KeyValue::new("server.port", i64::from(u.port)),
    ];
    if resent {
        attributes.push(KeyValue::new("http.request.resend_count", 1_i64));
    }
    attributes
}

/// The send's `traceparent` (and `tracestate`, or none) on the request the
/// upstream gets, replacing the sender's.
pub fn put_trace_headers(req: &mut RequestHeader, send: &SendSpan) -> pingora::Result<()> {
    let (parent, state) = send.headers();
    req.insert_header("traceparent", parent)?;
    match state {
        Some(state) => req.insert_header("tracestate", state)?,
        None => {
            req.remove_header("tracestate");
        }
    }
    Ok(())
}

/// The final response header a try read: a 101 is refused (idemgate never
/// asks for an upgrade, [`hop::strip_request`]).
fn final_header(client: HttpSession) -> Result<(HttpSession, ResponseHeader), UpstreamFailure> {
    let header = client
        .response_header()
        .cloned()
        .ok_or_else(|| UpstreamFailure::Failed {
            why: "no response header",
            error: "upstream sent no response header".into(),
        })?;
    if header.status == http::StatusCode::SWITCHING_PROTOCOLS {
        return Err(UpstreamFailure::Failed {
            why: "answered 101 Switching Protocols",
            error: "upstream answered 101 Switching Protocols to a request without Upgrade".into(),
        });
    }
    Ok((client, header))
}

/// How one try of a request on one connection failed.
enum Try {
    /// The connection was gone before any byte of an answer: the request
    /// may go once more, if the connection was a kept one.
    Gone(Box<pingora::Error>),
    Failed(Box<pingora::Error>),
}

/// Writes the request on `client` and reads up to the final response
/// header (1xx interim answers are not passed on; 101 is refused by the
/// caller). `written` is set once the request's last byte is written.
async fn try_once(
    client: HttpSession,
    peer: &HttpPeer,
    req: &RequestHeader,
    body: &Bytes,
    timeout: Duration,
    written: &AtomicBool,
) -> Result<HttpSession, Try> {
    let whole = matches!(client, HttpSession::H1(_)) && coalesces(req, body);
    let sent = match client {
        HttpSession::H1(h1) if whole => write_whole(h1, req, body, peer, timeout).await,
        client => write_apart(client, req, body, timeout).await,
    };
    let mut client = sent.map_err(|e| {
        // the kept connection was gone before the request was written
        match e.etype() {
            ErrorType::WriteError | ErrorType::ConnectionClosed => Try::Gone(e),
            _ => Try::Failed(e),
        }
    })?;
    written.store(true, Ordering::Relaxed);
    let mut interim = false;
    loop {
        if let Err(e) = client.read_response_header().await {
            return Err(if !interim && closed_before_answer(&e) {
                Try::Gone(e)
            } else {
                Try::Failed(e)
            });
        }
        let status = client
            .response_header()
            .map(|h| h.status.as_u16())
            .unwrap_or(0);
        if !(100..200).contains(&status) || status == 101 {
            return Ok(client);
        }
        interim = true;
    }
}

/// Whether reading the response header failed before a single byte of it
/// arrived: the connection was closed or reset (pingora marks those
/// retryable on a reused connection, and says how many bytes it had read).
pub fn closed_before_answer(e: &pingora::Error) -> bool {
    matches!(
        e.etype(),
        ErrorType::ConnectionClosed | ErrorType::ReadError
    ) && matches!(e.retry, pingora::RetryType::ReusedOnly)
        && e.context
            .as_ref()
            .is_some_and(|c| c.as_str().ends_with("bytes already read: 0"))
}

/// Whether the request goes out in one write (on an HTTP/1 connection): a
/// body of at most [`COALESCE_LIMIT`], and not `HEAD`. The session that
/// reads the answer is then built afresh on the connection and does not know
/// the request; for what it reads that is the same, because the request
/// carries an exact `Content-Length` and no `Connection` or `Upgrade` header
/// ([`build_request`] drops them), and a `HEAD` is written the usual way.
fn coalesces(req: &RequestHeader, body: &[u8]) -> bool {
    !body.is_empty() && body.len() <= COALESCE_LIMIT && req.method != http::Method::HEAD
}

/// Writes the request header and body with one vectored write (the body is
/// not copied) and one flush, and returns a session on the same connection,
/// with `timeout` for its reads and writes, to read the answer with. The
/// write itself is bounded by the caller's deadline.
async fn write_whole(
    h1: Http1Session,
    req: &RequestHeader,
    body: &Bytes,
    peer: &HttpPeer,
    timeout: Duration,
) -> pingora::Result<HttpSession> {
    use bytes::Buf;
    use tokio::io::AsyncWriteExt;
    let head = http_req_header_to_wire(req).ok_or_else(|| {
        pingora::Error::explain(
            ErrorType::InvalidHTTPHeader,
            "the request line holds a forbidden byte",
        )
    })?;
    let mut request = head.chain(body.clone());
    let mut stream = h1.into_inner();
    let written = async {
        stream.write_all_buf(&mut request).await?;
        stream.flush().await
    };
    written.await.map_err(|e| {
        pingora::Error::because(ErrorType::WriteError, "while writing the request", e)
    })?;
    let mut client = HttpSession::H1(Http1Session::new_with_options(stream, peer));
    client.set_read_timeout(Some(timeout));
    client.set_write_timeout(Some(timeout));
    Ok(client)
}

/// Writes the request header, then the body, as pingora writes them, with
/// `timeout` for the session's reads and writes.
async fn write_apart(
    mut client: HttpSession,
    req: &RequestHeader,
    body: &Bytes,
    timeout: Duration,
) -> pingora::Result<HttpSession> {
    client.set_read_timeout(Some(timeout));
    client.set_write_timeout(Some(timeout));
    client.write_request_header(Box::new(req.clone())).await?;
    if !body.is_empty() {
        client.write_request_body(body.clone(), true).await?;
    }
    client.finish_request_body().await?;
    Ok(client)
}

/// A failed connect, write or read, as an [`UpstreamFailure`]: after the
/// request's last byte was `written`, one the consumer may have acted on.
fn failure(e: &pingora::Error, written: bool) -> UpstreamFailure {
    if !written {
        return connect_failure(e);
    }
    match e.etype() {
        ErrorType::ReadTimedout | ErrorType::WriteTimedout => UpstreamFailure::Timeout { written },
        ErrorType::ConnectionClosed => UpstreamFailure::Lost {
            why: "connection closed before the answer",
            error: e.to_string(),
        },
        ErrorType::ReadError => UpstreamFailure::Lost {
            why: "connection reset before the answer",
            error: e.to_string(),
        },
        _ => UpstreamFailure::Lost {
            why: "the answer broke off before its head was complete",
            error: e.to_string(),
        },
    }
}

/// A failure before the request's last byte was written.
fn connect_failure(e: &pingora::Error) -> UpstreamFailure {
    let why = match e.etype() {
        ErrorType::ConnectTimedout
        | ErrorType::ReadTimedout
        | ErrorType::WriteTimedout
        | ErrorType::TLSHandshakeTimedout => return UpstreamFailure::Timeout { written: false },
        ErrorType::ConnectRefused => "connect refused",
        ErrorType::TLSHandshakeFailure | ErrorType::InvalidCert | ErrorType::HandshakeError => {
            "TLS failure"
        }
        ErrorType::WriteError | ErrorType::ConnectionClosed => {
            "connection failed while the request was written"
        }
        _ => "connect failed",
    };
    UpstreamFailure::Failed {
        why,
        error: e.to_string(),
    }
}

/// The upstream's response header as the sender gets it: hop-by-hop headers
/// dropped ([`hop`]; the body framing stays), plus `Idempotency-Status`.
pub fn downstream_header(
    upstream: &ResponseHeader,
    status_header: &str,
) -> pingora::Result<ResponseHeader> {
    let mut resp = upstream.clone();
    hop::strip_response(&mut resp);
    resp.insert_header(IDEMPOTENCY_STATUS, status_header)?;
    Ok(resp)
}

/// Whether a response to `method` with `status` carries no body.
pub fn bodiless(method: &http::Method, status: u16) -> bool {
    method == http::Method::HEAD || status == 204 || status == 304 || (100..200).contains(&status)
}

/// Passes the upstream's answer on to the sender, its header with
/// `Idempotency-Status: status_header` ([`downstream_header`]), streams the
/// rest of its body and keeps the upstream connection among the route's
/// idle ones when it is reusable. `prefix` is body that was already read
/// (to be stored for replay).
async fn relay(
    session: &mut Session,
    connector: &Connector,
    idle: &IdleConnections,
    peer: &HttpPeer,
    mut answered: Answered,
    prefix: Option<Bytes>,
    status_header: &str,
) -> pingora::Result<()> {
    let no_body = bodiless(
        &session.req_header().method,
        answered.header.status.as_u16(),
    );
    let header = downstream_header(&answered.header, status_header)?;
    if no_body {
        session
            .write_response_header(Box::new(header), true)
            .await?;
    } else {
        session
            .write_response_header(Box::new(header), false)
            .await?;
        if let Some(p) = prefix.filter(|p| !p.is_empty()) {
            session.write_response_body(Some(p), false).await?;
        }
        if let Some(e) = answered.broken.take() {
            return Err(e);
        }
        while let Some(chunk) = answered.client.read_response_body().await? {
            session.write_response_body(Some(chunk), false).await?;
        }
        session.write_response_body(None, true).await?;
    }
    keep_or_close(answered.client, connector, idle, peer).await;
    Ok(())
}

/// An upstream connection whose answer was relayed: kept among the route's
/// idle ones when its answer was read to the end and it may be reused,
/// closed otherwise.
async fn keep_or_close(
    mut client: HttpSession,
    connector: &Connector,
    idle: &IdleConnections,
    peer: &HttpPeer,
) {
    if !client.response_done() {
        return client.shutdown().await;
    }
    match client {
        HttpSession::H1(mut h1) => {
            h1.respect_keepalive();
            if let Some(stream) = h1.reuse().await {
                idle.put(stream);
            }
        }
        other => {
            connector
                .release_http_session(other, peer, peer.options.idle_timeout)
                .await
        }
    }
}

/// Reads the upstream body up to `limit` bytes (for `replay_body`). Returns the
/// bytes read and whether that was the whole body.
///
/// A body that breaks here is not an error for the caller: the upstream has
/// already answered with its status, and a settling status must still be
/// settled (`delivered`, without a stored body) — failing here would leave
/// the claim `processing` until its lease ran out and the event was
/// forwarded again. The failure is kept in `answered` for [`relay`].
pub async fn read_prefix(answered: &mut Answered, limit: usize) -> pingora::Result<(Bytes, bool)> {
    let mut buf = bytes::BytesMut::new();
    while buf.len() <= limit {
        match answered.client.read_response_body().await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk),
            Ok(None) => return Ok((buf.freeze(), true)),
            Err(e) => {
                tracing::warn!(error = %e, read = buf.len(), "the upstream's response body broke off: not stored for replay");
                answered.broken = Some(e);
                break;
            }
        }
    }
    Ok((buf.freeze(), false))
}
