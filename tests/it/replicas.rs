//! Several replicas, one store (SPEC §3, §6): two `idemgate serve` processes
//! share one PostgreSQL schema, or one SQLite file, in front of one consumer.
//! Deliveries of an event are split across both; exactly one reaches the
//! consumer.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use common::*;

const PATH: &str = "/hooks/r";
/// Each scenario must finish well inside this.
const BUDGET: Duration = Duration::from_secs(60);
/// Client threads for the many-events scenario.
const WORKERS: usize = 32;

/// Two replicas of one config on one store; the second starts once the
/// first has migrated and is ready.
fn replicas(store: &TestStore, up: &Consumer) -> [Proxy; 2] {
    let routes = route("r", PATH, &up.url(), "");
    let a = Proxy::start(&store.dir, &store.url, &routes);
    let b = Proxy::start(&store.dir, &store.url, &routes);
    [a, b]
}

/// What a sender saw: status and `Idempotency-Status`.
type Seen = (u16, String);

fn send(addr: SocketAddr, id: &str, body: &[u8]) -> Seen {
    let r = kit::deliver(addr, PATH, Some(id), body)
        .unwrap_or_else(|e| panic!("delivery of {id} to {addr}: {e}"));
    let status = r.header("Idempotency-Status").unwrap_or("").to_string();
    (r.status, status)
}

/// Panics with both replicas' logs (their tails) attached.
fn fail_with_logs(proxies: &[Proxy], msg: String) -> ! {
    panic!("{msg}{}", log_tails(proxies, 30));
}

/// How often each answer was given.
fn tally(seen: &[Seen]) -> HashMap<Seen, usize> {
    let mut t = HashMap::new();
    for s in seen {
        *t.entry(s.clone()).or_insert(0) += 1;
    }
    t
}

fn claims_total(proxies: &[Proxy]) -> f64 {
    proxies
        .iter()
        .map(|p| p.metric(r#"idemgate_claims_total{kind="new",route="r"}"#))
        .sum()
}

/// `n` deliveries of one event at once, alternating between the replicas.
fn burst(addrs: [SocketAddr; 2], id: &str, n: usize) -> Vec<Seen> {
    let barrier = Arc::new(Barrier::new(n));
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let barrier = barrier.clone();
                s.spawn(move || {
                    barrier.wait();
                    send(addrs[i % 2], id, br#"{"n":1}"#)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Exactly one sender was forwarded; the others were told "in flight" or
/// got the replay.
fn one_forwarded(proxies: &[Proxy], up: &Consumer, id: &str, seen: &[Seen], want_seen: usize) {
    let t = tally(seen);
    let forwarded = t.get(&(200, "forwarded".into())).copied().unwrap_or(0);
    let others_ok = seen.iter().all(|s| {
        matches!(
            (s.0, s.1.as_str()),
            (200, "forwarded") | (200, "replayed") | (409, "in_flight")
        )
    });
    if up.count(id) != want_seen || forwarded != 1 || !others_ok {
        fail_with_logs(
            proxies,
            format!(
                "consumer saw {} requests for the event (want {want_seen}), {forwarded} senders were forwarded; answers {t:?}",
                up.count(id)
            ),
        );
    }
}

/// 200 concurrent deliveries of one event, alternating between the two
/// replicas; the consumer holds the first one for a while so that most of
/// the others arrive while it is in flight. Then the same for an event whose
/// first attempt failed (the reclaim path), and a wave of late duplicates.
fn one_event_many_senders(store: TestStore) {
    let up = Consumer::start().unwrap();
    let proxies = replicas(&store, &up);
    let addrs = [proxies[0].addr, proxies[1].addr];
    let slow = || Reply::status(200).delay(Duration::from_millis(400));

    let id = eid("hot");
    up.script(&id, vec![slow()]);
    let started = Instant::now();
    let seen = burst(addrs, &id, 200);
    let took = started.elapsed();
    eprintln!(
        "200 concurrent deliveries of one event: {took:?}, answers {:?}",
        tally(&seen)
    );
    one_forwarded(&proxies, &up, &id, &seen, 1);
    assert!(took < BUDGET, "took {took:?}");

    // Late duplicates, through both: all replayed.
    let late = burst(addrs, &id, 50);
    assert_eq!(
        tally(&late),
        HashMap::from([((200, "replayed".into()), 50)])
    );

    // A failed first attempt releases the claim; 200 retries at once, across
    // both replicas, reclaim it exactly once.
    let retried = eid("retried");
    up.script(&retried, vec![Reply::status(500), slow()]);
    assert_eq!(
        send(addrs[0], &retried, br#"{"n":1}"#),
        (500, "forwarded".into())
    );
    let seen = burst(addrs, &retried, 200);
    eprintln!(
        "200 concurrent retries of a failed event: answers {:?}",
        tally(&seen)
    );
    one_forwarded(&proxies, &up, &retried, &seen, 2);

    assert_eq!(up.total(), 3);
    assert_eq!(claims_total(&proxies), 2.0);
    let reclaims: f64 = proxies
        .iter()
        .map(|p| p.metric(r#"idemgate_claims_total{kind="retry_failed",route="r"}"#))
        .sum();
    assert_eq!(reclaims, 1.0);
}

/// 1,000 distinct events, each delivered twice at about the same moment, once
/// through each replica, by a pool of client threads.
fn many_events_twice(store: TestStore) {
    let up = Consumer::start().unwrap();
    let proxies = replicas(&store, &up);
    let addrs = [proxies[0].addr, proxies[1].addr];
    let ids: Vec<String> = (0..1000).map(|_| eid("evt")).collect();
    // Both copies of an event are next to each other in the queue, so two
    // workers pick them up together; which replica comes first alternates.
    let jobs: Vec<(usize, usize)> = (0..ids.len())
        .flat_map(|i| [(i, i % 2), (i, (i + 1) % 2)])
        .collect();
    let next = AtomicUsize::new(0);
    let seen: Mutex<Vec<(usize, Seen)>> = Mutex::new(Vec::with_capacity(jobs.len()));
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..WORKERS {
            s.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(i, replica)) = jobs.get(n) else {
                    return;
                };
                let body = format!(r#"{{"event":{i}}}"#);
                let got = send(addrs[replica], &ids[i], body.as_bytes());
                seen.lock().unwrap().push((i, got));
            });
        }
    });
    let took = started.elapsed();
    let seen = seen.into_inner().unwrap();
    let all: Vec<Seen> = seen.iter().map(|(_, s)| s.clone()).collect();
    let t = tally(&all);
    eprintln!("1,000 events × 2 over 2 replicas: {took:?}, answers {t:?}");
    assert_eq!(seen.len(), 2000);

    let mut problems = Vec::new();
    let mut forwarded = vec![0; ids.len()];
    for (i, (status, outcome)) in &seen {
        match (status, outcome.as_str()) {
            (200, "forwarded") => forwarded[*i] += 1,
            (200, "replayed") | (409, "in_flight") => {}
            other => problems.push(format!("{}: {other:?}", ids[*i])),
        }
    }
    for (i, id) in ids.iter().enumerate() {
        let n = up.count(id);
        if n != 1 || forwarded[i] != 1 {
            problems.push(format!(
                "{id}: consumer saw it {n} times, {} senders forwarded",
                forwarded[i]
            ));
        }
    }
    if !problems.is_empty() {
        problems.truncate(20);
        fail_with_logs(&proxies, problems.join("\n"));
    }
    assert_eq!(up.total(), 1000);
    assert_eq!(claims_total(&proxies), 1000.0);
    for p in &proxies {
        let answered: f64 = ["forwarded", "replayed", "in_flight"]
            .iter()
            .map(|o| {
                p.metric(&format!(
                    r#"idemgate_requests_total{{outcome="{o}",route="r"}}"#
                ))
            })
            .sum();
        assert_eq!(
            answered, 1000.0,
            "each replica took one copy of every event"
        );
    }
    assert!(took < BUDGET, "took {took:?}");
}

on_both_stores!(one_event_many_senders("rep1"): sqlite_one_event_200_senders_two_processes, postgres_one_event_200_senders_two_replicas);

on_both_stores!(many_events_twice("rep1000"): sqlite_1000_events_twice_two_processes, postgres_1000_events_twice_two_replicas);
