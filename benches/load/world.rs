//! The types the harness's files share: the world of servers a run loads
//! (`World`, `Nginx`, `Idemgate`), one measured run (`Run`), and what the run
//! leaves behind to remove (`LEFTOVERS`). At the bottom of the harness: it
//! imports only the leaf files its fields' types come from, so every other
//! file may use it without a circle.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::procfs::IoPerRequest;
use crate::scenarios::Target;
use crate::wrk::WrkResult;

#[derive(Clone, Copy)]
pub(crate) struct Nginx {
    pub(crate) pid: u32,
    pub(crate) addr: SocketAddr,
}

#[derive(Clone, Copy)]
pub(crate) struct Idemgate {
    pub(crate) name: &'static str,
    pub(crate) pid: u32,
    pub(crate) addr: SocketAddr,
    pub(crate) admin: SocketAddr,
}

pub(crate) struct World {
    pub(crate) dir: PathBuf,
    pub(crate) upstream: Nginx,
    pub(crate) proxy: Option<Nginx>,
    pub(crate) sqlite: Idemgate,
    pub(crate) pg: Option<Idemgate>,
    /// (o), (m) and (w)'s processes, when a run has one of them.
    pub(crate) traced: Option<TracedSet>,
    /// (v)'s process and its private Valkey cluster, when a run has (v).
    pub(crate) valkey: Option<ValkeyStore>,
    pub(crate) tck: f64,
    pub(crate) ncpu: usize,
}

/// The tracing A/B's three processes, alike but for their `telemetry`.
pub(crate) struct TracedSet {
    /// (o): `sample: 1.0`.
    pub(crate) full: Idemgate,
    /// (m): `sample: 0.01`.
    pub(crate) sampled: Idemgate,
    /// (w): no `telemetry` block.
    pub(crate) off: Idemgate,
}

impl TracedSet {
    fn of(&self, t: Target) -> Option<&Idemgate> {
        match t {
            Target::IdemTraced => Some(&self.full),
            Target::IdemSampled => Some(&self.sampled),
            Target::IdemUntraced => Some(&self.off),
            _ => None,
        }
    }
}

/// (v)'s idemgate, on a private Valkey cluster of its own.
pub(crate) struct ValkeyStore {
    pub(crate) idemgate: Idemgate,
    /// Every `valkey-server`'s pid (3 primaries, 3 replicas): the store's CPU.
    pub(crate) nodes: Vec<u32>,
}

impl World {
    pub(crate) fn addr(&self, t: Target) -> Option<SocketAddr> {
        match t {
            Target::Upstream => Some(self.upstream.addr),
            Target::NginxProxy => self.proxy.as_ref().map(|n| n.addr),
            Target::IdemSqlite => Some(self.sqlite.addr),
            Target::IdemPg => self.pg.as_ref().map(|p| p.addr),
            Target::IdemTraced | Target::IdemSampled | Target::IdemUntraced => {
                self.traced.as_ref().and_then(|s| s.of(t)).map(|i| i.addr)
            }
            Target::IdemValkey => self.valkey.as_ref().map(|v| v.idemgate.addr),
        }
    }
    /// The process whose CPU a scenario measures (`None`: the client's ceiling).
    pub(crate) fn server_pid(&self, t: Target) -> Option<u32> {
        match t {
            Target::Upstream => None,
            Target::NginxProxy => self.proxy.as_ref().map(|n| n.pid),
            Target::IdemSqlite => Some(self.sqlite.pid),
            Target::IdemPg => self.pg.as_ref().map(|p| p.pid),
            Target::IdemTraced | Target::IdemSampled | Target::IdemUntraced => {
                self.traced.as_ref().and_then(|s| s.of(t)).map(|i| i.pid)
            }
            Target::IdemValkey => self.valkey.as_ref().map(|v| v.idemgate.pid),
        }
    }
    pub(crate) fn admin(&self, t: Target) -> Option<SocketAddr> {
        match t {
            Target::IdemSqlite => Some(self.sqlite.admin),
            Target::IdemPg => self.pg.as_ref().map(|p| p.admin),
            Target::IdemTraced | Target::IdemSampled | Target::IdemUntraced => {
                self.traced.as_ref().and_then(|s| s.of(t)).map(|i| i.admin)
            }
            Target::IdemValkey => self.valkey.as_ref().map(|v| v.idemgate.admin),
            _ => None,
        }
    }
    pub(crate) fn idemgates(&self) -> Vec<&Idemgate> {
        std::iter::once(&self.sqlite)
            .chain(self.pg.as_ref())
            .chain(
                self.traced
                    .iter()
                    .flat_map(|s| [&s.full, &s.sampled, &s.off]),
            )
            .chain(self.valkey.as_ref().map(|v| &v.idemgate))
            .collect()
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Run {
    pub(crate) key: char,
    pub(crate) conns: usize,
    pub(crate) round: usize,
    pub(crate) wrk: WrkResult,
    pub(crate) rps: f64,
    /// CPU µs per request: the process under test, the upstream, wrk, the
    /// store's server processes (every postgres process on the machine, or
    /// for (v) the private cluster's valkey-server processes), and the rest
    /// of the machine.
    pub(crate) cpu_server: Option<f64>,
    pub(crate) cpu_upstream: f64,
    pub(crate) cpu_wrk: f64,
    pub(crate) cpu_store: f64,
    /// What the process under test read and wrote per request.
    pub(crate) io_server: Option<IoPerRequest>,
    /// KiB of WAL the PostgreSQL server wrote per request (PostgreSQL
    /// scenarios): the server's I/O, which `io_server` does not see.
    pub(crate) pg_wal_kib: Option<f64>,
    /// Share of the machine's capacity busy with work the harness did not start.
    pub(crate) foreign_pct: f64,
    pub(crate) mix: String,
    pub(crate) problems: Vec<String>,
}

pub(crate) fn target_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is <target>/tmp.
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"))
}

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
