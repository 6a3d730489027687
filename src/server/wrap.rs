//! A service wrapping another: what the wrapper does as the service
//! starts, and the rest passed through to its `inner` service unchanged.

use async_trait::async_trait;
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::{ServiceReadyNotifier, ServiceWithDependents};

/// What a wrapper adds as its service starts (`stopping::UntilExit`,
/// `upgrade::KeepFds`); everything else is the inner service's.
pub trait AtStart: Send + Sync {
    /// Sees pingora's listening sockets and shutdown signal as the service
    /// starts; answers the shutdown signal the inner service is given.
    fn starting(&self, fds: Option<&ListenFds>, shutdown: ShutdownWatch) -> ShutdownWatch;
}

/// `inner`, with `at_start` run as it starts.
pub struct Wrapped<S, W> {
    pub inner: S,
    pub at_start: W,
}

#[async_trait]
impl<S: ServiceWithDependents, W: AtStart> ServiceWithDependents for Wrapped<S, W> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
        ready_notifier: ServiceReadyNotifier,
    ) {
        let shutdown = self.at_start.starting(fds.as_ref(), shutdown);
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
