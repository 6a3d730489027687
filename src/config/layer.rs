//! The route fields shared by `defaults` and a route, parsed one level at a
//! time. Each parsed value remembers the path that set it, so cross-field
//! errors and warnings can point at a line that set it.

use std::time::Duration;

use super::ctx::Ctx;
use super::fields;
use super::model::{DigestMode, EventIdSource, InFlight, OnMissingId, OnStoreError, SettleOn};
use super::raw::{route_fields, RawDefaults, RawEventId, Text};

/// A value and the path that set it.
#[derive(Debug, Clone)]
pub struct Set<T> {
    pub value: T,
    pub path: String,
}

/// Builds [`Layer`] from the field list of [`route_fields!`].
macro_rules! layer_struct {
    ($($(#[$attr:meta])* $field:ident: $raw:ty => $parsed:ty,)*) => {
        /// The shared route fields of one level (`defaults` or a route),
        /// parsed. A field that failed to parse is `None` (its error is
        /// already recorded).
        #[derive(Debug, Default)]
        pub struct Layer {
            $(pub $field: Option<Set<$parsed>>,)*
            /// `event_id` was written but is invalid (its error is recorded), so a
            /// "missing event_id" error would only repeat it.
            pub event_id_invalid: bool,
        }
    };
}
route_fields!(layer_struct);

/// Parses the shared fields of the level at `base` (`defaults`, `routes[1]`).
pub fn parse_layer(ctx: &mut Ctx, base: &str, raw: RawDefaults) -> Layer {
    let RawDefaults {
        strip_prefix,
        event_id,
        digest,
        digest_ignore,
        guard_methods,
        unverified_methods,
        on_missing_id,
        on_store_error,
        in_flight,
        max_waiters,
        settle_on,
        replay_body,
        replay_body_limit,
        idempotency_key_header,
        lease,
        retention,
        max_body,
        upstream_timeout,
    } = raw;
    let mut l = Level { ctx, base };
    let written = event_id.is_some();
    let event_id = l.parse("event_id", event_id, event_id_source);
    Layer {
        strip_prefix: l.plain("strip_prefix", strip_prefix),
        event_id_invalid: written && event_id.is_none(),
        event_id,
        digest: l.plain("digest", digest),
        digest_ignore: l.parse("digest_ignore", digest_ignore, pointers),
        guard_methods: l.parse("guard_methods", guard_methods, methods),
        unverified_methods: l.parse("unverified_methods", unverified_methods, methods),
        on_missing_id: l.plain("on_missing_id", on_missing_id),
        on_store_error: l.plain("on_store_error", on_store_error),
        in_flight: l.plain("in_flight", in_flight),
        max_waiters: l.parse("max_waiters", max_waiters, |ctx, path, n| {
            usize::try_from(n)
                .map_err(|_| ctx.at_value(path, "max_waiters is too large"))
                .ok()
        }),
        settle_on: l.parse("settle_on", settle_on, statuses),
        replay_body: l.plain("replay_body", replay_body),
        replay_body_limit: l.parse("replay_body_limit", replay_body_limit, size),
        idempotency_key_header: l.parse(
            "idempotency_key_header",
            idempotency_key_header,
            |ctx, path, h| {
                h.map(|h| fields::idempotency_key_header(&h))
                    .transpose()
                    .map_err(|e| ctx.at_value(path, e))
                    .ok()
            },
        ),
        lease: l.parse("lease", lease, duration),
        retention: l.parse("retention", retention, duration),
        max_body: l.parse("max_body", max_body, size),
        upstream_timeout: l.parse("upstream_timeout", upstream_timeout, duration),
    }
}

/// One level being parsed: each field's path is `base.key`.
struct Level<'c, 'a> {
    ctx: &'c mut Ctx<'a>,
    base: &'c str,
}

impl Level<'_, '_> {
    /// A value serde checked already.
    fn plain<T>(&self, key: &str, value: Option<T>) -> Option<Set<T>> {
        let path = format!("{}.{key}", self.base);
        value.map(|value| Set { value, path })
    }

    /// A value `parse` checks; it records its errors and answers `None`.
    fn parse<R, T>(
        &mut self,
        key: &str,
        raw: Option<R>,
        parse: impl FnOnce(&mut Ctx, &str, R) -> Option<T>,
    ) -> Option<Set<T>> {
        let path = format!("{}.{key}", self.base);
        let value = parse(self.ctx, &path, raw?)?;
        Some(Set { value, path })
    }
}

fn duration(ctx: &mut Ctx, path: &str, text: Text) -> Option<Duration> {
    ctx.duration(path, Some(&text))
}

fn size(ctx: &mut Ctx, path: &str, text: Text) -> Option<u64> {
    ctx.size(path, Some(&text))
}

/// `digest_ignore`: JSON pointers.
fn pointers(ctx: &mut Ctx, path: &str, list: Vec<String>) -> Option<Vec<String>> {
    let mut ok = true;
    for (i, ptr) in list.iter().enumerate() {
        if let Err(e) = fields::json_pointer(ptr) {
            ctx.at_value(&format!("{path}[{i}]"), e);
            ok = false;
        }
    }
    ok.then_some(list)
}

/// `settle_on`: at least one status class or code.
fn statuses(ctx: &mut Ctx, path: &str, items: Vec<Text>) -> Option<SettleOn> {
    let mut s = SettleOn {
        classes: Vec::new(),
        codes: Vec::new(),
    };
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        if let Err(e) = s.parse_item(&item.0) {
            ctx.at_value(&format!("{path}[{i}]"), e);
            ok = false;
        }
    }
    if items.is_empty() {
        ctx.at_value(path, "settle_on needs at least one status (e.g. [\"2xx\"])");
        ok = false;
    }
    ok.then_some(s)
}

/// A list of HTTP methods, duplicates dropped; `None` when an entry is
/// invalid (recorded).
fn methods(ctx: &mut Ctx, path: &str, list: Vec<String>) -> Option<Vec<http::Method>> {
    let mut methods: Vec<http::Method> = Vec::new();
    let mut ok = true;
    for (i, m) in list.iter().enumerate() {
        match fields::method(m) {
            Ok(m) if !methods.contains(&m) => methods.push(m),
            Ok(_) => {}
            Err(e) => {
                ctx.at_value(&format!("{path}[{i}]"), e);
                ok = false;
            }
        }
    }
    ok.then_some(methods)
}

/// Exactly one of `header` / `json_pointer`.
fn event_id_source(ctx: &mut Ctx, path: &str, raw: RawEventId) -> Option<EventIdSource> {
    let RawEventId {
        header,
        json_pointer,
    } = raw;
    match (header, json_pointer) {
        (Some(h), None) => fields::header_name(&h)
            .map(EventIdSource::Header)
            .map_err(|e| ctx.at_value(&format!("{path}.header"), e))
            .ok(),
        (None, Some(p)) => fields::json_pointer(&p)
            .map(|()| EventIdSource::JsonPointer(p))
            .map_err(|e| ctx.at_value(&format!("{path}.json_pointer"), e))
            .ok(),
        (None, None) => {
            ctx.at_key(
                path,
                "event_id needs exactly one source: `header` or `json_pointer` (found none)",
            );
            None
        }
        (Some(_), Some(_)) => {
            ctx.at_key(
                path,
                "event_id needs exactly one source: `header` or `json_pointer` (found both)",
            );
            None
        }
    }
}

/// The route value, else the `defaults` value, else `builtin`; with the path
/// that set it (`None` for a built-in default).
pub fn pick<T: Clone>(
    route: &Option<Set<T>>,
    defaults: &Option<Set<T>>,
    builtin: T,
) -> (T, Option<String>) {
    match route.as_ref().or(defaults.as_ref()) {
        Some(s) => (s.value.clone(), Some(s.path.clone())),
        None => (builtin, None),
    }
}
