//! Signing helpers: each function returns the **header value** a provider
//! would send for the given secret and payload, so tests and the demo can
//! produce deliveries that [`super::Verifier`] accepts. Keys are the same
//! resolved bytes a `Verifier` holds (for standard-webhooks the decoded key,
//! not the `whsec_…` string).

use base64::Engine as _;

use super::{mac, B64};

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
