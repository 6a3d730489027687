//! The harness's side of the "under attack" scenario (`LOAD_ATTACK`): (b)
//! without and with the attack connections held, in one run.

use std::time::{Duration, Instant};

use crate::attack;
use crate::report::Report;
use crate::runs::{id_prefix, measure, quiesce};
use crate::scenarios::scenario;
use crate::servers::ATTACK_TIMEOUTS;
use crate::settings::Settings;
use crate::world::World;

/// Resident memory (KiB) and open descriptors of `pid`, sampled until `stop`.
fn sample_peaks(
    pid: u32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(u64, usize)> {
    std::thread::spawn(move || {
        let (mut rss, mut fds) = (0u64, 0usize);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                if let Some(v) = st
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                {
                    rss = rss.max(v);
                }
            }
            if let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
                fds = fds.max(d.count());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        (rss, fds)
    })
}

/// Records of the SQLite store: (processing anywhere, delivered with `prefix`).
fn store_counts(w: &World, prefix: &str) -> (i64, i64) {
    let db = rusqlite::Connection::open_with_flags(
        w.dir.join("claims.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("the store opens");
    let processing: i64 = db
        .query_row(
            "SELECT count(*) FROM records WHERE state = 'processing'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let delivered: i64 = db
        .query_row(
            "SELECT count(*) FROM records WHERE state = 'delivered' AND event_id LIKE ?1",
            [format!("{prefix}-%")],
            |r| r.get(0),
        )
        .unwrap();
    (processing, delivered)
}

/// (b) without and with the attack, in one run; see `LOAD_ATTACK`.
pub(crate) fn under_attack(
    s: &Settings,
    w: &World,
    rep: &mut Report,
    serial: &mut usize,
    conns: usize,
) {
    let sc = scenario('b');
    let mut results = Vec::new();
    rep.line("");
    rep.line(format!(
        "under attack: (b) at {conns} connections, {} s runs",
        s.duration
    ));
    for with_attack in [false, true] {
        *serial += 1;
        let prefix = id_prefix(sc.key, *serial % 100);
        let mut held = None;
        if with_attack {
            held = Some(start_attack(s, w, rep));
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let peaks = sample_peaks(w.sqlite.pid, stop.clone());
        let r = measure(s, w, sc, conns, 0, *serial, false, false);
        let open_at_end = held.as_ref().map(|a| a.open());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (rss, fds) = peaks.join().unwrap();
        let report = held.map(|a| a.stop());
        quiesce(w);
        let (processing, delivered) = store_counts(w, &prefix);
        let p99 = r.wrk.p99_us / 1000.0;
        rep.line(format!(
            "  {:14} {:8.0} delivered/s  p99 {:6.2} ms  peak RSS {:6.1} MiB  open fds (peak) {:6}{}",
            if with_attack { "with attack" } else { "without attack" },
            r.rps,
            p99,
            rss as f64 / 1024.0,
            fds,
            open_at_end.map(|n| format!("  attack connections open at the end {n}")).unwrap_or_default(),
        ));
        let answered = r.wrk.requests as i64;
        rep.line(format!(
            "    store: {processing} records processing; {delivered} delivered for {answered} answered by wrk ({})",
            if processing == 0 && delivered >= answered && delivered <= answered + conns as i64 {
                "nothing lost"
            } else {
                "MISMATCH"
            }
        ));
        for p in &r.problems {
            // the attack's own requests (its GETs on /pass, its 408s) move
            // the counters the mix check reads
            let attack_traffic = p.starts_with("route pass moved")
                || p == "unexpected outcome invalid_body"
                || p.starts_with("idemgate counted");
            if !(with_attack && attack_traffic) {
                rep.line(format!("    problem: {p}"));
            }
        }
        if let Some((lines, ok)) = report {
            for l in lines {
                rep.line(format!("  {l}"));
            }
            rep.line(format!(
                "  every attack connection closed within its timeout + 1 s: {}",
                if ok { "yes" } else { "NO" }
            ));
        }
        results.push((r.rps, p99, rss));
    }
    if let [(rps0, p0, _), (rps1, p1, rss1)] = results[..] {
        rep.line(format!(
            "  under attack: {:.2} x the delivered/s (target >= 0.8), p99 {:.2} x (target <= 2), peak RSS {:.1} MiB (target <= 256)",
            rps1 / rps0.max(1.0),
            p1 / p0.max(0.001),
            rss1 as f64 / 1024.0
        ));
    }
}

/// Opens the attack connections, waiting at most 30 s until all are open.
fn start_attack(s: &Settings, w: &World, rep: &mut Report) -> attack::Attack {
    let (h, b, k) = ATTACK_TIMEOUTS;
    let a = attack::Attack::start(attack::Settings {
        addr: w.sqlite.addr,
        connections: s.attack,
        keepalive: Duration::from_secs(k),
        header: Duration::from_secs(h),
        body: Duration::from_secs(b),
        sources: (2..=5)
            .map(|x| std::net::Ipv4Addr::new(127, 0, 0, x))
            .collect(),
    });
    let t = Instant::now();
    while a.open() < s.attack && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    rep.line(format!(
        "  attack: {} of {} connections open after {:.1} s",
        a.open(),
        s.attack,
        t.elapsed().as_secs_f64()
    ));
    a
}
