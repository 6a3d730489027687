//! Outcomes idemgate cannot know (SPEC §12), every attempt recorded (§13),
//! bulk recovery and pausing a route (§14), against the real process and a
//! scripted consumer on loopback that counts what it received (its side
//! effects: it ignores `Idempotency-Key`).

use crate::common::*;
use crate::raw_upstream::{response, upstream, Behavior};

use std::time::{Duration, Instant};

/// `upstream_timeout` 1s, lease 4s, one route `r` on `/r`.
fn route_extra(on_ambiguous: &str) -> String {
    format!("    upstream_timeout: 1s\n    lease: 4s\n    on_ambiguous: {on_ambiguous}\n")
}

fn start(tag: &str, upstream: &str, on_ambiguous: &str) -> Harness {
    Harness::sqlite(tag)
        .route_to("r", "/r", upstream, &route_extra(on_ambiguous))
        .start()
}

fn problem_type(r: &Response) -> String {
    r.json()["type"].as_str().unwrap_or_default().to_string()
}

/// A consumer that answers after 2 s (past the 1 s `upstream_timeout`),
/// having acted: under `release` the retry acts again; under `hold` the
/// record is `ambiguous` and every later delivery gets 409 outcome-unknown.
#[test]
fn a_timeout_after_the_write_is_released_or_held() {
    for (mode, acted) in [("release", 2), ("hold", 1)] {
        let up = upstream(|_, _| Behavior::Late(Duration::from_secs(2), response(200, b"ok")));
        let h = start(
            &format!("amb-timeout-{mode}"),
            &format!("http://{}", up.addr),
            mode,
        );
        let id = eid("timeout");
        let r = h.deliver("/r", Some(&id), b"{\"a\":1}");
        assert_eq!(r.status, 504, "{mode}: {r:?}");
        let retry = h.deliver("/r", Some(&id), b"{\"a\":1}");
        let rec = show(&h.store, "r", &id);
        if mode == "hold" {
            assert_eq!(retry.status, 409, "{retry:?}");
            assert_eq!(problem_type(&retry), "urn:idemgate:problem:outcome-unknown");
            assert_eq!(retry.header("retry-after"), Some("60"));
            assert_eq!(retry.header("idempotency-status"), Some("outcome_unknown"));
            assert_eq!(rec["state"], "ambiguous", "{rec}");
            assert_eq!(rec["lease_until"], serde_json::Value::Null, "{rec}");
            let history = rec["history"].as_array().expect("history");
            assert_eq!(history.len(), 1, "{rec}");
            assert_eq!(history[0]["result"], "ambiguous", "{rec}");
            assert_eq!(
                history[0]["error"], "timeout after the request was written",
                "{rec}"
            );
            assert!(h.px.requests("r", "outcome_unknown") >= 1.0);
            assert!(h.px.metric("idemgate_settles_total{result=\"ambiguous\",route=\"r\"}") >= 1.0);
        } else {
            assert_eq!(retry.status, 504, "{retry:?}");
            assert_eq!(rec["state"], "failed", "{rec}");
        }
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(
            up.count(&id),
            acted,
            "{mode}: the consumer acted {acted} time(s)"
        );
    }
}

/// A consumer that reads the whole request and closes without a word (it
/// crashed mid-handler), on a kept connection: under `release` idemgate
/// sends it again at once on a new connection; under `hold` never.
#[test]
fn a_close_after_the_whole_request_is_retried_only_under_release() {
    for (mode, acted) in [("release", 2), ("hold", 1)] {
        let up = upstream(|req, _| {
            if req.key().is_some_and(|k| k.starts_with("warm")) {
                Behavior::Respond(response(200, b"ok"))
            } else {
                Behavior::Close(Vec::new())
            }
        });
        let h = start(
            &format!("amb-close-{mode}"),
            &format!("http://{}", up.addr),
            mode,
        );
        // a kept connection first: the close is met on it
        let warm = eid("warm");
        assert_eq!(h.deliver("/r", Some(&warm), b"{}").status, 200);
        let id = eid("close");
        let r = h.deliver("/r", Some(&id), b"{\"a\":1}");
        assert_eq!(r.status, 502, "{mode}: {r:?}");
        assert_eq!(up.count(&id), acted, "{mode}");
        let rec = show(&h.store, "r", &id);
        let want = if mode == "hold" {
            "ambiguous"
        } else {
            "failed"
        };
        assert_eq!(rec["state"], want, "{rec}");
        if mode == "hold" {
            let error = rec["history"][0]["error"].as_str().unwrap_or_default();
            assert!(error.contains("before the answer"), "{rec}");
            assert_eq!(h.deliver("/r", Some(&id), b"{\"a\":1}").status, 409);
            assert_eq!(up.count(&id), 1);
        }
    }
}

/// A refused connect is no ambiguity: under `hold` too it is released,
/// and the retry goes through once the consumer listens.
#[test]
fn a_refused_connect_is_released_under_hold() {
    let port = free_port();
    let h = start("amb-refused", &format!("http://127.0.0.1:{port}"), "hold");
    let id = eid("refused");
    assert_eq!(h.deliver("/r", Some(&id), b"{}").status, 502);
    let rec = show(&h.store, "r", &id);
    assert_eq!(rec["state"], "failed", "{rec}");
    assert_eq!(rec["history"][0]["error"], "connect refused", "{rec}");
    assert_eq!(rec["history"][0]["result"], "released", "{rec}");
}

/// Resolved as delivered: later deliveries are replayed with the status
/// given; resolved as failed: the next delivery is forwarded (attempt 2,
/// same key). A record that is not ambiguous is refused.
#[test]
fn resolve_both_ways() {
    let up = upstream(|req, _| {
        if req.key().is_some_and(|k| k.contains("slow")) {
            Behavior::Late(Duration::from_secs(2), response(200, b"ok"))
        } else {
            Behavior::Respond(response(200, b"ok"))
        }
    });
    let h = start("amb-resolve", &format!("http://{}", up.addr), "hold");
    let (done, undone) = (eid("slow-done"), eid("slow-undone"));
    for id in [&done, &undone] {
        assert_eq!(h.deliver("/r", Some(id), b"{}").status, 504);
        assert_eq!(show(&h.store, "r", id)["state"], "ambiguous");
    }
    let resolve = |id: &str, args: &[&str]| {
        let mut all = vec!["events", "resolve", "--store", &h.store, "--route", "r", id];
        all.extend_from_slice(args);
        cli(&all)
    };
    let (code, out, err) = resolve(&done, &["--as", "delivered", "--status", "202"]);
    assert_eq!(code, 0, "{out}{err}");
    let replay = h.deliver("/r", Some(&done), b"{}");
    assert_eq!(replay.status, 202, "{replay:?}");
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    let (code, out, err) = resolve(&undone, &["--as", "failed"]);
    assert_eq!(code, 0, "{out}{err}");
    // the consumer is fast for the retry of this one: rename-free, count it
    std::thread::sleep(Duration::from_millis(1200));
    let seen_before = up.count(&undone);
    let r = h.deliver("/r", Some(&undone), b"{}");
    assert_eq!(r.status, 504, "still slow: {r:?}");
    assert_eq!(up.count(&undone), seen_before + 1, "forwarded once more");
    let rec = show(&h.store, "r", &undone);
    assert_eq!(rec["attempts"], 2, "{rec}");
    // only an ambiguous record can be resolved
    let (code, _, err) = resolve(&done, &["--as", "failed"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not ambiguous"), "{err}");
    let (code, _, _) = resolve("no-such-event", &["--as", "failed"]);
    assert_eq!(code, 3);
}

/// Three attempts (503, 503, 200): the history holds each, oldest first,
/// with its status, result, duration and instance.
#[test]
fn an_attempt_history_of_three() {
    let up = upstream(|_, n| match n {
        0 | 1 => Behavior::Respond(response(503, b"busy")),
        _ => Behavior::Respond(response(200, b"ok")),
    });
    let h = Harness::sqlite("amb-history")
        .route_to(
            "r",
            "/r",
            &format!("http://{}", up.addr),
            &route_extra("hold"),
        )
        .yaml("instance: replica-a\n")
        .start();
    let id = eid("three");
    assert_eq!(h.deliver("/r", Some(&id), b"{}").status, 503);
    assert_eq!(h.deliver("/r", Some(&id), b"{}").status, 503);
    assert_eq!(h.deliver("/r", Some(&id), b"{}").status, 200);
    let rec = show(&h.store, "r", &id);
    assert_eq!(rec["attempts"], 3, "{rec}");
    let history = rec["history"].as_array().expect("history");
    let got: Vec<(i64, i64, &str)> = history
        .iter()
        .map(|a| {
            (
                a["attempt"].as_i64().unwrap(),
                a["status"].as_i64().unwrap(),
                a["result"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, 503, "released"),
            (2, 503, "released"),
            (3, 200, "delivered")
        ],
        "{rec}"
    );
    for a in history {
        assert_eq!(a["instance"], "replica-a", "{a}");
        assert!(a["duration_ms"].as_i64().is_some_and(|d| d >= 0), "{a}");
        assert!(
            a["started_at"].is_string() && a["ended_at"].is_string(),
            "{a}"
        );
    }
    // the text form shows the table too
    let (code, out, _) = cli(&["events", "show", "--store", &h.store, "--route", "r", &id]);
    assert_eq!(code, 0);
    assert!(
        out.contains("ATTEMPT") && out.contains("replica-a"),
        "{out}"
    );
}

/// SIGKILL while the consumer holds the request; restart; past the lease
/// the event is `ambiguous` (by the next delivery, or the sweeper), and the
/// consumer saw it once.
#[test]
fn a_crash_mid_attempt_under_hold_is_held() {
    let up = upstream(|_, _| Behavior::Late(Duration::from_secs(30), response(200, b"ok")));
    let h = Harness::sqlite("amb-crash")
        .route_to(
            "r",
            "/r",
            &format!("http://{}", up.addr),
            "    upstream_timeout: 20s\n    lease: 25s\n    on_ambiguous: hold\n",
        )
        .yaml("sweeper:\n  interval: 1s\n")
        .start();
    let mut h = h;
    let (by_delivery, by_sweeper) = (eid("crash-a"), eid("crash-b"));
    let addr = h.px.addr;
    let senders: Vec<_> = [by_delivery.clone(), by_sweeper.clone()]
        .into_iter()
        .map(|id| {
            std::thread::spawn(move || {
                let _ = testkit::client::deliver(addr, "/r", Some(&id), b"{}");
            })
        })
        .collect();
    let t = Instant::now();
    while up.count(&by_delivery) + up.count(&by_sweeper) < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the consumer got both"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    h.px.kill();
    for s in senders {
        let _ = s.join();
    }
    assert_eq!(show(&h.store, "r", &by_delivery)["state"], "processing");
    h.px.spawn();
    // past the lease (25 s from the claim)
    while t.elapsed() < Duration::from_secs(27) {
        std::thread::sleep(Duration::from_millis(250));
    }
    let r = h.deliver("/r", Some(&by_delivery), b"{}");
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(problem_type(&r), "urn:idemgate:problem:outcome-unknown");
    let rec = show(&h.store, "r", &by_delivery);
    assert_eq!(rec["state"], "ambiguous", "{rec}");
    assert_eq!(rec["history"][0]["error"], "lease ended without an answer");
    assert_eq!(up.count(&by_delivery), 1);
    // the other one, never delivered again: the sweeper (every second here)
    let rec = loop {
        let rec = show(&h.store, "r", &by_sweeper);
        if rec["state"] == "ambiguous" || t.elapsed() > Duration::from_secs(32) {
            break rec;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(rec["state"], "ambiguous", "{rec}");
    assert_eq!(rec["history"][0]["result"], "ambiguous", "{rec}");
    assert_eq!(up.count(&by_sweeper), 1);
}

/// Bulk release: a dry run counts, the release takes every ambiguous record
/// of the window, never a delivered one, and reports how many.
#[test]
fn bulk_release_counts_fences_and_spares_delivered() {
    let up = upstream(|req, _| {
        if req.key().is_some_and(|k| k.contains("slow")) {
            Behavior::Late(Duration::from_secs(2), response(200, b"ok"))
        } else {
            Behavior::Respond(response(200, b"ok"))
        }
    });
    let h = start("amb-bulk", &format!("http://{}", up.addr), "hold");
    let held: Vec<String> = (0..3).map(|i| eid(&format!("slow-{i}"))).collect();
    for id in &held {
        assert_eq!(h.deliver("/r", Some(id), b"{}").status, 504);
    }
    let fine = eid("fine");
    assert_eq!(h.deliver("/r", Some(&fine), b"{}").status, 200);
    let bulk = |state: &str, extra: &[&str]| {
        let mut args = vec![
            "events", "release", "--store", &h.store, "--route", "r", "--state", state,
        ];
        args.extend_from_slice(extra);
        cli(&args)
    };
    let (code, out, err) = bulk("ambiguous", &["--dry-run"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("3 "), "{out}");
    // a window that ended before them takes none
    let (code, out, _) = bulk("ambiguous", &["--updated-before", "2020-01-01T00:00:00Z"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("0 "), "{out}");
    let (code, out, err) = bulk("ambiguous", &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("3 "), "{out}");
    for id in &held {
        assert_eq!(show(&h.store, "r", id)["state"], "failed");
    }
    assert_eq!(show(&h.store, "r", &fine)["state"], "delivered");
    let (code, _, err) = bulk("delivered", &[]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(show(&h.store, "r", &fine)["state"], "delivered");
}

/// A pause reaches a second process on the same store within 2 s: both
/// refuse new events with 503 route-paused (nothing claimed) and still
/// replay delivered ones; a resume lets deliveries through again.
#[test]
fn a_pause_reaches_every_process_within_two_seconds() {
    let h = Harness::sqlite("amb-pause").route("r", "/r", "").start();
    let other = h.replica();
    let done = eid("done");
    assert_eq!(h.deliver("/r", Some(&done), b"{}").status, 200);
    let (code, _, err) = cli(&["routes", "pause", "--store", &h.store, "r"]);
    assert_eq!(code, 0, "{err}");
    let paused_at = Instant::now();
    // each try a new event: one let through before the pause took is delivered
    let mut refused = Vec::new();
    for px in [&h.px, &other] {
        loop {
            let id = eid("new");
            let r = px.deliver("/r", Some(&id), b"{}");
            if r.status == 503 && problem_type(&r) == "urn:idemgate:problem:route-paused" {
                assert_eq!(r.header("retry-after"), Some("30"));
                refused.push(id);
                break;
            }
            assert_eq!(r.status, 200, "{r:?}");
            assert!(
                paused_at.elapsed() < Duration::from_secs(2),
                "not paused within 2 s: {r:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let replay = px.deliver("/r", Some(&done), b"{}");
        assert_eq!(replay.status, 200, "{replay:?}");
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    }
    let new = refused[0].clone();
    let (code, out, _) = cli(&["routes", "list", "--store", &h.store]);
    assert_eq!(code, 0);
    assert!(out.contains("r  paused since"), "{out}");
    assert!(h.px.metric("idemgate_route_paused{route=\"r\"}") == 1.0);
    assert_eq!(h.up.count(&new), 0, "nothing was forwarded");
    let (code, _, _) = cli(&["events", "show", "--store", &h.store, "--route", "r", &new]);
    assert_eq!(code, 3, "nothing was claimed");
    let (code, _, err) = cli(&["routes", "resume", "--store", &h.store, "r"]);
    assert_eq!(code, 0, "{err}");
    let resumed = Instant::now();
    loop {
        let r = other.deliver("/r", Some(&new), b"{}");
        if r.status == 200 {
            break;
        }
        assert!(resumed.elapsed() < Duration::from_secs(2), "{r:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(h.up.count(&new), 1);
}
