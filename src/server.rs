//! Assembles the pingora server from `(Config, store, Metrics)` and runs it:
//! the proxy service, the admin listener and the sweeper, with a graceful
//! stop on SIGTERM/SIGINT that lets in-flight requests settle, and the
//! zero-downtime upgrade of SPEC §10: a new `serve --upgrade` waits on
//! `upgrade_sock`, SIGQUIT makes this process hand it the listening sockets
//! and drain like a graceful stop.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::connectors::http::Connector;
use pingora::connectors::ConnectorOptions;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{
    ExecutionPhase, ListenFds, RunArgs, Server, ShutdownSignal, ShutdownSignalWatch, ShutdownWatch,
};
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use pingora::services::{ServiceReadyNotifier, ServiceWithDependents};

use crate::admin::Admin;
use crate::config::Config;
use crate::listener::{self, Downstream, Table};
use crate::metrics::Metrics;
use crate::proxy::idle::PruneIdle;
use crate::proxy::routes::RouteTable;
use crate::proxy::{Gate, InFlightRequests};
use crate::store::ClaimStore;
use crate::sweeper::Sweeper;

/// How long SIGQUIT waits for a new `serve --upgrade` to appear on
/// `upgrade_sock` (it may still be connecting its store); past it the
/// SIGQUIT is ignored and this process goes on serving.
const WAIT_FOR_SUCCESSOR: Duration = Duration::from_secs(30);

/// pingora's table of listening sockets, once the proxy service has it.
type SharedFds = Arc<OnceLock<ListenFds>>;

/// SIGTERM and SIGINT mean "stop gracefully"; SIGQUIT means "hand the
/// listening sockets to the new process waiting on `upgrade_sock`, then stop
/// gracefully" — and is ignored (logged) when no new process comes.
struct Signals {
    upgrade_sock: PathBuf,
    fds: SharedFds,
    in_flight: Arc<InFlightRequests>,
}

#[async_trait]
impl ShutdownSignalWatch for Signals {
    async fn recv(&self) -> ShutdownSignal {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        let mut quit = signal(SignalKind::quit()).expect("SIGQUIT handler");
        loop {
            let upgrade = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
                _ = quit.recv() => "SIGQUIT",
            };
            if upgrade != "SIGQUIT" {
                tracing::info!("{upgrade}: stopping gracefully");
                return ShutdownSignal::GracefulTerminate;
            }
            // a stop asked for while waiting for the new process wins
            let handed = tokio::select! {
                handed = self.hand_over() => handed,
                _ = term.recv() => true,
                _ = int.recv() => true,
            };
            if handed {
                return ShutdownSignal::GracefulTerminate;
            }
        }
    }
}

impl Signals {
    /// Waits for the new process on `upgrade_sock` and sends it the
    /// listening sockets (proxy and admin); `true` once they are sent.
    async fn hand_over(&self) -> bool {
        let sock = self.upgrade_sock.display().to_string();
        tracing::info!(upgrade_sock = %sock, "SIGQUIT: handing the listening sockets to the new process");
        let deadline = Instant::now() + WAIT_FOR_SUCCESSOR;
        while !is_socket(&self.upgrade_sock) {
            if Instant::now() >= deadline {
                tracing::error!(
                    upgrade_sock = %sock,
                    "SIGQUIT ignored: no `serve --upgrade` waits on upgrade_sock (30s); still serving"
                );
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let Some(fds) = self.fds.get().cloned() else {
            tracing::error!("SIGQUIT ignored: the listeners are not open yet; still serving");
            return false;
        };
        let path = sock.clone();
        let sent =
            tokio::task::spawn_blocking(move || fds.lock().send_to_sock(path.as_str())).await;
        match sent {
            Ok(Ok(_)) => {
                // held duplicates are answered now; the stop follows at once
                self.in_flight.hand_over();
                tracing::info!("listening sockets handed over; draining");
                true
            }
            Ok(Err(e)) => {
                tracing::error!(upgrade_sock = %sock, error = %e, "cannot hand the listening sockets over; still serving");
                false
            }
            Err(e) => {
                tracing::error!(error = %e, "the hand-over failed; still serving");
                false
            }
        }
    }
}

fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// The proxy service, keeping hold of pingora's table of listening sockets
/// (shared by every service) for the hand-over on SIGQUIT.
struct KeepFds<S> {
    inner: S,
    fds: SharedFds,
}

#[async_trait]
impl<S: ServiceWithDependents> ServiceWithDependents for KeepFds<S> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
        ready_notifier: ServiceReadyNotifier,
    ) {
        if let Some(f) = &fds {
            let _ = self.fds.set(f.clone());
        }
        self.inner
            .start_service(fds, shutdown, listeners_per_fd, ready_notifier)
            .await
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn threads(&self) -> Option<usize> {
        self.inner.threads()
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        self.inner.listen_addresses()
    }
}

/// pingora's settings for one idemgate process. The pid file defaults to
/// a fixed `/tmp` path that two processes would share; the upgrade socket
/// is the config's `upgrade_sock` (shared on purpose by old and new).
pub fn server_conf(config: &Config) -> ServerConf {
    let pid = std::process::id();
    let tmp = std::env::temp_dir();
    let threads = config.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    });
    ServerConf {
        threads,
        work_stealing: true,
        pid_file: tmp
            .join(format!("idemgate-{pid}.pid"))
            .display()
            .to_string(),
        upgrade_sock: config.upgrade_sock.display().to_string(),
        grace_period_seconds: Some(config.shutdown_grace.as_secs().max(1)),
        graceful_shutdown_timeout_seconds: Some(1),
        upstream_keepalive_pool_size: 256,
        ..ServerConf::default()
    }
}

/// Builds the proxy gate (also used by tests and the demo).
pub fn gate(
    config: &Config,
    conf: &ServerConf,
    store: Arc<dyn ClaimStore>,
    metrics: Metrics,
) -> Result<Gate, String> {
    let routes = RouteTable::new(config.routes.clone())?;
    metrics.init_routes(routes.iter().map(|r| r.name()));
    Ok(Gate {
        routes,
        store,
        metrics,
        connector: Connector::new(Some(ConnectorOptions::from_server_conf(conf))),
        in_flight: Arc::new(InFlightRequests::default()),
        seen: Default::default(),
    })
}

/// On a plain start, a busy address is an error at once (pingora would
/// retry it for a long while). An upgrade takes its addresses over instead.
fn check_free(config: &Config) -> Result<(), String> {
    for (what, addr) in [
        ("listen", config.listen),
        ("admin_listen", config.admin_listen),
    ] {
        std::net::TcpListener::bind(addr)
            .map_err(|e| format!("{what}: cannot listen on {addr}: {e}"))?;
    }
    Ok(())
}

/// Runs until SIGTERM/SIGINT (or a hand-over on SIGQUIT), then drains:
/// stops accepting, closes idle kept-alive connections, waits for the
/// requests in flight (at most `shutdown_grace`), and returns. With
/// `upgrade`, first takes the listening sockets over from the running
/// process that shares `upgrade_sock` (pingora ends the process with
/// status 1 when none sends them within a few seconds).
pub fn run(
    config: Config,
    store: Arc<dyn ClaimStore>,
    metrics: Metrics,
    upgrade: bool,
) -> Result<(), String> {
    if !upgrade {
        check_free(&config)?;
    }
    let conf = server_conf(&config);
    let gate = gate(&config, &conf, store.clone(), metrics.clone())?;
    let in_flight = gate.in_flight.clone();
    let opt = upgrade.then(|| Opt {
        upgrade: true,
        ..Opt::default()
    });
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    if upgrade {
        tracing::info!(
            upgrade_sock = %config.upgrade_sock.display(),
            "waiting for the listening sockets: send SIGQUIT to the running idemgate"
        );
    }
    server.bootstrap();
    let fds = SharedFds::default();
    let table = add_services(&mut server, &config, gate, store, metrics, fds.clone());
    let (done, finished) = mpsc::channel();
    spawn_drain_watch(
        server.watch_execution_phase(),
        in_flight.clone(),
        table,
        config.shutdown_grace,
        done.clone(),
    );
    tracing::info!(
        listen = %config.listen,
        admin = %config.admin_listen,
        tls = config.tls.is_some(),
        max_connections = config.downstream.max_connections,
        upgraded = upgrade,
        "idemgate serving"
    );
    let signals = Signals {
        upgrade_sock: config.upgrade_sock.clone(),
        fds,
        in_flight,
    };
    // pingora sleeps out the whole grace period after a stop; the drain
    // watch says when it is done sooner, and the caller exits then
    std::thread::spawn(move || {
        server.run(RunArgs {
            shutdown_signal: Box::new(signals),
        });
        let _ = done.send(());
    });
    let _ = finished.recv();
    Ok(())
}

/// Adds the proxy, admin and background services; returns the proxy
/// listener's connection table (for the drain).
fn add_services(
    server: &mut Server,
    config: &Config,
    gate: Gate,
    store: Arc<dyn ClaimStore>,
    metrics: Metrics,
    fds: SharedFds,
) -> Arc<Table> {
    let conf = server.configuration.clone();
    let prune_idle = PruneIdle {
        routes: gate.routes.iter().cloned().collect(),
    };
    let downstream = Downstream::new(
        pingora::proxy::http_proxy(&conf, gate),
        &config.downstream,
        config.tls.as_ref(),
        &metrics,
    );
    let reaper = downstream.reaper();
    let table = reaper.table();
    let mut proxy = Service::new("idemgate proxy".to_string(), downstream);
    proxy.add_listener(
        ListenerConfig::tcp(config.listen.to_string())
            .l4_buffer(L4BufferSettings::default().read(listener::L4_READ_BUFFER)),
    );
    server.add_service(KeepFds { inner: proxy, fds });
    server.add_service(background_service("client connections", reaper));

    let mut admin = Service::new(
        "idemgate admin".to_string(),
        Admin {
            store: store.clone(),
            metrics: metrics.clone(),
            proxy_listen: config.listen,
            proxy_up: Default::default(),
            api: crate::admin::api::Api::new(config, store.clone(), metrics.clone()),
            loopback_only: config.admin_listen.ip().is_loopback(),
        },
    );
    admin.add_tcp(&config.admin_listen.to_string());
    server.add_service(admin);

    let sweeper = Sweeper {
        store,
        metrics,
        interval: config.sweeper.interval,
        batch_size: config.sweeper.batch_size as i64,
        routes: config.routes.iter().map(|r| r.name.clone()).collect(),
    };
    server.add_service(background_service("sweeper", sweeper));
    server.add_service(background_service("idle upstream connections", prune_idle));
    table
}

/// Follows pingora's phases: once running, tells systemd ([`notify_systemd`]);
/// once the stop begins, waits for the drain ([`drain`]) and says so on
/// `done`.
fn spawn_drain_watch(
    mut phases: tokio::sync::broadcast::Receiver<ExecutionPhase>,
    in_flight: Arc<InFlightRequests>,
    table: Arc<Table>,
    grace: Duration,
    done: mpsc::Sender<()>,
) {
    std::thread::spawn(move || loop {
        match phases.blocking_recv() {
            Ok(ExecutionPhase::Running) => notify_systemd(),
            Ok(ExecutionPhase::ShutdownStarted) => {
                let stopped = Instant::now();
                drain(&in_flight, &table, grace);
                if in_flight.handing_over() {
                    // the new process tells systemd it is the main process
                    // now; this one must not exit before (systemd would
                    // stop the service, the new process with it)
                    std::thread::sleep(HAND_OVER_LINGER.saturating_sub(stopped.elapsed()));
                }
                let _ = done.send(());
                return;
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(_) => return,
        }
    });
}

/// After a hand-over, the old process lives at least this long.
const HAND_OVER_LINGER: Duration = Duration::from_secs(1);

/// Under systemd (`Type=notify`, `NotifyAccess=all`, `NOTIFY_SOCKET` set):
/// this process is the service's main process and is ready. After an
/// upgrade that makes the new process the one systemd watches (and sends
/// SIGQUIT to on the next reload). Nothing without `NOTIFY_SOCKET`.
fn notify_systemd() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::UnixDatagram;
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let msg = format!("MAINPID={}\nREADY=1\n", std::process::id());
    let sent = UnixDatagram::unbound().and_then(|sock| match path.as_bytes() {
        [b'@', name @ ..] => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(msg.as_bytes(), &addr)
        }
        _ => sock.send_to(msg.as_bytes(), &path),
    });
    match sent {
        Ok(_) => tracing::info!("told systemd: ready, main process {}", std::process::id()),
        Err(e) => tracing::warn!(error = %e, "cannot notify systemd (NOTIFY_SOCKET)"),
    }
}

/// Waits, up to `grace`, until no guarded request is in flight and no
/// client connection has a request in progress or coming (idle kept-alive
/// connections are closed meanwhile).
fn drain(in_flight: &InFlightRequests, table: &Table, grace: Duration) {
    let started = Instant::now();
    let deadline = started + grace;
    loop {
        table.close_idle();
        let (requests, connections) = (in_flight.current(), table.busy());
        if requests == 0 && connections == 0 {
            tracing::info!(
                after_ms = started.elapsed().as_millis() as u64,
                "drained: no request in flight"
            );
            return;
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                in_flight = requests,
                connections,
                "grace period over with requests in flight"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
