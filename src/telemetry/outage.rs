//! While the store is away, senders retry hard, and a line per refused
//! request (thousands a second) would bury everything else in the log and
//! trip log-based alerts. Those requests are counted here instead and
//! summarised: at most one WARN line a second, with the counts per outcome
//! and the store's last error. The first refusal after a quiet second is
//! written at once; the rest of that second's by a thread of its own.
//! The metrics count every request as before.
//!
//! The lines that name one event (a settle kept for a retry, one given up)
//! matter more, but an outage meets every request in flight at once: at
//! most [`EVENT_LINES`] of them are written per [`EVENT_WINDOW`], and the
//! rest are counted in the summary (`folded`), so that a 10 s outage
//! under load writes at most about 20 lines whatever the load.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Between two summaries.
const EVERY: Duration = Duration::from_secs(1);
/// Per-event lines written per window; the rest are folded.
const EVENT_LINES: u32 = 3;
const EVENT_WINDOW: Duration = Duration::from_secs(10);

/// What the next summary line says.
struct Pending {
    /// Counts since the last summary, per outcome.
    counts: BTreeMap<&'static str, u64>,
    /// The store's last error since the last summary.
    error: Option<String>,
    /// When the last summary was written.
    written: Option<Instant>,
    /// Per-event lines not written since the last summary, per kind.
    folded: BTreeMap<&'static str, u64>,
    /// The current event-line window: when it began, lines written in it.
    window: Option<(Instant, u32)>,
}

static PENDING: Mutex<Pending> = Mutex::new(Pending {
    counts: BTreeMap::new(),
    error: None,
    written: None,
    folded: BTreeMap::new(),
    window: None,
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
    start_ticker();
}

/// The thread that writes the rest of each second's summary.
fn start_ticker() {
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

/// Whether a line naming one event of `kind` may be written now; if not,
/// it is counted in the next summary instead.
pub fn event_line(kind: &'static str) -> bool {
    let mut p = pending();
    let now = Instant::now();
    let (began, written) = match p.window {
        Some((began, n)) if now.duration_since(began) < EVENT_WINDOW => (began, n),
        _ => (now, 0),
    };
    if written < EVENT_LINES {
        p.window = Some((began, written + 1));
        return true;
    }
    p.window = Some((began, written));
    *p.folded.entry(kind).or_insert(0) += 1;
    drop(p);
    start_ticker();
    false
}

/// Keeps the store's error for the next summary line (the last one wins).
pub fn store_error(error: String) {
    pending().error = Some(error);
}

/// Writes the counts since the last summary, if any, and starts again.
fn summarise() {
    let (counts, error, folded) = {
        let mut p = pending();
        if p.counts.is_empty() && p.folded.is_empty() {
            return;
        }
        p.written = Some(Instant::now());
        (
            std::mem::take(&mut p.counts),
            p.error.take(),
            std::mem::take(&mut p.folded),
        )
    };
    let total: u64 = counts.values().sum();
    let listed = |m: &BTreeMap<&str, u64>| {
        m.iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    tracing::warn!(
        total,
        outcomes = %listed(&counts),
        folded = %listed(&folded),
        last_error = error.as_deref().unwrap_or(""),
        "store unavailable: requests answered without it since the last summary"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_event_lines_past_the_window_budget_are_folded_into_the_summary() {
        let allowed = (0..EVENT_LINES + 2)
            .filter(|_| event_line("test_kind"))
            .count() as u32;
        // another test of this binary may have used some of the window
        assert!(allowed <= EVENT_LINES, "{allowed} lines written");
        assert!(
            pending().folded.get("test_kind").copied().unwrap_or(0) >= 2,
            "the rest are counted for the summary"
        );
    }
}
