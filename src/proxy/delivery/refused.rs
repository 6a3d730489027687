//! The problems the claim step answers with: a duplicate in flight, an
//! event whose outcome is unknown, a paused route, a reused ID.

use crate::claim::policy::{self, Busy, InFlightRefusal};
use crate::problem::{Problem, ProblemKind};

/// 409: another delivery of this event holds its claim, and why this one
/// was not held until it settled.
pub fn in_flight(event_id: &str, r: InFlightRefusal) -> Problem {
    let why = match r.why {
        Busy::Conflict => "",
        Busy::TooManyWaiting => " (too many deliveries of this route are already waiting)",
        Busy::LeaseRanOut => " (its lease ran out while this delivery waited)",
        Busy::HandingOver => " (this process is handing over to a new one: retry then)",
    };
    Problem::new(
        ProblemKind::InFlight,
        format!("another delivery of this event is being processed{why}"),
    )
    .with_event_id(Some(event_id))
    .with_retry_after(r.retry_after_secs)
}

/// The record is `ambiguous`: the sender keeps retrying while an operator
/// finds out what the consumer did (SPEC §12).
pub fn outcome_unknown(event_id: &str) -> Problem {
    Problem::new(
        ProblemKind::OutcomeUnknown,
        "an earlier delivery of this event may have reached the consumer and its answer was \
         lost; it waits for an operator's decision",
    )
    .with_event_id(Some(event_id))
    .with_retry_after(policy::OUTCOME_UNKNOWN_RETRY_AFTER_SECS)
}

/// The route is paused: nothing is claimed, the sender retries (SPEC §14).
pub fn route_paused(event_id: Option<&str>) -> Problem {
    Problem::new(
        ProblemKind::RoutePaused,
        "deliveries to this route are paused by an operator; retry later",
    )
    .with_event_id(event_id)
    .with_retry_after(policy::ROUTE_PAUSED_RETRY_AFTER_SECS)
}

/// 422: the event ID was already used with another payload.
pub fn mismatch(event_id: &str) -> Problem {
    Problem::new(
        ProblemKind::DigestMismatch,
        "this event ID was already used with a different payload",
    )
    .with_event_id(Some(event_id))
}
