use super::*;

fn head(lines: &[&[u8]]) -> Vec<u8> {
    let mut h = Vec::new();
    for l in lines {
        h.extend_from_slice(l);
        h.extend_from_slice(b"\r\n");
    }
    h.extend_from_slice(b"\r\n");
    h
}

fn post(extra: &[&[u8]]) -> Vec<u8> {
    let mut lines: Vec<&[u8]> = vec![b"POST /h?a=1 HTTP/1.1", b"Host: localhost:8080"];
    lines.extend_from_slice(extra);
    head(&lines)
}

#[test]
fn ordinary_heads_pass_with_their_framing() {
    let ok = |h: &[u8]| check(h).unwrap_or_else(|r| panic!("{r:?}: {}", h.escape_ascii()));
    assert_eq!(ok(&post(&[])).body, Body::None);
    assert_eq!(
        ok(&post(&[b"Content-Length: 12", b"X-Event-ID: e1"])).body,
        Body::Length(12)
    );
    assert_eq!(
        ok(&post(&[b"Content-Length: 12", b"content-length:12"])).body,
        Body::Length(12),
        "the same length twice"
    );
    assert_eq!(
        ok(&post(&[b"Transfer-Encoding:  Chunked "])).body,
        Body::Chunked
    );
    let expect = ok(&post(&[b"Content-Length: 3", b"Expect: 100-continue"]));
    assert!(expect.expect);
    // obs-text in a value is judged after routing, not here
    ok(&post(&[b"X-Note: caf\xe9"]));
    // an underscore is a tchar: such a field is dropped later, not refused
    ok(&post(&[b"X_Forwarded: 1"]));
    ok(b"GET / HTTP/1.0\r\n\r\n");
    ok(b"\r\n\nGET / HTTP/1.1\nHost: a\n\n");
    ok(b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n");
    ok(b"GET http://a:1/x?y HTTP/1.1\r\nHost: a:1\r\n\r\n");
    ok(b"GET /%2e%41?q=%7e HTTP/1.1\r\nHost: [::1]:80\r\n\r\n");
    ok(b"GET / HTTP/1.1\r\nHost:\r\n\r\n");
    // the path's faults are the path's (400 invalid-path, after routing)
    ok(b"GET /a\\b/%zz/%4 HTTP/1.1\r\nHost: a\r\n\r\n");
}

// long: one table, a line per case
#[test]
fn what_rfc_9112_refuses_is_400() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("no Host", b"GET / HTTP/1.1\r\n\r\n".to_vec()),
        ("two Hosts", post(&[b"Host: b"])),
        ("same Host twice", post(&[b"Host: localhost:8080"])),
        (
            "Host with userinfo",
            head(&[b"GET / HTTP/1.1", b"Host: u@a"]),
        ),
        ("Host with a path", head(&[b"GET / HTTP/1.1", b"Host: a/b"])),
        (
            "Host with a space",
            head(&[b"GET / HTTP/1.1", b"Host: a b"]),
        ),
        ("two spaces", b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n".to_vec()),
        (
            "space in target",
            b"GET /g/ HGET / HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        ),
        (
            "tab separator",
            b"GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        ),
        (
            "trailing space",
            b"GET / HTTP/1.1 \r\nHost: a\r\n\r\n".to_vec(),
        ),
        (
            "NUL in target",
            b"GET /\0 HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        ),
        (
            "obs-text in target",
            b"GET /\xe9 HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        ),
        ("fragment", b"GET /#x HTTP/1.1\r\nHost: a\r\n\r\n".to_vec()),
        (
            "backslash in the query",
            b"GET /?a\\b HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        ),
        (
            "bad percent",
            b"GET /?q=%zz HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        ),
        (
            "short percent",
            b"GET /?% HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        ),
        (
            "relative target",
            b"GET x HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        ),
        (
            "other scheme",
            b"GET ftp://a/ HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        ),
        (
            "authority differs",
            b"GET http://b/ HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        ),
        (
            "asterisk GET",
            b"GET * HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        ),
        ("HTTP/2.0", b"GET / HTTP/2.0\r\nHost: a\r\n\r\n".to_vec()),
        (
            "lower-case version",
            b"GET / http/1.1\r\nHost: a\r\n\r\n".to_vec(),
        ),
        (
            "method not a token",
            b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
        ),
        ("bare CR in a value", post(&[b"X-A: 1\r2"])),
        ("bare CR line", b"GET / HTTP/1.1\rHost: a\r\n\r\n".to_vec()),
        ("NUL in a value", post(&[b"X-A: 1\x002"])),
        ("DEL in a value", post(&[b"X-A: 1\x7f"])),
        ("control byte in a value", post(&[b"X-A: \x01"])),
        ("NUL in a name", post(&[b"X-\0A: 1"])),
        ("non-tchar name", post(&[b"X-\xffA: 1"])),
        ("name with a slash", post(&[b"X/A: 1"])),
        ("empty name", post(&[b": 1"])),
        ("no colon", post(&[b"X-A 1"])),
        ("obs-fold", post(&[b"X-A: 1", b" 2"])),
        ("obs-fold by tab", post(&[b"X-A: 1", b"\t2"])),
        ("space before colon", post(&[b"Content-Length : 3"])),
        ("tab before colon", post(&[b"X-A\t: 3"])),
        ("CL not a number", post(&[b"Content-Length: 3a"])),
        ("CL signed", post(&[b"Content-Length: +3"])),
        ("CL list", post(&[b"Content-Length: 3, 3"])),
        ("CL empty", post(&[b"Content-Length:"])),
        ("CL huge", post(&[b"Content-Length: 99999999999999999999"])),
        (
            "CL differ",
            post(&[b"Content-Length: 3", b"Content-Length: 4"]),
        ),
        (
            "CL and TE",
            post(&[b"Content-Length: 3", b"Transfer-Encoding: chunked"]),
        ),
        (
            "TE and CL",
            post(&[b"Transfer-Encoding: chunked", b"Content-Length: 3"]),
        ),
        (
            "TE chunked twice",
            post(&[b"Transfer-Encoding: chunked, chunked"]),
        ),
        (
            "TE repeated",
            post(&[b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"]),
        ),
        ("TE not last", post(&[b"Transfer-Encoding: chunked, gzip"])),
        ("TE gzip alone", post(&[b"Transfer-Encoding: gzip"])),
        ("TE empty element", post(&[b"Transfer-Encoding: ,chunked"])),
        ("TE empty", post(&[b"Transfer-Encoding:"])),
        ("TE params", post(&[b"Transfer-Encoding: chunked;x=1"])),
        ("TE obs-text", post(&[b"Transfer-Encoding: chunked\xff"])),
        (
            "TE vertical tab",
            post(&[b"Transfer-Encoding: \x0bchunked"]),
        ),
        (
            "TE in HTTP/1.0",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec(),
        ),
        ("no request line", b"\r\n\r\n".to_vec()),
    ];
    for (what, h) in cases {
        match check(&h) {
            Err(BadHead::BadRequest(_)) => {}
            other => panic!("{what}: {other:?} for {}", h.escape_ascii()),
        }
    }
}

#[test]
fn unknown_codings_and_connect_are_501_and_many_fields_431() {
    for te in [
        &b"gzip, chunked"[..],
        b"x-custom ,chunked",
        b"identity, chunked",
    ] {
        let mut field = b"Transfer-Encoding: ".to_vec();
        field.extend_from_slice(te);
        assert!(
            matches!(check(&post(&[&field])), Err(BadHead::NotImplemented(_))),
            "{}",
            te.escape_ascii()
        );
    }
    let connect = b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n";
    assert!(matches!(check(connect), Err(BadHead::NotImplemented(_))));
    let fields: Vec<Vec<u8>> = (0..MAX_FIELDS)
        .map(|i| format!("X-{i}: 1").into_bytes())
        .collect();
    let refs: Vec<&[u8]> = fields.iter().map(Vec::as_slice).collect();
    assert_eq!(check(&post(&refs)), Err(BadHead::TooManyFields));
    assert!(check(&post(&refs[1..])).is_ok(), "Host and 255 more");
}

/// What pingora does with a head, as far as it could answer by itself:
/// httparse's parse (pingora's parser), then its request header.
/// `None` when httparse finds the head incomplete (the listener would read on).
fn pingora_accepts(h: &[u8]) -> Option<bool> {
    let mut fields = [httparse::EMPTY_HEADER; 300];
    let mut req = httparse::Request::new(&mut fields);
    match req.parse(h) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return None,
        Err(_) => return Some(false),
    }
    let (Some(method), Some(path)) = (req.method, req.path) else {
        return Some(false);
    };
    Some(pingora::http::RequestHeader::build(method, path.as_bytes(), None).is_ok())
}

/// Where the listener finds a head's end (as `listener::head::head_end`):
/// past the first empty line after the request line.
fn head_end(buf: &[u8]) -> Option<usize> {
    let mut start = 0;
    while buf[start..].starts_with(b"\r\n") || buf[start..].starts_with(b"\n") {
        start += if buf[start] == b'\r' { 2 } else { 1 };
    }
    (start..buf.len()).find_map(|i| {
        let rest = &buf[i..];
        if rest.starts_with(b"\n\n") {
            Some(i + 2)
        } else if rest.starts_with(b"\n\r\n") {
            Some(i + 3)
        } else {
            None
        }
    })
}

/// Every byte at every place of a few heads: whatever passes here, pingora
/// parses too (it never answers with its own 400 after this check).
#[test]
fn never_more_lenient_than_pingora() {
    let bases: [&[u8]; 4] = [
        b"POST /h?a=1 HTTP/1.1\r\nHost: a:1\r\nContent-Length: 2\r\nX-Event-ID: e\r\n\r\n",
        b"GET http://a/x HTTP/1.1\r\nHost: a\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET / HTTP/1.0\r\n\r\n",
    ];
    let mut passed = 0;
    for base in bases {
        assert!(check(base).is_ok() && pingora_accepts(base) == Some(true));
        for at in 0..base.len() {
            for b in 0..=255u8 {
                for replace in [false, true] {
                    let mut h = base.to_vec();
                    if replace {
                        h[at] = b;
                    } else {
                        h.insert(at, b);
                    }
                    let Some(end) = head_end(&h) else { continue };
                    let h = &h[..end];
                    if check(h).is_ok() {
                        passed += 1;
                        assert_eq!(pingora_accepts(h), Some(true), "{}", h.escape_ascii());
                    }
                }
            }
        }
    }
    assert!(passed > 1000, "only {passed} mutants passed");
}

/// What the full rules make of the first line of `buf`: its name and
/// value as [`Fields::add`] splits them, and the bytes after the line;
/// `None` where they refuse it or it is not there.
fn by_the_full_rules(buf: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let mut lines = Lines { rest: buf };
    let line = lines.next().ok()??;
    let mut fields = Fields::default();
    fields.add(line).ok()?;
    let colon = line.iter().position(|&b| b == b':')?;
    Some((&line[..colon], trim_ows(&line[colon + 1..]), lines.rest))
}

proptest::proptest! {
    /// The one-walk reader takes a line only as the full rules do: the
    /// same name, value and end. (The bytes are drawn from those the rules
    /// turn on, so most lines are near a boundary.)
    #[test]
    fn a_plain_field_is_read_as_the_full_rules_read_it(
        buf in proptest::collection::vec(
            proptest::sample::select(b"aZ-_:; \t\r\n\x00\x7f\x80\xff,@/".to_vec()),
            0..24,
        )
    ) {
        if let Some(quick) = plain_field(&buf) {
            proptest::prop_assert_eq!(Some(quick), by_the_full_rules(&buf));
        }
    }
}

proptest::proptest! {
    /// The eight-at-a-time token walk stops where the byte-by-byte one does.
    #[test]
    fn token_len_is_the_bytewise_walk(s in proptest::collection::vec(
        proptest::prop_oneof![
            proptest::num::u8::ANY,
            proptest::sample::select(b"aZ09-_~!:; \t(".to_vec()),
        ],
        0..40,
    )) {
        let bytewise = s.iter().position(|&b| !is_tchar(b)).unwrap_or(s.len());
        proptest::prop_assert_eq!(token_len(&s), bytewise);
    }

    /// The eight-at-a-time walk stops where the byte-by-byte one does.
    #[test]
    fn value_len_is_the_bytewise_walk(s in proptest::collection::vec(
        proptest::prop_oneof![
            proptest::num::u8::ANY,
            proptest::sample::select(b"\t\r\n \x1f\x7f\x80a".to_vec()),
            proptest::sample::select(b"abcdefgh:; ".to_vec()),
        ],
        0..40,
    )) {
        let bytewise = s.iter().position(|&b| !is_value_byte(b)).unwrap_or(s.len());
        proptest::prop_assert_eq!(value_len(&s), bytewise);
    }
}

#[test]
fn plain_fields_and_those_left_to_the_full_rules() {
    let taken: &[(&[u8], &[u8], &[u8])] = &[
        (b"Host: a\r\nX", b"a", b"X"),
        (b"Host:a \t \nX", b"a", b"X"),
        (b"X-E:\r\n\r\n", b"", b"\r\n"),
        (b"X: a  b\r\n", b"a  b", b""),
        (b"X: caf\xc3\xa9\r\n", b"caf\xc3\xa9", b""),
    ];
    for (buf, value, rest) in taken {
        let (_, v, r) = plain_field(buf).unwrap();
        assert_eq!((v, r), (*value, *rest), "{}", buf.escape_ascii());
    }
    let left: &[&[u8]] = &[
        b"\r\n",
        b" X: a\r\n",
        b"X : a\r\n",
        b"X a\r\n",
        b": a\r\n",
        b"X: a\rb\r\n",
        b"X: a\x00\r\n",
        b"X: a\x7f\r\n",
        b"X: a\r",
        b"X: a",
        b"X:   ",
    ];
    for buf in left {
        assert_eq!(plain_field(buf), None, "{}", buf.escape_ascii());
    }
}
