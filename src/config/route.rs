//! One route: its identity (name, match, upstream) and the resolution of its
//! shared fields: route > provider preset (event_id, on_missing_id) > `defaults` >
//! built-in default.

use std::time::Duration;

use super::ctx::Ctx;
use super::fields;
use super::layer::{parse_layer, pick, Layer};
use super::model::{
    DigestMode, EventIdSource, InFlight, OnMissingId, OnStoreError, Provider, Route, SettleOn,
    UpstreamUrl, Verify,
};
use super::raw::{RawMatch, RawRoute, RawVerifyField};
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
        ..
    } = raw;
    let errors_before = ctx.error_count();
    let id = identity(ctx, path, name, match_, upstream);
    // this route's own values; `d` holds the `defaults` ones
    let own = parse_layer(ctx, path, shared);

    let (guard_methods, _) = pick(
        &own.guard_methods,
        &d.guard_methods,
        vec![http::Method::POST],
    );
    let event_id = event_id(ctx, path, &own, d, provider, guard_methods.is_empty());
    let (digest, digest_ignore) = digest(ctx, path, &own, d);
    let (lease, upstream_timeout) = lease_and_timeout(ctx, path, &own, d);
    let retention = retention(ctx, path, &own, d, provider);
    let unverified_methods = unverified_methods(ctx, path, &own, d, &guard_methods);
    let verify = verify_field(
        ctx,
        path,
        verify,
        provider,
        !guard_methods.is_empty(),
        errors_before,
    );

    if ctx.error_count() != errors_before {
        return None;
    }
    Some(Route {
        name: id.name?,
        host: id.host,
        path_prefix: id.path_prefix?,
        upstream: id.upstream?,
        strip_prefix: pick(&own.strip_prefix, &d.strip_prefix, false).0,
        event_id: event_id?,
        digest,
        digest_ignore,
        guard_methods,
        unverified_methods,
        // Like event_id: route > provider preset > defaults.
        on_missing_id: match (
            &own.on_missing_id,
            provider.and_then(verify::preset_on_missing_id),
        ) {
            (None, Some(preset)) => preset,
            _ => pick(&own.on_missing_id, &d.on_missing_id, OnMissingId::Reject).0,
        },
        on_store_error: pick(&own.on_store_error, &d.on_store_error, OnStoreError::Reject).0,
        in_flight: pick(&own.in_flight, &d.in_flight, InFlight::Conflict).0,
        max_waiters: pick(&own.max_waiters, &d.max_waiters, 64).0,
        settle_on: pick(&own.settle_on, &d.settle_on, SettleOn::default()).0,
        replay_body: pick(&own.replay_body, &d.replay_body, false).0,
        replay_body_limit: pick(&own.replay_body_limit, &d.replay_body_limit, 64 * 1024).0,
        idempotency_key_header: pick(
            &own.idempotency_key_header,
            &d.idempotency_key_header,
            Some(http::HeaderName::from_static("idempotency-key")),
        )
        .0,
        lease,
        retention,
        max_body: pick(&own.max_body, &d.max_body, 1024 * 1024).0,
        upstream_timeout,
        provider,
        verify,
    })
}

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
    let (host, path_prefix) = match match_ {
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
    };
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

/// Event ID: route > provider preset > defaults. A pass-through route
/// (no guarded methods) never extracts one, so none is required there.
fn event_id(
    ctx: &mut Ctx,
    path: &str,
    own: &Layer,
    d: &Layer,
    provider: Option<Provider>,
    pass_through: bool,
) -> Option<EventIdSource> {
    match (&own.event_id, provider, &d.event_id) {
        (Some(s), _, _) => Some(s.value.clone()),
        _ if own.event_id_invalid => None,
        (None, Some(p), _) => Some(verify::preset_event_id(p)),
        (None, None, Some(s)) => Some(s.value.clone()),
        _ if d.event_id_invalid => None,
        // Never read: the route guards no method, so no ID is extracted.
        (None, None, None) if pass_through => Some(EventIdSource::Header(
            http::HeaderName::from_static("idempotency-key"),
        )),
        (None, None, None) => {
            ctx.at_value(
                path,
                "required field `event_id` is missing: set event_id.header or event_id.json_pointer, or a provider",
            );
            None
        }
    }
}

/// The digest mode and the pointers it ignores (JSON digests only).
fn digest(ctx: &mut Ctx, path: &str, own: &Layer, d: &Layer) -> (DigestMode, Vec<String>) {
    let (digest, _) = pick(&own.digest, &d.digest, DigestMode::Raw);
    let (digest_ignore, ignore_path) = pick(&own.digest_ignore, &d.digest_ignore, Vec::new());
    if !digest_ignore.is_empty() && digest != DigestMode::Json {
        let at_path = ignore_path.unwrap_or_else(|| path.to_string());
        ctx.at_key(&at_path, "digest_ignore requires `digest: json`");
    }
    (digest, digest_ignore)
}

/// The retention, with a warning when it ends before the provider's retries do.
fn retention(
    ctx: &mut Ctx,
    path: &str,
    own: &Layer,
    d: &Layer,
    provider: Option<Provider>,
) -> Duration {
    let (retention, retention_path) = pick(
        &own.retention,
        &d.retention,
        Duration::from_secs(7 * 86_400),
    );
    if let Some(p) = provider {
        verify::retention_warning(ctx, p, retention, retention_path.as_deref().unwrap_or(path));
    }
    retention
}

/// Methods forwarded unverified; never a guarded one.
fn unverified_methods(
    ctx: &mut Ctx,
    path: &str,
    own: &Layer,
    d: &Layer,
    guard_methods: &[http::Method],
) -> Vec<http::Method> {
    let (unverified_methods, unverified_path) =
        pick(&own.unverified_methods, &d.unverified_methods, Vec::new());
    if let Some(m) = unverified_methods
        .iter()
        .find(|m| guard_methods.contains(m))
    {
        // a guarded request is always verified: its claim must not be forgeable
        ctx.at_value(
            unverified_path.as_deref().unwrap_or(path),
            format!("{m} is in guard_methods: a guarded method is always verified and cannot be unverified"),
        );
    }
    unverified_methods
}

/// The lease and the upstream timeout, and the rule that binds them.
fn lease_and_timeout(ctx: &mut Ctx, path: &str, own: &Layer, d: &Layer) -> (Duration, Duration) {
    let (lease, lease_path) = pick(&own.lease, &d.lease, Duration::from_secs(60));
    let (upstream_timeout, timeout_path) = pick(
        &own.upstream_timeout,
        &d.upstream_timeout,
        Duration::from_secs(30),
    );
    if lease <= upstream_timeout {
        // Point at a line this route wrote: its lease, else its timeout, else the route.
        let at_path = match (&own.lease, &own.upstream_timeout) {
            (Some(s), _) | (None, Some(s)) => s.path.clone(),
            (None, None) => path.to_string(),
        };
        ctx.at_key(
            &at_path,
            format!(
                "lease ({}{}) must be longer than upstream_timeout ({}{}), or a claim could expire while the upstream still works",
                super::format_duration(lease),
                origin(lease_path.as_deref()),
                super::format_duration(upstream_timeout),
                origin(timeout_path.as_deref()),
            ),
        );
    }
    (lease, upstream_timeout)
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
) -> Option<Verify> {
    let (verify, verify_none) = match raw {
        Some(RawVerifyField::Block(v)) => (
            verify::verify(ctx, &format!("{path}.verify"), v, provider),
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
