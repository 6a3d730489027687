//! The declarative HMAC scheme (SPEC §17, `verify.scheme: hmac`): a
//! signature described as data. The github, shopify, slack, stripe,
//! hmac-sha256, paddle, typeform and zoom schemes are instances of it
//! ([`GITHUB`] …), so one function verifies them all.
//!
//! A [`Rule`] is built once (at config load) and only read per request: the
//! candidate signatures are decoded into a fixed array, the message's parts
//! are slices of the request, and nothing is allocated.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName};
use subtle::{Choice, ConstantTimeEq};

use super::mac::{Algorithm, Secrets, MAX_TAG};
use super::parts::{parse_timestamp, required, VerifyError, B64};

/// Most candidate signatures one header may carry (several: a rotation).
pub const MAX_SIGNATURES: usize = 8;
/// Most parts a message template may have (literal text and placeholders).
pub const MAX_PIECES: usize = 16;

/// How the signature is written in the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Hex digits, either case.
    Hex,
    /// Standard base64, padding optional.
    Base64,
}

impl Encoding {
    /// Every encoding, by its configuration name.
    pub const ALL: [(Encoding, &'static str); 2] =
        [(Encoding::Hex, "hex"), (Encoding::Base64, "base64")];
}

/// Where the signed timestamp (Unix seconds) is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Timestamp {
    /// Its own header.
    Header(HeaderName),
    /// A key of the signature header's `k=v` list.
    Param(Cow<'static, str>),
}

/// One part of the signed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Literal text.
    Text(Cow<'static, str>),
    /// The raw body.
    Body,
    /// The timestamp as sent.
    Timestamp,
    /// The event ID.
    Id,
    /// A header's value (trimmed); absent is a missing header.
    Header(HeaderName),
}

/// A prefix stripped from each signature before decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix {
    pub text: Cow<'static, str>,
    /// hmac-sha256's leniency: the prefix may be absent, in any case.
    /// Configured prefixes are required, exactly as written.
    pub optional: bool,
}

/// A declarative HMAC signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub algorithm: Algorithm,
    pub encoding: Encoding,
    /// The header holding the signature (or the `k=v` list).
    pub header: HeaderName,
    pub prefix: Option<Prefix>,
    /// The header is a `k=v` list (`,` or `;`) and the signatures are under this key.
    pub signature_param: Option<Cow<'static, str>>,
    pub timestamp: Option<Timestamp>,
    /// What is signed, in order; at most [`MAX_PIECES`].
    pub message: Cow<'static, [Piece]>,
}

const fn prefix(s: &'static str) -> Option<Prefix> {
    Some(Prefix {
        text: Cow::Borrowed(s),
        optional: false,
    })
}

/// `X-Hub-Signature-256: sha256=<hex>` over the body.
pub static GITHUB: Rule = Rule {
    algorithm: Algorithm::Sha256,
    encoding: Encoding::Hex,
    header: HeaderName::from_static("x-hub-signature-256"),
    prefix: prefix("sha256="),
    signature_param: None,
    timestamp: None,
    message: Cow::Borrowed(&[Piece::Body]),
};

/// `X-Shopify-Hmac-Sha256: <base64>` over the body.
pub static SHOPIFY: Rule = Rule {
    algorithm: Algorithm::Sha256,
    encoding: Encoding::Base64,
    header: HeaderName::from_static("x-shopify-hmac-sha256"),
    prefix: None,
    signature_param: None,
    timestamp: None,
    message: Cow::Borrowed(&[Piece::Body]),
};

/// `X-Slack-Signature: v0=<hex>` over `v0:{timestamp}:{body}`.
pub static SLACK: Rule = Rule {
    algorithm: Algorithm::Sha256,
    encoding: Encoding::Hex,
    header: HeaderName::from_static("x-slack-signature"),
    prefix: prefix("v0="),
    signature_param: None,
    timestamp: Some(Timestamp::Header(HeaderName::from_static(
        "x-slack-request-timestamp",
    ))),
    message: Cow::Borrowed(&[
        Piece::Text(Cow::Borrowed("v0:")),
        Piece::Timestamp,
        Piece::Text(Cow::Borrowed(":")),
        Piece::Body,
    ]),
};

/// `Stripe-Signature: t=…,v1=…[,v1=…]` over `{timestamp}.{body}`.
pub static STRIPE: Rule = Rule {
    algorithm: Algorithm::Sha256,
    encoding: Encoding::Hex,
    header: HeaderName::from_static("stripe-signature"),
    prefix: None,
    signature_param: Some(Cow::Borrowed("v1")),
    timestamp: Some(Timestamp::Param(Cow::Borrowed("t"))),
    message: Cow::Borrowed(&[
        Piece::Timestamp,
        Piece::Text(Cow::Borrowed(".")),
        Piece::Body,
    ]),
};

/// `Paddle-Signature: ts=…;h1=…[;h1=…]` over `{timestamp}:{body}`.
pub static PADDLE: Rule = Rule {
    algorithm: Algorithm::Sha256,
    encoding: Encoding::Hex,
    header: HeaderName::from_static("paddle-signature"),
    prefix: None,
    signature_param: Some(Cow::Borrowed("h1")),
    timestamp: Some(Timestamp::Param(Cow::Borrowed("ts"))),
    message: Cow::Borrowed(&[
        Piece::Timestamp,
        Piece::Text(Cow::Borrowed(":")),
        Piece::Body,
    ]),
};

/// `Typeform-Signature: sha256=<base64>` over the body.
pub static TYPEFORM: Rule = Rule {
    algorithm: Algorithm::Sha256,
    encoding: Encoding::Base64,
    header: HeaderName::from_static("typeform-signature"),
    prefix: prefix("sha256="),
    signature_param: None,
    timestamp: None,
    message: Cow::Borrowed(&[Piece::Body]),
};

/// `x-zm-signature: v0=<hex>` over `v0:{timestamp}:{body}`.
pub static ZOOM: Rule = Rule {
    algorithm: Algorithm::Sha256,
    encoding: Encoding::Hex,
    header: HeaderName::from_static("x-zm-signature"),
    prefix: prefix("v0="),
    signature_param: None,
    timestamp: Some(Timestamp::Header(HeaderName::from_static(
        "x-zm-request-timestamp",
    ))),
    message: Cow::Borrowed(&[
        Piece::Text(Cow::Borrowed("v0:")),
        Piece::Timestamp,
        Piece::Text(Cow::Borrowed(":")),
        Piece::Body,
    ]),
};

impl Rule {
    /// hmac-sha256: hex of the body in `header`, a `sha256=` prefix tolerated
    /// (absent, or in any case).
    pub fn hmac_sha256(header: HeaderName) -> Rule {
        Rule {
            algorithm: Algorithm::Sha256,
            encoding: Encoding::Hex,
            header,
            prefix: Some(Prefix {
                text: Cow::Borrowed("sha256="),
                optional: true,
            }),
            signature_param: None,
            timestamp: None,
            message: Cow::Borrowed(&[Piece::Body]),
        }
    }

    /// Whether the message signs the event ID (then the caller must pass it).
    pub fn signs_id(&self) -> bool {
        self.message.contains(&Piece::Id)
    }

    /// What makes the rule unusable, for config load (the verifier also
    /// refuses it, failing closed).
    pub fn problem(&self) -> Option<&'static str> {
        let has_ts = self.message.contains(&Piece::Timestamp);
        if self.message.len() > MAX_PIECES {
            Some("the message template has too many parts")
        } else if !self.message.contains(&Piece::Body) {
            Some("the message must contain {body}: a signature that does not cover the body protects nothing")
        } else if has_ts != self.timestamp.is_some() {
            Some("the message uses {timestamp} exactly when `timestamp` is set")
        } else if matches!(self.timestamp, Some(Timestamp::Param(_)))
            && self.signature_param.is_none()
        {
            Some("`timestamp: {param: …}` needs `signature_param` (the header is then a k=v list)")
        } else {
            None
        }
    }

    /// Verifies one delivery under `keys` (any may match); `id` is the
    /// event ID, for a message with `{id}`. Timestamps are checked by
    /// `check_ts` before any MAC is computed.
    pub(super) fn verify(
        &self,
        keys: &Secrets,
        headers: &HeaderMap,
        body: &[u8],
        id: Option<&str>,
        check_ts: impl FnOnce(i64) -> Result<(), VerifyError>,
    ) -> Result<(), VerifyError> {
        if let Some(why) = self.problem() {
            return Err(VerifyError::Misconfigured(why));
        }
        let name = self.header.as_str();
        let value = required(headers, name)?;
        let mut found = Candidates::default();
        let ts_raw: Option<&str> = match (&self.timestamp, &self.signature_param) {
            (_, Some(param)) => self.read_list(name, value, param, &mut found)?,
            (ts, None) => {
                let ts = match ts {
                    Some(Timestamp::Header(h)) => Some(required(headers, h.as_str())?),
                    _ => None,
                };
                self.decode(name, value, found.next().expect("an empty list has room"))?;
                ts
            }
        };
        if let Some(raw) = ts_raw {
            let ts_name = match &self.timestamp {
                Some(Timestamp::Header(h)) => h.as_str(),
                _ => name,
            };
            check_ts(parse_timestamp(ts_name, raw)?)?;
        }
        let parts = self.message_parts(headers, body, ts_raw, id)?;
        let parts = &parts[..self.message.len()];
        let mut matched = Choice::from(0u8);
        keys.for_each_tag(self.algorithm, parts, |tag| {
            for candidate in found.as_slice() {
                matched |= tag.ct_eq(&candidate[..tag.len()]);
            }
        });
        if bool::from(matched) {
            Ok(())
        } else {
            Err(VerifyError::Mismatch)
        }
    }

    /// The signed message's pieces, in order, each borrowed where it lies
    /// (the MAC reads them one after another: the body is never copied).
    fn message_parts<'a>(
        &'a self,
        headers: &'a HeaderMap,
        body: &'a [u8],
        ts_raw: Option<&'a str>,
        id: Option<&'a str>,
    ) -> Result<[&'a [u8]; MAX_PIECES], VerifyError> {
        let mut parts: [&[u8]; MAX_PIECES] = [&[]; MAX_PIECES];
        for (slot, piece) in parts.iter_mut().zip(self.message.iter()) {
            *slot = match piece {
                Piece::Text(t) => t.as_bytes(),
                Piece::Body => body,
                Piece::Timestamp => ts_raw.unwrap_or_default().as_bytes(),
                Piece::Id => id.ok_or(VerifyError::MissingEventId)?.as_bytes(),
                Piece::Header(h) => required(headers, h.as_str())?.as_bytes(),
            };
        }
        Ok(parts)
    }

    /// Reads a `k=v` list: the signatures under `param` into `found`, and
    /// the timestamp (its raw text) when it is a key of the list — else from
    /// its header.
    fn read_list<'a>(
        &self,
        name: &str,
        value: &'a str,
        param: &str,
        found: &mut Candidates,
    ) -> Result<Option<&'a str>, VerifyError> {
        let ts_param = match &self.timestamp {
            Some(Timestamp::Param(p)) => Some(p.as_ref()),
            _ => None,
        };
        let mut ts = None;
        for element in list_elements(value) {
            let element = element.trim_ascii();
            if element.is_empty() {
                continue;
            }
            let (key, val) = element
                .split_once('=')
                .ok_or_else(|| VerifyError::malformed(name, "an element is not `key=value`"))?;
            let (key, val) = (key.trim_ascii(), val.trim_ascii());
            if Some(key) == ts_param {
                if ts.is_some() {
                    return Err(VerifyError::malformed(name, "more than one timestamp"));
                }
                ts = Some(val);
            } else if key == param {
                let slot = found
                    .next()
                    .ok_or_else(|| VerifyError::malformed(name, "too many signatures"))?;
                self.decode(name, val, slot)?;
            }
            // other keys (Stripe's v0, future versions) are ignored
        }
        if ts_param.is_some() && ts.is_none() {
            return Err(VerifyError::malformed(name, "no timestamp in the list"));
        }
        if found.len == 0 {
            return Err(VerifyError::malformed(name, "no signature in the list"));
        }
        Ok(ts)
    }

    /// One signature into `out`: the prefix stripped, then decoded to
    /// exactly the algorithm's tag length.
    fn decode(&self, name: &str, s: &str, out: &mut [u8; MAX_TAG]) -> Result<(), VerifyError> {
        let s = match &self.prefix {
            None => s,
            Some(Prefix {
                text,
                optional: false,
            }) => s
                .strip_prefix(text.as_ref())
                .ok_or_else(|| VerifyError::malformed(name, "the signature lacks its prefix"))?,
            Some(Prefix {
                text,
                optional: true,
            }) => match s.get(..text.len()) {
                Some(p) if p.eq_ignore_ascii_case(text) => &s[text.len()..],
                _ => s,
            },
        };
        let len = self.algorithm.tag_len();
        let malformed = |why| Err(VerifyError::malformed(name, why));
        match self.encoding {
            Encoding::Hex => {
                if !decode_hex(s.as_bytes(), &mut out[..len]) {
                    return malformed(self.algorithm.hex_why());
                }
            }
            Encoding::Base64 => {
                use base64::Engine as _;
                let mut buf = [0u8; MAX_TAG + 8];
                if s.len() > 4 * (MAX_TAG + 2) / 3 + 4 {
                    return malformed(self.algorithm.len_why());
                }
                match B64.decode_slice(s.as_bytes(), &mut buf) {
                    Ok(n) if n == len => out[..len].copy_from_slice(&buf[..len]),
                    Ok(_) => return malformed(self.algorithm.len_why()),
                    Err(_) => return malformed("the signature is not valid base64"),
                }
            }
        }
        Ok(())
    }
}

/// The elements of a `k=v` list, split at `,` and `;`. The header is
/// visible ASCII ([`required`]), so it is searched by byte.
fn list_elements(value: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(value);
    std::iter::from_fn(move || {
        let s = rest?;
        match s.bytes().position(|b| b == b',' || b == b';') {
            Some(i) => {
                rest = Some(&s[i + 1..]);
                Some(&s[..i])
            }
            None => {
                rest = None;
                Some(s)
            }
        }
    })
}

/// The decoded signatures of one delivery, on the stack.
struct Candidates {
    tags: [[u8; MAX_TAG]; MAX_SIGNATURES],
    len: usize,
}

impl Default for Candidates {
    fn default() -> Self {
        Candidates {
            tags: [[0; MAX_TAG]; MAX_SIGNATURES],
            len: 0,
        }
    }
}

impl Candidates {
    /// The next free slot, taken (`None` when full): the signature is
    /// decoded in place.
    fn next(&mut self) -> Option<&mut [u8; MAX_TAG]> {
        let slot = self.tags.get_mut(self.len)?;
        self.len += 1;
        Some(slot)
    }

    fn as_slice(&self) -> &[[u8; MAX_TAG]] {
        &self.tags[..self.len]
    }
}

/// Exactly `2 * out.len()` hex digits (either case) into `out`; `false`
/// when the length or any digit is wrong. One table lookup per digit and no
/// early exit.
pub(super) fn decode_hex(s: &[u8], out: &mut [u8]) -> bool {
    /// A digit's value, or 0xff.
    const VALUE: [u8; 256] = {
        let mut t = [0xffu8; 256];
        let mut i = 0;
        while i < 10 {
            t[b'0' as usize + i] = i as u8;
            i += 1;
        }
        let mut i = 0;
        while i < 6 {
            t[b'a' as usize + i] = 10 + i as u8;
            t[b'A' as usize + i] = 10 + i as u8;
            i += 1;
        }
        t
    };
    if s.len() != 2 * out.len() {
        return false;
    }
    let mut bad = 0u8;
    for (pair, byte) in s.chunks_exact(2).zip(out.iter_mut()) {
        let (hi, lo) = (VALUE[usize::from(pair[0])], VALUE[usize::from(pair[1])]);
        bad |= hi | lo;
        *byte = (hi << 4) | (lo & 0x0f);
    }
    bad < 16
}

/// Parses a message template: literal text with `{body}`, `{timestamp}`,
/// `{id}` and `{header:NAME}`. `{{` and `}}` are a literal brace.
pub fn parse_message(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut lit = String::new();
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        lit.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("{{").or_else(|| tail.strip_prefix("}}")) {
            lit.push(tail.as_bytes()[0] as char);
            rest = after;
            continue;
        }
        if tail.starts_with('}') {
            return Err("an unmatched `}` (write `}}` for a literal brace)".into());
        }
        let end = tail
            .find('}')
            .ok_or("an unclosed `{` (write `{{` for a literal brace)")?;
        let piece = match &tail[1..end] {
            "body" => Piece::Body,
            "timestamp" => Piece::Timestamp,
            "id" => Piece::Id,
            other => match other.strip_prefix("header:") {
                Some(h) => Piece::Header(HeaderName::from_bytes(h.trim().as_bytes()).map_err(
                    |_| format!("`{{header:{h}}}` does not name a valid header"),
                )?),
                None => {
                    return Err(format!(
                        "unknown placeholder `{{{other}}}` (expected {{body}}, {{timestamp}}, {{id}} or {{header:NAME}})"
                    ))
                }
            },
        };
        if !lit.is_empty() {
            pieces.push(Piece::Text(Cow::Owned(std::mem::take(&mut lit))));
        }
        pieces.push(piece);
        rest = &tail[end + 1..];
    }
    lit.push_str(rest);
    if !lit.is_empty() {
        pieces.push(Piece::Text(Cow::Owned(lit)));
    }
    if pieces.len() > MAX_PIECES {
        return Err(format!(
            "at most {MAX_PIECES} parts (text and placeholders)"
        ));
    }
    Ok(pieces)
}
