//! The validation context: where errors and warnings are collected, each
//! with its position looked up in the parsed tree. Every section parser
//! (`validate.rs`, `layer.rs`, `route.rs`, `verify.rs`, `admin.rs`,
//! `tls.rs`) takes it; it imports none of them.

use std::time::Duration;

use super::raw::Text;
use super::units::{parse_duration, parse_size};
use super::yaml::{Doc, Pos};
use super::ConfigError;

/// Collects errors and warnings with their positions while validating.
pub struct Ctx<'a> {
    file: &'a str,
    doc: &'a Doc,
    /// `${VAR}` and `env:NAME` lookups.
    pub env: &'a dyn Fn(&str) -> Option<String>,
    errors: Vec<ConfigError>,
    warnings: Vec<(usize, usize, String)>,
}

impl<'a> Ctx<'a> {
    pub fn new(file: &'a str, doc: &'a Doc, env: &'a dyn Fn(&str) -> Option<String>) -> Ctx<'a> {
        Ctx {
            file,
            doc,
            env,
            errors: Vec::new(),
            warnings: Vec::new(),
        }
    }

    fn push(&mut self, pos: Pos, path: &str, message: String) {
        self.errors
            .push(ConfigError::new(self.file, pos, path, message));
    }

    /// An error about the value at `path` (a bad duration, URL, ...).
    pub fn at_value(&mut self, path: &str, message: impl Into<String>) {
        let pos = self.doc.value_pos(path);
        self.push(pos, path, message.into());
    }

    /// An error about the key at `path` (a duplicate name, a missing source, ...).
    pub fn at_key(&mut self, path: &str, message: impl Into<String>) {
        let pos = self.doc.key_pos(path);
        self.push(pos, path, message.into());
    }

    /// An error in another file the config names (an `allow_from` list),
    /// at its own line and column; `path` says which key named it.
    pub fn at_file(&mut self, file: &str, line: usize, col: usize, path: &str, message: String) {
        self.errors
            .push(ConfigError::new(file, Pos { line, col }, path, message));
    }

    /// A warning about the value at `path`.
    pub fn warn_value(&mut self, path: &str, message: impl Into<String>) {
        let pos = self.doc.value_pos(path);
        let shown = if path.is_empty() { "(root)" } else { path };
        let line = format!(
            "{}:{}:{}: {shown}: {}",
            self.file,
            pos.line,
            pos.col,
            message.into()
        );
        self.warnings.push((pos.line, pos.col, line));
    }

    /// `file:line:col` of the value (or key) at `path`, for messages that
    /// are written after validation (the open-files check at start).
    pub fn position(&self, path: &str, value: bool) -> String {
        let pos = if value {
            self.doc.value_pos(path)
        } else {
            self.doc.key_pos(path)
        };
        format!("{}:{}:{}", self.file, pos.line, pos.col)
    }

    /// Errors recorded so far (a route compares before and after).
    pub fn error_count(&self) -> usize {
        self.errors.len()
    }

    /// Line of the key at `path` (for "first defined at line N" hints).
    pub fn line_of(&self, path: &str) -> usize {
        self.doc.key_pos(path).line
    }

    /// Errors sorted by position (duplicates removed) and warnings likewise.
    pub fn finish(mut self) -> (Vec<ConfigError>, Vec<String>) {
        self.errors.sort_by_key(|e| (e.line, e.col));
        let mut seen = Vec::new();
        self.errors.retain(|e| {
            let new = !seen.contains(e);
            if new {
                seen.push(e.clone());
            }
            new
        });
        self.warnings.sort();
        self.warnings.dedup();
        (
            self.errors,
            self.warnings.into_iter().map(|(_, _, w)| w).collect(),
        )
    }

    /// Parses an optional duration at `path`; errors are recorded, `None` returned.
    pub fn duration(&mut self, path: &str, value: Option<&Text>) -> Option<Duration> {
        let text = value?;
        parse_duration(&text.0)
            .map_err(|e| self.at_value(path, e))
            .ok()
    }

    /// Parses an optional size at `path`.
    pub fn size(&mut self, path: &str, value: Option<&Text>) -> Option<u64> {
        let text = value?;
        parse_size(&text.0).map_err(|e| self.at_value(path, e)).ok()
    }
}
