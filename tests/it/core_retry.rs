//! Failures and what follows them (SPEC §3–§4): a failing consumer releases
//! the claim and the retry goes through; operator releases after a crash and
//! of delivered records; upstream timeouts and refused connections; a store
//! that fails under the running proxy.

use crate::common;
use crate::core_util;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use core_util::*;

fn release(store: &str, route: &str, id: &str, force: bool) -> (i32, String, String) {
    let mut args = vec!["events", "release", "--store", store, "--route", route, id];
    if force {
        args.push("--force");
    }
    cli(&args)
}

/// 500 then 200: the 500 is passed through and releases the claim, the retry
/// is forwarded and delivers, the next duplicate is replayed.
#[test]
fn failed_delivery_is_released_and_the_retry_delivers() {
    let h = Harness::guarded("retry-500", "");
    let id = eid("fail");
    h.up.script(
        &id,
        vec![
            Reply::status(500).body(b"consumer broke"),
            Reply::status(200).body(b"fine now"),
        ],
    );
    let first = h.deliver("/hooks/r", Some(&id), b"event");
    assert_eq!(first.status, 500);
    assert_eq!(first.body, b"consumer broke");
    assert_eq!(first.header("Idempotency-Status"), Some("forwarded"));
    let rec = show(&h.store, "r", &id);
    assert_eq!(rec["state"], "failed");
    assert_eq!(rec["attempts"], 1);
    assert_eq!(rec["last_status"], 500);
    assert!(rec["lease_until"].is_null(), "lease cleared: {rec}");

    let retry = h.deliver("/hooks/r", Some(&id), b"event");
    assert_eq!(retry.status, 200);
    assert_eq!(retry.body, b"fine now");
    assert_eq!(retry.header("Idempotent-Replayed"), None);
    let rec = show(&h.store, "r", &id);
    assert_eq!(rec["state"], "delivered");
    assert_eq!(rec["attempts"], 2);
    assert_eq!(rec["last_status"], 200);

    let dup = h.deliver("/hooks/r", Some(&id), b"event");
    assert_eq!(dup.status, 200);
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(h.up.count(&id), 2);
}

/// The proxy dies with a claim in flight; after the restart the claim is
/// still live (409) until the operator releases it, then the next delivery
/// is forwarded.
#[test]
fn operator_releases_a_claim_left_by_a_crash() {
    let mut h = Harness::guarded("retry-crash", "");
    let id = eid("crash");
    h.up.script(
        &id,
        vec![
            Reply::status(200).delay(Duration::from_secs(60)),
            Reply::status(200).body(b"second try"),
        ],
    );
    let lost = deliver_in_flight(&h, "/hooks/r", &id, b"event");
    h.kill();
    assert!(
        lost.join().unwrap().is_err(),
        "the sender got no answer from the killed proxy"
    );
    let rec = show(&h.store, "r", &id);
    assert_eq!(rec["state"], "processing");
    assert_eq!(rec["attempts"], 1);
    assert!(!rec["lease_until"].is_null());

    h.spawn();
    let held = h.deliver("/hooks/r", Some(&id), b"event");
    assert_eq!(held.status, 409, "the lease outlives the crash: {held:?}");

    let (code, out, err) = release(&h.store, "r", &id, false);
    assert_eq!(code, 0, "release of a processing record: {out}{err}");
    let rec = show(&h.store, "r", &id);
    assert_eq!(rec["state"], "failed");
    assert!(rec["lease_until"].is_null(), "lease cleared: {rec}");

    let again = h.deliver("/hooks/r", Some(&id), b"event");
    assert_eq!(again.status, 200);
    assert_eq!(again.body, b"second try");
    assert_eq!(again.header("Idempotency-Status"), Some("forwarded"));
    assert_eq!(h.up.count(&id), 2);
    assert_state(&h.store, "r", &id, "delivered", 2);
}

/// Releasing a delivered record needs `--force`; after it the next delivery
/// reaches the consumer again.
#[test]
fn release_of_a_delivered_record_needs_force() {
    let h = Harness::guarded("retry-force", "");
    let id = eid("force");
    assert_eq!(h.deliver("/hooks/r", Some(&id), b"event").status, 200);

    let (code, _, err) = release(&h.store, "r", &id, false);
    assert_eq!(code, 1, "refused without --force");
    assert!(err.contains("delivered"), "says why: {err}");
    assert_eq!(show(&h.store, "r", &id)["state"], "delivered");
    let dup = h.deliver("/hooks/r", Some(&id), b"event");
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));

    let (code, out, err) = release(&h.store, "r", &id, true);
    assert_eq!(code, 0, "forced release: {out}{err}");
    assert_eq!(show(&h.store, "r", &id)["state"], "failed");
    let again = h.deliver("/hooks/r", Some(&id), b"event");
    assert_eq!(again.status, 200);
    assert_eq!(again.header("Idempotent-Replayed"), None);
    assert_eq!(h.up.count(&id), 2);
    assert_state(&h.store, "r", &id, "delivered", 2);

    let (code, _, _) = release(&h.store, "r", &eid("unknown"), false);
    assert_eq!(code, 3, "release of an unknown event");
}

/// Duplicates hammered from four threads keep the proxy's cache of
/// delivered records (SQLite) filling while an operator releases the event
/// again and again: after each `events release --force` returns, the next
/// delivery is forwarded, held off as in flight, or answered with a *later*
/// delivery — never with the released one.
#[test]
fn releases_during_a_storm_of_duplicates_are_never_answered_from_memory() {
    const ROUNDS: usize = 8;
    let h = Harness::guarded("retry-storm", "    replay_body: true\n");
    let id = eid("storm");
    // the consumer answers its n-th delivery with the body "n"
    h.up.script(
        &id,
        (1..=ROUNDS + 1)
            .map(|n| Reply::status(200).body(n.to_string().as_bytes()))
            .collect(),
    );
    let delivery = |r: &Response| -> usize {
        r.text()
            .parse()
            .unwrap_or_else(|_| panic!("not a delivery number: {:?}", r.body))
    };
    assert_eq!(delivery(&h.deliver("/hooks/r", Some(&id), b"event")), 1);
    let addr = h.addr;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let r = kit::deliver(addr, "/hooks/r", Some(&id), b"event").unwrap();
                    assert!(matches!(r.status, 200 | 409), "storm got {}", r.status);
                }
            });
        }
        // the storm stops when the rounds end, and when one of them fails
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(&stop);
        for round in 1..=ROUNDS {
            // let the storm replay delivery `round` for a while
            std::thread::sleep(Duration::from_millis(50));
            let (code, out, err) = release(&h.store, "r", &id, true);
            assert_eq!(code, 0, "round {round}: {out}{err}");
            let next = h.deliver("/hooks/r", Some(&id), b"event");
            match next.status {
                200 => assert!(
                    delivery(&next) > round,
                    "round {round}: answered with delivery {} after its release",
                    delivery(&next)
                ),
                409 => {}
                other => panic!("round {round}: {other}"),
            }
            assert!(
                wait_until(Duration::from_secs(5), || {
                    h.up.count(&id) == round + 1 && show(&h.store, "r", &id)["state"] == "delivered"
                }),
                "round {round}: the redelivery did not settle; consumer saw {}",
                h.up.count(&id)
            );
        }
    });
    assert_eq!(h.up.count(&id), ROUNDS + 1, "one forward per release");
}

/// A consumer slower than `upstream_timeout`: 504 within the timeout (plus
/// slack), the claim released, the retry forwarded.
#[test]
fn upstream_timeout_gives_504_and_releases_the_claim() {
    let h = Harness::guarded("retry-timeout", "    upstream_timeout: 1s\n");
    let id = eid("slow");
    h.up.script(
        &id,
        vec![
            Reply::status(200).delay(Duration::from_secs(30)),
            Reply::status(200).body(b"in time"),
        ],
    );
    // One connection throughout: the 504 leaves it usable.
    let mut c = h.client();
    let mut post = || {
        c.request("POST", "/hooks/r", &[("X-Event-ID", &id)], b"event")
            .expect("an answer on the same connection")
    };
    let t = Instant::now();
    let late = post();
    let took = t.elapsed();
    assert_eq!(late.status, 504, "{late:?}");
    assert!(took < Duration::from_secs(3), "504 after {took:?}");
    assert_eq!(problem_type(&late), "upstream-timeout");
    assert_eq!(late.json()["event_id"], id.as_str());
    assert_eq!(late.header("Idempotency-Status"), Some("forwarded"));
    let rec = show(&h.store, "r", &id);
    assert_eq!(rec["state"], "failed");
    assert_eq!(rec["attempts"], 1);
    assert!(rec["lease_until"].is_null());

    let retry = post();
    assert_eq!(retry.status, 200);
    assert_eq!(retry.body, b"in time");
    assert_eq!(h.up.count(&id), 2);
    assert_state(&h.store, "r", &id, "delivered", 2);
}

/// Nothing listens at the upstream: 502, claim released; once the consumer
/// is up, the retry is delivered.
#[test]
fn unreachable_upstream_gives_502_and_the_retry_delivers() {
    let dir = TempDir::new("retry-down");
    let store = dir.sqlite_url("core.db");
    let up_addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let upstream = format!("http://{up_addr}");
    let px = Proxy::start(&dir, &store, &route("r", "/hooks/r", &upstream, ""));
    let id = eid("down");
    // One connection throughout: the 502 leaves it usable.
    let mut c = px.client();
    let mut post = || {
        c.request("POST", "/hooks/r", &[("X-Event-ID", &id)], b"event")
            .expect("an answer on the same connection")
    };
    let refused = post();
    assert_eq!(refused.status, 502, "{refused:?}");
    assert_eq!(problem_type(&refused), "upstream-unreachable");
    assert_eq!(refused.json()["event_id"], id.as_str());
    assert_eq!(refused.header("Idempotency-Status"), Some("forwarded"));
    assert_state(&store, "r", &id, "failed", 1);

    let up = Consumer::start_on(up_addr).expect("the upstream's port is still free");
    let retry = post();
    assert_eq!(retry.status, 200);
    assert_eq!(retry.header("Idempotency-Status"), Some("forwarded"));
    assert_eq!(up.count(&id), 1);
    assert_state(&store, "r", &id, "delivered", 2);

    // The consumer restarts: the proxy's pooled connection to it is dead,
    // which must not cost the next event a 502.
    drop(up);
    let up = Consumer::start_on(up_addr).expect("the upstream's port is still free");
    for n in 0..3 {
        let id = eid("after-restart");
        let r = px.deliver("/hooks/r", Some(&id), b"event");
        assert_eq!(
            r.status, 200,
            "delivery {n} after the consumer restarted: {r:?}"
        );
        assert_eq!(up.count(&id), 1);
    }
}

/// Overwrites the SQLite database, its WAL and its shared-memory index in
/// place (same inodes, same sizes) with noise. The running proxy keeps its
/// file descriptors and its page cache, but the next transaction finds the
/// WAL index invalid, rebuilds it from the (noise) WAL and then reads a file
/// that is not a database: SQLITE_NOTADB on every claim. Replacing or
/// unlinking the files, or `chmod` (the tests run as root), changes nothing
/// for a process that already has them open.
fn wreck_sqlite(db: &std::path::Path) {
    for (i, suffix) in ["", "-wal", "-shm"].into_iter().enumerate() {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let len = std::fs::metadata(&name)
            .unwrap_or_else(|e| panic!("{name:?}: {e}"))
            .len();
        let mut f = std::fs::OpenOptions::new().write(true).open(&name).unwrap();
        std::io::Write::write_all(&mut f, &payload(len as usize, 99 + i as u64)).unwrap();
        f.sync_all().unwrap();
    }
}

/// A store that fails under the running proxy: 503 with `Retry-After: 1`,
/// nothing forwarded, not even a duplicate of a delivered event.
#[test]
fn store_failure_fails_closed() {
    let h = Harness::guarded("retry-store", "");
    let done = eid("before");
    assert_eq!(h.deliver("/hooks/r", Some(&done), b"event").status, 200);

    wreck_sqlite(&h.sqlite_path());
    for id in [eid("during"), done.clone()] {
        let refused = h.deliver("/hooks/r", Some(&id), b"event");
        assert_eq!(refused.status, 503, "{refused:?}");
        assert_eq!(refused.header("Retry-After"), Some("1"));
        assert_eq!(problem_type(&refused), "store-unavailable");
        assert_eq!(refused.json()["event_id"], id.as_str());
        assert_eq!(
            refused.header("Idempotency-Status"),
            Some("store_unavailable")
        );
    }
    assert_eq!(h.up.total(), 1, "nothing forwarded while the store fails");
    assert_eq!(h.requests("r", "store_unavailable"), 2.0);
}

/// SPEC §5: `/readyz` is 503 when the store does not answer.
#[test]
fn readyz_reports_a_failing_store() {
    let h = Harness::guarded("retry-readyz", "");
    assert_eq!(h.deliver("/hooks/r", Some(&eid("x")), b"event").status, 200);
    wreck_sqlite(&h.sqlite_path());
    assert_eq!(h.deliver("/hooks/r", Some(&eid("y")), b"event").status, 503);
    let ready = kit::get(h.admin, "/readyz").unwrap();
    assert_eq!(ready.status, 503, "{ready:?}");
}
