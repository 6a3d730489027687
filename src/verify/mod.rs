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
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};

pub mod sign;

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
}

impl Scheme {
    /// Every scheme, in configuration order.
    pub const ALL: [Scheme; 6] = [
        Scheme::Stripe,
        Scheme::Github,
        Scheme::Shopify,
        Scheme::Slack,
        Scheme::StandardWebhooks,
        Scheme::HmacSha256,
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
        }
    }

    /// Whether the scheme carries a timestamp checked against the tolerance.
    pub fn is_timestamped(self) -> bool {
        matches!(
            self,
            Scheme::Stripe | Scheme::Slack | Scheme::StandardWebhooks
        )
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
#[error("unknown signature scheme (expected one of stripe, github, shopify, slack, standard-webhooks, hmac-sha256)")]
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

/// Why a delivery failed verification. `Display` is safe to send back to the
/// sender: it names headers, never their values, the secrets or the body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A required header is absent (the header name, lower case).
    #[error("missing signature header `{0}`")]
    MissingHeader(String),
    /// A header is present but cannot be parsed.
    #[error("malformed signature header `{header}`: {why}")]
    MalformedHeader { header: String, why: &'static str },
    /// The signed timestamp is older than the tolerance.
    #[error("signature timestamp is {age_secs}s old, outside the allowed tolerance")]
    StaleTimestamp { age_secs: i64 },
    /// The signed timestamp is further in the future than the tolerance.
    #[error("signature timestamp is {ahead_secs}s in the future, outside the allowed tolerance")]
    FutureTimestamp { ahead_secs: i64 },
    /// Well-formed, but no signature matches any secret.
    #[error("no signature matches the payload")]
    Mismatch,
    /// The verifier itself is unusable (no secrets, an empty secret, or
    /// hmac-sha256 without a header). Config validation should catch this
    /// first; [`Verifier::verify`] fails closed with it.
    #[error("signature verification is misconfigured: {0}")]
    Misconfigured(&'static str),
}

impl VerifyError {
    fn malformed(header: &str, why: &'static str) -> Self {
        VerifyError::MalformedHeader {
            header: header.to_owned(),
            why,
        }
    }
}

/// A configured signature check for one route.
#[derive(Clone)]
pub struct Verifier {
    pub scheme: Scheme,
    /// Resolved key bytes (see [`Scheme::key_from_secret`]); any one matching passes.
    pub secrets: Vec<Vec<u8>>,
    /// Timestamped schemes reject deliveries older *or newer* than this
    /// (`|now - t| <= tolerance` passes).
    pub tolerance: Duration,
    /// hmac-sha256 only: the header holding the hex digest. Ignored otherwise.
    pub header: Option<HeaderName>,
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
            .finish()
    }
}

impl Verifier {
    /// A verifier with the default tolerance and no custom header.
    pub fn new(scheme: Scheme, secrets: Vec<Vec<u8>>) -> Self {
        Verifier {
            scheme,
            secrets,
            tolerance: DEFAULT_TOLERANCE,
            header: None,
        }
    }

    /// Checks that the verifier can ever pass: at least one secret, no empty
    /// secret, and a header for hmac-sha256. For use at config load time.
    pub fn validate(&self) -> Result<(), VerifyError> {
        if self.secrets.is_empty() {
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
        Ok(())
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
        self.validate()?;
        match self.scheme {
            Scheme::Stripe => self.verify_stripe(headers, body, now_unix_secs),
            Scheme::Github => {
                let name = headers::GITHUB_SIGNATURE_256;
                let value = required(headers, name)?;
                let hex_sig = value
                    .strip_prefix("sha256=")
                    .ok_or_else(|| VerifyError::malformed(name, "expected `sha256=<hex>`"))?;
                let sig = decode_hex_tag(name, hex_sig)?;
                self.check(&[body], &[sig])
            }
            Scheme::Shopify => {
                let name = headers::SHOPIFY_HMAC_SHA256;
                let sig = decode_b64_tag(name, required(headers, name)?)?;
                self.check(&[body], &[sig])
            }
            Scheme::Slack => {
                let sig_name = headers::SLACK_SIGNATURE;
                let ts_name = headers::SLACK_REQUEST_TIMESTAMP;
                let sig_value = required(headers, sig_name)?;
                let ts_value = required(headers, ts_name)?;
                let ts = parse_timestamp(ts_name, ts_value)?;
                let hex_sig = sig_value
                    .strip_prefix("v0=")
                    .ok_or_else(|| VerifyError::malformed(sig_name, "expected `v0=<hex>`"))?;
                let sig = decode_hex_tag(sig_name, hex_sig)?;
                self.check_timestamp(ts, now_unix_secs)?;
                self.check(&[b"v0:", ts_value.as_bytes(), b":", body], &[sig])
            }
            Scheme::StandardWebhooks => self.verify_standard_webhooks(headers, body, now_unix_secs),
            Scheme::HmacSha256 => {
                let header = self
                    .header
                    .as_ref()
                    .ok_or(VerifyError::Misconfigured("hmac-sha256 needs `header`"))?;
                let name = header.as_str();
                let value = required(headers, name)?;
                // Tolerated: a `sha256=` prefix (any case), as GitHub-style senders add.
                let hex_sig = match value.get(..7) {
                    Some(p) if p.eq_ignore_ascii_case("sha256=") => &value[7..],
                    _ => value,
                };
                let sig = decode_hex_tag(name, hex_sig)?;
                self.check(&[body], &[sig])
            }
        }
    }

    fn verify_stripe(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), VerifyError> {
        let name = headers::STRIPE_SIGNATURE;
        let value = required(headers, name)?;
        let mut t: Option<(&str, i64)> = None;
        let mut sigs = Vec::new();
        for element in value.split(',') {
            let element = element.trim();
            if element.is_empty() {
                continue;
            }
            let (key, val) = element
                .split_once('=')
                .ok_or_else(|| VerifyError::malformed(name, "an element is not `key=value`"))?;
            match key.trim() {
                "t" => {
                    if t.is_some() {
                        return Err(VerifyError::malformed(name, "more than one `t=`"));
                    }
                    let raw = val.trim();
                    t = Some((raw, parse_timestamp(name, raw)?));
                }
                "v1" => sigs.push(decode_hex_tag(name, val.trim())?),
                _ => {} // v0 (test-mode legacy) and future schemes are ignored
            }
        }
        let (t_raw, t) = t.ok_or_else(|| VerifyError::malformed(name, "no `t=` timestamp"))?;
        if sigs.is_empty() {
            return Err(VerifyError::malformed(name, "no `v1=` signature"));
        }
        self.check_timestamp(t, now)?;
        self.check(&[t_raw.as_bytes(), b".", body], &sigs)
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
        let sigs = signature_list(set.signature(), sig_value)?;
        self.check_timestamp(ts, now)?;
        self.check(
            &[id.as_bytes(), b".", ts_value.as_bytes(), b".", body],
            &sigs,
        )
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
        for secret in &self.secrets {
            let tag = mac(secret, parts);
            for candidate in candidates {
                matched |= tag[..].ct_eq(&candidate[..]);
            }
        }
        if bool::from(matched) {
            Ok(())
        } else {
            Err(VerifyError::Mismatch)
        }
    }
}

// ----------------------------------------------------------------- helpers

/// The candidate signatures of a standard-webhooks signature list: its
/// space-separated `v1,<base64>` entries that decode to 32 bytes. As the
/// providers' own libraries do, every other entry is skipped: other versions
/// (`v1a,…` asymmetric, future ones), entries without a comma, and `v1`
/// entries that are not base64 of exactly 32 bytes. A list with no usable
/// entry is malformed (nothing could ever match it).
fn signature_list(name: &str, value: &str) -> Result<Vec<[u8; 32]>, VerifyError> {
    let mut sigs = Vec::new();
    let mut v1_entries = 0usize;
    for entry in value.split_ascii_whitespace() {
        let Some(sig) = entry.strip_prefix("v1,") else {
            continue;
        };
        v1_entries += 1;
        if let Some(tag) = b64_tag(sig) {
            sigs.push(tag);
        }
    }
    match (sigs.is_empty(), v1_entries) {
        (false, _) => Ok(sigs),
        (true, 0) => Err(VerifyError::malformed(name, "no `v1,` signature")),
        (true, _) => Err(VerifyError::malformed(
            name,
            "no `v1,` signature is base64 of 32 bytes",
        )),
    }
}

/// Standard alphabet; padding accepted but not required.
const B64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

pub(crate) fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes keys of any length");
    for part in parts {
        m.update(part);
    }
    m.finalize().into_bytes().into()
}

/// The single value of a required header, as trimmed visible ASCII.
fn required<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, VerifyError> {
    let mut values = headers.get_all(name).iter();
    let value = values
        .next()
        .ok_or_else(|| VerifyError::MissingHeader(name.to_owned()))?;
    if values.next().is_some() {
        return Err(VerifyError::malformed(name, "the header is repeated"));
    }
    let value = value
        .to_str()
        .map_err(|_| VerifyError::malformed(name, "the value is not visible ASCII"))?
        .trim();
    if value.is_empty() {
        return Err(VerifyError::malformed(name, "the value is empty"));
    }
    Ok(value)
}

/// Unix seconds: ASCII digits only (no sign, no fraction), fitting in i64.
fn parse_timestamp(name: &str, raw: &str) -> Result<i64, VerifyError> {
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VerifyError::malformed(
            name,
            "the timestamp is not Unix seconds",
        ));
    }
    raw.parse::<i64>()
        .map_err(|_| VerifyError::malformed(name, "the timestamp is out of range"))
}

/// 64 hex digits, either case.
fn decode_hex_tag(name: &str, s: &str) -> Result<[u8; 32], VerifyError> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out)
        .map_err(|_| VerifyError::malformed(name, "the signature is not 64 hex digits"))?;
    Ok(out)
}

/// Standard base64 (padding optional) of exactly 32 bytes.
fn decode_b64_tag(name: &str, s: &str) -> Result<[u8; 32], VerifyError> {
    let bytes = B64
        .decode(s.as_bytes())
        .map_err(|_| VerifyError::malformed(name, "the signature is not valid base64"))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| VerifyError::malformed(name, "the signature is not 32 bytes"))
}

/// [`decode_b64_tag`] without the why, for list entries that are skipped.
fn b64_tag(s: &str) -> Option<[u8; 32]> {
    let bytes = B64.decode(s.as_bytes()).ok()?;
    <[u8; 32]>::try_from(bytes.as_slice()).ok()
}
