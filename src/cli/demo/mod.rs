//! `idemgate demo`: the first thing a newcomer runs. A sample consumer and
//! the real proxy (this binary's `serve`, SQLite in a temp dir) on loopback
//! ports, a scripted set of deliveries, and a table of what the sender got
//! and what the consumer saw.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod kit;

use super::exit;
use kit::{Consumer, Process, Reply};

/// The proxy process and its temp dir, removed after the process stops.
struct Proxy {
    serve: Option<Process>,
    dir: PathBuf,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        drop(self.serve.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start_proxy(dir: &Path, upstream: &str) -> Result<(Proxy, SocketAddr), String> {
    let (listen, admin) = kit::free_ports().map_err(|e| e.to_string())?;
    let config = format!(
        r#"listen: "{listen}"
admin_listen: "{admin}"
store:
  url: "sqlite://{db}"
routes:
  - name: demo
    match:
      path_prefix: /hooks/demo
    upstream: "{upstream}"
    event_id:
      header: X-Event-ID
    verify: none
    lease: 10s
    upstream_timeout: 5s
"#,
        db = dir.join("idemgate.db").display()
    );
    let path = dir.join("demo.yaml");
    std::fs::write(&path, config).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let serve = Process::spawn(
        Command::new(exe)
            .args(["serve", "--config"])
            .arg(&path)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit()),
    )
    .map_err(|e| format!("cannot start the proxy: {e}"))?;
    let mut proxy = Proxy {
        serve: Some(serve),
        dir: dir.to_path_buf(),
    };
    if let Some(serve) = proxy.serve.as_mut() {
        serve.wait_ready(admin, Duration::from_secs(30))?;
    }
    Ok((proxy, listen))
}

struct Step {
    what: &'static str,
    got: String,
    saw: usize,
    ok: bool,
}

/// One delivery of the script and what it should come to.
struct Delivery {
    what: &'static str,
    id: &'static str,
    body: &'static [u8],
    status: u16,
    /// Whether the answer must be a replay (`None`: not checked).
    replayed: Option<bool>,
    /// Requests of this event the consumer should have seen after it.
    seen: usize,
}

const EVT_1: &[u8] = br#"{"amount":1200}"#;
const EVT_3: &[u8] = br#"{"amount":7}"#;

pub fn demo() -> i32 {
    match run_demo() {
        Ok(true) => exit::OK,
        Ok(false) => exit::FAILURE,
        Err(e) => {
            eprintln!("idemgate demo: {e}");
            exit::FAILURE
        }
    }
}

/// Runs the script against a sample consumer and a proxy of its own;
/// `Ok(false)` when a step did not come to what it should.
// long: the demo's script, each delivery and what it should come to written once, in order
fn run_demo() -> Result<bool, String> {
    let consumer =
        Consumer::start().map_err(|e| format!("cannot start the sample consumer: {e}"))?;
    let dir = std::env::temp_dir().join(format!("idemgate-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let (_proxy, addr) = start_proxy(&dir, &consumer.url())?;
    println!(
        "idemgate demo: consumer on {}, proxy on {addr}, store {}\n",
        consumer.url(),
        dir.join("idemgate.db").display()
    );
    let step = |d: Delivery| deliver(addr, &consumer, d);
    let mut steps = vec![
        step(Delivery {
            what: "first delivery of evt_1",
            id: "evt_1",
            body: EVT_1,
            status: 200,
            replayed: None,
            seen: 1,
        })?,
        step(Delivery {
            what: "duplicate of evt_1",
            id: "evt_1",
            body: EVT_1,
            status: 200,
            replayed: Some(true),
            seen: 1,
        })?,
        concurrent(addr, &consumer),
        step(Delivery {
            what: "evt_1 again with another payload",
            id: "evt_1",
            body: br#"{"amount":9999}"#,
            status: 422,
            replayed: None,
            seen: 1,
        })?,
    ];
    consumer.script(
        "evt_3",
        vec![Reply::status(500).body(b"try later"), Reply::status(200)],
    );
    for (what, status, replayed, seen) in [
        ("evt_3, consumer fails (500)", 500, None, 1),
        ("sender retries evt_3", 200, None, 2),
        ("sender retries evt_3 again", 200, Some(true), 2),
    ] {
        steps.push(step(Delivery {
            what,
            id: "evt_3",
            body: EVT_3,
            status,
            replayed,
            seen,
        })?);
    }
    Ok(report(&steps, consumer.total()))
}

/// Sends one delivery of the script and checks what it came to.
fn deliver(addr: SocketAddr, consumer: &Consumer, d: Delivery) -> Result<Step, String> {
    let r = kit::deliver(addr, "/hooks/demo", d.id, d.body).map_err(|e| e.to_string())?;
    let status = r.header("Idempotency-Status").unwrap_or("-");
    let replayed = r.header("Idempotent-Replayed") == Some("true");
    let saw = consumer.count(d.id);
    Ok(Step {
        what: d.what,
        got: format!("{} ({status})", r.status),
        saw,
        ok: r.status == d.status && d.replayed.is_none_or(|want| want == replayed) && saw == d.seen,
    })
}

/// Five deliveries of one event at once, while the consumer takes its time:
/// one is forwarded, the others meet it in flight.
fn concurrent(addr: SocketAddr, consumer: &Consumer) -> Step {
    consumer.script(
        "evt_2",
        vec![Reply::status(200).delay(Duration::from_millis(1500))],
    );
    let handles: Vec<_> = (0..5)
        .map(|_| {
            std::thread::spawn(move || {
                kit::deliver(addr, "/hooks/demo", "evt_2", br#"{"amount":50}"#)
            })
        })
        .collect();
    let mut statuses: Vec<u16> = handles
        .into_iter()
        .filter_map(|h| h.join().ok()?.ok())
        .map(|r| r.status)
        .collect();
    statuses.sort_unstable();
    let forwarded = statuses.iter().filter(|s| **s == 200).count();
    let conflicts = statuses.iter().filter(|s| **s == 409).count();
    Step {
        what: "5 concurrent deliveries of evt_2",
        got: format!("{forwarded}x 200, {conflicts}x 409 (in flight)"),
        saw: consumer.count("evt_2"),
        ok: forwarded == 1 && conflicts == 4 && consumer.count("evt_2") == 1,
    }
}

/// Prints the table of steps; whether every one behaved as described.
fn report(steps: &[Step], total: usize) -> bool {
    println!(
        "{:<36} {:<32} {:<22}",
        "STEP", "SENDER GOT", "CONSUMER SAW (event)"
    );
    let mut all_ok = true;
    for s in steps {
        all_ok &= s.ok;
        let mark = if s.ok { "ok" } else { "UNEXPECTED" };
        println!(
            "{:<36} {:<32} {:<22} {mark}",
            s.what,
            s.got,
            format!("{} request(s)", s.saw)
        );
    }
    println!(
        "\n{} deliveries sent, {} reached the consumer: every event was processed once (evt_3 twice, because the first attempt failed).",
        steps.len() + 4,
        total
    );
    println!(
        "{}",
        if all_ok {
            "demo: every step behaved as described"
        } else {
            "demo: some steps did NOT behave as described"
        }
    );
    all_ok
}
