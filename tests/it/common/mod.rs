//! Integration-test harness: the real `idemgate` binary started on free
//! loopback ports against a real store (a SQLite file in a temp dir, or the
//! PostgreSQL server), a real sample consumer, and a blocking HTTP client
//! (all three from the `testkit` crate, tests/testkit). [`Harness`] puts
//! them together; everything a test starts is stopped when its handle drops.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use testkit::{
    self as kit, wait_until, Client, Consumer, Ports, Reply, Request, Response, Serve, Server,
};

pub mod binaries;
pub mod collector;
pub mod pg_cluster;
pub mod tmpfs;
pub mod valkey;
pub mod vip;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A fresh temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("idemgate-test-{tag}-{}-{n}", run_token()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn sqlite_url(&self, file: &str) -> String {
        format!("sqlite://{}", self.0.join(file).display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Names this test process apart from every other run, past ones included:
/// the pid alone is not enough, because a PostgreSQL server outlives the
/// runs that use it, and identical fresh machines running the same steps
/// hand out the same pids. A test that reused an earlier run's schema found
/// that run's records (its first delivery was answered as a duplicate).
fn run_token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos();
        format!("{}_{:x}", std::process::id(), nanos % (1 << 48))
    })
}

/// Seconds since the Unix epoch (signature timestamps).
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

/// A unique event ID for this test run.
pub fn eid(tag: &str) -> String {
    format!(
        "{tag}-{}-{}",
        run_token(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn free_port() -> u16 {
    kit::free_port().expect("a free loopback port")
}

/// The shipped binary, as `cargo build` makes it ([`binaries::shipped`]);
/// the crash tests' armed one is [`binaries::armed`].
pub fn bin() -> &'static str {
    binaries::shipped().to_str().expect("a UTF-8 path")
}

/// The PostgreSQL URL for tests: `IDEMGATE_TEST_PG_URL`, else the local
/// server. `None` (with a printed skip) when it is unreachable outside CI; in
/// CI (`CI` set) a missing database is a test failure.
pub fn pg_url() -> Option<String> {
    let url = std::env::var("IDEMGATE_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string());
    let reachable = std::net::TcpStream::connect_timeout(
        &"127.0.0.1:5432".parse().unwrap(),
        Duration::from_secs(2),
    )
    .is_ok();
    if reachable {
        return Some(url);
    }
    if std::env::var_os("CI").is_some() {
        panic!("PostgreSQL is not reachable at {url}, and CI requires it");
    }
    eprintln!(
        "SKIP: PostgreSQL is not reachable at {url} (set IDEMGATE_TEST_PG_URL); test skipped"
    );
    None
}

/// A fresh PostgreSQL schema for one test, so that tests and runs never
/// see each other's records; dropped with everything in it when this drops
/// (declare it before the proxies that use it, so that they stop first).
pub struct PgSchema {
    base: String,
    name: String,
}

/// Runs one SQL command through `psql` on `base`.
fn psql(base: &str, sql: &str) -> std::io::Result<std::process::Output> {
    Command::new("psql").args([base, "-q", "-c", sql]).output()
}

impl PgSchema {
    pub fn create(base: &str, tag: &str) -> PgSchema {
        let name = format!(
            "t_{tag}_{}_{}",
            run_token(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        // not IF NOT EXISTS: a schema that exists belongs to another run
        let out = psql(base, &format!("CREATE SCHEMA {name}")).expect("psql runs");
        assert!(
            out.status.success(),
            "creating schema: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PgSchema {
            base: base.to_string(),
            name,
        }
    }

    /// A URL whose connections land in this schema.
    pub fn url(&self) -> String {
        self.url_via(&self.base)
    }

    /// Like [`PgSchema::url`], for another way to the same server (a relay).
    pub fn url_via(&self, server: &str) -> String {
        let sep = if server.contains('?') { '&' } else { '?' };
        format!("{server}{sep}options=-csearch_path%3D{}", self.name)
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let _ = psql(
            &self.base,
            &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name),
        );
    }
}

/// A store for one test: a SQLite file in a temp dir, or a fresh
/// PostgreSQL schema (and a temp dir beside it); removed on drop.
pub struct TestStore {
    pub url: String,
    _schema: Option<PgSchema>,
    pub dir: TempDir,
}

impl TestStore {
    pub fn sqlite(tag: &str) -> TestStore {
        let dir = TempDir::new(tag);
        TestStore {
            url: dir.sqlite_url("h.db"),
            _schema: None,
            dir,
        }
    }

    /// `None` (the test skips) without a database outside CI, see [`pg_url`].
    pub fn postgres(tag: &str) -> Option<TestStore> {
        let schema = PgSchema::create(&pg_url()?, &tag.replace('-', "_"));
        Some(TestStore {
            url: schema.url(),
            _schema: Some(schema),
            dir: TempDir::new(tag),
        })
    }
}

/// `#[test] fn SQLITE` and `#[test] fn POSTGRES`, each running `RUN(store)`
/// on a fresh [`TestStore`] of its kind (the PostgreSQL one skips without a
/// database outside CI): one suite, once per backend.
macro_rules! on_both_stores {
    ($run:ident($tag:literal): $sqlite:ident, $postgres:ident) => {
        #[test]
        fn $sqlite() {
            $run($crate::common::TestStore::sqlite($tag));
        }

        #[test]
        fn $postgres() {
            if let Some(store) = $crate::common::TestStore::postgres($tag) {
                $run(store);
            }
        }
    };
}

/// One `idemgate serve` process.
pub struct Proxy {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
    /// Extra environment for the process (e.g. `env:` secrets), kept for respawns.
    env: Vec<(String, String)>,
    /// The binary to run: this build's `idemgate` unless a test names another.
    pub bin: PathBuf,
    /// Arguments after `serve --config FILE` (e.g. `--no-migrate`), kept
    /// for respawns.
    pub serve_args: Vec<String>,
    process: Option<Serve>,
}

/// Builds a config: `routes` is YAML for the `routes:` list, indented by 2.
pub fn config_text(port: u16, admin: u16, store_url: &str, routes: &str) -> String {
    format!(
        "listen: \"127.0.0.1:{port}\"\nadmin_listen: \"127.0.0.1:{admin}\"\nstore:\n  url: \"{store_url}\"\n\
         defaults:\n  lease: 10s\n  upstream_timeout: 5s\nroutes:\n{routes}"
    )
}

/// A guarded route with the event ID in `X-Event-ID`; `extra` lines are added
/// to the route (each starting with 4 spaces).
pub fn route(name: &str, prefix: &str, upstream: &str, extra: &str) -> String {
    format!(
        "  - name: {name}\n    match:\n      path_prefix: {prefix}\n    upstream: \"{upstream}\"\n    event_id:\n      header: X-Event-ID\n{extra}"
    )
}

impl Proxy {
    /// Starts `serve` with the given routes and store; waits for `/readyz`.
    pub fn start(dir: &TempDir, store_url: &str, routes: &str) -> Proxy {
        Self::start_with_env(dir, store_url, routes, &[])
    }

    /// Like [`Proxy::start`], with extra environment variables for the
    /// process (for `env:NAME` secrets).
    pub fn start_with_env(
        dir: &TempDir,
        store_url: &str,
        routes: &str,
        env: &[(&str, &str)],
    ) -> Proxy {
        Self::start_bin(Path::new(bin()), dir, store_url, routes, env)
    }

    /// Like [`Proxy::start_with_env`], running the binary at `bin`.
    pub fn start_bin(
        bin: &Path,
        dir: &TempDir,
        store_url: &str,
        routes: &str,
        env: &[(&str, &str)],
    ) -> Proxy {
        let ports = Ports::free().expect("free loopback ports");
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let config_path = dir.path().join(format!("proxy{n}.yaml"));
        let text = config_text(ports.listen.port(), ports.admin.port(), store_url, routes);
        std::fs::write(&config_path, text).unwrap();
        let mut p = Proxy {
            addr: ports.listen,
            admin: ports.admin,
            log_path: dir.path().join(format!("proxy{n}.log")),
            config_path,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            bin: bin.to_path_buf(),
            serve_args: Vec::new(),
            process: None,
        };
        p.spawn();
        p
    }

    /// (Re)starts the process with the same config; waits for `/readyz` 200.
    pub fn spawn(&mut self) {
        self.spawn_until(|status| status == 200);
    }

    /// (Re)starts the process; waits until `/readyz` answers at all (a
    /// store that cannot take writes yet answers 503).
    pub fn spawn_answering(&mut self) {
        self.spawn_until(|_| true);
    }

    fn spawn_until(&mut self, ready: impl Fn(u16) -> bool) {
        assert!(self.process.is_none(), "already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap();
        let mut process = Serve::spawn(
            Command::new(&self.bin)
                .args(["serve", "--config"])
                .arg(&self.config_path)
                .args(&self.serve_args)
                .env(
                    "RUST_LOG",
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
                )
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log),
        )
        .expect("idemgate starts");
        let waited = process.wait_ready(self.admin, Duration::from_secs(30), ready);
        self.process = Some(process);
        if let Err(e) = waited {
            panic!("{e}; log:\n{}", self.log());
        }
    }

    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log_path) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// POST with `X-Event-ID` on a fresh connection.
    pub fn deliver(&self, path: &str, event_id: Option<&str>, body: &[u8]) -> Response {
        kit::deliver(self.addr, path, event_id, body).expect("delivery")
    }

    /// POST with these header fields (owned, as a test builds them) on a
    /// fresh connection.
    pub fn post(&self, path: &str, headers: &[(String, String)], body: &[u8]) -> Response {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (&**k, &**v)).collect();
        self.client()
            .request("POST", path, &headers, body)
            .expect("delivery")
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr).expect("connect to proxy")
    }

    pub fn metrics(&self) -> String {
        String::from_utf8(kit::get(self.admin, "/metrics").expect("metrics").body).unwrap()
    }

    /// The value of one sample, e.g. `idemgate_requests_total{outcome="replayed",route="r"}`
    /// (labels in the exposition's sorted order); 0 when absent.
    pub fn metric(&self, series: &str) -> f64 {
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    }

    /// `idemgate_requests_total` for one route and outcome.
    pub fn requests(&self, route: &str, outcome: &str) -> f64 {
        self.metric(&format!(
            "idemgate_requests_total{{outcome=\"{outcome}\",route=\"{route}\"}}"
        ))
    }

    /// SIGTERM; waits up to `timeout` (then SIGKILL); the exit code.
    pub fn stop(&mut self, timeout: Duration) -> Option<i32> {
        self.process.take()?.stop(timeout)
    }

    /// The running process's pid (`None` once it stopped).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref()?.pid()
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }
}

/// A test's fixture: a temp dir, a loopback [`Consumer`], a store, and the
/// proxy process in front of the consumer. Built with
/// `Harness::sqlite(tag).route(..).start()`; dereferences to its [`Proxy`].
/// Dropping it stops the proxy, then the consumer, then removes the
/// PostgreSQL schema (if any) and the temp dir.
pub struct Harness {
    // Field order is drop order: the proxy stops before what it uses goes.
    pub px: Proxy,
    pub up: Consumer,
    /// The store URL the proxy was started with.
    pub store: String,
    /// The `routes:` YAML and the environment, for replicas.
    routes: String,
    env: Vec<(String, String)>,
    /// The store's schema and temp dir.
    pub test_store: TestStore,
}

/// What a [`Harness`] will start: see [`Harness::sqlite`].
pub struct HarnessBuilder {
    store: TestStore,
    up: Consumer,
    routes: String,
    env: Vec<(String, String)>,
}

impl Harness {
    /// A harness on a fresh SQLite file in a temp dir named after `tag`.
    pub fn sqlite(tag: &str) -> HarnessBuilder {
        Harness::on(TestStore::sqlite(tag))
    }

    /// The most common harness, started: SQLite and one guarded route `r`
    /// on `/hooks/r` to the consumer, with the `extra` route lines.
    pub fn guarded(tag: &str, extra: &str) -> Harness {
        Harness::sqlite(tag).route("r", "/hooks/r", extra).start()
    }

    /// A harness on a fresh schema of the test PostgreSQL server; `None`
    /// (the test skips) when there is none outside CI, see [`pg_url`].
    pub fn postgres(tag: &str) -> Option<HarnessBuilder> {
        TestStore::postgres(tag).map(Harness::on)
    }

    /// A harness on a given store (see [`on_both_stores`]).
    pub fn on(store: TestStore) -> HarnessBuilder {
        HarnessBuilder {
            store,
            // On a port from `free_port`, which never hands out one a test
            // reserved for an upstream it starts later.
            up: kit::on_free_port(|port| {
                Consumer::start_on(SocketAddr::from(([127, 0, 0, 1], port)))
            })
            .expect("the sample consumer starts"),
            routes: String::new(),
            env: Vec::new(),
        }
    }
}

fn start_proxy(dir: &TempDir, store: &str, routes: &str, env: &[(String, String)]) -> Proxy {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (&**k, &**v)).collect();
    Proxy::start_with_env(dir, store, routes, &env)
}

impl Harness {
    /// Another proxy process with the same config and store: a replica
    /// (stopped when it drops; drop it before the harness).
    pub fn replica(&self) -> Proxy {
        start_proxy(&self.test_store.dir, &self.store, &self.routes, &self.env)
    }

    /// The temp dir.
    pub fn dir(&self) -> &TempDir {
        &self.test_store.dir
    }

    /// The SQLite file of a [`Harness::sqlite`] store.
    pub fn sqlite_path(&self) -> PathBuf {
        self.dir().path().join("h.db")
    }
}

impl std::ops::Deref for Harness {
    type Target = Proxy;
    fn deref(&self) -> &Proxy {
        &self.px
    }
}

impl std::ops::DerefMut for Harness {
    fn deref_mut(&mut self) -> &mut Proxy {
        &mut self.px
    }
}

impl HarnessBuilder {
    /// A path in the harness's temp dir (for files the config names).
    pub fn path(&self, name: &str) -> PathBuf {
        self.store.dir.path().join(name)
    }

    /// The consumer's URL, for routes written by hand.
    pub fn upstream(&self) -> String {
        self.up.url()
    }

    /// A guarded route to the consumer (see [`route`]; `extra` lines indented by 4).
    pub fn route(self, name: &str, prefix: &str, extra: &str) -> HarnessBuilder {
        let url = self.up.url();
        self.route_to(name, prefix, &url, extra)
    }

    /// A guarded route to another upstream.
    pub fn route_to(mut self, name: &str, prefix: &str, upstream: &str, extra: &str) -> Self {
        self.routes += &route(name, prefix, upstream, extra);
        self
    }

    /// YAML appended as it is after the routes so far (more routes, or
    /// top-level sections such as `downstream:` or `admin:`).
    pub fn yaml(mut self, text: &str) -> HarnessBuilder {
        self.routes += text;
        self
    }

    /// YAML made from the consumer's URL, appended as [`HarnessBuilder::yaml`] does.
    pub fn yaml_with(self, make: impl FnOnce(&str) -> String) -> HarnessBuilder {
        let text = make(&self.up.url());
        self.yaml(&text)
    }

    /// An environment variable for the process (for `env:NAME` secrets).
    pub fn env(mut self, name: &str, value: &str) -> HarnessBuilder {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// Starts the proxy; waits for `/readyz` 200.
    pub fn start(self) -> Harness {
        let px = start_proxy(&self.store.dir, &self.store.url, &self.routes, &self.env);
        Harness {
            px,
            up: self.up,
            store: self.store.url.clone(),
            routes: self.routes,
            env: self.env,
            test_store: self.store,
        }
    }
}

/// The last `lines` lines of each replica's log, under a heading each, for
/// a failure message.
pub fn log_tails<'a>(replicas: impl IntoIterator<Item = &'a Proxy>, lines: usize) -> String {
    let mut out = String::new();
    for (i, p) in replicas.into_iter().enumerate() {
        let log = p.log();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        out.push_str(&format!("\n--- replica {i} log (tail) ---\n"));
        for l in tail.into_iter().rev() {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Runs `idemgate ARGS…`; returns (exit code, stdout, stderr).
pub fn cli(args: &[&str]) -> (i32, String, String) {
    cli_env(args, &[])
}

/// Like [`cli`], with extra environment variables for the process.
pub fn cli_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(bin())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("idemgate runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Asserts a record's state and attempt count, as `events show` prints them.
pub fn assert_state(store: &str, route: &str, event_id: &str, state: &str, attempts: i64) {
    let rec = show(store, route, event_id);
    assert_eq!(
        (rec["state"].as_str(), rec["attempts"].as_i64()),
        (Some(state), Some(attempts)),
        "{route}/{event_id}: {rec}"
    );
}

/// `events show --json` as a JSON value (panics unless found).
pub fn show(store: &str, route: &str, event_id: &str) -> serde_json::Value {
    let (code, out, err) = cli(&[
        "events", "show", "--store", store, "--route", route, event_id, "--json",
    ]);
    assert_eq!(code, 0, "events show: {err}");
    serde_json::from_str(&out).expect("events show --json prints JSON")
}

/// A CA, and a leaf for `localhost` signed by it: (ca PEM, leaf PEM, leaf key PEM).
pub fn certificates() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    (ca.pem(), leaf.pem(), leaf_key.serialize_pem())
}

/// The one request `h`'s consumer has received, checked to carry `body`.
#[track_caller]
pub fn only_request(h: &Harness, body: &[u8]) -> Request {
    let mut got = h.up.received();
    assert_eq!(got.len(), 1);
    let req = got.pop().unwrap();
    assert_eq!(req.body, body);
    req
}

/// A read that ran out of its timeout (`WouldBlock` or `TimedOut`, by platform).
pub fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// A store's `peek` for `event_id` with `digest` at `now` (lease and
/// retention do not matter to a read).
pub async fn peek(
    store: &dyn idemgate::store::ClaimStore,
    route: &str,
    event_id: &str,
    digest: &str,
    now: i64,
) -> Result<Option<idemgate::store::ClaimOutcome>, idemgate::store::StoreError> {
    let req = idemgate::store::ClaimRequest {
        route,
        event_id,
        digest,
        now,
        lease_ms: 0,
        retention_ms: 0,
        hold: false,
        instance: "test",
        token: 0,
        trace: None,
    };
    store.peek(&req).await
}

/// An operator's release of one record, as `events release` asks it.
pub fn release_req<'a>(
    route: &'a str,
    event_id: &'a str,
    force: bool,
    now: i64,
) -> idemgate::store::ReleaseRequest<'a> {
    idemgate::store::ReleaseRequest {
        route,
        event_id,
        force,
        now,
    }
}
