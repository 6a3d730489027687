//! The change counter: how every process on a SQLite file learns, with one
//! memory read, that a record it may hold in memory was changed.
//!
//! A delivered record is final except for two operations: an operator's
//! release (`events release --force`, run by the CLI, another process) and
//! the sweep that deletes it after retention (in any process on the file).
//! The proxy keeps delivered records it has read in memory (see
//! `delivered`), so each of those must reach every such cache before it
//! returns: the sender's next delivery can follow a release by milliseconds.
//!
//! So they count themselves in a small file beside the database
//! (`<db>-changes`), mapped shared by every process: two counters, *begun*
//! and *ended*. A change, holding the file's exclusive lock, adds one to
//! *begun*, runs its statement to the end, then sets *ended* to *begun*.
//! A cache entry is filled only from a read that started while
//! *begun* = *ended* (no change under way), and carries that *begun*; it
//! answers only while *begun* still has that value. Any change that the
//! read could have missed began after it, so it changed *begun*.
//!
//! A change that dies half way leaves *begun* ahead of *ended*: caches
//! then fill nothing and answer nothing — slower, never wrong — until the
//! next holder of the lock (a change, or a store opening) sees that nobody
//! is under way and sets *ended* to *begun*.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use crate::sys::SharedCounters;

/// One process's mapping of the counter file.
pub(super) struct ChangeCounter {
    path: PathBuf,
    /// begun, ended; the mapping outlives the descriptor it was made from.
    cells: SharedCounters<2>,
}

/// `<db>-changes`, beside SQLite's own `-wal` and `-shm`.
pub(super) fn counter_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-changes");
    PathBuf::from(name)
}

impl ChangeCounter {
    /// Opens (creating it at zero if needed) and maps the counter of the
    /// database at `db`.
    pub(super) fn open(db: &Path) -> io::Result<Self> {
        let path = counter_path(db);
        let file = Self::open_file(&path)?;
        let cells = SharedCounters::map(&file)?;
        Ok(ChangeCounter { path, cells })
    }

    fn open_file(path: &Path) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
    }

    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    fn begun(&self) -> &AtomicU64 {
        self.cells.get(0)
    }

    fn ended(&self) -> &AtomicU64 {
        self.cells.get(1)
    }

    /// The tag for an entry filled by a read that starts now, or `None`
    /// while a change is under way (or was abandoned) — then fill nothing.
    /// *ended* is read first: it never passes *begun*, so equal values mean
    /// no change was under way when *begun* was read.
    pub(super) fn quiet_tag(&self) -> Option<u64> {
        let ended = self.ended().load(SeqCst);
        let begun = self.begun().load(SeqCst);
        (begun == ended).then_some(begun)
    }

    /// Whether no change has begun since the read that got `tag`.
    pub(super) fn unchanged_since(&self, tag: u64) -> bool {
        self.begun().load(SeqCst) == tag
    }

    /// Waits for the file's lock and counts a change as begun; the change
    /// ends when the returned guard is dropped, after its statement ran.
    /// Blocking: call it off the async threads.
    pub(super) fn begin(&self) -> io::Result<ChangeUnderWay<'_>> {
        // A file description of its own: flock excludes other descriptions,
        // so two changes in this process exclude each other too.
        let lock = Self::open_file(&self.path)?;
        lock.lock()?;
        Ok(self.begun_under(lock))
    }

    /// Like [`Self::begin`], but `None` at once if another change holds the
    /// lock (for the writer thread, which must not wait on it).
    pub(super) fn try_begin(&self) -> io::Result<Option<ChangeUnderWay<'_>>> {
        let lock = Self::open_file(&self.path)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => return Err(e),
        }
        Ok(Some(self.begun_under(lock)))
    }

    /// With the file's lock taken: counts a change as begun, held by `lock`.
    fn begun_under(&self, lock: File) -> ChangeUnderWay<'_> {
        self.end_abandoned();
        self.begun().fetch_add(1, SeqCst);
        ChangeUnderWay {
            counter: self,
            lock: Some(lock),
        }
    }

    /// If nobody holds the lock and a change was abandoned, ends it so that
    /// caches fill again. Says whether there was one.
    pub(super) fn repair_if_abandoned(&self) -> io::Result<bool> {
        let lock = Self::open_file(&self.path)?;
        match lock.try_lock() {
            Ok(()) => Ok(self.end_abandoned()),
            Err(TryLockError::WouldBlock) => Ok(false),
            Err(TryLockError::Error(e)) => Err(e),
        }
        // dropping `lock` closes it, which unlocks
    }

    /// With the lock held (nobody under way): sets *ended* to *begun*.
    fn end_abandoned(&self) -> bool {
        let begun = self.begun().load(SeqCst);
        self.ended().swap(begun, SeqCst) != begun
    }
}

/// A change that has begun: dropping it ends the change and unlocks.
pub(super) struct ChangeUnderWay<'a> {
    counter: &'a ChangeCounter,
    lock: Option<File>,
}

impl ChangeUnderWay<'_> {
    /// What a process that dies mid-change leaves behind: the lock goes
    /// with it, the count of ended changes is never raised.
    #[cfg(test)]
    fn abandon(mut self) {
        drop(self.lock.take());
    }
}

impl Drop for ChangeUnderWay<'_> {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            let begun = self.counter.begun().load(SeqCst);
            self.counter.ended().store(begun, SeqCst);
            drop(lock);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    fn temp_db(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "idemgate-changes-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("x.db")
    }

    #[test]
    fn a_new_counter_is_quiet_at_zero() {
        let db = temp_db("new");
        let counter = ChangeCounter::open(&db).unwrap();
        assert_eq!(counter.path(), counter_path(&db));
        assert_eq!(counter.quiet_tag(), Some(0));
        assert!(counter.unchanged_since(0));
        assert_eq!(std::fs::metadata(counter.path()).unwrap().len(), 16);
    }

    /// Two mappings of one file stand for two processes.
    #[test]
    fn a_change_in_one_mapping_is_seen_in_the_other() {
        let db = temp_db("two");
        let proxy = ChangeCounter::open(&db).unwrap();
        let cli = ChangeCounter::open(&db).unwrap();
        let tag = proxy.quiet_tag().unwrap();
        let change = cli.begin().unwrap();
        // under way: nothing may be filled, and the old tag is void already
        assert_eq!(proxy.quiet_tag(), None);
        assert!(!proxy.unchanged_since(tag));
        drop(change);
        assert_eq!(proxy.quiet_tag(), Some(tag + 1));
        assert!(!proxy.unchanged_since(tag));
        assert!(proxy.unchanged_since(tag + 1));
        // and it persists in the file for a process that maps it later
        drop((proxy, cli));
        assert_eq!(ChangeCounter::open(&db).unwrap().quiet_tag(), Some(1));
    }

    #[test]
    fn changes_exclude_each_other() {
        let db = temp_db("exclude");
        let counter = ChangeCounter::open(&db).unwrap();
        let first = counter.begin().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                let second = counter.begin().unwrap();
                tx.send(()).unwrap();
                drop(second);
            });
            assert!(
                rx.recv_timeout(Duration::from_millis(200)).is_err(),
                "a second change began while the first was under way"
            );
            assert_eq!(counter.quiet_tag(), None);
            drop(first);
            rx.recv_timeout(Duration::from_secs(5))
                .expect("the second change never began");
        });
        assert_eq!(counter.quiet_tag(), Some(2));
    }

    #[test]
    fn an_abandoned_change_keeps_caches_off_until_repaired() {
        let db = temp_db("abandoned");
        let proxy = ChangeCounter::open(&db).unwrap();
        let cli = ChangeCounter::open(&db).unwrap();
        cli.begin().unwrap().abandon();
        assert_eq!(proxy.quiet_tag(), None, "no fill after an abandoned change");
        assert!(!proxy.unchanged_since(0));
        // a repair while another change holds the lock leaves it alone
        let under_way = cli.begin().unwrap();
        assert!(!proxy.repair_if_abandoned().unwrap());
        assert_eq!(proxy.quiet_tag(), None);
        drop(under_way);
        // that change ended the abandoned one too
        assert_eq!(proxy.quiet_tag(), Some(2));
        cli.begin().unwrap().abandon();
        assert!(proxy.repair_if_abandoned().unwrap());
        assert_eq!(proxy.quiet_tag(), Some(3));
        assert!(
            !proxy.repair_if_abandoned().unwrap(),
            "nothing left to repair"
        );
    }
}
