//! The zero-downtime upgrade's side of the running process (SPEC §10): the
//! signals, caught from before the sockets arrive; on SIGQUIT, the hand-over
//! of pingora's listening sockets to the new `serve --upgrade` waiting on
//! `upgrade_sock`; and systemd's notify protocol, so that systemd follows
//! the new process.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::{ListenFds, ShutdownSignal, ShutdownSignalWatch, ShutdownWatch};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::wrap::AtStart;
use crate::proxy::InFlightRequests;

/// How long SIGQUIT waits for a new `serve --upgrade` to appear on
/// `upgrade_sock` (it may still be connecting its store); past it the
/// SIGQUIT is ignored and this process goes on serving.
const WAIT_FOR_SUCCESSOR: Duration = Duration::from_secs(30);

/// How long this process goes on accepting after sending the sockets,
/// at most, until the new process has taken them (it removes
/// `upgrade_sock` then; pingora's receiver looks for them once a second).
const WAIT_FOR_TAKE: Duration = Duration::from_secs(10);

/// pingora's table of listening sockets, once the proxy service has it.
pub type SharedFds = Arc<OnceLock<ListenFds>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sig {
    Term,
    Int,
    Quit,
}

/// Catches SIGTERM, SIGINT and SIGQUIT from now on, on a thread of its own:
/// a SIGQUIT that reaches a new process before pingora listens for signals
/// (an operator's next reload) must not kill it with the default action,
/// nor be lost.
pub fn catch_signals() -> Result<UnboundedReceiver<Sig>, SignalError> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(SignalError::Runtime)?;
    let (mut term, mut int, mut quit) = rt
        .block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::terminate())?,
                signal(SignalKind::interrupt())?,
                signal(SignalKind::quit())?,
            ))
        })
        .map_err(SignalError::Catch)?;
    let (tx, rx) = unbounded_channel();
    std::thread::Builder::new()
        .name("idemgate-signals".into())
        .spawn(move || {
            rt.block_on(async move {
                loop {
                    let sig = tokio::select! {
                        _ = term.recv() => Sig::Term,
                        _ = int.recv() => Sig::Int,
                        _ = quit.recv() => Sig::Quit,
                    };
                    if tx.send(sig).is_err() {
                        return;
                    }
                }
            })
        })
        .map_err(SignalError::Thread)?;
    Ok(rx)
}

/// Why the signals cannot be caught: each step's own I/O error.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    #[error("signal runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot catch signals: {0}")]
    Catch(#[source] std::io::Error),
    #[error("signal thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// SIGTERM and SIGINT mean "stop gracefully"; SIGQUIT means "hand the
/// listening sockets to the new process waiting on `upgrade_sock`, then stop
/// gracefully" — and is ignored (logged) when no new process comes.
pub struct Signals {
    pub signals: tokio::sync::Mutex<UnboundedReceiver<Sig>>,
    pub upgrade_sock: PathBuf,
    pub fds: SharedFds,
    pub in_flight: Arc<InFlightRequests>,
    /// Set as soon as a stop is asked for (the admin's `/readyz` answers
    /// 503 from then on), before pingora broadcasts it.
    pub stopping: Arc<AtomicBool>,
}

#[async_trait]
impl ShutdownSignalWatch for Signals {
    async fn recv(&self) -> ShutdownSignal {
        let mut signals = self.signals.lock().await;
        loop {
            match signals.recv().await {
                Some(Sig::Quit) => {}
                Some(sig) => {
                    self.stopping.store(true, Ordering::Release);
                    tracing::info!("{sig:?}: stopping gracefully");
                    return ShutdownSignal::GracefulTerminate;
                }
                None => return ShutdownSignal::GracefulTerminate,
            }
            let hand_over = self.hand_over();
            tokio::pin!(hand_over);
            // a stop asked for while waiting for the new process wins; a
            // second SIGQUIT changes nothing
            let handed = loop {
                tokio::select! {
                    handed = &mut hand_over => break handed,
                    sig = signals.recv() => match sig {
                        Some(Sig::Quit) => {}
                        Some(sig) => {
                            self.stopping.store(true, Ordering::Release);
                            tracing::info!("{sig:?} during the hand-over: stopping gracefully");
                            break true;
                        }
                        None => break true,
                    },
                }
            };
            if handed {
                return ShutdownSignal::GracefulTerminate;
            }
        }
    }
}

impl Signals {
    /// Waits for the new process on `upgrade_sock`, sends it the listening
    /// sockets (proxy and admin), and goes on accepting until it has taken
    /// them; `true` once they are sent.
    async fn hand_over(&self) -> bool {
        let sock = self.upgrade_sock.display().to_string();
        tracing::info!(upgrade_sock = %sock, "SIGQUIT: handing the listening sockets to the new process");
        if !wait_for(WAIT_FOR_SUCCESSOR, || is_socket(&self.upgrade_sock)).await {
            tracing::error!(
                upgrade_sock = %sock,
                "SIGQUIT ignored: no `serve --upgrade` waits on upgrade_sock (30s); still serving"
            );
            return false;
        }
        let Some(fds) = self.fds.get().cloned() else {
            tracing::error!("SIGQUIT ignored: the listeners are not open yet; still serving");
            return false;
        };
        let path = sock.clone();
        let sent =
            tokio::task::spawn_blocking(move || fds.lock().send_to_sock(path.as_str())).await;
        match sent {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::error!(upgrade_sock = %sock, error = %e, "cannot hand the listening sockets over; still serving");
                return false;
            }
            Err(e) => {
                tracing::error!(error = %e, "the hand-over failed; still serving");
                return false;
            }
        }
        if !wait_for(WAIT_FOR_TAKE, || !is_socket(&self.upgrade_sock)).await {
            tracing::warn!(upgrade_sock = %sock, "the new process did not take the sockets in 10s; stopping anyway");
        }
        // held duplicates are answered now; the stop follows at once
        self.in_flight.hand_over();
        tracing::info!("listening sockets handed over; draining");
        true
    }
}

/// Polls `done` every 20 ms for up to `limit`; whether it came true.
async fn wait_for(limit: Duration, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// For the proxy service: keeps hold of pingora's table of listening
/// sockets (shared by every service) for the hand-over on SIGQUIT.
pub struct KeepFds {
    pub fds: SharedFds,
}

impl AtStart for KeepFds {
    fn starting(&self, fds: Option<&ListenFds>, shutdown: ShutdownWatch) -> ShutdownWatch {
        if let Some(f) = fds {
            let _ = self.fds.set(f.clone());
        }
        shutdown
    }
}

/// Under systemd (`Type=notify`, `NotifyAccess=all`, `NOTIFY_SOCKET` set):
/// this process is the service's main process and is ready. After an
/// upgrade that makes the new process the one systemd watches (and sends
/// SIGQUIT to on the next reload). Nothing without `NOTIFY_SOCKET`.
pub fn notify_systemd() {
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
