//! Requests answered or forwarded without a claim, on idemgate's own path
//! (pingora's streaming path takes the rest): those that reach no route,
//! verified requests of unguarded methods, small unguarded bodies read
//! before forwarding, and the guard's unguarded fallbacks. Also the steps
//! the guard shares with them: the body's limits, `100 Continue`, the
//! signature, and the exchange with the upstream.

use std::sync::Arc;

use bytes::Bytes;
use pingora::http::RequestHeader;
use pingora::proxy::Session;

use super::body;
use super::forward::{self, Answered, UpstreamFailure};
use super::routes::RouteRt;
use super::verdict::{Ending, Handled, Refused, Relay, Verdict};
use super::Gate;
use crate::claim::now_ms;
use crate::metrics::Outcome;
use crate::problem::{Problem, ProblemKind};

impl Gate {
    /// A request that reaches no route (no match, or a path with no normal
    /// form): counted with `route=""`. The path decides it, so a sender
    /// waiting for `100 Continue` gets the answer at once, on a connection
    /// that closes; otherwise the body is read and dropped.
    pub(super) async fn refuse_unrouted(&self, session: &mut Session, p: Problem) -> Handled {
        let close =
            body::expects_continue(session) || body::read_full(session, 1 << 20).await.is_err();
        self.refuse(session, None, Refused::new(p).closing(close))
            .await
    }

    /// A request of a method the route does not guard, on a route with
    /// `verify` (SPEC §8: every method is verified but `unverified_methods`):
    /// read whole (bounded by `max_body`), verified, then forwarded
    /// unguarded. A forged one gets 401 and reaches nothing.
    pub(super) async fn pass_verified(
        &self,
        session: &mut Session,
        route: &Arc<RouteRt>,
    ) -> Handled {
        let ending = self.verified(session, route).await;
        self.answer(session, route, ending).await
    }

    async fn verified(&self, session: &mut Session, route: &Arc<RouteRt>) -> Ending {
        let max_body = route.cfg.max_body;
        check_declared_length(session, max_body)?;
        send_continue(session, body::expects_continue(session)).await?;
        let body = body::read_full(session, max_body)
            .await
            // as on the guarded path: 408 for a body late past body_timeout
            .map_err(|e| super::guard::body_refused(e, max_body, route.name()))?;
        check_signature(session, route, &body, None)?;
        Box::pin(self.forward_unguarded(session, route, body)).await
    }

    /// An unguarded request whose body is read before it is forwarded
    /// ([`body::buffered_pass_through`]): it goes out as guarded requests
    /// do, header and body in one write on one of the route's kept
    /// connections. No claim and no log line, as on pingora's path.
    pub(super) async fn pass_buffered(
        &self,
        session: &mut Session,
        route: &Arc<RouteRt>,
    ) -> Handled {
        let ending = match body::read_full(session, body::BUFFERED_PASS_LIMIT).await {
            // boxed: inline, the exchange (~12 KiB) made the request
            // filter's future that large for every request, guarded
            // ones waiting for their body included
            Ok(body) => Box::pin(self.forward_unguarded(session, route, body)).await,
            Err(e) => {
                let p = Problem::new(e.invalid_kind(), e.invalid_detail());
                Err(Refused::new(p).unguarded().closing(true).into())
            }
        };
        self.answer(session, route, ending).await
    }

    /// Forwards a request whose body was read, without a claim (unguarded
    /// requests read whole, `on_missing_id: forward`, `on_store_error:
    /// forward`).
    pub(super) async fn forward_unguarded(
        &self,
        session: &mut Session,
        route: &Arc<RouteRt>,
        body: Bytes,
    ) -> Ending {
        let req = upstream_request(session, route, body.len(), None)?;
        match self.exchange(route, req, body).await {
            Ok(answered) => Ok(Verdict::Relay(Relay {
                answered,
                prefix: None,
                outcome: Outcome::Unguarded,
            })),
            Err(failure) => {
                tracing::warn!(
                    route = route.name(),
                    upstream = %route.cfg.upstream.original,
                    error = ?failure,
                    "unguarded request: upstream failed"
                );
                Err(Refused::upstream_failed(&failure, None).unguarded().into())
            }
        }
    }

    /// Sends `req` and `body` to the route's upstream and waits for its
    /// answer (see [`forward::exchange`]); counts the answer, or the failure.
    pub(super) async fn exchange(
        &self,
        route: &RouteRt,
        req: RequestHeader,
        body: Bytes,
    ) -> Result<Answered, UpstreamFailure> {
        let name = route.name();
        let exchanged = forward::exchange(
            &self.connector,
            &route.idle,
            &route.peer,
            req,
            body,
            route.cfg.upstream_timeout,
            &|| self.metrics.upstream_retry(name),
        )
        .await;
        match &exchanged {
            Ok(answered) => self.metrics.upstream_answered(
                name,
                answered.header.status.as_u16(),
                answered.elapsed,
            ),
            Err(failure) => self
                .metrics
                .upstream_responses
                .with_label_values(&[name, failure.class()])
                .inc(),
        }
        exchanged
    }
}

/// A declared `Content-Length` over `max_body`: refused before the body.
pub(super) fn check_declared_length(session: &Session, max_body: u64) -> Result<(), Refused> {
    match body::content_length(session) {
        Some(n) if n > max_body => Err(Refused::too_large(max_body)),
        _ => Ok(()),
    }
}

/// Answers `Expect: 100-continue` when the sender waits for it.
pub(super) async fn send_continue(
    session: &mut Session,
    expect_continue: bool,
) -> pingora::Result<()> {
    if expect_continue {
        // pingora turns keep-alive off for any response header written
        // before the body was read, a 100 included; only the final
        // answer should decide that.
        session.set_close_on_response_before_downstream_finish(false);
        session.write_continue_response().await?;
        session.set_close_on_response_before_downstream_finish(true);
    }
    Ok(())
}

/// The route's signature check on the raw body, if it has one (401
/// naming `event_id`, when known).
pub(super) fn check_signature(
    session: &Session,
    route: &RouteRt,
    body: &[u8],
    event_id: Option<&str>,
) -> Result<(), Refused> {
    let Some(v) = &route.cfg.verify else {
        return Ok(());
    };
    let now_secs = (now_ms() / 1000) as i64;
    v.verify(&session.req_header().headers, body, now_secs)
        .map_err(|e| {
            let p = Problem::new(ProblemKind::InvalidSignature, e.to_string());
            Refused::new(p.with_event_id(event_id))
        })
}

/// The request as the route's upstream gets it ([`forward::upstream_request`]).
pub(super) fn upstream_request(
    session: &Session,
    route: &RouteRt,
    body_len: usize,
    key: Option<(&http::HeaderName, &str)>,
) -> pingora::Result<RequestHeader> {
    let original = session.req_header();
    let pq = original
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    forward::upstream_request(
        original,
        &route.upstream_path(pq),
        body_len,
        key,
        &route.cfg.upstream.host_header,
    )
}
