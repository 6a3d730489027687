//! Which of the store's write connections (its lanes) a write takes, and
//! when a lane's durability wait goes: the bookkeeping of `durable`, with
//! no I/O, so that it can be tested alone.
//!
//! A lane goes through these phases, so that a wait never has a write of
//! its own connection right behind or right in front of it, and so that
//! the writes that come together go out together:
//! - **open**: nothing in flight on it; a write takes it and holds it from
//!   before its request is sent until its reply came (then it *joins* the
//!   lane's next wait) or it needs no wait (it *leaves*);
//! - **writing**: that write, or the writes handed over together (below),
//!   in flight; no new write takes it;
//! - once a writer joined, the lane is **closing**, and when the last
//!   write in flight on it has answered, its round of waits starts with
//!   every writer that joined (group commit);
//! - **waiting**: the round is in flight; no write takes it (a write sent
//!   behind a blocked `WAITAOF` would queue on the server and reach it
//!   together with the next wait: the 1 s case of `durable`).
//!
//! When the round is done the lane is open again. A write that finds no
//! lane open queues, and the next lane that opens takes every write
//! queued meanwhile: `durable` sends them in one pipeline, and they share
//! that lane's next round.

use std::collections::VecDeque;

/// One lane's phase.
#[derive(Debug)]
struct Lane<W> {
    /// Writes that hold the lane (sent, or about to be; reply not yet in).
    writing: usize,
    /// Writers whose reply came, for the next round.
    joined: Vec<W>,
    /// A round of waits is in flight.
    waiting: bool,
}

impl<W> Lane<W> {
    /// Open: nothing in flight on it (no write, no round), so a write
    /// taken now goes out alone, and writes that come meanwhile queue and
    /// go out together when it opens again.
    fn open(&self) -> bool {
        !self.waiting && self.joined.is_empty() && self.writing == 0
    }
}

/// What a lane does once a write on it answered or ended.
#[derive(Debug, PartialEq)]
pub(super) enum Next<W, Q> {
    /// Nothing yet: a write is still in flight on it, or its round.
    Nothing,
    /// Its round of waits, with these writers.
    Round(Vec<W>),
    /// It opened without a round: these queued writes take it.
    Hand(Vec<Q>),
}

/// The lanes' phases and the writes queued for one; `W` is a writer that
/// joined, `Q` a writer that queued.
#[derive(Debug)]
pub(super) struct Lanes<W, Q> {
    lanes: Vec<Lane<W>>,
    queued: VecDeque<Q>,
}

impl<W, Q> Lanes<W, Q> {
    /// `count` lanes, all open (at least one).
    pub(super) fn new(count: usize) -> Self {
        Lanes {
            lanes: (0..count.max(1))
                .map(|_| Lane {
                    writing: 0,
                    joined: Vec::new(),
                    waiting: false,
                })
                .collect(),
            queued: VecDeque::new(),
        }
    }

    /// A lane for a write: the first open lane, held; else `queue` is
    /// queued for the next lane that opens.
    pub(super) fn take(&mut self, queue: impl FnOnce() -> Q) -> Option<usize> {
        let lane = self
            .lanes
            .iter()
            .enumerate()
            .find(|(_, l)| l.open())
            .map(|(i, _)| i);
        match lane {
            Some(i) => {
                self.lanes[i].writing += 1;
                Some(i)
            }
            None => {
                self.queued.push_back(queue());
                None
            }
        }
    }

    /// The write on `lane` answered and wants the next wait: the round to
    /// start now, if this was the last write in flight on it.
    pub(super) fn join(&mut self, lane: usize, writer: W) -> Next<W, Q> {
        let l = &mut self.lanes[lane];
        l.writing = l.writing.saturating_sub(1);
        l.joined.push(writer);
        self.next(lane)
    }

    /// The write on `lane` ended without wanting a wait (nothing written,
    /// or it failed): the round to start now, if writers joined and this
    /// was the last write in flight; the writes queued meanwhile, if none
    /// joined (the lane opened without a round).
    pub(super) fn leave(&mut self, lane: usize) -> Next<W, Q> {
        let l = &mut self.lanes[lane];
        l.writing = l.writing.saturating_sub(1);
        self.next(lane)
    }

    fn next(&mut self, lane: usize) -> Next<W, Q> {
        let l = &mut self.lanes[lane];
        if l.writing > 0 || l.waiting {
            Next::Nothing
        } else if !l.joined.is_empty() {
            l.waiting = true;
            Next::Round(std::mem::take(&mut l.joined))
        } else if self.queued.is_empty() {
            Next::Nothing
        } else {
            Next::Hand(self.take_queue(lane))
        }
    }

    /// `lane`'s round is done: it is open again, and takes every queued
    /// writer (each now holds it; the caller hands it to them).
    pub(super) fn done(&mut self, lane: usize) -> Vec<Q> {
        self.lanes[lane].waiting = false;
        self.take_queue(lane)
    }

    fn take_queue(&mut self, lane: usize) -> Vec<Q> {
        let queued: Vec<Q> = self.queued.drain(..).collect();
        self.lanes[lane].writing += queued.len();
        queued
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Next::{Hand, Nothing, Round};

    type L = Lanes<&'static str, u32>;

    #[test]
    fn a_write_takes_an_idle_lane_and_queues_when_none_is() {
        let mut l = L::new(3);
        let got: Vec<_> = (0..3).map(|_| l.take(|| 0).unwrap()).collect();
        assert_eq!(got, [0, 1, 2]);
        // each lane has a write in flight: the next ones queue
        assert_eq!(l.take(|| 7), None);
        assert_eq!(l.take(|| 8), None);
        // lane 1's write needed no wait: it opens and takes both queued
        // writes together, and no other
        assert_eq!(l.leave(1), Hand(vec![7, 8]));
        assert_eq!(l.take(|| 9), None);
    }

    #[test]
    fn a_lane_waits_for_its_last_write_then_closes_until_its_round_is_done() {
        let mut l = L::new(2);
        assert_eq!(l.take(|| 0), Some(0));
        assert_eq!(l.take(|| 0), Some(1));
        assert_eq!(l.take(|| 5), None);
        // lane 0's round ends: it takes the queued write
        assert_eq!(l.join(0, "a"), Round(vec!["a"]));
        assert_eq!(l.done(0), vec![5]);
        // the handed write and lane 1's both answer
        assert_eq!(l.join(1, "b"), Round(vec!["b"]));
        assert_eq!(l.join(0, "c"), Round(vec!["c"]));
        // while both wait, a write queues; the first round done takes it
        assert_eq!(l.take(|| 6), None);
        assert_eq!(l.done(1), vec![6]);
        assert!(l.done(0).is_empty());
        assert_eq!(l.take(|| 0), Some(0));
    }

    #[test]
    fn writes_handed_over_together_share_one_round() {
        let mut l = L::new(1);
        assert_eq!(l.take(|| 0), Some(0));
        assert_eq!(l.take(|| 1), None);
        assert_eq!(l.take(|| 2), None);
        assert_eq!(l.join(0, "a"), Round(vec!["a"]));
        assert_eq!(l.done(0), vec![1, 2]);
        // the first of the two answered: the round waits for the second
        assert_eq!(l.join(0, "x"), Nothing);
        assert_eq!(l.take(|| 3), None);
        assert_eq!(l.join(0, "y"), Round(vec!["x", "y"]));
        assert_eq!(l.done(0), vec![3]);
    }

    #[test]
    fn a_write_that_leaves_lets_the_round_start() {
        let mut l = L::new(1);
        assert_eq!(l.take(|| 0), Some(0));
        assert_eq!(l.take(|| 1), None);
        // a lane nobody joined starts no round; it opens to the queued
        assert_eq!(l.leave(0), Hand(vec![1]));
        assert_eq!(l.join(0, "a"), Round(vec!["a"]));
        assert!(l.done(0).is_empty());
        assert_eq!(l.take(|| 0), Some(0));
        assert_eq!(l.leave(0), Nothing);
    }

    #[test]
    fn no_write_takes_a_lane_that_has_a_writer_waiting_for_its_round() {
        let mut l = L::new(1);
        assert_eq!(l.take(|| 0), Some(0));
        assert_eq!(l.take(|| 1), None);
        assert_eq!(l.take(|| 2), None);
        assert_eq!(l.join(0, "a"), Round(vec!["a"]));
        assert_eq!(l.done(0), vec![1, 2]);
        assert_eq!(l.join(0, "b"), Nothing);
        // b waits for the round; the lane is closing: nothing takes it
        assert_eq!(l.take(|| 3), None);
        assert_eq!(l.leave(0), Round(vec!["b"]));
        assert_eq!(l.done(0), vec![3]);
    }
}
