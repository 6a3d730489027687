//! Core behaviour of a guarded route against a real consumer and a real
//! SQLite file (SPEC §3–§4).

mod common;

use common::*;

#[test]
fn first_delivery_then_replay_then_mismatch() {
    let dir = TempDir::new("core");
    let up = Consumer::start().unwrap();
    let store = dir.sqlite_url("core.db");
    let px = Proxy::start(&dir, &store, &route("r", "/hooks/r", &up.url(), ""));
    let id = eid("evt");
    let first = px.deliver("/hooks/r", Some(&id), br#"{"a":1}"#);
    assert_eq!(first.status, 200);
    assert_eq!(first.header("Idempotency-Status"), Some("forwarded"));
    let got = up.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header("Idempotency-Key"), Some(id.as_str()));
    assert_eq!(got[0].body, br#"{"a":1}"#);

    let dup = px.deliver("/hooks/r", Some(&id), br#"{"a":1}"#);
    assert_eq!(
        (dup.status, dup.header("Idempotent-Replayed")),
        (200, Some("true"))
    );
    let other = px.deliver("/hooks/r", Some(&id), br#"{"a":2}"#);
    assert_eq!(other.status, 422);
    assert_eq!(other.json()["type"], "urn:idemgate:problem:digest-mismatch");
    assert_eq!(up.count(&id), 1);
    let rec = show(&store, "r", &id);
    assert_eq!(rec["state"], "delivered");
    assert_eq!(rec["attempts"], 1);
}
