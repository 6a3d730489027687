//! PostgreSQL: several proxy replicas share one database. The claim and the
//! fenced settle are single statements, correct under READ COMMITTED: the
//! unique key on (route, event_id) makes exactly one concurrent claim win.

use std::borrow::Cow;
use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::StoreError;

/// A stuck database must not hold a request forever.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub struct PostgresStore {
    write: PgPool,
    /// Same pool: PostgreSQL has no single-writer constraint.
    read: PgPool,
}

impl PostgresStore {
    pub async fn open(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let opts = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::UnsupportedUrl(format!("{}: {e}", super::redact_url(url))))?
            .options([(
                "statement_timeout",
                STATEMENT_TIMEOUT.as_millis().to_string(),
            )])
            .application_name("idemgate");
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .min_connections(0)
            .acquire_timeout(CONNECT_TIMEOUT)
            .test_before_acquire(false)
            .connect_lazy_with(opts);
        Ok(PostgresStore {
            write: pool.clone(),
            read: pool,
        })
    }

    pub(crate) fn migrator() -> Migrator {
        Migrator {
            migrations: Cow::Owned(vec![Migration::new(
                1,
                Cow::Borrowed("records"),
                MigrationType::Simple,
                Cow::Borrowed(include_str!("../../migrations/postgres/0001_records.sql")),
                false,
            )]),
            ignore_missing: false,
            locking: true,
            no_tx: false,
        }
    }
}

super::sql::impl_claim_store!(PostgresStore);
