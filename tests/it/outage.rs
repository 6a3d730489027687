//! The database goes away mid-run (SPEC §4 "store unreachable", §5
//! `/readyz`): the proxy reaches PostgreSQL through a loopback TCP relay that
//! the test controls. While it is cut, guarded deliveries get 503 with
//! `Retry-After` and nothing is forwarded; once it is restored, service
//! resumes without a restart.

use crate::common;
use crate::core_util;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use core_util::wait_until;

const PATH: &str = "/hooks/r";
/// SPEC: service resumes within this once the database is back.
const RECOVERY: Duration = Duration::from_secs(5);
/// A 503 must come within a few seconds, not after a TCP timeout.
const FAIL_FAST: Duration = Duration::from_secs(7);

/// A loopback TCP relay: accepts on its own port, connects each client to
/// `upstream` and pumps bytes both ways on two threads per connection.
struct Relay {
    addr: SocketAddr,
    shared: Arc<RelayShared>,
    acceptor: Option<JoinHandle<()>>,
}

struct RelayShared {
    upstream: SocketAddr,
    /// `None` while cut: connections are refused, as by a stopped server.
    listener: Mutex<Option<TcpListener>>,
    /// Both sockets of every relayed connection, to close them on `cut`.
    open: Mutex<Vec<TcpStream>>,
    /// The bytes of connections numbered below this are held (not read on,
    /// not lost): `u64::MAX` while stalled, a silent network; the count at
    /// `stall_open`, a server slow on the statements it has and quick to
    /// answer anew; 0 otherwise.
    held_below: AtomicU64,
    /// The number the next relayed connection gets.
    next_conn: AtomicU64,
    stop: AtomicBool,
}

impl Relay {
    fn start(upstream: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(RelayShared {
            upstream,
            listener: Mutex::new(Some(listener)),
            open: Mutex::new(Vec::new()),
            held_below: AtomicU64::new(0),
            next_conn: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let sh = shared.clone();
        let acceptor = std::thread::spawn(move || accept_loop(sh));
        Relay {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// Closes every relayed connection and refuses new ones.
    fn cut(&self) {
        drop(self.shared.listener.lock().unwrap().take());
        self.close_all();
    }

    /// Holds every byte in both directions, on old and new connections.
    fn stall(&self) {
        self.shared.held_below.store(u64::MAX, Ordering::SeqCst);
    }

    /// Holds every byte on the connections open now; new ones flow.
    fn stall_open(&self) {
        let next = self.shared.next_conn.load(Ordering::SeqCst);
        self.shared.held_below.store(next, Ordering::SeqCst);
    }

    /// Accepts again (on the same port) and lets held bytes through.
    fn restore(&self) {
        let mut l = self.shared.listener.lock().unwrap();
        if l.is_none() {
            let listener = TcpListener::bind(self.addr)
                .unwrap_or_else(|e| panic!("relay cannot listen on {} again: {e}", self.addr));
            listener.set_nonblocking(true).unwrap();
            *l = Some(listener);
        }
        self.shared.held_below.store(0, Ordering::SeqCst);
    }

    fn close_all(&self) {
        for s in self.shared.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.held_below.store(0, Ordering::SeqCst);
        self.cut();
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(sh: Arc<RelayShared>) {
    while !sh.stop.load(Ordering::SeqCst) {
        let accepted = match sh.listener.lock().unwrap().as_ref() {
            Some(l) => l.accept().ok(),
            None => None,
        };
        let Some((client, _)) = accepted else {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        };
        let Ok(server) = TcpStream::connect_timeout(&sh.upstream, Duration::from_secs(2)) else {
            continue; // dropping `client` closes it
        };
        let number = sh.next_conn.fetch_add(1, Ordering::SeqCst);
        client.set_nonblocking(false).unwrap();
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        {
            let mut open = sh.open.lock().unwrap();
            open.push(client.try_clone().unwrap());
            open.push(server.try_clone().unwrap());
        }
        for (from, to) in [
            (client.try_clone().unwrap(), server.try_clone().unwrap()),
            (server, client),
        ] {
            let sh = sh.clone();
            // Detached: each ends when its socket is closed (cut, or either
            // side hanging up).
            std::thread::spawn(move || pump(from, to, &sh, number));
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, sh: &RelayShared, number: u64) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while number < sh.held_below.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// `postgres://user@host:port/db…` → (the address, the URL with `addr` in its place).
fn through(url: &str, addr: SocketAddr) -> (SocketAddr, String) {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), authority),
    };
    let hostport = if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:5432")
    };
    let upstream = hostport
        .to_socket_addrs()
        .expect("PostgreSQL address resolves")
        .next()
        .expect("an address");
    (upstream, format!("{scheme}://{userinfo}{addr}{tail}"))
}

/// The proxy, its consumer and the relay between it and PostgreSQL.
struct Setup {
    // Field order is drop order: the proxy stops before the relay goes.
    px: Proxy,
    up: Consumer,
    relay: Relay,
    _schema: PgSchema,
    _dir: TempDir,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.px.stop(Duration::from_secs(10));
    }
}

fn setup(tag: &str) -> Option<Setup> {
    let base = pg_url()?;
    let dir = TempDir::new(tag);
    let (upstream, _) = through(&base, "127.0.0.1:1".parse().unwrap());
    let relay = Relay::start(upstream);
    let (_, relayed) = through(&base, relay.addr);
    let schema = PgSchema::create(&base, tag);
    let url = schema.url_via(&relayed);
    let up = Consumer::start().unwrap();
    let px = Proxy::start(&dir, &url, &route("r", PATH, &up.url(), ""));
    Some(Setup {
        px,
        up,
        relay,
        _schema: schema,
        _dir: dir,
    })
}

/// [`setup`], then a first delivery: it opens the connections, so that a
/// stall catches them open.
fn setup_warm(tag: &str) -> Option<Setup> {
    let s = setup(tag)?;
    let warm = s.px.deliver(PATH, Some(&eid("warm")), br#"{"n":1}"#);
    assert_eq!(warm.status, 200, "{:?}", warm.json());
    Some(s)
}

/// [`setup_warm`], then its open connections stalled (`stall_open`), and
/// the ID of an event not yet sent.
fn setup_stalled_open(tag: &str) -> Option<(Setup, String)> {
    let s = setup_warm(tag)?;
    s.relay.stall_open();
    Some((s, eid(tag)))
}

fn readyz(px: &Proxy) -> u16 {
    kit::get(px.admin, "/readyz").map(|r| r.status).unwrap_or(0)
}

/// Asserts a fail-closed answer and returns how long it took.
fn expect_503(px: &Proxy, id: &str) -> Duration {
    let t = Instant::now();
    let r = px.deliver(PATH, Some(id), br#"{"n":1}"#);
    let took = t.elapsed();
    assert_eq!(r.status, 503, "{id}: {:?}\n{}", r.json(), px.log());
    assert_eq!(r.header("Retry-After"), Some("1"));
    assert_eq!(r.header("Idempotency-Status"), Some("store_unavailable"));
    assert_eq!(r.json()["type"], "urn:idemgate:problem:store-unavailable");
    assert_eq!(r.json()["event_id"], id);
    assert!(took < FAIL_FAST, "{id}: the 503 took {took:?}");
    took
}

/// Delivers `id` until it is forwarded; every answer before is a 503.
/// Returns how long that took.
fn until_forwarded(px: &Proxy, id: &str) -> Duration {
    let t = Instant::now();
    loop {
        let r = px.deliver(PATH, Some(id), br#"{"n":1}"#);
        if r.status == 200 {
            assert_eq!(r.header("Idempotency-Status"), Some("forwarded"));
            return t.elapsed();
        }
        assert_eq!(r.status, 503, "{id} while recovering: {:?}", r.json());
        assert!(
            t.elapsed() < RECOVERY,
            "service did not resume within {RECOVERY:?}\n{}",
            px.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn database_cut_fails_closed_then_recovers_without_restart() {
    let Some(s) = setup("outage") else { return };
    let (px, up) = (&s.px, &s.up);
    let old = eid("old");
    let first = px.deliver(PATH, Some(&old), br#"{"n":1}"#);
    assert_eq!(first.status, 200);
    assert_eq!(readyz(px), 200);

    s.relay.cut();
    // The pooled connections are gone: the first request finds out at once,
    // later ones wait out the refused reconnects (the acquire timeout).
    let during = eid("during");
    let first_503 = expect_503(px, &during);
    let steady_503 = expect_503(px, &during);
    expect_503(px, &old);
    let t = Instant::now();
    assert_eq!(readyz(px), 503);
    let readyz_503 = t.elapsed();
    assert_eq!(up.total(), 1, "nothing forwarded during the outage");

    s.relay.restore();
    let recovered = until_forwarded(px, &during);
    eprintln!(
        "cut: first 503 in {first_503:?}, steady 503 in {steady_503:?}, /readyz 503 in {readyz_503:?}; \
         restored: forwarding again after {recovered:?}"
    );
    assert_eq!(readyz(px), 200);
    assert_eq!(up.count(&during), 1);
    let replay = px.deliver(PATH, Some(&old), br#"{"n":1}"#);
    assert_eq!(
        (replay.status, replay.header("Idempotent-Replayed")),
        (200, Some("true"))
    );
    let fresh = eid("fresh");
    assert_eq!(px.deliver(PATH, Some(&fresh), br#"{"n":1}"#).status, 200);
    assert_eq!(up.count(&old), 1);
    assert_eq!(up.count(&fresh), 1);
    assert_eq!(up.total(), 3);
    assert!(px.requests("r", "store_unavailable") >= 3.0);
}

/// A database that stops answering without closing anything (a network
/// partition): requests still fail within the client-side bound, and when the
/// held bytes flow again, so does the service.
#[test]
fn silent_database_fails_closed_then_recovers() {
    let Some(s) = setup("stall") else { return };
    let (px, up) = (&s.px, &s.up);
    let old = eid("old");
    assert_eq!(px.deliver(PATH, Some(&old), br#"{"n":1}"#).status, 200);

    s.relay.stall();
    let during = eid("during");
    // Several at once, so that more than one pooled connection goes silent.
    let took: Vec<Duration> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let id = format!("{during}-{i}");
                sc.spawn(move || expect_503(px, &id))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let t = Instant::now();
    assert_eq!(readyz(px), 503);
    let readyz_503 = t.elapsed();
    assert_eq!(
        up.total(),
        1,
        "nothing forwarded while the database is silent"
    );

    s.relay.restore();
    let recovered = until_forwarded(px, &during);
    eprintln!(
        "stall: 503s in {took:?}, /readyz 503 in {readyz_503:?}; restored: forwarding again after {recovered:?}"
    );
    let replay = px.deliver(PATH, Some(&old), br#"{"n":1}"#);
    assert_eq!(replay.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(up.count(&during), 1);
    // Claims that timed out on our side may still have committed: those
    // events are in flight until their lease ends, never forwarded twice.
    for i in 0..4 {
        let id = format!("{during}-{i}");
        let r = px.deliver(PATH, Some(&id), br#"{"n":1}"#);
        assert!(
            matches!(r.status, 200 | 409),
            "{id} after recovery: {}",
            r.status
        );
        assert!(up.count(&id) <= 1);
    }
}

/// A database that is slow, not gone (a commit waiting for a busy disk):
/// the statements on its open connections get no answer for longer than a
/// silent one is given, while new connections are answered at once. The
/// claim on the wire is waited for and the event forwarded, once; given up
/// instead, its outcome would be unknown, and a claim that did commit would
/// hold the event in flight (409s) until its lease ends.
#[test]
fn a_slow_database_that_still_answers_is_waited_for() {
    let Some((s, slow)) = setup_stalled_open("slow") else {
        return;
    };
    let (px, up) = (&s.px, &s.up);
    // past the 5 s after which a silent database's 503 comes (FAIL_FAST)
    let held = Duration::from_secs(8);
    let (answer, took) = std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            let t = Instant::now();
            let r = px.deliver(PATH, Some(&slow), br#"{"n":1}"#);
            (r, t.elapsed())
        });
        std::thread::sleep(held);
        s.relay.restore();
        h.join().unwrap()
    });
    eprintln!(
        "slow database held for {held:?}: answered {} after {took:?}",
        answer.status
    );
    assert_eq!(answer.status, 200, "{:?}\n{}", answer.json(), px.log());
    assert!(
        took >= held - Duration::from_millis(500),
        "not held: {took:?}"
    );
    assert_eq!(up.count(&slow), 1);
    let replay = px.deliver(PATH, Some(&slow), br#"{"n":1}"#);
    assert_eq!(replay.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(up.count(&slow), 1);
    assert_eq!(px.requests("r", "store_unavailable"), 0.0);
}

/// A database that answers new connections but never the statement it was
/// given (a hung disk under a live server): the wait is bounded all the
/// same, at 30 s (`silence::LIMIT`), and the sender gets its 503.
#[test]
fn a_statement_held_while_the_server_answers_is_given_up_at_the_limit() {
    let Some((s, hung)) = setup_stalled_open("hung") else {
        return;
    };
    let (px, up) = (&s.px, &s.up);
    let t = Instant::now();
    let r = px.deliver(PATH, Some(&hung), br#"{"n":1}"#);
    let took = t.elapsed();
    eprintln!(
        "statement held while the server answers: {} after {took:?}",
        r.status
    );
    assert_eq!(r.status, 503, "{:?}", r.json());
    assert_eq!(r.header("Idempotency-Status"), Some("store_unavailable"));
    assert!(
        (Duration::from_secs(29)..Duration::from_secs(40)).contains(&took),
        "given up after {took:?}"
    );
    assert!(
        px.log()
            .contains("answered new connections but not a batch within 30s"),
        "{}",
        px.log()
    );
    s.relay.restore();
    // the claim may have committed: forwarded at most once, ever
    let after = px.deliver(PATH, Some(&hung), br#"{"n":1}"#);
    assert!(matches!(after.status, 200 | 409), "{}", after.status);
    assert_eq!(up.count(&hung), usize::from(after.status == 200));
}

/// The upstream answered, then the settle cannot reach the database: it is
/// retried with bounded backoff for 3 s. The settle commits before the
/// answer is passed on (SPEC §3), and this one did not: the sender gets a
/// 503 to retry (a 2xx would be a delivery the store never learns of). The
/// settle is then kept and retried in the background (SPEC §16,
/// `idemgate_settles_pending`), logged with the event ID; once the database
/// is back it commits, and the sender's retry is replayed — never forwarded
/// a second time.
/// Delivers `id` and cuts the database while the consumer works on it: the
/// settle cannot commit, the sender gets a 503, and the settle is kept
/// (`idemgate_settles_pending` 1).
fn deliver_with_the_settle_cut(s: &Setup, id: &str) {
    let (px, up) = (&s.px, &s.up);
    up.hold(id, 200, Duration::from_millis(800));
    let t = Instant::now();
    let answer = std::thread::scope(|sc| {
        let h = sc.spawn(|| px.deliver(PATH, Some(id), br#"{"n":1}"#));
        let deadline = Instant::now() + Duration::from_secs(10);
        while up.count(id) == 0 {
            assert!(Instant::now() < deadline, "never reached the consumer");
            std::thread::sleep(Duration::from_millis(2));
        }
        // Claimed and forwarded; the consumer is still thinking.
        s.relay.cut();
        h.join().unwrap()
    });
    let took = t.elapsed();
    eprintln!("settle with the database cut: the sender waited {took:?}");
    assert_eq!(answer.status, 503, "{:?}", answer.json());
    assert_eq!(
        answer.header("Idempotency-Status"),
        Some("store_unavailable")
    );
    assert_eq!(answer.header("Retry-After"), Some("1"));
    assert!(took < Duration::from_secs(15), "unbounded settle: {took:?}");
    assert_eq!(px.metric("idemgate_settles_pending"), 1.0, "kept");
}

#[test]
fn settle_failing_after_the_upstream_answered_is_carried_until_it_commits() {
    let Some(s) = setup("settle") else { return };
    let (px, up) = (&s.px, &s.up);
    let id = eid("slow");
    deliver_with_the_settle_cut(&s, &id);
    assert_eq!(
        px.metric(r#"idemgate_settles_total{result="error",route="r"}"#),
        0.0,
        "not given up while the lease lasts"
    );
    // Log lines are written by a background thread: give it a moment.
    let names_the_event = |log: &str| {
        log.lines()
            .any(|l| l.contains("settle failed; kept") && l.contains(&id) && l.contains("WARN"))
    };
    wait_until(Duration::from_secs(2), || names_the_event(&px.log()));
    let log = px.log();
    assert!(
        names_the_event(&log),
        "no line naming the kept settle's event:\n{log}"
    );

    s.relay.restore();
    // the sender retries: 409 (the live claim) or 503 until the kept
    // settle commits, then the replay
    let deadline = Instant::now() + RECOVERY + Duration::from_secs(5);
    let mut r = px.deliver(PATH, Some(&id), br#"{"n":1}"#);
    while r.status != 200 && Instant::now() < deadline {
        assert!(matches!(r.status, 409 | 503), "{} {:?}", r.status, r.text());
        std::thread::sleep(Duration::from_millis(100));
        r = px.deliver(PATH, Some(&id), br#"{"n":1}"#);
    }
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("Idempotency-Status"), Some("replayed"));
    assert_eq!(up.count(&id), 1, "forwarded once");
    assert_eq!(px.metric("idemgate_settles_pending"), 0.0);
    assert_eq!(
        px.metric(r#"idemgate_settles_total{result="error",route="r"}"#),
        0.0
    );
}

/// A graceful stop while a settle is carried (a deploy during a database
/// outage) waits for it, within `shutdown_grace`: the database comes back
/// a second after the SIGTERM, the settle commits, and only then does the
/// process exit. Started again, it replays the event. (Before, the stop
/// ended at once, and the claim held its event until the lease ended:
/// then a second delivery, or an event held for an operator.)
#[test]
fn a_graceful_stop_waits_for_a_carried_settle() {
    let Some(mut s) = setup("stopcarry") else {
        return;
    };
    let id = eid("carried");
    deliver_with_the_settle_cut(&s, &id);
    let stopped = Instant::now();
    let code = std::thread::scope(|sc| {
        let px = &mut s.px;
        let stop = sc.spawn(move || px.stop(Duration::from_secs(20)));
        std::thread::sleep(Duration::from_secs(1));
        assert!(!stop.is_finished(), "exited with a settle still carried");
        s.relay.restore();
        stop.join().unwrap()
    });
    let took = stopped.elapsed();
    eprintln!("stop with a carried settle took {took:?}");
    assert_eq!(code, Some(0), "{}", s.px.log());
    assert!(took < Duration::from_secs(8), "{took:?}");
    let log = s.px.log();
    assert!(
        log.lines()
            .any(|l| l.contains("pending settle committed") && l.contains(&id)),
        "{log}"
    );
    s.px.spawn();
    let again = s.px.deliver(PATH, Some(&id), br#"{"n":1}"#);
    assert_eq!(again.status, 200, "{:?}", again.json());
    assert_eq!(again.header("Idempotency-Status"), Some("replayed"));
    assert_eq!(s.up.count(&id), 1, "forwarded once");
}

/// The server ends every connection while staying up (a restart between
/// two deliveries, an idle-session timeout, a pooler's recycling): the
/// connections the proxy keeps between batches are replaced by the next
/// batch, not kept failing. At most the first delivery of each kind of
/// batch finds its connection dead.
#[test]
fn connections_ended_by_the_server_are_replaced() {
    let Some(s) = setup("ended") else { return };
    let (px, up) = (&s.px, &s.up);
    for round in 0..3 {
        let id = eid(&format!("before-{round}"));
        assert_eq!(px.deliver(PATH, Some(&id), br#"{"n":1}"#).status, 200);
        s.relay.close_all();
        let after = eid(&format!("after-{round}"));
        let t = Instant::now();
        let mut unavailable = 0;
        loop {
            let r = px.deliver(PATH, Some(&after), br#"{"n":1}"#);
            if r.status == 200 {
                break;
            }
            assert_eq!(r.status, 503, "{after}: {:?}", r.json());
            unavailable += 1;
            assert!(
                unavailable <= 2 && t.elapsed() < RECOVERY,
                "round {round}: {unavailable} 503s in {:?}\n{}",
                t.elapsed(),
                px.log()
            );
        }
        assert_eq!(up.count(&after), 1);
        let replay = px.deliver(PATH, Some(&after), br#"{"n":1}"#);
        assert_eq!(
            replay.header("Idempotent-Replayed"),
            Some("true"),
            "round {round}"
        );
    }
}

/// Claims queued behind a batch stuck on a silent database, whose senders
/// got their 503 meanwhile, are not made once the database answers again:
/// the sender's retry is forwarded at once instead of finding its own
/// orphaned claim in flight (409) until the lease ends. The claim that was
/// already on the wire may have committed: that one is in flight.
#[test]
fn claims_whose_senders_gave_up_are_not_made_late() {
    let Some(s) = setup_warm("abandon") else {
        return;
    };
    let (px, up) = (&s.px, &s.up);
    s.relay.stall();
    let stuck = eid("stuck");
    let queued: Vec<String> = (0..3).map(|i| eid(&format!("queued-{i}"))).collect();
    std::thread::scope(|sc| {
        let first = sc.spawn(|| expect_503(px, &stuck));
        // the first claim's batch is on the wire; these queue behind it
        std::thread::sleep(Duration::from_millis(300));
        let rest: Vec<_> = queued
            .iter()
            .map(|id| sc.spawn(move || expect_503(px, id)))
            .collect();
        first.join().unwrap();
        for h in rest {
            h.join().unwrap();
        }
    });
    s.relay.restore();
    for id in &queued {
        let r = px.deliver(PATH, Some(id), br#"{"n":1}"#);
        assert_eq!(r.status, 200, "{id}: {:?}\n{}", r.json(), px.log());
        assert_eq!(up.count(id), 1);
    }
    let r = px.deliver(PATH, Some(&stuck), br#"{"n":1}"#);
    assert!(matches!(r.status, 200 | 409), "{stuck}: {}", r.status);
    assert!(up.count(&stuck) <= 1);
}

/// SPEC §7, §20: a 10 s outage under load is summarised, not written a
/// line per refusal or per probe. 16 senders deliver new events back to
/// back (the shape of the load harness's (b)) and a prober asks `/readyz`
/// twice a second while the database is cut for 10 s: the
/// process writes at most 20 WARN or ERROR lines from the start of the load
/// to the end of the recovery, and the refusals agree three ways: what the
/// senders got, `idemgate_requests_total{outcome="store_unavailable"}`, and
/// the sum of the summary lines' counts.
#[test]
fn a_10s_outage_under_load_is_summarised_and_the_counts_agree() {
    const SENDERS: usize = 16;
    const OUTAGE: Duration = Duration::from_secs(10);
    let Some(s) = setup_warm("outage_log") else {
        return;
    };
    let px = &s.px;
    let log_before = px.log().len();
    let unavailable_before = px.requests("r", "store_unavailable");
    let stop = AtomicBool::new(false);
    let (refused, forwarded) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|sc| {
        for sender in 0..SENDERS {
            let (stop, refused, forwarded) = (&stop, &refused, &forwarded);
            sc.spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let id = eid(&format!("load-{sender}-{n}"));
                    let r = px.deliver(PATH, Some(&id), br#"{"n":1}"#);
                    match r.status {
                        200 => forwarded.fetch_add(1, Ordering::Relaxed),
                        503 => refused.fetch_add(1, Ordering::Relaxed),
                        other => panic!("{id}: {other} {:?}", r.json()),
                    };
                }
            });
        }
        // and a prober on /readyz twice a second, as a strict kubelet would
        let stop = &stop;
        sc.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = kit::get(px.admin, "/readyz");
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        std::thread::sleep(Duration::from_secs(1));
        s.relay.cut();
        std::thread::sleep(OUTAGE);
        s.relay.restore();
        let back = forwarded.load(Ordering::Relaxed);
        let resumed = wait_until(RECOVERY, || {
            forwarded.load(Ordering::Relaxed) >= back + SENDERS as u64
        });
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
        assert!(resumed, "forwarding resumed within {RECOVERY:?}");
    });
    // the last summary is written within a second of the last refusal
    std::thread::sleep(Duration::from_millis(1500));
    let log = px.log();
    let window = &log[log_before..];
    let loud: Vec<&str> = window
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .collect();
    let summarised: u64 = loud
        .iter()
        .filter(|l| l.contains("since the last summary"))
        .filter_map(|l| {
            let counts = l.split("store_unavailable=").nth(1)?;
            counts
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    let refused = refused.load(Ordering::Relaxed);
    let counted = px.requests("r", "store_unavailable") - unavailable_before;
    eprintln!(
        "a {OUTAGE:?} outage, {SENDERS} senders: {refused} refused, {} forwarded; \
         {} WARN/ERROR lines; summaries count {summarised}, the metric {counted}",
        forwarded.load(Ordering::Relaxed),
        loud.len()
    );
    assert!(
        loud.len() <= 20,
        "{} lines about the outage:\n{}",
        loud.len(),
        loud.join("\n")
    );
    assert!(refused >= SENDERS as u64, "the outage refused deliveries");
    assert_eq!(counted, refused as f64, "the metric counts every refusal");
    assert_eq!(summarised, refused, "the summaries count every refusal");
}
