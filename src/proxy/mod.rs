//! The pingora side: one `ProxyHttp` implementation whose hooks gather facts
//! and call plain functions. Guarded requests are decided and forwarded in
//! `request_filter` (read body → verify → claim → forward → settle → answer);
//! so are unguarded requests with a small body of known length (read, then
//! forwarded as a guarded request is, without the claim); other unguarded
//! requests (chunked or large bodies, upgrades) take pingora's streaming
//! proxy path.
//!
//! Every request read whole comes to one ending (`exit::Verdict`: a replay,
//! an upstream answer to relay, or a problem), which one exit
//! (`exit::answer`) counts and writes, handing back the proof that it
//! counted; `delivery` is the guarded path (its policies are
//! `claim::policy`'s), `pass_through` the unguarded ones read whole.

pub mod body;
mod delivery;
mod exit;
pub mod forward;
pub mod hop;
pub mod idle;
mod in_flight;
mod pass_through;
mod pending;
pub mod respond;
pub mod routes;
pub mod seen;
mod shared;
mod steps;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorType, Result};

use crate::metrics::Outcome;
use crate::problem::{Problem, ProblemKind};
use crate::strict::fields::{self, FieldFault, MAX_HEADER_SECTION};
use exit::{Exit, Refused};
pub use in_flight::InFlightRequests;
pub use pending::PendingSettles;
use routes::{RouteRt, RouteTable};
pub use shared::Shared;

/// The proxy: its routes and what every request shares. Its hooks gather
/// facts and hand the request to [`delivery`] (guarded), [`pass_through`]
/// (read whole, unguarded) or pingora's streaming path.
pub struct Gate {
    pub routes: RouteTable,
    pub shared: Shared,
}

/// Per-request state shared by pingora's hooks.
#[derive(Default)]
pub struct RequestCtx {
    route: Option<Arc<RouteRt>>,
    /// When the request went upstream on pingora's path (unguarded).
    upstream_started: Option<Instant>,
    /// The request's count is settled ([`exit::Counted`]): by the exit
    /// that answered it, or once on pingora's path (`count_unguarded`).
    counted: Option<exit::Counted>,
    /// pingora's path: the request is being sent once more (a kept
    /// connection failed before answering), on a connection of its own.
    retried: bool,
    /// pingora's path: the route's limits let the request through (SPEC
    /// §15); its slot is given back when the context is dropped.
    permit: Option<crate::limits::Permit>,
    /// The request's trace (SPEC §19), from its route on; ended in
    /// `logging`. `None` without tracing.
    trace: Option<crate::otel::RequestTrace>,
    /// pingora's path: the send's CLIENT span.
    send: Option<crate::otel::SendSpan>,
}

impl RequestCtx {
    /// The request was answered on idemgate's own path: its count is
    /// settled by that exit.
    fn answered(&mut self, exit: Exit) -> Result<bool> {
        self.counted = Some(exit.counted);
        exit.handled
    }
}

/// Pool keys for retried requests on pingora's path: each retry gets a new
/// connection (its own pool key), never another kept one. pingora keeps
/// that connection afterwards under its key, unused, until its idle
/// timeout or the pool's size bound lets it go.
static RETRY_POOL: AtomicU64 = AtomicU64::new(1);

#[async_trait]
impl ProxyHttp for Gate {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    /// Phase 1, after the request header: the path's normal form, the route,
    /// and for guarded requests the whole protocol. `Ok(true)` means the
    /// response was written here.
    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        if session.req_header().version < http::Version::HTTP_11 {
            // RFC 9110 §15.2: no 1xx to an HTTP/1.0 client (pingora would
            // relay an upstream's)
            session.set_ignore_info_resp(true);
        }
        let dropped = fields::drop_underscored(session.req_header_mut());
        if dropped > 0 {
            self.shared.metrics.underscore_headers_dropped(dropped);
        }
        let exit = match self.route_request(session, ctx).await {
            Some(exit) => exit,
            None => return self.stream_unguarded(session, ctx).await,
        };
        ctx.answered(exit)
    }

    /// Unguarded requests only: the route's upstream (on a retry, on a
    /// connection of its own).
    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let route = ctx
            .route
            .as_ref()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no route"))?;
        ctx.upstream_started = Some(Instant::now());
        let mut peer = Box::new(route.peer.clone());
        if ctx.retried {
            peer.group_key = RETRY_POOL.fetch_add(1, Ordering::Relaxed);
        }
        Ok(peer)
    }

    /// Unguarded requests only: the path as the upstream expects it, the
    /// hop-by-hop headers dropped ([`hop`]; pingora's own sanitising is off
    /// so that every path drops the same), HTTP/1.1 with a `Host`.
    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let Some(route) = &ctx.route {
            let pq = session
                .req_header()
                .uri
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/");
            let uri: http::Uri = route.upstream_path(pq).parse().map_err(|_| {
                Error::explain(ErrorType::InvalidHTTPHeader, "rewritten path is not a URI")
            })?;
            upstream.set_uri(uri);
            hop::strip_request(upstream);
            // pingora frames the streamed body afresh (chunked unless it has a length)
            upstream.remove_header(&http::header::TRANSFER_ENCODING);
            if session.req_header().version < http::Version::HTTP_11 {
                // an HTTP/1.0 expectation is ignored (RFC 9110 §10.1.1)
                upstream.remove_header(&http::header::EXPECT);
            }
            if !upstream.headers.contains_key(http::header::HOST) {
                upstream
                    .insert_header(http::header::HOST, route.cfg.upstream.host_header.clone())?;
            }
            if let Some(trace) = &ctx.trace {
                let attributes = forward::send_attributes(route, ctx.retried);
                let send = trace.send(None, &upstream.method, attributes);
                forward::put_trace_headers(upstream, &send)?;
                ctx.send = Some(send);
            }
        }
        Ok(())
    }

    /// Unguarded requests only, on pingora's path: the upstream's response
    /// header before it goes to the sender. A 101 is refused (no upgrade is
    /// forwarded), hop-by-hop headers are dropped as on idemgate's own path,
    /// the final answer is counted and marked `Idempotency-Status:
    /// unguarded`.
    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        upstream: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if upstream.status == http::StatusCode::SWITCHING_PROTOCOLS {
            // no upgrade is ever forwarded (hop.rs): a 101 is the upstream's fault
            return Error::e_explain(
                ErrorType::InvalidHTTPHeader,
                "upstream answered 101 Switching Protocols to a request without Upgrade",
            )
            .map_err(|e| e.into_up());
        }
        hop::strip_response(upstream);
        if upstream.status.is_informational() {
            return Ok(()); // an interim answer; the final one is counted
        }
        if let Some(send) = ctx.send.take() {
            send.answered(upstream.status.as_u16());
        }
        self.count_unguarded(ctx, Some(upstream.status.as_u16()), None);
        upstream.insert_header(respond::IDEMPOTENCY_STATUS, Outcome::Unguarded.as_str())?;
        Ok(())
    }

    /// Unguarded requests only, on pingora's path: a kept connection that
    /// failed before any byte of an answer gets the request once more (SPEC
    /// §4), when pingora still holds its body (up to 64 KiB).
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut RequestCtx,
        client_reused: bool,
    ) -> Box<Error> {
        let retry = client_reused
            && !ctx.retried
            && forward::closed_before_answer(&e)
            && !session.as_ref().retry_buffer_truncated();
        if let Some(send) = ctx.send.take() {
            send.failed(e.etype().as_str());
        }
        let mut e = e.more_context(format!("Peer: {peer}"));
        e.set_retry(retry);
        if let (true, Some(route)) = (retry, &ctx.route) {
            ctx.retried = true;
            self.shared.metrics.upstream_retry(route.name());
        }
        e
    }

    /// Unguarded requests only, on pingora's path: the upstream failed
    /// before answering (502, 504), or the sender's streamed body did (408
    /// for a stall past `body_timeout`, 400 for a body that broke off or
    /// was malformed) — answered here while no byte of a response went out.
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        if let Some(send) = ctx.send.take() {
            send.failed(e.etype().as_str());
        }
        let stalled = sender_stalled(session, e);
        // a stall is the sender's: no upstream outcome is counted for it
        self.count_unguarded(ctx, None, (!stalled).then_some(e));
        let Some(kind) = streamed_failure(e, stalled) else {
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        };
        if kind == ProblemKind::BodyTimeout {
            // a 408 closes its connection, as on idemgate's own path
            self.shared
                .metrics
                .connection_closed(crate::metrics::CloseReason::BodyTimeout);
        }
        if let (Some(route), None) = (&ctx.route, session.response_written()) {
            // the detail names nothing of the upstream; the log has it
            tracing::warn!(route = route.name(), upstream = %route.cfg.upstream.original, error = %e, "unguarded request: proxying failed");
            let detail = match kind {
                ProblemKind::UpstreamTimeout | ProblemKind::UpstreamUnreachable => {
                    forward::failure_detail(kind)
                }
                ProblemKind::BodyTimeout => "the request body did not arrive in time",
                ProblemKind::InvalidRequest => {
                    "the chunked framing of the request body is malformed"
                }
                _ => "the request body broke off before its end",
            };
            let p = Problem::new(kind, detail);
            let _ = respond::problem(session, &p, Outcome::Unguarded.as_str(), true).await;
        }
        FailToProxy {
            error_code: kind.status(),
            can_reuse_downstream: false,
        }
    }

    /// Every path, once, after the response: counts the unguarded requests
    /// that neither an upstream answer nor a failure counted.
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        self.count_unguarded(ctx, None, e);
        if let Some(send) = ctx.send.take() {
            send.failed(e.map_or("incomplete", |e| e.etype().as_str()));
        }
        if let Some(trace) = ctx.trace.take() {
            end_trace(trace, session, e, ctx.counted.as_ref());
        }
        if e.is_some_and(|e| {
            e.etype() == &ErrorType::WriteTimedout && e.esource() != &pingora::ErrorSource::Upstream
        }) {
            // the client did not read its response: the connection closes
            self.shared
                .metrics
                .connection_closed(crate::metrics::CloseReason::WriteTimeout);
        }
    }
}

/// The SERVER span's end: the status written, the outcome counted, and
/// for a 5xx or a broken connection what went wrong (`error.type`: the
/// outcome, or pingora's error; a relayed 5xx is its status).
fn end_trace(
    trace: crate::otel::RequestTrace,
    session: &Session,
    e: Option<&Error>,
    counted: Option<&exit::Counted>,
) {
    let status = session.response_written().map(|h| h.status.as_u16());
    let outcome = counted.and_then(exit::Counted::outcome);
    let failure = match (status, outcome, e) {
        (Some(s), Some(o), _)
            if s >= 500 && !matches!(o, Outcome::Forwarded | Outcome::Unguarded) =>
        {
            Some(o.as_str())
        }
        (None, _, Some(e)) => Some(e.etype().as_str()),
        _ => None,
    };
    let label = outcome.map_or("", Outcome::as_str);
    trace.end(status, label, failure);
}

/// What the header fields refuse once the route (if any) is known
/// ([`fields::judge`]): the route's own event-ID header is exempt from the
/// `obs-text` rule (its invalid values are `invalid-event-id`).
fn field_refusal(req: &RequestHeader, route: Option<&RouteRt>) -> Option<Problem> {
    let exempt = || {
        route
            .filter(|r| r.guards(&req.method))
            .and_then(|r| r.cfg.event_id.header_for(&req.headers))
    };
    Some(match fields::judge(req, exempt)? {
        FieldFault::TooLarge => Problem::new(
            ProblemKind::HeadersTooLarge,
            format!("the header section is larger than {MAX_HEADER_SECTION} bytes"),
        ),
        FieldFault::ObsText => Problem::new(
            ProblemKind::InvalidRequest,
            "a header value holds a byte outside ASCII",
        ),
    })
}

/// What a failure on pingora's streaming path is answered with: the
/// sender's (its body, or its stall), else the upstream's (504, 502);
/// `None` when nobody can be answered.
fn streamed_failure(e: &Error, stalled: bool) -> Option<ProblemKind> {
    if e.esource() == &pingora::ErrorSource::Downstream {
        return downstream_failure(e);
    }
    if stalled {
        return Some(ProblemKind::BodyTimeout);
    }
    match e.etype() {
        ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => {
            Some(ProblemKind::UpstreamTimeout)
        }
        _ if e.esource() == &pingora::ErrorSource::Upstream => {
            Some(ProblemKind::UpstreamUnreachable)
        }
        _ => None,
    }
}

/// The request's SERVER span: a child of the sender's `traceparent` on a
/// route that trusts it, else a new root.
fn start_trace(
    tracing: &crate::otel::Tracing,
    req: &RequestHeader,
    route: &RouteRt,
    client: Option<std::net::IpAddr>,
) -> crate::otel::RequestTrace {
    let inbound = if route.cfg.trust_inbound_trace {
        crate::otel::propagation::inbound(&req.headers)
    } else {
        None
    };
    tracing.request(crate::otel::ServerSpan {
        method: &req.method,
        path: req.uri.path(),
        path_prefix: &route.cfg.path_prefix,
        version: req.version,
        route: route.name(),
        client,
        inbound,
    })
}

/// SPEC §22: a client outside the route's `allow_from` (an unknown one
/// too) is refused on its head: nothing read, nothing claimed, no store
/// operation, the connection closed.
fn source_refusal(route: &RouteRt, client: Option<std::net::IpAddr>) -> Option<Refused> {
    let allowed = route.cfg.allow_from.as_ref()?;
    if client.is_some_and(|c| allowed.contains(c)) {
        return None;
    }
    let shown = crate::source::Shown(client);
    tracing::debug!(route = route.name(), client = %shown, "source not allowed");
    let p = Problem::new(
        ProblemKind::SourceNotAllowed,
        "the sender's address is not allowed on this route",
    );
    Some(Refused::new(p).closing(true))
}

/// The upstream's read timed out while the sender's streamed body (or its
/// trailer section) was still incomplete: pingora times the upstream's
/// answer from the last body byte it forwarded, so the sender sent nothing
/// for the route's `upstream_timeout`, and the upstream could not have
/// answered a request it has not got whole (SPEC §12 counts its time from
/// the last byte written). The sender stalled: 408, never 504 (SPEC §4, §9).
fn sender_stalled(session: &mut Session, e: &Error) -> bool {
    e.esource() == &pingora::ErrorSource::Upstream
        && e.etype() == &ErrorType::ReadTimedout
        && !session.is_body_done()
}

/// What a failure of the sender's side of a streamed request is answered
/// with; `None` when the sender cannot be answered (its writes failed).
fn downstream_failure(e: &Error) -> Option<ProblemKind> {
    match e.etype() {
        ErrorType::ReadTimedout => Some(ProblemKind::BodyTimeout),
        ErrorType::WriteTimedout | ErrorType::WriteError => None,
        _ if body::is_framing_error(e) => Some(ProblemKind::InvalidRequest),
        _ => Some(ProblemKind::InvalidBody),
    }
}

impl Gate {
    /// The path's normal form (routes see it, and upstreams get it), the
    /// route, and the request answered on idemgate's own path: guarded
    /// ([`delivery`]), unguarded read whole ([`pass_through`]), or refused.
    /// `None`: an unguarded request for pingora's streaming path.
    async fn route_request(&self, session: &mut Session, ctx: &mut RequestCtx) -> Option<Exit> {
        let shared = &self.shared;
        match crate::path::normal_uri(&session.req_header().uri) {
            Ok(None) => {}
            Ok(Some(uri)) => session.req_header_mut().set_uri(uri),
            Err(e) => {
                let p = Problem::new(ProblemKind::InvalidPath, e.to_string());
                return Some(pass_through::refuse_unrouted(shared, session, p).await);
            }
        }
        let req = session.req_header();
        let host = routes::request_host(req);
        let found = self.routes.find(host.as_deref(), req.uri.path()).cloned();
        if let Some(p) = field_refusal(req, found.as_deref()) {
            let refused = Refused::new(p).closing(true);
            return Some(exit::refuse(shared, session, found.as_deref(), refused).await);
        }
        let Some(route) = found else {
            let p = Problem::new(
                ProblemKind::NoRoute,
                format!("no route matches {}", req.uri.path()),
            );
            return Some(pass_through::refuse_unrouted(shared, session, p).await);
        };
        let client = self.client(session);
        if let Some(tracing) = &shared.tracing {
            ctx.trace = Some(start_trace(tracing, session.req_header(), &route, client));
        }
        if let Some(refused) = source_refusal(&route, client) {
            return Some(exit::refuse(shared, session, Some(&route), refused).await);
        }
        self.answer_routed(session, ctx, route, client).await
    }

    /// The routed request's path, once its source is allowed: guarded,
    /// refused while the route is paused, verified and forwarded, read whole
    /// and forwarded, or (`None`) streamed by pingora.
    async fn answer_routed(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        route: Arc<RouteRt>,
        client: Option<std::net::IpAddr>,
    ) -> Option<Exit> {
        let shared = &self.shared;
        let req = session.req_header();
        let method = &req.method;
        let (guarded, verified) = (route.guards(method), route.verifies(method));
        ctx.route = Some(route.clone());
        if guarded {
            let trace = ctx.trace.as_ref();
            return Some(delivery::run(shared, session, &route, client, trace).await);
        }
        if shared.paused.contains(route.name()) {
            // a paused route forwards nothing (SPEC §14); the body is not read
            let refused = Refused::new(delivery::route_paused(None)).closing(true);
            return Some(exit::refuse(shared, session, Some(&route), refused).await);
        }
        if verified {
            // read, verified, then forwarded unguarded (SPEC §8)
            let trace = ctx.trace.as_ref();
            return Some(pass_through::pass_verified(shared, session, &route, trace).await);
        }
        if body::buffered_pass_through(session) {
            let trace = ctx.trace.as_ref();
            return Some(pass_through::pass_buffered(shared, session, &route, trace).await);
        }
        None
    }

    /// The request's client address (SPEC §22): the TCP peer, or behind a
    /// trusted proxy what its `X-Forwarded-For` says; `None` when that is
    /// unknown (garbage in the chain, or a peer that is no IP address).
    fn client(&self, session: &Session) -> Option<std::net::IpAddr> {
        let peer = session.client_addr()?.as_inet()?.ip();
        let xff = session.req_header().headers.get_all("x-forwarded-for");
        crate::source::client(
            peer,
            &self.shared.trusted_proxies,
            xff.iter().map(|v| v.as_bytes()),
        )
    }

    /// An unguarded request for pingora's streaming path, within the
    /// route's limits (SPEC §15): the context holds its slot to the end
    /// (`Ok(false)`), or it is refused here without its body being read.
    async fn stream_unguarded(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        let Some(route) = ctx.route.clone() else {
            return Error::e_explain(ErrorType::InternalError, "no route");
        };
        match pass_through::within_limits(&route).await {
            Ok(permit) => {
                ctx.permit = permit;
                Ok(false)
            }
            Err(refused) => {
                let refused = refused.closing(true);
                let exit = exit::refuse(&self.shared, session, Some(&route), refused).await;
                ctx.answered(exit)
            }
        }
    }

    /// Counts a request on pingora's streaming path once, unless its count
    /// is settled already ([`exit::count_streamed`]).
    fn count_unguarded(&self, ctx: &mut RequestCtx, status: Option<u16>, failure: Option<&Error>) {
        let Some(route) = &ctx.route else { return };
        let started = ctx.upstream_started;
        ctx.counted.get_or_insert_with(|| {
            exit::count_streamed(&self.shared, route, started, status, failure)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every request's future is allocated (async_trait) and moved whole:
    /// it must not hold the upstream exchange or the relay of an answer
    /// inline (each ~3 to 12 KiB), which are boxed where they run.
    #[tokio::test]
    async fn the_request_filters_future_stays_small() {
        let dir = std::env::temp_dir().join(format!("idemgate-future-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let yaml = format!(
            "listen: \"127.0.0.1:0\"\nadmin_listen: \"127.0.0.1:0\"\nstore:\n  url: \"sqlite://{}/x.db\"\n\
             routes:\n  - name: r\n    match:\n      path_prefix: /\n    upstream: \"http://127.0.0.1:9\"\n\
             \x20   event_id:\n      header: X-Event-ID\n    verify: none\n",
            dir.display()
        );
        let cfg = crate::config::load_str(&yaml, "x.yaml", &|_| None)
            .unwrap()
            .config;
        let store = crate::store::open_url(&cfg.store.url, 1).await.unwrap();
        let metrics = crate::metrics::Metrics::new();
        let reconciler = crate::reconcile::Reconciler::new(
            &cfg.routes,
            store.clone(),
            metrics.clone(),
            "test".into(),
        );
        let gate = Gate {
            routes: RouteTable::new(cfg.routes.clone()).unwrap(),
            shared: Shared {
                store,
                metrics,
                connector: pingora::connectors::http::Connector::new(None),
                in_flight: Default::default(),
                seen: Default::default(),
                paused: Default::default(),
                instance: "test".into(),
                pending: Default::default(),
                trusted_proxies: Default::default(),
                tracing: None,
                reconciler,
            },
        };
        let (stream, _peer) = tokio::io::duplex(64);
        let mut session = Session::new_h1(Box::new(stream));
        let mut ctx = RequestCtx::default();
        let size = std::mem::size_of_val(&*gate.request_filter(&mut session, &mut ctx));
        assert!(size < 6 * 1024, "request_filter's future is {size} bytes");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
