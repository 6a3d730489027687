//! The guarded path, from the header to the answer: what the headers
//! decide, the whole body (bounded), the signature, the event ID and
//! digest ([`intake`]); then one [`Delivery`] claims, forwards and settles.
//! `Delivery` is declared here; each file beside this one holds one of its
//! impl blocks: `claim.rs` (the claim, within the route's limits),
//! `deliver.rs` (forward and the upstream's answer), `settle.rs`.
//! What it does without an event ID, without the store, and with a
//! duplicate in flight is [`crate::claim::policy`]'s to say. Its ending goes to the one
//! exit ([`exit::answer`]), which counts, writes and logs it.

mod claim;
mod deliver;
mod key;
mod refused;
mod settle;

use std::time::Instant;

use bytes::Bytes;
use pingora::proxy::Session;

use super::body::{self, BodyError};
use super::exit::{self, Exit, LogLine, Refused};
use super::pass_through;
use super::routes::RouteRt;
use super::shared::Shared;
use super::steps;
use crate::claim::policy::Key;
use crate::claim::{digest, Millis};
use crate::config::DigestMode;
use crate::limits::Permit;
use crate::metrics::CloseReason;
use crate::otel::RequestTrace;
use crate::problem::{Problem, ProblemKind};
use crate::store::TraceRef;
use key::{header_key, json_body, json_key};
use opentelemetry::KeyValue;
pub use refused::route_paused;

/// A guarded request, from the header to the answer.
pub async fn run(
    shared: &Shared,
    session: &mut Session,
    route: &RouteRt,
    client: Option<std::net::IpAddr>,
    trace: Option<&RequestTrace>,
) -> Exit {
    let started = Instant::now();
    // Counted from the start: a claim may commit before the answer is written.
    let _busy = shared.in_flight.enter();
    let (ending, delivery) = match intake(shared, session, route, trace).await {
        Ok(Intake::Claim {
            event_id,
            digest,
            body,
        }) => {
            let mut delivery = Delivery::new(shared, route, event_id, digest, trace);
            (delivery.deliver(session, body).await, Some(delivery))
        }
        Ok(Intake::Unguarded(body)) => {
            let forwarded = pass_through::forward(shared, session, route, body, trace, false);
            (Box::pin(forwarded).await, None)
        }
        Err(stop) => (Err(stop), None),
    };
    let log = LogLine {
        started,
        event_id: delivery.as_ref().map(|d| d.event_id.as_str()),
        attempt: delivery.as_ref().and_then(|d| d.attempt),
        client,
        trace,
    };
    exit::answer(shared, session, route, ending, Some(log)).await
}

/// A guarded request with its event ID, from the claim to the settle.
pub struct Delivery<'a> {
    shared: &'a Shared,
    route: &'a RouteRt,
    event_id: String,
    /// The body's digest, hex: what a duplicate must match.
    digest: String,
    /// Set once this delivery holds the claim.
    attempt: Option<i64>,
    /// When the claim was taken: the attempt's start in its record.
    started_at: Millis,
    /// The route's limits let this delivery through (SPEC §15): its slot
    /// (and half-open probe) until the delivery is dropped, on every exit.
    permit: Option<Permit>,
    /// When the claim's lease ends, as the store recorded it.
    lease_until: Millis,
    /// The request's trace (SPEC §19), if traced.
    trace: Option<&'a RequestTrace>,
    /// The first send's trace and span ID, chosen before the claim so that
    /// the record keeps them (`None` unless the trace is recorded).
    planned_send: Option<TraceRef>,
    /// The record's send this request's span links to already.
    linked: Option<TraceRef>,
}

// ---- Delivery: its start (the claim, forward and settle are in the files beside)

impl<'a> Delivery<'a> {
    pub fn new(
        shared: &'a Shared,
        route: &'a RouteRt,
        event_id: String,
        digest: String,
        trace: Option<&'a RequestTrace>,
    ) -> Self {
        Delivery {
            shared,
            route,
            event_id,
            digest,
            attempt: None,
            started_at: 0,
            permit: None,
            lease_until: 0,
            planned_send: trace.and_then(RequestTrace::plan_send),
            linked: None,
            trace,
        }
    }
}

/// What the request comes to before the store is asked.
enum Intake {
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
async fn intake(
    shared: &Shared,
    session: &mut Session,
    route: &RouteRt,
    trace: Option<&RequestTrace>,
) -> Result<Intake, exit::Stop> {
    let cfg = &route.cfg;
    let expect_continue = body::expects_continue(session.req_header());
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
    if let (Some(t), Some(id)) = (trace, header_id) {
        // known before the signature: a 401 names it too
        t.set(KeyValue::new("idemgate.event_id", id.to_owned()));
    }
    let named = header_id.is_some();
    steps::check_signature(session, route, &body, header_id, trace)?;
    let json = json_body(route, &body, header_id)?;
    let key = match header_key {
        Some(key) => key,
        None => json_key(route, &session.req_header().headers, json.as_ref())?,
    };
    let id = match key {
        Key::EventId(id) => Some(id),
        Key::Digest => None,
        Key::Unguarded => return Ok(Intake::Unguarded(body)),
        Key::Missing => {
            let p = Problem::new(
                ProblemKind::MissingEventId,
                "the request has no event ID where the route reads it (a JSON pointer, or a part)",
            );
            return Err(Refused::new(p).into());
        }
    };
    let digest = body_digest(route, json.as_ref(), &body);
    let event_id = id.unwrap_or_else(|| digest.clone());
    if let (Some(t), false) = (trace, named) {
        t.set(KeyValue::new("idemgate.event_id", event_id.clone()));
    }
    Ok(Intake::Claim {
        event_id,
        digest,
        body,
    })
}

/// The body's digest, hex, as the route takes it: of the canonical JSON
/// (`digest: json`, less `digest_ignore`) or of the raw bytes.
fn body_digest(route: &RouteRt, json: Option<&serde_json::Value>, body: &[u8]) -> String {
    let cfg = &route.cfg;
    let digest = match (json, cfg.digest) {
        (Some(doc), DigestMode::Json) => digest::json_digest(doc, &cfg.digest_ignore),
        _ => digest::raw_digest(body),
    };
    digest::to_hex(&digest)
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
