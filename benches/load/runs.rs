//! One measured run: the world it loads, the figures before and after, and the outcome mix.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::pg::pg_wal_position;
use crate::probe::{report_probe, start_probe, stop_probe, Probe};
use crate::processes::command;
use crate::procfs::{
    children_cpu_us, machine_busy_ticks, postgres_ticks, proc_io, tree_ticks, trees_ticks,
    IoPerRequest, ProcIo,
};
use crate::report::{run_header, run_line, Report};
use crate::scenarios::scenario;
use crate::scenarios::{Ids, Scenario, Target};
use crate::servers::tool;
use crate::settings::Settings;
use crate::world::{Run, World};
use crate::wrk::{body_for, event_id, parse_wrk, wrk_script, Pace, WrkResult};

/// `idemgate_requests_total` by (route, outcome).
pub(crate) fn outcomes(admin: SocketAddr) -> BTreeMap<(String, String), f64> {
    let text = testkit::get(admin, "/metrics")
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .unwrap_or_default();
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("idemgate_requests_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let label = |name: &str| -> String {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        if let Ok(v) = value.trim().parse::<f64>() {
            m.insert((label("route"), label("outcome")), v);
        }
    }
    m
}
// ------------------------------------------------------------------ runs

pub(crate) struct Snapshot {
    pub(crate) server: u64,
    pub(crate) server_io: Option<ProcIo>,
    /// The server's WAL insert position, bytes (PostgreSQL scenarios).
    pub(crate) pg_wal: Option<u64>,
    pub(crate) upstream: u64,
    pub(crate) pg: u64,
    /// (v)'s valkey-server processes (0 without (v)).
    pub(crate) valkey: u64,
    pub(crate) busy: u64,
    pub(crate) ours: u64,
    pub(crate) wrk_us: f64,
    pub(crate) outcomes: BTreeMap<(String, String), f64>,
}

pub(crate) fn snapshot(s: &Settings, w: &World, sc: &Scenario) -> Snapshot {
    let server_pid = w.server_pid(sc.target);
    let server = server_pid.map_or(0, tree_ticks);
    let server_io = server_pid.and_then(proc_io);
    let pg_wal = (sc.target == Target::IdemPg)
        .then(|| pg_wal_position(&s.pg_url))
        .flatten();
    let upstream = tree_ticks(w.upstream.pid);
    let mut ours = upstream;
    for g in w.idemgates() {
        ours += tree_ticks(g.pid);
    }
    if let Some(p) = &w.proxy {
        ours += tree_ticks(p.pid);
    }
    let pg = postgres_ticks();
    let valkey = w.valkey.as_ref().map_or(0, |v| trees_ticks(&v.nodes));
    Snapshot {
        server,
        server_io,
        pg_wal,
        upstream,
        pg,
        valkey,
        busy: machine_busy_ticks(),
        ours: ours + pg + valkey,
        wrk_us: children_cpu_us(),
        outcomes: w.admin(sc.target).map(outcomes).unwrap_or_default(),
    }
}

/// Waits (at most 5 s) until no idemgate counts requests any more: wrk
/// drops the requests in flight when it stops, and idemgate still finishes
/// them (claims queued behind the store) — that load must not leak into the
/// next run's figures.
pub(crate) fn quiesce(w: &World) {
    let count = || -> f64 {
        w.idemgates()
            .iter()
            .map(|g| outcomes(g.admin).values().sum::<f64>())
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = count();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(150));
        let now = count();
        if now == last {
            return;
        }
        last = now;
    }
}

/// A unique 8-character prefix for the event IDs of one run.
pub(crate) fn id_prefix(key: char, serial: usize) -> String {
    let pid = std::process::id() % 100_000;
    format!("{key}{serial:02}{pid:05}")
}

/// Runs wrk once; the replay event is delivered by the caller first.
#[allow(clippy::too_many_arguments)] // a bench's plain plumbing
pub(crate) fn run_wrk(
    s: &Settings,
    w: &World,
    sc: &Scenario,
    conns: usize,
    secs: u64,
    prefix: &str,
    serial: usize,
    pace: Pace,
) -> String {
    let script = w.dir.join(format!("wrk-{}-{serial}.lua", sc.key));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ ((std::process::id() as u64) << 20)
        ^ serial as u64;
    std::fs::write(&script, wrk_script(sc.path, sc.ids, prefix, seed, pace)).unwrap();
    let addr = w.addr(sc.target).expect("target running");
    let out = command(&tool("wrk"))
        .args(["-t", &s.wrk_threads.to_string()])
        .args(["-c", &conns.to_string()])
        .args(["-d", &format!("{secs}s")])
        .args(["--timeout", "10s", "-s"])
        .arg(&script)
        .arg(format!("http://{addr}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("wrk runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || !text.contains("LOADRESULT") {
        panic!(
            "wrk failed ({}):\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    text
}

/// One run's ID prefix; for a replay run, its event is delivered here.
pub(crate) fn prepare(w: &World, sc: &Scenario, serial: usize) -> String {
    let prefix = id_prefix(sc.key, serial % 100);
    if sc.ids == Ids::Same {
        prime_replay(w, sc, &prefix);
    }
    prefix
}

/// Delivers the one event every request of a replay run repeats, and checks
/// that a duplicate is replayed.
pub(crate) fn prime_replay(w: &World, sc: &Scenario, prefix: &str) {
    let addr = w.addr(sc.target).unwrap();
    let id = event_id(prefix, 0, 0);
    let body = body_for(&id);
    let first = testkit::deliver(addr, sc.path, Some(&id), &body).expect("priming delivery");
    assert_eq!(first.status, 200, "priming delivery: {first:?}");
    let again = testkit::deliver(addr, sc.path, Some(&id), &body).expect("priming duplicate");
    assert_eq!(
        again.header("Idempotent-Replayed"),
        Some("true"),
        "the replay route does not replay: {again:?}"
    );
}

#[allow(clippy::too_many_arguments)] // a bench's plain plumbing
pub(crate) fn measure(
    s: &Settings,
    w: &World,
    sc: &Scenario,
    conns: usize,
    round: usize,
    serial: usize,
    perf: bool,
    trace: bool,
) -> Run {
    let (wrk, before, after) = wrk_between_snapshots(s, w, sc, conns, serial, perf, trace);
    let n = wrk.requests.max(1) as f64;
    let us = |ticks: u64| ticks as f64 * 1e6 / w.tck / n;
    let rps = wrk.requests as f64 / (wrk.duration_us.max(1) as f64 / 1e6);
    let wrk_us = after.wrk_us - before.wrk_us;
    let busy = after.busy.saturating_sub(before.busy) as f64 * 1e6 / w.tck;
    let ours = after.ours.saturating_sub(before.ours) as f64 * 1e6 / w.tck + wrk_us;
    let capacity = wrk.duration_us as f64 * w.ncpu as f64;
    let foreign_pct = ((busy - ours).max(0.0) / capacity.max(1.0)) * 100.0;

    let mut problems = Vec::new();
    if wrk.socket_errors > 0 {
        problems.push(format!("{} socket errors", wrk.socket_errors));
    }
    let mix = match sc.route {
        Some(route) => outcome_mix(sc, route, conns, &wrk, &before, &after, &mut problems),
        None => String::from("-"),
    };
    let expected_non_2xx = if sc.ids == Ids::Group64 {
        // The 409s of the conflict path.
        None
    } else {
        Some(0)
    };
    if expected_non_2xx.is_some_and(|e| wrk.non_2xx > e) {
        problems.push(format!("{} non-2xx responses", wrk.non_2xx));
    }
    Run {
        key: sc.key,
        conns,
        round,
        rps,
        cpu_server: w
            .server_pid(sc.target)
            .map(|_| us(after.server - before.server)),
        cpu_upstream: us(after.upstream - before.upstream),
        cpu_wrk: wrk_us / n,
        cpu_store: if sc.target == Target::IdemValkey {
            us(after.valkey.saturating_sub(before.valkey))
        } else {
            us(after.pg.saturating_sub(before.pg))
        },
        io_server: before
            .server_io
            .zip(after.server_io)
            .map(|(b, a)| IoPerRequest {
                read_kib: kib_per(n, b.read_bytes, a.read_bytes),
                written_kib: kib_per(n, b.written_bytes, a.written_bytes),
            }),
        pg_wal_kib: before
            .pg_wal
            .zip(after.pg_wal)
            .map(|(b, a)| kib_per(n, b, a)),
        foreign_pct,
        mix,
        problems,
        wrk,
    }
}

/// One wrk run of `s.duration` seconds, under the probes asked for, between
/// two snapshots of the figures.
#[allow(clippy::too_many_arguments)] // a bench's plain plumbing
fn wrk_between_snapshots(
    s: &Settings,
    w: &World,
    sc: &Scenario,
    conns: usize,
    serial: usize,
    perf: bool,
    trace: bool,
) -> (WrkResult, Snapshot, Snapshot) {
    let prefix = prepare(w, sc, serial);
    quiesce(w);
    let probes: Vec<Probe> = [(perf, false), (trace, true)]
        .into_iter()
        .filter(|(on, _)| *on)
        .filter_map(|(_, t)| start_probe(w, sc, t, s.perf_callgraph))
        .collect();
    let before = snapshot(s, w, sc);
    let out = run_wrk(
        s,
        w,
        sc,
        conns,
        s.duration,
        &prefix,
        serial,
        Pace::default(),
    );
    let after = snapshot(s, w, sc);
    probes.iter().for_each(stop_probe);
    let wrk = parse_wrk(&out).expect("wrk result line");
    for p in &probes {
        report_probe(p, sc.key, wrk.requests);
    }
    (wrk, before, after)
}

/// The outcome mix of `route` over a run from `idemgate_requests_total`, as
/// shares; an outcome the scenario should not have, another route that
/// moved, or a count apart from wrk's, go into `problems`.
fn outcome_mix(
    sc: &Scenario,
    route: &str,
    conns: usize,
    wrk: &WrkResult,
    before: &Snapshot,
    after: &Snapshot,
    problems: &mut Vec<String>,
) -> String {
    let mut delta: BTreeMap<String, f64> = BTreeMap::new();
    for ((r, o), v) in &after.outcomes {
        let d = v - before.outcomes.get(&(r.clone(), o.clone())).unwrap_or(&0.0);
        if d > 0.0 {
            if r == route {
                *delta.entry(o.clone()).or_default() += d;
            } else {
                problems.push(format!("route {r} moved ({o} +{d})"));
            }
        }
    }
    let total: f64 = delta.values().sum();
    let mix = delta
        .iter()
        .map(|(o, d)| format!("{o} {:.0}%", d * 100.0 / total.max(1.0)))
        .collect::<Vec<_>>()
        .join(", ");
    let expected: &[&str] = match sc.ids {
        Ids::Unique if route == "pass" => &["unguarded"],
        Ids::Unique | Ids::Random | Ids::TimeOrdered => &["forwarded"],
        Ids::Same => &["replayed"],
        Ids::Group64 => &["forwarded", "in_flight", "replayed"],
    };
    for o in delta.keys() {
        if !expected.contains(&o.as_str()) {
            problems.push(format!("unexpected outcome {o}"));
        }
    }
    // wrk drops the responses still in flight when it stops: allow that many.
    if (total - wrk.requests as f64).abs() > conns as f64 + 1.0 {
        problems.push(format!(
            "idemgate counted {total} requests, wrk {}",
            wrk.requests
        ));
    }
    mix
}

/// A byte counter's growth from `from` to `to`, in KiB per one of `n` requests.
pub(crate) fn kib_per(n: f64, from: u64, to: u64) -> f64 {
    to.saturating_sub(from) as f64 / 1024.0 / n
}

/// Announces the rounds, runs each scenario once for `s.warmup` seconds at
/// `top` connections, and prints the runs' table header.
pub(crate) fn warm_up(
    s: &Settings,
    w: &World,
    keys: &[char],
    top: usize,
    serial: &mut usize,
    rep: &mut Report,
) {
    let per_run = s.duration as f64 + 0.6;
    let total = keys.len() as f64
        * (s.conns.len() as f64 * s.repeats as f64 * per_run + s.warmup as f64 + 0.6);
    rep.line(format!(
        "scenarios {}; about {:.0} s in all",
        keys.iter()
            .map(|k| format!("({k})"))
            .collect::<Vec<_>>()
            .join(" "),
        total
    ));
    rep.line("");
    if s.warmup > 0 {
        for &k in keys {
            *serial += 1;
            let prefix = prepare(w, scenario(k), *serial);
            run_wrk(
                s,
                w,
                scenario(k),
                top,
                s.warmup,
                &prefix,
                *serial,
                Pace::default(),
            );
        }
    }
    rep.line("srv µs: CPU of the process under test per request (idemgate or the nginx proxy);");
    rep.line("up µs: the upstream nginx; wrk µs: the client; store µs: all postgres processes");
    rep.line("(PostgreSQL scenarios only), or the 6 valkey-server processes of (v)'s cluster;");
    rep.line("foreign: share of the machine busy with processes the harness did not start.");
    println!("{}", run_header());
}

/// Sanity: one request per scenario does what the scenario says.
pub(crate) fn sanity_check(w: &World, keys: &[char]) {
    for &k in keys {
        let sc = scenario(k);
        let id = event_id(&id_prefix('z', 0), 1, k as u64);
        let r = testkit::deliver(
            w.addr(sc.target).unwrap(),
            sc.path,
            Some(&id),
            &body_for(&id),
        )
        .unwrap_or_else(|e| panic!("({k}) does not answer: {e}"));
        let want = match sc.route {
            None => None,
            Some("pass") => Some("unguarded"),
            Some(_) => Some("forwarded"),
        };
        assert_eq!(r.status, 200, "({k}) sanity request: {r:?}");
        assert_eq!(
            r.header("Idempotency-Status"),
            want,
            "({k}) sanity request: {r:?}"
        );
    }
}

/// The measured runs: every scenario at every connection count, in
/// `s.repeats` rounds.
pub(crate) fn rounds(s: &Settings, w: &World, keys: &[char], serial: &mut usize) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for round in 1..=s.repeats {
        for &conns in &s.conns {
            // Rotate the order each round so that no scenario always runs first.
            let mut order = keys.to_vec();
            order.rotate_left((round - 1) % keys.len().max(1));
            for k in order {
                *serial += 1;
                let r = measure(s, w, scenario(k), conns, round, *serial, false, false);
                runs.push(r);
                // Ratios to (a) fill in once (a) of the round has run.
                let last = runs.last().unwrap();
                println!("{}", run_line(&runs, last));
            }
        }
    }
    runs
}

/// The runs under `LOAD_PERF` and `LOAD_SYSCALLS`.
pub(crate) fn probed_runs(
    s: &Settings,
    w: &World,
    keys: &[char],
    runs: &[Run],
    top: usize,
    serial: &mut usize,
) {
    // Probed runs come after the rounds and stay out of the figures: a
    // profiler changes what it measures.
    for &k in keys {
        let (perf, trace) = (s.perf.contains(&k), s.syscalls.contains(&k));
        if perf || trace {
            *serial += 1;
            let r = measure(s, w, scenario(k), top, 0, *serial, perf, trace);
            println!("probed run (not in the figures):\n{}", run_line(runs, &r));
        }
    }
}
