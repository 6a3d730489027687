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

use super::sql::{Statement, Value};
use super::{
    ClaimOutcome, ClaimRequest, ClaimStore, ListFilter, Record, ReleaseOutcome, ReleaseRequest,
    SettleRequest, StoreError,
};
use crate::claim::{Millis, SettleResult};

/// One database behind the claim store. Each method does one operation of
/// [`ClaimStore`]; [`Bounded`] applies [`Backend::OP_TIMEOUT`] around it
/// (but not around `migrate` and `close`), except that a claim or settle is
/// given its limit instead, not cut off from outside. A backend that
/// queues other work (a batch of lookups, a slice of a sweep) may bound the
/// wait in the queue by `OP_TIMEOUT` too.
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

    /// Applies pending migrations, safely when several processes start
    /// together. Not bounded: an index build may take minutes.
    fn migrate(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// One cheap read that touches the records table, not only the
    /// connection (`/readyz`).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// After [`ping`](Backend::ping): `Ok` only if a write could commit now.
    /// A backend whose writes may fail where reads succeed (a full disk)
    /// answers an error after a failed write until one commits again, and
    /// waits at most `limit` for its probe write.
    fn write_probe(&self, limit: Duration) -> impl Future<Output = Result<(), StoreError>> + Send;

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

    /// Runs `statements` in one transaction; the rows each changed. A
    /// change of records that caches may hold counts itself (SQLite).
    fn write(
        &self,
        statements: &[Statement<'_>],
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send;

    /// The rows of one read, as values.
    fn read(
        &self,
        statement: &Statement<'_>,
    ) -> impl Future<Output = Result<Vec<Vec<Value>>, StoreError>> + Send;

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

    async fn write(&self, statements: &[Statement<'_>]) -> Result<Vec<u64>, StoreError> {
        self.0.write(statements).await
    }

    async fn read(&self, statement: &Statement<'_>) -> Result<Vec<Vec<Value>>, StoreError> {
        bounded(B::OP_TIMEOUT, self.0.read(statement)).await
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
