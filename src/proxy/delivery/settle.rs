//! The settle step of a delivery: committed with retries
//! ([`policy::SettleRetry`]); when it does not commit,
//! [`policy::without_store`] says what the sender gets.

use std::time::Instant;

use crate::claim::policy::{self, SettleRetry, StoreStep};
use crate::claim::{now_ms, AttemptEnd, SettleResult};
use crate::problem::{Problem, ProblemKind};
use crate::proxy::exit::Refused;
use crate::store::owned::OwnedSettle;
use crate::store::{SettleOutcome, SettleRequest, StoreError};
use crate::telemetry::outage;

use super::Delivery;

// ---- Delivery: the settle, committed or carried across a store outage

impl Delivery<'_> {
    /// Settles the attempt ([`Delivery::commit`]); when the store does not
    /// take it, [`policy::without_store`] says whether the sender still gets
    /// the upstream's answer.
    /// `attempt_error` is what the attempt's row says went wrong.
    pub async fn settle(
        &self,
        outcome: SettleOutcome<'_>,
        attempt_error: Option<&str>,
    ) -> Result<(), Refused> {
        let (end, status) = match &outcome {
            SettleOutcome::Delivered { status, .. } => (AttemptEnd::Settled, Some(*status)),
            SettleOutcome::Failed { status, .. } => (AttemptEnd::Failed, *status),
            SettleOutcome::Ambiguous { .. } => (AttemptEnd::Ambiguous, None),
        };
        let span = self.trace.map(|t| t.store_step("idemgate.settle"));
        let committed = self.commit(outcome, attempt_error).await;
        if let Some(mut span) = span {
            let label = committed.map_or("store_error", SettleResult::as_str);
            crate::otel::store_outcome(&mut span, label);
        }
        if committed.is_some() {
            return Ok(());
        }
        let on_store_error = self.route.cfg.on_store_error;
        match policy::without_store(on_store_error, StoreStep::Settle(end)) {
            policy::WithoutStore::GoOn => Ok(()),
            policy::WithoutStore::Refuse => {
                let detail = "the upstream's answer could not be recorded; retry later";
                let mut r = Refused::new(store_unavailable(&self.event_id, detail));
                r.upstream_status = status;
                Err(r)
            }
        }
    }

    /// Commits the settle, retrying a failing store ([`SettleRetry`]). A
    /// settle that still fails leaves the claim to its lease.
    async fn commit(
        &self,
        outcome: SettleOutcome<'_>,
        attempt_error: Option<&str>,
    ) -> Option<SettleResult> {
        let (shared, name, event_id) = (self.shared, self.route.name(), self.event_id.as_str());
        let deadline = Instant::now() + policy::SETTLE_DEADLINE;
        let mut retry = SettleRetry::default();
        let mut tries = 0;
        let error = loop {
            tries += 1;
            let req = self.settle_request(outcome.clone(), attempt_error);
            let t = Instant::now();
            // Not cut off from outside: a settle under way when the deadline
            // passes is waited for, so an error counted here never committed.
            let res = shared
                .store
                .settle_within(&req, deadline.saturating_duration_since(t))
                .await;
            shared
                .metrics
                .store_time("settle", t.elapsed().as_secs_f64());
            let e = match res {
                Ok(result) => {
                    shared.metrics.settled(name, result.as_str());
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
        self.carry(outcome, attempt_error, tries, &error);
        None
    }

    /// A settle that did not commit within its deadline: carried across the
    /// store's outage while the lease allows ([`PendingSettles`]), else
    /// left to its lease.
    ///
    /// [`PendingSettles`]: crate::proxy::PendingSettles
    fn carry(
        &self,
        outcome: SettleOutcome<'_>,
        attempt_error: Option<&str>,
        tries: u32,
        error: &StoreError,
    ) {
        let (shared, name, event_id) = (self.shared, self.route.name(), self.event_id.as_str());
        let attempt = self.attempt.unwrap_or(0);
        let owned = OwnedSettle::new(&self.settle_request(outcome, attempt_error));
        let (store, metrics) = (&shared.store, &shared.metrics);
        if shared
            .pending
            .carry(store, metrics, owned, self.lease_until)
        {
            if outage::event_line("settle_kept") {
                tracing::warn!(route = name, event_id, attempt, tries, error = %error, "settle failed; kept and retried until the lease nearly ends");
            }
        } else {
            metrics.settled(name, "error");
            if outage::event_line("settle_lost") {
                tracing::error!(route = name, event_id, attempt, tries, error = %error, "settle failed; the claim stays until its lease ends");
            }
        }
    }

    /// This attempt's settle, as of now.
    fn settle_request<'r>(
        &'r self,
        outcome: SettleOutcome<'r>,
        attempt_error: Option<&'r str>,
    ) -> SettleRequest<'r> {
        SettleRequest {
            route: self.route.name(),
            event_id: &self.event_id,
            // only a claimed delivery settles
            attempt: self.attempt.unwrap_or(0),
            started_at: self.started_at,
            instance: &self.shared.instance,
            attempt_error,
            now: now_ms(),
            retention_ms: self.route.cfg.retention.ms(),
            outcome,
        }
    }
}

pub fn store_unavailable(event_id: &str, detail: &'static str) -> Problem {
    Problem::new(ProblemKind::StoreUnavailable, detail)
        .with_event_id(Some(event_id))
        .with_retry_after(policy::STORE_RETRY_AFTER_SECS)
}
