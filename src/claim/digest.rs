//! Payload digests (SPEC §2 `digest: raw | json`, `digest_ignore`).
//!
//! - `raw`: SHA-256 of the body bytes.
//! - `json`: SHA-256 of the RFC 8785 (JCS) canonical form of the parsed body,
//!   after removing the `digest_ignore` pointers.
//!
//! The JCS serialiser is hand-written over [`serde_json::Value`] (no crate on
//! crates.io serialises a `Value` without buffering every object member in its
//! own `Vec`); numbers use `ryu-js`, which implements ECMAScript's
//! Number-to-String. For the parse side to be exact, serde_json must be built
//! with its `float_roundtrip` feature (RFC 8785 §3.2.2.3 needs correctly
//! rounded doubles), and must not use `arbitrary_precision`.
//!
//! Duplicate member names: RFC 8785 §3.1 requires I-JSON (RFC 7493), whose
//! §2.3 says objects MUST NOT have duplicate names. serde_json silently keeps
//! the last one, which would let `{"a":1,"a":2}` and `{"a":2}` share a digest
//! (and a consumer that keeps the first would see different data), so
//! [`parse_json_body`] rejects any body with a duplicate name, at any depth.
//! Lone surrogates (`"\ud800"`), also excluded by I-JSON, are rejected by
//! serde_json itself. Nesting deeper than 128 is rejected by serde_json's
//! recursion limit, which also bounds the recursion of the functions here.

use std::cmp::Ordering;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::map::Entry;
use serde_json::{Map, Number, Value};
use sha2::{Digest as _, Sha256};
use thiserror::Error;

use super::json_pointer::{self, JsonPointer};

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// SHA-256 of the body bytes (`digest: raw`).
pub fn raw_digest(body: &[u8]) -> Digest {
    Sha256::digest(body).into()
}

/// Lower-case hex digits: the digest's hex and canonical JSON's `\u00XX`.
const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Lower-case hex, 64 characters, a digit pair per byte from a table:
/// `hex::encode` collects an iterator of chars, and even its
/// `encode_to_slice` took ~490 instructions per request (callgrind).
pub fn to_hex(d: &Digest) -> String {
    let mut out = [0u8; 64];
    for (pair, &b) in out.chunks_exact_mut(2).zip(d) {
        pair[0] = HEX_DIGITS[usize::from(b >> 4)];
        pair[1] = HEX_DIGITS[usize::from(b & 15)];
    }
    String::from_utf8(out.to_vec()).expect("hex digits are ASCII")
}

/// The body is not JSON (or not I-JSON). The message gives the position and
/// serde_json's description of the problem, never bytes of the payload.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("the body is not valid JSON: {reason} at line {line} column {column}")]
pub struct InvalidJsonBody {
    /// 1-based line of the problem (0 if unknown).
    pub line: usize,
    /// 1-based column of the problem, in bytes (0 if unknown or at end of input before any byte).
    pub column: usize,
    /// What is wrong, e.g. "trailing characters", "EOF while parsing an object",
    /// "duplicate object member name".
    pub reason: String,
}

const DUPLICATE_NAME: &str = "duplicate object member name";

/// Parses a request body as one JSON value: trailing non-whitespace is
/// rejected, and so are duplicate member names (see the module docs).
pub fn parse_json_body(body: &[u8]) -> Result<Value, InvalidJsonBody> {
    match serde_json::from_slice::<IJson>(body) {
        Ok(IJson(v)) => Ok(v),
        Err(e) => {
            let (line, column) = (e.line(), e.column());
            let mut reason = e.to_string();
            let suffix = format!(" at line {line} column {column}");
            if reason.ends_with(&suffix) {
                reason.truncate(reason.len() - suffix.len());
            }
            Err(InvalidJsonBody {
                line,
                column,
                reason,
            })
        }
    }
}

/// A `Value` deserialised with duplicate member names rejected.
struct IJson(Value);

impl<'de> Deserialize<'de> for IJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(IJsonVisitor).map(IJson)
    }
}

struct IJsonVisitor;

impl<'de> Visitor<'de> for IJsonVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // serde_json's parser never yields a non-finite double.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        IJson::deserialize(d).map(|IJson(v)| v)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut vec = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(IJson(v)) = seq.next_element()? {
            vec.push(v);
        }
        Ok(Value::Array(vec))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            match members.entry(key) {
                Entry::Vacant(slot) => {
                    let IJson(v) = map.next_value()?;
                    slot.insert(v);
                }
                // Never name the member: it is payload.
                Entry::Occupied(_) => return Err(de::Error::custom(DUPLICATE_NAME)),
            }
        }
        Ok(Value::Object(members))
    }
}

/// The RFC 8785 (JCS) canonical form of `doc`: object members sorted by the
/// UTF-16 code units of their names, no insignificant whitespace, strings
/// escaped as ECMAScript's `JSON.stringify` does, numbers as ECMAScript's
/// Number-to-String of the IEEE 754 double (integers beyond 2^53 are rounded to
/// the nearest double, as RFC 8785 requires).
pub fn canonical_json(doc: &Value) -> Vec<u8> {
    let guess = match doc {
        Value::Object(m) => 2 + 48 * m.len(),
        Value::Array(a) => 2 + 16 * a.len(),
        Value::String(s) => 2 + s.len(),
        _ => 24,
    };
    let mut out = Vec::with_capacity(guess.min(1 << 20));
    write_value(doc, &mut out);
    out
}

/// SHA-256 of the canonical form of `doc` after removing each `ignore` pointer
/// (applied in order; pointers that resolve to nothing are skipped). `doc` is
/// cloned only when at least one pointer resolves. The canonical form is
/// streamed into the hash, never materialised.
pub fn json_digest(doc: &Value, ignore: &[JsonPointer]) -> Digest {
    let needs_removal = ignore.iter().any(|p| {
        let t = p.tokens();
        !t.is_empty() && json_pointer::lookup(doc, t).is_some()
    });
    if needs_removal {
        let mut owned = doc.clone();
        for p in ignore {
            json_pointer::remove(&mut owned, p.tokens());
        }
        hash_canonical(&owned)
    } else {
        hash_canonical(doc)
    }
}

fn hash_canonical(doc: &Value) -> Digest {
    let mut sink = HashSink {
        hasher: Sha256::new(),
        buf: [0; HASH_BUF],
        len: 0,
    };
    write_value(doc, &mut sink);
    sink.finish()
}

/// Where canonical bytes go: a `Vec`, or a buffered SHA-256.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
    fn put_byte(&mut self, b: u8);
}

impl Sink for Vec<u8> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    #[inline]
    fn put_byte(&mut self, b: u8) {
        self.push(b);
    }
}

const HASH_BUF: usize = 4096;

struct HashSink {
    hasher: Sha256,
    buf: [u8; HASH_BUF],
    len: usize,
}

impl HashSink {
    fn flush(&mut self) {
        self.hasher.update(&self.buf[..self.len]);
        self.len = 0;
    }
    fn finish(mut self) -> Digest {
        self.flush();
        self.hasher.finalize().into()
    }
}

impl Sink for HashSink {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > HASH_BUF {
            self.flush();
            if bytes.len() > HASH_BUF {
                self.hasher.update(bytes);
                return;
            }
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }
    #[inline]
    fn put_byte(&mut self, b: u8) {
        if self.len == HASH_BUF {
            self.flush();
        }
        self.buf[self.len] = b;
        self.len += 1;
    }
}

fn write_value<S: Sink>(v: &Value, out: &mut S) {
    match v {
        Value::Null => out.put(b"null"),
        Value::Bool(true) => out.put(b"true"),
        Value::Bool(false) => out.put(b"false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_str(s, out),
        Value::Array(a) => {
            out.put_byte(b'[');
            for (i, item) in a.iter().enumerate() {
                if i > 0 {
                    out.put_byte(b',');
                }
                write_value(item, out);
            }
            out.put_byte(b']');
        }
        Value::Object(m) => write_object(m, out),
    }
}

fn write_object<S: Sink>(m: &Map<String, Value>, out: &mut S) {
    out.put_byte(b'{');
    // serde_json's default map is a BTreeMap, whose order (UTF-8 bytes, i.e.
    // code points) differs from UTF-16 order only when names differ first at a
    // character >= U+E000; so the members are nearly always already in order
    // and no sorting (nor allocation) is needed.
    let mut keys = m.keys();
    let in_order = match keys.next() {
        None => true,
        Some(first) => keys
            .try_fold(first, |prev, k| {
                (cmp_utf16(prev, k) == Ordering::Less).then_some(k)
            })
            .is_some(),
    };
    if in_order {
        for (i, (k, v)) in m.iter().enumerate() {
            write_member(i, k, v, out);
        }
    } else {
        let mut members: Vec<(&String, &Value)> = m.iter().collect();
        members.sort_unstable_by(|a, b| cmp_utf16(a.0, b.0));
        for (i, (k, v)) in members.into_iter().enumerate() {
            write_member(i, k, v, out);
        }
    }
    out.put_byte(b'}');
}

#[inline]
fn write_member<S: Sink>(i: usize, k: &str, v: &Value, out: &mut S) {
    if i > 0 {
        out.put_byte(b',');
    }
    write_str(k, out);
    out.put_byte(b':');
    write_value(v, out);
}

/// Compares two strings by their UTF-16 code units without transcoding them.
fn cmp_utf16(a: &str, b: &str) -> Ordering {
    let (ab, bb) = (a.as_bytes(), b.as_bytes());
    let Some(i) = ab.iter().zip(bb).position(|(x, y)| x != y) else {
        return ab.len().cmp(&bb.len());
    };
    // The strings agree before `i`, so the character containing byte `i`
    // starts at the same offset in both.
    let mut start = i;
    while !a.is_char_boundary(start) {
        start -= 1;
    }
    match (a[start..].chars().next(), b[start..].chars().next()) {
        (Some(ca), Some(cb)) => {
            // A character above U+FFFF starts with a high surrogate (0xD800..=0xDBFF),
            // which sorts below U+E000..=U+FFFF; among themselves such
            // characters keep code-point order.
            let unit = |c: char| if c as u32 > 0xFFFF { 0xD800 } else { c as u32 };
            unit(ca).cmp(&unit(cb)).then((ca as u32).cmp(&(cb as u32)))
        }
        // Unreachable: `i` is inside both strings.
        _ => ab.cmp(bb),
    }
}

fn write_str<S: Sink>(s: &str, out: &mut S) {
    out.put_byte(b'"');
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x09 => b"\\t",
            0x0A => b"\\n",
            0x0C => b"\\f",
            0x0D => b"\\r",
            0x00..=0x1F => &[],
            _ => continue,
        };
        out.put(&bytes[run..i]);
        run = i + 1;
        if short.is_empty() {
            out.put(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX_DIGITS[usize::from(b >> 4)],
                HEX_DIGITS[usize::from(b & 0xF)],
            ]);
        } else {
            out.put(short);
        }
    }
    out.put(&bytes[run..]);
    out.put_byte(b'"');
}

const MAX_SAFE: u64 = 1 << 53;

fn write_number<S: Sink>(n: &Number, out: &mut S) {
    if let Some(u) = n.as_u64() {
        if u <= MAX_SAFE {
            write_u64(u, out);
        } else {
            #[allow(clippy::cast_precision_loss)] // RFC 8785: numbers are IEEE 754 doubles
            write_f64(u as f64, out);
        }
    } else if let Some(i) = n.as_i64() {
        // Negative here (non-negative values are u64).
        if i.unsigned_abs() <= MAX_SAFE {
            out.put_byte(b'-');
            write_u64(i.unsigned_abs(), out);
        } else {
            #[allow(clippy::cast_precision_loss)]
            write_f64(i as f64, out);
        }
    } else {
        write_f64(n.as_f64().unwrap_or(f64::NAN), out);
    }
}

fn write_u64<S: Sink>(mut v: u64, out: &mut S) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    loop {
        at -= 1;
        // v % 10 < 10, so the cast is lossless.
        buf[at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.put(&buf[at..]);
}

fn write_f64<S: Sink>(f: f64, out: &mut S) {
    if f.is_finite() {
        // ECMAScript Number-to-String; -0 prints as "0".
        out.put(ryu_js::Buffer::new().format_finite(f).as_bytes());
    } else {
        // Unreachable with serde_json's default features (a Number is always
        // finite); JSON.stringify writes non-finite numbers as null.
        out.put(b"null");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon_str(json_text: &str) -> String {
        let v = parse_json_body(json_text.as_bytes()).expect("test input parses");
        String::from_utf8(canonical_json(&v)).expect("canonical JSON is UTF-8")
    }

    fn sha(bytes: &[u8]) -> Digest {
        Sha256::digest(bytes).into()
    }

    #[test]
    fn raw_digest_and_hex() {
        let d = raw_digest(b"abc");
        assert_eq!(
            to_hex(&d),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            to_hex(&raw_digest(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    /// RFC 8785 §3.2.2 example (also cyberphone's testdata/values.json).
    #[test]
    fn rfc8785_section_3_2_2() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50,
                      2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        let want = r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#;
        assert_eq!(canon_str(input), want);
        // §3.2.4: the UTF-8 bytes of that output.
        let hex_bytes = "7b 22 6c 69 74 65 72 61 6c 73 22 3a 5b 6e 75 6c 6c 2c 74 72 \
            75 65 2c 66 61 6c 73 65 5d 2c 22 6e 75 6d 62 65 72 73 22 3a \
            5b 33 33 33 33 33 33 33 33 33 2e 33 33 33 33 33 33 33 2c 31 \
            65 2b 33 30 2c 34 2e 35 2c 30 2e 30 30 32 2c 31 65 2d 32 37 \
            5d 2c 22 73 74 72 69 6e 67 22 3a 22 e2 82 ac 24 5c 75 30 30 \
            30 66 5c 6e 41 27 42 5c 22 5c 5c 5c 5c 5c 22 2f 22 7d";
        let want_bytes: Vec<u8> = hex_bytes
            .split_whitespace()
            .map(|h| u8::from_str_radix(h, 16).unwrap())
            .collect();
        assert_eq!(
            canonical_json(&parse_json_body(input.as_bytes()).unwrap()),
            want_bytes
        );
    }

    /// RFC 8785 §3.2.3: member sorting by UTF-16 code units.
    #[test]
    fn rfc8785_section_3_2_3_sorting() {
        let input = r#"{
          "\u20ac": "Euro Sign",
          "\r": "Carriage Return",
          "\ufb33": "Hebrew Letter Dalet With Dagesh",
          "1": "One",
          "\ud83d\ude00": "Emoji: Grinning Face",
          "\u0080": "Control",
          "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        let want = "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
            \"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\
            \"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}";
        assert_eq!(canon_str(input), want);
    }

    /// cyberphone/json-canonicalization testdata (the RFC's reference test set).
    #[test]
    fn reference_testdata() {
        let cases = [
            // arrays.json
            (
                r#"[56, {"d": true, "10": null, "1": [ ]}]"#,
                r#"[56,{"1":[],"10":null,"d":true}]"#,
            ),
            // french.json
            (
                r#"{"peach": "This sorting order", "péché": "is wrong according to French",
                    "pêche": "but canonicalization MUST", "sin": "ignore locale"}"#,
                r#"{"peach":"This sorting order","péché":"is wrong according to French","pêche":"but canonicalization MUST","sin":"ignore locale"}"#,
            ),
            // structures.json
            (
                r#"{"1": {"f": {"f": "hi","F": 5} ,"\n": 56.0}, "10": { }, "": "empty",
                    "a": { }, "111": [ {"e": "yes","E": "no" } ], "A": { }}"#,
                r#"{"":"empty","1":{"\n":56,"f":{"F":5,"f":"hi"}},"10":{},"111":[{"E":"no","e":"yes"}],"A":{},"a":{}}"#,
            ),
            // unicode.json: no normalisation
            (
                r#"{"Unnormalized Unicode":"A\u030a"}"#,
                "{\"Unnormalized Unicode\":\"A\u{30a}\"}",
            ),
            // weird.json
            (
                r#"{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\u000a": "Newline",
                    "1": "One", "\u0080": "Control\u007f", "\ud83d\ude02": "Smiley",
                    "\u00f6": "Latin Small Letter O With Diaeresis",
                    "\ufb33": "Hebrew Letter Dalet With Dagesh", "</script>": "Browser Challenge"}"#,
                "{\"\\n\":\"Newline\",\"\\r\":\"Carriage Return\",\"1\":\"One\",\
                 \"</script>\":\"Browser Challenge\",\"\u{80}\":\"Control\u{7f}\",\
                 \"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\
                 \"😂\":\"Smiley\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(canon_str(input), want, "input {input}");
        }
    }

    /// RFC 8785 Appendix B: IEEE 754 bit patterns and their canonical text.
    #[test]
    fn rfc8785_appendix_b_numbers() {
        let table: &[(u64, &str)] = &[
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
        ];
        for &(bits, want) in table {
            let f = f64::from_bits(bits);
            let v = Value::Number(Number::from_f64(f).unwrap());
            assert_eq!(
                String::from_utf8(canonical_json(&v)).unwrap(),
                want,
                "bits {bits:016x}"
            );
            // And through the parser: the canonical text parses back to the same double.
            let back = parse_json_body(want.as_bytes()).unwrap();
            assert_eq!(
                back.as_f64().map(f64::to_bits),
                Some(if f == 0.0 { 0 } else { bits })
            );
            assert_eq!(canonical_json(&back), want.as_bytes());
        }
        // NaN and the infinities (Appendix B: "error") cannot be a serde_json Number.
        assert!(Number::from_f64(f64::NAN).is_none());
        assert!(Number::from_f64(f64::INFINITY).is_none());
        assert!(parse_json_body(b"1e400").is_err());
        assert!(parse_json_body(b"NaN").is_err());
    }

    #[test]
    fn integers_and_parsed_numbers() {
        for (input, want) in [
            ("0", "0"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("1", "1"),
            ("-1", "-1"),
            ("300", "300"),
            ("1.0", "1"),
            ("1e2", "100"),
            ("1E+2", "100"),
            ("0.1", "0.1"),
            ("-1.5e-10", "-1.5e-10"),
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("9007199254740991", "9007199254740991"),
            ("9007199254740992", "9007199254740992"),
            ("9007199254740993", "9007199254740992"), // rounded to a double, as JCS requires
            ("-9007199254740993", "-9007199254740992"),
            ("18446744073709551615", "18446744073709552000"),
            ("9223372036854775807", "9223372036854776000"),
            ("-9223372036854775808", "-9223372036854776000"),
            ("184467440737095520000", "184467440737095500000"),
            ("1844674407370955200000", "1.8446744073709552e+21"),
            ("4.50", "4.5"),
            ("2e-3", "0.002"),
            ("0.000001", "0.000001"),
            ("0.0000001", "1e-7"),
            ("123456789012345680000", "123456789012345680000"),
        ] {
            assert_eq!(canon_str(input), want, "input {input}");
        }
    }

    #[test]
    fn string_escapes() {
        let all_controls: String = (0u8..0x20).map(char::from).collect();
        let v = json!(all_controls);
        assert_eq!(
            String::from_utf8(canonical_json(&v)).unwrap(),
            "\"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r\\u000e\\u000f\
             \\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019\\u001a\\u001b\\u001c\\u001d\\u001e\\u001f\""
        );
        // Not escaped: '/', DEL, U+2028/2029, non-ASCII, astral characters.
        assert_eq!(
            canon_str(r#""\/\u007f\u2028\u2029é\ud83d\ude00""#),
            "\"/\u{7f}\u{2028}\u{2029}é😀\""
        );
        assert_eq!(canon_str(r#""a\"b\\c""#), r#""a\"b\\c""#);
        assert_eq!(canon_str(r#""""#), r#""""#);
    }

    #[test]
    // long: a corpus of keys in the order RFC 8785 gives, one a line
    fn utf16_key_order() {
        // Code-point order would put U+FB33 before U+1F600; UTF-16 puts it after.
        let mut keys = vec![
            "\u{20ac}",
            "\r",
            "\u{fb33}",
            "1",
            "\u{1f600}",
            "\u{80}",
            "\u{f6}",
        ];
        keys.sort_by(|a, b| cmp_utf16(a, b));
        assert_eq!(
            keys,
            [
                "\r",
                "1",
                "\u{80}",
                "\u{f6}",
                "\u{20ac}",
                "\u{1f600}",
                "\u{fb33}"
            ]
        );
        // Agrees with comparing the transcoded units, on awkward pairs.
        let samples = [
            "",
            "a",
            "ab",
            "b",
            "\u{7f}",
            "\u{80}",
            "\u{7ff}",
            "\u{800}",
            "\u{d7ff}",
            "\u{e000}",
            "\u{ffff}",
            "\u{10000}",
            "\u{10ffff}",
            "a\u{ffff}",
            "a\u{10000}",
            "\u{1f600}x",
            "\u{1f601}",
            "\u{fb33}",
        ];
        for a in samples {
            for b in samples {
                let want = a.encode_utf16().cmp(b.encode_utf16());
                assert_eq!(cmp_utf16(a, b), want, "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn nested_and_empty_containers() {
        assert_eq!(canon_str("[]"), "[]");
        assert_eq!(canon_str("{}"), "{}");
        assert_eq!(canon_str(" [ [ ] , { } , null ] "), "[[],{},null]");
        assert_eq!(
            canon_str(r#"{"b":{"z":1,"a":[{"y":2,"x":3}]},"a":0}"#),
            r#"{"a":0,"b":{"a":[{"x":3,"y":2}],"z":1}}"#
        );
    }

    #[test]
    fn digest_ignores_whitespace_and_member_order() {
        let a =
            parse_json_body(br#"{"id":"evt_1","amount":100,"meta":{"x":1,"y":[1,2]}}"#).unwrap();
        let b = parse_json_body(
            b"{\n  \"meta\" : { \"y\" : [ 1 , 2 ] , \"x\" : 1.0 } ,\r\n\t\"amount\": 1e2, \"id\":\"evt_\\u0031\" }\n",
        )
        .unwrap();
        assert_eq!(json_digest(&a, &[]), json_digest(&b, &[]));
        let c =
            parse_json_body(br#"{"id":"evt_1","amount":101,"meta":{"x":1,"y":[1,2]}}"#).unwrap();
        assert_ne!(json_digest(&a, &[]), json_digest(&c, &[]));
        let d =
            parse_json_body(br#"{"id":"evt_1","amount":100,"meta":{"x":1,"y":[2,1]}}"#).unwrap();
        assert_ne!(
            json_digest(&a, &[]),
            json_digest(&d, &[]),
            "array order matters"
        );
        // The streamed hash is the hash of canonical_json.
        assert_eq!(json_digest(&a, &[]), sha(&canonical_json(&a)));
    }

    #[test]
    fn streamed_hash_matches_on_large_documents() {
        // Crosses the 4 KiB hash buffer with both small writes and one big string.
        let big = "x".repeat(10_000);
        let doc = json!({
            "list": (0..2000).map(|i| json!({"i": i, "s": "ab\"c"})).collect::<Vec<_>>(),
            "big": big,
            "tail": [1.5, -2, null, true],
        });
        assert_eq!(json_digest(&doc, &[]), sha(&canonical_json(&doc)));
    }

    #[test]
    fn digest_ignore_removes_nested_members() {
        let p = |s: &str| JsonPointer::parse(s).unwrap();
        let first = parse_json_body(
            br#"{"id":"e1","delivery_attempt":1,"data":{"obj":{"a":1,"sent_at":"10:00"}},"l":[1,2]}"#,
        )
        .unwrap();
        let retry = parse_json_body(
            br#"{"id":"e1","delivery_attempt":2,"data":{"obj":{"a":1,"sent_at":"10:05"}},"l":[1,2]}"#,
        )
        .unwrap();
        let ignore = vec![
            p("/delivery_attempt"),
            p("/data/obj/sent_at"),
            p("/not/there"),
        ];
        assert_ne!(json_digest(&first, &[]), json_digest(&retry, &[]));
        assert_eq!(json_digest(&first, &ignore), json_digest(&retry, &ignore));
        let stripped = json!({"id":"e1","data":{"obj":{"a":1}},"l":[1,2]});
        assert_eq!(
            json_digest(&first, &ignore),
            sha(&canonical_json(&stripped))
        );
        // A pointer that resolves nowhere changes nothing; the input is never modified.
        assert_eq!(json_digest(&first, &[p("/nope")]), json_digest(&first, &[]));
        assert_eq!(json_digest(&first, &[p("")]), json_digest(&first, &[]));
        assert_eq!(first["delivery_attempt"], json!(1));
        // Still sensitive to what is not ignored.
        let other = parse_json_body(
            br#"{"id":"e1","delivery_attempt":2,"data":{"obj":{"a":2,"sent_at":"10:05"}},"l":[1,2]}"#,
        )
        .unwrap();
        assert_ne!(json_digest(&first, &ignore), json_digest(&other, &ignore));
    }

    #[test]
    fn parse_rejects_bad_bodies_with_position_and_no_payload() {
        let cases: &[(&[u8], usize, usize)] = &[
            (b"", 1, 0),
            (b"{\"a\":1} x", 1, 9),
            (b"{\"a\":1}{}", 1, 8),
            (b"[1,2", 1, 4),
            (b"{\n  \"secret\": trux\n}", 2, 16),
            (b"\"unterminated SECRET", 1, 20),
            (b"\"\xff SECRET\"", 1, 2),
            (b"\"\\ud800 SECRET\"", 1, 8),
            (b"{\"SECRET\":1,\"SECRET\":2}", 1, 20),
            (b"\xef\xbb\xbf{}", 1, 1),
        ];
        for &(body, line, column) in cases {
            let err = parse_json_body(body).unwrap_err();
            let msg = err.to_string();
            assert!(!msg.contains("SECRET") && !msg.contains("secret"), "{msg}");
            assert_eq!(
                (err.line, err.column),
                (line, column),
                "{msg} for {:?}",
                String::from_utf8_lossy(body)
            );
            assert!(
                msg.contains(&format!("line {line} column {column}")),
                "{msg}"
            );
        }
        let dup = parse_json_body(br#"{"x":{"a":1,"b":2,"a":3}}"#).unwrap_err();
        assert_eq!(dup.reason, DUPLICATE_NAME);
        // Trailing whitespace is fine; so is a scalar document.
        assert_eq!(
            parse_json_body(b" {\"a\":1}\r\n\t ").unwrap(),
            json!({"a":1})
        );
        assert_eq!(parse_json_body(b"42").unwrap(), json!(42));
        // Same names in different objects are not duplicates.
        assert!(parse_json_body(br#"{"a":{"a":1},"b":{"a":2}}"#).is_ok());
        // serde_json's recursion limit guards the stack.
        let deep = "[".repeat(10_000);
        assert!(parse_json_body(deep.as_bytes()).is_err());
    }
}
