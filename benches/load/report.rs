//! The report: one line per run, the medians and the issue-7 targets, the machine.

use std::fmt::Write as _;

use crate::processes::sh;
use crate::procfs::rss_mib;
use crate::scenarios::{scenario, Target};
use crate::settings::Settings;
use crate::world::{Run, World};

pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

pub(crate) fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

/// The run of scenario `key` in the same round and at the same connections.
pub(crate) fn peer<'a>(runs: &'a [Run], r: &Run, key: char) -> Option<&'a Run> {
    runs.iter()
        .find(|x| x.key == key && x.round == r.round && x.conns == r.conns)
}

/// `r`'s req/s over that of scenario `key` in the same round and connections.
pub(crate) fn ratio_to(runs: &[Run], r: &Run, key: char) -> Option<f64> {
    peer(runs, r, key).map(|a| r.rps / a.rps)
}

pub(crate) struct Report(pub(crate) String);

impl Report {
    pub(crate) fn line(&mut self, s: impl AsRef<str>) {
        println!("{}", s.as_ref());
        self.0.push_str(s.as_ref());
        self.0.push('\n');
    }
}

pub(crate) fn run_header() -> String {
    format!(
        "{:<3} {:>5} {:>5} {:>9} {:>8} {:>8} {:>6} {:>8} {:>7} {:>6} {:>8} {:>7}  {}",
        "scn",
        "conns",
        "round",
        "req/s",
        "p50 ms",
        "p99 ms",
        "x(a)",
        "srv µs",
        "up µs",
        "wrk µs",
        "store µs",
        "foreign",
        "outcomes / problems"
    )
}

pub(crate) fn run_line(runs: &[Run], r: &Run) -> String {
    let mut notes = r.mix.clone();
    if r.key == 'e' && r.wrk.non_2xx > 0 {
        write!(notes, " ({} × 409)", r.wrk.non_2xx).unwrap();
    }
    for p in &r.problems {
        write!(notes, "  !! {p}").unwrap();
    }
    format!(
        "({}) {:>5} {:>5} {:>9.0} {:>8.2} {:>8.2} {:>6} {:>8} {:>7.1} {:>6.1} {:>8} {:>6.0}%  {}",
        r.key,
        r.conns,
        r.round,
        r.rps,
        r.wrk.p50_us / 1000.0,
        r.wrk.p99_us / 1000.0,
        opt(ratio_to(runs, r, 'a'), 2),
        opt(r.cpu_server, 1),
        r.cpu_upstream,
        r.cpu_wrk,
        if matches!(scenario(r.key).target, Target::IdemPg | Target::IdemValkey) {
            format!("{:.1}", r.cpu_store)
        } else {
            "-".into()
        },
        r.foreign_pct,
        notes
    )
}

pub(crate) fn summarise(rep: &mut Report, s: &Settings, runs: &[Run], w: &World) {
    medians(rep, s, runs);
    targets(rep, s, runs);
    for g in w.idemgates() {
        let (rss, hwm) = rss_mib(g.pid).unwrap_or((f64::NAN, f64::NAN));
        let verdict = if hwm <= 100.0 { "met" } else { "NOT MET" };
        rep.line(format!(
            "  {} resident memory: VmRSS {rss:.1} MiB now, VmHWM (peak) {hwm:.1} MiB   target <= 100 MiB  {verdict}",
            g.name
        ));
    }
    let noisy = runs.iter().filter(|r| r.foreign_pct > 25.0).count();
    if noisy > 0 {
        rep.line(format!(
            "  note: {noisy} of {} runs shared the machine with more than 25% foreign load \
             (column 'foreign'): their req/s say more about the neighbours than about idemgate; \
             CPU µs/request and same-round ratios suffer less",
            runs.len()
        ));
    }
    let problems: usize = runs.iter().map(|r| r.problems.len()).sum();
    if problems > 0 {
        rep.line(format!(
            "  !! {problems} problem(s) flagged above: those runs did not measure what they claim"
        ));
    }
}

/// Per scenario and connection count, the medians over the rounds.
fn medians(rep: &mut Report, s: &Settings, runs: &[Run]) {
    rep.line("");
    rep.line(format!(
        "medians over {} round(s) ({} s runs); x(a) = median of the per-round ratios to (a):",
        s.repeats, s.duration
    ));
    rep.line(format!(
        "{:<34} {:>5} {:>9} {:>8} {:>8} {:>6} {:>8} {:>7}",
        "scenario", "conns", "req/s", "p50 ms", "p99 ms", "x(a)", "srv µs", "up µs"
    ));
    for &conns in &s.conns {
        for &k in &s.scenarios {
            let rs: Vec<&Run> = runs
                .iter()
                .filter(|r| r.key == k && r.conns == conns)
                .collect();
            if rs.is_empty() {
                continue;
            }
            let m =
                |f: &dyn Fn(&Run) -> Option<f64>| median(rs.iter().filter_map(|r| f(r)).collect());
            rep.line(format!(
                "({k}) {:<30} {:>5} {:>9} {:>8} {:>8} {:>6} {:>8} {:>7}",
                scenario(k).name,
                conns,
                opt(m(&|r| Some(r.rps)), 0),
                opt(m(&|r| Some(r.wrk.p50_us / 1000.0)), 2),
                opt(m(&|r| Some(r.wrk.p99_us / 1000.0)), 2),
                opt(m(&|r| ratio_to(runs, r, 'a')), 2),
                opt(m(&|r| r.cpu_server), 1),
                opt(m(&|r| Some(r.cpu_upstream)), 1),
            ));
        }
    }
}

/// Issue 7's targets at the highest connection count, and the CPU per
/// request of idemgate, the nginx proxy and the upstream there.
fn targets(rep: &mut Report, s: &Settings, runs: &[Run]) {
    let top = *s.conns.iter().max().unwrap();
    let at = |k: char| -> Vec<&Run> {
        runs.iter()
            .filter(|r| r.key == k && r.conns == top)
            .collect()
    };
    let ratio = |k: char, base: char| -> Option<f64> {
        median(
            at(k)
                .iter()
                .filter_map(|r| ratio_to(runs, r, base))
                .collect(),
        )
    };
    let p99 = |k: char| median(at(k).iter().map(|r| r.wrk.p99_us / 1000.0).collect());
    rep.line("");
    rep.line(format!(
        "issue-7 targets at {top} connections (medians of per-round ratios):"
    ));
    let check =
        |rep: &mut Report, what: &str, got: Option<f64>, ok: &dyn Fn(f64) -> bool, goal: &str| {
            let verdict = match got {
                None => "n/a".to_string(),
                Some(g) if ok(g) => "met".to_string(),
                Some(_) => "NOT MET".to_string(),
            };
            rep.line(format!(
                "  {what:<34} {:>8}   target {goal:<16} {verdict}",
                opt(got, 2)
            ));
        };
    check(
        rep,
        "(a) / nginx proxy",
        ratio('a', 'n'),
        &|x| x >= 0.6,
        ">= 0.6",
    );
    check(
        rep,
        "(b) SQLite unique / (a)",
        ratio('b', 'a'),
        &|x| x >= 0.7,
        ">= 0.7",
    );
    check(
        rep,
        "(c) replay / (a)",
        ratio('c', 'a'),
        &|x| x >= 2.5,
        ">= 2.5",
    );
    check(
        rep,
        "(d) PostgreSQL unique / (a)",
        ratio('d', 'a'),
        &|x| x >= 0.5,
        ">= 0.5",
    );
    let p99_gap = p99('b').zip(p99('a')).map(|(b, a)| b - a);
    check(
        rep,
        "p99(b) - p99(a), ms",
        p99_gap,
        &|x| x <= 5.0,
        "<= 5 ms",
    );
    let cpu = |k: char| median(at(k).iter().filter_map(|r| r.cpu_server).collect());
    rep.line(format!(
        "  CPU µs/request at {top} conns: idemgate (a) {}, nginx proxy {}, upstream nginx {}",
        opt(cpu('a'), 1),
        opt(cpu('n'), 1),
        opt(median(at('a').iter().map(|r| r.cpu_upstream).collect()), 1)
    ));
}
pub(crate) fn machine_line(s: &Settings) -> Vec<String> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    let ncpu = std::thread::available_parallelism().map_or(0, |n| n.get());
    // Name the changed files: in a shared work tree, "uncommitted changes"
    // alone does not say which code was measured.
    let changed: Vec<String> = sh("git", &["status", "--porcelain", "--untracked-files=no"])
        .lines()
        .filter_map(|l| l.get(3..))
        .filter(|f| f.starts_with("src/") || f.starts_with("Cargo") || f.starts_with("migrations/"))
        .map(str::to_string)
        .collect();
    let dirty = if changed.is_empty() {
        String::new()
    } else {
        format!(" + uncommitted changes in {}", changed.join(", "))
    };
    vec![
        format!(
            "idemgate load harness — {} — commit {}{dirty}",
            sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
            sh("git", &["rev-parse", "--short", "HEAD"])
        ),
        if s.bin == env!("CARGO_BIN_EXE_idemgate") {
            format!("idemgate binary: {} (built from this work tree)", s.bin)
        } else {
            format!("idemgate binary: LOAD_BIN={} (the commit above is the harness's, not this binary's)", s.bin)
        },
        format!(
            "machine: {ncpu} CPU(s), {cpu}, kernel {}, load average {}",
            std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim(),
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        ),
        format!(
            "runs: {} s each, {} round(s), warm-up {} s per scenario, connections {:?}, wrk threads {}, \
             idemgate threads {}, nginx proxy workers {}, idemgate RUST_LOG={}",
            s.duration,
            s.repeats,
            s.warmup,
            s.conns,
            s.wrk_threads,
            s.idemgate_threads
                .map_or("default".into(), |t| t.to_string()),
            s.nginx_workers,
            s.rust_log
        ),
    ]
}
