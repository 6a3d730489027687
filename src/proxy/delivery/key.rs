//! The event ID of a guarded request, from its header or its JSON body,
//! and what keys its claim ([`policy::key`]).

use pingora::proxy::Session;
use serde_json::Value;

use crate::claim::policy::{self, Key};
use crate::claim::{digest, event_id, json_pointer};
use crate::config::{DigestMode, EventIdSource, IdPart, OnMissingId};
use crate::problem::{Problem, ProblemKind};
use crate::proxy::exit::Refused;
use crate::proxy::routes::RouteRt;

/// The event ID's key from headers, for a route that reads it from headers
/// alone (`None` for one that needs the body: a JSON pointer, a part of
/// one, or zoom's challenge, which is known only from the body).
pub fn header_key(session: &Session, route: &RouteRt) -> Result<Option<Key<String>>, Problem> {
    let headers = &session.req_header().headers;
    let cfg = &route.cfg;
    if cfg.challenge.is_some() {
        return Ok(None);
    }
    let on_missing = cfg.on_missing_id;
    if let EventIdSource::Parts(parts) = &cfg.event_id {
        if cfg.event_id.reads_body() {
            return Ok(None);
        }
        return parts_id(parts, headers, None).map(|id| Some(policy::key(id, on_missing)));
    }
    let Some(h) = cfg.event_id.header_for(headers) else {
        return Ok(None);
    };
    Ok(Some(policy::key(
        header_event_id(headers, h, on_missing)?,
        on_missing,
    )))
}

/// The event ID's key once the body is read, for a route [`header_key`]
/// left it to: a JSON pointer, parts, or a zoom route (whose signed
/// `endpoint.url_validation` challenge passes unguarded, as Slack's
/// `url_verification` does).
pub fn json_key(
    route: &RouteRt,
    headers: &http::HeaderMap,
    json: Option<&Value>,
) -> Result<Key<String>, Refused> {
    let cfg = &route.cfg;
    if let (Some(c), Some(doc)) = (cfg.challenge, json) {
        if doc.pointer(c.pointer).and_then(Value::as_str) == Some(c.value) {
            return Ok(Key::Unguarded);
        }
    }
    let on_missing = cfg.on_missing_id;
    let id = match (&cfg.event_id, json) {
        (EventIdSource::Parts(parts), doc) => {
            parts_id(parts, headers, doc).map_err(Refused::new)?
        }
        (EventIdSource::JsonPointer(p), Some(doc)) => {
            match event_id::event_id_from_json_tokens(doc, p.tokens()) {
                Ok(id) => Some(id),
                Err(event_id::JsonIdError::Absent) => None,
                Err(e) => {
                    let p = Problem::new(ProblemKind::InvalidEventId, e.to_string());
                    return Err(Refused::new(p));
                }
            }
        }
        (EventIdSource::Header(_) | EventIdSource::SvixId, _) => {
            // a zoom route named a header: read it now
            match cfg.event_id.header_for(headers) {
                Some(h) => header_event_id(headers, h, on_missing).map_err(Refused::new)?,
                None => None,
            }
        }
        (EventIdSource::JsonPointer(_), None) => None,
    };
    Ok(policy::key(id, on_missing))
}

/// The body as JSON, when the digest, the event ID or a challenge needs it.
pub fn json_body(
    route: &RouteRt,
    body: &[u8],
    header_id: Option<&str>,
) -> Result<Option<Value>, Refused> {
    let cfg = &route.cfg;
    let needs =
        cfg.digest == DigestMode::Json || cfg.event_id.reads_body() || cfg.challenge.is_some();
    if !needs {
        return Ok(None);
    }
    digest::parse_json_body(body).map(Some).map_err(|e| {
        let p = Problem::new(ProblemKind::InvalidBody, e.to_string());
        Refused::new(p.with_event_id(header_id))
    })
}

/// A composite ID (SPEC §17): every part read (headers, and the body's
/// pointers from the one parse of `doc`), joined with `:`. `Ok(None)` when
/// a part is absent; a problem when one is invalid or the whole is.
fn parts_id(
    parts: &[IdPart],
    headers: &http::HeaderMap,
    doc: Option<&Value>,
) -> Result<Option<String>, Problem> {
    let invalid = |e: String| Problem::new(ProblemKind::InvalidEventId, e);
    let mut texts: Vec<std::borrow::Cow<'_, str>> = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let text = match part {
            IdPart::Header(h) => {
                let mut values = headers.get_all(h).iter();
                let Some(first) = values.next() else {
                    return Ok(None);
                };
                if values.any(|v| v != first) {
                    return Err(invalid(format!(
                        "the request carries several different {h} headers"
                    )));
                }
                let text = first
                    .to_str()
                    .map_err(|_| invalid(format!("header {h}: the value is not visible ASCII")))?;
                std::borrow::Cow::Borrowed(text)
            }
            IdPart::JsonPointer(p) => {
                let Some(value) = doc.and_then(|d| json_pointer::lookup(d, p.tokens())) else {
                    return Ok(None);
                };
                event_id::id_text(value)
                    .map_err(|e| invalid(format!("part {} ({p}): {e}", i + 1)))?
            }
        };
        texts.push(text);
    }
    event_id::join_parts(texts.iter().map(|t| t.as_ref()))
        .map(Some)
        .map_err(|e| invalid(e.to_string()))
}

/// The event ID from header `h`: `Ok(None)` when it is absent and the route
/// does not reject that; a problem when it is absent (rejected), invalid, or
/// given twice with different values.
fn header_event_id(
    headers: &http::HeaderMap,
    h: &http::HeaderName,
    on_missing: OnMissingId,
) -> std::result::Result<Option<String>, Problem> {
    let mut values = headers.get_all(h).iter();
    let Some(first) = values.next() else {
        return match on_missing {
            OnMissingId::Reject => Err(Problem::new(
                ProblemKind::MissingEventId,
                format!("the request has no {h} header"),
            )),
            OnMissingId::Forward | OnMissingId::BodyDigest => Ok(None),
        };
    };
    if values.any(|v| v != first) {
        return Err(Problem::new(
            ProblemKind::InvalidEventId,
            format!("the request carries several different {h} headers"),
        ));
    }
    event_id::validate_event_id(first.as_bytes())
        .map(|id| Some(id.to_owned()))
        .map_err(|e| Problem::new(ProblemKind::InvalidEventId, format!("header {h}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> http::HeaderMap {
        let mut m = http::HeaderMap::new();
        for v in values {
            m.append("x-event-id", v.parse().unwrap());
        }
        m
    }

    #[test]
    fn header_event_ids() {
        use OnMissingId::*;
        let h = http::HeaderName::from_static("x-event-id");
        type Want = Result<Option<String>, ProblemKind>;
        let some = |id: &str| Ok(Some(id.to_owned()));
        let cases: [(&[&str], OnMissingId, Want); 7] = [
            (&["evt_1"], Reject, some("evt_1")),
            (&["e", "e"], Reject, some("e")),
            (&["a", "b"], Reject, Err(ProblemKind::InvalidEventId)),
            (&["a b"], Reject, Err(ProblemKind::InvalidEventId)),
            (&[], Reject, Err(ProblemKind::MissingEventId)),
            (&[], Forward, Ok(None)),
            (&[], BodyDigest, Ok(None)),
        ];
        for (values, on_missing, want) in cases {
            let got = header_event_id(&headers(values), &h, on_missing).map_err(|p| p.kind);
            assert_eq!(got, want, "{values:?} {on_missing:?}");
        }
    }
}
