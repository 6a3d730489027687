//! A request-smuggling corpus (issue 44), written down here: the gadget
//! families of public corpora (defparam/smuggler's `Transfer-Encoding`
//! mutations as CL.TE, TE.CL and TE.TE; http-garden's whitespace, control
//! bytes and line endings around names and values, duplicate and
//! conflicting framing, chunk-size forms, obs-fold), each followed by a
//! second request a lenient hop might find inside the first one's body.
//!
//! For every input, on a fresh connection that the sender half-closes:
//! - each answer is either idemgate's own refusal (problem+json with
//!   `Idempotency-Status`) or the upstream's answer relayed, never one
//!   written by the engine underneath;
//! - the upstream got exactly as many requests as the sender got relayed
//!   answers — no request idemgate did not answer, none hidden in a body;
//! - each forwarded request is one that a strict parser (httparse, and the
//!   rules of RFC 9112 on framing) reads alone: tokens for names, no `_`,
//!   not both `Content-Length` and `Transfer-Encoding`, and the body as
//!   idemgate framed it (`hello` decoded, or the bytes after the head that
//!   its length covers);
//! - after a refusal nothing more reached the upstream.

use crate::common::*;
use crate::raw_upstream::{response, upstream, Behavior};

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const BODY: &[u8] = b"hello";
const CHUNKED: &[u8] = b"5\r\nhello\r\n0\r\n\r\n";
const SMUGGLED: &[u8] = b"GET /pass/smuggled HTTP/1.1\r\nHost: a\r\n\r\n";

/// The corpus: (family, the request bytes before the smuggled one).
// long: the corpus, one family per block
fn corpus() -> Vec<(&'static str, Vec<u8>)> {
    let head = |fields: &[u8]| {
        let mut h = b"POST /pass/t HTTP/1.1\r\nHost: a\r\n".to_vec();
        h.extend_from_slice(fields);
        h.extend_from_slice(b"\r\n");
        h
    };
    let te_names: [&[u8]; 14] = [
        b"Transfer-Encoding",
        b"transfer-encoding",
        b"TRANSFER-ENCODING",
        b"Transfer_Encoding",
        b"Transfer-Encoding ",
        b"Transfer-Encoding\t",
        b" Transfer-Encoding",
        b"\tTransfer-Encoding",
        b"Transfer-Encoding\x00",
        b"Transfer\x0bEncoding",
        b"Transfer-Encoding\r",
        b"Transfer-\xe9ncoding",
        b"X-Pad: 1\r\n Transfer-Encoding",
        b"Transfer-Encoding\n",
    ];
    let te_values: [&[u8]; 24] = [
        b"chunked",
        b" chunked",
        b"chunked ",
        b"\tchunked",
        b"Chunked",
        b"CHUNKED",
        b"chunk",
        b"chunked, identity",
        b"identity, chunked",
        b"gzip, chunked",
        b",chunked",
        b"chunked,",
        b"chunked, chunked",
        b"\"chunked\"",
        b"chunked\x00",
        b"\x0bchunked",
        b"\x0cchunked",
        b"chunked\x0c",
        b"\xffchunked",
        b"chunked;q=1",
        b"cow-chunked",
        b"chunked\r",
        b"",
        b"x\r\n chunked",
    ];
    // how the framing fields are put together around one TE field
    let framings: [(&str, &[u8], &[u8]); 5] = [
        ("TE", b"", b""),
        ("CL.TE", b"Content-Length: 4\r\n", b""),
        ("TE.CL", b"", b"Content-Length: 60\r\n"),
        ("TE.TE identity", b"", b"Transfer-Encoding: identity\r\n"),
        ("TE.TE chunked", b"Transfer-Encoding: chunked\r\n", b""),
    ];
    let mut out = Vec::new();
    for (family, before, after) in framings {
        for name in te_names {
            for value in te_values {
                let mut fields = before.to_vec();
                fields.extend_from_slice(name);
                fields.extend_from_slice(b": ");
                fields.extend_from_slice(value);
                fields.extend_from_slice(b"\r\n");
                fields.extend_from_slice(after);
                let mut bytes = head(&fields);
                bytes.extend_from_slice(CHUNKED);
                out.push((family, bytes));
            }
        }
    }
    let cl_names: [&[u8]; 6] = [
        b"Content-Length",
        b"content-length",
        b"Content_Length",
        b"Content-Length ",
        b" Content-Length",
        b"Content-Length\x00",
    ];
    let cl_values: [&[u8]; 16] = [
        b"5",
        b" 5",
        b"5 ",
        b"+5",
        b"05",
        b"5.0",
        b"0x5",
        b"5,5",
        b"5, 5",
        b"-5",
        b"",
        b"5\x00",
        b"\x0b5",
        b"5 5",
        b"99999999999999999999",
        b"5\r\nContent-Length: 6",
    ];
    for name in cl_names {
        for value in cl_values {
            let mut fields = name.to_vec();
            fields.extend_from_slice(b": ");
            fields.extend_from_slice(value);
            fields.extend_from_slice(b"\r\n");
            let mut bytes = head(&fields);
            bytes.extend_from_slice(BODY);
            out.push(("CL", bytes));
        }
    }
    let chunk_forms: [&[u8]; 20] = [
        CHUNKED,
        b"5;x\r\nhello\r\n0\r\n\r\n",
        b"5 ;x\r\nhello\r\n0\r\n\r\n",
        b"05\r\nhello\r\n0\r\n\r\n",
        b"0x5\r\nhello\r\n0\r\n\r\n",
        b"+5\r\nhello\r\n0\r\n\r\n",
        b" 5\r\nhello\r\n0\r\n\r\n",
        b"5 \r\nhello\r\n0\r\n\r\n",
        b"5\nhello\n0\n\n",
        b"5\rhello\r0\r\r",
        b"\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\r\n\r\n0\r\n\r\n",
        b"5\r\nhello\r\n0\r\nX: y\r\n\r\n",
        b"5\r\nhello\r\n0\r\nbad trailer\r\n\r\n",
        b"5\r\nhello\r\n0\r\n X: y\r\n\r\n",
        b"5\r\nhellohello\r\n0\r\n\r\n",
        b"5\r\nhel\r\n0\r\n\r\n",
        b"ffffffffffffffffff\r\nhello\r\n0\r\n\r\n",
        b"5;x=\"\x01\"\r\nhello\r\n0\r\n\r\n",
        b"5\r\nhello\r\n0\r\n\r",
    ];
    for form in chunk_forms {
        let mut bytes = head(b"Transfer-Encoding: chunked\r\n");
        bytes.extend_from_slice(form);
        out.push(("chunk-size", bytes));
    }
    let line_forms: [&[u8]; 8] = [
        b"POST /pass/t HTTP/1.1\nHost: a\nContent-Length: 5\n\nhello",
        b"POST /pass/t HTTP/1.1\rHost: a\r\nContent-Length: 5\r\n\r\nhello",
        b"POST /pass/t HTTP/1.1\r\nHost: a\r\r\nContent-Length: 5\r\n\r\nhello",
        b"POST /pass/t HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\rhello",
        b"\r\nPOST /pass/t HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
        b"POST /pass/t HTTP/1.1\r\nHost: a\r\nX: 1\r\n\tContent-Length: 5\r\n\r\nhello",
        b"POST /pass/t HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n \r\n\r\nhello",
        b"POST /pass/t  HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
    ];
    for form in line_forms {
        out.push(("line endings", form.to_vec()));
    }
    out
}

/// One answer: status, header fields, body.
type Answer = (u16, Vec<(String, String)>, Vec<u8>);

/// Every answer on a connection until it closes (or `wait` passes).
fn answers(s: &mut TcpStream, wait: Duration) -> Vec<Answer> {
    let deadline = Instant::now() + wait;
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        while let Ok(Some(head)) = kit::http::response_head(&buf) {
            let len = kit::http::find(&head.headers, "content-length")
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() < head.len + len {
                break;
            }
            out.push((
                head.status,
                head.headers,
                buf[head.len..head.len + len].to_vec(),
            ));
            buf.drain(..head.len + len);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return out;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return out,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Why a forwarded request is not one a strict parser reads alone, if so.
/// `sent` is what the sender sent after its first head: the forwarded body
/// is the chunked body decoded, or the bytes the length idemgate read
/// framed (a prefix of `sent`).
fn not_strict(req: &Request, sent: &[u8]) -> Option<String> {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Request::new(&mut fields);
    match parsed.parse(&req.head) {
        Ok(httparse::Status::Complete(n)) if n == req.head.len() => {}
        other => return Some(format!("httparse: {other:?}")),
    }
    let mut cl = 0;
    let mut te = 0;
    for f in parsed.headers.iter() {
        if f.name.contains('_') || f.name.bytes().any(|b| b.is_ascii_whitespace()) {
            return Some(format!("field name {:?}", f.name));
        }
        if f.value
            .iter()
            .any(|&b| (b < 0x20 && b != b'\t') || b >= 0x7f)
        {
            return Some(format!("value of {}", f.name));
        }
        cl += usize::from(f.name.eq_ignore_ascii_case("content-length"));
        te += usize::from(f.name.eq_ignore_ascii_case("transfer-encoding"));
    }
    if cl + te > 1 {
        return Some(format!("{cl} Content-Length and {te} Transfer-Encoding"));
    }
    if req.body != BODY && !sent.starts_with(&req.body) {
        return Some(format!("body {:?}", String::from_utf8_lossy(&req.body)));
    }
    None
}

/// Sends one input with the smuggled request behind it; checks it. How
/// many of its requests were forwarded (the smuggled one counts when it
/// was a request of its own after the first).
fn probe(addr: SocketAddr, raw: &crate::raw_upstream::Server, what: &str, bytes: &[u8]) -> usize {
    let before = raw.received().len();
    let mut s = TcpStream::connect(addr).unwrap();
    let mut all = bytes.to_vec();
    all.extend_from_slice(SMUGGLED);
    let _ = s.write_all(&all);
    let _ = s.shutdown(Shutdown::Write);
    let got = answers(&mut s, Duration::from_secs(5));
    let shown = String::from_utf8_lossy(bytes).escape_debug().to_string();
    assert!(!got.is_empty(), "{what}: no answer to {shown}");
    let mut relayed = 0;
    for (i, (status, headers, body)) in got.iter().enumerate() {
        let find = |n: &str| kit::http::find(headers, n);
        assert!(find("server").is_none(), "{what}: {shown}: {headers:?}");
        let outcome = find("idempotency-status").unwrap_or_default();
        if find("content-type") == Some("application/problem+json") {
            assert!(!outcome.is_empty(), "{what}: {shown}");
            assert!(
                matches!(status, 400 | 408 | 431 | 501),
                "{what}: {status} to {shown}"
            );
            assert_eq!(i, got.len() - 1, "{what}: answers after a refusal: {shown}");
        } else {
            assert_eq!((*status, outcome), (200, "unguarded"), "{what}: {shown}");
            assert!(body.starts_with(b"/pass/"), "{what}: {shown}");
            relayed += 1;
        }
    }
    let forwarded = &raw.received()[before..];
    assert_eq!(
        forwarded.len(),
        relayed,
        "{what}: forwarded {forwarded:?} for {shown}"
    );
    let head_end = [&b"\r\n\r\n"[..], b"\n\n"]
        .iter()
        .filter_map(|end| {
            all.windows(end.len())
                .position(|w| w == *end)
                .map(|i| i + end.len())
        })
        .min()
        .unwrap_or(0);
    for req in forwarded {
        if let Some(why) = not_strict(req, &all[head_end..]) {
            panic!("{what}: forwarded a request a strict parser refuses ({why}) for {shown}");
        }
    }
    relayed
}

#[test]
fn the_smuggling_corpus_is_refused_or_forwarded_as_one_strict_request() {
    let raw = upstream(|req, _| Behavior::Respond(response(200, req.path.as_bytes())));
    let h = Harness::sqlite("smuggling")
        .yaml(&format!(
            "  - name: pass\n    match:\n      path_prefix: /pass\n    upstream: \"{}\"\n    guard_methods: []\n\
             downstream:\n  body_timeout: 2s\n",
            raw.url()
        ))
        .start();
    let corpus = corpus();
    let t = Instant::now();
    let mut forwarded = std::collections::BTreeMap::<usize, usize>::new();
    for (family, bytes) in &corpus {
        *forwarded
            .entry(probe(h.addr, &raw, family, bytes))
            .or_default() += 1;
    }
    eprintln!(
        "{} inputs in {:?}; inputs by requests forwarded: {forwarded:?}",
        corpus.len(),
        t.elapsed()
    );
    // the corpus exercises both ends: most refused outright, some
    // forwarded (with the request behind them, as a pipelined one)
    assert!(forwarded[&0] > corpus.len() / 2, "{forwarded:?}");
    assert!(
        forwarded.get(&2).copied().unwrap_or(0) > 50,
        "{forwarded:?}"
    );
    let text = h.metrics();
    assert!(text.contains("idemgate_requests_total{outcome=\"invalid_request\",route=\"\"}"));
}
