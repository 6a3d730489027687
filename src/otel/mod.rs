//! OpenTelemetry traces (SPEC §19), with the SDK directly: one SERVER span
//! per request that reaches a route, created by the first hook and kept in
//! the request's context ([`RequestTrace`]); its children `idemgate.verify`,
//! `idemgate.claim`, `idemgate.settle` and one CLIENT span per send to the
//! upstream, whose `traceparent` the consumer gets. A duplicate's SERVER
//! span links to the send its record remembers ([`TraceRef`]).
//!
//! Without `telemetry.otlp` there is no [`Tracing`], and the request path
//! holds `None` where a trace would be: no span, no allocation.
//!
//! The files: `propagation.rs` (W3C Trace Context in and out, pure),
//! `export.rs` (the bounded queue and the export thread), `client.rs` (the
//! exporter's HTTP client over pingora's connector).

mod client;
mod export;
pub mod propagation;

use std::cell::Cell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceState, Tracer,
    TracerProvider,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, RetryPolicy, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SdkTracer, SdkTracerProvider, Span,
};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;

use crate::config::Otlp;
use crate::store::TraceRef;

/// How long a stop waits for the spans still queued to be sent.
const STOP_WITHIN: Duration = Duration::from_secs(3);

/// The process's tracer and its export thread.
pub struct Tracing {
    tracer: SdkTracer,
    /// `db.system.name` of the claim and settle spans.
    db_system: &'static str,
    provider: SdkTracerProvider,
    exporter: export::Exporter,
}

impl Tracing {
    /// The tracer for `otlp`, exporting from a thread of its own; spans
    /// that cannot be exported are counted in `dropped`.
    pub fn start(
        otlp: &Otlp,
        instance: &str,
        store: crate::store::StoreKind,
        dropped: IntCounter,
    ) -> Tracing {
        let url = format!(
            "{}://{}:{}{}",
            if otlp.endpoint.tls { "https" } else { "http" },
            otlp.endpoint.host,
            otlp.endpoint.port,
            otlp.path
        );
        let headers: HashMap<String, String> = otlp
            .headers
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        let target = otlp.endpoint.clone();
        // made on the export thread: its client's connections live there
        let make = move || {
            let collector = client::Collector::new(target, export::EXPORT_WITHIN);
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_http_client(collector)
                .with_endpoint(url)
                .with_protocol(Protocol::HttpBinary)
                .with_headers(headers)
                .with_timeout(export::EXPORT_WITHIN)
                .with_retry_policy(RetryPolicy::disabled())
                .build()
        };
        let resource = Resource::builder_empty()
            .with_service_name(otlp.service_name.clone())
            .with_attributes([KeyValue::new("service.instance.id", instance.to_owned())])
            .build();
        let (queue, exporter) = export::Exporter::start(
            move || match make() {
                Ok(e) => Some(e),
                Err(e) => {
                    tracing::error!(error = %e, "tracing: the OTLP exporter could not be built; spans are dropped");
                    None
                }
            },
            resource.clone(),
            dropped,
        );
        let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(otlp.sample)));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .with_sampler(sampler)
            .with_id_generator(Ids::default())
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("idemgate");
        Tracing {
            tracer,
            db_system: db_system(store),
            provider,
            exporter,
        }
    }

    /// The SERVER span of a request that reached a route: a new root, or
    /// with `trusted` the child of the sender's valid `traceparent`.
    pub fn request(&self, server: ServerSpan<'_>) -> RequestTrace {
        let parent = match server.inbound {
            Some(sc) => Context::new().with_remote_span_context(sc),
            None => Context::new(),
        };
        let mut attributes = Vec::with_capacity(8);
        attributes.extend([
            KeyValue::new("http.request.method", server.method.as_str().to_owned()),
            KeyValue::new("url.path", server.path.to_owned()),
            KeyValue::new("http.route", server.path_prefix.to_owned()),
            KeyValue::new("network.protocol.version", protocol_version(server.version)),
            KeyValue::new("idemgate.route", server.route.to_owned()),
        ]);
        if let Some(ip) = server.client {
            attributes.push(KeyValue::new("client.address", ip.to_string()));
        }
        let span = self
            .tracer
            .span_builder(format!("{} {}", server.method, server.path_prefix))
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        RequestTrace {
            tracer: self.tracer.clone(),
            db_system: self.db_system,
            cx: parent.with_span(span),
        }
    }

    /// Sends what is queued (within a few seconds) and stops the thread.
    pub fn stop(&self) {
        let _ = self.provider.shutdown();
        self.exporter.stop(STOP_WITHIN);
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
    pub inbound: Option<SpanContext>,
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

thread_local! {
    /// The span ID the next span made on this thread takes ([`Ids`]).
    static NEXT_SPAN_ID: Cell<Option<SpanId>> = const { Cell::new(None) };
}

/// The SDK's random IDs, except that a CLIENT span can take an ID chosen
/// before it (the one its record keeps since the claim): the SDK's span
/// builder has no span ID of its own since 0.28. Set and taken on one
/// thread within one synchronous call ([`RequestTrace::send`]).
#[derive(Debug, Default)]
struct Ids(RandomIdGenerator);

impl IdGenerator for Ids {
    fn new_trace_id(&self) -> opentelemetry::trace::TraceId {
        self.0.new_trace_id()
    }

    fn new_span_id(&self) -> SpanId {
        NEXT_SPAN_ID
            .with(Cell::take)
            .unwrap_or_else(|| self.0.new_span_id())
    }
}

/// One request's trace: its SERVER span, in the context its children are
/// made in. Ended (and so exported) when dropped, after [`RequestTrace::end`]
/// gave it the answer's status and outcome.
pub struct RequestTrace {
    tracer: SdkTracer,
    db_system: &'static str,
    cx: Context,
}

impl RequestTrace {
    fn server(&self) -> SpanContext {
        self.cx.span().span_context().clone()
    }

    /// Whether this trace is recorded (the sampler kept it).
    pub fn sampled(&self) -> bool {
        self.cx.span().span_context().is_sampled()
    }

    /// The trace ID, hex, for the request's log line.
    pub fn trace_id(&self) -> String {
        self.server().trace_id().to_string()
    }

    /// An attribute of the SERVER span.
    pub fn set(&self, attribute: KeyValue) {
        self.cx.span().set_attribute(attribute);
    }

    /// A store operation's span (`idemgate.claim`, `idemgate.settle`), with
    /// `db.system.name`; its outcome is set by the caller.
    pub fn store_step(&self, name: &'static str) -> Span {
        self.child(name, vec![KeyValue::new("db.system.name", self.db_system)])
    }

    /// A child of the SERVER span (INTERNAL): ends when dropped.
    pub fn child(&self, name: &'static str, attributes: Vec<KeyValue>) -> Span {
        self.tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &self.cx)
    }

    /// The first send's trace and span ID, chosen now so that the claim
    /// keeps them with the record (SPEC §19); `None` when the trace is not
    /// recorded (a link to it would lead nowhere).
    pub fn plan_send(&self) -> Option<TraceRef> {
        if !self.sampled() {
            return None;
        }
        let span_id = RandomIdGenerator::default().new_span_id();
        Some(TraceRef {
            trace_id: self.server().trace_id().to_bytes(),
            span_id: span_id.to_bytes(),
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
        if let Some(p) = planned {
            NEXT_SPAN_ID.with(|c| c.set(Some(SpanId::from_bytes(p.span_id))));
        }
        let name = method.as_str().to_owned();
        attributes.push(KeyValue::new("http.request.method", name.clone()));
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &self.cx);
        NEXT_SPAN_ID.with(|c| c.set(None));
        SendSpan { span, done: false }
    }

    /// A link from the SERVER span to the send a record remembers, with
    /// why (`idemgate.link`: replayed, in_flight, mismatch, reclaimed,
    /// outcome_unknown).
    pub fn link(&self, to: TraceRef, why: &'static str) {
        let sc = SpanContext::new(
            opentelemetry::trace::TraceId::from_bytes(to.trace_id),
            SpanId::from_bytes(to.span_id),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        self.cx
            .span()
            .add_link(sc, vec![KeyValue::new("idemgate.link", why)]);
    }

    /// The answer: its status, the outcome label (SPEC §5) and, for a 5xx
    /// or a failure, `error.type`; the span ends when this trace is dropped.
    pub fn end(&self, status: Option<u16>, outcome: &str, failure: Option<&str>) {
        let span = self.cx.span();
        if !span.is_recording() {
            return;
        }
        span.set_attribute(KeyValue::new("idemgate.outcome", outcome.to_owned()));
        if let Some(s) = status {
            span.set_attribute(KeyValue::new("http.response.status_code", i64::from(s)));
        }
        let error = match (status, failure) {
            (_, Some(f)) => Some(f.to_owned()),
            (Some(s), None) if s >= 500 => Some(s.to_string()),
            _ => None,
        };
        if let Some(e) = error {
            span.set_attribute(KeyValue::new("error.type", e));
            span.set_status(Status::error(""));
        }
    }
}

impl Drop for RequestTrace {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

/// One send's CLIENT span; one dropped before its end (the upstream's
/// time ran out, or the sender went away) ends as a `timeout`.
pub struct SendSpan {
    span: Span,
    done: bool,
}

impl Drop for SendSpan {
    fn drop(&mut self) {
        use opentelemetry::trace::Span as _;
        if !self.done {
            self.span
                .set_attribute(KeyValue::new("error.type", "timeout"));
            self.span.set_status(Status::error(""));
        }
    }
}

impl SendSpan {
    /// The headers the upstream gets: `traceparent`, and `tracestate` when
    /// the trace carries one (a trusted sender's).
    pub fn headers(&self) -> (String, Option<String>) {
        use opentelemetry::trace::Span as _;
        let sc = self.span.span_context();
        let state = sc.trace_state().header();
        (
            propagation::traceparent(sc),
            (!state.is_empty()).then_some(state),
        )
    }

    /// The upstream answered `status`.
    pub fn answered(mut self, status: u16) {
        use opentelemetry::trace::Span as _;
        self.done = true;
        self.span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 {
            self.span
                .set_attribute(KeyValue::new("error.type", status.to_string()));
            self.span.set_status(Status::error(""));
        }
    }

    /// The send failed before an answer: `why` is the error's class.
    pub fn failed(mut self, why: &'static str) {
        use opentelemetry::trace::Span as _;
        self.done = true;
        self.span.set_attribute(KeyValue::new("error.type", why));
        self.span.set_status(Status::error(""));
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
    use opentelemetry::trace::Span as _;
    span.set_attribute(KeyValue::new("idemgate.store.outcome", outcome));
    if outcome == "store_error" {
        span.set_attribute(KeyValue::new("error.type", "store_error"));
        span.set_status(Status::error(""));
    }
}

/// The verify span's result (`idemgate.verify.result`: valid or invalid;
/// an invalid signature marks the span as an error).
pub fn verified(span: &mut Span, valid: bool) {
    use opentelemetry::trace::Span as _;
    let result = if valid { "valid" } else { "invalid" };
    span.set_attribute(KeyValue::new("idemgate.verify.result", result));
    if !valid {
        span.set_status(Status::error("invalid signature"));
    }
}
