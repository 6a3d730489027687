//! Which events this process has met lately: decides whether a guarded request
//! reads the store first or claims at once.
//!
//! A read first keeps duplicates of settled events off the write path (the
//! replay must not queue behind claims). For an event never seen before the
//! read is wasted: one more statement, and on PostgreSQL one more round trip,
//! per unique event. So a request whose (route, event ID) this process has
//! not met recently claims at once; one it has met reads first.
//!
//! This is a hint, never a decision: the claim statement decides every case
//! the read would have (replay, mismatch, in flight) from the record itself,
//! so a key met by another replica, forgotten here, or sharing a slot with
//! another key costs at most the slower path, never a wrong answer.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots in the table (8 bytes each: 2 MiB). At 5,000 new events a second a
/// key stays about a minute, longer than most senders' first retry.
const SLOTS: usize = 1 << 18;

/// A fixed-size, lock-free table of key fingerprints: a key's slot holds its
/// fingerprint until another key that maps to the same slot replaces it.
pub struct SeenEvents {
    slots: Box<[AtomicU64]>,
    hasher: RandomState,
}

impl Default for SeenEvents {
    fn default() -> Self {
        Self::with_slots(SLOTS)
    }
}

impl SeenEvents {
    fn with_slots(n: usize) -> Self {
        assert!(n.is_power_of_two());
        SeenEvents {
            slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
            hasher: RandomState::new(),
        }
    }

    /// Records the key and says whether it was already there.
    pub fn check_and_record(&self, route: &str, event_id: &str) -> bool {
        let hash = self.hasher.hash_one((route, event_id));
        // 0 marks an empty slot, so no fingerprint is 0
        let fingerprint = hash | 1;
        let slot = &self.slots[(hash >> 32) as usize & (self.slots.len() - 1)];
        if slot.load(Ordering::Relaxed) == fingerprint {
            return true;
        }
        slot.store(fingerprint, Ordering::Relaxed);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_new_once_then_seen() {
        let seen = SeenEvents::default();
        assert!(!seen.check_and_record("stripe", "evt_1"));
        assert!(seen.check_and_record("stripe", "evt_1"));
        assert!(seen.check_and_record("stripe", "evt_1"));
    }

    #[test]
    fn route_and_event_id_make_the_key() {
        let seen = SeenEvents::default();
        assert!(!seen.check_and_record("a", "1"));
        assert!(!seen.check_and_record("b", "1"));
        assert!(!seen.check_and_record("a", "2"));
        // no ambiguity from joining the two strings
        assert!(!seen.check_and_record("a1", ""));
        assert!(seen.check_and_record("a", "1"));
    }

    #[test]
    fn a_full_table_forgets_instead_of_growing() {
        let seen = SeenEvents::with_slots(16);
        for i in 0..1_000 {
            seen.check_and_record("r", &i.to_string());
        }
        // the newest key holds its slot: nothing was written over it since
        assert!(seen.check_and_record("r", "999"));
        // most early keys were replaced: forgetting only means reading less
        let remembered = (0..100)
            .filter(|i| seen.check_and_record("r", &i.to_string()))
            .count();
        assert!(remembered < 50, "{remembered} of 100 still there");
    }
}
