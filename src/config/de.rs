//! A serde `Deserializer` over the parsed tree ([`super::yaml`]): the raw
//! types of [`super::raw`] are read from it, and every error they raise
//! leaves with the position and path of the node that raised it (an unknown
//! or repeated key: that key; a bad value: that value).
//!
//! Plain scalars resolve as YAML 1.2's core schema (`~`/`null`, `true`,
//! `30`, `0x1f`, `1.5`); a string is asked for by type, so `upstream: 123`
//! reads as the text `123`.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

use super::yaml::{is_null, Doc, Kind, Pos, MAX_DEPTH};

/// A serde error with where it happened (set by the innermost node it
/// passed).
#[derive(Debug)]
pub struct Error {
    pub message: String,
    /// Position and path (`""` for the root).
    pub at: Option<(Pos, String)>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Error {
        Error {
            message: msg.to_string(),
            at: None,
        }
    }
}

/// Reads a `T` from the document; an empty document reads as an empty mapping.
pub fn from_doc<'de, T: de::Deserialize<'de>>(doc: &Doc) -> Result<T, Error> {
    let visits = Cell::new(0);
    let limit = 10 * doc.nodes.len() + 10_000;
    let ctx = Ctx {
        doc,
        visits: &visits,
        limit,
    };
    match doc.root {
        Some(id) => T::deserialize(NodeDe {
            ctx,
            id,
            path: Path::Root,
            depth: 0,
        }),
        None => T::deserialize(de::value::MapDeserializer::<_, Error>::new(
            std::iter::empty::<((), ())>(),
        )),
    }
}

/// Where a node sits, written out only for an error (a path repeats every
/// ancestor's key, which may be long).
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Key(Path::Root, k) => f.write_str(k),
            Path::Key(p, k) => write!(f, "{p}.{k}"),
            Path::Index(p, i) => write!(f, "{p}[{i}]"),
        }
    }
}

#[derive(Clone, Copy)]
struct Ctx<'a> {
    doc: &'a Doc,
    /// Nodes read so far, against `limit`: an alias re-reads its node, and
    /// aliases of aliases could multiply that without bound.
    visits: &'a Cell<usize>,
    limit: usize,
}

/// One node to deserialize.
struct NodeDe<'a> {
    ctx: Ctx<'a>,
    id: usize,
    /// A key's path is its mapping's: an unknown key is the mapping's error.
    path: Path<'a>,
    depth: usize,
}

impl<'a> NodeDe<'a> {
    fn pos(&self) -> Pos {
        self.ctx.doc.nodes[self.id].pos
    }

    /// The node's kind with aliases followed; counts the visit.
    fn enter(&self) -> Result<&'a Kind, Error> {
        let n = self.ctx.visits.get() + 1;
        self.ctx.visits.set(n);
        if n > self.ctx.limit {
            return Err(self.error("repetition limit exceeded (aliases expand too far)"));
        }
        if self.depth > MAX_DEPTH {
            return Err(self.error(format!("nested too deeply (more than {MAX_DEPTH} levels)")));
        }
        let mut id = self.id;
        // an alias never names another alias's own node
        while let Kind::Alias(target) = &self.ctx.doc.nodes[id].kind {
            id = *target;
        }
        Ok(&self.ctx.doc.nodes[id].kind)
    }

    fn error(&self, message: impl Into<String>) -> Error {
        Error {
            message: message.into(),
            at: Some((self.pos(), self.path.to_string())),
        }
    }

    /// Gives an error that has no place yet this node's.
    fn place<T>(&self, r: Result<T, Error>) -> Result<T, Error> {
        self.place_at(r, self.pos())
    }

    fn place_at<T>(&self, r: Result<T, Error>, pos: Pos) -> Result<T, Error> {
        r.map_err(|mut e| {
            if e.at.is_none() {
                e.at = Some((pos, self.path.to_string()));
            }
            e
        })
    }

    fn child(&self, id: usize, path: Path<'a>) -> NodeDe<'a> {
        NodeDe {
            ctx: self.ctx,
            id,
            path,
            depth: self.depth + 1,
        }
    }

    fn visit_map<'de, V: Visitor<'de>>(
        self,
        entries: &'a [(usize, usize)],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let mut access = MapDe {
            node: &self,
            entries,
            next: 0,
            last_key: None,
        };
        let r = visitor.visit_map(&mut access);
        // A struct's own errors (a repeated field) are about the key it
        // just read; after the last key, about the mapping.
        let at = match access.last_key {
            Some(pos) if access.next <= entries.len() => pos,
            _ => self.pos(),
        };
        self.place_at(r, at)
    }

    fn visit_seq<'de, V: Visitor<'de>>(
        self,
        items: &'a [usize],
        visitor: V,
    ) -> Result<V::Value, Error> {
        let r = visitor.visit_seq(SeqDe {
            node: &self,
            items,
            next: 0,
        });
        self.place(r)
    }

    /// A plain scalar as the core schema reads it.
    fn visit_plain<'de, V: Visitor<'de>>(v: &str, visitor: V) -> Result<V::Value, Error> {
        if is_null(v) {
            return visitor.visit_unit();
        }
        match v {
            "true" | "True" | "TRUE" => return visitor.visit_bool(true),
            "false" | "False" | "FALSE" => return visitor.visit_bool(false),
            _ => {}
        }
        if let Some(n) = int(v, u64::from_str_radix) {
            return visitor.visit_u64(n);
        }
        if v.starts_with('-') {
            if let Some(n) = int(v, i64::from_str_radix) {
                return visitor.visit_i64(n);
            }
        }
        if let Some(f) = float(v) {
            return visitor.visit_f64(f);
        }
        visitor.visit_str(v)
    }
}

/// A YAML 1.2 integer: decimal (no leading zero), `0x`, `0o` or `0b`, signed.
fn int<T>(v: &str, radix: fn(&str, u32) -> Result<T, std::num::ParseIntError>) -> Option<T> {
    let (sign, digits) = match v.as_bytes().first() {
        Some(b'-') => ("-", &v[1..]),
        Some(b'+') => ("", &v[1..]),
        _ => ("", v),
    };
    let (base, body) = [("0x", 16), ("0o", 8), ("0b", 2)]
        .iter()
        .find_map(|(p, b)| digits.strip_prefix(p).map(|rest| (*b, rest)))
        .unwrap_or((10, digits));
    let leading_zero = base == 10 && body.len() > 1 && body.starts_with('0');
    if body.is_empty() || body.starts_with(['+', '-']) || leading_zero {
        return None;
    }
    radix(&format!("{sign}{body}"), base).ok()
}

/// A finite float, or `.inf` / `-.inf` / `.nan`.
fn float(v: &str) -> Option<f64> {
    let unsigned = v.strip_prefix(['+', '-']).unwrap_or(v);
    let negative = v.starts_with('-');
    match unsigned {
        ".inf" | ".Inf" | ".INF" => {
            return Some(if negative {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            })
        }
        ".nan" | ".NaN" | ".NAN" if v == unsigned => return Some(f64::NAN),
        _ => {}
    }
    let digits_only = unsigned.len() > 1
        && unsigned.starts_with('0')
        && unsigned.bytes().all(|b| b.is_ascii_digit());
    if unsigned.starts_with(['+', '-']) || digits_only {
        return None;
    }
    v.parse::<f64>().ok().filter(|f| f.is_finite())
}

impl<'de, 'a> de::Deserializer<'de> for NodeDe<'a> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.enter()? {
            Kind::Scalar { text, plain: true } => {
                let r = Self::visit_plain(text, visitor);
                self.place(r)
            }
            Kind::Scalar { text, .. } => {
                let r = visitor.visit_str(text);
                self.place(r)
            }
            Kind::Seq(items) => self.visit_seq(items, visitor),
            Kind::Map(entries) => self.visit_map(entries, visitor),
            Kind::Alias(_) => unreachable!("enter follows aliases"),
        }
    }

    /// Any scalar is its text.
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.enter()? {
            Kind::Scalar { text, .. } => {
                let r = visitor.visit_str(text);
                self.place(r)
            }
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.enter()? {
            Kind::Scalar { text, plain: true } if is_null(text) => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    /// A struct may be written as an empty value (`defaults:`), never as a
    /// sequence of its fields.
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.enter()? {
            Kind::Scalar { text, plain: true } if is_null(text) => self.visit_map(&[], visitor),
            Kind::Seq(_) => {
                let e = <Error as de::Error>::invalid_type(de::Unexpected::Seq, &visitor);
                self.place(Err(e))
            }
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_map(visitor)
    }

    /// A unit variant, named by a scalar.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.enter()? {
            Kind::Scalar { text, .. } => {
                let r = visitor.visit_enum(text.as_str().into_deserializer());
                self.place(r)
            }
            _ => self.deserialize_any(visitor),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes byte_buf
        unit unit_struct seq tuple tuple_struct
    }
}

struct MapDe<'n, 'a> {
    node: &'n NodeDe<'a>,
    entries: &'a [(usize, usize)],
    /// The entry whose key is read next; its value is `next - 1`'s.
    next: usize,
    last_key: Option<Pos>,
}

impl<'de, 'a> de::MapAccess<'de> for MapDe<'_, 'a> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(&(key, _)) = self.entries.get(self.next) else {
            self.next = self.entries.len() + 1;
            return Ok(None);
        };
        self.next += 1;
        let key = self.node.child(key, self.node.path);
        self.last_key = Some(key.pos());
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let (key, value) = self.entries[self.next - 1];
        let name = match &self.node.ctx.doc.nodes[key].kind {
            Kind::Scalar { text, .. } => text.as_str(),
            _ => "?",
        };
        let path = Path::Key(&self.node.path, name);
        seed.deserialize(self.node.child(value, path))
    }
}

struct SeqDe<'n, 'a> {
    node: &'n NodeDe<'a>,
    items: &'a [usize],
    next: usize,
}

impl<'de> de::SeqAccess<'de> for SeqDe<'_, '_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        let Some(&item) = self.items.get(self.next) else {
            return Ok(None);
        };
        let i = self.next;
        self.next += 1;
        let path = Path::Index(&self.node.path, i);
        seed.deserialize(self.node.child(item, path)).map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len() - self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_schema_scalars() {
        assert_eq!(int("0x1f", u64::from_str_radix), Some(31));
        assert_eq!(int("-0o17", i64::from_str_radix), Some(-15));
        assert_eq!(int("+7", u64::from_str_radix), Some(7));
        assert_eq!(int("007", u64::from_str_radix), None);
        assert_eq!(int("0", u64::from_str_radix), Some(0));
        assert_eq!(int("-", i64::from_str_radix), None);
        assert_eq!(float("1.5"), Some(1.5));
        assert_eq!(float("-.inf"), Some(f64::NEG_INFINITY));
        assert_eq!(float("0123"), None);
        assert_eq!(float("inf"), None);
        assert_eq!(float("30s"), None);
    }
}
