//! The load harness (issue 7): idemgate against itself and against nginx, in
//! one run, with a real load generator.
//!
//! ```sh
//! cargo bench --bench load                 # full: 10 s runs, 3 rounds (~8 min)
//! LOAD_QUICK=1 cargo bench --bench load    # try it out: 3 s runs, 1 round (~1 min)
//! ```
//!
//! It starts, all on loopback and under `target/tmp/load-PID/`:
//! - an nginx upstream answering `200 ok` to everything (1 worker);
//! - an nginx reverse proxy over that upstream (the external reference);
//! - idemgate (the release binary of this package) with the SQLite store and
//!   the routes `/pass` (unguarded, `guard_methods: []`), `/unique`,
//!   `/replay` and `/conflict`;
//! - a second idemgate with the PostgreSQL store (a schema of its own, dropped
//!   at the end) and the route `/unique`, since one config has one store;
//! - for (o), (m) and (w) only, a live OTLP collector (rotel) and three
//!   SQLite idemgates of their own, alike but for their `telemetry`; for
//!   (v) only, a private Valkey cluster (`valkey.rs`) and an idemgate on it;
//!
//! then drives them with wrk (a generated Lua script: 1 KiB JSON bodies, a
//! per-request `X-Event-ID`) through these scenarios, alternating them in
//! rounds and at each connection count:
//!
//! | key | scenario |
//! |-----|----------|
//! | u | wrk straight at the upstream: the ceiling of client + upstream |
//! | n | nginx reverse proxy (reference) |
//! | a | idemgate, unguarded route (pass-through) |
//! | b | idemgate, unique events, SQLite (WAL, synchronous=FULL) |
//! | c | idemgate, duplicates of one delivered event (replay path) |
//! | d | idemgate, unique events, PostgreSQL (synchronous_commit as the server has it) |
//! | e | idemgate, SQLite, groups of 64 consecutive requests share a fresh event ID (conflict path) |
//! | r | as (b), but each event ID is a random 32-hex string (LuaJIT's `math.random`, seeded per run and thread) |
//! | p | as (d), with random 32-hex event IDs |
//! | t | as (r), but each ID begins with the time: 12 hex of Unix milliseconds, then 20 random hex (the order of UUIDv7, ULID, KSUID) |
//! | q | as (p), with (t)'s time-ordered IDs |
//! | l | as (b), on a route with `allow_from: file:` of 5,000 ranges (loopback the last) |
//! | h | as (b), on a route that keeps `replay_headers: [Location, ETag]` |
//! | x | as (b), on a route with `on_ambiguous: hold` and `reconcile` (nothing ambiguous: what it costs the others) |
//! | o | as (b), in a process of its own traced to a live collector at `sample: 1.0` |
//! | m | as (o), at `sample: 0.01` |
//! | w | as (o), without a `telemetry` block: (o) and (m)'s baseline |
//! | v | as (b), in a process of its own on a private Valkey 9 cluster: 3 primaries, 3 replicas, `appendfsync always`, `durability: fsynced` |
//!
//! For every run it prints req/s, p50, p99, the ratio to (a) of the same round
//! and connection count, CPU µs per request of the process under test, the
//! upstream, wrk, the store's servers (PostgreSQL's or (v)'s valkey-server
//! processes) and the rest of the machine (from /proc), and the outcome mix
//! from idemgate's own `/metrics` (so a scenario that did not do what it says
//! is flagged). At the end: medians per scenario, the issue-7 targets at the
//! highest connection count, and idemgate's resident memory. The report is
//! also written to `target/load-report.txt`.
//!
//! Settings (environment):
//! - `LOAD_QUICK=1`: 3 s runs, 1 round, 1 s warm-up.
//! - `LOAD_DURATION` (seconds per run, default 10), `LOAD_REPEATS` (rounds,
//!   default 3), `LOAD_WARMUP` (seconds per scenario before round 1, default 2).
//! - `LOAD_CONNS` (default `16,64`), `LOAD_SCENARIOS` (default `u,n,a,b,c,d,e`).
//! - `LOAD_WRK_THREADS` (default 1: on 2 cores every client cycle is taken
//!   from the proxy; scenario u shows whether the client keeps up).
//! - `LOAD_THREADS`: idemgate's `threads:` (default: unset, idemgate decides).
//! - `LOAD_NGINX_WORKERS`: the reference proxy's `worker_processes` (default `auto`).
//! - `LOAD_PG_URL` (else `IDEMGATE_TEST_PG_URL`, else
//!   `postgres://postgres@127.0.0.1:5432/test`); unreachable → (d) skipped.
//! - `LOAD_RUST_LOG`: idemgate's `RUST_LOG` (default `info`, as shipped).
//! - `LOAD_PERF=b,a`: after the rounds, one extra run of each of those
//!   scenarios at the highest connection count under `perf record` (kept out
//!   of the figures); the data goes to `target/load-perf-KEY.data` and a
//!   summary is printed.
//!   `LOAD_PERF_CALLGRAPH=1` adds kernel call chains (`-g`; slows the run a lot).
//! - `LOAD_SYSCALLS=a,c`: likewise under `perf trace -s`: syscalls per request
//!   of the process under test (`target/load-syscalls-KEY.txt`).
//! - `LOAD_KEEP=1`: keep `target/tmp/load-PID/` (configs, logs, scripts).
//! - `LOAD_LOGS_ON_DISK=1`: write idemgate's logs into the run dir, beside
//!   the SQLite file, instead of `/dev/shm/idemgate-load-PID/` (see
//!   [`log_dir`]).
//! - `LOAD_ATTACK=10000`: after the rounds, the "under attack" scenario
//!   (issue 19): (b) at the highest connection count without, then with that
//!   many attack connections held (a third each idle kept-alive, dribbled
//!   heads, dribbled bodies; see `attack/`), reporting delivered/s and
//!   p99 of both, idemgate's peak RSS and open descriptors, when every attack
//!   connection was closed, and the store afterwards (no record left
//!   `processing`, every answered delivery `delivered`). idemgate then runs
//!   with `downstream` limits of header 5 s, body 8 s, keep-alive 10 s and
//!   `max_connections` attack + 2,000; give runs of 20 s or more
//!   (`LOAD_DURATION`) so that every kind meets its timeout.
//! - `LOAD_BIN=/path/to/idemgate`: load another build (say, a baseline built
//!   from an older commit) instead of this package's release binary.
//!
//! Issue 24 (cost that does not grow with the store; `scale/`). Either
//! setting below runs its section after the rounds, and then the rounds run
//! only the scenarios `LOAD_SCENARIOS` names (default: none).
//! - `LOAD_PRELOAD=0,5000000,20000000` (`5M`, `200k` also read): (r) and (p)
//!   against stores preloaded with that many delivered records (0, the empty
//!   store, is always added), one idemgate per store and size, interleaved in
//!   `LOAD_REPEATS` rounds at each `LOAD_CONNS`; per run req/s, p50, p99,
//!   their ratios to the empty store of the same round, the records and the
//!   store's size (SQLite db + wal; PostgreSQL `pg_total_relation_size` and
//!   `pg_indexes_size`); then medians and issue 24's targets. The preloaded
//!   stores are built once (how, and how long it took, is printed; see
//!   `scale/preload.rs`) and cached: `target/load-stores/sqlite-N.db`
//!   and the schema `load_preload_N`, each with a marker (count, a hash of
//!   `migrations/`, preload time); a schema change or a week's age rebuilds
//!   them. Records added by earlier runs are deleted before the runs.
//!   `LOAD_PRELOAD_STORES` (default `sqlite,postgres`) picks the stores.
//! - `LOAD_SCALE_IDS=time`: both sections load (t) and (q), time-ordered
//!   IDs, instead of (r) and (p) (`random`, the default).
//! - `LOAD_PRELOAD_DROP=1`: first remove the cached stores (files and
//!   `load_preload_*` schemas).
//! - `LOAD_STEADY=300`: a steady state of that many seconds: a fresh store, an
//!   idemgate with `retention` `LOAD_STEADY_RETENTION` (default 60) s and
//!   `sweeper.interval` `LOAD_STEADY_SWEEP` (default 30) s, loaded at a fixed
//!   claim rate of random-ID unique deliveries at the highest `LOAD_CONNS`
//!   (`LOAD_STEADY_RATE` req/s, else `LOAD_STEADY_SHARE`, default 0.6, of a
//!   5 s flat-out run on the harness's own idemgate; paced by a `delay()` in
//!   the wrk script), in back-to-back `LOAD_STEADY_SEGMENT` (default 10) s
//!   segments. Per segment: req/s kept, p50, p99, records, store size,
//!   sweeper lag (age of the oldest record past its `expires_at`), whether
//!   a sweep ran, records swept and sweep time (from `/metrics`), sweeps that
//!   failed (`sweeper failed` lines in idemgate's log). At the end:
//!   table size and records after the first retention + sweeper interval vs
//!   at the end (flat within ±10 %?), p99 of segments in which the sweeper
//!   deleted records vs the others, whether the sweeper kept up (max lag).
//!   `LOAD_STEADY_STORES` (default `sqlite`;
//!   `sqlite,postgres`) picks the stores.
//!
//! Issue 42 (protecting the consumer; `storm.rs`):
//! - `LOAD_STORM=20000`: after the rounds (then by default none), the retry
//!   storm: a consumer of fixed capacity (8 at once, 200/s, past that 500
//!   after 200 ms) and that many events from senders retrying with backoff,
//!   through an idemgate without limits, then one with `upstream_concurrency`
//!   and `upstream_rate` at the consumer's capacity; per run the requests
//!   that reached the consumer, its errors, idemgate's 503s, the time until
//!   every event was delivered, duplicate side effects.
//!
//! Everything it starts runs in its own process group with a parent-death
//! signal, and is stopped at the end, on a panic, and on Ctrl-C/SIGTERM.

use std::path::{Path, PathBuf};

use attack::run::under_attack;
use cleanup::{cleanup, remove_stale, watch_signals, CleanupGuard};
use processes::{fs_type, lock, LOG_DIR_PREFIX, SHM};
use report::{machine_line, run_header, run_line, summarise, Report};
use runs::{probed_runs, rounds, sanity_check, warm_up};
use scenarios::{scenario, Target};
use servers::{start_world, tool};
use settings::Settings;
use world::{target_dir, Run, World, LEFTOVERS};

mod attack;
mod cleanup;
mod pg;
mod probe;
mod processes;
mod procfs;
mod report;
mod runs;
mod scale;
mod scenarios;
mod servers;
mod settings;
mod storm;
mod valkey;
mod world;
mod wrk;

fn main() {
    let s = Settings::from_env();
    let _guard = CleanupGuard;
    watch_signals();
    tool("wrk");
    tool("nginx");
    let mut rep = Report(String::new());
    for l in machine_line(&s) {
        rep.line(l);
    }

    let uses_pg = s
        .scenarios
        .iter()
        .any(|&k| scenario(k).target == Target::IdemPg);
    remove_stale((uses_pg || s.scale.uses_pg()).then_some(s.pg_url.as_str()));
    // The steady state's flat-out probe runs on the harness's own idemgate.
    let uses_pg = uses_pg || s.scale.uses_pg();
    if s.scale.preload_drop {
        scale::drop_cached(&s, &mut rep);
    }
    let (dir, logs) = run_dirs(&s, &mut rep);
    let w = start_world(&s, dir, &logs, uses_pg, &mut rep);
    let keys: Vec<char> = s
        .scenarios
        .iter()
        .copied()
        .filter(|&k| w.addr(scenario(k).target).is_some())
        .collect();

    sanity_check(&w, &keys);

    let top = *s.conns.iter().max().unwrap();
    let mut serial = 0;
    if !keys.is_empty() {
        warm_up(&s, &w, &keys, top, &mut serial, &mut rep);
    }
    let runs = rounds(&s, &w, &keys, &mut serial);
    probed_runs(&s, &w, &keys, &runs, top, &mut serial);

    if s.attack > 0 {
        under_attack(&s, &w, &mut rep, &mut serial, top);
    }
    if s.storm > 0 {
        storm::storm(&s, &w.dir, &mut rep);
    }
    // a fn, not a closure: a closure's inferred signature ties every
    // call's borrows to one lifetime, and the second call did not compile
    fn section<'a>(
        s: &'a Settings,
        w: &'a World,
        logs: &'a std::path::Path,
        rep: &'a mut Report,
        serial: &'a mut usize,
    ) -> scale::Section<'a> {
        scale::Section {
            s,
            w,
            logs,
            rep,
            serial,
        }
    }
    if !s.scale.preload.is_empty() {
        scale::store_sizes(section(&s, &w, &logs, &mut rep, &mut serial));
    }
    if s.scale.steady > 0 {
        scale::steady(section(&s, &w, &logs, &mut rep, &mut serial));
    }

    final_report(&mut rep, &s, &runs, &w, &logs);
    if s.keep {
        println!("run dir kept: {}", w.dir.display());
        if logs != w.dir {
            println!("log dir kept: {}", logs.display());
        }
    }
    cleanup();
}

/// Makes the run dir and the log dir ([`log_dir`]), registers them for
/// removal unless kept, and reports where they are.
fn run_dirs(s: &Settings, rep: &mut Report) -> (PathBuf, PathBuf) {
    // A run dir on the same disk as a real deployment's SQLite file.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("load-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("run dir");
    let logs = log_dir(s, &dir);
    std::fs::create_dir_all(&logs).expect("log dir");
    if !s.keep {
        let mut left = lock(&LEFTOVERS);
        left.dirs.push(dir.clone());
        if logs != dir {
            left.dirs.push(logs.clone());
        }
    }
    let fs = fs_type(&dir);
    rep.line(format!(
        "run dir {} ({fs}){}",
        dir.display(),
        if fs == "tmpfs" {
            " — WARNING: tmpfs, SQLite's fsync costs nothing here"
        } else {
            ""
        }
    ));
    rep.line(if logs == dir {
        "idemgate's logs: in the run dir, on the database's disk (their writeback can queue (b)'s fsyncs)".to_string()
    } else {
        format!("idemgate's logs: {} (tmpfs, off the database's disk; LOAD_LOGS_ON_DISK=1 puts them beside it)", logs.display())
    });
    (dir, logs)
}

/// The full table again, the medians and targets, the logs' sizes; the
/// report's file.
fn final_report(rep: &mut Report, s: &Settings, runs: &[Run], w: &World, logs: &Path) {
    if !runs.is_empty() {
        // The full table again, with every ratio known.
        rep.line("");
        rep.line("all runs (x(a) = ratio to (a) of the same round and connections):");
        rep.line(run_header());
        for r in runs {
            rep.line(run_line(runs, r));
        }
        summarise(rep, s, runs, w);
    }
    for name in ["idemgate-sqlite", "idemgate-postgres", "idemgate-valkey"] {
        if let Ok(m) = std::fs::metadata(logs.join(format!("{name}.log"))) {
            rep.line(format!(
                "  {name} log: {:.0} MiB written in the run",
                m.len() as f64 / (1024.0 * 1024.0)
            ));
        }
    }

    let path = target_dir().join("load-report.txt");
    if std::fs::write(&path, &rep.0).is_ok() {
        println!("\nreport written to {}", path.display());
    }
}

/// Where idemgate's logs go: on tmpfs, away from the SQLite file, unless
/// `LOAD_LOGS_ON_DISK` or there is no tmpfs. At info level idemgate writes a
/// line per guarded request, 20+ MB/s under (c) and (e); written beside the
/// database, those pages reach the disk in the kernel's writeback, whenever
/// it comes, and an (b) run that meets it has its fsyncs queued behind
/// hundreds of MB: p99 20–90 ms instead of 5. That measures the machine's
/// writeback, not idemgate; a deployment keeps a busy log off the store's
/// disk too (a collector over a pipe or the network, or another disk).
fn log_dir(s: &Settings, run_dir: &Path) -> PathBuf {
    if s.logs_on_disk || fs_type(Path::new(SHM)) != "tmpfs" {
        return run_dir.to_path_buf();
    }
    Path::new(SHM).join(format!("{LOG_DIR_PREFIX}{}", std::process::id()))
}
