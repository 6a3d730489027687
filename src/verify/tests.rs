//! Tests for every scheme: published vectors where they exist, vectors computed
//! with an independent HMAC implementation (Python's `hmac`) otherwise, and the
//! failure modes a forger or a broken sender can produce.

use super::*;
use http::HeaderValue;

// ------------------------------------------------------------------ helpers

fn hm(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in pairs {
        h.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    h
}

fn v(scheme: Scheme, secrets: &[&[u8]]) -> Verifier {
    Verifier::new(scheme, secrets.iter().map(|s| s.to_vec()).collect())
}

fn malformed(r: Result<(), VerifyError>, header: &str) {
    match r {
        Err(VerifyError::MalformedHeader { header: h, .. }) => assert_eq!(h, header),
        other => panic!("expected MalformedHeader({header}), got {other:?}"),
    }
}

/// Each of `values`, sent as the only `header`, is refused as malformed; a
/// failure names the value.
#[track_caller]
fn malformed_values<V: AsRef<[u8]>>(
    ver: &Verifier,
    header: &str,
    body: &[u8],
    now: i64,
    values: &[V],
) {
    for value in values {
        let shown = String::from_utf8_lossy(value.as_ref());
        match ver.verify(&hm(&[(header, value.as_ref())]), body, now) {
            Err(VerifyError::MalformedHeader { header: h, .. }) => assert_eq!(h, header, "{shown}"),
            other => panic!("`{shown}`: expected MalformedHeader({header}), got {other:?}"),
        }
    }
}

/// `h` is accepted up to the default 300 s either side of `t`, and refused
/// a second past it.
#[track_caller]
fn default_tolerance(ver: &Verifier, h: &HeaderMap, body: &[u8], t: i64) {
    for now in [t, t + 300, t - 300] {
        assert_eq!(ver.verify(h, body, now), Ok(()), "t{:+}", now - t);
    }
    assert_eq!(
        ver.verify(h, body, t + 301),
        Err(VerifyError::StaleTimestamp { age_secs: 301 })
    );
    assert_eq!(
        ver.verify(h, body, t - 301),
        Err(VerifyError::FutureTimestamp { ahead_secs: 301 })
    );
}

fn missing(r: Result<(), VerifyError>, header: &str) {
    assert_eq!(r, Err(VerifyError::MissingHeader(header.to_owned())));
}

// ------------------------------------------------------------------- stripe

const STRIPE_SECRET: &[u8] = b"whsec_test_secret";
const STRIPE_T: i64 = 1_492_774_577;
const STRIPE_BODY: &[u8] = b"{\n  \"id\": \"evt_test_webhook\",\n  \"object\": \"event\"\n}";
// HMAC-SHA256(secret, "1492774577." + body), computed with Python's hmac.
const STRIPE_SIG: &str = "c2f890decbc5ede7c5060bb9a6d31e0626a4342bacb9aeae2adb1bcea72f9812";

fn stripe_headers(value: &str) -> HeaderMap {
    hm(&[("Stripe-Signature", value.as_bytes())])
}

#[test]
fn stripe_valid_vector() {
    let value = format!("t={STRIPE_T},v1={STRIPE_SIG}");
    assert_eq!(sign::stripe(STRIPE_SECRET, STRIPE_T, STRIPE_BODY), value);
    let ver = v(Scheme::Stripe, &[STRIPE_SECRET]);
    assert_eq!(
        ver.verify(&stripe_headers(&value), STRIPE_BODY, STRIPE_T),
        Ok(())
    );
    // upper-case hex and surrounding whitespace are tolerated
    let loose = format!(" t={STRIPE_T}, v1={} ", STRIPE_SIG.to_uppercase());
    assert_eq!(
        ver.verify(&stripe_headers(&loose), STRIPE_BODY, STRIPE_T),
        Ok(())
    );
}

#[test]
fn stripe_secret_is_used_raw_including_prefix() {
    assert_eq!(
        Scheme::Stripe.key_from_secret("whsec_test_secret").unwrap(),
        STRIPE_SECRET
    );
}

#[test]
fn stripe_wrong_secret_and_tampering() {
    let ver = v(Scheme::Stripe, &[b"whsec_other"]);
    let value = sign::stripe(STRIPE_SECRET, STRIPE_T, STRIPE_BODY);
    assert_eq!(
        ver.verify(&stripe_headers(&value), STRIPE_BODY, STRIPE_T),
        Err(VerifyError::Mismatch)
    );

    let ver = v(Scheme::Stripe, &[STRIPE_SECRET]);
    let mut body = STRIPE_BODY.to_vec();
    body[10] ^= 1;
    assert_eq!(
        ver.verify(&stripe_headers(&value), &body, STRIPE_T),
        Err(VerifyError::Mismatch)
    );
    // the timestamp is part of the signed payload
    let moved = format!("t={},v1={STRIPE_SIG}", STRIPE_T + 1);
    assert_eq!(
        ver.verify(&stripe_headers(&moved), STRIPE_BODY, STRIPE_T),
        Err(VerifyError::Mismatch)
    );
    // a signature over the same timestamp and an extra byte
    let mut longer = STRIPE_BODY.to_vec();
    longer.push(b' ');
    assert_eq!(
        ver.verify(&stripe_headers(&value), &longer, STRIPE_T),
        Err(VerifyError::Mismatch)
    );
}

#[test]
fn stripe_timestamp_tolerance_both_directions() {
    let ver = v(Scheme::Stripe, &[STRIPE_SECRET]);
    let h = stripe_headers(&sign::stripe(STRIPE_SECRET, STRIPE_T, STRIPE_BODY));
    default_tolerance(&ver, &h, STRIPE_BODY, STRIPE_T);
    let strict = Verifier {
        tolerance: Duration::from_secs(10),
        ..ver
    };
    assert_eq!(strict.verify(&h, STRIPE_BODY, STRIPE_T + 10), Ok(()));
    assert_eq!(
        strict.verify(&h, STRIPE_BODY, STRIPE_T + 11),
        Err(VerifyError::StaleTimestamp { age_secs: 11 })
    );
}

#[test]
fn stripe_rotation_and_several_v1() {
    let value = sign::stripe(STRIPE_SECRET, STRIPE_T, STRIPE_BODY);
    let h = stripe_headers(&value);
    for secrets in [
        &[b"whsec_old".as_slice(), STRIPE_SECRET][..],
        &[STRIPE_SECRET, b"whsec_new"][..],
    ] {
        assert_eq!(
            v(Scheme::Stripe, secrets).verify(&h, STRIPE_BODY, STRIPE_T),
            Ok(())
        );
    }
    let other = hex::encode([7u8; 32]);
    let ver = v(Scheme::Stripe, &[STRIPE_SECRET]);
    for value in [
        format!("t={STRIPE_T},v1={other},v1={STRIPE_SIG}"),
        format!("t={STRIPE_T},v1={STRIPE_SIG},v1={other}"),
        format!("v1={STRIPE_SIG},t={STRIPE_T}"),
        format!("t={STRIPE_T},v1={STRIPE_SIG},v0={other}"),
        format!("t={STRIPE_T},v0=notevenhex,v1={STRIPE_SIG},future=1"),
    ] {
        assert_eq!(
            ver.verify(&stripe_headers(&value), STRIPE_BODY, STRIPE_T),
            Ok(()),
            "{value}"
        );
    }
    // the v1 signed by the second of two secrets, next to one signed by an unknown secret
    let second = sign::stripe(b"whsec_second", STRIPE_T, STRIPE_BODY);
    let second_sig = second.split_once("v1=").unwrap().1;
    let both = format!("t={STRIPE_T},v1={other},v1={second_sig}");
    let ver = v(Scheme::Stripe, &[STRIPE_SECRET, b"whsec_second"]);
    assert_eq!(
        ver.verify(&stripe_headers(&both), STRIPE_BODY, STRIPE_T),
        Ok(())
    );
    // only non-matching v1 entries
    let none = format!("t={STRIPE_T},v1={other},v1={other}");
    assert_eq!(
        ver.verify(&stripe_headers(&none), STRIPE_BODY, STRIPE_T),
        Err(VerifyError::Mismatch)
    );
    // a v0 entry carrying the right signature does not count
    let v0_only = format!("t={STRIPE_T},v0={STRIPE_SIG}");
    malformed(
        ver.verify(&stripe_headers(&v0_only), STRIPE_BODY, STRIPE_T),
        "stripe-signature",
    );
}

#[test]
fn stripe_missing_and_malformed() {
    let ver = v(Scheme::Stripe, &[STRIPE_SECRET]);
    missing(
        ver.verify(&HeaderMap::new(), STRIPE_BODY, STRIPE_T),
        "stripe-signature",
    );
    let short = &STRIPE_SIG[..62];
    let bad = [
        "garbage".to_owned(),
        String::new(),
        "   ".to_owned(),
        format!("v1={STRIPE_SIG}"),                           // no t=
        format!("t={STRIPE_T}"),                              // no v1=
        format!("t=,v1={STRIPE_SIG}"),                        // empty t
        format!("t=abc,v1={STRIPE_SIG}"),                     // non-numeric t
        format!("t=-5,v1={STRIPE_SIG}"),                      // negative t
        format!("t=+{STRIPE_T},v1={STRIPE_SIG}"),             // signed t
        format!("t={STRIPE_T}.5,v1={STRIPE_SIG}"),            // fractional t
        format!("t=99999999999999999999,v1={STRIPE_SIG}"),    // t out of range
        format!("t={STRIPE_T},t={STRIPE_T},v1={STRIPE_SIG}"), // duplicate t
        format!("t={STRIPE_T},v1=zz{}", &STRIPE_SIG[2..]),    // non-hex
        format!("t={STRIPE_T},v1={short}"),                   // too short
        format!("t={STRIPE_T},v1={STRIPE_SIG}00"),            // too long
        format!("t={STRIPE_T},v1="),                          // empty signature
        format!("t={STRIPE_T},v1,{STRIPE_SIG}"),              // element without '='
    ];
    malformed_values(&ver, "stripe-signature", STRIPE_BODY, STRIPE_T, &bad);
    // non-UTF-8 (obs-text) bytes in the value
    let mut raw = format!("t={STRIPE_T},v1={STRIPE_SIG}").into_bytes();
    raw.extend_from_slice(&[0xff, 0xfe]);
    malformed_values(&ver, "stripe-signature", STRIPE_BODY, STRIPE_T, &[raw]);
    // a repeated header is refused rather than guessed at
    let good = sign::stripe(STRIPE_SECRET, STRIPE_T, STRIPE_BODY);
    let twice = hm(&[
        ("stripe-signature", good.as_bytes()),
        ("stripe-signature", good.as_bytes()),
    ]);
    malformed(
        ver.verify(&twice, STRIPE_BODY, STRIPE_T),
        "stripe-signature",
    );
}

#[test]
fn stripe_empty_body() {
    let ver = v(Scheme::Stripe, &[STRIPE_SECRET]);
    let h = stripe_headers(&sign::stripe(STRIPE_SECRET, STRIPE_T, b""));
    assert_eq!(ver.verify(&h, b"", STRIPE_T), Ok(()));
    assert_eq!(ver.verify(&h, b" ", STRIPE_T), Err(VerifyError::Mismatch));
}

// ------------------------------------------------------------------- github

// Published in GitHub's "Validating webhook deliveries" documentation.
const GITHUB_SECRET: &[u8] = b"It's a Secret to Everybody";
const GITHUB_BODY: &[u8] = b"Hello, World!";
const GITHUB_SIG: &str = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

fn github_headers(value: &[u8]) -> HeaderMap {
    hm(&[("X-Hub-Signature-256", value)])
}

#[test]
fn github_failures() {
    let h = github_headers(GITHUB_SIG.as_bytes());
    let ver = v(Scheme::Github, &[GITHUB_SECRET]);
    assert_eq!(
        ver.verify(&h, b"Hello, World?", 0),
        Err(VerifyError::Mismatch)
    );
    assert_eq!(ver.verify(&h, b"", 0), Err(VerifyError::Mismatch));
    // the SHA-1 header alone is not accepted
    let sha1 = hm(&[(
        "X-Hub-Signature",
        b"sha1=0123456789abcdef0123456789abcdef01234567",
    )]);
    missing(ver.verify(&sha1, GITHUB_BODY, 0), "x-hub-signature-256");
    let hex_only = &GITHUB_SIG[7..];
    let bad = [
        hex_only.to_owned(),          // no prefix
        format!("sha1={hex_only}"),   // wrong algorithm
        format!("SHA256={hex_only}"), // prefix is case-sensitive for GitHub
        "sha256=".to_owned(),
        format!("sha256={}", &hex_only[..63]),
        format!("sha256=g{}", &hex_only[1..]),
        "garbage".to_owned(),
    ];
    let header = "x-hub-signature-256";
    malformed_values(&ver, header, GITHUB_BODY, 0, &bad);
    malformed_values(&ver, header, GITHUB_BODY, 0, &[b"sha256=\xe9\xe9"]);
}

// ------------------------------------------------------------------ shopify

const SHOPIFY_SECRET: &[u8] = b"shpss_hush";
const SHOPIFY_BODY: &[u8] = br#"{"id":820982911946154508,"email":"jon@example.com"}"#;
// base64(HMAC-SHA256(secret, body)), computed with Python's hmac.
const SHOPIFY_SIG: &str = "minWArgZa/Hsplvy6dlnaKNnlyvuW8Y2ovDcBlzZSE0=";

fn shopify_headers(value: &[u8]) -> HeaderMap {
    hm(&[("X-Shopify-Hmac-Sha256", value)])
}

#[test]
fn shopify_padding_is_optional() {
    let ver = v(Scheme::Shopify, &[SHOPIFY_SECRET]);
    let unpadded = SHOPIFY_SIG.trim_end_matches('=');
    assert_eq!(
        ver.verify(&shopify_headers(unpadded.as_bytes()), SHOPIFY_BODY, 0),
        Ok(())
    );
}

#[test]
fn shopify_failures() {
    let h = shopify_headers(SHOPIFY_SIG.as_bytes());
    let ver = v(Scheme::Shopify, &[SHOPIFY_SECRET]);
    assert_eq!(
        ver.verify(
            &h,
            br#"{"id":820982911946154509,"email":"jon@example.com"}"#,
            0
        ),
        Err(VerifyError::Mismatch)
    );
    let hex_sig = hex::encode(B64.decode(SHOPIFY_SIG).unwrap()); // hex is not what Shopify sends
    let short = B64.encode([1u8; 16]);
    let bad = [
        "!!!not base64!!!",
        "minWArgZa_Hsplvy6dlnaKNnlyvuW8Y2ovDcBlzZSE0",
        hex_sig.as_str(),
        short.as_str(),
        "a",
    ];
    let header = "x-shopify-hmac-sha256";
    malformed_values(&ver, header, SHOPIFY_BODY, 0, &bad);
    malformed_values(&ver, header, SHOPIFY_BODY, 0, &[b"\x80\x81=="]);
}

// -------------------------------------------------------------------- slack

// Published in Slack's "Verifying requests from Slack" documentation.
const SLACK_SECRET: &[u8] = b"8f742231b10e8888abcd99yyyzzz85a5";
const SLACK_TS: i64 = 1_531_420_618;
const SLACK_BODY: &[u8] = b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
const SLACK_SIG: &str = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

fn slack_headers(sig: &[u8], ts: &[u8]) -> HeaderMap {
    hm(&[
        ("X-Slack-Signature", sig),
        ("X-Slack-Request-Timestamp", ts),
    ])
}

#[test]
fn slack_documented_vector() {
    assert_eq!(sign::slack(SLACK_SECRET, SLACK_TS, SLACK_BODY), SLACK_SIG);
    let ver = v(Scheme::Slack, &[SLACK_SECRET]);
    let h = slack_headers(SLACK_SIG.as_bytes(), SLACK_TS.to_string().as_bytes());
    assert_eq!(ver.verify(&h, SLACK_BODY, SLACK_TS), Ok(()));
}

#[test]
fn slack_failures() {
    let ts = SLACK_TS.to_string();
    let h = slack_headers(SLACK_SIG.as_bytes(), ts.as_bytes());
    assert_eq!(
        v(Scheme::Slack, &[b"other"]).verify(&h, SLACK_BODY, SLACK_TS),
        Err(VerifyError::Mismatch)
    );
    let ver = v(Scheme::Slack, &[SLACK_SECRET]);
    assert_eq!(
        ver.verify(&h, &SLACK_BODY[1..], SLACK_TS),
        Err(VerifyError::Mismatch)
    );
    let moved = slack_headers(SLACK_SIG.as_bytes(), (SLACK_TS + 1).to_string().as_bytes());
    assert_eq!(
        ver.verify(&moved, SLACK_BODY, SLACK_TS),
        Err(VerifyError::Mismatch)
    );

    missing(
        ver.verify(
            &hm(&[("X-Slack-Request-Timestamp", ts.as_bytes())]),
            SLACK_BODY,
            SLACK_TS,
        ),
        "x-slack-signature",
    );
    missing(
        ver.verify(
            &hm(&[("X-Slack-Signature", SLACK_SIG.as_bytes())]),
            SLACK_BODY,
            SLACK_TS,
        ),
        "x-slack-request-timestamp",
    );

    let hex_only = &SLACK_SIG[3..];
    for bad in [
        hex_only.to_owned(),
        format!("v1={hex_only}"),
        "v0=".to_owned(),
        format!("v0={}", &hex_only[..60]),
        format!("v0=xx{}", &hex_only[2..]),
    ] {
        malformed(
            ver.verify(
                &slack_headers(bad.as_bytes(), ts.as_bytes()),
                SLACK_BODY,
                SLACK_TS,
            ),
            "x-slack-signature",
        );
    }
    for bad_ts in [
        &b"abc"[..],
        b"1531420618.0",
        b"-1531420618",
        b"",
        b"15314\xff20618",
    ] {
        malformed(
            ver.verify(
                &slack_headers(SLACK_SIG.as_bytes(), bad_ts),
                SLACK_BODY,
                SLACK_TS,
            ),
            "x-slack-request-timestamp",
        );
    }
    malformed(
        ver.verify(
            &slack_headers(b"v0=\xc3\xa9", ts.as_bytes()),
            SLACK_BODY,
            SLACK_TS,
        ),
        "x-slack-signature",
    );
}

#[test]
fn slack_tolerance_and_rotation() {
    let ver = v(Scheme::Slack, &[b"old".as_slice(), SLACK_SECRET]);
    let h = slack_headers(SLACK_SIG.as_bytes(), SLACK_TS.to_string().as_bytes());
    default_tolerance(&ver, &h, SLACK_BODY, SLACK_TS);
    // a replay long after the fact
    assert_eq!(
        ver.verify(&h, SLACK_BODY, SLACK_TS + 86_400),
        Err(VerifyError::StaleTimestamp { age_secs: 86_400 })
    );
}

#[test]
fn slack_empty_body() {
    let ver = v(Scheme::Slack, &[SLACK_SECRET]);
    let h = slack_headers(
        sign::slack(SLACK_SECRET, SLACK_TS, b"").as_bytes(),
        SLACK_TS.to_string().as_bytes(),
    );
    assert_eq!(ver.verify(&h, b"", SLACK_TS), Ok(()));
}

// -------------------------------------------------------- standard webhooks

// The test vector published with the Standard Webhooks specification.
const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
pub(crate) const SW_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
pub(crate) const SW_TS: i64 = 1_614_265_330;
pub(crate) const SW_BODY: &[u8] = br#"{"test": 2432232314}"#;
pub(crate) const SW_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn sw_key() -> Vec<u8> {
    Scheme::StandardWebhooks.key_from_secret(SW_SECRET).unwrap()
}

pub(crate) fn sw_verifier() -> Verifier {
    Verifier::new(Scheme::StandardWebhooks, vec![sw_key()])
}

fn sw_headers(prefix: &str, id: &str, ts: &str, sig: &[u8]) -> HeaderMap {
    hm(&[
        (&format!("{prefix}-id"), id.as_bytes()),
        (&format!("{prefix}-timestamp"), ts.as_bytes()),
        (&format!("{prefix}-signature"), sig),
    ])
}

fn sw(sig: &str) -> HeaderMap {
    sw_headers("webhook", SW_ID, &SW_TS.to_string(), sig.as_bytes())
}

#[test]
fn standard_webhooks_published_vector() {
    assert_eq!(
        sign::standard_webhooks(&sw_key(), SW_ID, SW_TS, SW_BODY),
        SW_SIG
    );
    assert_eq!(sign::standard_webhooks_secret(&sw_key()), SW_SECRET);
    assert_eq!(sw_verifier().verify(&sw(SW_SIG), SW_BODY, SW_TS), Ok(()));
}

#[test]
fn standard_webhooks_svix_fallback() {
    let h = sw_headers("svix", SW_ID, &SW_TS.to_string(), SW_SIG.as_bytes());
    assert_eq!(sw_verifier().verify(&h, SW_BODY, SW_TS), Ok(()));
    // webhook-* wins when present, even if svix-* carries garbage
    let mut both = sw(SW_SIG);
    both.insert("svix-signature", HeaderValue::from_static("garbage"));
    both.insert("svix-timestamp", HeaderValue::from_static("0"));
    assert_eq!(sw_verifier().verify(&both, SW_BODY, SW_TS), Ok(()));
    // the sets are not mixed: a partial webhook-* set does not borrow from svix-*
    let mixed = hm(&[
        ("webhook-id", SW_ID.as_bytes()),
        ("webhook-signature", SW_SIG.as_bytes()),
        ("svix-timestamp", SW_TS.to_string().as_bytes()),
    ]);
    missing(
        sw_verifier().verify(&mixed, SW_BODY, SW_TS),
        "webhook-timestamp",
    );
    // svix set with a missing member
    let partial = hm(&[
        ("svix-id", SW_ID.as_bytes()),
        ("svix-signature", SW_SIG.as_bytes()),
    ]);
    missing(
        sw_verifier().verify(&partial, SW_BODY, SW_TS),
        "svix-timestamp",
    );
}

/// Both sets present: the `svix-id` a route may be keyed on must be the
/// `webhook-id` that was signed, or a captured delivery could be re-sent
/// under any other event ID.
#[test]
fn standard_webhooks_svix_id_must_match_the_signed_webhook_id() {
    let mut both = sw(SW_SIG);
    both.insert("svix-id", HeaderValue::from_static(SW_ID));
    assert_eq!(sw_verifier().verify(&both, SW_BODY, SW_TS), Ok(()));
    both.insert("svix-id", HeaderValue::from_static("msg_someone_elses_id"));
    malformed(sw_verifier().verify(&both, SW_BODY, SW_TS), "svix-id");
    both.append("svix-id", HeaderValue::from_static(SW_ID));
    malformed(sw_verifier().verify(&both, SW_BODY, SW_TS), "svix-id");
}

#[test]
fn standard_webhooks_failures() {
    let ver = sw_verifier();
    let other_key = Verifier::new(Scheme::StandardWebhooks, vec![vec![9u8; 24]]);
    assert_eq!(
        other_key.verify(&sw(SW_SIG), SW_BODY, SW_TS),
        Err(VerifyError::Mismatch)
    );
    assert_eq!(
        ver.verify(&sw(SW_SIG), br#"{"test": 2432232315}"#, SW_TS),
        Err(VerifyError::Mismatch)
    );
    // id and timestamp are both signed
    let other_id = sw_headers(
        "webhook",
        "msg_other",
        &SW_TS.to_string(),
        SW_SIG.as_bytes(),
    );
    assert_eq!(
        ver.verify(&other_id, SW_BODY, SW_TS),
        Err(VerifyError::Mismatch)
    );
    let other_ts = sw_headers(
        "webhook",
        SW_ID,
        &(SW_TS + 1).to_string(),
        SW_SIG.as_bytes(),
    );
    assert_eq!(
        ver.verify(&other_ts, SW_BODY, SW_TS),
        Err(VerifyError::Mismatch)
    );

    missing(
        ver.verify(&HeaderMap::new(), SW_BODY, SW_TS),
        "webhook-signature",
    );
    let no_id = hm(&[
        ("webhook-timestamp", SW_TS.to_string().as_bytes()),
        ("webhook-signature", SW_SIG.as_bytes()),
    ]);
    missing(ver.verify(&no_id, SW_BODY, SW_TS), "webhook-id");
    let no_sig = hm(&[
        ("webhook-id", SW_ID.as_bytes()),
        ("webhook-timestamp", SW_TS.to_string().as_bytes()),
    ]);
    missing(ver.verify(&no_sig, SW_BODY, SW_TS), "webhook-signature");

    let short = format!("v1,{}", B64.encode([0u8; 16]));
    for bad in [
        "garbage",                                          // no comma
        "v1",                                               // no comma
        "v1a,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", // only another version
        "v1,!!!!",                                          // non-base64
        "v1,",                                              // empty signature
        short.as_str(),                                     // wrong length
        "v1,g0hM9SsE-OTPJTGt_tmIKtSyZlE3uFJELVlNIOLJ1OE=",  // URL-safe alphabet
    ] {
        malformed(ver.verify(&sw(bad), SW_BODY, SW_TS), "webhook-signature");
    }
    for bad_ts in ["soon", "1614265330.0", "-1614265330", "1e9"] {
        let h = sw_headers("webhook", SW_ID, bad_ts, SW_SIG.as_bytes());
        malformed(ver.verify(&h, SW_BODY, SW_TS), "webhook-timestamp");
    }
    let non_utf8 = sw_headers("webhook", SW_ID, &SW_TS.to_string(), b"v1,\xf0\x28\x8c\x28");
    malformed(ver.verify(&non_utf8, SW_BODY, SW_TS), "webhook-signature");
    let mut bad_id = sw(SW_SIG);
    bad_id.insert("webhook-id", HeaderValue::from_bytes(b"msg_\xff").unwrap());
    malformed(ver.verify(&bad_id, SW_BODY, SW_TS), "webhook-id");
}

#[test]
fn standard_webhooks_several_signatures() {
    let ver = sw_verifier();
    let other = format!("v1,{}", B64.encode([3u8; 32]));
    let unpadded = SW_SIG.trim_end_matches('=');
    for value in [
        format!("{other} {SW_SIG}"),
        format!("{SW_SIG} {other}"),
        format!("v1a,Zm9vYmFy {SW_SIG}"), // asymmetric entries are ignored
        format!("v2,whatever  {SW_SIG}"), // unknown versions, extra spaces
        unpadded.to_owned(),              // padding optional
    ] {
        assert_eq!(ver.verify(&sw(&value), SW_BODY, SW_TS), Ok(()), "{value}");
    }
    assert_eq!(
        ver.verify(&sw(&format!("{other} {other}")), SW_BODY, SW_TS),
        Err(VerifyError::Mismatch)
    );
}

/// SPEC §8: a signature list passes when any `v1` entry matches; entries of
/// other versions, or that do not decode to 32 bytes, are skipped, as the
/// providers' libraries skip them (issue 20). On both header sets.
#[test]
fn standard_webhooks_lists_skip_entries_that_cannot_be_signatures() {
    let ver = sw_verifier();
    let short = format!("v1,{}", B64.encode([7u8; 16]));
    let long = format!("v1,{}", B64.encode([7u8; 33]));
    let url_safe = "v1,g0hM9SsE-OTPJTGt_tmIKtSyZlE3uFJELVlNIOLJ1OE=";
    let skipped = [
        short.as_str(),                                    // a v1 entry of 16 bytes
        long.as_str(),                                     // of 33 bytes
        "v1,!!!!",                                         // not base64
        "v1,",                                             // empty
        url_safe,                                          // another alphabet
        "garbage",                                         // no comma
        "v1",                                              // no comma
        "v1a,Zm9vYmFy",                                    // asymmetric
        "V1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", // versions are case-sensitive
        ",",
    ];
    for prefix in ["webhook", "svix"] {
        for bad in skipped {
            for value in [format!("{bad} {SW_SIG}"), format!("{SW_SIG} {bad}")] {
                let h = sw_headers(prefix, SW_ID, &SW_TS.to_string(), value.as_bytes());
                assert_eq!(ver.verify(&h, SW_BODY, SW_TS), Ok(()), "{prefix}: {value}");
            }
        }
        // every kind at once, the valid entry last
        let all = format!("{} {SW_SIG}", skipped.join(" "));
        let h = sw_headers(prefix, SW_ID, &SW_TS.to_string(), all.as_bytes());
        assert_eq!(ver.verify(&h, SW_BODY, SW_TS), Ok(()), "{prefix}: {all}");
    }
}

/// Leniency never turns into a pass: skipped entries next to a well-formed
/// but wrong signature are a mismatch, and a list of nothing but skipped
/// entries is malformed, with a reason that tells the two cases apart.
#[test]
fn standard_webhooks_lists_without_a_usable_entry_are_refused() {
    let ver = sw_verifier();
    let wrong = format!("v1,{}", B64.encode([3u8; 32]));
    let short = format!("v1,{}", B64.encode([7u8; 16]));
    assert_eq!(
        ver.verify(&sw(&format!("{short} v1,!!!! {wrong}")), SW_BODY, SW_TS),
        Err(VerifyError::Mismatch)
    );
    // the valid signature of another key is as wrong as any other
    let foreign = sign::standard_webhooks(&[9u8; 24], SW_ID, SW_TS, SW_BODY);
    assert_eq!(
        ver.verify(&sw(&format!("{short} {foreign}")), SW_BODY, SW_TS),
        Err(VerifyError::Mismatch)
    );
    let why = |value: &str| match ver.verify(&sw(value), SW_BODY, SW_TS) {
        Err(VerifyError::MalformedHeader { header, why }) => {
            assert_eq!(header, "webhook-signature");
            why
        }
        other => panic!("{value}: expected malformed, got {other:?}"),
    };
    assert_eq!(
        why(&format!("{short} v1,!!!!")),
        "no `v1,` signature is base64 of 32 bytes"
    );
    assert_eq!(why("v1a,Zm9vYmFy v2,abc"), "no `v1,` signature");
    assert_eq!(why("   "), "the value is empty");
    // a skipped entry's content never reaches the message
    let marker = "v1,SECRETMARKER";
    let e = ver.verify(&sw(marker), SW_BODY, SW_TS).unwrap_err();
    assert!(!e.to_string().contains("SECRETMARKER"), "{e}");
    // skipping is not a way around the timestamp check
    assert_eq!(
        ver.verify(&sw(&format!("{short} {SW_SIG}")), SW_BODY, SW_TS + 301),
        Err(VerifyError::StaleTimestamp { age_secs: 301 })
    );
}

/// The rule that picks the header set, shared by the verifier and the
/// `svix` preset's event-ID source: `webhook-*` as soon as any of it is
/// present, `svix-*` otherwise.
#[test]
fn header_set_selection() {
    assert_eq!(HeaderSet::of(&HeaderMap::new()), None);
    assert_eq!(HeaderSet::of(&hm(&[("x-other", b"1")])), None);
    for name in ["svix-id", "svix-timestamp", "svix-signature"] {
        assert_eq!(
            HeaderSet::of(&hm(&[(name, b"x")])),
            Some(HeaderSet::Svix),
            "{name}"
        );
    }
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        assert_eq!(
            HeaderSet::of(&hm(&[(name, b"x")])),
            Some(HeaderSet::Webhook),
            "{name}"
        );
        let with_svix = hm(&[
            ("svix-id", b"a"),
            ("svix-timestamp", b"1"),
            ("svix-signature", b"v1,x"),
            (name, b"x"),
        ]);
        assert_eq!(
            HeaderSet::of(&with_svix),
            Some(HeaderSet::Webhook),
            "{name}"
        );
    }
    // names are case-insensitive on the wire; `http` lower-cases them
    assert_eq!(
        HeaderSet::of(&hm(&[("Webhook-Id", b"x")])),
        Some(HeaderSet::Webhook)
    );
    // look-alike names select nothing
    assert_eq!(
        HeaderSet::of(&hm(&[("webhook_id", b"x"), ("svix", b"x")])),
        None
    );
    use headers::{SVIX_ID, SVIX_SIGNATURE, SVIX_TIMESTAMP};
    use headers::{WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP};
    for (set, names) in [
        (
            HeaderSet::Webhook,
            [WEBHOOK_ID, WEBHOOK_TIMESTAMP, WEBHOOK_SIGNATURE],
        ),
        (HeaderSet::Svix, [SVIX_ID, SVIX_TIMESTAMP, SVIX_SIGNATURE]),
    ] {
        assert_eq!(
            [set.id(), set.timestamp(), set.signature()],
            names,
            "{set:?}"
        );
    }
}

#[test]
fn standard_webhooks_tolerance_and_rotation() {
    let ver = Verifier::new(Scheme::StandardWebhooks, vec![vec![1u8; 32], sw_key()]);
    let h = sw(SW_SIG);
    default_tolerance(&ver, &h, SW_BODY, SW_TS);
}

#[test]
fn standard_webhooks_empty_body() {
    let key = sw_key();
    let sig = sign::standard_webhooks(&key, SW_ID, SW_TS, b"");
    assert_eq!(sw_verifier().verify(&sw(&sig), b"", SW_TS), Ok(()));
}

#[test]
fn standard_webhooks_secret_decoding() {
    let key = sw_key();
    assert_eq!(
        decode_standard_webhooks_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap(),
        key
    );
    // padding optional
    let padded_key = [5u8; 31];
    let with_pad = sign::standard_webhooks_secret(&padded_key);
    assert!(with_pad.ends_with('='));
    assert_eq!(
        decode_standard_webhooks_secret(&with_pad).unwrap(),
        padded_key
    );
    assert_eq!(
        decode_standard_webhooks_secret(with_pad.trim_end_matches('=')).unwrap(),
        padded_key
    );
    for bad in ["whsec_", "whsec_!!!", "whsec_a", ""] {
        assert!(decode_standard_webhooks_secret(bad).is_err(), "{bad}");
    }
    let err = decode_standard_webhooks_secret("whsec_sup3r$ecret!").unwrap_err();
    assert!(!err.to_string().contains("sup3r"));
}

// -------------------------------------------------------------- hmac-sha256

const HMAC_SECRET: &[u8] = b"s3cret";
const HMAC_BODY: &[u8] = br#"{"event":"ping","id":"evt_1"}"#;
// HMAC-SHA256(secret, body), computed with Python's hmac.
const HMAC_HEX: &str = "c1cb8d6a4ea823badd677a8a6583e37954b8f40bc48b5579a64363d215346514";
const HMAC_EMPTY_HEX: &str = "91dfac70c5348b04e1babb8b421ac92cec08b565b49ca16130dccb72503647b7";

fn hmac_verifier(secrets: &[&[u8]]) -> Verifier {
    Verifier {
        header: Some(HeaderName::from_static("x-signature")),
        ..v(Scheme::HmacSha256, secrets)
    }
}

fn hmac_headers(value: &str) -> HeaderMap {
    hm(&[("X-Signature", value.as_bytes())])
}

#[test]
fn hmac_sha256_valid_in_every_accepted_form() {
    let ver = hmac_verifier(&[HMAC_SECRET]);
    for value in [
        HMAC_HEX.to_owned(),
        HMAC_HEX.to_uppercase(),
        format!("sha256={HMAC_HEX}"),
        format!("SHA256={}", HMAC_HEX.to_uppercase()),
    ] {
        assert_eq!(
            ver.verify(&hmac_headers(&value), HMAC_BODY, 0),
            Ok(()),
            "{value}"
        );
    }
    assert_eq!(sign::hmac_hex(HMAC_SECRET, b""), HMAC_EMPTY_HEX);
    assert_eq!(ver.verify(&hmac_headers(HMAC_EMPTY_HEX), b"", 0), Ok(()));
}

#[test]
fn hmac_sha256_failures() {
    let ver = hmac_verifier(&[HMAC_SECRET]);
    let h = hmac_headers(HMAC_HEX);
    assert_eq!(ver.verify(&h, b"{}", 0), Err(VerifyError::Mismatch));
    // a different header holding the right digest does not count
    missing(
        ver.verify(
            &hm(&[("X-Hub-Signature-256", HMAC_HEX.as_bytes())]),
            HMAC_BODY,
            0,
        ),
        "x-signature",
    );
    let bad = [
        format!("sha1={HMAC_HEX}"),
        format!("sha256:{HMAC_HEX}"),
        HMAC_HEX[..63].to_owned(),
        format!("{HMAC_HEX}0"),
        format!("q{}", &HMAC_HEX[1..]),
        B64.encode(hex::decode(HMAC_HEX).unwrap()),
        "sha256=".to_owned(),
    ];
    malformed_values(&ver, "x-signature", HMAC_BODY, 0, &bad);
    malformed_values(&ver, "x-signature", HMAC_BODY, 0, &[b"\xde\xad\xbe\xef"]);
}

#[test]
fn hmac_sha256_rotation() {
    let h = hmac_headers(HMAC_HEX);
    assert_eq!(
        hmac_verifier(&[b"old", b"older"]).verify(&h, HMAC_BODY, 0),
        Err(VerifyError::Mismatch)
    );
}

// ------------------------------------------- one header and no timestamp

/// A scheme that signs the body alone into one header: how to build its
/// verifier, the header, a secret, a body, its signature, and the signer.
struct OneHeader {
    verifier: fn(&[&[u8]]) -> Verifier,
    header: &'static str,
    secret: &'static [u8],
    body: &'static [u8],
    sig: &'static str,
    sign: fn(&[u8], &[u8]) -> String,
}

const ONE_HEADER: [OneHeader; 3] = [
    OneHeader {
        verifier: |s| v(Scheme::Github, s),
        header: "x-hub-signature-256",
        secret: GITHUB_SECRET,
        body: GITHUB_BODY,
        sig: GITHUB_SIG,
        sign: sign::github,
    },
    OneHeader {
        verifier: |s| v(Scheme::Shopify, s),
        header: "x-shopify-hmac-sha256",
        secret: SHOPIFY_SECRET,
        body: SHOPIFY_BODY,
        sig: SHOPIFY_SIG,
        sign: sign::shopify,
    },
    OneHeader {
        verifier: hmac_verifier,
        header: "x-signature",
        secret: HMAC_SECRET,
        body: HMAC_BODY,
        sig: HMAC_HEX,
        sign: sign::hmac_hex,
    },
];

/// The schemes that sign the body alone: the vector, any clock, rotation, a
/// wrong secret, no header, an empty body.
#[test]
fn one_header_schemes_share_their_rules() {
    for s in ONE_HEADER {
        assert_eq!((s.sign)(s.secret, s.body), s.sig, "{}", s.header);
        let h = hm(&[(s.header, s.sig.as_bytes())]);
        let ver = (s.verifier)(&[s.secret]);
        // no timestamp: the clock does not matter
        for now in [0, 1_700_000_000, i64::MIN, i64::MAX] {
            assert_eq!(ver.verify(&h, s.body, now), Ok(()), "{} at {now}", s.header);
        }
        let rotated = (s.verifier)(&[b"old", s.secret]);
        assert_eq!(rotated.verify(&h, s.body, 0), Ok(()), "{}", s.header);
        let wrong = (s.verifier)(&[b"wrong"]);
        let mismatch = Err(VerifyError::Mismatch);
        assert_eq!(wrong.verify(&h, s.body, 0), mismatch, "{}", s.header);
        missing(ver.verify(&HeaderMap::new(), s.body, 0), s.header);
        let empty = hm(&[(s.header, (s.sign)(s.secret, b"").as_bytes())]);
        assert_eq!(ver.verify(&empty, b"", 0), Ok(()), "{}", s.header);
    }
}

// ------------------------------------------------------------ configuration

#[test]
fn misconfigured_verifiers_fail_closed() {
    let h = hmac_headers(HMAC_HEX);
    let no_header = v(Scheme::HmacSha256, &[HMAC_SECRET]);
    assert!(matches!(
        no_header.validate(),
        Err(VerifyError::Misconfigured(_))
    ));
    assert!(matches!(
        no_header.verify(&h, HMAC_BODY, 0),
        Err(VerifyError::Misconfigured(_))
    ));

    let no_secrets = Verifier::new(Scheme::Github, vec![]);
    assert!(matches!(
        no_secrets.validate(),
        Err(VerifyError::Misconfigured(_))
    ));
    let gh = github_headers(sign::github(b"", GITHUB_BODY).as_bytes());
    assert!(matches!(
        no_secrets.verify(&gh, GITHUB_BODY, 0),
        Err(VerifyError::Misconfigured(_))
    ));

    // an empty key would let anyone sign
    let empty_secret = v(Scheme::Github, &[b""]);
    assert!(matches!(
        empty_secret.verify(&gh, GITHUB_BODY, 0),
        Err(VerifyError::Misconfigured(_))
    ));
    assert!(Scheme::Github.key_from_secret("").is_err());

    assert_eq!(hmac_verifier(&[HMAC_SECRET]).validate(), Ok(()));
    // `header` is ignored by the fixed schemes
    let gh_with_header = Verifier {
        header: Some(HeaderName::from_static("x-signature")),
        ..v(Scheme::Github, &[GITHUB_SECRET])
    };
    assert_eq!(
        gh_with_header.verify(&github_headers(GITHUB_SIG.as_bytes()), GITHUB_BODY, 0),
        Ok(())
    );
}

#[test]
fn scheme_names_round_trip() {
    for scheme in Scheme::ALL {
        assert_eq!(scheme.as_str().parse::<Scheme>(), Ok(scheme));
        assert_eq!(scheme.to_string(), scheme.as_str());
    }
    for bad in ["svix", "Stripe", "HMAC", "", "standard_webhooks"] {
        assert_eq!(bad.parse::<Scheme>(), Err(UnknownScheme), "{bad}");
    }
    let timestamped: Vec<_> = Scheme::ALL
        .into_iter()
        .filter(|s| s.is_timestamped())
        .collect();
    assert_eq!(
        timestamped,
        [Scheme::Stripe, Scheme::Slack, Scheme::StandardWebhooks]
    );
}

// ---------------------------------------------------------------- edge cases

#[test]
fn sub_second_and_zero_tolerance() {
    let h = stripe_headers(&sign::stripe(STRIPE_SECRET, STRIPE_T, STRIPE_BODY));
    let half = Verifier {
        tolerance: Duration::from_millis(500),
        ..v(Scheme::Stripe, &[STRIPE_SECRET])
    };
    assert_eq!(half.verify(&h, STRIPE_BODY, STRIPE_T), Ok(()));
    assert_eq!(
        half.verify(&h, STRIPE_BODY, STRIPE_T + 1),
        Err(VerifyError::StaleTimestamp { age_secs: 1 })
    );
    let zero = Verifier {
        tolerance: Duration::ZERO,
        ..half
    };
    assert_eq!(zero.verify(&h, STRIPE_BODY, STRIPE_T), Ok(()));
    assert_eq!(
        zero.verify(&h, STRIPE_BODY, STRIPE_T - 1),
        Err(VerifyError::FutureTimestamp { ahead_secs: 1 })
    );
    let huge = Verifier {
        tolerance: Duration::MAX,
        ..zero
    };
    assert_eq!(huge.verify(&h, STRIPE_BODY, i64::MAX), Ok(()));
    assert_eq!(huge.verify(&h, STRIPE_BODY, i64::MIN), Ok(()));
}

#[test]
fn extreme_clock_values_do_not_panic() {
    let ver = v(Scheme::Stripe, &[STRIPE_SECRET]);
    let h0 = stripe_headers(&sign::stripe(STRIPE_SECRET, 0, STRIPE_BODY));
    assert_eq!(
        ver.verify(&h0, STRIPE_BODY, i64::MAX),
        Err(VerifyError::StaleTimestamp { age_secs: i64::MAX })
    );
    let hmax = stripe_headers(&sign::stripe(STRIPE_SECRET, i64::MAX, STRIPE_BODY));
    assert_eq!(ver.verify(&hmax, STRIPE_BODY, i64::MAX), Ok(()));
    assert_eq!(
        ver.verify(&hmax, STRIPE_BODY, i64::MIN),
        Err(VerifyError::FutureTimestamp {
            ahead_secs: i64::MAX
        })
    );
    assert_eq!(
        ver.verify(&h0, STRIPE_BODY, i64::MIN),
        Err(VerifyError::FutureTimestamp {
            ahead_secs: i64::MAX
        })
    );
}

#[test]
fn timestamp_is_checked_before_the_signature() {
    // a stale replay is reported as stale whatever its signature
    let ver = v(Scheme::Stripe, &[STRIPE_SECRET]);
    let forged = stripe_headers(&format!("t={STRIPE_T},v1={}", hex::encode([0u8; 32])));
    assert_eq!(
        ver.verify(&forged, STRIPE_BODY, STRIPE_T + 1000),
        Err(VerifyError::StaleTimestamp { age_secs: 1000 })
    );
    assert_eq!(
        ver.verify(&forged, STRIPE_BODY, STRIPE_T),
        Err(VerifyError::Mismatch)
    );
}

/// A delivery of `body` signed for `scheme` with the key `x`.
fn signed_with_another_key(scheme: Scheme, now: i64, body: &[u8]) -> HeaderMap {
    match scheme {
        Scheme::Stripe => stripe_headers(&sign::stripe(b"x", now, body)),
        Scheme::Github => github_headers(sign::github(b"x", body).as_bytes()),
        Scheme::Shopify => shopify_headers(sign::shopify(b"x", body).as_bytes()),
        Scheme::Slack => slack_headers(
            sign::slack(b"x", now, body).as_bytes(),
            now.to_string().as_bytes(),
        ),
        Scheme::StandardWebhooks => sw_headers(
            "webhook",
            "id",
            &now.to_string(),
            sign::standard_webhooks(b"x", "id", now, body).as_bytes(),
        ),
        Scheme::HmacSha256 | Scheme::Hmac | Scheme::Token => {
            hmac_headers(&sign::hmac_hex(b"x", body))
        }
        Scheme::Paddle => hm(&[("paddle-signature", sign::paddle(b"x", now, body).as_bytes())]),
        Scheme::Typeform => hm(&[("typeform-signature", sign::typeform(b"x", body).as_bytes())]),
        Scheme::Zoom => hm(&[
            ("x-zm-signature", sign::zoom(b"x", now, body).as_bytes()),
            ("x-zm-request-timestamp", now.to_string().as_bytes()),
        ]),
    }
}

#[test]
fn no_error_or_debug_output_reveals_secrets_body_or_values() {
    let secret = "TOPSECRET-c0ffee-key";
    let body = b"BODYMARKER payload";
    let sig_value = "VALUEMARKER";
    let mut errors = Vec::new();
    for scheme in Scheme::ALL {
        let ver = Verifier {
            header: Some(HeaderName::from_static("x-signature")),
            ..Verifier::new(scheme, vec![secret.as_bytes().to_vec()])
        };
        let now = 1_700_000_000;
        let signed = signed_with_another_key(scheme, now, body);
        errors.push(ver.verify(&signed, body, now).unwrap_err()); // mismatch
        errors.push(ver.verify(&signed, body, now + 10_000).unwrap_err()); // stale, or mismatch
        errors.push(ver.verify(&HeaderMap::new(), body, now).unwrap_err()); // missing
                                                                            // malformed: every header the scheme reads carries the marker
        let all: Vec<(&str, &[u8])> = [
            "stripe-signature",
            "x-hub-signature-256",
            "x-shopify-hmac-sha256",
            "x-slack-signature",
            "x-slack-request-timestamp",
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature",
            "x-signature",
            "paddle-signature",
            "typeform-signature",
            "x-zm-signature",
            "x-zm-request-timestamp",
        ]
        .into_iter()
        .map(|n| (n, sig_value.as_bytes()))
        .collect();
        errors.push(ver.verify(&hm(&all), body, now).unwrap_err());
        assert!(!format!("{ver:?}").contains(secret));
    }
    errors.push(VerifyError::StaleTimestamp { age_secs: 1 });
    errors.push(VerifyError::FutureTimestamp { ahead_secs: 1 });
    errors.push(
        Verifier::new(Scheme::Github, vec![])
            .validate()
            .unwrap_err(),
    );
    for e in &errors {
        for text in [e.to_string(), format!("{e:?}")] {
            assert!(!text.contains(secret), "{text}");
            assert!(!text.contains("BODYMARKER"), "{text}");
            assert!(!text.contains(sig_value), "{text}");
            assert!(!text.is_empty());
        }
    }
    assert!(errors.iter().any(|e| matches!(e, VerifyError::Mismatch)));
    assert!(errors
        .iter()
        .any(|e| matches!(e, VerifyError::MissingHeader(_))));
    assert!(errors
        .iter()
        .any(|e| matches!(e, VerifyError::MalformedHeader { .. })));
    assert!(errors
        .iter()
        .any(|e| matches!(e, VerifyError::StaleTimestamp { .. })));
}

#[test]
fn error_display_is_readable() {
    assert_eq!(
        VerifyError::MissingHeader("stripe-signature".into()).to_string(),
        "missing signature header `stripe-signature`"
    );
    assert_eq!(
        VerifyError::MalformedHeader {
            header: "x-slack-signature".into(),
            why: "expected `v0=<hex>`"
        }
        .to_string(),
        "malformed signature header `x-slack-signature`: expected `v0=<hex>`"
    );
    assert_eq!(
        VerifyError::StaleTimestamp { age_secs: 301 }.to_string(),
        "signature timestamp is 301s old, outside the allowed tolerance"
    );
    assert_eq!(
        VerifyError::Mismatch.to_string(),
        "no signature matches the payload"
    );
}

#[test]
fn verifier_debug_redacts_secrets() {
    let ver = v(Scheme::Stripe, &[b"whsec_hideme", b"whsec_alsohidden"]);
    let dbg = format!("{ver:?}");
    assert!(dbg.contains("2 redacted"), "{dbg}");
    assert!(!dbg.contains("hideme") && !dbg.contains("alsohidden"));
    assert!(!dbg.contains("104")); // not even as a byte list ('h' = 104)
}
