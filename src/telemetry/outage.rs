//! While the store is away, senders retry hard, and a line per refused
//! request (thousands a second) would bury everything else in the log and
//! trip log-based alerts. Those requests are counted here instead and
//! summarised: at most one WARN line a second, with the counts per outcome
//! and the store's last error. The first refusal after a quiet second is
//! written at once; the rest of that second's by a thread of its own.
//! The metrics count every request as before.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Between two summaries.
const EVERY: Duration = Duration::from_secs(1);

/// What the next summary line says.
struct Pending {
    /// Counts since the last summary, per outcome.
    counts: BTreeMap<&'static str, u64>,
    /// The store's last error since the last summary.
    error: Option<String>,
    /// When the last summary was written.
    written: Option<Instant>,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending {
    counts: BTreeMap::new(),
    error: None,
    written: None,
});
static TICKER: OnceLock<()> = OnceLock::new();

fn pending() -> std::sync::MutexGuard<'static, Pending> {
    PENDING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counts one request that ended with `outcome` because the store did not
/// answer: written at once after a quiet second, else in the next summary.
pub fn note(outcome: &'static str) {
    let due = {
        let mut p = pending();
        *p.counts.entry(outcome).or_insert(0) += 1;
        p.written.is_none_or(|at| at.elapsed() >= EVERY)
    };
    if due {
        summarise();
    }
    TICKER.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("idemgate-outage-log".into())
            .spawn(|| loop {
                std::thread::sleep(EVERY);
                summarise();
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the outage log's thread");
        }
    });
}

/// Keeps the store's error for the next summary line (the last one wins).
pub fn store_error(error: String) {
    pending().error = Some(error);
}

/// Writes the counts since the last summary, if any, and starts again.
fn summarise() {
    let (counts, error) = {
        let mut p = pending();
        if p.counts.is_empty() {
            return;
        }
        p.written = Some(Instant::now());
        (std::mem::take(&mut p.counts), p.error.take())
    };
    let total: u64 = counts.values().sum();
    let by_outcome = counts
        .iter()
        .map(|(outcome, n)| format!("{outcome}={n}"))
        .collect::<Vec<_>>()
        .join(" ");
    tracing::warn!(
        total,
        outcomes = %by_outcome,
        last_error = error.as_deref().unwrap_or(""),
        "store unavailable: requests answered without it since the last summary"
    );
}
