//! Maps a config path (`routes[1].lease`) to where it sits in the file.
//!
//! serde_yaml gives positions only for the errors it raises itself; everything
//! `validate` finds afterwards (duplicate names, `lease <= upstream_timeout`)
//! needs node positions, so we walk yaml-rust2's marked events over the same
//! text once and remember, for every path, where its key and its value start.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;

/// A 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

impl Pos {
    /// yaml-rust2 markers carry 1-based lines and 0-based columns.
    fn from_marker(m: Marker) -> Pos {
        Pos {
            line: m.line(),
            col: m.col() + 1,
        }
    }
}

/// Where one node starts: its key (absent for sequence items and the root)
/// and its value.
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    key: Option<(Pos, usize)>,
    value: Option<(Pos, usize)>,
    /// The second occurrence of the same key, for "duplicate field" errors.
    repeat: Option<Pos>,
}

/// Path → positions. Lookups of unknown paths fall back to the nearest
/// ancestor that is known, and finally to 1:1, so an error always has a place.
#[derive(Debug, Default)]
pub struct PosIndex {
    entries: HashMap<String, Entry>,
}

impl PosIndex {
    /// Builds the index; a text yaml-rust2 cannot parse yields a partial index
    /// (serde_yaml will have reported the syntax error already).
    pub fn build(text: &str) -> PosIndex {
        let mut builder = Builder {
            index: PosIndex::default(),
            stack: Vec::new(),
        };
        let mut parser = Parser::new_from_str(text);
        // A scan error only truncates the index; positions fall back to ancestors.
        let _ = parser.load(&mut builder, false);
        builder.index
    }

    /// Position of the key of `path` (e.g. the `name:` of `routes[1].name`),
    /// else of its value, else of its nearest known ancestor.
    pub fn key(&self, path: &str) -> Pos {
        self.lookup(path, |e| e.key.or(e.value))
    }

    /// Position of the value of `path`, else of its key, else of its nearest
    /// known ancestor.
    pub fn value(&self, path: &str) -> Pos {
        self.lookup(path, |e| e.value.or(e.key))
    }

    /// Exact key position of `path`, if the file has that key.
    pub fn key_exact(&self, path: &str) -> Option<Pos> {
        self.entries.get(path).and_then(|e| e.key).map(|(p, _)| p)
    }

    /// Where the key of `path` occurs a second time, if it does.
    pub fn repeated_key(&self, path: &str) -> Option<Pos> {
        self.entries.get(path).and_then(|e| e.repeat)
    }

    fn lookup(&self, path: &str, pick: impl Fn(&Entry) -> Option<(Pos, usize)>) -> Pos {
        let mut current = path;
        loop {
            if let Some(pos) = self.entries.get(current).and_then(&pick) {
                return pos.0;
            }
            match parent(current) {
                Some(p) => current = p,
                None => return Pos { line: 1, col: 1 },
            }
        }
    }
}

/// `routes[1].lease` → `routes[1]` → `routes` → `` (the root) → none.
fn parent(path: &str) -> Option<&str> {
    if path.is_empty() {
        return None;
    }
    let cut = path.rfind(['.', '[']).unwrap_or(0);
    Some(&path[..cut])
}

/// Joins a parent path and a mapping key the way error paths are written.
pub fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// One open collection while walking events.
enum Frame {
    /// `key` is `Some` while we wait for that key's value.
    Map {
        path: String,
        key: Option<String>,
    },
    Seq {
        path: String,
        next: usize,
    },
}

struct Builder {
    index: PosIndex,
    stack: Vec<Frame>,
}

impl Builder {
    /// Decides the path of the node that starts now. Returns `None` when the
    /// node is a mapping key (recorded here) rather than a value.
    fn node_path(&mut self, scalar: Option<&str>, at: (Pos, usize)) -> Option<String> {
        match self.stack.last_mut() {
            None => Some(String::new()),
            Some(Frame::Seq { path, next }) => {
                let p = format!("{path}[{next}]");
                *next += 1;
                Some(p)
            }
            Some(Frame::Map { path, key }) => match key.take() {
                Some(k) => Some(join(path, &k)),
                None => {
                    // A complex (non-scalar) key gets a placeholder name; no
                    // config path can refer to it.
                    let k = scalar.unwrap_or("?").to_string();
                    let full = join(path, &k);
                    let entry = self.index.entries.entry(full).or_default();
                    match entry.key {
                        None => entry.key = Some(at),
                        Some(_) => {
                            entry.repeat.get_or_insert(at.0);
                        }
                    }
                    // A block mapping reports its start after the first key, so
                    // the mapping's own start is its first key when earlier.
                    let entry = self.index.entries.entry(path.clone()).or_default();
                    match entry.value {
                        Some((_, idx)) if idx <= at.1 => {}
                        _ => entry.value = Some(at),
                    }
                    *key = Some(k);
                    None
                }
            },
        }
    }

    fn record_value(&mut self, path: &str, at: (Pos, usize)) {
        let entry = self.index.entries.entry(path.to_string()).or_default();
        match entry.value {
            Some((_, idx)) if idx <= at.1 => {}
            _ => entry.value = Some(at),
        }
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        let at = (Pos::from_marker(mark), mark.index());
        match ev {
            Event::Scalar(ref text, ..) => {
                if let Some(path) = self.node_path(Some(text), at) {
                    self.record_value(&path, at);
                }
            }
            Event::Alias(_) => {
                if let Some(path) = self.node_path(None, at) {
                    self.record_value(&path, at);
                }
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                let is_map = matches!(ev, Event::MappingStart(..));
                let path = self.node_path(None, at).unwrap_or_else(|| "?".to_string());
                self.record_value(&path, at);
                self.stack.push(if is_map {
                    Frame::Map { path, key: None }
                } else {
                    Frame::Seq { path, next: 0 }
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                self.stack.pop();
            }
            _ => {}
        }
    }
}
