//! Resolution: route > provider preset (event_id) > defaults > built-in.

use std::time::Duration;

use super::{ok, one_error_with_path, route, HEAD};
use crate::config::{
    DigestMode, EventIdSource, InFlight, OnMissingId, OnStoreError, Provider, Scheme, SettleOn,
};

fn days(n: u64) -> Duration {
    Duration::from_secs(n * 86_400)
}

#[test]
fn built_in_defaults() {
    let l = ok(&route(""));
    // a guarded route without `verify` is the one thing the defaults warn about
    assert_eq!(l.warnings.len(), 1, "{:?}", l.warnings);
    assert!(
        l.warnings[0].starts_with("cfg.yaml:6:5: routes[0]: guarded route without `verify`"),
        "{:?}",
        l.warnings
    );
    assert!(ok(&route("    verify: none\n")).warnings.is_empty());
    let c = &l.config;
    assert_eq!(c.listen.to_string(), "127.0.0.1:1");
    assert_eq!(c.admin_listen.to_string(), "127.0.0.1:2");
    assert_eq!(c.shutdown_grace, Duration::from_secs(30));
    assert_eq!(
        (c.sweeper.interval, c.sweeper.batch_size),
        (Duration::from_secs(60), 1000)
    );
    assert_eq!(c.threads, None);
    let r = &c.routes[0];
    assert_eq!(r.host, None);
    assert!(!r.strip_prefix);
    assert_eq!(
        r.event_id,
        EventIdSource::Header(http::HeaderName::from_static("x-event-id"))
    );
    assert_eq!(r.digest, DigestMode::Raw);
    assert!(r.digest_ignore.is_empty());
    assert_eq!(r.guard_methods, vec![http::Method::POST]);
    assert!(r.unverified_methods.is_empty());
    assert_eq!(r.on_missing_id, OnMissingId::Reject);
    assert_eq!(r.on_store_error, OnStoreError::Reject);
    assert_eq!(r.in_flight, InFlight::Conflict);
    assert_eq!(r.max_waiters, 64);
    assert_eq!(r.settle_on, SettleOn::default());
    assert!(!r.replay_body);
    assert_eq!(r.replay_body_limit, 64 * 1024);
    assert_eq!(
        r.idempotency_key_header,
        Some(http::HeaderName::from_static("idempotency-key"))
    );
    assert_eq!(r.lease, Duration::from_secs(60));
    assert_eq!(r.retention, days(7));
    // as the store takes them
    assert_eq!((r.lease.ms(), r.retention.ms()), (60_000, 7 * 86_400_000));
    assert_eq!(r.max_body, 1 << 20);
    assert_eq!(r.upstream_timeout, Duration::from_secs(30));
    assert_eq!((r.provider, r.verify.is_none()), (None, true));
}

#[test]
fn route_beats_defaults_beats_built_in() {
    let text = format!(
        "defaults:
  lease: 2m
  retention: 30d
  max_body: 256KiB
  digest: json
  on_missing_id: body_digest
  on_store_error: forward
  in_flight: wait
  max_waiters: 8
  settle_on: [\"2xx\", 409]
  replay_body: true
  replay_body_limit: 4KiB
  idempotency_key_header: null
  strip_prefix: true
  guard_methods: [POST, PUT]
  event_id: {{json_pointer: /id}}
{}    lease: 90s
    digest: raw
    idempotency_key_header: X-Key
  - name: beta
    match: {{path_prefix: /hooks/beta, host: Hooks.Example.COM}}
    upstream: \"https://consumer:8443/in\"
",
        route("")
    );
    let l = ok(&text);
    let (a, b) = (&l.config.routes[0], &l.config.routes[1]);
    // Route values.
    assert_eq!(a.lease, Duration::from_secs(90));
    assert_eq!(a.digest, DigestMode::Raw);
    assert_eq!(
        a.event_id,
        EventIdSource::Header(http::HeaderName::from_static("x-event-id"))
    );
    assert_eq!(
        a.idempotency_key_header,
        Some(http::HeaderName::from_static("x-key"))
    );
    // Defaults.
    assert_eq!(b.lease, Duration::from_secs(120));
    assert_eq!(b.digest, DigestMode::Json);
    assert_eq!(
        b.event_id,
        EventIdSource::JsonPointer("/id".parse().unwrap())
    );
    assert_eq!(b.idempotency_key_header, None);
    for r in [a, b] {
        assert_eq!(r.retention, days(30));
        assert_eq!(r.max_body, 256 * 1024);
        assert_eq!(r.on_missing_id, OnMissingId::BodyDigest);
        assert_eq!(r.on_store_error, OnStoreError::Forward);
        assert_eq!(r.in_flight, InFlight::Wait);
        assert_eq!(r.max_waiters, 8);
        assert!(r.settle_on.matches(409) && r.settle_on.matches(200) && !r.settle_on.matches(500));
        assert!(r.replay_body && r.strip_prefix);
        assert_eq!(r.replay_body_limit, 4096);
        assert_eq!(r.guard_methods, vec![http::Method::POST, http::Method::PUT]);
        // Built-in, since neither sets it.
        assert_eq!(r.upstream_timeout, Duration::from_secs(30));
    }
    assert_eq!(b.host.as_deref(), Some("hooks.example.com"));
    assert_eq!(
        (
            b.upstream.tls,
            b.upstream.port,
            b.upstream.base_path.as_str()
        ),
        (true, 8443, "/in")
    );
}

#[test]
fn defaults_errors_are_reported_once_at_defaults() {
    let text = format!("defaults:\n  lease: forever\n{}", route(""));
    one_error_with_path(&text, 2, 10, "defaults.lease", "invalid duration `forever`");
}

/// A route with `provider` and no explicit event_id, starting at line 6.
fn provider_route(provider: &str, extra: &str) -> String {
    format!(
        "{HEAD}  - name: p
    match: {{path_prefix: /p}}
    upstream: \"http://127.0.0.1:3001\"
    provider: {provider}
    retention: 30d
{extra}"
    )
}

#[test]
fn provider_presets_fill_event_id_and_scheme() {
    let header = |h: &'static str| EventIdSource::Header(http::HeaderName::from_static(h));
    let cases = [
        (
            "stripe",
            EventIdSource::JsonPointer("/id".parse().unwrap()),
            Scheme::Stripe,
            Provider::Stripe,
        ),
        (
            "github",
            header("x-github-delivery"),
            Scheme::Github,
            Provider::Github,
        ),
        (
            "shopify",
            header("x-shopify-event-id"),
            Scheme::Shopify,
            Provider::Shopify,
        ),
        (
            "slack",
            EventIdSource::JsonPointer("/event_id".parse().unwrap()),
            Scheme::Slack,
            Provider::Slack,
        ),
        (
            "standard-webhooks",
            header("webhook-id"),
            Scheme::StandardWebhooks,
            Provider::StandardWebhooks,
        ),
        (
            "svix",
            EventIdSource::SvixId,
            Scheme::StandardWebhooks,
            Provider::Svix,
        ),
    ];
    for (name, event_id, scheme, provider) in cases {
        let secret = if scheme == Scheme::StandardWebhooks {
            "env:WH_SECRET"
        } else {
            "env:PLAIN"
        };
        let l = ok(&provider_route(
            name,
            &format!("    verify: {{secrets: [{secret}]}}\n"),
        ));
        let r = &l.config.routes[0];
        assert_eq!(r.provider, Some(provider), "{name}");
        assert_eq!(r.event_id, event_id, "{name}");
        let v = r.verify.as_ref().unwrap();
        assert_eq!(v.scheme, scheme, "{name}");
        assert_eq!(v.tolerance, Duration::from_secs(300));
        // Without verify the provider still fills event_id.
        let l = ok(&provider_route(name, ""));
        assert_eq!(l.config.routes[0].event_id, event_id, "{name}");
        assert!(l.config.routes[0].verify.is_none());
    }
}

#[test]
fn explicit_route_fields_beat_the_preset() {
    let l = ok(&provider_route(
        "stripe",
        "    event_id: {header: X-Custom-Id}\n    verify: {scheme: hmac-sha256, header: X-Sig, secrets: [env:PLAIN], tolerance: 1m}\n",
    ));
    let r = &l.config.routes[0];
    assert_eq!(
        r.event_id,
        EventIdSource::Header(http::HeaderName::from_static("x-custom-id"))
    );
    let v = r.verify.as_ref().unwrap();
    assert_eq!(v.scheme, Scheme::HmacSha256);
    assert_eq!(v.header, Some(http::HeaderName::from_static("x-sig")));
    assert_eq!(v.tolerance, Duration::from_secs(60));
    // The preset also beats an event_id from defaults.
    let text = format!(
        "defaults:\n  event_id: {{header: X-Event-ID}}\n{}",
        provider_route("github", "")
    );
    let r = &ok(&text).config.routes[0];
    assert_eq!(
        r.event_id,
        EventIdSource::Header(http::HeaderName::from_static("x-github-delivery"))
    );
}

/// The svix preset reads `svix-id`, or `webhook-id` when the white-labelled
/// set is sent (SPEC §8); a route that names its header keeps that header.
#[test]
fn svix_preset_reads_the_id_of_the_header_set_sent() {
    let r = &ok(&provider_route("svix", "")).config.routes[0];
    assert_eq!(r.event_id, EventIdSource::SvixId);
    assert_eq!(
        r.event_id_source_text(),
        "header svix-id (webhook-id when white-labelled)"
    );
    let headers = |names: &[&'static str]| {
        let mut h = http::HeaderMap::new();
        for n in names {
            h.insert(*n, http::HeaderValue::from_static("x"));
        }
        h
    };
    let picked = |names: &[&'static str]| {
        r.event_id
            .header_for(&headers(names))
            .map(|h| h.as_str().to_owned())
    };
    assert_eq!(picked(&[]).as_deref(), Some("svix-id"));
    assert_eq!(
        picked(&["svix-id", "svix-timestamp", "svix-signature"]).as_deref(),
        Some("svix-id")
    );
    assert_eq!(
        picked(&["webhook-id", "webhook-timestamp", "webhook-signature"]).as_deref(),
        Some("webhook-id")
    );
    // any webhook-* header selects that set, as verification does
    assert_eq!(
        picked(&["svix-id", "svix-timestamp", "webhook-signature"]).as_deref(),
        Some("webhook-id")
    );
    // the other sources
    let explicit = &ok(&provider_route(
        "svix",
        "    event_id: {header: svix-id}
",
    ))
    .config
    .routes[0];
    assert_eq!(
        explicit.event_id,
        EventIdSource::Header(http::HeaderName::from_static("svix-id"))
    );
    let webhook_set = headers(&["webhook-id", "webhook-timestamp", "webhook-signature"]);
    assert_eq!(
        explicit
            .event_id
            .header_for(&webhook_set)
            .map(|h| h.as_str()),
        Some("svix-id")
    );
    let stripe = &ok(&provider_route("stripe", "")).config.routes[0];
    assert_eq!(stripe.event_id.header_for(&webhook_set), None);
}

#[test]
fn slack_preset_forwards_a_body_without_event_id() {
    let missing = |text: &str| ok(text).config.routes[0].on_missing_id;
    assert_eq!(missing(&provider_route("slack", "")), OnMissingId::Forward);
    // The route wins; the preset beats defaults (as for event_id).
    assert_eq!(
        missing(&provider_route("slack", "    on_missing_id: reject\n")),
        OnMissingId::Reject
    );
    let text = format!(
        "defaults:\n  on_missing_id: reject\n{}",
        provider_route("slack", "")
    );
    assert_eq!(missing(&text), OnMissingId::Forward);
    for other in ["stripe", "github", "shopify", "standard-webhooks", "svix"] {
        assert_eq!(
            missing(&provider_route(other, "")),
            OnMissingId::Reject,
            "{other}"
        );
    }
}

#[test]
fn check_output_lines() {
    let l = ok(&format!(
        "{}  - name: gh\n    match: {{host: hooks.example.com, path_prefix: /gh}}\n    upstream: \"https://h/x\"\n    provider: github\n    retention: 30d\n    verify: {{secrets: [env:PLAIN]}}\n    lease: 45s\n",
        route("")
    ));
    let r = &l.config.routes[0];
    assert_eq!(r.event_id_source_text(), "header x-event-id");
    assert_eq!(
        l.config.routes[1].event_id_source_text(),
        "header x-github-delivery"
    );
    let lines = l.config.describe_routes();
    assert_eq!(lines.len(), 2);
    assert_eq!(
        lines[0],
        "alpha  /hooks/alpha -> http://127.0.0.1:3001  event_id=header x-event-id  digest=raw lease=1m retention=7d max_body=1MiB"
    );
    assert_eq!(
        lines[1],
        "gh     hooks.example.com/gh -> https://h/x  event_id=header x-github-delivery  digest=raw lease=45s retention=30d max_body=1MiB  provider=github  verify=github (1 secret(s))"
    );
    assert!(
        !format!("{:?}", l.config).contains("plain-secret"),
        "Debug must not show secrets"
    );
    let pass =
        ok(&route("    guard_methods: []\n")
            .replace("    event_id:\n      header: X-Event-ID\n", ""));
    assert!(
        pass.config.describe_routes()[0].contains("event_id=none (pass-through)"),
        "{:?}",
        pass.config.describe_routes()
    );
    let json = ok(&route("").replace("header: X-Event-ID", "json_pointer: /data/id"));
    assert_eq!(
        json.config.routes[0].event_id_source_text(),
        "json_pointer /data/id"
    );
}

#[test]
fn upstream_limits_are_none_unless_set_and_defaults_may_set_them() {
    use crate::limits::{BreakerCfg, Rate};
    let r = &ok(&route("")).config.routes[0];
    assert_eq!(
        (r.upstream_concurrency, r.upstream_rate, r.upstream_breaker),
        (None, None, None)
    );
    let set = route(
        "    upstream_concurrency: 8\n    upstream_rate: \"600/m\"\n    \
         upstream_breaker: {failures: 5, open: 30s}\n",
    );
    let r = &ok(&set).config.routes[0];
    assert_eq!(r.upstream_concurrency, Some(8));
    let rate = Rate {
        per: 600,
        every: Duration::from_secs(60),
    };
    assert_eq!(r.upstream_rate, Some(rate));
    assert_eq!(rate.burst(), 10, "one second's worth");
    let breaker = BreakerCfg {
        failures: 5,
        open: Duration::from_secs(30),
    };
    assert_eq!(r.upstream_breaker, Some(breaker));
    let from_defaults = route("").replace(
        "routes:\n",
        "defaults:\n  upstream_rate: \"50/s\"\nroutes:\n",
    );
    let r = &ok(&from_defaults).config.routes[0];
    assert_eq!(
        r.upstream_rate.map(|r| r.to_string()).as_deref(),
        Some("50/s")
    );
}

#[test]
fn a_bad_rate_is_one_positioned_error() {
    for (text, needle) in [
        ("\"50\"", "expected N/s or N/m"),
        ("\"0/s\"", "at least 1"),
        ("\"-1/s\"", "whole number"),
        ("\"5/h\"", "the unit is `s` or `m`"),
    ] {
        one_error_with_path(
            &route(&format!("    upstream_rate: {text}\n")),
            12,
            20,
            "routes[0].upstream_rate",
            needle,
        );
    }
}
