//! Protecting a route's consumer (SPEC §15), per process. Four kinds of
//! limit, a file each, and the route's set of them ([`RouteLimits`],
//! `route.rs`) that the proxy asks before it forwards:
//!
//! - `slots.rs`: at most `upstream_concurrency` requests in flight;
//! - `rate.rs`: `upstream_rate` as a token bucket (GCRA: one atomic
//!   "theoretical arrival time"), which can reserve a token ahead;
//! - `breaker.rs`: a breaker that opens after `failures` consecutive
//!   failed attempts, or for as long as an upstream 429/503 `Retry-After`
//!   says (`retry_after.rs` reads that header);
//! - `wait.rs`: `upstream_wait` (off unless set) lets a request past the
//!   slot or the token wait for one, in this process, before its 503: a
//!   sender whose retries back off exponentially otherwise meets a refusal
//!   per retry and soon waits its longest backoff while the consumer idles
//!   (the storm in `benches/load/storm.rs`). A waiter holds a connection
//!   and its body, so at most [`MAX_WAITING`] wait per route; a freed slot
//!   wakes one of them, and a token is reserved ahead so that waiters are
//!   served in turn.
//!
//! All state is atomics: nothing is locked, so nothing is held across an
//! await. The clock is passed in (microseconds of [`now`], `clock.rs`), so
//! the pure logic is tested with a made-up one. A route without limits has
//! an unlimited [`RouteLimits`]: its check is one load of the breaker
//! (closed unless the upstream pushed back), and nothing is counted.

mod breaker;
mod clock;
mod over_limit;
mod rate;
mod retry_after;
mod route;
mod slots;
mod wait;

pub use breaker::{AttemptEnd, BreakerCfg, MAX_PUSHBACK};
pub use clock::{now, Micros};
pub use over_limit::OverLimit;
pub use rate::Rate;
pub use retry_after::retry_after;
pub use route::{LimitsCfg, Permit, RouteLimits, Snapshot};
pub use wait::{MAX_WAIT, MAX_WAITING};

#[cfg(test)]
mod tests;
#[cfg(test)]
mod wait_tests;
