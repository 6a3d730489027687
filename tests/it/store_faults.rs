//! Real store faults (issue 26), against the real binary:
//! - a private PostgreSQL cluster (never the shared server) whose postmaster
//!   is SIGKILLed mid-load and restarted 2 s later, again and again, under
//!   two idemgate replicas and senders that send unique deliveries,
//!   duplicates of delivered events and 20-way storms of one event, in front
//!   of a consumer that records every request;
//! - the SQLite file on a small tmpfs that fills mid-load and is freed, and
//!   idemgate SIGKILLed while it is full.
//!
//! The fast variants run in `cargo test` (3 crashes); the full one (10
//! crashes) is `cargo test --release --test store_faults -- --ignored`.
//! Each prints the figures docs/guarantees.md's table quotes.

use crate::common;
use crate::core_util;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::pg_cluster::PgCluster;
use common::tmpfs::SqliteOnTmpfs;
use common::*;
use core_util::wait_until;

pub(crate) const PATH: &str = "/hooks/r";
/// Short, so that claims orphaned by a crash (the settle never committed)
/// are re-attempted within the test.
const LEASE: &str = "2s";

fn routes(up: &Consumer) -> String {
    route(
        "r",
        PATH,
        &up.url(),
        &format!("    lease: {LEASE}\n    upstream_timeout: 1s\n"),
    )
}

/// What the senders saw, shared by every sender thread.
#[derive(Default)]
pub(crate) struct Seen {
    /// Events a sender saw answered 2xx, with how (forwarded / replayed).
    pub(crate) ok: Mutex<HashMap<String, Vec<String>>>,
    /// Answers that no sender should ever get.
    pub(crate) wrong: Mutex<Vec<String>>,
    pub(crate) sent: AtomicUsize,
    /// 503s with `store_unavailable`, 409s: what a sender retries.
    pub(crate) unavailable: AtomicUsize,
    pub(crate) in_flight: AtomicUsize,
}

impl Seen {
    fn ok(&self, id: &str, how: &str) {
        self.ok
            .lock()
            .unwrap()
            .entry(id.to_string())
            .or_default()
            .push(how.to_string());
    }
    pub(crate) fn delivered(&self) -> Vec<String> {
        self.ok.lock().unwrap().keys().cloned().collect()
    }
}

/// Delivers `id` through `addrs` (alternating, from `start`) until a 2xx,
/// as a sender does: 503 and 409 are retried after a pause, so is a refused
/// or cut connection. Gives up after `patience`.
pub(crate) fn send_until_ok(
    seen: &Seen,
    addrs: &[SocketAddr],
    start: usize,
    id: &str,
    patience: Duration,
) {
    let deadline = Instant::now() + patience;
    let mut i = start;
    while Instant::now() < deadline {
        let addr = addrs[i % addrs.len()];
        i += 1;
        seen.sent.fetch_add(1, Ordering::Relaxed);
        match kit::deliver(addr, PATH, Some(id), br#"{"fault":true}"#) {
            Ok(r) if r.status == 200 => {
                let how = r.header("Idempotency-Status").unwrap_or("").to_string();
                if !matches!(how.as_str(), "forwarded" | "replayed") {
                    seen.wrong
                        .lock()
                        .unwrap()
                        .push(format!("{id}: 200 with Idempotency-Status {how:?}"));
                }
                seen.ok(id, &how);
                return;
            }
            Ok(r) if r.status == 503 => {
                seen.unavailable.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(r) if r.status == 409 => {
                seen.in_flight.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok(r) => {
                seen.wrong
                    .lock()
                    .unwrap()
                    .push(format!("{id}: {} {}", r.status, r.text()));
                return;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    seen.wrong
        .lock()
        .unwrap()
        .push(format!("{id}: no 2xx within {patience:?}"));
}

/// `/readyz` of one replica, sampled every 50 ms: each change with its time.
pub(crate) struct ReadyLog {
    changes: Mutex<Vec<(Instant, u16)>>,
}

impl ReadyLog {
    pub(crate) fn watch(admin: SocketAddr, stop: &AtomicBool) -> Self {
        let log = ReadyLog {
            changes: Mutex::new(Vec::new()),
        };
        let mut last = 0;
        while !stop.load(Ordering::Relaxed) {
            let status = kit::get(admin, "/readyz").map(|r| r.status).unwrap_or(0);
            if status != last {
                log.changes.lock().unwrap().push((Instant::now(), status));
                last = status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        log
    }

    /// One watcher per replica, on threads of `s`, until `stop`.
    pub(crate) fn watch_each<'scope>(
        s: &'scope std::thread::Scope<'scope, '_>,
        replicas: &[Proxy],
        stop: &'scope AtomicBool,
    ) -> Vec<std::thread::ScopedJoinHandle<'scope, ReadyLog>> {
        replicas
            .iter()
            .map(|p| {
                let admin = p.admin;
                s.spawn(move || ReadyLog::watch(admin, stop))
            })
            .collect()
    }

    /// Whether it answered 503 in the outage that began at `killed` (and
    /// before `until`, the next one), and when it answered 200 after that.
    pub(crate) fn outage(&self, killed: Instant, until: Instant) -> (bool, Option<Instant>) {
        let changes = self.changes.lock().unwrap();
        let Some(pos) = changes
            .iter()
            .position(|&(t, s)| t >= killed && t < until && s != 200)
        else {
            return (false, None);
        };
        let back = changes[pos..]
            .iter()
            .find(|&&(_, s)| s == 200)
            .map(|&(t, _)| t);
        (true, back)
    }
}

/// Sets the flag when dropped: every exit of a scope, a panic included,
/// stops the threads that watch it (else the scope would wait forever).
pub(crate) struct SetOnDrop<'a>(pub(crate) &'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One run's senders' shared state: what they saw, the flag that stops
/// them, and how many storms they sent.
#[derive(Default)]
pub(crate) struct Load {
    pub(crate) seen: Seen,
    stop: AtomicBool,
    pub(crate) storms: AtomicUsize,
}

impl Load {
    /// Starts [`senders`] in `s` across `addrs`: they stop when the guard
    /// this answers drops (every exit of the scope, a panic included).
    pub(crate) fn start<'s>(
        &'s self,
        s: &'s std::thread::Scope<'s, '_>,
        addrs: &'s [SocketAddr],
        storm: usize,
        patience: Duration,
    ) -> SetOnDrop<'s> {
        let stop_senders = SetOnDrop(&self.stop);
        senders(
            s,
            &self.seen,
            &self.stop,
            &self.storms,
            addrs,
            storm,
            patience,
        );
        stop_senders
    }
}

/// Six senders of unique events (every fourth a duplicate of one already
/// delivered) and a thread of `storm`-way storms of one event, across
/// `addrs`, each retrying until a 2xx or `patience` runs out; until `stop`.
fn senders<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    seen: &'s Seen,
    stop: &'s AtomicBool,
    storms: &'s AtomicUsize,
    addrs: &'s [SocketAddr],
    storm: usize,
    patience: Duration,
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
                send_until_ok(seen, addrs, n + w, &id, patience);
            }
        });
    }
    s.spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            let id = eid("storm");
            std::thread::scope(|st| {
                for i in 0..storm {
                    let id = &id;
                    st.spawn(move || send_until_ok(seen, addrs, i, id, patience));
                }
            });
            storms.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(100));
        }
    });
}

/// One crash: when the postmaster was killed and when it was running again.
struct Crash {
    killed: Instant,
    restarted: Instant,
    /// Per replica: from the restart to the first claim it served.
    first_claim: Vec<Duration>,
}

/// A fresh event through one replica, again and again until forwarded.
fn first_claim_after(addr: SocketAddr, tag: &str, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    let id = eid(tag);
    while t.elapsed() < limit {
        if let Ok(r) = kit::deliver(addr, PATH, Some(&id), br#"{"probe":true}"#) {
            if r.status == 200 {
                return Some(t.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn postgres_crashes(crashes: usize) {
    let Some(pg) = PgCluster::start("faults-pg", &[]) else {
        return;
    };
    let dir = TempDir::new("faults-pg-proxies");
    let up = Consumer::start().unwrap();
    let replicas = [
        Proxy::start(&dir, &pg.url(), &routes(&up)),
        Proxy::start(&dir, &pg.url(), &routes(&up)),
    ];
    let addrs = [replicas[0].addr, replicas[1].addr];
    let load = Load::default();
    let watching = AtomicBool::new(false);
    let started = Instant::now();

    let (crash_log, ready_logs) = std::thread::scope(|s| {
        let _stop_watchers = SetOnDrop(&watching);
        let ready = ReadyLog::watch_each(s, &replicas, &watching);
        let log = std::thread::scope(|s| {
            // Senders: unique deliveries, duplicates of delivered events,
            // 20-way storms of one event.
            let _stop_senders = load.start(s, &addrs, 20, Duration::from_secs(40));
            // The crashes.
            let mut log = Vec::new();
            for c in 0..crashes {
                std::thread::sleep(Duration::from_millis(1500));
                let killed = Instant::now();
                pg.kill_postmaster();
                std::thread::sleep(Duration::from_secs(2));
                pg.pg_ctl_start();
                let restarted = Instant::now();
                let first_claim = addrs
                    .iter()
                    .map(|&a| {
                        first_claim_after(a, &format!("probe{c}"), Duration::from_secs(30))
                            .unwrap_or_else(|| {
                                panic!("a replica served no claim within 30 s of restart {c}")
                            })
                    })
                    .collect();
                log.push(Crash {
                    killed,
                    restarted,
                    first_claim,
                });
            }
            std::thread::sleep(Duration::from_secs(1));
            log
            // `_stop_senders` drops here: the senders end their current
            // events (retrying past leases), then the scope ends
        });
        drop(_stop_watchers);
        let ready_logs: Vec<ReadyLog> = ready.into_iter().map(|h| h.join().unwrap()).collect();
        (log, ready_logs)
    });
    let took = started.elapsed();
    report_and_check(&pg, &up, &replicas, &load, &crash_log, &ready_logs, took);
}

fn report_and_check(
    pg: &PgCluster,
    up: &Consumer,
    replicas: &[Proxy; 2],
    load: &Load,
    crashes: &[Crash],
    ready: &[ReadyLog],
    took: Duration,
) {
    let Load { seen, storms, .. } = load;
    let mut problems: Vec<String> = seen.wrong.lock().unwrap().clone();
    // Every record, after recovery.
    let rows = pg.psql("SELECT event_id, state, attempts FROM records WHERE route = 'r'");
    let records: HashMap<String, (String, i64)> = rows
        .lines()
        .filter_map(|l| {
            let mut f = l.split('|');
            Some((
                f.next()?.to_string(),
                (f.next()?.to_string(), f.next()?.parse().ok()?),
            ))
        })
        .collect();
    // What the consumer got, per event, with the Idempotency-Key of each.
    let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in up.received() {
        let id = r.header("X-Event-ID").unwrap_or_default().to_string();
        let key = r.header("Idempotency-Key").unwrap_or_default().to_string();
        got.entry(id).or_default().push(key);
    }
    let (mut reattempted, mut extra_effects) = (0usize, 0usize);
    for (id, keys) in &got {
        let Some((state, attempts)) = records.get(id) else {
            problems.push(format!("{id}: forwarded, but no record after recovery"));
            continue;
        };
        if keys.len() > 1 {
            // a re-attempt after an expired lease: a claim of its own each
            // time, and the same key every time
            if keys.iter().any(|k| k != id) || (keys.len() as i64) > *attempts {
                problems.push(format!(
                    "{id}: {} side effects, {attempts} claims, keys {keys:?} ({state})",
                    keys.len()
                ));
            } else {
                reattempted += 1;
                extra_effects += keys.len() - 1;
            }
        }
    }
    let delivered_ok = seen.delivered();
    for id in &delivered_ok {
        match records.get(id) {
            Some((state, _)) if state == "delivered" => {}
            other => problems.push(format!(
                "{id}: a sender saw 2xx, the record after recovery is {other:?}"
            )),
        }
    }
    // Readiness: both replicas went 503 during each outage and came back.
    let mut ready_back = Vec::new();
    for (c, crash) in crashes.iter().enumerate() {
        let until = crashes
            .get(c + 1)
            .map(|next| next.killed)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        for (i, log) in ready.iter().enumerate() {
            let (dipped, back) = log.outage(crash.killed, until);
            if !dipped {
                problems.push(format!("replica {i}: /readyz never 503 in outage {c}"));
            }
            match back {
                Some(t) => ready_back.push(t.saturating_duration_since(crash.restarted)),
                None => problems.push(format!("replica {i}: /readyz not 200 after outage {c}")),
            }
        }
    }
    let first: Vec<Duration> = crashes
        .iter()
        .flat_map(|c| c.first_claim.iter().copied())
        .collect();
    let max_first = first.iter().max().copied().unwrap_or_default();
    let mean_first = first.iter().sum::<Duration>() / first.len().max(1) as u32;
    let max_ready = ready_back.iter().max().copied().unwrap_or_default();
    let forwarded_once = got.values().filter(|k| k.len() == 1).count();
    let storm_ids: HashSet<&String> = got.keys().filter(|k| k.starts_with("storm")).collect();
    eprintln!(
        "postgres crashes: {} SIGKILLs of the postmaster (2 s down each) in {took:?}, 2 replicas; \
         requests sent {}, events answered 2xx {}, storms {} ({} reached the consumer); \
         503s {}, 409s {}; consumer: {} events once, {reattempted} re-attempted after an expired lease \
         ({extra_effects} extra side effects, all with the same Idempotency-Key), other duplicates {}; \
         restart to first claim served: mean {mean_first:?}, max {max_first:?}; \
         restart to /readyz 200: max {max_ready:?}; problems {}",
        crashes.len(),
        seen.sent.load(Ordering::Relaxed),
        delivered_ok.len(),
        storms.load(Ordering::Relaxed),
        storm_ids.len(),
        seen.unavailable.load(Ordering::Relaxed),
        seen.in_flight.load(Ordering::Relaxed),
        forwarded_once,
        problems.iter().filter(|p| p.contains("side effects")).count(),
        problems.len(),
    );
    if !problems.is_empty() {
        problems.truncate(30);
        panic!("{}{}", problems.join("\n"), log_tails(replicas, 20));
    }
    assert!(delivered_ok.len() > 20, "too little load to say anything");
}

/// The fast variant, in every `cargo test`: 3 crashes.
#[test]
fn postgres_postmaster_killed_3_times_under_load() {
    postgres_crashes(3);
}

/// The full run of issue 26: 10 crashes in one run (about 2 minutes):
/// `cargo test --release --test store_faults -- --ignored`.
#[test]
#[ignore]
fn postgres_postmaster_killed_10_times_under_load() {
    postgres_crashes(10);
}

/// When the first claim at or after `from` was refused.
fn first_503(answers: &Answers, from: Instant) -> Option<Instant> {
    answers
        .lock()
        .unwrap()
        .iter()
        .find(|(t, _, s, _)| *t >= from && *s == 503)
        .map(|(t, _, _, _)| *t)
}

/// One delivery attempt through the proxy: (status, Idempotency-Status).
fn attempt(addr: SocketAddr, id: &str) -> (u16, String) {
    match kit::deliver(addr, PATH, Some(id), br#"{"disk":true}"#) {
        Ok(r) => (
            r.status,
            r.header("Idempotency-Status").unwrap_or("").to_string(),
        ),
        Err(_) => (0, String::new()),
    }
}

fn readyz(px: &Proxy) -> u16 {
    kit::get(px.admin, "/readyz").map(|r| r.status).unwrap_or(0)
}

/// Every record of the file, read-only (reads work on a full disk).
fn records_of(db: &std::path::Path) -> BTreeMap<String, (String, i64)> {
    let conn = rusqlite::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap();
    let mut st = conn
        .prepare("SELECT event_id, state, attempts FROM records")
        .unwrap();
    let rows = st
        .query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))
        .unwrap();
    rows.map(Result::unwrap).collect()
}

fn integrity(db: &std::path::Path) -> String {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap()
}

/// Load from `workers` threads until `stop`: fresh events, and every third
/// a duplicate of one delivered before; every answer kept with the time it
/// was asked.
type Answers = Mutex<Vec<(Instant, String, u16, String)>>;

fn load(addr: SocketAddr, stop: &AtomicBool, answers: &Answers, workers: usize) {
    std::thread::scope(|s| {
        for w in 0..workers {
            s.spawn(move || {
                let mut n = 0usize;
                let mut mine: Vec<String> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let id = match (n.is_multiple_of(3), mine.last()) {
                        (true, Some(old)) => old.clone(),
                        _ => eid(&format!("d{w}")),
                    };
                    let at = Instant::now();
                    let (status, how) = attempt(addr, &id);
                    if status == 200 && how == "forwarded" {
                        mine.push(id.clone());
                    }
                    answers.lock().unwrap().push((at, id, status, how));
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
        }
    });
}

/// Records of `before` that are gone or went back (delivered is final;
/// anything else may only have moved on), and the events forwarded since
/// `restarted` that are not delivered in `after`; the latter's IDs.
fn lost_records(
    before: &BTreeMap<String, (String, i64)>,
    after: &BTreeMap<String, (String, i64)>,
    answers: &Answers,
    restarted: Instant,
) -> (Vec<String>, Vec<String>) {
    // Delivered is final; anything else may only have moved on (a reclaim
    // by the load after the restart).
    let mut lost = Vec::new();
    for (id, (state, attempts)) in before {
        match after.get(id) {
            Some((s, a)) if s == state && a == attempts => {}
            Some((_, a)) if state != "delivered" && a >= attempts => {}
            other => lost.push(format!("{id}: {state}/{attempts} before, {other:?} after")),
        }
    }
    // and what the sender saw forwarded after the restart is on disk too
    let forwarded_after: Vec<String> = answers
        .lock()
        .unwrap()
        .iter()
        .filter(|(t, _, s, h)| *t >= restarted && *s == 200 && h == "forwarded")
        .map(|(_, id, _, _)| id.clone())
        .collect();
    for id in &forwarded_after {
        if after.get(id).is_none_or(|(s, _)| s != "delivered") {
            lost.push(format!(
                "{id}: forwarded after the restart, {:?}",
                after.get(id)
            ));
        }
    }
    (lost, forwarded_after)
}

/// The SQLite file on a 32 MiB tmpfs that fills mid-load. While full:
/// every fresh delivery gets 503, nothing reaches the consumer without a
/// committed claim, `/readyz` answers 503, every settle that did not commit
/// is counted. Freed: service and `/readyz` come back without a restart,
/// `PRAGMA integrity_check` is ok. Then full again, idemgate SIGKILLed and
/// restarted while full (not ready, nothing lost), freed: no record lost.
#[test]
// long: one scenario told in order: fill under load, free, fill again, SIGKILL, restart full, free
fn sqlite_disk_fills_mid_load_then_frees() {
    let Some(full) = SqliteOnTmpfs::mount("faults-full", "32m") else {
        return;
    };
    let (disk, db, up) = (&full.disk, &full.db, &full.up);
    let mut px = full.start(&routes(up));
    let answers: Answers = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let fresh_refused = |from: Instant, to: Instant| -> Vec<(u16, String)> {
        let a = answers.lock().unwrap();
        let delivered_before: HashSet<&String> = a
            .iter()
            .filter(|(t, _, s, _)| *t < from && *s == 200)
            .map(|(_, id, _, _)| id)
            .collect();
        a.iter()
            .filter(|(t, id, _, _)| *t >= from && *t < to && !delivered_before.contains(id))
            .map(|(_, _, s, h)| (*s, h.clone()))
            .collect()
    };

    // 1. Load; the disk fills under it; then it is freed.
    let (filled, full_from, freed, readyz_503_after, resumed_after, readyz_200_after) =
        std::thread::scope(|s| {
            let _stop = SetOnDrop(&stop);
            s.spawn(|| load(px.addr, &stop, &answers, 4));
            std::thread::sleep(Duration::from_secs(1));
            let filled = Instant::now();
            disk.fill(0);
            // Claims go on while the WAL has room in the space it already
            // has; full is from the first claim refused (plus a moment for
            // the batches then under way to end).
            assert!(
                wait_until(Duration::from_secs(60), || first_503(&answers, filled)
                    .is_some()),
                "no claim was refused on a full disk\n{}",
                px.log()
            );
            let full_from = first_503(&answers, filled).unwrap() + Duration::from_millis(200);
            let t = Instant::now();
            assert!(
                wait_until(Duration::from_secs(10), || readyz(&px) == 503),
                "/readyz stayed ready on a full disk\n{}",
                px.log()
            );
            let readyz_503_after = t.elapsed();
            std::thread::sleep(Duration::from_secs(2));
            let freed = Instant::now();
            disk.free();
            let t = Instant::now();
            let probe = eid("after-free");
            let resumed = wait_until(Duration::from_secs(10), || {
                attempt(px.addr, &probe).0 == 200
            });
            assert!(resumed, "no service within 10 s of freeing\n{}", px.log());
            let resumed_after = t.elapsed();
            assert!(
                wait_until(Duration::from_secs(10), || readyz(&px) == 200),
                "/readyz not ready again"
            );
            let readyz_200_after = t.elapsed();
            std::thread::sleep(Duration::from_millis(500));
            (
                filled,
                full_from,
                freed,
                readyz_503_after,
                resumed_after,
                readyz_200_after,
            )
        });
    let full_answers = fresh_refused(full_from, freed);
    // 503 (fail closed); a claim that still found room in the WAL commits,
    // durably, and is forwarded (its record is checked below with the rest)
    let refused_full = full_answers
        .iter()
        .filter(|(s, h)| *s == 503 && h == "store_unavailable")
        .count();
    let committed_full = full_answers
        .iter()
        .filter(|(s, h)| *s == 200 && matches!(h.as_str(), "forwarded" | "replayed"))
        .count();
    assert!(
        refused_full > 0 && refused_full + committed_full == full_answers.len(),
        "fresh deliveries while full: {full_answers:?}"
    );
    // Nothing reached the consumer without a committed claim, and every
    // forwarded event whose settle did not commit was counted — once the
    // settles kept across the full disk (SPEC §16) committed or were given
    // up at their lease's end.
    assert!(
        wait_until(Duration::from_secs(20), || px
            .metric("idemgate_settles_pending")
            == 0.0),
        "settles still pending"
    );
    let records = records_of(db);
    let forwarded: HashSet<String> = up
        .received()
        .iter()
        .filter_map(|r| r.header("X-Event-ID").map(str::to_string))
        .collect();
    let unclaimed: Vec<&String> = forwarded
        .iter()
        .filter(|id| !records.contains_key(*id))
        .collect();
    assert!(
        unclaimed.is_empty(),
        "forwarded without a claim: {unclaimed:?}"
    );
    // A settle that did not commit leaves its claim processing until a
    // duplicate reclaims it after the lease (a second attempt): each is one
    // counted error, no more, no fewer.
    let unsettled: i64 = forwarded
        .iter()
        .filter_map(|id| records.get(id))
        .map(|(state, attempts)| (attempts - 1) + i64::from(state == "processing"))
        .sum();
    let settle_errors = px.metric(r#"idemgate_settles_total{result="error",route="r"}"#);
    assert_eq!(
        unsettled as f64, settle_errors,
        "settles that did not commit (processing records, reclaims) vs settle errors counted"
    );
    assert_eq!(integrity(db), "ok");
    let (n_full, total) = (full_answers.len(), answers.lock().unwrap().len());

    // 2. Full again (under load until a claim is refused); SIGKILL while
    // full; restarted while full.
    let refilled = Instant::now();
    disk.fill(0);
    stop.store(false, Ordering::Relaxed);
    std::thread::scope(|s| {
        let _stop = SetOnDrop(&stop);
        s.spawn(|| load(px.addr, &stop, &answers, 4));
        assert!(
            wait_until(Duration::from_secs(60), || first_503(&answers, refilled)
                .is_some()),
            "no claim was refused on a full disk again"
        );
    });
    let before = records_of(db);
    px.kill();
    px.spawn_answering();
    // The restarted process may find room in the WAL the dead one left
    // (its frames checkpointed): claims then commit, durably, until it is
    // used up. Its readiness must say which: load until a claim is refused.
    let restarted = Instant::now();
    std::thread::scope(|s| {
        let _stop = SetOnDrop(&stop);
        stop.store(false, Ordering::Relaxed);
        s.spawn(|| load(px.addr, &stop, &answers, 4));
        assert!(
            wait_until(Duration::from_secs(60), || first_503(&answers, restarted)
                .is_some()),
            "restarted on a full disk, no claim was ever refused"
        );
    });
    assert!(
        wait_until(Duration::from_secs(10), || readyz(&px) == 503),
        "restarted on a full disk, refusing claims, and ready"
    );
    // (a claim that finds room in the WAL still commits, durably: refused
    // or recorded, never forwarded without its record)
    let late = eid("restarted-full");
    match attempt(px.addr, &late) {
        (503, _) => {}
        (200, how) if how == "forwarded" => assert!(records_of(db).contains_key(&late)),
        other => panic!("{late} on a full disk: {other:?}"),
    }
    // reads still answer: a delivered event is replayed
    let delivered = before
        .iter()
        .find(|(_, (s, _))| s == "delivered")
        .map(|(id, _)| id.clone())
        .expect("a delivered record");
    assert_eq!(attempt(px.addr, &delivered), (200, "replayed".into()));
    disk.free();
    assert!(
        wait_until(Duration::from_secs(10), || readyz(&px) == 200),
        "/readyz not ready after freeing\n{}",
        px.log()
    );
    let after = records_of(db);
    let (lost, forwarded_after) = lost_records(&before, &after, &answers, restarted);
    assert!(lost.is_empty(), "records lost or changed: {lost:?}");
    assert_eq!(integrity(db), "ok");
    let fresh = eid("end");
    assert_eq!(attempt(px.addr, &fresh), (200, "forwarded".into()));
    eprintln!(
        "sqlite disk full: {total} deliveries, {n_full} fresh ones while full ({refused_full} 503, \
         {committed_full} committed in room the WAL still had), \
         /readyz 503 {readyz_503_after:?} after the fill was seen, {} records; forwarded without a claim 0; \
         {unsettled} forwarded events unsettled = {settle_errors} settle errors counted; \
         freed: service after {resumed_after:?}, /readyz 200 after {readyz_200_after:?}, no restart; \
         SIGKILL while full, restarted while full ({} forwarded while its WAL had room, then 503, replays served): {} records kept, 0 lost; \
         integrity_check ok (first claim refused {:?} after the fill began)",
        records.len(),
        forwarded_after.len(),
        before.len(),
        full_from.saturating_duration_since(filled),
    );
}
