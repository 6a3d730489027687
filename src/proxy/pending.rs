//! Settles carried across a store outage (SPEC §16). A settle that could
//! not commit within its few seconds of retries is not given up: the
//! upstream's answer is known, and once it commits every duplicate is
//! replayed rather than forwarded again. It is retried in the background
//! (the same fenced statement) until one second before its claim's lease
//! ends; until then the claim is live, so no other attempt can begin, and
//! duplicates meet it (409). So a failover shorter than the lease doubles
//! no delivery.
//!
//! A claim whose commit was not acknowledged (the store's answer was lost)
//! is carried the same way: released, fenced by its token, as soon as the
//! store answers again, rather than holding its event until the lease ends.
//! Whether it committed at all is unknown; the fenced release changes
//! nothing where it did not.
//!
//! Bounded: at most [`MAX_PENDING`] settles and [`MAX_PENDING_BYTES`] of
//! the answers they keep for replay (`replay_body`). One past either is
//! given up at once and logged; its claim then waits out its lease as
//! before (and under `on_ambiguous: hold` is held, SPEC §12).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::claim::{now_ms, Millis};
use crate::metrics::Metrics;
use crate::store::owned::{OwnedOutcome, OwnedSettle};
use crate::store::{ClaimStore, UnacknowledgedClaim};
use crate::telemetry::outage;

/// The most settles one process keeps.
pub const MAX_PENDING: usize = 10_000;
/// The most bytes of stored answers they keep, together.
pub const MAX_PENDING_BYTES: usize = 64 << 20;
/// How long before its lease's end a pending settle stops: a settle that
/// committed after the lease ended would race the next claim's attempt.
const MARGIN_MS: Millis = 1_000;
/// The first pause between tries, doubled up to [`LONGEST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// The settles this process carries.
#[derive(Default)]
pub struct PendingSettles {
    count: AtomicUsize,
    bytes: AtomicUsize,
}

impl PendingSettles {
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps `settle` and retries it until `lease_until - 1 s`. Returns
    /// false when there is no room or no time (logged here).
    pub(crate) fn carry(
        self: &Arc<Self>,
        store: &Arc<dyn ClaimStore>,
        metrics: &Metrics,
        settle: OwnedSettle,
        lease_until: Millis,
    ) -> bool {
        let give_up_at = lease_until - MARGIN_MS;
        let size = kept_bytes(&settle);
        let (route, event_id) = (settle.route.as_str(), settle.event_id.as_str());
        if now_ms() >= give_up_at {
            tracing::error!(
                route,
                event_id,
                attempt = settle.attempt,
                "settle given up: its lease ends within a second"
            );
            return false;
        }
        if !self.reserve(size) {
            tracing::error!(
                route,
                event_id,
                attempt = settle.attempt,
                pending = self.len(),
                "settle given up: {MAX_PENDING} settles or {} MiB already pending",
                MAX_PENDING_BYTES >> 20
            );
            return false;
        }
        metrics.settles_pending(self.len());
        let (this, store, metrics) = (Arc::clone(self), Arc::clone(store), metrics.clone());
        tokio::spawn(async move {
            this.retry(&*store, &metrics, settle, give_up_at).await;
            this.count.fetch_sub(1, Ordering::Relaxed);
            this.bytes.fetch_sub(size, Ordering::Relaxed);
            metrics.settles_pending(this.len());
        });
        true
    }

    /// Releases the claim `token` names once the store answers, until its
    /// lease would have ended anyway. Counted with the settles.
    pub fn carry_release(
        self: &Arc<Self>,
        store: &Arc<dyn ClaimStore>,
        route: &str,
        event_id: &str,
        token: i64,
        lease_until: Millis,
    ) {
        let size = 256 + route.len() + event_id.len();
        if !self.reserve(size) {
            tracing::warn!(
                route,
                event_id,
                "unacknowledged claim left to its lease: too much pending"
            );
            return;
        }
        let (this, store) = (Arc::clone(self), Arc::clone(store));
        let (route, event_id) = (route.to_owned(), event_id.to_owned());
        tokio::spawn(async move {
            let mut pause = FIRST_PAUSE;
            while now_ms() < lease_until {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LONGEST_PAUSE);
                let claim = UnacknowledgedClaim {
                    route: &route,
                    event_id: &event_id,
                    token,
                    now: now_ms(),
                };
                match store.release_unacknowledged(&claim).await {
                    Ok(true) => {
                        tracing::info!(
                            route,
                            event_id,
                            "a claim whose commit was not acknowledged had committed; released"
                        );
                        break;
                    }
                    Ok(false) => break,
                    Err(_) => {}
                }
            }
            this.count.fetch_sub(1, Ordering::Relaxed);
            this.bytes.fetch_sub(size, Ordering::Relaxed);
        });
    }

    fn reserve(&self, size: usize) -> bool {
        if self.count.fetch_add(1, Ordering::Relaxed) >= MAX_PENDING {
            self.count.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        if self.bytes.fetch_add(size, Ordering::Relaxed) + size > MAX_PENDING_BYTES {
            self.bytes.fetch_sub(size, Ordering::Relaxed);
            self.count.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    async fn retry(
        &self,
        store: &dyn ClaimStore,
        metrics: &Metrics,
        mut settle: OwnedSettle,
        give_up_at: Millis,
    ) {
        let mut pause = FIRST_PAUSE;
        let mut tries = 0u32;
        loop {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LONGEST_PAUSE);
            let now = now_ms();
            if now >= give_up_at {
                if outage::event_line("settle_given_up") {
                    tracing::error!(
                        route = settle.route,
                        event_id = settle.event_id,
                        attempt = settle.attempt,
                        tries,
                        "pending settle given up: its lease ends within a second"
                    );
                }
                metrics.settled(&settle.route, "error");
                return;
            }
            tries += 1;
            settle.now = now;
            let left = Duration::from_millis((give_up_at - now) as u64);
            if let Ok(result) = store.settle_within(&settle.req(), left).await {
                tracing::info!(
                    route = settle.route,
                    event_id = settle.event_id,
                    attempt = settle.attempt,
                    tries,
                    result = result.as_str(),
                    "pending settle committed"
                );
                metrics.settled(&settle.route, result.as_str());
                return;
            }
        }
    }
}

/// What a pending settle holds beyond its fixed part: the answer's body
/// and the names and error texts.
fn kept_bytes(s: &OwnedSettle) -> usize {
    let outcome = match &s.outcome {
        OwnedOutcome::Delivered {
            body, content_type, ..
        } => body.as_ref().map_or(0, Vec::len) + content_type.as_ref().map_or(0, String::len),
        OwnedOutcome::Failed { error, .. } | OwnedOutcome::Ambiguous { error } => {
            error.as_ref().map_or(0, String::len)
        }
    };
    let texts = s.route.len() + s.event_id.len() + s.instance.len();
    256 + outcome + texts + s.attempt_error.as_ref().map_or(0, String::len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_bounded_by_count_and_bytes_and_given_back() {
        let p = PendingSettles::default();
        assert!(p.reserve(MAX_PENDING_BYTES / 2));
        assert!(p.reserve(MAX_PENDING_BYTES / 2));
        assert!(!p.reserve(1), "past the bytes");
        assert_eq!(p.len(), 2);
        p.bytes.store(0, Ordering::Relaxed);
        p.count.store(MAX_PENDING - 1, Ordering::Relaxed);
        assert!(p.reserve(1));
        assert!(!p.reserve(1), "past the count");
        assert_eq!(p.len(), MAX_PENDING);
        assert_eq!(p.bytes.load(Ordering::Relaxed), 1);
    }
}
