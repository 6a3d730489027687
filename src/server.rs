//! Assembles the pingora server from `(Config, store, Metrics)` and runs it:
//! the proxy service, the admin listener and the sweeper, with a graceful
//! stop on SIGTERM/SIGINT that lets in-flight guarded requests settle.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::connectors::http::Connector;
use pingora::connectors::ConnectorOptions;
use pingora::listeners::{L4BufferSettings, ListenerConfig};
use pingora::server::configuration::ServerConf;
use pingora::server::{ExecutionPhase, RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};
use pingora::services::background::background_service;
use pingora::services::listening::Service;

use crate::admin::Admin;
use crate::config::Config;
use crate::listener::{self, Downstream};
use crate::metrics::Metrics;
use crate::proxy::idle::PruneIdle;
use crate::proxy::routes::RouteTable;
use crate::proxy::{Gate, InFlightRequests};
use crate::store::ClaimStore;
use crate::sweeper::Sweeper;

/// SIGTERM and SIGINT both mean "stop gracefully"; SIGQUIT is ignored (no
/// zero-downtime upgrade here).
struct StopOnSignal;

#[async_trait]
impl ShutdownSignalWatch for StopOnSignal {
    async fn recv(&self) -> ShutdownSignal {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping gracefully"),
            _ = int.recv() => tracing::info!("SIGINT: stopping gracefully"),
        }
        ShutdownSignal::GracefulTerminate
    }
}

/// pingora's settings for one idemgate process. The pid file and upgrade
/// socket default to fixed `/tmp` paths that two processes would share.
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
        upgrade_sock: tmp
            .join(format!("idemgate-{pid}.upgrade.sock"))
            .display()
            .to_string(),
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

/// Runs until SIGTERM/SIGINT, then drains: stops accepting, waits for the
/// guarded requests in flight (at most `shutdown_grace`), and returns.
pub fn run(config: Config, store: Arc<dyn ClaimStore>, metrics: Metrics) -> Result<(), String> {
    // pingora retries a busy address for a long while; say it at once instead
    for (what, addr) in [
        ("listen", config.listen),
        ("admin_listen", config.admin_listen),
    ] {
        std::net::TcpListener::bind(addr)
            .map_err(|e| format!("{what}: cannot listen on {addr}: {e}"))?;
    }
    let conf = server_conf(&config);
    let gate = gate(&config, &conf, store.clone(), metrics.clone())?;
    let in_flight = gate.in_flight.clone();
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
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
    let mut proxy = Service::new("idemgate proxy".to_string(), downstream);
    proxy.add_listener(
        ListenerConfig::tcp(config.listen.to_string())
            .l4_buffer(L4BufferSettings::default().read(listener::L4_READ_BUFFER)),
    );
    server.add_service(proxy);
    server.add_service(background_service("client connections", reaper));

    let mut admin = Service::new(
        "idemgate admin".to_string(),
        Admin {
            store: store.clone(),
            metrics: metrics.clone(),
            proxy_listen: config.listen,
            proxy_up: Default::default(),
            api: crate::admin::api::Api::new(&config, store.clone(), metrics.clone()),
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

    spawn_drain_watch(
        server.watch_execution_phase(),
        in_flight,
        config.shutdown_grace,
    );
    tracing::info!(
        listen = %config.listen,
        admin = %config.admin_listen,
        tls = config.tls.is_some(),
        max_connections = config.downstream.max_connections,
        "idemgate serving"
    );
    server.run(RunArgs {
        shutdown_signal: Box::new(StopOnSignal),
    });
    Ok(())
}

/// pingora sleeps out the whole grace period after a graceful stop; this
/// ends the process as soon as no guarded request is in flight.
fn spawn_drain_watch(
    mut phases: tokio::sync::broadcast::Receiver<ExecutionPhase>,
    in_flight: Arc<InFlightRequests>,
    grace: Duration,
) {
    std::thread::spawn(move || loop {
        match phases.blocking_recv() {
            Ok(ExecutionPhase::ShutdownGracePeriod) => {
                let deadline = Instant::now() + grace;
                while in_flight.current() > 0 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if in_flight.current() > 0 {
                    tracing::warn!(
                        in_flight = in_flight.current(),
                        "grace period over with requests in flight"
                    );
                } else {
                    tracing::info!("drained: no request in flight");
                }
                crate::telemetry::flush_logs();
                std::process::exit(0);
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(_) => return,
        }
    });
}
