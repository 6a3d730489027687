//! Request paths as routes see them: RFC 3986 §6.2.2 normalisation, so that
//! every spelling of a path that a consumer's framework would decode to the
//! same handler matches the same route — and the forwarded request carries
//! that one spelling (SPEC §4, "Paths").
//!
//! [`normalise`] decodes percent-encoded unreserved characters (`%73` → `s`),
//! writes the other escapes' hex digits in upper case, merges repeated
//! slashes and removes `.` and `..` segments (after decoding, so `%2e%2e` is
//! `..`). It refuses, as `invalid-path`, what no single reading exists for:
//! an encoded `/`, `\` or NUL (`%2F`, `%5C`, `%00`), a literal `\`, a `..`
//! that climbs above the root, a malformed escape (`%`, `%4`, `%zz`), a path
//! parameter (`;`: Tomcat and Spring drop `;…` from each segment before
//! routing, so `/hooks;x/stripe` would reach a handler no route matched),
//! and bytes outside visible ASCII. The config's `path_prefix` must already
//! be in this form (checked at load).
//!
//! The common path needs nothing done: one pass over the bytes finds that
//! and returns it borrowed.

use std::borrow::Cow;
use std::fmt;

/// Why a path has no normal form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// Not an absolute path (`*`, or an empty target).
    NotAbsolute,
    /// `%2F` or `%5C` (either case): a separator hidden from the router.
    EncodedSeparator,
    /// `%00`.
    EncodedNul,
    /// A literal `\`, which some servers take for `/`.
    Backslash,
    /// `%` not followed by two hex digits.
    MalformedEscape,
    /// `;`, a path parameter some frameworks strip before routing.
    PathParameter,
    /// A `..` segment with nothing left to remove.
    AboveRoot,
    /// A control character, a space, DEL or a byte past ASCII.
    InvalidByte,
    /// The normal form, with the query, does not parse as a request target.
    NotAUri,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            PathError::NotAbsolute => "the request target is not an absolute path",
            PathError::EncodedSeparator => "the path holds an encoded `/` or `\\` (%2F, %5C)",
            PathError::EncodedNul => "the path holds an encoded NUL (%00)",
            PathError::Backslash => "the path holds a `\\`",
            PathError::MalformedEscape => {
                "the path holds a `%` that is not followed by two hex digits"
            }
            PathError::PathParameter => "the path holds a `;` (path parameters are not accepted)",
            PathError::AboveRoot => "the path climbs above the root with `..`",
            PathError::InvalidByte => {
                "the path holds a byte that is not visible ASCII (encode it as %XX)"
            }
            PathError::NotAUri => "the path is not a valid URI",
        })
    }
}

impl std::error::Error for PathError {}

/// RFC 3986 unreserved characters: an escape of one is the character itself.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Whether `path` is already normal and valid: escapes only of reserved
/// bytes, in upper case; no `\`, `;` or byte outside visible ASCII; no empty
/// segment except a trailing one, no `.` or `..` segment.
fn already_normal(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') {
        return false;
    }
    let mut segments = path[1..].split(|&b| b == b'/').peekable();
    while let Some(seg) = segments.next() {
        let last = segments.peek().is_none();
        if (seg.is_empty() && !last) || seg == b"." || seg == b".." {
            return false;
        }
        let mut i = 0;
        while i < seg.len() {
            match seg[i] {
                b'%' => {
                    let upper = |b: u8| b.is_ascii_digit() || (b'A'..=b'F').contains(&b);
                    let kept = match (seg.get(i + 1), seg.get(i + 2)) {
                        (Some(&h), Some(&l)) if upper(h) && upper(l) => {
                            let v = hex(h).unwrap_or(0) << 4 | hex(l).unwrap_or(0);
                            !unreserved(v) && !matches!(v, b'/' | b'\\' | 0)
                        }
                        _ => false,
                    };
                    if !kept {
                        return false;
                    }
                    i += 3;
                }
                b'\\' | b';' => return false,
                b if !(0x21..0x7f).contains(&b) => return false,
                _ => i += 1,
            }
        }
    }
    true
}

/// The request target `uri` with its path in normal form, the query kept:
/// `None` when the path is normal already (the common case: a scan, no
/// allocation), or why it has no normal form.
pub fn normal_uri(uri: &http::Uri) -> Result<Option<http::Uri>, PathError> {
    let normal = match normalise(uri.path())? {
        Cow::Borrowed(_) => return Ok(None),
        Cow::Owned(normal) => normal,
    };
    let pq = match uri.query() {
        Some(q) => format!("{normal}?{q}"),
        None => normal,
    };
    pq.parse().map(Some).map_err(|_| PathError::NotAUri)
}

/// The normal form of `path` (a request's path, without the query), or
/// why it has none.
pub fn normalise(path: &str) -> Result<Cow<'_, str>, PathError> {
    let bytes = path.as_bytes();
    if already_normal(bytes) {
        return Ok(Cow::Borrowed(path));
    }
    if bytes.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    // Each segment with its escapes normalised, then the dot segments.
    let mut out: Vec<String> = Vec::new();
    let mut trailing_slash = false;
    for raw in bytes[1..].split(|&b| b == b'/') {
        let seg = segment(raw)?;
        trailing_slash = false;
        match seg.as_str() {
            "" => trailing_slash = true,
            "." => trailing_slash = true,
            ".." => {
                out.pop().ok_or(PathError::AboveRoot)?;
                trailing_slash = true;
            }
            _ => out.push(seg),
        }
    }
    let mut normal = String::with_capacity(path.len());
    for seg in &out {
        normal.push('/');
        normal.push_str(seg);
    }
    if out.is_empty() || trailing_slash {
        normal.push('/');
    }
    Ok(Cow::Owned(normal))
}

/// One segment: unreserved escapes decoded, other escapes in upper case;
/// the refusals of [`PathError`].
fn segment(raw: &[u8]) -> Result<String, PathError> {
    let mut seg = String::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        match b {
            b'%' => {
                let (hi, lo) = match (raw.get(i + 1).copied(), raw.get(i + 2).copied()) {
                    (Some(h), Some(l)) => (h, l),
                    _ => return Err(PathError::MalformedEscape),
                };
                let v = match (hex(hi), hex(lo)) {
                    (Some(h), Some(l)) => h << 4 | l,
                    _ => return Err(PathError::MalformedEscape),
                };
                match v {
                    b'/' | b'\\' => return Err(PathError::EncodedSeparator),
                    0 => return Err(PathError::EncodedNul),
                    v if unreserved(v) => seg.push(v as char),
                    v => {
                        seg.push('%');
                        seg.push(char::from(b"0123456789ABCDEF"[usize::from(v >> 4)]));
                        seg.push(char::from(b"0123456789ABCDEF"[usize::from(v & 15)]));
                    }
                }
                i += 3;
                continue;
            }
            b'\\' => return Err(PathError::Backslash),
            b';' => return Err(PathError::PathParameter),
            b if !(0x21..0x7f).contains(&b) => return Err(PathError::InvalidByte),
            b => seg.push(b as char),
        }
        i += 1;
    }
    Ok(seg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(p: &str) -> Result<String, PathError> {
        normalise(p).map(Cow::into_owned)
    }

    #[test]
    fn normal_paths_are_borrowed_unchanged() {
        for p in [
            "/",
            "/hooks/stripe",
            "/hooks/stripe/",
            "/a/b.c/...",
            "/a%20b%3A",
            "/x",
        ] {
            assert!(
                matches!(normalise(p), Ok(Cow::Borrowed(q)) if q == p),
                "{p}"
            );
        }
    }

    #[test]
    fn the_issue_s_spellings_all_become_one_path() {
        for p in [
            "/hooks/%73tripe",
            "/hooks/%73%74%72%69%70%65",
            "/hooks//stripe",
            "///hooks///stripe",
            "/hooks/./stripe",
            "/hooks/x/../stripe",
            "/hooks/x/%2e%2E/stripe",
            "/./hooks/stripe",
            "/a/../hooks/stripe",
        ] {
            assert_eq!(n(p).as_deref(), Ok("/hooks/stripe"), "{p}");
        }
    }

    #[test]
    fn trailing_slashes_and_dot_segments_follow_rfc_3986() {
        for (p, want) in [
            ("//", "/"),
            ("/.", "/"),
            ("/./", "/"),
            ("/a/..", "/"),
            ("/a/b/.", "/a/b/"),
            ("/a/b/..", "/a/"),
            ("/a/b//", "/a/b/"),
            ("/a/%2e", "/a/"),
            ("/a/.../b", "/a/.../b"),
            ("/a/.b/..c", "/a/.b/..c"),
        ] {
            assert_eq!(n(p).as_deref(), Ok(want), "{p}");
        }
    }

    #[test]
    fn other_escapes_stay_encoded_in_upper_case() {
        assert_eq!(n("/a%20b/%3a%7e").as_deref(), Ok("/a%20b/%3A~"));
        assert_eq!(n("/%25%252F").as_deref(), Ok("/%25%252F"));
        assert_eq!(n("/caf%C3%A9").as_deref(), Ok("/caf%C3%A9"));
    }

    #[test]
    fn refusals() {
        use PathError::*;
        for (p, e) in [
            ("*", NotAbsolute),
            ("", NotAbsolute),
            ("hooks", NotAbsolute),
            ("/hooks%2fstripe", EncodedSeparator),
            ("/hooks%2Fstripe", EncodedSeparator),
            ("/hooks/%5cstripe", EncodedSeparator),
            ("/hooks/%5Cstripe", EncodedSeparator),
            ("/a%00", EncodedNul),
            ("/a\\b", Backslash),
            ("/a%", MalformedEscape),
            ("/a%4", MalformedEscape),
            ("/a%zz", MalformedEscape),
            ("/a%4g", MalformedEscape),
            ("/hooks;x/stripe", PathParameter),
            ("/..", AboveRoot),
            ("/a/../..", AboveRoot),
            ("/a/%2e%2e/%2E%2E/b", AboveRoot),
            ("/a b", InvalidByte),
            ("/a\tb", InvalidByte),
            ("/caf\u{e9}", InvalidByte),
        ] {
            assert_eq!(n(p), Err(e), "{p:?}");
        }
    }

    /// The normal form is a fixed point.
    #[test]
    fn normalising_twice_changes_nothing() {
        for p in ["/a/./b//c/../%64", "/x/%3a/", "//", "/a/b/.."] {
            let once = n(p).unwrap();
            assert_eq!(n(&once).unwrap(), once, "{p}");
            assert!(matches!(normalise(&once), Ok(Cow::Borrowed(_))), "{once}");
        }
    }

    /// The request target keeps its query; a normal one is not rebuilt.
    #[test]
    fn the_uri_is_rebuilt_only_when_its_path_changes() {
        let uri = |s: &str| s.parse::<http::Uri>().unwrap();
        assert_eq!(normal_uri(&uri("/a/b?x=1")), Ok(None));
        let rebuilt = normal_uri(&uri("/a//%62/./c?x=%2F")).unwrap().unwrap();
        assert_eq!(rebuilt, uri("/a/b/c?x=%2F"));
        assert_eq!(normal_uri(&uri("/a/%2F")), Err(PathError::EncodedSeparator));
    }
}
