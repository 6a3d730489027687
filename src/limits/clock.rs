//! The limits' clock: microseconds on this process's monotonic clock.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Microseconds on this process's monotonic clock.
pub type Micros = u64;

pub const SEC: Micros = 1_000_000;

/// Microseconds since this process first asked (monotonic, never 0 after
/// the first call's first microsecond: 0 means "closed" to the breaker).
pub fn now() -> Micros {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(|| Instant::now() - Duration::from_secs(1));
    epoch.elapsed().as_micros() as Micros
}

/// Whole seconds for `Retry-After`, rounded up, at least 1.
pub fn secs_ceil(us: Micros) -> u64 {
    us.div_ceil(SEC).max(1)
}
