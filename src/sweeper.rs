//! The background housekeeping of `serve`: deletes expired records in bounded
//! batches and keeps `idemgate_processing_oldest_age_seconds` current.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::claim::Millis;
use crate::metrics::Metrics;
use crate::proxy::now_ms;
use crate::store::{ClaimStore, StoreError};

pub struct Sweeper {
    pub store: Arc<dyn ClaimStore>,
    pub metrics: Metrics,
    pub interval: Duration,
    pub batch_size: i64,
    /// Every route, so a route whose last processing record settled drops to 0.
    pub routes: Vec<String>,
}

/// Deletes every expired record, one bounded batch at a time, pausing between
/// batches so a large backlog does not monopolise the store. Returns how many.
pub async fn sweep_all(
    store: &dyn ClaimStore,
    metrics: Option<&Metrics>,
    now: Millis,
    batch_size: i64,
) -> Result<u64, StoreError> {
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
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl Sweeper {
    async fn tick(&self) {
        let now = now_ms();
        match sweep_all(
            self.store.as_ref(),
            Some(&self.metrics),
            now,
            self.batch_size,
        )
        .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(deleted = n, "sweeper deleted expired records"),
            Err(e) => tracing::warn!(error = %e, "sweeper failed; will retry"),
        }
        match self.store.oldest_processing().await {
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
        let mut every = tokio::time::interval(self.interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => self.tick().await,
                _ = shutdown.changed() => return,
            }
        }
    }
}
