//! OpenTelemetry traces (SPEC §19): one SERVER span per request that
//! reaches a route, created by the first hook and kept in the request's
//! context ([`RequestTrace`]); its children `idemgate.verify`,
//! `idemgate.claim`, `idemgate.settle` and one CLIENT span per send to the
//! upstream, whose `traceparent` the consumer gets. A duplicate's SERVER
//! span links to the send its record remembers ([`TraceRef`]).
//!
//! Without `telemetry.otlp` there is no [`Tracing`], and the request path
//! holds `None` where a trace would be: no span, no allocation.
//!
//! The spans are plain records (`record.rs`, which says why not the SDK's
//! spans), exported as OTLP/HTTP protobuf written by `record.rs` itself.
//! The files: `propagation.rs` (W3C Trace Context in and out, pure),
//! `record.rs` (a span's record, and the OTLP protobuf it is written as),
//! `export.rs` (the bounded queue and the export thread), `client.rs` (the
//! OTLP/HTTP client over pingora's connector).

mod client;
mod export;
pub mod propagation;
mod record;

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use opentelemetry::KeyValue;
use prometheus::IntCounter;

use crate::config::Otlp;
use crate::store::TraceRef;
use record::{Kind, LinkTo, SpanRecord, TraceRecord};

/// How long a stop waits for the spans still queued to be sent.
const STOP_WITHIN: Duration = Duration::from_secs(3);

/// The process's sampler and its export thread.
pub struct Tracing {
    /// `sample`: the share of new traces recorded.
    sample: f64,
    /// `db.system.name` of the claim and settle spans.
    db_system: &'static str,
    queue: export::Queue,
    exporter: export::Exporter,
}

impl Tracing {
    /// Traces for `otlp`, exported from a thread of its own; spans that
    /// cannot be exported are counted in `dropped`.
    pub fn start(
        otlp: &Otlp,
        instance: &str,
        store: crate::store::StoreKind,
        dropped: IntCounter,
    ) -> Tracing {
        let target = otlp.endpoint.clone();
        let path = otlp.path.clone();
        let headers = otlp
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let resource = vec![
            KeyValue::new("service.name", otlp.service_name.clone()),
            KeyValue::new("service.instance.id", instance.to_owned()),
        ];
        // made on the export thread: its client's connections live there
        let make = move || export::Target {
            collector: client::Collector::new(target, export::EXPORT_WITHIN),
            path,
            headers,
            resource,
        };
        let (queue, exporter) = export::Exporter::start(make, dropped);
        Tracing {
            sample: otlp.sample,
            db_system: db_system(store),
            queue,
            exporter,
        }
    }

    /// The SERVER span of a request that reached a route: a new root, or
    /// with `trusted` the child of the sender's valid `traceparent`, whose
    /// sampling decision it follows (the SDK's parent-based ratio sampler).
    pub fn request(&self, server: ServerSpan<'_>) -> RequestTrace {
        let (trace_id, parent, sampled, state, remote) = match server.inbound {
            Some(p) => (p.trace_id, p.span_id, p.sampled, p.state, true),
            None => {
                let id = new_trace_id();
                (
                    id,
                    [0; 8],
                    ratio_keeps(self.sample, &id),
                    String::new(),
                    false,
                )
            }
        };
        let span_id = new_span_id();
        let recorder = sampled.then(|| {
            let mut attributes = Vec::with_capacity(10);
            attributes.extend([
                KeyValue::new("http.request.method", method(server.method)),
                KeyValue::new("url.path", server.path.to_owned()),
                KeyValue::new("http.route", server.path_prefix.to_owned()),
                KeyValue::new("network.protocol.version", protocol_version(server.version)),
                KeyValue::new("idemgate.route", server.route.to_owned()),
            ]);
            if let Some(ip) = server.client {
                attributes.push(KeyValue::new("client.address", ip.to_string()));
            }
            let name = format!("{} {}", server.method, server.path_prefix);
            let span = SpanRecord::start(span_id, parent, name, Kind::Server, attributes);
            Arc::new(Recorder {
                queue: self.queue.clone(),
                trace: Mutex::new(TraceRecord {
                    trace_id,
                    state: state.clone(),
                    remote_parent: remote,
                    // the SERVER span, verify, claim, settle, a send
                    spans: {
                        let mut spans = Vec::with_capacity(6);
                        spans.push(span);
                        spans
                    },
                }),
            })
        });
        RequestTrace {
            trace_id,
            span_id,
            state,
            db_system: self.db_system,
            recorder,
        }
    }

    /// Sends what is queued (within a few seconds) and stops the thread.
    pub fn stop(&self) {
        self.exporter.stop(STOP_WITHIN);
    }
}

/// The ratio sampler of a new root, as the SDK's `TraceIdRatioBased`
/// decides: the trace ID's lower 63 bits under `sample` × 2⁶³.
fn ratio_keeps(sample: f64, trace_id: &[u8; 16]) -> bool {
    if sample >= 1.0 {
        return true;
    }
    let bound = (sample.max(0.0) * (1u64 << 63) as f64) as u64;
    let low = u64::from_be_bytes(trace_id[8..].try_into().unwrap_or([0; 8]));
    (low >> 1) < bound
}

/// A random trace ID, never all zero.
fn new_trace_id() -> [u8; 16] {
    loop {
        let id = fastrand::u128(..).to_be_bytes();
        if id != [0; 16] {
            return id;
        }
    }
}

/// A random span ID, never all zero.
fn new_span_id() -> [u8; 8] {
    loop {
        let id = fastrand::u64(..).to_be_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

/// A standard method's name without an allocation.
fn method(m: &http::Method) -> Cow<'static, str> {
    const STANDARD: [http::Method; 9] = [
        http::Method::GET,
        http::Method::POST,
        http::Method::PUT,
        http::Method::DELETE,
        http::Method::PATCH,
        http::Method::HEAD,
        http::Method::OPTIONS,
        http::Method::CONNECT,
        http::Method::TRACE,
    ];
    const NAMES: [&str; 9] = [
        "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "TRACE",
    ];
    match STANDARD.iter().position(|s| s == m) {
        Some(i) => Cow::Borrowed(NAMES[i]),
        None => Cow::Owned(m.as_str().to_owned()),
    }
}

/// A recorded trace's spans while its request runs: the SERVER span first,
/// each child added as it ends. Queued for export when the last holder
/// (the request, or a span that outlived it) lets go.
struct Recorder {
    queue: export::Queue,
    trace: Mutex<TraceRecord>,
}

impl Recorder {
    fn lock(&self) -> MutexGuard<'_, TraceRecord> {
        self.trace.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The SERVER span, changed by `f`.
    fn server(&self, f: impl FnOnce(&mut SpanRecord)) {
        if let Some(s) = self.lock().spans.first_mut() {
            f(s);
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let trace = self.trace.get_mut().unwrap_or_else(|p| p.into_inner());
        self.queue.push(std::mem::take(trace));
    }
}

/// What a SERVER span is made of.
pub struct ServerSpan<'a> {
    pub method: &'a http::Method,
    pub path: &'a str,
    pub path_prefix: &'a str,
    pub version: http::Version,
    pub route: &'a str,
    pub client: Option<IpAddr>,
    /// The sender's context, when the route trusts it.
    pub inbound: Option<propagation::Parent>,
}

fn protocol_version(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "0.9",
        http::Version::HTTP_10 => "1.0",
        http::Version::HTTP_2 => "2",
        http::Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

/// One request's trace: its IDs, and while it is recorded, its spans.
/// The SERVER span ends when this is dropped, after [`RequestTrace::end`]
/// gave it the answer's status and outcome.
pub struct RequestTrace {
    trace_id: [u8; 16],
    /// The SERVER span's.
    span_id: [u8; 8],
    /// The `tracestate` passed on ("" for none).
    state: String,
    db_system: &'static str,
    /// `None` when the sampler did not keep the trace.
    recorder: Option<Arc<Recorder>>,
}

impl RequestTrace {
    /// Whether this trace is recorded (the sampler kept it).
    pub fn sampled(&self) -> bool {
        self.recorder.is_some()
    }

    /// The trace ID, hex, for the request's log line.
    pub fn trace_id(&self) -> String {
        TraceRef {
            trace_id: self.trace_id,
            span_id: self.span_id,
        }
        .trace_hex()
    }

    /// An attribute of the SERVER span.
    pub fn set(&self, attribute: KeyValue) {
        if let Some(r) = &self.recorder {
            r.server(|s| s.attributes.push(attribute));
        }
    }

    /// A store operation's span (`idemgate.claim`, `idemgate.settle`), with
    /// `db.system.name`; its outcome is set by the caller.
    pub fn store_step(&self, name: &'static str) -> Span {
        if self.recorder.is_none() {
            return Span::unrecorded();
        }
        self.child(name, vec![KeyValue::new("db.system.name", self.db_system)])
    }

    /// A child of the SERVER span (INTERNAL): ends when dropped.
    pub fn child(&self, name: &'static str, attributes: Vec<KeyValue>) -> Span {
        self.span(new_span_id(), name, Kind::Internal, attributes)
    }

    fn span(
        &self,
        id: [u8; 8],
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
        attributes: Vec<KeyValue>,
    ) -> Span {
        Span {
            record: self.recorder.as_ref().map(|r| {
                let record = SpanRecord::start(id, self.span_id, name, kind, attributes);
                (Arc::clone(r), record)
            }),
        }
    }

    /// The first send's trace and span ID, chosen now so that the claim
    /// keeps them with the record (SPEC §19); `None` when the trace is not
    /// recorded (a link to it would lead nowhere).
    pub fn plan_send(&self) -> Option<TraceRef> {
        self.sampled().then(|| TraceRef {
            trace_id: self.trace_id,
            span_id: new_span_id(),
        })
    }

    /// A CLIENT span for one send to the upstream (`planned`: the span ID
    /// the record keeps, for the first send), and the `traceparent` (and
    /// `tracestate`, when there is one) the upstream gets with it.
    pub fn send(
        &self,
        planned: Option<TraceRef>,
        method: &http::Method,
        mut attributes: Vec<KeyValue>,
    ) -> SendSpan {
        let id = planned.map_or_else(new_span_id, |p| p.span_id);
        let name = self::method(method);
        if self.sampled() {
            attributes.push(KeyValue::new("http.request.method", name.clone()));
        }
        SendSpan {
            traceparent: propagation::traceparent(&self.trace_id, &id, self.sampled()),
            tracestate: (!self.state.is_empty()).then(|| self.state.clone()),
            span: self.span(id, name, Kind::Client, attributes),
            done: false,
        }
    }

    /// A link from the SERVER span to the send a record remembers, with
    /// why (`idemgate.link`: replayed, in_flight, mismatch, reclaimed,
    /// outcome_unknown).
    pub fn link(&self, to: TraceRef, why: &'static str) {
        if let Some(r) = &self.recorder {
            r.server(|s| s.links.push(LinkTo { to, why }));
        }
    }

    /// The answer: its status, the outcome label (SPEC §5) and, for a 5xx
    /// or a failure, `error.type`; the span ends when this trace is dropped.
    pub fn end(&self, status: Option<u16>, outcome: &str, failure: Option<&str>) {
        let Some(r) = &self.recorder else {
            return;
        };
        r.server(|span| {
            let a = &mut span.attributes;
            a.push(KeyValue::new("idemgate.outcome", outcome.to_owned()));
            if let Some(s) = status {
                a.push(KeyValue::new("http.response.status_code", i64::from(s)));
            }
            let error = match (status, failure) {
                (_, Some(f)) => Some(f.to_owned()),
                (Some(s), None) if s >= 500 => Some(s.to_string()),
                _ => None,
            };
            if let Some(e) = error {
                a.push(KeyValue::new("error.type", e));
                span.error = Some("");
            }
        });
    }
}

impl Drop for RequestTrace {
    fn drop(&mut self) {
        if let Some(r) = &self.recorder {
            r.server(SpanRecord::finish);
        }
    }
}

/// A child span: recorded when its trace is, and added to it when
/// dropped (its end).
pub struct Span {
    record: Option<(Arc<Recorder>, SpanRecord)>,
}

impl Span {
    fn unrecorded() -> Span {
        Span { record: None }
    }

    /// An attribute (nothing when not recorded).
    pub fn set_attribute(&mut self, attribute: KeyValue) {
        if let Some((_, s)) = &mut self.record {
            s.attributes.push(attribute);
        }
    }

    /// Marks the span as an error, with `description`.
    pub fn set_error(&mut self, description: &'static str) {
        if let Some((_, s)) = &mut self.record {
            s.error = Some(description);
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some((recorder, mut span)) = self.record.take() {
            span.finish();
            recorder.lock().spans.push(span);
        }
    }
}

/// One send's CLIENT span; one dropped before its end (the upstream's
/// time ran out, or the sender went away) ends as a `timeout`.
pub struct SendSpan {
    traceparent: String,
    tracestate: Option<String>,
    span: Span,
    done: bool,
}

impl Drop for SendSpan {
    fn drop(&mut self) {
        if !self.done {
            self.span
                .set_attribute(KeyValue::new("error.type", "timeout"));
            self.span.set_error("");
        }
    }
}

impl SendSpan {
    /// The headers the upstream gets: `traceparent`, and `tracestate` when
    /// the trace carries one (a trusted sender's).
    pub fn headers(&self) -> (String, Option<String>) {
        (self.traceparent.clone(), self.tracestate.clone())
    }

    /// The upstream answered `status`.
    pub fn answered(mut self, status: u16) {
        self.done = true;
        self.span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 {
            self.span
                .set_attribute(KeyValue::new("error.type", status.to_string()));
            self.span.set_error("");
        }
    }

    /// The send failed before an answer: `why` is the error's class.
    pub fn failed(mut self, why: &'static str) {
        self.done = true;
        self.span.set_attribute(KeyValue::new("error.type", why));
        self.span.set_error("");
    }
}

/// `db.system.name` for a store URL's kind.
fn db_system(kind: crate::store::StoreKind) -> &'static str {
    match kind {
        crate::store::StoreKind::Sqlite => "sqlite",
        crate::store::StoreKind::Postgres => "postgresql",
        crate::store::StoreKind::Valkey => "valkey",
    }
}

/// A store step's outcome, `idemgate.store.outcome`: on the claim span
/// claimed, replay or the refusal's problem; on the settle span what the
/// settle did (delivered, released, ambiguous, stale). A store error marks
/// the span as an error.
pub fn store_outcome(span: &mut Span, outcome: &'static str) {
    span.set_attribute(KeyValue::new("idemgate.store.outcome", outcome));
    if outcome == "store_error" {
        span.set_attribute(KeyValue::new("error.type", "store_error"));
        span.set_error("");
    }
}

/// The verify span's result (`idemgate.verify.result`: valid or invalid;
/// an invalid signature marks the span as an error).
pub fn verified(span: &mut Span, valid: bool) {
    let result = if valid { "valid" } else { "invalid" };
    span.set_attribute(KeyValue::new("idemgate.verify.result", result));
    if !valid {
        span.set_error("invalid signature");
    }
}
