//! Readiness follows a stop (SPEC §20): from SIGTERM/SIGINT until the
//! process exits, the admin listener goes on accepting and `/readyz` answers
//! 503, so a load balancer (or the kubelet) sees the process drain instead
//! of vanishing, and `/metrics` covers the drain's last seconds. After a
//! hand-over (SIGQUIT) the admin socket belongs to the new process, which
//! answers it; this one stops accepting there as pingora would, and answers
//! 503 on the connections it still holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pingora::server::{ListenFds, ShutdownWatch};

use super::wrap::AtStart;
use crate::proxy::InFlightRequests;

/// For the admin service, a shutdown signal of its own: it is told to
/// stop only after a hand-over; otherwise it serves until the process
/// exits. `stopping` is set as soon as pingora's stop begins (the admin's
/// `/readyz` reads it).
pub struct UntilExit {
    pub stopping: Arc<AtomicBool>,
    pub in_flight: Arc<InFlightRequests>,
}

impl AtStart for UntilExit {
    fn starting(&self, _: Option<&ListenFds>, shutdown: ShutdownWatch) -> ShutdownWatch {
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
        own_watch
    }
}
