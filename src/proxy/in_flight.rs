//! The guarded requests between claim and answer: counted for the graceful
//! drain, and told when this process hands its listeners over (SPEC §10).

use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts guarded requests between claim and answer, for the graceful
/// drain; and says when this process hands its listeners over to a new one
/// (SPEC §10), so that held duplicates are answered at once.
#[derive(Default)]
pub struct InFlightRequests(AtomicUsize, tokio::sync::watch::Sender<bool>);

impl InFlightRequests {
    pub fn current(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// The listeners went to a new process: held duplicates are answered
    /// now (409 with `Retry-After`), and none is held from here on.
    pub fn hand_over(&self) {
        self.1.send_replace(true);
    }

    pub fn handing_over(&self) -> bool {
        *self.1.borrow()
    }

    /// Resolves once [`InFlightRequests::hand_over`] was called.
    pub async fn handed_over(&self) {
        let mut rx = self.1.subscribe();
        let _ = rx.wait_for(|&over| over).await;
    }

    /// Counts a guarded request until the returned guard drops.
    pub fn enter(&self) -> InFlightGuard<'_> {
        self.0.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(self)
    }
}

/// A guarded request counted by [`InFlightRequests::enter`].
pub struct InFlightGuard<'a>(&'a InFlightRequests);

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::AcqRel);
    }
}
