//! Configuration: the YAML file of SPEC §2 (and the `provider` / `verify`
//! keys of §8), in three steps over one parse.
//!
//! 0. [`yaml`]: the text, parsed once into a tree of nodes that keep their
//!    line and column.
//! 1. [`raw`]: serde types that mirror the file, `deny_unknown_fields`
//!    everywhere, typed enums, no `flatten`, read from the tree by [`de`].
//!    A serde failure (an unknown key, an unknown enum value, a wrong type)
//!    stops here with that one error, at the node that raised it; so does a
//!    syntax error.
//! 2. [`validate`](validate::validate): turns the raw file into the model and
//!    reports *every* remaining problem at once, each as
//!    `file:line:col: path: message` (positions looked up in the same tree).
//! 3. [`model`]: the resolved [`Config`] the runtime alone sees. Route fields
//!    are resolved as route value > `defaults` value > built-in default;
//!    a provider preset fills `event_id` (before `defaults`) and `verify.scheme`,
//!    and the slack preset `on_missing_id: forward` (its url_verification).
//!    Values are ready for use: JSON pointers parsed, the signature
//!    [`Verifier`] built, leases and retentions in the store's milliseconds,
//!    the upstream's `Host` header made. The runtime adds only what needs the
//!    network or the OS (the upstream's address).
//!
//! Environment variables: `${NAME}` is expanded in `store.url` only (so a
//! database password need not sit in the file). Secrets come from
//! `env:NAME` / `file:PATH` references in `verify.secrets` and `admin.token`; a relative
//! `file:` path is relative to the working directory, like a SQLite path.
//!
//! Layout: `yaml.rs` (the tree, path → line:col), `de.rs` (serde over the
//! tree), `raw.rs` (serde types), `route_fields.rs` (the one list of route
//! fields: each with its types, built-in default and parser), `ctx.rs` (where
//! errors and warnings collect, below every section parser), `units.rs`
//! (durations and sizes), `validate.rs` (top level, store, duplicates),
//! `layer.rs` (fields shared with `defaults`, and their resolution),
//! `route.rs` (one route: presets and the checks across its fields),
//! `admin.rs` (the admin token), `tls.rs` (the listener's certificate),
//! `fields.rs` (small value parsers: upstream URL, JSON pointer, header),
//! `reconcile.rs` (a route's `reconcile` block, SPEC §21),
//! `verify.rs` (provider presets, secrets, warnings), `hmac_rule.rs` (the
//! `scheme: hmac` block, SPEC §17), `error.rs` (a problem with its file,
//! line and column), `model.rs` (the output).
//!
//! A new route key: an entry in `route_fields.rs`, its parser in `layer.rs`
//! if serde's check is not enough, any rule binding it to other fields in
//! `route.rs`, and its tests in `tests/`.

mod admin;
mod ctx;
mod de;
mod error;
mod fields;
mod hmac_rule;
mod layer;
mod model;
mod raw;
mod reconcile;
mod route;
mod route_fields;
mod telemetry;
mod tls;
mod units;
mod validate;
mod verify;
mod yaml;

#[cfg(test)]
mod tests;

use std::path::Path;

/// The store's URL type is the store's own.
pub use crate::store::{StoreKind, StoreUrl};
pub use error::{ConfigError, ConfigErrors};
pub use fields::route_name;
pub use model::{
    AdminConfig, AdminToken, Ask, AskUrl, Challenge, Config, DigestMode, Downstream, DurationMs,
    EventIdSource, IdPart, InFlight, OnAmbiguous, OnMissingId, OnStoreError, Otlp, Provider,
    Reconcile, Route, Scheme, SettleOn, StoreConfig, SweeperConfig, Telemetry, Tls, UpstreamUrl,
    Verifier,
};
pub use units::{format_duration, format_size, parse_duration, parse_size};

use yaml::{Doc, Pos};

/// A validated configuration and the warnings `idemgate check` prints.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The model the runtime uses.
    pub config: Config,
    /// Non-fatal findings, one readable line each, `file:line:col: path: message`.
    pub warnings: Vec<String>,
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
    let one = |pos: Pos, path: &str, message: String| {
        ConfigErrors(vec![ConfigError::new(file_name, pos, path, message)])
    };
    // A syntax error, or serde's first (an unknown key, a wrong type), stops here.
    let doc = Doc::parse(text).map_err(|e| one(e.pos, "", e.message))?;
    let raw: raw::RawConfig = de::from_doc(&doc).map_err(|e| {
        let (pos, path) = e.at.unwrap_or((Pos::START, String::new()));
        one(pos, &path, e.message)
    })?;
    if doc.has_no_values() {
        // One clear message instead of four "missing field" errors.
        return Err(one(Pos::START, "", "the config file is empty".to_string()));
    }
    let mut ctx = ctx::Ctx::new(file_name, &doc, env);
    let config = validate::validate(raw, &mut ctx);
    let (mut errors, warnings) = ctx.finish();
    match config {
        Some(config) if errors.is_empty() => Ok(Loaded { config, warnings }),
        _ => {
            if errors.is_empty() {
                // validate() only returns None after recording an error;
                // this keeps the contract even if that ever changes.
                errors.push(ConfigError::new(
                    file_name,
                    Pos::START,
                    "",
                    "invalid configuration".to_string(),
                ));
            }
            Err(ConfigErrors(errors))
        }
    }
}
