//! The hard-coded github, slack and stripe checks as they were before the
//! declarative scheme replaced them (src/verify/mod.rs before issue 43),
//! kept here only as the `signature/*` benches' baseline, so the comparison
//! is against the code the declarative path replaced, not a guess at it.

use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::Sha256;
use subtle::{Choice, ConstantTimeEq};

type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, PartialEq, Eq)]
pub enum Error {
    Missing,
    Malformed,
    Stale,
    Mismatch,
}

pub struct Legacy {
    pub secrets: Vec<Vec<u8>>,
    pub tolerance_ms: i128,
}

impl Legacy {
    pub fn github(&self, headers: &HeaderMap, body: &[u8]) -> Result<(), Error> {
        let value = required(headers, "x-hub-signature-256")?;
        let hex_sig = value.strip_prefix("sha256=").ok_or(Error::Malformed)?;
        let sig = decode_hex_tag(hex_sig)?;
        self.check(&[body], &[sig])
    }

    pub fn slack(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), Error> {
        let sig_value = required(headers, "x-slack-signature")?;
        let ts_value = required(headers, "x-slack-request-timestamp")?;
        let ts = parse_timestamp(ts_value)?;
        let hex_sig = sig_value.strip_prefix("v0=").ok_or(Error::Malformed)?;
        let sig = decode_hex_tag(hex_sig)?;
        self.check_timestamp(ts, now)?;
        self.check(&[b"v0:", ts_value.as_bytes(), b":", body], &[sig])
    }

    pub fn stripe(&self, headers: &HeaderMap, body: &[u8], now: i64) -> Result<(), Error> {
        let value = required(headers, "stripe-signature")?;
        let mut t: Option<(&str, i64)> = None;
        let mut sigs = Vec::new();
        for element in value.split(',') {
            let element = element.trim();
            if element.is_empty() {
                continue;
            }
            let (key, val) = element.split_once('=').ok_or(Error::Malformed)?;
            match key.trim() {
                "t" => {
                    if t.is_some() {
                        return Err(Error::Malformed);
                    }
                    let raw = val.trim();
                    t = Some((raw, parse_timestamp(raw)?));
                }
                "v1" => sigs.push(decode_hex_tag(val.trim())?),
                _ => {}
            }
        }
        let (t_raw, t) = t.ok_or(Error::Malformed)?;
        if sigs.is_empty() {
            return Err(Error::Malformed);
        }
        self.check_timestamp(t, now)?;
        self.check(&[t_raw.as_bytes(), b".", body], &sigs)
    }

    fn check_timestamp(&self, ts: i64, now: i64) -> Result<(), Error> {
        let age = i128::from(now) - i128::from(ts);
        if age.saturating_mul(1000) > self.tolerance_ms
            || (-age).saturating_mul(1000) > self.tolerance_ms
        {
            Err(Error::Stale)
        } else {
            Ok(())
        }
    }

    fn check(&self, parts: &[&[u8]], candidates: &[[u8; 32]]) -> Result<(), Error> {
        let mut matched = Choice::from(0u8);
        for secret in &self.secrets {
            let mut m = <HmacSha256 as Mac>::new_from_slice(secret).expect("any key length");
            for part in parts {
                m.update(part);
            }
            let tag: [u8; 32] = m.finalize().into_bytes().into();
            for candidate in candidates {
                matched |= tag[..].ct_eq(&candidate[..]);
            }
        }
        if bool::from(matched) {
            Ok(())
        } else {
            Err(Error::Mismatch)
        }
    }
}

fn required<'a>(headers: &'a HeaderMap, name: &str) -> Result<&'a str, Error> {
    let mut values = headers.get_all(name).iter();
    let value = values.next().ok_or(Error::Missing)?;
    if values.next().is_some() {
        return Err(Error::Malformed);
    }
    let value = value.to_str().map_err(|_| Error::Malformed)?.trim();
    if value.is_empty() {
        return Err(Error::Malformed);
    }
    Ok(value)
}

fn parse_timestamp(raw: &str) -> Result<i64, Error> {
    if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Error::Malformed);
    }
    raw.parse::<i64>().map_err(|_| Error::Malformed)
}

fn decode_hex_tag(s: &str) -> Result<[u8; 32], Error> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).map_err(|_| Error::Malformed)?;
    Ok(out)
}
