//! Crash injection for the reliability tests: `IDEMGATE_FAILPOINT=NAME` makes
//! the process abort — no destructors, no flush, like `kill -9` — when a
//! guarded delivery reaches the point called NAME:
//!
//! - `before_claim`: the event ID and digest are known, nothing is stored yet;
//! - `after_claim`: the claim is committed, the upstream not contacted;
//! - `after_upstream`: the upstream answered, the settle is not committed.
//!
//! Read once at start; when unset a check costs one load and compare.

use std::sync::OnceLock;

static ARMED: OnceLock<Option<String>> = OnceLock::new();

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
#[inline]
pub fn hit(name: &str) {
    if armed() == Some(name) {
        eprintln!("idemgate: failpoint {name} reached: aborting");
        std::process::abort();
    }
}
