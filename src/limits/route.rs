//! One route's limits and their state in this process ([`RouteLimits`]),
//! and what a request let through holds ([`Permit`]).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::breaker::{AttemptEnd, Breaker, BreakerCfg};
use super::clock::Micros;
use super::over_limit::OverLimit;
use super::rate::{Gcra, Rate};
use super::slots::Slots;

/// A route's limits as configured (each optional).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitsCfg {
    pub concurrency: Option<u32>,
    pub rate: Option<Rate>,
    pub breaker: Option<BreakerCfg>,
    /// `upstream_wait`: how long a request may wait for a slot or a token.
    pub wait: Option<Duration>,
}

/// One route's consumer protection and its state in this process.
#[derive(Debug)]
pub struct RouteLimits {
    pub(super) cfg: LimitsCfg,
    /// Any of the three is set: requests are counted and admitted.
    limited: bool,
    pub(super) slots: Slots,
    pub(super) rate: Gcra,
    pub(super) breaker: Breaker,
    /// Requests waiting for a slot or a token (`upstream_wait`).
    pub(super) waiting: AtomicU32,
}

/// What a request let through holds: its concurrency slot, and while the
/// breaker is half-open the one probe. Dropped on every exit (answer,
/// error, cancel, panic): the slot is given back, and a probe that never
/// came to an outcome lets the next delivery probe.
#[derive(Debug)]
pub struct Permit {
    limits: Arc<RouteLimits>,
    pub(super) slot: bool,
    /// Holds the half-open probe until its outcome is recorded.
    probe: AtomicBool,
}

/// What a route's breaker and load look like, for metrics and the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    pub in_flight: u32,
    /// `closed`, `open` or `half-open`.
    pub breaker: &'static str,
    /// While open: seconds until it half-opens.
    pub open_secs: u64,
    /// Requests waiting for a slot or a token (`upstream_wait`).
    pub waiting: u32,
}

impl RouteLimits {
    pub fn new(cfg: LimitsCfg) -> RouteLimits {
        RouteLimits {
            limited: cfg.concurrency.is_some() || cfg.rate.is_some() || cfg.breaker.is_some(),
            cfg,
            slots: Slots::default(),
            rate: Gcra::default(),
            breaker: Breaker::default(),
            waiting: AtomicU32::new(0),
        }
    }

    pub fn cfg(&self) -> &LimitsCfg {
        &self.cfg
    }

    /// Whether a limit is configured (the route's requests are counted).
    pub fn limited(&self) -> bool {
        self.limited
    }

    /// Admits a request at `now`: `Ok(None)` when nothing is to hold (a
    /// route without limits whose breaker is closed: one atomic load).
    /// `guarded` requests also pass the breaker; unguarded ones only the
    /// slot and the token. The breaker is asked first, then the slot, then
    /// the token (the one thing that is not given back).
    pub fn admit(
        self: &Arc<Self>,
        now: Micros,
        guarded: bool,
    ) -> Result<Option<Permit>, OverLimit> {
        let open = guarded && self.breaker.is_open();
        if !self.limited && !open {
            return Ok(None);
        }
        let mut permit = self.permit(open && self.breaker.pass(now)?);
        if !self.limited {
            return Ok(Some(permit));
        }
        match self.cfg.concurrency {
            Some(max) => self.slots.take(max)?,
            None => self.slots.count(),
        }
        permit.slot = true;
        if let Some(rate) = self.cfg.rate {
            self.rate.take(rate, now, 0)?;
        }
        Ok(Some(permit))
    }

    /// A permit holding no slot yet, and `probe`: the breaker's half-open
    /// probe.
    pub(super) fn permit(self: &Arc<Self>, probe: bool) -> Permit {
        Permit {
            limits: self.clone(),
            slot: false,
            probe: AtomicBool::new(probe),
        }
    }

    /// An attempt's end, for the breaker. `permit` is the attempt's own:
    /// a probe's outcome closes or reopens the breaker.
    pub fn ended(&self, permit: Option<&Permit>, now: Micros, end: AttemptEnd) {
        let probe = permit.is_some_and(|p| p.probe.swap(false, Ordering::AcqRel));
        self.breaker.ended(self.cfg.breaker, probe, now, end);
    }

    /// The upstream answered 429 or 503 with `Retry-After: for_`: the
    /// breaker opens that long (at most [`super::MAX_PUSHBACK`]),
    /// configured or not.
    pub fn pushed_back(&self, now: Micros, for_: Duration) {
        self.breaker.pushed_back(now, for_);
    }

    pub fn snapshot(&self, now: Micros) -> Snapshot {
        let (breaker, open_secs) = self.breaker.state(now);
        Snapshot {
            in_flight: self.slots.in_flight(),
            breaker,
            open_secs,
            waiting: self.waiting.load(Ordering::Acquire),
        }
    }
}

impl Permit {
    pub fn limits(&self) -> &RouteLimits {
        &self.limits
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.slot {
            let wake = self.limits.cfg.wait.is_some();
            self.limits.slots.give_back(wake);
        }
        if self.probe.load(Ordering::Acquire) {
            // no outcome: the next delivery probes
            self.limits.breaker.probe_lost();
        }
    }
}
