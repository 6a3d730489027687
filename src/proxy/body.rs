//! Reading a request's body in full, bounded in size and in time: the
//! digest and the claim need all of it before anything is forwarded. The
//! one bounded reader ([`read_bounded`]) serves the proxy and the admin
//! listener.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pingora::http::RequestHeader;
use pingora::protocols::http::ServerSession;
use pingora::proxy::Session;

use crate::problem::ProblemKind;
use crate::strict::chunked::ChunkError;

/// Longest time for the whole body when the session names none (SPEC §2's
/// `downstream.body_timeout` default). The listener sets the session's read
/// timeout to `downstream.body_timeout` (see [`read_full`]).
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub enum BodyError {
    /// More than `max_body` bytes.
    TooLarge,
    /// The body did not arrive within the body timeout.
    Timeout,
    /// Chunked framing that a strict parser refuses (the listener's
    /// check, `crate::strict::chunked`): 400 `invalid-request`.
    Framing,
    /// Malformed framing or a broken connection.
    Broken(Box<pingora::Error>),
}

impl BodyError {
    /// The `invalid-body` problem's detail for a body that could not be
    /// read. A body past a declared length within the limit (`TooLarge`
    /// where the limit is that length) is a framing fault too.
    pub fn invalid_detail(&self) -> &'static str {
        match self {
            BodyError::Timeout => "the request body did not arrive in time",
            BodyError::Framing => "the chunked framing of the request body is malformed",
            BodyError::TooLarge | BodyError::Broken(_) => {
                "the request body is malformed or its framing is inconsistent"
            }
        }
    }

    /// The problem for a body that could not be read: 408 when it did not
    /// arrive in time (SPEC §9), else 400; `invalid-body` but for malformed
    /// chunked framing, `invalid-request` (SPEC §4, "Strictness").
    pub fn invalid_kind(&self) -> ProblemKind {
        match self {
            BodyError::Timeout => ProblemKind::BodyTimeout,
            BodyError::Framing => ProblemKind::InvalidRequest,
            BodyError::TooLarge | BodyError::Broken(_) => ProblemKind::InvalidBody,
        }
    }
}

/// The declared `Content-Length`, if any and well-formed.
pub fn content_length(session: &Session) -> Option<u64> {
    declared_length(session.req_header())
}

/// The `Content-Length` `req` declares, if any and well-formed.
pub fn declared_length(req: &RequestHeader) -> Option<u64> {
    req.headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Largest body of an unguarded request read before forwarding.
pub const BUFFERED_PASS_LIMIT: u64 = 64 * 1024;

/// Whether an unguarded request is read whole before it is forwarded, as
/// nginx buffers request bodies by default: a declared length of at most
/// [`BUFFERED_PASS_LIMIT`] (neither `Content-Length` nor
/// `Transfer-Encoding`: no body), and nothing that needs pingora's streaming
/// path — no chunked body, no `Expect: 100-continue`, no protocol upgrade.
pub fn buffered_pass_through(session: &Session) -> bool {
    let headers = &session.req_header().headers;
    let small = match headers.get(http::header::CONTENT_LENGTH) {
        None => true,
        Some(_) => content_length(session).is_some_and(|n| n <= BUFFERED_PASS_LIMIT),
    };
    small
        && !headers.contains_key(http::header::TRANSFER_ENCODING)
        && !headers.contains_key(http::header::EXPECT)
        && !headers.contains_key(http::header::UPGRADE)
}

/// Whether the sender waits for `100 Continue` before sending the body.
/// Only an HTTP/1.1 sender does: an HTTP/1.0 one has no 1xx answers, and
/// its expectation is ignored (RFC 9110 §10.1.1, §15.2).
pub fn expects_continue(req: &RequestHeader) -> bool {
    req.version == http::Version::HTTP_11
        && req
            .headers
            .get(http::header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Whether the request header had both `Content-Length` and
/// `Transfer-Encoding`. pingora follows RFC 9112 §6.3 (chunked wins; it drops
/// the `Content-Length` before any hook runs and turns keep-alive off), so
/// only the raw header still shows both. Such a request is the classic
/// smuggling vector, and which bytes form its payload — the payload the digest
/// binds to the event ID — depends on which header a hop believes: refused,
/// as nginx does.
pub fn conflicting_framing(session: &Session) -> bool {
    if !session
        .req_header()
        .headers
        .contains_key(http::header::TRANSFER_ENCODING)
    {
        return false;
    }
    let raw = session.to_h1_raw();
    raw.split(|&b| b == b'\n').skip(1).any(|line| {
        line.iter().position(|&b| b == b':').is_some_and(|colon| {
            line[..colon]
                .trim_ascii()
                .eq_ignore_ascii_case(b"content-length")
        })
    })
}

/// Reads the whole body, at most `max_body` bytes, within the session's read
/// timeout — which the listener sets for every session to what is left of
/// `downstream.body_timeout` (it reads small bodies itself first), so that
/// it bounds the whole body here and each read of a body that streams
/// through pingora — or [`DEFAULT_BODY_TIMEOUT`] without one.
/// Conflicting framing ([`conflicting_framing`]) is `Broken` before any of
/// the body is read: the connection is closed without forwarding anything.
pub async fn read_full(session: &mut Session, max_body: u64) -> Result<Bytes, BodyError> {
    if conflicting_framing(session) {
        return Err(BodyError::Broken(pingora::Error::explain(
            pingora::ErrorType::InvalidHTTPHeader,
            "the request has both Content-Length and Transfer-Encoding",
        )));
    }
    let total = session.get_read_timeout().unwrap_or(DEFAULT_BODY_TIMEOUT);
    read_bounded(session, max_body, total).await
}

/// The one bounded body reader: the whole body, at most `max_body` bytes,
/// within `total` in all.
pub async fn read_bounded(
    session: &mut ServerSession,
    max_body: u64,
    total: Duration,
) -> Result<Bytes, BodyError> {
    // The declared length is a hint only up to 64 KiB: a sender that
    // announces 1 MiB and sends nothing must not make idemgate hold 1 MiB.
    let hint = declared_length(session.req_header())
        .unwrap_or(4096)
        .min(max_body)
        .min(64 * 1024) as usize;
    let mut buf = BytesMut::with_capacity(hint);
    let read = async {
        while let Some(chunk) = session.read_request_body().await.map_err(classify)? {
            if (buf.len() + chunk.len()) as u64 > max_body {
                return Err(BodyError::TooLarge);
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(())
    };
    match tokio::time::timeout(total, read).await {
        Ok(Ok(())) => Ok(buf.freeze()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(BodyError::Timeout),
    }
}

fn classify(e: Box<pingora::Error>) -> BodyError {
    match e.etype() {
        pingora::ErrorType::ReadTimedout => BodyError::Timeout,
        _ if is_framing_error(&e) => BodyError::Framing,
        _ => BodyError::Broken(e),
    }
}

/// Whether `e` was caused by chunked framing that the listener's stream
/// refused ([`ChunkError`], inside the `io::Error` of a read).
pub fn is_framing_error(e: &pingora::Error) -> bool {
    fn of(e: &pingora::Error) -> Option<&(dyn std::error::Error + 'static)> {
        e.cause
            .as_deref()
            .map(|c| c as &(dyn std::error::Error + 'static))
    }
    let mut cause = of(e);
    while let Some(c) = cause {
        if c.is::<ChunkError>() {
            return true;
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if io.get_ref().is_some_and(|inner| inner.is::<ChunkError>()) {
                return true;
            }
        }
        // a pingora error wrapping another holds it as itself or boxed
        cause = match (
            c.downcast_ref::<pingora::Error>(),
            c.downcast_ref::<Box<pingora::Error>>(),
        ) {
            (Some(p), _) => of(p),
            (None, Some(p)) => of(p),
            (None, None) => c.source(),
        };
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_errors_are_found_however_deep() {
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, ChunkError("x"));
        let read = pingora::Error::because(pingora::ErrorType::ReadError, "when reading body", io);
        assert!(is_framing_error(&read));
        let wrapped = pingora::Error::because(pingora::ErrorType::ReadError, "peer", read);
        assert!(is_framing_error(&wrapped));
        let other = std::io::Error::new(std::io::ErrorKind::InvalidData, "tls");
        let other = pingora::Error::because(pingora::ErrorType::ReadError, "x", other);
        assert!(!is_framing_error(&other));
    }
}
