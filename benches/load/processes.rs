//! The processes the harness starts, and what it removes at the end.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::pg::pg_exec;
use crate::settings::Settings;

/// Every process the harness started, stopped by [`cleanup`].
pub(crate) static CHILDREN: Mutex<Vec<(String, Child)>> = Mutex::new(Vec::new());
/// Things to remove at the end: the run and log dirs (unless kept) and the
/// PG schemas of this run (not the cached preloaded ones).
pub(crate) static LEFTOVERS: Mutex<Leftovers> = Mutex::new(Leftovers {
    dirs: Vec::new(),
    pg: Vec::new(),
});

pub(crate) struct Leftovers {
    /// The run dir and, when apart from it, the log dir.
    pub(crate) dirs: Vec<PathBuf>,
    /// (server URL, schema)
    pub(crate) pg: Vec<(String, String)>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A command that cannot outlive the harness: its own process group (so a
/// terminal's Ctrl-C reaches the harness alone, which then stops it in
/// order) and SIGTERM when the harness dies, however it dies.
pub(crate) fn command(program: &str) -> Command {
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
pub(crate) fn spawn(name: &str, mut cmd: Command) -> u32 {
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    let pid = child.id();
    lock(&CHILDREN).push((name.to_string(), child));
    pid
}

pub(crate) fn signal(pid: u32, sig: i32) {
    // SAFETY: plain kill(2) on a pid we started and have not reaped.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Stops every registered process (SIGTERM, then SIGKILL after 5 s) and
/// removes what the run left behind. Idempotent.
pub(crate) fn cleanup() {
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
pub(crate) struct CleanupGuard;

impl Drop for CleanupGuard {
    fn drop(&mut self) {
        cleanup();
    }
}

/// Ctrl-C, SIGTERM or SIGHUP: stop everything, then exit 130.
pub(crate) fn watch_signals() {
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

/// Removes what a harness killed with SIGKILL left behind (its processes
/// died with it): run dirs and PostgreSQL schemas whose pid is gone.
pub(crate) fn remove_stale(pg_url: Option<&str>) {
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
pub(crate) fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

pub(crate) const SHM: &str = "/dev/shm";
pub(crate) const LOG_DIR_PREFIX: &str = "idemgate-load-";

/// Where idemgate's logs go: on tmpfs, away from the SQLite file, unless
/// `LOAD_LOGS_ON_DISK` or there is no tmpfs. At info level idemgate writes a
/// line per guarded request, 20+ MB/s under (c) and (e); written beside the
/// database, those pages reach the disk in the kernel's writeback, whenever
/// it comes, and an (b) run that meets it has its fsyncs queued behind
/// hundreds of MB: p99 20–90 ms instead of 5. That measures the machine's
/// writeback, not idemgate; a deployment keeps a busy log off the store's
/// disk too (a collector over a pipe or the network, or another disk).
pub(crate) fn log_dir(s: &Settings, run_dir: &Path) -> PathBuf {
    if s.logs_on_disk || fs_type(Path::new(SHM)) != "tmpfs" {
        return run_dir.to_path_buf();
    }
    Path::new(SHM).join(format!("{LOG_DIR_PREFIX}{}", std::process::id()))
}

pub(crate) fn fs_type(path: &Path) -> String {
    sh("stat", &["-f", "-c", "%T", &path.display().to_string()])
}
