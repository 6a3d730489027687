//! Protecting a route's consumer (SPEC §15), per process: at most
//! `upstream_concurrency` requests in flight, `upstream_rate` as a token
//! bucket (GCRA: one atomic "theoretical arrival time"), and a breaker that
//! opens after `failures` consecutive failed attempts, or for as long as an
//! upstream 429/503 `Retry-After` says. All state is atomics: nothing is
//! locked, so nothing is held across an await. The clock is passed in
//! (microseconds of [`now`]), so the pure logic is tested with a made-up one.
//!
//! A route without limits has an unlimited [`Limits`]: its check is one load
//! of the breaker (closed unless the upstream pushed back), and nothing is
//! counted.
//!
//! `upstream_wait` (off unless set) lets a request past the slot or the
//! token wait for one, in this process, before its 503: a sender whose
//! retries back off exponentially otherwise meets a refusal per retry and
//! soon waits its longest backoff while the consumer idles (the storm in
//! `benches/load/storm.rs`). A waiter holds a connection and its body, so
//! at most [`MAX_WAITING`] wait per route; a freed slot wakes one of them,
//! and a token is reserved ahead (GCRA) so that waiters are served in turn.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Microseconds on this process's monotonic clock.
pub type Micros = u64;

/// Most requests of one route waiting for a slot or a token at once
/// (`upstream_wait`); past it a request is refused at once.
pub const MAX_WAITING: u32 = 256;

/// The longest `upstream_wait` a route may set: well inside any sender's
/// own timeout (GitHub's is 10 s).
pub const MAX_WAIT: Duration = Duration::from_secs(5);

/// The longest an upstream's `Retry-After` opens the breaker.
pub const MAX_PUSHBACK: Duration = Duration::from_secs(600);

const SEC: Micros = 1_000_000;

/// Microseconds since this process first asked (monotonic, never 0 after
/// the first call's first microsecond: 0 means "closed" to the breaker).
pub fn now() -> Micros {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(|| Instant::now() - Duration::from_secs(1));
    epoch.elapsed().as_micros() as Micros
}

/// `upstream_rate`: `per` requests every `every`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub per: u32,
    pub every: Duration,
}

impl Rate {
    /// One second's worth of tokens, at least 1: the bucket's size.
    pub fn burst(self) -> u64 {
        let per_sec = u64::from(self.per) * SEC / (self.every.as_micros() as u64).max(1);
        per_sec.max(1)
    }
}

impl std::fmt::Display for Rate {
    /// As the config file writes it: `50/s`, `600/m`.
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let unit = if self.every.as_secs() == 60 { "m" } else { "s" };
        write!(f, "{}/{unit}", self.per)
    }
}

/// `upstream_breaker`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerCfg {
    pub failures: u32,
    pub open: Duration,
}

/// A route's limits as configured (each optional).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitsCfg {
    pub concurrency: Option<u32>,
    pub rate: Option<Rate>,
    pub breaker: Option<BreakerCfg>,
    /// `upstream_wait`: how long a request may wait for a slot or a token.
    pub wait: Option<Duration>,
}

/// Why a request was not let through: its 503 and `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No slot (`upstream_concurrency`) or no token (`upstream_rate`).
    Saturated { retry_after_secs: u64 },
    /// The breaker is open, or half-open with its one delivery under way.
    Open { retry_after_secs: u64 },
}

/// How a guarded attempt ended, for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    Success,
    /// A status of 500 or more outside `settle_on`, a connect error, a
    /// timeout, an outcome idemgate cannot know.
    Failure,
}

/// One route's limits and their state in this process.
#[derive(Debug)]
pub struct Limits {
    cfg: LimitsCfg,
    /// Any of the three is set: requests are counted and admitted.
    limited: bool,
    in_flight: AtomicU32,
    /// GCRA's theoretical arrival time of the next request, µs.
    tat: AtomicU64,
    breaker: Breaker,
    /// Requests waiting for a slot or a token (`upstream_wait`).
    waiting: AtomicU32,
    /// Woken (one waiter) when a slot is given back, with `upstream_wait`.
    freed: tokio::sync::Notify,
}

/// The breaker's state: `open_until` 0 is closed; a time past is half-open.
#[derive(Debug, Default)]
struct Breaker {
    open_until: AtomicU64,
    /// Half-open: the one delivery let through is under way.
    probing: AtomicBool,
    /// Consecutive failed attempts while closed.
    failures: AtomicU32,
}

/// What a request let through holds: its concurrency slot, and while the
/// breaker is half-open the one probe. Dropped on every exit (answer,
/// error, cancel, panic): the slot is given back, and a probe that never
/// came to an outcome lets the next delivery probe.
#[derive(Debug)]
pub struct Permit {
    limits: Arc<Limits>,
    slot: bool,
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

fn secs_ceil(us: Micros) -> u64 {
    us.div_ceil(SEC).max(1)
}

impl Limits {
    pub fn new(cfg: LimitsCfg) -> Limits {
        Limits {
            limited: cfg.concurrency.is_some() || cfg.rate.is_some() || cfg.breaker.is_some(),
            cfg,
            in_flight: AtomicU32::new(0),
            tat: AtomicU64::new(0),
            breaker: Breaker::default(),
            waiting: AtomicU32::new(0),
            freed: tokio::sync::Notify::new(),
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
    pub fn admit(self: &Arc<Self>, now: Micros, guarded: bool) -> Result<Option<Permit>, Refusal> {
        let open = guarded && self.breaker.open_until.load(Ordering::Acquire) != 0;
        if !self.limited && !open {
            return Ok(None);
        }
        let mut permit = Permit {
            limits: self.clone(),
            slot: false,
            probe: AtomicBool::new(false),
        };
        if open {
            permit.probe = AtomicBool::new(self.breaker.pass(now)?);
        }
        if !self.limited {
            return Ok(Some(permit));
        }
        match self.cfg.concurrency {
            Some(max) => permit.slot = self.take_slot(max)?,
            None => {
                self.in_flight.fetch_add(1, Ordering::AcqRel);
                permit.slot = true;
            }
        }
        if let Some(rate) = self.cfg.rate {
            self.take_token(rate, now, 0)?;
        }
        Ok(Some(permit))
    }

    /// [`Limits::admit`], and with `upstream_wait` a request refused for
    /// want of a slot or a token waits for one, up to that long (the
    /// breaker is never waited for). Cancel-safe: a waiter dropped
    /// mid-wait gives back its slot; a token it reserved is spent.
    pub async fn admit_waiting(self: &Arc<Self>, guarded: bool) -> Result<Option<Permit>, Refusal> {
        let refused = match self.admit(now(), guarded) {
            Err(r @ Refusal::Saturated { .. }) => r,
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
        let mut permit = self.admit_breaker_only(guarded)?;
        if let Some(max) = self.cfg.concurrency {
            loop {
                match self.take_slot(max) {
                    Ok(slot) => break permit.slot = slot,
                    Err(r) => {
                        let left = deadline.saturating_sub(now());
                        if left == 0 {
                            return Err(r);
                        }
                        let freed = self.freed.notified();
                        // a slot given back between the check and here stored
                        // a wakeup in `freed`: nothing is missed
                        let _ = tokio::time::timeout(Duration::from_micros(left), freed).await;
                    }
                }
            }
        } else {
            self.in_flight.fetch_add(1, Ordering::AcqRel);
            permit.slot = true;
        }
        if let Some(rate) = self.cfg.rate {
            let t = now();
            let due = self.take_token(rate, t, deadline.saturating_sub(t))?;
            if due > t {
                tokio::time::sleep(Duration::from_micros(due - t)).await;
            }
        }
        Ok(Some(permit))
    }

    /// A permit that holds nothing yet but, for a guarded request, the
    /// breaker's pass (its probe while half-open).
    fn admit_breaker_only(self: &Arc<Self>, guarded: bool) -> Result<Permit, Refusal> {
        let open = guarded && self.breaker.open_until.load(Ordering::Acquire) != 0;
        let probe = open && self.breaker.pass(now())?;
        Ok(Permit {
            limits: self.clone(),
            slot: false,
            probe: AtomicBool::new(probe),
        })
    }

    fn take_slot(&self, max: u32) -> Result<bool, Refusal> {
        let mut n = self.in_flight.load(Ordering::Acquire);
        loop {
            if n >= max {
                return Err(Refusal::Saturated {
                    retry_after_secs: 1,
                });
            }
            match self.in_flight.compare_exchange_weak(
                n,
                n + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(true),
                Err(seen) => n = seen,
            }
        }
    }

    /// GCRA: a token bucket of `burst` tokens refilled one every
    /// `interval`, as one timestamp. Starts full. A token up to `ahead` µs
    /// in the future may be reserved: the answer is when it is due (`now`
    /// or later), and the next one is counted from it.
    fn take_token(&self, rate: Rate, now: Micros, ahead: Micros) -> Result<Micros, Refusal> {
        let interval = (rate.every.as_micros() as u64 / u64::from(rate.per.max(1))).max(1);
        let tolerance = (rate.burst() - 1) * interval;
        let mut tat = self.tat.load(Ordering::Acquire);
        loop {
            let start = tat.max(now);
            let due = now.max(start.saturating_sub(tolerance));
            if due - now > ahead {
                return Err(Refusal::Saturated {
                    retry_after_secs: secs_ceil(due - now),
                });
            }
            match self.tat.compare_exchange_weak(
                tat,
                start + interval,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(due),
                Err(seen) => tat = seen,
            }
        }
    }

    /// An attempt's end, for the breaker. `permit` is the attempt's own:
    /// a probe's outcome closes or reopens the breaker.
    pub fn ended(&self, permit: Option<&Permit>, now: Micros, end: AttemptEnd) {
        let probe = permit.is_some_and(|p| p.probe.swap(false, Ordering::AcqRel));
        let b = &self.breaker;
        let Some(cfg) = self.cfg.breaker else {
            if probe {
                // opened by a Retry-After alone: the probe's answer ends the
                // pause, unless it asks for another (`pushed_back`, after this)
                b.close();
            }
            return;
        };
        match (end, probe) {
            (AttemptEnd::Success, true) => b.close(),
            (AttemptEnd::Failure, true) => b.reopen(now, cfg.open),
            (AttemptEnd::Success, false) => {
                if b.failures.load(Ordering::Relaxed) != 0 {
                    b.failures.store(0, Ordering::Relaxed);
                }
            }
            (AttemptEnd::Failure, false) => {
                let n = b.failures.fetch_add(1, Ordering::AcqRel) + 1;
                if n >= cfg.failures
                    && b.open_until
                        .compare_exchange(
                            0,
                            now + cfg.open.as_micros() as u64,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        )
                        .is_ok()
                {
                    b.failures.store(0, Ordering::Release);
                }
            }
        }
    }

    /// The upstream answered 429 or 503 with `Retry-After: for_`: the
    /// breaker opens that long (at most [`MAX_PUSHBACK`]), configured or not.
    pub fn pushed_back(&self, now: Micros, for_: Duration) {
        if for_.is_zero() {
            return;
        }
        let until = now + for_.min(MAX_PUSHBACK).as_micros() as u64;
        self.breaker.open_until.fetch_max(until, Ordering::AcqRel);
        self.breaker.failures.store(0, Ordering::Release);
    }

    pub fn snapshot(&self, now: Micros) -> Snapshot {
        let until = self.breaker.open_until.load(Ordering::Acquire);
        let (breaker, open_secs) = match until {
            0 => ("closed", 0),
            u if u > now => ("open", secs_ceil(u - now)),
            _ => ("half-open", 0),
        };
        Snapshot {
            in_flight: self.in_flight.load(Ordering::Acquire),
            breaker,
            open_secs,
            waiting: self.waiting.load(Ordering::Acquire),
        }
    }
}

impl Breaker {
    /// An open breaker at `now`: refused while open; half-open, the first
    /// to come takes the probe (`true`), the others are refused.
    fn pass(&self, now: Micros) -> Result<bool, Refusal> {
        let until = self.open_until.load(Ordering::Acquire);
        if until == 0 {
            return Ok(false); // closed meanwhile
        }
        if now < until {
            return Err(Refusal::Open {
                retry_after_secs: secs_ceil(until - now),
            });
        }
        match self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(true),
            Err(_) => Err(Refusal::Open {
                retry_after_secs: 1,
            }),
        }
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

impl Permit {
    pub fn limits(&self) -> &Limits {
        &self.limits
    }
}

/// One waiter counted in [`Limits::admit_waiting`], uncounted on every exit.
struct Waiting<'a>(&'a AtomicU32);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.slot {
            self.limits.in_flight.fetch_sub(1, Ordering::AcqRel);
            if self.limits.cfg.wait.is_some() {
                self.limits.freed.notify_one();
            }
        }
        if self.probe.load(Ordering::Acquire) {
            // no outcome: the next delivery probes
            self.limits.breaker.probing.store(false, Ordering::Release);
        }
    }
}

/// `Retry-After`'s value (RFC 9110 §10.2.3): delay-seconds, or an HTTP
/// date (`now` the wall clock); `None` when it is neither.
pub fn retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // a huge number is capped, never an error
        return Some(Duration::from_secs(v.parse().unwrap_or(u64::MAX)).min(MAX_PUSHBACK));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(cfg: LimitsCfg) -> Arc<Limits> {
        Arc::new(Limits::new(cfg))
    }

    const S: Micros = SEC;

    #[test]
    fn a_route_without_limits_holds_nothing() {
        let l = limits(LimitsCfg::default());
        for _ in 0..1000 {
            assert!(l.admit(S, true).unwrap().is_none());
        }
        assert_eq!(l.snapshot(S).in_flight, 0);
    }

    #[test]
    fn concurrency_slots_come_back_on_drop() {
        let l = limits(LimitsCfg {
            concurrency: Some(2),
            ..Default::default()
        });
        let a = l.admit(S, true).unwrap();
        let b = l.admit(S, false).unwrap();
        assert_eq!(
            l.admit(S, true).unwrap_err(),
            Refusal::Saturated {
                retry_after_secs: 1
            }
        );
        assert_eq!(l.snapshot(S).in_flight, 2);
        drop(a);
        let c = l.admit(S, true).unwrap();
        drop((b, c));
        assert_eq!(l.snapshot(S).in_flight, 0);
    }

    #[test]
    fn the_bucket_starts_full_with_one_seconds_worth() {
        let rate = Rate {
            per: 10,
            every: Duration::from_secs(1),
        };
        let l = limits(LimitsCfg {
            rate: Some(rate),
            ..Default::default()
        });
        let t0 = 100 * S;
        for _ in 0..10 {
            l.admit(t0, true).unwrap();
        }
        // the 11th waits for the next token: 100 ms, so Retry-After 1
        assert_eq!(
            l.admit(t0, true).unwrap_err(),
            Refusal::Saturated {
                retry_after_secs: 1
            }
        );
        // one token every 100 ms
        l.admit(t0 + S / 10, true).unwrap();
        assert!(l.admit(t0 + S / 10, true).is_err());
        // over 5 s: the burst and 50 more, no more
        let mut passed = 0;
        let mut t = t0 + S / 10;
        while t < t0 + 5 * S {
            t += S / 100;
            passed += l.admit(t, true).is_ok() as u32;
        }
        assert_eq!(passed, 49);
    }

    #[test]
    fn a_per_minute_rate_bursts_one_and_says_how_long() {
        let rate = Rate {
            per: 6,
            every: Duration::from_secs(60),
        };
        assert_eq!(rate.burst(), 1);
        let l = limits(LimitsCfg {
            rate: Some(rate),
            ..Default::default()
        });
        l.admit(S, false).unwrap();
        assert_eq!(
            l.admit(S + S / 2, false).unwrap_err(),
            Refusal::Saturated {
                retry_after_secs: 10
            }
        );
        l.admit(11 * S, false).unwrap();
    }

    #[test]
    fn a_refused_token_gives_its_slot_back() {
        let l = limits(LimitsCfg {
            concurrency: Some(1),
            rate: Some(Rate {
                per: 1,
                every: Duration::from_secs(1),
            }),
            ..Default::default()
        });
        drop(l.admit(S, true).unwrap());
        assert!(l.admit(S, true).is_err());
        assert_eq!(l.snapshot(S).in_flight, 0);
    }

    fn breaker(failures: u32, open_secs: u64) -> Arc<Limits> {
        limits(LimitsCfg {
            breaker: Some(BreakerCfg {
                failures,
                open: Duration::from_secs(open_secs),
            }),
            ..Default::default()
        })
    }

    #[test]
    fn the_breaker_opens_after_f_consecutive_failures() {
        let l = breaker(3, 10);
        let t = 5 * S;
        for end in [
            AttemptEnd::Failure,
            AttemptEnd::Failure,
            AttemptEnd::Success,
        ] {
            let p = l.admit(t, true).unwrap();
            l.ended(p.as_ref(), t, end);
        }
        for _ in 0..3 {
            let p = l.admit(t, true).unwrap();
            l.ended(p.as_ref(), t, AttemptEnd::Failure);
        }
        assert_eq!(
            l.admit(t + S / 2, true).unwrap_err(),
            Refusal::Open {
                retry_after_secs: 10
            }
        );
        assert_eq!(l.snapshot(t + 3 * S).breaker, "open");
        assert_eq!(l.snapshot(t + 3 * S).open_secs, 7);
        // unguarded requests are not the breaker's
        assert!(l.admit(t + S, false).is_ok());
    }

    #[test]
    fn half_open_lets_exactly_one_through_and_its_success_closes() {
        let l = breaker(1, 10);
        let p = l.admit(S, true).unwrap();
        l.ended(p.as_ref(), S, AttemptEnd::Failure);
        drop(p);
        let t = 11 * S;
        assert_eq!(l.snapshot(t).breaker, "half-open");
        let probe = l.admit(t, true).unwrap().unwrap();
        for _ in 0..10 {
            assert_eq!(
                l.admit(t, true).unwrap_err(),
                Refusal::Open {
                    retry_after_secs: 1
                }
            );
        }
        l.ended(Some(&probe), t, AttemptEnd::Success);
        drop(probe);
        assert_eq!(l.snapshot(t).breaker, "closed");
        assert!(l.admit(t, true).is_ok());
    }

    #[test]
    fn a_failed_probe_reopens_and_a_lost_one_lets_the_next_probe() {
        let l = breaker(1, 10);
        l.ended(None, S, AttemptEnd::Failure);
        let t = 11 * S;
        // a probe dropped without an outcome (cancelled, or a replay after all)
        drop(l.admit(t, true).unwrap());
        let probe = l.admit(t, true).unwrap().unwrap();
        l.ended(Some(&probe), t, AttemptEnd::Failure);
        drop(probe);
        assert_eq!(
            l.admit(t + S, true).unwrap_err(),
            Refusal::Open {
                retry_after_secs: 9
            }
        );
        assert!(l.admit(t + 10 * S, true).is_ok());
    }

    #[test]
    fn a_pushback_opens_any_routes_breaker_capped() {
        let l = limits(LimitsCfg::default());
        l.pushed_back(S, Duration::from_secs(3));
        assert_eq!(
            l.admit(S, true).unwrap_err(),
            Refusal::Open {
                retry_after_secs: 3
            }
        );
        // unguarded requests of a route without limits still pass
        assert!(l.admit(S, false).unwrap().is_none());
        let probe = l.admit(4 * S, true).unwrap().unwrap();
        assert!(l.admit(4 * S, true).is_err());
        l.ended(Some(&probe), 4 * S, AttemptEnd::Success);
        drop(probe);
        assert!(l.admit(4 * S, true).unwrap().is_none());
        l.pushed_back(S, Duration::from_secs(86_400));
        assert_eq!(l.snapshot(S).open_secs, 600);
    }

    #[test]
    fn retry_after_takes_seconds_or_a_date() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(retry_after("3", now), Some(Duration::from_secs(3)));
        assert_eq!(
            retry_after("99999999999999999999999", now),
            Some(MAX_PUSHBACK)
        );
        // Wed, 21 Oct 2015 07:28:00 GMT is 1_445_412_480
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("-1", now), None);
        assert_eq!(retry_after("soon", now), None);
        assert_eq!(retry_after("", now), None);
    }
}

/// `upstream_wait`, on the real clock (each test well under a second).
#[cfg(test)]
mod wait_tests {
    use super::*;
    use std::time::Instant;

    fn waiting(concurrency: Option<u32>, rate: Option<Rate>, wait_ms: u64) -> Arc<Limits> {
        Arc::new(Limits::new(LimitsCfg {
            concurrency,
            rate,
            wait: Some(Duration::from_millis(wait_ms)),
            ..LimitsCfg::default()
        }))
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_slot_given_back_goes_to_a_waiter() {
        run(async {
            let l = waiting(Some(1), None, 2_000);
            let held = l.admit(now(), true).unwrap();
            let t = Instant::now();
            let waiter = tokio::spawn({
                let l = l.clone();
                async move { l.admit_waiting(true).await }
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(l.snapshot(now()).waiting, 1);
            drop(held);
            let permit = waiter.await.unwrap().unwrap();
            assert!(permit.is_some());
            let waited = t.elapsed();
            assert!(waited >= Duration::from_millis(100) && waited < Duration::from_millis(1_500));
            assert_eq!(l.snapshot(now()).waiting, 0);
            assert_eq!(l.snapshot(now()).in_flight, 1, "the waiter holds the slot");
        });
    }

    #[test]
    fn a_waiter_is_refused_at_its_deadline_and_uncounted() {
        run(async {
            let l = waiting(Some(1), None, 150);
            let _held = l.admit(now(), true).unwrap();
            let t = Instant::now();
            let r = l.admit_waiting(true).await.map(|p| p.is_some());
            assert_eq!(
                r,
                Err(Refusal::Saturated {
                    retry_after_secs: 1
                })
            );
            assert!(t.elapsed() >= Duration::from_millis(150));
            let s = l.snapshot(now());
            assert_eq!((s.waiting, s.in_flight), (0, 1));
        });
    }

    #[test]
    fn tokens_are_reserved_in_turn_and_a_wait_too_short_is_refused_at_once() {
        run(async {
            // 10/s: a bucket of 10, then one every 100 ms
            let rate = Rate {
                per: 10,
                every: Duration::from_secs(1),
            };
            let l = waiting(None, Some(rate), 1_000);
            for _ in 0..10 {
                l.admit(now(), true).unwrap();
            }
            let t = Instant::now();
            let mut at = Vec::new();
            for _ in 0..3 {
                l.admit_waiting(true).await.unwrap();
                at.push(t.elapsed());
            }
            for (i, d) in at.iter().enumerate() {
                let want = Duration::from_millis(100 * (i as u64 + 1));
                assert!(
                    *d + Duration::from_millis(15) >= want
                        && *d < want + Duration::from_millis(400),
                    "{at:?}"
                );
            }
            // 1/m: the next token is a minute away, past any wait
            let slow = waiting(
                None,
                Some(Rate {
                    per: 1,
                    every: Duration::from_secs(60),
                }),
                1_000,
            );
            slow.admit(now(), true).unwrap();
            let t = Instant::now();
            let r = slow.admit_waiting(true).await.map(|p| p.is_some());
            assert_eq!(
                r,
                Err(Refusal::Saturated {
                    retry_after_secs: 60
                })
            );
            assert!(
                t.elapsed() < Duration::from_millis(100),
                "refused without waiting"
            );
        });
    }

    #[test]
    fn at_most_max_waiting_wait_and_the_breaker_is_never_waited_for() {
        run(async {
            let l = waiting(Some(1), None, 2_000);
            let held = l.admit(now(), true).unwrap();
            let waiters: Vec<_> = (0..MAX_WAITING)
                .map(|_| {
                    let l = l.clone();
                    tokio::spawn(async move { l.admit_waiting(true).await.is_ok() })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(l.snapshot(now()).waiting, MAX_WAITING);
            let t = Instant::now();
            assert!(l.admit_waiting(true).await.is_err(), "one past the bound");
            assert!(t.elapsed() < Duration::from_millis(50));
            for w in &waiters {
                w.abort();
            }
            drop(held);
            tokio::time::sleep(Duration::from_millis(20)).await;
            let s = l.snapshot(now());
            assert_eq!(
                (s.waiting, s.in_flight),
                (0, 0),
                "aborted waiters hold nothing"
            );
            // an open breaker: refused at once, as `upstream-unavailable`
            l.pushed_back(now(), Duration::from_secs(30));
            let r = l.admit_waiting(true).await.map(|p| p.is_some());
            assert_eq!(
                r,
                Err(Refusal::Open {
                    retry_after_secs: 30
                })
            );
        });
    }
}
