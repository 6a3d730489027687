//! Operations (issue 6): the background sweeper, the graceful drain on
//! SIGTERM, JSON logs without payloads, and the operator commands on both
//! stores.

use crate::common;
use crate::core_util;

use std::time::{Duration, Instant};

use common::*;
use core_util::deliver_in_flight;

fn records(store: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["events", "list", "--store", store, "--json"];
    args.extend_from_slice(extra);
    let (code, out, err) = cli(&args);
    assert_eq!(code, 0, "events list: {err}");
    serde_json::from_str::<Vec<serde_json::Value>>(&out).unwrap()
}

#[test]
fn the_sweeper_deletes_expired_records_but_never_a_live_lease() {
    let h = Harness::sqlite("sweeper")
        .route(
            "s",
            "/hooks/s",
            "    retention: 1s\n    lease: 8s\n    upstream_timeout: 6s\n",
        )
        .yaml("sweeper:\n  interval: 300ms\n  batch_size: 2\n")
        .start();
    for i in 0..5 {
        assert_eq!(
            h.deliver("/hooks/s", Some(&eid(&format!("old{i}"))), b"{}")
                .status,
            200
        );
    }
    // a delivery in flight whose retention (1s) ends long before its lease (8s)
    let live = eid("live");
    h.up.hold(&live, 200, Duration::from_millis(3000));
    let addr = h.addr;
    let in_flight = {
        let live = live.clone();
        std::thread::spawn(move || kit::deliver(addr, "/hooks/s", Some(&live), b"{}").unwrap())
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !records(&h.store, &["--state", "delivered"]).is_empty() {
        assert!(Instant::now() < deadline, "expired records were not swept");
        std::thread::sleep(Duration::from_millis(100));
    }
    let left = records(&h.store, &[]);
    assert_eq!(left.len(), 1, "only the live claim is left: {left:?}");
    assert_eq!(left[0]["event_id"], live.as_str());
    assert_eq!(left[0]["state"], "processing");
    assert!(h.metric("idemgate_records_swept_total") >= 5.0);
    assert_eq!(in_flight.join().unwrap().status, 200);
    let age = h.metric(r#"idemgate_processing_oldest_age_seconds{route="s"}"#);
    assert!(age >= 0.0);
}

/// A delivered record the proxy holds in memory (SQLite), swept by another
/// process (`idemgate sweep`): the next delivery of its ID, with another
/// payload, is a new event and is forwarded at once — not refused with the
/// swept record's digest.
#[test]
fn a_sweep_by_another_process_reaches_the_proxy_at_once() {
    let h = Harness::sqlite("sweep-cached")
        .route("c", "/hooks/c", "    retention: 1s\n")
        // the proxy's own sweeper stays out of the way
        .yaml("sweeper:\n  interval: 1h\n")
        .start();
    let id = eid("swept");
    assert_eq!(h.deliver("/hooks/c", Some(&id), b"first").status, 200);
    std::thread::sleep(Duration::from_millis(1100));
    // expired but not swept: still replayed, and now held in memory
    for _ in 0..2 {
        let dup = h.deliver("/hooks/c", Some(&id), b"first");
        assert_eq!(dup.header("Idempotency-Status"), Some("replayed"));
    }
    let (code, out, err) = cli(&["sweep", "--store", &h.store]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.split_whitespace().next(), Some("1"), "{out}");
    let again = h.deliver("/hooks/c", Some(&id), b"second");
    assert_eq!(again.status, 200, "{:?}", again.text());
    assert_eq!(again.header("Idempotency-Status"), Some("forwarded"));
    assert_eq!(h.up.count(&id), 2);
    // and the new record binds the ID to the new payload
    assert_eq!(h.deliver("/hooks/c", Some(&id), b"first").status, 422);
}

#[test]
fn sigterm_lets_the_request_in_flight_finish_and_settle() {
    let mut h = Harness::sqlite("drain").route("d", "/hooks/d", "").start();
    let id = eid("drain");
    h.up.hold(&id, 202, Duration::from_millis(1500));
    let sender = deliver_in_flight(&h, "/hooks/d", &id, b"{}");
    let t = Instant::now();
    assert_eq!(
        h.stop(Duration::from_secs(15)),
        Some(0),
        "exit code after SIGTERM"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(1000),
        "the process waited for the delivery"
    );
    let answer = sender
        .join()
        .unwrap()
        .expect("the in-flight delivery was answered");
    assert_eq!(answer.status, 202);
    assert_eq!(show(&h.store, "d", &id)["state"], "delivered");
    assert!(
        records(&h.store, &["--state", "processing"]).is_empty(),
        "a clean stop leaves nothing processing"
    );
}

#[test]
fn json_logs_carry_one_line_per_guarded_request_and_never_the_payload() {
    let mut h = Harness::sqlite("logs")
        .route("l", "/hooks/l", "")
        .env("IDEMGATE_LOG_FORMAT", "json")
        .start();
    let id = eid("log");
    let marker = "PAYLOAD-MARKER-7f3a";
    h.deliver(
        "/hooks/l",
        Some(&id),
        format!("{{\"secret\":\"{marker}\"}}").as_bytes(),
    );
    h.deliver(
        "/hooks/l",
        Some(&id),
        format!("{{\"secret\":\"{marker}\"}}").as_bytes(),
    );
    h.stop(Duration::from_secs(10));
    let log = h.log();
    assert!(!log.contains(marker), "the payload leaked into the log");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "guarded request")
        .collect();
    assert_eq!(lines.len(), 2, "one info event per guarded request:\n{log}");
    // Each line is written after its answer, so the second request's line
    // may come first; find the lines by outcome.
    let by_outcome = |o: &str| {
        lines
            .iter()
            .find(|l| l["outcome"] == o)
            .unwrap_or_else(|| panic!("no {o} line:\n{log}"))
    };
    let forwarded = by_outcome("forwarded");
    assert_eq!(forwarded["event_id"], id.as_str());
    assert_eq!(forwarded["route"], "l");
    assert_eq!(forwarded["upstream_status"], 200);
    assert_eq!(forwarded["attempt"], 1);
    assert_eq!(by_outcome("replayed")["event_id"], id.as_str());
}

fn operator_commands(s: TestStore) {
    let h = Harness::on(s).route("o", "/hooks/o", "").start();
    let (a, b) = (eid("op-a"), eid("op-b"));
    h.up.script(&b, vec![Reply::status(500)]);
    h.deliver("/hooks/o", Some(&a), b"{}");
    h.deliver("/hooks/o", Some(&b), b"{}");
    // human-readable table and JSON
    let (code, out, _) = cli(&["events", "list", "--store", &h.store, "--route", "o"]);
    assert_eq!(code, 0);
    assert!(out.lines().next().unwrap().contains("EVENT ID"), "{out}");
    assert!(out.contains(&a) && out.contains(&b));
    let failed = records(&h.store, &["--route", "o", "--state", "failed"]);
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["event_id"], b.as_str());
    assert_eq!(
        records(&h.store, &["--route", "o", "--limit", "1"]).len(),
        1
    );
    let (code, out, _) = cli(&["events", "show", "--store", &h.store, "--route", "o", &a]);
    assert_eq!(code, 0);
    assert!(out.contains("delivered"), "{out}");
    // release: refused for delivered without --force, then the deliberate redelivery
    let (code, _, err) = cli(&["events", "release", "--store", &h.store, "--route", "o", &a]);
    assert_eq!(code, 1, "delivered needs --force");
    assert!(err.contains("--force"), "{err}");
    let (code, _, _) = cli(&[
        "events", "release", "--store", &h.store, "--route", "o", &a, "--force",
    ]);
    assert_eq!(code, 0);
    let rec = show(&h.store, "o", &a);
    assert_eq!(
        (rec["state"].as_str(), rec["lease_until"].is_null()),
        (Some("failed"), true)
    );
    let again = h.deliver("/hooks/o", Some(&a), b"{}");
    assert_eq!(
        (again.status, h.up.count(&a)),
        (200, 2),
        "the released event is forwarded again; answered {:?}; record now {}; proxy log:\n{}",
        again.header("Idempotency-Status"),
        show(&h.store, "o", &a),
        h.log()
    );
    let (code, _, _) = cli(&[
        "events", "release", "--store", &h.store, "--route", "o", "absent",
    ]);
    assert_eq!(code, 3);
    // sweep once: nothing has expired yet
    let (code, out, _) = cli(&["sweep", "--store", &h.store]);
    assert_eq!(code, 0);
    assert_eq!(out.split_whitespace().next(), Some("0"), "{out}");
}

on_both_stores!(operator_commands("ops"): operator_commands_on_sqlite, operator_commands_on_postgres);

/// `/readyz` says ready only once the proxy port accepts: pingora starts
/// the admin service first, and a client that trusted an early 200 got
/// "connection refused" (seen once in the conformance suite).
#[test]
fn readyz_is_200_only_when_the_proxy_port_accepts() {
    let dir = TempDir::new("ready");
    let up = Consumer::start().unwrap();
    let store = dir.sqlite_url("r.db");
    for _ in 0..5 {
        // Proxy::start returns at the first 200 from /readyz
        let mut px = Proxy::start(&dir, &store, &route("r", "/hooks/r", &up.url(), ""));
        let accepted = std::net::TcpStream::connect_timeout(&px.addr, Duration::from_secs(2));
        assert!(
            accepted.is_ok(),
            "/readyz said 200 but the proxy port refused: {accepted:?}"
        );
        px.stop(Duration::from_secs(10));
    }
}

#[test]
fn serve_on_a_busy_address_exits_1_with_one_line() {
    let dir = TempDir::new("busy");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let text = config_text(
        port,
        free_port(),
        &dir.sqlite_url("b.db"),
        &route("b", "/hooks/b", "http://127.0.0.1:9", ""),
    );
    let path = dir.path().join("busy.yaml");
    std::fs::write(&path, text).unwrap();
    let t = Instant::now();
    let (code, _, err) = cli(&["serve", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "refused at once, not after retries"
    );
    assert!(
        err.contains(&format!("127.0.0.1:{port}")) && err.contains("listen"),
        "{err}"
    );
    drop(taken);
}
