//! The declarative scheme (SPEC §17) and standard-webhooks `v1a` entries:
//! vectors computed independently (Python's `hmac` and `cryptography`), the
//! fixed schemes as instances of the rule, and what a forger can try.

use std::borrow::Cow;

use super::declarative::{decode_hex, parse_message};
use super::*;
use http::HeaderValue;

fn hm(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in pairs {
        h.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    h
}

fn hmac_verifier(rule: Rule, secrets: &[&[u8]]) -> Verifier {
    Verifier {
        rule: Some(Box::new(rule)),
        ..Verifier::new(Scheme::Hmac, secrets.iter().map(|s| s.to_vec()).collect())
    }
}

fn rule(header: &'static str, message: &str) -> Rule {
    Rule {
        algorithm: Algorithm::Sha256,
        encoding: Encoding::Hex,
        header: HeaderName::from_static(header),
        prefix: None,
        signature_param: None,
        timestamp: None,
        message: Cow::Owned(parse_message(message).unwrap()),
    }
}

const BODY: &[u8] = br#"{"event_id":"evt_01h","event_type":"transaction.completed"}"#;
const TS: i64 = 1_700_000_000;
// Python: hmac.new(b"pdl_ntfset_01h_secret", b"1700000000:" + BODY, sha256).hexdigest()
const PADDLE_H1: &str = "f9d3b075f6e0b21ce2157f39a9eaee0b1ae03f81e030c52eb85157fb19c926c4";
// Python: base64(hmac.new(b"tf_secret", BODY, sha256).digest())
const TYPEFORM_SIG: &str = "X/O0BWGdrD+4cLrxTfUa3DQHQEAc8b95RqoRVry6640=";
// Python: hmac.new(b"zm_secret", b"v0:1700000000:" + BODY, sha256).hexdigest()
const ZOOM_SIG: &str = "c40e5b3dfd462ae3c18b16fc8a2616fb966e7916e7e3585add00a50a7963ccaf";
// Python: hmac.new(b"k1", BODY, sha1).hexdigest()
const SHA1_HEX: &str = "f4ce9ef29f7ab3fb7bf4bb0bd8f196bcb2e03a0e";
// Python: base64(hmac.new(b"k512", b"id-1|1700000000|" + BODY, sha512).digest())
const SHA512_B64: &str =
    "CeSZcNBdvVBBfOCtfzpSqM4mDkKjoRLUFPPnqTanWlpgumtbG2rHWhBOPPuDtuRFq8DHryBIIlEJb70WgxVubA==";

#[test]
fn new_presets_match_independent_vectors() {
    let paddle = Verifier::new(Scheme::Paddle, vec![b"pdl_ntfset_01h_secret".to_vec()]);
    let h = hm(&[("Paddle-Signature", &format!("ts={TS};h1={PADDLE_H1}"))]);
    assert_eq!(paddle.verify(&h, BODY, TS), Ok(()));
    assert_eq!(
        sign::paddle(b"pdl_ntfset_01h_secret", TS, BODY),
        format!("ts={TS};h1={PADDLE_H1}")
    );
    assert_eq!(
        paddle.verify(&h, &BODY[1..], TS),
        Err(VerifyError::Mismatch)
    );

    let typeform = Verifier::new(Scheme::Typeform, vec![b"tf_secret".to_vec()]);
    let h = hm(&[("Typeform-Signature", &format!("sha256={TYPEFORM_SIG}"))]);
    assert_eq!(typeform.verify(&h, BODY, 0), Ok(()));
    assert_eq!(
        sign::typeform(b"tf_secret", BODY),
        format!("sha256={TYPEFORM_SIG}")
    );
    let bare = hm(&[("Typeform-Signature", TYPEFORM_SIG)]);
    assert!(matches!(
        typeform.verify(&bare, BODY, 0),
        Err(VerifyError::MalformedHeader { .. })
    ));

    let zoom = Verifier::new(Scheme::Zoom, vec![b"zm_secret".to_vec()]);
    let h = hm(&[
        ("x-zm-signature", &format!("v0={ZOOM_SIG}")),
        ("x-zm-request-timestamp", "1700000000"),
    ]);
    assert_eq!(zoom.verify(&h, BODY, TS), Ok(()));
    assert_eq!(sign::zoom(b"zm_secret", TS, BODY), format!("v0={ZOOM_SIG}"));
    assert_eq!(
        zoom.verify(&h, BODY, TS + 301),
        Err(VerifyError::StaleTimestamp { age_secs: 301 })
    );
}

#[test]
fn paddle_rotation_lists_several_h1_and_any_may_match() {
    let other = sign::paddle(b"old-secret", TS, BODY);
    let old_h1 = other.split("h1=").nth(1).unwrap();
    let ver = Verifier::new(Scheme::Paddle, vec![b"pdl_ntfset_01h_secret".to_vec()]);
    for value in [
        format!("ts={TS};h1={old_h1};h1={PADDLE_H1}"),
        format!("ts={TS};h1={PADDLE_H1};h1={old_h1}"),
        format!("h1={PADDLE_H1}; ts={TS}"),
    ] {
        assert_eq!(
            ver.verify(&hm(&[("Paddle-Signature", &value)]), BODY, TS),
            Ok(()),
            "{value}"
        );
    }
    let forged = format!("ts={TS};h1={old_h1};h1={}", "0".repeat(64));
    assert_eq!(
        ver.verify(&hm(&[("Paddle-Signature", &forged)]), BODY, TS),
        Err(VerifyError::Mismatch)
    );
    for bad in [
        format!("h1={PADDLE_H1}"),                  // no ts
        format!("ts={TS}"),                         // no h1
        format!("ts={TS};ts={TS};h1={PADDLE_H1}"),  // two timestamps
        format!("ts=x;h1={PADDLE_H1}"),             // not seconds
        format!("ts={TS};h1={}", &PADDLE_H1[..62]), // short
        format!("ts={TS};h1"),                      // not k=v
        format!("ts={TS}{}", ";h1=00".repeat(2)),   // undecodable
        format!("ts={TS}{}", format!(";h1={PADDLE_H1}").repeat(MAX_SIGS + 1)),
    ] {
        let r = ver.verify(&hm(&[("Paddle-Signature", &bad)]), BODY, TS);
        assert!(
            matches!(&r, Err(VerifyError::MalformedHeader { header, .. }) if header == "paddle-signature"),
            "{bad}: {r:?}"
        );
    }
}

const MAX_SIGS: usize = declarative::MAX_SIGNATURES;

/// Each fixed scheme and its rule written as a `scheme: hmac` block accept
/// and refuse the same deliveries.
#[test]
fn fixed_schemes_are_instances_of_the_rule() {
    let secret: &[u8] = b"s3cret";
    let cases: [(Scheme, HeaderMap); 7] = [
        (
            Scheme::Github,
            hm(&[("X-Hub-Signature-256", &sign::github(secret, BODY))]),
        ),
        (
            Scheme::Shopify,
            hm(&[("X-Shopify-Hmac-Sha256", &sign::shopify(secret, BODY))]),
        ),
        (
            Scheme::Slack,
            hm(&[
                ("X-Slack-Signature", &sign::slack(secret, TS, BODY)),
                ("X-Slack-Request-Timestamp", "1700000000"),
            ]),
        ),
        (
            Scheme::Stripe,
            hm(&[("Stripe-Signature", &sign::stripe(secret, TS, BODY))]),
        ),
        (
            Scheme::Paddle,
            hm(&[("Paddle-Signature", &sign::paddle(secret, TS, BODY))]),
        ),
        (
            Scheme::Typeform,
            hm(&[("Typeform-Signature", &sign::typeform(secret, BODY))]),
        ),
        (
            Scheme::Zoom,
            hm(&[
                ("x-zm-signature", &sign::zoom(secret, TS, BODY)),
                ("x-zm-request-timestamp", "1700000000"),
            ]),
        ),
    ];
    for (scheme, h) in cases {
        let fixed = Verifier::new(scheme, vec![secret.to_vec()]);
        let declared = hmac_verifier(scheme.fixed_rule().unwrap().clone(), &[secret]);
        for (body, now) in [(BODY, TS), (&BODY[1..], TS), (BODY, TS + 400)] {
            assert_eq!(
                fixed.verify(&h, body, now),
                declared.verify(&h, body, now),
                "{scheme}"
            );
        }
        assert_eq!(declared.verify(&h, BODY, TS), Ok(()), "{scheme}");
    }
}

#[test]
fn declarative_forms() {
    // body signature, sha1 hex
    let r = Rule {
        algorithm: Algorithm::Sha1,
        ..rule("x-sig", "{body}")
    };
    let ver = hmac_verifier(r, &[b"k1"]);
    assert_eq!(ver.verify(&hm(&[("X-Sig", SHA1_HEX)]), BODY, 0), Ok(()));
    assert_eq!(
        ver.verify(&hm(&[("X-Sig", &SHA1_HEX.to_uppercase())]), BODY, 0),
        Ok(())
    );
    // a sha256-length tag is not a sha1 tag
    let long = hm(&[("X-Sig", &"ab".repeat(32))]);
    assert!(matches!(
        ver.verify(&long, BODY, 0),
        Err(VerifyError::MalformedHeader { .. })
    ));

    // timestamped message with {id}, sha512 base64, timestamp header
    let r = Rule {
        algorithm: Algorithm::Sha512,
        encoding: Encoding::Base64,
        timestamp: Some(Timestamp::Header(HeaderName::from_static("x-ts"))),
        ..rule("x-sig", "{id}|{timestamp}|{body}")
    };
    let ver = hmac_verifier(r, &[b"k512"]);
    let h = hm(&[("X-Sig", SHA512_B64), ("X-Ts", "1700000000")]);
    assert_eq!(ver.verify_with_id(&h, BODY, Some("id-1"), TS), Ok(()));
    assert_eq!(
        ver.verify_with_id(&h, BODY, Some("id-2"), TS),
        Err(VerifyError::Mismatch)
    );
    assert_eq!(
        ver.verify_with_id(&h, BODY, None, TS),
        Err(VerifyError::MissingEventId)
    );
    assert_eq!(
        ver.verify_with_id(&h, BODY, Some("id-1"), TS - 301),
        Err(VerifyError::FutureTimestamp { ahead_secs: 301 })
    );
    missing_header(
        ver.verify_with_id(&hm(&[("X-Sig", SHA512_B64)]), BODY, Some("id-1"), TS),
        "x-ts",
    );

    // {header:NAME} and literal braces
    let r = rule("x-sig", "{header:X-Tenant}{{}}{body}");
    let ver = hmac_verifier(r, &[b"k"]);
    let tag = sign::tag(
        Algorithm::Sha256,
        Encoding::Hex,
        b"k",
        &[b"t1", b"{}", BODY],
    );
    let h = hm(&[("X-Sig", &tag), ("X-Tenant", "t1")]);
    assert_eq!(ver.verify(&h, BODY, 0), Ok(()));
    let other = hm(&[("X-Sig", &tag), ("X-Tenant", "t2")]);
    assert_eq!(ver.verify(&other, BODY, 0), Err(VerifyError::Mismatch));
    missing_header(ver.verify(&hm(&[("X-Sig", &tag)]), BODY, 0), "x-tenant");
}

#[track_caller]
fn missing_header(r: Result<(), VerifyError>, name: &str) {
    assert_eq!(r, Err(VerifyError::MissingHeader(name.to_owned())));
}

#[test]
fn templates_parse_or_say_why() {
    use Piece::{Body, Header, Id, Text};
    let text = |s: &str| Text(Cow::Owned(s.to_owned()));
    assert_eq!(parse_message("{body}").unwrap(), [Body]);
    assert_eq!(
        parse_message("v0:{timestamp}:{body}").unwrap(),
        [text("v0:"), Piece::Timestamp, text(":"), Body]
    );
    assert_eq!(
        parse_message("{id}.{header:X-A}{{x}}{body}").unwrap(),
        [
            Id,
            text("."),
            Header(HeaderName::from_static("x-a")),
            text("{x}"),
            Body
        ]
    );
    for bad in [
        "{bodyy}",
        "{body",
        "body}",
        "{header:bad name}",
        "{}",
        &"{body}.".repeat(9),
    ] {
        assert!(parse_message(bad).is_err(), "{bad}");
    }
    // a rule must sign the body, and use {timestamp} exactly with a timestamp
    assert!(rule("x", "{id}").problem().is_some());
    assert!(rule("x", "{timestamp}{body}").problem().is_some());
    let ts_unused = Rule {
        timestamp: Some(Timestamp::Header(HeaderName::from_static("x-ts"))),
        ..rule("x", "{body}")
    };
    assert!(ts_unused.problem().is_some());
    let param_without_list = Rule {
        timestamp: Some(Timestamp::Param(Cow::Borrowed("t"))),
        ..rule("x", "{timestamp}{body}")
    };
    assert!(param_without_list.problem().is_some());
    // the verifier fails closed on such a rule
    let ver = hmac_verifier(rule("x", "{id}"), &[b"k"]);
    assert!(matches!(
        ver.verify(&hm(&[("x", "00")]), BODY, 0),
        Err(VerifyError::Misconfigured(_))
    ));
    assert!(matches!(
        Verifier::new(Scheme::Hmac, vec![b"k".to_vec()]).validate(),
        Err(VerifyError::Misconfigured(_))
    ));
}

#[test]
fn token_scheme_compares_the_whole_token() {
    let ver = Verifier::new(
        Scheme::Token,
        vec![b"glpat-token".to_vec(), b"next".to_vec()],
    );
    assert_eq!(
        ver.verify(&hm(&[("X-Gitlab-Token", "glpat-token")]), b"", 0),
        Ok(())
    );
    assert_eq!(
        ver.verify(&hm(&[("X-Gitlab-Token", "next")]), BODY, 0),
        Ok(())
    );
    for wrong in ["glpat-toke", "glpat-token2", "GLPAT-TOKEN", "x"] {
        assert_eq!(
            ver.verify(&hm(&[("X-Gitlab-Token", wrong)]), BODY, 0),
            Err(VerifyError::Mismatch),
            "{wrong}"
        );
    }
    missing_header(ver.verify(&HeaderMap::new(), BODY, 0), "x-gitlab-token");
    let custom = Verifier {
        header: Some(HeaderName::from_static("x-token")),
        ..ver
    };
    assert_eq!(custom.verify(&hm(&[("X-Token", "next")]), BODY, 0), Ok(()));
}

// ------------------------------------------------------------------- v1a

// Python `cryptography`: Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
const SEED: [u8; 32] = {
    let mut s = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        s[i] = i as u8;
        i += 1;
    }
    s
};
const PK_B64: &str = "A6EHv/POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg=";
// .sign(b"msg_1.1700000000." + BODY)
const V1A: &str =
    "kd48t3/AB0CQOJ8XGXkwh6hNh7cs5AQV3+thtYo71jAfphwIeGsow5HvG1TA06HOQ8WghI4rUwQBEixBbWGvBw==";

fn pk() -> [u8; 32] {
    B64.decode(PK_B64).unwrap().try_into().unwrap()
}

fn sw(sig: &str) -> HeaderMap {
    hm(&[
        ("webhook-id", "msg_1"),
        ("webhook-timestamp", "1700000000"),
        ("webhook-signature", sig),
    ])
}

fn ed_verifier(hmac_keys: &[&[u8]], public_keys: &[[u8; 32]]) -> Verifier {
    Verifier {
        public_keys: public_keys.to_vec(),
        ..Verifier::new(
            Scheme::StandardWebhooks,
            hmac_keys.iter().map(|k| k.to_vec()).collect(),
        )
    }
}

#[test]
fn v1a_vector_right_and_wrong_key() {
    assert_eq!(
        sign::standard_webhooks_v1a(&SEED, "msg_1", TS, BODY),
        format!("v1a,{V1A}")
    );
    assert_eq!(
        sign::standard_webhooks_public_key(&SEED),
        format!("whpk_{PK_B64}")
    );
    let ver = ed_verifier(&[], &[pk()]);
    assert_eq!(ver.verify(&sw(&format!("v1a,{V1A}")), BODY, TS), Ok(()));
    assert_eq!(
        ver.verify(&sw(&format!("v1a,{V1A}")), &BODY[1..], TS),
        Err(VerifyError::Mismatch)
    );
    let wrong = ed_verifier(&[], &[[7u8; 32]]);
    assert_eq!(
        wrong.verify(&sw(&format!("v1a,{V1A}")), BODY, TS),
        Err(VerifyError::Mismatch)
    );
    // rotation: any key may match
    let rotated = ed_verifier(&[], &[[7u8; 32], pk()]);
    assert_eq!(rotated.verify(&sw(&format!("v1a,{V1A}")), BODY, TS), Ok(()));
    assert_eq!(
        ver.verify(&sw(&format!("v1a,{V1A}")), BODY, TS + 301),
        Err(VerifyError::StaleTimestamp { age_secs: 301 })
    );
}

#[test]
fn v1a_entries_are_checked_only_against_keys_of_their_kind() {
    let key = b"hmac-key-32-bytes-long-enough!!!";
    let v1 = sign::standard_webhooks(key, "msg_1", TS, BODY);
    let v1a = format!("v1a,{V1A}");
    let bad_v1 = format!("v1,{}", B64.encode([0u8; 32]));
    let both = ed_verifier(&[key], &[pk()]);
    // a bad v1 beside a good v1a, and the other way round
    assert_eq!(
        both.verify(&sw(&format!("{bad_v1} {v1a}")), BODY, TS),
        Ok(())
    );
    assert_eq!(
        both.verify(
            &sw(&format!("{v1} v1a,{}", B64.encode([0u8; 64]))),
            BODY,
            TS
        ),
        Ok(())
    );
    assert_eq!(
        both.verify(
            &sw(&format!("{bad_v1} v1a,{}", B64.encode([0u8; 64]))),
            BODY,
            TS
        ),
        Err(VerifyError::Mismatch)
    );
    // the HMAC key's tag sent as v1a, or an Ed25519 signature sent as v1: no match
    let as_v1a = format!("v1a,{}", v1.strip_prefix("v1,").unwrap());
    assert!(both.verify(&sw(&as_v1a), BODY, TS).is_err());
    // an HMAC-only route never reads v1a entries: a v1a-only list is malformed
    let hmac_only = ed_verifier(&[key], &[]);
    assert!(matches!(
        hmac_only.verify(&sw(&v1a), BODY, TS),
        Err(VerifyError::MalformedHeader { .. })
    ));
    assert_eq!(
        hmac_only.verify(&sw(&format!("{v1a} {v1}")), BODY, TS),
        Ok(())
    );
    // a public-key-only route never reads v1 entries
    let ed_only = ed_verifier(&[], &[pk()]);
    assert!(matches!(
        ed_only.verify(&sw(&v1), BODY, TS),
        Err(VerifyError::MalformedHeader { .. })
    ));
    // entries of the wrong length are skipped
    assert_eq!(
        ed_only.verify(&sw(&format!("v1a,AAAA {v1a}")), BODY, TS),
        Ok(())
    );
    // public keys are for standard-webhooks only
    let misplaced = Verifier {
        public_keys: vec![pk()],
        ..Verifier::new(Scheme::Github, vec![b"k".to_vec()])
    };
    assert!(matches!(
        misplaced.validate(),
        Err(VerifyError::Misconfigured(_))
    ));
}

#[test]
fn hex_signatures_decode_in_either_case_and_nothing_else_passes() {
    let mut out = [0u8; 4];
    assert!(decode_hex(b"00fFa9B0", &mut out));
    assert_eq!(out, [0x00, 0xff, 0xa9, 0xb0]);
    let (all, lower) = (
        "0123456789abcdefABCDEF",
        hex::encode((0u8..=255).collect::<Vec<_>>()),
    );
    let mut every = [0u8; 256];
    assert!(decode_hex(lower.as_bytes(), &mut every));
    assert!(every.iter().enumerate().all(|(i, b)| usize::from(*b) == i));
    // every byte that is not a hex digit, in either position of a pair
    for bad in (0u8..=255).filter(|b| !all.as_bytes().contains(b)) {
        for at in 0..2 {
            let mut pair = *b"a0";
            pair[at] = bad;
            assert!(!decode_hex(&pair, &mut [0u8; 1]), "{bad:#x} at {at}");
        }
    }
    // wrong lengths: short, long, odd
    for s in [&b"00ff"[..], b"00ffa9b0c", b"00ffa9b0cc", b""] {
        assert!(!decode_hex(s, &mut out), "{s:?}");
    }
}
