//! Route options of SPEC §2 beyond the defaults (issue 4): canonical JSON
//! digests, missing-ID policies, stored replays.

use crate::common;

use common::*;

/// A harness whose route `j` (`/hooks/j`) takes the event ID from the JSON body's `/id`.
fn json_harness(tag: &str, extra: &str) -> Harness {
    let h = Harness::sqlite(tag);
    let route = format!(
        "  - name: j\n    match:\n      path_prefix: /hooks/j\n    upstream: \"{}\"\n    event_id:\n      json_pointer: /id\n{extra}",
        h.upstream()
    );
    h.yaml(&route).start()
}

fn post(px: &Proxy, path: &str, body: &[u8]) -> Response {
    px.deliver(path, None, body)
}

#[test]
fn json_digest_ignores_key_order_whitespace_and_ignored_pointers() {
    let extra = "    digest: json\n    digest_ignore: [/meta/attempt]\n";
    let h = json_harness("jcs", extra);
    let id = eid("jcs");
    let first = format!(r#"{{"id":"{id}","amount":10,"meta":{{"attempt":1,"src":"a"}}}}"#);
    let reordered = format!(
        "{{ \"meta\": {{\"src\": \"a\", \"attempt\": 2}},\n  \"amount\": 10, \"id\": \"{id}\" }}"
    );
    let changed = format!(r#"{{"id":"{id}","amount":11,"meta":{{"attempt":1,"src":"a"}}}}"#);
    assert_eq!(post(&h, "/hooks/j", first.as_bytes()).status, 200);
    let dup = post(&h, "/hooks/j", reordered.as_bytes());
    assert_eq!(
        (dup.status, dup.header("Idempotent-Replayed")),
        (200, Some("true")),
        "same canonical payload"
    );
    assert_eq!(
        post(&h, "/hooks/j", changed.as_bytes()).status,
        422,
        "a real change is a mismatch"
    );
    assert_eq!(h.up.count(&id), 1);
    // the forwarded body is the sender's bytes, not the canonical form
    assert_eq!(h.up.received()[0].body, first.as_bytes());
}

#[test]
fn json_pointer_ids_numbers_and_errors() {
    let h = json_harness("jptr", "");
    let n = std::process::id() as u64 * 1000 + 7;
    let r = post(&h, "/hooks/j", format!(r#"{{"id":{n}}}"#).as_bytes());
    assert_eq!(r.status, 200);
    assert_eq!(
        h.up.received()[0].header("Idempotency-Key"),
        Some(n.to_string().as_str()),
        "a number is its decimal text"
    );
    let bad = post(&h, "/hooks/j", b"not json");
    assert_eq!(
        (bad.status, bad.json()["type"].as_str()),
        (400, Some("urn:idemgate:problem:invalid-body"))
    );
    let absent = post(&h, "/hooks/j", br#"{"other":1}"#);
    assert_eq!(
        (absent.status, absent.json()["type"].as_str()),
        (400, Some("urn:idemgate:problem:missing-event-id"))
    );
    let wrong = post(&h, "/hooks/j", br#"{"id":{"nested":true}}"#);
    assert_eq!(
        (wrong.status, wrong.json()["type"].as_str()),
        (400, Some("urn:idemgate:problem:invalid-event-id"))
    );
    assert_eq!(h.up.total(), 1, "no refused request reached the consumer");
}

#[test]
fn on_missing_id_forward_passes_unguarded() {
    let h = json_harness("missing-fwd", "    on_missing_id: forward\n");
    for _ in 0..2 {
        let r = post(&h, "/hooks/j", br#"{"type":"url_verification"}"#);
        assert_eq!(
            (r.status, r.header("Idempotency-Status")),
            (200, Some("unguarded"))
        );
    }
    assert_eq!(h.up.total(), 2, "both unguarded deliveries were forwarded");
    assert_eq!(h.requests("j", "unguarded"), 2.0);
}

#[test]
fn on_missing_id_body_digest_uses_the_digest_as_the_id() {
    let h = Harness::sqlite("missing-digest")
        .route("d", "/hooks/d", "    on_missing_id: body_digest\n")
        .start();
    let body = format!("payload {}", eid("p"));
    assert_eq!(h.deliver("/hooks/d", None, body.as_bytes()).status, 200);
    let dup = h.deliver("/hooks/d", None, body.as_bytes());
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(h.up.total(), 1);
    let key = h.up.received()[0]
        .header("Idempotency-Key")
        .unwrap()
        .to_string();
    assert_eq!(key.len(), 64, "the sha256 hex digest is the event ID");
}

#[test]
fn replay_body_stores_and_replays_the_settled_response() {
    let h = Harness::guarded(
        "replay-body",
        "    replay_body: true\n    replay_body_limit: 1KiB\n",
    );
    let small = eid("small");
    h.up.script(&small, vec![Reply::status(201).body(br#"{"stored":true}"#)]);
    let first = h.deliver("/hooks/r", Some(&small), b"{}");
    assert_eq!(
        (first.status, first.body.as_slice()),
        (201, &br#"{"stored":true}"#[..])
    );
    let dup = h.deliver("/hooks/r", Some(&small), b"{}");
    assert_eq!(
        (dup.status, dup.body.as_slice()),
        (201, &br#"{"stored":true}"#[..])
    );
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(dup.header("Content-Type"), Some("text/plain"));
    let big = eid("big");
    let large = vec![b'x'; 4096];
    h.up.script(&big, vec![Reply::status(200).body(&large)]);
    let first = h.deliver("/hooks/r", Some(&big), b"{}");
    assert_eq!(
        first.body.len(),
        4096,
        "the sender still gets the whole body"
    );
    let dup = h.deliver("/hooks/r", Some(&big), b"{}");
    assert_eq!(
        (dup.status, dup.body.len()),
        (200, 0),
        "over the limit: replayed without a body"
    );
    let rec = show(&h.store, "r", &small);
    assert_eq!(rec["replay_status"], 201);
    assert_eq!(rec["replay_body_bytes"], 15);
}
