//! What the harness removes at the end, however it ends: the processes it
//! started, the run and log dirs and PostgreSQL schemas of this run, and
//! those a harness killed with SIGKILL left behind.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use crate::pg::pg_exec;
use crate::processes::{lock, signal, CHILDREN, LOG_DIR_PREFIX, SHM};
use crate::world::LEFTOVERS;

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
