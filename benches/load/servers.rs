//! The servers under load: the nginx upstream and reference proxy, and idemgate.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use std::path::PathBuf;

use crate::pg::{pg_exec, pg_run_schema};
use crate::processes::{command, spawn};
use crate::procfs::clk_tck;
use crate::report::Report;
use crate::scenarios::Target;
use crate::settings::Settings;
use crate::valkey::start_cluster;
use crate::world::{Idemgate, Nginx, TracedSet, ValkeyStore, World};

/// A tool's path: on PATH, or in the sbin directories (nginx lives in /usr/sbin).
pub(crate) fn tool(name: &str) -> String {
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

pub(crate) fn free_port() -> u16 {
    testkit::free_port().expect("a free loopback port")
}

pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

pub(crate) fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("{what} did not become ready within {timeout:?}");
}

/// An nginx in the foreground (`daemon off`), everything under `dir`.
pub(crate) fn start_nginx(dir: &Path, name: &str, workers: &str, server_block: &str) -> Nginx {
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
pub(crate) const ATTACK_TIMEOUTS: (u64, u64, u64) = (5, 8, 10);

#[allow(clippy::too_many_arguments)] // a bench's plain plumbing
pub(crate) fn start_idemgate(
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
        let guard = match *r {
            "pass" => "    guard_methods: []\n".to_string(),
            "allowlisted" => format!(
                "    allow_from: \"file:{}\"\n",
                allow_list(dir).display()
            ),
            "headers" => "    replay_headers: [Location, ETag]\n".to_string(),
            "reconciled" => format!(
                "    on_ambiguous: hold\n    reconcile:\n      url: \"http://{upstream}/check/{{id}}\"\n"
            ),
            _ => String::new(),
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
pub(crate) struct Extra {
    pub(crate) top: String,
    pub(crate) defaults: String,
}

/// Starts the servers the scenarios and sections load.
pub(crate) fn start_world(
    s: &Settings,
    dir: PathBuf,
    logs: &Path,
    uses_pg: bool,
    rep: &mut Report,
) -> World {
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
        logs,
        "idemgate-sqlite",
        s,
        &format!("sqlite://{}", dir.join("claims.db").display()),
        upstream.addr,
        &[
            "pass",
            "unique",
            "replay",
            "conflict",
            "allowlisted",
            "headers",
            "reconciled",
        ],
        &Extra::default(),
    );
    let pg = if uses_pg {
        start_pg(s, &dir, logs, upstream.addr, rep)
    } else {
        None
    };
    let traced = s
        .scenarios
        .iter()
        .any(|&k| crate::scenarios::scenario(k).target.traced())
        .then(|| start_traced(s, &dir, logs, upstream.addr));
    let valkey = s
        .scenarios
        .iter()
        .any(|&k| crate::scenarios::scenario(k).target == Target::IdemValkey)
        .then(|| start_valkey(s, &dir, logs, upstream.addr, rep));
    World {
        dir,
        upstream,
        proxy,
        sqlite,
        pg,
        traced,
        valkey,
        tck: clk_tck(),
        ncpu: std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// A live OTLP collector (rotel, from PyPI, as the tests use; nothing
/// printed, spans taken and dropped) and the three SQLite processes of
/// (o), (m) and (w), each on its own store file: traced at 1.0, at 0.01,
/// and not at all.
fn start_traced(s: &Settings, dir: &Path, logs: &Path, upstream: SocketAddr) -> TracedSet {
    let pkg = crate::processes::sh(
        "python3",
        &[
            "-c",
            "import rotel, os; print(os.path.dirname(rotel.__file__))",
        ],
    );
    assert!(
        !pkg.is_empty(),
        "(o) and (m) need the collector: python3 -m pip install rotel==0.0.1a15"
    );
    let (http, grpc) = (free_port(), free_port());
    let log = std::fs::File::create(logs.join("rotel.log")).unwrap();
    let mut cmd = command(&format!("{pkg}/rotel-agent"));
    cmd.args(["start", "--exporter", "blackhole", "--otlp-http-endpoint"])
        .arg(format!("127.0.0.1:{http}"))
        .arg("--otlp-grpc-endpoint")
        .arg(format!("127.0.0.1:{grpc}"))
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    spawn("rotel", cmd);
    wait_until("rotel", Duration::from_secs(10), || {
        std::net::TcpStream::connect(loopback(http)).is_ok()
    });
    let start = |name: &'static str, sample: Option<&str>| {
        let extra = Extra {
            top: sample.map_or(String::new(), |sample| format!(
                "telemetry:\n  otlp:\n    endpoint: \"http://127.0.0.1:{http}\"\n    sample: {sample}\n"
            )),
            defaults: String::new(),
        };
        let store = format!("sqlite://{}", dir.join(format!("{name}.db")).display());
        start_idemgate(dir, logs, name, s, &store, upstream, &["unique"], &extra)
    };
    TracedSet {
        full: start("idemgate-traced", Some("1.0")),
        sampled: start("idemgate-sampled", Some("0.01")),
        off: start("idemgate-untraced", None),
    }
}

/// (v): a private Valkey cluster ([`start_cluster`]) and an idemgate on
/// it with the default durability, `fsynced` (SPEC §18).
fn start_valkey(
    s: &Settings,
    dir: &Path,
    logs: &Path,
    upstream: SocketAddr,
    rep: &mut Report,
) -> ValkeyStore {
    let cluster = start_cluster(dir, logs);
    rep.line(format!(
        "Valkey: 3 primaries + 3 replicas, appendfsync always, store {}",
        cluster.url
    ));
    let idemgate = start_idemgate(
        dir,
        logs,
        "idemgate-valkey",
        s,
        &cluster.url,
        upstream,
        &["unique"],
        &Extra::default(),
    );
    ValkeyStore {
        idemgate,
        nodes: cluster.pids,
    }
}

/// The idemgate on a PostgreSQL schema of this run, if the server is usable.
fn start_pg(
    s: &Settings,
    dir: &Path,
    logs: &Path,
    upstream: SocketAddr,
    rep: &mut Report,
) -> Option<Idemgate> {
    let schema = format!("load_{}", std::process::id());
    let settings = pg_run_schema(s, &schema).and_then(|url| {
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
                dir,
                logs,
                "idemgate-postgres",
                s,
                &url,
                upstream,
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
}

/// 5,000 ranges for the `allowlisted` route, loopback the last of them
/// (none other holds it), written into `dir`.
fn allow_list(dir: &Path) -> PathBuf {
    let path = dir.join("allow_from.txt");
    let mut list = String::from("# the load harness's allow list: 4,999 ranges and loopback\n");
    for i in 0..4999u32 {
        list.push_str(&format!("10.{}.{}.0/24\n", i / 256, i % 256));
    }
    list.push_str("127.0.0.0/8\n");
    std::fs::write(&path, list).unwrap();
    path
}
