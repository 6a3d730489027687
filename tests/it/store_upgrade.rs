//! A zero-downtime upgrade over migration 4 (SPEC §12–14): a store written
//! by the release before opens, and while an old and a new process share it
//! both keep working — the new one migrates under the running old one, each
//! replays what the other delivered, and the old one never forwards an event
//! the new one holds `ambiguous` (it does not know the state: it fails
//! closed with 503).
//!
//! The release before is the binary `IDEMGATE_PREVIOUS_BIN` names (built
//! from the commit below in a target directory of its own: a build that
//! shares this one's would overwrite its `idemgate`); without it the test
//! prints SKIP.

use crate::common::*;
use crate::raw_upstream::{response, upstream, Behavior};

use std::path::PathBuf;
use std::time::Duration;

fn previous_bin() -> Option<PathBuf> {
    let path = std::env::var_os("IDEMGATE_PREVIOUS_BIN").map(PathBuf::from);
    if path.is_none() {
        eprintln!(
            "SKIP: IDEMGATE_PREVIOUS_BIN is not set: build the release before ({}) with \
             `git worktree add /tmp/prev {} && cargo build --release --manifest-path \
             /tmp/prev/Cargo.toml --target-dir /tmp/prev-target` and name its binary",
            PREVIOUS_RELEASE, PREVIOUS_RELEASE
        );
    }
    path
}

/// The release before migration 4: `main` when issue 41 began.
const PREVIOUS_RELEASE: &str = "578665163bf87b4f2337083f49b7b98716c85abe";

/// Route `r` to the consumer; route `s` to a consumer slower than its
/// `upstream_timeout`, held under `on_ambiguous: hold` by the new process
/// (the old one does not know the key).
fn routes(up: &str, slow: &str, new: bool) -> String {
    let hold = if new { "    on_ambiguous: hold\n" } else { "" };
    route("r", "/r", up, "")
        + &route(
            "s",
            "/s",
            slow,
            &format!("    upstream_timeout: 1s\n    lease: 4s\n{hold}"),
        )
}

fn old_and_new_on_one_store(store: TestStore) {
    let Some(previous) = previous_bin() else {
        return;
    };
    let up = Consumer::start().unwrap();
    let slow = upstream(|_, _| Behavior::Late(Duration::from_secs(2), response(200, b"ok")));
    let slow_url = format!("http://{}", slow.addr);
    let old = Proxy::start_bin(
        &previous,
        &store.dir,
        &store.url,
        &routes(&up.url(), &slow_url, false),
        &[],
    );
    let before = eid("before");
    assert_eq!(old.deliver("/r", Some(&before), b"{}").status, 200);
    // the new process migrates the store under the running old one
    let new = Proxy::start(&store.dir, &store.url, &routes(&up.url(), &slow_url, true));
    for (px, name) in [(&old, "old"), (&new, "new")] {
        let replay = px.deliver("/r", Some(&before), b"{}");
        assert_eq!(replay.status, 200, "{name}: {replay:?}");
        assert_eq!(replay.header("idempotent-replayed"), Some("true"), "{name}");
    }
    // each delivers new events, the other replays them
    for (first, second) in [(&old, &new), (&new, &old)] {
        let id = eid("both");
        assert_eq!(first.deliver("/r", Some(&id), b"{}").status, 200);
        let replay = second.deliver("/r", Some(&id), b"{}");
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        assert_eq!(up.count(&id), 1);
    }
    // the new one holds an unknown outcome; the old one does not forward it
    let held = eid("held");
    assert_eq!(new.deliver("/s", Some(&held), b"{}").status, 504);
    assert_eq!(show(&store.url, "s", &held)["state"], "ambiguous");
    let old_answer = old.deliver("/s", Some(&held), b"{}");
    assert_eq!(
        old_answer.status, 503,
        "the old process fails closed: {old_answer:?}"
    );
    assert_eq!(new.deliver("/s", Some(&held), b"{}").status, 409);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(slow.count(&held), 1, "the consumer saw the held event once");
    // the old one's deliveries: the first attempt read from the record,
    // without the instance the old release does not write
    let rec = show(&store.url, "r", &before);
    assert_eq!(rec["history"][0]["result"], "delivered", "{rec}");
    assert_eq!(
        rec["history"][0]["instance"],
        serde_json::Value::Null,
        "{rec}"
    );
    let id = eid("attempted");
    assert_eq!(new.deliver("/r", Some(&id), b"{}").status, 200);
    assert_eq!(
        show(&store.url, "r", &id)["history"][0]["result"],
        "delivered"
    );
    drop(old);
    drop(new);
}

on_both_stores!(old_and_new_on_one_store("upgrade-v4"): sqlite_old_and_new_on_one_store, postgres_old_and_new_on_one_store);
