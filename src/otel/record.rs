//! What a request's spans are while it runs, and the OTLP protobuf they
//! become on the export thread (`ExportTraceServiceRequest`, written field
//! by field: [`encode`]).
//!
//! Why not the SDK's spans: measured in the load harness (issue 53), the
//! SDK's span objects (a builder, a sampler and `Context` lookups, a
//! mutex per span, a `SpanData` moved through the processor) cost about
//! 47 µs of CPU per request on the request threads, and its exporter's
//! conversion about 4 µs per span on the export thread: (b) at
//! `sample: 1.0` ran at 0.72 of tracing off. Here a span is a plain record
//! filled in place, and a request's spans leave as one [`TraceRecord`].
//! Building `opentelemetry-proto`'s generated messages from the records
//! still cost about 4 µs per request on the export thread (an owned string
//! per attribute key and value, then prost's encoding), so they are written
//! straight into protobuf's wire format; the tests decode what is written
//! with those generated messages, so the field numbers and types are
//! theirs.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::KeyValue;

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
#[derive(Debug, Default)]
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

/// Protobuf's wire format, as much of it as OTLP's trace messages need.
mod wire {
    /// Wire types.
    pub const VARINT: u32 = 0;
    pub const FIXED64: u32 = 1;
    pub const LEN: u32 = 2;
    pub const FIXED32: u32 = 5;

    pub fn varint(buf: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            buf.push(v as u8 | 0x80);
            v >>= 7;
        }
        buf.push(v as u8);
    }

    pub fn key(buf: &mut Vec<u8>, field: u32, wire: u32) {
        varint(buf, u64::from(field << 3 | wire));
    }

    pub fn bytes(buf: &mut Vec<u8>, field: u32, b: &[u8]) {
        key(buf, field, LEN);
        varint(buf, b.len() as u64);
        buf.extend_from_slice(b);
    }

    /// A string or bytes field, left out when empty (proto3's default).
    pub fn bytes_unless_empty(buf: &mut Vec<u8>, field: u32, b: &[u8]) {
        if !b.is_empty() {
            bytes(buf, field, b);
        }
    }

    pub fn fixed64(buf: &mut Vec<u8>, field: u32, v: u64) {
        key(buf, field, FIXED64);
        buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn fixed32(buf: &mut Vec<u8>, field: u32, v: u32) {
        key(buf, field, FIXED32);
        buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn uint(buf: &mut Vec<u8>, field: u32, v: u64) {
        key(buf, field, VARINT);
        varint(buf, v);
    }

    /// A message field: `body` writes the message, its length goes in
    /// front (one byte guessed, the body moved when it needs more).
    pub fn message(buf: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
        key(buf, field, LEN);
        let at = buf.len();
        buf.push(0);
        body(buf);
        let len = buf.len() - at - 1;
        if len < 0x80 {
            buf[at] = len as u8;
        } else {
            let mut prefix = Vec::with_capacity(10);
            varint(&mut prefix, len as u64);
            buf.splice(at..=at, prefix);
        }
    }
}

/// OTLP's field numbers (opentelemetry/proto/{collector/trace,trace,
/// common,resource}/v1).
mod field {
    pub const REQUEST_RESOURCE_SPANS: u32 = 1;
    pub const RESOURCE_SPANS_RESOURCE: u32 = 1;
    pub const RESOURCE_SPANS_SCOPE_SPANS: u32 = 2;
    pub const RESOURCE_ATTRIBUTES: u32 = 1;
    pub const SCOPE_SPANS_SCOPE: u32 = 1;
    pub const SCOPE_SPANS_SPANS: u32 = 2;
    pub const SCOPE_NAME: u32 = 1;
    pub const SCOPE_VERSION: u32 = 2;
    pub const SPAN_TRACE_ID: u32 = 1;
    pub const SPAN_SPAN_ID: u32 = 2;
    pub const SPAN_TRACE_STATE: u32 = 3;
    pub const SPAN_PARENT_SPAN_ID: u32 = 4;
    pub const SPAN_NAME: u32 = 5;
    pub const SPAN_KIND: u32 = 6;
    pub const SPAN_START: u32 = 7;
    pub const SPAN_END: u32 = 8;
    pub const SPAN_ATTRIBUTES: u32 = 9;
    pub const SPAN_LINKS: u32 = 13;
    pub const SPAN_STATUS: u32 = 15;
    pub const SPAN_FLAGS: u32 = 16;
    pub const LINK_TRACE_ID: u32 = 1;
    pub const LINK_SPAN_ID: u32 = 2;
    pub const LINK_ATTRIBUTES: u32 = 4;
    pub const LINK_FLAGS: u32 = 6;
    pub const STATUS_MESSAGE: u32 = 2;
    pub const STATUS_CODE: u32 = 3;
    pub const KEY_VALUE_KEY: u32 = 1;
    pub const KEY_VALUE_VALUE: u32 = 2;
    pub const ANY_STRING: u32 = 1;
    pub const ANY_BOOL: u32 = 2;
    pub const ANY_INT: u32 = 3;
    pub const ANY_DOUBLE: u32 = 4;
}

/// `SpanKind`'s and `StatusCode`'s numbers.
const KIND_INTERNAL: u64 = 1;
const KIND_SERVER: u64 = 2;
const KIND_CLIENT: u64 = 3;
const STATUS_ERROR: u64 = 2;

fn attribute(buf: &mut Vec<u8>, field: u32, kv: &KeyValue) {
    use opentelemetry::Value;
    wire::message(buf, field, |buf| {
        wire::bytes(buf, field::KEY_VALUE_KEY, kv.key.as_str().as_bytes());
        wire::message(buf, field::KEY_VALUE_VALUE, |buf| match &kv.value {
            Value::String(s) => wire::bytes(buf, field::ANY_STRING, s.as_str().as_bytes()),
            Value::I64(i) => wire::uint(buf, field::ANY_INT, *i as u64),
            Value::Bool(b) => wire::uint(buf, field::ANY_BOOL, u64::from(*b)),
            Value::F64(f) => wire::fixed64(buf, field::ANY_DOUBLE, f.to_bits()),
            // idemgate sets no arrays; one would go as its text
            other => wire::bytes(buf, field::ANY_STRING, other.to_string().as_bytes()),
        });
    });
}

/// The OTLP span of `span` in `trace`.
fn span(buf: &mut Vec<u8>, trace: &TraceRecord, span: &SpanRecord) {
    use field::*;
    let remote = span.kind == Kind::Server && trace.remote_parent;
    wire::message(buf, SCOPE_SPANS_SPANS, |buf| {
        wire::bytes(buf, SPAN_TRACE_ID, &trace.trace_id);
        wire::bytes(buf, SPAN_SPAN_ID, &span.span_id);
        wire::bytes_unless_empty(buf, SPAN_TRACE_STATE, trace.state.as_bytes());
        if span.parent != [0; 8] {
            wire::bytes(buf, SPAN_PARENT_SPAN_ID, &span.parent);
        }
        wire::bytes(buf, SPAN_NAME, span.name.as_bytes());
        let kind = match span.kind {
            Kind::Server => KIND_SERVER,
            Kind::Internal => KIND_INTERNAL,
            Kind::Client => KIND_CLIENT,
        };
        wire::uint(buf, SPAN_KIND, kind);
        wire::fixed64(buf, SPAN_START, span.start);
        wire::fixed64(buf, SPAN_END, span.end.max(span.start));
        for kv in &span.attributes {
            attribute(buf, SPAN_ATTRIBUTES, kv);
        }
        for l in &span.links {
            wire::message(buf, SPAN_LINKS, |buf| {
                wire::bytes(buf, LINK_TRACE_ID, &l.to.trace_id);
                wire::bytes(buf, LINK_SPAN_ID, &l.to.span_id);
                attribute(buf, LINK_ATTRIBUTES, &KeyValue::new("idemgate.link", l.why));
                // the linked send was recorded, in another request
                wire::fixed32(buf, LINK_FLAGS, flags(true));
            });
        }
        wire::message(buf, SPAN_STATUS, |buf| {
            if let Some(message) = span.error {
                wire::bytes_unless_empty(buf, STATUS_MESSAGE, message.as_bytes());
                wire::uint(buf, STATUS_CODE, STATUS_ERROR);
            }
        });
        wire::fixed32(buf, SPAN_FLAGS, flags(remote));
    });
}

/// The export request's body for `traces`: one resource (`resource`'s
/// attributes), one instrumentation scope (`idemgate`), protobuf-encoded.
pub fn encode(traces: &[TraceRecord], resource: &[KeyValue]) -> Vec<u8> {
    use field::*;
    let spans: usize = traces.iter().map(|t| t.spans.len()).sum();
    let mut buf = Vec::with_capacity(128 + spans * 320);
    wire::message(&mut buf, REQUEST_RESOURCE_SPANS, |buf| {
        wire::message(buf, RESOURCE_SPANS_RESOURCE, |buf| {
            for kv in resource {
                attribute(buf, RESOURCE_ATTRIBUTES, kv);
            }
        });
        wire::message(buf, RESOURCE_SPANS_SCOPE_SPANS, |buf| {
            wire::message(buf, SCOPE_SPANS_SCOPE, |buf| {
                wire::bytes(buf, SCOPE_NAME, b"idemgate");
                wire::bytes(buf, SCOPE_VERSION, env!("CARGO_PKG_VERSION").as_bytes());
            });
            for t in traces {
                for s in &t.spans {
                    span(buf, t, s);
                }
            }
        });
    });
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::trace::v1::{span, status, ResourceSpans, ScopeSpans, Span};
    use prost::Message;

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
        let body = encode(&traces, &[KeyValue::new("service.name", "svc")]);
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

    #[test]
    fn every_value_type_and_a_large_batch_decode_as_written() {
        let long = "p".repeat(20_000);
        let traces: Vec<TraceRecord> = (0..600u32)
            .map(|i| {
                let mut s = record(1, 0, Kind::Server);
                s.attributes = vec![
                    KeyValue::new("s", long.clone()),
                    KeyValue::new("i", -5_i64),
                    KeyValue::new("b", true),
                    KeyValue::new("f", 1.5_f64),
                    KeyValue::new("n", i64::from(i)),
                ];
                TraceRecord {
                    trace_id: [7; 16],
                    state: String::new(),
                    remote_parent: false,
                    spans: vec![s],
                }
            })
            .collect();
        let spans = decode(traces);
        assert_eq!(spans.len(), 600);
        for (i, s) in spans.iter().enumerate() {
            let v: Vec<Value> = s
                .attributes
                .iter()
                .map(|a| a.value.clone().unwrap().value.unwrap())
                .collect();
            assert_eq!(v[0], Value::StringValue(long.clone()));
            assert_eq!(v[1], Value::IntValue(-5));
            assert_eq!(v[2], Value::BoolValue(true));
            assert_eq!(v[3], Value::DoubleValue(1.5));
            assert_eq!(v[4], Value::IntValue(i as i64), "in order");
        }
    }
}
