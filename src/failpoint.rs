//! Crash injection for the reliability tests: `IDEMGATE_FAILPOINT=NAME` makes
//! the process abort — no destructors, no flush, like `kill -9` — when a
//! guarded delivery reaches the point called NAME:
//!
//! - `before_claim`: the event ID and digest are known, nothing is stored yet;
//! - `after_claim`: the claim is committed, the upstream not contacted;
//! - `after_upstream`: the upstream answered, the settle is not committed.
//!
//! Only in builds with the `testkit` cargo feature. The shipped binary
//! (`cargo build --release`, the Dockerfile) is built without it: there
//! [`hit`] is empty and the variable is never read, so setting it by mistake
//! in production does nothing. Test builds get the feature through the
//! package's dev-dependency on itself (see Cargo.toml), so `cargo test`
//! runs the crash tests against a binary that honours it.
//!
//! Read once at start; when unset a check costs one load and compare.

#[cfg(feature = "testkit")]
static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

#[cfg(feature = "testkit")]
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
#[cfg(feature = "testkit")]
#[inline]
pub fn hit(name: &str) {
    if armed() == Some(name) {
        eprintln!("idemgate: failpoint {name} reached: aborting");
        std::process::abort();
    }
}

/// Without the `testkit` feature: nothing, whatever the environment says.
#[cfg(not(feature = "testkit"))]
#[inline(always)]
pub fn hit(_name: &str) {}
