//! While the store is away, senders retry hard, and a line per refused
//! request (thousands a second) would bury everything else in the log and
//! trip log-based alerts. Those requests are counted here instead and
//! summarised: one WARN line a second with the counts per outcome, written
//! by a thread of its own, and nothing once the outage ends. The metrics
//! count every request as before.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Counts since the last summary, per outcome.
static COUNTS: Mutex<BTreeMap<&'static str, u64>> = Mutex::new(BTreeMap::new());
static TICKER: OnceLock<()> = OnceLock::new();

/// Between two summaries.
const EVERY: Duration = Duration::from_secs(1);

/// Counts one request that ended with `outcome` because the store did not
/// answer; it is in the next second's summary line.
pub fn note(outcome: &'static str) {
    *COUNTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(outcome)
        .or_insert(0) += 1;
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

/// Writes the counts since the last summary, if any, and starts again.
fn summarise() {
    let counts = std::mem::take(&mut *COUNTS.lock().unwrap_or_else(|p| p.into_inner()));
    if counts.is_empty() {
        return;
    }
    let total: u64 = counts.values().sum();
    let by_outcome = counts
        .iter()
        .map(|(outcome, n)| format!("{outcome}={n}"))
        .collect::<Vec<_>>()
        .join(" ");
    tracing::warn!(
        total,
        outcomes = %by_outcome,
        "store unavailable: requests answered without it in the last second"
    );
}
