//! One delivery of an event on the guarded path: the route, the event ID
//! and digest, and once claimed the attempt. Its steps are methods in the
//! files beside this one: [`Delivery::claim`], [`Delivery::deliver`] (and
//! forward), [`Delivery::settle`].

use crate::claim::Millis;
use crate::limits::Permit;
use crate::proxy::routes::RouteRt;
use crate::proxy::shared::Shared;

/// A guarded request with its event ID, from the claim to the settle.
pub struct Delivery<'a> {
    pub(super) shared: &'a Shared,
    pub(super) route: &'a RouteRt,
    pub(super) event_id: String,
    /// The body's digest, hex: what a duplicate must match.
    pub(super) digest: String,
    /// Set once this delivery holds the claim.
    pub(super) attempt: Option<i64>,
    /// When the claim was taken: the attempt's start in its record.
    pub(super) started_at: Millis,
    /// The route's limits let this delivery through (SPEC §15): its slot
    /// (and half-open probe) until the delivery is dropped, on every exit.
    pub(super) permit: Option<Permit>,
    /// When the claim's lease ends, as the store recorded it.
    pub(super) lease_until: Millis,
}

impl<'a> Delivery<'a> {
    pub fn new(shared: &'a Shared, route: &'a RouteRt, event_id: String, digest: String) -> Self {
        Delivery {
            shared,
            route,
            event_id,
            digest,
            attempt: None,
            started_at: 0,
            permit: None,
            lease_until: 0,
        }
    }
}
