//! A config file's problems, each with its file, line and column.

use std::fmt;

use super::yaml::Pos;

/// One problem in the config file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{col}: {path}: {message}")]
pub struct ConfigError {
    /// The file name as given to the loader.
    pub file: String,
    /// 1-based.
    pub line: usize,
    /// 1-based.
    pub col: usize,
    /// Where in the document, e.g. `routes[1].lease`; `(root)` for the top level.
    pub path: String,
    /// What is wrong. Never contains a secret or an expanded URL.
    pub message: String,
}

impl ConfigError {
    /// An error at `pos`; an empty `path` is the root.
    pub(super) fn new(file: &str, pos: Pos, path: &str, message: String) -> ConfigError {
        ConfigError {
            file: file.to_string(),
            line: pos.line,
            col: pos.col,
            path: if path.is_empty() { "(root)" } else { path }.to_string(),
            message,
        }
    }
}

/// Every problem found, sorted by position. `Display` prints one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}
