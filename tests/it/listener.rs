//! The listener on the open internet (SPEC §9), against the real process on
//! loopback with small limits: each timeout, the connection cap reclaiming
//! idle connections while genuine deliveries go on, a stalled log sink, the
//! open-files check, and the connection metrics.

use crate::common;
use crate::core_util::read_response_text;
use crate::raw_upstream;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use raw_upstream::{response, upstream, Behavior};

/// A harness with a guarded route `/h` (event ID in `X-Event-ID`) and a
/// pass-through route `/pass` before `up` (the harness's consumer when
/// `None`), and the `downstream` lines given.
fn start(tag: &str, up: Option<&str>, downstream: &str) -> Harness {
    let h = Harness::sqlite(tag);
    let up = up.map_or_else(|| h.upstream(), str::to_string);
    h.route_to("r", "/h", &up, "")
        .yaml(&format!(
            "  - name: pass\n    match:\n      path_prefix: /pass\n    upstream: \"{up}\"\n    guard_methods: []\n\
             downstream:\n{downstream}"
        ))
        .start()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Reads until the peer closes; how long that took (None: still open after `max`).
fn closed_within(s: &mut TcpStream, max: Duration) -> Option<Duration> {
    let t = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        let left = max.checked_sub(t.elapsed())?;
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match s.read(&mut buf) {
            Ok(0) => return Some(t.elapsed()),
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                if t.elapsed() >= max {
                    return None;
                }
            }
            Err(_) => return Some(t.elapsed()), // reset
        }
    }
}

/// One response on `s`: status and the whole text (head and a
/// Content-Length body).
fn read_response(s: &mut TcpStream) -> (u16, String) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    read_response_text(s)
}

/// A connection that has had one 200 for `GET path` and is kept alive.
fn kept_alive(addr: SocketAddr, path: &str) -> TcpStream {
    let mut s = connect(addr);
    s.write_all(get(path).as_bytes()).unwrap();
    assert_eq!(read_response(&mut s).0, 200);
    s
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n")
}

fn post(id: &str, body: &str) -> String {
    format!(
        "POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Guarded deliveries the consumer saw (the pass route's GETs aside).
fn posts(up: &Consumer) -> usize {
    up.received().iter().filter(|r| r.method == "POST").count()
}

fn closes(px: &Proxy, reason: &str) -> f64 {
    px.metric(&format!(
        "idemgate_connections_closed_total{{reason=\"{reason}\"}}"
    ))
}

#[test]
fn header_timeout_is_a_total_for_the_head_from_the_accept_or_the_first_byte() {
    let h = start("listener-header", None, "  header_timeout: 600ms\n");

    // nothing at all
    let mut silent = connect(h.addr);
    // a head dripped a byte every 50 ms: no single read waits long
    let drip = std::thread::spawn({
        let addr = h.addr;
        move || {
            let mut s = connect(addr);
            let t = Instant::now();
            for b in post("drip", "{}").bytes().cycle() {
                if s.write_all(&[b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
                if t.elapsed() > Duration::from_secs(10) {
                    break;
                }
            }
            t.elapsed()
        }
    });
    let t = silent_close(&mut silent);
    assert!(t > Duration::from_millis(400), "not before its time: {t:?}");
    let dripped = drip.join().unwrap();
    assert!(
        dripped < Duration::from_millis(600 + 1500),
        "a dripped head is cut at the header timeout, not per read: {dripped:?}"
    );

    // kept alive: one request, a pause (the keep-alive's, not the head's),
    // then half a head, the rest never
    let mut kept = connect(h.addr);
    kept.write_all(get("/pass/x").as_bytes()).unwrap();
    assert_eq!(read_response(&mut kept).0, 200);
    std::thread::sleep(Duration::from_millis(900));
    kept.write_all(b"GET /pass/y HTTP/1.1\r\nHo").unwrap();
    let t = closed_within(&mut kept, Duration::from_secs(5)).expect("closed");
    assert!(
        t > Duration::from_millis(400) && t < Duration::from_millis(600 + 1500),
        "the next head's time runs from its first byte: {t:?}"
    );
    assert_eq!(closes(&h, "header_timeout"), 3.0);
    assert_eq!(posts(&h.up), 0, "nothing was forwarded");

    // a head that arrives in time is served
    let mut ok = connect(h.addr);
    ok.write_all(get("/pass/z").as_bytes()).unwrap();
    assert_eq!(read_response(&mut ok).0, 200);
}

fn silent_close(s: &mut TcpStream) -> Duration {
    closed_within(s, Duration::from_secs(5)).expect("a silent connection is closed")
}

#[test]
fn keepalive_timeout_closes_idle_connections_and_restarts_with_each_request() {
    let h = start("listener-keepalive", None, "  keepalive_timeout: 800ms\n");
    let mut busy = connect(h.addr);
    for _ in 0..5 {
        busy.write_all(get("/pass/a").as_bytes()).unwrap();
        assert_eq!(read_response(&mut busy).0, 200);
        std::thread::sleep(Duration::from_millis(400));
    }
    // 2 s of requests 400 ms apart on one connection: still open
    busy.write_all(get("/pass/a").as_bytes()).unwrap();
    assert_eq!(read_response(&mut busy).0, 200);
    let t = closed_within(&mut busy, Duration::from_secs(5)).expect("closed when idle");
    assert!(
        t > Duration::from_millis(600) && t < Duration::from_millis(800 + 1500),
        "{t:?}"
    );
    assert_eq!(closes(&h, "keepalive_timeout"), 1.0);
    assert_eq!(closes(&h, "header_timeout"), 0.0);
}

#[test]
fn body_timeout_answers_408_and_closes_with_nothing_claimed() {
    let h = start("listener-body", None, "  body_timeout: 700ms\n");
    let id = eid("slow-body");
    // half a body, then silence
    let mut half = connect(h.addr);
    half.write_all(
        format!(
            "POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\nContent-Length: 100\r\n\r\n{}",
            "x".repeat(50)
        )
        .as_bytes(),
    )
    .unwrap();
    // a body dripped a byte every 50 ms: no single read waits long
    let id2 = eid("drip-body");
    let drip = std::thread::spawn({
        let (addr, id2) = (h.addr, id2.clone());
        move || {
            let mut s = connect(addr);
            s.write_all(
                format!(
                    "POST /h HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id2}\r\nContent-Length: 1000\r\n\r\n"
                )
                .as_bytes(),
            )
            .unwrap();
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(10) && s.write_all(b"x").is_ok() {
                std::thread::sleep(Duration::from_millis(50));
                s.set_nonblocking(true).unwrap();
                let mut b = [0u8; 1];
                let answered = s.read(&mut b).is_ok();
                s.set_nonblocking(false).unwrap();
                if answered {
                    break;
                }
            }
            t.elapsed()
        }
    });
    let t = Instant::now();
    let (status, text) = read_response(&mut half);
    let took = t.elapsed();
    assert_eq!(status, 408, "{text}");
    assert!(took > Duration::from_millis(500), "{took:?}");
    assert!(text.contains("application/problem+json"), "{text}");
    assert!(text.contains("urn:idemgate:problem:invalid-body"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    assert!(closed_within(&mut half, Duration::from_secs(3)).is_some());
    let dripped = drip.join().unwrap();
    assert!(
        dripped < Duration::from_millis(700 + 1500),
        "a dripped body is cut at the body timeout, not per read: {dripped:?}"
    );
    assert_eq!(h.up.total(), 0, "nothing forwarded");
    let (code, out, err) = cli(&["events", "list", "--store", &h.store, "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "[]", "nothing claimed");
    assert_eq!(closes(&h, "body_timeout"), 2.0);
    assert_eq!(h.requests("r", "invalid_body"), 2.0);
    // the next delivery goes through
    let r = h.deliver("/h", Some(&id), b"{}");
    assert_eq!(r.status, 200);
}

#[test]
fn write_timeout_closes_a_connection_whose_client_does_not_read() {
    let big = vec![b'z'; 48 << 20];
    let body = response(200, &big);
    let up = upstream(move |_, _| Behavior::Respond(body.clone()));
    let h = start(
        "listener-write",
        Some(&up.url()),
        "  write_timeout: 500ms\n",
    );
    let mut s = connect(h.addr);
    s.write_all(get("/pass/big").as_bytes()).unwrap();
    // read nothing: the socket buffers fill and the proxy's writes stall
    let deadline = Instant::now() + Duration::from_secs(15);
    while closes(&h, "write_timeout") < 1.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(closes(&h, "write_timeout"), 1.0);
    // what was in flight arrives, then the end: not the whole body
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        got += n;
    }
    assert!(got < big.len(), "the response was cut: {got}");
    // the proxy serves others meanwhile
    let mut other = connect(h.addr);
    other.write_all(get("/pass/small").as_bytes()).unwrap();
    assert_eq!(read_response(&mut other).0, 200);
}

#[test]
fn the_cap_reclaims_idle_connections_oldest_first_while_deliveries_succeed() {
    let h = start("listener-cap", None, "  max_connections: 40\n");
    // 40 idle kept-alive connections, oldest first
    let mut idle = Vec::new();
    for _ in 0..40 {
        idle.push(kept_alive(h.addr, "/pass/idle"));
        std::thread::sleep(Duration::from_millis(5));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.metric("idemgate_connections{state=\"idle\"}") < 40.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(h.metric("idemgate_connections{state=\"idle\"}"), 40.0);
    // 20 genuine deliveries, each on a new connection that stays open
    let mut ids = Vec::new();
    let mut kept = Vec::new();
    for i in 0..20 {
        let id = eid(&format!("cap{i}"));
        let mut s = connect(h.addr);
        s.write_all(post(&id, "{\"n\":1}").as_bytes()).unwrap();
        let (status, text) = read_response(&mut s);
        assert_eq!(status, 200, "delivery {i}: {text}");
        assert!(text.contains("Idempotency-Status: forwarded"), "{text}");
        ids.push(id);
        kept.push(s);
    }
    assert_eq!(posts(&h.up), 20);
    assert_eq!(closes(&h, "limit"), 20.0);
    // the 20 oldest idle ones were closed, the 20 newest still work
    for (i, s) in idle.iter_mut().enumerate() {
        if i < 20 {
            assert!(
                closed_within(s, Duration::from_secs(2)).is_some(),
                "idle connection {i} (among the oldest) closed"
            );
        } else {
            s.write_all(get("/pass/again").as_bytes()).unwrap();
            assert_eq!(read_response(s).0, 200, "idle connection {i} kept");
        }
    }
    for id in &ids {
        assert_eq!(show(&h.store, "r", id)["state"], "delivered");
    }
}

#[test]
fn past_the_cap_new_connections_close_at_once_and_requests_in_progress_finish() {
    let h = start("listener-cap-full", None, "  max_connections: 4\n");
    // 2 guarded deliveries in progress (the consumer takes 1.5 s) and 2
    // connections waiting for their head: nothing to reclaim
    let slow: Vec<String> = (0..2).map(|i| eid(&format!("slow{i}"))).collect();
    let mut busy = Vec::new();
    for id in &slow {
        h.up.hold(id, 200, Duration::from_millis(1500));
        let mut s = connect(h.addr);
        s.write_all(post(id, "{}").as_bytes()).unwrap();
        busy.push(s);
    }
    let mut waiting: Vec<TcpStream> = (0..2).map(|_| connect(h.addr)).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.metric("idemgate_connections{state=\"active\"}") < 2.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut extra = connect(h.addr);
    let t = closed_within(&mut extra, Duration::from_secs(3)).expect("refused");
    assert!(t < Duration::from_millis(500), "closed at once: {t:?}");
    assert_eq!(closes(&h, "limit"), 1.0);
    for (s, id) in busy.iter_mut().zip(&slow) {
        assert_eq!(
            read_response(s).0,
            200,
            "a request in progress is never cut"
        );
        assert_eq!(show(&h.store, "r", id)["state"], "delivered");
    }
    drop(waiting.drain(..));
}

#[test]
fn a_stalled_log_sink_does_not_stop_deliveries() {
    let dir = TempDir::new("listener-log");
    let up = Consumer::start().unwrap();
    let store = dir.sqlite_url("log.db");
    let (port, admin) = (free_port(), free_port());
    let config = dir.path().join("log.yaml");
    std::fs::write(
        &config,
        config_text(port, admin, &store, &route("r", "/h", &up.url(), "")),
    )
    .unwrap();
    // stderr is a pipe nobody reads (until the end); debug makes many lines
    let mut child = Command::new(bin())
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
    assert!(kit::wait_ready(admin, "/readyz", Duration::from_secs(30)));
    let dropped = || -> f64 {
        let m = String::from_utf8(kit::get(admin, "/metrics").unwrap().body).unwrap();
        m.lines()
            .find_map(|l| l.strip_prefix("idemgate_log_lines_dropped_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let mut client = Client::connect(addr).unwrap();
    let t = Instant::now();
    let mut n = 0;
    while dropped() == 0.0 && t.elapsed() < Duration::from_secs(120) {
        for _ in 0..200 {
            let id = eid("log");
            let r = client
                .request("POST", "/h", &[("X-Event-ID", &id)], b"{}")
                .expect("a delivery while the log is stuck");
            assert_eq!(r.status, 200);
            n += 1;
        }
    }
    assert!(dropped() > 0.0, "lines dropped after {n} deliveries");
    // deliveries go on, promptly
    let t = Instant::now();
    for _ in 0..200 {
        let r = client
            .request("POST", "/h", &[("X-Event-ID", &eid("log"))], b"{}")
            .unwrap();
        assert_eq!(r.status, 200);
    }
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert_eq!(up.total(), n + 200);
    // the sink takes lines again: the drop is reported
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            match err.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => text.extend_from_slice(&buf[..k]),
            }
            if String::from_utf8_lossy(&text).contains("log lines dropped") {
                break;
            }
        }
        String::from_utf8_lossy(&text).to_string()
    });
    // one more line after the reader started, to wake the writer
    let _ = client.request("POST", "/h", &[("X-Event-ID", &eid("log"))], b"{}");
    let _ = kit::get(admin, "/metrics");
    let text = reader.join().unwrap();
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let line = text
        .lines()
        .find(|l| l.contains("log lines dropped"))
        .unwrap_or_else(|| panic!("no drop report in {} bytes", text.len()));
    assert!(line.contains("WARN") && line.contains("dropped="), "{line}");
}

#[test]
fn the_open_files_limit_is_raised_and_max_connections_must_fit() {
    use std::os::unix::process::CommandExt;
    let dir = TempDir::new("listener-fds");
    let up = Consumer::start().unwrap();
    let store = dir.sqlite_url("fds.db");
    let write = |max: u64| {
        let (port, admin) = (free_port(), free_port());
        let path = dir.path().join(format!("fds{max}.yaml"));
        let text = format!(
            "{}downstream:\n  max_connections: {max}\n",
            config_text(port, admin, &store, &route("r", "/h", &up.url(), ""))
        );
        std::fs::write(&path, text).unwrap();
        let admin: SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
        (path, admin)
    };
    // soft 256, hard 4096, as a login shell might leave them
    let limited = |path: &std::path::Path| {
        let mut c = Command::new(bin());
        c.args(["serve", "--config"])
            .arg(path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        unsafe {
            c.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: 256,
                    rlim_max: 4096,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        c
    };
    let (too_many, _) = write(4000);
    let out = limited(&too_many).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let at = format!("{}:", too_many.display());
    let line = err
        .lines()
        .find(|l| l.contains("downstream.max_connections"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.starts_with(&at), "file:line:col first: {line}");
    assert!(line.contains("4096"), "names the hard limit: {line}");

    let (fits, admin) = write(1000);
    let mut child = limited(&fits).stderr(Stdio::null()).spawn().unwrap();
    assert!(
        kit::wait_ready(admin, "/readyz", Duration::from_secs(30)),
        "1000 connections fit in 4096"
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let open_files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>();
    assert_eq!(&open_files[3..5], ["4096", "4096"], "soft raised to hard");
    let m = String::from_utf8(kit::get(admin, "/metrics").unwrap().body).unwrap();
    assert!(m.contains("process_max_fds 4096"), "{m}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn connection_gauges_follow_the_connections() {
    let h = start("listener-gauges", None, "  header_timeout: 5s\n");
    let reading: Vec<TcpStream> = (0..3).map(|_| connect(h.addr)).collect();
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(kept_alive(h.addr, "/pass/g"));
    }
    let want = |state: &str, n: f64| {
        let deadline = Instant::now() + Duration::from_secs(5);
        let series = format!("idemgate_connections{{state=\"{state}\"}}");
        while h.metric(&series) != n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(h.metric(&series), n, "{state}");
    };
    want("reading", 3.0);
    want("idle", 2.0);
    want("active", 0.0);
    drop(reading);
    drop(idle);
    want("reading", 0.0);
    want("idle", 0.0);
    let m = h.metrics();
    for name in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
        "process_cpu_seconds_total",
        "idemgate_build_info{version=",
    ] {
        assert!(m.contains(name), "{name}");
    }
}

/// SPEC §9: a body idemgate reads whole must be complete within
/// body_timeout, else 408. That holds for a verified request of a method
/// outside `guard_methods` too (a verify route checks every method, so it
/// reads the body): 408, the connection closed, nothing forwarded.
#[test]
fn body_timeout_answers_408_on_a_verified_unguarded_method_too() {
    let h = Harness::sqlite("listener-body-verified");
    let up = h.upstream();
    let h = h
        .env("GH_SECRET", "s3cret")
        .yaml(&format!(
            "  - name: gh\n    match:\n      path_prefix: /gh\n    upstream: \"{up}\"\n    provider: github\n\
             \x20   verify:\n      secrets: [env:GH_SECRET]\n\
             downstream:\n  body_timeout: 700ms\n"
        ))
        .start();
    let mut half = connect(h.addr);
    half.write_all(
        format!(
            "PUT /gh HTTP/1.1\r\nHost: localhost\r\nX-GitHub-Delivery: {}\r\nContent-Length: 100\r\n\r\n{}",
            eid("put-slow"),
            "x".repeat(50)
        )
        .as_bytes(),
    )
    .unwrap();
    let t = Instant::now();
    let (status, text) = read_response(&mut half);
    assert_eq!(status, 408, "{text}");
    assert!(
        t.elapsed() > Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    assert!(text.contains("urn:idemgate:problem:invalid-body"), "{text}");
    assert!(closed_within(&mut half, Duration::from_secs(3)).is_some());
    assert_eq!(h.up.total(), 0, "nothing reached the consumer");
}
