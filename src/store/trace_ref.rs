//! The send a record remembers (SPEC §19): the trace and span ID of the
//! CLIENT span that forwarded its latest attempt, so that a duplicate's
//! span (a replay, a 409, a 422, a reclaim) can link to it. Every engine
//! keeps it as one text, [`TraceRef::stored`]: `<32 hex>-<16 hex>`, the
//! middle of a W3C `traceparent`.

use std::fmt;

/// A trace ID and a span ID, neither all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceRef {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
}

impl TraceRef {
    /// The text every engine keeps: 49 bytes.
    pub fn stored(&self) -> String {
        let mut text = String::with_capacity(49);
        self.push_to(&mut text);
        text
    }

    /// As an engine read it back; `None` for anything that is not
    /// [`stored`](Self::stored)'s form (a hand edit, or an empty text).
    pub fn from_stored(text: &str) -> Option<TraceRef> {
        let (trace, span) = text.split_once('-')?;
        let trace_id = hex_array::<16>(trace)?;
        let span_id = hex_array::<8>(span)?;
        let zero = trace_id == [0; 16] || span_id == [0; 8];
        (!zero).then_some(TraceRef { trace_id, span_id })
    }

    /// A column or hash field read back: `None` for NULL or absent (the
    /// send was not traced, or a process of the release before wrote the
    /// record) as for a text that is not [`stored`](Self::stored)'s form.
    pub fn from_column(text: Option<&str>) -> Option<TraceRef> {
        text.and_then(TraceRef::from_stored)
    }

    /// A [`Record`](super::Record)'s `trace_id` and `span_id`: both or
    /// neither.
    pub fn record_ids(trace: Option<TraceRef>) -> (Option<String>, Option<String>) {
        match trace {
            Some(t) => (Some(t.trace_hex()), Some(t.span_hex())),
            None => (None, None),
        }
    }

    /// Appends [`stored`](Self::stored)'s text to `out` (the middle of a
    /// `traceparent`), without a string of its own.
    pub fn push_to(&self, out: &mut String) {
        push_hex(out, &self.trace_id);
        out.push('-');
        push_hex(out, &self.span_id);
    }

    /// The trace ID as 32 lowercase hex digits.
    pub fn trace_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span ID as 16 lowercase hex digits.
    pub fn span_hex(&self) -> String {
        hex(&self.span_id)
    }
}

impl fmt::Display for TraceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.stored())
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    push_hex(&mut s, bytes);
    s
}

/// Appends `bytes` as lowercase hex. By table, not `{:02x}`: a traced
/// request writes about 60 bytes so (its `traceparent`, the stored send,
/// the log line's trace ID), and with the formatter's machinery per byte
/// tracing added about 20 µs of CPU per request in the load harness's
/// (o), against about 8 µs by table (docs/performance.md, "Tracing").
fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
}

/// `N` bytes from exactly `2N` lowercase hex digits.
fn hex_array<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_text_round_trips_and_refuses_anything_else() {
        let t = TraceRef {
            trace_id: *b"\x4b\xf9\x2f\x35\x77\xb3\x4d\xa6\xa3\xce\x92\x9d\x0e\x0e\x47\x36",
            span_id: *b"\x00\xf0\x67\xaa\x0b\xa9\x02\xb7",
        };
        let s = t.stored();
        assert_eq!(s, "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7");
        assert_eq!(TraceRef::from_stored(&s), Some(t));
        for bad in [
            "",
            "4bf92f3577b34da6a3ce929d0e0e4736",
            "4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7",
            "00000000000000000000000000000000-00f067aa0ba902b7",
            "4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000",
            "4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7",
            "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceRef::from_stored(bad), None, "{bad:?}");
            assert_eq!(TraceRef::from_column(Some(bad)), None, "{bad:?}");
        }
        assert_eq!(TraceRef::from_column(None), None);
        assert_eq!(TraceRef::from_column(Some(&s)), Some(t));
        assert_eq!(
            TraceRef::record_ids(Some(t)),
            (
                Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
                Some("00f067aa0ba902b7".into())
            )
        );
        assert_eq!(TraceRef::record_ids(None), (None, None));
    }
}
