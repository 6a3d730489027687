//! The background housekeeping of `serve`: deletes expired records in bounded
//! batches, turns the ended leases of claims held under `on_ambiguous: hold`
//! `ambiguous` (SPEC §12) and keeps the gauge of processing ages current.
//! The paused routes and the ambiguous count are followed by
//! `paused`'s `RouteState`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::claim::{now_ms, Millis};
use crate::metrics::Metrics;
use crate::store::{ClaimStore, StoreError};

pub struct Sweeper {
    pub store: Arc<dyn ClaimStore>,
    pub metrics: Metrics,
    pub interval: Duration,
    pub batch_size: i64,
    /// Every route, so a route whose last processing record settled drops to 0.
    pub routes: Vec<String>,
    /// What the last sweep deleted: what the next one expects (see [`Pacing`]).
    pub last_swept: AtomicU64,
}

/// How a sweep spaces its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    /// For this long from the sweep's start a batch is followed by a pause
    /// as long as it took (at least [`MIN_PAUSE`]); after it, only by the
    /// schedule below.
    pub paced_for: Duration,
    /// The sweep's schedule: `expected` records spread evenly over `spread`
    /// from its start. A batch ahead of it waits for it; one behind it (more
    /// expired than expected) goes on by the rule above.
    pub spread: Duration,
    pub expected: u64,
}

impl Pacing {
    /// The CLI's `sweep`: paced throughout, with no schedule.
    pub const THROUGHOUT: Pacing = Pacing {
        paced_for: Duration::MAX,
        spread: Duration::ZERO,
        expected: 0,
    };

    /// The serve loop's sweep every `interval`, expecting as many expired
    /// records as the last one deleted (the claim rate changes slowly next
    /// to an interval): spread over four fifths of the interval, paced by
    /// batch time for its first half, then back to back when behind.
    pub fn every(interval: Duration, expected: u64) -> Pacing {
        Pacing {
            paced_for: interval / 2,
            spread: interval * 4 / 5,
            expected,
        }
    }
}

/// Deletes every expired record, one bounded batch at a time, spaced as
/// `pacing` says. The pause as long as a batch took keeps the sweep to at
/// most half the store's time (on SQLite a batch runs on the one writer; in
/// issue 24's steady state, sweeps without a pause cut the claim rate they
/// ran beside by 12 %). The schedule spreads the sweep over most of the
/// interval rather than a burst at its start: at 5,000 claims/s a sweep's
/// burst tripled the claims' p99 in the seconds it ran. Past the paced half
/// the batches behind schedule run back to back, so a backlog is cleared
/// before the next sweep is due (with pauses throughout, PostgreSQL's
/// sweeper fell behind at 8,500 claims/s). Returns how many.
pub async fn sweep_all(
    store: &dyn ClaimStore,
    metrics: Option<&Metrics>,
    now: Millis,
    batch_size: i64,
    pacing: Pacing,
) -> Result<u64, StoreError> {
    let started = Instant::now();
    let mut total = 0;
    loop {
        let t = Instant::now();
        let n = store.sweep_batch(now, batch_size).await?;
        if let Some(m) = metrics {
            m.store_time("sweep", t.elapsed().as_secs_f64());
            m.swept(n);
        }
        total += n;
        if (n as i64) < batch_size {
            return Ok(total);
        }
        match pause_after(t.elapsed(), started.elapsed(), total, &pacing) {
            Some(pause) => tokio::time::sleep(pause).await,
            None => tokio::task::yield_now().await,
        }
    }
}

/// The shortest pause between two paced batches of a sweep.
const MIN_PAUSE: Duration = Duration::from_millis(10);

/// The pause after a batch that took `batch`, `swept_for` into a sweep that
/// has deleted `swept` records; `None`: go on at once.
fn pause_after(
    batch: Duration,
    swept_for: Duration,
    swept: u64,
    pacing: &Pacing,
) -> Option<Duration> {
    let paced = (swept_for < pacing.paced_for).then(|| batch.max(MIN_PAUSE));
    let scheduled = (swept < pacing.expected)
        .then(|| {
            let due = pacing.spread.mul_f64(swept as f64 / pacing.expected as f64);
            due.checked_sub(swept_for).map(|ahead| ahead.max(MIN_PAUSE))
        })
        .flatten();
    // the longer of the two (`None`, no pause, is the shortest)
    paced.max(scheduled)
}

/// How often the oldest-processing gauge is refreshed.
const GAUGE_EVERY: Duration = Duration::from_secs(5);
/// Held leases turned `ambiguous` per statement.
const HOLD_BATCH: i64 = 500;

impl Sweeper {
    async fn sweep(&self) {
        self.hold_ended_leases().await;
        let deleted = sweep_all(
            self.store.as_ref(),
            Some(&self.metrics),
            now_ms(),
            self.batch_size,
            Pacing::every(self.interval, self.last_swept.load(Ordering::Relaxed)),
        )
        .await;
        if let Ok(n) = deleted {
            self.last_swept.store(n, Ordering::Relaxed);
        }
        match deleted {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "sweeper deleted expired records"),
            Err(e) => tracing::warn!(error = %e, "sweeper failed; will retry"),
        }
    }

    /// Claims held under `hold` whose lease ended turn `ambiguous`, in
    /// batches (SPEC §12: the sweeper or the next delivery, first come).
    async fn hold_ended_leases(&self) {
        let mut held = 0;
        loop {
            match self.store.hold_ended_leases(now_ms(), HOLD_BATCH).await {
                Ok(n) => {
                    held += n;
                    if (n as i64) < HOLD_BATCH {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "holding ended leases failed; will retry");
                    break;
                }
            }
        }
        if held > 0 {
            tracing::warn!(
                records = held,
                "leases ended without an answer under on_ambiguous: hold; the records wait for an operator"
            );
        }
    }

    async fn refresh_gauge(&self) {
        let now = now_ms();
        let t = Instant::now();
        let rows = self.store.oldest_processing().await;
        self.metrics.store_time("lookup", t.elapsed().as_secs_f64());
        match rows {
            Ok(rows) => {
                for r in &self.routes {
                    let age = rows
                        .iter()
                        .find(|(route, _)| route == r)
                        .map(|(_, oldest)| (now - oldest).max(0) as f64 / 1000.0)
                        .unwrap_or(0.0);
                    self.metrics.processing_oldest(r, age);
                }
            }
            Err(e) => tracing::debug!(error = %e, "oldest processing lookup failed"),
        }
    }
}

#[async_trait]
impl BackgroundService for Sweeper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut sweep = tokio::time::interval(self.interval);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut gauge = tokio::time::interval(GAUGE_EVERY.min(self.interval));
        gauge.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = sweep.tick() => self.sweep().await,
                _ = gauge.tick() => self.refresh_gauge().await,
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Pacing by batch time alone (the first sweep: nothing expected).
    fn unscheduled(paced_for: Duration) -> Pacing {
        Pacing {
            paced_for,
            spread: Duration::ZERO,
            expected: 0,
        }
    }

    #[test]
    fn paced_batches_pause_as_long_as_they_took_then_run_back_to_back() {
        let p = unscheduled(15_000 * MS);
        assert_eq!(pause_after(40 * MS, Duration::ZERO, 0, &p), Some(40 * MS));
        assert_eq!(pause_after(MS, 100 * MS, 0, &p), Some(MIN_PAUSE));
        assert_eq!(pause_after(40 * MS, 14_999 * MS, 9, &p), Some(40 * MS));
        assert_eq!(pause_after(40 * MS, 15_000 * MS, 9, &p), None);
        assert_eq!(pause_after(40 * MS, 60_000 * MS, 9, &p), None);
        // the CLI's sweep is paced throughout
        let cli = Pacing::THROUGHOUT;
        assert_eq!(
            pause_after(40 * MS, 3_600_000 * MS, 1 << 40, &cli),
            Some(40 * MS)
        );
        assert_eq!(
            pause_after(40 * MS, Duration::ZERO, 0, &unscheduled(Duration::ZERO)),
            None
        );
    }

    #[test]
    fn an_expected_sweep_is_spread_over_four_fifths_of_the_interval() {
        // 30 s interval, 150,000 expected: 1,000 records due every 160 ms
        let p = Pacing::every(30_000 * MS, 150_000);
        assert_eq!((p.paced_for, p.spread), (15_000 * MS, 24_000 * MS));
        // ahead of schedule: wait for it, longer than the batch took
        assert_eq!(pause_after(40 * MS, 40 * MS, 1_000, &p), Some(120 * MS));
        assert_eq!(
            pause_after(40 * MS, 12_000 * MS, 100_000, &p),
            Some(4_000 * MS)
        );
        // past the paced half and ahead: still the schedule
        assert_eq!(
            pause_after(40 * MS, 16_000 * MS, 110_000, &p),
            Some(1_600 * MS)
        );
        // behind it in the paced half: the batch's own time
        assert_eq!(pause_after(40 * MS, 9_000 * MS, 50_000, &p), Some(40 * MS));
        // behind it after the half, or past what was expected: back to back
        assert_eq!(pause_after(40 * MS, 20_000 * MS, 100_000, &p), None);
        assert_eq!(pause_after(40 * MS, 25_000 * MS, 200_000, &p), None);
        // exactly on schedule still yields a short pause
        assert_eq!(
            pause_after(40 * MS, 16_000 * MS, 100_000, &p),
            Some(MIN_PAUSE)
        );
    }
}
