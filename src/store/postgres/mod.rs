//! PostgreSQL: several proxy replicas share one database. The claim and the
//! fenced settle are single statements, correct under READ COMMITTED: the
//! unique key on (route, event_id) makes exactly one concurrent claim win.
//!
//! Failure is fast and recovery needs no restart: the pool connects lazily,
//! a connection that fails is dropped (sqlx pings it on release; a batch
//! dispatcher pings the one it keeps after a failed batch), and every
//! operation is bounded, so with the database unreachable a request gets its
//! 503 within [`ACQUIRE_TIMEOUT`] (refused connections) or
//! `OP_TIMEOUT` (silence; see [`Backend`]), and the first request after the
//! database is back opens a fresh connection. A write already on the wire is
//! given up within that bound only if the server answers no new connection
//! either: a slow commit on a live server is waited for (`silence`).

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, Row};

use super::owned::{OwnedClaim, OwnedSettle};
use super::sql::{self, Statement, Value};
use super::sql_operator::{sql_operator_ops, SqlRun};
use super::{
    Backend, ClaimOutcome, ClaimRequest, Found, ListFilter, Record, ReleaseOutcome, ReleaseRequest,
    SettleOutcome, SettleRequest, StoreError,
};
use crate::claim::{Millis, SettleResult, State};
use rows::{bind_all, record_from_row};

/// Server side: a stuck database (a lock, an overloaded server) must not hold
/// a request forever. Every statement here touches one row or one bounded
/// batch, so anything near this is trouble; the proxy fails closed on it.
/// Migrations run without it (an index build may take minutes).
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(3);
/// Waiting for a pooled connection, including (re)connecting: sqlx keeps
/// retrying a refused connection until this runs out, so it is also how long
/// a request waits before its 503 while the database is down.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a pooled connection may take to answer the ping that shows it
/// in order: when it is handed back, and (on the cold pool) before it is
/// taken out again. One whose query was cut off at a timeout may be
/// waiting for an answer that never comes (a path that lost it); sqlx's
/// own ping on release would wait for it forever and keep its place in the
/// pool, and a pool of one or two places would then be gone for good
/// (`/readyz` 503 long after the database is back). Before use, sqlx's
/// test would wait out the whole [`ACQUIRE_TIMEOUT`] and then fail the
/// acquire; this one closes the connection and lets the acquire open
/// another.
const CONN_PING_TIMEOUT: Duration = Duration::from_secs(1);
/// The readiness ping's statements, on the connection it took: `/readyz`
/// answers within 500 ms (SPEC §5), so a ping slower than that is useful
/// only to the probes that join it (`admin::ready`), while a ping whose
/// answer was lost would hold the next ones off for the whole
/// `OP_TIMEOUT`. Past this the connection is closed, not handed back.
const READY_PING_TIMEOUT: Duration = Duration::from_secs(1);

/// `migrations/postgres`, in order: version, description, SQL.
const MIGRATIONS: [(i64, &str, &str); 8] = [
    (
        1,
        "records",
        include_str!("../../../migrations/postgres/0001_records.sql"),
    ),
    (
        2,
        "failed index",
        include_str!("../../../migrations/postgres/0002_failed_index.sql"),
    ),
    (
        3,
        "vacuum settings",
        include_str!("../../../migrations/postgres/0003_vacuum_settings.sql"),
    ),
    (
        4,
        "ambiguous attempts pauses",
        include_str!("../../../migrations/postgres/0004_ambiguous_attempts_pauses.sql"),
    ),
    (
        5,
        "claim token",
        include_str!("../../../migrations/postgres/0005_claim_token.sql"),
    ),
    (
        6,
        "replay headers",
        include_str!("../../../migrations/postgres/0006_replay_headers.sql"),
    ),
    (
        7,
        "reconcile",
        include_str!("../../../migrations/postgres/0007_reconcile.sql"),
    ),
    (
        8,
        "send trace",
        include_str!("../../../migrations/postgres/0008_send_trace.sql"),
    ),
];

pub struct PostgresStore {
    /// Everything but the hot path: migrations, operator commands, sweeps,
    /// the readiness probe, held duplicates' reads.
    cold: PgPool,
    /// Lookups, claims and delivered settles, in batches, on `hot`.
    batchers: batch::Batchers,
    /// The hot path's connections, used only by tasks on `rt`: a tokio
    /// socket is driven by the runtime that opened it, so a connection
    /// opened by, say, the sweeper's runtime would have every batch on it
    /// woken through that runtime's thread.
    hot: PgPool,
    /// The runtime the store was opened on (`serve`'s store runtime).
    rt: tokio::runtime::Handle,
    /// The URL's hosts, and which one takes writes (SPEC §16).
    hosts: Arc<hosts::Hosts>,
}

/// Connections for the hot path and for the rest, out of `max_connections`:
/// the rest gets a quarter, one or two (at least one each, so a
/// `max_connections` of 1 opens up to 2).
fn split_connections(max: u32) -> (u32, u32) {
    let cold = (max / 4).clamp(1, 2);
    (max.saturating_sub(cold).max(1), cold)
}

/// A pooled connection's ping, within [`CONN_PING_TIMEOUT`]: `Ok(true)`
/// keeps it; an error (one came, or none in time) makes sqlx close it
/// hard, without a goodbye.
async fn in_order(conn: &mut sqlx::PgConnection) -> Result<bool, sqlx::Error> {
    match tokio::time::timeout(CONN_PING_TIMEOUT, conn.ping()).await {
        Ok(pinged) => pinged.map(|()| true),
        Err(_) => Err(sqlx::Error::PoolTimedOut),
    }
}

/// What every connection sets up, whichever host it reaches.
fn session(opts: PgConnectOptions) -> PgConnectOptions {
    opts.options([
        (
            "statement_timeout",
            STATEMENT_TIMEOUT.as_millis().to_string(),
        ),
        // SPEC §6: a claim is durable before the forward, whatever
        // the server's (or the role's, or the database's) default.
        ("synchronous_commit", "on".to_string()),
        // Every hot statement finds its rows by key. Planning a
        // batch's statement afresh cost ~0.3 ms of server CPU, a
        // quarter of its run, so each connection plans a statement
        // once (generic plan). With sequential scans and hash or merge
        // joins off, a plan made while the table was small cannot join
        // a batch's arrays by scanning the whole table later: it uses
        // the primary key whatever the table's size.
        ("plan_cache_mode", "force_generic_plan".to_string()),
        ("enable_seqscan", "off".to_string()),
        ("enable_hashjoin", "off".to_string()),
        ("enable_mergejoin", "off".to_string()),
        // A sweep batch's estimated cost (a join over a large table)
        // made the server compile it with LLVM, 15 ms a batch to
        // save nothing; no statement here is long enough to gain.
        ("jit", "off".to_string()),
    ])
    .application_name("idemgate")
}

mod batch;
mod hosts;
mod rows;
mod silence;

impl PostgresStore {
    pub async fn open(url: &super::StoreUrl, max_connections: u32) -> Result<Self, StoreError> {
        let targets = url
            .postgres_targets()
            .ok_or_else(|| StoreError::UnsupportedUrl(url.redacted()))?;
        let mut sessions = Vec::with_capacity(targets.urls.len());
        for one in &targets.urls {
            let opts = PgConnectOptions::from_str(one)
                .map_err(|e| StoreError::UnsupportedUrl(format!("{url}: {e}")))?;
            sessions.push(session(opts));
        }
        let hosts = hosts::Hosts::new(sessions, targets.connect_timeout);
        let (hot_max, cold_max) = split_connections(max_connections);
        let pool = |max: u32, test_before_acquire: bool| {
            let (arrivals, first) = (Arc::clone(&hosts), hosts.current().clone());
            let options = PgPoolOptions::new()
                .max_connections(max)
                .min_connections(0)
                .acquire_timeout(ACQUIRE_TIMEOUT)
                .test_before_acquire(false)
                .after_release(|conn, _| Box::pin(in_order(conn)))
                .after_connect(move |conn, _| {
                    let hosts = Arc::clone(&arrivals);
                    Box::pin(async move { hosts.check_arrival(conn).await })
                });
            let options = if test_before_acquire {
                options.before_acquire(|conn, _| Box::pin(in_order(conn)))
            } else {
                options
            };
            options.connect_lazy_with(first)
        };
        // The hot path takes a dead connection's error (a 503 the sender
        // retries) over a ping before each batch; its dispatchers keep their
        // connections, so sqlx's ping on release is gone too. The rest is
        // rare, and `/readyz` must not report the database down for a
        // connection that died while it was away: there a connection is
        // pinged before use. In both, a connection handed back is pinged
        // within CONN_PING_TIMEOUT or closed.
        let (hot, cold) = (pool(hot_max, false), pool(cold_max, true));
        hosts.follow([cold.clone(), hot.clone()]);
        Ok(PostgresStore {
            batchers: batch::Batchers::start(&hot, hot_max, &hosts),
            hot,
            rt: tokio::runtime::Handle::current(),
            cold,
            hosts,
        })
    }

    pub(crate) fn migrator() -> Migrator {
        let migrations = MIGRATIONS
            .iter()
            .map(|&(version, description, sql)| {
                let (description, sql) = (Cow::Borrowed(description), Cow::Borrowed(sql));
                Migration::new(version, description, MigrationType::Simple, sql, false)
            })
            .collect();
        Migrator {
            migrations: Cow::Owned(migrations),
            ignore_missing: false,
            locking: true,
            no_tx: false,
        }
    }
}

impl SqlRun for PostgresStore {
    async fn execute(&self, statements: &[Statement<'_>]) -> Result<Vec<u64>, StoreError> {
        let mut tx = self.cold.begin().await?;
        let mut changed = Vec::with_capacity(statements.len());
        for s in statements {
            let done = bind_all(sqlx::query(s.sql), &s.params)
                .execute(&mut *tx)
                .await?;
            changed.push(done.rows_affected());
        }
        tx.commit().await?;
        Ok(changed)
    }

    async fn query(&self, statement: &Statement<'_>) -> Result<Vec<Vec<Value>>, StoreError> {
        let rows = bind_all(sqlx::query(statement.sql), &statement.params)
            .fetch_all(&self.cold)
            .await?;
        rows.iter().map(rows::values).collect()
    }
}

impl Backend for PostgresStore {
    /// Client side, for a whole operation (a claim may be two statements):
    /// catches a connection that went silent, which no server-side timeout
    /// can. Above the statement timeout, so that one fires first when the
    /// server is merely slow.
    const OP_TIMEOUT: Duration = Duration::from_secs(5);

    /// On a connection of its own with no statement timeout, closed after
    /// so the setting never reaches the pool. Replicas starting together
    /// take turns on the migrator's advisory lock.
    async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.cold.acquire().await?.detach();
        let res = async {
            sqlx::query("SET statement_timeout = 0")
                .execute(&mut conn)
                .await?;
            Self::migrator()
                .run_direct(&mut conn)
                .await
                .map_err(|e| StoreError::Migration(e.into()))
        }
        .await;
        let _ = conn.close().await;
        res
    }

    async fn claim(
        &self,
        req: &ClaimRequest<'_>,
        limit: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        self.batchers.claim(OwnedClaim::new(req), limit).await
    }

    async fn settle(
        &self,
        req: &SettleRequest<'_>,
        limit: Duration,
    ) -> Result<SettleResult, StoreError> {
        match req.outcome {
            SettleOutcome::Delivered { .. } => {
                self.batchers.deliver(OwnedSettle::new(req), limit).await
            }
            SettleOutcome::Failed { .. } | SettleOutcome::Ambiguous { .. } => {
                // on the store's runtime, like the batches (see `hot`); run
                // only if taken before the requester withdrew it (`ticket`)
                let (hot, owned) = (self.hot.clone(), OwnedSettle::new(req));
                let hosts = Arc::clone(&self.hosts);
                let (ticket, tx, waiter) = super::ticket::new();
                self.rt.spawn(async move {
                    let res = match hot.acquire().await {
                        Err(e) => {
                            hosts.trouble();
                            Err(e.into())
                        }
                        Ok(_) if !ticket.take() => return,
                        Ok(mut conn) => {
                            let req = owned.req();
                            let run = rows::settle_on(&mut conn, &req);
                            let server = hot.connect_options();
                            match silence::unless_silent(&server, run).await {
                                Ok(Err(StoreError::Sqlx(e))) if hosts::server_lost(&e) => {
                                    hosts.trouble();
                                    drop(conn.detach());
                                    Err(e.into())
                                }
                                Ok(res) => res,
                                Err(gave_up) => {
                                    hosts.trouble();
                                    drop(conn.detach());
                                    Err(StoreError::OutcomeUnknown(gave_up.describe("the settle")))
                                }
                            }
                        }
                    };
                    let _ = tx.send(res);
                });
                waiter.answer(limit).await
            }
        }
    }

    async fn peek(&self, req: &ClaimRequest<'_>) -> Result<Option<ClaimOutcome>, StoreError> {
        let lookup = batch::Lookup {
            route: req.route.to_owned(),
            event_id: req.event_id.to_owned(),
        };
        match self.batchers.lookup(lookup, Self::OP_TIMEOUT).await? {
            Some(found) => Ok(match found.outcome(req.digest, req.now, req.hold) {
                Found::Answer(outcome) => Some(outcome),
                Found::Claim | Found::Hold => None,
            }),
            None => Ok(None),
        }
    }

    /// Deletes one batch of expired records.
    /// Planned afresh at every batch (not a statement the connection keeps):
    /// a connection keeps the generic plan it made on first use, and the
    /// sweep's join is planned for the table's size then. A sweeper that
    /// first ran on an empty table kept a nested loop over the whole primary
    /// key; on a table of millions each batch outlasted the statement
    /// timeout, and nothing expired was deleted again (issue 24's steady
    /// state; `store_contract`'s `sweep_plan_follows_the_table`). Planning
    /// costs about a millisecond; a batch deletes a thousand records.
    async fn sweep(&self, now: Millis, limit: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(sql::SWEEP)
            .persistent(false)
            .bind(now)
            .bind(limit)
            .execute(&self.cold)
            .await?;
        Ok(done.rows_affected())
    }

    /// Operator release. No process caches delivered records of a shared
    /// database (a replica could not learn of a release in time), so there
    /// is nobody to tell.
    async fn release(&self, req: &ReleaseRequest<'_>) -> Result<ReleaseOutcome, StoreError> {
        let (route, event_id, force, now) = (req.route, req.event_id, req.force, req.now);
        // Read the state, then release only that state: a record that
        // changed in between (settled, reclaimed) is read again.
        for _ in 0..4 {
            let before = sqlx::query(sql::STATE_OF)
                .bind(route)
                .bind(event_id)
                .fetch_optional(&self.cold)
                .await?;
            let Some(before) = before else {
                return Ok(ReleaseOutcome::NotFound);
            };
            let previous = super::state_of(before.try_get("state")?)?;
            if previous == State::Delivered && !force {
                return Ok(ReleaseOutcome::RefusedDelivered);
            }
            if previous == State::Delivered {
                // the first attempt's row, before the record's columns change
                sqlx::query(sql::MATERIALISE_FIRST)
                    .bind(route)
                    .bind(event_id)
                    .execute(&self.cold)
                    .await?;
            }
            let done = sqlx::query(sql::RELEASE)
                .bind(route)
                .bind(event_id)
                .bind(now)
                .bind(previous.as_str())
                .execute(&self.cold)
                .await?;
            if done.rows_affected() == 1 {
                return Ok(ReleaseOutcome::Released { previous });
            }
        }
        Err(StoreError::Unavailable(
            "release kept racing with other writers".into(),
        ))
    }

    /// Touches the records table itself, not just the connection, on a
    /// server that takes writes (SPEC §16: a standby answers reads).
    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.cold.acquire().await.inspect_err(|e| {
            if hosts::server_lost(e) {
                self.hosts.trouble();
            }
        })?;
        let writable = async {
            sqlx::query("SELECT 1 FROM records LIMIT 1")
                .execute(&mut *conn)
                .await?;
            hosts::writable(&mut conn).await
        };
        let Ok(writable) = tokio::time::timeout(READY_PING_TIMEOUT, writable).await else {
            // its answer may come late or never: closed, so that it
            // neither waits in the pool nor holds a place there
            drop(conn.detach());
            return Err(StoreError::Unavailable(format!(
                "no answer to the readiness ping within {READY_PING_TIMEOUT:?}"
            )));
        };
        match writable {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.hosts.trouble();
                drop(conn.detach());
                Err(StoreError::Unavailable(hosts::NOT_WRITABLE.into()))
            }
            Err(e) => {
                if hosts::server_lost(&e) {
                    self.hosts.trouble();
                    drop(conn.detach());
                }
                Err(e.into())
            }
        }
    }

    async fn get(&self, route: &str, event_id: &str) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(sql::GET_RECORD)
            .bind(route)
            .bind(event_id)
            .fetch_optional(&self.cold)
            .await?;
        row.as_ref().map(record_from_row).transpose()
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
        let (sql, params) = sql::list_statement(filter);
        let rows = bind_all(sqlx::query(&sql), &params)
            .fetch_all(&self.cold)
            .await?;
        rows.iter().map(record_from_row).collect()
    }

    async fn oldest_processing(&self) -> Result<Vec<(String, Millis)>, StoreError> {
        let rows = sqlx::query(sql::OLDEST_PROCESSING)
            .fetch_all(&self.cold)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("route")?, r.try_get("oldest")?)))
            .collect()
    }

    sql_operator_ops!();

    async fn close(&self) {
        self.hot.close().await;
        self.cold.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::split_connections;

    #[test]
    fn the_hot_path_gets_most_connections_and_each_side_one_at_least() {
        assert_eq!(split_connections(16), (14, 2));
        assert_eq!(split_connections(8), (6, 2));
        assert_eq!(split_connections(4), (3, 1));
        assert_eq!(split_connections(2), (1, 1));
        assert_eq!(split_connections(1), (1, 1));
        assert_eq!(split_connections(0), (1, 1));
    }
}
