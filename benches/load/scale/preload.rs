//! The preloaded stores of `LOAD_PRELOAD`: built once, cached under
//! `target/load-stores/` (SQLite: `sqlite-N.db` and `sqlite-N.marker`) and
//! in the PostgreSQL schema `load_preload_N` (marker: its table
//! `load_marker`), and reused while their marker matches.
//!
//! The table is made by idemgate itself (`idemgate migrate`), then filled in
//! one statement per million records, in the order records arrive in a real
//! store: `first_seen_at` rising over the 7 days before the preload, event
//! IDs random (32 hex), so the primary key's B-tree is split as random
//! claims split it and not packed as a sorted bulk load would be. Every
//! record is `delivered` on route `unique` (the route the claims of (r) and
//! (p) hit), attempt 1, status 200, a random digest, settled 40 ms after its
//! claim; `expires_at` is its claim + 14 days, so the expiries are spread
//! over the 7 days that start a week after the preload: the sweeper deletes
//! none of them during a run, and the cache stays usable for a week (then
//! it is rebuilt).
//!
//! The marker holds the count, a hash of `migrations/<store>/` (a schema
//! change rebuilds) and the preload time. The runs add records; they are
//! not kept: before the runs, every record first seen since the preload is
//! deleted again (an index range on `first_seen_at`), so each harness run
//! starts from the same N records without copying a multi-GiB file. The free
//! pages those deletes leave are reused by the next run's inserts.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::stores::{now_ms, stores_dir, Sized};
use crate::pg::{pg_exec, pg_schema_url};
use crate::report::Report;
use crate::settings::Store;

const DAY_MS: i64 = 86_400_000;
/// Records per fill statement (and progress line).
const CHUNK: u64 = 1_000_000;
/// Said of a store built in this run. The first harness run after a build
/// measured 0.56-0.76 x the empty store (5M and 20M), where runs on the same
/// stores, cached, measured 0.76-1.04, and it read more pages per request
/// (docs/performance.md, eighteenth round; the cause is not known).
const JUST_BUILT: &str =
    "  NOTE: the store was built in this run; runs on a store just built have \
     measured slower than on the same store cached: compare builds on cached stores";

/// A cache is rebuilt this long before its first record would expire.
const MARGIN_MS: i64 = 3_600_000;

/// A hash of the migrations idemgate applies to `store`.
fn migrations_hash(store: Store) -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(store.name());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    let mut h = Sha256::new();
    for f in files {
        h.update(f.file_name().unwrap().as_encoded_bytes());
        h.update(std::fs::read(&f).unwrap_or_default());
    }
    hex::encode(&h.finalize()[..8])
}

fn marker_text(n: u64, hash: &str, loaded_at: i64) -> String {
    format!("count={n} migrations={hash} loaded_at={loaded_at}")
}

/// The preload time of a marker that matches `n` and `hash`, if its records
/// are still far from expiring.
fn marker_loaded_at(text: &str, n: u64, hash: &str) -> Option<i64> {
    let loaded_at: i64 = text
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("loaded_at="))?
        .parse()
        .ok()?;
    let fresh = now_ms() < loaded_at + 7 * DAY_MS - MARGIN_MS;
    (text.trim() == marker_text(n, hash, loaded_at) && fresh).then_some(loaded_at)
}

/// The preloaded store of `n` records: reused from the cache, or built.
pub(super) fn cached(
    s: &crate::settings::Settings,
    store: Store,
    n: u64,
    rep: &mut Report,
) -> Result<Sized, String> {
    match store {
        Store::Sqlite => sqlite(s, n, rep),
        Store::Postgres => postgres(s, n, rep),
    }
}

fn migrate(s: &crate::settings::Settings, url: &str) -> Result<(), String> {
    let out = crate::processes::command(&s.bin)
        .args(["migrate", "--store", url])
        .output()
        .map_err(|e| format!("idemgate migrate: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "idemgate migrate failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn sqlite_files(db: &Path) -> [std::path::PathBuf; 3] {
    [
        db.to_path_buf(),
        db.with_extension("db-wal"),
        db.with_extension("db-shm"),
    ]
}

fn sqlite(s: &crate::settings::Settings, n: u64, rep: &mut Report) -> Result<Sized, String> {
    let dir = stores_dir();
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let db = dir.join(format!("sqlite-{n}.db"));
    let marker = dir.join(format!("sqlite-{n}.marker"));
    let hash = migrations_hash(Store::Sqlite);
    let url = format!("sqlite://{}", db.display());
    let known = std::fs::read_to_string(&marker)
        .ok()
        .and_then(|t| marker_loaded_at(&t, n, &hash));
    let loaded_at = match known {
        Some(at) if db.exists() => {
            let t = std::time::Instant::now();
            let c = rusqlite::Connection::open(&db).map_err(|e| e.to_string())?;
            let gone = c
                .execute("DELETE FROM records WHERE first_seen_at >= ?1", [at])
                .map_err(|e| e.to_string())?;
            let _ = c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
            rep.line(format!(
                "  sqlite preload {n}: cached {} ({} records of earlier runs deleted in {:.1} s)",
                db.display(),
                gone,
                t.elapsed().as_secs_f64()
            ));
            at
        }
        _ => {
            let _ = std::fs::remove_file(&marker);
            for f in sqlite_files(&db) {
                let _ = std::fs::remove_file(f);
            }
            let t = std::time::Instant::now();
            migrate(s, &url)?;
            let loaded_at = now_ms();
            fill_sqlite(&db, n, loaded_at)?;
            std::fs::write(&marker, marker_text(n, &hash, loaded_at)).map_err(|e| e.to_string())?;
            rep.line(format!(
                "  sqlite preload {n}: built {} in {:.0} s",
                db.display(),
                t.elapsed().as_secs_f64()
            ));
            rep.line(JUST_BUILT);
            loaded_at
        }
    };
    // The fill runs without a journal or fsync, and the deletions above are
    // left to the OS too: written back during the runs, those pages would
    // stall the measured fsyncs (p99 of 130-200 ms at 5M and 20M in the run
    // just after a build).
    let t = std::time::Instant::now();
    let synced = std::process::Command::new("sync").status();
    rep.line(format!(
        "  sqlite preload {n}: written back (sync: {}) in {:.1} s",
        synced.map_or_else(|e| e.to_string(), |s| s.to_string()),
        t.elapsed().as_secs_f64()
    ));
    Ok(Sized {
        size: n,
        store: Store::Sqlite,
        url,
        loaded_at,
        sqlite: Some(db),
        pg_table: None,
    })
}

/// The fill statement's values: $lo..=$hi the record numbers, then the first
/// record's claim time and the step between claims (ms).
fn times(n: u64, loaded_at: i64) -> (i64, i64) {
    let span = 7 * DAY_MS;
    (loaded_at - span, (span / n.max(1) as i64).max(1))
}

fn fill_sqlite(db: &Path, n: u64, loaded_at: i64) -> Result<(), String> {
    let e = |e: rusqlite::Error| e.to_string();
    let c = rusqlite::Connection::open(db).map_err(e)?;
    // No journal while filling (a crash leaves no marker: rebuilt next
    // time), a page cache of up to 4 GiB; WAL again at the end, as idemgate
    // keeps it.
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .map_err(e)?;
    c.query_row("PRAGMA journal_mode = OFF", [], |_| Ok(()))
        .map_err(e)?;
    c.execute_batch("PRAGMA synchronous = OFF; PRAGMA cache_size = -4194304;")
        .map_err(e)?;
    let (t0, step) = times(n, loaded_at);
    let sql = format!(
        "WITH RECURSIVE c(x) AS (SELECT ?1 UNION ALL SELECT x + 1 FROM c WHERE x < ?2)
         INSERT OR IGNORE INTO records (route, event_id, body_sha256, state, attempts, lease_until,
             last_status, last_error, first_seen_at, updated_at, delivered_at, expires_at)
         SELECT 'unique', lower(hex(randomblob(16))), lower(hex(randomblob(32))), 'delivered', 1,
             NULL, 200, NULL, {t0} + x * {step}, {t0} + x * {step} + 40, {t0} + x * {step} + 40,
             {t0} + x * {step} + {} FROM c",
        14 * DAY_MS
    );
    let t = std::time::Instant::now();
    let mut lo = 0;
    while lo < n {
        let hi = (lo + CHUNK).min(n) - 1;
        c.execute(&sql, [lo as i64, hi as i64]).map_err(e)?;
        lo = hi + 1;
        println!(
            "load: sqlite preload {n}: {lo} records, {:.0} s",
            t.elapsed().as_secs_f64()
        );
    }
    c.query_row(&format!("PRAGMA journal_mode = {mode}"), [], |_| Ok(()))
        .map_err(e)?;
    let got: i64 = c
        .query_row("SELECT count(*) FROM records", [], |r| r.get(0))
        .map_err(e)?;
    if got as u64 != n {
        return Err(format!("the fill made {got} records, not {n}"));
    }
    Ok(())
}

fn pg_schema(n: u64) -> String {
    format!("load_preload_{n}")
}

fn postgres(s: &crate::settings::Settings, n: u64, rep: &mut Report) -> Result<Sized, String> {
    let schema = pg_schema(n);
    let table = format!("{schema}.records");
    let hash = migrations_hash(Store::Postgres);
    let url = pg_schema_url(&s.pg_url, &schema);
    let known = pg_exec(
        &s.pg_url,
        &format!(
            "SELECT format('count=%s migrations=%s loaded_at=%s', count, migrations, loaded_at) \
             FROM {schema}.load_marker"
        ),
    )
    .ok()
    .and_then(|v| v.into_iter().next())
    .and_then(|t| marker_loaded_at(&t, n, &hash));
    let loaded_at = match known {
        Some(at) => {
            let t = std::time::Instant::now();
            // on the schema's own search path: the delete's triggers (the
            // attempts and questions go with their record) name their
            // tables unqualified
            let gone = pg_exec(
                &url,
                &format!(
                    "WITH d AS (DELETE FROM {table} WHERE first_seen_at >= {at} RETURNING 1) \
                     SELECT count(*)::text FROM d"
                ),
            )?
            .join("");
            if gone != "0" {
                pg_exec(&s.pg_url, &format!("VACUUM (ANALYZE) {table}"))?;
            }
            rep.line(format!(
                "  postgres preload {n}: cached schema {schema} ({gone} records of earlier runs deleted in {:.1} s)",
                t.elapsed().as_secs_f64()
            ));
            at
        }
        None => pg_build(s, n, rep, (&schema, &table, &hash, &url))?,
    };
    Ok(Sized {
        size: n,
        store: Store::Postgres,
        url,
        loaded_at,
        sqlite: None,
        pg_table: Some(table),
    })
}

/// Builds the preloaded schema of `n` records, and its marker; when it was loaded.
fn pg_build(
    s: &crate::settings::Settings,
    n: u64,
    rep: &mut Report,
    (schema, table, hash, url): (&str, &str, &str, &str),
) -> Result<i64, String> {
    let t = std::time::Instant::now();
    pg_exec(
        &s.pg_url,
        &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
    )?;
    pg_exec(&s.pg_url, &format!("CREATE SCHEMA {schema}"))?;
    migrate(s, url)?;
    let loaded_at = now_ms();
    let (t0, step) = times(n, loaded_at);
    let mut lo = 0;
    while lo < n {
        let hi = (lo + CHUNK).min(n) - 1;
        pg_exec(
            &s.pg_url,
            &format!(
                "INSERT INTO {table} (route, event_id, body_sha256, state, attempts, lease_until,
                     last_status, last_error, first_seen_at, updated_at, delivered_at, expires_at)
                 SELECT 'unique', md5(random()::text || x::text),
                     md5(random()::text) || md5(random()::text), 'delivered', 1, NULL, 200, NULL,
                     {t0} + x * {step}, {t0} + x * {step} + 40, {t0} + x * {step} + 40,
                     {t0} + x * {step} + {}
                 FROM generate_series({lo}::bigint, {hi}::bigint) AS x
                 ON CONFLICT DO NOTHING",
                14 * DAY_MS
            ),
        )?;
        lo = hi + 1;
        println!(
            "load: postgres preload {n}: {lo} records, {:.0} s",
            t.elapsed().as_secs_f64()
        );
    }
    pg_exec(&s.pg_url, &format!("VACUUM (ANALYZE) {table}"))?;
    let got = pg_exec(&s.pg_url, &format!("SELECT count(*)::text FROM {table}"))?.join("");
    if got != n.to_string() {
        return Err(format!("the fill made {got} records, not {n}"));
    }
    pg_exec(
        &s.pg_url,
        &format!(
            "CREATE TABLE {schema}.load_marker AS SELECT {n}::bigint AS count, \
             '{hash}'::text AS migrations, {loaded_at}::bigint AS loaded_at"
        ),
    )?;
    rep.line(format!(
        "  postgres preload {n}: built schema {schema} in {:.0} s",
        t.elapsed().as_secs_f64()
    ));
    Ok(loaded_at)
}

/// `LOAD_PRELOAD_DROP=1`: removes the cached stores (files and schemas).
pub(crate) fn drop_cached(s: &crate::settings::Settings, rep: &mut Report) {
    let dir = stores_dir();
    let files = std::fs::read_dir(&dir).map_or(0, |d| d.count());
    let _ = std::fs::remove_dir_all(&dir);
    let schemas = pg_exec(
        &s.pg_url,
        "SELECT nspname::text FROM pg_namespace WHERE nspname ~ '^load_preload_[0-9]+$'",
    )
    .unwrap_or_default();
    for schema in &schemas {
        let _ = pg_exec(
            &s.pg_url,
            &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
        );
    }
    rep.line(format!(
        "LOAD_PRELOAD_DROP: removed {} ({files} files) and the schemas {schemas:?}",
        dir.display()
    ));
}
