//! One route: its identity (name, match, upstream) and the resolution of its
//! shared fields: route > provider preset (event_id, on_missing_id) > `defaults` >
//! built-in default (the field list's, [`route_fields!`]); then the checks
//! that bind one field to another.

use super::ctx::Ctx;
use super::fields;
use super::layer::{parse_layer, resolve, Layer, Resolved};
use super::model::{DigestMode, EventIdSource, Provider, Reconcile, Route, UpstreamUrl, Verifier};
use super::raw::{RawMatch, RawRoute, RawVerifyField};
use super::reconcile;
use super::route_fields::route_fields;
use super::verify;

/// `", from defaults"` / `", built-in default"` / `""` (set on the route).
fn origin(set_at: Option<&str>) -> &'static str {
    match set_at {
        Some(p) if p.starts_with("defaults.") => ", from defaults",
        Some(_) => "",
        None => ", built-in default",
    }
}

/// Parses and resolves one route. `None` when it has errors (recorded).
pub fn parse_route(ctx: &mut Ctx, path: &str, mut raw: RawRoute, d: &Layer) -> Option<Route> {
    let shared = raw.take_shared();
    let RawRoute {
        name,
        match_,
        upstream,
        provider,
        verify,
        reconcile,
        ..
    } = raw;
    let errors_before = ctx.error_count();
    let id = identity(ctx, path, name, match_, upstream);
    // this route's own values; `d` holds the `defaults` ones
    let own = parse_layer(ctx, path, shared);
    let mut r = resolve(&own, d);
    let guarded = !r.guard_methods.value.is_empty();
    presets(ctx, path, &own, d, provider, guarded, &mut r);
    check_digest(ctx, path, &r);
    check_lease(ctx, path, &own, &r);
    check_wait(ctx, path, &r);
    check_unverified(ctx, path, &r);
    if let Some(p) = provider {
        let at = r.retention.set_at.as_deref().unwrap_or(path);
        verify::retention_warning(ctx, p, r.retention.value.duration(), at);
    }
    let verify = verify_field(ctx, path, verify, provider, guarded, errors_before);
    let reconcile = reconcile.and_then(|raw| {
        let at = format!("{path}.reconcile");
        reconcile::reconcile(ctx, &at, raw, r.on_ambiguous.value)
    });
    signed_gitlab_id(&own, provider, verify.as_ref(), &mut r);
    check_signed_id(ctx, path, &r, verify.as_ref());

    if ctx.error_count() != errors_before {
        return None;
    }
    assemble(id, r, provider, verify, reconcile)
}

/// Builds `assemble` from the field list of [`route_fields!`].
macro_rules! assemble {
    ($($(#[doc = $doc:literal])* $(#[serde($($serde:tt)*)])?
       $field:ident: $raw:ty => $parsed:ty = $default:expr, parse $parse:ident;)*) => {
        /// The model route: its identity, its resolved fields, its
        /// provider and verifier. `None` when an identity field failed.
        fn assemble(
            id: Identity,
            r: Resolved,
            provider: Option<Provider>,
            verify: Option<Verifier>,
            reconcile: Option<Reconcile>,
        ) -> Option<Route> {
            Some(Route {
                name: id.name?,
                host: id.host,
                path_prefix: id.path_prefix?,
                upstream: id.upstream?,
                $($field: r.$field.value,)*
                provider,
                challenge: provider.and_then(verify::preset_challenge),
                verify,
                reconcile,
            })
        }
    };
}
route_fields!(assemble);

/// What makes a route itself: its name, what it matches, where it sends.
/// A field that failed is `None` (its error is recorded).
struct Identity {
    name: Option<String>,
    host: Option<String>,
    path_prefix: Option<String>,
    upstream: Option<UpstreamUrl>,
}

fn identity(
    ctx: &mut Ctx,
    path: &str,
    name: Option<String>,
    match_: Option<RawMatch>,
    upstream: Option<String>,
) -> Identity {
    let at = |key: &str| format!("{path}.{key}");
    let name = match name {
        Some(n) => fields::route_name(&n)
            .map_err(|e| ctx.at_value(&at("name"), e))
            .ok()
            .map(|()| n),
        None => {
            ctx.at_value(path, "required field `name` is missing");
            None
        }
    };
    let (host, path_prefix) = route_match(ctx, path, match_);
    let upstream = match upstream {
        Some(u) => fields::upstream(&u)
            .map_err(|e| ctx.at_value(&at("upstream"), e))
            .ok(),
        None => {
            ctx.at_value(
                path,
                "required field `upstream` is missing (e.g. \"http://127.0.0.1:3000\")",
            );
            None
        }
    };
    Identity {
        name,
        host,
        path_prefix,
        upstream,
    }
}

/// `match`: its host (none is any host) and its `path_prefix`, which it must have.
fn route_match(
    ctx: &mut Ctx,
    path: &str,
    match_: Option<RawMatch>,
) -> (Option<String>, Option<String>) {
    let at = |key: &str| format!("{path}.{key}");
    match match_ {
        None => {
            ctx.at_value(
                path,
                "required field `match` is missing (match: {path_prefix: /hooks/x})",
            );
            (None, None)
        }
        Some(m) => {
            let host = m.host.and_then(|h| {
                fields::match_host(&h)
                    .map_err(|e| ctx.at_value(&at("match.host"), e))
                    .ok()
            });
            let prefix = match m.path_prefix {
                Some(p) => fields::path_prefix(&p)
                    .map_err(|e| ctx.at_value(&at("match.path_prefix"), e))
                    .ok(),
                None => {
                    ctx.at_key(&at("match"), "required field `path_prefix` is missing");
                    None
                }
            };
            (host, prefix)
        }
    }
}

/// What a provider preset sets sits between the route and `defaults`: the
/// event ID, and slack's `on_missing_id: forward`. A guarded route must have
/// an event-ID source from one of them; a pass-through route (which never
/// extracts one) keeps the built-in placeholder.
fn presets(
    ctx: &mut Ctx,
    path: &str,
    own: &Layer,
    d: &Layer,
    provider: Option<Provider>,
    guarded: bool,
    r: &mut Resolved,
) {
    if own.on_missing_id.is_none() {
        if let Some(preset) = provider.and_then(verify::preset_on_missing_id) {
            r.on_missing_id.value = preset;
        }
    }
    if own.event_id.is_some() || own.event_id_invalid {
        return;
    }
    match provider.map(|p| (p, verify::preset_event_id(p))) {
        Some((_, Some(source))) => r.event_id.value = source,
        // zoom: no ID of its own; the route (or `defaults`) must name one
        Some((p, None)) if guarded && d.event_id.is_none() && !d.event_id_invalid => ctx.at_value(
            path,
            format!(
                "provider {} has no event ID of its own: set event_id, e.g. parts: [{{json_pointer: /payload/account_id}}, {{json_pointer: /event}}, {{json_pointer: /event_ts}}]",
                p.as_str()
            ),
        ),
        Some((_, None)) => {}
        // unset everywhere (an invalid `defaults` one is reported already)
        None if guarded && d.event_id.is_none() && !d.event_id_invalid => ctx.at_value(
            path,
            "required field `event_id` is missing: set event_id.header, event_id.json_pointer or event_id.parts, or a provider",
        ),
        None => {}
    }
}

/// gitlab with a `whsec_` signing token: the event ID is the signed
/// `webhook-id` (GitLab sets it to the `Idempotency-Key`), not the unsigned
/// header, which a replayed capture could change to pass as a new event.
fn signed_gitlab_id(
    own: &Layer,
    provider: Option<Provider>,
    verify: Option<&Verifier>,
    r: &mut Resolved,
) {
    let signed = verify.is_some_and(|v| v.scheme == crate::verify::Scheme::StandardWebhooks);
    if provider == Some(Provider::Gitlab)
        && signed
        && own.event_id.is_none()
        && !own.event_id_invalid
    {
        r.event_id.value = EventIdSource::Header(http::HeaderName::from_static("webhook-id"));
    }
}

/// A message that signs `{id}` is verified before the body is parsed, so
/// its event ID must come from headers alone.
fn check_signed_id(ctx: &mut Ctx, path: &str, r: &Resolved, verify: Option<&Verifier>) {
    let signs_id = verify
        .and_then(|v| v.rule.as_deref())
        .is_some_and(|rule| rule.signs_id());
    if signs_id && r.event_id.value.reads_body() {
        ctx.at_value(
            &format!("{path}.verify.message"),
            "{id} is signed, so the event ID must come from headers (event_id.header, or parts that are all headers), not the body",
        );
    }
}

/// `digest_ignore` needs a JSON digest.
fn check_digest(ctx: &mut Ctx, path: &str, r: &Resolved) {
    if !r.digest_ignore.value.is_empty() && r.digest.value != DigestMode::Json {
        let at_path = r.digest_ignore.set_at.as_deref().unwrap_or(path);
        ctx.at_key(at_path, "digest_ignore requires `digest: json`");
    }
}

/// Methods forwarded unverified; never a guarded one.
fn check_unverified(ctx: &mut Ctx, path: &str, r: &Resolved) {
    let guard_methods = &r.guard_methods.value;
    if let Some(m) = r
        .unverified_methods
        .value
        .iter()
        .find(|m| guard_methods.contains(m))
    {
        // a guarded request is always verified: its claim must not be forgeable
        ctx.at_value(
            r.unverified_methods.set_at.as_deref().unwrap_or(path),
            format!("{m} is in guard_methods: a guarded method is always verified and cannot be unverified"),
        );
    }
}

/// `upstream_wait` waits for a slot or a token: it needs one of them.
fn check_wait(ctx: &mut Ctx, path: &str, r: &Resolved) {
    if r.upstream_wait.value.is_some()
        && r.upstream_concurrency.value.is_none()
        && r.upstream_rate.value.is_none()
    {
        ctx.at_value(
            r.upstream_wait.set_at.as_deref().unwrap_or(path),
            "upstream_wait needs upstream_concurrency or upstream_rate: it waits for a slot or a token",
        );
    }
}

/// The rule that binds the lease and the upstream timeout.
fn check_lease(ctx: &mut Ctx, path: &str, own: &Layer, r: &Resolved) {
    let (lease, timeout) = (&r.lease, &r.upstream_timeout);
    if lease.value.duration() <= timeout.value {
        // Point at a line this route wrote: its lease, else its timeout, else the route.
        let at_path = match (&own.lease, &own.upstream_timeout) {
            (Some(s), _) => s.path.as_str(),
            (None, Some(s)) => s.path.as_str(),
            (None, None) => path,
        };
        ctx.at_key(
            at_path,
            format!(
                "lease ({}{}) must be longer than upstream_timeout ({}{}), or a claim could expire while the upstream still works",
                super::format_duration(lease.value),
                origin(lease.set_at.as_deref()),
                super::format_duration(timeout.value),
                origin(timeout.set_at.as_deref()),
            ),
        );
    }
}

/// The `verify` block; warns about a guarded route that has none (unless it
/// says `verify: none`, and only for a route without other errors).
fn verify_field(
    ctx: &mut Ctx,
    path: &str,
    raw: Option<RawVerifyField>,
    provider: Option<Provider>,
    guarded: bool,
    errors_before: usize,
) -> Option<Verifier> {
    let (verify, verify_none) = match raw {
        Some(RawVerifyField::Block(v)) => (
            verify::verify(ctx, &format!("{path}.verify"), *v, provider),
            false,
        ),
        Some(RawVerifyField::None) => (None, true),
        None => (None, false),
    };
    if guarded && verify.is_none() && !verify_none && ctx.error_count() == errors_before {
        ctx.warn_value(
            path,
            "guarded route without `verify`: anyone who can reach the listener can occupy event IDs \
             (a forged delivery claims the ID, the genuine one then gets 422); \
             add a verify block, or `verify: none` to accept that",
        );
    }
    verify
}
