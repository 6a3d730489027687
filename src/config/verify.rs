//! Provider presets (SPEC §8), `verify` blocks and their secrets.
//!
//! Secret values never appear in a message: errors name the reference
//! (`env:NAME`, `file:PATH`) and the secret's index, nothing more.

use std::time::Duration;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

use super::ctx::Ctx;
use super::fields;
use super::model::{Challenge, EventIdSource, OnMissingId, Provider, Scheme, Verifier};
use super::raw::RawVerify;
use super::units::format_duration;
use crate::claim::json_pointer::JsonPointer;
use crate::verify::DEFAULT_TOLERANCE;

/// Standard alphabet, padding optional (Standard Webhooks secrets come both ways).
const WHSEC_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Where each provider puts its event ID; `None` for zoom, which has none
/// of its own (the route must name one).
pub fn preset_event_id(p: Provider) -> Option<EventIdSource> {
    let header = |h: &'static str| EventIdSource::Header(http::HeaderName::from_static(h));
    let pointer = |p: &str| {
        let parsed = JsonPointer::parse(p).expect("a preset's pointer is valid");
        EventIdSource::JsonPointer(parsed)
    };
    Some(match p {
        Provider::Stripe => pointer("/id"),
        Provider::Github => header("x-github-delivery"),
        Provider::Shopify => header("x-shopify-event-id"),
        Provider::Slack => pointer("/event_id"),
        Provider::StandardWebhooks => header("webhook-id"),
        // `svix-id`, or `webhook-id` when Svix sends white-labelled headers.
        Provider::Svix => EventIdSource::SvixId,
        Provider::Paddle | Provider::Typeform => pointer("/event_id"),
        // GitLab 17.4+ keeps it across retries (and signs it as `webhook-id`).
        Provider::Gitlab => header("idempotency-key"),
        Provider::Zoom => return None,
    })
}

/// What a provider's preset does with a delivery that has no event ID. Slack
/// sends its `url_verification` handshake without `/event_id`; it must pass
/// (unguarded, after its signature is checked) or the app cannot be enabled.
/// (Zoom's `endpoint.url_validation` is recognised by its `event`, not by a
/// missing ID: see [`preset_challenge`].)
pub fn preset_on_missing_id(p: Provider) -> Option<OnMissingId> {
    match p {
        Provider::Slack => Some(OnMissingId::Forward),
        _ => None,
    }
}

/// The signed handshake each provider sends without an event ID, that
/// passes unguarded: zoom's `endpoint.url_validation` (its challenge is
/// answered by the consumer, so it must reach it).
pub fn preset_challenge(p: Provider) -> Option<Challenge> {
    match p {
        Provider::Zoom => Some(Challenge {
            pointer: "/event",
            value: "endpoint.url_validation",
        }),
        _ => None,
    }
}

/// The signature scheme each provider uses. GitLab's depends on its secrets
/// ([`gitlab_scheme`]).
pub fn preset_scheme(p: Provider) -> Scheme {
    match p {
        Provider::Stripe => Scheme::Stripe,
        Provider::Github => Scheme::Github,
        Provider::Shopify => Scheme::Shopify,
        Provider::Slack => Scheme::Slack,
        Provider::StandardWebhooks | Provider::Svix => Scheme::StandardWebhooks,
        Provider::Paddle => Scheme::Paddle,
        Provider::Gitlab => Scheme::Token,
        Provider::Typeform => Scheme::Typeform,
        Provider::Zoom => Scheme::Zoom,
    }
}

/// How long each provider keeps retrying a delivery (docs/providers.md says
/// where each figure comes from).
pub fn redelivery_horizon(p: Provider) -> Duration {
    const HOUR: u64 = 3600;
    Duration::from_secs(match p {
        Provider::Stripe | Provider::Github | Provider::Paddle => 72 * HOUR,
        Provider::Shopify => 4 * HOUR,
        Provider::Slack => HOUR,
        Provider::StandardWebhooks => 76 * HOUR,
        Provider::Svix => 28 * HOUR,
        // GitLab retries only by hand, from its webhook log: keep a week.
        Provider::Gitlab => 7 * 24 * HOUR,
        Provider::Typeform => 10 * HOUR,
        Provider::Zoom => 2 * HOUR,
    })
}

/// Warns when records may be swept before the provider's last retry.
pub fn retention_warning(ctx: &mut Ctx, p: Provider, retention: Duration, at: &str) {
    let horizon = redelivery_horizon(p);
    if retention < horizon {
        ctx.warn_value(
            at,
            format!(
                "retention {} is shorter than {}'s redelivery horizon ({}): a record swept before the last retry makes that retry look new",
                format_duration(retention),
                p.as_str(),
                format_duration(horizon)
            ),
        );
    }
}

/// Validates a `verify` block at `path`; the scheme falls back to the provider's.
pub fn verify(
    ctx: &mut Ctx,
    path: &str,
    raw: RawVerify,
    provider: Option<Provider>,
) -> Option<Verifier> {
    let at = |key: &str| format!("{path}.{key}");
    let scheme = scheme_of(ctx, path, raw.scheme, provider);
    let tolerance = ctx.duration(&at("tolerance"), raw.tolerance.as_ref());
    let resolved = resolve_all(ctx, path, raw.secrets.as_deref());
    // gitlab: a `whsec_` signing token is GitLab 19's standard-webhooks signature
    let scheme = match (scheme, provider, raw.scheme) {
        (Some(Scheme::Token), Some(Provider::Gitlab), None)
            if !resolved.is_empty() && resolved.iter().all(|(_, r)| r.starts_with(b"whsec_")) =>
        {
            Some(Scheme::StandardWebhooks)
        }
        (s, _, _) => s,
    };
    let header = header_field(ctx, path, scheme, raw.header.as_deref());
    let rule = match scheme {
        Some(Scheme::Hmac) => super::hmac_rule::rule(ctx, path, &raw),
        _ => {
            super::hmac_rule::refuse_hmac_keys(ctx, path, &raw, scheme);
            None
        }
    };
    let (keys, public_keys) = keys_of(ctx, path, scheme, resolved);
    Some(Verifier {
        scheme: scheme?,
        secrets: keys.into(),
        tolerance: tolerance.unwrap_or(DEFAULT_TOLERANCE),
        header,
        rule: rule.map(Box::new),
        public_keys,
    })
}

/// The block's `scheme`, else the provider's.
fn scheme_of(
    ctx: &mut Ctx,
    path: &str,
    scheme: Option<Scheme>,
    provider: Option<Provider>,
) -> Option<Scheme> {
    match (scheme, provider) {
        (Some(s), _) => Some(s),
        (None, Some(p)) => Some(preset_scheme(p)),
        (None, None) => {
            ctx.at_key(
                path,
                "verify needs a `scheme` (or a `provider` on the route)",
            );
            None
        }
    }
}

/// The secrets as the scheme takes them: HMAC keys (or tokens), and for
/// standard-webhooks also Ed25519 public keys; a wrong one is recorded.
fn keys_of(
    ctx: &mut Ctx,
    path: &str,
    scheme: Option<Scheme>,
    resolved: Vec<(usize, Vec<u8>)>,
) -> (Vec<Vec<u8>>, Vec<[u8; 32]>) {
    let mut keys = Vec::new();
    let mut public_keys = Vec::new();
    for (i, raw_key) in resolved {
        let spath = format!("{path}.secrets[{i}]");
        match key_bytes(scheme, raw_key) {
            Ok(Key::Secret(k)) => keys.push(k),
            Ok(Key::Public(k)) => public_keys.push(k),
            Err(e) => ctx.at_value(&spath, e),
        }
    }
    (keys, public_keys)
}

/// Every secret of the block, read (errors recorded), with its index.
fn resolve_all(ctx: &mut Ctx, path: &str, secrets: Option<&[String]>) -> Vec<(usize, Vec<u8>)> {
    let mut out = Vec::new();
    match secrets {
        None => ctx.at_key(
            path,
            "required field `secrets` is missing (e.g. [env:WEBHOOK_SECRET])",
        ),
        Some([]) => ctx.at_value(
            &format!("{path}.secrets"),
            "at least one secret is required",
        ),
        Some(list) => {
            for (i, reference) in list.iter().enumerate() {
                match resolve_secret(reference, ctx.env) {
                    Ok(raw) => out.push((i, raw)),
                    Err(e) => ctx.at_value(&format!("{path}.secrets[{i}]"), e),
                }
            }
        }
    }
    out
}

/// `header`: the digest's header for hmac-sha256 (required), the token's
/// for token (default `X-Gitlab-Token`), the signature's for hmac
/// (required, read by the rule); no other scheme takes it.
fn header_field(
    ctx: &mut Ctx,
    path: &str,
    scheme: Option<Scheme>,
    header: Option<&str>,
) -> Option<http::HeaderName> {
    let at = format!("{path}.header");
    match (scheme, header) {
        (Some(Scheme::HmacSha256 | Scheme::Token | Scheme::Hmac), Some(h)) => {
            fields::header_name(h)
                .map_err(|e| ctx.at_value(&at, e))
                .ok()
        }
        (Some(Scheme::HmacSha256), None) => {
            ctx.at_key(
                path,
                "scheme hmac-sha256 requires `header` (the header holding the hex digest)",
            );
            None
        }
        (Some(Scheme::Hmac), None) => {
            ctx.at_key(
                path,
                "scheme hmac requires `header` (the header holding the signature)",
            );
            None
        }
        (Some(s), Some(_)) => {
            ctx.at_key(
                &at,
                format!(
                    "`header` is only allowed with scheme hmac-sha256, hmac or token, not {}",
                    s.as_str()
                ),
            );
            None
        }
        (None, _) | (Some(_), None) => None,
    }
}

/// Reads an `env:NAME` or `file:PATH` secret. A `file:` secret loses one
/// trailing newline (`\n` or `\r\n`), as editors add one.
pub fn resolve_secret(
    reference: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<u8>, String> {
    let value = if let Some(name) = reference.strip_prefix("env:") {
        if name.is_empty() {
            return Err("`env:` needs a variable name (env:NAME)".to_string());
        }
        env(name)
            .ok_or_else(|| format!("secret env:{name}: environment variable `{name}` is not set"))?
            .into_bytes()
    } else if let Some(file) = reference.strip_prefix("file:") {
        if file.is_empty() {
            return Err("`file:` needs a path (file:PATH)".to_string());
        }
        let mut bytes = std::fs::read(file)
            .map_err(|e| format!("secret file:{file}: cannot read the file: {e}"))?;
        if bytes.ends_with(b"\r\n") {
            bytes.truncate(bytes.len() - 2);
        } else if bytes.ends_with(b"\n") {
            bytes.truncate(bytes.len() - 1);
        }
        bytes
    } else {
        // Never echo the entry: it may be a secret pasted inline.
        return Err("a secret must be a reference, `env:NAME` or `file:PATH` (inline secrets are not allowed)"
            .to_string());
    };
    if value.is_empty() {
        return Err(format!("secret {reference} is empty"));
    }
    Ok(value)
}

/// A resolved secret as its scheme uses it.
enum Key {
    /// HMAC key bytes (or the token).
    Secret(Vec<u8>),
    /// standard-webhooks: an Ed25519 public key (`whpk_`).
    Public([u8; 32]),
}

/// Key bytes for the scheme: Standard Webhooks decodes `whsec_<base64>`
/// (an HMAC key) and `whpk_<base64>` (an Ed25519 public key, exactly 32
/// bytes); the others use the secret's bytes as written.
fn key_bytes(scheme: Option<Scheme>, raw: Vec<u8>) -> Result<Key, String> {
    if scheme != Some(Scheme::StandardWebhooks) {
        return Ok(Key::Secret(raw));
    }
    if let Some(encoded) = raw.strip_prefix(b"whpk_") {
        return match WHSEC_BASE64.decode(encoded).map(<[u8; 32]>::try_from) {
            Ok(Ok(key)) => Ok(Key::Public(key)),
            Ok(Err(v)) => Err(format!(
                "a `whpk_` public key must be base64 of 32 bytes (an Ed25519 key), not {}",
                v.len()
            )),
            Err(_) => {
                Err("the part of the public key after `whpk_` is not valid base64".to_string())
            }
        };
    }
    let Some(encoded) = raw.strip_prefix(b"whsec_") else {
        return Err(
            "a standard-webhooks secret must start with `whsec_` (or `whpk_` for an Ed25519 public key)"
                .to_string(),
        );
    };
    match WHSEC_BASE64.decode(encoded) {
        Ok(key) if !key.is_empty() => Ok(Key::Secret(key)),
        Ok(_) => Err("the standard-webhooks secret is empty after `whsec_`".to_string()),
        Err(_) => Err(
            "the part of the standard-webhooks secret after `whsec_` is not valid base64"
                .to_string(),
        ),
    }
}
