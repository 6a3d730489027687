//! Crash tests (issue 8): an `idemgate serve` process dies (abort, like
//! `kill -9`) at chosen points of a delivery, or is killed at a random
//! moment; the sender redelivers through a healthy process on the same store.
//! Exactly once, except a re-attempt after the lease expired with the outcome
//! unknown — and that one carries the same `Idempotency-Key`.

use crate::common;

use std::time::{Duration, Instant};

use common::binaries::armed;
use common::*;

/// A fixed-seed generator (xorshift), so every run takes the same path.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Crash {
    BeforeClaim,
    AfterClaim,
    AfterUpstream,
    /// SIGKILL from outside after a random delay.
    RandomKill(u64),
}

const LEASE: Duration = Duration::from_millis(1500);

fn routes(up: &Consumer) -> String {
    route(
        "c",
        "/hooks/c",
        &up.url(),
        "    lease: 1500ms\n    upstream_timeout: 1s\n",
    )
}

/// Redelivers until the sender sees a success; returns how many tries.
fn redeliver(px: &Proxy, id: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(15);
    for tries in 1.. {
        let r = px.deliver("/hooks/c", Some(id), b"{\"crash\":true}");
        match r.status {
            200 => return tries,
            409 => std::thread::sleep(Duration::from_millis(200)),
            other => panic!("{id}: unexpected {other} {}", r.text()),
        }
        assert!(Instant::now() < deadline, "{id}: no success within 15s");
    }
    unreachable!()
}

#[test]
fn crashes_at_every_point_lose_nothing_and_double_only_after_an_unknown_outcome() {
    let dir = TempDir::new("crash");
    let up = Consumer::start().unwrap();
    let store = dir.sqlite_url("crash.db");
    let healthy = Proxy::start(&dir, &store, &routes(&up));
    let mut rng = Rng(0x1de_9a7e);
    let runs = 56;
    let (mut sent, mut duplicates) = (0usize, 0usize);
    let mut by_kind = std::collections::BTreeMap::<String, (usize, usize)>::new();
    for run in 0..runs {
        let crash = match run % 4 {
            0 => Crash::BeforeClaim,
            1 => Crash::AfterClaim,
            2 => Crash::AfterUpstream,
            _ => Crash::RandomKill(rng.next() % 300),
        };
        let id = eid("crash");
        up.hold(&id, 200, Duration::from_millis(150));
        let failpoint = match crash {
            Crash::BeforeClaim => "before_claim",
            Crash::AfterClaim => "after_claim",
            Crash::AfterUpstream => "after_upstream",
            Crash::RandomKill(_) => "",
        };
        let mut doomed = Proxy::start_bin(
            armed(),
            &dir,
            &store,
            &routes(&up),
            &[("IDEMGATE_FAILPOINT", failpoint)],
        );
        let addr = doomed.addr;
        let sender = {
            let id = id.clone();
            std::thread::spawn(move || {
                kit::deliver(addr, "/hooks/c", Some(&id), b"{\"crash\":true}")
            })
        };
        if let Crash::RandomKill(ms) = crash {
            std::thread::sleep(Duration::from_millis(ms));
            doomed.kill();
        }
        let first = sender.join().unwrap();
        doomed.kill(); // reaps an aborted process; no-op otherwise
        sent += 1;
        let first_ok = first.as_ref().is_ok_and(|r| r.status == 200);
        if !first_ok {
            sent += redeliver(&healthy, &id);
        }
        let seen = up.count(&id);
        let keys: Vec<String> = up
            .received()
            .iter()
            .filter(|r| r.key() == Some(id.as_str()))
            .map(|r| r.header("Idempotency-Key").unwrap_or_default().to_string())
            .collect();
        assert!(
            keys.iter().all(|k| k == &id),
            "{crash:?}: every attempt carries the same key: {keys:?}"
        );
        let rec = show(&store, "c", &id);
        assert_eq!(rec["state"], "delivered", "{crash:?}: {rec}");
        match crash {
            Crash::BeforeClaim | Crash::AfterClaim => {
                assert_eq!(seen, 1, "{crash:?}: exactly once")
            }
            // the consumer applied the effect but nobody learned it: one re-attempt after the lease
            Crash::AfterUpstream => assert_eq!(seen, 2, "{crash:?}: the one allowed re-attempt"),
            Crash::RandomKill(_) => assert!((1..=2).contains(&seen), "{crash:?}: seen {seen}"),
        }
        if seen == 2 {
            assert_eq!(
                rec["attempts"], 2,
                "{crash:?}: the duplicate is a reclaim after the lease"
            );
            duplicates += 1;
        }
        let kind = format!("{crash:?}").split('(').next().unwrap().to_string();
        let e = by_kind.entry(kind).or_default();
        e.0 += 1;
        e.1 += seen;
    }
    // nothing stays processing
    let (code, out, _) = cli(&[
        "events",
        "list",
        "--store",
        &store,
        "--state",
        "processing",
        "--json",
    ]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&out).unwrap(),
        serde_json::json!([])
    );
    eprintln!(
        "crash runs: {runs}, deliveries sent: {sent}, upstream side effects: {}, duplicates at the upstream: {duplicates} \
         (all re-attempts after an expired lease with the same Idempotency-Key); by crash point (runs, side effects): {by_kind:?}; lease {LEASE:?}",
        up.total()
    );
}

/// The shipped binary — built without the `failpoints` feature, as every
/// test but the crash test above runs it — ignores `IDEMGATE_FAILPOINT`:
/// set by mistake in production it must not abort the process. The binary
/// is this build's `idemgate`, or the one `IDEMGATE_SHIPPED_BIN` names.
#[test]
fn the_shipped_binary_ignores_failpoints() {
    let shipped = std::env::var_os("IDEMGATE_SHIPPED_BIN")
        .map_or_else(|| std::path::PathBuf::from(bin()), std::path::PathBuf::from);
    let dir = TempDir::new("crash-shipped");
    let up = Consumer::start().unwrap();
    let store = dir.sqlite_url("shipped.db");
    for failpoint in ["before_claim", "after_claim", "after_upstream"] {
        let mut px = Proxy::start_bin(
            &shipped,
            &dir,
            &store,
            &routes(&up),
            &[("IDEMGATE_FAILPOINT", failpoint)],
        );
        let id = eid("shipped");
        let r = px.deliver("/hooks/c", Some(&id), b"{\"crash\":false}");
        assert_eq!(r.status, 200, "{failpoint}: {r:?}\n{}", px.log());
        assert_eq!(show(&store, "c", &id)["state"], "delivered", "{failpoint}");
        assert_eq!(
            px.stop(Duration::from_secs(10)),
            Some(0),
            "{failpoint}: still running, exits 0"
        );
        assert!(!px.log().contains("failpoint"), "{failpoint}: {}", px.log());
    }
}
