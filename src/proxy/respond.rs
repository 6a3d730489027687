//! Responses idemgate writes itself on the downstream session: problems,
//! replays, and the headers every one of them carries. Each leaves the
//! connection usable (the request body was read) or says `Connection: close`.

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::Result;

use crate::problem::{Problem, CONTENT_TYPE};
use crate::store::{Recorded, ReplayHeaders};
use crate::strict::fields::{is_framing, is_hop_by_hop};

pub const IDEMPOTENCY_STATUS: &str = "Idempotency-Status";
pub const IDEMPOTENT_REPLAYED: &str = "Idempotent-Replayed";

/// Writes a problem+json response. `status_header` is the
/// `Idempotency-Status` value; `close` ends the connection after it (used when
/// the request body was not read).
pub async fn problem(
    session: &mut Session,
    p: &Problem,
    status_header: &str,
    close: bool,
) -> Result<()> {
    let body = Bytes::from(p.body());
    let mut resp = ResponseHeader::build(p.status(), Some(6))?;
    resp.insert_header(http::header::CONTENT_TYPE, CONTENT_TYPE)?;
    resp.insert_header(http::header::CONTENT_LENGTH, body.len())?;
    resp.insert_header(IDEMPOTENCY_STATUS, status_header)?;
    if let Some(secs) = p.retry_after {
        resp.insert_header(http::header::RETRY_AFTER, secs)?;
    }
    if close {
        resp.insert_header(http::header::CONNECTION, "close")?;
        session.set_keepalive(None);
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}

/// A problem+json response as bytes on the wire, with `Connection:
/// close`: for a connection answered before pingora has a session for it
/// (the listener's 431 for an oversized head).
pub fn problem_closing_wire(p: &Problem, status_header: &str) -> Vec<u8> {
    let body = p.body();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\n\
         {IDEMPOTENCY_STATUS}: {status_header}\r\nConnection: close\r\n\r\n",
        p.status(),
        p.kind.title(),
        body.len(),
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Answers a duplicate of a delivered event with the recorded outcome: its
/// status, and with `replay_body` its content type and body.
/// The headers kept with the record (SPEC §22), beside the replay's own:
/// never one that frames the message or that idemgate writes itself (the
/// config refuses those names; a record kept under another config, or
/// edited by hand, is not believed).
fn replay_headers(resp: &mut ResponseHeader, kept: &ReplayHeaders) -> Result<()> {
    for (name, value) in kept.iter() {
        let refused = is_framing(name)
            || is_hop_by_hop(name)
            || matches!(name, "content-type" | "set-cookie")
            || name.starts_with("idempoten");
        let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) else {
            continue;
        };
        if !refused {
            resp.append_header(name, value)?;
        }
    }
    Ok(())
}

pub async fn replay(session: &mut Session, recorded: &Recorded) -> Result<()> {
    let status = recorded.status.unwrap_or(200);
    let body = recorded.body.clone().map(Bytes::from).unwrap_or_default();
    let mut resp = ResponseHeader::build(status, Some(5))?;
    let bodiless = status == 204 || status == 304 || (100..200).contains(&status);
    if !bodiless {
        resp.insert_header(http::header::CONTENT_LENGTH, body.len())?;
        if let Some(ct) = recorded
            .content_type
            .as_deref()
            .filter(|_| !body.is_empty())
        {
            resp.insert_header(http::header::CONTENT_TYPE, ct)?;
        }
    }
    resp.insert_header(IDEMPOTENT_REPLAYED, "true")?;
    resp.insert_header(IDEMPOTENCY_STATUS, "replayed")?;
    if let Some(kept) = &recorded.headers {
        replay_headers(&mut resp, kept)?;
    }
    if bodiless || body.is_empty() {
        return session.write_response_header(Box::new(resp), true).await;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}
