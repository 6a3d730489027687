//! The retry storm (issue 42, `LOAD_STORM=20000`): a consumer with a fixed
//! capacity comes back to a backlog of events whose senders all retry with
//! backoff, as Stripe does (faster, to fit a run). Three times, each time
//! with a fresh idemgate and store: without limits, with
//! `upstream_concurrency` and `upstream_rate` set to the consumer's
//! capacity, and with those and `upstream_wait: 1s`. Reported: requests
//! that reached the consumer, its errors, the time until every event was
//! delivered, and duplicate side effects (0 in both, or idemgate failed).
//!
//! The consumer (in this process, on loopback): at most `CAP_CONCURRENT`
//! requests at once and `CAP_RATE` a second (a token bucket of one second's
//! worth); a request within both works `WORK` and answers 200, applying the
//! event's side effect (counted per event ID); past either it answers 500
//! after `OVERLOAD_DELAY` (an overloaded handler fails slowly). The senders:
//! `SENDERS` threads, each on its own kept connection, taking the event due
//! first; an answer other than 2xx is retried after a backoff that doubles
//! from `BACKOFF_FIRST` up to `BACKOFF_MAX` (±20 % jitter), `Retry-After`
//! when idemgate gives a longer one.

use std::collections::{BinaryHeap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use testkit::serve::{Ports, Serve};
use testkit::Client;

use crate::report::Report;
use crate::settings::Settings;

const CAP_CONCURRENT: usize = 8;
const CAP_RATE: u64 = 200;
const WORK: Duration = Duration::from_millis(5);
const OVERLOAD_DELAY: Duration = Duration::from_millis(200);
const SENDERS: usize = 64;
const BACKOFF_FIRST: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(8);
/// A run that has not delivered everything by then is reported as such.
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// What the consumer saw.
#[derive(Default)]
struct Seen {
    requests: AtomicU64,
    errors: AtomicU64,
    in_work: AtomicUsize,
    /// Side effects per event ID.
    effects: Mutex<HashMap<String, u32>>,
    /// The bucket: (tokens, when last filled).
    bucket: Mutex<(f64, Option<Instant>)>,
    stop: AtomicBool,
}

impl Seen {
    fn token(&self) -> bool {
        let mut b = self.bucket.lock().unwrap();
        let now = Instant::now();
        let burst = CAP_RATE as f64;
        let filled = b.1.map_or(burst, |t| {
            (b.0 + now.duration_since(t).as_secs_f64() * CAP_RATE as f64).min(burst)
        });
        *b = (filled, Some(now));
        if b.0 >= 1.0 {
            b.0 -= 1.0;
            true
        } else {
            false
        }
    }

    /// One request of event `id`: its status.
    fn handle(&self, id: &str) -> u16 {
        self.requests.fetch_add(1, Ordering::Relaxed);
        // the workers: a request past them (or past the rate) is not worked on
        let slot = self.in_work.fetch_add(1, Ordering::AcqRel) < CAP_CONCURRENT;
        if slot && self.token() {
            std::thread::sleep(WORK);
            *self
                .effects
                .lock()
                .unwrap()
                .entry(id.to_owned())
                .or_default() += 1;
            self.in_work.fetch_sub(1, Ordering::AcqRel);
            return 200;
        }
        self.in_work.fetch_sub(1, Ordering::AcqRel);
        std::thread::sleep(OVERLOAD_DELAY);
        self.errors.fetch_add(1, Ordering::Relaxed);
        500
    }
}

/// Serves one kept connection: each request's `Idempotency-Key` is its event.
fn serve_conn(seen: Arc<Seen>, stream: TcpStream) {
    let mut out = stream.try_clone().expect("clone");
    let mut r = BufReader::new(stream);
    loop {
        let (mut key, mut len, mut line) = (String::new(), 0usize, String::new());
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            line.clear();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                match k.to_ascii_lowercase().as_str() {
                    "idempotency-key" => key = v.trim().to_owned(),
                    "content-length" => len = v.trim().parse().unwrap_or(0),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let status = seen.handle(&key);
        let resp = format!("HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\nok");
        if out.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

fn consumer(seen: Arc<Seen>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            if seen.stop.load(Ordering::Relaxed) {
                return;
            }
            let seen = seen.clone();
            std::thread::spawn(move || serve_conn(seen, s));
        }
    });
    addr
}

/// The events still to deliver, earliest due first.
struct Backlog {
    due: Mutex<BinaryHeap<std::cmp::Reverse<(Instant, usize, u32)>>>,
    more: Condvar,
    left: AtomicUsize,
}

/// One sender: takes the event due first, sends it, reschedules it unless
/// it was delivered. Counts idemgate's refusals.
fn sender(backlog: Arc<Backlog>, addr: SocketAddr, tag: String, refused: Arc<AtomicU64>) {
    let mut client = Client::connect(addr).expect("connect");
    let mut rng = tag.len() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    while backlog.left.load(Ordering::Acquire) > 0 {
        let next = {
            let mut due = backlog.due.lock().unwrap();
            loop {
                if backlog.left.load(Ordering::Acquire) == 0 {
                    return;
                }
                match due.peek().map(|r| r.0 .0) {
                    Some(at) if at <= Instant::now() => break due.pop().unwrap().0,
                    Some(at) => {
                        due = backlog
                            .more
                            .wait_timeout(due, at - Instant::now())
                            .unwrap()
                            .0
                    }
                    None => {
                        due = backlog
                            .more
                            .wait_timeout(due, Duration::from_millis(50))
                            .unwrap()
                            .0
                    }
                }
            }
        };
        let (_, event, attempt) = next;
        let id = format!("{tag}-{event}");
        let r = match client.request("POST", "/storm", &[("X-Event-ID", &id)], b"{}") {
            Ok(r) => r,
            Err(_) => {
                client = Client::connect(addr).expect("reconnect");
                testkit::Response {
                    status: 0,
                    headers: Vec::new(),
                    body: Vec::new(),
                }
            }
        };
        if (200..300).contains(&r.status) {
            backlog.left.fetch_sub(1, Ordering::AcqRel);
            backlog.more.notify_all();
            continue;
        }
        if r.status == 503 {
            refused.fetch_add(1, Ordering::Relaxed);
        }
        let backoff = BACKOFF_FIRST
            .saturating_mul(1 << attempt.min(5))
            .min(BACKOFF_MAX);
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let jitter = 0.8 + (rng % 400) as f64 / 1000.0;
        let after = r
            .header("Retry-After")
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_secs)
            .unwrap_or_default()
            .max(backoff.mul_f64(jitter));
        let mut due = backlog.due.lock().unwrap();
        due.push(std::cmp::Reverse((
            Instant::now() + after,
            event,
            attempt + 1,
        )));
        backlog.more.notify_one();
    }
}

/// What stands between the senders and the consumer in one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protection {
    None,
    /// `upstream_concurrency` and `upstream_rate` at the consumer's capacity.
    Limits,
    /// The same, and `upstream_wait: WAIT`.
    LimitsWaiting,
}

/// `upstream_wait` of the third run.
const WAIT: &str = "1s";

impl Protection {
    fn config(self) -> String {
        let limits = format!(
            "    upstream_concurrency: {CAP_CONCURRENT}\n    upstream_rate: \"{CAP_RATE}/s\"\n"
        );
        match self {
            Protection::None => String::new(),
            Protection::Limits => limits,
            Protection::LimitsWaiting => format!("{limits}    upstream_wait: {WAIT}\n"),
        }
    }

    fn label(self) -> String {
        match self {
            Protection::None => "no limits".to_string(),
            Protection::Limits => format!("limits {CAP_CONCURRENT} at once, {CAP_RATE}/s"),
            Protection::LimitsWaiting => format!("the same, waiting up to {WAIT}"),
        }
    }
}

/// A fresh idemgate (its own store) in front of `up`, protecting it as
/// `p` says; ready.
fn start_idemgate(
    s: &Settings,
    dir: &std::path::Path,
    up: SocketAddr,
    p: Protection,
) -> (Serve, Ports) {
    let ports = Ports::free().expect("ports");
    let limits = format!("{p:?}").to_lowercase();
    let store = dir.join(format!("storm-{limits}.db"));
    let extra = p.config();
    let config = format!(
        "{}store:\n  url: \"sqlite://{}\"\nroutes:\n  - name: storm\n    match:\n      path_prefix: /storm\n    \
         upstream: \"http://{up}\"\n    event_id:\n      header: X-Event-ID\n    verify: none\n{extra}",
        ports.config(),
        store.display()
    );
    let path = dir.join(format!("storm-{limits}.yaml"));
    std::fs::write(&path, config).expect("config");
    let log = std::fs::File::create(dir.join(format!("storm-{limits}.log"))).expect("log");
    // dies with the harness, however it dies
    let mut px = Serve::spawn(
        crate::processes::command(&s.bin)
            .args(["serve", "--config"])
            .arg(&path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log),
    )
    .expect("idemgate starts");
    px.wait_ready(ports.admin, Duration::from_secs(30), |st| st == 200)
        .expect("idemgate ready");
    (px, ports)
}

/// One run: a fresh idemgate in front of a fresh consumer.
fn run(s: &Settings, dir: &std::path::Path, events: usize, p: Protection) -> Vec<String> {
    let seen = Arc::new(Seen::default());
    let up = consumer(seen.clone());
    let (mut px, ports) = start_idemgate(s, dir, up, p);
    let now = Instant::now();
    let backlog = Arc::new(Backlog {
        due: Mutex::new(
            (0..events)
                .map(|e| std::cmp::Reverse((now, e, 0)))
                .collect(),
        ),
        more: Condvar::new(),
        left: AtomicUsize::new(events),
    });
    let refused = Arc::new(AtomicU64::new(0));
    let tag = format!("storm{}-{}", p as u8, std::process::id());
    let started = Instant::now();
    let senders: Vec<_> = (0..SENDERS)
        .map(|_| {
            let (b, t, r) = (backlog.clone(), tag.clone(), refused.clone());
            std::thread::spawn(move || sender(b, ports.listen, t, r))
        })
        .collect();
    while backlog.left.load(Ordering::Acquire) > 0 && started.elapsed() < RUN_LIMIT {
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = started.elapsed();
    let left = backlog.left.swap(0, Ordering::AcqRel);
    backlog.more.notify_all();
    for t in senders {
        let _ = t.join();
    }
    px.stop(Duration::from_secs(10));
    seen.stop.store(true, Ordering::Relaxed);
    let effects = seen.effects.lock().unwrap();
    let duplicates = effects.values().filter(|&&n| n > 1).count();
    let (requests, errors) = (
        seen.requests.load(Ordering::Relaxed),
        seen.errors.load(Ordering::Relaxed),
    );
    vec![format!(
        "{:<28} {:>9} {:>9} {:>6.1}% {:>10} {:>9.1} {:>11} {:>6}",
        p.label(),
        requests,
        errors,
        100.0 * errors as f64 / requests.max(1) as f64,
        refused.load(Ordering::Relaxed),
        took.as_secs_f64(),
        duplicates,
        left,
    )]
}

/// The three runs, reported.
pub(crate) fn storm(s: &Settings, dir: &std::path::Path, rep: &mut Report) {
    let events = s.storm;
    rep.line(format!(
        "\nretry storm (issue 42): {events} events, {SENDERS} senders retrying with backoff \
         {BACKOFF_FIRST:?} doubling to {BACKOFF_MAX:?}; the consumer takes {CAP_CONCURRENT} at \
         once and {CAP_RATE}/s, past that 500 after {OVERLOAD_DELAY:?}"
    ));
    rep.line(format!(
        "{:<28} {:>9} {:>9} {:>7} {:>10} {:>9} {:>11} {:>6}",
        "idemgate", "consumer", "errors", "", "503s", "all in s", "dup effects", "left"
    ));
    for p in [
        Protection::None,
        Protection::Limits,
        Protection::LimitsWaiting,
    ] {
        for l in run(s, dir, events, p) {
            rep.line(l);
        }
    }
}
