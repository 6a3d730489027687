//! Crash injection for the reliability tests: `IDEMGATE_FAILPOINT=NAME` makes
//! the process abort — no destructors, no flush, like `kill -9` — when a
//! guarded delivery reaches the point called NAME:
//!
//! - `before_claim`: the event ID and digest are known, nothing is stored yet;
//! - `after_claim`: the claim is committed, the upstream not contacted;
//! - `after_upstream`: the upstream answered, the settle is not committed.
//!
//! Only in builds with the `failpoints` cargo feature. Every other build,
//! the tests' included, is without it: there [`hit`] is empty and the
//! variable is never read, so setting it by mistake in production does
//! nothing. The crash tests build their own armed binary into
//! `target/failpoints/` (tests/it/common/binaries.rs), so
//! `target/release/idemgate` is always the shipped one.
//!
//! Read once at start; when unset a check costs one load and compare.

#[cfg(feature = "failpoints")]
static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

#[cfg(feature = "failpoints")]
fn armed() -> Option<&'static str> {
    ARMED
        .get_or_init(|| {
            std::env::var("IDEMGATE_FAILPOINT")
                .ok()
                .filter(|v| !v.is_empty())
        })
        .as_deref()
}

/// Aborts the process if `name` is the armed failpoint.
#[cfg(feature = "failpoints")]
#[inline]
pub fn hit(name: &str) {
    if armed() == Some(name) {
        eprintln!("idemgate: failpoint {name} reached: aborting");
        std::process::abort();
    }
}

/// Without the `failpoints` feature: nothing, whatever the environment says.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_name: &str) {}
