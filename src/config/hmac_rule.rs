//! `verify.scheme: hmac` (SPEC §17): the block's keys turned into a
//! [`Rule`], every problem recorded at its key.

use std::borrow::Cow;

use super::ctx::Ctx;
use super::fields;
use super::model::Scheme;
use super::raw::{RawTimestamp, RawVerify};
use crate::verify::declarative::parse_message;
use crate::verify::{Algorithm, Encoding, Prefix, Rule, Timestamp};

/// The rule of a `scheme: hmac` block; `None` when a key is invalid (recorded).
pub fn rule(ctx: &mut Ctx, path: &str, raw: &RawVerify) -> Option<Rule> {
    let at = |key: &str| format!("{path}.{key}");
    let algorithm = named(
        ctx,
        &at("algorithm"),
        raw.algorithm.as_deref(),
        &Algorithm::ALL,
    )
    .map(|a| a.unwrap_or(Algorithm::Sha256));
    let encoding = named(
        ctx,
        &at("encoding"),
        raw.encoding.as_deref(),
        &Encoding::ALL,
    )
    .map(|e| e.unwrap_or(Encoding::Hex));
    let prefix = prefix(ctx, &at("prefix"), raw.prefix.as_deref());
    let signature_param =
        signature_param(ctx, &at("signature_param"), raw.signature_param.as_deref());
    let timestamp = timestamp(ctx, &at("timestamp"), raw.timestamp.as_ref());
    let message = match parse_message(raw.message.as_deref().unwrap_or("{body}")) {
        Ok(m) => Some(m),
        Err(e) => {
            ctx.at_value(&at("message"), e);
            None
        }
    };
    // the header's own problems are recorded by the `verify` block
    let header = fields::header_name(raw.header.as_deref()?).ok()?;
    let rule = Rule {
        algorithm: algorithm?,
        encoding: encoding?,
        header,
        prefix: prefix?,
        signature_param: signature_param?,
        timestamp: timestamp?,
        message: Cow::Owned(message?),
    };
    if let Some(why) = rule.problem() {
        let key = if raw.message.is_some() {
            at("message")
        } else {
            path.to_owned()
        };
        ctx.at_key(&key, why);
        return None;
    }
    Some(rule)
}

/// `prefix`, the text before the signature: absent, or not empty.
fn prefix(ctx: &mut Ctx, path: &str, raw: Option<&str>) -> Option<Option<Prefix>> {
    match raw {
        Some("") => {
            ctx.at_value(path, "prefix is empty (leave it out instead)");
            None
        }
        p => Some(p.map(|p| Prefix {
            text: Cow::Owned(p.to_owned()),
            optional: false,
        })),
    }
}

/// `signature_param`, the signature's key when the header is a `k=v` list.
fn signature_param(
    ctx: &mut Ctx,
    path: &str,
    raw: Option<&str>,
) -> Option<Option<Cow<'static, str>>> {
    match raw {
        Some(p) if p.is_empty() || p.contains([',', ';', '=', ' ']) => {
            ctx.at_value(
                path,
                "signature_param must be a key of the header's k=v list (no `,`, `;`, `=` or space)",
            );
            None
        }
        p => Some(p.map(|p| Cow::Owned(p.to_owned()))),
    }
}

/// The hmac-only keys set on another scheme are an error, one per key.
pub fn refuse_hmac_keys(ctx: &mut Ctx, path: &str, raw: &RawVerify, scheme: Option<Scheme>) {
    let Some(scheme) = scheme else { return };
    let set = [
        ("algorithm", raw.algorithm.is_some()),
        ("encoding", raw.encoding.is_some()),
        ("prefix", raw.prefix.is_some()),
        ("signature_param", raw.signature_param.is_some()),
        ("timestamp", raw.timestamp.is_some()),
        ("message", raw.message.is_some()),
    ];
    for (key, _) in set.iter().filter(|(_, is_set)| *is_set) {
        ctx.at_key(
            &format!("{path}.{key}"),
            format!(
                "`{key}` is only allowed with scheme hmac, not {}",
                scheme.as_str()
            ),
        );
    }
}

/// A name from `names`: `Some(None)` when absent, `None` when unknown (recorded).
fn named<T: Copy>(
    ctx: &mut Ctx,
    path: &str,
    raw: Option<&str>,
    names: &[(T, &'static str)],
) -> Option<Option<T>> {
    let Some(raw) = raw else { return Some(None) };
    match names.iter().find(|(_, n)| *n == raw) {
        Some((v, _)) => Some(Some(*v)),
        None => {
            let expected: Vec<&str> = names.iter().map(|(_, n)| *n).collect();
            ctx.at_value(
                path,
                format!(
                    "unknown value `{raw}` (expected one of {})",
                    expected.join(", ")
                ),
            );
            None
        }
    }
}

/// `timestamp: {header: NAME}` or `{param: KEY}`; `Some(None)` when absent.
fn timestamp(ctx: &mut Ctx, path: &str, raw: Option<&RawTimestamp>) -> Option<Option<Timestamp>> {
    let Some(RawTimestamp { header, param }) = raw else {
        return Some(None);
    };
    match (header, param) {
        (Some(h), None) => match fields::header_name(h) {
            Ok(h) => Some(Some(Timestamp::Header(h))),
            Err(e) => {
                ctx.at_value(&format!("{path}.header"), e);
                None
            }
        },
        (None, Some(p)) if !p.is_empty() => Some(Some(Timestamp::Param(Cow::Owned(p.clone())))),
        _ => {
            ctx.at_key(
                path,
                "timestamp needs exactly one of `header` (its own header) or `param` (a key of the signature's k=v list)",
            );
            None
        }
    }
}
