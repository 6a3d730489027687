//! Following the routes' state in the store: the paused routes (SPEC §14),
//! which every process follows within 2 s, and the count of ambiguous
//! records (SPEC §5), on a loop of their own beside the sweeper's; with the
//! paused routes, every second, what the store's engine reports for the
//! metrics (SPEC §18: its shards, its durability waits).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::routes::PausedRoutes;
use crate::metrics::Metrics;
use crate::store::ClaimStore;

/// How often the paused routes are read: a pause reaches every process
/// within 2 s (SPEC §14).
const PAUSES_EVERY: Duration = Duration::from_secs(1);
/// How often the ambiguous records are counted (SPEC §5: at most every 30 s).
const AMBIGUOUS_EVERY: Duration = Duration::from_secs(30);

/// Follows the routes' state in the store on a loop of its own (a sweep may
/// take most of its interval): the paused routes, which every process
/// follows within 2 s (SPEC §14), and the count of ambiguous records.
pub struct RouteState {
    pub store: Arc<dyn ClaimStore>,
    pub metrics: Metrics,
    pub routes: Vec<String>,
    /// The paused routes the proxy checks.
    pub paused: Arc<PausedRoutes>,
}

impl RouteState {
    /// The paused routes, for the proxy and `idemgate_route_paused`.
    async fn refresh_paused(&self) {
        match self.store.paused().await {
            Ok(paused) => {
                for r in &self.routes {
                    self.metrics
                        .paused(r, paused.iter().any(|(route, _)| route == r));
                }
                self.paused.replace(paused);
            }
            // the last known state stands until the store answers
            Err(e) => tracing::debug!(error = %e, "reading the paused routes failed"),
        }
    }

    /// What the store's engine tells the metrics: its shards, and how long
    /// its durability waits took (the `wait` operation), SPEC §18.
    fn report_engine(&self) {
        let report = self.store.report();
        if let Some(n) = report.shards {
            self.metrics.store_shards(n);
        }
        for took in report.waits {
            self.metrics.store_time("wait", took);
        }
    }

    /// `idemgate_ambiguous_records`.
    async fn count_ambiguous(&self) {
        match self.store.ambiguous_counts().await {
            Ok(counts) => {
                for r in &self.routes {
                    let n = counts
                        .iter()
                        .find(|(route, _)| route == r)
                        .map_or(0, |c| c.1);
                    self.metrics.ambiguous(r, n);
                }
            }
            Err(e) => tracing::debug!(error = %e, "counting ambiguous records failed"),
        }
    }
}

#[async_trait]
impl BackgroundService for RouteState {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut pauses = tokio::time::interval(PAUSES_EVERY);
        pauses.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ambiguous = tokio::time::interval(AMBIGUOUS_EVERY);
        ambiguous.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = pauses.tick() => {
                    self.refresh_paused().await;
                    self.report_engine();
                }
                _ = ambiguous.tick() => self.count_ambiguous().await,
                _ = shutdown.changed() => return,
            }
        }
    }
}
