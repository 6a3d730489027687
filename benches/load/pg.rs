//! PostgreSQL: the run's schemas and one-statement queries.

use std::time::Duration;

use crate::processes::lock;
use crate::settings::Settings;
use crate::world::LEFTOVERS;

/// Creates `schema` for this run (dropped at the end, or by the next run
/// after a SIGKILL: name it `load_PID` or `load_PID_WORD`); its store URL.
pub(crate) fn pg_run_schema(s: &Settings, schema: &str) -> Result<String, String> {
    pg_exec(&s.pg_url, &format!("CREATE SCHEMA {schema}"))?;
    lock(&LEFTOVERS)
        .pg
        .push((s.pg_url.clone(), schema.to_string()));
    Ok(pg_schema_url(&s.pg_url, schema))
}

/// The store URL of idemgate on `schema` of the PostgreSQL server at `base`.
pub(crate) fn pg_schema_url(base: &str, schema: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}options=-csearch_path%3D{schema}")
}

pub(crate) fn pg_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs one statement; the rows' first columns as text.
pub(crate) fn pg_exec(base: &str, sql: &str) -> Result<Vec<String>, String> {
    use sqlx::Row;
    pg_runtime().block_on(async {
        let pool = tokio::time::timeout(
            Duration::from_secs(3),
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(base),
        )
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
        let rows = sqlx::query(sql)
            .fetch_all(&pool)
            .await
            .map_err(|e| e.to_string())?;
        pool.close().await;
        Ok(rows
            .iter()
            .map(|r| r.try_get::<String, _>(0).unwrap_or_default())
            .collect())
    })
}

/// The server's WAL insert position in bytes: exact at once, where
/// `pg_stat_wal` lags by up to a backend's stats interval. Cluster-wide, so
/// another session's writes would count too, and `foreign` would not show
/// them (every postgres process's CPU counts as the harness's own).
pub(crate) fn pg_wal_position(base: &str) -> Option<u64> {
    pg_exec(
        base,
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint::text",
    )
    .ok()?
    .first()?
    .parse()
    .ok()
}
