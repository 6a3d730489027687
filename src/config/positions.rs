//! Maps a config path (`routes[1].lease`) to where it sits in the file.
//!
//! serde_yaml gives positions only for the errors it raises itself; everything
//! `validate` finds afterwards (duplicate names, `lease <= upstream_timeout`)
//! needs node positions, so we walk yaml-rust2's marked events over the same
//! text once and remember, for every path, where its key and its value start.
//!
//! The walk pulls events one at a time and keeps open collections on an
//! explicit stack (yaml-rust2's `Parser::load` recurses once per nesting
//! level, so a hostile file could overflow the thread's stack). It stops at
//! [`MAX_DEPTH`] levels, which the loader reports as "nested too deeply", and
//! once the paths it built exceed [`PATH_BUDGET`] bytes (long keys repeated in
//! every descendant's path), leaving a partial index.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::Marker;

/// Deepest nesting of collections a config may use; a valid config needs a
/// handful of levels. serde_yaml's own recursion limit is also 128.
pub const MAX_DEPTH: usize = 128;

/// Upper bound on the bytes of path strings built while indexing. A path
/// repeats every ancestor key, so a long key with many descendants would
/// otherwise cost its length once per descendant.
const PATH_BUDGET: usize = 64 << 20;

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
    /// Where the first collection nested deeper than [`MAX_DEPTH`] starts.
    too_deep: Option<Pos>,
}

impl PosIndex {
    /// Builds the index; a text yaml-rust2 cannot parse yields a partial index
    /// (serde_yaml will have reported the syntax error already). Only the
    /// first document is indexed, as serde_yaml reads only one.
    pub fn build(text: &str) -> PosIndex {
        let mut builder = Builder {
            index: PosIndex::default(),
            stack: Vec::new(),
            path_bytes: 0,
        };
        let mut parser = Parser::new_from_str(text);
        loop {
            match parser.next_token() {
                // The scanner's own limit on flow nesting (255 levels): it
                // looks ahead for keys, so it can fail before the parser has
                // opened MAX_DEPTH collections. (Should the message change,
                // serde_yaml still refuses such a file, only more slowly.)
                Err(e) if e.info() == "recursion limit exceeded" => {
                    builder.index.too_deep = Some(Pos::from_marker(*e.marker()));
                    break;
                }
                // Any other scan error only truncates the index; positions
                // fall back to ancestors.
                Err(_) => break,
                Ok((Event::DocumentEnd | Event::StreamEnd, _)) => break,
                Ok((ev, mark)) => match builder.on_event(ev, mark) {
                    Ok(()) => {}
                    Err(Stop::TooDeep(at)) => {
                        // A block mapping reports its start after its first
                        // key; point at whichever comes first.
                        let first = match parser.peek() {
                            Ok((_, next)) if next.index() < at.1 => Pos::from_marker(*next),
                            _ => at.0,
                        };
                        builder.index.too_deep = Some(first);
                        break;
                    }
                    Err(Stop::OverBudget) => break,
                },
            }
        }
        builder.index
    }

    /// Where a collection nested more than [`MAX_DEPTH`] levels deep starts,
    /// if the file has one.
    pub fn too_deep(&self) -> Option<Pos> {
        self.too_deep
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
    /// Bytes of path strings built so far, against [`PATH_BUDGET`].
    path_bytes: usize,
}

/// Why the walk stopped before the end of the document.
#[derive(Debug)]
enum Stop {
    /// A collection would open past [`MAX_DEPTH`]; where its event was marked.
    TooDeep((Pos, usize)),
    /// The paths built so far exceed [`PATH_BUDGET`].
    OverBudget,
}

impl Builder {
    /// Decides the path of the node that starts now. Returns `None` when the
    /// node is a mapping key (recorded here) rather than a value.
    fn node_path(
        &mut self,
        scalar: Option<&str>,
        at: (Pos, usize),
    ) -> Result<Option<String>, Stop> {
        // Charged before any string is built: the parent's path plus the
        // longest suffix this node can add.
        let cost = match self.stack.last() {
            None => 0,
            Some(Frame::Seq { path, .. }) => 2 * (path.len() + 24),
            Some(Frame::Map { path, key }) => {
                let k = key.as_deref().or(scalar).unwrap_or("?");
                2 * (path.len() + 1 + k.len())
            }
        };
        self.path_bytes = self.path_bytes.saturating_add(cost);
        if self.path_bytes > PATH_BUDGET {
            return Err(Stop::OverBudget);
        }
        Ok(match self.stack.last_mut() {
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
        })
    }

    fn record_value(&mut self, path: &str, at: (Pos, usize)) {
        let entry = self.index.entries.entry(path.to_string()).or_default();
        match entry.value {
            Some((_, idx)) if idx <= at.1 => {}
            _ => entry.value = Some(at),
        }
    }

    /// Takes one event; `Err` ends the walk early.
    fn on_event(&mut self, ev: Event, mark: Marker) -> Result<(), Stop> {
        let at = (Pos::from_marker(mark), mark.index());
        match ev {
            Event::Scalar(ref text, ..) => {
                if let Some(path) = self.node_path(Some(text), at)? {
                    self.record_value(&path, at);
                }
            }
            Event::Alias(_) => {
                if let Some(path) = self.node_path(None, at)? {
                    self.record_value(&path, at);
                }
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                if self.stack.len() >= MAX_DEPTH {
                    return Err(Stop::TooDeep(at));
                }
                let is_map = matches!(ev, Event::MappingStart(..));
                let path = self.node_path(None, at)?.unwrap_or_else(|| "?".to_string());
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `load_str` on a 2 MiB stack; the message of its first error.
    fn refuse_on_small_stack(text: String) -> String {
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(
                move || match super::super::load_str(&text, "t.yaml", &|_| None) {
                    Ok(_) => panic!("accepted"),
                    Err(errs) => errs.0[0].to_string(),
                },
            )
            .unwrap()
            .join()
            .expect("the loader panicked")
    }

    fn block_maps(depth: usize) -> String {
        (0..depth)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect()
    }

    #[test]
    fn nesting_up_to_the_limit_is_indexed() {
        let index = PosIndex::build(&block_maps(MAX_DEPTH));
        assert_eq!(index.too_deep(), None);
        let deepest = (0..MAX_DEPTH - 1)
            .map(|i| format!("k{i}"))
            .collect::<Vec<_>>()
            .join(".");
        let line = MAX_DEPTH - 1;
        assert_eq!(index.key_exact(&deepest), Some(Pos { line, col: line }));
    }

    #[test]
    fn nesting_past_the_limit_is_refused_where_it_starts() {
        // The mapping at depth MAX_DEPTH + 1 starts at its first key.
        let index = PosIndex::build(&block_maps(MAX_DEPTH + 1));
        let line = MAX_DEPTH + 1;
        assert_eq!(index.too_deep(), Some(Pos { line, col: line }));
        let flow = format!("routes: {}{}", "[".repeat(200), "]".repeat(200));
        let col = "routes: ".len() + MAX_DEPTH;
        assert_eq!(
            PosIndex::build(&flow).too_deep(),
            Some(Pos { line: 1, col })
        );
    }

    #[test]
    fn deep_documents_are_refused_without_overflowing() {
        let cases = [
            block_maps(5_000),
            format!("routes: {}{}", "[".repeat(100_000), "]".repeat(100_000)),
            format!("routes: {}x{}", "{a: ".repeat(100_000), "}".repeat(100_000)),
            format!("{}x{}", "{a: ".repeat(300), "}".repeat(300)),
            format!("{}{}", "- ".repeat(50_000), "x"),
        ];
        for text in cases {
            let t = std::time::Instant::now();
            let msg = refuse_on_small_stack(text);
            assert!(msg.contains("nested too deeply"), "{msg}");
            assert!(t.elapsed() < std::time::Duration::from_secs(5), "{msg}");
        }
    }

    #[test]
    fn a_long_key_over_many_descendants_stays_within_budget() {
        // Each descendant's path repeats the 1 MB key: ~3 GB if built in full.
        let mut text = format!("? {}\n:\n", "a".repeat(1 << 20));
        for i in 0..3_000 {
            text.push_str(&format!("  b{i}: 1\n"));
        }
        let msg = refuse_on_small_stack(text);
        assert!(msg.contains("unknown field"), "{msg}");
    }
}
