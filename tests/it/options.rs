//! Route options of SPEC §2 beyond the defaults (issue 4): canonical JSON
//! digests, missing-ID policies, stored replays.

use crate::common;

use common::*;

fn json_route(up: &Consumer, extra: &str) -> String {
    format!(
        "  - name: j\n    match:\n      path_prefix: /hooks/j\n    upstream: \"{}\"\n    event_id:\n      json_pointer: /id\n{extra}",
        up.url()
    )
}

fn post(px: &Proxy, path: &str, body: &[u8]) -> Response {
    px.deliver(path, None, body)
}

#[test]
fn json_digest_ignores_key_order_whitespace_and_ignored_pointers() {
    let dir = TempDir::new("jcs");
    let up = Consumer::start().unwrap();
    let extra = "    digest: json\n    digest_ignore: [/meta/attempt]\n";
    let px = Proxy::start(&dir, &dir.sqlite_url("j.db"), &json_route(&up, extra));
    let id = eid("jcs");
    let first = format!(r#"{{"id":"{id}","amount":10,"meta":{{"attempt":1,"src":"a"}}}}"#);
    let reordered = format!(
        "{{ \"meta\": {{\"src\": \"a\", \"attempt\": 2}},\n  \"amount\": 10, \"id\": \"{id}\" }}"
    );
    let changed = format!(r#"{{"id":"{id}","amount":11,"meta":{{"attempt":1,"src":"a"}}}}"#);
    assert_eq!(post(&px, "/hooks/j", first.as_bytes()).status, 200);
    let dup = post(&px, "/hooks/j", reordered.as_bytes());
    assert_eq!(
        (dup.status, dup.header("Idempotent-Replayed")),
        (200, Some("true")),
        "same canonical payload"
    );
    assert_eq!(
        post(&px, "/hooks/j", changed.as_bytes()).status,
        422,
        "a real change is a mismatch"
    );
    assert_eq!(up.count(&id), 1);
    // the forwarded body is the sender's bytes, not the canonical form
    assert_eq!(up.received()[0].body, first.as_bytes());
}

#[test]
fn json_pointer_ids_numbers_and_errors() {
    let dir = TempDir::new("jptr");
    let up = Consumer::start().unwrap();
    let px = Proxy::start(&dir, &dir.sqlite_url("j.db"), &json_route(&up, ""));
    let n = std::process::id() as u64 * 1000 + 7;
    let r = post(&px, "/hooks/j", format!(r#"{{"id":{n}}}"#).as_bytes());
    assert_eq!(r.status, 200);
    assert_eq!(
        up.received()[0].header("Idempotency-Key"),
        Some(n.to_string().as_str()),
        "a number is its decimal text"
    );
    let bad = post(&px, "/hooks/j", b"not json");
    assert_eq!(
        (bad.status, bad.json()["type"].as_str()),
        (400, Some("urn:idemgate:problem:invalid-body"))
    );
    let absent = post(&px, "/hooks/j", br#"{"other":1}"#);
    assert_eq!(
        (absent.status, absent.json()["type"].as_str()),
        (400, Some("urn:idemgate:problem:missing-event-id"))
    );
    let wrong = post(&px, "/hooks/j", br#"{"id":{"nested":true}}"#);
    assert_eq!(
        (wrong.status, wrong.json()["type"].as_str()),
        (400, Some("urn:idemgate:problem:invalid-event-id"))
    );
    assert_eq!(up.total(), 1, "no refused request reached the consumer");
}

#[test]
fn on_missing_id_forward_passes_unguarded() {
    let dir = TempDir::new("missing-fwd");
    let up = Consumer::start().unwrap();
    let px = Proxy::start(
        &dir,
        &dir.sqlite_url("m.db"),
        &json_route(&up, "    on_missing_id: forward\n"),
    );
    for _ in 0..2 {
        let r = post(&px, "/hooks/j", br#"{"type":"url_verification"}"#);
        assert_eq!(
            (r.status, r.header("Idempotency-Status")),
            (200, Some("unguarded"))
        );
    }
    assert_eq!(up.total(), 2, "both unguarded deliveries were forwarded");
    assert_eq!(
        px.metric(r#"idemgate_requests_total{outcome="unguarded",route="j"}"#),
        2.0
    );
}

#[test]
fn on_missing_id_body_digest_uses_the_digest_as_the_id() {
    let dir = TempDir::new("missing-digest");
    let up = Consumer::start().unwrap();
    let routes = format!(
        "  - name: d\n    match:\n      path_prefix: /hooks/d\n    upstream: \"{}\"\n    event_id:\n      header: X-Event-ID\n    on_missing_id: body_digest\n",
        up.url()
    );
    let px = Proxy::start(&dir, &dir.sqlite_url("d.db"), &routes);
    let body = format!("payload {}", eid("p"));
    assert_eq!(px.deliver("/hooks/d", None, body.as_bytes()).status, 200);
    let dup = px.deliver("/hooks/d", None, body.as_bytes());
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(up.total(), 1);
    let key = up.received()[0]
        .header("Idempotency-Key")
        .unwrap()
        .to_string();
    assert_eq!(key.len(), 64, "the sha256 hex digest is the event ID");
}

#[test]
fn replay_body_stores_and_replays_the_settled_response() {
    let dir = TempDir::new("replay-body");
    let up = Consumer::start().unwrap();
    let extra = "    replay_body: true\n    replay_body_limit: 1KiB\n";
    let store = dir.sqlite_url("r.db");
    let px = Proxy::start(&dir, &store, &route("r", "/hooks/r", &up.url(), extra));
    let small = eid("small");
    up.script(&small, vec![Reply::status(201).body(br#"{"stored":true}"#)]);
    let first = px.deliver("/hooks/r", Some(&small), b"{}");
    assert_eq!(
        (first.status, first.body.as_slice()),
        (201, &br#"{"stored":true}"#[..])
    );
    let dup = px.deliver("/hooks/r", Some(&small), b"{}");
    assert_eq!(
        (dup.status, dup.body.as_slice()),
        (201, &br#"{"stored":true}"#[..])
    );
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(dup.header("Content-Type"), Some("text/plain"));
    let big = eid("big");
    let large = vec![b'x'; 4096];
    up.script(&big, vec![Reply::status(200).body(&large)]);
    let first = px.deliver("/hooks/r", Some(&big), b"{}");
    assert_eq!(
        first.body.len(),
        4096,
        "the sender still gets the whole body"
    );
    let dup = px.deliver("/hooks/r", Some(&big), b"{}");
    assert_eq!(
        (dup.status, dup.body.len()),
        (200, 0),
        "over the limit: replayed without a body"
    );
    let rec = show(&store, "r", &small);
    assert_eq!(rec["replay_status"], 201);
    assert_eq!(rec["replay_body_bytes"], 15);
}
