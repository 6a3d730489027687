//! The seam between [`ClaimStore`] and a database: a [`Backend`] runs each
//! operation, and [`Bounded`] turns any backend into a `ClaimStore` by
//! applying the client-side time bounds, the same way for every backend.
//!
//! The bounds live on the client side because a database that stops
//! answering mid-statement (behind a network partition, say) is not caught
//! by any server-side timeout.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;

use super::{
    Attempt, BulkRelease, ClaimOutcome, ClaimRequest, ClaimStore, EngineReport, ListFilter,
    QuestionBatch, Reconciliation, Record, ReleaseOutcome, ReleaseRequest, ResolveOutcome,
    ResolveRequest, SettleRequest, StoreError, UnacknowledgedClaim,
};
use crate::claim::{Millis, SettleResult, State};

/// Records a bulk release changes per batch (one transaction each on SQL).
const BULK_BATCH: i64 = 500;

/// One database behind the claim store. Each method does one operation of
/// [`ClaimStore`], typed: a backend that is not SQL implements every one
/// (`store::memory` is the reference model). [`Bounded`] cuts the reads
/// off after [`Backend::OP_TIMEOUT`] (`ping`, `peek`, `get`, `list`,
/// `history`, `paused`, `ambiguous_counts`, `oldest_processing`) and the
/// single release and the sweep's batches too. It does not cut off the
/// writes whose result must be known (`claim`, `settle`: they are given
/// their limit to be taken instead; the operator's `resolve`,
/// `release_unacknowledged`, `release_bulk`, `set_paused`, `reconciled`
/// and the sweeper's `hold_ended_leases`: an error there means nothing
/// committed), nor `migrate` and `close`; `take_questions` is cut off (a
/// mark taken and not answered only delays a question by `every`). A backend that queues other work
/// (a batch of lookups, a slice of a sweep) may bound the wait in the queue
/// by `OP_TIMEOUT` too.
///
/// Errors: any error means the operation did not take effect, unless the
/// error says that the backend could not learn whether it did (a commit
/// whose answer was lost). [`StoreError::Unavailable`] is for what the
/// backend found itself (a limit passed, a writer stopped); a driver's
/// error is passed on as its own variant.
pub trait Backend: Send + Sync {
    /// Bounds every operation on the client side, and is the longest a
    /// claim or settle waits to be taken. Above any server-side statement
    /// timeout, so that one fires first when the database is merely slow.
    const OP_TIMEOUT: Duration;

    /// What the engine tells the metrics (see [`ClaimStore::report`]).
    fn report(&self) -> EngineReport {
        EngineReport::default()
    }

    /// Applies pending migrations, safely when several processes start
    /// together. Not bounded: an index build may take minutes.
    fn migrate(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// One cheap read that touches the records table, not only the
    /// connection (`/readyz`).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// After [`ping`](Backend::ping): `Ok` only if a write could commit now.
    /// A backend whose writes may fail where reads succeed (a full disk)
    /// answers an error after a failed write until one commits again, and
    /// waits at most `limit` for its probe write. The default, `Ok`, is
    /// for a backend with nothing to add to `ping`: PostgreSQL (every write
    /// goes to the server `ping` reached), Valkey (`ping` checked the
    /// shards; a write's own wait says the rest), the memory model.
    fn write_probe(&self, _limit: Duration) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    /// Claims the event in one atomic statement (`claim::decide`'s rules in
    /// SQL), and reads a refused claim's record back to say why. `limit` is
    /// how long the claim may wait to be taken: one not under way by then
    /// is not run at all (an `Unavailable` error), and one under way is
    /// waited for to its answer, within the backend's own bound (see
    /// `ticket`). Not cut off from outside, so that a committed claim is
    /// never reported as failed.
    fn claim(
        &self,
        req: &ClaimRequest<'_>,
        limit: Duration,
    ) -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send;

    /// Settles an attempt in one atomic statement: delivered is final and
    /// the first settle wins, whatever its attempt; a failure is fenced by
    /// the attempt number. A settle that changes nothing is `Stale`.
    /// `limit` as for [`claim`](Backend::claim).
    fn settle(
        &self,
        req: &SettleRequest<'_>,
        limit: Duration,
    ) -> impl Future<Output = Result<SettleResult, StoreError>> + Send;

    /// The claim's answer when the record alone decides it (delivered,
    /// another digest, a live lease), `None` when the claim must run. Never
    /// writes.
    fn peek(
        &self,
        req: &ClaimRequest<'_>,
    ) -> impl Future<Output = Result<Option<ClaimOutcome>, StoreError>> + Send;

    /// One record, every field.
    fn get(
        &self,
        route: &str,
        event_id: &str,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;

    /// The records `filter` selects, newest first (then by route and event
    /// ID), at most `filter.limit`.
    fn list(
        &self,
        filter: &ListFilter,
    ) -> impl Future<Output = Result<Vec<Record>, StoreError>> + Send;

    /// Operator release to `failed`, as a compare-and-set on the state read
    /// just before, so that the outcome names the state it released; a
    /// delivered record only with `force`. Anything that caches delivered
    /// records must learn of it.
    fn release(
        &self,
        req: &ReleaseRequest<'_>,
    ) -> impl Future<Output = Result<ReleaseOutcome, StoreError>> + Send;

    /// Deletes at most `limit` records expired by `now`, never one with a
    /// live lease; returns how many.
    fn sweep(
        &self,
        now: Millis,
        limit: i64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Per route, the `updated_at` of the oldest `processing` record.
    fn oldest_processing(
        &self,
    ) -> impl Future<Output = Result<Vec<(String, Millis)>, StoreError>> + Send;

    /// An `ambiguous` record to `delivered` or `failed`, as one
    /// compare-and-set on its state; what was found otherwise. Anything
    /// that caches delivered records must learn of it.
    fn resolve(
        &self,
        req: &ResolveRequest<'_>,
    ) -> impl Future<Output = Result<ResolveOutcome, StoreError>> + Send;

    /// A `processing` record whose claim token is `claim.token` to
    /// `failed`, atomically; whether one was.
    fn release_unacknowledged(
        &self,
        claim: &UnacknowledgedClaim<'_>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The record's attempts, oldest first (at most the newest 20), none
    /// for an absent record.
    fn history(
        &self,
        route: &str,
        event_id: &str,
    ) -> impl Future<Output = Result<Vec<Attempt>, StoreError>> + Send;

    /// One batch of a bulk release: at most `batch` records `req` selects,
    /// changed before `req.now`, released to `failed` atomically each (a
    /// record that changed meanwhile is left); how many were. With
    /// `dry_run`, how many `req` selects in all, changing nothing. A
    /// delivered state is refused.
    fn release_bulk(
        &self,
        req: &BulkRelease<'_>,
        batch: i64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Adds (keeping a first `paused_at`) or removes the route's pause.
    fn set_paused(
        &self,
        route: &str,
        paused: bool,
        now: Millis,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The paused routes and since when, by name.
    fn paused(&self) -> impl Future<Output = Result<Vec<(String, Millis)>, StoreError>> + Send;

    /// Per route with any, how many records are `ambiguous`, by name.
    fn ambiguous_counts(
        &self,
    ) -> impl Future<Output = Result<Vec<(String, i64)>, StoreError>> + Send;

    /// At most `limit` `processing` records claimed under `hold` whose
    /// lease ended by `now` turn `ambiguous`, each with its lost attempt
    /// recorded in the same atomic change; how many did. Cheap when there
    /// is none (a read, not a write).
    fn hold_ended_leases(
        &self,
        now: Millis,
        limit: i64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// A question's answer recorded and acted on, as one atomic change
    /// fenced by the state (`ambiguous`) and the attempt count; what was
    /// found otherwise (see [`ClaimStore::reconciled`]). Anything that
    /// caches delivered records must learn of it.
    fn reconciled(
        &self,
        req: &Reconciliation<'_>,
    ) -> impl Future<Output = Result<ResolveOutcome, StoreError>> + Send;

    /// The background's questions to ask (see
    /// [`ClaimStore::take_questions`]): each record's mark taken with a
    /// compare-and-set of its own, so that two processes never both take
    /// one before its mark passes.
    fn take_questions(
        &self,
        batch: &QuestionBatch<'_>,
    ) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// Closes every connection (the last one flushes SQLite's WAL).
    fn close(&self) -> impl Future<Output = ()> + Send;
}

/// A [`Backend`] as a [`ClaimStore`], every operation bounded by the
/// backend's [`OP_TIMEOUT`](Backend::OP_TIMEOUT): both stores get the same
/// bounds and the same contract from this one impl.
pub struct Bounded<B>(B);

impl<B: Backend> Bounded<B> {
    pub fn new(backend: B) -> Self {
        Bounded(backend)
    }
}

#[async_trait]
impl<B: Backend> ClaimStore for Bounded<B> {
    async fn migrate(&self) -> Result<(), StoreError> {
        self.0.migrate().await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        bounded(B::OP_TIMEOUT, async {
            self.0.ping().await?;
            // and, where a write failed last, that one can commit now
            self.0.write_probe(B::OP_TIMEOUT).await
        })
        .await
    }

    // Not `bounded` from outside: an operation a batch has taken is waited
    // for (its answer says whether it committed).
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.0.claim(req, B::OP_TIMEOUT).await
    }

    async fn settle(&self, req: &SettleRequest<'_>) -> Result<SettleResult, StoreError> {
        self.0.settle(req, B::OP_TIMEOUT).await
    }

    async fn settle_within(
        &self,
        req: &SettleRequest<'_>,
        limit: Duration,
    ) -> Result<SettleResult, StoreError> {
        self.0.settle(req, limit.min(B::OP_TIMEOUT)).await
    }

    async fn peek(&self, req: &ClaimRequest<'_>) -> Result<Option<ClaimOutcome>, StoreError> {
        bounded(B::OP_TIMEOUT, self.0.peek(req)).await
    }

    async fn get(&self, route: &str, event_id: &str) -> Result<Option<Record>, StoreError> {
        bounded(B::OP_TIMEOUT, self.0.get(route, event_id)).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
        bounded(B::OP_TIMEOUT, self.0.list(filter)).await
    }

    async fn release(&self, req: &ReleaseRequest<'_>) -> Result<ReleaseOutcome, StoreError> {
        bounded(B::OP_TIMEOUT, self.0.release(req)).await
    }

    async fn sweep_batch(&self, now: Millis, limit: i64) -> Result<u64, StoreError> {
        bounded(B::OP_TIMEOUT, self.0.sweep(now, limit)).await
    }

    async fn oldest_processing(&self) -> Result<Vec<(String, Millis)>, StoreError> {
        bounded(B::OP_TIMEOUT, self.0.oldest_processing()).await
    }

    async fn resolve(&self, req: &ResolveRequest<'_>) -> Result<ResolveOutcome, StoreError> {
        self.0.resolve(req).await
    }

    async fn release_unacknowledged(
        &self,
        claim: &UnacknowledgedClaim<'_>,
    ) -> Result<bool, StoreError> {
        self.0.release_unacknowledged(claim).await
    }

    async fn history(&self, route: &str, event_id: &str) -> Result<Vec<Attempt>, StoreError> {
        bounded(B::OP_TIMEOUT, self.0.history(route, event_id)).await
    }

    async fn release_bulk(&self, req: &BulkRelease<'_>) -> Result<u64, StoreError> {
        if req.state == State::Delivered {
            return Err(StoreError::Unavailable(
                "a delivered record is never released in bulk".into(),
            ));
        }
        if req.dry_run {
            return bounded(B::OP_TIMEOUT, self.0.release_bulk(req, 0)).await;
        }
        let mut released = 0;
        loop {
            let n = self.0.release_bulk(req, BULK_BATCH).await?;
            released += n;
            if n == 0 {
                return Ok(released);
            }
        }
    }

    async fn set_paused(&self, route: &str, paused: bool, now: Millis) -> Result<(), StoreError> {
        self.0.set_paused(route, paused, now).await
    }

    async fn paused(&self) -> Result<Vec<(String, Millis)>, StoreError> {
        bounded(B::OP_TIMEOUT, self.0.paused()).await
    }

    async fn ambiguous_counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        bounded(B::OP_TIMEOUT, self.0.ambiguous_counts()).await
    }

    async fn hold_ended_leases(&self, now: Millis, limit: i64) -> Result<u64, StoreError> {
        self.0.hold_ended_leases(now, limit).await
    }

    fn report(&self) -> EngineReport {
        self.0.report()
    }

    async fn reconciled(&self, req: &Reconciliation<'_>) -> Result<ResolveOutcome, StoreError> {
        self.0.reconciled(req).await
    }

    async fn take_questions(&self, batch: &QuestionBatch<'_>) -> Result<Vec<String>, StoreError> {
        bounded(B::OP_TIMEOUT, self.0.take_questions(batch)).await
    }

    async fn close(&self) {
        self.0.close().await;
    }
}

/// Runs one store operation, failing it as unavailable once `limit` passes.
async fn bounded<T>(
    limit: Duration,
    op: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, op).await {
        Ok(res) => res,
        Err(_) => Err(StoreError::Unavailable(format!(
            "no answer within {}",
            humantime::format_duration(limit)
        ))),
    }
}
