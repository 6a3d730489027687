//! Issue 24's sections of the load harness: unique deliveries with random
//! event IDs against stores preloaded with millions of delivered records
//! (`LOAD_PRELOAD`, this file; the stores are built and cached by
//! `preload.rs`), and a steady state where the sweeper deletes records as
//! fast as they expire under a fixed claim rate (`LOAD_STEADY`, `steady.rs`).
//! The settings are described in `benches/load/main.rs`'s header.

use std::fmt::Write as _;
use std::path::Path;

use crate::procfs::rss_mib;
use crate::report::{median, opt, Report};
use crate::runs::{measure, run_wrk};
use crate::servers::Extra;
use crate::settings::Store;
use crate::world::{Run, World};
use crate::wrk::Pace;
use stores::{fresh_store, gib, start_on, world_with, Sized};

mod preload;
mod steady;
mod stores;

pub(super) use preload::drop_cached;
pub(super) use steady::steady;
pub(super) use stores::Section;

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Sqlite => "sqlite",
            Store::Postgres => "postgres",
        }
    }
}

/// One run of the store-size section.
struct SizedRun {
    size: u64,
    run: Run,
    records: u64,
    bytes: u64,
    detail: String,
}

/// The run of the empty store in the same round, connections and store.
fn empty_peer<'a>(runs: &'a [SizedRun], r: &SizedRun) -> Option<&'a SizedRun> {
    runs.iter().find(|x| {
        x.size == 0
            && x.run.key == r.run.key
            && x.run.round == r.run.round
            && x.run.conns == r.run.conns
    })
}

fn sized_header() -> String {
    format!(
        "{:<3} {:>9} {:>5} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>10} {:>7} {:>6} {:>6} {:>7} {:>7}  {}",
        "scn",
        "preload",
        "conns",
        "round",
        "req/s",
        "p50 ms",
        "p99 ms",
        "x(empty)",
        "p99 x(e)",
        "records",
        "srv µs",
        "rd KiB",
        "wr KiB",
        "wal KiB",
        "foreign",
        "store size / outcomes / problems"
    )
}

fn sized_line(runs: &[SizedRun], r: &SizedRun) -> String {
    let peer = empty_peer(runs, r);
    let mut notes = format!("{} · {}", r.detail, r.run.mix);
    for p in &r.run.problems {
        write!(notes, "  !! {p}").unwrap();
    }
    format!(
        "({}) {:>9} {:>5} {:>5} {:>9.0} {:>8.2} {:>8.2} {:>8} {:>8} {:>10} {:>7} {:>6} {:>6} {:>7} {:>6.0}%  {}",
        r.run.key,
        r.size,
        r.run.conns,
        r.run.round,
        r.run.rps,
        r.run.wrk.p50_us / 1000.0,
        r.run.wrk.p99_us / 1000.0,
        opt(peer.map(|p| r.run.rps / p.run.rps), 2),
        opt(
            peer.map(|p| r.run.wrk.p99_us / p.run.wrk.p99_us.max(1.0)),
            2
        ),
        r.records,
        opt(r.run.cpu_server, 1),
        opt(r.run.io_server.map(|io| io.read_kib), 1),
        opt(r.run.io_server.map(|io| io.written_kib), 1),
        opt(r.run.pg_wal_kib, 1),
        r.run.foreign_pct,
        notes
    )
}

/// `LOAD_PRELOAD`: (r) and (p) against the empty store and the preloaded
/// ones, interleaved in rounds; ratios to the empty store of the same round.
pub(super) fn store_sizes(section: Section<'_>) {
    let (s, w, logs) = (section.s, section.w, section.logs);
    let (rep, serial) = (section.rep, section.serial);
    let sc = &s.scale;
    rep.line("");
    rep.line(format!(
        "store sizes (issue 24): unique deliveries with {} 32-hex IDs, stores preloaded with {:?} delivered records",
        sc.ids_word(),
        sc.preload
    ));
    let stores = start_sized(s, w, logs, rep);
    let runs = sized_rounds(s, &stores, serial);
    sized_report(rep, s, &stores, &runs);
}

/// An idemgate on each store and size of `LOAD_PRELOAD`, with the world it loads.
fn start_sized(
    s: &crate::settings::Settings,
    w: &World,
    logs: &Path,
    rep: &mut Report,
) -> Vec<(Sized, World)> {
    let sc = &s.scale;
    let mut stores: Vec<(Sized, World)> = Vec::new();
    for &store in &sc.preload_stores {
        for &size in &sc.preload {
            let st = if size == 0 {
                fresh_store(s, w, store, "empty")
            } else {
                preload::cached(s, store, size, rep)
            };
            let st = match st {
                Ok(st) => st,
                Err(e) => {
                    rep.line(format!("  SKIP {} {size}: {e}", store.name()));
                    continue;
                }
            };
            let g = start_on(
                s,
                w,
                logs,
                format!("idemgate-{}-{size}", store.name()),
                &st,
                &Extra::default(),
            );
            let c = st.content(s);
            rep.line(format!(
                "  {} preload {size}: {} records, {}",
                store.name(),
                c.records,
                c.detail
            ));
            stores.push((st, world_with(w, g, store)));
        }
    }
    stores
}

/// The warm-up, then the store-size runs in `s.repeats` rounds.
fn sized_rounds(
    s: &crate::settings::Settings,
    stores: &[(Sized, World)],
    serial: &mut usize,
) -> Vec<SizedRun> {
    let sc = &s.scale;
    let top = *s.conns.iter().max().unwrap();
    if s.warmup > 0 {
        for (st, world) in stores {
            *serial += 1;
            let k = sc.scenario(st.store);
            run_wrk(s, world, k, top, s.warmup, "", *serial, Pace::default());
        }
    }
    println!("{}", sized_header());
    let mut runs: Vec<SizedRun> = Vec::new();
    for round in 1..=s.repeats {
        for &conns in &s.conns {
            let mut order: Vec<usize> = (0..stores.len()).collect();
            order.rotate_left((round - 1) % stores.len().max(1));
            for i in order {
                let (st, world) = &stores[i];
                *serial += 1;
                let run = measure(
                    s,
                    world,
                    sc.scenario(st.store),
                    conns,
                    round,
                    *serial,
                    false,
                    false,
                );
                let c = st.content(s);
                runs.push(SizedRun {
                    size: st.size,
                    run,
                    records: c.records,
                    bytes: c.bytes,
                    detail: c.detail,
                });
                println!("{}", sized_line(&runs, runs.last().unwrap()));
            }
        }
    }
    runs
}

/// Every store-size run again, then the medians and issue 24's targets.
fn sized_report(
    rep: &mut Report,
    s: &crate::settings::Settings,
    stores: &[(Sized, World)],
    runs: &[SizedRun],
) {
    let sc = &s.scale;
    rep.line("");
    rep.line("all store-size runs (x(empty), p99 x(e): req/s and p99 over the empty store's of the same round, connections and store;");
    rep.line("srv µs: idemgate's CPU per request; rd KiB, wr KiB: what idemgate read (page-cache misses) and wrote per request,");
    rep.line("counted, the figures to compare between builds; wal KiB: WAL the PostgreSQL server wrote per request (its insert position);");
    rep.line("foreign: share of the machine busy with processes the harness did not start):");
    rep.line(sized_header());
    for r in runs {
        rep.line(sized_line(runs, r));
    }
    rep.line("");
    rep.line(format!(
        "store sizes, medians over {} round(s) of {} s (x(empty): median of the per-round ratios):",
        s.repeats, s.duration
    ));
    rep.line(format!(
        "{:<10} {:>9} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6} {:>6} {:>7} {:>8} {:>12}",
        "store",
        "preload",
        "conns",
        "req/s",
        "p50 ms",
        "p99 ms",
        "x(empty)",
        "p99 x(e)",
        "rd KiB",
        "wr KiB",
        "wal KiB",
        "peak MiB",
        "size at end"
    ));
    for &store in &sc.preload_stores {
        for &size in &sc.preload {
            for &conns in &s.conns {
                sized_median_row(rep, s, stores, runs, (store, size, conns));
            }
        }
    }
}

/// The medians of one store, size and connection count, and the target's verdict.
fn sized_median_row(
    rep: &mut Report,
    s: &crate::settings::Settings,
    stores: &[(Sized, World)],
    runs: &[SizedRun],
    (store, size, conns): (Store, u64, usize),
) {
    let sc = &s.scale;
    let rs: Vec<&SizedRun> = runs
        .iter()
        .filter(|r| r.size == size && r.run.key == sc.scenario(store).key && r.run.conns == conns)
        .collect();
    if rs.is_empty() {
        return;
    }
    let m = |f: &dyn Fn(&SizedRun) -> Option<f64>| median(rs.iter().filter_map(|r| f(r)).collect());
    let ratio = m(&|r| empty_peer(runs, r).map(|p| r.run.rps / p.run.rps));
    let p99r = m(&|r| empty_peer(runs, r).map(|p| r.run.wrk.p99_us / p.run.wrk.p99_us.max(1.0)));
    let goal = match (store, size) {
        (_, 0) => String::new(),
        (Store::Sqlite, n) if n >= 20_000_000 => verdict(ratio, 0.9, None),
        (Store::Sqlite, n) if n >= 5_000_000 => verdict(ratio, 0.95, p99r),
        (Store::Postgres, n) if n >= 5_000_000 => verdict(ratio, 0.95, None),
        _ => String::new(),
    };
    let peak = stores
        .iter()
        .find(|(st, _)| st.store == store && st.size == size)
        .and_then(|(st, world)| world.server_pid(sc.scenario(st.store).target))
        .and_then(rss_mib)
        .map(|(_, hwm)| hwm);
    rep.line(format!(
        "{:<10} {:>9} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6} {:>6} {:>7} {:>8} {:>12}{goal}",
        store.name(),
        size,
        conns,
        opt(m(&|r| Some(r.run.rps)), 0),
        opt(m(&|r| Some(r.run.wrk.p50_us / 1000.0)), 2),
        opt(m(&|r| Some(r.run.wrk.p99_us / 1000.0)), 2),
        opt(ratio, 2),
        opt(p99r, 2),
        opt(m(&|r| r.run.io_server.map(|io| io.read_kib)), 1),
        opt(m(&|r| r.run.io_server.map(|io| io.written_kib)), 1),
        opt(m(&|r| r.run.pg_wal_kib), 1),
        opt(peak, 1),
        rs.last().map_or("-".into(), |r| gib(r.bytes)),
    ));
}

/// Issue 24's target: req/s ≥ `min` × the empty store's (and, given, p99
/// within 2× of its).
fn verdict(ratio: Option<f64>, min: f64, p99: Option<f64>) -> String {
    let Some(r) = ratio else {
        return String::new();
    };
    let ok = r >= min && p99.is_none_or(|p| p <= 2.0);
    format!(
        "   target x(empty) >= {min}{}: {}",
        if p99.is_some() { ", p99 <= 2x" } else { "" },
        if ok { "met" } else { "NOT MET" }
    )
}
