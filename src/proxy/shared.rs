//! What every request handler takes by reference: the store, the metrics,
//! the upstream connector, the in-flight table, the seen cache, the paused
//! routes, this process's name and the reconciler.

use std::sync::Arc;

use pingora::connectors::http::Connector;

use super::in_flight::InFlightRequests;
use super::pending::PendingSettles;
use super::seen::SeenEvents;
use crate::metrics::Metrics;
use crate::paused::PausedRoutes;
use crate::reconcile::Reconciler;
use crate::source::Ranges;
use crate::store::ClaimStore;

/// The parts of the proxy that outlive a request and are the same for
/// every route.
pub struct Shared {
    pub store: Arc<dyn ClaimStore>,
    pub metrics: Metrics,
    /// idemgate's own upstream connector, for requests it read whole.
    pub connector: Connector,
    pub in_flight: Arc<InFlightRequests>,
    /// Events met lately: they read the store before claiming.
    pub seen: SeenEvents,
    /// The routes an operator paused, as last read from the store.
    pub paused: Arc<PausedRoutes>,
    /// This process's name in attempt records (config `instance`).
    pub instance: String,
    /// Settles kept across a store outage (SPEC §16).
    pub pending: Arc<PendingSettles>,
    /// Peers whose `X-Forwarded-For` names the client (SPEC §22).
    pub trusted_proxies: Arc<Ranges>,
    /// Asks the consumer about an ambiguous record a delivery meets (SPEC §21).
    pub reconciler: Reconciler,
    /// OpenTelemetry (SPEC §19); `None` without `telemetry.otlp`.
    pub tracing: Option<Arc<crate::otel::Tracing>>,
}
