//! The group-commit writer: one OS thread owning the process's one write
//! connection. It takes every claim and settle queued while the previous
//! commit was on its way to disk and runs them in one
//! `BEGIN IMMEDIATE … COMMIT`, so one fsync serves many deliveries. No
//! operation is answered before its batch has committed: durability is that
//! of one commit per claim. A thread rather than a task because every step
//! here is a blocking SQLite call, the fsync included.
//!
//! An operation whose requester withdrew it (see `ticket`) is skipped; one
//! taken is answered with what its batch did. A statement error that rolls
//! the whole transaction back (disk full, I/O) ends the batch there: what
//! follows it is not run in autocommit, and nothing of it is reported done.
//! The last batch's failure is kept for `/readyz` (see [`Writer::probe`]).
//!
//! A slice of the sweep rides in a batch too, so that its deletions share
//! the claims' commit instead of taking one of their own; the batch is then
//! counted as a change of records in the change counter (see `changes`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::changes::{ChangeCounter, ChangeUnderWay};
use super::direct::{self, Role};
use crate::claim::{Millis, SettleResult};
use crate::store::owned::{OwnedClaim, OwnedSettle};
use crate::store::ticket::{self, Ticket};
use crate::store::{ClaimOutcome, ClaimRequest, SettleRequest, StoreError};

/// Most operations committed together.
const MAX_BATCH: usize = 256;

/// A claim or settle waiting for the writer, with where to send its result.
enum Op {
    Claim(
        OwnedClaim,
        Ticket,
        oneshot::Sender<Result<ClaimOutcome, StoreError>>,
    ),
    Settle(
        OwnedSettle,
        Ticket,
        oneshot::Sender<Result<SettleResult, StoreError>>,
    ),
    /// A write that changes nothing (`/readyz` after a failed batch): one
    /// frame through the WAL and its fsync, as a claim's commit needs.
    Probe(oneshot::Sender<Result<(), StoreError>>),
    /// A slice of the sweep: `None` when another change holds the change
    /// counter (the slice did not run; see [`Writer::sweep`]).
    Sweep(SweepSlice, oneshot::Sender<Result<Option<u64>, StoreError>>),
    /// Close the connection and stop (the store is closing).
    Close(oneshot::Sender<()>),
}

/// At most `limit` records expired at `now` to delete, counted in `changes`.
pub(super) struct SweepSlice {
    pub(super) changes: Arc<ChangeCounter>,
    pub(super) now: Millis,
    pub(super) limit: i64,
}

/// The async side of the writer thread.
pub(super) struct Writer {
    queue: mpsc::Sender<Op>,
    /// How the last batch of claims or settles went.
    health: Arc<Mutex<Health>>,
    /// The database file, for its file system's free space.
    path: PathBuf,
}

/// Free space a full disk must have again before `/readyz` says ready
/// (with no batch committed since it failed): room for a few batches.
const READY_ROOM: u64 = 4 << 20;

/// How the writer's last batch of claims or settles went.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Health {
    /// None has run yet: nobody knows that writes can commit.
    Unknown,
    Ok,
    Failed(String),
}

impl Health {
    fn set_ok_if_unknown(&mut self) {
        if *self == Health::Unknown {
            *self = Health::Ok;
        }
    }
}

/// Bytes available to this process on the file system holding `path`.
fn free_bytes(path: &std::path::Path) -> Result<u64, StoreError> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    crate::sys::free_bytes(dir)
        .map_err(|e| StoreError::io(format_args!("statvfs {}", dir.display()), e))
}

impl Writer {
    /// Starts the thread; it connects on its first batch and again after a
    /// failed one, and stops when the store (every sender) is gone.
    pub(super) fn start(path: PathBuf) -> Result<Self, StoreError> {
        let (queue, ops) = mpsc::channel(4 * MAX_BATCH);
        // Until a first batch commits, nobody knows that writes can: the
        // first `/readyz` probes (a process started on a full disk is not
        // ready).
        let health = Arc::new(Mutex::new(Health::Unknown));
        let record = Record(health.clone());
        let thread_path = path.clone();
        std::thread::Builder::new()
            .name("idemgate-sqlite-writer".into())
            .spawn(move || run(thread_path, ops, record))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the SQLite writer: {e}")))?;
        Ok(Writer {
            queue,
            health,
            path,
        })
    }

    /// The claim, withdrawn if no batch takes it within `limit`.
    pub(super) async fn claim(
        &self,
        req: &ClaimRequest<'_>,
        limit: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        let claim = OwnedClaim::new(req);
        self.ask(|ticket, tx| Op::Claim(claim, ticket, tx), limit)
            .await
    }

    /// The settle, withdrawn if no batch takes it within `limit`.
    pub(super) async fn settle(
        &self,
        req: &SettleRequest<'_>,
        limit: Duration,
    ) -> Result<SettleResult, StoreError> {
        let settle = OwnedSettle::new(req);
        self.ask(|ticket, tx| Op::Settle(settle, ticket, tx), limit)
            .await
    }

    /// Deletes the slice inside the next batch's transaction: it never
    /// waits for the write lock, and costs the claims beside it no commit of
    /// its own. The batch is counted as a change from before it begins to
    /// after it commits; `None` when another change (a release) holds the
    /// counter, which the writer must not wait for. Once queued it runs to
    /// its end even if the caller stops waiting.
    pub(super) async fn sweep(
        &self,
        slice: SweepSlice,
        limit: Duration,
    ) -> Result<Option<u64>, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.send(Op::Sweep(slice, tx), limit).await?;
        rx.await.map_err(|_| writer_gone())?
    }

    /// Queues the operation `op` makes and waits for its batch's answer.
    async fn ask<O>(
        &self,
        op: impl FnOnce(Ticket, oneshot::Sender<Result<O, StoreError>>) -> Op,
        limit: Duration,
    ) -> Result<O, StoreError> {
        let (ticket, tx, waiter) = ticket::new();
        self.send(op(ticket, tx), limit).await?;
        waiter.answer(limit).await
    }

    async fn send(&self, op: Op, limit: Duration) -> Result<(), StoreError> {
        match tokio::time::timeout(limit, self.queue.send(op)).await {
            Ok(sent) => sent.map_err(|_| writer_gone()),
            Err(_) => Err(StoreError::Unavailable(format!(
                "not run: the SQLite writer's queue stayed full for {}",
                humantime::format_duration(limit)
            ))),
        }
    }

    /// `/readyz`'s part: `Ok` unless the last batch failed, or none has run
    /// yet. Then a write that changes nothing is tried (so that readiness
    /// comes back by itself, with no claim needed, once writes can commit).
    /// After a failed batch that is not enough: a one-page write may fit in
    /// the room a full disk has left in the WAL while a batch does not, so
    /// the file system must also have [`READY_ROOM`] free — until a batch of
    /// claims or settles commits again.
    pub(super) async fn probe(&self, limit: Duration) -> Result<(), StoreError> {
        let health = self
            .health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if health == Health::Ok {
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        self.send(Op::Probe(tx), limit).await?;
        match tokio::time::timeout(limit, rx).await {
            Ok(res) => res.map_err(|_| writer_gone())??,
            Err(_) => {
                return Err(StoreError::Unavailable(format!(
                    "the SQLite writer did not answer within {}",
                    humantime::format_duration(limit)
                )))
            }
        }
        match health {
            Health::Failed(why) => {
                let free = free_bytes(&self.path)?;
                if free < READY_ROOM {
                    return Err(StoreError::Unavailable(format!(
                        "the last write failed ({why}); {} has {free} bytes free",
                        self.path.display()
                    )));
                }
                Ok(())
            }
            _ => {
                // nothing had been written yet, and now a write committed
                self.health
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .set_ok_if_unknown();
                Ok(())
            }
        }
    }

    /// Waits for the queued operations to commit, then closes the connection.
    pub(super) async fn close(&self) {
        let (tx, rx) = oneshot::channel();
        if self.queue.send(Op::Close(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

fn writer_gone() -> StoreError {
    StoreError::Unavailable("the SQLite writer stopped".into())
}

/// The writer thread's record of its last batch.
struct Record(Arc<Mutex<Health>>);

impl Record {
    fn set(&self, failed: Option<String>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = match failed {
            None => Health::Ok,
            Some(why) => Health::Failed(why),
        };
    }
}

fn run(path: PathBuf, mut ops: mpsc::Receiver<Op>, health: Record) {
    let mut conn: Option<Connection> = None;
    let mut batch: Vec<Op> = Vec::with_capacity(MAX_BATCH);
    while let Some(op) = ops.blocking_recv() {
        batch.push(op);
        while batch.len() < MAX_BATCH {
            match ops.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        // a close request ends the batch; what follows it fails with it
        let close = batch
            .iter()
            .position(|op| matches!(op, Op::Close(_)))
            .map(|at| batch.split_off(at));
        if !batch.is_empty() {
            if let Err(e) = connect(&mut conn, &path) {
                health.set(Some(e.to_string()));
                fail_all(&mut batch, e);
            }
            if let Some(c) = conn.as_ref() {
                match commit_batch(c, &mut batch) {
                    Ok(true) => health.set(None),
                    Ok(false) => {} // nothing but probes: says nothing of batches
                    Err(e) => {
                        tracing::warn!(error = %e, "SQLite batch failed; reconnecting");
                        health.set(Some(e.to_string()));
                        conn = None; // a fresh connection for the next batch
                    }
                }
            }
        }
        if let Some(rest) = close {
            drop(conn.take());
            for op in rest {
                match op {
                    Op::Close(done) => {
                        let _ = done.send(());
                    }
                    other => {
                        fail_all(&mut vec![other], closing());
                    }
                }
            }
            ops.close();
            let mut late = Vec::new();
            while let Ok(op) = ops.try_recv() {
                late.push(op);
            }
            fail_all(&mut late, closing());
            return;
        }
    }
}

/// The writer's connection, opened if it is not.
fn connect<'c>(
    conn: &'c mut Option<Connection>,
    path: &Path,
) -> Result<&'c Connection, StoreError> {
    if conn.is_none() {
        *conn = Some(direct::open(path, Role::Writer)?);
    }
    Ok(conn.as_ref().expect("opened above"))
}

/// What one operation of a batch did inside the transaction.
enum Done {
    Claim(Result<ClaimOutcome, StoreError>),
    Settle(Result<SettleResult, StoreError>),
    Probe(Result<(), StoreError>),
    Sweep(Result<u64, StoreError>),
    /// Withdrawn by its requester before the batch took it: not run.
    Skipped,
}

impl Done {
    /// The statement's error, if it failed.
    fn error(&self) -> Option<&StoreError> {
        match self {
            Done::Claim(Err(e))
            | Done::Settle(Err(e))
            | Done::Probe(Err(e))
            | Done::Sweep(Err(e)) => Some(e),
            _ => None,
        }
    }
}

/// Runs and commits the batch; `Ok(false)` when no claim or settle of it
/// ran (all withdrawn, or only probes).
fn commit_batch(conn: &Connection, batch: &mut Vec<Op>) -> Result<bool, StoreError> {
    // Withdrawn while the batch filled: not worth the transaction.
    batch.retain(|op| match op {
        Op::Claim(_, t, _) | Op::Settle(_, t, _) => !t.withdrawn(),
        Op::Probe(_) | Op::Close(_) | Op::Sweep(..) => true,
    });
    // every slice carries the store's one counter: the first one's serves
    let counter = batch.iter().find_map(|op| match op {
        Op::Sweep(slice, _) => Some(slice.changes.clone()),
        _ => None,
    });
    let under_way = counter.as_deref().and_then(|c| begin_sweeps(c, batch));
    if batch.is_empty() {
        return Ok(false);
    }
    let mut ran = false;
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        return Err(fail_all(batch, e.into()));
    }
    let mut done = Vec::with_capacity(batch.len());
    for op in batch.iter() {
        // Taken only now, with the transaction begun: a requester whose time
        // ran out while this batch waited for the lock has withdrawn.
        let result = match op {
            Op::Claim(_, t, _) | Op::Settle(_, t, _) if !t.take() => Done::Skipped,
            Op::Claim(c, _, _) => {
                ran = true;
                Done::Claim(direct::claim_in(conn, &c.req()))
            }
            Op::Settle(s, _, _) => {
                ran = true;
                Done::Settle(direct::settle_in(conn, &s.req()))
            }
            Op::Probe(_) => Done::Probe(rewrite_user_version(conn)),
            Op::Sweep(slice, _) => Done::Sweep(direct::sweep(conn, slice.now, slice.limit)),
            Op::Close(_) => unreachable!("close requests are split off the batch"),
        };
        let failed = result.error().is_some();
        done.push(result);
        // Some errors (disk full, I/O) roll the whole transaction back.
        // Then nothing of the batch is on disk, whatever the statements
        // said, and the rest must not run: each would commit on its own
        // (autocommit) while reported failed with the batch.
        if failed && conn.is_autocommit() {
            let e = StoreError::Unavailable(format!(
                "the batch transaction was rolled back: {}",
                first_error(&done)
            ));
            return Err(fail_all(batch, e));
        }
    }
    if let Err(e) = conn.execute_batch("COMMIT") {
        let _ = conn.execute_batch("ROLLBACK");
        return Err(fail_all(batch, e.into()));
    }
    // committed: the change has ended before anyone hears of it
    drop(under_way);
    answer_all(batch, done);
    Ok(ran)
}

/// The batch's sweep slices change records that caches may hold: counted
/// from before the transaction begins to after it commits, so that no cache
/// fills from a read that could miss the deletions. `None` when another
/// change holds the counter (the writer does not wait for it): the slices
/// are then answered and taken out of the batch.
fn begin_sweeps<'c>(counter: &'c ChangeCounter, batch: &mut Vec<Op>) -> Option<ChangeUnderWay<'c>> {
    match counter.try_begin() {
        Ok(Some(change)) => Some(change),
        Ok(None) => {
            answer_sweeps(batch, || Ok(None));
            None
        }
        Err(e) => {
            let why = Arc::new(direct::lock_failed(counter, e));
            answer_sweeps(batch, || Err(StoreError::Batch(why.clone())));
            None
        }
    }
}

/// Answers each operation of a committed batch with what it did.
fn answer_all(batch: &mut Vec<Op>, done: Vec<Done>) {
    for (op, result) in batch.drain(..).zip(done) {
        match (op, result) {
            (Op::Claim(_, _, reply), Done::Claim(r)) => {
                let _ = reply.send(r);
            }
            (Op::Settle(_, _, reply), Done::Settle(r)) => {
                let _ = reply.send(r);
            }
            (Op::Probe(reply), Done::Probe(r)) => {
                let _ = reply.send(r);
            }
            (Op::Sweep(_, reply), Done::Sweep(r)) => {
                let _ = reply.send(r.map(Some));
            }
            _ => {} // skipped: nobody waits
        }
    }
}

/// Writes the header page with what it holds: the write a probe commits.
fn rewrite_user_version(conn: &Connection) -> Result<(), StoreError> {
    let v: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    conn.execute_batch(&format!("PRAGMA user_version = {v}"))?;
    Ok(())
}

fn first_error(done: &[Done]) -> String {
    done.iter()
        .find_map(Done::error)
        .map(ToString::to_string)
        .unwrap_or_default()
}

fn closing() -> StoreError {
    StoreError::Unavailable("the SQLite store is closing".into())
}

/// Answers every operation of the batch with `why` (each its own error
/// sharing the one cause), and gives that back.
fn fail_all(batch: &mut Vec<Op>, why: StoreError) -> StoreError {
    let why = Arc::new(why);
    let e = || StoreError::Batch(why.clone());
    for op in batch.drain(..) {
        match op {
            Op::Claim(_, _, reply) => {
                let _ = reply.send(Err(e()));
            }
            Op::Settle(_, _, reply) => {
                let _ = reply.send(Err(e()));
            }
            Op::Probe(reply) => {
                let _ = reply.send(Err(e()));
            }
            Op::Close(done) => {
                let _ = done.send(());
            }
            Op::Sweep(_, reply) => {
                let _ = reply.send(Err(e()));
            }
        }
    }
    e()
}

/// Answers and takes out of the batch its sweep slices, which do not run.
fn answer_sweeps(batch: &mut Vec<Op>, answer: impl Fn() -> Result<Option<u64>, StoreError>) {
    for op in std::mem::take(batch) {
        match op {
            Op::Sweep(_, reply) => {
                let _ = reply.send(answer());
            }
            other => batch.push(other),
        }
    }
}
