//! Issue 24's sections of the load harness: unique deliveries with random
//! event IDs against stores preloaded with millions of delivered records
//! (`LOAD_PRELOAD`, this file; the stores are built and cached by
//! `preload.rs`), and a steady state where the sweeper deletes records as
//! fast as they expire under a fixed claim rate (`LOAD_STEADY`, `steady.rs`).
//! The settings are described in `benches/load/main.rs`'s header.

use std::fmt::Write as _;
use std::path::Path;

use crate::pg::{pg_exec, pg_run_schema};
use crate::procfs::rss_mib;
use crate::report::{median, opt, Report};
use crate::runs::{measure, run_wrk, target_dir, Run, World};
use crate::scenarios::{scenario, Scenario};
use crate::servers::{start_idemgate, Extra, Idemgate};
use crate::settings::{env_list, env_or};
use crate::wrk::Pace;

mod preload;
mod steady;

pub(super) use preload::drop_cached;
pub(super) use steady::steady;

/// Which store a section loads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Store {
    Sqlite,
    Postgres,
}

impl Store {
    fn name(self) -> &'static str {
        match self {
            Store::Sqlite => "sqlite",
            Store::Postgres => "postgres",
        }
    }
}

pub(super) struct Settings {
    /// Store sizes (records preloaded); 0 is the empty store.
    pub preload: Vec<u64>,
    pub preload_stores: Vec<Store>,
    /// Remove the cached preloaded stores first.
    pub preload_drop: bool,
    /// Load time-ordered IDs, (t) and (q), instead of random ones.
    pub time_ids: bool,
    /// Seconds of the steady-state run (0: none).
    pub steady: u64,
    pub steady_stores: Vec<Store>,
    pub steady_retention: u64,
    pub steady_sweep: u64,
    pub steady_segment: u64,
    /// Fixed claim rate (req/s); `None`: `steady_share` of a flat-out run's.
    pub steady_rate: Option<f64>,
    pub steady_share: f64,
}

/// `5000000`, `5M`, `200k`.
fn count(v: &str) -> u64 {
    let v = v.trim();
    let (num, mul) = match v.chars().last() {
        Some('k' | 'K') => (&v[..v.len() - 1], 1_000),
        Some('m' | 'M') => (&v[..v.len() - 1], 1_000_000),
        _ => (v, 1),
    };
    num.parse::<u64>()
        .unwrap_or_else(|_| panic!("LOAD_PRELOAD: {v:?} is not a count"))
        * mul
}

fn stores(name: &str, default: &str) -> Vec<Store> {
    env_list(name, default)
        .split(',')
        .map(|v| match v.trim() {
            "sqlite" => Store::Sqlite,
            "postgres" | "pg" => Store::Postgres,
            other => panic!("{name}: unknown store {other:?} (sqlite, postgres)"),
        })
        .collect()
}

impl Settings {
    pub fn from_env() -> Settings {
        let mut preload: Vec<u64> = env_list("LOAD_PRELOAD", "")
            .split(',')
            .filter(|v| !v.trim().is_empty())
            .map(count)
            .collect();
        if !preload.is_empty() && !preload.contains(&0) {
            // The ratios need the empty store of the same round.
            preload.insert(0, 0);
        }
        preload.sort_unstable();
        preload.dedup();
        let share = env_or("LOAD_STEADY_SHARE", 0.6f64);
        assert!(share > 0.0 && share <= 1.0, "LOAD_STEADY_SHARE: in (0, 1]");
        Settings {
            preload,
            preload_stores: stores("LOAD_PRELOAD_STORES", "sqlite,postgres"),
            preload_drop: env_or("LOAD_PRELOAD_DROP", 0u8) != 0,
            time_ids: match env_list("LOAD_SCALE_IDS", "random").trim() {
                "random" => false,
                "time" => true,
                v => panic!("LOAD_SCALE_IDS: random or time, not {v:?}"),
            },
            steady: env_or("LOAD_STEADY", 0u64),
            steady_stores: stores("LOAD_STEADY_STORES", "sqlite"),
            steady_retention: env_or("LOAD_STEADY_RETENTION", 60u64).max(1),
            steady_sweep: env_or("LOAD_STEADY_SWEEP", 30u64).max(1),
            steady_segment: env_or("LOAD_STEADY_SEGMENT", 10u64).max(1),
            steady_rate: std::env::var("LOAD_STEADY_RATE")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(|v| v.trim().parse().expect("LOAD_STEADY_RATE: req/s")),
            steady_share: share,
        }
    }

    /// The scenario both sections load on `store`: (r) or (p) with random
    /// IDs, (t) or (q) with time-ordered ones.
    fn scenario(&self, store: Store) -> &'static Scenario {
        scenario(match (store, self.time_ids) {
            (Store::Sqlite, false) => 'r',
            (Store::Postgres, false) => 'p',
            (Store::Sqlite, true) => 't',
            (Store::Postgres, true) => 'q',
        })
    }

    /// How the loaded IDs are made, for the reports' headings.
    pub fn ids_word(&self) -> &'static str {
        if self.time_ids {
            "time-ordered"
        } else {
            "random"
        }
    }

    /// Whether a section of issue 24 runs, or the cache is dropped (then the
    /// usual rounds run only if `LOAD_SCENARIOS` asks for them).
    pub fn any(&self) -> bool {
        !self.preload.is_empty() || self.steady > 0 || self.preload_drop
    }

    pub fn uses_pg(&self) -> bool {
        self.preload_drop
            || (!self.preload.is_empty() && self.preload_stores.contains(&Store::Postgres))
            || (self.steady > 0 && self.steady_stores.contains(&Store::Postgres))
    }
}

pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn gib(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// A store the runs of one size load, and what is known of its content.
struct Sized {
    size: u64,
    store: Store,
    /// idemgate's `store.url`.
    url: String,
    /// Records first seen before this (ms) are the preloaded ones; 0 for the
    /// empty store.
    loaded_at: i64,
    sqlite: Option<std::path::PathBuf>,
    /// Schema-qualified table (`schema.records`).
    pg_table: Option<String>,
}

/// What a store holds now.
struct Content {
    records: u64,
    /// Bytes on disk: SQLite db + wal, PostgreSQL `pg_total_relation_size`.
    bytes: u64,
    detail: String,
    /// `min(expires_at)`, ms (None: no record).
    oldest_expiry: Option<i64>,
}

impl Sized {
    /// Records, size and oldest expiry; the records are counted as the
    /// preloaded count plus those first seen since the preload (an index
    /// range), so a 20M store is not scanned after each run.
    fn content(&self, s: &crate::settings::Settings) -> Content {
        match (&self.sqlite, &self.pg_table) {
            (Some(db), _) => {
                let c = rusqlite::Connection::open_with_flags(
                    db,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                )
                .expect("the store opens");
                let added: i64 = c
                    .query_row(
                        "SELECT count(*) FROM records WHERE first_seen_at >= ?1",
                        [self.loaded_at],
                        |r| r.get(0),
                    )
                    .unwrap_or(-1);
                let oldest: Option<i64> = c
                    .query_row("SELECT min(expires_at) FROM records", [], |r| r.get(0))
                    .unwrap_or(None);
                let wal = db.with_extension("db-wal");
                let (d, w) = (file_len(db), file_len(&wal));
                Content {
                    records: self.size + added.max(0) as u64,
                    bytes: d + w,
                    detail: format!("db {} + wal {}", gib(d), gib(w)),
                    oldest_expiry: oldest,
                }
            }
            (None, Some(t)) => {
                let row = pg_exec(
                    &s.pg_url,
                    &format!(
                        "SELECT concat_ws(' ', (SELECT count(*) FROM {t} WHERE first_seen_at >= {}), \
                         pg_total_relation_size('{t}'), pg_indexes_size('{t}'), \
                         coalesce((SELECT min(expires_at) FROM {t}), -1))",
                        self.loaded_at
                    ),
                )
                .ok()
                .and_then(|v| v.into_iter().next())
                .unwrap_or_default();
                let f: Vec<i64> = row
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
                let g = |i: usize| f.get(i).copied().unwrap_or(0);
                Content {
                    records: self.size + g(0).max(0) as u64,
                    bytes: g(1) as u64,
                    detail: format!(
                        "table+indexes {} (indexes {})",
                        gib(g(1) as u64),
                        gib(g(2) as u64)
                    ),
                    oldest_expiry: (g(3) >= 0 && !f.is_empty()).then(|| g(3)),
                }
            }
            _ => unreachable!("a store is SQLite or PostgreSQL"),
        }
    }
}

/// An empty store of this run: a fresh SQLite file in the run dir or a
/// schema of its own (dropped at the end).
fn fresh_store(
    s: &crate::settings::Settings,
    w: &World,
    store: Store,
    word: &str,
) -> Result<Sized, String> {
    let (url, sqlite, pg_table) = match store {
        Store::Sqlite => {
            let db = w.dir.join(format!("claims-{word}.db"));
            (format!("sqlite://{}", db.display()), Some(db), None)
        }
        Store::Postgres => {
            let schema = format!("load_{}_{word}", std::process::id());
            let url = pg_run_schema(s, &schema)?;
            (url, None, Some(format!("{schema}.records")))
        }
    };
    Ok(Sized {
        size: 0,
        store,
        url,
        loaded_at: 0,
        sqlite,
        pg_table,
    })
}

/// The harness's world, with `g` as the idemgate of `store`.
fn world_with(w: &World, g: Idemgate, store: Store) -> World {
    World {
        dir: w.dir.clone(),
        upstream: w.upstream,
        proxy: None,
        sqlite: if store == Store::Sqlite { g } else { w.sqlite },
        pg: (store == Store::Postgres).then_some(g),
        tck: w.tck,
        ncpu: w.ncpu,
    }
}

fn start_on(
    s: &crate::settings::Settings,
    w: &World,
    logs: &Path,
    name: String,
    st: &Sized,
    extra: &Extra,
) -> Idemgate {
    let name: &'static str = Box::leak(name.into_boxed_str());
    start_idemgate(
        &w.dir,
        logs,
        name,
        s,
        &st.url,
        w.upstream.addr,
        &["unique"],
        extra,
    )
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

/// What a scale section runs with: the settings, the running world, the
/// log directory, the report it writes to and the run counter.
pub(crate) struct Section<'a> {
    pub s: &'a crate::settings::Settings,
    pub w: &'a World,
    pub logs: &'a Path,
    pub rep: &'a mut Report,
    pub serial: &'a mut usize,
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

/// The directory of the cached preloaded SQLite stores.
fn stores_dir() -> std::path::PathBuf {
    target_dir().join("load-stores")
}
