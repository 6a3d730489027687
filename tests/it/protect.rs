//! Protecting the consumer (SPEC §15), on the real binary with a real
//! loopback consumer: `upstream_concurrency` refuses the (N+1)th delivery
//! with 503 `upstream-saturated` and claims nothing while duplicates are
//! still replayed; `upstream_rate` counted over 5 s; the breaker opens after
//! F failures, lets exactly one delivery through when it half-opens, and
//! closes on its success; a consumer's 429 `Retry-After: 3` opens it 3 s;
//! with `upstream_wait` a delivery past the slot waits for one, and is
//! refused, unclaimed, when none comes in time.

use std::time::{Duration, Instant};

use testkit::consumer::Reply;

use crate::admin_util::get_json;
use crate::common::*;
use crate::core_util::*;

/// What a refusal of the limits looks like: 503, the problem, a
/// `Retry-After` (returned) of at least 1, the outcome in
/// `Idempotency-Status`.
fn refused(r: &testkit::Response, problem: &str) -> u64 {
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(problem_type(r), problem, "{r:?}");
    let outcome = match problem {
        "upstream-saturated" => "saturated",
        _ => "breaker_open",
    };
    assert_eq!(r.header("Idempotency-Status"), Some(outcome), "{r:?}");
    let secs: u64 = r
        .header("Retry-After")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a Retry-After in seconds: {r:?}"));
    assert!(secs >= 1, "{r:?}");
    secs
}

/// Whether the store has no record of the event (`events show` finds none).
fn unclaimed(h: &Harness, event_id: &str) -> bool {
    let (code, out, _) = cli(&[
        "events", "show", "--store", &h.store, "--route", "r", event_id, "--json",
    ]);
    code != 0 && out.trim().is_empty()
}

#[test]
fn past_its_concurrency_a_delivery_is_refused_unclaimed_while_duplicates_replay() {
    let tag = "protect-conc";
    let h = Harness::guarded(tag, "    upstream_concurrency: 2\n");
    let done = eid("done");
    assert_eq!(h.deliver("/hooks/r", Some(&done), b"{}").status, 200);
    let (a, b, c) = (eid("a"), eid("b"), eid("c"));
    for id in [&a, &b] {
        h.up.hold(id, 200, Duration::from_secs(3));
    }
    let held: Vec<_> = [&a, &b]
        .into_iter()
        .map(|id| deliver_in_flight(&h, "/hooks/r", id, b"{}"))
        .collect();
    assert_eq!(
        h.metric("idemgate_upstream_in_flight{route=\"r\"}"),
        2.0,
        "{}",
        h.metrics()
    );

    // the admin API (and the console) show the limits and the state
    let routes = get_json(&h, "/api/routes");
    let r = &routes["routes"][0];
    assert_eq!(
        r["limits"],
        serde_json::json!({"concurrency": 2, "rate": null, "wait": null, "breaker": null})
    );
    assert_eq!(r["upstream_state"]["in_flight"], 2, "{r}");
    assert_eq!(r["upstream_state"]["breaker"], "closed", "{r}");

    let third = h.deliver("/hooks/r", Some(&c), b"{}");
    assert_eq!(refused(&third, "upstream-saturated"), 1);
    assert_eq!(third.json()["event_id"], c.as_str());
    // unguarded requests of the route count against it too
    let put = h
        .client()
        .request("PUT", "/hooks/r/x", &[], b"{}")
        .expect("PUT");
    refused(&put, "upstream-saturated");
    // a duplicate of a delivered event needs no slot
    let dup = h.deliver("/hooks/r", Some(&done), b"{}");
    assert_eq!(dup.status, 200, "{dup:?}");
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));
    // a duplicate in flight still gets its 409
    assert_eq!(h.deliver("/hooks/r", Some(&a), b"{}").status, 409);
    assert_eq!(h.up.count(&c), 0, "the consumer never saw it");
    assert!(
        unclaimed(&h, &c),
        "nothing is claimed for a refused delivery"
    );
    assert_eq!(h.requests("r", "saturated"), 2.0);

    for d in held {
        assert_eq!(d.join().unwrap().unwrap().status, 200);
    }
    assert_eq!(h.metric("idemgate_upstream_in_flight{route=\"r\"}"), 0.0);
    // the sender's retry is a clean first delivery
    assert_eq!(h.deliver("/hooks/r", Some(&c), b"{}").status, 200);
    assert_state(&h.store, "r", &c, "delivered", 1);
    assert_eq!(h.up.count(&c), 1);
}

#[test]
fn the_rate_holds_over_five_seconds() {
    let tag = "protect-rate";
    let h = Harness::guarded(tag, "    upstream_rate: \"4/s\"\n");
    let started = Instant::now();
    let (mut forwarded, mut refusals, mut n) = (0, 0, 0);
    let mut client = h.client();
    while started.elapsed() < Duration::from_secs(5) {
        n += 1;
        let id = eid(&format!("r{n}"));
        let r = client
            .request("POST", "/hooks/r", &[("X-Event-ID", &id)], b"{}")
            .expect("delivery");
        match r.status {
            200 => forwarded += 1,
            _ => {
                assert_eq!(refused(&r, "upstream-saturated"), 1, "a token every 250 ms");
                refusals += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = started.elapsed().as_secs_f64();
    // the bucket starts full (one second's worth: 4), then 4 a second
    let most = 4.0 + 4.0 * elapsed;
    assert!(
        forwarded as f64 <= most + 1.0 && forwarded as f64 >= most - 3.0,
        "{forwarded} forwarded, {refusals} refused in {elapsed:.2} s"
    );
    assert!(refusals > 100, "{refusals}");
    assert_eq!(
        h.up.total(),
        forwarded,
        "the consumer saw only those let through"
    );
    assert_eq!(h.requests("r", "saturated"), refusals as f64);
}

#[test]
fn the_breaker_opens_half_opens_for_exactly_one_and_closes_on_success() {
    let tag = "protect-breaker";
    let h = Harness::guarded(
        tag,
        "    upstream_breaker:\n      failures: 3\n      open: 2s\n",
    );
    let done = eid("done");
    assert_eq!(h.deliver("/hooks/r", Some(&done), b"{}").status, 200);
    for i in 0..3 {
        let id = eid(&format!("fail{i}"));
        h.up.script(&id, vec![Reply::status(500)]);
        // the consumer's own answer, passed on
        assert_eq!(h.deliver("/hooks/r", Some(&id), b"{}").status, 500);
    }
    let opened = Instant::now();
    let x = eid("x");
    let r = h.deliver("/hooks/r", Some(&x), b"{}");
    assert_eq!(refused(&r, "upstream-unavailable"), 2, "the seconds left");
    assert_eq!(h.up.count(&x), 0);
    assert!(unclaimed(&h, &x));
    assert_eq!(h.metric("idemgate_upstream_breaker_open{route=\"r\"}"), 1.0);
    // duplicates of delivered events are still replayed
    let dup = h.deliver("/hooks/r", Some(&done), b"{}");
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"), "{dup:?}");

    std::thread::sleep(Duration::from_secs(2).saturating_sub(opened.elapsed()) + ms(100));
    // half-open is not closed: no delivery has succeeded yet
    assert_eq!(h.metric("idemgate_upstream_breaker_open{route=\"r\"}"), 1.0);
    // half-open: 11 deliveries at once, the consumer holding each 1.5 s
    let ids: Vec<String> = (0..11).map(|i| eid(&format!("w{i}"))).collect();
    for id in &ids {
        h.up.hold(id, 200, ms(1500));
    }
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(ids.len()));
    let sent: Vec<_> = ids
        .iter()
        .map(|id| {
            let (addr, id, barrier) = (h.addr, id.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                testkit::deliver(addr, "/hooks/r", Some(&id), b"{}").expect("delivery")
            })
        })
        .collect();
    let answers: Vec<testkit::Response> = sent.into_iter().map(|t| t.join().unwrap()).collect();
    let through: Vec<&String> = ids.iter().filter(|id| h.up.count(id) > 0).collect();
    assert_eq!(through.len(), 1, "exactly one let through: {through:?}");
    assert_eq!(
        tally(answers.iter().map(|r| r.status)),
        [(200, 1), (503, 10)].into()
    );
    for r in answers.iter().filter(|r| r.status == 503) {
        assert_eq!(refused(r, "upstream-unavailable"), 1);
    }
    // its success closed the breaker
    assert_eq!(h.metric("idemgate_upstream_breaker_open{route=\"r\"}"), 0.0);
    let waited = ids.iter().find(|id| h.up.count(id) == 0).unwrap();
    h.up.hold(waited, 200, Duration::ZERO);
    assert_eq!(h.deliver("/hooks/r", Some(waited), b"{}").status, 200);
    assert_state(&h.store, "r", waited, "delivered", 1);
    assert_eq!(h.requests("r", "breaker_open"), 11.0);
}

#[test]
fn a_failed_probe_opens_the_breaker_again() {
    let tag = "protect-reopen";
    let h = Harness::guarded(tag, "    upstream_breaker: {failures: 1, open: 1s}\n");
    let f = eid("f");
    h.up.script(&f, vec![Reply::status(502)]);
    assert_eq!(h.deliver("/hooks/r", Some(&f), b"{}").status, 502);
    refused(
        &h.deliver("/hooks/r", Some(&eid("y")), b"{}"),
        "upstream-unavailable",
    );
    std::thread::sleep(ms(1100));
    // the probe: the same event, failing again
    assert_eq!(h.deliver("/hooks/r", Some(&f), b"{}").status, 502);
    refused(
        &h.deliver("/hooks/r", Some(&eid("y")), b"{}"),
        "upstream-unavailable",
    );
    std::thread::sleep(ms(1100));
    h.up.script(&f, vec![Reply::status(200)]);
    assert_eq!(h.deliver("/hooks/r", Some(&f), b"{}").status, 200);
    assert_eq!(h.deliver("/hooks/r", Some(&eid("z")), b"{}").status, 200);
    assert_state(&h.store, "r", &f, "delivered", 3);
}

#[test]
fn a_429_with_retry_after_3_pauses_a_route_without_limits() {
    let tag = "protect-429";
    let h = Harness::guarded(tag, "");
    let done = eid("done");
    assert_eq!(h.deliver("/hooks/r", Some(&done), b"{}").status, 200);
    let busy = eid("busy");
    h.up.script(
        &busy,
        vec![
            Reply::status(429)
                .header("Retry-After", "3")
                .body(b"slow down"),
            Reply::status(200),
        ],
    );
    let r = h.deliver("/hooks/r", Some(&busy), b"{}");
    let pushed = Instant::now();
    // the consumer's answer, unchanged
    assert_eq!(r.status, 429);
    assert_eq!(r.header("Retry-After"), Some("3"));
    assert_eq!(r.body, b"slow down");
    let y = eid("y");
    let secs = refused(
        &h.deliver("/hooks/r", Some(&y), b"{}"),
        "upstream-unavailable",
    );
    assert!((2..=3).contains(&secs), "{secs}");
    assert_eq!(h.metric("idemgate_upstream_breaker_open{route=\"r\"}"), 1.0);
    assert_eq!(h.up.count(&y), 0);
    assert!(unclaimed(&h, &y));
    let dup = h.deliver("/hooks/r", Some(&done), b"{}");
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"), "{dup:?}");
    // unguarded requests are not held by the breaker
    let get = h
        .client()
        .request("GET", "/hooks/r", &[], b"")
        .expect("GET");
    assert_eq!(get.status, 200, "{get:?}");

    // still open just before the 3 s are up
    std::thread::sleep(ms(2500).saturating_sub(pushed.elapsed()));
    refused(
        &h.deliver("/hooks/r", Some(&y), b"{}"),
        "upstream-unavailable",
    );
    std::thread::sleep(ms(3100).saturating_sub(pushed.elapsed()));
    assert_eq!(h.deliver("/hooks/r", Some(&busy), b"{}").status, 200);
    assert_eq!(h.deliver("/hooks/r", Some(&y), b"{}").status, 200);
    assert_state(&h.store, "r", &y, "delivered", 1);
    assert_eq!(h.up.count(&busy), 2);
}

#[test]
fn limits_are_validated_with_their_positions() {
    let dir = TempDir::new("protect-config");
    let path = dir.path().join("bad.yaml");
    let text = config_text(
        1,
        2,
        &dir.sqlite_url("x.db"),
        &route(
            "r",
            "/r",
            "http://127.0.0.1:9",
            "    upstream_concurrency: 0\n    upstream_rate: \"5/h\"\n    upstream_breaker: {failures: 0}\n",
        ),
    );
    std::fs::write(&path, text).unwrap();
    let (code, _, err) = cli(&["check", "--config", path.to_str().unwrap()]);
    assert_ne!(code, 0);
    let file = path.display().to_string();
    for want in [
        format!("{file}:15:27: routes[0].upstream_concurrency: upstream_concurrency must be at least 1"),
        format!("{file}:16:20: routes[0].upstream_rate: invalid upstream_rate `5/h`: the unit is `s` or `m`"),
        format!("{file}:17:34: routes[0].upstream_breaker.failures: failures must be from 1"),
        format!("{file}:17:5: routes[0].upstream_breaker: upstream_breaker needs `open`"),
    ] {
        assert!(err.contains(&want), "missing {want:?} in:\n{err}");
    }
}

#[test]
fn with_upstream_wait_a_delivery_waits_for_a_slot_and_is_refused_when_none_comes() {
    let tag = "protect-wait";
    let h = Harness::guarded(tag, "    upstream_concurrency: 1\n    upstream_wait: 2s\n");
    let done = eid("done");
    assert_eq!(h.deliver("/hooks/r", Some(&done), b"{}").status, 200);
    let (a, b) = (eid("a"), eid("b"));
    h.up.hold(&a, 200, ms(800));
    let first = deliver_in_flight(&h, "/hooks/r", &a, b"{}");
    let t = Instant::now();
    let second = deliver_in_background(h.addr, "/hooks/r", &b, b"{}");
    assert!(
        wait_until(Duration::from_secs(5), || {
            h.metric("idemgate_upstream_waiting{route=\"r\"}") == 1.0
        }),
        "{}",
        h.metrics()
    );
    let routes = get_json(&h, "/api/routes");
    let r = &routes["routes"][0];
    assert_eq!(r["limits"]["wait"], "2s", "{r}");
    assert_eq!(r["upstream_state"]["waiting"], 1, "{r}");
    // a duplicate of a delivered event does not wait
    let dup_at = Instant::now();
    let dup = h.deliver("/hooks/r", Some(&done), b"{}");
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"), "{dup:?}");
    assert!(dup_at.elapsed() < ms(500), "{:?}", dup_at.elapsed());
    assert_eq!(h.up.count(&b), 0, "waiting, not forwarded");
    assert_eq!(first.join().unwrap().unwrap().status, 200);
    let r = second.join().unwrap().unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        t.elapsed() >= ms(300),
        "it waited for the slot: {:?}",
        t.elapsed()
    );
    assert_state(&h.store, "r", &b, "delivered", 1);
    assert_eq!(h.up.count(&b), 1);
    assert_eq!(h.metric("idemgate_upstream_waiting{route=\"r\"}"), 0.0);
    assert_eq!(h.requests("r", "saturated"), 0.0);

    // no slot within the wait: refused, unclaimed, after the wait
    let (c, d) = (eid("c"), eid("d"));
    h.up.hold(&c, 200, Duration::from_secs(4));
    let long = deliver_in_flight(&h, "/hooks/r", &c, b"{}");
    let t = Instant::now();
    let late = h.deliver("/hooks/r", Some(&d), b"{}");
    assert_eq!(refused(&late, "upstream-saturated"), 1);
    assert!(
        t.elapsed() >= ms(1900),
        "refused after its wait: {:?}",
        t.elapsed()
    );
    assert!(unclaimed(&h, &d));
    assert_eq!(h.up.count(&d), 0);
    assert_eq!(h.requests("r", "saturated"), 1.0);
    assert_eq!(long.join().unwrap().unwrap().status, 200);
}

#[test]
fn upstream_wait_is_validated_with_its_position() {
    let dir = TempDir::new("protect-wait-config");
    let path = dir.path().join("bad.yaml");
    let routes = route("a", "/a", "http://127.0.0.1:9", "    upstream_wait: 1s\n")
        + &route(
            "b",
            "/b",
            "http://127.0.0.1:9",
            "    upstream_rate: \"5/s\"\n    upstream_wait: 6s\n",
        );
    let text = config_text(1, 2, &dir.sqlite_url("x.db"), &routes);
    std::fs::write(&path, &text).unwrap();
    let (code, _, err) = cli(&["check", "--config", path.to_str().unwrap()]);
    assert_ne!(code, 0);
    let file = path.display().to_string();
    for want in [
        "routes[0].upstream_wait: upstream_wait needs upstream_concurrency or upstream_rate",
        "routes[1].upstream_wait: upstream_wait is at most 5s",
    ] {
        let line = err
            .lines()
            .find(|l| l.contains(want))
            .unwrap_or_else(|| panic!("missing {want:?} in:\n{err}"));
        assert!(line.starts_with(&format!("{file}:")), "{line}");
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
