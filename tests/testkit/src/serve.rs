//! An `idemgate serve` process for the demo, the tests and the benches:
//! free loopback ports for its listener and admin, the start of its config,
//! readiness by polling `/readyz` (while watching that the process is still
//! alive), and SIGTERM then SIGKILL when it stops or drops.

use std::io;
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::client::{free_port, get};

/// The listener and admin addresses of one process, on free loopback ports.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
}

impl Ports {
    pub fn free() -> io::Result<Ports> {
        let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        Ok(Ports {
            listen: loopback(free_port()?),
            admin: loopback(free_port()?),
        })
    }

    /// The config's first lines: `listen` and `admin_listen`.
    pub fn config(&self) -> String {
        format!(
            "listen: \"{}\"\nadmin_listen: \"{}\"\n",
            self.listen, self.admin
        )
    }
}

/// A running process; stopped (SIGTERM, then SIGKILL after 10 s) on drop.
pub struct Serve {
    child: Option<Child>,
}

impl Serve {
    /// Spawns `cmd` (an `idemgate serve --config …` with its output set up).
    pub fn spawn(cmd: &mut Command) -> io::Result<Serve> {
        Ok(Serve {
            child: Some(cmd.spawn()?),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Waits until `GET /readyz` on `admin` answers with a status `ready`
    /// accepts. An error says why not: the process exited, or `timeout` passed.
    pub fn wait_ready(
        &mut self,
        admin: SocketAddr,
        timeout: Duration,
        ready: impl Fn(u16) -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let child = self.child.as_mut().ok_or("not running")?;
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("idemgate exited with {status} before ready"));
            }
            if get(admin, "/readyz").is_ok_and(|r| ready(r.status)) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Err(format!("idemgate not ready within {timeout:?}"))
    }

    /// SIGTERM; waits up to `timeout`, then SIGKILL. The exit code, if it
    /// exited by itself; `None` when it had to be killed or was not running.
    pub fn stop(&mut self, timeout: Duration) -> Option<i32> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// A process's memory figure from `/proc/PID/status` in KiB: `key` is
/// `VmRSS:` (resident now) or `VmHWM:` (the peak).
pub fn memory_kib(pid: u32, key: &str) -> Option<u64> {
    proc_number(pid, "status", key)
}

/// The number that follows `key` on its line of `/proc/PID/<file>`
/// (`status`, `io`, …).
pub fn proc_number(pid: u32, file: &str, key: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
