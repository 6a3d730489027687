//! The hand-off of one claim or settle between its requester and the batch
//! that runs it (the SQLite writer thread, a PostgreSQL dispatcher).
//!
//! SPEC §6: an operation whose requester gave up is not applied later
//! behind its back, and an operation is reported as failed only if it did
//! not commit. Both follow from one rule, decided by a compare-and-set on a
//! shared cell:
//! - while the operation waits in the queue, the requester may *withdraw*
//!   it (its time ran out, or it stopped waiting): the batch then skips it;
//! - once a batch has *taken* it (its statement is about to run), the
//!   requester can no longer withdraw it and waits for the batch's answer,
//!   which the batch gives within its own bound.
//!
//! A batch that takes an operation and then cannot learn whether its
//! transaction committed (the connection died between the commit and the
//! answer, or went silent past the batch's bound) answers with an error
//! that says so: such a claim may hold its event until the lease ends.

use std::sync::atomic::{AtomicU8, Ordering::AcqRel, Ordering::Acquire};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::StoreError;

/// The longest a requester waits for a batch that took its operation.
const TAKEN_BACKSTOP: Duration = Duration::from_secs(60);

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

/// The batch's side: carried with the queued operation.
#[derive(Debug)]
pub(crate) struct Ticket(Arc<AtomicU8>);

impl Ticket {
    /// The operation is about to run: `false` if its requester withdrew it
    /// (then skip it and send nothing). Call it only once the operation can
    /// run without further waiting (the transaction begun, the connection in
    /// hand), so that a requester is held only by the statement itself.
    pub(crate) fn take(&self) -> bool {
        match self.0.compare_exchange(QUEUED, TAKEN, AcqRel, Acquire) {
            Ok(_) => true,
            Err(state) => state == TAKEN,
        }
    }

    /// Whether the requester withdrew the operation (for dropping it from a
    /// batch early, before `take`).
    pub(crate) fn withdrawn(&self) -> bool {
        self.0.load(Acquire) == WITHDRAWN
    }
}

/// The requester's side.
#[derive(Debug)]
struct Claim(Arc<AtomicU8>);

impl Claim {
    /// Withdraws the operation unless a batch took it; says whether it did.
    fn withdraw(&self) -> bool {
        match self.0.compare_exchange(QUEUED, WITHDRAWN, AcqRel, Acquire) {
            Ok(_) => true,
            Err(state) => state == WITHDRAWN,
        }
    }
}

/// A new hand-off: the ticket goes into the queue with the operation, the
/// waiter stays with the requester.
pub(crate) fn new<O>() -> (Ticket, oneshot::Sender<Result<O, StoreError>>, Waiter<O>) {
    let cell = Arc::new(AtomicU8::new(QUEUED));
    let (tx, rx) = oneshot::channel();
    (
        Ticket(cell.clone()),
        tx,
        Waiter {
            claim: Claim(cell),
            rx,
        },
    )
}

/// Waits for the answer of a queued operation. Dropped before the answer
/// came (the caller stopped waiting), it withdraws the operation if no batch
/// has taken it yet.
pub(crate) struct Waiter<O> {
    claim: Claim,
    rx: oneshot::Receiver<Result<O, StoreError>>,
}

impl<O> Waiter<O> {
    /// The batch's answer; or, if no batch took the operation within
    /// `limit`, withdraws it and fails. Once taken it waits for the batch,
    /// whose own bound ends the wait.
    pub(crate) async fn answer(mut self, limit: Duration) -> Result<O, StoreError> {
        let gone = || StoreError::Unavailable("the store's writer stopped".into());
        match tokio::time::timeout(limit, &mut self.rx).await {
            Ok(res) => return res.map_err(|_| gone())?,
            Err(_) if self.claim.withdraw() => {
                return Err(StoreError::Unavailable(format!(
                    "not run: the store took no answer within {}",
                    humantime::format_duration(limit)
                )))
            }
            Err(_) => {}
        }
        // Taken: the batch's own bound ends this (PostgreSQL's silence
        // check and 30 s limit, SQLite's busy timeout); this one only
        // catches a batch stuck in a call that never returns (a hung disk).
        match tokio::time::timeout(TAKEN_BACKSTOP, &mut self.rx).await {
            Ok(res) => res.map_err(|_| gone())?,
            Err(_) => Err(StoreError::OutcomeUnknown(format!(
                "the store took the operation but gave no answer within {}; \
                 whether it committed is unknown",
                humantime::format_duration(TAKEN_BACKSTOP)
            ))),
        }
    }
}

impl<O> Drop for Waiter<O> {
    fn drop(&mut self) {
        self.claim.withdraw();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_answer_in_time_is_passed_on() {
        let (ticket, tx, waiter) = new::<u32>();
        assert!(ticket.take());
        tx.send(Ok(7)).unwrap();
        assert_eq!(waiter.answer(Duration::from_secs(1)).await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_queued_operation_is_withdrawn_when_its_time_runs_out() {
        let (ticket, _tx, waiter) = new::<u32>();
        let e = waiter.answer(Duration::from_millis(20)).await.unwrap_err();
        assert!(e.to_string().contains("not run"), "{e}");
        assert!(ticket.withdrawn());
        assert!(!ticket.take(), "a withdrawn operation is never taken");
    }

    #[tokio::test]
    async fn a_taken_operation_is_waited_for_past_the_limit() {
        let (ticket, tx, waiter) = new::<u32>();
        assert!(ticket.take());
        let batch = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            tx.send(Ok(9)).unwrap();
        });
        let got = waiter.answer(Duration::from_millis(10)).await;
        assert_eq!(got.unwrap(), 9, "the committed result, not a timeout");
        batch.await.unwrap();
    }

    #[tokio::test]
    async fn a_dropped_waiter_withdraws_unless_taken() {
        let (ticket, _tx, waiter) = new::<u32>();
        drop(waiter);
        assert!(!ticket.take());

        let (ticket, _tx, waiter) = new::<u32>();
        assert!(ticket.take());
        drop(waiter);
        assert!(!ticket.withdrawn(), "taken stays taken");
        assert!(ticket.take(), "taking twice is harmless");
    }

    #[tokio::test]
    async fn a_batch_that_stops_without_answering_is_an_error() {
        let (ticket, tx, waiter) = new::<u32>();
        assert!(ticket.take());
        drop(tx);
        assert!(waiter.answer(Duration::from_secs(1)).await.is_err());
    }
}
