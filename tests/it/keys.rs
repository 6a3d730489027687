//! SPEC §17 against the real binary, a real consumer and a real SQLite
//! store: composite event IDs, the declarative `hmac` scheme in each of its
//! forms, the paddle, gitlab, typeform and zoom presets, and Ed25519 `v1a`
//! entries for standard-webhooks and svix.
//!
//! Deliveries are signed by the senders' own libraries where one exists on
//! PyPI (Paddle's SDK's HMAC, the `standardwebhooks` package, Python's
//! `cryptography` for Ed25519, which no Standard Webhooks library signs
//! with), else by `idemgate::verify::sign`, itself checked against vectors
//! computed with Python's `hmac` (src/verify/declarative_tests.rs). Without
//! python3 or a package, a library-signed test prints `SKIP` and passes —
//! except in CI (`CI` set), where it fails.

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use idemgate::verify::{sign, Algorithm, Encoding};
use serde_json::{json, Value};

const INVALID_SIGNATURE: &str = "urn:idemgate:problem:invalid-signature";

// ------------------------------------------------------------ helpers

type Headers = Vec<(String, String)>;

/// Makes a signed delivery (headers, body) of an event: (key, event ID).
type Deliver<'a> = &'a dyn Fn(&[u8], &str) -> (Headers, Vec<u8>);

fn headers(pairs: &[(&str, &str)]) -> Headers {
    let mut h = vec![("Content-Type".to_string(), "application/json".to_string())];
    h.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    h
}

/// A proxy with one route named `name` at `/hooks/{name}`: `lines` are the
/// route's own lines (4-space indent) after `upstream`.
fn harness(name: &str, lines: &str, env: &[(&str, &str)]) -> Harness {
    let mut b = Harness::sqlite(&format!("keys-{name}")).yaml_with(|up| {
        format!("  - name: {name}\n    match:\n      path_prefix: /hooks/{name}\n    upstream: \"{up}\"\n{lines}")
    });
    for (k, v) in env {
        b = b.env(k, v);
    }
    b.start()
}

#[track_caller]
fn assert_forwarded(r: &Response, why: &str) {
    assert_eq!(r.status, 200, "{why}: {:?}", r.text());
    assert_eq!(r.header("Idempotency-Status"), Some("forwarded"), "{why}");
}

#[track_caller]
fn assert_replayed(r: &Response, why: &str) {
    assert_eq!(
        (r.status, r.header("Idempotent-Replayed")),
        (200, Some("true")),
        "{why}: {:?}",
        r.text()
    );
}

#[track_caller]
fn assert_invalid_signature(r: &Response, needle: &str) {
    assert_eq!(r.status, 401, "{:?}", r.text());
    let p = r.json();
    assert_eq!(p["type"], INVALID_SIGNATURE, "{p}");
    let detail = p["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(needle), "`{detail}` lacks `{needle}`");
}

/// Runs `script` with `input` as its stdin (JSON) and returns its stdout
/// (JSON), within 60 s. `None` after printing SKIP when python3 or a
/// package it imports is missing (a panic in CI).
fn python(script: &str, input: &Value, package: &str) -> Option<Value> {
    let run = || -> Result<Value, String> {
        let mut child = Command::new("python3")
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("python3 cannot be run: {e}"))?;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(input.to_string().as_bytes()).unwrap();
        drop(stdin);
        let (tx, rx) = mpsc::channel();
        let pid = child.id();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let out = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(out) => out.map_err(|e| e.to_string())?,
            Err(_) => {
                let _ = Command::new("kill").arg(pid.to_string()).status();
                return Err("python3 did not answer within 60s".into());
            }
        };
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            return Err(format!("python3 failed: {last}"));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    };
    match run() {
        Ok(v) => Some(v),
        Err(why) if why.contains("ModuleNotFoundError") || why.contains("cannot be run") => {
            if std::env::var_os("CI").is_some() {
                panic!("{why}; CI requires it (`python3 -m pip install {package}`)");
            }
            eprintln!("SKIP: {why}; `python3 -m pip install {package}` to run this test");
            None
        }
        Err(why) => panic!("{why}"),
    }
}

// ------------------------------------------------------------ composite IDs

#[test]
fn composite_ids_scope_event_ids_by_tenant() {
    let h = harness(
        "tenants",
        "    event_id:\n      parts: [{json_pointer: /team_id}, {json_pointer: /event_id}]\n    verify: none\n",
        &[],
    );
    let event = eid("Ev");
    let body = |team: &str, id: &str| json!({"team_id": team, "event_id": id, "x": 1}).to_string();
    let post = |b: &str| h.post("/hooks/tenants", &headers(&[]), b.as_bytes());

    // two tenants, one event ID: two events
    assert_forwarded(&post(&body("T1", &event)), "tenant 1");
    assert_forwarded(
        &post(&body("T2", &event)),
        "tenant 2: not a replay of tenant 1",
    );
    // the same pair again: a replay
    assert_replayed(&post(&body("T1", &event)), "tenant 1 again");
    assert_replayed(&post(&body("T2", &event)), "tenant 2 again");
    assert_eq!(h.up.total(), 2);
    assert_eq!(
        show(&h.store, "tenants", &format!("T1:{event}"))["state"],
        "delivered"
    );
    assert_eq!(
        show(&h.store, "tenants", &format!("T2:{event}"))["state"],
        "delivered"
    );
    // the consumer gets the composite key
    let got = h.up.received();
    assert_eq!(
        got[0].header("Idempotency-Key"),
        Some(format!("T1:{event}").as_str())
    );

    // a part missing is a missing ID; a tenant with `:` could pose as another
    let r = post(&json!({"event_id": event}).to_string());
    assert_eq!(r.status, 400, "{:?}", r.text());
    assert_eq!(r.json()["type"], "urn:idemgate:problem:missing-event-id");
    let r = post(&body("T1:x", &event));
    assert_eq!(r.status, 400, "{:?}", r.text());
    assert_eq!(r.json()["type"], "urn:idemgate:problem:invalid-event-id");
    assert_eq!(h.up.total(), 2);
}

#[test]
fn composite_ids_mix_headers_and_the_body() {
    let h = harness(
        "mixed",
        "    event_id:\n      parts: [{header: X-Tenant}, {json_pointer: /id}]\n    verify: none\n",
        &[],
    );
    let id = eid("m");
    let body = json!({"id": id}).to_string();
    let post = |tenant: &str| {
        h.post(
            "/hooks/mixed",
            &headers(&[("X-Tenant", tenant)]),
            body.as_bytes(),
        )
    };
    assert_forwarded(&post("acme"), "acme");
    assert_forwarded(&post("globex"), "globex");
    assert_replayed(&post("acme"), "acme again");
    assert_eq!(h.up.total(), 2);
    let r = h.post("/hooks/mixed", &headers(&[]), body.as_bytes());
    assert_eq!(r.status, 400);
}

// ------------------------------------------------------------ declarative hmac

/// `scheme: hmac` over the body alone: sha1, hex, a prefix.
#[test]
fn declarative_body_signature() {
    let h = harness(
        "body",
        "    event_id: {header: X-Delivery}\n    verify:\n      scheme: hmac\n      secrets: [env:BODY_SECRET]\n      algorithm: sha1\n      header: X-Signature\n      prefix: \"sha1=\"\n",
        &[("BODY_SECRET", "body-secret")],
    );
    let id = eid("b");
    let body = br#"{"action":"opened"}"#;
    let sig = |key: &[u8]| {
        format!(
            "sha1={}",
            sign::tag(Algorithm::Sha1, Encoding::Hex, key, &[body])
        )
    };
    let post = |key: &[u8], id: &str| {
        h.post(
            "/hooks/body",
            &headers(&[("X-Delivery", id), ("X-Signature", &sig(key))]),
            body,
        )
    };
    assert_forwarded(&post(b"body-secret", &id), "signed");
    assert_replayed(&post(b"body-secret", &id), "duplicate");
    let next = eid("b-next");
    assert_invalid_signature(&post(b"forged", &next), "no signature matches");
    assert_eq!(
        cli(&["events", "show", "--store", &h.store, "--route", "body", &next]).0,
        3
    );
    // without the prefix the signature is malformed
    let bare = sign::tag(Algorithm::Sha1, Encoding::Hex, b"body-secret", &[body]);
    let r = h.post(
        "/hooks/body",
        &headers(&[("X-Delivery", &next), ("X-Signature", &bare)]),
        body,
    );
    assert_invalid_signature(&r, "x-signature");
    assert_eq!(h.up.total(), 1);
}

/// `scheme: hmac` over a timestamped message: sha512, base64, the
/// timestamp in its own header, the signed event ID and a signed header.
#[test]
fn declarative_timestamped_message() {
    let h = harness(
        "stamped",
        "    event_id: {header: X-Event}\n    verify:\n      scheme: hmac\n      secrets: [env:TS_SECRET]\n      algorithm: sha512\n      encoding: base64\n      header: X-Signature\n      timestamp: {header: X-Timestamp}\n      message: \"{id}.{timestamp}.{header:X-Account}.{body}\"\n      tolerance: 1m\n",
        &[("TS_SECRET", "ts-secret")],
    );
    let body = br#"{"kind":"invoice.paid"}"#;
    let post = |key: &[u8], id: &str, ts: i64, account: &str, signed_account: &str| {
        let t = ts.to_string();
        let parts: [&[u8]; 7] = [
            id.as_bytes(),
            b".",
            t.as_bytes(),
            b".",
            signed_account.as_bytes(),
            b".",
            body,
        ];
        let sig = sign::tag(Algorithm::Sha512, Encoding::Base64, key, &parts);
        let hs = headers(&[
            ("X-Event", id),
            ("X-Timestamp", &t),
            ("X-Account", account),
            ("X-Signature", &sig),
        ]);
        h.post("/hooks/stamped", &hs, body)
    };
    let id = eid("s");
    let now = unix_now();
    assert_forwarded(&post(b"ts-secret", &id, now, "a1", "a1"), "signed");
    assert_replayed(&post(b"ts-secret", &id, now, "a1", "a1"), "duplicate");
    let other = eid("s2");
    // signed for another event ID, another account, too old, wrong key
    let moved = {
        let t = now.to_string();
        let parts: [&[u8]; 7] = [id.as_bytes(), b".", t.as_bytes(), b".", b"a1", b".", body];
        let sig = sign::tag(Algorithm::Sha512, Encoding::Base64, b"ts-secret", &parts);
        let hs = headers(&[
            ("X-Event", &other),
            ("X-Timestamp", &t),
            ("X-Account", "a1"),
            ("X-Signature", &sig),
        ]);
        h.post("/hooks/stamped", &hs, body)
    };
    assert_invalid_signature(&moved, "no signature matches");
    assert_invalid_signature(
        &post(b"ts-secret", &other, now, "a2", "a1"),
        "no signature matches",
    );
    assert_invalid_signature(&post(b"ts-secret", &other, now - 120, "a1", "a1"), "old");
    assert_invalid_signature(
        &post(b"forged", &other, now, "a1", "a1"),
        "no signature matches",
    );
    assert_eq!(h.up.total(), 1);
    assert_forwarded(
        &post(b"ts-secret", &other, now, "a1", "a1"),
        "the genuine one",
    );
}

/// `scheme: hmac` with a `k=v` list holding the timestamp and several
/// signatures (a rotation): any may match.
#[test]
fn declarative_list_with_several_signatures() {
    let h = harness(
        "listed",
        "    event_id: {json_pointer: /id}\n    verify:\n      scheme: hmac\n      secrets: [env:NEW_SECRET]\n      header: X-Signature\n      signature_param: v1\n      timestamp: {param: t}\n      message: \"{timestamp}.{body}\"\n",
        &[("NEW_SECRET", "new-secret")],
    );
    let id = eid("l");
    let body = json!({"id": id}).to_string();
    let now = unix_now().to_string();
    let tag = |key: &[u8]| {
        sign::tag(
            Algorithm::Sha256,
            Encoding::Hex,
            key,
            &[now.as_bytes(), b".", body.as_bytes()],
        )
    };
    let post = |value: String| {
        h.post(
            "/hooks/listed",
            &headers(&[("X-Signature", &value)]),
            body.as_bytes(),
        )
    };
    // the sender signs with the old and the new secret during its rotation
    let both = format!(
        "t={now},v1={},v1={}",
        tag(b"old-secret"),
        tag(b"new-secret")
    );
    assert_forwarded(&post(both.clone()), "old and new");
    assert_replayed(
        &post(format!("v1={};t={now}", tag(b"new-secret"))),
        "new only, `;`, in another order",
    );
    let r = post(format!(
        "t={now},v1={},v1={}",
        tag(b"old-secret"),
        tag(b"other")
    ));
    assert_invalid_signature(&r, "no signature matches");
    assert_invalid_signature(&post(format!("v1={}", tag(b"new-secret"))), "x-signature");
    assert_eq!(h.up.total(), 1);
}

// ------------------------------------------------------------ presets

/// A preset's scenario: `deliver(key, id, body_id)` makes a signed delivery
/// (headers, body) of event `id`; the genuine one is forwarded once and
/// replayed, a forged one refused with nothing stored.
fn preset_scenario(
    name: &str,
    secret: &str,
    extra: &str,
    deliver: Deliver<'_>,
    key_of: &dyn Fn(&str) -> String,
) -> Harness {
    let var = format!("{}_SECRET", name.to_uppercase());
    let h = harness(
        name,
        &format!("    provider: {name}\n    verify:\n      secrets: [env:{var}]\n    retention: 30d\n{extra}"),
        &[(&var, secret)],
    );
    let path = format!("/hooks/{name}");
    let id = eid(name);
    let (hs, body) = deliver(secret.as_bytes(), &id);
    assert_forwarded(&h.post(&path, &hs, &body), name);
    assert_eq!(
        h.up.received()[0].body,
        body,
        "{name}: the body reaches the consumer unchanged"
    );
    assert_replayed(&h.post(&path, &hs, &body), name);
    let next = eid(&format!("{name}-next"));
    let (hs, body) = deliver(b"not-the-secret", &next);
    assert_invalid_signature(&h.post(&path, &hs, &body), "");
    assert_eq!(
        cli(&[
            "events",
            "show",
            "--store",
            &h.store,
            "--route",
            name,
            &key_of(&next)
        ])
        .0,
        3
    );
    assert_eq!(
        h.up.total(),
        1,
        "{name}: the forgery never reaches the consumer"
    );
    let (hs, body) = deliver(secret.as_bytes(), &next);
    assert_forwarded(&h.post(&path, &hs, &body), name);
    assert_eq!(show(&h.store, name, &key_of(&next))["state"], "delivered");
    assert_eq!(h.requests(name, "invalid_signature"), 1.0);
    h
}

fn paddle_body(id: &str) -> String {
    json!({
        "event_id": id,
        "event_type": "transaction.completed",
        "occurred_at": "2024-04-12T10:18:49.621022Z",
        "notification_id": "ntf_01hv8x2az4shn3n9zp4jk7xn0p",
        "data": {"id": "txn_01hv8wptq8987qeep44cyrewp9", "status": "completed"},
    })
    .to_string()
}

/// Paddle's SDK (`paddle-python-sdk`) signs (its HMAC) and verifies.
const PADDLE_PY: &str = r#"
import json, sys
from paddle_billing.Notifications import PaddleSignature, Secret
req = json.load(sys.stdin)
out = []
for body in req["bodies"]:
    ts = req["ts"]
    h1 = PaddleSignature.calculate_hmac(req["secret"], f"{ts}:{body}".encode()).hexdigest()
    header = f"ts={ts};h1={h1}"
    ok = PaddleSignature().verify(header, body, Secret(req["secret"]))
    out.append([header, ok])
print(json.dumps(out))
"#;

#[test]
fn paddle_preset() {
    let deliver = |key: &[u8], id: &str| {
        let body = paddle_body(id);
        let sig = sign::paddle(key, unix_now(), body.as_bytes());
        (headers(&[("Paddle-Signature", &sig)]), body.into_bytes())
    };
    let secret = "pdl_ntfset_01hv8wtj6ykyq7dp8g8azxhdcz_secret";
    let h = preset_scenario("paddle", secret, "", &deliver, &|id| id.to_string());

    // signed by Paddle's own SDK, which also accepts what sign::paddle makes
    let ids = [eid("paddle-sdk"), eid("paddle-sdk2")];
    let bodies: Vec<String> = ids.iter().map(|id| paddle_body(id)).collect();
    let input = json!({"secret": secret, "ts": unix_now(), "bodies": bodies});
    let Some(signed) = python(PADDLE_PY, &input, "paddle-python-sdk") else {
        return;
    };
    for (i, body) in bodies.iter().enumerate() {
        let (header, ok) = (signed[i][0].as_str().unwrap(), &signed[i][1]);
        assert_eq!(ok, true, "the SDK verifies its own signature");
        let hs = headers(&[("Paddle-Signature", header)]);
        assert_forwarded(&h.post("/hooks/paddle", &hs, body.as_bytes()), "SDK-signed");
        assert_replayed(
            &h.post("/hooks/paddle", &hs, body.as_bytes()),
            "SDK-signed, again",
        );
    }
}

#[test]
fn typeform_preset() {
    let deliver = |key: &[u8], id: &str| {
        let body = json!({
            "event_id": id,
            "event_type": "form_response",
            "form_response": {"form_id": "lT4Z3j", "token": "a3a12ec67a1365927098a606107fac15", "answers": []},
        })
        .to_string();
        let sig = sign::typeform(key, body.as_bytes());
        (headers(&[("Typeform-Signature", &sig)]), body.into_bytes())
    };
    preset_scenario("typeform", "tf-webhook-secret", "", &deliver, &|id| {
        id.to_string()
    });
}

fn gitlab_body() -> String {
    json!({"object_kind": "push", "ref": "refs/heads/main", "project": {"path_with_namespace": "g/p"}}).to_string()
}

#[test]
fn gitlab_preset_with_a_secret_token() {
    let deliver = |key: &[u8], id: &str| {
        let token = String::from_utf8(key.to_vec()).unwrap();
        let hs = headers(&[
            ("X-Gitlab-Event", "Push Hook"),
            ("X-Gitlab-Token", &token),
            ("Idempotency-Key", id),
            (
                "X-Gitlab-Event-UUID",
                "13792a34-cac6-4fda-95a8-c58e00a3954e",
            ),
        ]);
        (hs, gitlab_body().into_bytes())
    };
    let h = preset_scenario("gitlab", "glwht-token-1", "", &deliver, &|id| {
        id.to_string()
    });
    let r = h.post(
        "/hooks/gitlab",
        &headers(&[("Idempotency-Key", &eid("g"))]),
        gitlab_body().as_bytes(),
    );
    assert_invalid_signature(&r, "x-gitlab-token");
}

/// The `standardwebhooks` package signs as GitLab 19 does with a signing
/// token (its webhook-id is the Idempotency-Key).
const STANDARD_WEBHOOKS_PY: &str = r#"
import json, sys
from datetime import datetime, timezone
from standardwebhooks.webhooks import Webhook
req = json.load(sys.stdin)
wh = Webhook(req["secret"])
ts = datetime.fromtimestamp(req["ts"], tz=timezone.utc)
print(json.dumps([wh.sign(i, ts, req["body"]) for i in req["ids"]]))
"#;

#[test]
fn gitlab_preset_with_a_signing_token() {
    let key = b"gitlab-signing-token-32-bytes!!!";
    let secret = sign::standard_webhooks_secret(key);
    let h = harness(
        "gitlab",
        "    provider: gitlab\n    verify:\n      secrets: [env:GITLAB_SIGNING]\n",
        &[("GITLAB_SIGNING", &secret)],
    );
    let body = gitlab_body();
    let ids = [eid("gl"), eid("gl-forged")];
    let ts = unix_now();
    let input = json!({"secret": secret, "ts": ts, "ids": ids, "body": body});
    let sigs: Vec<String> = match python(STANDARD_WEBHOOKS_PY, &input, "standardwebhooks") {
        Some(v) => v
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect(),
        None => ids
            .iter()
            .map(|id| sign::standard_webhooks(key, id, ts, body.as_bytes()))
            .collect(),
    };
    let post = |id: &str, sig: &str| {
        let t = ts.to_string();
        let hs = headers(&[
            ("Idempotency-Key", id),
            ("webhook-id", id),
            ("webhook-timestamp", &t),
            ("webhook-signature", sig),
        ]);
        h.post("/hooks/gitlab", &hs, body.as_bytes())
    };
    assert_forwarded(&post(&ids[0], &sigs[0]), "signed");
    assert_replayed(&post(&ids[0], &sigs[0]), "again");
    // another delivery's signature does not sign this ID
    assert_invalid_signature(&post(&ids[1], &sigs[0]), "no signature matches");
    // a captured delivery re-sent under another (unsigned) Idempotency-Key is
    // still the signed webhook-id's event: replayed, not forwarded again
    let t = ts.to_string();
    let hs = headers(&[
        ("Idempotency-Key", &ids[1]),
        ("webhook-id", &ids[0]),
        ("webhook-timestamp", &t),
        ("webhook-signature", &sigs[0]),
    ]);
    assert_replayed(
        &h.post("/hooks/gitlab", &hs, body.as_bytes()),
        "re-keyed capture",
    );
    assert_eq!(h.up.total(), 1);
}

fn zoom_body(account: &str, ts: u64) -> String {
    json!({
        "event": "meeting.started",
        "event_ts": ts,
        "payload": {"account_id": account, "object": {"id": "85769513426", "uuid": "4444AAAiAAAAAiAiAiiAii==", "topic": "My Meeting"}},
    })
    .to_string()
}

#[test]
fn zoom_preset() {
    let extra = "    event_id:\n      parts: [{json_pointer: /payload/account_id}, {json_pointer: /event}, {json_pointer: /event_ts}]\n";
    let event_ts = |id: &str| {
        1_700_000_000_000 + id.bytes().map(u64::from).sum::<u64>() + id.len() as u64 * 1000
    };
    let deliver = |key: &[u8], id: &str| {
        let body = zoom_body(id, event_ts(id));
        let ts = unix_now();
        let hs = headers(&[
            ("x-zm-request-timestamp", &ts.to_string()),
            ("x-zm-signature", &sign::zoom(key, ts, body.as_bytes())),
        ]);
        (hs, body.into_bytes())
    };
    let key_of = |id: &str| format!("{id}:meeting.started:{}", event_ts(id));
    let secret = "zoom-secret-token";
    let h = preset_scenario("zoom", secret, extra, &deliver, &key_of);
    let before = h.up.total();

    // the signed endpoint.url_validation challenge passes unguarded, each time
    let challenge = json!({"payload": {"plainToken": "qgg8vlvZRS6UYooatFL8Aw"}, "event_ts": 1654503849680u64, "event": "endpoint.url_validation"}).to_string();
    let ts = unix_now();
    let signed = headers(&[
        ("x-zm-request-timestamp", &ts.to_string()),
        (
            "x-zm-signature",
            &sign::zoom(secret.as_bytes(), ts, challenge.as_bytes()),
        ),
    ]);
    for _ in 0..2 {
        let r = h.post("/hooks/zoom", &signed, challenge.as_bytes());
        assert_eq!(r.status, 200, "{:?}", r.text());
        assert_eq!(r.header("Idempotency-Status"), Some("unguarded"));
    }
    assert_eq!(h.up.total(), before + 2);
    // an unsigned (or forged) one does not
    let forged = headers(&[
        ("x-zm-request-timestamp", &ts.to_string()),
        (
            "x-zm-signature",
            &sign::zoom(b"guess", ts, challenge.as_bytes()),
        ),
    ]);
    assert_invalid_signature(
        &h.post("/hooks/zoom", &forged, challenge.as_bytes()),
        "no signature matches",
    );
    assert_eq!(h.up.total(), before + 2);
}

#[test]
fn zoom_route_without_an_event_id_is_refused_by_check() {
    let dir = TempDir::new("keys-zoom-check");
    let file = dir.path().join("zoom.yaml");
    let text = config_text(
        free_port(),
        free_port(),
        &dir.sqlite_url("z.db"),
        "  - name: zoom\n    match:\n      path_prefix: /hooks/zoom\n    upstream: \"http://127.0.0.1:9\"\n    provider: zoom\n    verify:\n      secrets: [env:ZOOM_SECRET]\n",
    );
    std::fs::write(&file, text).unwrap();
    let (code, _, err) = cli_env(
        &["check", "--config", &file.display().to_string()],
        &[("ZOOM_SECRET", "s")],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("zoom.yaml:9:5: routes[0]: provider zoom has no event ID of its own"),
        "{err}"
    );
}

// ------------------------------------------------------------ v1a

/// Python's `cryptography` signs `v1a` entries (Ed25519 over id.ts.body)
/// and gives the public key, for seeds 1 and 2.
const ED25519_PY: &str = r#"
import base64, json, sys
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives import serialization
req = json.load(sys.stdin)
out = {}
for seed in (1, 2):
    k = Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)
    pub = k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    msg = f"{req['id']}.{req['ts']}.{req['body']}".encode()
    out[str(seed)] = {"pk": "whpk_" + base64.b64encode(pub).decode(), "v1a": "v1a," + base64.b64encode(k.sign(msg)).decode()}
print(json.dumps(out))
"#;

/// Ed25519 `v1a` entries on a standard-webhooks and a svix route, each with
/// a `whpk_` key and a `whsec_` secret.
#[test]
fn v1a_entries_right_key_wrong_key_and_beside_a_bad_v1() {
    let hmac_key = b"standard-webhooks-hmac-key-bytes";
    let whsec = sign::standard_webhooks_secret(hmac_key);
    for (provider, prefix) in [("standard-webhooks", "webhook"), ("svix", "svix")] {
        let id = eid("msg");
        let ts = unix_now();
        let body = json!({"type": "invoice.paid", "data": {"id": id}}).to_string();
        let input = json!({"id": id, "ts": ts, "body": body});
        let Some(signed) = python(ED25519_PY, &input, "cryptography") else {
            return;
        };
        let entry = |seed: &str| signed[seed]["v1a"].as_str().unwrap().to_string();
        let pk = signed["1"]["pk"].as_str().unwrap().to_string();
        assert_eq!(
            pk,
            sign::standard_webhooks_public_key(&[1; 32]),
            "ring and cryptography agree"
        );
        let name = provider.replace('-', "");
        let h = harness(
            &name,
            &format!("    provider: {provider}\n    verify:\n      secrets: [env:PK, env:WHSEC]\n"),
            &[("PK", &pk), ("WHSEC", &whsec)],
        );
        let path = format!("/hooks/{name}");
        let post = |id: &str, list: &str| {
            let t = ts.to_string();
            let hs = headers(&[
                (&format!("{prefix}-id"), id),
                (&format!("{prefix}-timestamp"), &t),
                (&format!("{prefix}-signature"), list),
            ]);
            h.post(&path, &hs, body.as_bytes())
        };
        let bad_v1 = format!(
            "v1,{}",
            sign::standard_webhooks(b"not-the-key", &id, ts, body.as_bytes())
                .trim_start_matches("v1,")
        );
        // signed with the wrong key (seed 2): refused, nothing stored
        assert_invalid_signature(&post(&id, &entry("2")), "no signature matches");
        assert_invalid_signature(
            &post(&id, &format!("{bad_v1} {}", entry("2"))),
            "no signature matches",
        );
        assert_eq!(
            cli(&["events", "show", "--store", &h.store, "--route", &name, &id]).0,
            3
        );
        // the right key, beside a bad v1 entry (the route has both kinds)
        assert_forwarded(&post(&id, &format!("{bad_v1} {}", entry("1"))), provider);
        assert_replayed(&post(&id, &entry("1")), provider);
        // a v1a entry does not sign another message ID
        assert_invalid_signature(&post(&eid("other"), &entry("1")), "no signature matches");
        assert_eq!(h.up.total(), 1, "{provider}");
    }
}

#[test]
fn a_public_key_that_is_not_32_bytes_is_a_config_error() {
    let dir = TempDir::new("keys-whpk");
    let file = dir.path().join("sw.yaml");
    let text = config_text(
        free_port(),
        free_port(),
        &dir.sqlite_url("s.db"),
        "  - name: sw\n    match:\n      path_prefix: /hooks/sw\n    upstream: \"http://127.0.0.1:9\"\n    provider: standard-webhooks\n    verify:\n      secrets: [env:PK]\n",
    );
    std::fs::write(&file, text).unwrap();
    let (code, _, err) = cli_env(
        &["check", "--config", &file.display().to_string()],
        &[("PK", "whpk_AAAAAAAA")],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("sw.yaml:15:17: routes[0].verify.secrets[0]: a `whpk_` public key must be base64 of 32 bytes"), "{err}");
}
