//! The embedded default: one SQLite file in WAL mode with `synchronous=FULL`,
//! so a claim is on disk before the request is forwarded.
//!
//! The hot path bypasses sqlx (see `direct`): claims and settles go to one
//! writer thread with its own connection (group commit, see `writer`), and
//! duplicate lookups are one indexed read inline on the request's thread.
//! Other writes (`events release`, the sweeper, migrations) use a sqlx pool
//! of one connection; other reads (`events`, `/readyz`, held duplicates) a
//! small sqlx pool. Other processes sharing the file are serialised by
//! SQLite's lock and the busy timeout.

use std::borrow::Cow;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::{ClaimOutcome, ClaimRequest, SettleRequest, StoreError};
use crate::claim::{Millis, SettleResult};

mod direct;
mod writer;

/// How long a writer waits for another process's lock before failing.
const BUSY_TIMEOUT: Duration = direct::WRITER_BUSY_TIMEOUT;
/// How long a request waits for the one write connection of this process.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct SqliteStore {
    write: SqlitePool,
    read: SqlitePool,
    /// Claims and settles: the group-commit writer thread.
    writer: writer::Writer,
    /// Duplicate lookups.
    readers: direct::Readers,
}

impl SqliteStore {
    pub async fn open(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let path = path_of(url)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        let opts = SqliteConnectOptions::from_str("sqlite://")
            .map_err(|e| StoreError::UnsupportedUrl(e.to_string()))?
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(false);
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(opts.clone())
            .await?;
        let read = SqlitePoolOptions::new()
            .max_connections(max_connections.clamp(1, 4))
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(opts.clone())
            .await?;
        Ok(SqliteStore {
            write,
            read,
            writer: writer::Writer::start(path.clone())?,
            readers: direct::Readers::new(path),
        })
    }

    /// A backstop only: a local file answers within the acquire and busy
    /// timeouts above.
    const OP_TIMEOUT: Duration = Duration::from_secs(20);

    async fn run_migrations(&self) -> Result<(), StoreError> {
        Self::migrator()
            .run(&self.write)
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))
    }

    pub(crate) fn migrator() -> Migrator {
        Migrator {
            migrations: Cow::Owned(vec![Migration::new(
                1,
                Cow::Borrowed("records"),
                MigrationType::Simple,
                Cow::Borrowed(include_str!("../../../migrations/sqlite/0001_records.sql")),
                false,
            )]),
            ignore_missing: false,
            locking: true,
            no_tx: false,
        }
    }
}

/// `sqlite://PATH` (absolute `sqlite:///abs/x.db` or relative `sqlite://data/x.db`,
/// relative to the working directory) or `sqlite:PATH`.
pub fn path_of(url: &str) -> Result<PathBuf, StoreError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| StoreError::UnsupportedUrl(url.to_string()))?;
    let rest = rest.split('?').next().unwrap_or_default();
    if rest.is_empty() {
        return Err(StoreError::UnsupportedUrl(format!("{url}: no file path")));
    }
    Ok(PathBuf::from(rest))
}

impl SqliteStore {
    async fn claim_op(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.writer.claim(req).await
    }

    async fn settle_op(&self, req: &SettleRequest<'_>) -> Result<SettleResult, StoreError> {
        self.writer.settle(req).await
    }

    /// Inline, without an await: one indexed read of a local file.
    async fn peek_op(
        &self,
        route: &str,
        event_id: &str,
        digest: &str,
        now: Millis,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        self.readers.peek(route, event_id, digest, now)
    }

    /// The writer and the inline readers first, the pools last: the last
    /// connection to close checkpoints the WAL into the database file.
    async fn close_all(&self) {
        self.writer.close().await;
        self.readers.close();
        self.write.close().await;
        self.read.close().await;
    }
}

super::sql::impl_claim_store!(SqliteStore);

#[cfg(test)]
mod tests {
    use super::*;

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
