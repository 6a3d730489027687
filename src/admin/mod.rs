//! The admin listener: `/healthz` (the process runs), `/readyz` (the proxy
//! listener accepts and the store answers), `/metrics` (Prometheus text),
//! the JSON admin API under `/api/` and the operator console at `/`
//! (SPEC §11; see [`api`] and [`console`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;

use crate::metrics::Metrics;
use crate::problem::{AdminKind, Problem, ProblemKind};
use crate::proxy::body::{self, BodyError};
use crate::store::ClaimStore;

mod actions;
pub mod api;
mod ask;
pub mod console;
mod ready;
mod web;

/// `/readyz` answers within this, whatever the store does (SPEC §5): a
/// probe's default timeout is 1 s, and a store that has not answered by
/// then is not ready. The proxy's check and the store's share it.
const READY_TIMEOUT: Duration = Duration::from_millis(450);
/// The most an action's body may hold: its JSON documents are a few dozen
/// bytes.
pub const MAX_BODY: usize = 4096;
/// An action's whole body must arrive within this, however slowly it
/// trickles in (pingora bounds each read, not the whole).
const BODY_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Admin {
    pub store: Arc<dyn ClaimStore>,
    pub metrics: Metrics,
    /// The proxy's listen address: pingora starts the admin service before
    /// the proxy service, so `/readyz` must not say ready until the proxy
    /// listener accepts (a client that trusted it got "connection refused").
    pub proxy_listen: SocketAddr,
    /// Set once a connection to `proxy_listen` succeeded.
    pub proxy_up: AtomicBool,
    /// Set when the graceful stop begins: `/readyz` answers 503 from then
    /// until the process exits (SPEC §20), while the drain goes on.
    pub stopping: Arc<AtomicBool>,
    /// The store's readiness ping under way, joined by every probe.
    pub store_ping: ready::StorePing,
    pub not_ready_log: ready::NotReadyLog,
    /// `/api/…` and the console.
    pub api: api::Api,
    /// The admin listener is on loopback: the API and the console answer
    /// only a loopback `Host` (see [`web::loopback_host`]).
    pub loopback_only: bool,
    /// Peers whose `X-Forwarded-For` names the operator's address in the
    /// actions' log lines (SPEC §22).
    pub trusted_proxies: Arc<crate::source::Ranges>,
}

impl Admin {
    async fn proxy_accepts(&self) -> bool {
        if self.proxy_up.load(Ordering::Relaxed) {
            return true;
        }
        let connect = tokio::net::TcpStream::connect(self.proxy_listen);
        let up = matches!(
            tokio::time::timeout(READY_TIMEOUT, connect).await,
            Ok(Ok(_))
        );
        if up {
            self.proxy_up.store(true, Ordering::Relaxed);
        }
        up
    }
}

/// The type of the plain-text answers.
const PLAIN: &str = "text/plain; charset=utf-8";

fn text(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Vec<u8>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(body)
        .expect("static response parts are valid")
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        if !is_api(session.req_header().uri.path()) && declares_body(session) {
            // only an action reads a body: any other is left unread, and the
            // connection closed after the answer rather than drained
            session.set_keepalive(None);
        }
        if let Some(resp) = self.api_or_console(session).await {
            return resp;
        }
        match session.req_header().uri.path() {
            "/healthz" => text(StatusCode::OK, PLAIN, b"ok\n".to_vec()),
            "/readyz" => self.readyz().await,
            "/metrics" => text(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                self.metrics.render(),
            ),
            _ => text(
                StatusCode::NOT_FOUND,
                PLAIN,
                b"not found: try /, /api/routes, /healthz, /readyz or /metrics\n".to_vec(),
            ),
        }
    }
}

impl Admin {
    /// The console's files and `/api/…`; `None` for the other paths.
    async fn api_or_console(&self, session: &mut ServerSession) -> Option<Response<Vec<u8>>> {
        let req = session.req_header();
        let path = req.uri.path();
        let asset = if is_api(path) {
            None
        } else {
            Some(console::asset(path)?)
        };
        if self.loopback_only && !web::loopback_host_of(req) {
            session.set_keepalive(None);
            let detail = "the admin listener is on loopback and answers only Host: localhost, \
                          127.0.0.1 or [::1] (a page that points another name here is refused)";
            let p = Problem::admin(AdminKind::MisdirectedRequest, detail);
            return Some(p.into_response());
        }
        if let Some(resp) = asset {
            return Some(resp);
        }
        let method = req.method.clone();
        let path = path.to_owned();
        let query = req.uri.query().map(str::to_owned);
        let authorization: Vec<Vec<u8>> = req
            .headers
            .get_all(http::header::AUTHORIZATION)
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect();
        let peer = self.peer(session);
        let body = match read_body(session).await {
            Ok(body) => body,
            Err(problem) => return Some(problem.into_response()),
        };
        let request = api::ApiRequest {
            method: &method,
            path: &path,
            query: query.as_deref(),
            authorization: authorization.iter().map(Vec::as_slice).collect(),
            peer,
            body: &body,
        };
        Some(self.api.respond(&request).await)
    }

    /// `/readyz`: ready when not stopping, the proxy listener accepts, and
    /// the store answers within READY_TIMEOUT.
    async fn readyz(&self) -> Response<Vec<u8>> {
        let unavailable =
            |why: &'static [u8]| text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, why.to_vec());
        if self.stopping.load(Ordering::Acquire) {
            return unavailable(b"stopping: draining before exit\n");
        }
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        if !self.proxy_accepts().await {
            return unavailable(b"proxy listener: not accepting yet\n");
        }
        let t = std::time::Instant::now();
        let ping = self.store_ping.answer(&self.store, deadline).await;
        self.metrics.store_time("lookup", t.elapsed().as_secs_f64());
        // the body says only that: the store's error text (paths,
        // hosts, driver messages) goes to the log
        match ping {
            Some(Ok(())) => {
                self.not_ready_log.ready();
                text(StatusCode::OK, PLAIN, b"ready\n".to_vec())
            }
            Some(Err(e)) => {
                self.not_ready_log
                    .not_ready(|| tracing::warn!(error = %e, "/readyz: the store does not answer"));
                unavailable(b"store: not answering\n")
            }
            None => {
                self.not_ready_log.not_ready(|| {
                    tracing::warn!(
                        "/readyz: the store gave no answer within {}",
                        humantime::format_duration(READY_TIMEOUT)
                    )
                });
                unavailable(b"store: not answering\n")
            }
        }
    }

    /// The client, as the proxy's log shows it: behind a trusted proxy, the
    /// one it names (SPEC §22).
    fn peer(&self, session: &ServerSession) -> String {
        match session.client_addr().and_then(|a| a.as_inet()) {
            Some(a) => {
                let xff = session.req_header().headers.get_all("x-forwarded-for");
                let xff = xff.iter().map(|v| v.as_bytes());
                crate::source::Shown(crate::source::client(a.ip(), &self.trusted_proxies, xff))
                    .to_string()
            }
            None => session
                .client_addr()
                .map(|a| a.to_string())
                .unwrap_or_default(),
        }
    }
}

fn is_api(path: &str) -> bool {
    path == "/api" || path.starts_with("/api/")
}

/// The request says a body follows (a length above 0, or a transfer coding).
fn declares_body(session: &ServerSession) -> bool {
    let headers = &session.req_header().headers;
    headers.contains_key(http::header::TRANSFER_ENCODING)
        || headers
            .get(http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

/// An API request's body, read whole by the proxy's one bounded reader
/// ([`body::read_bounded`]): at most [`MAX_BODY`] bytes (a larger declared
/// length is refused before a byte is read), within [`BODY_TIMEOUT`] in
/// all. A refusal closes the connection after the answer; what was not
/// read is never drained. A chunked body also closes it: the answer is
/// given whatever the framing said.
async fn read_body(session: &mut ServerSession) -> Result<Vec<u8>, Problem> {
    if !declares_body(session) {
        return Ok(Vec::new());
    }
    let headers = &session.req_header().headers;
    let chunked = headers.contains_key(http::header::TRANSFER_ENCODING);
    let expects_continue = body::expects_continue(session.req_header());
    let too_large = || {
        let detail = format!("an action's body is a small JSON document: at most {MAX_BODY} bytes");
        Problem::new(ProblemKind::BodyTooLarge, detail)
    };
    // pingora refused an invalid length already; a chunked body has none
    let declared = body::declared_length(session.req_header());
    if chunked {
        session.set_keepalive(None);
    } else if declared.is_some_and(|n| n > MAX_BODY as u64) {
        session.set_keepalive(None);
        return Err(too_large());
    }
    if expects_continue && session.write_continue_response().await.is_err() {
        session.set_keepalive(None);
        return Err(unreadable());
    }
    let read = body::read_bounded(session, MAX_BODY as u64, BODY_TIMEOUT).await;
    if read.is_err() {
        session.set_keepalive(None);
    }
    read.map(Vec::from).map_err(|e| match e {
        BodyError::TooLarge => too_large(),
        BodyError::Timeout => {
            let waited = humantime::format_duration(BODY_TIMEOUT);
            let detail = format!("the body did not arrive within {waited}");
            Problem::new(ProblemKind::BodyTimeout, detail)
        }
        BodyError::Framing | BodyError::Broken(_) => {
            tracing::debug!(error = ?e, "admin API: the request body could not be read");
            unreadable()
        }
    })
}

fn unreadable() -> Problem {
    Problem::bad_body("the request body could not be read (cut short, or badly framed)")
}
