//! PostgreSQL failover under load (SPEC §16, issue 45), on one machine:
//! a private primary with a streaming standby (the server package's
//! `initdb`, `pg_basebackup`, `pg_ctl`, run as `postgres`), two idemgate
//! replicas, senders that retry as real ones do (unique events, duplicates
//! of delivered ones, 5-way storms of one event), and a consumer that does
//! not deduplicate by `Idempotency-Key`: it counts every request as a side
//! effect. Each round SIGKILLs the primary's postmaster, waits 4 s (longer
//! than a settle's own 3 s of retries), promotes the standby, and rebuilds
//! the old primary as the new standby, as an HA tool would.
//!
//! Two ways to reach the server: the URL lists both hosts
//! (`target_session_attrs=read-write`), or one address (a loopback
//! forwarder standing in for a virtual IP) moves to the standby at its
//! promotion. The fast variants (3 failovers) run in `cargo test`; the full
//! runs (10 failovers each, and the asynchronous control) with
//! `cargo test --release --test it failover:: -- --ignored`. Each prints
//! the figures the README quotes. `IDEMGATE_FAILOVER_BIN` runs another
//! binary (a release before, to show what it did).

use crate::common;
use crate::store_faults::{send_until_ok, ReadyLog, Seen, SetOnDrop, PATH};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::pg_cluster::{PgCluster, REPLICATION};
use common::vip::Vip;
use common::*;

/// Longer than any outage here: a settle kept across it commits before
/// the lease ends.
const LEASE: &str = "20s";

/// How the replicas reach the database.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Reach {
    /// Both hosts in the URL.
    HostList,
    /// One address that moves at the promotion.
    Vip,
}

/// One failover: when the primary was killed, the standby promoted, and
/// each replica's `/readyz` answered 200 again.
struct Round {
    killed: Instant,
    promoted: Instant,
}

struct Figures {
    sent: usize,
    events_ok: usize,
    forwarded_twice: usize,
    storms: usize,
    unavailable: usize,
    in_flight: usize,
    outage_max: Duration,
    ready_back_max: Duration,
    pending_max: f64,
    problems: Vec<String>,
}

fn failover(tag: &str, rounds: usize, sync: bool, reach: Reach) -> Option<Figures> {
    let mut conf: Vec<&str> = REPLICATION.to_vec();
    conf.push("synchronous_commit = on");
    let names = format!(
        "synchronous_standby_names = '{}'",
        common::pg_cluster::STANDBY_NAME
    );
    if sync {
        conf.push(&names);
    }
    let first = PgCluster::start(&format!("{tag}-a"), &conf)?;
    let second = PgCluster::standby_of(&first, &format!("{tag}-b"));
    first.attach_standby(sync);
    let pgs = [first, second];
    let vip = (reach == Reach::Vip).then(|| Vip::start(pgs[0].port));
    let url = match &vip {
        Some(v) => format!("postgres://postgres@127.0.0.1:{}/postgres", v.port),
        None => format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write&connect_timeout=2",
            pgs[0].port, pgs[1].port
        ),
    };
    let dir = TempDir::new(tag);
    let up = Consumer::start().unwrap();
    let routes = route(
        "r",
        PATH,
        &up.url(),
        &format!("    lease: {LEASE}\n    upstream_timeout: 2s\n"),
    );
    let bin = std::env::var_os("IDEMGATE_FAILOVER_BIN").map(PathBuf::from);
    let bin = bin.unwrap_or_else(|| PathBuf::from(common::bin()));
    let replicas = [
        Proxy::start_bin(&bin, &dir, &url, &routes, &[]),
        Proxy::start_bin(&bin, &dir, &url, &routes, &[]),
    ];
    let pids: Vec<Option<u32>> = replicas.iter().map(Proxy::pid).collect();
    let addrs = [replicas[0].addr, replicas[1].addr];
    let seen = Seen::default();
    let (stop, watching) = (AtomicBool::new(false), AtomicBool::new(false));
    let storms = AtomicUsize::new(0);
    let mut primary = 0;

    let (log, ready, pending_max) = std::thread::scope(|s| {
        let _stop_watchers = SetOnDrop(&watching);
        let ready: Vec<_> = replicas
            .iter()
            .map(|p| {
                let (admin, watching) = (p.admin, &watching);
                s.spawn(move || ReadyLog::watch(admin, watching))
            })
            .collect();
        let pending: Vec<_> = replicas
            .iter()
            .map(|p| {
                let (admin, watching) = (p.admin, &watching);
                s.spawn(move || most_pending(admin, watching))
            })
            .collect();
        let log = std::thread::scope(|s| {
            let _stop_senders = SetOnDrop(&stop);
            senders(s, &seen, &stop, &storms, addrs);
            let mut log = Vec::new();
            for _ in 0..rounds {
                std::thread::sleep(Duration::from_secs(2));
                let standby = 1 - primary;
                let killed = Instant::now();
                pgs[primary].kill_postmaster();
                std::thread::sleep(Duration::from_secs(4));
                pgs[standby].promote();
                if let Some(v) = &vip {
                    v.point_to(pgs[standby].port);
                }
                let promoted = Instant::now();
                log.push(Round { killed, promoted });
                // the new primary alone for a while, then a new standby
                std::thread::sleep(Duration::from_secs(2));
                pgs[primary].rebuild_as_standby_of(&pgs[standby]);
                pgs[standby].attach_standby(sync);
                primary = standby;
            }
            std::thread::sleep(Duration::from_secs(1));
            log
        });
        drop(_stop_watchers);
        let ready: Vec<ReadyLog> = ready.into_iter().map(|h| h.join().unwrap()).collect();
        let most = pending
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold(0.0, f64::max);
        (log, ready, most)
    });
    let mut figures = tally(&pgs[primary], &up, &seen, &log, &ready, sync);
    figures.storms = storms.load(Ordering::Relaxed);
    figures.pending_max = pending_max;
    for (i, (p, pid)) in replicas.iter().zip(&pids).enumerate() {
        if p.pid() != *pid || !pid.is_some_and(alive) {
            figures
                .problems
                .push(format!("replica {i} was restarted or died"));
        }
    }
    eprintln!(
        "failover {tag} ({}, {reach:?}): {rounds} failovers; requests {}, events answered 2xx {}, \
         storms {}; 503s {}, 409s {}; events reaching the consumer twice or more {}; \
         outage (kill to both /readyz 200) max {:?}, promotion to /readyz 200 max {:?}; \
         most settles pending at once {}; problems {}",
        if sync {
            "synchronous standby"
        } else {
            "asynchronous standby"
        },
        figures.sent,
        figures.events_ok,
        figures.storms,
        figures.unavailable,
        figures.in_flight,
        figures.forwarded_twice,
        figures.outage_max,
        figures.ready_back_max,
        figures.pending_max,
        figures.problems.len(),
    );
    if !figures.problems.is_empty() && sync {
        let mut problems = figures.problems.clone();
        problems.truncate(30);
        panic!("{}{}", problems.join("\n"), log_tails(&replicas, 30));
    }
    Some(figures)
}

/// Six senders of unique events (every fourth a duplicate of one already
/// delivered) and a thread of 5-way storms of one event, across both
/// replicas, each retrying until a 2xx.
fn senders<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    seen: &'s Seen,
    stop: &'s AtomicBool,
    storms: &'s AtomicUsize,
    addrs: [std::net::SocketAddr; 2],
) {
    for w in 0..6 {
        s.spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let dup = n
                    .is_multiple_of(4)
                    .then(|| {
                        let ok = seen.ok.lock().unwrap();
                        ok.keys().nth((n * 7919 + w) % ok.len().max(1)).cloned()
                    })
                    .flatten();
                let id = dup.unwrap_or_else(|| eid(&format!("u{w}")));
                send_until_ok(seen, &addrs, n + w, &id, Duration::from_secs(60));
            }
        });
    }
    s.spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let id = eid("storm");
            std::thread::scope(|st| {
                for i in 0..5 {
                    let id = &id;
                    st.spawn(move || send_until_ok(seen, &addrs, i, id, Duration::from_secs(60)));
                }
            });
            storms.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(100));
        }
    });
}

/// The most `idemgate_settles_pending` one replica showed, sampled every
/// 100 ms.
fn most_pending(admin: std::net::SocketAddr, stop: &AtomicBool) -> f64 {
    let mut most: f64 = 0.0;
    while !stop.load(Ordering::Relaxed) {
        if let Ok(r) = kit::get(admin, "/metrics") {
            let text = r.text();
            let now = text
                .lines()
                .find_map(|l| l.strip_prefix("idemgate_settles_pending "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0);
            most = most.max(now);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    most
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Checks the run against what SPEC §16 promises and gathers its figures.
fn tally(
    now_primary: &PgCluster,
    up: &Consumer,
    seen: &Seen,
    rounds: &[Round],
    ready: &[ReadyLog],
    sync: bool,
) -> Figures {
    let mut problems: Vec<String> = seen.wrong.lock().unwrap().clone();
    let rows = now_primary.psql("SELECT event_id, state FROM records WHERE route = 'r'");
    let records: BTreeMap<String, String> = rows
        .lines()
        .filter_map(|l| l.split_once('|'))
        .map(|(id, state)| (id.to_string(), state.to_string()))
        .collect();
    let mut got: BTreeMap<String, usize> = BTreeMap::new();
    for r in up.received() {
        *got.entry(r.header("X-Event-ID").unwrap_or_default().to_string())
            .or_default() += 1;
    }
    let twice: Vec<(&String, &usize)> = got.iter().filter(|(_, &n)| n > 1).collect();
    for (id, n) in &twice {
        problems.push(format!("{id}: {n} side effects at the consumer"));
    }
    let ok = seen.delivered();
    for id in &ok {
        if records.get(id).map(String::as_str) != Some("delivered") {
            problems.push(format!(
                "{id}: a sender saw 2xx; on the promoted server the record is {:?}",
                records.get(id)
            ));
        }
    }
    let (mut outage_max, mut ready_back_max) = (Duration::ZERO, Duration::ZERO);
    for (c, round) in rounds.iter().enumerate() {
        let until = rounds
            .get(c + 1)
            .map_or_else(|| Instant::now() + Duration::from_secs(3600), |n| n.killed);
        for (i, log) in ready.iter().enumerate() {
            let (dipped, back) = log.outage(round.killed, until);
            if !dipped {
                problems.push(format!("replica {i}: /readyz never 503 in failover {c}"));
            }
            match back {
                Some(t) => {
                    let after = t.saturating_duration_since(round.promoted);
                    if after > Duration::from_secs(5) && sync {
                        problems.push(format!(
                            "replica {i}: /readyz 200 only {after:?} after promotion {c}"
                        ));
                    }
                    ready_back_max = ready_back_max.max(after);
                    outage_max = outage_max.max(t.saturating_duration_since(round.killed));
                }
                None => problems.push(format!("replica {i}: /readyz not 200 after failover {c}")),
            }
        }
    }
    if ok.len() < 50 {
        problems.push(format!(
            "too little load to say anything: {} events",
            ok.len()
        ));
    }
    Figures {
        sent: seen.sent.load(Ordering::Relaxed),
        events_ok: ok.len(),
        forwarded_twice: twice.len(),
        storms: 0,
        unavailable: seen.unavailable.load(Ordering::Relaxed),
        in_flight: seen.in_flight.load(Ordering::Relaxed),
        outage_max,
        ready_back_max,
        pending_max: 0.0,
        problems,
    }
}

/// In every `cargo test`: 3 failovers with the host list.
#[test]
fn synchronous_standby_promoted_3_times_host_list() {
    failover("fo-list", 3, true, Reach::HostList);
}

/// In every `cargo test`: 3 failovers behind a moving address.
#[test]
fn synchronous_standby_promoted_3_times_behind_a_virtual_ip() {
    failover("fo-vip", 3, true, Reach::Vip);
}

/// The full run of issue 45: 10 failovers in a row, host list.
#[test]
#[ignore]
fn synchronous_standby_promoted_10_times_host_list() {
    failover("fo-list10", 10, true, Reach::HostList);
}

/// The full run of issue 45: 10 failovers in a row, virtual IP.
#[test]
#[ignore]
fn synchronous_standby_promoted_10_times_behind_a_virtual_ip() {
    failover("fo-vip10", 10, true, Reach::Vip);
}

/// The control: an asynchronous standby loses what it had not received
/// when the primary died; the figures say what that costs (no assertion
/// on duplicates: they are the measurement).
#[test]
#[ignore]
fn asynchronous_standby_control_run() {
    if let Some(f) = failover("fo-async", 10, false, Reach::HostList) {
        eprintln!(
            "asynchronous control: problems (lost or doubled): {:#?}",
            f.problems
        );
    }
}
