//! RFC 6901 JSON Pointers: parsing, lookup, and removal (for `digest_ignore`).
//!
//! Parse a pointer once (at config load) into a [`JsonPointer`], which keeps
//! its text and its tokens; [`lookup`] and [`remove`] then allocate nothing.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;
use thiserror::Error;

/// Why a pointer string is not an RFC 6901 JSON Pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum PointerError {
    #[error("a JSON pointer must be empty or start with '/'")]
    NoLeadingSlash,
    #[error("bad escape in JSON pointer at byte {at}: '~' must be followed by '0' or '1'")]
    BadEscape { at: usize },
}

/// A parsed RFC 6901 pointer: the text as written (for messages, `check`
/// and the admin API) and its unescaped tokens (for [`lookup`] and
/// [`remove`]). Equal to a string that is its text.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct JsonPointer {
    text: String,
    tokens: Vec<String>,
}

impl JsonPointer {
    /// Parses `text` (see [`parse_pointer`]).
    pub fn parse(text: &str) -> Result<JsonPointer, PointerError> {
        Ok(JsonPointer {
            tokens: parse_pointer(text)?,
            text: text.to_owned(),
        })
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The unescaped reference tokens; none for `""`, the whole document.
    pub fn tokens(&self) -> &[String] {
        &self.tokens
    }
}

impl FromStr for JsonPointer {
    type Err = PointerError;

    fn from_str(text: &str) -> Result<JsonPointer, PointerError> {
        JsonPointer::parse(text)
    }
}

impl fmt::Display for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for JsonPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("JsonPointer").field(&self.text).finish()
    }
}

impl PartialEq<str> for JsonPointer {
    fn eq(&self, other: &str) -> bool {
        self.text == other
    }
}

impl PartialEq<&str> for JsonPointer {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

impl PartialEq<String> for JsonPointer {
    fn eq(&self, other: &String) -> bool {
        &self.text == other
    }
}

/// Written as its text.
impl serde::Serialize for JsonPointer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// Splits an RFC 6901 pointer into unescaped reference tokens.
///
/// `""` is the whole document (no tokens). Otherwise the pointer must start with
/// `/`; in each token `~1` becomes `/` and `~0` becomes `~` (so `~01` is `~1`);
/// `~` followed by anything else, or at the end, is an error.
pub fn parse_pointer(p: &str) -> Result<Vec<String>, PointerError> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let rest = p.strip_prefix('/').ok_or(PointerError::NoLeadingSlash)?;
    let mut tokens = Vec::with_capacity(rest.bytes().filter(|&b| b == b'/').count() + 1);
    let mut offset = 1; // byte offset of the current token within `p`
    for raw in rest.split('/') {
        tokens.push(unescape(raw, offset)?);
        offset += raw.len() + 1;
    }
    Ok(tokens)
}

fn unescape(raw: &str, offset: usize) -> Result<String, PointerError> {
    if !raw.contains('~') {
        return Ok(raw.to_owned());
    }
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.char_indices();
    while let Some((i, c)) = chars.next() {
        if c == '~' {
            match chars.next() {
                Some((_, '0')) => out.push('~'),
                Some((_, '1')) => out.push('/'),
                _ => return Err(PointerError::BadEscape { at: offset + i }),
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

/// The array index named by `token`: `"0"` or digits without a leading zero.
/// `"-"` (the element after the last) never names an existing element.
fn array_index(token: &str) -> Option<usize> {
    let b = token.as_bytes();
    match b {
        [b'0'] => Some(0),
        [b'1'..=b'9', rest @ ..] if rest.iter().all(u8::is_ascii_digit) => token.parse().ok(),
        _ => None,
    }
}

/// The value the tokens point at, if any.
pub fn lookup<'a>(doc: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    tokens.iter().try_fold(doc, |v, t| match v {
        Value::Object(m) => m.get(t.as_str()),
        Value::Array(a) => array_index(t).and_then(|i| a.get(i)),
        _ => None,
    })
}

fn lookup_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    tokens.iter().try_fold(doc, |v, t| match v {
        Value::Object(m) => m.get_mut(t.as_str()),
        Value::Array(a) => array_index(t).and_then(move |i| a.get_mut(i)),
        _ => None,
    })
}

/// Removes the member or array element the tokens point at. Returns whether
/// something was removed. The empty pointer (the whole document) removes nothing.
pub fn remove(doc: &mut Value, tokens: &[String]) -> bool {
    let Some((last, parent)) = tokens.split_last() else {
        return false;
    };
    match lookup_mut(doc, parent) {
        Some(Value::Object(m)) => m.remove(last.as_str()).is_some(),
        Some(Value::Array(a)) => match array_index(last) {
            Some(i) if i < a.len() => {
                a.remove(i);
                true
            }
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(s: &str) -> Vec<String> {
        parse_pointer(s).unwrap()
    }

    /// The example document of RFC 6901 section 5.
    fn rfc_doc() -> Value {
        serde_json::from_str(
            r#"{
              "foo": ["bar", "baz"],
              "": 0,
              "a/b": 1,
              "c%d": 2,
              "e^f": 3,
              "g|h": 4,
              "i\\j": 5,
              "k\"l": 6,
              " ": 7,
              "m~n": 8
            }"#,
        )
        .unwrap()
    }

    #[test]
    fn rfc6901_section5_examples() {
        let doc = rfc_doc();
        let cases: &[(&str, Value)] = &[
            ("", doc.clone()),
            ("/foo", json!(["bar", "baz"])),
            ("/foo/0", json!("bar")),
            ("/", json!(0)),
            ("/a~1b", json!(1)),
            ("/c%d", json!(2)),
            ("/e^f", json!(3)),
            ("/g|h", json!(4)),
            ("/i\\j", json!(5)),
            ("/k\"l", json!(6)),
            ("/ ", json!(7)),
            ("/m~0n", json!(8)),
        ];
        for (ptr, want) in cases {
            assert_eq!(lookup(&doc, &p(ptr)), Some(want), "pointer {ptr:?}");
        }
    }

    #[test]
    fn parsing() {
        assert_eq!(p(""), Vec::<String>::new());
        assert_eq!(p("/"), vec![""]);
        assert_eq!(p("//"), vec!["", ""]);
        assert_eq!(p("/a/b"), vec!["a", "b"]);
        assert_eq!(p("/a~1b/m~0n"), vec!["a/b", "m~n"]);
        // ~1 first, then ~0: "~01" is "~1", not "/".
        assert_eq!(p("/~01"), vec!["~1"]);
        assert_eq!(p("/~10"), vec!["/0"]);
        assert_eq!(p("/~0~0"), vec!["~~"]);
        assert_eq!(p("/é/☃"), vec!["é", "☃"]);
        assert_eq!(parse_pointer("a"), Err(PointerError::NoLeadingSlash));
        assert_eq!(parse_pointer("#/a"), Err(PointerError::NoLeadingSlash));
        assert_eq!(parse_pointer("/~"), Err(PointerError::BadEscape { at: 1 }));
        assert_eq!(
            parse_pointer("/a~2"),
            Err(PointerError::BadEscape { at: 2 })
        );
        assert_eq!(
            parse_pointer("/ok/b~"),
            Err(PointerError::BadEscape { at: 5 })
        );
        assert_eq!(parse_pointer("/~/"), Err(PointerError::BadEscape { at: 1 }));
        assert_eq!(parse_pointer("/~é"), Err(PointerError::BadEscape { at: 1 }));
    }

    #[test]
    fn a_parsed_pointer_keeps_its_text_and_tokens() {
        let ptr: JsonPointer = "/a~1b/m~0n".parse().unwrap();
        assert_eq!(ptr.as_str(), "/a~1b/m~0n");
        assert_eq!(ptr.tokens(), ["a/b", "m~n"]);
        assert_eq!(ptr, "/a~1b/m~0n");
        assert_eq!(ptr.to_string(), "/a~1b/m~0n");
        assert_eq!(format!("{ptr:?}"), r#"JsonPointer("/a~1b/m~0n")"#);
        assert_eq!(serde_json::to_value(&ptr).unwrap(), json!("/a~1b/m~0n"));
        assert_eq!(JsonPointer::parse("").unwrap().tokens(), [] as [String; 0]);
        assert_eq!(JsonPointer::parse("x"), Err(PointerError::NoLeadingSlash));
    }

    #[test]
    fn arrays() {
        let doc = json!({"a": [10, 20, [30, 31]], "o": {"0": "zero", "01": "lead", "-": "dash"}});
        assert_eq!(lookup(&doc, &p("/a/0")), Some(&json!(10)));
        assert_eq!(lookup(&doc, &p("/a/1")), Some(&json!(20)));
        assert_eq!(lookup(&doc, &p("/a/2/1")), Some(&json!(31)));
        assert_eq!(lookup(&doc, &p("/a/3")), None, "out of bounds");
        assert_eq!(lookup(&doc, &p("/a/01")), None, "leading zero");
        assert_eq!(lookup(&doc, &p("/a/00")), None, "leading zero");
        assert_eq!(lookup(&doc, &p("/a/-")), None, "'-' never resolves");
        assert_eq!(lookup(&doc, &p("/a/-1")), None);
        assert_eq!(lookup(&doc, &p("/a/+1")), None);
        assert_eq!(lookup(&doc, &p("/a/1 ")), None);
        assert_eq!(lookup(&doc, &p("/a/")), None);
        assert_eq!(lookup(&doc, &p("/a/x")), None);
        assert_eq!(
            lookup(&doc, &p("/a/99999999999999999999999")),
            None,
            "overflow"
        );
        // On objects, the same tokens are plain member names.
        assert_eq!(lookup(&doc, &p("/o/0")), Some(&json!("zero")));
        assert_eq!(lookup(&doc, &p("/o/01")), Some(&json!("lead")));
        assert_eq!(lookup(&doc, &p("/o/-")), Some(&json!("dash")));
    }

    #[test]
    fn into_scalars_and_missing() {
        let doc = json!({"s": "str", "n": 1, "b": true, "z": null});
        for ptr in [
            "/s/0",
            "/s/x",
            "/n/0",
            "/b/x",
            "/z/x",
            "/missing",
            "/missing/deeper",
        ] {
            assert_eq!(lookup(&doc, &p(ptr)), None, "pointer {ptr:?}");
        }
        assert_eq!(lookup(&json!(5), &p("/0")), None);
        assert_eq!(lookup(&json!(5), &p("")), Some(&json!(5)));
    }

    #[test]
    fn removal() {
        let mut doc = json!({"a": {"b": 1, "c": 2}, "l": [0, 1, 2], "s": "x", "m~n": 3});
        assert!(remove(&mut doc, &p("/a/b")));
        assert!(!remove(&mut doc, &p("/a/b")), "already gone");
        assert!(remove(&mut doc, &p("/l/1")));
        assert!(!remove(&mut doc, &p("/l/2")), "out of bounds after removal");
        assert!(!remove(&mut doc, &p("/l/-")));
        assert!(!remove(&mut doc, &p("/l/01")));
        assert!(!remove(&mut doc, &p("/s/0")), "into a scalar");
        assert!(!remove(&mut doc, &p("/nope/x")));
        assert!(!remove(&mut doc, &p("")), "the root is never removed");
        assert!(remove(&mut doc, &p("/m~0n")));
        assert_eq!(doc, json!({"a": {"c": 2}, "l": [0, 2], "s": "x"}));
    }
}
