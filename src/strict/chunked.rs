//! Chunked framing (RFC 9112 §7.1), checked as the body arrives, in any
//! pieces: `chunk-size [ chunk-ext ] CRLF`, the data, `CRLF`, …, the last
//! chunk `0`, trailer fields, and the final `CRLF`.
//!
//! Refused where httparse and pingora forgive: an empty chunk-size line
//! (which ends their body), a size with stray bytes or more than 16 hex
//! digits, a bare LF or CR where CRLF belongs, control bytes in an
//! extension, and a trailer line that is not `name: value` (no colon, a
//! name that is not a token, a folded line). [`Chunked::feed`] also says
//! where the body ends, so that what follows it is left for the next
//! request.

use std::fmt;

/// Why a chunked body is refused (the rule it broke; never its bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkError(pub &'static str);

impl fmt::Display for ChunkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed chunked framing: {}", self.0)
    }
}

impl std::error::Error for ChunkError {}

/// Longest chunk-size line with its extensions (pingora's own bound on
/// extensions is far larger).
const MAX_SIZE_LINE: usize = 4 * 1024;
/// Most bytes of trailer fields.
const MAX_TRAILERS: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the hex digits of a chunk size (this many so far, at most 255;
    /// leading zeros are bounded by the line's length).
    Size(u8),
    /// Whitespace after the size: only an extension may follow.
    SizeSpace,
    /// In the chunk extensions, up to the CR.
    Extension,
    /// The chunk-size line's CR was seen.
    SizeLf,
    /// This many data bytes still to come.
    Data(u64),
    DataCr,
    DataLf,
    /// At the start of a trailer line, or of the final CRLF.
    LineStart,
    TrailerName,
    TrailerValue,
    TrailerLf,
    FinalLf,
    Done,
}

/// The framing state of one chunked body.
#[derive(Debug, Clone)]
pub struct Chunked {
    state: State,
    /// The chunk size being read.
    size: u64,
    /// Bytes of the current chunk-size line, and of the trailers.
    line: usize,
    trailers: usize,
}

impl Default for Chunked {
    fn default() -> Self {
        Chunked::new()
    }
}

impl Chunked {
    pub fn new() -> Chunked {
        Chunked {
            state: State::Size(0),
            size: 0,
            line: 0,
            trailers: 0,
        }
    }

    /// The body's final CRLF has been seen.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Checks the next bytes of the body; how many of them belong to it
    /// (all of them, unless the body ends inside `buf`). Once an error is
    /// returned, the body is refused: feed it no more.
    pub fn feed(&mut self, buf: &[u8]) -> Result<usize, ChunkError> {
        let mut i = 0;
        while i < buf.len() {
            if let State::Data(left) = self.state {
                let n = left.min((buf.len() - i) as u64);
                i += n as usize;
                self.state = match left - n {
                    0 => State::DataCr,
                    rest => State::Data(rest),
                };
                continue;
            }
            if self.state == State::Done {
                return Ok(i);
            }
            self.step(buf[i])?;
            i += 1;
        }
        Ok(i)
    }

    /// One framing byte (anything but data).
    fn step(&mut self, b: u8) -> Result<(), ChunkError> {
        let err = |rule| Err(ChunkError(rule));
        self.state = match (self.state, b) {
            (State::Size(n), _) if b.is_ascii_hexdigit() => {
                if self.size >> 60 != 0 {
                    return err("a chunk size over 16 hex digits");
                }
                let digit = (b as char).to_digit(16).unwrap_or(0) as u64;
                self.size = self.size << 4 | digit;
                State::Size(n.saturating_add(1))
            }
            (State::Size(0), _) => return err("a chunk-size line without a size"),
            (State::Size(_), b'\r') | (State::Extension, b'\r') => State::SizeLf,
            (State::Size(_), b';') | (State::SizeSpace, b';') => State::Extension,
            (State::Size(_), b' ' | b'\t') | (State::SizeSpace, b' ' | b'\t') => State::SizeSpace,
            (State::Size(_) | State::SizeSpace, _) => {
                return err("a chunk size followed by something other than an extension")
            }
            (State::Extension, _) if b == b'\t' || (0x20..0x7f).contains(&b) => State::Extension,
            (State::Extension, _) => return err("a control byte in a chunk extension"),
            (State::SizeLf, b'\n') => self.chunk_starts(),
            (State::SizeLf, _) => return err("a chunk-size line not ended by CRLF"),
            (State::DataCr, b'\r') => State::DataLf,
            (State::DataLf, b'\n') => State::Size(0),
            (State::DataCr | State::DataLf, _) => return err("chunk data not followed by CRLF"),
            (State::LineStart, b'\r') => State::FinalLf,
            (State::LineStart, _) if super::is_tchar(b) => State::TrailerName,
            (State::LineStart, _) => return err("a trailer line that is not a header field"),
            (State::TrailerName, b':') => State::TrailerValue,
            (State::TrailerName, _) if super::is_tchar(b) => State::TrailerName,
            (State::TrailerName, _) => return err("a trailer line without a colon after a token"),
            (State::TrailerValue, b'\r') => State::TrailerLf,
            (State::TrailerValue, _) if b == b'\t' || (0x20..0x7f).contains(&b) => {
                State::TrailerValue
            }
            (State::TrailerValue, _) => return err("a control or non-ASCII byte in a trailer"),
            (State::TrailerLf, b'\n') => State::LineStart,
            (State::FinalLf, b'\n') => State::Done,
            (State::TrailerLf | State::FinalLf, _) => {
                return err("a trailer line not ended by CRLF")
            }
            (State::Data(_) | State::Done, _) => unreachable!("handled by feed"),
        };
        self.count(b)
    }

    /// After a chunk-size line: the data, or the trailers after the last chunk.
    fn chunk_starts(&mut self) -> State {
        let size = std::mem::take(&mut self.size);
        self.line = 0;
        match size {
            0 => State::LineStart,
            n => State::Data(n),
        }
    }

    /// Bounds the chunk-size line and the trailers.
    fn count(&mut self, _b: u8) -> Result<(), ChunkError> {
        match self.state {
            State::Size(_) | State::SizeSpace | State::Extension | State::SizeLf => {
                self.line += 1;
                if self.line > MAX_SIZE_LINE {
                    return Err(ChunkError("a chunk-size line over 4 KiB"));
                }
            }
            State::TrailerName | State::TrailerValue | State::TrailerLf | State::LineStart => {
                self.trailers += 1;
                if self.trailers > MAX_TRAILERS {
                    return Err(ChunkError("trailers over 16 KiB"));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole body fed at once, and byte by byte: the same verdict.
    fn verdict(body: &[u8]) -> Result<usize, ChunkError> {
        let whole = Chunked::new().feed(body);
        let mut c = Chunked::new();
        let mut used = 0;
        let mut bytewise = Ok(0);
        for b in body {
            match c.feed(std::slice::from_ref(b)) {
                Ok(n) => used += n,
                Err(e) => {
                    bytewise = Err(e);
                    break;
                }
            }
            if c.is_done() {
                break;
            }
        }
        let bytewise = bytewise.map(|_| used);
        assert_eq!(whole, bytewise, "{:?}", String::from_utf8_lossy(body));
        whole
    }

    #[test]
    fn well_formed_bodies_end_where_they_end() {
        let cases: [&[u8]; 6] = [
            b"0\r\n\r\n",
            b"5\r\nhello\r\n0\r\n\r\n",
            b"5;ext=1\r\nhello\r\n0\r\n\r\n",
            b"5 ; a=\"b c\"\r\nhello\r\n000\r\n\r\n",
            b"A\r\n0123456789\r\n0\r\nX-Sum: 1\r\nY: \r\n\r\n",
            b"00000000000000003\r\nabc\r\n0\r\n\r\n",
        ];
        for body in cases {
            let mut next = body.to_vec();
            next.extend_from_slice(b"GET / HTTP/1.1\r\n");
            let used = verdict(&next);
            assert_eq!(used, Ok(body.len()), "{:?}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn lenient_forms_are_refused() {
        let cases: [&[u8]; 21] = [
            b"\r\nhello\r\n0\r\n\r\n",
            b"\r\n\r\n",
            b"zz\r\nabc\r\n0\r\n\r\n",
            b"-3\r\nabc\r\n0\r\n\r\n",
            b"+3\r\nabc\r\n0\r\n\r\n",
            b"0x3\r\nabc\r\n0\r\n\r\n",
            b" 3\r\nabc\r\n0\r\n\r\n",
            b"3 \r\nabc\r\n0\r\n\r\n",
            b"fffffffffffffffff\r\n",
            b"00010000000000000000\r\n",
            b"3\nabc\r\n0\r\n\r\n",
            b"3\rabc",
            b"3\r\nabcdef\r\n0\r\n\r\n",
            b"3\r\nabc\n0\r\n\r\n",
            b"3;\x01\r\nabc\r\n0\r\n\r\n",
            b"0\r\nno colon\r\n\r\n",
            b"0\r\nBad Name: 1\r\n\r\n",
            b"0\r\n: empty\r\n\r\n",
            b"0\r\nA: 1\r\n folded\r\n\r\n",
            b"0\r\nA: caf\xe9\r\n\r\n",
            b"0\r\n\n",
        ];
        for body in cases {
            assert!(
                verdict(body).is_err(),
                "{:?} was accepted",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn a_body_in_pieces_is_still_pending() {
        let mut c = Chunked::new();
        assert_eq!(c.feed(b"1"), Ok(1));
        assert_eq!(c.feed(b"0\r"), Ok(2));
        assert_eq!(c.feed(b"\n0123456789abcdef"), Ok(17));
        assert!(!c.is_done());
        assert_eq!(c.feed(b"\r\n0\r\n\r\nnext"), Ok(7));
        assert!(c.is_done());
    }

    #[test]
    fn framing_lines_are_bounded() {
        let mut long = b"1;".to_vec();
        long.extend(std::iter::repeat_n(b'x', MAX_SIZE_LINE));
        assert!(Chunked::new().feed(&long).is_err());
        let mut trailers = b"0\r\n".to_vec();
        for i in 0..2000 {
            trailers.extend_from_slice(format!("X-T{i}: 1234567\r\n").as_bytes());
        }
        assert!(Chunked::new().feed(&trailers).is_err());
    }
}
