//! The background housekeeping of `serve`: deletes expired records in bounded
//! batches and keeps `idemgate_processing_oldest_age_seconds` current.

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
}

/// Deletes every expired record, one bounded batch at a time. For the first
/// `pacing` of the sweep it pauses after each batch as long as the batch
/// took (at least [`MIN_PAUSE`]), so the sweep takes at most half the
/// store's time and the claims meanwhile keep the other half (on SQLite a
/// batch runs on the one writer; in issue 24's steady state, sweeps without
/// a pause cut the claim rate they ran beside by 12 %). Past `pacing` it
/// runs the batches back to back: a backlog the paced half could not clear
/// is cleared before the next sweep is due (the serve loop passes half its
/// interval; with pauses throughout, PostgreSQL's sweeper fell behind at
/// 8,500 claims/s). Returns how many.
pub async fn sweep_all(
    store: &dyn ClaimStore,
    metrics: Option<&Metrics>,
    now: Millis,
    batch_size: i64,
    pacing: Duration,
) -> Result<u64, StoreError> {
    let started = Instant::now();
    let mut total = 0;
    loop {
        let t = Instant::now();
        let n = store.sweep_batch(now, batch_size).await?;
        if let Some(m) = metrics {
            m.store_time("sweep", t.elapsed().as_secs_f64());
            m.records_swept.inc_by(n);
        }
        total += n;
        if (n as i64) < batch_size {
            return Ok(total);
        }
        match pause_after(t.elapsed(), started.elapsed(), pacing) {
            Some(pause) => tokio::time::sleep(pause).await,
            None => tokio::task::yield_now().await,
        }
    }
}

/// The shortest pause between two paced batches of a sweep.
const MIN_PAUSE: Duration = Duration::from_millis(10);

/// The pause after a batch that took `batch`, `swept_for` into a sweep
/// paced for its first `pacing`; none once past it.
fn pause_after(batch: Duration, swept_for: Duration, pacing: Duration) -> Option<Duration> {
    (swept_for < pacing).then(|| batch.max(MIN_PAUSE))
}

/// How often the oldest-processing gauge is refreshed.
const GAUGE_EVERY: Duration = Duration::from_secs(5);

impl Sweeper {
    async fn sweep(&self) {
        let deleted = sweep_all(
            self.store.as_ref(),
            Some(&self.metrics),
            now_ms(),
            self.batch_size,
            self.interval / 2,
        )
        .await;
        match deleted {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "sweeper deleted expired records"),
            Err(e) => tracing::warn!(error = %e, "sweeper failed; will retry"),
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
                    self.metrics
                        .processing_oldest_age
                        .with_label_values(&[r])
                        .set(age);
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

    #[test]
    fn paced_batches_pause_as_long_as_they_took_then_run_back_to_back() {
        let pacing = 15_000 * MS;
        assert_eq!(pause_after(40 * MS, Duration::ZERO, pacing), Some(40 * MS));
        assert_eq!(pause_after(MS, 100 * MS, pacing), Some(MIN_PAUSE));
        assert_eq!(pause_after(40 * MS, 14_999 * MS, pacing), Some(40 * MS));
        assert_eq!(pause_after(40 * MS, 15_000 * MS, pacing), None);
        assert_eq!(pause_after(40 * MS, 60_000 * MS, pacing), None);
        // the CLI's sweep is paced throughout
        assert_eq!(
            pause_after(40 * MS, 3_600_000 * MS, Duration::MAX),
            Some(40 * MS)
        );
        assert_eq!(pause_after(40 * MS, Duration::ZERO, Duration::ZERO), None);
    }
}
