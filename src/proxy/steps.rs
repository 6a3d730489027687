//! The steps both paths that read a request whole share, as free
//! functions: the declared length, `100 Continue`, the bounded body read,
//! the signature check, the upstream request and the exchange with the
//! upstream.

use bytes::Bytes;
use pingora::http::RequestHeader;
use pingora::proxy::Session;

use super::body::{self, BodyError};
use super::exit::Refused;
use super::forward::{self, Answered, UpstreamFailure};
use super::routes::RouteRt;
use super::shared::Shared;
use crate::claim::now_ms;
use crate::problem::{Problem, ProblemKind};

/// A declared `Content-Length` over `max_body`: refused before the body.
pub fn check_declared_length(session: &Session, max_body: u64) -> Result<(), Refused> {
    match body::content_length(session) {
        Some(n) if n > max_body => Err(Refused::too_large(max_body)),
        _ => Ok(()),
    }
}

/// Answers `Expect: 100-continue` when the sender waits for it.
pub async fn send_continue(session: &mut Session, expect_continue: bool) -> pingora::Result<()> {
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

/// The whole body, bounded by the route's `max_body`: too large is 413, a
/// body late past `body_timeout` 408, broken framing 400 (the last two
/// close the connection: its stream is unusable).
pub async fn read_body(session: &mut Session, route: &RouteRt) -> Result<Bytes, Refused> {
    let max_body = route.cfg.max_body;
    body::read_full(session, max_body).await.map_err(|e| {
        if let BodyError::Broken(cause) = &e {
            tracing::debug!(route = route.name(), error = %cause, "unreadable request body");
        }
        match e {
            BodyError::TooLarge => Refused::too_large(max_body),
            e => Refused::new(Problem::new(e.invalid_kind(), e.invalid_detail())).closing(true),
        }
    })
}

/// The route's signature check on the raw body, if it has one (401
/// naming `event_id`, when known).
pub fn check_signature(
    session: &Session,
    route: &RouteRt,
    body: &[u8],
    event_id: Option<&str>,
) -> Result<(), Refused> {
    let Some(v) = &route.cfg.verify else {
        return Ok(());
    };
    let now_secs = (now_ms() / 1000) as i64;
    v.verify_with_id(&session.req_header().headers, body, event_id, now_secs)
        .map_err(|e| {
            let p = Problem::new(ProblemKind::InvalidSignature, e.to_string());
            Refused::new(p.with_event_id(event_id))
        })
}

/// The request as the route's upstream gets it ([`forward::upstream_request`]).
pub fn upstream_request(
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

/// Sends `req` and `body` to the route's upstream and waits for its
/// answer (see [`forward::exchange`]; `hold`: never send it again once its
/// last byte was written); counts the answer, or the failure.
pub async fn exchange(
    shared: &Shared,
    route: &RouteRt,
    req: RequestHeader,
    body: Bytes,
    hold: bool,
) -> Result<Answered, UpstreamFailure> {
    let name = route.name();
    let metrics = &shared.metrics;
    let upstream = forward::Upstream {
        connector: &shared.connector,
        idle: &route.idle,
        peer: &route.peer,
        timeout: route.cfg.upstream_timeout,
    };
    let exchanged =
        forward::exchange(upstream, req, body, hold, &|| metrics.upstream_retry(name)).await;
    match &exchanged {
        Ok(answered) => {
            metrics.upstream_answered(name, answered.header.status.as_u16(), answered.elapsed)
        }
        Err(failure) => metrics.upstream_outcome(name, failure.class()),
    }
    exchanged
}
