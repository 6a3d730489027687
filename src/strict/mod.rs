//! The strict HTTP/1.1 request grammar (SPEC §4, "Strictness"), pure: what
//! RFC 9112 says a server must reject, judged on the bytes as they arrived,
//! before any parser that forgives (pingora's, httparse's) sees them.
//!
//! - [`check`]: a request head → how its body is framed, or why it is refused.
//! - [`chunked`]: the chunked framing of a body, byte by byte.
//!
//! Both are stricter than httparse and pingora on every point where those
//! forgive (a unit test holds `check` to that), so a head passed here is one
//! pingora parses without answering by itself.

pub mod chunked;
pub mod fields;

/// Why a head is refused: the status and a detail that names the rule and
/// never echoes the request's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadHead {
    /// 400: the head breaks RFC 9112's grammar or its framing rules.
    BadRequest(&'static str),
    /// 501: a transfer coding or a method idemgate does not implement
    /// (RFC 9112 §6.1, RFC 9110 §15.6.2).
    NotImplemented(&'static str),
    /// 431: more header fields than [`MAX_FIELDS`].
    TooManyFields,
}

/// How the body of an accepted request is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// No `Content-Length` and no `Transfer-Encoding`: no body.
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// What an accepted head says about what follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    pub body: Body,
    /// The head has an `Expect` field (its sender may wait before the body).
    pub expect: bool,
}

/// Most header fields in a head: pingora's own limit (it answers by itself
/// past it).
pub const MAX_FIELDS: usize = 256;

/// Longest `Content-Length` value: 18 digits always fit a u64.
const MAX_LENGTH_DIGITS: usize = 18;

/// `tchar` of RFC 9110 §5.6.2: the bytes of a token (method, field name,
/// transfer coding).
pub fn is_tchar(b: u8) -> bool {
    TCHAR[usize::from(b)]
}

/// A table of 256 entries, true for the alphanumerics and `extra`: a head
/// is checked a byte at a time, and a lookup is cheaper than a search.
const fn table(extra: &[u8]) -> [bool; 256] {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = (b as u8).is_ascii_alphanumeric();
        b += 1;
    }
    let mut i = 0;
    while i < extra.len() {
        t[extra[i] as usize] = true;
        i += 1;
    }
    t
}

const TCHAR: [bool; 256] = table(b"!#$%&'*+-.^_`|~");
const TARGET: [bool; 256] = table(b"-._~!$&'()*+,;=:@/?%[]");

/// A byte allowed in a request-target: RFC 3986's unreserved, sub-delims,
/// `:`, `@`, `/`, `?`, `%` (in the query, checked for two hex digits), and
/// `[` `]` of an IP literal in an absolute-form authority. No space, no
/// control byte, no `#`, nothing outside ASCII. (A `\` in the path is let
/// through for the path's own check.)
fn is_target_byte(b: u8) -> bool {
    TARGET[usize::from(b)]
}

/// A byte of a field value: VCHAR, SP, HTAB, or obs-text (bytes ≥ 0x80,
/// which the proxy refuses after routing: a route's event-ID header judges
/// its own).
fn is_value_byte(b: u8) -> bool {
    VALUE[usize::from(b)]
}

/// [`is_value_byte`] as a table (a value is checked a byte at a time).
const VALUE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = b == 0x09 || (b >= 0x20 && b != 0x7f);
        b += 1;
    }
    t
};

/// A byte of a `Host` value: a request-target byte but `@`, `/` and `?`
/// (an authority has no userinfo, path or query).
const HOST: [bool; 256] = {
    let mut t = TARGET;
    t[b'@' as usize] = false;
    t[b'/' as usize] = false;
    t[b'?' as usize] = false;
    t
};

/// `s` without the optional whitespace (SP, HTAB) around it: not
/// `trim_ascii`, which also takes form feeds and would let one through.
fn trim_ows(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(start, |i| i + 1);
    &s[start..end]
}

/// Checks a request head: `head` runs from the first byte received to the
/// end of the empty line that closes it. Lines end in CRLF or in a bare LF
/// (RFC 9112 §2.2 lets a recipient accept it); empty lines before the
/// request line are skipped (§2.2).
pub fn check(head: &[u8]) -> Result<Framing, BadHead> {
    let mut lines = Lines { rest: head };
    let first = loop {
        match lines.next()? {
            Some([]) => continue,
            Some(line) => break line,
            None => return Err(BadHead::BadRequest("the head has no request line")),
        }
    };
    let line = request_line(first)?;
    let mut fields = Fields::default();
    // the common line, read in one walk; the first it cannot take whole
    // (the empty line that ends the head, or one the rules below refuse)
    // and every line after it go through the full rules
    while let Some((name, value, rest)) = plain_field(lines.rest) {
        fields.count += 1;
        if fields.count > MAX_FIELDS {
            return Err(BadHead::TooManyFields);
        }
        fields.field(name, value)?;
        lines.rest = rest;
    }
    loop {
        match lines.next()? {
            Some([]) => return fields.finish(&line),
            Some(l) => fields.add(l)?,
            None => {
                return Err(BadHead::BadRequest(
                    "the head does not end in an empty line",
                ))
            }
        }
    }
}

/// A field line as nearly every sender writes it, `token: value` with no
/// control byte and ended by CRLF or LF: its name, its value without the
/// whitespace around it, and the bytes after its end. `None` for anything
/// else. Each byte is looked at once: the name's up to the colon, the
/// value's up to the line's end (neither table admits CR or LF), what
/// [`Lines`], [`Fields::add`] and [`trim_ows`] do in three walks. A line
/// taken here is one `add` takes with the same name and value.
fn plain_field(buf: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let colon = token_len(buf);
    if colon == 0 || buf.get(colon) != Some(&b':') {
        return None;
    }
    let after_colon = &buf[colon + 1..];
    let start = after_colon.iter().position(|&b| b != b' ' && b != b'\t')?;
    let value_and_rest = &after_colon[start..];
    let end = value_len(value_and_rest);
    let rest = match value_and_rest[end..] {
        [b'\r', b'\n', ..] => &value_and_rest[end + 2..],
        [b'\n', ..] => &value_and_rest[end + 1..],
        _ => return None,
    };
    let value = &value_and_rest[..end];
    let trimmed = value
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(0, |i| i + 1);
    Some((&buf[..colon], &value[..trimmed], rest))
}

/// How many bytes `s` starts with that `byte_ok` takes: eight at a time
/// while `all_ok` takes the eight (a test without a branch per byte), then
/// byte by byte from the first eight it does not.
#[inline(always)]
fn leading(s: &[u8], all_ok: impl Fn(&[u8; 8]) -> bool, byte_ok: impl Fn(u8) -> bool) -> usize {
    let mut at = 0;
    for w in s.chunks_exact(8) {
        if !all_ok(w.try_into().expect("eight bytes")) {
            break;
        }
        at += 8;
    }
    at + s[at..]
        .iter()
        .position(|&b| !byte_ok(b))
        .unwrap_or(s.len() - at)
}

/// How many bytes `s` starts with that a token may hold ([`is_tchar`]),
/// by eight table lookups at a time (a field name is most often 4 to 16
/// bytes).
fn token_len(s: &[u8]) -> usize {
    leading(
        s,
        |w| w.iter().fold(true, |all, &b| all & is_tchar(b)),
        is_tchar,
    )
}

/// How many bytes `s` starts with that a field value may hold
/// ([`is_value_byte`]), by two word tests per eight: no byte below 0x20
/// and none equal to 0x7F (eight with a tab, which is allowed, or a CR,
/// where a value ends, are looked at byte by byte).
fn value_len(s: &[u8]) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    const SPACE: u64 = u64::from_ne_bytes([0x20; 8]);
    const DEL: u64 = u64::from_ne_bytes([0x7f; 8]);
    let all_ok = |w: &[u8; 8]| {
        let w = u64::from_ne_bytes(*w);
        // a byte below 0x20 (of those without the high bit: obs-text is
        // allowed), and a byte equal to 0x7F (one that xor makes zero)
        let low = w.wrapping_sub(SPACE) & !w & HIGH;
        let del = (w ^ DEL).wrapping_sub(ONES) & !(w ^ DEL) & HIGH;
        low | del == 0
    };
    leading(s, all_ok, is_value_byte)
}

/// The head's lines, each without its terminator.
struct Lines<'a> {
    rest: &'a [u8],
}

impl<'a> Lines<'a> {
    fn next(&mut self) -> Result<Option<&'a [u8]>, BadHead> {
        // the first CR or LF, in one vectorised search: a CR ends the
        // line only as the first byte of CRLF
        let Some(end) = memchr::memchr2(b'\r', b'\n', self.rest) else {
            return Ok(None);
        };
        let line = &self.rest[..end];
        let after = match self.rest[end..] {
            [b'\n', ..] => end + 1,
            [b'\r', b'\n', ..] => end + 2,
            [b'\r'] => return Ok(None), // its LF has not come yet
            _ => return Err(BadHead::BadRequest("a bare CR in the head")),
        };
        self.rest = &self.rest[after..];
        Ok(Some(line))
    }
}

/// What the request line says.
struct RequestLine<'a> {
    http11: bool,
    /// The authority of an absolute-form target.
    authority: Option<&'a [u8]>,
}

/// `method SP request-target SP HTTP-version`, one space each.
fn request_line(line: &[u8]) -> Result<RequestLine<'_>, BadHead> {
    let bad = BadHead::BadRequest;
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad(
            "the request line is not three parts parted by one space each",
        ));
    };
    if method.is_empty() || !method.iter().all(|&b| is_tchar(b)) {
        return Err(bad("the method is not a token"));
    }
    let http11 = match version {
        b"HTTP/1.1" => true,
        b"HTTP/1.0" => false,
        _ => return Err(bad("the HTTP version is neither HTTP/1.1 nor HTTP/1.0")),
    };
    if method == b"CONNECT" {
        return Err(BadHead::NotImplemented("CONNECT is not supported"));
    }
    let authority = target_authority(method, target)?;
    Ok(RequestLine { http11, authority })
}

/// Checks a request-target; the authority of an absolute-form one.
fn target_authority<'a>(method: &[u8], target: &'a [u8]) -> Result<Option<&'a [u8]>, BadHead> {
    let bad = BadHead::BadRequest;
    // the path's own faults (a literal `\`, a malformed escape) are its
    // normal form's to judge: 400 `invalid-path` (SPEC §4, "Paths")
    let (path, query) = match target.iter().position(|&b| b == b'?') {
        Some(q) => target.split_at(q),
        None => (target, &b""[..]),
    };
    if target.is_empty()
        || !path.iter().all(|&b| is_target_byte(b) || b == b'\\')
        || !query.iter().all(|&b| is_target_byte(b))
    {
        return Err(bad("the request target holds a byte a URI may not"));
    }
    let mut pct = query.split(|&b| b == b'%').skip(1);
    if pct.any(|after| after.len() < 2 || !after[..2].iter().all(u8::is_ascii_hexdigit)) {
        return Err(bad("a % in the query is not followed by two hex digits"));
    }
    if target == b"*" {
        return match method {
            b"OPTIONS" => Ok(None),
            _ => Err(bad("the asterisk-form is for OPTIONS only")),
        };
    }
    if target.starts_with(b"/") {
        return Ok(None);
    }
    let scheme_end = target.iter().position(|&b| b == b':').unwrap_or(0);
    let scheme = &target[..scheme_end];
    if !(scheme.eq_ignore_ascii_case(b"http") || scheme.eq_ignore_ascii_case(b"https"))
        || !target[scheme_end..].starts_with(b"://")
    {
        return Err(bad(
            "the request target is neither a path nor an http(s) URI",
        ));
    }
    let rest = &target[scheme_end + 3..];
    let end = rest
        .iter()
        .position(|&b| b == b'/' || b == b'?')
        .unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.is_empty() || authority.contains(&b'@') {
        return Err(bad(
            "the request target's authority is empty or has userinfo",
        ));
    }
    Ok(Some(authority))
}

/// The header fields seen so far, as far as framing and routing need them.
#[derive(Default)]
struct Fields<'a> {
    count: usize,
    hosts: usize,
    host: &'a [u8],
    length: Option<&'a [u8]>,
    /// `Transfer-Encoding` seen, its codings so far and the last one.
    te: bool,
    chunked: usize,
    unknown_coding: bool,
    last_coding: &'a [u8],
    expect: bool,
}

impl<'a> Fields<'a> {
    fn add(&mut self, line: &'a [u8]) -> Result<(), BadHead> {
        let bad = BadHead::BadRequest;
        self.count += 1;
        if self.count > MAX_FIELDS {
            return Err(BadHead::TooManyFields);
        }
        if matches!(line.first(), Some(b' ' | b'\t')) {
            return Err(bad("a folded header line (obs-fold)"));
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err(bad("a header line without a colon"));
        };
        let name = &line[..colon];
        if matches!(name.last(), Some(b' ' | b'\t')) {
            return Err(bad("whitespace between a header name and its colon"));
        }
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err(bad("a header name that is not a token"));
        }
        let value = trim_ows(&line[colon + 1..]);
        if !value.iter().all(|&b| is_value_byte(b)) {
            return Err(bad("a control byte in a header value"));
        }
        self.field(name, value)
    }

    /// The fields that frame the request or name its host.
    fn field(&mut self, name: &[u8], value: &'a [u8]) -> Result<(), BadHead> {
        let bad = BadHead::BadRequest;
        // by length and first letter: most fields are none of the four
        // (`name` is a token, never empty)
        match (name.len(), name[0].to_ascii_lowercase()) {
            (4, b'h') if name.eq_ignore_ascii_case(b"host") => {
                self.hosts += 1;
                self.host = value;
                if !value.iter().all(|&b| HOST[usize::from(b)]) {
                    return Err(bad("the Host is not an authority"));
                }
            }
            (14, b'c') if name.eq_ignore_ascii_case(b"content-length") => {
                if value.is_empty()
                    || value.len() > MAX_LENGTH_DIGITS
                    || !value.iter().all(u8::is_ascii_digit)
                {
                    return Err(bad("a Content-Length that is not one decimal number"));
                }
                if self.length.is_some_and(|seen| seen != value) {
                    return Err(bad("several different Content-Length values"));
                }
                self.length = Some(value);
            }
            (17, b't') if name.eq_ignore_ascii_case(b"transfer-encoding") => {
                self.te = true;
                for coding in value.split(|&b| b == b',') {
                    self.coding(trim_ows(coding))?;
                }
            }
            (6, b'e') if name.eq_ignore_ascii_case(b"expect") => self.expect = true,
            _ => {}
        }
        Ok(())
    }

    fn coding(&mut self, coding: &'a [u8]) -> Result<(), BadHead> {
        let name_end = coding
            .iter()
            .position(|&b| !is_tchar(b))
            .unwrap_or(coding.len());
        let name = &coding[..name_end];
        if name.is_empty() {
            return Err(BadHead::BadRequest("an empty or malformed transfer coding"));
        }
        if name.eq_ignore_ascii_case(b"chunked") {
            if name_end != coding.len() {
                return Err(BadHead::BadRequest("chunked with parameters"));
            }
            self.chunked += 1;
        } else {
            self.unknown_coding = true;
        }
        self.last_coding = name;
        Ok(())
    }

    /// The rules across fields, and the body's framing.
    fn finish(self, line: &RequestLine) -> Result<Framing, BadHead> {
        let bad = BadHead::BadRequest;
        if self.hosts > 1 {
            return Err(bad("several Host fields"));
        }
        if line.http11 && self.hosts == 0 {
            return Err(bad("an HTTP/1.1 request without Host"));
        }
        if let Some(authority) = line.authority {
            if self.hosts == 1 && self.host != authority {
                return Err(bad("the Host differs from the request target's authority"));
            }
        }
        let body = match (self.te, self.length) {
            (true, Some(_)) => return Err(bad("both Content-Length and Transfer-Encoding")),
            (true, None) => {
                if !line.http11 {
                    return Err(bad("Transfer-Encoding in an HTTP/1.0 request"));
                }
                if !self.last_coding.eq_ignore_ascii_case(b"chunked") {
                    return Err(bad("chunked is not the final transfer coding"));
                }
                if self.chunked > 1 {
                    return Err(bad("chunked applied more than once"));
                }
                if self.unknown_coding {
                    return Err(BadHead::NotImplemented(
                        "a transfer coding other than chunked",
                    ));
                }
                Body::Chunked
            }
            // at most 18 digits, checked in `field`: no overflow
            (false, Some(len)) => {
                Body::Length(len.iter().fold(0, |n, &d| n * 10 + u64::from(d - b'0')))
            }
            (false, None) => Body::None,
        };
        Ok(Framing {
            body,
            expect: self.expect,
        })
    }
}

#[cfg(test)]
mod tests;
