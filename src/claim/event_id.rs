//! Event IDs: validation (SPEC §4) and extraction from a JSON body (SPEC §2 `event_id.json_pointer`).
//!
//! A valid event ID is 1..=255 bytes, each visible ASCII (0x21..=0x7E). Error
//! messages never echo the ID's bytes: they may be anything a sender put there.

use std::borrow::Cow;

use serde_json::Value;
use thiserror::Error;

use super::json_pointer::{self, PointerError};

/// Longest event ID accepted, in bytes.
pub const MAX_EVENT_ID_LEN: usize = 255;

/// Why a raw event ID was refused. Messages never contain the ID itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum InvalidEventId {
    #[error("the event ID is empty")]
    Empty,
    #[error("the event ID is {len} bytes long; at most {MAX_EVENT_ID_LEN} are allowed")]
    TooLong { len: usize },
    #[error("the event ID has a byte that is not visible ASCII (0x21-0x7E) at offset {at}")]
    NotVisibleAscii { at: usize },
}

/// Checks a raw event ID (a header value or extracted JSON text) and returns it as `&str`.
pub fn validate_event_id(raw: &[u8]) -> Result<&str, InvalidEventId> {
    if raw.is_empty() {
        return Err(InvalidEventId::Empty);
    }
    if raw.len() > MAX_EVENT_ID_LEN {
        return Err(InvalidEventId::TooLong { len: raw.len() });
    }
    if let Some(at) = raw.iter().position(|&b| !(0x21..=0x7E).contains(&b)) {
        return Err(InvalidEventId::NotVisibleAscii { at });
    }
    // Every byte is ASCII, so this cannot fail; no unsafe needed.
    std::str::from_utf8(raw).map_err(|e| InvalidEventId::NotVisibleAscii {
        at: e.valid_up_to(),
    })
}

/// Why no event ID could be taken from a JSON body.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum JsonIdError {
    /// Nothing at the pointer (missing member, index out of range, pointer through a scalar).
    #[error("the JSON body has no value at the event-ID pointer")]
    Absent,
    /// The value at the pointer is neither a string nor a number.
    #[error("the value at the event-ID pointer is {found}, not a string or a number")]
    WrongType { found: &'static str },
    /// A string or number was found but is not a valid event ID.
    #[error("{0}")]
    Invalid(#[from] InvalidEventId),
    /// The pointer text itself is not an RFC 6901 pointer (a configuration error;
    /// config validation should have caught it). Only [`event_id_from_json`] returns it.
    #[error("the event-ID JSON pointer is malformed: {0}")]
    Pointer(#[from] PointerError),
}

/// The event ID at the RFC 6901 `pointer` in `doc`.
///
/// Parses the pointer on every call; on the hot path parse it once with
/// [`json_pointer::parse_pointer`] and call [`event_id_from_json_tokens`].
pub fn event_id_from_json(doc: &Value, pointer: &str) -> Result<String, JsonIdError> {
    let tokens = json_pointer::parse_pointer(pointer)?;
    event_id_from_json_tokens(doc, &tokens)
}

/// The event ID at an already-parsed pointer.
///
/// - a string is taken as it is;
/// - an integer (i64/u64 range) becomes its exact decimal text (`12345`, `-7`);
/// - any other number (fraction, exponent, or beyond u64) becomes the ECMAScript
///   Number-to-String text of the double, i.e. the shortest round-trip form as a
///   JavaScript sender would print it (`1.5`, `12345` for `12345.0`, `1e+30`);
/// - anything else is [`JsonIdError::WrongType`].
///
/// The result is then checked with [`validate_event_id`].
pub fn event_id_from_json_tokens(doc: &Value, tokens: &[String]) -> Result<String, JsonIdError> {
    let value = json_pointer::lookup(doc, tokens).ok_or(JsonIdError::Absent)?;
    let text = id_text(value)?;
    validate_event_id(text.as_bytes())?;
    Ok(text.into_owned())
}

/// The text of a string or number as an event ID takes it (see
/// [`event_id_from_json_tokens`]), not yet validated.
pub fn id_text(value: &Value) -> Result<Cow<'_, str>, JsonIdError> {
    match value {
        Value::String(s) => Ok(Cow::Borrowed(s)),
        Value::Number(n) => Ok(Cow::Owned(number_text(n))),
        Value::Null => Err(JsonIdError::WrongType { found: "null" }),
        Value::Bool(_) => Err(JsonIdError::WrongType { found: "a boolean" }),
        Value::Array(_) => Err(JsonIdError::WrongType { found: "an array" }),
        Value::Object(_) => Err(JsonIdError::WrongType { found: "an object" }),
    }
}

/// Why the parts of a composite ID (SPEC §17) make no valid ID. Messages
/// name the part by its position, never its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PartsError {
    #[error("part {part} of the event ID is empty")]
    EmptyPart { part: usize },
    /// Only the last part may hold `:`, so that the join is unambiguous:
    /// tenant `a:b` with ID `c` must not be tenant `a` with ID `b:c`.
    #[error("part {part} of the event ID holds `:`, which only the last part may")]
    Colon { part: usize },
    #[error("{0}")]
    Invalid(#[from] InvalidEventId),
}

/// Joins the parts of a composite ID with `:` and validates the whole.
pub fn join_parts<'a>(parts: impl ExactSizeIterator<Item = &'a str>) -> Result<String, PartsError> {
    let last = parts.len().saturating_sub(1);
    let mut id = String::with_capacity(64);
    for (i, part) in parts.enumerate() {
        if part.is_empty() {
            return Err(PartsError::EmptyPart { part: i + 1 });
        }
        if i < last && part.contains(':') {
            return Err(PartsError::Colon { part: i + 1 });
        }
        if i > 0 {
            id.push(':');
        }
        id.push_str(part);
        if id.len() > MAX_EVENT_ID_LEN {
            break; // refused below, without copying the rest
        }
    }
    validate_event_id(id.as_bytes())?;
    Ok(id)
}

fn number_text(n: &serde_json::Number) -> String {
    if let Some(u) = n.as_u64() {
        u.to_string()
    } else if let Some(i) = n.as_i64() {
        i.to_string()
    } else {
        // A serde_json Number is always finite (without arbitrary_precision it
        // cannot hold NaN or infinities), so as_f64 is Some and finite here.
        let f = n.as_f64().unwrap_or(0.0);
        let mut buf = ryu_js::Buffer::new();
        buf.format(f).to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn empty_is_rejected() {
        assert_eq!(validate_event_id(b""), Err(InvalidEventId::Empty));
    }

    #[test]
    fn lengths() {
        assert_eq!(validate_event_id(b"a"), Ok("a"));
        let max = vec![b'x'; 255];
        assert_eq!(validate_event_id(&max).map(str::len), Ok(255));
        let over = vec![b'x'; 256];
        assert_eq!(
            validate_event_id(&over),
            Err(InvalidEventId::TooLong { len: 256 })
        );
        let huge = vec![b' '; 10_000];
        assert_eq!(
            validate_event_id(&huge),
            Err(InvalidEventId::TooLong { len: 10_000 })
        );
    }

    #[test]
    fn every_byte_value() {
        for b in 0u8..=255 {
            let raw = [b'a', b, b'z'];
            let r = validate_event_id(&raw);
            if (0x21..=0x7E).contains(&b) {
                assert!(r.is_ok(), "byte {b:#04x} should be accepted");
            } else {
                assert_eq!(
                    r,
                    Err(InvalidEventId::NotVisibleAscii { at: 1 }),
                    "byte {b:#04x}"
                );
            }
        }
    }

    #[test]
    fn named_invalid_bytes() {
        for (raw, at) in [
            (&b" abc"[..], 0),       // space
            (&b"ab\tc"[..], 2),      // tab
            (&b"abc\x7f"[..], 3),    // DEL
            (&b"\x80"[..], 0),       // high bit
            (&b"ab\xc3\xa9"[..], 2), // UTF-8 "é"
            (&b"\x00"[..], 0),       // NUL
            (&b"a\r\nb"[..], 1),     // CR LF
            (&b"a\x1b"[..], 1),      // ESC
            (&b"evt_1 "[..], 5),     // trailing space
        ] {
            assert_eq!(
                validate_event_id(raw),
                Err(InvalidEventId::NotVisibleAscii { at })
            );
        }
        assert_eq!(validate_event_id(b"!~"), Ok("!~"));
        assert_eq!(validate_event_id(b"evt_1Nq2\"{}"), Ok("evt_1Nq2\"{}"));
    }

    #[test]
    fn messages_never_echo_the_id() {
        let secret = b"SECRET-ID\x01";
        let msg = validate_event_id(secret).unwrap_err().to_string();
        assert!(!msg.contains("SECRET"), "{msg}");
        assert!(msg.contains("offset 9"), "{msg}");
        let msg = validate_event_id(&[b'S'; 300]).unwrap_err().to_string();
        assert!(!msg.contains("SSS") && msg.contains("300"), "{msg}");
        let doc = json!({"id": "SECRET ID"});
        let msg = event_id_from_json(&doc, "/id").unwrap_err().to_string();
        assert!(!msg.contains("SECRET"), "{msg}");
    }

    fn id(doc: &Value, p: &str) -> Result<String, JsonIdError> {
        event_id_from_json(doc, p)
    }

    #[test]
    fn json_strings_and_numbers() {
        let doc: Value = serde_json::from_str(
            r#"{"s":"evt_123","i":12345,"n":-7,"z":0,"f":1.5,"fi":12345.0,"e":1e30,
                "big":18446744073709551615,"min":-9223372036854775808,"huge":100000000000000000000000,
                "small":1e-7,"data":{"object":{"id":"in/ner"}}}"#,
        )
        .unwrap();
        for (pointer, want) in [
            ("/s", "evt_123"),
            ("/i", "12345"),
            ("/n", "-7"),
            ("/z", "0"),
            ("/f", "1.5"),
            ("/fi", "12345"),
            ("/e", "1e+30"),
            ("/big", "18446744073709551615"),
            ("/min", "-9223372036854775808"),
            ("/huge", "1e+23"),
            ("/small", "1e-7"),
            ("/data/object/id", "in/ner"),
        ] {
            assert_eq!(id(&doc, pointer).unwrap(), want, "{pointer}");
        }
        let tokens = json_pointer::parse_pointer("/data/object/id").unwrap();
        assert_eq!(event_id_from_json_tokens(&doc, &tokens).unwrap(), "in/ner");
    }

    #[test]
    fn json_wrong_types_and_absent() {
        let doc = json!({"b": true, "f": false, "n": null, "o": {}, "a": [1], "s": ["x"]});
        for (pointer, found) in [
            ("/b", "a boolean"),
            ("/f", "a boolean"),
            ("/n", "null"),
            ("/o", "an object"),
            ("/a", "an array"),
            ("", "an object"),
        ] {
            assert_eq!(
                id(&doc, pointer),
                Err(JsonIdError::WrongType { found }),
                "{pointer:?}"
            );
        }
        assert_eq!(id(&doc, "/missing"), Err(JsonIdError::Absent));
        assert_eq!(id(&doc, "/b/x"), Err(JsonIdError::Absent));
        assert_eq!(id(&doc, "/a/1"), Err(JsonIdError::Absent));
        assert_eq!(id(&json!("top"), "/id"), Err(JsonIdError::Absent));
        assert_eq!(id(&json!("top"), "").unwrap(), "top");
        assert!(matches!(id(&doc, "id"), Err(JsonIdError::Pointer(_))));
    }

    #[test]
    fn json_invalid_ids() {
        let long = "x".repeat(256);
        let doc = json!({"e": "", "sp": "a b", "u": "é", "l": long, "ok": "x".repeat(255)});
        assert_eq!(
            id(&doc, "/e"),
            Err(JsonIdError::Invalid(InvalidEventId::Empty))
        );
        assert_eq!(
            id(&doc, "/sp"),
            Err(JsonIdError::Invalid(InvalidEventId::NotVisibleAscii {
                at: 1
            }))
        );
        assert_eq!(
            id(&doc, "/u"),
            Err(JsonIdError::Invalid(InvalidEventId::NotVisibleAscii {
                at: 0
            }))
        );
        assert_eq!(
            id(&doc, "/l"),
            Err(JsonIdError::Invalid(InvalidEventId::TooLong { len: 256 }))
        );
        assert_eq!(id(&doc, "/ok").unwrap().len(), 255);
    }

    #[test]
    fn composite_ids_join_with_colons_and_refuse_ambiguity() {
        let join = |parts: &[&str]| join_parts(parts.iter().copied());
        assert_eq!(join(&["T1", "Ev1"]).unwrap(), "T1:Ev1");
        assert_eq!(join(&["only"]).unwrap(), "only");
        // the last part may hold `:`; earlier ones may not
        assert_eq!(join(&["T1", "urn:x:1"]).unwrap(), "T1:urn:x:1");
        assert_eq!(join(&["a:b", "c"]), Err(PartsError::Colon { part: 1 }));
        assert_eq!(
            join(&["a", "", "c"]),
            Err(PartsError::EmptyPart { part: 2 })
        );
        assert_eq!(
            join(&["a b", "c"]),
            Err(PartsError::Invalid(InvalidEventId::NotVisibleAscii {
                at: 1
            }))
        );
        let long = "x".repeat(200);
        assert_eq!(
            join(&[&long, &long]),
            Err(PartsError::Invalid(InvalidEventId::TooLong { len: 401 }))
        );
        let msg = join(&["SECRET:X", "y"]).unwrap_err().to_string();
        assert!(!msg.contains("SECRET"), "{msg}");
    }

    #[test]
    fn id_text_is_what_a_pointer_id_takes() {
        let doc = json!({"s": "x", "n": 7, "f": 1.5, "b": true});
        assert_eq!(id_text(&doc["s"]).unwrap(), "x");
        assert_eq!(id_text(&doc["n"]).unwrap(), "7");
        assert_eq!(id_text(&doc["f"]).unwrap(), "1.5");
        assert_eq!(
            id_text(&doc["b"]),
            Err(JsonIdError::WrongType { found: "a boolean" })
        );
    }
}
