//! Signing helpers: each function returns the **header value** a provider
//! would send for the given secret and payload, so tests and the demo can
//! produce deliveries that [`super::Verifier`] accepts. Keys are the same
//! resolved bytes a `Verifier` holds (for standard-webhooks the decoded key,
//! not the `whsec_…` string).

use base64::Engine as _;

use super::mac;
use super::parts::B64;

/// `Stripe-Signature` value: `t={t},v1={hex}` over `"{t}.{body}"`.
pub fn stripe(secret: &[u8], t: i64, body: &[u8]) -> String {
    let ts = t.to_string();
    format!(
        "t={ts},v1={}",
        hex::encode(mac(secret, &[ts.as_bytes(), b".", body]))
    )
}

/// `X-Hub-Signature-256` value: `sha256={hex}` over the body.
pub fn github(secret: &[u8], body: &[u8]) -> String {
    format!("sha256={}", hmac_hex(secret, body))
}

/// `X-Shopify-Hmac-Sha256` value: standard base64 (padded) over the body.
pub fn shopify(secret: &[u8], body: &[u8]) -> String {
    B64.encode(mac(secret, &[body]))
}

/// `X-Slack-Signature` value: `v0={hex}` over `"v0:{ts}:{body}"`; send `ts`
/// as `X-Slack-Request-Timestamp`.
pub fn slack(secret: &[u8], ts: i64, body: &[u8]) -> String {
    let ts = ts.to_string();
    format!(
        "v0={}",
        hex::encode(mac(secret, &[b"v0:", ts.as_bytes(), b":", body]))
    )
}

/// `webhook-signature` (or `svix-signature`) value: `v1,{base64}` over
/// `"{id}.{ts}.{body}"`; send `id` and `ts` as `webhook-id` / `webhook-timestamp`.
/// `key` is the decoded secret (the bytes after `whsec_`).
pub fn standard_webhooks(key: &[u8], id: &str, ts: i64, body: &[u8]) -> String {
    let ts = ts.to_string();
    let tag = mac(key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
    format!("v1,{}", B64.encode(tag))
}

/// The `whsec_<base64>` configuration form of a standard-webhooks key.
pub fn standard_webhooks_secret(key: &[u8]) -> String {
    format!("whsec_{}", B64.encode(key))
}

/// Lower-case hex HMAC-SHA256 of the body: the value for `hmac-sha256`'s header.
pub fn hmac_hex(secret: &[u8], body: &[u8]) -> String {
    hex::encode(mac(secret, &[body]))
}

/// `Paddle-Signature` value: `ts={ts};h1={hex}` over `"{ts}:{body}"`.
pub fn paddle(secret: &[u8], ts: i64, body: &[u8]) -> String {
    let ts = ts.to_string();
    format!(
        "ts={ts};h1={}",
        hex::encode(mac(secret, &[ts.as_bytes(), b":", body]))
    )
}

/// `Typeform-Signature` value: `sha256={base64}` over the body.
pub fn typeform(secret: &[u8], body: &[u8]) -> String {
    format!("sha256={}", B64.encode(mac(secret, &[body])))
}

/// `x-zm-signature` value: `v0={hex}` over `"v0:{ts}:{body}"`; send `ts` as
/// `x-zm-request-timestamp`.
pub fn zoom(secret: &[u8], ts: i64, body: &[u8]) -> String {
    slack(secret, ts, body)
}

/// The tag of any algorithm, hex or base64: for `scheme: hmac` tests.
pub fn tag(
    algorithm: super::Algorithm,
    encoding: super::Encoding,
    secret: &[u8],
    parts: &[&[u8]],
) -> String {
    let tag = algorithm.tag(secret, parts);
    match encoding {
        super::Encoding::Hex => hex::encode(tag),
        super::Encoding::Base64 => B64.encode(tag),
    }
}

/// A `v1a,{base64}` standard-webhooks entry: Ed25519 over
/// `"{id}.{ts}.{body}"` with the key made from `seed` (32 bytes).
pub fn standard_webhooks_v1a(seed: &[u8; 32], id: &str, ts: i64, body: &[u8]) -> String {
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(seed)
        .expect("any 32 bytes are an Ed25519 seed");
    let message = [id.as_bytes(), b".", ts.to_string().as_bytes(), b".", body].concat();
    format!("v1a,{}", B64.encode(pair.sign(&message)))
}

/// The `whpk_<base64>` configuration form of the public key of `seed`.
pub fn standard_webhooks_public_key(seed: &[u8; 32]) -> String {
    use ring::signature::KeyPair as _;
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(seed)
        .expect("any 32 bytes are an Ed25519 seed");
    format!("whpk_{}", B64.encode(pair.public_key().as_ref()))
}
