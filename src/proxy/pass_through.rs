//! Requests answered or forwarded without a claim on idemgate's own path
//! (pingora's streaming path takes the rest): those that reach no route,
//! verified requests of unguarded methods, small unguarded bodies read
//! before forwarding, and the guarded path's unguarded fallbacks.

use crate::otel::RequestTrace;
use bytes::Bytes;
use pingora::proxy::Session;

use super::body;
use super::exit::{self, Ending, Exit, Refused, Relay, Verdict};
use super::forward::Upstream;
use super::routes::RouteRt;
use super::shared::Shared;
use super::steps;
use crate::limits::Permit;
use crate::metrics::Outcome;
use crate::problem::{upstream_refusal, Problem};

/// A request that reaches no route (no match, or a path with no normal
/// form): counted with `route=""`. The path decides it, so a sender
/// waiting for `100 Continue` gets the answer at once, on a connection
/// that closes; otherwise the body is read and dropped.
pub async fn refuse_unrouted(shared: &Shared, session: &mut Session, p: Problem) -> Exit {
    let close = body::expects_continue(session.req_header())
        || body::read_full(session, 1 << 20).await.is_err();
    exit::refuse(shared, session, None, Refused::new(p).closing(close)).await
}

/// A request of a method the route does not guard, on a route with
/// `verify` (SPEC §8: every method is verified but `unverified_methods`):
/// read whole (bounded by `max_body`), verified, then forwarded
/// unguarded. A forged one gets 401 and reaches nothing.
pub async fn pass_verified(
    shared: &Shared,
    session: &mut Session,
    route: &RouteRt,
    trace: Option<&RequestTrace>,
) -> Exit {
    let ending = verified(shared, session, route, trace).await;
    exit::answer(shared, session, route, ending, None).await
}

async fn verified(
    shared: &Shared,
    session: &mut Session,
    route: &RouteRt,
    trace: Option<&RequestTrace>,
) -> Ending {
    steps::check_declared_length(session, route.cfg.max_body)?;
    steps::send_continue(session, body::expects_continue(session.req_header())).await?;
    // as on the guarded path: 408 for a body late past body_timeout
    let body = steps::read_body(session, route).await?;
    steps::check_signature(session, route, &body, None, trace)?;
    Box::pin(forward(shared, session, route, body, trace, false)).await
}

/// An unguarded request whose body is read before it is forwarded
/// ([`body::buffered_pass_through`]): it goes out as guarded requests
/// do, header and body in one write on one of the route's kept
/// connections. No claim and no log line, as on pingora's path.
pub async fn pass_buffered(
    shared: &Shared,
    session: &mut Session,
    route: &RouteRt,
    trace: Option<&RequestTrace>,
) -> Exit {
    let ending = match body::read_full(session, body::BUFFERED_PASS_LIMIT).await {
        // boxed: inline, the exchange (~12 KiB) made the request
        // filter's future that large for every request, guarded
        // ones waiting for their body included
        Ok(body) => Box::pin(forward(shared, session, route, body, trace, false)).await,
        Err(e) => {
            let p = Problem::new(e.invalid_kind(), e.invalid_detail());
            Err(Refused::new(p).unguarded().closing(true).into())
        }
    };
    exit::answer(shared, session, route, ending, None).await
}

/// Admits an unguarded request against the route's upstream concurrency
/// and rate (SPEC §15; not the breaker, which is the deliveries'),
/// waiting up to `upstream_wait`: the permit to hold while it is
/// forwarded, or its 503 `upstream-saturated`.
pub async fn within_limits(route: &RouteRt) -> Result<Option<Permit>, Refused> {
    route
        .limits
        .admit_waiting(false)
        .await
        .map_err(|r| Refused::new(upstream_refusal(r, None)))
}

/// Forwards a request whose body was read, without a claim (unguarded
/// requests read whole, `on_missing_id: forward`, `on_store_error:
/// forward`), within the route's limits ([`within_limits`]) unless the
/// caller holds a permit already (`permit_held`: a delivery whose store
/// failed after its claim was admitted).
pub async fn forward(
    shared: &Shared,
    session: &mut Session,
    route: &RouteRt,
    body: Bytes,
    trace: Option<&RequestTrace>,
    permit_held: bool,
) -> Ending {
    let _permit = if permit_held {
        None
    } else {
        within_limits(route).await?
    };
    let upstream = Upstream::of(shared, route).traced(trace, None);
    let req = upstream.request(session, body.len(), None)?;
    match upstream.exchange(req, body, false).await {
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
