//! The route fields shared by `defaults` and a route, parsed one level at a
//! time. Each parsed value remembers the path that set it, so cross-field
//! errors and warnings can point at a line that set it.

use std::time::Duration;

use super::fields;
use super::model::{DigestMode, EventIdSource, InFlight, OnMissingId, OnStoreError, SettleOn};
use super::raw::{route_fields, RawDefaults, RawEventId};
use super::validate::Ctx;

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
    let p = |key: &str| format!("{base}.{key}");
    fn at<T>(base: &str, key: &str, value: T) -> Set<T> {
        Set {
            value,
            path: format!("{base}.{key}"),
        }
    }
    let mut layer = Layer {
        strip_prefix: strip_prefix.map(|v| at(base, "strip_prefix", v)),
        digest: digest.map(|v| at(base, "digest", v)),
        on_missing_id: on_missing_id.map(|v| at(base, "on_missing_id", v)),
        on_store_error: on_store_error.map(|v| at(base, "on_store_error", v)),
        in_flight: in_flight.map(|v| at(base, "in_flight", v)),
        replay_body: replay_body.map(|v| at(base, "replay_body", v)),
        ..Layer::default()
    };
    if let Some(e) = event_id {
        layer.event_id = event_id_source(ctx, &p("event_id"), e).map(|v| at(base, "event_id", v));
        layer.event_id_invalid = layer.event_id.is_none();
    }
    if let Some(list) = digest_ignore {
        let mut ok = true;
        for (i, ptr) in list.iter().enumerate() {
            if let Err(e) = fields::json_pointer(ptr) {
                ctx.at_value(&format!("{base}.digest_ignore[{i}]"), e);
                ok = false;
            }
        }
        layer.digest_ignore = ok.then(|| at(base, "digest_ignore", list));
    }
    layer.guard_methods = guard_methods
        .and_then(|list| methods(ctx, base, "guard_methods", &list))
        .map(|v| at(base, "guard_methods", v));
    layer.unverified_methods = unverified_methods
        .and_then(|list| methods(ctx, base, "unverified_methods", &list))
        .map(|v| at(base, "unverified_methods", v));
    if let Some(n) = max_waiters {
        match usize::try_from(n) {
            Ok(n) => layer.max_waiters = Some(at(base, "max_waiters", n)),
            Err(_) => ctx.at_value(&p("max_waiters"), "max_waiters is too large"),
        }
    }
    if let Some(items) = settle_on {
        let mut s = SettleOn {
            classes: Vec::new(),
            codes: Vec::new(),
        };
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            if let Err(e) = s.parse_item(&item.0) {
                ctx.at_value(&format!("{base}.settle_on[{i}]"), e);
                ok = false;
            }
        }
        if items.is_empty() {
            ctx.at_value(
                &p("settle_on"),
                "settle_on needs at least one status (e.g. [\"2xx\"])",
            );
            ok = false;
        }
        layer.settle_on = ok.then(|| at(base, "settle_on", s));
    }
    layer.replay_body_limit = ctx
        .size(&p("replay_body_limit"), replay_body_limit.as_ref())
        .map(|v| at(base, "replay_body_limit", v));
    if let Some(h) = idempotency_key_header {
        match h.map(|h| fields::idempotency_key_header(&h)).transpose() {
            Ok(v) => layer.idempotency_key_header = Some(at(base, "idempotency_key_header", v)),
            Err(e) => ctx.at_value(&p("idempotency_key_header"), e),
        }
    }
    layer.lease = ctx
        .duration(&p("lease"), lease.as_ref())
        .map(|v| at(base, "lease", v));
    layer.retention = ctx
        .duration(&p("retention"), retention.as_ref())
        .map(|v| at(base, "retention", v));
    layer.max_body = ctx
        .size(&p("max_body"), max_body.as_ref())
        .map(|v| at(base, "max_body", v));
    layer.upstream_timeout = ctx
        .duration(&p("upstream_timeout"), upstream_timeout.as_ref())
        .map(|v| at(base, "upstream_timeout", v));
    layer
}

/// A list of HTTP methods at `base.key`, duplicates dropped; `None` when an
/// entry is invalid (recorded).
fn methods(ctx: &mut Ctx, base: &str, key: &str, list: &[String]) -> Option<Vec<http::Method>> {
    let mut methods: Vec<http::Method> = Vec::new();
    let mut ok = true;
    for (i, m) in list.iter().enumerate() {
        match fields::method(m) {
            Ok(m) if !methods.contains(&m) => methods.push(m),
            Ok(_) => {}
            Err(e) => {
                ctx.at_value(&format!("{base}.{key}[{i}]"), e);
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
