//! The embedded default: one SQLite file in WAL mode with `synchronous=FULL`,
//! so a claim is on disk before the request is forwarded. One driver,
//! rusqlite, on connections this process drives itself.
//!
//! Claims and settles go to one writer thread with its own connection
//! (group commit, see `writer`), and duplicate lookups are one indexed read
//! inline on the request's thread, or none when the delivered record is in
//! hand (see `delivered`). Operator releases and sweeps run on a connection
//! of their own, counted in the file every process's cache watches (see
//! `changes`). Migrations (`migrate`, recorded as sqlx recorded them) and
//! the cold reads (`reads`: `events`, the admin API, `/readyz`, held
//! duplicates) run on blocking threads, the reads on the lookups' idle
//! connections. Other processes sharing the file are serialised by SQLite's
//! lock and the busy timeout.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::Connection;

use super::sql::{OwnedParam, Statement, Value};
use super::sql_operator::{sql_operator_ops, SqlRun};
use super::{
    Backend, ClaimOutcome, ClaimRequest, Found, ListFilter, Record, ReleaseOutcome, ReleaseRequest,
    SettleRequest, StoreError, StoreUrl,
};
use crate::claim::{Millis, SettleResult};

mod changes;
mod delivered;
mod direct;
mod migrate;
mod reads;
mod writer;

/// Most records one transaction of the sweep deletes (see `sweep`).
const SWEEP_SLICE: i64 = 100;

pub struct SqliteStore {
    /// Claims and settles: the group-commit writer thread.
    writer: writer::Writer,
    /// Duplicate lookups inline, and the cold reads on blocking threads.
    readers: Arc<direct::Readers>,
    path: PathBuf,
    /// The cache of delivered records, with the change counter it shares
    /// with every process on the file; `Err` says why there is neither (the
    /// cache is then off, and releases and sweeps refuse to run: a change
    /// must count itself).
    delivered: Result<delivered::DeliveredCache, String>,
}

impl SqliteStore {
    /// Creates the file (and its directory) if missing, in WAL mode.
    /// `max_connections` does not apply: there is one writer, and read
    /// connections are opened as lookups need them.
    pub async fn open(url: &StoreUrl, _max_connections: u32) -> Result<Self, StoreError> {
        let path = url
            .sqlite_path()
            .ok_or_else(|| StoreError::UnsupportedUrl(url.redacted()))?
            .to_path_buf();
        let file = path.clone();
        blocking(move || direct::create(&file).map(drop)).await?;
        let delivered = changes::ChangeCounter::open(&path)
            .map(|counter| {
                match counter.repair_if_abandoned() {
                    Ok(false) => {}
                    Ok(true) => tracing::warn!(
                        counter = %counter.path().display(),
                        "an earlier release or sweep stopped half way; marked as ended"
                    ),
                    Err(e) => tracing::warn!(
                        counter = %counter.path().display(),
                        error = %e,
                        "cannot check the change counter"
                    ),
                }
                delivered::DeliveredCache::new(Arc::new(counter))
            })
            .map_err(|e| {
                let counter = changes::counter_path(&path);
                tracing::warn!(
                    counter = %counter.display(),
                    error = %e,
                    "cannot open the change counter: delivered records are not cached"
                );
                format!("cannot open {}: {e}", counter.display())
            });
        Ok(SqliteStore {
            writer: writer::Writer::start(path.clone())?,
            readers: Arc::new(direct::Readers::new(path.clone())),
            path,
            delivered,
        })
    }

    /// A read on an idle lookup connection, on a blocking thread.
    async fn cold_read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let readers = self.readers.clone();
        blocking(move || readers.with(read)).await
    }

    /// A change of records that caches may hold (see `direct::counted`), on
    /// a blocking thread that runs it to the end even if the caller stops
    /// waiting.
    async fn counted<T: Send + 'static>(
        &self,
        change: impl FnOnce(&rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let counter = self.change_counter()?;
        let path = self.path.clone();
        blocking(move || direct::counted(&path, &counter, change)).await
    }

    /// The counter every change of delivered records must count itself in.
    fn change_counter(&self) -> Result<Arc<changes::ChangeCounter>, StoreError> {
        match &self.delivered {
            Ok(cache) => Ok(cache.changes().clone()),
            Err(why) => Err(StoreError::Unavailable(format!(
                "{why}; a release or sweep must count itself there so that \
                 running proxies stop replaying what it changed"
            ))),
        }
    }
}

fn owned_statements(statements: &[Statement<'_>]) -> Vec<direct::OwnedStatement> {
    statements
        .iter()
        .map(|s| (s.sql, s.params.iter().map(OwnedParam::from).collect()))
        .collect()
}

/// Runs blocking SQLite work on a blocking thread, to its end even if the
/// caller stops waiting.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| StoreError::Unavailable(format!("stopped: {e}")))?
}

impl SqlRun for SqliteStore {
    /// On a connection of its own, counted: a resolve or a bulk release
    /// changes records a cache may hold the state of.
    async fn execute(&self, statements: &[Statement<'_>]) -> Result<Vec<u64>, StoreError> {
        let owned = owned_statements(statements);
        self.counted(move |conn| direct::write_all(conn, &owned))
            .await
    }

    async fn query(&self, statement: &Statement<'_>) -> Result<Vec<Vec<Value>>, StoreError> {
        let owned = owned_statements(std::slice::from_ref(statement)).remove(0);
        self.cold_read(move |conn| direct::read_rows(conn, &owned))
            .await
    }
}

impl Backend for SqliteStore {
    /// A backstop only: a local file answers within the busy timeouts.
    const OP_TIMEOUT: Duration = Duration::from_secs(20);

    async fn migrate(&self) -> Result<(), StoreError> {
        let path = self.path.clone();
        blocking(move || {
            let mut conn = direct::create(&path)?;
            migrate::run(&mut conn).map_err(|e| StoreError::Migration(Box::new(e)))
        })
        .await
    }

    /// On a connection of its own, opened for this read and closed after:
    /// a pooled one may answer from its page cache after the file changed
    /// under it, so `/readyz` said ready on a file that could not serve.
    async fn ping(&self) -> Result<(), StoreError> {
        let path = self.path.clone();
        blocking(move || reads::ping(&direct::open(&path, direct::Role::Reader)?)).await
    }

    async fn claim(
        &self,
        req: &ClaimRequest<'_>,
        limit: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        self.writer.claim(req, limit).await
    }

    async fn settle(
        &self,
        req: &SettleRequest<'_>,
        limit: Duration,
    ) -> Result<SettleResult, StoreError> {
        self.writer.settle(req, limit).await
    }

    /// A file that can be read may still refuse writes (a full disk, an I/O
    /// error): after a failed batch, ready only once a write commits again.
    async fn write_probe(&self, limit: Duration) -> Result<(), StoreError> {
        self.writer.probe(limit).await
    }

    /// Inline, without an await: the delivered record in hand, else one
    /// indexed read of a local file.
    async fn peek(&self, req: &ClaimRequest<'_>) -> Result<Option<ClaimOutcome>, StoreError> {
        let (route, event_id, digest, now) = (req.route, req.event_id, req.digest, req.now);
        let hold = req.hold;
        let cache = self.delivered.as_ref().ok();
        if let Some(hit) = cache.and_then(|c| c.answer(route, event_id, digest, now)) {
            return Ok(Some(hit));
        }
        // the tag is taken before the read: see `changes`
        let tag = cache.and_then(|c| c.fill_tag());
        let Some(found) = self.readers.read(route, event_id)? else {
            return Ok(None);
        };
        if let (Some(cache), Some(tag)) = (cache, tag) {
            cache.fill(route, event_id, &found, tag);
        }
        Ok(match found.outcome(digest, now, hold) {
            Found::Answer(outcome) => Some(outcome),
            Found::Claim | Found::Hold => None,
        })
    }

    async fn get(&self, route: &str, event_id: &str) -> Result<Option<Record>, StoreError> {
        let (route, event_id) = (route.to_owned(), event_id.to_owned());
        self.cold_read(move |conn| reads::get(conn, &route, &event_id))
            .await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
        let filter = filter.clone();
        self.cold_read(move |conn| reads::list(conn, &filter)).await
    }

    async fn release(&self, req: &ReleaseRequest<'_>) -> Result<ReleaseOutcome, StoreError> {
        let (route, event_id) = (req.route.to_owned(), req.event_id.to_owned());
        let (force, now) = (req.force, req.now);
        self.counted(move |conn| direct::release(conn, &route, &event_id, force, now))
            .await
    }

    /// The batch in slices of at most `SWEEP_SLICE` records, each inside
    /// one of the writer's batches: a slice shares the claims' commit, and
    /// no claim waits longer than one slice takes (on a store of millions
    /// with random event IDs, a thousand deletions touch a thousand
    /// scattered pages: tens of ms).
    async fn sweep(&self, now: Millis, limit: i64) -> Result<u64, StoreError> {
        let changes = self.change_counter()?;
        let mut swept = 0u64;
        while (swept as i64) < limit {
            let slice = (limit - swept as i64).min(SWEEP_SLICE);
            let on_writer = self
                .writer
                .sweep(
                    writer::SweepSlice {
                        changes: changes.clone(),
                        now,
                        limit: slice,
                    },
                    Self::OP_TIMEOUT,
                )
                .await?;
            let n = match on_writer {
                Some(n) => n,
                // another change (a release) holds the counter: this slice
                // waits for it on a connection of its own, not the writer
                None => self.counted(move |c| direct::sweep(c, now, slice)).await?,
            };
            swept += n;
            if (n as i64) < slice {
                break;
            }
        }
        Ok(swept)
    }

    async fn oldest_processing(&self) -> Result<Vec<(String, Millis)>, StoreError> {
        self.cold_read(reads::oldest_processing).await
    }

    sql_operator_ops!();

    /// The idle readers first, the writer last: the last connection to
    /// close checkpoints the WAL into the database file.
    async fn close(&self) {
        self.readers.close();
        self.writer.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sqlite://PATH` (absolute `sqlite:///abs/x.db` or relative
    /// `sqlite://data/x.db`, relative to the working directory) or `sqlite:PATH`.
    fn path_of(url: &str) -> Result<PathBuf, StoreError> {
        let url: StoreUrl = url.parse()?;
        let path = url.sqlite_path();
        path.map(PathBuf::from)
            .ok_or_else(|| StoreError::UnsupportedUrl(url.redacted()))
    }

    #[test]
    fn paths_from_urls() {
        assert_eq!(
            path_of("sqlite:///tmp/a/b.db").unwrap(),
            PathBuf::from("/tmp/a/b.db")
        );
        assert_eq!(
            path_of("sqlite://data/idemgate.db").unwrap(),
            PathBuf::from("data/idemgate.db")
        );
        assert_eq!(
            path_of("sqlite:x.db?mode=rwc").unwrap(),
            PathBuf::from("x.db")
        );
        assert!(path_of("sqlite://").is_err());
        assert!(path_of("postgres://x").is_err());
    }
}
