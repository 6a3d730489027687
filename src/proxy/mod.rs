//! The pingora side: one `ProxyHttp` implementation whose hooks gather facts
//! and call plain functions. Guarded requests are decided and forwarded in
//! `request_filter` (read body → verify → claim → forward → settle → answer);
//! so are unguarded requests with a small body of known length (read, then
//! forwarded as a guarded request is, without the claim); other unguarded
//! requests (chunked or large bodies, upgrades) take pingora's streaming
//! proxy path.
//!
//! Every request read whole comes to one ending (`exit.rs`'s `Verdict`: a
//! replay, an upstream answer to relay, or a problem), which one exit counts
//! and writes; `delivery/` is the guarded path (its policies are
//! `claim::policy`'s), `pass_through.rs` the unguarded ones read whole.

pub mod body;
mod delivery;
mod exit;
mod fields;
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

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorType, Result};

use crate::metrics::{status_class, Outcome};
use crate::problem::{Problem, ProblemKind};
use exit::Refused;
pub use in_flight::InFlightRequests;
pub use pending::PendingSettles;
use routes::{RouteRt, RouteTable};
pub use shared::Shared;

pub use fields::MAX_HEADER_SECTION;

/// The proxy: its routes and what every request shares. Its hooks gather
/// facts and hand the request to [`delivery`] (guarded), [`pass_through`]
/// (read whole, unguarded) or pingora's streaming path.
pub struct Gate {
    pub routes: RouteTable,
    pub shared: Shared,
}

/// Per-request state shared by the hooks.
#[derive(Default)]
pub struct Ctx {
    route: Option<Arc<RouteRt>>,
    /// When the request went upstream on pingora's path (unguarded).
    upstream_started: Option<Instant>,
    /// The unguarded request is counted already (see `count_unguarded`).
    counted: bool,
    /// pingora's path: the request is being sent once more (a kept
    /// connection failed before answering), on a connection of its own.
    retried: bool,
    /// pingora's path: the route's limits let the request through (SPEC
    /// §15); its slot is given back when the context is dropped.
    permit: Option<crate::limits::Permit>,
}

/// Pool keys for retried requests on pingora's path: each retry gets a new
/// connection (its own pool key), never another kept one. pingora keeps
/// that connection afterwards under its key, unused, until its idle
/// timeout or the pool's size bound lets it go.
static RETRY_POOL: AtomicU64 = AtomicU64::new(1);

#[async_trait]
impl ProxyHttp for Gate {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::default()
    }

    /// Phase 1, after the request header: the path's normal form, the route,
    /// and for guarded requests the whole protocol. `Ok(true)` means the
    /// response was written here.
    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        if session.req_header().version < http::Version::HTTP_11 {
            // RFC 9110 §15.2: no 1xx to an HTTP/1.0 client (pingora would
            // relay an upstream's)
            session.set_ignore_info_resp(true);
        }
        let dropped = fields::drop_underscored(session.req_header_mut());
        if dropped > 0 {
            self.shared.metrics.underscore_headers_dropped(dropped);
        }
        // Routes see, and upstreams get, the normal form of the path (the
        // common, already normal path costs a scan and no allocation).
        let changed = match crate::path::normalise(session.req_header().uri.path()) {
            Ok(Cow::Borrowed(_)) => None,
            Ok(Cow::Owned(normal)) => Some(normal),
            Err(e) => {
                let p = Problem::new(ProblemKind::InvalidPath, e.to_string());
                return pass_through::refuse_unrouted(&self.shared, session, p).await;
            }
        };
        if let Some(normal) = changed {
            let req = session.req_header_mut();
            let pq = match req.uri.query() {
                Some(q) => format!("{normal}?{q}"),
                None => normal,
            };
            match pq.parse::<http::Uri>() {
                Ok(uri) => req.set_uri(uri),
                Err(_) => {
                    let p = Problem::new(ProblemKind::InvalidPath, "the path is not a valid URI");
                    return pass_through::refuse_unrouted(&self.shared, session, p).await;
                }
            }
        }
        let req = session.req_header();
        let host = routes::request_host(req);
        let found = self.routes.find(host.as_deref(), req.uri.path()).cloned();
        if let Some(p) = fields::refusal(req, found.as_deref()) {
            let refused = Refused::new(p).closing(true);
            return exit::refuse(&self.shared, session, found.as_deref(), refused).await;
        }
        let Some(route) = found else {
            let p = Problem::new(
                ProblemKind::NoRoute,
                format!("no route matches {}", req.uri.path()),
            );
            return pass_through::refuse_unrouted(&self.shared, session, p).await;
        };
        let method = &req.method;
        let guarded = route.guards(method);
        let verified = route.verifies(method);
        ctx.route = Some(route.clone());
        if !guarded && self.shared.paused.contains(route.name()) {
            // a paused route forwards nothing (SPEC §14); the body is not read
            let p = delivery::route_paused(None);
            let refused = Refused::new(p).closing(true);
            ctx.counted = true; // as `paused`, not once more as unguarded
            return exit::refuse(&self.shared, session, Some(&route), refused).await;
        }
        if !guarded {
            if verified {
                // read, verified, then forwarded unguarded (SPEC §8)
                ctx.counted = true;
                return pass_through::pass_verified(&self.shared, session, &route).await;
            }
            if body::buffered_pass_through(session) {
                ctx.counted = true; // counted where it is forwarded
                return pass_through::pass_buffered(&self.shared, session, &route).await;
            }
            return self.stream_unguarded(session, ctx, &route).await;
        }
        delivery::run(&self.shared, session, &route).await
    }

    /// Unguarded requests only: the route's upstream (on a retry, on a
    /// connection of its own).
    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
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
        ctx: &mut Ctx,
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
        session: &mut Session,
        upstream: &mut ResponseHeader,
        ctx: &mut Ctx,
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
        self.count_unguarded(session, ctx, Some(upstream.status.as_u16()), None);
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
        ctx: &mut Ctx,
        client_reused: bool,
    ) -> Box<Error> {
        let retry = client_reused
            && !ctx.retried
            && forward::closed_before_answer(&e)
            && !session.as_ref().retry_buffer_truncated();
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
    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        self.count_unguarded(session, ctx, None, Some(e));
        let from_upstream = e.esource() == &pingora::ErrorSource::Upstream;
        let kind = if e.esource() == &pingora::ErrorSource::Downstream {
            downstream_failure(e)
        } else {
            match e.etype() {
                ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => {
                    Some(ProblemKind::UpstreamTimeout)
                }
                _ if from_upstream => Some(ProblemKind::UpstreamUnreachable),
                _ => None,
            }
        };
        let Some(kind) = kind else {
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
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        self.count_unguarded(session, ctx, None, e);
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
    /// An unguarded request for pingora's streaming path, within the
    /// route's limits (SPEC §15): the context holds its slot to the end
    /// (`Ok(false)`), or it is refused here without its body being read.
    async fn stream_unguarded(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        route: &RouteRt,
    ) -> Result<bool> {
        match pass_through::admit(route).await {
            Ok(permit) => {
                ctx.permit = permit;
                Ok(false)
            }
            Err(refused) => {
                ctx.counted = true;
                let refused = refused.closing(true);
                exit::refuse(&self.shared, session, Some(route), refused).await
            }
        }
    }

    /// Counts an unguarded request once, as soon as its outcome is known and
    /// before its answer goes out: a sender that reads `/metrics` right after
    /// its answer finds it counted. `status` is the upstream's answer; else
    /// `failure` says what broke, if anything did.
    fn count_unguarded(
        &self,
        session: &Session,
        ctx: &mut Ctx,
        status: Option<u16>,
        failure: Option<&Error>,
    ) {
        let Some(route) = &ctx.route else { return };
        if ctx.counted || route.guards(&session.req_header().method) {
            return; // guarded requests were counted where they were decided
        }
        ctx.counted = true;
        let name = route.name();
        let metrics = &self.shared.metrics;
        metrics.route_request(&route.requests, name, Outcome::Unguarded);
        let class = match (status, failure) {
            (Some(s), _) => status_class(s),
            (None, Some(e))
                if e.esource() != &pingora::ErrorSource::Downstream
                    && matches!(
                        e.etype(),
                        ErrorType::ConnectTimedout
                            | ErrorType::ReadTimedout
                            | ErrorType::WriteTimedout
                    ) =>
            {
                "timeout"
            }
            // the sender's side failed: no upstream outcome to count
            (None, Some(e)) if e.esource() == &pingora::ErrorSource::Downstream => return,
            (None, Some(_)) => "connect_error",
            (None, None) => return,
        };
        metrics.upstream_outcome(name, class);
        if let Some(t) = ctx.upstream_started {
            metrics.upstream_time(name, t.elapsed());
        }
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
        let gate = Gate {
            routes: RouteTable::new(cfg.routes.clone()).unwrap(),
            shared: Shared {
                store,
                metrics: crate::metrics::Metrics::new(),
                connector: pingora::connectors::http::Connector::new(None),
                in_flight: Default::default(),
                seen: Default::default(),
                paused: Default::default(),
                instance: "test".into(),
                pending: Default::default(),
            },
        };
        let (stream, _peer) = tokio::io::duplex(64);
        let mut session = Session::new_h1(Box::new(stream));
        let mut ctx = Ctx::default();
        let size = std::mem::size_of_val(&*gate.request_filter(&mut session, &mut ctx));
        assert!(size < 6 * 1024, "request_filter's future is {size} bytes");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
