//! Readiness follows a stop (SPEC §20): from SIGTERM/SIGINT until the
//! process exits, the admin listener goes on accepting and `/readyz` answers
//! 503, so a load balancer (or the kubelet) sees the process drain instead
//! of vanishing, and `/metrics` covers the drain's last seconds. After a
//! hand-over (SIGQUIT) the admin socket belongs to the new process, which
//! answers it; this one stops accepting there as pingora would, and answers
//! 503 on the connections it still holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::{ServiceReadyNotifier, ServiceWithDependents};

use crate::proxy::InFlightRequests;

/// The admin service, given a shutdown signal of its own: it is told to stop
/// only after a hand-over; otherwise it serves until the process exits.
/// `stopping` is set as soon as pingora's stop begins (the admin's
/// `/readyz` reads it).
pub struct UntilExit<S> {
    pub inner: S,
    pub stopping: Arc<AtomicBool>,
    pub in_flight: Arc<InFlightRequests>,
}

#[async_trait]
impl<S: ServiceWithDependents> ServiceWithDependents for UntilExit<S> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
        ready_notifier: ServiceReadyNotifier,
    ) {
        let (own, own_watch) = tokio::sync::watch::channel(false);
        let (stopping, in_flight) = (self.stopping.clone(), self.in_flight.clone());
        tokio::spawn(async move {
            let mut shutdown = shutdown;
            // an error means pingora's sender is gone: a stop all the same
            let _ = shutdown.wait_for(|&stop| stop).await;
            stopping.store(true, Ordering::Release);
            if in_flight.handing_over() {
                let _ = own.send(true);
                return;
            }
            // the sender lives as long as the runtime: the listener closes
            // with the process
            std::future::pending::<()>().await;
            drop(own);
        });
        self.inner
            .start_service(fds, own_watch, listeners_per_fd, ready_notifier)
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
