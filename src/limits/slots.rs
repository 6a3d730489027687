//! `upstream_concurrency`: the requests of a route in flight, as one
//! counter, and the wake-up of one waiter when a slot is given back.

use std::sync::atomic::{AtomicU32, Ordering};

use super::over_limit::OverLimit;

/// A route's requests in flight.
#[derive(Debug, Default)]
pub struct Slots {
    in_flight: AtomicU32,
    /// Woken (one waiter) when a slot is given back, with `upstream_wait`.
    pub freed: tokio::sync::Notify,
}

impl Slots {
    /// Takes one of `max` slots, or refuses (retry in a second).
    pub fn take(&self, max: u32) -> Result<(), OverLimit> {
        let mut n = self.in_flight.load(Ordering::Acquire);
        loop {
            if n >= max {
                return Err(OverLimit::Saturated {
                    retry_after_secs: 1,
                });
            }
            match self.in_flight.compare_exchange_weak(
                n,
                n + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(()),
                Err(seen) => n = seen,
            }
        }
    }

    /// Takes a slot where there is no bound: counted only.
    pub fn count(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// Gives a slot back; `wake`: a waiter may be waiting for it.
    pub fn give_back(&self, wake: bool) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        if wake {
            self.freed.notify_one();
        }
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }
}
