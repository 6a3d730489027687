//! Configuration: the YAML file of SPEC §2 (and the `provider` / `verify`
//! keys of §8), in three steps.
//!
//! 1. [`raw`]: serde types that mirror the file, `deny_unknown_fields`
//!    everywhere, typed enums, no `flatten`. A serde failure (bad syntax, an
//!    unknown key, an unknown enum value, a wrong type) stops here with that
//!    one error, positioned at the offending key or value.
//! 2. [`validate`](validate::validate): turns the raw file into the model and
//!    reports *every* remaining problem at once, each as
//!    `file:line:col: path: message` (positions from [`positions`]).
//! 3. [`model`]: the resolved [`Config`] the runtime alone sees. Route fields
//!    are resolved as route value > `defaults` value > built-in default;
//!    a provider preset fills `event_id` (before `defaults`) and `verify.scheme`,
//!    and the slack preset `on_missing_id: forward` (its url_verification).
//!
//! Environment variables: `${NAME}` is expanded in `store.url` only (so a
//! database password need not sit in the file). Secrets come from
//! `env:NAME` / `file:PATH` references in `verify.secrets` and `admin.token`; a relative
//! `file:` path is relative to the working directory, like a SQLite path.
//!
//! Layout: `raw.rs` (serde types), `units.rs` (durations and sizes),
//! `positions.rs` (path → line:col), `validate.rs` (top level, store,
//! duplicates), `layer.rs` (fields shared with `defaults`), `route.rs` (one
//! route and its resolution), `admin.rs` (the admin token), `fields.rs` (small
//! value parsers: upstream URL, JSON pointer, header), `verify.rs` (provider
//! presets, secrets, warnings), `model.rs` (the output).

mod admin;
mod fields;
mod layer;
mod model;
mod positions;
mod raw;
mod route;
mod tls;
mod units;
mod validate;
mod verify;

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::Path;

pub use model::{
    AdminConfig, AdminToken, Config, DigestMode, Downstream, EventIdSource, InFlight, OnMissingId,
    OnStoreError, Provider, Route, Scheme, SettleOn, StoreConfig, StoreKind, SweeperConfig, Tls,
    UpstreamUrl, Verify,
};
pub use units::{format_duration, format_size, parse_duration, parse_size};

use positions::{join, PosIndex, MAX_DEPTH};

/// A validated configuration and the warnings `idemgate check` prints.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The model the runtime uses.
    pub config: Config,
    /// Non-fatal findings, one readable line each, `file:line:col: path: message`.
    pub warnings: Vec<String>,
}

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

/// Reads and validates `path`; environment lookups use the process
/// environment. Errors name the file as given.
pub fn load_file(path: &Path) -> Result<Loaded, ConfigErrors> {
    let file_name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigErrors(vec![ConfigError {
            file: file_name.clone(),
            line: 1,
            col: 1,
            path: "(file)".to_string(),
            message: format!("cannot read the config file: {e}"),
        }])
    })?;
    load_str(&text, &file_name, &|name| std::env::var(name).ok())
}

/// Parses and validates `text`; `file_name` prefixes every message and `env`
/// answers `${VAR}` and `env:NAME` lookups (a seam for tests).
pub fn load_str(
    text: &str,
    file_name: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, ConfigErrors> {
    let index = PosIndex::build(text);
    if let Some(pos) = index.too_deep() {
        // Refused before serde_yaml, whose time grows with the square of the depth.
        return Err(ConfigErrors(vec![ConfigError {
            file: file_name.to_string(),
            line: pos.line,
            col: pos.col,
            path: "(root)".to_string(),
            message: format!("nested too deeply (more than {MAX_DEPTH} levels)"),
        }]));
    }
    let raw: raw::RawConfig = match serde_yaml::from_str(text) {
        Ok(raw) => raw,
        Err(e) => return Err(ConfigErrors(vec![serde_error(&e, file_name, &index)])),
    };
    if raw.is_empty() {
        // One clear message instead of four "missing field" errors.
        return Err(ConfigErrors(vec![ConfigError {
            file: file_name.to_string(),
            line: 1,
            col: 1,
            path: "(root)".to_string(),
            message: "the config file is empty".to_string(),
        }]));
    }
    let mut ctx = validate::Ctx::new(file_name, &index, env);
    let config = validate::validate(raw, &mut ctx);
    let (mut errors, warnings) = ctx.finish();
    match config {
        Some(config) if errors.is_empty() => Ok(Loaded { config, warnings }),
        _ => {
            if errors.is_empty() {
                // validate() only returns None after recording an error;
                // this keeps the contract even if that ever changes.
                errors.push(ConfigError {
                    file: file_name.to_string(),
                    line: 1,
                    col: 1,
                    path: "(root)".to_string(),
                    message: "invalid configuration".to_string(),
                });
            }
            Err(ConfigErrors(errors))
        }
    }
}

/// Converts serde_yaml's one error into ours: splits off its path prefix and
/// `at line L column C` suffix, and re-points an unknown field at the unknown
/// key itself using the position index.
fn serde_error(e: &serde_yaml::Error, file: &str, index: &PosIndex) -> ConfigError {
    let mut message = e.to_string();
    let (mut line, mut col) = (1, 1);
    if let Some(loc) = e.location() {
        (line, col) = (loc.line(), loc.column());
        let suffix = format!(" at line {} column {}", loc.line(), loc.column());
        if let Some(at) = message.find(&suffix) {
            message.replace_range(at..at + suffix.len(), "");
        }
    }
    let mut path = "(root)".to_string();
    if let Some((head, rest)) = message.split_once(": ") {
        let looks_like_path = !head.is_empty()
            && head
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.[]?".contains(c));
        if looks_like_path && head != "." {
            path = head.to_string();
            message = rest.to_string();
        }
    }
    let parent = if path == "(root)" { "" } else { path.as_str() };
    let named = |prefix: &str| {
        message
            .strip_prefix(prefix)
            .and_then(|r| r.split_once('`'))
            .map(|(n, _)| join(parent, n))
    };
    let better = if let Some(key) = named("unknown field `") {
        index.key_exact(&key)
    } else if let Some(key) = named("duplicate field `") {
        index.repeated_key(&key)
    } else {
        None
    };
    if let Some(pos) = better {
        (line, col) = (pos.line, pos.col);
    }
    ConfigError {
        file: file.to_string(),
        line,
        col,
        path,
        message,
    }
}
