//! The guarded path, from the header to the answer: what the headers
//! decide, the whole body (bounded), the signature, the event ID and
//! digest ([`admit`]); then one [`Delivery`] claims, forwards and settles.
//! What it does without an event ID, without the store, and with a
//! duplicate in flight is [`crate::claim::policy`]'s to say. Its ending goes to the one
//! exit ([`exit::answer`]), which counts, writes and logs it.

mod claim;
mod deliver;
mod event;
mod key;
mod settle;

use std::time::Instant;

use bytes::Bytes;
use pingora::proxy::Session;

use super::body::{self, BodyError};
use super::exit::{self, Handled, LogLine, Refused};
use super::pass_through;
use super::routes::RouteRt;
use super::shared::Shared;
use super::steps;
use crate::claim::digest;
use crate::claim::policy::Key;
use crate::config::DigestMode;
use crate::metrics::CloseReason;
use crate::problem::{Problem, ProblemKind};
pub use claim::route_paused;
use event::Delivery;
use key::{header_key, json_body, json_key};

/// A guarded request, from the header to the answer.
pub async fn run(shared: &Shared, session: &mut Session, route: &RouteRt) -> Handled {
    let started = Instant::now();
    // Counted from the start: a claim may commit before the answer is written.
    let _busy = shared.in_flight.enter();
    let (ending, delivery) = match admit(shared, session, route).await {
        Ok(Admitted::Claim {
            event_id,
            digest,
            body,
        }) => {
            let mut delivery = Delivery::new(shared, route, event_id, digest);
            (delivery.deliver(session, body).await, Some(delivery))
        }
        Ok(Admitted::Unguarded(body)) => {
            let forwarded = Box::pin(pass_through::forward_admitted(shared, session, route, body));
            (forwarded.await, None)
        }
        Err(stop) => (Err(stop), None),
    };
    let log = LogLine {
        started,
        event_id: delivery.as_ref().map(|d| d.event_id.as_str()),
        attempt: delivery.as_ref().and_then(|d| d.attempt),
    };
    exit::answer(shared, session, route, ending, Some(log)).await
}

/// What the request comes to before the store is asked.
enum Admitted {
    /// To claim, under its event ID (the digest's hex without one).
    Claim {
        event_id: String,
        digest: String,
        body: Bytes,
    },
    /// To forward without a claim (`on_missing_id: forward`).
    Unguarded(Bytes),
}

/// Steps 1 to 4 of a guarded request: what the headers alone decide, the
/// whole body, the signature on the raw body (before anything is
/// claimed), then the event ID and digest.
async fn admit(
    shared: &Shared,
    session: &mut Session,
    route: &RouteRt,
) -> Result<Admitted, exit::Stop> {
    let cfg = &route.cfg;
    let expect_continue = body::expects_continue(session);
    steps::check_declared_length(session, cfg.max_body)?;
    let header_key = match header_key(session, route) {
        Ok(key) => key,
        Err(p) => {
            let r = refuse_before_body(shared, session, p, expect_continue, cfg.max_body);
            return Err(r.await.into());
        }
    };
    steps::send_continue(session, expect_continue).await?;
    let body = steps::read_body(session, route).await?;
    let header_id = match &header_key {
        Some(Key::EventId(id)) => Some(id.as_str()),
        _ => None,
    };
    steps::check_signature(session, route, &body, header_id)?;
    let json = json_body(route, &body, header_id)?;
    let key = match header_key {
        Some(key) => key,
        None => json_key(route, &session.req_header().headers, json.as_ref())?,
    };
    let id = match key {
        Key::EventId(id) => Some(id),
        Key::Digest => None,
        Key::Unguarded => return Ok(Admitted::Unguarded(body)),
        Key::Missing => {
            let p = Problem::new(
                ProblemKind::MissingEventId,
                "the request has no event ID where the route reads it (a JSON pointer, or a part)",
            );
            return Err(Refused::new(p).into());
        }
    };
    let digest = match (&json, cfg.digest) {
        (Some(doc), DigestMode::Json) => digest::json_digest(doc, &cfg.digest_ignore),
        _ => digest::raw_digest(&body),
    };
    let digest = digest::to_hex(&digest);
    let event_id = id.unwrap_or_else(|| digest.clone());
    Ok(Admitted::Claim {
        event_id,
        digest,
        body,
    })
}

/// A refusal decided from the headers alone. With `Expect: 100-continue`
/// the body never comes: answer at once and close. Otherwise read and
/// discard the body so the connection stays usable.
async fn refuse_before_body(
    shared: &Shared,
    session: &mut Session,
    p: Problem,
    expect_continue: bool,
    max_body: u64,
) -> Refused {
    let close = expect_continue || {
        let drained = body::read_full(session, max_body).await;
        if matches!(drained, Err(BodyError::Timeout)) {
            shared.metrics.connection_closed(CloseReason::BodyTimeout);
        }
        drained.is_err()
    };
    Refused::new(p).closing(close)
}
