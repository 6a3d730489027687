//! The HTTP/1.1 core of the kit, free of I/O: heads parsed with `httparse`
//! (the parser pingora itself uses), bodies framed by `Content-Length`,
//! chunked coding or the end of the connection, and the messages the
//! servers and the client exchange. The blocking client and the async
//! servers only move bytes into a buffer and call these.

use std::io;

/// Header fields parsed at most in one head; more is an error.
const MAX_HEADERS: usize = 256;

fn invalid(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// The first value of a header in `headers` (case-insensitive name).
pub fn find<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// Whether a head asks to close the connection.
pub fn says_close(headers: &[(String, String)]) -> bool {
    find(headers, "connection").is_some_and(|v| v.eq_ignore_ascii_case("close"))
}

fn fields(raw: &[httparse::Header<'_>]) -> Vec<(String, String)> {
    raw.iter()
        .map(|h| {
            let value = String::from_utf8_lossy(h.value).trim().to_string();
            (h.name.to_string(), value)
        })
        .collect()
}

/// A request as a server read it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// The request target as sent (path and query).
    pub path: String,
    /// Header fields in wire order (values as lossy UTF-8; see [`Request::header_bytes`]).
    pub headers: Vec<(String, String)>,
    /// The request line and headers as received, up to and including the blank line.
    pub head: Vec<u8>,
    /// The body, decoded from its framing.
    pub body: Vec<u8>,
    /// Socket reads it took to gather this request (0: it was already
    /// buffered behind the previous one).
    pub reads: usize,
}

impl Request {
    /// The first value of a header, as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }

    /// The first value of a header as the raw bytes received (which need not be UTF-8).
    pub fn header_bytes(&self, name: &str) -> Option<&[u8]> {
        self.head
            .split(|&b| b == b'\n')
            .skip(1)
            .filter_map(|line| {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let colon = line.iter().position(|&b| b == b':')?;
                let (k, v) = line.split_at(colon);
                k.eq_ignore_ascii_case(name.as_bytes())
                    .then(|| v[1..].trim_ascii())
            })
            .next()
    }

    /// The event's key: `Idempotency-Key`, else `X-Event-ID`.
    pub fn key(&self) -> Option<&str> {
        self.header("Idempotency-Key")
            .or_else(|| self.header("X-Event-ID"))
    }
}

/// A request head at the front of `buf`, with its length; `None` while incomplete.
pub fn request_head(buf: &[u8]) -> io::Result<Option<(Request, usize)>> {
    let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut raw);
    let httparse::Status::Complete(n) = req.parse(buf).map_err(invalid)? else {
        return Ok(None);
    };
    let request = Request {
        method: req.method.unwrap_or_default().to_string(),
        path: req.path.unwrap_or_default().to_string(),
        headers: fields(req.headers),
        head: buf[..n].to_vec(),
        body: Vec::new(),
        reads: 0,
    };
    Ok(Some((request, n)))
}

/// A response as the client read it.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Header fields in wire order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }

    /// The body as text (lossy UTF-8), for messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (`Null` when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// A response head as parsed.
#[derive(Debug, Clone)]
pub struct ResponseHead {
    pub status: u16,
    /// Header fields in wire order.
    pub headers: Vec<(String, String)>,
    /// Its length in bytes, the blank line included.
    pub len: usize,
}

/// A response head at the front of `buf`; `None` while incomplete.
pub fn response_head(buf: &[u8]) -> io::Result<Option<ResponseHead>> {
    let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut raw);
    let httparse::Status::Complete(len) = resp.parse(buf).map_err(invalid)? else {
        return Ok(None);
    };
    Ok(Some(ResponseHead {
        status: resp.code.unwrap_or(0),
        headers: fields(resp.headers),
        len,
    }))
}

/// How a message's body is framed, and the decoding of it as bytes arrive.
#[derive(Debug)]
pub enum Body {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Length(usize),
    /// Chunked coding: the chunks decoded so far; `trailers` once the last
    /// (empty) chunk was read.
    Chunked { body: Vec<u8>, trailers: bool },
    /// Everything until the peer closes.
    ToEnd,
}

fn chunked(headers: &[(String, String)]) -> bool {
    find(headers, "transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
}

fn content_length(headers: &[(String, String)]) -> Option<usize> {
    find(headers, "content-length").and_then(|v| v.parse().ok())
}

impl Body {
    /// The framing of a request's body.
    pub fn of_request(headers: &[(String, String)]) -> Body {
        if chunked(headers) {
            Body::Chunked {
                body: Vec::new(),
                trailers: false,
            }
        } else {
            content_length(headers).map_or(Body::Empty, Body::Length)
        }
    }

    /// The framing of a final response's body (`head_only`: the answer to a HEAD).
    pub fn of_response(status: u16, headers: &[(String, String)], head_only: bool) -> Body {
        if head_only || status == 204 || status == 304 {
            Body::Empty
        } else if chunked(headers) {
            Body::of_request(headers)
        } else {
            content_length(headers).map_or(Body::ToEnd, Body::Length)
        }
    }

    /// Takes the whole body from the front of `buf` once it is there;
    /// `None` while more bytes are needed. `eof`: none will come (an
    /// incomplete body is then an error, except one framed by the end).
    pub fn take(&mut self, buf: &mut Vec<u8>, eof: bool) -> io::Result<Option<Vec<u8>>> {
        let done = match self {
            Body::Empty => Some(Vec::new()),
            Body::Length(n) => (buf.len() >= *n).then(|| buf.drain(..*n).collect()),
            Body::ToEnd => eof.then(|| std::mem::take(buf)),
            Body::Chunked { body, trailers } => decode_chunks(buf, body, trailers)?,
        };
        if done.is_none() && eof && !matches!(self, Body::ToEnd) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed inside a body",
            ));
        }
        Ok(done)
    }
}

/// Moves the complete chunks at the front of `buf` into `body`; the body
/// once the last chunk and the trailers are in.
fn decode_chunks(
    buf: &mut Vec<u8>,
    body: &mut Vec<u8>,
    trailers: &mut bool,
) -> io::Result<Option<Vec<u8>>> {
    loop {
        if *trailers {
            let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else {
                return Ok(None);
            };
            buf.drain(..eol + 2);
            if eol == 0 {
                return Ok(Some(std::mem::take(body)));
            }
            continue;
        }
        let httparse::Status::Complete((at, size)) =
            httparse::parse_chunk_size(buf).map_err(|_| invalid("bad chunk size"))?
        else {
            return Ok(None);
        };
        if size == 0 {
            buf.drain(..at);
            *trailers = true;
            continue;
        }
        let size = usize::try_from(size).map_err(invalid)?;
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buf[at..at + size]);
        buf.drain(..at + size + 2);
    }
}

/// A complete response with a `Content-Length` body (none for 204 and 304).
pub fn response(status: u16, content_type: &str, body: &[u8]) -> Vec<u8> {
    response_with(status, content_type, &[], body)
}

/// [`response`] with more header fields.
pub fn response_with(
    status: u16,
    content_type: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} X\r\n").into_bytes();
    for (k, v) in headers {
        out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    if status != 204 && status != 304 {
        out.extend_from_slice(
            format!(
                "Content-Type: {content_type}\r\nContent-Length: {}\r\n",
                body.len()
            )
            .as_bytes(),
        );
    }
    out.extend_from_slice(b"\r\n");
    if status != 204 && status != 304 {
        out.extend_from_slice(body);
    }
    out
}

/// A request with a `Content-Length` body and `Host: localhost`.
pub fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// The status code of the first response in `bytes`, if its line arrived.
pub fn status_of(bytes: &[u8]) -> Option<u16> {
    let line = bytes.split(|&b| b == b'\n').next()?;
    std::str::from_utf8(line)
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_body_is_decoded_as_its_bytes_arrive() {
        let wire = b"3\r\nabc\r\n1;ext=1\r\nd\r\n0\r\nTrailer: x\r\n\r\nNEXT";
        for split in 0..wire.len() {
            let mut body = Body::Chunked {
                body: Vec::new(),
                trailers: false,
            };
            let mut buf = wire[..split].to_vec();
            let first = body.take(&mut buf, false).unwrap();
            buf.extend_from_slice(&wire[split..]);
            let got = first.or_else(|| body.take(&mut buf, false).unwrap());
            assert_eq!(got.as_deref(), Some(&b"abcd"[..]), "split at {split}");
            assert_eq!(buf, b"NEXT", "split at {split}");
        }
    }

    #[test]
    fn framing_follows_the_headers() {
        let h = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
        let mut buf = b"hello world".to_vec();
        let got = Body::of_request(&h("Content-Length", "5")).take(&mut buf, false);
        assert_eq!(got.unwrap().as_deref(), Some(&b"hello"[..]));
        assert!(matches!(
            Body::of_response(204, &h("Content-Length", "5"), false),
            Body::Empty
        ));
        assert!(matches!(Body::of_response(200, &[], false), Body::ToEnd));
        assert!(Body::Length(9).take(&mut b"abc".to_vec(), true).is_err());
    }

    #[test]
    fn heads_parse_with_their_raw_bytes() {
        let wire = b"POST /a?b=1 HTTP/1.1\r\nX-Event-ID: e1\r\nX-Raw: caf\xe9\r\n\r\nbody";
        let (req, n) = request_head(wire).unwrap().unwrap();
        assert_eq!(
            (req.method.as_str(), req.path.as_str(), n),
            ("POST", "/a?b=1", wire.len() - 4)
        );
        assert_eq!(req.key(), Some("e1"));
        assert_eq!(req.header_bytes("x-raw"), Some(&b"caf\xe9"[..]));
        assert!(request_head(&wire[..20]).unwrap().is_none());
        let head = response_head(b"HTTP/1.1 204 No Content\r\nA: b\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!((head.status, find(&head.headers, "a")), (204, Some("b")));
    }
}
