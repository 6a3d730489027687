//! The one parse of the file: yaml-rust2's marked events, pulled one at a
//! time, built into a tree of nodes that keep where they start. serde reads
//! the tree ([`super::de`]), so every serde error has its node's position;
//! validation looks positions up by path (`routes[1].lease`) in the same tree.
//!
//! The walk keeps open collections on an explicit stack (yaml-rust2's
//! `Parser::load` recurses once per nesting level, so a hostile file could
//! overflow the thread's stack) and stops at [`MAX_DEPTH`] levels, which the
//! loader reports as "nested too deeply".

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// Deepest nesting of collections a config may use; a valid config needs a
/// handful of levels.
pub const MAX_DEPTH: usize = 128;

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

impl Pos {
    pub const START: Pos = Pos { line: 1, col: 1 };

    /// yaml-rust2 markers carry 1-based lines and 0-based columns.
    fn from_marker(m: &Marker) -> Pos {
        Pos {
            line: m.line(),
            col: m.col() + 1,
        }
    }
}

/// What a node is.
#[derive(Debug)]
pub enum Kind {
    /// `plain`: written without quotes or block style and without a `!!str`
    /// tag, so `~`, `true` or `30` in it mean null, a bool, a number.
    Scalar {
        text: String,
        plain: bool,
    },
    Seq(Vec<usize>),
    /// (key node, value node) in file order.
    Map(Vec<(usize, usize)>),
    /// `*name`: the anchored node.
    Alias(usize),
}

#[derive(Debug)]
pub struct Node {
    pub kind: Kind,
    pub pos: Pos,
}

/// The first document of the file; `root` is `None` for an empty one.
#[derive(Debug, Default)]
pub struct Doc {
    pub nodes: Vec<Node>,
    pub root: Option<usize>,
}

/// Why the text is not a document: a message and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    pub pos: Pos,
    pub message: String,
}

impl Doc {
    /// Parses `text`: its first document, or the syntax error, or "nested too
    /// deeply" at the first collection past [`MAX_DEPTH`].
    pub fn parse(text: &str) -> Result<Doc, SyntaxError> {
        let mut b = Builder::default();
        // a byte order mark says how the text is encoded; it is not content
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut parser = Parser::new_from_str(text);
        loop {
            let (ev, mark) = parser.next_token().map_err(|e| {
                let pos = Pos::from_marker(e.marker());
                // The scanner's own limit on flow nesting (255 levels): it
                // looks ahead for keys, so it can fail before the walk has
                // opened MAX_DEPTH collections.
                if e.info() == "recursion limit exceeded" {
                    too_deep(pos)
                } else {
                    SyntaxError {
                        pos,
                        message: e.info().to_string(),
                    }
                }
            })?;
            match ev {
                Event::DocumentEnd => {
                    return match parser.peek() {
                        Ok((Event::DocumentStart, m)) => Err(SyntaxError {
                            pos: Pos::from_marker(m),
                            message: "deserializing from YAML containing more than one document is not supported".to_string(),
                        }),
                        _ => Ok(b.doc),
                    };
                }
                Event::StreamEnd => return Ok(b.doc),
                Event::MappingStart(..) | Event::SequenceStart(..)
                    if b.stack.len() >= MAX_DEPTH =>
                {
                    // A block mapping reports its start after its first
                    // key; point at whichever comes first.
                    let at = match parser.peek() {
                        Ok((_, next)) if next.index() < mark.index() => Pos::from_marker(next),
                        _ => Pos::from_marker(&mark),
                    };
                    return Err(too_deep(at));
                }
                ev => b.on_event(ev, &mark)?,
            }
        }
    }

    /// True for a document that sets nothing: empty, only comments, `{}`,
    /// or keys without values (each then reads as absent).
    pub fn has_no_values(&self) -> bool {
        let is_null = |id: usize| matches!(&self.nodes[id].kind, Kind::Scalar { text, plain: true } if is_null(text));
        match self.root {
            None => true,
            Some(root) => match &self.nodes[root].kind {
                Kind::Map(entries) => entries.iter().all(|&(_, v)| is_null(v)),
                _ => is_null(root),
            },
        }
    }

    /// Position of the key of `path` (e.g. the `name:` of `routes[1].name`),
    /// else of its value, else of its nearest ancestor in the file.
    pub fn key_pos(&self, path: &str) -> Pos {
        let (key, value) = self.locate(path);
        key.or(value).unwrap_or(Pos::START)
    }

    /// Position of the value of `path`, else of its key, else of its nearest
    /// ancestor in the file.
    pub fn value_pos(&self, path: &str) -> Pos {
        let (key, value) = self.locate(path);
        value.or(key).unwrap_or(Pos::START)
    }

    /// The key and value positions of the deepest node on `path` the file
    /// has (the first of repeated keys; aliases are not followed).
    fn locate(&self, path: &str) -> (Option<Pos>, Option<Pos>) {
        let Some(mut at) = self.root else {
            return (None, None);
        };
        let mut found = (None, Some(self.nodes[at].pos));
        for seg in segments(path) {
            let next = match (&self.nodes[at].kind, seg) {
                (Kind::Map(entries), Seg::Key(name)) => entries
                    .iter()
                    .find(|(k, _)| self.scalar(*k) == Some(name))
                    .map(|&(k, v)| (Some(self.nodes[k].pos), v)),
                (Kind::Seq(items), Seg::Index(i)) => items.get(i).map(|&v| (None, v)),
                _ => None,
            };
            let Some((key, value)) = next else { break };
            found = (key, Some(self.nodes[value].pos));
            at = value;
        }
        found
    }

    fn scalar(&self, id: usize) -> Option<&str> {
        match &self.nodes[id].kind {
            Kind::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }
}

/// The core schema's null (`~`, `null`, or nothing): how [`super::de`]
/// reads a plain scalar, and what [`Doc::has_no_values`] counts as unset.
pub fn is_null(v: &str) -> bool {
    matches!(v, "" | "~" | "null" | "Null" | "NULL")
}

fn too_deep(pos: Pos) -> SyntaxError {
    SyntaxError {
        pos,
        message: format!("nested too deeply (more than {MAX_DEPTH} levels)"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// `routes[1].verify` → `routes`, `[1]`, `verify`. A malformed index ends
/// the path there.
fn segments(path: &str) -> impl Iterator<Item = Seg<'_>> {
    let mut rest = path;
    std::iter::from_fn(move || {
        rest = rest.strip_prefix('.').unwrap_or(rest);
        if rest.is_empty() {
            return None;
        }
        if let Some(inner) = rest.strip_prefix('[') {
            let (n, after) = inner.split_once(']')?;
            rest = after;
            return n.parse().ok().map(Seg::Index);
        }
        let end = rest.find(['.', '[']).unwrap_or(rest.len());
        let (name, after) = rest.split_at(end);
        rest = after;
        Some(Seg::Key(name))
    })
}

/// One open collection while walking events.
#[derive(Debug)]
struct Open {
    node: usize,
    /// A mapping's key that waits for its value.
    key: Option<usize>,
}

#[derive(Debug, Default)]
struct Builder {
    doc: Doc,
    stack: Vec<Open>,
    /// yaml-rust2's anchor ids (from 1) → node.
    anchors: Vec<Option<usize>>,
}

impl Builder {
    fn on_event(&mut self, ev: Event, mark: &Marker) -> Result<(), SyntaxError> {
        let pos = Pos::from_marker(mark);
        match ev {
            Event::Scalar(text, style, anchor, tag) => {
                let str_tag = tag.is_some_and(|t| t.suffix == "str");
                let plain = style == TScalarStyle::Plain && !str_tag;
                let id = self.add(Kind::Scalar { text, plain }, pos, anchor);
                self.attach(id);
            }
            Event::Alias(anchor) => {
                let target = self.anchors.get(anchor).copied().flatten();
                let Some(target) = target else {
                    return Err(SyntaxError {
                        pos,
                        message: "unknown anchor".to_string(),
                    });
                };
                if self.stack.iter().any(|o| o.node == target) {
                    return Err(SyntaxError {
                        pos,
                        message: "an alias inside the node it names".to_string(),
                    });
                }
                let id = self.add(Kind::Alias(target), pos, 0);
                self.attach(id);
            }
            Event::MappingStart(anchor, _) => {
                let node = self.add(Kind::Map(Vec::new()), pos, anchor);
                self.stack.push(Open { node, key: None });
            }
            Event::SequenceStart(anchor, _) => {
                let node = self.add(Kind::Seq(Vec::new()), pos, anchor);
                self.stack.push(Open { node, key: None });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                if let Some(open) = self.stack.pop() {
                    self.attach(open.node);
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn add(&mut self, kind: Kind, pos: Pos, anchor: usize) -> usize {
        let id = self.doc.nodes.len();
        self.doc.nodes.push(Node { kind, pos });
        if anchor > 0 {
            if self.anchors.len() <= anchor {
                self.anchors.resize(anchor + 1, None);
            }
            self.anchors[anchor] = Some(id);
        }
        id
    }

    /// A finished node joins the open collection, or is the root.
    fn attach(&mut self, id: usize) {
        let Some(open) = self.stack.last_mut() else {
            self.doc.root.get_or_insert(id);
            return;
        };
        let key_pos = self.doc.nodes[id].pos;
        let parent = &mut self.doc.nodes[open.node];
        match &mut parent.kind {
            Kind::Seq(items) => items.push(id),
            Kind::Map(entries) => match open.key.take() {
                Some(key) => entries.push((key, id)),
                None => {
                    // A block mapping reports its start after the first key,
                    // so the mapping's own start is its first key when earlier.
                    if entries.is_empty() && key_pos < parent.pos {
                        parent.pos = key_pos;
                    }
                    open.key = Some(id);
                }
            },
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_find_keys_values_and_their_nearest_ancestor() {
        let doc = Doc::parse("a:\n  - x: 1\n    y: [2, 3]\nb: 4\n").unwrap();
        assert_eq!(doc.key_pos("a[0].y"), Pos { line: 3, col: 5 });
        assert_eq!(doc.value_pos("a[0].y[1]"), Pos { line: 3, col: 12 });
        assert_eq!(doc.value_pos("a[0]"), Pos { line: 2, col: 5 });
        assert_eq!(doc.value_pos("a[0].nope.deeper"), Pos { line: 2, col: 5 });
        assert_eq!(doc.key_pos("b"), Pos { line: 4, col: 1 });
        assert_eq!(doc.value_pos("b"), Pos { line: 4, col: 4 });
        assert_eq!(doc.value_pos(""), Pos::START);
        assert_eq!(Doc::default().key_pos("a"), Pos::START);
    }
}
