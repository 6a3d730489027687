//! `upstream_wait`: a request refused for want of a slot or a token waits
//! for one, up to that long, in this process (see the folder's doc).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::clock::{now, Micros};
use super::over_limit::OverLimit;
use super::route::{Permit, RouteLimits};

/// Most requests of one route waiting for a slot or a token at once
/// (`upstream_wait`); past it a request is refused at once.
pub const MAX_WAITING: u32 = 256;

/// The longest `upstream_wait` a route may set: well inside any sender's
/// own timeout (GitHub's is 10 s).
pub const MAX_WAIT: Duration = Duration::from_secs(5);

impl RouteLimits {
    /// [`RouteLimits::admit`], and with `upstream_wait` a request refused
    /// for want of a slot or a token waits for one, up to that long (the
    /// breaker is never waited for). Cancel-safe: a waiter dropped
    /// mid-wait gives back its slot; a token it reserved is spent.
    pub async fn admit_waiting(
        self: &Arc<Self>,
        guarded: bool,
    ) -> Result<Option<Permit>, OverLimit> {
        let refused = match self.admit(now(), guarded) {
            Err(r @ OverLimit::Saturated { .. }) => r,
            other => return other,
        };
        let Some(wait) = self.cfg.wait else {
            return Err(refused);
        };
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= MAX_WAITING {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(refused);
        }
        let _waiting = Waiting(&self.waiting);
        let deadline = now() + wait.as_micros() as Micros;
        // the breaker's pass (its probe while half-open), for a guarded request
        let open = guarded && self.breaker.is_open();
        let mut permit = self.permit(open && self.breaker.pass(now())?);
        self.wait_for_slot(deadline).await?;
        permit.slot = true;
        if let Some(rate) = self.cfg.rate {
            let t = now();
            let due = self.rate.take(rate, t, deadline.saturating_sub(t))?;
            if due > t {
                tokio::time::sleep(Duration::from_micros(due - t)).await;
            }
        }
        Ok(Some(permit))
    }

    /// Takes a slot, waiting for one given back until `deadline`.
    async fn wait_for_slot(&self, deadline: Micros) -> Result<(), OverLimit> {
        let Some(max) = self.cfg.concurrency else {
            self.slots.count();
            return Ok(());
        };
        loop {
            let refused = match self.slots.take(max) {
                Ok(()) => return Ok(()),
                Err(r) => r,
            };
            let left = deadline.saturating_sub(now());
            if left == 0 {
                return Err(refused);
            }
            let freed = self.slots.freed.notified();
            // a slot given back between the check and here stored a
            // wakeup in `freed`: nothing is missed
            let _ = tokio::time::timeout(Duration::from_micros(left), freed).await;
        }
    }
}

/// One waiter counted in [`RouteLimits::admit_waiting`], uncounted on every exit.
struct Waiting<'a>(&'a AtomicU32);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
