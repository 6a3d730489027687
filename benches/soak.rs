//! The bounded soak (issue 8): minutes of mixed traffic — unique events,
//! duplicates, mismatched payloads, a failing consumer — against idemgate on
//! SQLite and on PostgreSQL, counting what reached the consumer.
//!
//! ```sh
//! cargo bench --bench soak                    # 5 minutes per store
//! SOAK_SECS=30 cargo bench --bench soak       # a shorter run
//! ```
//!
//! Prints sent / forwarded / replayed / rejected, the duplicates at the
//! consumer (successful deliveries of an event beyond the first: must be 0),
//! and idemgate's resident memory at start, midway and end (must not grow
//! without bound). Loopback only; everything it starts is stopped at the end.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testkit::{memory_kib, Client, Consumer, Ports, Reply, Request, Serve};

const WORKERS: usize = 16;

/// One `idemgate serve` on SQLite or PostgreSQL, and its temp dir.
struct Proxy {
    serve: Serve,
    addr: SocketAddr,
    dir: std::path::PathBuf,
}

impl Proxy {
    fn start(store: &str, upstream: &str, tag: &str) -> Proxy {
        let dir = std::env::temp_dir().join(format!("idemgate-soak-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ports = Ports::free().unwrap();
        let config = format!(
            "{}store:\n  url: \"{store}\"\n\
             routes:\n  - name: soak\n    match:\n      path_prefix: /hooks\n    upstream: \"{upstream}\"\n\
             \x20   event_id:\n      header: X-Event-ID\n    lease: 10s\n    upstream_timeout: 5s\n",
            ports.config()
        );
        let path = dir.join("soak.yaml");
        std::fs::write(&path, config).unwrap();
        let bin = std::env::var("SOAK_BIN")
            .unwrap_or_else(|_| format!("{}/target/release/idemgate", env!("CARGO_MANIFEST_DIR")));
        let mut serve = Serve::spawn(
            Command::new(bin)
                .args(["serve", "--config"])
                .arg(&path)
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit()),
        )
        .expect("idemgate starts (cargo build --release first)");
        serve
            .wait_ready(ports.admin, Duration::from_secs(30), |s| s == 200)
            .unwrap();
        Proxy {
            serve,
            addr: ports.listen,
            dir,
        }
    }

    fn rss_kib(&self) -> u64 {
        self.serve
            .pid()
            .and_then(|pid| memory_kib(pid, "VmRSS:"))
            .unwrap_or(0)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.serve.stop(Duration::from_secs(60));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Default)]
struct Counts {
    sent: AtomicU64,
    forwarded: AtomicU64,
    replayed: AtomicU64,
    rejected: AtomicU64,
    failed_upstream: AtomicU64,
    unexpected: AtomicU64,
}

/// One client's loop until `stop`: a mix of unique events, duplicates,
/// reused IDs with another payload and events the consumer fails first.
#[allow(clippy::too_many_arguments)] // a bench's plain plumbing
fn worker(
    w: usize,
    addr: SocketAddr,
    counts: &Counts,
    stop: &AtomicBool,
    fail_first: &Mutex<HashMap<String, ()>>,
    up_script: &dyn Fn(&str, Vec<Reply>),
    run_id: u32,
    tag: &str,
) {
    let mut client = Client::connect(addr).unwrap();
    let mut recent: Vec<String> = Vec::new();
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let kind = n % 10;
        let (id, body): (String, &[u8]) = match kind {
            // duplicates of a recent event
            0..=2 if !recent.is_empty() => (
                recent[(n as usize * 7) % recent.len()].clone(),
                b"{\"v\":1}",
            ),
            // a reused ID with another payload
            3 if !recent.is_empty() => (
                recent[(n as usize * 3) % recent.len()].clone(),
                b"{\"v\":2}",
            ),
            // the consumer fails the first attempt
            4 => {
                let id = format!("soak-{run_id}-{tag}-{w}-{n}");
                up_script(&id, vec![Reply::status(503), Reply::status(200)]);
                fail_first.lock().unwrap().insert(id.clone(), ());
                (id, b"{\"v\":1}")
            }
            _ => (format!("soak-{run_id}-{tag}-{w}-{n}"), b"{\"v\":1}"),
        };
        let send = |client: &mut Client| {
            counts.sent.fetch_add(1, Ordering::Relaxed);
            client.request("POST", "/hooks/e", &[("X-Event-ID", &id)], body)
        };
        let r = match send(&mut client) {
            Ok(r) => r,
            Err(_) => {
                client = Client::connect(addr).unwrap();
                counts.unexpected.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        match (r.status, r.header("Idempotency-Status")) {
            (200, Some("forwarded")) => {
                counts.forwarded.fetch_add(1, Ordering::Relaxed);
                if recent.len() < 256 {
                    recent.push(id.clone());
                } else {
                    recent[(n as usize) % 256] = id.clone();
                }
            }
            (200, Some("replayed")) => {
                counts.replayed.fetch_add(1, Ordering::Relaxed);
            }
            (409 | 422, _) => {
                counts.rejected.fetch_add(1, Ordering::Relaxed);
            }
            (503, Some("forwarded")) => {
                counts.failed_upstream.fetch_add(1, Ordering::Relaxed);
                // the sender retries: now the consumer accepts it
                if let Ok(r2) = send(&mut client) {
                    if r2.status == 200 {
                        counts.forwarded.fetch_add(1, Ordering::Relaxed);
                        recent.push(id.clone());
                    }
                }
            }
            _ => {
                counts.unexpected.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Successful deliveries of an event beyond the first (an event the
/// consumer failed once has one more), and the events the consumer saw.
fn duplicates(received: &[Request], fail_first: &HashMap<String, ()>) -> (u64, usize) {
    let mut per_event: HashMap<String, u64> = HashMap::new();
    for r in received {
        if let Some(k) = r.key() {
            *per_event.entry(k.to_string()).or_default() += 1;
        }
    }
    let duplicates: u64 = per_event
        .iter()
        .map(|(k, n)| {
            let successes = if fail_first.contains_key(k) {
                n.saturating_sub(1)
            } else {
                *n
            };
            successes.saturating_sub(1)
        })
        .sum();
    (duplicates, per_event.len())
}

fn soak(store: &str, tag: &str, secs: u64) {
    let up = Consumer::start().unwrap();
    let px = Proxy::start(store, &up.url(), tag);
    let counts = Arc::new(Counts::default());
    // events whose first attempt the consumer fails: their second 2xx is not a duplicate
    let fail_first: Arc<Mutex<HashMap<String, ()>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let rss_start = px.rss_kib();
    let started = Instant::now();
    let run_id = std::process::id();
    let tag_owned = tag.to_string();
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (counts, stop, fail_first, addr) =
                (counts.clone(), stop.clone(), fail_first.clone(), px.addr);
            let up_script = up.scripter();
            let tag = tag_owned.clone();
            std::thread::spawn(move || {
                worker(
                    w,
                    addr,
                    &counts,
                    &stop,
                    &fail_first,
                    &up_script,
                    run_id,
                    &tag,
                )
            })
        })
        .collect();
    let mut rss_mid = 0;
    while started.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_secs(1));
        if rss_mid == 0 && started.elapsed() >= Duration::from_secs(secs / 2) {
            rss_mid = px.rss_kib();
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let rss_end = px.rss_kib();
    // successful deliveries of an event beyond the first
    let received = up.received();
    let (duplicates, events) = duplicates(&received, &fail_first.lock().unwrap());
    let c = &counts;
    let secs_run = started.elapsed().as_secs_f64();
    println!(
        "soak {tag}: {secs_run:.0}s, sent {}, forwarded {}, replayed {}, rejected (409/422) {}, upstream failures passed on {}, \
         unexpected {}, consumer saw {} requests for {} events, duplicates at the consumer {duplicates}, \
         RSS start {} KiB, mid {} KiB, end {} KiB ({:.0} req/s)",
        c.sent.load(Ordering::Relaxed),
        c.forwarded.load(Ordering::Relaxed),
        c.replayed.load(Ordering::Relaxed),
        c.rejected.load(Ordering::Relaxed),
        c.failed_upstream.load(Ordering::Relaxed),
        c.unexpected.load(Ordering::Relaxed),
        received.len(),
        events,
        rss_start,
        rss_mid,
        rss_end,
        c.sent.load(Ordering::Relaxed) as f64 / secs_run,
    );
    assert_eq!(duplicates, 0, "an event reached the consumer twice");
}

fn main() {
    // `cargo bench` passes --bench; a bare `cargo test --benches` passes nothing: run short then.
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("idemgate-soak-db-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    soak(
        &format!("sqlite://{}", dir.join("soak.db").display()),
        "sqlite",
        secs,
    );
    let _ = std::fs::remove_dir_all(&dir);
    let pg = std::env::var("IDEMGATE_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    if std::net::TcpStream::connect_timeout(
        &"127.0.0.1:5432".parse().unwrap(),
        Duration::from_secs(2),
    )
    .is_ok()
    {
        soak(&pg, "postgres", secs);
    } else {
        println!("soak postgres: SKIP (no PostgreSQL at 127.0.0.1:5432)");
    }
}
