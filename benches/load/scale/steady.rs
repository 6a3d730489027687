//! `LOAD_STEADY`: a fixed claim rate of unique random-ID deliveries against
//! an idemgate with a short retention and sweeper interval, in back-to-back
//! segments, so that the sweeper deletes records as fast as they expire.
//! Each segment reports its latencies, the table, the sweeper's lag and
//! whether a sweep ran in it.

use std::net::SocketAddr;
use std::path::Path;

use super::stores::{fresh_store, gib, now_ms, start_on, world_with, Section, Sized};
use crate::report::{median, opt, Report};
use crate::runs::run_wrk;
use crate::servers::Extra;
use crate::settings::{ScaleSettings, Store};
use crate::world::World;
use crate::wrk::{parse_wrk, Pace};

/// The sweeper's counters from `/metrics`: sweep batches run, seconds spent
/// in them, records swept.
#[derive(Default, Clone, Copy)]
struct Sweeps {
    batches: f64,
    seconds: f64,
    swept: f64,
}

fn sweeps(admin: SocketAddr) -> Sweeps {
    let text = testkit::get(admin, "/metrics")
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .unwrap_or_default();
    let value = |prefix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Sweeps {
        batches: value("idemgate_store_duration_seconds_count{operation=\"sweep\"}"),
        seconds: value("idemgate_store_duration_seconds_sum{operation=\"sweep\"}"),
        swept: value("idemgate_records_swept_total"),
    }
}

struct Segment {
    /// Seconds since the steady run's start, at the segment's end.
    at: f64,
    rps: f64,
    p50: f64,
    p99: f64,
    records: u64,
    bytes: u64,
    detail: String,
    lag: f64,
    batches: f64,
    swept: f64,
    sweep_ms: f64,
    /// Sweeps that failed in the segment (idemgate's log: a failed batch
    /// moves no metric).
    failed: usize,
    problems: String,
}

/// Counts the lines saying `needle` that the log gained since `offset`.
fn new_lines_saying(log: &Path, offset: &mut u64, needle: &str) -> usize {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(log) else {
        return 0;
    };
    let mut text = String::new();
    if f.seek(SeekFrom::Start(*offset)).is_err() || f.read_to_string(&mut text).is_err() {
        return 0;
    }
    // Up to the last complete line; the rest is read next time.
    let complete = text.rfind('\n').map_or(0, |i| i + 1);
    *offset += complete as u64;
    text[..complete]
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

pub(crate) fn steady(section: Section<'_>) {
    let (s, w, logs) = (section.s, section.w, section.logs);
    let (rep, serial) = (section.rep, section.serial);
    let sc = &s.scale;
    for &store in &sc.steady_stores {
        let st = match fresh_store(s, w, store, "steady") {
            Ok(st) => st,
            Err(e) => {
                rep.line(format!("SKIP steady state on {}: {e}", store.name()));
                continue;
            }
        };
        let extra = Extra {
            top: format!("sweeper:\n  interval: {}s\n", sc.steady_sweep),
            defaults: format!("  retention: {}s\n", sc.steady_retention),
        };
        let name = format!("idemgate-steady-{}", store.name());
        let log = logs.join(format!("{name}.log"));
        let mut log_offset = 0;
        let g = start_on(s, w, logs, name, &st, &extra);
        let world = world_with(w, g, store);
        let conns = *s.conns.iter().max().unwrap();
        let rate = steady_rate(s, w, &world, store, rep, serial);
        steady_header(rep, sc, store, rate, conns);
        let pace = Pace {
            per_thread: Some(rate / s.wrk_threads as f64),
        };
        let start = std::time::Instant::now();
        let mut segs: Vec<Segment> = Vec::new();
        while start.elapsed().as_secs() + sc.steady_segment / 2 < sc.steady {
            *serial += 1;
            let seg = segment(
                s,
                &world,
                &st,
                g.admin,
                &log,
                &mut log_offset,
                start,
                (pace, *serial),
            );
            rep.line(segment_line(&seg));
            segs.push(seg);
        }
        summary(rep, sc, rate, &segs);
    }
}

/// The steady state's claim rate: `LOAD_STEADY_RATE`, else the share of a
/// flat-out run.
fn steady_rate(
    s: &crate::settings::Settings,
    w: &World,
    world: &World,
    store: Store,
    rep: &mut Report,
    serial: &mut usize,
) -> f64 {
    let sc = &s.scale;
    let key = sc.scenario(store);
    let conns = *s.conns.iter().max().unwrap();
    sc.steady_rate.unwrap_or_else(|| {
        // Flat out for 5 s on the harness's own idemgate of this store
        // (so that this load does not expire into the steady run), then
        // the share of it.
        let probe = match store {
            Store::Sqlite => Some(w),
            Store::Postgres => w.pg.is_some().then_some(w),
        }
        .unwrap_or(world);
        *serial += 1;
        let out = run_wrk(s, probe, key, conns, 5, "", *serial, Pace::default());
        let r = parse_wrk(&out).expect("wrk result line");
        let max = r.requests as f64 / (r.duration_us.max(1) as f64 / 1e6);
        rep.line(format!(
            "steady state, {}: flat out {max:.0} req/s at {conns} connections (5 s)",
            store.name()
        ));
        (max * sc.steady_share).floor()
    })
}

/// The steady state's heading and the segments' column names.
fn steady_header(rep: &mut Report, sc: &ScaleSettings, store: Store, rate: f64, conns: usize) {
    rep.line("");
    rep.line(format!(
        "steady state (issue 24), {}: {rate:.0} claims/s of unique {} IDs at {conns} connections for {} s, \
         retention {} s, sweeper every {} s (batch 1000), {} s segments",
        store.name(),
        sc.ids_word(),
        sc.steady,
        sc.steady_retention,
        sc.steady_sweep,
        sc.steady_segment
    ));
    rep.line(format!(
        "{:>6} {:>8} {:>8} {:>8} {:>9} {:>10} {:>7} {:>6} {:>8} {:>8} {:>6}  {}",
        "t s",
        "req/s",
        "p50 ms",
        "p99 ms",
        "records",
        "size",
        "lag s",
        "sweep",
        "swept",
        "sweep ms",
        "failed",
        "store / problems"
    ));
}

/// One segment: a paced wrk run, and the store and sweeper around it.
#[allow(clippy::too_many_arguments)] // a bench's plain plumbing
fn segment(
    s: &crate::settings::Settings,
    world: &World,
    st: &Sized,
    admin: SocketAddr,
    log: &Path,
    log_offset: &mut u64,
    start: std::time::Instant,
    (pace, serial): (Pace, usize),
) -> Segment {
    let sc = &s.scale;
    let key = sc.scenario(st.store);
    let conns = *s.conns.iter().max().unwrap();
    let before = sweeps(admin);
    let out = run_wrk(s, world, key, conns, sc.steady_segment, "", serial, pace);
    let after = sweeps(admin);
    let r = parse_wrk(&out).expect("wrk result line");
    let c = st.content(s);
    let now = now_ms();
    let mut problems = String::new();
    if r.socket_errors > 0 {
        problems.push_str(&format!("  !! {} socket errors", r.socket_errors));
    }
    if r.non_2xx > 0 {
        problems.push_str(&format!("  !! {} non-2xx", r.non_2xx));
    }
    Segment {
        at: start.elapsed().as_secs_f64(),
        rps: r.requests as f64 / (r.duration_us.max(1) as f64 / 1e6),
        p50: r.p50_us / 1000.0,
        p99: r.p99_us / 1000.0,
        records: c.records,
        bytes: c.bytes,
        detail: c.detail,
        lag: c
            .oldest_expiry
            .map_or(0.0, |e| (now - e).max(0) as f64 / 1000.0),
        batches: after.batches - before.batches,
        swept: after.swept - before.swept,
        sweep_ms: (after.seconds - before.seconds) * 1000.0,
        failed: new_lines_saying(log, log_offset, "sweeper failed"),
        problems,
    }
}

/// A segment's line of the report.
fn segment_line(seg: &Segment) -> String {
    format!(
        "{:>6.0} {:>8.0} {:>8.2} {:>8.2} {:>9} {:>10} {:>7.1} {:>6} {:>8.0} {:>8.0} {:>6}  {}{}",
        seg.at,
        seg.rps,
        seg.p50,
        seg.p99,
        seg.records,
        gib(seg.bytes),
        seg.lag,
        if seg.batches > 0.0 { "yes" } else { "-" },
        seg.swept,
        seg.sweep_ms,
        seg.failed,
        seg.detail,
        seg.problems
    )
}

fn summary(rep: &mut Report, sc: &ScaleSettings, rate: f64, segs: &[Segment]) {
    // After the first retention period and the sweep that follows it, the
    // table should hold about rate x retention records and stay there.
    let settled = (sc.steady_retention + sc.steady_sweep) as f64;
    let steady: Vec<&Segment> = segs
        .iter()
        .filter(|g| g.at - sc.steady_segment as f64 >= settled)
        .collect();
    let (Some(first), Some(last)) = (steady.first(), steady.last()) else {
        rep.line(format!(
            "  too short for a steady state: it starts after retention + sweeper interval = {settled:.0} s"
        ));
        return;
    };
    let flat = |a: f64, b: f64| {
        let r = b / a.max(1.0);
        format!(
            "{:+.1} % ({})",
            (r - 1.0) * 100.0,
            if (r - 1.0).abs() <= 0.10 {
                "flat within ±10 %"
            } else {
                "NOT flat"
            }
        )
    };
    // The record count is a saw-tooth (each sweep cuts a sweeper interval's
    // worth): compare its means over the first and the last sweep cycle.
    let cycle = (sc.steady_sweep.div_ceil(sc.steady_segment) as usize).clamp(1, steady.len());
    let mean = |v: &[&Segment]| v.iter().map(|g| g.records as f64).sum::<f64>() / v.len() as f64;
    let (r0, r1) = (
        mean(&steady[..cycle]),
        mean(&steady[steady.len() - cycle..]),
    );
    rep.line(format!(
        "  from t = {:.0} s (after retention + sweeper interval) to the end ({:.0} s): table size {} -> {} {}",
        first.at,
        last.at,
        gib(first.bytes),
        gib(last.bytes),
        flat(first.bytes as f64, last.bytes as f64),
    ));
    rep.line(format!(
        "  records, mean over the first and the last sweep cycle ({cycle} segments): {r0:.0} -> {r1:.0} {}",
        flat(r0, r1)
    ));
    rep.line(format!(
        "  expected records at the fixed rate: about {:.0} (rate x retention) + up to {:.0} waiting for the next sweep",
        rate * sc.steady_retention as f64,
        rate * sc.steady_sweep as f64
    ));
    sweep_p99s(rep, &steady);
    // A sweeper that keeps up leaves no record more than one interval (and
    // the segment it is read at) past its expiry.
    let lag = steady.iter().map(|g| g.lag).reduce(f64::max);
    let bound = (sc.steady_sweep + sc.steady_segment) as f64 + 5.0;
    let failed: usize = segs.iter().map(|g| g.failed).sum();
    rep.line(format!(
        "  sweeper lag (oldest record past its expiry, at segment ends): max {} s ({}: bound sweeper interval + segment + 5 s = {bound:.0} s); \
         failed sweeps (idemgate's log): {failed}; claim rate kept: median {} req/s of {rate:.0}",
        opt(lag, 1),
        if lag.is_some_and(|l| l <= bound) { "keeps up" } else { "does NOT keep up" },
        opt(median(steady.iter().map(|g| g.rps).collect()), 0)
    ));
}

/// p99 of the segments with a sweep against those without.
fn sweep_p99s(rep: &mut Report, steady: &[&Segment]) {
    // "With a sweep": the sweeper deleted records during the segment.
    let (with, without): (Vec<&&Segment>, Vec<&&Segment>) =
        steady.iter().partition(|g| g.swept > 0.0);
    let p99s = |v: &[&&Segment]| median(v.iter().map(|g| g.p99).collect());
    let max = |v: &[&&Segment]| {
        v.iter()
            .map(|g| g.p99)
            .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
    };
    rep.line(format!(
        "  p99 of segments in which the sweeper deleted records: median {} ms, max {} ms ({} segments); without: median {} ms, max {} ms ({} segments); ratio of medians {}",
        opt(p99s(&with), 2),
        opt(max(&with), 2),
        with.len(),
        opt(p99s(&without), 2),
        opt(max(&without), 2),
        without.len(),
        opt(p99s(&with).zip(p99s(&without)).map(|(a, b)| a / b.max(0.001)), 2)
    ));
}
