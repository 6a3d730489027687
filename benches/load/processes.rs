//! The processes the harness starts, and the shell-outs it reads. It
//! imports nothing of the harness: every other file may use it.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

/// Every process the harness started, stopped by `cleanup::cleanup`.
pub(crate) static CHILDREN: Mutex<Vec<(String, Child)>> = Mutex::new(Vec::new());

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

pub(crate) fn sh(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

pub(crate) const SHM: &str = "/dev/shm";
pub(crate) const LOG_DIR_PREFIX: &str = "idemgate-load-";

pub(crate) fn fs_type(path: &Path) -> String {
    sh("stat", &["-f", "-c", "%T", &path.display().to_string()])
}
