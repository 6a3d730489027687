//! What a request's spans are while it runs, and the OTLP protobuf they
//! become on the export thread.
//!
//! Why not the SDK's spans: measured in the load harness (issue 53), the
//! SDK's span objects (a builder, a sampler and `Context` lookups, a
//! mutex per span, a `SpanData` moved through the processor) cost about
//! 47 µs of CPU per request on the request threads, and its exporter's
//! conversion about 4 µs per span on the export thread: (b) at
//! `sample: 1.0` ran at 0.72 of tracing off. Here a span is a plain record
//! filled in place, a request's spans leave as one [`TraceRecord`], and
//! the messages are built from them directly with the OTLP crate's own
//! generated types (`opentelemetry-proto`), so the wire format is theirs.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::KeyValue;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span, status, ResourceSpans, ScopeSpans, Span, Status,
};
use opentelemetry_proto::transform::common::tonic::Attributes;
use prost::Message;

use crate::store::TraceRef;

/// A span's kind (the three idemgate makes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Server,
    Internal,
    Client,
}

/// A link to another trace's span, with why (`idemgate.link`).
#[derive(Debug, Clone, Copy)]
pub struct LinkTo {
    pub to: TraceRef,
    pub why: &'static str,
}

/// One span as it is filled in: IDs, times, attributes, links, status.
#[derive(Debug)]
pub struct SpanRecord {
    pub span_id: [u8; 8],
    /// The parent's span ID; all zero for a root.
    pub parent: [u8; 8],
    pub name: std::borrow::Cow<'static, str>,
    pub kind: Kind,
    /// Nanoseconds since the Unix epoch.
    pub start: u64,
    pub end: u64,
    pub attributes: Vec<KeyValue>,
    pub links: Vec<LinkTo>,
    /// `Some(description)` once the span is marked as an error.
    pub error: Option<&'static str>,
}

impl SpanRecord {
    /// A span starting now.
    pub fn start(
        span_id: [u8; 8],
        parent: [u8; 8],
        name: impl Into<std::borrow::Cow<'static, str>>,
        kind: Kind,
        attributes: Vec<KeyValue>,
    ) -> SpanRecord {
        SpanRecord {
            span_id,
            parent,
            name: name.into(),
            kind,
            start: now_nanos(),
            end: 0,
            attributes,
            links: Vec::new(),
            error: None,
        }
    }

    /// Ends the span now, unless it has ended.
    pub fn finish(&mut self) {
        if self.end == 0 {
            self.end = now_nanos().max(self.start);
        }
    }
}

/// A request's recorded spans, in one trace: what the queue carries.
#[derive(Debug)]
pub struct TraceRecord {
    pub trace_id: [u8; 16],
    /// The W3C `tracestate` every span of the trace carries ("" for none).
    pub state: String,
    /// The SERVER span's parent is the sender's (a trusted route's).
    pub remote_parent: bool,
    /// The SERVER span first.
    pub spans: Vec<SpanRecord>,
}

/// The span's `flags` field: W3C's sampled bit (every exported span is
/// sampled), and whether its parent is remote, known (OTLP's
/// `SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK` and `..._IS_REMOTE_MASK`).
fn flags(remote: bool) -> u32 {
    const SAMPLED: u32 = 0x01;
    const HAS_IS_REMOTE: u32 = 0x100;
    const IS_REMOTE: u32 = 0x200;
    SAMPLED | HAS_IS_REMOTE | if remote { IS_REMOTE } else { 0 }
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The OTLP span of `span` in `trace`.
fn span(trace: &TraceRecord, span: SpanRecord) -> Span {
    let remote = span.kind == Kind::Server && trace.remote_parent;
    let root = span.parent == [0; 8];
    Span {
        trace_id: trace.trace_id.to_vec(),
        span_id: span.span_id.to_vec(),
        trace_state: trace.state.clone(),
        parent_span_id: if root {
            Vec::new()
        } else {
            span.parent.to_vec()
        },
        flags: flags(remote),
        name: span.name.into_owned(),
        kind: match span.kind {
            Kind::Server => span::SpanKind::Server,
            Kind::Internal => span::SpanKind::Internal,
            Kind::Client => span::SpanKind::Client,
        } as i32,
        start_time_unix_nano: span.start,
        end_time_unix_nano: span.end.max(span.start),
        attributes: Attributes::from(span.attributes).0,
        links: span
            .links
            .into_iter()
            .map(|l| span::Link {
                trace_id: l.to.trace_id.to_vec(),
                span_id: l.to.span_id.to_vec(),
                attributes: Attributes::from([KeyValue::new("idemgate.link", l.why)]).0,
                // the linked send was recorded, in another request
                flags: flags(true),
                ..Default::default()
            })
            .collect(),
        status: Some(match span.error {
            Some(message) => Status {
                code: status::StatusCode::Error as i32,
                message: message.to_owned(),
            },
            None => Status::default(),
        }),
        ..Default::default()
    }
}

/// The export request's body for `traces`: one resource (`resource`'s
/// attributes), one instrumentation scope (`idemgate`), protobuf-encoded.
pub fn encode(traces: Vec<TraceRecord>, resource: &[KeyValue]) -> Vec<u8> {
    let spans = traces
        .into_iter()
        .flat_map(|mut t| {
            let records = std::mem::take(&mut t.spans);
            records
                .into_iter()
                .map(move |s| span(&t, s))
                .collect::<Vec<_>>()
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: Attributes::from(resource.iter().cloned()).0,
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "idemgate".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;

    fn record(span_id: u8, parent: u8, kind: Kind) -> SpanRecord {
        let mut s = SpanRecord::start(
            [span_id; 8],
            [parent; 8],
            "name",
            kind,
            vec![KeyValue::new("k", "v"), KeyValue::new("n", 7_i64)],
        );
        s.finish();
        s
    }

    fn decode(traces: Vec<TraceRecord>) -> Vec<Span> {
        let body = encode(traces, &[KeyValue::new("service.name", "svc")]);
        let req = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        let [rs] = <[ResourceSpans; 1]>::try_from(req.resource_spans).unwrap();
        let attrs = rs.resource.unwrap().attributes;
        assert_eq!(attrs[0].key, "service.name");
        let [ss] = <[ScopeSpans; 1]>::try_from(rs.scope_spans).unwrap();
        assert_eq!(ss.scope.unwrap().name, "idemgate");
        ss.spans
    }

    #[test]
    fn a_trace_encodes_its_tree_flags_and_attributes() {
        let mut server = record(1, 9, Kind::Server);
        server.links.push(LinkTo {
            to: TraceRef {
                trace_id: [3; 16],
                span_id: [4; 8],
            },
            why: "replayed",
        });
        let mut child = record(2, 1, Kind::Internal);
        child.error = Some("invalid signature");
        let trace = TraceRecord {
            trace_id: [7; 16],
            state: "k=v".into(),
            remote_parent: true,
            spans: vec![server, child, record(5, 1, Kind::Client)],
        };
        let spans = decode(vec![trace]);
        assert_eq!(spans.len(), 3);
        let (s, c, send) = (&spans[0], &spans[1], &spans[2]);
        assert_eq!(s.trace_id, vec![7; 16]);
        assert_eq!(s.parent_span_id, vec![9; 8]);
        assert_eq!(s.kind, span::SpanKind::Server as i32);
        assert_eq!(s.flags, 0x301, "sampled, parent remote and known");
        assert_eq!(s.trace_state, "k=v");
        assert_eq!(s.links.len(), 1);
        assert_eq!(s.links[0].span_id, vec![4; 8]);
        assert_eq!(s.links[0].attributes[0].key, "idemgate.link");
        assert_eq!(c.parent_span_id, vec![1; 8]);
        assert_eq!(c.flags, 0x101, "a local parent");
        assert_eq!(
            c.status.as_ref().unwrap().code,
            status::StatusCode::Error as i32
        );
        assert_eq!(c.status.as_ref().unwrap().message, "invalid signature");
        assert_eq!(send.kind, span::SpanKind::Client as i32);
        assert!(send.end_time_unix_nano >= send.start_time_unix_nano);
        let value = |i: usize| send.attributes[i].value.clone().unwrap().value.unwrap();
        assert_eq!(value(0), Value::StringValue("v".into()));
        assert_eq!(value(1), Value::IntValue(7));
    }

    #[test]
    fn a_root_has_no_parent_and_no_remote_bit() {
        let trace = TraceRecord {
            trace_id: [7; 16],
            state: String::new(),
            remote_parent: false,
            spans: vec![record(1, 0, Kind::Server)],
        };
        let spans = decode(vec![trace]);
        assert!(spans[0].parent_span_id.is_empty());
        assert_eq!(spans[0].flags, 0x101);
        assert_eq!(spans[0].status.as_ref().unwrap().code, 0, "unset");
    }

    #[test]
    fn an_unended_span_never_ends_before_it_starts() {
        let mut s = record(1, 0, Kind::Server);
        s.end = 0;
        let trace = TraceRecord {
            trace_id: [7; 16],
            state: String::new(),
            remote_parent: false,
            spans: vec![s],
        };
        let spans = decode(vec![trace]);
        assert_eq!(spans[0].end_time_unix_nano, spans[0].start_time_unix_nano);
    }
}
