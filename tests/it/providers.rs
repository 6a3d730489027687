//! Provider presets and signature verification before the claim (SPEC §8,
//! issue 5), against the real binary, a real consumer and a real SQLite store.
//!
//! Every delivery is signed with `idemgate::verify::sign`, which builds the
//! header values exactly as each provider documents them (the schemes
//! themselves are checked against the published vectors in
//! `src/verify/tests.rs`). Secrets reach the proxy the only way the config
//! allows: `env:NAME` (set on the spawned process) or `file:PATH`.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use idemgate::verify::sign;

const INVALID_SIGNATURE: &str = "urn:idemgate:problem:invalid-signature";

// ------------------------------------------------------------ deliveries

/// One HTTP delivery as a provider would send it.
#[derive(Clone)]
struct Delivery {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Delivery {
    fn new(body: impl Into<Vec<u8>>) -> Delivery {
        Delivery {
            headers: vec![("Content-Type".into(), "application/json".into())],
            body: body.into(),
        }
    }

    fn header(mut self, name: &str, value: impl Into<String>) -> Delivery {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    fn without(mut self, name: &str) -> Delivery {
        self.headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        self
    }

    /// POSTs to `path` on a fresh connection.
    fn post(&self, px: &Proxy, path: &str) -> Response {
        px.post(path, &self.headers, &self.body)
    }
}

/// Builds a signed delivery: (key bytes, event ID, timestamp) → delivery.
type Signer = fn(&[u8], &str, i64) -> Delivery;

/// `Stripe-Signature: t=…,v1=…` over `t.body`; the event ID is the body's `/id`.
fn stripe(key: &[u8], id: &str, ts: i64) -> Delivery {
    let body = serde_json::json!({
        "id": id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": ts,
        "type": "payment_intent.succeeded",
        "livemode": false,
        "data": {"object": {"id": "pi_3MtwBwLkdIwHu7ix28a3tqPa", "object": "payment_intent", "amount": 2000}},
    })
    .to_string();
    let sig = sign::stripe(key, ts, body.as_bytes());
    Delivery::new(body).header("Stripe-Signature", sig)
}

/// `X-Hub-Signature-256: sha256=<hex>` over the body; the ID is `X-GitHub-Delivery`.
fn github(key: &[u8], id: &str, _ts: i64) -> Delivery {
    let body = serde_json::json!({
        "action": "opened",
        "issue": {"number": 1347, "title": "Found a bug"},
        "repository": {"full_name": "octocat/Hello-World"},
        "sender": {"login": "octocat"},
    })
    .to_string();
    let sig = sign::github(key, body.as_bytes());
    Delivery::new(body)
        .header("X-GitHub-Event", "issues")
        .header("X-GitHub-Delivery", id)
        .header("X-GitHub-Hook-ID", "292430182")
        .header("X-Hub-Signature-256", sig)
}

/// `X-Shopify-Hmac-Sha256: <base64>` over the body; the ID is `X-Shopify-Event-Id`.
fn shopify(key: &[u8], id: &str, _ts: i64) -> Delivery {
    let body = serde_json::json!({
        "id": 820982911946154508u64,
        "email": "jon@example.com",
        "total_price": "254.98",
    })
    .to_string();
    let sig = sign::shopify(key, body.as_bytes());
    Delivery::new(body)
        .header("X-Shopify-Topic", "orders/create")
        .header("X-Shopify-Shop-Domain", "example.myshopify.com")
        .header("X-Shopify-API-Version", "2024-07")
        .header(
            "X-Shopify-Webhook-Id",
            "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
        )
        .header("X-Shopify-Event-Id", id)
        .header("X-Shopify-Hmac-Sha256", sig)
}

/// `X-Slack-Signature: v0=<hex>` over `v0:ts:body`; the ID is the body's `/event_id`.
fn slack(key: &[u8], id: &str, ts: i64) -> Delivery {
    let body = serde_json::json!({
        "token": "XXYYZZ",
        "team_id": "T123ABC456",
        "api_app_id": "A123ABC456",
        "event": {"type": "app_mention", "user": "U123ABC456", "text": "<@U0LAN0Z89> hi", "ts": "1515449522.000016", "channel": "C123ABC456"},
        "type": "event_callback",
        "event_id": id,
        "event_time": ts,
    })
    .to_string();
    slack_signed(key, ts, body.into_bytes())
}

fn slack_signed(key: &[u8], ts: i64, body: Vec<u8>) -> Delivery {
    let sig = sign::slack(key, ts, &body);
    Delivery::new(body)
        .header("X-Slack-Request-Timestamp", ts.to_string())
        .header("X-Slack-Signature", sig)
}

fn standard_webhooks_body(id: &str) -> String {
    serde_json::json!({
        "type": "invoice.paid",
        "timestamp": "2024-06-01T12:00:00Z",
        "data": {"invoice": id, "amount": 1200},
    })
    .to_string()
}

/// `webhook-id` / `webhook-timestamp` / `webhook-signature: v1,<base64>` over `id.ts.body`.
fn standard_webhooks(key: &[u8], id: &str, ts: i64) -> Delivery {
    signed_set("webhook", key, id, ts, |sig| sig.to_string())
}

/// What Svix sends unless white-labelled: the same scheme under `svix-*` names.
fn svix(key: &[u8], id: &str, ts: i64) -> Delivery {
    signed_set("svix", key, id, ts, |sig| sig.to_string())
}

/// The Standard Webhooks header set under `prefix` (`webhook` or `svix`),
/// signed with `key`; `list` writes the signature header from the one
/// valid `v1,` entry (several entries, skipped ones).
fn signed_set(
    prefix: &str,
    key: &[u8],
    id: &str,
    ts: i64,
    list: impl FnOnce(&str) -> String,
) -> Delivery {
    let body = standard_webhooks_body(id);
    let sig = sign::standard_webhooks(key, id, ts, body.as_bytes());
    Delivery::new(body)
        .header(&format!("{prefix}-id"), id)
        .header(&format!("{prefix}-timestamp"), ts.to_string())
        .header(&format!("{prefix}-signature"), list(&sig))
}

// ------------------------------------------------------------ presets

/// One provider preset under test.
struct Preset {
    /// The `provider:` value, also the route name and the path `/hooks/{name}`.
    name: &'static str,
    sign: Signer,
    /// The event ID is in a header (so a 401 problem can name it).
    id_in_header: bool,
    /// The secret as configured (`whsec_…` for standard-webhooks and svix).
    secret: String,
    /// The key bytes the provider signs with.
    key: Vec<u8>,
}

impl Preset {
    fn new(name: &'static str, sign: Signer, id_in_header: bool, secret: &str) -> Preset {
        Preset {
            name,
            sign,
            id_in_header,
            secret: secret.to_string(),
            key: secret.as_bytes().to_vec(),
        }
    }

    /// standard-webhooks and svix: the secret is `whsec_` + base64 of the key.
    fn whsec(name: &'static str, sign: Signer, key: &[u8]) -> Preset {
        Preset {
            name,
            sign,
            id_in_header: true,
            secret: sign::standard_webhooks_secret(key),
            key: key.to_vec(),
        }
    }

    fn path(&self) -> String {
        format!("/hooks/{}", self.name)
    }

    fn var(&self) -> String {
        format!("{}_SECRET", self.name.to_uppercase().replace('-', "_"))
    }
}

/// A provider route written by hand: `provider: NAME` and a verify block with
/// `secrets` (YAML flow list) and `extra` route lines (4-space indent).
fn provider_route(name: &str, upstream: &str, secrets: &str, extra: &str) -> String {
    format!(
        "  - name: {name}\n    match:\n      path_prefix: /hooks/{name}\n    upstream: \"{upstream}\"\n    provider: {name}\n    verify:\n      secrets: {secrets}\n{extra}"
    )
}

/// A proxy with one provider route whose secret is the environment
/// variable `var`, set to `secret`; `extra` route lines as in `provider_route`.
fn provider_harness(test: &str, provider: &str, var: &str, secret: &str, extra: &str) -> Harness {
    Harness::sqlite(test)
        .yaml_with(|up| provider_route(provider, up, &format!("[env:{var}]"), extra))
        .env(var, secret)
        .start()
}

/// `provider_harness` for standard-webhooks or svix: the secret is
/// `whsec_` + base64 of `key`.
fn whsec_harness(test: &str, provider: &str, var: &str, key: &[u8]) -> Harness {
    let secret = sign::standard_webhooks_secret(key);
    provider_harness(test, provider, var, &secret, "")
}

/// An `hmac-sha256` verify block (route lines) on `header`, its secret in
/// the environment variable `var`.
fn hmac_verify(header: &str, var: &str) -> String {
    format!("    verify:\n      scheme: hmac-sha256\n      header: {header}\n      secrets: [env:{var}]\n")
}

/// Each delivery is refused with a 401 whose detail names its needle, and
/// the consumer has then seen `total` requests: none of the refused.
#[track_caller]
fn assert_refused(
    h: &Harness,
    path: &str,
    refused: Vec<(Delivery, &str)>,
    total: usize,
    why: &str,
) {
    for (d, needle) in refused {
        assert_invalid_signature(&d.post(h, path), needle);
    }
    assert_eq!(h.up.total(), total, "{why}");
}

/// Exit code of `events show` (0 found, 3 absent).
fn show_code(store: &str, route: &str, id: &str) -> i32 {
    cli(&["events", "show", "--store", store, "--route", route, id]).0
}

#[track_caller]
fn assert_invalid_signature(r: &Response, needle: &str) {
    assert_eq!(r.status, 401, "{:?}", r.text());
    assert_eq!(r.header("Content-Type"), Some("application/problem+json"));
    assert_eq!(r.header("Idempotency-Status"), Some("invalid_signature"));
    let p = r.json();
    assert_eq!(p["type"], INVALID_SIGNATURE, "{p}");
    assert_eq!(p["status"], 401);
    let detail = p["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(needle), "`{detail}` lacks `{needle}`");
}

/// The scenario every preset must pass: a signed delivery is forwarded once
/// and its duplicate replayed; a forged delivery (wrong secret) of a future
/// event ID is refused with 401, stores nothing and never reaches the
/// consumer; the genuine delivery of that ID is then forwarded.
fn preset_scenario(p: Preset) {
    let h = provider_harness(p.name, p.name, &p.var(), &p.secret, "");
    let path = p.path();
    let ts = unix_now();

    let id = eid(&format!("{}-evt", p.name));
    let first = (p.sign)(&p.key, &id, ts);
    let r = first.post(&h, &path);
    assert_eq!(r.status, 200, "{}: {}", p.name, h.log());
    assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
    assert_eq!(h.up.count(&id), 1, "{}", p.name);
    let got = &h.up.received()[0];
    assert_eq!(
        got.body, first.body,
        "the body reaches the consumer unchanged"
    );
    for (k, v) in &first.headers {
        assert_eq!(got.header(k), Some(v.as_str()), "{}: header {k}", p.name);
    }

    let dup = first.post(&h, &path);
    assert_eq!(
        (dup.status, dup.header("Idempotent-Replayed")),
        (200, Some("true")),
        "{}",
        p.name
    );
    assert_eq!(
        h.up.count(&id),
        1,
        "{}: the duplicate is not forwarded",
        p.name
    );

    // An attacker who knows (or guesses) the next event ID.
    let next = eid(&format!("{}-next", p.name));
    let forged = (p.sign)(b"not-the-secret", &next, ts);
    let r = forged.post(&h, &path);
    assert_invalid_signature(&r, "no signature matches");
    let named = r.json()["event_id"].as_str().map(str::to_owned);
    assert_eq!(named, p.id_in_header.then(|| next.clone()), "{}", p.name);
    assert_eq!(
        show_code(&h.store, p.name, &next),
        3,
        "{}: nothing stored",
        p.name
    );
    assert_eq!(h.up.total(), 1, "{}: the consumer is not contacted", p.name);

    // The genuine delivery of that ID was not pre-empted.
    let r = (p.sign)(&p.key, &next, unix_now()).post(&h, &path);
    assert_eq!(r.status, 200, "{}", p.name);
    assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
    assert_eq!(h.up.count(&next), 1, "{}", p.name);
    assert_eq!(show(&h.store, p.name, &next)["state"], "delivered");

    let series = |outcome: &str| h.requests(p.name, outcome);
    assert_eq!(series("invalid_signature"), 1.0, "{}", p.name);
    assert_eq!(series("forwarded"), 2.0, "{}", p.name);
    assert_eq!(series("replayed"), 1.0, "{}", p.name);
}

#[test]
fn stripe_preset() {
    preset_scenario(Preset::new(
        "stripe",
        stripe,
        false,
        "whsec_test_51NzQ2bKZ3nUZq8sStripeEndpointSecret",
    ));
}

#[test]
fn github_preset() {
    preset_scenario(Preset::new(
        "github",
        github,
        true,
        "It's a Secret to Everybody",
    ));
}

#[test]
fn shopify_preset() {
    preset_scenario(Preset::new(
        "shopify",
        shopify,
        true,
        "shpss_0123456789abcdef0123456789abcdef",
    ));
}

#[test]
fn slack_preset() {
    preset_scenario(Preset::new(
        "slack",
        slack,
        false,
        "8f742231b10e8888abcd99yyyzzz85a5",
    ));
}

#[test]
fn standard_webhooks_preset() {
    preset_scenario(Preset::whsec(
        "standard-webhooks",
        standard_webhooks,
        b"standard-webhooks key bytes \x00\x01\xfe\xff",
    ));
}

#[test]
fn svix_preset() {
    preset_scenario(Preset::whsec("svix", svix, b"svix key bytes, 24 long"));
}

/// A route keyed on `svix-id` takes its event ID from a header; the
/// signature covers `webhook-id` when the `webhook-*` set is sent. A captured
/// genuine delivery re-sent with another `svix-id` must not occupy that ID.
#[test]
fn svix_id_must_be_the_signed_id() {
    let key = b"svix-id-binding-key";
    let h = whsec_harness("svixid", "svix", "SVIX_SECRET", key);
    let captured = eid("msg-captured");
    let future = eid("msg-future");
    let replay = standard_webhooks(key, &captured, unix_now()).header("svix-id", &future);
    let r = replay.post(&h, "/hooks/svix");
    assert_invalid_signature(&r, "svix-id");
    assert_eq!(show_code(&h.store, "svix", &future), 3);
    assert_eq!(h.up.total(), 0);
    // Both sets naming the same message are fine.
    let both = standard_webhooks(key, &future, unix_now()).header("svix-id", &future);
    assert_eq!(both.post(&h, "/hooks/svix").status, 200);
    assert_eq!(h.up.count(&future), 1);
}

// ------------------------------------------------------------ timestamps

/// Stale and future timestamps are refused before anything is claimed;
/// a timestamp inside the tolerance passes.
#[test]
fn stale_and_future_timestamps_are_refused() {
    let presets = [
        Preset::new("stripe", stripe, false, "whsec_stripe_ts"),
        Preset::new("slack", slack, false, "slack-ts-secret"),
        Preset::whsec("standard-webhooks", standard_webhooks, b"sw-ts-key"),
    ];
    let mut h = Harness::sqlite("ts");
    for p in &presets {
        let extra = if p.name == "slack" {
            "      tolerance: 1m\n"
        } else {
            ""
        };
        h = h
            .yaml_with(|up| provider_route(p.name, up, &format!("[env:{}]", p.var()), extra))
            .env(&p.var(), &p.secret);
    }
    let h = h.start();

    for p in &presets {
        // Default tolerance 5m; slack's is set to 1m above.
        let tol = if p.name == "slack" { 60 } else { 300 };
        for (offset, why) in [
            (-(tol + 30), "old"),
            (-3 * 86_400, "old"),
            (tol + 30, "in the future"),
            (86_400, "in the future"),
        ] {
            let id = eid(&format!("{}-ts", p.name));
            let r = (p.sign)(&p.key, &id, unix_now() + offset).post(&h, &p.path());
            assert_invalid_signature(&r, why);
            assert_eq!(show_code(&h.store, p.name, &id), 3, "{} {offset}", p.name);
        }
        assert_eq!(h.up.total(), 0, "{}: the consumer is not contacted", p.name);
    }
    for p in &presets {
        let id = eid(&format!("{}-in", p.name));
        let r = (p.sign)(&p.key, &id, unix_now() - 40).post(&h, &p.path());
        assert_eq!(r.status, 200, "{}: inside the tolerance", p.name);
        assert_eq!(h.up.count(&id), 1);
    }
}

// ------------------------------------------------------------ rotation

/// Several secrets: a delivery signed with either passes (the second one in
/// the list too); one signed with neither does not.
#[test]
fn rotation_accepts_any_listed_secret() {
    let (gh_old, gh_new) = ("github-old-secret", "github-new-secret");
    let (sw_old, sw_new) = (b"sw-old-key".as_slice(), b"sw-new-key".as_slice());
    let h = Harness::sqlite("rot")
        .yaml_with(|up| provider_route("github", up, "[env:GH_OLD, env:GH_NEW]", ""))
        .yaml_with(|up| provider_route("standard-webhooks", up, "[env:SW_OLD, env:SW_NEW]", ""))
        .env("GH_OLD", gh_old)
        .env("GH_NEW", gh_new)
        .env("SW_OLD", &sign::standard_webhooks_secret(sw_old))
        .env("SW_NEW", &sign::standard_webhooks_secret(sw_new))
        .start();
    let cases: [(&str, Signer, &[u8], &[u8]); 2] = [
        ("github", github, gh_old.as_bytes(), gh_new.as_bytes()),
        ("standard-webhooks", standard_webhooks, sw_old, sw_new),
    ];
    for (name, signer, old, new) in cases {
        let path = format!("/hooks/{name}");
        for key in [new, old] {
            let id = eid(name);
            let r = signer(key, &id, unix_now()).post(&h, &path);
            assert_eq!(r.status, 200, "{name}");
            assert_eq!(h.up.count(&id), 1, "{name}");
        }
        let id = eid(name);
        let r = signer(b"retired-secret", &id, unix_now()).post(&h, &path);
        assert_invalid_signature(&r, "no signature matches");
        assert_eq!(show_code(&h.store, name, &id), 3);
    }
    assert_eq!(h.up.total(), 4);
}

/// Standard Webhooks lets a sender sign with several keys at once
/// (`v1,<a> v1,<b>`): one matching entry is enough.
#[test]
fn standard_webhooks_several_signatures_in_one_header() {
    let key = b"multi-sig-key";
    let h = whsec_harness("multi", "standard-webhooks", "SW", key);
    let id = eid("msg");
    let ts = unix_now();
    let body = standard_webhooks_body(&id);
    let other = sign::standard_webhooks(b"someone-else", &id, ts, body.as_bytes());
    let r = signed_set("webhook", key, &id, ts, |good| format!("{other} {good}"))
        .post(&h, "/hooks/standard-webhooks");
    assert_eq!(r.status, 200, "{}", h.log());
    assert_eq!(h.up.count(&id), 1);
}

/// Issue 20, "Signature lists": a list holding an entry that is not 32 bytes
/// (or not base64, or of another version) next to the valid one passes, as
/// the providers' own libraries skip such entries (SPEC §8); on the
/// standard-webhooks preset and on both header sets of the svix preset. The
/// skipped entries never make a forgery pass: with no valid entry the
/// delivery is refused, claims nothing and never reaches the consumer.
/// Before the fix, every list with a short entry was refused with 401.
#[test]
fn signature_lists_skip_entries_that_are_not_32_byte_v1() {
    let key = b"lenient-list-key";
    let h = Harness::sqlite("lenient")
        .yaml_with(|up| provider_route("standard-webhooks", up, "[env:SW]", ""))
        .yaml_with(|up| provider_route("svix", up, "[env:SW]", ""))
        .env("SW", &sign::standard_webhooks_secret(key))
        .start();
    let b64 = |bytes: &[u8]| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(bytes)
    };
    let short = format!("v1,{}", b64(&[7u8; 16]));
    let wrong = format!("v1,{}", b64(&[3u8; 32]));
    // (route, header prefix)
    let targets = [
        ("standard-webhooks", "webhook"),
        ("svix", "svix"),
        ("svix", "webhook"),
    ];
    for (route, prefix) in targets {
        let path = format!("/hooks/{route}");
        let deliver = |id: &str, list: &dyn Fn(&str) -> String| {
            signed_set(prefix, key, id, unix_now(), list).post(&h, &path)
        };
        for (what, list) in [
            (
                "a 16-byte entry first",
                &(|good: &str| format!("{short} {good}")) as &dyn Fn(&str) -> String,
            ),
            ("a 16-byte entry last", &|good: &str| {
                format!("{good} {short}")
            }),
            ("every kind of entry skipped", &|good: &str| {
                format!("v1,!!!! v1, {short} v1a,Zm9vYmFy junk v2,abc {good}")
            }),
        ] {
            let id = eid(&format!("{route}-{prefix}-ok"));
            let r = deliver(&id, list);
            assert_eq!(r.status, 200, "{route}/{prefix}, {what}: {:?}", r.text());
            assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
            assert_eq!(h.up.count(&id), 1, "{route}/{prefix}, {what}");
        }
        let before = h.up.total();
        for (what, list, needle) in [
            (
                "only skipped entries",
                &(|_: &str| format!("{short} v1,!!!! v1a,Zm9vYmFy")) as &dyn Fn(&str) -> String,
                "no `v1,` signature is base64 of 32 bytes",
            ),
            (
                "skipped entries and a wrong one",
                &|_: &str| format!("{short} {wrong}"),
                "no signature matches",
            ),
        ] {
            let id = eid(&format!("{route}-{prefix}-forged"));
            let r = deliver(&id, list);
            assert_invalid_signature(&r, needle);
            assert_eq!(
                show_code(&h.store, route, &id),
                3,
                "{route}/{prefix}, {what}: nothing claimed"
            );
        }
        assert_eq!(
            h.up.total(),
            before,
            "{route}/{prefix}: no forgery reaches the consumer"
        );
    }
}

// ------------------------------------------------------------ slack url_verification

/// Slack's url_verification handshake has no `event_id`: signed, it reaches
/// the consumer unguarded (nothing claimed); unsigned or forged, it is refused.
#[test]
fn slack_url_verification_passes_unguarded_only_when_signed() {
    let secret = "slack-signing-secret";
    let h = provider_harness("slackuv", "slack", "SLACK_SIGNING_SECRET", secret, "");
    let body = br#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;

    let unsigned = Delivery::new(body.as_slice());
    let forged = slack_signed(b"guess", unix_now(), body.to_vec());
    let no_ts = slack_signed(secret.as_bytes(), unix_now(), body.to_vec())
        .without("X-Slack-Request-Timestamp");
    let refused = vec![
        (unsigned, "missing signature header `x-slack-signature`"),
        (forged, "no signature matches"),
        (no_ts, "x-slack-request-timestamp"),
    ];
    let why = "refused handshakes never reach the consumer";
    assert_refused(&h, "/hooks/slack", refused, 0, why);

    let signed =
        slack_signed(secret.as_bytes(), unix_now(), body.to_vec()).post(&h, "/hooks/slack");
    assert_eq!(signed.status, 200, "{}", h.log());
    assert_eq!(signed.header("Idempotency-Status"), Some("unguarded"));
    let got = only_request(&h, body);
    assert_eq!(got.header("Idempotency-Key"), None, "nothing was claimed");
    let (code, out, err) = cli(&["events", "list", "--store", &h.store, "--json"]);
    assert_eq!((code, out.trim()), (0, "[]"), "{err}");
    assert_eq!(h.requests("slack", "invalid_signature"), 3.0);
}

// ------------------------------------------------------------ generic hmac-sha256, secrets

/// The generic scheme: a hex HMAC-SHA256 of the body in a header of the
/// route's choosing (either case, optional `sha256=`).
#[test]
fn generic_hmac_sha256_with_a_custom_header() {
    let secret = "generic-hmac-secret";
    let verify = hmac_verify("X-Acme-Signature", "ACME_SECRET");
    let h = Harness::sqlite("hmac")
        .route("acme", "/hooks/acme", &verify)
        .env("ACME_SECRET", secret)
        .start();
    let body = br#"{"event":"order.paid","order":42}"#;
    let hex = sign::hmac_hex(secret.as_bytes(), body);
    let post = |id: &str, sig: Option<String>| {
        let mut d = Delivery::new(body.as_slice()).header("X-Event-ID", id);
        if let Some(sig) = sig {
            d = d.header("X-Acme-Signature", sig);
        }
        d.post(&h, "/hooks/acme")
    };
    for (i, sig) in [hex.clone(), hex.to_uppercase(), format!("sha256={hex}")]
        .into_iter()
        .enumerate()
    {
        let id = eid(&format!("acme{i}"));
        assert_eq!(post(&id, Some(sig)).status, 200);
        assert_eq!(h.up.count(&id), 1);
    }
    let id = eid("acme-forged");
    let forged = sign::hmac_hex(b"wrong", body);
    assert_invalid_signature(&post(&id, Some(forged)), "no signature matches");
    // The generic scheme reads only its own header.
    let r = post(&id, None);
    assert_invalid_signature(&r, "missing signature header `x-acme-signature`");
    let r = Delivery::new(body.as_slice())
        .header("X-Event-ID", &id)
        .header("X-Hub-Signature-256", format!("sha256={hex}"))
        .post(&h, "/hooks/acme");
    assert_invalid_signature(&r, "x-acme-signature");
    assert_invalid_signature(&post(&id, Some("zz".repeat(32))), "64 hex digits");
    assert_eq!(show_code(&h.store, "acme", &id), 3);
    assert_eq!(h.up.total(), 3);
    assert_eq!(post(&id, Some(hex)).status, 200);
    assert_eq!(h.up.count(&id), 1);
}

/// `file:` secrets: one trailing newline is dropped (as editors add one), and
/// a `whsec_` secret in a file is decoded like one from the environment.
#[test]
fn file_secrets() {
    let h = Harness::sqlite("filesecret");
    let (gh, sw) = (h.path("github.secret"), h.path("sw.secret"));
    std::fs::write(&gh, "file-github-secret\n").unwrap();
    let sw_key = b"file-sw-key";
    std::fs::write(
        &sw,
        format!("{}\r\n", sign::standard_webhooks_secret(sw_key)),
    )
    .unwrap();
    let file = |p: &std::path::Path| format!("[\"file:{}\"]", p.display());
    let h = h
        .yaml_with(|up| provider_route("github", up, &file(&gh), ""))
        .yaml_with(|up| provider_route("svix", up, &file(&sw), ""))
        .start();
    let id = eid("gh");
    let r = github(b"file-github-secret", &id, unix_now()).post(&h, "/hooks/github");
    assert_eq!(r.status, 200, "{}", h.log());
    let r = github(b"file-github-secret\n", &eid("gh"), unix_now()).post(&h, "/hooks/github");
    assert_invalid_signature(&r, "no signature matches");
    let id2 = eid("msg");
    assert_eq!(
        svix(sw_key, &id2, unix_now())
            .post(&h, "/hooks/svix")
            .status,
        200
    );
    assert_eq!((h.up.count(&id), h.up.count(&id2), h.up.total()), (1, 1, 2));
}

// ------------------------------------------------------------ no unverified path

/// Every way a guarded request can reach the consumer without a claim
/// (`on_missing_id: forward`, `body_digest`) still checks the signature first.
#[test]
fn no_guarded_path_skips_verification() {
    let verify = hmac_verify("X-Sig", "PATHS_SECRET");
    let forward = format!("    on_missing_id: forward\n{verify}");
    let digest = format!("    on_missing_id: body_digest\n{verify}");
    let h = Harness::sqlite("paths")
        .route("fwd", "/hooks/fwd", &forward)
        .route("dig", "/hooks/dig", &digest)
        .env("PATHS_SECRET", "paths")
        .start();
    let body = br#"{"no":"id"}"#;
    for path in ["/hooks/fwd", "/hooks/dig"] {
        let forged = Delivery::new(body.as_slice())
            .header("X-Sig", sign::hmac_hex(b"nope", body))
            .post(&h, path);
        assert_invalid_signature(&forged, "no signature matches");
        let unsigned = Delivery::new(body.as_slice()).post(&h, path);
        assert_invalid_signature(&unsigned, "missing signature header");
    }
    assert_eq!(h.up.total(), 0);
    let (code, out, _) = cli(&["events", "list", "--store", &h.store, "--json"]);
    assert_eq!((code, out.trim()), (0, "[]"), "nothing claimed");

    let signed = Delivery::new(body.as_slice()).header("X-Sig", sign::hmac_hex(b"paths", body));
    let r = signed.post(&h, "/hooks/fwd");
    assert_eq!(
        (r.status, r.header("Idempotency-Status")),
        (200, Some("unguarded"))
    );
    let r = signed.post(&h, "/hooks/dig");
    assert_eq!(
        (r.status, r.header("Idempotency-Status")),
        (200, Some("forwarded"))
    );
    assert_eq!(h.up.total(), 2);
}

/// `on_store_error: forward` forwards unguarded when the store fails, but
/// never a request whose signature does not verify: the check comes first.
#[test]
fn store_error_forward_still_verifies() {
    let forward = "    on_store_error: forward\n";
    let h = provider_harness("storeerr", "github", "GH", "store-error-secret", forward);
    let db = h.sqlite_path();
    // Break the store under the running proxy: every claim now fails.
    for suffix in ["", "-wal", "-shm"] {
        let mut p = db.clone().into_os_string();
        p.push(suffix);
        let p = PathBuf::from(p);
        if p.exists() {
            std::fs::write(&p, vec![0x5a; 8192]).unwrap();
        }
    }
    let key = b"store-error-secret";
    let id = eid("gh");
    let r = github(key, &id, unix_now()).post(&h, "/hooks/github");
    assert_eq!(
        (r.status, r.header("Idempotency-Status")),
        (200, Some("unguarded")),
        "the store must be broken for this test to mean anything: {}",
        h.log()
    );
    assert_eq!(h.up.total(), 1);
    let forged = github(b"forged", &eid("gh"), unix_now());
    let unsigned = github(key, &eid("gh"), unix_now()).without("X-Hub-Signature-256");
    let refused = vec![
        (forged, "no signature matches"),
        (unsigned, "missing signature header"),
    ];
    let why = "forged deliveries never reach the consumer";
    assert_refused(&h, "/hooks/github", refused, 1, why);
}

// ------------------------------------------------------------ config errors (CLI)

/// Writes a config with `routes` to `dir/name` and returns its path.
fn write_config(dir: &TempDir, name: &str, routes: &str) -> PathBuf {
    let path = dir.path().join(name);
    let text = config_text(free_port(), free_port(), &dir.sqlite_url("c.db"), routes);
    std::fs::write(&path, text).unwrap();
    path
}

/// `file:line:col` of the first occurrence of `needle` in the file.
fn position(path: &Path, needle: &str) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let (i, line) = text
        .lines()
        .enumerate()
        .find(|(_, l)| l.contains(needle))
        .expect("needle in config");
    format!(
        "{}:{}:{}",
        path.display(),
        i + 1,
        line.find(needle).unwrap() + 1
    )
}

/// A secret that cannot be read, or a `whsec_` secret that does not decode:
/// `check` and `serve` exit 2, name each spot, and never print the secret.
#[test]
fn unreadable_or_invalid_secrets_are_config_errors() {
    let dir = TempDir::new("secrets");
    let up = "http://127.0.0.1:9";
    let bad_whsec = "whsec_c2VjcmV0*not-base64!";
    let bad_file = dir.path().join("bad.whsec");
    std::fs::write(&bad_file, "whsec_ZmlsZQ$$$\n").unwrap();
    let missing_file = dir.path().join("missing.secret");
    let routes = provider_route("github", up, "[env:IDEMGATE_TEST_UNSET_SECRET]", "")
        + &provider_route(
            "shopify",
            up,
            &format!("[file:{}]", missing_file.display()),
            "",
        )
        + &provider_route("svix", up, "[env:SVIX_BAD]", "")
        + &provider_route(
            "standard-webhooks",
            up,
            &format!("[env:SW_OK, file:{}]", bad_file.display()),
            "",
        );
    let cfg = write_config(&dir, "bad.yaml", &routes);
    let env = [("SVIX_BAD", bad_whsec), ("SW_OK", "whsec_aGVsbG8=")];
    let expected = [
        (
            position(&cfg, "env:IDEMGATE_TEST_UNSET_SECRET"),
            "routes[0].verify.secrets[0]",
            "environment variable `IDEMGATE_TEST_UNSET_SECRET` is not set",
        ),
        (
            position(&cfg, "file:"),
            "routes[1].verify.secrets[0]",
            "cannot read the file",
        ),
        (
            position(&cfg, "env:SVIX_BAD"),
            "routes[2].verify.secrets[0]",
            "not valid base64",
        ),
        (
            position(&cfg, &format!("file:{}", bad_file.display())),
            "routes[3].verify.secrets[1]",
            "not valid base64",
        ),
    ];
    let cfg_s = cfg.display().to_string();
    for cmd in ["check", "serve"] {
        let (code, out, err) = cli_env(&[cmd, "--config", &cfg_s], &env);
        assert_eq!(code, 2, "{cmd}: {out}{err}");
        for (at, path, msg) in &expected {
            let line = format!("{at}: {path}: ");
            let hit = err.lines().find(|l| l.starts_with(&line));
            let hit = hit.unwrap_or_else(|| panic!("{cmd}: no `{line}` in:\n{err}"));
            assert!(hit.contains(msg), "{cmd}: `{hit}` lacks `{msg}`");
        }
        for secret in [bad_whsec, "c2VjcmV0", "ZmlsZQ", "aGVsbG8"] {
            assert!(
                !out.contains(secret) && !err.contains(secret),
                "{cmd} echoed a secret:\n{out}{err}"
            );
        }
    }
    // An inline secret is refused without being echoed.
    let inline = write_config(
        &dir,
        "inline.yaml",
        &provider_route("github", up, "[hunter2-inline]", ""),
    );
    let (code, out, err) = cli(&["check", "--config", &inline.display().to_string()]);
    assert_eq!(code, 2, "{out}{err}");
    let at = position(&inline, "hunter2");
    assert!(
        err.contains(&format!("{at}: routes[0].verify.secrets[0]: ")),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}

/// A valid config with secrets: `check` prints its routes and never a secret.
#[test]
fn check_never_prints_secret_values() {
    let dir = TempDir::new("checkok");
    let routes = provider_route("stripe", "http://127.0.0.1:9", "[env:S1, env:S2]", "");
    let cfg = write_config(&dir, "ok.yaml", &routes);
    let (s1, s2) = ("whsec_first_secret_value", "whsec_second_secret_value");
    let (code, out, err) = cli_env(
        &["check", "--config", &cfg.display().to_string()],
        &[("S1", s1), ("S2", s2)],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("provider=stripe") && out.contains("verify=stripe (2 secret(s))"),
        "{out}"
    );
    assert!(
        !out.contains("secret_value") && !err.contains("secret_value"),
        "{out}{err}"
    );
}

/// `check` warns (exit 0) when retention is shorter than the provider's
/// redelivery horizon; enough retention gives no warning.
#[test]
fn check_warns_when_retention_is_shorter_than_the_redelivery_horizon() {
    let dir = TempDir::new("horizon");
    let up = "http://127.0.0.1:9";
    let cases = [
        ("stripe", "2d", "3d"),
        ("github", "1d", "3d"),
        ("shopify", "3h", "4h"),
        ("slack", "30m", "1h"),
        ("standard-webhooks", "3d", "76h"),
        ("svix", "20h", "28h"),
    ];
    let env = [
        ("STRIPE_SECRET", "whsec_aGVsbG8="),
        ("GITHUB_SECRET", "whsec_aGVsbG8="),
        ("SHOPIFY_SECRET", "whsec_aGVsbG8="),
        ("SLACK_SECRET", "whsec_aGVsbG8="),
        ("STANDARD_WEBHOOKS_SECRET", "whsec_aGVsbG8="),
        ("SVIX_SECRET", "whsec_aGVsbG8="),
    ];
    let secrets = |p: &str| format!("[env:{}_SECRET]", p.to_uppercase().replace('-', "_"));
    // `check` on the six routes, route i with `retentions[i]`: its stderr and the file.
    let check = |file: &str, retentions: &[&str]| {
        let routes: String = cases
            .iter()
            .zip(retentions)
            .map(|((p, _, _), r)| {
                provider_route(p, up, &secrets(p), &format!("    retention: {r}\n"))
            })
            .collect();
        let cfg = write_config(&dir, file, &routes);
        let (code, _, err) = cli_env(&["check", "--config", &cfg.display().to_string()], &env);
        assert_eq!(code, 0, "{err}");
        (err, cfg)
    };
    let (err, cfg) = check("short.yaml", &cases.map(|(_, short, _)| short));
    let text = std::fs::read_to_string(&cfg).unwrap();
    for (i, (p, short, _)) in cases.iter().enumerate() {
        // The value of this route's `    retention: …` line (each is distinct).
        let line_no = 1 + text
            .lines()
            .position(|l| l == format!("    retention: {short}"))
            .unwrap();
        let want = format!(
            "warning: {}:{line_no}:16: routes[{i}].retention: retention {short} is shorter than {p}'s redelivery horizon",
            cfg.display()
        );
        assert!(
            err.lines().any(|l| l.starts_with(&want)),
            "no `{want}` in:\n{err}"
        );
    }
    assert_eq!(
        err.lines().filter(|l| l.starts_with("warning:")).count(),
        6,
        "{err}"
    );

    let (err, _) = check("enough.yaml", &cases.map(|(_, _, enough)| enough));
    assert!(!err.contains("warning"), "{err}");
}

// ------------------------------------------------------------ shipped configs

/// Every YAML config under `config/` (subfolders included) passes
/// `idemgate check` with the env variables it names set to dummy values, and
/// without warnings; there is one ready example per provider.
#[test]
fn shipped_configs_pass_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    let mut dirs = vec![root.join("config")];
    while let Some(dir) = dirs.pop() {
        for path in std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()) {
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                files.push(path);
            }
        }
    }
    for p in [
        "stripe",
        "github",
        "shopify",
        "slack",
        "standard-webhooks",
        "svix",
    ] {
        let f = root.join(format!("config/providers/{p}.yaml"));
        assert!(files.contains(&f), "missing {}", f.display());
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(text.contains(&format!("provider: {p}")), "{}", f.display());
        assert!(
            text.contains("secrets: [env:"),
            "{}: env: secrets",
            f.display()
        );
    }
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        if !text.lines().any(|l| l.starts_with("routes:")) {
            continue; // alert rules, dashboards
        }
        // Every `env:NAME` and `${NAME}` the file mentions.
        let mut vars = Vec::new();
        for (open, close) in [
            ("env:", &[',', ']', '}', ' ', '\n', '"'][..]),
            ("${", &['}'][..]),
        ] {
            for (i, _) in text.match_indices(open) {
                let rest = &text[i + open.len()..];
                let end = rest.find(close).unwrap_or(rest.len());
                vars.push(rest[..end].to_string());
            }
        }
        vars.retain(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        let env: Vec<(&str, &str)> = vars
            .iter()
            .map(|v| (v.as_str(), "whsec_ZHVtbXktc2VjcmV0LWZvci1jaGVjaw"))
            .collect();
        let (code, out, err) = cli_env(&["check", "--config", &f.display().to_string()], &env);
        assert_eq!(code, 0, "{}:\n{err}", f.display());
        assert!(!err.contains("warning"), "{}:\n{err}", f.display());
        assert!(!out.is_empty(), "{}: check prints the routes", f.display());
    }
}
