//! `in_flight: wait` (issue 4): duplicates that find a live lease are held
//! until the attempt settles, against a real consumer and a real store.

use crate::common;
use crate::core_util;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use core_util::{deliver_in_flight, tally};

/// `n` concurrent deliveries of one event, spread over `addrs` in turn.
fn concurrent_over(addrs: &[SocketAddr], id: &str, body: &'static [u8], n: usize) -> Vec<Response> {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (id, addr) = (id.to_string(), addrs[i % addrs.len()]);
            std::thread::spawn(move || kit::deliver(addr, "/hooks/w", Some(&id), body).unwrap())
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// A harness whose one route `w` (`/hooks/w`) has `in_flight: wait`, and
/// `extra` route lines.
fn waiting(tag: &str, extra: &str) -> Harness {
    let lines = format!("    in_flight: wait\n{extra}");
    Harness::sqlite(tag).route("w", "/hooks/w", &lines).start()
}

fn concurrent(px: &Proxy, id: &str, body: &'static [u8], n: usize) -> Vec<Response> {
    concurrent_over(&[px.addr], id, body, n)
}

/// `n` concurrent deliveries over `addrs` of a fresh event (its ID from
/// `tag`, returned), the consumer holding its answer `(status, ms)`.
fn held_burst(
    h: &Harness,
    addrs: &[SocketAddr],
    tag: &str,
    (status, ms): (u16, u64),
    body: &'static [u8],
    n: usize,
) -> (String, Vec<Response>) {
    let id = eid(tag);
    h.up.hold(&id, status, Duration::from_millis(ms));
    let answers = concurrent_over(addrs, &id, body, n);
    (id, answers)
}

#[test]
fn twenty_held_duplicates_get_one_forward_and_twenty_successes() {
    let h = waiting("wait", "");
    let (id, answers) = held_burst(&h, &[h.addr], "held", (202, 800), b"{\"x\":1}", 20);
    assert_eq!(
        h.up.count(&id),
        1,
        "exactly one request reached the consumer"
    );
    assert_eq!(tally(answers.iter().map(|r| r.status)), [(202, 20)].into());
    let replayed = answers
        .iter()
        .filter(|r| r.header("Idempotent-Replayed") == Some("true"))
        .count();
    assert_eq!(
        replayed, 19,
        "the held duplicates were answered with the replay"
    );
}

#[test]
fn a_failed_first_attempt_lets_exactly_one_held_request_forward() {
    let h = waiting("wait-fail", "");
    let id = eid("held-fail");
    h.up.script(
        &id,
        vec![
            Reply::status(500).delay(Duration::from_millis(600)),
            Reply::status(200).delay(Duration::from_millis(300)),
        ],
    );
    let answers = concurrent(&h, &id, b"{\"x\":2}", 8);
    assert_eq!(
        h.up.count(&id),
        2,
        "the failed attempt and exactly one reclaim"
    );
    let statuses = tally(answers.iter().map(|r| r.status));
    assert_eq!(statuses, [(200, 7), (500, 1)].into(), "{statuses:?}");
}

#[test]
fn a_lease_that_runs_out_while_waiting_gives_409() {
    let h = waiting("wait-lease", "    lease: 2s\n    upstream_timeout: 1s\n");
    let id = eid("held-lease");
    // The first attempt's process dies with the claim live: kill it mid-flight.
    h.up.hold(&id, 200, Duration::from_millis(900));
    let first = deliver_in_flight(&h, "/hooks/w", &id, b"{}");
    let mut h = h;
    h.kill();
    let _ = first.join();
    h.spawn();
    let t = std::time::Instant::now();
    let r = h.deliver("/hooks/w", Some(&id), b"{}");
    assert_eq!(r.status, 409, "held until the lease ran out");
    assert_eq!(r.json()["type"], "urn:idemgate:problem:in-flight");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "answered when the 2s lease ended"
    );
    // and now the lease is over: the next delivery reclaims it
    let again = h.deliver("/hooks/w", Some(&id), b"{}");
    assert_eq!(again.status, 200);
    assert_eq!(h.up.count(&id), 2);
}

#[test]
fn max_waiters_caps_held_requests() {
    let h = waiting("wait-cap", "    max_waiters: 2\n");
    let (id, answers) = held_burst(&h, &[h.addr], "held-cap", (200, 1000), b"{}", 6);
    assert_eq!(
        tally(answers.iter().map(|r| r.status)),
        [(200, 3), (409, 3)].into(),
        "one forward, two held, three refused"
    );
    assert_eq!(h.up.count(&id), 1);
}

#[test]
fn held_duplicates_across_two_replicas_on_postgres() {
    let Some(h) = Harness::postgres("wait-pg") else {
        return;
    };
    let h = h.route("w", "/hooks/w", "    in_flight: wait\n").start();
    let b = h.replica();
    let a = &h.px;
    let addrs = [a.addr, b.addr];
    let (id, answers) = held_burst(&h, &addrs, "held-pg", (202, 800), b"{}", 20);
    assert_eq!(
        h.up.count(&id),
        1,
        "exactly one request reached the consumer across both replicas"
    );
    assert_eq!(tally(answers.iter().map(|r| r.status)), [(202, 20)].into());

    // the first attempt fails on one replica: exactly one held request, on either, forwards
    let id = eid("held-pg-fail");
    h.up.script(
        &id,
        vec![
            Reply::status(500).delay(Duration::from_millis(600)),
            Reply::status(200),
        ],
    );
    let statuses = tally(
        concurrent_over(&addrs, &id, b"{}", 10)
            .iter()
            .map(|r| r.status),
    );
    assert_eq!(
        h.up.count(&id),
        2,
        "the failed attempt and exactly one reclaim: {statuses:?}"
    );
    assert_eq!(statuses, [(200, 9), (500, 1)].into(), "{statuses:?}");
}
