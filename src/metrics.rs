//! The metric set of SPEC §5 over an owned registry (each test and each
//! server has its own). Event IDs never become label values: every label here
//! is a route name or a fixed word.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use prometheus::{
    GaugeVec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
};

use crate::limits::RouteLimits;
use crate::telemetry::registry::{encode_text, Registrar};
use crate::telemetry::LOG_LINES_DROPPED;

/// Request outcomes: the `outcome` label and the `Idempotency-Status` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Forwarded,
    Replayed,
    InFlight,
    DigestMismatch,
    MissingId,
    InvalidId,
    InvalidBody,
    BodyTooLarge,
    InvalidSignature,
    StoreUnavailable,
    Unguarded,
    /// The path has no normal form (SPEC §4, "Paths"): no route was chosen.
    InvalidPath,
    /// The event's record is `ambiguous` (SPEC §12).
    OutcomeUnknown,
    /// The route is paused (SPEC §14).
    Paused,
    /// A request RFC 9112 says a server must reject (SPEC §4, "Strictness").
    InvalidRequest,
    /// Over the route's upstream concurrency or rate (SPEC §15).
    Saturated,
    /// The route's breaker is open (SPEC §15).
    BreakerOpen,
    /// The client address is outside the route's `allow_from` (SPEC §22).
    SourceRefused,
    /// Stays last: [`RequestCounters`] has one slot per outcome up to it.
    NoRoute,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Replayed => "replayed",
            Outcome::InFlight => "in_flight",
            Outcome::DigestMismatch => "digest_mismatch",
            Outcome::MissingId => "missing_id",
            Outcome::InvalidId => "invalid_id",
            Outcome::InvalidBody => "invalid_body",
            Outcome::BodyTooLarge => "body_too_large",
            Outcome::InvalidSignature => "invalid_signature",
            Outcome::StoreUnavailable => "store_unavailable",
            Outcome::Unguarded => "unguarded",
            Outcome::InvalidPath => "invalid_path",
            Outcome::OutcomeUnknown => "outcome_unknown",
            Outcome::Paused => "paused",
            Outcome::InvalidRequest => "invalid_request",
            Outcome::Saturated => "saturated",
            Outcome::BreakerOpen => "breaker_open",
            Outcome::SourceRefused => "source_refused",
            Outcome::NoRoute => "no_route",
        }
    }
}

/// Why idemgate closed a connection: `idemgate_connections_closed_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    HeaderTimeout,
    BodyTimeout,
    KeepaliveTimeout,
    WriteTimeout,
    Limit,
}

impl CloseReason {
    pub const ALL: [CloseReason; 5] = [
        CloseReason::HeaderTimeout,
        CloseReason::BodyTimeout,
        CloseReason::KeepaliveTimeout,
        CloseReason::WriteTimeout,
        CloseReason::Limit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::HeaderTimeout => "header_timeout",
            CloseReason::BodyTimeout => "body_timeout",
            CloseReason::KeepaliveTimeout => "keepalive_timeout",
            CloseReason::WriteTimeout => "write_timeout",
            CloseReason::Limit => "limit",
        }
    }
}

/// The `class` label of `idemgate_upstream_responses_total`.
pub fn status_class(status: u16) -> &'static str {
    match status {
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    upstream_responses: IntCounterVec,
    claims: IntCounterVec,
    settles: IntCounterVec,
    upstream_duration: HistogramVec,
    store_duration: HistogramVec,
    /// `store_duration`'s lookup, claim and settle series, resolved once: a
    /// labelled observation hashes its label values on every call.
    store_hot: [Histogram; 3],
    processing_oldest_age: GaugeVec,
    records_swept: IntCounter,
    /// `idemgate_connections{state}`: active, idle, reading.
    connections: IntGaugeVec,
    /// `idemgate_connections_closed_total{reason}`.
    connections_closed: IntCounterVec,
    /// `idemgate_log_lines_dropped_total`, brought up to
    /// [`LOG_LINES_DROPPED`] at each scrape.
    log_lines_dropped: IntCounter,
    /// `idemgate_spans_dropped_total` (SPEC §19).
    spans_dropped: IntCounter,
    /// Requests sent once more after a kept upstream connection failed
    /// before answering (SPEC §4, "Hop-by-hop").
    upstream_retries: IntCounterVec,
    /// `idemgate_headers_dropped_total{reason}`: request header fields
    /// not forwarded (SPEC §4, "Strictness": a name holding `_`).
    headers_dropped: IntCounterVec,
    /// Records waiting for an operator's decision (SPEC §12), per route.
    ambiguous_records: GaugeVec,
    /// 1 while a route is paused (SPEC §14).
    route_paused: GaugeVec,
    /// `idemgate_upstream_in_flight{route}` and
    /// `idemgate_upstream_breaker_open{route}` (SPEC §15).
    upstream: UpstreamGauges,
    /// Settles kept across a store outage (SPEC §16).
    settles_pending: IntGauge,
    /// `idemgate_store_shards` (SPEC §18), registered once a sharded store
    /// reports its shards: the SQL stores have none to count.
    store_shards: Arc<OnceLock<IntGauge>>,
    /// `idemgate_reconciliations_total{route, result}` (SPEC §21):
    /// questions to the consumer, by what they learned.
    reconciliations: IntCounterVec,
}

/// The routes' upstream gauges (SPEC §15), read from their limits at each
/// scrape: nothing is counted on the request path for them.
#[derive(Clone)]
struct UpstreamGauges {
    in_flight: IntGaugeVec,
    /// `idemgate_upstream_waiting{route}`: routes with `upstream_wait`.
    waiting: IntGaugeVec,
    breaker_open: IntGaugeVec,
    /// The routes' limits, set once the proxy's routes exist.
    limits: Arc<OnceLock<LimitsByRoute>>,
}

/// Each route's name and limits.
pub type LimitsByRoute = Vec<(String, Arc<RouteLimits>)>;

/// `idemgate_reconciliations_total` (SPEC §21).
fn reconciliations_counter(r: &Registrar) -> IntCounterVec {
    r.counters(
        "idemgate_reconciliations_total",
        "Questions to the consumer about ambiguous records, by what they learned: delivered, \
         failed, unknown.",
        &["route", "result"],
    )
}

/// `idemgate_ambiguous_records` and `idemgate_route_paused` (SPEC §12, §14).
fn route_state_gauges(r: &Registrar) -> (GaugeVec, GaugeVec) {
    let ambiguous = r.gauges(
        "idemgate_ambiguous_records",
        "Records whose outcome idemgate cannot know, waiting for an operator's decision, per \
         route (counted at most every 30 s).",
        &["route"],
    );
    let paused = r.gauges(
        "idemgate_route_paused",
        "1 while the route is paused: nothing is forwarded, delivered events are still replayed.",
        &["route"],
    );
    (ambiguous, paused)
}

impl UpstreamGauges {
    fn new(r: &Registrar) -> UpstreamGauges {
        UpstreamGauges {
            in_flight: r.int_gauges(
                "idemgate_upstream_in_flight",
                "Requests of the route in flight to its upstream in this process (routes with an \
                 upstream limit).",
                &["route"],
            ),
            waiting: r.int_gauges(
                "idemgate_upstream_waiting",
                "Requests of the route waiting in this process for a slot or a token \
                 (routes with upstream_wait).",
                &["route"],
            ),
            breaker_open: r.int_gauges(
                "idemgate_upstream_breaker_open",
                "1 while the route's breaker is not closed (open, or half-open until one delivery \
                 succeeds): new deliveries get 503 upstream-unavailable.",
                &["route"],
            ),
            limits: Default::default(),
        }
    }
}

/// `idemgate_log_lines_dropped_total`.
fn log_lines_dropped_counter(r: &Registrar) -> IntCounter {
    r.counter(
        "idemgate_log_lines_dropped_total",
        "Log lines dropped because the log's output did not take them.",
    )
}

/// `idemgate_spans_dropped_total` (SPEC §19).
fn spans_dropped_counter(r: &Registrar) -> IntCounter {
    r.counter(
        "idemgate_spans_dropped_total",
        "Trace spans dropped: the export queue was full, or the collector did not take them in time.",
    )
}

/// `idemgate_upstream_retries_total{route}`.
fn upstream_retries_counter(r: &Registrar) -> IntCounterVec {
    r.counters(
        "idemgate_upstream_retries_total",
        "Requests sent once more, on a new connection, after a kept upstream connection closed before any response byte.",
        &["route"],
    )
}

/// `idemgate_settles_pending` (SPEC §16).
fn settles_pending_gauge(r: &Registrar) -> IntGauge {
    r.int_gauge(
        "idemgate_settles_pending",
        "Settles that could not commit, kept and retried in the background until one second \
         before their claim's lease ends.",
    )
}

/// `idemgate_headers_dropped_total{reason}` (SPEC §4, "Strictness").
fn headers_dropped_counter(r: &Registrar) -> IntCounterVec {
    r.counters(
        "idemgate_headers_dropped_total",
        "Request header fields dropped before forwarding (underscore: a name with `_`).",
        &["reason"],
    )
}

/// The `reason` of `idemgate_headers_dropped_total` for a field name holding `_`.
const UNDERSCORE: &str = "underscore";

/// Outcomes there are, for [`RequestCounters`].
const OUTCOMES: usize = Outcome::NoRoute as usize + 1;

/// One route's `idemgate_requests_total` series, each resolved the first
/// time it is counted (a series still appears only once it has happened)
/// and kept, so that counting a request needs no label lookup. Held by the
/// route, for the one [`Metrics`] its proxy counts into.
#[derive(Default)]
pub struct RequestCounters([OnceLock<IntCounter>; OUTCOMES]);

/// Buckets for sub-millisecond store commits up to multi-second upstreams.
const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

impl Metrics {
    // long: the metric set, each metric's name, help and labels written once, beside its field
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let r = Registrar(&registry);
        let store_duration = r.histograms(
            "idemgate_store_duration_seconds",
            "Store round trips by operation.",
            &["operation"],
            DURATION_BUCKETS,
        );
        let (ambiguous_records, route_paused) = route_state_gauges(&r);
        let m = Metrics {
            requests: r.counters(
                "idemgate_requests_total",
                "Requests by route and outcome.",
                &["route", "outcome"],
            ),
            upstream_responses: r.counters(
                "idemgate_upstream_responses_total",
                "Upstream answers by status class, connect errors and timeouts.",
                &["route", "class"],
            ),
            claims: r.counters(
                "idemgate_claims_total",
                "Claims taken: new events, retries after a failure, retries after an expired lease.",
                &["route", "kind"],
            ),
            settles: r.counters(
                "idemgate_settles_total",
                "Claims settled: delivered, released, ambiguous (held for an operator), stale (a newer attempt owns it), error.",
                &["route", "result"],
            ),
            upstream_duration: r.histograms(
                "idemgate_upstream_duration_seconds",
                "Time from forwarding to the upstream's response header.",
                &["route"],
                DURATION_BUCKETS,
            ),
            store_hot: ["lookup", "claim", "settle"]
                .map(|op| store_duration.with_label_values(&[op])),
            store_duration,
            processing_oldest_age: r.gauges(
                "idemgate_processing_oldest_age_seconds",
                "Age of the oldest record still processing, per route.",
                &["route"],
            ),
            records_swept: r.counter(
                "idemgate_records_swept_total",
                "Expired records deleted by the sweeper.",
            ),
            connections: r.int_gauges(
                "idemgate_connections",
                "Open client connections: active (a request in progress), idle (kept alive, \
                 between requests), reading (before the first request's head is complete).",
                &["state"],
            ),
            connections_closed: r.counters(
                "idemgate_connections_closed_total",
                "Client connections idemgate closed: header, body, keep-alive and write timeouts, \
                 and the connection limit.",
                &["reason"],
            ),
            log_lines_dropped: log_lines_dropped_counter(&r),
            spans_dropped: spans_dropped_counter(&r),
            upstream_retries: upstream_retries_counter(&r),
            headers_dropped: headers_dropped_counter(&r),
            ambiguous_records,
            route_paused,
            upstream: UpstreamGauges::new(&r),
            settles_pending: settles_pending_gauge(&r),
            store_shards: Arc::default(),
            reconciliations: reconciliations_counter(&r),
            registry: registry.clone(),
        };
        process_metrics(&r);
        m.init_fixed_series();
        m
    }

    /// The series whose labels are fixed words, at zero from the start.
    fn init_fixed_series(&self) {
        for state in ["active", "idle", "reading"] {
            self.connections.with_label_values(&[state]);
        }
        for reason in CloseReason::ALL {
            self.connections_closed
                .with_label_values(&[reason.as_str()]);
        }
        self.headers_dropped.with_label_values(&[UNDERSCORE]);
    }

    /// `n` request header fields whose names hold `_` were dropped.
    pub fn underscore_headers_dropped(&self, n: u64) {
        self.headers_dropped
            .with_label_values(&[UNDERSCORE])
            .inc_by(n);
    }

    /// Counts a connection idemgate closed for `reason`.
    pub fn connection_closed(&self, reason: CloseReason) {
        self.connections_closed
            .with_label_values(&[reason.as_str()])
            .inc();
    }

    /// Creates the series of every route at zero, so dashboards and rates see
    /// them before the first event.
    pub fn init_routes<'a>(&self, routes: impl IntoIterator<Item = &'a str>) {
        for route in routes {
            self.requests
                .with_label_values(&[route, Outcome::Forwarded.as_str()]);
            self.claims.with_label_values(&[route, "new"]);
            self.settles.with_label_values(&[route, "delivered"]);
            self.upstream_responses.with_label_values(&[route, "2xx"]);
            self.upstream_duration.with_label_values(&[route]);
            self.upstream_retries.with_label_values(&[route]);
            self.processing_oldest_age
                .with_label_values(&[route])
                .set(0.0);
            self.ambiguous_records.with_label_values(&[route]);
            self.route_paused.with_label_values(&[route]);
            self.upstream.breaker_open.with_label_values(&[route]);
        }
        for op in ["claim", "settle", "lookup", "sweep"] {
            self.store_duration.with_label_values(&[op]);
        }
    }

    pub fn request(&self, route: &str, outcome: Outcome) {
        self.requests
            .with_label_values(&[route, outcome.as_str()])
            .inc();
    }

    /// [`Metrics::request`] through the route's resolved series.
    pub fn route_request(&self, counters: &RequestCounters, route: &str, outcome: Outcome) {
        counters.0[outcome as usize]
            .get_or_init(|| self.requests.with_label_values(&[route, outcome.as_str()]))
            .inc();
    }

    /// The upstream answered `status` after `elapsed`.
    pub fn upstream_answered(&self, route: &str, status: u16, elapsed: std::time::Duration) {
        self.upstream_responses
            .with_label_values(&[route, status_class(status)])
            .inc();
        self.upstream_duration
            .with_label_values(&[route])
            .observe(elapsed.as_secs_f64());
    }

    /// An upstream outcome by class: a status class (`2xx`…) for an answer
    /// counted without [`Metrics::upstream_answered`], or `timeout` or
    /// `connect_error`.
    pub fn upstream_outcome(&self, route: &str, class: &str) {
        self.upstream_responses
            .with_label_values(&[route, class])
            .inc();
    }

    /// How long an upstream took, for an answer counted elsewhere.
    pub fn upstream_time(&self, route: &str, elapsed: std::time::Duration) {
        self.upstream_duration
            .with_label_values(&[route])
            .observe(elapsed.as_secs_f64());
    }

    /// A claim taken, of `kind` (`new`, `reclaim`, `retry`).
    pub fn claimed(&self, route: &str, kind: &str) {
        self.claims.with_label_values(&[route, kind]).inc();
    }

    /// A settle's result (`delivered`, `failed`, …, or `error`).
    pub fn settled(&self, route: &str, result: &str) {
        self.settles.with_label_values(&[route, result]).inc();
    }

    /// A question to the consumer learned `result` (`delivered`, `failed`,
    /// `unknown`).
    pub fn reconciled(&self, route: &str, result: &str) {
        self.reconciliations
            .with_label_values(&[route, result])
            .inc();
    }

    /// A route that asks its consumer: its three series at zero.
    pub fn init_reconciliations(&self, route: &str) {
        for result in ["delivered", "failed", "unknown"] {
            self.reconciliations.with_label_values(&[route, result]);
        }
    }

    /// The sweeper removed `n` records.
    pub fn swept(&self, n: u64) {
        self.records_swept.inc_by(n);
    }

    /// The age of `route`'s oldest record in `processing`.
    pub fn processing_oldest(&self, route: &str, age_secs: f64) {
        self.processing_oldest_age
            .with_label_values(&[route])
            .set(age_secs);
    }

    /// How many of `route`'s records are `ambiguous`.
    pub fn ambiguous(&self, route: &str, count: i64) {
        self.ambiguous_records
            .with_label_values(&[route])
            .set(count as f64);
    }

    /// Whether `route` is paused.
    pub fn paused(&self, route: &str, paused: bool) {
        self.route_paused
            .with_label_values(&[route])
            .set(if paused { 1.0 } else { 0.0 });
    }

    /// `idemgate_connections{state}`, resolved once by the connection table.
    pub fn connections_gauge(&self, state: &str) -> prometheus::IntGauge {
        self.connections.with_label_values(&[state])
    }

    /// `idemgate_connections_closed_total{reason}`, resolved once by the
    /// connection table.
    pub fn closed_counter(&self, reason: &str) -> IntCounter {
        self.connections_closed.with_label_values(&[reason])
    }

    /// A request to `route`'s upstream was sent once more.
    pub fn upstream_retry(&self, route: &str) {
        self.upstream_retries.with_label_values(&[route]).inc();
    }

    /// `idemgate_store_shards`: the shards a sharded store saw last.
    pub fn store_shards(&self, n: u64) {
        self.store_shards
            .get_or_init(|| {
                Registrar(&self.registry).int_gauge(
                    "idemgate_store_shards",
                    "Shards of the sharded store (Valkey or Redis Cluster) seen at its last check.",
                )
            })
            .set(n as i64);
    }

    /// `idemgate_spans_dropped_total`, for the span exporter to count in.
    pub fn spans_dropped(&self) -> IntCounter {
        self.spans_dropped.clone()
    }

    /// `idemgate_settles_pending`, as the carrier counts them.
    pub fn settles_pending(&self, n: usize) {
        self.settles_pending.set(n as i64);
    }

    pub fn store_time(&self, operation: &str, seconds: f64) {
        match operation {
            "lookup" => self.store_hot[0].observe(seconds),
            "claim" => self.store_hot[1].observe(seconds),
            "settle" => self.store_hot[2].observe(seconds),
            other => self
                .store_duration
                .with_label_values(&[other])
                .observe(seconds),
        }
    }

    /// The routes' limits whose state the upstream gauges show (once).
    pub fn follow_limits(&self, routes: LimitsByRoute) {
        for (route, limits) in &routes {
            if limits.limited() {
                self.upstream.in_flight.with_label_values(&[route]);
            }
            if limits.cfg().wait.is_some() {
                self.upstream.waiting.with_label_values(&[route]);
            }
        }
        let _ = self.upstream.limits.set(routes);
    }

    /// `route`'s limits and their state now, for the admin API.
    pub fn upstream_state(
        &self,
        route: &str,
    ) -> Option<(crate::limits::LimitsCfg, crate::limits::Snapshot)> {
        let routes = self.upstream.limits.get()?;
        let (_, limits) = routes.iter().find(|(r, _)| r == route)?;
        Some((*limits.cfg(), limits.snapshot(crate::limits::now())))
    }

    /// The upstream gauges, from the routes' limits as they are now.
    fn read_limits(&self) {
        let Some(routes) = self.upstream.limits.get() else {
            return;
        };
        let now = crate::limits::now();
        for (route, limits) in routes {
            let s = limits.snapshot(now);
            if limits.limited() {
                let in_flight = self.upstream.in_flight.with_label_values(&[route]);
                in_flight.set(i64::from(s.in_flight));
            }
            if limits.cfg().wait.is_some() {
                let waiting = self.upstream.waiting.with_label_values(&[route]);
                waiting.set(i64::from(s.waiting));
            }
            let open = self.upstream.breaker_open.with_label_values(&[route]);
            // half-open counts: the breaker is not closed until a probe succeeds
            open.set(i64::from(s.breaker != "closed"));
        }
    }

    /// Every metric's current samples, as `render` would print them (the
    /// admin API reads its live counters here, so they match `/metrics`).
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.read_limits();
        self.registry.gather()
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> Vec<u8> {
        let dropped = LOG_LINES_DROPPED.load(Ordering::Relaxed);
        let shown = self.log_lines_dropped.get();
        if dropped > shown {
            self.log_lines_dropped.inc_by(dropped - shown);
        }
        self.read_limits();
        encode_text(&self.registry)
    }
}

/// The metrics no [`Metrics`] method touches: the build's version, and the
/// standard `process_*` ones (CPU, memory, open and maximum file
/// descriptors, start time).
fn process_metrics(r: &Registrar) {
    r.int_gauges(
        "idemgate_build_info",
        "Always 1; the version of this build.",
        &["version"],
    )
    .with_label_values(&[env!("CARGO_PKG_VERSION")])
    .set(1);
    r.collector(prometheus::process_collector::ProcessCollector::for_self());
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_gauges_follow_the_routes_limits_at_each_scrape() {
        use crate::limits::{LimitsCfg, Rate};
        let m = Metrics::new();
        let limited = Arc::new(RouteLimits::new(LimitsCfg {
            concurrency: Some(2),
            rate: Some(Rate {
                per: 5,
                every: std::time::Duration::from_secs(1),
            }),
            breaker: None,
            wait: None,
        }));
        let plain = Arc::new(RouteLimits::new(LimitsCfg::default()));
        m.follow_limits(vec![
            ("a".into(), limited.clone()),
            ("b".into(), plain.clone()),
        ]);
        let permit = limited.admit(crate::limits::now(), true).unwrap();
        plain.pushed_back(crate::limits::now(), std::time::Duration::from_secs(60));
        let text = String::from_utf8(m.render()).unwrap();
        assert!(
            text.contains("idemgate_upstream_in_flight{route=\"a\"} 1\n"),
            "{text}"
        );
        // a route without limits counts nothing: no in-flight series
        assert!(
            !text.contains("idemgate_upstream_in_flight{route=\"b\"}"),
            "{text}"
        );
        assert!(
            text.contains("idemgate_upstream_breaker_open{route=\"a\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("idemgate_upstream_breaker_open{route=\"b\"} 1\n"),
            "{text}"
        );
        drop(permit);
        let text = String::from_utf8(m.render()).unwrap();
        assert!(
            text.contains("idemgate_upstream_in_flight{route=\"a\"} 0\n"),
            "{text}"
        );
    }

    #[test]
    // long: one use of every metric of SPEC §5, then one assertion each
    fn exposes_every_spec_metric() {
        let m = Metrics::new();
        m.init_routes(["r"]);
        m.request("", Outcome::NoRoute);
        m.upstream_responses.with_label_values(&["r", "2xx"]).inc();
        m.upstream_duration.with_label_values(&["r"]).observe(0.01);
        m.records_swept.inc();
        let text = String::from_utf8(m.render()).unwrap();
        for name in [
            "# TYPE idemgate_requests_total counter",
            "# TYPE idemgate_upstream_responses_total counter",
            "# TYPE idemgate_claims_total counter",
            "# TYPE idemgate_settles_total counter",
            "# TYPE idemgate_upstream_duration_seconds histogram",
            "# TYPE idemgate_store_duration_seconds histogram",
            "# TYPE idemgate_processing_oldest_age_seconds gauge",
            "# TYPE idemgate_records_swept_total counter",
            "# TYPE idemgate_connections gauge",
            "# TYPE idemgate_connections_closed_total counter",
            "# TYPE idemgate_log_lines_dropped_total counter",
            "# TYPE idemgate_spans_dropped_total counter",
            "idemgate_spans_dropped_total 0",
            "# TYPE idemgate_headers_dropped_total counter",
            "# TYPE idemgate_settles_pending gauge",
            "idemgate_settles_pending 0",
            "idemgate_headers_dropped_total{reason=\"underscore\"} 0",
            "# TYPE idemgate_build_info gauge",
            "# TYPE process_resident_memory_bytes gauge",
            "# TYPE process_open_fds gauge",
            "# TYPE process_max_fds gauge",
            "# TYPE process_cpu_seconds_total counter",
            "# TYPE process_start_time_seconds gauge",
        ] {
            assert!(text.contains(name), "missing {name}");
        }
        assert!(
            text.contains(r#"idemgate_requests_total{outcome="no_route",route=""} 1"#),
            "{text}"
        );
        let version = format!(
            "idemgate_build_info{{version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&version), "{text}");
        for state in ["active", "idle", "reading"] {
            let line = format!("idemgate_connections{{state=\"{state}\"}} 0\n");
            assert!(text.contains(&line), "{line}");
        }
        for reason in CloseReason::ALL {
            let line = format!(
                "idemgate_connections_closed_total{{reason=\"{}\"}} 0\n",
                reason.as_str()
            );
            assert!(text.contains(&line), "{line}");
        }
    }

    #[test]
    fn dropped_log_lines_show_at_the_next_scrape() {
        let m = Metrics::new();
        let before = LOG_LINES_DROPPED.load(Ordering::Relaxed);
        LOG_LINES_DROPPED.fetch_add(3, Ordering::Relaxed);
        let text = text_of(&m);
        let shown: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("idemgate_log_lines_dropped_total "))
            .and_then(|v| v.parse().ok())
            .expect("the counter is exposed");
        assert!(shown >= before + 3, "{shown} < {before} + 3");
    }

    #[test]
    fn resolved_series_count_into_the_labelled_ones() {
        let m = Metrics::new();
        let counters = RequestCounters::default();
        let all = [
            Outcome::Forwarded,
            Outcome::Replayed,
            Outcome::InFlight,
            Outcome::DigestMismatch,
            Outcome::MissingId,
            Outcome::InvalidId,
            Outcome::InvalidBody,
            Outcome::BodyTooLarge,
            Outcome::InvalidSignature,
            Outcome::StoreUnavailable,
            Outcome::Unguarded,
            Outcome::InvalidPath,
            Outcome::OutcomeUnknown,
            Outcome::Paused,
            Outcome::InvalidRequest,
            Outcome::Saturated,
            Outcome::BreakerOpen,
            Outcome::SourceRefused,
            Outcome::NoRoute,
        ];
        assert_eq!(all.len(), OUTCOMES);
        for (i, outcome) in all.into_iter().enumerate() {
            for _ in 0..=i {
                m.route_request(&counters, "r", outcome);
            }
            m.request("r", outcome);
        }
        let text = String::from_utf8(m.render()).unwrap();
        for (i, outcome) in all.into_iter().enumerate() {
            let line = format!(
                "idemgate_requests_total{{outcome=\"{}\",route=\"r\"}} {}\n",
                outcome.as_str(),
                i + 2
            );
            assert!(text.contains(&line), "{line} in\n{text}");
        }
        for (op, n) in [("lookup", 1), ("claim", 2), ("settle", 3), ("sweep", 4)] {
            for _ in 0..n {
                m.store_time(op, 0.001);
            }
            let line = format!("idemgate_store_duration_seconds_count{{operation=\"{op}\"}} {n}\n");
            assert!(text_of(&m).contains(&line), "{line}");
        }
    }

    fn text_of(m: &Metrics) -> String {
        String::from_utf8(m.render()).unwrap()
    }

    #[test]
    fn status_classes() {
        assert_eq!(status_class(200), "2xx");
        assert_eq!(status_class(204), "2xx");
        assert_eq!(status_class(302), "3xx");
        assert_eq!(status_class(404), "4xx");
        assert_eq!(status_class(503), "5xx");
    }
}
