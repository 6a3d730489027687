//! The settle step of the guard: committed with retries
//! ([`policy::SettleRetry`]); when it does not commit,
//! [`policy::without_store`] says what the sender gets.

use std::time::Instant;

use crate::claim::policy::{self, SettleRetry, StoreStep};
use crate::claim::{now_ms, AttemptEnd, SettleResult};
use crate::problem::{Problem, ProblemKind};
use crate::proxy::routes::RouteRt;
use crate::proxy::verdict::Refused;
use crate::proxy::Gate;
use crate::store::{SettleOutcome, SettleRequest};

impl Gate {
    /// Settles the attempt ([`Gate::settle`]); when the store does not take
    /// it, [`policy::without_store`] says whether the sender still gets the
    /// upstream's answer.
    pub(super) async fn settle_or_refuse(
        &self,
        route: &RouteRt,
        event_id: &str,
        attempt: i64,
        outcome: SettleOutcome<'_>,
    ) -> Result<(), Refused> {
        let (end, status) = match &outcome {
            SettleOutcome::Delivered { status, .. } => (AttemptEnd::Settled, Some(*status)),
            SettleOutcome::Failed { status, .. } => (AttemptEnd::Failed, *status),
        };
        if self
            .settle(route, event_id, attempt, outcome)
            .await
            .is_some()
        {
            return Ok(());
        }
        match policy::without_store(route.cfg.on_store_error, StoreStep::Settle(end)) {
            policy::WithoutStore::GoOn => Ok(()),
            policy::WithoutStore::Refuse => {
                let detail = "the upstream's answer could not be recorded; retry later";
                let mut r = Refused::new(store_unavailable(event_id, detail));
                r.upstream_status = status;
                Err(r)
            }
        }
    }

    /// Commits the settle, retrying a failing store ([`SettleRetry`]). A
    /// settle that still fails leaves the claim to its lease.
    async fn settle(
        &self,
        route: &RouteRt,
        event_id: &str,
        attempt: i64,
        outcome: SettleOutcome<'_>,
    ) -> Option<SettleResult> {
        let name = route.name();
        let deadline = Instant::now() + policy::SETTLE_DEADLINE;
        let mut retry = SettleRetry::default();
        let mut tries = 0;
        let error = loop {
            tries += 1;
            let req = SettleRequest {
                route: name,
                event_id,
                attempt,
                now: now_ms(),
                retention_ms: route.cfg.retention.ms(),
                outcome: outcome.clone(),
            };
            let t = Instant::now();
            // Not cut off from outside: a settle under way when the deadline
            // passes is waited for, so an error counted here never committed.
            let res = self
                .store
                .settle_within(&req, deadline.saturating_duration_since(t))
                .await;
            self.metrics.store_time("settle", t.elapsed().as_secs_f64());
            let e = match res {
                Ok(result) => {
                    self.metrics
                        .settles
                        .with_label_values(&[name, result.as_str()])
                        .inc();
                    return Some(result);
                }
                Err(e) => e,
            };
            match retry.after_failure(deadline.saturating_duration_since(Instant::now())) {
                Some(pause) => {
                    tracing::debug!(route = name, event_id, tries, error = %e, "settle failed, retrying");
                    tokio::time::sleep(pause).await;
                }
                None => break e,
            }
        };
        self.metrics
            .settles
            .with_label_values(&[name, "error"])
            .inc();
        tracing::error!(route = name, event_id, attempt, tries, error = %error, "settle failed; the claim stays until its lease ends");
        None
    }
}

pub(super) fn store_unavailable(event_id: &str, detail: &'static str) -> Problem {
    Problem::new(ProblemKind::StoreUnavailable, detail)
        .with_event_id(Some(event_id))
        .with_retry_after(policy::STORE_RETRY_AFTER_SECS)
}
