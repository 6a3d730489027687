//! Webhook signature verification for the provider presets of SPEC §8.
//!
//! Pure logic: no I/O, no clock (the caller passes `now`). A [`Verifier`] holds
//! one [`Scheme`], one or more already-resolved secrets (several = rotation:
//! any one matching passes), the timestamp tolerance and, for
//! [`Scheme::HmacSha256`], the header that carries the digest.
//!
//! Every MAC comparison is constant-time (`subtle`), and every (secret,
//! candidate signature) pair is compared without an early exit, so timing does
//! not reveal which secret or which candidate matched. Errors never contain a
//! secret, the body, or any header *value*; they name headers and say why, so
//! their `Display` can be used as the `detail` of the 401 problem.
//!
//! The [`sign`] module produces valid header values for each scheme, for the
//! proxy's integration tests and the demo.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName};
use ring::signature::{UnparsedPublicKey, ED25519};
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};

pub mod declarative;
mod mac;
mod parts;
pub mod sign;

pub use declarative::{Encoding, Piece, Prefix, Rule, Timestamp};
pub use mac::{Algorithm, Secrets};
pub use parts::VerifyError;
use parts::{parse_timestamp, required, B64};

#[cfg(test)]
mod declarative_tests;
#[cfg(test)]
pub(crate) mod tests;

type HmacSha256 = Hmac<Sha256>;

/// Tolerance used when the configuration sets none (SPEC §2: 5m).
pub const DEFAULT_TOLERANCE: Duration = Duration::from_secs(300);

/// Header names used by the fixed schemes (lower case, as `http` stores them).
pub mod headers {
    pub const STRIPE_SIGNATURE: &str = "stripe-signature";
    pub const GITHUB_SIGNATURE_256: &str = "x-hub-signature-256";
    pub const SHOPIFY_HMAC_SHA256: &str = "x-shopify-hmac-sha256";
    pub const SLACK_SIGNATURE: &str = "x-slack-signature";
    pub const SLACK_REQUEST_TIMESTAMP: &str = "x-slack-request-timestamp";
    pub const WEBHOOK_ID: &str = "webhook-id";
    pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
    pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";
    pub const SVIX_ID: &str = "svix-id";
    pub const SVIX_TIMESTAMP: &str = "svix-timestamp";
    pub const SVIX_SIGNATURE: &str = "svix-signature";
    pub const GITLAB_TOKEN: &str = "x-gitlab-token";
}

/// Which names a standard-webhooks delivery uses: `webhook-id`,
/// `webhook-timestamp`, `webhook-signature` (the specification's, and what a
/// white-labelled Svix sends), or `svix-id`, `svix-timestamp`,
/// `svix-signature` (what Svix sends by default).
///
/// The sets are never mixed: the `webhook-*` set is the one read as soon as
/// any of its headers is present, and then every member must be there. The
/// event-ID source of the `svix` preset picks its header with the same rule
/// ([`HeaderSet::of`]), so the event ID is always the ID the signature covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderSet {
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature`.
    Webhook,
    /// `svix-id`, `svix-timestamp`, `svix-signature`.
    Svix,
}

impl HeaderSet {
    /// The set a request's headers select: `Webhook` when any `webhook-*`
    /// header is present, else `Svix` when any `svix-*` header is, else `None`.
    pub fn of(h: &HeaderMap) -> Option<HeaderSet> {
        use headers::*;
        let any = |names: [&str; 3]| names.iter().any(|n| h.contains_key(*n));
        if any([WEBHOOK_ID, WEBHOOK_TIMESTAMP, WEBHOOK_SIGNATURE]) {
            Some(HeaderSet::Webhook)
        } else if any([SVIX_ID, SVIX_TIMESTAMP, SVIX_SIGNATURE]) {
            Some(HeaderSet::Svix)
        } else {
            None
        }
    }

    /// The header carrying the message ID (lower case).
    pub fn id(self) -> &'static str {
        match self {
            HeaderSet::Webhook => headers::WEBHOOK_ID,
            HeaderSet::Svix => headers::SVIX_ID,
        }
    }

    /// The header carrying the Unix timestamp (lower case).
    pub fn timestamp(self) -> &'static str {
        match self {
            HeaderSet::Webhook => headers::WEBHOOK_TIMESTAMP,
            HeaderSet::Svix => headers::SVIX_TIMESTAMP,
        }
    }

    /// The header carrying the signature list (lower case).
    pub fn signature(self) -> &'static str {
        match self {
            HeaderSet::Webhook => headers::WEBHOOK_SIGNATURE,
            HeaderSet::Svix => headers::SVIX_SIGNATURE,
        }
    }
}

/// A signature scheme (`verify.scheme` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>…]`, HMAC-SHA256 over `"{t}.{body}"`.
    Stripe,
    /// `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 over the body.
    Github,
    /// `X-Shopify-Hmac-Sha256: <base64>`, HMAC-SHA256 over the body.
    Shopify,
    /// `X-Slack-Signature: v0=<hex>` + `X-Slack-Request-Timestamp`, over `"v0:{ts}:{body}"`.
    Slack,
    /// `webhook-id/-timestamp/-signature` (or `svix-*`), over `"{id}.{ts}.{body}"`,
    /// signature list `v1,<base64> …`.
    StandardWebhooks,
    /// Hex HMAC-SHA256 of the body in the configured header (optional `sha256=` prefix).
    HmacSha256,
    /// The declarative scheme (SPEC §17): the verifier's [`Verifier::rule`].
    Hmac,
    /// A shared token compared in constant time (GitLab's `X-Gitlab-Token`).
    Token,
    /// `Paddle-Signature: ts=…;h1=…`, over `{ts}:{body}`.
    Paddle,
    /// `Typeform-Signature: sha256=<base64>`, over the body.
    Typeform,
    /// `x-zm-signature: v0=<hex>` + `x-zm-request-timestamp`, over `v0:{ts}:{body}`.
    Zoom,
}

impl Scheme {
    /// Every scheme, in configuration order.
    pub const ALL: [Scheme; 11] = [
        Scheme::Stripe,
        Scheme::Github,
        Scheme::Shopify,
        Scheme::Slack,
        Scheme::StandardWebhooks,
        Scheme::HmacSha256,
        Scheme::Hmac,
        Scheme::Token,
        Scheme::Paddle,
        Scheme::Typeform,
        Scheme::Zoom,
    ];

    /// The configuration name (`stripe`, …, `standard-webhooks`, `hmac-sha256`).
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Stripe => "stripe",
            Scheme::Github => "github",
            Scheme::Shopify => "shopify",
            Scheme::Slack => "slack",
            Scheme::StandardWebhooks => "standard-webhooks",
            Scheme::HmacSha256 => "hmac-sha256",
            Scheme::Hmac => "hmac",
            Scheme::Token => "token",
            Scheme::Paddle => "paddle",
            Scheme::Typeform => "typeform",
            Scheme::Zoom => "zoom",
        }
    }

    /// Whether the scheme carries a timestamp checked against the tolerance
    /// (for `hmac`, its rule says: [`Rule::timestamp`]).
    pub fn is_timestamped(self) -> bool {
        matches!(
            self,
            Scheme::Stripe | Scheme::Slack | Scheme::StandardWebhooks
        )
    }

    /// The declarative rule a fixed scheme is an instance of (`None` for
    /// standard-webhooks, token, and hmac/hmac-sha256, whose rule is configured).
    pub fn fixed_rule(self) -> Option<&'static Rule> {
        match self {
            Scheme::Stripe => Some(&declarative::STRIPE),
            Scheme::Github => Some(&declarative::GITHUB),
            Scheme::Shopify => Some(&declarative::SHOPIFY),
            Scheme::Slack => Some(&declarative::SLACK),
            Scheme::Paddle => Some(&declarative::PADDLE),
            Scheme::Typeform => Some(&declarative::TYPEFORM),
            Scheme::Zoom => Some(&declarative::ZOOM),
            Scheme::StandardWebhooks | Scheme::HmacSha256 | Scheme::Hmac | Scheme::Token => None,
        }
    }

    /// Turns a secret as configured (after `env:`/`file:` resolution) into key
    /// bytes: for standard-webhooks the base64 after `whsec_` (see
    /// [`decode_standard_webhooks_secret`]); for every other scheme the raw
    /// string's bytes. An empty key is refused (anyone could sign with it).
    pub fn key_from_secret(self, secret: &str) -> Result<Vec<u8>, InvalidSecret> {
        let key = match self {
            Scheme::StandardWebhooks => decode_standard_webhooks_secret(secret)?,
            _ => secret.as_bytes().to_vec(),
        };
        if key.is_empty() {
            return Err(InvalidSecret("the secret is empty"));
        }
        Ok(key)
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scheme {
    type Err = UnknownScheme;

    /// Accepts exactly the configuration names of [`Scheme::as_str`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Scheme::ALL
            .into_iter()
            .find(|sch| sch.as_str() == s)
            .ok_or(UnknownScheme)
    }
}

/// `verify.scheme` named no known scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown signature scheme (expected one of stripe, github, shopify, slack, standard-webhooks, hmac-sha256, hmac, token, paddle, typeform, zoom)")]
pub struct UnknownScheme;

/// A configured secret could not be turned into a key. The message never
/// contains the secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid secret: {0}")]
pub struct InvalidSecret(pub &'static str);

/// Decodes a Standard Webhooks / Svix secret: the optional `whsec_` prefix is
/// removed and the rest is standard base64, padding optional.
pub fn decode_standard_webhooks_secret(secret: &str) -> Result<Vec<u8>, InvalidSecret> {
    let b64 = secret.strip_prefix("whsec_").unwrap_or(secret);
    let key = B64
        .decode(b64.as_bytes())
        .map_err(|_| InvalidSecret("the part after `whsec_` is not valid base64"))?;
    if key.is_empty() {
        return Err(InvalidSecret("the secret is empty"));
    }
    Ok(key)
}

/// A configured signature check for one route.
#[derive(Clone)]
pub struct Verifier {
    pub scheme: Scheme,
    /// Resolved key bytes (see [`Scheme::key_from_secret`]); any one matching passes.
    pub secrets: Secrets,
    /// Timestamped schemes reject deliveries older *or newer* than this
    /// (`|now - t| <= tolerance` passes).
    pub tolerance: Duration,
    /// hmac-sha256: the header holding the hex digest; token: the header
    /// holding the token (default `x-gitlab-token`). Ignored otherwise.
    pub header: Option<HeaderName>,
    /// `hmac` only: the declarative rule, built once at config load.
    pub rule: Option<Box<Rule>>,
    /// standard-webhooks: Ed25519 public keys (`whpk_…`) for `v1a` entries.
    pub public_keys: Vec<[u8; 32]>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("scheme", &self.scheme)
            .field(
                "secrets",
                &format_args!("[{} redacted]", self.secrets.len()),
            )
            .field("tolerance", &self.tolerance)
            .field("header", &self.header)
            .field("rule", &self.rule)
            .field("public_keys", &self.public_keys.len())
            .finish()
    }
}

impl Verifier {
    /// A verifier with the default tolerance and no custom header.
    pub fn new(scheme: Scheme, secrets: Vec<Vec<u8>>) -> Self {
        Verifier {
            scheme,
            secrets: secrets.into(),
            tolerance: DEFAULT_TOLERANCE,
            header: None,
            rule: None,
            public_keys: Vec::new(),
        }
    }

    /// Checks that the verifier can ever pass: at least one secret, no empty
    /// secret, and a header for hmac-sha256. For use at config load time.
    pub fn validate(&self) -> Result<(), VerifyError> {
        if self.secrets.is_empty() && self.public_keys.is_empty() {
            return Err(VerifyError::Misconfigured("no secret configured"));
        }
        if self.secrets.iter().any(|s| s.is_empty()) {
            return Err(VerifyError::Misconfigured("a configured secret is empty"));
        }
        if self.scheme == Scheme::HmacSha256 && self.header.is_none() {
            return Err(VerifyError::Misconfigured(
                "hmac-sha256 needs `header` naming the header that holds the digest",
            ));
        }
        if self.secrets.is_empty() && self.scheme != Scheme::StandardWebhooks {
            return Err(VerifyError::Misconfigured("no secret configured"));
        }
        if !self.public_keys.is_empty() && self.scheme != Scheme::StandardWebhooks {
            return Err(VerifyError::Misconfigured(
                "public keys are for standard-webhooks only",
            ));
        }
        match (self.scheme, &self.rule) {
            (Scheme::Hmac, None) => Err(VerifyError::Misconfigured("hmac needs its rule")),
            (Scheme::Hmac, Some(rule)) => rule
                .problem()
                .map_or(Ok(()), |why| Err(VerifyError::Misconfigured(why))),
            _ => Ok(()),
        }
    }

    /// Verifies one delivery. `now_unix_secs` is the current time in Unix
    /// seconds. Header values that are not visible ASCII, repeated signature
    /// headers and unparseable timestamps are `MalformedHeader`.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now_unix_secs: i64,
    ) -> Result<(), VerifyError> {
        self.verify_with_id(headers, body, None, now_unix_secs)
    }

    /// [`Verifier::verify`] for a rule whose message covers the event ID
    /// (`{id}`): `id` is the route's event ID as read from the request.
    pub fn verify_with_id(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        id: Option<&str>,
        now_unix_secs: i64,
    ) -> Result<(), VerifyError> {
        self.validate()?;
        let check_ts = |ts| self.check_timestamp(ts, now_unix_secs);
        let rule = match (self.scheme, self.scheme.fixed_rule()) {
            (_, Some(rule)) => rule,
            (Scheme::StandardWebhooks, _) => {
                return self.verify_standard_webhooks(headers, body, now_unix_secs)
            }
            (Scheme::Token, _) => return self.verify_token(headers),
            (Scheme::HmacSha256, _) => {
                let header = self
                    .header
                    .clone()
                    .ok_or(VerifyError::Misconfigured("hmac-sha256 needs `header`"))?;
                let rule = Rule::hmac_sha256(header);
                return rule.verify(&self.secrets, headers, body, id, check_ts);
            }
            _ => self
                .rule
                .as_deref()
                .ok_or(VerifyError::Misconfigured("hmac needs its rule"))?,
        };
        rule.verify(&self.secrets, headers, body, id, check_ts)
    }

    /// The token header's value against every secret, in constant time
    /// (their SHA-256 digests are compared, so lengths do not leak either).
    fn verify_token(&self, headers: &HeaderMap) -> Result<(), VerifyError> {
        use sha2::Digest as _;
        let name = self
            .header
            .as_ref()
            .map_or(headers::GITLAB_TOKEN, |h| h.as_str());
        let given = Sha256::digest(required(headers, name)?.as_bytes());
        let mut matched = Choice::from(0u8);
        for secret in self.secrets.iter() {
            matched |= Sha256::digest(secret).ct_eq(&given);
        }
        if bool::from(matched) {
            Ok(())
        } else {
            Err(VerifyError::Mismatch)
        }
    }

    fn verify_standard_webhooks(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: i64,
    ) -> Result<(), VerifyError> {
        let set = HeaderSet::of(headers)
            .ok_or_else(|| VerifyError::MissingHeader(headers::WEBHOOK_SIGNATURE.to_owned()))?;
        let sig_value = required(headers, set.signature())?;
        let id = required(headers, set.id())?;
        // The signed id must be the only id: a route keyed on `svix-id` would
        // otherwise take its event ID from an unsigned header (a captured
        // `webhook-*` delivery plus any `svix-id` could occupy that ID).
        if set == HeaderSet::Webhook
            && headers
                .get_all(headers::SVIX_ID)
                .iter()
                .any(|v| v.as_bytes().trim_ascii() != id.as_bytes())
        {
            return Err(VerifyError::malformed(
                headers::SVIX_ID,
                "differs from the signed `webhook-id`",
            ));
        }
        let ts_value = required(headers, set.timestamp())?;
        let ts = parse_timestamp(set.timestamp(), ts_value)?;
        let list = signature_list(
            set.signature(),
            sig_value,
            !self.secrets.is_empty(),
            !self.public_keys.is_empty(),
        )?;
        self.check_timestamp(ts, now)?;
        let parts: [&[u8]; 5] = [id.as_bytes(), b".", ts_value.as_bytes(), b".", body];
        let hmac_ok = self.check(&parts, &list.v1).is_ok();
        let ed_ok = !list.v1a.is_empty() && self.ed25519_matches(&parts, &list.v1a);
        if hmac_ok || ed_ok {
            Ok(())
        } else {
            Err(VerifyError::Mismatch)
        }
    }

    /// Whether any `v1a` signature is one of the public keys' over the
    /// message; Ed25519 signs the message whole, so it is copied once, and
    /// only when a v1a entry is there to check.
    fn ed25519_matches(&self, parts: &[&[u8]], signatures: &[[u8; 64]]) -> bool {
        let message = parts.concat();
        let mut ok = false;
        for key in &self.public_keys {
            let key = UnparsedPublicKey::new(&ED25519, key);
            for sig in signatures {
                ok |= key.verify(&message, sig).is_ok();
            }
        }
        ok
    }

    /// `|now - ts| <= tolerance` passes (compared at millisecond precision).
    fn check_timestamp(&self, ts: i64, now: i64) -> Result<(), VerifyError> {
        let age = i128::from(now) - i128::from(ts);
        let tol_ms = i128::try_from(self.tolerance.as_millis()).unwrap_or(i128::MAX);
        let saturate = |v: i128| i64::try_from(v).unwrap_or(i64::MAX);
        if age.saturating_mul(1000) > tol_ms {
            Err(VerifyError::StaleTimestamp {
                age_secs: saturate(age),
            })
        } else if (-age).saturating_mul(1000) > tol_ms {
            Err(VerifyError::FutureTimestamp {
                ahead_secs: saturate(-age),
            })
        } else {
            Ok(())
        }
    }

    /// Computes the MAC of `parts` under every secret and compares it with every
    /// candidate, in constant time and without an early exit.
    fn check(&self, parts: &[&[u8]], candidates: &[[u8; 32]]) -> Result<(), VerifyError> {
        let mut matched = Choice::from(0u8);
        self.secrets.for_each_tag(Algorithm::Sha256, parts, |tag| {
            for candidate in candidates {
                matched |= tag.ct_eq(&candidate[..]);
            }
        });
        if bool::from(matched) {
            Ok(())
        } else {
            Err(VerifyError::Mismatch)
        }
    }
}

// ----------------------------------------------------------------- helpers

/// The candidate signatures of a standard-webhooks list, by kind.
struct SignatureList {
    /// `v1,<base64>`: HMAC-SHA256 tags.
    v1: Vec<[u8; 32]>,
    /// `v1a,<base64>`: Ed25519 signatures.
    v1a: Vec<[u8; 64]>,
}

/// The candidate signatures of a standard-webhooks signature list: its
/// space-separated `v1,<base64>` entries that decode to 32 bytes (when the
/// verifier has HMAC secrets) and `v1a,<base64>` entries that decode to 64
/// bytes (when it has public keys): an entry is checked only against keys of
/// its kind. As the providers' own libraries do, every other entry is
/// skipped: other versions, entries without a comma, entries of a kind the
/// route has no key for, entries of the wrong length. A list with no usable
/// entry is malformed (nothing could ever match it).
fn signature_list(
    name: &str,
    value: &str,
    hmac: bool,
    ed25519: bool,
) -> Result<SignatureList, VerifyError> {
    let mut list = SignatureList {
        v1: Vec::new(),
        v1a: Vec::new(),
    };
    let mut entries = 0usize;
    for entry in value.split_ascii_whitespace() {
        if let Some(sig) = entry.strip_prefix("v1,").filter(|_| hmac) {
            entries += 1;
            if let Some(tag) = b64_array(sig) {
                list.v1.push(tag);
            }
        } else if let Some(sig) = entry.strip_prefix("v1a,").filter(|_| ed25519) {
            entries += 1;
            if let Some(sig) = b64_array(sig) {
                list.v1a.push(sig);
            }
        }
    }
    let (none, unusable) = match (hmac, ed25519) {
        (true, false) => (
            "no `v1,` signature",
            "no `v1,` signature is base64 of 32 bytes",
        ),
        (false, true) => (
            "no `v1a,` signature",
            "no `v1a,` signature is base64 of 64 bytes",
        ),
        _ => (
            "no `v1,` or `v1a,` signature",
            "no signature decodes to its kind's length",
        ),
    };
    match (list.v1.is_empty() && list.v1a.is_empty(), entries) {
        (false, _) => Ok(list),
        (true, 0) => Err(VerifyError::malformed(name, none)),
        (true, _) => Err(VerifyError::malformed(name, unusable)),
    }
}

pub(crate) fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    for part in parts {
        m.update(part);
    }
    m.finalize().into_bytes().into()
}

/// Standard base64 (padding optional) of exactly `N` bytes, for list
/// entries that are skipped when they are not.
fn b64_array<const N: usize>(s: &str) -> Option<[u8; N]> {
    let bytes = B64.decode(s.as_bytes()).ok()?;
    <[u8; N]>::try_from(bytes.as_slice()).ok()
}
