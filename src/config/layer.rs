//! The route fields shared by `defaults` and a route, parsed one level at a
//! time. Each parsed value remembers the path that set it, so cross-field
//! errors and warnings can point at a line that set it.

use std::sync::Arc;
use std::time::Duration;

use super::ctx::Ctx;
use super::fields;
use super::model::{
    BreakerCfg, DigestMode, DurationMs, EventIdSource, IdPart, InFlight, OnAmbiguous, OnMissingId,
    OnStoreError, Rate, SettleOn,
};
use super::raw::{RawAllowFrom, RawBreaker, RawDefaults, RawEventId, RawIdPart, Text};
use super::route_fields::route_fields;
use crate::claim::json_pointer::JsonPointer;
use crate::source::{Range, Ranges};

/// A value and the path that set it.
#[derive(Debug, Clone)]
pub struct Set<T> {
    pub value: T,
    pub path: String,
}

/// Builds, from the field list of [`route_fields!`], [`Layer`] and its
/// parser, and [`Resolved`] with the resolution that fills in defaults.
macro_rules! layer {
    ($($(#[doc = $doc:literal])* $(#[serde($($serde:tt)*)])?
       $field:ident: $raw:ty => $parsed:ty = $default:expr, parse $parse:ident;)*) => {
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

        /// Parses the shared fields of the level at `base` (`defaults`, `routes[1]`).
        pub fn parse_layer(ctx: &mut Ctx, base: &str, raw: RawDefaults) -> Layer {
            let written = raw.event_id.is_some();
            let mut l = Level { ctx, base };
            let layer = Layer {
                $($field: l.parse(stringify!($field), raw.$field, $parse),)*
                event_id_invalid: false,
            };
            Layer {
                event_id_invalid: written && layer.event_id.is_none(),
                ..layer
            }
        }

        /// One route's shared fields, resolved: each the route's value, else
        /// the `defaults` value, else its built-in default.
        #[derive(Debug)]
        pub struct Resolved {
            $(pub $field: Picked<$parsed>,)*
        }

        /// Resolves a route's level `own` over `defaults`.
        pub fn resolve(own: &Layer, defaults: &Layer) -> Resolved {
            Resolved {
                $($field: pick(&own.$field, &defaults.$field, $default),)*
            }
        }
    };
}
route_fields!(layer);

/// One level being parsed: each field's path is `base.key`.
struct Level<'c, 'a> {
    ctx: &'c mut Ctx<'a>,
    base: &'c str,
}

impl Level<'_, '_> {
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

// The parsers the field list names: each records its errors and answers
// `None` for a value it refused.

/// A value serde checked already.
fn plain<T>(_: &mut Ctx, _: &str, value: T) -> Option<T> {
    Some(value)
}

fn duration(ctx: &mut Ctx, path: &str, text: Text) -> Option<Duration> {
    ctx.duration(path, Some(&text))
}

/// A duration the store takes in milliseconds.
fn duration_ms(ctx: &mut Ctx, path: &str, text: Text) -> Option<DurationMs> {
    duration(ctx, path, text).map(DurationMs::from)
}

fn size(ctx: &mut Ctx, path: &str, text: Text) -> Option<u64> {
    ctx.size(path, Some(&text))
}

/// `digest_ignore`: JSON pointers.
fn pointers(ctx: &mut Ctx, path: &str, list: Vec<String>) -> Option<Vec<JsonPointer>> {
    let mut pointers = Vec::with_capacity(list.len());
    let mut ok = true;
    for (i, ptr) in list.iter().enumerate() {
        match fields::json_pointer(ptr) {
            Ok(p) => pointers.push(p),
            Err(e) => {
                ctx.at_value(&format!("{path}[{i}]"), e);
                ok = false;
            }
        }
    }
    ok.then_some(pointers)
}

/// `max_waiters`.
fn max_waiters(ctx: &mut Ctx, path: &str, n: u64) -> Option<usize> {
    usize::try_from(n)
        .map_err(|_| ctx.at_value(path, "max_waiters is too large"))
        .ok()
}

/// `upstream_concurrency`: 1 or more.
fn concurrency(ctx: &mut Ctx, path: &str, n: u64) -> Option<Option<u32>> {
    match u32::try_from(n) {
        Ok(0) => ctx.at_value(path, "upstream_concurrency must be at least 1"),
        Ok(n) => return Some(Some(n)),
        Err(_) => ctx.at_value(path, "upstream_concurrency is too large"),
    }
    None
}

/// `upstream_rate`: `N/s` or `N/m`, N at least 1.
fn rate(ctx: &mut Ctx, path: &str, text: Text) -> Option<Option<Rate>> {
    let bad = |why: &str| format!("invalid upstream_rate `{}`: {why}", text.0);
    let (n, unit) = match text.0.trim().split_once('/') {
        Some(parts) => parts,
        None => {
            ctx.at_value(path, bad("expected N/s or N/m (e.g. \"50/s\")"));
            return None;
        }
    };
    let every = match unit {
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        _ => {
            ctx.at_value(path, bad("the unit is `s` or `m`"));
            return None;
        }
    };
    match n.parse::<u32>() {
        Ok(0) => ctx.at_value(path, bad("the rate must be at least 1")),
        Ok(per) if n.bytes().all(|b| b.is_ascii_digit()) => return Some(Some(Rate { per, every })),
        _ => ctx.at_value(path, bad("N is a whole number from 1 to 4294967295")),
    }
    None
}

/// `upstream_wait`: a duration up to [`crate::limits::MAX_WAIT`].
fn wait(ctx: &mut Ctx, path: &str, text: Text) -> Option<Option<Duration>> {
    let d = ctx.duration(path, Some(&text))?;
    if d > crate::limits::MAX_WAIT {
        let max = super::format_duration(crate::limits::MAX_WAIT);
        ctx.at_value(
            path,
            format!(
                "upstream_wait is at most {max}: a waiting request holds its sender's connection"
            ),
        );
        return None;
    }
    Some(Some(d))
}

/// `upstream_breaker`: `failures` (1 or more) and `open` (a duration).
fn breaker(ctx: &mut Ctx, path: &str, raw: RawBreaker) -> Option<Option<BreakerCfg>> {
    let failures = match raw.failures.map(u32::try_from) {
        Some(Ok(n)) if n > 0 => Some(n),
        Some(_) => {
            let why = "failures must be from 1 to 4294967295";
            ctx.at_value(&format!("{path}.failures"), why);
            None
        }
        None => {
            ctx.at_key(path, "upstream_breaker needs `failures` (e.g. 5)");
            None
        }
    };
    let open = match &raw.open {
        Some(text) => ctx.duration(&format!("{path}.open"), Some(text)),
        None => {
            ctx.at_key(path, "upstream_breaker needs `open` (e.g. 30s)");
            None
        }
    };
    Some(Some(BreakerCfg {
        failures: failures?,
        open: open?,
    }))
}

/// `idempotency_key_header`: a header name, or `None` (`null`: disabled).
fn key_header(ctx: &mut Ctx, path: &str, name: Option<String>) -> Option<Option<http::HeaderName>> {
    name.map(|h| fields::idempotency_key_header(&h))
        .transpose()
        .map_err(|e| ctx.at_value(path, e))
        .ok()
}

/// `allow_from`: ranges written in the file, or `file:PATH` (one range a
/// line, `#` comments), read now: a reload reads it again. `None` (the
/// file's `null`): any source. An empty list is refused: it would refuse
/// every sender (`null` says "any" on purpose).
fn allow_from(ctx: &mut Ctx, path: &str, raw: Option<RawAllowFrom>) -> Option<Option<Arc<Ranges>>> {
    let ranges = match raw? {
        RawAllowFrom::List(items) => {
            let mut ranges = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match Range::parse(item) {
                    Ok(r) => ranges.push(r),
                    Err(e) => ctx.at_value(&format!("{path}[{i}]"), e.to_string()),
                }
            }
            (ranges.len() == items.len()).then_some(ranges)?
        }
        RawAllowFrom::Text(text) => match text.strip_prefix("file:") {
            Some(file) => ranges_file(ctx, path, file)?,
            None => {
                let why =
                    "allow_from is a list of address ranges ([192.0.2.0/24, ...]) or file:PATH";
                ctx.at_value(path, why);
                return None;
            }
        },
    };
    if ranges.is_empty() {
        let why = "allow_from holds no range: it would refuse every sender (null allows any)";
        ctx.at_value(path, why);
        return None;
    }
    Some(Some(Arc::new(Ranges::new(ranges))))
}

/// An `allow_from` file: one range a line, blank lines and `#` comments
/// (whole-line or after a range) allowed; each bad line is an error at its
/// own `file:line:col`.
fn ranges_file(ctx: &mut Ctx, path: &str, file: &str) -> Option<Vec<Range>> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            ctx.at_value(
                path,
                format!("cannot read the allow_from file `{file}`: {e}"),
            );
            return None;
        }
    };
    let mut ranges = Vec::new();
    let mut ok = true;
    for (n, line) in text.lines().enumerate() {
        let content = line.split('#').next().unwrap_or("");
        let range = content.trim();
        if range.is_empty() {
            continue;
        }
        let col = content.len() - content.trim_start().len() + 1;
        match Range::parse(range) {
            Ok(r) => ranges.push(r),
            Err(e) => {
                ctx.at_file(file, n + 1, col, path, e.to_string());
                ok = false;
            }
        }
    }
    ok.then_some(ranges)
}

/// Most headers `replay_headers` may name.
const MAX_REPLAY_HEADERS: usize = 8;

/// `replay_headers`: at most [`MAX_REPLAY_HEADERS`] names, none that a
/// replay must not repeat (`Set-Cookie`, hop-by-hop, framing), duplicates
/// dropped.
fn replay_headers(ctx: &mut Ctx, path: &str, list: Vec<String>) -> Option<Vec<http::HeaderName>> {
    if list.len() > MAX_REPLAY_HEADERS {
        let why = format!("replay_headers names at most {MAX_REPLAY_HEADERS} headers");
        ctx.at_value(path, why);
        return None;
    }
    let mut names: Vec<http::HeaderName> = Vec::with_capacity(list.len());
    let mut ok = true;
    for (i, name) in list.iter().enumerate() {
        match fields::replay_header(name) {
            Ok(h) if !names.contains(&h) => names.push(h),
            Ok(_) => {}
            Err(e) => {
                ctx.at_value(&format!("{path}[{i}]"), e);
                ok = false;
            }
        }
    }
    ok.then_some(names)
}

/// The header the built-in default sends the event ID in.
fn idempotency_key() -> http::HeaderName {
    http::HeaderName::from_static("idempotency-key")
}

/// `event_id`'s built-in default: a header that is never read, since only
/// a pass-through route (which extracts no ID) may leave the source unset.
fn idempotency_key_placeholder() -> EventIdSource {
    EventIdSource::Header(idempotency_key())
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

/// Exactly one of `header` / `json_pointer` / `parts`.
fn event_id_source(ctx: &mut Ctx, path: &str, raw: RawEventId) -> Option<EventIdSource> {
    let RawEventId {
        header,
        json_pointer,
        parts,
    } = raw;
    let found = [header.is_some(), json_pointer.is_some(), parts.is_some()];
    match found.iter().filter(|f| **f).count() {
        0 => {
            ctx.at_key(
                path,
                "event_id needs exactly one source: `header`, `json_pointer` or `parts` (found none)",
            );
            return None;
        }
        1 => {}
        n => {
            let found = if n == 2 { "both" } else { "all three" };
            ctx.at_key(
                path,
                format!("event_id needs exactly one source: `header`, `json_pointer` or `parts` (found {found})"),
            );
            return None;
        }
    }
    if let Some(parts) = parts {
        return id_parts(ctx, &format!("{path}.parts"), parts).map(EventIdSource::Parts);
    }
    match id_part(ctx, path, header, json_pointer)? {
        IdPart::Header(h) => Some(EventIdSource::Header(h)),
        IdPart::JsonPointer(p) => Some(EventIdSource::JsonPointer(p)),
    }
}

/// Most parts a composite ID may have.
const MAX_ID_PARTS: usize = 8;

/// `event_id.parts`: one to [`MAX_ID_PARTS`] sources, each checked.
fn id_parts(ctx: &mut Ctx, path: &str, raw: Vec<RawIdPart>) -> Option<Vec<IdPart>> {
    if raw.is_empty() || raw.len() > MAX_ID_PARTS {
        ctx.at_value(
            path,
            format!("parts needs 1 to {MAX_ID_PARTS} sources, e.g. [{{json_pointer: /team_id}}, {{json_pointer: /event_id}}]"),
        );
        return None;
    }
    let mut parts = Vec::with_capacity(raw.len());
    let mut ok = true;
    for (
        i,
        RawIdPart {
            header,
            json_pointer,
        },
    ) in raw.into_iter().enumerate()
    {
        let at = format!("{path}[{i}]");
        if header.is_some() == json_pointer.is_some() {
            ctx.at_key(
                &at,
                "each part needs exactly one of `header` or `json_pointer`",
            );
            ok = false;
            continue;
        }
        match id_part(ctx, &at, header, json_pointer) {
            Some(p) => parts.push(p),
            None => ok = false,
        }
    }
    ok.then_some(parts)
}

/// One source: a header name or a JSON pointer (exactly one is `Some`).
fn id_part(
    ctx: &mut Ctx,
    path: &str,
    header: Option<String>,
    json_pointer: Option<String>,
) -> Option<IdPart> {
    match (header, json_pointer) {
        (Some(h), _) => fields::header_name(&h)
            .map(IdPart::Header)
            .map_err(|e| ctx.at_value(&format!("{path}.header"), e))
            .ok(),
        (None, Some(p)) => fields::json_pointer(&p)
            .map(IdPart::JsonPointer)
            .map_err(|e| ctx.at_value(&format!("{path}.json_pointer"), e))
            .ok(),
        (None, None) => None,
    }
}

/// A resolved value and the path that set it (`None`: the built-in default).
#[derive(Debug, Clone)]
pub struct Picked<T> {
    pub value: T,
    pub set_at: Option<String>,
}

/// The route value, else the `defaults` value, else `builtin`.
fn pick<T: Clone>(route: &Option<Set<T>>, defaults: &Option<Set<T>>, builtin: T) -> Picked<T> {
    match route.as_ref().or(defaults.as_ref()) {
        Some(s) => Picked {
            value: s.value.clone(),
            set_at: Some(s.path.clone()),
        },
        None => Picked {
            value: builtin,
            set_at: None,
        },
    }
}
