//! The embedded default: one SQLite file in WAL mode with `synchronous=FULL`,
//! so a claim is on disk before the request is forwarded.
//!
//! Claims and settles go through one writer task with its own connection
//! (group commit): it takes every operation queued while the previous commit
//! was on its way to disk and runs them in one `BEGIN IMMEDIATE … COMMIT`, so
//! one fsync serves many deliveries. No operation is answered before its batch
//! has committed: durability is that of one commit per claim. Other writes
//! (`events release`, the sweeper, migrations) use a pool of one connection;
//! reads (`events`, `/readyz`, held duplicates) their own small pool. Other
//! processes sharing the file are serialised by SQLite's lock and the busy
//! timeout.

use std::borrow::Cow;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use sqlx::{ConnectOptions, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use super::{ClaimOutcome, ClaimRequest, SettleOutcome, SettleRequest, StoreError};
use crate::claim::{Millis, SettleResult};

/// How long a writer waits for another process's lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request waits for the one write connection of this process.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

pub struct SqliteStore {
    write: SqlitePool,
    read: SqlitePool,
    /// The group-commit writer's queue.
    batcher: mpsc::Sender<Op>,
}

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
}

struct OwnedClaim {
    route: String,
    event_id: String,
    digest: String,
    now: Millis,
    lease_ms: Millis,
    retention_ms: Millis,
}

struct OwnedSettle {
    route: String,
    event_id: String,
    attempt: i64,
    now: Millis,
    retention_ms: Millis,
    delivered: Option<(u16, Option<String>, Option<Vec<u8>>)>,
    failed: Option<(Option<u16>, Option<String>)>,
}

impl OwnedClaim {
    fn new(r: &ClaimRequest<'_>) -> Self {
        OwnedClaim {
            route: r.route.to_owned(),
            event_id: r.event_id.to_owned(),
            digest: r.digest.to_owned(),
            now: r.now,
            lease_ms: r.lease_ms,
            retention_ms: r.retention_ms,
        }
    }
    fn req(&self) -> ClaimRequest<'_> {
        ClaimRequest {
            route: &self.route,
            event_id: &self.event_id,
            digest: &self.digest,
            now: self.now,
            lease_ms: self.lease_ms,
            retention_ms: self.retention_ms,
        }
    }
}

impl OwnedSettle {
    fn new(r: &SettleRequest<'_>) -> Self {
        let (delivered, failed) = match &r.outcome {
            SettleOutcome::Delivered {
                status,
                content_type,
                body,
            } => (
                Some((
                    *status,
                    content_type.map(str::to_owned),
                    body.map(<[u8]>::to_vec),
                )),
                None,
            ),
            SettleOutcome::Failed { status, error } => {
                (None, Some((*status, error.map(str::to_owned))))
            }
        };
        OwnedSettle {
            route: r.route.to_owned(),
            event_id: r.event_id.to_owned(),
            attempt: r.attempt,
            now: r.now,
            retention_ms: r.retention_ms,
            delivered,
            failed,
        }
    }
    fn req(&self) -> SettleRequest<'_> {
        let outcome = match (&self.delivered, &self.failed) {
            (Some((status, ct, body)), _) => SettleOutcome::Delivered {
                status: *status,
                content_type: ct.as_deref(),
                body: body.as_deref(),
            },
            (None, Some((status, error))) => SettleOutcome::Failed {
                status: *status,
                error: error.as_deref(),
            },
            (None, None) => SettleOutcome::Failed {
                status: None,
                error: None,
            },
        };
        SettleRequest {
            route: &self.route,
            event_id: &self.event_id,
            attempt: self.attempt,
            now: self.now,
            retention_ms: self.retention_ms,
            outcome,
        }
    }
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
        let (batcher, queue) = mpsc::channel(4 * MAX_BATCH);
        tokio::spawn(run_writer(opts, queue));
        Ok(SqliteStore {
            write,
            read,
            batcher,
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
                Cow::Borrowed(include_str!("../../migrations/sqlite/0001_records.sql")),
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
        let (tx, rx) = oneshot::channel();
        self.batcher
            .send(Op::Claim(OwnedClaim::new(req), tx))
            .await
            .map_err(|_| writer_gone())?;
        rx.await.map_err(|_| writer_gone())?
    }

    async fn settle_op(&self, req: &SettleRequest<'_>) -> Result<SettleResult, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.batcher
            .send(Op::Settle(OwnedSettle::new(req), tx))
            .await
            .map_err(|_| writer_gone())?;
        rx.await.map_err(|_| writer_gone())?
    }
}

fn writer_gone() -> StoreError {
    StoreError::Unavailable("the SQLite writer stopped".into())
}

/// The group-commit writer: one connection, one transaction per batch of
/// whatever was queued, every result sent only after its batch committed.
async fn run_writer(opts: SqliteConnectOptions, mut queue: mpsc::Receiver<Op>) {
    let mut conn: Option<SqliteConnection> = None;
    let mut batch: Vec<Op> = Vec::with_capacity(MAX_BATCH);
    while let Some(op) = queue.recv().await {
        batch.push(op);
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        if conn.is_none() {
            match opts.connect().await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    fail_all(&mut batch, &StoreError::from(e).to_string());
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected above");
        if let Err(e) = commit_batch(c, &mut batch).await {
            tracing::warn!(error = %e, "SQLite batch failed; reconnecting");
            conn = None; // a fresh connection for the next batch
        }
    }
}

async fn commit_batch(conn: &mut SqliteConnection, batch: &mut Vec<Op>) -> Result<(), StoreError> {
    if let Err(e) = sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await {
        let e = StoreError::from(e);
        fail_all(batch, &e.to_string());
        return Err(e);
    }
    let mut claims = Vec::new();
    let mut settles = Vec::new();
    for op in batch.iter() {
        match op {
            Op::Claim(c, _) => claims.push(SqliteStore::claim_on(conn, &c.req()).await),
            Op::Settle(s, _) => settles.push(SqliteStore::settle_on(conn, &s.req()).await),
        }
    }
    if let Err(e) = sqlx::query("COMMIT").execute(&mut *conn).await {
        let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
        let e = StoreError::from(e);
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
        }
    }
}

super::sql::impl_transitions!(SqliteStore, SqliteConnection);
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
