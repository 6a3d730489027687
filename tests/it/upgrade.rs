//! Zero-downtime upgrades (SPEC §10): a new `serve --upgrade` takes the
//! listening sockets over from the running one on SIGQUIT, under continuous
//! load, with a changed config (a route added, a renewed certificate); the
//! old process answers and settles what it holds and exits 0. An invalid
//! config exits 2 and takes nothing; a SIGQUIT with no new process waiting
//! is ignored.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;

/// One `idemgate serve` process, by hand: an upgrade runs two at once on
/// the same config file and ports.
pub(crate) struct Serve {
    child: Child,
    log_path: PathBuf,
}

impl Serve {
    fn spawn(
        dir: &TempDir,
        config: &Path,
        upgrade: bool,
        n: usize,
        env: &[(String, String)],
    ) -> Serve {
        let log_path = dir.path().join(format!("serve{n}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let mut cmd = Command::new(bin());
        cmd.args(["serve", "--config"]).arg(config);
        if upgrade {
            cmd.arg("--upgrade");
        }
        let child = cmd
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("idemgate starts");
        Serve { child, log_path }
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid()])
            .status()
            .unwrap();
        assert!(ok.success(), "kill {sig}");
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The exit code, once it exits within `timeout`.
    fn wait(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// A config for these tests: `config_text`, with the test's own
/// `upgrade_sock` and a short `shutdown_grace`.
fn config(port: u16, admin: u16, store: &str, sock: &Path, routes: &str) -> String {
    format!(
        "upgrade_sock: {}\nshutdown_grace: 20s\n{}",
        sock.display(),
        config_text(port, admin, store, routes)
    )
}

/// The test's two ports, config file and upgrade socket.
pub(crate) struct Setup {
    pub(crate) dir: TempDir,
    pub(crate) addr: SocketAddr,
    pub(crate) admin: SocketAddr,
    store: String,
    config: PathBuf,
    sock: PathBuf,
    started: usize,
    /// Extra environment for every process started.
    env: Vec<(String, String)>,
}

impl Setup {
    /// A setup on a fresh SQLite store with `routes_v1` to `up` written.
    fn sqlite_v1(tag: &str, up: &Consumer) -> Setup {
        let dir = TempDir::new(tag);
        let store = dir.sqlite_url("u.db");
        let s = Setup::new(dir, store);
        s.write(&routes_v1(&up.url()));
        s
    }

    /// One new delivery to `path`: 200, and the consumer got it once.
    fn served_once(&self, up: &Consumer, path: &str, tag: &str, what: &str) {
        let id = eid(tag);
        let r = kit::client::deliver(self.addr, path, Some(&id), b"{}").unwrap();
        assert_eq!((r.status, up.count(&id)), (200, 1), "{what}: {r:?}");
    }

    pub(crate) fn new(dir: TempDir, store: String) -> Setup {
        let (port, admin) = (free_port(), free_port());
        Setup {
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
            admin: format!("127.0.0.1:{admin}").parse().unwrap(),
            store,
            config: dir.path().join("idemgate.yaml"),
            sock: dir.path().join("upgrade.sock"),
            dir,
            started: 0,
            env: Vec::new(),
        }
    }

    pub(crate) fn write(&self, routes: &str) {
        let text = config(
            self.addr.port(),
            self.admin.port(),
            &self.store,
            &self.sock,
            routes,
        );
        std::fs::write(&self.config, text).unwrap();
    }

    fn spawn(&mut self, upgrade: bool) -> Serve {
        self.started += 1;
        Serve::spawn(&self.dir, &self.config, upgrade, self.started, &self.env)
    }

    /// A plain `serve`, ready.
    pub(crate) fn start(&mut self) -> Serve {
        let mut s = self.spawn(false);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !kit::client::get(self.admin, "/readyz").is_ok_and(|r| r.status == 200) {
            assert!(s.running(), "serve exited; log:\n{}", s.log());
            assert!(Instant::now() < deadline, "not ready; log:\n{}", s.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    /// Starts `serve --upgrade` with the config as it is now, sends SIGQUIT
    /// to `old` at once (it waits for the new process), and waits for the
    /// old one to exit: the new process and how long the old one took to
    /// exit after the SIGQUIT (the overlap of the two).
    pub(crate) fn upgrade(&mut self, old: &mut Serve) -> (Serve, Duration) {
        let mut new = self.spawn(true);
        old.signal("-QUIT");
        let quit = Instant::now();
        let code = old.wait(Duration::from_secs(40));
        let overlap = quit.elapsed();
        assert_eq!(
            code,
            Some(0),
            "the old process exits 0; its log:\n{}\nthe new one's:\n{}",
            old.log(),
            new.log()
        );
        assert!(new.running(), "the new process runs; log:\n{}", new.log());
        (new, overlap)
    }
}

/// What the load's clients saw.
#[derive(Default)]
struct Seen {
    /// (event ID, status of the first delivery, `Idempotency-Status`)
    firsts: Vec<(String, u16, String)>,
    /// (event ID, status of its duplicate, `Idempotent-Replayed`)
    duplicates: Vec<(String, u16, String)>,
    errors: Vec<String>,
}

/// `clients` threads, each delivering unique events on new connections,
/// each followed by its duplicate, until `stop`.
fn load(
    addr: SocketAddr,
    path: &'static str,
    clients: usize,
    stop: Arc<AtomicBool>,
) -> (Arc<Mutex<Seen>>, Vec<std::thread::JoinHandle<()>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let threads = (0..clients)
        .map(|c| {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let id = eid(&format!("load{c}"));
                    let body = format!("{{\"id\":\"{id}\"}}");
                    let first = match kit::client::deliver(addr, path, Some(&id), body.as_bytes()) {
                        Ok(r) => r,
                        Err(e) => {
                            seen.lock().unwrap().errors.push(format!("{id}: {e}"));
                            continue;
                        }
                    };
                    let status = first.header("Idempotency-Status").unwrap_or("").to_string();
                    seen.lock()
                        .unwrap()
                        .firsts
                        .push((id.clone(), first.status, status));
                    match kit::client::deliver(addr, path, Some(&id), body.as_bytes()) {
                        Ok(r) => {
                            let replayed =
                                r.header("Idempotent-Replayed").unwrap_or("").to_string();
                            seen.lock()
                                .unwrap()
                                .duplicates
                                .push((id, r.status, replayed));
                        }
                        Err(e) => seen.lock().unwrap().errors.push(format!("{id} again: {e}")),
                    }
                }
            })
        })
        .collect();
    (seen, threads)
}

/// Every first delivery forwarded (200), every duplicate replayed (200),
/// no connection error, and each event at the consumer exactly once.
fn check_load(seen: &Seen, up: &Consumer) {
    assert!(
        seen.errors.is_empty(),
        "connection errors: {:?}",
        seen.errors
    );
    let mut at_consumer = std::collections::HashMap::<String, usize>::new();
    for r in up.received() {
        *at_consumer
            .entry(r.key().unwrap_or("").to_string())
            .or_default() += 1;
    }
    for (id, status, how) in &seen.firsts {
        assert_eq!((*status, how.as_str()), (200, "forwarded"), "{id}");
        assert_eq!(
            at_consumer.get(id),
            Some(&1),
            "{id} reached the consumer once"
        );
    }
    for (id, status, replayed) in &seen.duplicates {
        assert_eq!(
            (*status, replayed.as_str()),
            (200, "true"),
            "duplicate of {id}"
        );
    }
}

fn routes_v1(up: &str) -> String {
    route(
        "a",
        "/hooks/a",
        up,
        "    verify: none\n    in_flight: wait\n",
    )
}

fn routes_v2(up: &str) -> String {
    format!(
        "{}{}",
        routes_v1(up),
        route("b", "/hooks/b", up, "    verify: none\n")
    )
}

/// One slow delivery in flight at the SIGQUIT, and a duplicate of it held
/// (`in_flight: wait`): each thread gives the answer and when it came.
struct Slow {
    id: String,
    first: std::thread::JoinHandle<(Response, Instant)>,
    held: std::thread::JoinHandle<(Response, Instant)>,
}

impl Slow {
    fn start(up: &Consumer, addr: SocketAddr) -> Slow {
        let id = eid("slow");
        up.script(
            &id,
            vec![Reply::status(200).delay(Duration::from_millis(2500))],
        );
        let deliver = {
            let id = id.clone();
            move || {
                let r = kit::client::deliver(addr, "/hooks/a", Some(&id), b"{\"slow\":1}").unwrap();
                (r, Instant::now())
            }
        };
        let first = std::thread::spawn(deliver.clone());
        while up.count(&id) == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let held = std::thread::spawn(deliver);
        std::thread::sleep(Duration::from_millis(300));
        Slow { id, first, held }
    }

    /// The slow one answered 200 by the old process; the held one 409 with
    /// `Retry-After` at once after the SIGQUIT, not when the slow one ends.
    fn check(self, quit: Instant, old: &Serve) -> String {
        let (first, _) = self.first.join().unwrap();
        assert_eq!(first.status, 200, "{first:?}");
        assert_eq!(first.header("Idempotency-Status"), Some("forwarded"));
        assert!(
            old.log().contains(&self.id),
            "the old process answered the slow one"
        );
        let (held, at) = self.held.join().unwrap();
        assert_eq!(held.status, 409, "{held:?}");
        assert!(held.header("Retry-After").is_some(), "{held:?}");
        let after = at.duration_since(quit);
        assert!(
            after < Duration::from_millis(1500),
            "the held duplicate was answered {after:?} after the SIGQUIT, not at once"
        );
        self.id
    }
}

/// Connections the old process accepted before the SIGQUIT whose requests
/// come after the hand-over: each (event ID, answer).
type Late = std::thread::JoinHandle<Vec<(String, Result<Response, String>)>>;

fn connect_early(addr: SocketAddr, old: &Serve) -> Late {
    let early: Vec<Client> = (0..3).map(|_| Client::connect(addr).unwrap()).collect();
    let old_log = old.log_path.clone();
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&old_log)
            .unwrap_or_default()
            .contains("listening sockets handed over")
        {
            assert!(Instant::now() < deadline, "no hand-over");
            std::thread::sleep(Duration::from_millis(5));
        }
        early
            .into_iter()
            .map(|mut c| {
                let id = eid("late");
                let r = c.request("POST", "/hooks/a", &[("X-Event-ID", &id)], b"{}");
                (id, r.map_err(|e| e.to_string()))
            })
            .collect()
    })
}

/// Answered by the old process, not cut, with `Connection: close`.
fn check_late(late: Late, up: &Consumer, old: &Serve) {
    for (id, r) in late.join().unwrap() {
        let r = r.unwrap_or_else(|e| panic!("{id}, connected before the SIGQUIT: {e}"));
        assert_eq!(r.status, 200, "{id}: {r:?}");
        assert_eq!(r.header("Connection"), Some("close"), "{id}: {r:?}");
        assert_eq!(up.count(&id), 1);
        assert!(
            old.log().contains(&id),
            "{id} was answered by the old process"
        );
    }
}

/// The whole story of SPEC §10 on one store; see the module comment.
fn upgrade_under_load(dir: TempDir, store: String) {
    let up = Consumer::start().unwrap();
    let mut s = Setup::new(dir, store);
    s.write(&routes_v1(&up.url()));
    let mut old = s.start();
    let r = kit::client::deliver(s.addr, "/hooks/b", Some(&eid("early")), b"{}").unwrap();
    assert_eq!(r.status, 404, "route b is not there yet");

    let stop = Arc::new(AtomicBool::new(false));
    let (seen, clients) = load(s.addr, "/hooks/a", 4, stop.clone());
    std::thread::sleep(Duration::from_millis(500));
    let slow = Slow::start(&up, s.addr);
    let late = connect_early(s.addr, &old);

    s.write(&routes_v2(&up.url()));
    let quit = Instant::now();
    let (new, overlap) = s.upgrade(&mut old);
    check_late(late, &up, &old);
    let slow = slow.check(quit, &old);

    // the load goes on against the new process for a while
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }

    // settled by the old process: its duplicate is replayed by the new one
    let again = kit::client::deliver(s.addr, "/hooks/a", Some(&slow), b"{\"slow\":1}").unwrap();
    assert_eq!(
        (again.status, again.header("Idempotent-Replayed")),
        (200, Some("true")),
        "{again:?}"
    );
    assert_eq!(up.count(&slow), 1);
    s.served_once(&up, "/hooks/b", "new-route", "the new route is served");

    let seen = seen.lock().unwrap();
    check_load(&seen, &up);
    eprintln!(
        "upgrade under load: {} unique deliveries and {} duplicates, 0 errors; \
         the old process exited {overlap:?} after SIGQUIT",
        seen.firsts.len(),
        seen.duplicates.len()
    );
    drop(new);
}

#[test]
fn upgrade_under_load_on_sqlite() {
    let dir = TempDir::new("upgrade-sqlite");
    let store = dir.sqlite_url("u.db");
    upgrade_under_load(dir, store);
}

#[test]
fn upgrade_under_load_on_postgres() {
    let Some(base) = pg_url() else { return };
    let schema = PgSchema::create(&base, "upgrade");
    upgrade_under_load(TempDir::new("upgrade-pg"), schema.url());
}

/// An invalid config exits 2 before it takes anything; the old process
/// serves on, and a valid upgrade after it works.
#[test]
fn an_invalid_config_exits_2_and_the_old_process_serves_on() {
    let up = Consumer::start().unwrap();
    let mut s = Setup::sqlite_v1("upgrade-invalid", &up);
    let mut old = s.start();
    s.write(&routes_v1(&up.url()).replace("verify: none", "verify: nonsense"));
    let mut bad = s.spawn(true);
    assert_eq!(bad.wait(Duration::from_secs(20)), Some(2), "{}", bad.log());
    assert!(bad.log().contains("idemgate.yaml:"), "{}", bad.log());
    assert!(
        !s.sock.exists(),
        "the invalid one never waited on upgrade_sock"
    );
    let id = eid("after-invalid");
    let r = kit::client::deliver(s.addr, "/hooks/a", Some(&id), b"{}").unwrap();
    assert_eq!((r.status, up.count(&id)), (200, 1));
    assert!(old.running());

    s.write(&routes_v2(&up.url()));
    let (_new, _) = s.upgrade(&mut old);
    let r = kit::client::deliver(s.addr, "/hooks/b", Some(&eid("b")), b"{}").unwrap();
    assert_eq!(r.status, 200);
}

/// SIGQUIT with no `serve --upgrade` waiting: ignored after its wait, and
/// the process goes on serving (it does not stop with nobody to take over).
#[test]
fn sigquit_without_a_new_process_is_ignored() {
    let up = Consumer::start().unwrap();
    let mut s = Setup::sqlite_v1("upgrade-alone", &up);
    let mut old = s.start();
    old.signal("-QUIT");
    let mut last = 0;
    let deadline = Instant::now() + Duration::from_secs(33);
    while Instant::now() < deadline {
        let id = eid("alone");
        let r = kit::client::deliver(s.addr, "/hooks/a", Some(&id), b"{}").unwrap();
        assert_eq!(r.status, 200);
        last += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(old.running(), "{}", old.log());
    assert!(old.log().contains("SIGQUIT ignored"), "{}", old.log());
    assert!(last > 10);
    old.signal("-TERM");
    assert_eq!(old.wait(Duration::from_secs(20)), Some(0));
}

/// Ten upgrades in a row under load: no error, each event once.
#[test]
fn ten_upgrades_in_a_row_under_load() {
    let up = Consumer::start().unwrap();
    let mut s = Setup::sqlite_v1("upgrade-ten", &up);
    let mut current = s.start();
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, clients) = load(s.addr, "/hooks/a", 3, stop.clone());
    let mut overlaps = Vec::new();
    for i in 0..10 {
        std::thread::sleep(Duration::from_millis(200));
        // alternate the configs: a route comes and goes
        if i % 2 == 0 {
            s.write(&routes_v2(&up.url()));
        } else {
            s.write(&routes_v1(&up.url()));
        }
        let (new, overlap) = s.upgrade(&mut current);
        overlaps.push(overlap);
        current = new;
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    check_load(&seen, &up);
    assert!(seen.firsts.len() > 50, "{} deliveries", seen.firsts.len());
    eprintln!(
        "ten upgrades: {} unique deliveries and {} duplicates, 0 errors; old processes exited after {overlaps:?}",
        seen.firsts.len(),
        seen.duplicates.len()
    );
}

/// A kept-alive connection idle at the hand-over is closed by the old
/// process; the client's next request, on a new connection, is served.
#[test]
fn an_idle_kept_alive_connection_is_closed_at_the_hand_over() {
    let up = Consumer::start().unwrap();
    let mut s = Setup::sqlite_v1("upgrade-idle", &up);
    let mut old = s.start();
    let mut kept = Client::connect(s.addr).unwrap();
    let id = eid("kept");
    let r = kept
        .request("POST", "/hooks/a", &[("X-Event-ID", &id)], b"{}")
        .unwrap();
    assert_eq!(r.status, 200);
    let (_new, _) = s.upgrade(&mut old);
    // closed: the next read sees the end of the stream
    assert!(kept
        .request("POST", "/hooks/a", &[("X-Event-ID", &id)], b"{}")
        .is_err());
    let r = kit::client::deliver(s.addr, "/hooks/a", Some(&id), b"{}").unwrap();
    assert_eq!(r.header("Idempotent-Replayed"), Some("true"));
}

/// One delivery over TLS trusting only `ca_pem`; `Err` when the handshake
/// fails (the server's certificate is not from that CA).
fn deliver_tls(ca_pem: &str, addr: SocketAddr, id: &str) -> Result<String, String> {
    use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let req = format!(
        "POST /hooks/a HTTP/1.1\r\nHost: localhost\r\nX-Event-ID: {id}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    tls.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut out = String::new();
    match tls.read_to_string(&mut out) {
        Ok(_) => Ok(out),
        // the server closes without close_notify after Connection: close
        Err(_) if out.starts_with("HTTP/1.1") => Ok(out),
        Err(e) => Err(e.to_string()),
    }
}

/// A renewed certificate takes effect through an upgrade (SPEC §9): the
/// new process reads the files again.
#[test]
fn a_renewed_certificate_is_served_after_an_upgrade() {
    let up = Consumer::start().unwrap();
    let dir = TempDir::new("upgrade-tls");
    let store = dir.sqlite_url("u.db");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let mut s = Setup::new(dir, store);
    let tls = format!(
        "tls:\n  cert: file:{}\n  key: file:{}\n",
        cert.display(),
        key.display()
    );
    let (ca_a, leaf_a, key_a) = certificates();
    std::fs::write(&cert, leaf_a).unwrap();
    std::fs::write(&key, key_a).unwrap();
    s.write(&format!("{}{tls}", routes_v1(&up.url())));
    let mut old = s.start();
    let ok = deliver_tls(&ca_a, s.addr, &eid("tls-a")).unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");

    let (ca_b, leaf_b, key_b) = certificates();
    std::fs::write(&cert, leaf_b).unwrap();
    std::fs::write(&key, key_b).unwrap();
    // the running process keeps the certificate it read at start
    assert!(deliver_tls(&ca_a, s.addr, &eid("tls-a2")).is_ok());
    let (_new, _) = s.upgrade(&mut old);
    let ok = deliver_tls(&ca_b, s.addr, &eid("tls-b")).unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(
        deliver_tls(&ca_a, s.addr, &eid("tls-a3")).is_err(),
        "the old certificate is gone"
    );
}

/// A plain start on a busy port still exits 1 at once.
#[test]
fn a_plain_start_on_a_busy_port_exits_1() {
    let dir = TempDir::new("upgrade-busy");
    let store = dir.sqlite_url("u.db");
    let mut s = Setup::new(dir, store);
    let _busy = std::net::TcpListener::bind(s.addr).unwrap();
    s.write(&routes_v1("http://127.0.0.1:9"));
    let mut p = s.spawn(false);
    assert_eq!(p.wait(Duration::from_secs(20)), Some(1), "{}", p.log());
    assert!(p.log().contains("cannot listen on"), "{}", p.log());
}

/// The `MAINPID=` of the next notify message (which also says `READY=1`).
fn main_pid(notify: &std::os::unix::net::UnixDatagram) -> String {
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("a notify message");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.contains("READY=1"), "{msg}");
    msg.lines()
        .find_map(|l| l.strip_prefix("MAINPID="))
        .expect("MAINPID=")
        .to_string()
}

/// The unit's `ExecReload` upgrade command, as systemd would run it under
/// `sh -c`: `$$` becomes `$` (systemd sets MAINPID for ExecReload), with
/// this build's binary.
fn reload_script() -> String {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config/systemd/idemgate.service"),
    )
    .unwrap();
    let reloads: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("ExecReload="))
        .collect();
    assert_eq!(reloads.len(), 2, "check, then the upgrade: {reloads:?}");
    assert_eq!(reloads[0], "/usr/local/bin/idemgate check");
    reloads[1]
        .strip_prefix("/bin/sh -c '")
        .and_then(|c| c.strip_suffix('\''))
        .expect("ExecReload=/bin/sh -c '...'")
        .replace("/usr/local/bin/idemgate", bin())
        .replace("$$", "$")
}

/// A process this test did not start itself (the reload's); SIGTERM, and
/// waits until it is gone, also when the test fails first.
struct Adopted(String);

impl Adopted {
    fn gone(&self) -> bool {
        match std::fs::read_to_string(format!("/proc/{}/stat", self.0)) {
            Ok(stat) => stat.contains(") Z "),
            Err(_) => true,
        }
    }

    fn stop(&self) -> bool {
        let _ = Command::new("kill").args(["-TERM", &self.0]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.gone() {
            if Instant::now() >= deadline {
                let _ = Command::new("kill").args(["-KILL", &self.0]).status();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }
}

impl Drop for Adopted {
    fn drop(&mut self) {
        if !self.gone() {
            self.stop();
        }
    }
}

/// systemd's side of `config/systemd/idemgate.service`, played by the test:
/// a notify socket (`Type=notify`, `NotifyAccess=all`) and the unit's own
/// `ExecReload` shell command with `$MAINPID`. The plain start says
/// `MAINPID=` and `READY=1`; after the reload the new process says it is
/// the main process, before the old one has exited; the old exits 0.
#[test]
fn the_systemd_unit_reloads_without_downtime() {
    let up = Consumer::start().unwrap();
    let dir = TempDir::new("upgrade-systemd");
    let store = dir.sqlite_url("u.db");
    let notify_path = dir.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut s = Setup::new(dir, store);
    let notify_env = notify_path.display().to_string();
    s.env = vec![("NOTIFY_SOCKET".to_string(), notify_env.clone())];
    s.write(&routes_v1(&up.url()));
    let mut old = s.start();
    assert_eq!(main_pid(&notify), old.pid());

    s.write(&routes_v2(&up.url()));
    let config = s.config.display().to_string();
    let (code, _, err) = cli_env(&["check"], &[("IDEMGATE_CONFIG", config.as_str())]);
    assert_eq!(code, 0, "{err}");
    let log = std::fs::File::create(s.dir.path().join("reloaded.log")).unwrap();
    let status = Command::new("/bin/sh")
        .args(["-c", &reload_script()])
        .env("MAINPID", old.pid())
        .env("IDEMGATE_CONFIG", &config)
        .env("NOTIFY_SOCKET", &notify_env)
        .env("RUST_LOG", "info")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .unwrap();
    assert!(status.success());
    let new = Adopted(main_pid(&notify));
    assert_ne!(new.0, old.pid());
    assert!(
        old.running(),
        "the old process is still there when the new one takes over"
    );
    assert_eq!(old.wait(Duration::from_secs(30)), Some(0), "{}", old.log());
    s.served_once(&up, "/hooks/b", "systemd-b", "served by the new process");
    // systemctl stop: SIGTERM to the new main process
    assert!(new.stop(), "the new process stops on SIGTERM");
}
