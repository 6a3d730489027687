//! Delivered records this process has read lately, so that duplicates of a
//! delivered event (a sender's retry storm, a bulk redelivery) are answered
//! from memory instead of a read of the file each.
//!
//! An entry answers only while both of these hold, checked on every use:
//! - no change has begun since the read that filled it (the shared
//!   [`ChangeCounter`]: a release or a sweep, by the CLI or by any process on
//!   the file, reaches every cache before it returns);
//! - the entry is younger than [`MAX_AGE`]: a bound on what nothing else
//!   covers (a hand edit of the file, a change by an idemgate too old to
//!   count it).
//!
//! Only `delivered` records are kept: a release and the sweep are the only
//! ways they change. The answer is decided by `claim::decide` from the
//! cached record, as it is from a read.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::changes::ChangeCounter;
use crate::claim::{Millis, State};
use crate::store::sql::Readback;
use crate::store::{ClaimOutcome, Recorded};

/// How long an entry may answer at most.
pub(super) const MAX_AGE: Duration = Duration::from_secs(1);
/// Memory for entries, keys and replay bodies, over all shards.
const BUDGET_BYTES: usize = 8 << 20;
/// Shards, each behind its own mutex (held for a map lookup and a clone).
const SHARDS: usize = 16;
/// Bookkeeping counted per entry on top of its strings and body.
const ENTRY_OVERHEAD: usize = 128;

pub(super) struct DeliveredCache {
    changes: Arc<ChangeCounter>,
    hasher: RandomState,
    shards: Box<[Mutex<Shard>]>,
    shard_budget: usize,
}

/// Entries by key fingerprint, and the order they came in: the oldest goes
/// first when the shard is over budget.
#[derive(Default)]
struct Shard {
    entries: HashMap<u64, Entry, BuildHasherDefault<Fingerprint>>,
    arrivals: VecDeque<(u64, u64)>,
    bytes: usize,
    next_seq: u64,
}

struct Entry {
    /// The full key: fingerprints may collide.
    route: Box<str>,
    event_id: Box<str>,
    body_sha256: Box<str>,
    recorded: Recorded,
    /// The change count the filling read saw (see `ChangeCounter`).
    tag: u64,
    read_at: Instant,
    /// Tells this entry from a later one of the same key in `arrivals`.
    seq: u64,
    bytes: usize,
}

impl DeliveredCache {
    pub(super) fn new(changes: Arc<ChangeCounter>) -> Self {
        Self::with_budget(changes, BUDGET_BYTES)
    }

    fn with_budget(changes: Arc<ChangeCounter>, budget: usize) -> Self {
        DeliveredCache {
            changes,
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            shard_budget: budget / SHARDS,
        }
    }

    /// The counter that keeps the entries right; changes count themselves in it.
    pub(super) fn changes(&self) -> &Arc<ChangeCounter> {
        &self.changes
    }

    fn shard(&self, fingerprint: u64) -> &Mutex<Shard> {
        // bits the map itself does not use much (it takes the low ones for
        // the bucket and the top seven as tags)
        &self.shards[(fingerprint >> 40) as usize % SHARDS]
    }

    /// The claim's answer for a delivery of `digest`, if a valid entry holds
    /// the record; a stale entry is dropped.
    pub(super) fn answer(
        &self,
        route: &str,
        event_id: &str,
        digest: &str,
        now: Millis,
    ) -> Option<ClaimOutcome> {
        let fingerprint = self.hasher.hash_one((route, event_id));
        let mut shard = self
            .shard(fingerprint)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let entry = shard.entries.get(&fingerprint)?;
        if &*entry.route != route || &*entry.event_id != event_id {
            return None;
        }
        if entry.read_at.elapsed() >= MAX_AGE || !self.changes.unchanged_since(entry.tag) {
            shard.remove(fingerprint);
            return None;
        }
        let same_digest = &*entry.body_sha256 == digest;
        let recorded = entry.recorded.clone();
        drop(shard);
        // "delivered" with the same digest replays, with another is refused
        match crate::store::existing_outcome(
            State::Delivered,
            None,
            same_digest,
            now,
            false,
            recorded,
        ) {
            crate::store::Found::Answer(outcome) => Some(outcome),
            crate::store::Found::Claim | crate::store::Found::Hold => None,
        }
    }

    /// The change count to tag a fill with: take it *before* the read.
    pub(super) fn fill_tag(&self) -> Option<u64> {
        self.changes.quiet_tag()
    }

    /// Keeps a record read with `tag` in hand, if it is delivered.
    pub(super) fn fill(&self, route: &str, event_id: &str, found: &Readback, tag: u64) {
        if found.state != State::Delivered {
            return;
        }
        let recorded = found.recorded();
        let bytes = ENTRY_OVERHEAD
            + route.len()
            + event_id.len()
            + found.body_sha256.len()
            + recorded.content_type.as_ref().map_or(0, String::len)
            + recorded.body.as_ref().map_or(0, Vec::len)
            + recorded.headers.as_ref().map_or(0, |h| h.stored().len());
        if bytes > self.shard_budget / 4 {
            return;
        }
        let fingerprint = self.hasher.hash_one((route, event_id));
        let mut shard = self
            .shard(fingerprint)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        shard.remove(fingerprint);
        while shard.bytes + bytes > self.shard_budget {
            let Some((oldest, seq)) = shard.arrivals.pop_front() else {
                break;
            };
            if shard.entries.get(&oldest).is_some_and(|e| e.seq == seq) {
                shard.remove(oldest);
            }
        }
        let seq = shard.next_seq;
        shard.next_seq += 1;
        shard.arrivals.push_back((fingerprint, seq));
        shard.bytes += bytes;
        shard.entries.insert(
            fingerprint,
            Entry {
                route: route.into(),
                event_id: event_id.into(),
                body_sha256: found.body_sha256.as_str().into(),
                recorded,
                tag,
                read_at: Instant::now(),
                seq,
                bytes,
            },
        );
        // a shard whose entries keep being replaced must not keep their
        // arrivals forever: drop the ones that no longer name an entry
        if shard.arrivals.len() > 2 * shard.entries.len() + 64 {
            let Shard {
                entries, arrivals, ..
            } = &mut *shard;
            arrivals.retain(|(f, s)| entries.get(f).is_some_and(|e| e.seq == *s));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap().entries.len())
            .sum()
    }
}

impl Shard {
    fn remove(&mut self, fingerprint: u64) {
        if let Some(gone) = self.entries.remove(&fingerprint) {
            self.bytes -= gone.bytes;
        }
    }
}

/// The map's keys are already uniform hashes: use them as they are.
#[derive(Default)]
struct Fingerprint(u64);

impl Hasher for Fingerprint {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::Refusal;

    fn counter(name: &str) -> Arc<ChangeCounter> {
        let dir =
            std::env::temp_dir().join(format!("idemgate-delivered-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Arc::new(ChangeCounter::open(&dir.join("x.db")).unwrap())
    }

    fn now() -> Millis {
        crate::claim::now_ms()
    }

    fn delivered(digest: &str, body: usize) -> Readback {
        Readback {
            state: State::Delivered,
            lease_until: None,
            body_sha256: digest.into(),
            last_status: Some(200),
            replay_status: None,
            replay_content_type: None,
            replay_body: (body > 0).then(|| vec![b'x'; body]),
            replay_headers: None,
            send_trace: None,
        }
    }

    fn decision(outcome: Option<ClaimOutcome>) -> Option<Refusal> {
        outcome.map(|o| match o {
            ClaimOutcome::Existing { decision, .. } => decision,
            ClaimOutcome::Claimed { .. } => panic!("a cache never claims"),
        })
    }

    /// Whether the cache answers for `route`/`id` with digest `d`.
    fn holds(cache: &DeliveredCache, route: &str, id: &str) -> bool {
        cache.answer(route, id, "d", now()).is_some()
    }

    #[test]
    fn a_delivered_record_answers_replay_or_mismatch() {
        let cache = DeliveredCache::new(counter("answers"));
        assert!(cache.answer("r", "e1", "d", now()).is_none(), "empty");
        let tag = cache.fill_tag().unwrap();
        cache.fill("r", "e1", &delivered("d", 0), tag);
        let hit = cache.answer("r", "e1", "d", now()).unwrap();
        assert_eq!(
            hit,
            ClaimOutcome::Existing {
                decision: Refusal::Replay,
                recorded: Recorded {
                    status: Some(200),
                    content_type: None,
                    body: None,
                    headers: None,
                    trace: None,
                }
            }
        );
        assert_eq!(
            decision(cache.answer("r", "e1", "other", now())),
            Some(Refusal::Mismatch)
        );
        assert!(!holds(&cache, "r", "e2"), "another event");
        assert!(!holds(&cache, "s", "e1"), "another route");
    }

    /// The record's latest send (SPEC §19) is kept with the entry: a
    /// replay and a mismatch answered from memory link to it too.
    #[test]
    fn an_entry_keeps_the_latest_send() {
        let cache = DeliveredCache::new(counter("send"));
        let send = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7";
        let rec = Readback {
            send_trace: Some(send.into()),
            ..delivered("d", 3)
        };
        cache.fill("r", "e", &rec, cache.fill_tag().unwrap());
        let want = crate::store::TraceRef::from_stored(send);
        assert!(want.is_some());
        for digest in ["d", "other"] {
            let Some(ClaimOutcome::Existing { recorded, .. }) =
                cache.answer("r", "e", digest, now())
            else {
                panic!("{digest}: no answer from memory");
            };
            assert_eq!(recorded.trace, want, "{digest}");
        }
    }

    #[test]
    fn only_delivered_records_are_kept() {
        let cache = DeliveredCache::new(counter("kept"));
        let tag = cache.fill_tag().unwrap();
        for state in [State::Processing, State::Failed] {
            let rec = Readback {
                state,
                ..delivered("d", 0)
            };
            cache.fill("r", state.as_str(), &rec, tag);
            assert!(
                cache.answer("r", state.as_str(), "d", now()).is_none(),
                "{state}"
            );
        }
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn an_entry_answers_for_max_age_at_most() {
        let cache = DeliveredCache::new(counter("age"));
        cache.fill("r", "e", &delivered("d", 0), cache.fill_tag().unwrap());
        assert!(cache.answer("r", "e", "d", now()).is_some());
        std::thread::sleep(MAX_AGE + Duration::from_millis(20));
        assert!(cache.answer("r", "e", "d", now()).is_none());
    }

    #[test]
    fn a_change_voids_every_entry_filled_before_it() {
        let changes = counter("change");
        let cache = DeliveredCache::new(changes.clone());
        let before = cache.fill_tag().unwrap();
        cache.fill("r", "e1", &delivered("d", 0), before);
        let change = changes.begin().unwrap();
        assert_eq!(
            cache.fill_tag(),
            None,
            "no fill while a change is under way"
        );
        assert!(cache.answer("r", "e1", "d", now()).is_none());
        // a read that started before the change began, finishing after
        cache.fill("r", "e2", &delivered("d", 0), before);
        drop(change);
        assert!(cache.answer("r", "e2", "d", now()).is_none());
        let after = cache.fill_tag().unwrap();
        assert_ne!(after, before);
        cache.fill("r", "e1", &delivered("d", 0), after);
        assert!(cache.answer("r", "e1", "d", now()).is_some());
    }

    #[test]
    fn the_budget_bounds_memory_and_the_oldest_go_first() {
        // 16 shards of 16 KiB: a 1 KiB body is ~1.2 KiB an entry
        let cache = DeliveredCache::with_budget(counter("budget"), (16 * 16) << 10);
        let tag = cache.fill_tag().unwrap();
        for i in 0..2_000 {
            cache.fill("r", &format!("e{i}"), &delivered("d", 1024), tag);
        }
        let bytes: usize = cache.shards.iter().map(|s| s.lock().unwrap().bytes).sum();
        assert!(bytes <= (16 * 16) << 10, "{bytes}");
        assert!(cache.len() > 100, "{}", cache.len());
        assert!(holds(&cache, "r", "e1999"), "the newest stays");
        assert!(!holds(&cache, "r", "e0"), "the oldest went");
        // too large for a shard: not kept at all
        cache.fill("r", "big", &delivered("d", 8 << 10), tag);
        assert!(cache.answer("r", "big", "d", now()).is_none());
    }

    #[test]
    fn refilling_one_key_keeps_bookkeeping_bounded() {
        let cache = DeliveredCache::new(counter("refill"));
        let tag = cache.fill_tag().unwrap();
        for _ in 0..10_000 {
            cache.fill("r", "e", &delivered("d", 10), tag);
        }
        assert_eq!(cache.len(), 1);
        let arrivals: usize = cache
            .shards
            .iter()
            .map(|s| s.lock().unwrap().arrivals.len())
            .sum();
        assert!(arrivals < 100, "{arrivals}");
    }
}
