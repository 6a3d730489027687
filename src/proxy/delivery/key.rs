//! The event ID of a guarded request, from its header or its JSON body,
//! and what keys its claim ([`policy::key`]).

use pingora::proxy::Session;
use serde_json::Value;

use crate::claim::policy::{self, Key};
use crate::claim::{digest, event_id};
use crate::config::{DigestMode, OnMissingId};
use crate::problem::{Problem, ProblemKind};
use crate::proxy::exit::Refused;
use crate::proxy::routes::RouteRt;

/// The event ID's key from its header, for a route that reads one (`None`
/// for one that reads it from the body).
pub fn header_key(session: &Session, route: &RouteRt) -> Result<Option<Key<String>>, Problem> {
    let headers = &session.req_header().headers;
    let Some(h) = route.cfg.event_id.header_for(headers) else {
        return Ok(None);
    };
    let on_missing = route.cfg.on_missing_id;
    Ok(Some(policy::key(
        header_event_id(headers, h, on_missing)?,
        on_missing,
    )))
}

/// The event ID's key from the body, for a route that reads it at a JSON pointer.
pub fn json_key(route: &RouteRt, json: Option<&Value>) -> Result<Key<String>, Refused> {
    let id = match (route.cfg.event_id.json_pointer(), json) {
        (Some(p), Some(doc)) => match event_id::event_id_from_json_tokens(doc, p.tokens()) {
            Ok(id) => Some(id),
            Err(event_id::JsonIdError::Absent) => None,
            Err(e) => {
                let p = Problem::new(ProblemKind::InvalidEventId, e.to_string());
                return Err(Refused::new(p));
            }
        },
        _ => None,
    };
    Ok(policy::key(id, route.cfg.on_missing_id))
}

/// The body as JSON, when the digest or the event ID needs it.
pub fn json_body(
    route: &RouteRt,
    body: &[u8],
    header_id: Option<&str>,
) -> Result<Option<Value>, Refused> {
    if route.cfg.digest != DigestMode::Json && route.cfg.event_id.json_pointer().is_none() {
        return Ok(None);
    }
    digest::parse_json_body(body).map(Some).map_err(|e| {
        let p = Problem::new(ProblemKind::InvalidBody, e.to_string());
        Refused::new(p.with_event_id(header_id))
    })
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
