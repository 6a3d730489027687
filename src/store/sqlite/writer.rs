//! The group-commit writer: one OS thread owning the process's one write
//! connection. It takes every claim and settle queued while the previous
//! commit was on its way to disk and runs them in one
//! `BEGIN IMMEDIATE … COMMIT`, so one fsync serves many deliveries. No
//! operation is answered before its batch has committed: durability is that
//! of one commit per claim. A thread rather than a task because every step
//! here is a blocking SQLite call, the fsync included.

use std::path::PathBuf;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::direct::{self, Role};
use crate::claim::SettleResult;
use crate::store::owned::{OwnedClaim, OwnedSettle};
use crate::store::{ClaimOutcome, ClaimRequest, SettleRequest, StoreError};

/// Most operations committed together.
const MAX_BATCH: usize = 256;

/// A claim or settle waiting for the writer, with where to send its result.
enum Op {
    Claim(
        OwnedClaim,
        oneshot::Sender<Result<ClaimOutcome, StoreError>>,
    ),
    Settle(
        OwnedSettle,
        oneshot::Sender<Result<SettleResult, StoreError>>,
    ),
    /// Close the connection and stop (the store is closing).
    Close(oneshot::Sender<()>),
}

/// The async side of the writer thread.
pub(super) struct Writer {
    queue: mpsc::Sender<Op>,
}

impl Writer {
    /// Starts the thread; it connects on its first batch and again after a
    /// failed one, and stops when the store (every sender) is gone.
    pub(super) fn start(path: PathBuf) -> Result<Self, StoreError> {
        let (queue, ops) = mpsc::channel(4 * MAX_BATCH);
        std::thread::Builder::new()
            .name("idemgate-sqlite-writer".into())
            .spawn(move || run(path, ops))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the SQLite writer: {e}")))?;
        Ok(Writer { queue })
    }

    pub(super) async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.queue
            .send(Op::Claim(OwnedClaim::new(req), tx))
            .await
            .map_err(|_| writer_gone())?;
        rx.await.map_err(|_| writer_gone())?
    }

    pub(super) async fn settle(&self, req: &SettleRequest<'_>) -> Result<SettleResult, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.queue
            .send(Op::Settle(OwnedSettle::new(req), tx))
            .await
            .map_err(|_| writer_gone())?;
        rx.await.map_err(|_| writer_gone())?
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

fn run(path: PathBuf, mut ops: mpsc::Receiver<Op>) {
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
        // a close request ends the batch: what came before it commits first
        let close = batch
            .iter()
            .position(|op| matches!(op, Op::Close(_)))
            .map(|at| batch.split_off(at));
        if !batch.is_empty() {
            if conn.is_none() {
                match direct::open(&path, Role::Writer) {
                    Ok(c) => conn = Some(c),
                    Err(e) => fail_all(&mut batch, &e.to_string()),
                }
            }
            if let Some(c) = conn.as_ref() {
                if let Err(e) = commit_batch(c, &mut batch) {
                    tracing::warn!(error = %e, "SQLite batch failed; reconnecting");
                    conn = None; // a fresh connection for the next batch
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
                    other => fail_all(&mut vec![other], "the SQLite store is closing"),
                }
            }
            ops.close();
            let mut late = Vec::new();
            while let Ok(op) = ops.try_recv() {
                late.push(op);
            }
            fail_all(&mut late, "the SQLite store is closing");
            return;
        }
    }
}

fn commit_batch(conn: &Connection, batch: &mut Vec<Op>) -> Result<(), StoreError> {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let e = StoreError::from(e);
        fail_all(batch, &e.to_string());
        return Err(e);
    }
    let mut claims = Vec::new();
    let mut settles = Vec::new();
    for op in batch.iter() {
        match op {
            Op::Claim(c, _) => claims.push(direct::claim_in(conn, &c.req())),
            Op::Settle(s, _) => settles.push(direct::settle_in(conn, &s.req())),
            Op::Close(_) => unreachable!("close requests are split off the batch"),
        }
    }
    // Some errors (disk full, I/O) roll the whole transaction back; then
    // nothing of the batch is on disk, whatever the statements said.
    let committed = if conn.is_autocommit() {
        Err(StoreError::Unavailable(
            "the batch transaction was rolled back".into(),
        ))
    } else {
        conn.execute_batch("COMMIT").map_err(StoreError::from)
    };
    if let Err(e) = committed {
        let _ = conn.execute_batch("ROLLBACK");
        fail_all(batch, &e.to_string());
        return Err(e);
    }
    let (mut claims, mut settles) = (claims.into_iter(), settles.into_iter());
    for op in batch.drain(..) {
        match op {
            Op::Claim(_, reply) => {
                let _ = reply.send(claims.next().expect("one result per claim"));
            }
            Op::Settle(_, reply) => {
                let _ = reply.send(settles.next().expect("one result per settle"));
            }
            Op::Close(_) => {}
        }
    }
    Ok(())
}

fn fail_all(batch: &mut Vec<Op>, why: &str) {
    for op in batch.drain(..) {
        let e = || StoreError::Unavailable(why.to_string());
        match op {
            Op::Claim(_, reply) => {
                let _ = reply.send(Err(e()));
            }
            Op::Settle(_, reply) => {
                let _ = reply.send(Err(e()));
            }
            Op::Close(done) => {
                let _ = done.send(());
            }
        }
    }
}
