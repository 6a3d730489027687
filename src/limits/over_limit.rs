//! Why a route's limits did not let a request through.

/// Why a request was not let through: its 503 and `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverLimit {
    /// No slot (`upstream_concurrency`) or no token (`upstream_rate`).
    Saturated { retry_after_secs: u64 },
    /// The breaker is open, or half-open with its one delivery under way.
    Open { retry_after_secs: u64 },
}
