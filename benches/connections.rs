//! What a client connection costs idemgate in resident memory (issue 19).
//!
//! ```sh
//! cargo bench --bench connections                  # 2,000 of each kind
//! CONN_N=5000 CONN_BIN=/path/to/idemgate cargo bench --bench connections
//! ```
//!
//! It starts the release binary (or `CONN_BIN`) on loopback with a SQLite
//! store and a pass-through route in front of the sample consumer, warms it
//! up, then opens `CONN_N` connections of each kind in turn and reads
//! idemgate's RSS (`/proc/PID/status`) after each batch has settled:
//! 1. idle kept-alive: one `GET` answered, then nothing;
//! 2. waiting for a head: half a request head sent;
//! 3. silent: connected, nothing sent;
//! 4. a guarded request waiting for its body: head and 10 of 1,024 bytes sent.
//!
//! The figure per connection is the RSS growth of the batch over `CONN_N`.
//! A binary that does not know `downstream` (an older build) gets a config
//! without it.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testkit::{memory_kib, Client, Consumer, Ports, Serve};

fn rss_kib(pid: u32) -> u64 {
    memory_kib(pid, "VmRSS:").expect("the proxy's /proc status")
}

/// RSS once it stops moving (idemgate's allocator returns memory lazily).
fn settled_rss(pid: u32) -> u64 {
    std::thread::sleep(Duration::from_secs(2));
    let mut last = rss_kib(pid);
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(500));
        let now = rss_kib(pid);
        if now.abs_diff(last) < 64 {
            return now;
        }
        last = now;
    }
    last
}

fn raise_nofile() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// One GET on the unguarded route, answered 200 "ok".
fn get_ok(c: &mut Client) {
    let r = c.request("GET", "/pass/x", &[], b"").unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
}

/// idemgate on a SQLite store in `dir`, in front of `up`, ready; its
/// listen address, and whether the binary knows `downstream`.
fn start_proxy(bin: &str, up: &Consumer, dir: &std::path::Path) -> (Serve, SocketAddr, bool) {
    let ports = Ports::free().unwrap();
    let base = format!(
        "{}threads: 2\n\
         store:\n  url: \"sqlite://{}/c.db\"\nroutes:\n  - name: pass\n    match:\n      path_prefix: /pass\n    upstream: \"{}\"\n    guard_methods: []\n\
         \x20 - name: h\n    match:\n      path_prefix: /h\n    upstream: \"{}\"\n    event_id:\n      header: X-Event-ID\n",
        ports.config(),
        dir.display(),
        up.url(),
        up.url()
    );
    let config = dir.join("c.yaml");
    let limits =
        "downstream:\n  header_timeout: 10m\n  keepalive_timeout: 10m\n  max_connections: 12000\n";
    std::fs::write(&config, format!("{base}{limits}")).unwrap();
    let known = Command::new(bin)
        .args(["check", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    if !known {
        std::fs::write(&config, &base).unwrap();
    }
    let mut serve = Serve::spawn(
        Command::new(bin)
            .args(["serve", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .unwrap();
    let addr = ports.listen;
    serve
        .wait_ready(ports.admin, Duration::from_secs(30), |s| s == 200)
        .unwrap();
    (serve, addr, known)
}

/// `n` connections that sent half a request head.
fn waiting_for_heads(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut heads = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"POST /pass/x HTTP/1.1\r\nHost: localhost\r\nContent-Le")
            .unwrap();
        heads.push(s);
    }
    heads
}

/// `n` guarded requests that sent their head and 10 of 1,024 body bytes.
fn waiting_for_bodies(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut bodies = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = TcpStream::connect(addr).unwrap();
        let head = format!(
            "POST /h/x HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: body-{i}\r\nContent-Length: 1024\r\n\r\n0123456789"
        );
        s.write_all(head.as_bytes()).unwrap();
        bodies.push(s);
    }
    bodies
}

fn main() {
    raise_nofile();
    let n: usize = std::env::var("CONN_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let bin = std::env::var("CONN_BIN").unwrap_or_else(|_| {
        let dir = std::env::current_exe().unwrap();
        let target = dir.ancestors().nth(3).unwrap().join("release/idemgate");
        target.display().to_string()
    });
    let up = Consumer::start().unwrap();
    let dir = std::env::temp_dir().join(format!("idemgate-conn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (mut serve, addr, known) = start_proxy(&bin, &up, &dir);
    let pid = serve.pid().unwrap();

    // warm-up: allocator arenas and runtimes as under traffic
    let t = Instant::now();
    for _ in 0..8 {
        let mut c = Client::connect(addr).unwrap();
        for _ in 0..200 {
            get_ok(&mut c);
        }
    }
    println!(
        "binary {bin} ({}), {n} connections per kind, warm-up {:?}",
        if known {
            "with downstream"
        } else {
            "older: no downstream"
        },
        t.elapsed()
    );
    let r0 = settled_rss(pid);
    println!("baseline RSS: {:.1} MiB", r0 as f64 / 1024.0);

    let mut idle = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = Client::connect(addr).unwrap();
        get_ok(&mut c);
        idle.push(c);
    }
    let r1 = settled_rss(pid);
    report("idle kept-alive (one GET answered)", r1, r0, n);

    let heads = waiting_for_heads(addr, n);
    let r2 = settled_rss(pid);
    report("waiting for its head (half a head sent)", r2, r1, n);

    let mut silent = Vec::with_capacity(n);
    for _ in 0..n {
        silent.push(TcpStream::connect(addr).unwrap());
    }
    let r3 = settled_rss(pid);
    report("silent (connected, nothing sent)", r3, r2, n);

    let bodies = waiting_for_bodies(addr, n);
    let r4 = settled_rss(pid);
    report(
        "waiting for its body (guarded, 10 of 1,024 bytes)",
        r4,
        r3,
        n,
    );

    // every idle connection still works
    for s in idle.iter_mut().step_by(97) {
        get_ok(s);
    }
    println!(
        "total: {:.1} MiB for {} connections",
        r4 as f64 / 1024.0,
        4 * n
    );
    drop((idle, heads, silent, bodies));
    serve.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

fn report(what: &str, after: u64, before: u64, n: usize) {
    let per = (after.saturating_sub(before) as f64 * 1024.0) / n as f64;
    println!(
        "{what}: RSS {:.1} → {:.1} MiB, {:.0} bytes ({:.1} KiB) per connection",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        per,
        per / 1024.0
    );
}
