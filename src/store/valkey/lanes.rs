//! Which of the store's write connections (its lanes) a write takes, and
//! when a lane's durability wait goes: the bookkeeping of `durable`, with
//! no I/O, so that it can be tested alone.
//!
//! A lane alternates between two phases, so that a wait never has a write
//! of its own connection right behind or right in front of it:
//! - **open**: writes may take it; each holds it from before its request
//!   is sent until its reply came (then it *joins* the lane's next wait)
//!   or it needs no wait (it *leaves*);
//! - once a writer joined, the lane is **closing**: no new write takes
//!   it, and when the last write in flight on it has answered, its round
//!   of waits starts with every writer that joined (group commit);
//! - **waiting**: the round is in flight; no write takes it (a write sent
//!   behind a blocked `WAITAOF` would queue on the server and reach it
//!   together with the next wait: the 1 s case of `durable`).
//!
//! When the round is done the lane is open again. A write that finds no
//! lane open queues, and the next lane that opens takes every write
//! queued meanwhile: they are written together and share that lane's next
//! round.

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
    fn open(&self) -> bool {
        !self.waiting && self.joined.is_empty()
    }
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

    /// A lane for a write: the open lane with the fewest writes on it
    /// (the first of them), held; else `queue` is queued for the next lane
    /// that opens.
    pub(super) fn take(&mut self, queue: impl FnOnce() -> Q) -> Option<usize> {
        let lane = self
            .lanes
            .iter()
            .enumerate()
            .filter(|(_, l)| l.open())
            .min_by_key(|(i, l)| (l.writing, *i))
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
    pub(super) fn join(&mut self, lane: usize, writer: W) -> Option<Vec<W>> {
        let l = &mut self.lanes[lane];
        l.writing = l.writing.saturating_sub(1);
        l.joined.push(writer);
        Self::start(l)
    }

    /// The write on `lane` ended without wanting a wait (nothing written,
    /// or it failed): the round to start now, if writers joined and this
    /// was the last write in flight.
    pub(super) fn leave(&mut self, lane: usize) -> Option<Vec<W>> {
        let l = &mut self.lanes[lane];
        l.writing = l.writing.saturating_sub(1);
        Self::start(l)
    }

    fn start(l: &mut Lane<W>) -> Option<Vec<W>> {
        if l.writing == 0 && !l.waiting && !l.joined.is_empty() {
            l.waiting = true;
            Some(std::mem::take(&mut l.joined))
        } else {
            None
        }
    }

    /// `lane`'s round is done: it is open again, and takes every queued
    /// writer (each now holds it; the caller hands it to them).
    pub(super) fn done(&mut self, lane: usize) -> Vec<Q> {
        let l = &mut self.lanes[lane];
        l.waiting = false;
        let queued: Vec<Q> = self.queued.drain(..).collect();
        l.writing += queued.len();
        queued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type L = Lanes<&'static str, u32>;

    #[test]
    fn writes_spread_over_the_open_lanes() {
        let mut l = L::new(3);
        let got: Vec<_> = (0..6).map(|_| l.take(|| 0).unwrap()).collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn a_lane_waits_for_its_last_write_then_closes_until_its_round_is_done() {
        let mut l = L::new(2);
        assert_eq!(l.take(|| 0), Some(0));
        assert_eq!(l.take(|| 0), Some(1));
        assert_eq!(l.take(|| 0), Some(0));
        // the first reply on lane 0: one more write is in flight there
        assert_eq!(l.join(0, "a"), None);
        // lane 0 is closing: a new write goes to lane 1
        assert_eq!(l.take(|| 0), Some(1));
        // the last write on lane 0 answered: the round has both
        assert_eq!(l.join(0, "b"), Some(vec!["a", "b"]));
        // while lane 0 waits, writes go to lane 1 only
        assert_eq!(l.take(|| 0), Some(1));
        assert!(l.done(0).is_empty());
        assert_eq!(l.take(|| 0), Some(0));
    }

    #[test]
    fn a_write_that_leaves_lets_the_round_start() {
        let mut l = L::new(1);
        assert_eq!(l.take(|| 0), Some(0));
        assert_eq!(l.take(|| 0), Some(0));
        assert_eq!(l.join(0, "a"), None);
        assert_eq!(l.leave(0), Some(vec!["a"]));
        // a lane nobody joined starts no round
        assert!(l.done(0).is_empty());
        assert_eq!(l.take(|| 0), Some(0));
        assert_eq!(l.leave(0), None);
    }

    #[test]
    fn writes_that_find_every_lane_busy_queue_for_the_next_one_to_open() {
        let mut l = L::new(2);
        for _ in 0..2 {
            let lane = l.take(|| 0).unwrap();
            assert!(l.join(lane, "w").is_some());
        }
        assert_eq!(l.take(|| 7), None);
        assert_eq!(l.take(|| 8), None);
        // lane 1's round ends first: it takes both queued writes together
        assert_eq!(l.done(1), vec![7, 8]);
        assert_eq!(l.join(1, "x"), None);
        assert_eq!(l.join(1, "y"), Some(vec!["x", "y"]));
        // nothing left queued for lane 0
        assert!(l.done(0).is_empty());
        assert_eq!(l.take(|| 0), Some(0));
    }

    #[test]
    fn no_write_takes_a_lane_that_has_a_writer_waiting_for_its_round() {
        let mut l = L::new(1);
        assert_eq!(l.take(|| 0), Some(0));
        assert_eq!(l.take(|| 0), Some(0));
        assert_eq!(l.join(0, "a"), None);
        assert_eq!(l.take(|| 1), None);
        assert_eq!(l.leave(0), Some(vec!["a"]));
        assert_eq!(l.done(0), vec![1]);
    }
}
