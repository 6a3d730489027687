//! Store edge cases (issue 20, SPEC §6), each against the real binary and
//! the real store:
//! - a settle whose requester gave up is not applied later behind its back
//!   (SQLite: the writer waited for another process's lock meanwhile);
//! - a claim that commits while its requester waits is reported as claimed,
//!   not failed (PostgreSQL: it was queued behind a slow batch);
//! - a rollback-class error (disk full) ends the SQLite batch: what follows
//!   is not run in autocommit behind the 503s;
//! - idemgate's PostgreSQL commits are durable even on a server whose
//!   default is `synchronous_commit = off` (a private cluster, killed).

use crate::common;
use crate::core_util;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::pg_cluster::PgCluster;
use common::tmpfs::SqliteOnTmpfs;
use common::*;
use core_util::wait_until;

const PATH: &str = "/hooks/r";

fn deliver_in_thread(
    addr: std::net::SocketAddr,
    id: &str,
) -> std::thread::JoinHandle<std::io::Result<Response>> {
    let id = id.to_string();
    std::thread::spawn(move || kit::deliver(addr, PATH, Some(&id), br#"{"n":1}"#))
}

/// The settle waits for the SQLite write lock that another process holds
/// past the proxy's settle deadline (3 s): the sender is told to retry
/// (503), and the settle is kept (SPEC §16), not counted as an error. When
/// the lock is released the kept settle commits — once: the record turns
/// `delivered`, counted once as delivered and never as an error (before
/// v3 a given-up settle was applied behind the proxy's back while its error
/// stood counted), and the sender's retry is replayed.
#[test]
fn sqlite_a_settle_past_its_deadline_is_kept_and_commits_once() {
    let dir = TempDir::new("edge-settle");
    let db = dir.path().join("edge.db");
    let store = format!("sqlite://{}", db.display());
    let up = Consumer::start().unwrap();
    let px = Proxy::start(&dir, &store, &route("r", PATH, &up.url(), ""));
    let id = eid("late-settle");
    up.hold(&id, 200, Duration::from_millis(800));
    let sender = deliver_in_thread(px.addr, &id);
    assert!(
        wait_until(Duration::from_secs(10), || up.count(&id) == 1),
        "never forwarded"
    );
    // claimed and forwarded; now another process takes the write lock
    let other = rusqlite::Connection::open(&db).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let locked = Instant::now();
    let answer = sender.join().unwrap().expect("an answer");
    let waited = locked.elapsed();
    assert!(waited < Duration::from_secs(5), "answered after {waited:?}");
    // not recorded, so not passed on: the sender was told to retry
    assert_eq!(answer.status, 503, "{:?}", answer.json());
    assert_eq!(px.metric("idemgate_settles_pending"), 1.0, "kept");
    other.execute_batch("ROLLBACK").unwrap();
    assert!(
        wait_until(Duration::from_secs(8), || show(&store, "r", &id)["state"]
            == "delivered"),
        "the kept settle committed: {}",
        show(&store, "r", &id)
    );
    assert!(wait_until(Duration::from_secs(2), || px
        .metric("idemgate_settles_pending")
        == 0.0));
    let delivered = px.metric(r#"idemgate_settles_total{result="delivered",route="r"}"#);
    let errors = px.metric(r#"idemgate_settles_total{result="error",route="r"}"#);
    assert_eq!((delivered, errors), (1.0, 0.0));
    let dup = px.deliver(PATH, Some(&id), br#"{"n":1}"#);
    assert_eq!(dup.status, 200, "{:?}", dup.text());
    assert_eq!(dup.header("Idempotency-Status"), Some("replayed"));
    assert_eq!(up.count(&id), 1);
}

/// psql holding an uncommitted insert of (r, `id`) for `hold`: a claim of
/// that key waits for it, then (rolled back) inserts as new.
fn hold_key(url: &str, id: &str, hold: Duration) -> Child {
    let sql = format!(
        "BEGIN; INSERT INTO records (route, event_id, body_sha256, state, attempts, \
         first_seen_at, updated_at, expires_at) VALUES ('r', '{id}', 'held', 'processing', 1, 0, 0, 0); \
         SELECT pg_sleep({}); ROLLBACK;",
        hold.as_secs_f64()
    );
    Command::new("psql")
        .args([url, "-qAt", "-c", &sql])
        .stdout(Stdio::null())
        .spawn()
        .expect("psql runs")
}

/// Sessions of `url`'s database that are in `pg_sleep` now.
fn sleeping(url: &str) -> usize {
    let out = Command::new("psql")
        .args([
            url,
            "-qAt",
            "-c",
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'",
        ])
        .output()
        .expect("psql runs");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// Two keys held by other transactions: A's claim batch waits ~4 s (past
/// the statement timeout, then its one-by-one fallback), and B's claim,
/// queued behind it, runs next and waits ~2 s more, committing some 6 s
/// after it was sent. On main the requester had given up at 5 s: B's sender
/// got a 503 for a claim that committed, and its retry met its own claim
/// in flight (409) until the lease ran out. Now a claim that a batch took
/// is waited for: B is forwarded, once.
#[test]
fn postgres_a_claim_that_commits_late_is_not_reported_failed() {
    let Some(base) = pg_url() else { return };
    let schema = PgSchema::create(&base, "edge_late");
    let dir = TempDir::new("edge-late");
    let up = Consumer::start().unwrap();
    let px = Proxy::start(&dir, &schema.url(), &route("r", PATH, &up.url(), ""));
    let (a, b) = (eid("held-a"), eid("held-b"));
    let before = sleeping(&schema.url());
    let mut holders = [
        hold_key(&schema.url(), &a, Duration::from_millis(4000)),
        hold_key(&schema.url(), &b, Duration::from_millis(6200)),
    ];
    assert!(
        wait_until(Duration::from_secs(10), || sleeping(&schema.url())
            >= before + 2),
        "the holding transactions never started"
    );
    let t = Instant::now();
    let first = deliver_in_thread(px.addr, &a);
    // A's batch must be the one on the wire when B queues
    std::thread::sleep(Duration::from_millis(500));
    let second = deliver_in_thread(px.addr, &b);
    let (ra, rb) = (first.join().unwrap(), second.join().unwrap());
    let took = t.elapsed();
    for h in &mut holders {
        let _ = h.wait();
    }
    let (ra, rb) = (ra.expect("A answered"), rb.expect("B answered"));
    eprintln!(
        "held claims: A {} B {} after {took:?}",
        ra.status, rb.status
    );
    assert_eq!(ra.status, 200, "A: {:?}", ra.json());
    assert_eq!(
        (rb.status, rb.header("Idempotency-Status")),
        (200, Some("forwarded")),
        "B's claim committed but was reported as: {:?}\n{}",
        rb.json(),
        px.log()
    );
    assert_eq!(up.count(&a), 1);
    assert_eq!(up.count(&b), 1);
    let again = px.deliver(PATH, Some(&b), br#"{"n":1}"#);
    assert_eq!(again.header("Idempotent-Replayed"), Some("true"));
}

/// The SQLite file on a nearly full tmpfs. One batch holds, in this order, a
/// settle whose replayed body (6 MiB) cannot fit — the statement fails with
/// SQLITE_FULL and SQLite rolls the whole transaction back — and 20 small
/// claims that would fit. On main the claims then ran one by one in
/// autocommit and committed, while every sender got a 503: after the disk
/// was freed, their retries met their own orphaned claims (409 in flight).
/// Now the batch ends at the rollback: nothing of it is on disk.
#[test]
fn sqlite_a_rolled_back_batch_runs_nothing_in_autocommit() {
    let Some(full) = SqliteOnTmpfs::mount("edge-full", "24m") else {
        return;
    };
    let up = &full.up;
    let lines = "    replay_body: true\n    replay_body_limit: 8MiB\n";
    let px = full.start(&route("r", PATH, &up.url(), lines));
    assert_eq!(px.deliver(PATH, Some(&eid("warm")), b"{}").status, 200);
    full.disk.fill(1 << 20);

    let big = eid("big");
    up.script(
        &big,
        vec![Reply::status(200)
            .body(&vec![b'x'; 6 << 20])
            .delay(Duration::from_millis(1000))],
    );
    let big_sender = deliver_in_thread(px.addr, &big);
    assert!(
        wait_until(Duration::from_secs(10), || up.count(&big) == 1),
        "the big event was never forwarded\n{}",
        px.log()
    );
    // Hold the writer: a first claim's batch waits for this lock while the
    // big settle and then the small claims queue behind it, in one batch.
    let other = rusqlite::Connection::open(&full.db).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let blocker = eid("blocker");
    let blocker_sender = deliver_in_thread(px.addr, &blocker);
    // the consumer answers the big event after 1 s; its settle queues
    std::thread::sleep(Duration::from_millis(1600));
    let small: Vec<String> = (0..20).map(|i| eid(&format!("small-{i}"))).collect();
    let senders: Vec<_> = small
        .iter()
        .map(|id| deliver_in_thread(px.addr, id))
        .collect();
    std::thread::sleep(Duration::from_millis(600));
    other.execute_batch("ROLLBACK").unwrap();
    drop(other);

    let big_answer = big_sender.join().unwrap().expect("big answered");
    let blocker_answer = blocker_sender.join().unwrap().expect("blocker answered");
    let answers: Vec<u16> = senders
        .into_iter()
        .map(|h| h.join().unwrap().expect("answered").status)
        .collect();
    eprintln!(
        "disk full: blocker {}, small claims {answers:?}, settle errors {}",
        blocker_answer.status,
        px.metric(r#"idemgate_settles_total{result="error",route="r"}"#)
    );
    assert!(answers.iter().all(|&s| s == 503 || s == 200), "{answers:?}");
    let refused: Vec<&String> = small
        .iter()
        .zip(&answers)
        .filter(|(_, &s)| s == 503)
        .map(|(id, _)| id)
        .collect();
    assert!(
        !refused.is_empty(),
        "the small claims never shared the failing batch (test setup)\n{}",
        px.log()
    );
    full.disk.free();
    // Every claim refused with a 503 must not exist: its retry is forwarded.
    for id in &refused {
        assert_eq!(up.count(id), 0, "{id} forwarded without a claim");
        let mut r = px.deliver(PATH, Some(id), br#"{"n":1}"#);
        let deadline = Instant::now() + Duration::from_secs(10);
        while r.status == 503 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            r = px.deliver(PATH, Some(id), br#"{"n":1}"#);
        }
        assert_eq!(
            r.status,
            200,
            "{id}: reported failed, yet its claim committed: {:?}",
            r.json()
        );
        assert_eq!(up.count(id), 1);
    }
    // its settle could not commit: not passed on as a delivery
    assert_eq!(big_answer.status, 503, "{:?}", big_answer.json());
    let check = rusqlite::Connection::open(&full.db).unwrap();
    let ok: String = check
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
}

/// A server whose default is `synchronous_commit = off` acknowledges
/// commits before they are on disk. idemgate's claims must be durable
/// before the forward (SPEC §6) whatever that default: deliveries that
/// were forwarded and settled, then the server dies at once with
/// everything it held in memory (every process SIGKILLed). After the
/// restart each record is there, and a redelivery is replayed, not
/// forwarded a second time. On main the records were gone.
#[test]
fn postgres_commits_are_durable_on_a_server_with_synchronous_commit_off() {
    let Some(pg) = PgCluster::start(
        "edge-sync",
        &[
            "synchronous_commit = off",
            // the WAL writer would flush async commits within 200 ms
            "wal_writer_delay = 10000ms",
            "wal_writer_flush_after = 0",
            "checkpoint_timeout = 1h",
        ],
    ) else {
        return;
    };
    let dir = TempDir::new("edge-sync-proxy");
    let up = Consumer::start().unwrap();
    let mut px = Proxy::start(&dir, &pg.url(), &route("r", PATH, &up.url(), ""));
    // the schema's own commits reach disk (whoever makes them)
    pg.psql("CHECKPOINT");
    let ids: Vec<String> = (0..5).map(|i| eid(&format!("durable-{i}"))).collect();
    for id in &ids {
        let r = px.deliver(PATH, Some(id), br#"{"n":1}"#);
        assert_eq!(r.status, 200, "{id}: {:?}", r.json());
    }
    pg.kill_all();
    std::thread::sleep(Duration::from_millis(500));
    pg.pg_ctl_start();
    let kept = pg.psql(&format!(
        "SELECT count(*) FROM records WHERE state = 'delivered' AND event_id IN ({})",
        ids.iter()
            .map(|i| format!("'{i}'"))
            .collect::<Vec<_>>()
            .join(",")
    ));
    assert_eq!(
        kept.trim(),
        ids.len().to_string(),
        "acknowledged commits lost in the crash\n{}",
        pg.log()
    );
    for id in &ids {
        let mut r = px.deliver(PATH, Some(id), br#"{"n":1}"#);
        let deadline = Instant::now() + Duration::from_secs(10);
        while r.status == 503 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            r = px.deliver(PATH, Some(id), br#"{"n":1}"#);
        }
        assert_eq!(r.header("Idempotent-Replayed"), Some("true"), "{id}");
        assert_eq!(up.count(id), 1, "{id}: a second side effect");
    }
    px.stop(Duration::from_secs(10));
}
