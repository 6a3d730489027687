//! What every scheme reads a request with: the error a refusal carries, a
//! required header's single value, a Unix timestamp, base64. Shared by
//! `verify/mod.rs` and `verify/declarative.rs` (so neither imports the other
//! for them).

use http::HeaderMap;

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
    /// The signed message covers the event ID, and the request has none.
    #[error("the signed message covers the event ID, and the request has none")]
    MissingEventId,
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
    pub(super) fn malformed(header: &str, why: &'static str) -> Self {
        VerifyError::MalformedHeader {
            header: header.to_owned(),
            why,
        }
    }
}

/// Standard alphabet; padding accepted but not required.
pub(super) const B64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_encode_padding(true)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// The single value of a required header, as trimmed visible ASCII.
pub(super) fn required<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, VerifyError> {
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
        .trim_ascii();
    if value.is_empty() {
        return Err(VerifyError::malformed(name, "the value is empty"));
    }
    Ok(value)
}

/// Unix seconds: ASCII digits only (no sign, no fraction), fitting in i64.
pub(super) fn parse_timestamp(name: &str, raw: &str) -> Result<i64, VerifyError> {
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(VerifyError::malformed(
            name,
            "the timestamp is not Unix seconds",
        ));
    }
    raw.parse::<i64>()
        .map_err(|_| VerifyError::malformed(name, "the timestamp is out of range"))
}
