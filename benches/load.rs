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
//!
//! For every run it prints req/s, p50, p99, the ratio to (a) of the same round
//! and connection count, CPU µs per request of the process under test, the
//! upstream, wrk and the rest of the machine (from /proc), and the outcome mix
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
//!   heads, dribbled bodies; see `load_attack/`), reporting delivered/s and
//!   p99 of both, idemgate's peak RSS and open descriptors, when every attack
//!   connection was closed, and the store afterwards (no record left
//!   `processing`, every answered delivery `delivered`). idemgate then runs
//!   with `downstream` limits of header 5 s, body 8 s, keep-alive 10 s and
//!   `max_connections` attack + 2,000; give runs of 20 s or more
//!   (`LOAD_DURATION`) so that every kind meets its timeout.
//! - `LOAD_BIN=/path/to/idemgate`: load another build (say, a baseline built
//!   from an older commit) instead of this package's release binary.
//!
//! Issue 24 (cost that does not grow with the store; `load_scale/`). Either
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
//!   `load_scale/preload.rs`) and cached: `target/load-stores/sqlite-N.db`
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
//! Everything it starts runs in its own process group with a parent-death
//! signal, and is stopped at the end, on a panic, and on Ctrl-C/SIGTERM.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use attack::run::under_attack;
use probe::{report_probe, start_probe, stop_probe, Probe};

#[path = "load_attack/mod.rs"]
mod attack;
#[path = "load_probe/mod.rs"]
mod probe;
#[path = "load_scale/mod.rs"]
mod scale;

// ---------------------------------------------------------------- settings

struct Settings {
    duration: u64,
    repeats: usize,
    warmup: u64,
    conns: Vec<usize>,
    scenarios: Vec<char>,
    wrk_threads: usize,
    idemgate_threads: Option<usize>,
    nginx_workers: String,
    pg_url: String,
    rust_log: String,
    perf: Vec<char>,
    perf_callgraph: bool,
    syscalls: Vec<char>,
    keep: bool,
    logs_on_disk: bool,
    bin: String,
    attack: usize,
    /// The store-size and steady-state sections (issue 24).
    scale: scale::Settings,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not valid")),
        _ => default,
    }
}

fn env_list(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

impl Settings {
    fn from_env() -> Settings {
        let quick = env_or("LOAD_QUICK", 0u8) != 0;
        let conns: Vec<usize> = env_list("LOAD_CONNS", "16,64")
            .split(',')
            .map(|s| s.trim().parse().expect("LOAD_CONNS: numbers"))
            .collect();
        let keys = |s: String| -> Vec<char> {
            s.split(',')
                .filter_map(|k| k.trim().chars().next())
                .map(|k| k.to_ascii_lowercase())
                .collect()
        };
        let scale = scale::Settings::from_env();
        // With a section of issue 24 asked for, the rounds run only if asked for too.
        let default_scenarios = if scale.any() { "" } else { "u,n,a,b,c,d,e" };
        let scenarios = keys(env_list("LOAD_SCENARIOS", default_scenarios));
        for k in &scenarios {
            assert!(
                SCENARIOS.iter().any(|s| s.key == *k),
                "unknown scenario {k}"
            );
        }
        let wrk_threads = env_or("LOAD_WRK_THREADS", 1usize).max(1);
        assert!(
            conns.iter().all(|&c| c >= wrk_threads),
            "every LOAD_CONNS must be >= LOAD_WRK_THREADS"
        );
        Settings {
            duration: env_or("LOAD_DURATION", if quick { 3 } else { 10 }),
            repeats: env_or("LOAD_REPEATS", if quick { 1 } else { 3 }).max(1),
            warmup: env_or("LOAD_WARMUP", if quick { 1 } else { 2 }),
            conns,
            scenarios,
            wrk_threads,
            idemgate_threads: std::env::var("LOAD_THREADS")
                .ok()
                .map(|v| v.parse().expect("LOAD_THREADS: a number")),
            nginx_workers: env_list("LOAD_NGINX_WORKERS", "auto"),
            pg_url: std::env::var("LOAD_PG_URL")
                .or_else(|_| std::env::var("IDEMGATE_TEST_PG_URL"))
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
            rust_log: env_list("LOAD_RUST_LOG", "info"),
            perf: keys(env_list("LOAD_PERF", "")),
            perf_callgraph: env_or("LOAD_PERF_CALLGRAPH", 0u8) != 0,
            syscalls: keys(env_list("LOAD_SYSCALLS", "")),
            keep: env_or("LOAD_KEEP", 0u8) != 0,
            logs_on_disk: env_or("LOAD_LOGS_ON_DISK", 0u8) != 0,
            bin: env_list("LOAD_BIN", env!("CARGO_BIN_EXE_idemgate")),
            attack: env_or("LOAD_ATTACK", 0usize),
            scale,
        }
    }
}

// --------------------------------------------------------------- scenarios

/// Which server a scenario loads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    Upstream,
    NginxProxy,
    IdemSqlite,
    IdemPg,
}

/// How the event IDs of a run are made.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ids {
    /// A fresh ID per request.
    Unique,
    /// The same, already delivered, ID for every request.
    Same,
    /// 64 consecutive requests of a wrk thread share a fresh ID.
    Group64,
    /// A fresh random 32-hex ID per request (as most senders' IDs are).
    Random,
    /// A fresh 32-hex ID per request that begins with the wall clock's
    /// milliseconds, as UUIDv7, ULID and KSUID do: each claim's key lands
    /// beside the last one's in the key index.
    TimeOrdered,
}

struct Scenario {
    key: char,
    name: &'static str,
    target: Target,
    path: &'static str,
    ids: Ids,
    /// The idemgate route whose `/metrics` counters this run should move.
    route: Option<&'static str>,
}

const SCENARIOS: [Scenario; 11] = [
    Scenario {
        key: 'u',
        name: "upstream direct (ceiling)",
        target: Target::Upstream,
        path: "/pass",
        ids: Ids::Unique,
        route: None,
    },
    Scenario {
        key: 'n',
        name: "nginx reverse proxy",
        target: Target::NginxProxy,
        path: "/pass",
        ids: Ids::Unique,
        route: None,
    },
    Scenario {
        key: 'a',
        name: "unguarded pass-through",
        target: Target::IdemSqlite,
        path: "/pass",
        ids: Ids::Unique,
        route: Some("pass"),
    },
    Scenario {
        key: 'b',
        name: "unique events, SQLite",
        target: Target::IdemSqlite,
        path: "/unique",
        ids: Ids::Unique,
        route: Some("unique"),
    },
    Scenario {
        key: 'c',
        name: "replay of a delivered event",
        target: Target::IdemSqlite,
        path: "/replay",
        ids: Ids::Same,
        route: Some("replay"),
    },
    Scenario {
        key: 'd',
        name: "unique events, PostgreSQL",
        target: Target::IdemPg,
        path: "/unique",
        ids: Ids::Unique,
        route: Some("unique"),
    },
    Scenario {
        key: 'e',
        name: "64-way duplicates, fresh IDs",
        target: Target::IdemSqlite,
        path: "/conflict",
        ids: Ids::Group64,
        route: Some("conflict"),
    },
    Scenario {
        key: 'r',
        name: "unique random IDs, SQLite",
        target: Target::IdemSqlite,
        path: "/unique",
        ids: Ids::Random,
        route: Some("unique"),
    },
    Scenario {
        key: 'p',
        name: "unique random IDs, PostgreSQL",
        target: Target::IdemPg,
        path: "/unique",
        ids: Ids::Random,
        route: Some("unique"),
    },
    Scenario {
        key: 't',
        name: "unique time-ordered IDs, SQLite",
        target: Target::IdemSqlite,
        path: "/unique",
        ids: Ids::TimeOrdered,
        route: Some("unique"),
    },
    Scenario {
        key: 'q',
        name: "unique time-ordered IDs, PostgreSQL",
        target: Target::IdemPg,
        path: "/unique",
        ids: Ids::TimeOrdered,
        route: Some("unique"),
    },
];

fn scenario(key: char) -> &'static Scenario {
    SCENARIOS.iter().find(|s| s.key == key).expect("known key")
}

// ------------------------------------------------- processes and cleanup

/// Every process the harness started, stopped by [`cleanup`].
static CHILDREN: Mutex<Vec<(String, Child)>> = Mutex::new(Vec::new());
/// Things to remove at the end: the run and log dirs (unless kept) and the
/// PG schemas of this run (not the cached preloaded ones).
static LEFTOVERS: Mutex<Leftovers> = Mutex::new(Leftovers {
    dirs: Vec::new(),
    pg: Vec::new(),
});

struct Leftovers {
    /// The run dir and, when apart from it, the log dir.
    dirs: Vec<PathBuf>,
    /// (server URL, schema)
    pg: Vec<(String, String)>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A command that cannot outlive the harness: its own process group (so a
/// terminal's Ctrl-C reaches the harness alone, which then stops it in
/// order) and SIGTERM when the harness dies, however it dies.
fn command(program: &str) -> Command {
    let mut c = Command::new(program);
    c.stdin(Stdio::null()).process_group(0);
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        c.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    c
}

/// Starts a long-lived process and registers it for cleanup.
fn spawn(name: &str, mut cmd: Command) -> u32 {
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    let pid = child.id();
    lock(&CHILDREN).push((name.to_string(), child));
    pid
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: plain kill(2) on a pid we started and have not reaped.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Stops every registered process (SIGTERM, then SIGKILL after 5 s) and
/// removes what the run left behind. Idempotent.
fn cleanup() {
    let children: Vec<(String, Child)> = lock(&CHILDREN).drain(..).collect();
    for (_, c) in &children {
        signal(c.id(), libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for (name, mut c) in children {
        loop {
            match c.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    eprintln!("load: {name} ignored SIGTERM; killing it");
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
            }
        }
    }
    let mut left = lock(&LEFTOVERS);
    for (base, schema) in left.pg.drain(..) {
        let _ = pg_exec(&base, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
    }
    for dir in left.dirs.drain(..) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Runs [`cleanup`] when `main` returns or unwinds.
struct CleanupGuard;

impl Drop for CleanupGuard {
    fn drop(&mut self) {
        cleanup();
    }
}

/// Ctrl-C, SIGTERM or SIGHUP: stop everything, then exit 130.
fn watch_signals() {
    std::thread::spawn(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("signal runtime");
        rt.block_on(async {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
            let mut hup = signal(SignalKind::hangup()).expect("SIGHUP handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
                _ = hup.recv() => {}
            }
        });
        eprintln!("\nload: interrupted; stopping everything it started");
        cleanup();
        std::process::exit(130);
    });
}

// -------------------------------------------------------------- /proc

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// (ppid, utime + stime in ticks) of a process.
fn proc_stat(pid: u32) -> Option<(u32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: state(3) ppid(4) … utime(14) stime(15), 1-based in stat.
    Some((
        f[1].parse().ok()?,
        f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?,
    ))
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// CPU ticks of a process and its direct children (nginx's workers).
fn tree_ticks(pid: u32) -> u64 {
    let mut total = proc_stat(pid).map_or(0, |(_, t)| t);
    for p in all_pids() {
        if let Some((ppid, t)) = proc_stat(p) {
            if ppid == pid {
                total += t;
            }
        }
    }
    total
}

/// CPU ticks of every `postgres` process on the machine (not only ours).
fn postgres_ticks() -> u64 {
    all_pids()
        .into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "postgres")
        })
        .filter_map(|p| proc_stat(p).map(|(_, t)| t))
        .sum()
}

/// Busy ticks of the whole machine (all CPUs), from /proc/stat.
fn machine_busy_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = s.lines().next().unwrap_or("");
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    get(0) + get(1) + get(2) + get(5) + get(6) + get(7)
}

/// CPU time of reaped children (wrk), in µs.
fn children_cpu_us() -> f64 {
    // SAFETY: getrusage writes into the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// What a process read and wrote (`/proc/PID/io`): `rchar` counts the
/// bytes of its `read`/`pread` calls (a store's page-cache misses; sockets
/// are read with `recv`, which it does not count), `write_bytes` what it
/// sent toward the disk. Counted, not timed: an A/B of a store's layout
/// shows in them where its throughput is lost in this VM's variance.
#[derive(Clone, Copy, Debug)]
struct ProcIo {
    read_bytes: u64,
    written_bytes: u64,
}

/// [`ProcIo`] over a run, per request.
#[derive(Clone, Copy, Debug)]
struct IoPerRequest {
    read_kib: f64,
    written_kib: f64,
}

fn proc_io(pid: u32) -> Option<ProcIo> {
    Some(ProcIo {
        read_bytes: testkit::proc_number(pid, "io", "rchar:")?,
        written_bytes: testkit::proc_number(pid, "io", "write_bytes:")?,
    })
}

/// `VmRSS` and `VmHWM` (peak) in MiB.
fn rss_mib(pid: u32) -> Option<(f64, f64)> {
    let mib = |key: &str| testkit::memory_kib(pid, key).map(|kib| kib as f64 / 1024.0);
    Some((mib("VmRSS:")?, mib("VmHWM:")?))
}

// ------------------------------------------------------------ the servers

/// A tool's path: on PATH, or in the sbin directories (nginx lives in /usr/sbin).
fn tool(name: &str) -> String {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    if on_path {
        return name.to_string();
    }
    ["/usr/sbin", "/usr/local/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| panic!("{name} is not installed (apt-get install -y {name})"))
}

fn free_port() -> u16 {
    testkit::free_port().expect("a free loopback port")
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("{what} did not become ready within {timeout:?}");
}

#[derive(Clone, Copy)]
struct Nginx {
    pid: u32,
    addr: SocketAddr,
}

/// An nginx in the foreground (`daemon off`), everything under `dir`.
fn start_nginx(dir: &Path, name: &str, workers: &str, server_block: &str) -> Nginx {
    let port = free_port();
    let prefix = dir.join(name);
    std::fs::create_dir_all(&prefix).unwrap();
    let p = prefix.display();
    let conf = format!(
        "daemon off;\nmaster_process on;\nworker_processes {workers};\npid {p}/nginx.pid;\n\
         error_log {p}/error.log warn;\nevents {{ worker_connections 4096; }}\nhttp {{\n\
         access_log off;\nclient_body_temp_path {p}/body;\nproxy_temp_path {p}/proxy;\n\
         fastcgi_temp_path {p}/fastcgi;\nuwsgi_temp_path {p}/uwsgi;\nscgi_temp_path {p}/scgi;\n\
         keepalive_requests 100000000;\nkeepalive_timeout 300s;\nclient_body_buffer_size 64k;\n\
         {}\n}}\n",
        server_block.replace("PORT", &port.to_string())
    );
    let conf_path = prefix.join("nginx.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let mut cmd = command(&tool("nginx"));
    cmd.arg("-p")
        .arg(&prefix)
        .arg("-e")
        .arg(prefix.join("error.log"))
        .arg("-c")
        .arg(&conf_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let pid = spawn(name, cmd);
    let addr = loopback(port);
    wait_until(name, Duration::from_secs(10), || {
        testkit::get(addr, "/pass").is_ok_and(|r| r.status == 200)
    });
    Nginx { pid, addr }
}

/// The attack run's header, body and keep-alive timeouts, in seconds.
const ATTACK_TIMEOUTS: (u64, u64, u64) = (5, 8, 10);

#[derive(Clone, Copy)]
struct Idemgate {
    name: &'static str,
    pid: u32,
    addr: SocketAddr,
    admin: SocketAddr,
}

#[allow(clippy::too_many_arguments)] // a bench's plain plumbing
fn start_idemgate(
    dir: &Path,
    logs: &Path,
    name: &'static str,
    s: &Settings,
    store_url: &str,
    upstream: SocketAddr,
    routes: &[&str],
    extra: &Extra,
) -> Idemgate {
    let (port, admin) = (free_port(), free_port());
    let mut cfg = format!(
        "listen: \"127.0.0.1:{port}\"\nadmin_listen: \"127.0.0.1:{admin}\"\nshutdown_grace: 2s\n"
    );
    if let Some(t) = s.idemgate_threads {
        writeln!(cfg, "threads: {t}").unwrap();
    }
    cfg.push_str(&extra.top);
    if s.attack > 0 {
        let (h, b, k) = ATTACK_TIMEOUTS;
        write!(
            cfg,
            "downstream:\n  header_timeout: {h}s\n  body_timeout: {b}s\n  keepalive_timeout: {k}s\n  max_connections: {}\n",
            s.attack + 2000
        )
        .unwrap();
    }
    write!(
        cfg,
        "store:\n  url: \"{store_url}\"\n  max_connections: 16\n\
         defaults:\n  lease: 30s\n  upstream_timeout: 10s\n{}routes:\n",
        extra.defaults
    )
    .unwrap();
    for r in routes {
        // `pass` is the unguarded route; the others are guarded POST routes.
        let guard = if *r == "pass" {
            "    guard_methods: []\n"
        } else {
            ""
        };
        write!(
            cfg,
            "  - name: {r}\n    match:\n      path_prefix: /{r}\n    upstream: \"http://{upstream}\"\n\
             \x20   event_id:\n      header: X-Event-ID\n{guard}"
        )
        .unwrap();
    }
    let conf_path = dir.join(format!("{name}.yaml"));
    std::fs::write(&conf_path, cfg).unwrap();
    let log = std::fs::File::create(logs.join(format!("{name}.log"))).unwrap();
    let mut cmd = command(&s.bin);
    cmd.args(["serve", "--config"])
        .arg(&conf_path)
        .env("RUST_LOG", &s.rust_log)
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    let pid = spawn(name, cmd);
    let admin = loopback(admin);
    let ready = testkit::wait_ready(admin, "/readyz", Duration::from_secs(30));
    if !ready {
        let log = std::fs::read_to_string(logs.join(format!("{name}.log"))).unwrap_or_default();
        panic!("{name} did not become ready; its log:\n{log}");
    }
    Idemgate {
        name,
        pid,
        addr: loopback(port),
        admin,
    }
}

/// More of an idemgate's config: top-level keys and `defaults:` keys (each
/// line indented by two), e.g. the steady-state run's sweeper and retention.
#[derive(Default)]
struct Extra {
    top: String,
    defaults: String,
}

// ----------------------------------------------------------- PostgreSQL

/// Creates `schema` for this run (dropped at the end, or by the next run
/// after a SIGKILL: name it `load_PID` or `load_PID_WORD`); its store URL.
fn pg_run_schema(s: &Settings, schema: &str) -> Result<String, String> {
    pg_exec(&s.pg_url, &format!("CREATE SCHEMA {schema}"))?;
    lock(&LEFTOVERS)
        .pg
        .push((s.pg_url.clone(), schema.to_string()));
    Ok(pg_schema_url(&s.pg_url, schema))
}

/// The store URL of idemgate on `schema` of the PostgreSQL server at `base`.
fn pg_schema_url(base: &str, schema: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}options=-csearch_path%3D{schema}")
}

fn pg_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs one statement; the rows' first columns as text.
fn pg_exec(base: &str, sql: &str) -> Result<Vec<String>, String> {
    use sqlx::Row;
    pg_runtime().block_on(async {
        let pool = tokio::time::timeout(
            Duration::from_secs(3),
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(base),
        )
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
        let rows = sqlx::query(sql)
            .fetch_all(&pool)
            .await
            .map_err(|e| e.to_string())?;
        pool.close().await;
        Ok(rows
            .iter()
            .map(|r| r.try_get::<String, _>(0).unwrap_or_default())
            .collect())
    })
}

/// The server's WAL insert position in bytes: exact at once, where
/// `pg_stat_wal` lags by up to a backend's stats interval. Cluster-wide, so
/// another session's writes would count too, and `foreign` would not show
/// them (every postgres process's CPU counts as the harness's own).
fn pg_wal_position(base: &str) -> Option<u64> {
    pg_exec(
        base,
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint::text",
    )
    .ok()?
    .first()?
    .parse()
    .ok()
}

// ------------------------------------------------------------------ wrk

const ID_LEN: usize = 24; // PREFIX(8) - TT(2) - NNNNNNNNNNNN(12)
/// A random ID: 32 hex digits.
const RANDOM_ID_LEN: usize = 32;
const BODY_LEN: usize = 1024;

/// The webhook body around an event ID: Stripe-like JSON, exactly 1 KiB for
/// an ID of `id_len` bytes. wrk builds the same bytes in Lua.
fn body_parts(id_len: usize) -> (String, String) {
    let head = r#"{"id":""#.to_string();
    let mid = r#"","object":"event","api_version":"2024-06-20","created":1718000000,"livemode":false,"pending_webhooks":1,"type":"invoice.payment_succeeded","data":{"object":{"id":"in_1PqR5sLkdIwHu7ixQwErTyUi","object":"invoice","amount_due":4200,"amount_paid":4200,"attempt_count":1,"billing_reason":"subscription_cycle","currency":"eur","customer":"cus_QhJkLmNoPqRsTu","customer_email":"jane.doe@example.com","discount":null,"lines":{"object":"list","data":[{"id":"il_1PqR5sLkdIwHu7ixAsDfGhJk","amount":4200,"description":"1 x Pro plan (at 42.00 / month)","period":{"end":1720592000,"start":1718000000},"quantity":1}],"has_more":false},"paid":true,"status":"paid","total":4200}},"pad":""#;
    let end = r#""}"#;
    let pad = BODY_LEN - head.len() - id_len - mid.len() - end.len();
    let tail = format!("{mid}{}{end}", "x".repeat(pad));
    (head, tail)
}

fn event_id(prefix: &str, thread: u32, n: u64) -> String {
    let id = format!("{prefix}-{thread:02}-{n:012}");
    assert_eq!(id.len(), ID_LEN);
    id
}

fn body_for(id: &str) -> Vec<u8> {
    let (head, tail) = body_parts(id.len());
    let b = format!("{head}{id}{tail}").into_bytes();
    assert_eq!(b.len(), BODY_LEN);
    b
}

/// How a wrk run sends: as fast as it can, or paced.
#[derive(Clone, Copy, Default)]
struct Pace {
    /// Requests per second per wrk thread (`None`: closed loop, flat out).
    per_thread: Option<f64>,
}

/// A wrk script: POST `path` with a 1 KiB body and an `X-Event-ID` made per
/// request; `done` prints one machine-readable line. Random IDs come from
/// LuaJIT's `math.random`, seeded per thread from `seed`; time-ordered ones
/// put the wall clock's milliseconds before 20 of those hex digits. With a
/// pace, a `delay()` hands each request the next slot of its thread's fixed
/// schedule (the monotonic clock through LuaJIT's FFI), so the rate stays fixed
/// while connections are free, whatever the latency; a backlog of more than
/// a second is dropped rather than burst.
fn wrk_script(path: &str, ids: Ids, prefix: &str, seed: u64, pace: Pace) -> String {
    let (head, tail) = body_parts(match ids {
        Ids::Random | Ids::TimeOrdered => RANDOM_ID_LEN,
        Ids::Unique | Ids::Same | Ids::Group64 => ID_LEN,
    });
    let mode = match ids {
        Ids::Unique => "unique",
        Ids::Same => "same",
        Ids::Group64 => "group",
        Ids::Random => "random",
        Ids::TimeOrdered => "time",
    };
    let seed = seed % (1 << 40);
    // A clock through LuaJIT's FFI (1: monotonic, 0: the wall clock), for
    // the pace and for time-ordered IDs.
    let clock = if pace.per_thread.is_some() || ids == Ids::TimeOrdered {
        r#"
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } load_timespec;
int clock_gettime(int clk, load_timespec *tp);
]]
local ts = ffi.new("load_timespec")
local function now_ms(clk)
  ffi.C.clock_gettime(clk, ts)
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end
"#
    } else {
        ""
    };
    let pacing = match pace.per_thread {
        None => String::new(),
        Some(rate) => format!(
            r#"
local interval = 1000 / {rate}
local next_at = nil
delay = function()
  local now = now_ms(1)
  if next_at == nil or next_at < now - 1000 then next_at = now end
  next_at = next_at + interval
  local d = next_at - now
  if d < 0 then return 0 end
  return d
end
"#
        ),
    };
    format!(
        r#"-- generated by benches/load.rs
local path = "{path}"
local mode = "{mode}"
local prefix = "{prefix}"
local head = [==[{head}]==]
local tail = [==[{tail}]==]
local headers = {{ ["Content-Type"] = "application/json" }}
local counter = 0
local nthreads = 0
local rnd = math.random
{clock}{pacing}
setup = function(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
end

init = function(args)
  math.randomseed({seed} + (tid or 0) * 7919)
end

request = function()
  counter = counter + 1
  local t, n = tid or 0, counter
  if mode == "same" then t, n = 0, 0
  elseif mode == "group" then n = math.floor(counter / 64) end
  local id
  if mode == "random" then
    id = string.format("%04x%04x%04x%04x%04x%04x%04x%04x", rnd(0, 65535), rnd(0, 65535),
      rnd(0, 65535), rnd(0, 65535), rnd(0, 65535), rnd(0, 65535), rnd(0, 65535), rnd(0, 65535))
  elseif mode == "time" then
    local ms = math.floor(now_ms(0))
    id = string.format("%06x%06x%04x%04x%04x%04x%04x", math.floor(ms / 16777216), ms % 16777216,
      rnd(0, 65535), rnd(0, 65535), rnd(0, 65535), rnd(0, 65535), rnd(0, 65535))
  else
    id = string.format("%s-%02d-%012d", prefix, t, n)
  end
  headers["X-Event-ID"] = id
  return wrk.format("POST", path, headers, head .. id .. tail)
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "LOADRESULT requests=%d duration_us=%d connect=%d read=%d write=%d status=%d timeout=%d p50_us=%d p99_us=%d max_us=%d\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
"#
    )
}

#[derive(Default, Clone, Debug)]
struct WrkResult {
    requests: u64,
    duration_us: u64,
    socket_errors: u64,
    non_2xx: u64,
    p50_us: f64,
    p99_us: f64,
}

fn parse_wrk(out: &str) -> Option<WrkResult> {
    let line = out.lines().find(|l| l.starts_with("LOADRESULT "))?;
    let kv: BTreeMap<&str, f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|p| {
            let (k, v) = p.split_once('=')?;
            Some((k, v.parse().ok()?))
        })
        .collect();
    let g = |k: &str| kv.get(k).copied().unwrap_or(0.0);
    Some(WrkResult {
        requests: g("requests") as u64,
        duration_us: g("duration_us") as u64,
        socket_errors: (g("connect") + g("read") + g("write") + g("timeout")) as u64,
        non_2xx: g("status") as u64,
        p50_us: g("p50_us"),
        p99_us: g("p99_us"),
    })
}

// -------------------------------------------------------------- metrics

/// `idemgate_requests_total` by (route, outcome).
fn outcomes(admin: SocketAddr) -> BTreeMap<(String, String), f64> {
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

struct World {
    dir: PathBuf,
    upstream: Nginx,
    proxy: Option<Nginx>,
    sqlite: Idemgate,
    pg: Option<Idemgate>,
    tck: f64,
    ncpu: usize,
}

impl World {
    fn addr(&self, t: Target) -> Option<SocketAddr> {
        match t {
            Target::Upstream => Some(self.upstream.addr),
            Target::NginxProxy => self.proxy.as_ref().map(|n| n.addr),
            Target::IdemSqlite => Some(self.sqlite.addr),
            Target::IdemPg => self.pg.as_ref().map(|p| p.addr),
        }
    }
    /// The process whose CPU a scenario measures (`None`: the client's ceiling).
    fn server_pid(&self, t: Target) -> Option<u32> {
        match t {
            Target::Upstream => None,
            Target::NginxProxy => self.proxy.as_ref().map(|n| n.pid),
            Target::IdemSqlite => Some(self.sqlite.pid),
            Target::IdemPg => self.pg.as_ref().map(|p| p.pid),
        }
    }
    fn admin(&self, t: Target) -> Option<SocketAddr> {
        match t {
            Target::IdemSqlite => Some(self.sqlite.admin),
            Target::IdemPg => self.pg.as_ref().map(|p| p.admin),
            _ => None,
        }
    }
    fn idemgates(&self) -> Vec<&Idemgate> {
        std::iter::once(&self.sqlite)
            .chain(self.pg.as_ref())
            .collect()
    }
}

#[derive(Clone, Debug)]
struct Run {
    key: char,
    conns: usize,
    round: usize,
    wrk: WrkResult,
    rps: f64,
    /// CPU µs per request: the process under test, the upstream, wrk, all
    /// postgres processes, and the rest of the machine.
    cpu_server: Option<f64>,
    cpu_upstream: f64,
    cpu_wrk: f64,
    cpu_pg: f64,
    /// What the process under test read and wrote per request.
    io_server: Option<IoPerRequest>,
    /// KiB of WAL the PostgreSQL server wrote per request (PostgreSQL
    /// scenarios): the server's I/O, which `io_server` does not see.
    pg_wal_kib: Option<f64>,
    /// Share of the machine's capacity busy with work the harness did not start.
    foreign_pct: f64,
    mix: String,
    problems: Vec<String>,
}

struct Snapshot {
    server: u64,
    server_io: Option<ProcIo>,
    /// The server's WAL insert position, bytes (PostgreSQL scenarios).
    pg_wal: Option<u64>,
    upstream: u64,
    pg: u64,
    busy: u64,
    ours: u64,
    wrk_us: f64,
    outcomes: BTreeMap<(String, String), f64>,
}

fn snapshot(s: &Settings, w: &World, sc: &Scenario) -> Snapshot {
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
    Snapshot {
        server,
        server_io,
        pg_wal,
        upstream,
        pg,
        busy: machine_busy_ticks(),
        ours: ours + pg,
        wrk_us: children_cpu_us(),
        outcomes: w.admin(sc.target).map(outcomes).unwrap_or_default(),
    }
}

/// Waits (at most 5 s) until no idemgate counts requests any more: wrk
/// drops the requests in flight when it stops, and idemgate still finishes
/// them (claims queued behind the store) — that load must not leak into the
/// next run's figures.
fn quiesce(w: &World) {
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
fn id_prefix(key: char, serial: usize) -> String {
    let pid = std::process::id() % 100_000;
    format!("{key}{serial:02}{pid:05}")
}

/// Runs wrk once; the replay event is delivered by the caller first.
#[allow(clippy::too_many_arguments)] // a bench's plain plumbing
fn run_wrk(
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
fn prepare(w: &World, sc: &Scenario, serial: usize) -> String {
    let prefix = id_prefix(sc.key, serial % 100);
    if sc.ids == Ids::Same {
        prime_replay(w, sc, &prefix);
    }
    prefix
}

/// Delivers the one event every request of a replay run repeats, and checks
/// that a duplicate is replayed.
fn prime_replay(w: &World, sc: &Scenario, prefix: &str) {
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
fn measure(
    s: &Settings,
    w: &World,
    sc: &Scenario,
    conns: usize,
    round: usize,
    serial: usize,
    perf: bool,
    trace: bool,
) -> Run {
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
    let mut mix = String::from("-");
    if let Some(route) = sc.route {
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
        mix = delta
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
    }
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
        cpu_pg: us(after.pg.saturating_sub(before.pg)),
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

/// A byte counter's growth from `from` to `to`, in KiB per one of `n` requests.
fn kib_per(n: f64, from: u64, to: u64) -> f64 {
    to.saturating_sub(from) as f64 / 1024.0 / n
}

fn target_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is <target>/tmp.
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"))
}

// --------------------------------------------------------------- report

fn median(mut v: Vec<f64>) -> Option<f64> {
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

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

/// The run of scenario `key` in the same round and at the same connections.
fn peer<'a>(runs: &'a [Run], r: &Run, key: char) -> Option<&'a Run> {
    runs.iter()
        .find(|x| x.key == key && x.round == r.round && x.conns == r.conns)
}

/// `r`'s req/s over that of scenario `key` in the same round and connections.
fn ratio_to(runs: &[Run], r: &Run, key: char) -> Option<f64> {
    peer(runs, r, key).map(|a| r.rps / a.rps)
}

struct Report(String);

impl Report {
    fn line(&mut self, s: impl AsRef<str>) {
        println!("{}", s.as_ref());
        self.0.push_str(s.as_ref());
        self.0.push('\n');
    }
}

fn run_header() -> String {
    format!(
        "{:<3} {:>5} {:>5} {:>9} {:>8} {:>8} {:>6} {:>8} {:>7} {:>6} {:>6} {:>7}  {}",
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
        "pg µs",
        "foreign",
        "outcomes / problems"
    )
}

fn run_line(runs: &[Run], r: &Run) -> String {
    let mut notes = r.mix.clone();
    if r.key == 'e' && r.wrk.non_2xx > 0 {
        write!(notes, " ({} × 409)", r.wrk.non_2xx).unwrap();
    }
    for p in &r.problems {
        write!(notes, "  !! {p}").unwrap();
    }
    format!(
        "({}) {:>5} {:>5} {:>9.0} {:>8.2} {:>8.2} {:>6} {:>8} {:>7.1} {:>6.1} {:>6} {:>6.0}%  {}",
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
        if scenario(r.key).target == Target::IdemPg {
            format!("{:.1}", r.cpu_pg)
        } else {
            "-".into()
        },
        r.foreign_pct,
        notes
    )
}

fn summarise(rep: &mut Report, s: &Settings, runs: &[Run], w: &World) {
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

/// Removes what a harness killed with SIGKILL left behind (its processes
/// died with it): run dirs and PostgreSQL schemas whose pid is gone.
fn remove_stale(pg_url: Option<&str>) {
    let alive = |pid: &str| Path::new("/proc").join(pid).exists();
    let places = [
        (Path::new(env!("CARGO_TARGET_TMPDIR")), "load-"),
        (Path::new(SHM), LOG_DIR_PREFIX),
    ];
    for (parent, prefix) in places {
        for e in std::fs::read_dir(parent).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix(prefix) {
                if pid.parse::<u32>().is_ok() && !alive(pid) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
    let Some(url) = pg_url else { return };
    let schemas = pg_exec(
        url,
        "SELECT nspname::text FROM pg_namespace WHERE nspname ~ '^load_[0-9]+(_[a-z]+)?$'",
    )
    .unwrap_or_default();
    for schema in schemas {
        let pid = schema["load_".len()..].split('_').next().unwrap_or("");
        if !alive(pid) {
            let _ = pg_exec(url, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
        }
    }
}

// ----------------------------------------------------------------- main

fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

const SHM: &str = "/dev/shm";
const LOG_DIR_PREFIX: &str = "idemgate-load-";

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

fn fs_type(path: &Path) -> String {
    sh("stat", &["-f", "-c", "%T", &path.display().to_string()])
}

fn machine_line(s: &Settings) -> Vec<String> {
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
    // A run dir on the same disk as a real deployment's SQLite file.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("load-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("run dir");
    let logs = log_dir(&s, &dir);
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

    let upstream = start_nginx(
        &dir,
        "nginx-upstream",
        "1",
        "server { listen 127.0.0.1:PORT; location / { return 200 \"ok\\n\"; } }",
    );
    let proxy = s.scenarios.contains(&'n').then(|| {
        start_nginx(
            &dir,
            "nginx-proxy",
            &s.nginx_workers,
            &format!(
                "upstream backend {{ server {}; keepalive 128; keepalive_requests 100000000; }}\n\
                 server {{ listen 127.0.0.1:PORT; location / {{ proxy_pass http://backend; \
                 proxy_http_version 1.1; proxy_set_header Connection \"\"; }} }}",
                upstream.addr
            ),
        )
    });
    let sqlite = start_idemgate(
        &dir,
        &logs,
        "idemgate-sqlite",
        &s,
        &format!("sqlite://{}", dir.join("claims.db").display()),
        upstream.addr,
        &["pass", "unique", "replay", "conflict"],
        &Extra::default(),
    );
    let pg = if uses_pg {
        let schema = format!("load_{}", std::process::id());
        let settings = pg_run_schema(&s, &schema).and_then(|url| {
            let sc = pg_exec(&s.pg_url, "SHOW synchronous_commit")?;
            let fsync = pg_exec(&s.pg_url, "SHOW fsync")?;
            let autovacuum = pg_exec(&s.pg_url, "SHOW autovacuum")?;
            Ok((url, sc.join(""), fsync.join(""), autovacuum.join("")))
        });
        match settings {
            Ok((url, sc, fsync, autovacuum)) => {
                rep.line(format!(
                    "PostgreSQL: synchronous_commit={sc}, fsync={fsync}, autovacuum={autovacuum}{}{}",
                    if sc != "on" || fsync != "on" {
                        " — WARNING: (d) is not durable as configured"
                    } else {
                        ""
                    },
                    if autovacuum != "on" {
                        " — WARNING: deleted records' space is never reused (the steady state's table grows)"
                    } else {
                        ""
                    }
                ));
                Some(start_idemgate(
                    &dir,
                    &logs,
                    "idemgate-postgres",
                    &s,
                    &url,
                    upstream.addr,
                    &["unique"],
                    &Extra::default(),
                ))
            }
            Err(e) => {
                rep.line(format!(
                    "SKIP (d), (p): PostgreSQL at {} is not usable: {e}",
                    s.pg_url
                ));
                None
            }
        }
    } else {
        None
    };
    let w = World {
        dir,
        upstream,
        proxy,
        sqlite,
        pg,
        tck: clk_tck(),
        ncpu: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let keys: Vec<char> = s
        .scenarios
        .iter()
        .copied()
        .filter(|&k| w.addr(scenario(k).target).is_some())
        .collect();

    // Sanity: one request per scenario does what the scenario says.
    for &k in &keys {
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

    let per_run = s.duration as f64 + 0.6;
    let total = keys.len() as f64
        * (s.conns.len() as f64 * s.repeats as f64 * per_run + s.warmup as f64 + 0.6);
    let top = *s.conns.iter().max().unwrap();
    let mut serial = 0;
    if !keys.is_empty() {
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
            for &k in &keys {
                serial += 1;
                let prefix = prepare(&w, scenario(k), serial);
                run_wrk(
                    &s,
                    &w,
                    scenario(k),
                    top,
                    s.warmup,
                    &prefix,
                    serial,
                    Pace::default(),
                );
            }
        }
        rep.line(
            "srv µs: CPU of the process under test per request (idemgate or the nginx proxy);",
        );
        rep.line(
        "up µs: the upstream nginx; wrk µs: the client; pg µs: all postgres processes (d only);",
    );
        rep.line("foreign: share of the machine busy with processes the harness did not start.");
        println!("{}", run_header());
    }
    let mut runs: Vec<Run> = Vec::new();
    for round in 1..=s.repeats {
        for &conns in &s.conns {
            // Rotate the order each round so that no scenario always runs first.
            let mut order = keys.clone();
            order.rotate_left((round - 1) % keys.len().max(1));
            for k in order {
                serial += 1;
                let r = measure(&s, &w, scenario(k), conns, round, serial, false, false);
                runs.push(r);
                // Ratios to (a) fill in once (a) of the round has run.
                let last = runs.last().unwrap();
                println!("{}", run_line(&runs, last));
            }
        }
    }
    // Probed runs come after the rounds and stay out of the figures: a
    // profiler changes what it measures.
    for &k in &keys {
        let (perf, trace) = (s.perf.contains(&k), s.syscalls.contains(&k));
        if perf || trace {
            serial += 1;
            let r = measure(&s, &w, scenario(k), top, 0, serial, perf, trace);
            println!("probed run (not in the figures):\n{}", run_line(&runs, &r));
        }
    }

    if s.attack > 0 {
        under_attack(&s, &w, &mut rep, &mut serial, top);
    }
    if !s.scale.preload.is_empty() {
        scale::store_sizes(&s, &w, &logs, &mut rep, &mut serial);
    }
    if s.scale.steady > 0 {
        scale::steady(&s, &w, &logs, &mut rep, &mut serial);
    }

    if !runs.is_empty() {
        // The full table again, with every ratio known.
        rep.line("");
        rep.line("all runs (x(a) = ratio to (a) of the same round and connections):");
        rep.line(run_header());
        for r in &runs {
            rep.line(run_line(&runs, r));
        }
        summarise(&mut rep, &s, &runs, &w);
    }
    for name in ["idemgate-sqlite", "idemgate-postgres"] {
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
    if s.keep {
        println!("run dir kept: {}", w.dir.display());
        if logs != w.dir {
            println!("log dir kept: {}", logs.display());
        }
    }
    cleanup();
}
