//! Assembles the pingora server from `(Config, store, Metrics)` and runs it:
//! the proxy service, the admin listener and the sweeper, with a graceful
//! stop on SIGTERM/SIGINT that lets in-flight requests settle, and the
//! zero-downtime upgrade of SPEC §10: a new `serve --upgrade` waits on
//! `upgrade_sock`, SIGQUIT makes this process hand it the listening sockets
//! and drain like a graceful stop.

mod stopping;
mod upgrade;
mod wrap;

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use pingora::connectors::http::Connector;
use pingora::connectors::ConnectorOptions;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::{Opt, ServerConf};
use pingora::server::{ExecutionPhase, RunArgs, Server};
use pingora::services::background::background_service;
use pingora::services::listening::Service;

use crate::admin::Admin;
use crate::config::Config;
use crate::listener::{self, Downstream, Table};
use crate::metrics::Metrics;
use crate::paused::RouteState;
use crate::proxy::routes::PruneIdle;
use crate::proxy::routes::{RouteError, RouteTable};
use crate::proxy::{Gate, InFlightRequests, PendingSettles, Shared};
use crate::reconcile::{Background, Reconciler};
use crate::store::ClaimStore;
use crate::sweeper::Sweeper;
use stopping::UntilExit;
use upgrade::{KeepFds, SharedFds, SignalError, Signals};
use wrap::Wrapped;

/// Why the server could not start. `Display` is the line the CLI prints.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Signals(#[from] SignalError),
    /// On a plain start, the address is taken (or cannot be bound).
    #[error("{what}: cannot listen on {addr}: {source}")]
    Listen {
        /// The config key: `listen` or `admin_listen`.
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Route(#[from] RouteError),
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
) -> Result<Gate, RouteError> {
    let routes = RouteTable::new(config.routes.clone())?;
    metrics.init_routes(routes.iter().map(|r| r.name()));
    metrics.follow_limits(
        routes
            .iter()
            .map(|r| (r.name().to_owned(), r.limits.clone()))
            .collect(),
    );
    let tracing = config
        .telemetry
        .as_ref()
        .and_then(|t| t.otlp.as_ref())
        .map(|otlp| {
            Arc::new(crate::otel::Tracing::start(
                otlp,
                &config.instance,
                config.store.url.kind(),
                metrics.spans_dropped(),
            ))
        });
    let reconciler = Reconciler::new(
        &config.routes,
        store.clone(),
        metrics.clone(),
        config.instance.clone(),
    );
    Ok(Gate {
        routes,
        shared: Shared {
            store,
            metrics,
            connector: Connector::new(Some(ConnectorOptions::from_server_conf(conf))),
            in_flight: Arc::new(InFlightRequests::default()),
            seen: Default::default(),
            paused: Default::default(),
            instance: config.instance.clone(),
            pending: Default::default(),
            trusted_proxies: config.trusted_proxies.clone(),
            reconciler,
            tracing,
        },
    })
}

/// On a plain start, a busy address is an error at once (pingora would
/// retry it for a long while). An upgrade takes its addresses over instead.
fn check_free(config: &Config) -> Result<(), ServeError> {
    for (what, addr) in [
        ("listen", config.listen),
        ("admin_listen", config.admin_listen),
    ] {
        std::net::TcpListener::bind(addr).map_err(|source| ServeError::Listen {
            what,
            addr,
            source,
        })?;
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
) -> Result<(), ServeError> {
    let signals = upgrade::catch_signals()?;
    if !upgrade {
        check_free(&config)?;
    }
    let conf = server_conf(&config);
    let gate = gate(&config, &conf, store.clone(), metrics.clone())?;
    let in_flight = gate.shared.in_flight.clone();
    let (pending, gate_tracing) = (gate.shared.pending.clone(), gate.shared.tracing.clone());
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
    if upgrade {
        // the sockets are here: systemd is to follow this process from now
        // on, before the old one exits (it lingers for this)
        upgrade::notify_systemd();
    }
    let fds = SharedFds::default();
    let stopping = Arc::new(AtomicBool::new(false));
    let table = add_services(
        &mut server,
        &config,
        gate,
        (store, metrics),
        fds.clone(),
        stopping.clone(),
    );
    let (done, finished) = mpsc::channel();
    spawn_drain_watch(
        server.watch_execution_phase(),
        Draining {
            in_flight: in_flight.clone(),
            table,
            pending,
            tracing: gate_tracing,
        },
        config.shutdown_grace,
        upgrade,
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
        signals: tokio::sync::Mutex::new(signals),
        upgrade_sock: config.upgrade_sock.clone(),
        fds,
        in_flight,
        stopping,
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

/// The admin listener's service (`/readyz`, `/metrics`, the API, the
/// console).
fn admin_service(
    config: &Config,
    store: &Arc<dyn ClaimStore>,
    metrics: &Metrics,
    reconciler: &crate::reconcile::Reconciler,
    stopping: Arc<AtomicBool>,
) -> Service<Admin> {
    Service::new(
        "idemgate admin".to_string(),
        Admin {
            store: store.clone(),
            metrics: metrics.clone(),
            proxy_listen: config.listen,
            proxy_up: Default::default(),
            stopping,
            store_ping: Default::default(),
            not_ready_log: Default::default(),
            api: crate::admin::api::Api::new(
                config,
                store.clone(),
                metrics.clone(),
                reconciler.clone(),
            ),
            loopback_only: config.admin_listen.ip().is_loopback(),
            trusted_proxies: config.trusted_proxies.clone(),
        },
    )
}

/// Adds the proxy, admin and background services; returns the proxy
/// listener's connection table (for the drain).
fn add_services(
    server: &mut Server,
    config: &Config,
    gate: Gate,
    (store, metrics): (Arc<dyn ClaimStore>, Metrics),
    fds: SharedFds,
    stopping: Arc<AtomicBool>,
) -> Arc<Table> {
    let conf = server.configuration.clone();
    let in_flight = gate.shared.in_flight.clone();
    let prune_idle = PruneIdle {
        routes: gate.routes.iter().cloned().collect(),
    };
    let paused = gate.shared.paused.clone();
    let reconciler = gate.shared.reconciler.clone();
    let downstream = Downstream::new(
        pingora::proxy::http_proxy(&conf, gate),
        &config.downstream,
        config.tls.as_ref(),
        &metrics,
        listener::Senders::of(config),
    );
    let reaper = downstream.reaper();
    let table = reaper.table();
    let mut proxy = Service::new("idemgate proxy".to_string(), downstream);
    proxy.add_listener(
        ListenerConfig::tcp(config.listen.to_string())
            .l4_buffer(L4BufferSettings::default().read(listener::L4_READ_BUFFER)),
    );
    server.add_service(Wrapped {
        inner: proxy,
        at_start: KeepFds { fds },
    });
    server.add_service(background_service("client connections", reaper));

    let mut admin = admin_service(config, &store, &metrics, &reconciler, stopping.clone());
    admin.add_tcp(&config.admin_listen.to_string());
    server.add_service(Wrapped {
        inner: admin,
        at_start: UntilExit {
            stopping,
            in_flight: in_flight.clone(),
        },
    });

    let route_state = RouteState {
        store: store.clone(),
        metrics: metrics.clone(),
        routes: config.routes.iter().map(|r| r.name.clone()).collect(),
        paused,
    };
    server.add_service(background_service("route state", route_state));
    let sweeper = Sweeper {
        store,
        metrics,
        interval: config.sweeper.interval,
        batch_size: config.sweeper.batch_size as i64,
        routes: config.routes.iter().map(|r| r.name.clone()).collect(),
        last_swept: Default::default(),
    };
    server.add_service(background_service("sweeper", sweeper));
    server.add_service(background_service("reconcile", Background(reconciler)));
    server.add_service(background_service("idle upstream connections", prune_idle));
    table
}

/// Follows pingora's phases: once running, tells systemd ([`upgrade::notify_systemd`];
/// an upgrade did so on receiving the sockets);
/// once the stop begins, waits for the drain ([`drain`]) and says so on
/// `done`.
fn spawn_drain_watch(
    mut phases: tokio::sync::broadcast::Receiver<ExecutionPhase>,
    draining: Draining,
    grace: Duration,
    upgraded: bool,
    done: mpsc::Sender<()>,
) {
    std::thread::spawn(move || loop {
        match phases.blocking_recv() {
            Ok(ExecutionPhase::Running) if !upgraded => upgrade::notify_systemd(),
            Ok(ExecutionPhase::ShutdownStarted) => {
                let stopped = Instant::now();
                drain(&draining, grace);
                if let Some(t) = &draining.tracing {
                    t.stop();
                }
                if draining.in_flight.handing_over() && std::env::var_os("NOTIFY_SOCKET").is_some()
                {
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

/// After a hand-over under systemd, the old process lives at least this
/// long: the new one tells systemd it is the main process as soon as it has
/// the sockets.
const HAND_OVER_LINGER: Duration = Duration::from_secs(2);

/// How long the drain must see nothing in progress before it ends: a
/// connection pingora accepted just before the stop reaches the connection
/// table only when its task first runs.
const QUIET: Duration = Duration::from_millis(200);

/// What a graceful stop waits for.
struct Draining {
    in_flight: Arc<InFlightRequests>,
    table: Arc<Table>,
    /// Settles carried across a store outage (SPEC §16): their upstream
    /// answered, and a settle dropped here leaves its claim to the lease's
    /// end and then to SPEC §12 (a second delivery, or an event held).
    pending: Arc<PendingSettles>,
    /// The spans of the last requests, sent once they are drained.
    tracing: Option<Arc<crate::otel::Tracing>>,
}

/// Waits, up to `grace`, until no guarded request is in flight, no client
/// connection has a request in progress or coming, and no settle is still
/// carried, for [`QUIET`] (idle kept-alive connections are closed
/// meanwhile). A carried settle gives up by itself a second before its
/// lease ends, so a store that stays away holds the stop no longer than
/// that.
fn drain(d: &Draining, grace: Duration) {
    let started = Instant::now();
    let deadline = started + grace;
    let mut quiet_since: Option<Instant> = None;
    loop {
        d.table.close_idle();
        let (requests, connections, settles) =
            (d.in_flight.current(), d.table.busy(), d.pending.len());
        if requests > 0 || connections > 0 || settles > 0 {
            quiet_since = None;
        } else if quiet_since.get_or_insert_with(Instant::now).elapsed() >= QUIET {
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
                settles_pending = settles,
                "grace period over with requests in flight or settles pending"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
