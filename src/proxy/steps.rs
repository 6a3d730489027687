//! The intake steps both paths that read a request whole share, as free
//! functions: the declared length, `100 Continue`, the bounded body read,
//! the signature check. The upstream request and exchange are the route's
//! upstream's ([`super::forward::Upstream`]).

use bytes::Bytes;
use pingora::proxy::Session;

use super::body::{self, BodyError};
use super::exit::Refused;
use super::routes::RouteRt;
use crate::claim::now_ms;
use crate::otel::RequestTrace;
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
    trace: Option<&RequestTrace>,
) -> Result<(), Refused> {
    let Some(v) = &route.cfg.verify else {
        return Ok(());
    };
    let now_secs = (now_ms() / 1000) as i64;
    let span = trace.map(|t| t.child("idemgate.verify", Vec::new()));
    let checked = v.verify_with_id(&session.req_header().headers, body, event_id, now_secs);
    if let Some(mut span) = span {
        crate::otel::verified(&mut span, checked.is_ok());
    }
    checked.map_err(|e| {
        let p = Problem::new(ProblemKind::InvalidSignature, e.to_string());
        Refused::new(p.with_event_id(event_id))
    })
}
