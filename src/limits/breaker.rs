//! `upstream_breaker`: opens after `failures` consecutive failed attempts
//! for `open`, or for as long as an upstream's 429/503 `Retry-After` says;
//! then half-open, one delivery (the probe) decides.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use super::clock::{secs_ceil, Micros};
use super::over_limit::OverLimit;

/// The longest an upstream's `Retry-After` opens the breaker.
pub const MAX_PUSHBACK: Duration = Duration::from_secs(600);

/// `upstream_breaker`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerCfg {
    pub failures: u32,
    pub open: Duration,
}

/// How a guarded attempt ended, for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    Success,
    /// A status of 500 or more outside `settle_on`, a connect error, a
    /// timeout, an outcome idemgate cannot know.
    Failure,
}

/// The breaker's state: `open_until` 0 is closed; a time past is half-open.
#[derive(Debug, Default)]
pub struct Breaker {
    open_until: AtomicU64,
    /// Half-open: the one delivery let through is under way.
    probing: AtomicBool,
    /// Consecutive failed attempts while closed.
    failures: AtomicU32,
}

impl Breaker {
    /// Whether the breaker is not closed (one atomic load).
    pub fn is_open(&self) -> bool {
        self.open_until.load(Ordering::Acquire) != 0
    }

    /// An open breaker at `now`: refused while open; half-open, the first
    /// to come takes the probe (`true`), the others are refused.
    pub fn pass(&self, now: Micros) -> Result<bool, OverLimit> {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Ok(false); // closed meanwhile
        }
        if now < until {
            return Err(OverLimit::Open {
                retry_after_secs: secs_ceil(until - now),
            });
        }
        match self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(true),
            Err(_) => Err(OverLimit::Open {
                retry_after_secs: 1,
            }),
        }
    }

    /// An attempt's end at `now`; `probe`: it was the half-open probe.
    pub fn ended(&self, cfg: Option<BreakerCfg>, probe: bool, now: Micros, end: AttemptEnd) {
        let Some(cfg) = cfg else {
            if probe {
                // opened by a Retry-After alone: the probe's answer ends the
                // pause, unless it asks for another (`pushed_back`, after this)
                self.close();
            }
            return;
        };
        match (end, probe) {
            (AttemptEnd::Success, true) => self.close(),
            (AttemptEnd::Failure, true) => self.reopen(now, cfg.open),
            (AttemptEnd::Success, false) => {
                if self.failures.load(Ordering::Relaxed) != 0 {
                    self.failures.store(0, Ordering::Relaxed);
                }
            }
            (AttemptEnd::Failure, false) => {
                let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
                let until = now + cfg.open.as_micros() as u64;
                if n >= cfg.failures
                    && self
                        .open_until
                        .compare_exchange(0, until, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    self.failures.store(0, Ordering::Release);
                }
            }
        }
    }

    /// Opens for `for_` (at most [`MAX_PUSHBACK`]) from `now`.
    pub fn pushed_back(&self, now: Micros, for_: Duration) {
        if for_.is_zero() {
            return;
        }
        let until = now + for_.min(MAX_PUSHBACK).as_micros() as u64;
        self.open_until.fetch_max(until, Ordering::AcqRel);
        self.failures.store(0, Ordering::Release);
    }

    /// `closed`, `open` or `half-open` at `now`, and while open the seconds
    /// until it half-opens.
    pub fn state(&self, now: Micros) -> (&'static str, u64) {
        match self.open_until.load(Ordering::Acquire) {
            0 => ("closed", 0),
            u if u > now => ("open", secs_ceil(u - now)),
            _ => ("half-open", 0),
        }
    }

    /// A probe that never came to an outcome: the next delivery probes.
    pub fn probe_lost(&self) {
        self.probing.store(false, Ordering::Release);
    }

    fn close(&self) {
        self.failures.store(0, Ordering::Release);
        self.open_until.store(0, Ordering::Release);
        self.probing.store(false, Ordering::Release);
    }

    /// The probe failed: open again for `open` (before the probe is given
    /// back, so no one probes the old, ended, period).
    fn reopen(&self, now: Micros, open: Duration) {
        self.open_until
            .fetch_max(now + open.as_micros() as u64, Ordering::AcqRel);
        self.probing.store(false, Ordering::Release);
    }
}
