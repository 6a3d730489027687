//! Group commit for PostgreSQL: the lookups, claims and delivered settles
//! that arrive while earlier ones are on their way each go to the server as
//! one statement over arrays (`UNNEST`), one round trip and one commit for
//! the lot. Per event, that saves the statement's fixed cost on both sides
//! (the executor's start-up, the commit, the WAL flush, the driver), which
//! was most of the durable path's time.
//!
//! Each kind has a dispatcher that runs one batch at a time: it takes
//! everything queued, runs it, answers, and takes what queued meanwhile.
//! Under light load a batch is one operation and costs what the single
//! statement did; under heavy load the queue fills while a batch runs, and
//! batches grow.
//!
//! A dispatcher keeps its connection from one batch to the next (when the
//! pool has room for that, see [`Batchers::start`]): sqlx pings a
//! connection on every return to the pool, a round trip per batch that cost
//! more of both processes' CPU than anything but the statement itself
//! (perf, load scenario d). A batch that fails keeps the connection only if
//! a ping then answers; one given up on (the server went silent, see
//! `silence`) closes it.
//!
//! Every batch is one statement, so no transaction spans a round trip. Keys
//! go in sorted order, so that two replicas' batches lock shared rows in the
//! same order. A key that repeats within a batch, a row that a concurrent
//! writer changed in between, and a batch the server refused (a deadlock
//! with another replica, say) fall back to the single statements of
//! `claim_on`/`settle_on`, whose answers are authoritative.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, Postgres};
use sqlx::{PgConnection, Row};
use tokio::sync::{mpsc, oneshot};

use super::hosts::{self, Hosts};
use super::rows::{claim_on, readback, settle_on};
use super::silence;
use crate::claim::SettleResult;
use crate::store::owned::{OwnedClaim, OwnedOutcome, OwnedSettle};
use crate::store::sql::{self, Readback};
use crate::store::ticket::{self, Ticket};
use crate::store::{ClaimOutcome, Found, ReplayHeaders, StoreError};
use std::sync::Arc;

/// Most operations in one statement.
const MAX_BATCH: usize = 128;

/// Connections the dispatchers keep: one each.
pub(super) const KEPT_CONNECTIONS: u32 = 3;

/// Claims of keys not in the table yet, or reclaimable: [`sql::CLAIM`] over
/// arrays. $1 routes, $2 event_ids, $3 digests, $4 lease_until, $5 now,
/// $6 expires_at, $7 hold, $8 instance, $9 tokens, $10 sends (SPEC §19,
/// NULL where not traced) — one element per claim, sorted by (route,
/// event_id).
const CLAIM_MANY: &str = concat!(
    sql::claim_insert!(),
    "SELECT r, e, d, 'processing', 1, l, n, n, x, h, c, k, t
FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int8[], $5::int8[], $6::int8[],
            $7::int8[], $8::text[], $9::int8[], $10::text[])
     WITH ORDINALITY AS u(r, e, d, l, n, x, h, c, k, t, i)
ORDER BY i\n",
    sql::claim_on_conflict!(),
    "RETURNING route, event_id, attempts, claimed_from, claimed_trace"
);

/// [`sql::CLAIM_READBACK`] for many keys. $1 routes, $2 event_ids
const READ_MANY: &str = "\
SELECT records.route, records.event_id, state, lease_until, body_sha256, last_status,
       replay_status, replay_content_type, replay_body, replay_headers, send_trace
FROM records JOIN UNNEST($1::text[], $2::text[]) AS u(r, e)
  ON records.route = u.r AND records.event_id = u.e";

/// [`sql::SETTLE_DELIVERED`] for many keys, with each attempt's row
/// (SPEC §13) in the same statement — but for a first attempt that
/// delivered, which the record itself holds ([`sql::first_delivered`]). $1 routes, $2 event_ids, $3 statuses,
/// $4 now, $5 expires_at, $6 replay statuses, $7 replay content types,
/// $8 replay bodies, $9 attempts, $10 attempts' starts, $11 instances,
/// $12 replayed headers (SPEC §22)
const DELIVER_MANY: &str = "\
WITH u AS (
    SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[], $6::int8[],
                         $7::text[], $8::bytea[], $9::int8[], $10::int8[], $11::text[], $12::text[])
        AS u(r, e, s, n, x, rs, rct, rb, a, st, c, rh)),
d AS (
    UPDATE records SET state = 'delivered', last_status = u.s, last_error = NULL,
        lease_until = NULL, delivered_at = u.n, updated_at = u.n, expires_at = u.x,
        replay_status = u.rs, replay_content_type = u.rct, replay_body = u.rb,
        replay_headers = u.rh
    FROM u
    WHERE records.route = u.r AND records.event_id = u.e AND records.state <> 'delivered'
    RETURNING records.route, records.event_id),
w AS (
    INSERT INTO record_attempts
        (route, event_id, attempt, started_at, ended_at, status, result, error, duration_ms, instance)
    SELECT u.r, u.e, u.a, u.st, u.n, u.s,
           CASE WHEN d.route IS NULL THEN 'stale' ELSE 'delivered' END, NULL, u.n - u.st, u.c
    FROM u LEFT JOIN d ON d.route = u.r AND d.event_id = u.e
    -- a first attempt that delivered is its record's own columns (sql::HISTORY)
    WHERE NOT (u.a = 1 AND d.route IS NOT NULL)
      AND EXISTS (SELECT 1 FROM records WHERE records.route = u.r AND records.event_id = u.e
                  AND NOT (u.a = 1 AND records.state = 'delivered' AND records.attempts = 1))
    ON CONFLICT (route, event_id, attempt) DO UPDATE SET
        started_at = excluded.started_at, ended_at = excluded.ended_at, status = excluded.status,
        result = excluded.result, error = excluded.error, duration_ms = excluded.duration_ms,
        instance = excluded.instance
    WHERE record_attempts.result <> 'delivered'),
t AS (
    DELETE FROM record_attempts a USING u
    WHERE u.a > 20 AND a.route = u.r AND a.event_id = u.e AND a.attempt <= u.a - 20)
SELECT route, event_id FROM d";

/// [`DELIVER_MANY`] for a batch of first attempts, by far the most common:
/// a first attempt that delivers is its record's own columns
/// ([`sql::first_delivered`]), so the statement is the update alone (no
/// attempt rows to join, insert or trim: the release before's cost). $1–$8
/// as [`DELIVER_MANY`]'s, $9 its $12.
const DELIVER_FIRSTS: &str = "\
UPDATE records SET state = 'delivered', last_status = u.s, last_error = NULL,
    lease_until = NULL, delivered_at = u.n, updated_at = u.n, expires_at = u.x,
    replay_status = u.rs, replay_content_type = u.rct, replay_body = u.rb,
    replay_headers = u.rh
FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[], $6::int8[],
            $7::text[], $8::bytea[], $9::text[]) AS u(r, e, s, n, x, rs, rct, rb, rh)
WHERE records.route = u.r AND records.event_id = u.e AND records.state <> 'delivered'
RETURNING records.route, records.event_id";

/// After [`DELIVER_FIRSTS`]: the rows of first attempts whose settle
/// changed nothing (the record was delivered already, by a later attempt;
/// a record its first attempt delivered is this settle repeated, and gets
/// no row), as [`DELIVER_MANY`] writes them. No record changed for them, so their
/// rows need no commit of their own to share. $1 routes, $2 event_ids,
/// $3 statuses, $4 ends, $5 starts, $6 instances
const STALE_FIRSTS: &str = "\
INSERT INTO record_attempts
    (route, event_id, attempt, started_at, ended_at, status, result, error, duration_ms, instance)
SELECT u.r, u.e, 1, u.st, u.n, u.s, 'stale', NULL, u.n - u.st, u.c
FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[], $6::text[])
    AS u(r, e, s, n, st, c)
WHERE EXISTS (SELECT 1 FROM records WHERE records.route = u.r AND records.event_id = u.e
              AND NOT (records.state = 'delivered' AND records.attempts = 1))
ON CONFLICT (route, event_id, attempt) DO UPDATE SET
    started_at = excluded.started_at, ended_at = excluded.ended_at, status = excluded.status,
    result = excluded.result, error = excluded.error, duration_ms = excluded.duration_ms,
    instance = excluded.instance
WHERE record_attempts.result <> 'delivered'";

type Key = (String, String);
type Reply<O> = oneshot::Sender<Result<O, StoreError>>;
/// A queued operation: the item, its hand-off (see `ticket`), its answer.
type Job<I, O> = (I, Ticket, Reply<O>);

/// A duplicate lookup: the key; answered with the record's decisive columns.
pub(super) struct Lookup {
    pub route: String,
    pub event_id: String,
}

/// The queues of the three dispatchers.
pub(super) struct Batchers {
    lookups: mpsc::Sender<Job<Lookup, Option<Readback>>>,
    claims: mpsc::Sender<Job<OwnedClaim, ClaimOutcome>>,
    delivered: mpsc::Sender<Job<OwnedSettle, SettleResult>>,
}

impl Batchers {
    /// Starts the dispatchers on the current runtime. They keep their
    /// connections between batches when `pool_size` leaves at least one
    /// more for the rest (failed settles); otherwise each batch takes one
    /// from the pool and gives it back.
    pub(super) fn start(pool: &PgPool, pool_size: u32, hosts: &Arc<Hosts>) -> Self {
        let keep = pool_size > KEPT_CONNECTIONS;
        Batchers {
            lookups: dispatch(pool.clone(), Arc::clone(hosts), keep, read_batch),
            claims: dispatch(pool.clone(), Arc::clone(hosts), keep, claim_batch),
            delivered: dispatch(pool.clone(), Arc::clone(hosts), keep, deliver_batch),
        }
    }

    pub(super) async fn lookup(
        &self,
        item: Lookup,
        limit: Duration,
    ) -> Result<Option<Readback>, StoreError> {
        ask(&self.lookups, item, limit).await
    }

    pub(super) async fn claim(
        &self,
        item: OwnedClaim,
        limit: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        ask(&self.claims, item, limit).await
    }

    /// A delivered settle (failed ones are rare and run alone).
    pub(super) async fn deliver(
        &self,
        item: OwnedSettle,
        limit: Duration,
    ) -> Result<SettleResult, StoreError> {
        ask(&self.delivered, item, limit).await
    }
}

/// Queues `item`; withdrawn unless a batch takes it within `limit`.
async fn ask<I, O>(
    queue: &mpsc::Sender<Job<I, O>>,
    item: I,
    limit: Duration,
) -> Result<O, StoreError> {
    let gone = || StoreError::Unavailable("the PostgreSQL batcher stopped".into());
    let (ticket, tx, waiter) = ticket::new();
    match tokio::time::timeout(limit, queue.send((item, ticket, tx))).await {
        Ok(sent) => sent.map_err(|_| gone())?,
        Err(_) => {
            return Err(StoreError::Unavailable(
                "not run: the PostgreSQL batcher's queue stayed full".into(),
            ))
        }
    }
    waiter.answer(limit).await
}

/// What a dispatcher runs: one batch on a connection.
type BatchFuture<'c, O> = Pin<Box<dyn Future<Output = Vec<Result<O, StoreError>>> + Send + 'c>>;

/// Runs the batches of `run` one at a time; stops when every sender is gone.
///
/// An operation is taken (see `ticket`) once the batch has its connection,
/// right before the statement: one withdrawn by then — its requester's time
/// ran out while earlier batches were stuck, and the sender was told to
/// retry — is not run. A claim made behind its back would only hold the
/// event in flight until its lease ends; a settle, contradict the error the
/// proxy counted.
///
/// One statement of a kind in flight at a time: while it runs, the next
/// batch fills, so the batch size follows the load; more in flight only
/// split the same operations over more statements. Measured with the load
/// harness (scenario d, 64 connections, server on the same 2 cores): 3 in
/// flight 7.8-8.8k events/s at 77-83 µs of server CPU per event, 2 8.4-9.1k
/// at 67-73 µs, 1 9.4-10.2k at 55-60 µs.
fn dispatch<I, O>(
    pool: PgPool,
    hosts: Arc<Hosts>,
    keep: bool,
    run: for<'c> fn(&'c mut PgConnection, Vec<I>) -> BatchFuture<'c, O>,
) -> mpsc::Sender<Job<I, O>>
where
    I: Send + 'static,
    O: Send + 'static,
{
    let (queue, mut jobs) = mpsc::channel::<Job<I, O>>(4 * MAX_BATCH);
    tokio::spawn(async move {
        let mut kept: Option<PoolConnection<Postgres>> = None;
        // A closing pool waits for every connection to come back.
        let mut closing = std::pin::pin!(pool.close_event());
        let mut keep = keep;
        loop {
            let next = match kept {
                None => jobs.recv().await,
                Some(_) => tokio::select! {
                    biased;
                    job = jobs.recv() => job,
                    () = &mut closing => {
                        (kept, keep) = (None, false);
                        continue;
                    }
                },
            };
            let Some(first) = next else { break };
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match jobs.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            batch.retain(|(_, ticket, _)| !ticket.withdrawn());
            if batch.is_empty() {
                continue;
            }
            let conn = match kept.take() {
                Some(conn) => Ok(conn),
                None => pool.acquire().await,
            };
            let conn = match conn {
                Ok(conn) => {
                    batch.retain(|(_, ticket, _)| ticket.take());
                    if batch.is_empty() {
                        if keep {
                            kept = Some(conn);
                        }
                        continue;
                    }
                    Ok(conn)
                }
                Err(e) => Err(e),
            };
            let (items, replies): (Vec<I>, Vec<Reply<O>>) = batch
                .into_iter()
                .map(|(item, _, reply)| (item, reply))
                .unzip();
            let server = pool.connect_options();
            let (results, back) = run_batch(&server, &hosts, conn, items, keep, run).await;
            kept = back;
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
    });
    queue
}

/// Runs one batch on `conn`: a result for each item, and the connection
/// back when it is kept for the next batch. Its requesters wait for it (see
/// `ticket`) for as long as the `server` keeps answering (see `silence`).
/// A connection whose server is gone or takes no writes is closed, and
/// `hosts` told.
async fn run_batch<I, O>(
    server: &PgConnectOptions,
    hosts: &Hosts,
    conn: Result<PoolConnection<Postgres>, sqlx::Error>,
    items: Vec<I>,
    keep: bool,
    run: for<'c> fn(&'c mut PgConnection, Vec<I>) -> BatchFuture<'c, O>,
) -> (Vec<Result<O, StoreError>>, Option<PoolConnection<Postgres>>) {
    let mut conn = match conn {
        Err(e) => {
            hosts.trouble();
            return (all_failed(items.len(), e.into()), None);
        }
        Ok(conn) => conn,
    };
    let n = items.len();
    match silence::unless_silent(server, run(&mut conn, items)).await {
        Ok(results) => {
            let failed = results.iter().any(Result::is_err);
            if !still_good(&mut conn, failed).await {
                hosts.trouble();
                drop(conn.detach());
                return (results, None);
            }
            (results, keep.then_some(conn))
        }
        Err(gave_up) => {
            // cut off mid-statement: the connection's state is unknown
            hosts.trouble();
            drop(conn.detach());
            let e = StoreError::OutcomeUnknown(gave_up.describe("a batch"));
            (all_failed(n, e), None)
        }
    }
}

/// Whether a connection may run the next batch: yes after a batch without
/// errors; after one with errors, if its server answers and still takes
/// writes (a primary demoted under it answers every write with 25006).
async fn still_good(conn: &mut PgConnection, failed: bool) -> bool {
    if !failed {
        return true;
    }
    matches!(
        tokio::time::timeout(silence::QUIET, hosts::writable(conn)).await,
        Ok(Ok(true))
    )
}

/// The indexes of the batch's items in key order, each key's first
/// occurrence only: repeats are left for the single statements.
fn firsts_by_key<'a>(keys: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<usize> {
    let mut order: Vec<(usize, (&str, &str))> = keys.enumerate().collect();
    order.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    // sorted by key, then index: the kept one of each run is the first
    order.dedup_by(|later, kept| later.1 == kept.1);
    order.into_iter().map(|(i, _)| i).collect()
}

/// The route and event-ID arrays of the items at `which`, in that order.
fn key_arrays<'a, T>(
    items: &'a [T],
    which: &[usize],
    key: impl Fn(&'a T) -> (&'a str, &'a str),
) -> (Vec<&'a str>, Vec<&'a str>) {
    which.iter().map(|&i| key(&items[i])).unzip()
}

/// `e` answered to each of `n` operations.
fn all_failed<O>(n: usize, e: StoreError) -> Vec<Result<O, StoreError>> {
    let e = std::sync::Arc::new(e);
    (0..n).map(|_| Err(StoreError::Batch(e.clone()))).collect()
}

/// The first item of each key, which a batch's one statement may decide
/// (repeats of a key are left undecided), and a result per item, none yet.
fn undecided<T, O>(
    items: &[T],
    key: impl Fn(&T) -> (&str, &str),
) -> (Vec<usize>, Vec<Option<Result<O, StoreError>>>) {
    let firsts = firsts_by_key(items.iter().map(key));
    (firsts, (0..items.len()).map(|_| None).collect())
}

/// Runs what the batch's statement left undecided (repeats of a key among
/// it, or every item when it was refused) one by one with `single`, and
/// answers every item.
async fn single_for_the_rest<T, O>(
    conn: &mut PgConnection,
    items: &[T],
    mut results: Vec<Option<Result<O, StoreError>>>,
    single: impl AsyncFn(&mut PgConnection, &T) -> Result<O, StoreError>,
) -> Vec<Result<O, StoreError>> {
    for (item, result) in items.iter().zip(&mut results) {
        if result.is_none() {
            *result = Some(single(conn, item).await);
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(StoreError::Unavailable("no result".into()))))
        .collect()
}

async fn read_many(
    conn: &mut PgConnection,
    keys: &[(&str, &str)],
) -> Result<HashMap<Key, Readback>, StoreError> {
    let (routes, ids): (Vec<&str>, Vec<&str>) = keys.iter().copied().unzip();
    let rows = sqlx::query(READ_MANY)
        .bind(routes)
        .bind(ids)
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|row| {
            let key = (row.try_get("route")?, row.try_get("event_id")?);
            Ok((key, readback(row)?))
        })
        .collect()
}

fn read_batch(conn: &mut PgConnection, items: Vec<Lookup>) -> BatchFuture<'_, Option<Readback>> {
    Box::pin(read_batch_on(conn, items))
}

async fn read_batch_on(
    conn: &mut PgConnection,
    items: Vec<Lookup>,
) -> Vec<Result<Option<Readback>, StoreError>> {
    let keys: Vec<(&str, &str)> = items
        .iter()
        .map(|l| (l.route.as_str(), l.event_id.as_str()))
        .collect();
    match read_many(conn, &keys).await {
        Ok(mut found) => keys
            .iter()
            .map(|(r, e)| Ok(found.remove(&(r.to_string(), e.to_string()))))
            .collect(),
        Err(e) => all_failed(items.len(), e),
    }
}

fn claim_batch(conn: &mut PgConnection, items: Vec<OwnedClaim>) -> BatchFuture<'_, ClaimOutcome> {
    Box::pin(claim_batch_on(conn, items))
}

async fn claim_batch_on(
    conn: &mut PgConnection,
    items: Vec<OwnedClaim>,
) -> Vec<Result<ClaimOutcome, StoreError>> {
    let (firsts, mut results) = undecided(&items, |c| (&c.route, &c.event_id));
    if let Err(e) = claim_many(conn, &items, &firsts, &mut results).await {
        tracing::debug!(error = %e, "batched claim refused; claiming one by one");
    }
    single_for_the_rest(conn, &items, results, async |conn, c| {
        claim_on(conn, &c.req()).await
    })
    .await
}

/// One statement for the claims at `which`; fills in what it decided.
async fn claim_many(
    conn: &mut PgConnection,
    items: &[OwnedClaim],
    which: &[usize],
    results: &mut [Option<Result<ClaimOutcome, StoreError>>],
) -> Result<(), StoreError> {
    let pick =
        |f: &dyn Fn(&OwnedClaim) -> i64| which.iter().map(|&i| f(&items[i])).collect::<Vec<_>>();
    let (routes, event_ids) = key_arrays(items, which, |c| (&c.route, &c.event_id));
    let rows = sqlx::query(CLAIM_MANY)
        .bind(routes)
        .bind(event_ids)
        .bind(
            which
                .iter()
                .map(|&i| items[i].digest.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(pick(&|c| c.now + c.lease_ms))
        .bind(pick(&|c| c.now))
        .bind(pick(&|c| c.now + c.retention_ms))
        .bind(pick(&|c| i64::from(c.hold)))
        .bind(
            which
                .iter()
                .map(|&i| items[i].instance.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(pick(&|c| c.token))
        .bind(
            which
                .iter()
                .map(|&i| items[i].trace.map(|t| t.stored()))
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await?;
    type Won = (i64, Option<String>, Option<String>);
    let mut claimed: HashMap<Key, Won> = HashMap::with_capacity(rows.len());
    for row in &rows {
        claimed.insert(
            (row.try_get("route")?, row.try_get("event_id")?),
            (
                row.try_get("attempts")?,
                row.try_get("claimed_from")?,
                row.try_get("claimed_trace")?,
            ),
        );
    }
    let mut refused = Vec::new();
    for &i in which {
        let c = &items[i];
        match claimed.remove(&(c.route.clone(), c.event_id.clone())) {
            Some((attempt, from, replaced)) => {
                results[i] = Some(Ok(sql::claimed(
                    attempt,
                    from.as_deref(),
                    replaced.as_deref(),
                    c.now + c.lease_ms,
                )));
            }
            None => refused.push(i),
        }
    }
    decide_refused(conn, items, &refused, results).await
}

/// Claims the statement refused: decided by the record as it is now; one
/// that became claimable in between is left to the single statement.
async fn decide_refused(
    conn: &mut PgConnection,
    items: &[OwnedClaim],
    refused: &[usize],
    results: &mut [Option<Result<ClaimOutcome, StoreError>>],
) -> Result<(), StoreError> {
    if refused.is_empty() {
        return Ok(());
    }
    let keys: Vec<(&str, &str)> = refused
        .iter()
        .map(|&i| (items[i].route.as_str(), items[i].event_id.as_str()))
        .collect();
    let mut found = read_many(conn, &keys).await?;
    for &i in refused {
        let c = &items[i];
        if let Some(record) = found.remove(&(c.route.clone(), c.event_id.clone())) {
            if let Found::Answer(outcome) = record.outcome(&c.digest, c.now, c.hold) {
                results[i] = Some(Ok(outcome));
            }
        }
    }
    Ok(())
}

fn deliver_batch(
    conn: &mut PgConnection,
    items: Vec<OwnedSettle>,
) -> BatchFuture<'_, SettleResult> {
    Box::pin(deliver_batch_on(conn, items))
}

async fn deliver_batch_on(
    conn: &mut PgConnection,
    items: Vec<OwnedSettle>,
) -> Vec<Result<SettleResult, StoreError>> {
    let (firsts, mut results) = undecided(&items, |s| (&s.route, &s.event_id));
    match deliver_many(conn, &items, &firsts).await {
        Ok(updated) => {
            for &i in &firsts {
                let key = (items[i].route.clone(), items[i].event_id.clone());
                results[i] = Some(Ok(if updated.contains(&key) {
                    SettleResult::Delivered
                } else {
                    SettleResult::Stale
                }));
            }
        }
        Err(e) => tracing::debug!(error = %e, "batched settle refused; settling one by one"),
    }
    single_for_the_rest(conn, &items, results, async |conn, s| {
        settle_on(conn, &s.req()).await
    })
    .await
}

/// One statement for the delivered settles at `which`; the keys it updated.
async fn deliver_many(
    conn: &mut PgConnection,
    items: &[OwnedSettle],
    which: &[usize],
) -> Result<HashSet<Key>, StoreError> {
    let mut statuses = Vec::with_capacity(which.len());
    let mut replay_statuses = Vec::with_capacity(which.len());
    let mut content_types = Vec::with_capacity(which.len());
    let mut bodies = Vec::with_capacity(which.len());
    let mut headers = Vec::with_capacity(which.len());
    for &i in which {
        let OwnedOutcome::Delivered {
            status,
            content_type,
            body,
            headers: kept,
        } = &items[i].outcome
        else {
            return Err(StoreError::Corrupt(
                "a failed settle in a delivered batch".into(),
            ));
        };
        statuses.push(i64::from(*status));
        replay_statuses.push(body.as_ref().map(|_| i64::from(*status)));
        content_types.push(content_type.as_deref().filter(|_| body.is_some()));
        bodies.push(body.as_deref());
        headers.push(kept.as_ref().map(ReplayHeaders::stored));
    }
    let (routes, event_ids) = key_arrays(items, which, |s| (&s.route, &s.event_id));
    let firsts = which.iter().all(|&i| items[i].attempt == 1);
    let query = sqlx::query(if firsts { DELIVER_FIRSTS } else { DELIVER_MANY })
        .bind(routes)
        .bind(event_ids)
        .bind(&statuses)
        .bind(which.iter().map(|&i| items[i].now).collect::<Vec<_>>())
        .bind(
            which
                .iter()
                .map(|&i| items[i].now + items[i].retention_ms)
                .collect::<Vec<_>>(),
        )
        .bind(replay_statuses)
        .bind(content_types)
        .bind(bodies);
    let query = if firsts {
        query
    } else {
        query
            .bind(which.iter().map(|&i| items[i].attempt).collect::<Vec<_>>())
            .bind(started_ats(items, which))
            .bind(instances(items, which))
    };
    let query = query.bind(headers);
    let rows = query.fetch_all(&mut *conn).await?;
    let delivered: HashSet<Key> = rows
        .iter()
        .map(|row| Ok((row.try_get("route")?, row.try_get("event_id")?)))
        .collect::<Result<_, StoreError>>()?;
    if firsts && delivered.len() < which.len() {
        let (stale, stale_statuses): (Vec<usize>, Vec<i64>) = which
            .iter()
            .zip(&statuses)
            .filter(|(&i, _)| {
                let s = &items[i];
                !delivered.contains(&(s.route.clone(), s.event_id.clone()))
            })
            .map(|(&i, &status)| (i, status))
            .unzip();
        write_stale_firsts(conn, items, &stale, stale_statuses).await?;
    }
    Ok(delivered)
}

/// [`STALE_FIRSTS`] for `which`, whose answers were `statuses`.
async fn write_stale_firsts(
    conn: &mut PgConnection,
    items: &[OwnedSettle],
    which: &[usize],
    statuses: Vec<i64>,
) -> Result<(), StoreError> {
    let (routes, event_ids) = key_arrays(items, which, |s| (&s.route, &s.event_id));
    sqlx::query(STALE_FIRSTS)
        .bind(routes)
        .bind(event_ids)
        .bind(statuses)
        .bind(which.iter().map(|&i| items[i].now).collect::<Vec<_>>())
        .bind(started_ats(items, which))
        .bind(instances(items, which))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

fn started_ats(items: &[OwnedSettle], which: &[usize]) -> Vec<i64> {
    which.iter().map(|&i| items[i].started_at).collect()
}

fn instances<'a>(items: &'a [OwnedSettle], which: &[usize]) -> Vec<&'a str> {
    which.iter().map(|&i| items[i].instance.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use super::firsts_by_key;

    #[test]
    fn keys_sorted_and_repeats_apart() {
        let keys = [("r", "b"), ("r", "a"), ("q", "z"), ("r", "b"), ("r", "a")];
        let firsts = firsts_by_key(keys.iter().copied());
        assert_eq!(firsts, vec![2, 1, 0]);
    }
}
