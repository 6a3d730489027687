//! Which keys the file may hold: a Bloom filter over (route, event ID) of
//! every record at the last scan of the key index and every claim this
//! process made since. A unique delivery, the common case, is then claimed
//! without first reading the index for a duplicate that is not there: on a
//! store of millions that read descends into cold pages on every request,
//! and it was most of the big store's cost (issue 24).
//!
//! A "no" may be wrong (a record another process claimed after the scan),
//! and that costs only speed: the claim, on the writer, finds the record and
//! answers as the read would have. The read is a fast path for duplicates,
//! never the decision. A "maybe" is a read, as without the filter; so is
//! every lookup until the first scan has finished.
//!
//! Swept records stay in the filter, so it fills up. Once this process has
//! added as many keys as the filter has room for, a new one is built from a
//! fresh scan on a thread of its own, with the keys claimed meanwhile added
//! to both.

use std::hash::BuildHasher;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use rusqlite::Connection;

use super::direct::{self, Role};
use crate::store::StoreError;

/// Bits per key the filter is sized for: about 1 % false "maybe" with
/// [`PROBES`] probes.
const BITS_PER_KEY: u64 = 10;
/// Bit positions tested per key.
const PROBES: u64 = 4;
/// Keys a filter has room for at least (a new store grows into it).
const MIN_KEYS: u64 = 1 << 20;
/// The most memory one filter takes (32 MiB; two while one is rebuilt).
/// A bigger store gets more false "maybe"s, each a read as without it.
const MAX_BITS: u64 = 256 << 20;

/// Keys one read of the scan takes.
const SCAN_CHUNK: u64 = 10_000;

/// The filter of one store, shared by its lookups, its claims and the
/// thread that rebuilds it.
pub(super) struct KeyFilter {
    path: PathBuf,
    hasher: std::hash::RandomState,
    /// `None` until the first scan has finished.
    current: ArcSwapOption<Bloom>,
    /// The filter a scan is filling, which claims also add to.
    next: ArcSwapOption<Bloom>,
    scanning: AtomicBool,
}

impl KeyFilter {
    pub(super) fn new(path: PathBuf) -> Arc<Self> {
        Arc::new(KeyFilter {
            path,
            hasher: std::hash::RandomState::new(),
            current: ArcSwapOption::empty(),
            next: ArcSwapOption::empty(),
            scanning: AtomicBool::new(false),
        })
    }

    fn hash(&self, route: &str, event_id: &str) -> u64 {
        self.hasher.hash_one((route, event_id))
    }

    /// False only if no record of the key was in the file at the last scan
    /// and this process has not claimed it since.
    pub(super) fn may_hold(&self, route: &str, event_id: &str) -> bool {
        match &*self.current.load() {
            Some(bloom) => bloom.contains(self.hash(route, event_id)),
            None => true,
        }
    }

    /// The key is about to be claimed; a full filter starts a rebuild.
    pub(super) fn add(self: &Arc<Self>, route: &str, event_id: &str) {
        let h = self.hash(route, event_id);
        if let Some(next) = &*self.next.load() {
            next.insert(h);
        }
        if let Some(bloom) = &*self.current.load() {
            if bloom.insert(h) && bloom.full() {
                let rows =
                    bloom.scanned.load(Ordering::Relaxed) + bloom.added.load(Ordering::Relaxed);
                self.rescan(rows);
            }
        }
    }

    /// Builds a new filter sized for `rows` records from the file, on a
    /// thread of its own, unless a scan is under way; a failed scan leaves
    /// the filter as it was. The new filter takes the keys claimed from the
    /// moment this returns, so none claimed meanwhile is missed.
    pub(super) fn rescan(self: &Arc<Self>, rows: u64) {
        if self.scanning.swap(true, Ordering::AcqRel) {
            return;
        }
        let bloom = Arc::new(Bloom::sized_for(rows));
        self.next.store(Some(bloom.clone()));
        let filter = self.clone();
        let spawned = std::thread::Builder::new()
            .name("idemgate-sqlite-keys".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                match filter.scan(bloom) {
                    Ok(keys) => tracing::debug!(
                        keys,
                        ms = started.elapsed().as_millis() as u64,
                        "SQLite key filter built"
                    ),
                    Err(e) => tracing::warn!(error = %e, "cannot build the SQLite key filter"),
                }
                filter.next.store(None);
                filter.scanning.store(false, Ordering::Release);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the SQLite key filter's scan");
            self.next.store(None);
            self.scanning.store(false, Ordering::Release);
        }
    }

    /// Fills `bloom` with the keys of the file's records, then puts it in
    /// place; the keys scanned.
    fn scan(&self, bloom: Arc<Bloom>) -> Result<u64, StoreError> {
        let conn = direct::open(&self.path, Role::Reader)?;
        // in chunks, each its own read: one snapshot held for the whole
        // scan would keep the WAL from starting over for seconds
        let mut st = conn.prepare(
            "SELECT route, event_id FROM records WHERE (route, event_id) > ($1, $2) \
             ORDER BY route, event_id LIMIT $3",
        )?;
        let (mut route, mut event_id) = (String::new(), String::new());
        let mut keys = 0u64;
        loop {
            let mut rows = st.query(rusqlite::params![route, event_id, SCAN_CHUNK])?;
            let mut in_chunk = 0;
            while let Some(row) = rows.next()? {
                route.clear();
                route.push_str(row.get_ref(0)?.as_str().unwrap_or_default());
                event_id.clear();
                event_id.push_str(row.get_ref(1)?.as_str().unwrap_or_default());
                bloom.insert(self.hash(&route, &event_id));
                in_chunk += 1;
            }
            keys += in_chunk;
            if in_chunk < SCAN_CHUNK {
                break;
            }
        }
        bloom.added.store(0, Ordering::Relaxed);
        bloom.scanned.store(keys, Ordering::Relaxed);
        self.current.store(Some(bloom));
        Ok(keys)
    }
}

/// An upper bound on the records, without counting them: rowids only grow.
pub(super) fn rows_at_most(conn: &Connection) -> Result<u64, StoreError> {
    let span: Option<i64> =
        conn.query_row("SELECT max(rowid) - min(rowid) + 1 FROM records", [], |r| {
            r.get(0)
        })?;
    Ok(span.unwrap_or(0).max(0) as u64)
}

/// A fixed-size Bloom filter whose bits are set without a lock.
struct Bloom {
    words: Box<[AtomicU64]>,
    bits: u64,
    /// Keys its scan found.
    scanned: AtomicU64,
    /// Keys new to it inserted since its scan finished.
    added: AtomicU64,
}

impl Bloom {
    /// Room for twice `rows` keys (at least [`MIN_KEYS`]), within [`MAX_BITS`].
    fn sized_for(rows: u64) -> Self {
        let keys = (rows.saturating_mul(2)).max(MIN_KEYS);
        let bits = keys.saturating_mul(BITS_PER_KEY).min(MAX_BITS);
        let words = (0..bits.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Bloom {
            words,
            bits,
            scanned: AtomicU64::new(0),
            added: AtomicU64::new(0),
        }
    }

    /// Time for a new one: it has taken as many new keys as it has room
    /// for, or, once past the cap (no room), as many as the store held.
    fn full(&self) -> bool {
        let scanned = self.scanned.load(Ordering::Relaxed);
        let room = (self.bits / BITS_PER_KEY).saturating_sub(scanned);
        let limit = if room > 0 {
            room
        } else {
            scanned.max(MIN_KEYS)
        };
        self.added.load(Ordering::Relaxed) > limit
    }

    /// The key's bit positions: double hashing, each reduced to the range
    /// by a multiply-shift (no power-of-two size needed).
    fn positions(&self, h: u64) -> impl Iterator<Item = u64> + '_ {
        let step = h.rotate_left(32).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..PROBES).map(move |i| {
            let x = h.wrapping_add(i.wrapping_mul(step));
            ((x as u128 * self.bits as u128) >> 64) as u64
        })
    }

    fn contains(&self, h: u64) -> bool {
        self.positions(h)
            .all(|p| self.words[(p / 64) as usize].load(Ordering::Relaxed) & (1 << (p % 64)) != 0)
    }

    /// Sets the key's bits; true if one was not set (a key new to it).
    fn insert(&self, h: u64) -> bool {
        let mut new = false;
        for p in self.positions(h) {
            let bit = 1u64 << (p % 64);
            new |= self.words[(p / 64) as usize].fetch_or(bit, Ordering::Relaxed) & bit == 0;
        }
        if new {
            self.added.fetch_add(1, Ordering::Relaxed);
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_inserted_is_contained() {
        let bloom = Bloom::sized_for(0);
        for h in (0..200_000u64).map(|i| i.wrapping_mul(0x2545_F491_4F6C_DD1D)) {
            bloom.insert(h);
        }
        for h in (0..200_000u64).map(|i| i.wrapping_mul(0x2545_F491_4F6C_DD1D)) {
            assert!(bloom.contains(h));
        }
    }

    #[test]
    fn keys_never_inserted_are_mostly_absent_at_the_sized_load() {
        let bloom = Bloom::sized_for(0);
        let hasher = std::hash::RandomState::new();
        for i in 0..MIN_KEYS {
            bloom.insert(hasher.hash_one(("r", i)));
        }
        let trials = 100_000u64;
        let false_maybe = (0..trials)
            .filter(|i| bloom.contains(hasher.hash_one(("other", *i))))
            .count() as f64
            / trials as f64;
        // 10 bits and 4 probes per key: about 1.2 %
        assert!(false_maybe < 0.03, "false maybe rate {false_maybe}");
    }

    #[test]
    fn full_once_its_room_or_the_store_again_is_taken() {
        let bloom = Bloom::sized_for(3_000_000);
        assert_eq!(bloom.bits, 6_000_000 * BITS_PER_KEY);
        bloom.scanned.store(2_000_000, Ordering::Relaxed);
        bloom.added.store(4_000_000, Ordering::Relaxed);
        assert!(!bloom.full());
        bloom.added.store(4_000_001, Ordering::Relaxed);
        assert!(bloom.full());
        let huge = Bloom::sized_for(100_000_000);
        assert_eq!(huge.bits, MAX_BITS);
        huge.scanned.store(100_000_000, Ordering::Relaxed);
        huge.added.store(99_999_999, Ordering::Relaxed);
        assert!(
            !huge.full(),
            "past the cap: rebuilt once it has seen the store again"
        );
        huge.added.store(100_000_001, Ordering::Relaxed);
        assert!(huge.full());
    }

    /// The scan, on a real file: every key of every chunk (two full ones
    /// and a part) goes in, keys on both sides of a chunk's edge included.
    #[test]
    fn the_scan_takes_every_key_of_the_file() {
        let dir = std::env::temp_dir().join(format!("idemgate-key-filter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keys.db");
        let _ = std::fs::remove_file(&path);
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             CREATE TABLE records (route TEXT NOT NULL, event_id TEXT NOT NULL);
             CREATE UNIQUE INDEX records_key ON records (route, event_id);",
        )
        .unwrap();
        let keys: Vec<(String, String)> = (0..2 * SCAN_CHUNK + 137)
            .map(|i| (format!("r{}", i % 3), format!("evt_{i:08x}")))
            .collect();
        let tx = conn.unchecked_transaction().unwrap();
        for (route, id) in &keys {
            tx.execute("INSERT INTO records VALUES (?1, ?2)", (route, id))
                .unwrap();
        }
        tx.commit().unwrap();
        let filter = KeyFilter::new(path.clone());
        assert!(
            filter.may_hold("r0", "never"),
            "before a scan every key may be held"
        );
        let rows = rows_at_most(&conn).unwrap();
        assert_eq!(rows, keys.len() as u64);
        let scanned = filter.scan(Arc::new(Bloom::sized_for(rows))).unwrap();
        assert_eq!(scanned, keys.len() as u64);
        assert!(keys.iter().all(|(r, id)| filter.may_hold(r, id)));
        let absent = (0..1_000)
            .filter(|i| !filter.may_hold("r0", &format!("new_{i}")))
            .count();
        assert!(
            absent > 950,
            "only {absent} of 1,000 new keys were surely new"
        );
        drop(conn);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
