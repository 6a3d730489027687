//! A request head, read by idemgate before pingora sees the connection.
//!
//! Why here and not in pingora's `read_request`: pingora bounds each read of
//! a head (59 s each, so a head dripped a byte at a time is held for ever),
//! and a session parked there holds its HTTP/1 state and the proxy's whole
//! per-request future. Here a connection waiting for a request holds no
//! buffer at all — each poll of the socket reads into a fresh buffer that is
//! freed again when nothing came — and the head's bytes go to pingora as the
//! session's first bytes (its pipelined prefix), which it parses without
//! another read. The header timeout is the connection table's: it shuts the
//! socket down, and the read here ends.

use std::future::poll_fn;

use bytes::BytesMut;
use pingora::protocols::Stream;
use tokio::io::AsyncReadExt;

/// The first read of a request: room for the head and a small body (as
/// pingora's own head buffer). A guarded request keeps it until its answer,
/// so it is what a connection dripping its body costs beyond its head.
const FIRST_READ: usize = 4 * 1024;
pub use crate::strict::fields::MAX_HEAD;

/// How waiting for a head ended.
#[derive(Debug)]
pub enum Head {
    /// The complete head (this many bytes), maybe with the start of the
    /// body after it.
    Complete(BytesMut, usize),
    /// The first bytes arrived and the head is not complete yet (returned
    /// once, so the caller can move a kept-alive connection on; call
    /// [`read_rest`] next).
    Started(BytesMut),
    /// The peer closed or reset the connection, or it was shut down here.
    Closed,
    /// More than [`MAX_HEAD`] bytes without the end of the head.
    TooLarge,
}

/// Waits for the first bytes of a request, holding no buffer meanwhile.
pub async fn first_bytes(stream: &mut Stream) -> Head {
    // nothing came: the buffer is freed until the socket is readable
    let read = poll_fn(|cx| crate::sys::poll_read_new(&mut *stream, cx, FIRST_READ));
    match read.await {
        Ok(buf) if buf.is_empty() => Head::Closed,
        Ok(buf) => match head_end(&buf, 0) {
            Some(end) => Head::Complete(buf, end),
            None if buf.len() > MAX_HEAD => Head::TooLarge,
            // a head that comes in pieces (a slow sender, or one dripping
            // it on purpose) keeps a buffer its size, not the first read's
            None if buf.len() < FIRST_READ / 4 => {
                let mut small = BytesMut::with_capacity(buf.len().max(256) * 2);
                small.extend_from_slice(&buf);
                Head::Started(small)
            }
            None => Head::Started(buf),
        },
        Err(_) => Head::Closed,
    }
}

/// The first bytes of a head that were read with the previous request
/// (a pipelined request), as [`first_bytes`] would have found them.
pub fn started(buf: BytesMut) -> Head {
    match head_end(&buf, 0) {
        Some(end) => Head::Complete(buf, end),
        None if buf.len() > MAX_HEAD => Head::TooLarge,
        None => Head::Started(buf),
    }
}

/// Reads on until the head in `buf` is complete.
pub async fn read_rest(stream: &mut Stream, mut buf: BytesMut) -> Head {
    // the end of the head cannot be before the last bytes already scanned
    let mut scanned = buf.len();
    loop {
        if buf.len() > MAX_HEAD {
            return Head::TooLarge;
        }
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(4096);
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return Head::Closed,
            Ok(_) => {}
        }
        if let Some(end) = head_end(&buf, scanned.saturating_sub(2)) {
            return Head::Complete(buf, end);
        }
        scanned = buf.len();
    }
}

/// Largest body read here before pingora sees the request (as large as the
/// unguarded bodies idemgate reads whole): one `Content-Length` body,
/// without `Expect` (a sender waiting for `100 Continue` sends nothing
/// more).
///
/// Why: a request waiting for its body inside pingora holds the proxy's
/// whole per-request state (~30 KiB); waiting here it holds its bytes.
pub const MAX_PREREAD_BODY: usize = 64 * 1024;

/// Reads on until `buf` holds `want` bytes (never past them: what follows
/// is the next request's). `false` when the connection closed first.
pub async fn read_body(stream: &mut Stream, buf: &mut BytesMut, want: usize) -> bool {
    while buf.len() < want {
        let left = want - buf.len();
        // grows with what arrives, not with what was announced
        buf.reserve(left.min(4096));
        let room = (buf.capacity() - buf.len()).min(left);
        match (&mut *stream).take(room as u64).read_buf(buf).await {
            Ok(0) | Err(_) => return false,
            Ok(_) => {}
        }
    }
    true
}

/// Where the header section in `buf` ends (the index past its empty line),
/// if it is complete; `from` is where to resume a scan of a growing buffer
/// (an index before which no end was found). Like httparse, empty lines
/// before the request line are skipped, and a line may end in LF alone: an
/// end found here is one httparse finds too, so the head pingora parses
/// never needs another read.
pub fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut start = 0;
    loop {
        match buf.get(start..start + 2) {
            Some(b"\r\n") => start += 2,
            _ if buf.get(start) == Some(&b'\n') => start += 1,
            _ => break,
        }
    }
    if start >= buf.len() {
        return None;
    }
    let mut i = from.max(start);
    while let Some(off) = buf[i..].iter().position(|&b| b == b'\n') {
        let lf = i + off;
        match buf.get(lf + 1) {
            Some(b'\n') => return Some(lf + 2),
            Some(b'\r') if buf.get(lf + 2) == Some(&b'\n') => return Some(lf + 3),
            _ => i = lf + 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_of_heads() {
        let full = b"POST /h HTTP/1.1\r\nHost: a\r\n\r\nbody";
        assert_eq!(head_end(full, 0), Some(full.len() - 4));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n", 0), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\n\r\n", 0), Some(23));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n", 0), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r", 0), None);
        assert_eq!(head_end(b"", 0), None);
    }

    #[test]
    fn leading_empty_lines_are_not_an_end() {
        // httparse skips them and waits for the request line
        assert_eq!(head_end(b"\r\n\r\n", 0), None);
        assert_eq!(head_end(b"\n\n\r\n", 0), None);
        let h = b"\r\n\nGET / HTTP/1.1\r\n\r\n";
        assert_eq!(head_end(h, 0), Some(h.len()));
    }

    #[test]
    fn a_resumed_scan_finds_an_end_split_across_reads() {
        let h = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        for cut in 1..h.len() {
            let first = head_end(&h[..cut], 0);
            let resumed = head_end(h, cut.saturating_sub(2));
            assert_eq!(first, None, "cut {cut}");
            assert_eq!(resumed, Some(h.len()), "cut {cut}");
        }
    }

    #[test]
    fn agrees_with_httparse_on_completeness() {
        // every prefix of some heads: complete here exactly when httparse
        // says complete (pingora's parser)
        let heads: [&[u8]; 4] = [
            b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi",
            b"\r\nGET / HTTP/1.1\nA: 1\n\n",
            b"GET / HTTP/1.0\r\n\r\n",
            b"PUT /x HTTP/1.1\r\nA: b\r\n c\r\n\r\n",
        ];
        for h in heads {
            for cut in 0..=h.len() {
                let p = &h[..cut];
                let mut headers = [httparse::EMPTY_HEADER; 16];
                let parsed = httparse::Request::new(&mut headers).parse(p);
                if let Some(end) = head_end(p, 0) {
                    // never an end where httparse would want more bytes
                    assert!(
                        !matches!(parsed, Ok(httparse::Status::Partial)),
                        "{:?} cut {cut} (end {end})",
                        String::from_utf8_lossy(h)
                    );
                } else {
                    assert!(
                        !matches!(parsed, Ok(httparse::Status::Complete(_))),
                        "{:?} cut {cut}",
                        String::from_utf8_lossy(h)
                    );
                }
            }
        }
    }
}
