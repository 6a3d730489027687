//! A private PostgreSQL cluster for tests that kill the database itself
//! (issue 26): `initdb` into a temp dir as the `postgres` user (initdb
//! refuses root), started with `pg_ctl` on a free loopback port with `fsync`
//! on, its socket in that dir. Never the shared server on 5432. Dropping it
//! kills whatever of it still runs (postmaster and backends) and removes the
//! dir, also when the test failed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{free_port, TempDir};

pub struct PgCluster {
    pub port: u16,
    data: PathBuf,
    bin: PathBuf,
    log: PathBuf,
    dir: TempDir,
}

/// `/usr/lib/postgresql/<newest>/bin`, where Debian puts initdb and pg_ctl.
fn pg_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Runs a PostgreSQL program as the `postgres` user.
fn as_postgres(bin: &Path, program: &str, args: &[&str]) -> std::process::Output {
    Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(bin.join(program))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("runuser {program}: {e}"))
}

impl PgCluster {
    /// A new cluster, started; `conf` lines are added to postgresql.conf.
    /// `None` (with a printed SKIP) where PostgreSQL's server programs or
    /// the `postgres` user are missing, outside CI; in CI that is a failure.
    pub fn start(tag: &str, conf: &[&str]) -> Option<PgCluster> {
        let skip = |why: String| {
            if std::env::var_os("CI").is_some() {
                panic!("a private PostgreSQL cluster is needed in CI: {why}");
            }
            eprintln!("SKIP: no private PostgreSQL cluster: {why}");
        };
        let Some(bin) = pg_bin() else {
            skip("no initdb under /usr/lib/postgresql/*/bin".into());
            return None;
        };
        let dir = TempDir::new(tag);
        let chown = Command::new("chown")
            .args(["-R", "postgres:"])
            .arg(dir.path())
            .status();
        if !chown.is_ok_and(|s| s.success()) {
            skip(format!(
                "cannot give {} to the postgres user",
                dir.path().display()
            ));
            return None;
        }
        let data = dir.path().join("data");
        let data_s = data.to_str().unwrap().to_string();
        let out = as_postgres(
            &bin,
            "initdb",
            &[
                "-D",
                &data_s,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-instructions",
                // initdb's own syncing of its files; the cluster runs with fsync on
                "--no-sync",
            ],
        );
        if !out.status.success() {
            skip(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
            return None;
        }
        let port = free_port();
        let mut text = format!(
            "\n# idemgate test cluster\nport = {port}\nlisten_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{}'\nfsync = on\nmax_connections = 60\n\
             shared_buffers = 16MB\nlog_min_messages = warning\n",
            dir.path().display()
        );
        for line in conf {
            text.push_str(line);
            text.push('\n');
        }
        let conf_path = data.join("postgresql.conf");
        let mut all = std::fs::read_to_string(&conf_path).expect("postgresql.conf");
        all.push_str(&text);
        std::fs::write(&conf_path, all).expect("postgresql.conf written");
        let cluster = PgCluster {
            port,
            log: dir.path().join("server.log"),
            data,
            bin,
            dir,
        };
        cluster.pg_ctl_start();
        Some(cluster)
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Starts the server and waits until it accepts connections (crash
    /// recovery included). A postmaster killed a moment ago may leave
    /// backends that still hold its shared memory for a while: retried.
    pub fn pg_ctl_start(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = as_postgres(
                &self.bin,
                "pg_ctl",
                &[
                    "-D",
                    self.data.to_str().unwrap(),
                    "-l",
                    self.log.to_str().unwrap(),
                    "-w",
                    "-t",
                    "60",
                    "start",
                ],
            );
            if out.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the test cluster did not start: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The postmaster's pid, from `postmaster.pid`; `None` when stopped.
    pub fn postmaster_pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        let pid: i32 = text.lines().next()?.trim().parse().ok()?;
        // a stale file of a killed postmaster names a dead process
        (unsafe { libc::kill(pid, 0) } == 0).then_some(pid)
    }

    /// SIGKILL to the postmaster alone, as the issue asks: its backends
    /// find it gone and exit by themselves.
    pub fn kill_postmaster(&self) -> i32 {
        let pid = self.postmaster_pid().expect("the test cluster runs");
        unsafe { libc::kill(pid, libc::SIGKILL) };
        pid
    }

    /// SIGKILL to the postmaster and every process it started, at once: a
    /// power cut for the server (nothing it held in memory reaches disk).
    pub fn kill_all(&self) {
        let Some(pid) = self.postmaster_pid() else {
            return;
        };
        let children = children_of(pid);
        unsafe { libc::kill(pid, libc::SIGKILL) };
        for c in children {
            unsafe { libc::kill(c, libc::SIGKILL) };
        }
        self.wait_gone(pid);
    }

    fn wait_gone(&self, pid: i32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs SQL with `psql` on the cluster; panics on failure; returns stdout.
    pub fn psql(&self, sql: &str) -> String {
        psql_at(&self.url(), sql)
    }
}

/// What a primary needs for a streaming standby (SPEC §16's tests).
pub const REPLICATION: [&str; 4] = [
    "wal_level = replica",
    "max_wal_senders = 5",
    "wal_keep_size = 256MB",
    "hot_standby = on",
];

/// The name a standby streams under: what `synchronous_standby_names` names.
pub const STANDBY_NAME: &str = "standby";

impl PgCluster {
    /// A new standby of `primary`, from a base backup, started and
    /// streaming as [`STANDBY_NAME`].
    pub fn standby_of(primary: &PgCluster, tag: &str) -> PgCluster {
        let dir = TempDir::new(tag);
        let chown = Command::new("chown")
            .args(["-R", "postgres:"])
            .arg(dir.path())
            .status();
        assert!(
            chown.is_ok_and(|s| s.success()),
            "chown {}",
            dir.path().display()
        );
        let standby = PgCluster {
            port: free_port(),
            log: dir.path().join("server.log"),
            data: dir.path().join("data"),
            bin: primary.bin.clone(),
            dir,
        };
        standby.base_backup_of(primary);
        standby.pg_ctl_start();
        standby
    }

    /// Makes this cluster, whose server was killed, a standby of `primary`:
    /// its data replaced by a new base backup (as an HA tool rebuilds a
    /// failed primary), on the same port.
    pub fn rebuild_as_standby_of(&self, primary: &PgCluster) {
        self.kill_all();
        let deadline = Instant::now() + Duration::from_secs(10);
        while still_running_in(self.dir.path()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_dir_all(&self.data);
        self.base_backup_of(primary);
        self.pg_ctl_start();
    }

    /// `pg_basebackup -R` into this cluster's data directory, then its own
    /// port and socket directory, streaming under [`STANDBY_NAME`], and no
    /// synchronous standby of its own until one is set (a promoted server
    /// with none attached would wait on every commit).
    fn base_backup_of(&self, primary: &PgCluster) {
        let out = as_postgres(
            &self.bin,
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port.to_string(),
                "-U",
                "postgres",
                "-D",
                self.data.to_str().unwrap(),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-sync",
            ],
        );
        assert!(
            out.status.success(),
            "pg_basebackup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let auto = self.data.join("postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&auto).expect("postgresql.auto.conf");
        text.push_str(&format!(
            "\nport = {}\nunix_socket_directories = '{}'\n\
             primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name={STANDBY_NAME}'\n\
             synchronous_standby_names = ''\n",
            self.port,
            self.dir.path().display(),
            primary.port,
        ));
        std::fs::write(&auto, text).expect("postgresql.auto.conf written");
    }

    /// `pg_ctl promote`, waiting until the server takes writes.
    pub fn promote(&self) {
        let out = as_postgres(
            &self.bin,
            "pg_ctl",
            &[
                "-D",
                self.data.to_str().unwrap(),
                "-w",
                "-t",
                "60",
                "promote",
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl promote: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// Waits until [`STANDBY_NAME`] streams from this server; then, with
    /// `sync`, makes it the synchronous standby.
    pub fn attach_standby(&self, sync: bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let query = format!(
            "SELECT count(*) FROM pg_stat_replication \
             WHERE application_name = '{STANDBY_NAME}' AND state = 'streaming'"
        );
        while self.psql(&query).trim() != "1" {
            assert!(
                Instant::now() < deadline,
                "no standby streams: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        if sync {
            self.psql(&format!(
                "ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'"
            ));
            self.psql("SELECT pg_reload_conf()");
            let query = format!(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = '{STANDBY_NAME}'"
            );
            while self.psql(&query).trim() != "sync" {
                assert!(Instant::now() < deadline, "the standby is not synchronous");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Runs SQL with `psql` at `url`; panics on failure; returns stdout.
pub fn psql_at(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([url, "-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("psql runs");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The pids whose parent is `pid` (from /proc).
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| {
            let child: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            // pid (comm) state ppid …; comm may hold spaces: split after ')'
            let ppid: i32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // everything of it, now: a test that failed may have left it running
        self.kill_all();
        // backends of a postmaster killed earlier exit on their own; give
        // them a moment so that the dir goes away whole
        let deadline = Instant::now() + Duration::from_secs(5);
        while still_running_in(self.dir.path()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether any process has its working directory in `dir` (a backend of the
/// cluster: they run in the data directory).
fn still_running_in(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.filter_map(|e| e.ok()).any(|e| {
        e.file_name()
            .to_str()
            .is_some_and(|n| n.parse::<u32>().is_ok())
            && std::fs::read_link(e.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
    })
}
