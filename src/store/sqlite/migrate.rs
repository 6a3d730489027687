//! The SQLite file's migrations (`migrations/sqlite`), run with rusqlite and
//! recorded as sqlx's migrator records them, in `_sqlx_migrations`: the same
//! table, versions, descriptions and SHA-384 checksums of the same files. A
//! file that an earlier idemgate migrated with sqlx opens as it did (what
//! it applied is not applied again, a changed file is refused), and the
//! record stays one that sqlx would read.
//!
//! All pending migrations run in one `BEGIN IMMEDIATE` transaction, after
//! the record is read inside it: two processes starting on one file take
//! turns, and the second finds the work done.

use std::time::Instant;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use sha2::{Digest, Sha384};

/// One numbered file of `migrations/sqlite`.
struct Migration {
    version: i64,
    description: &'static str,
    sql: &'static str,
}

impl Migration {
    /// What sqlx records: SHA-384 of the file's text.
    fn checksum(&self) -> Vec<u8> {
        Sha384::digest(self.sql.as_bytes()).to_vec()
    }
}

/// A [`Migration`] of the file `migrations/sqlite/$file`, its text
/// included in the binary.
macro_rules! migration {
    ($version:literal, $description:literal, $file:literal) => {
        Migration {
            version: $version,
            description: $description,
            sql: include_str!(concat!("../../../migrations/sqlite/", $file)),
        }
    };
}

/// In order; a new file gets the next version, and a file once released
/// never changes (its checksum is on record in every store).
const MIGRATIONS: [Migration; 8] = [
    migration!(1, "records", "0001_records.sql"),
    migration!(2, "failed index", "0002_failed_index.sql"),
    migration!(3, "rowid records", "0003_rowid_records.sql"),
    migration!(
        4,
        "ambiguous attempts pauses",
        "0004_ambiguous_attempts_pauses.sql"
    ),
    migration!(5, "claim token", "0005_claim_token.sql"),
    migration!(6, "replay headers", "0006_replay_headers.sql"),
    migration!(7, "reconcile", "0007_reconcile.sql"),
    migration!(8, "send trace", "0008_send_trace.sql"),
];

/// sqlx's table, as sqlx (0.8) creates it.
const RECORD_TABLE: &str = "
CREATE TABLE IF NOT EXISTS _sqlx_migrations (
    version BIGINT PRIMARY KEY,
    description TEXT NOT NULL,
    installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
    success BOOLEAN NOT NULL,
    checksum BLOB NOT NULL,
    execution_time BIGINT NOT NULL
);";

/// Why the file cannot be migrated; the texts are sqlx's.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(
        "migration {0} is partially applied; fix and remove row from `_sqlx_migrations` table"
    )]
    Dirty(i64),
    #[error("migration {0} was previously applied but is missing in the resolved migrations")]
    VersionMissing(i64),
    #[error("migration {0} was previously applied but has been modified")]
    VersionMismatch(i64),
    #[error("while executing migration {1}: {0}")]
    Execute(#[source] rusqlite::Error, i64),
    #[error("while executing migrations: {0}")]
    Driver(#[from] rusqlite::Error),
}

/// Applies what the record lacks; checks what it has.
pub(super) fn run(conn: &mut Connection) -> Result<(), MigrateError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(RECORD_TABLE)?;
    let dirty: Option<i64> = tx
        .query_row(
            "SELECT version FROM _sqlx_migrations WHERE success = false ORDER BY version LIMIT 1",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if let Some(version) = dirty {
        return Err(MigrateError::Dirty(version));
    }
    let applied: Vec<(i64, Vec<u8>)> = tx
        .prepare("SELECT version, checksum FROM _sqlx_migrations ORDER BY version")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    if let Some((version, _)) = applied
        .iter()
        .find(|(v, _)| !MIGRATIONS.iter().any(|m| m.version == *v))
    {
        return Err(MigrateError::VersionMissing(*version));
    }
    for m in &MIGRATIONS {
        match applied.iter().find(|(v, _)| *v == m.version) {
            Some((_, checksum)) if *checksum == m.checksum() => {}
            Some(_) => return Err(MigrateError::VersionMismatch(m.version)),
            None => apply(&tx, m)?,
        }
    }
    tx.commit()?;
    Ok(())
}

/// Runs one migration and records it as sqlx does.
fn apply(conn: &Connection, m: &Migration) -> Result<(), MigrateError> {
    let started = Instant::now();
    conn.execute_batch(m.sql)
        .map_err(|e| MigrateError::Execute(e, m.version))?;
    let nanos = i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
    conn.execute(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (?1, ?2, TRUE, ?3, ?4)",
        params![m.version, m.description, m.checksum(), nanos],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checksums sqlx 0.8's migrator wrote into a file it migrated
    /// (idemgate before it ran migrations itself), read back with sqlite3.
    const SQLX_CHECKSUMS: [&str; 2] = [
        "9f1be48fb7b3bd3752021424e274812ed209058229987ac3012eeb5a10eccb0ad2203267d55dbbed919532852fd3cf56",
        "b4f7a84204e625dfe5dfee1c55b244cdcc1d4071d7d2974feec46270a96f10ec0ed0205be3472e17a96f1b9bff95ec1f",
    ];

    fn versions(conn: &Connection) -> Vec<(i64, String, bool, String)> {
        conn.prepare(
            "SELECT version, description, success, hex(checksum) FROM _sqlx_migrations ORDER BY version",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
    }

    /// A file as sqlx left it after the first migration only: its table, its
    /// row (the text `installed_on`, the integer `success`).
    fn migrated_by_sqlx_to_version_1() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(RECORD_TABLE).unwrap();
        conn.execute_batch(MIGRATIONS[0].sql).unwrap();
        conn.execute(
            "INSERT INTO _sqlx_migrations VALUES (1, 'records', '2026-12-01 18:02:07', 1, ?1, 443191)",
            [hex::decode(SQLX_CHECKSUMS[0]).unwrap()],
        )
        .unwrap();
        conn
    }

    #[test]
    fn checksums_are_the_ones_sqlx_recorded() {
        for (m, want) in MIGRATIONS.iter().zip(SQLX_CHECKSUMS) {
            assert_eq!(hex::encode(m.checksum()), want, "migration {}", m.version);
        }
    }

    #[test]
    fn a_fresh_file_gets_every_migration_recorded_once() {
        let mut conn = Connection::open_in_memory().unwrap();
        run(&mut conn).unwrap();
        run(&mut conn).unwrap();
        let got = versions(&conn);
        assert_eq!(got.len(), MIGRATIONS.len(), "{got:?}");
        for ((v, d, ok, sum), m) in got.iter().zip(&MIGRATIONS) {
            assert_eq!((*v, d.as_str(), *ok), (m.version, m.description, true));
            assert_eq!(sum.to_lowercase(), hex::encode(m.checksum()));
        }
        conn.execute_batch("SELECT route FROM records WHERE state = 'failed'")
            .unwrap();
        // every column of every migration, although 4 edits the table's
        // text in place and 5 adds a column in the same transaction
        conn.execute_batch(
            "SELECT hold, claimed_by, claim_token, replay_headers, reconcile_after, send_trace,
                    claimed_trace FROM records",
        )
        .unwrap();
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
    }

    /// Migration 4 widens the state's CHECK in place: a connection opened
    /// before it (a running process of the release before) and one opened
    /// after both see the new rule, the old rows stay, and a state outside
    /// the rule is still refused.
    #[test]
    fn the_wider_state_check_reaches_every_connection() {
        let dir = std::env::temp_dir().join(format!("idemgate-m4-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m4.db");
        let _ = std::fs::remove_file(&path);
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
        for m in &MIGRATIONS[..3] {
            conn.execute_batch(m.sql).unwrap();
        }
        let insert = |c: &Connection, id: &str, state: &str| {
            c.execute(
                "INSERT INTO records (route, event_id, body_sha256, state, attempts, first_seen_at, updated_at, expires_at)
                 VALUES ('r', ?1, 'd', ?2, 1, 1, 1, 2)",
                params![id, state],
            )
        };
        insert(&conn, "old", "failed").unwrap();
        let before = Connection::open(&path).unwrap();
        assert!(insert(&before, "x", "ambiguous").is_err(), "the old rule");
        conn.execute_batch(MIGRATIONS[3].sql).unwrap();
        let after = Connection::open(&path).unwrap();
        insert(&before, "a", "ambiguous").unwrap();
        insert(&after, "b", "ambiguous").unwrap();
        assert!(insert(&after, "c", "gone").is_err(), "still a CHECK");
        assert_eq!(count(&after, "records"), 3);
        let check: String = after
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        drop((conn, before, after));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_sqlx_migrated_keeps_what_it_has_and_gets_the_rest() {
        let mut conn = migrated_by_sqlx_to_version_1();
        conn.execute(
            "INSERT INTO records (route, event_id, body_sha256, state, attempts, first_seen_at, updated_at, expires_at)
             VALUES ('r', 'e', 'd', 'delivered', 1, 1, 1, 2)",
            [],
        )
        .unwrap();
        run(&mut conn).unwrap();
        let got = versions(&conn);
        assert_eq!(
            got.iter().map(|v| v.0).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(got[0].3.to_lowercase(), SQLX_CHECKSUMS[0]);
        assert_eq!(count(&conn, "records"), 1, "version 1 is not run again");
        let index = count(&conn, "sqlite_master WHERE name = 'records_failed'");
        assert_eq!(index, 1);
    }

    /// `SELECT count(*) FROM` what `from` says.
    fn count(conn: &Connection, from: &str) -> i64 {
        conn.query_row(&format!("SELECT count(*) FROM {from}"), [], |r| r.get(0))
            .unwrap()
    }

    /// Every column of every record, in key order, each as its SQLite value.
    fn dump(conn: &Connection) -> Vec<String> {
        conn.prepare(
            "SELECT route, event_id, body_sha256, state, attempts, lease_until, last_status,
                    last_error, first_seen_at, updated_at, delivered_at, expires_at, claimed_from,
                    replay_status, replay_content_type, hex(replay_body)
             FROM records ORDER BY route, event_id",
        )
        .unwrap()
        .query_map([], |r| {
            (0..16)
                .map(|i| {
                    let v: rusqlite::types::Value = r.get(i)?;
                    Ok(format!("{v:?}"))
                })
                .collect::<rusqlite::Result<Vec<_>>>()
                .map(|cols| cols.join("|"))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
    }

    /// Migration 3 rewrites the table: nothing of a record may be lost, in
    /// any state, and the key stays unique.
    #[test]
    fn the_rowid_rewrite_keeps_every_record_whole() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(RECORD_TABLE).unwrap();
        for m in &MIGRATIONS[..2] {
            apply(&conn, m).unwrap();
        }
        conn.execute_batch(
            "INSERT INTO records VALUES
             ('a', 'e1', 'd1', 'processing', 2, 50, NULL, NULL, 30, 40, NULL, 90, 'failed', NULL, NULL, NULL),
             ('a', 'e2', 'd2', 'delivered', 1, NULL, 200, NULL, 10, 20, 20, 99, NULL, 201, 'text/plain', x'00ff'),
             ('b', 'e1', 'd3', 'failed', 3, NULL, 503, 'upstream 503', 20, 25, NULL, 95, 'processing', NULL, NULL, NULL)",
        )
        .unwrap();
        let before = dump(&conn);
        run(&mut conn).unwrap();
        assert_eq!(dump(&conn), before);
        let without_rowid = count(
            &conn,
            "sqlite_master WHERE name = 'records' AND sql LIKE '%WITHOUT ROWID%'",
        );
        assert_eq!(without_rowid, 0);
        let dup = conn.execute(
            "INSERT INTO records (route, event_id, body_sha256, state, attempts, first_seen_at, updated_at, expires_at)
             VALUES ('a', 'e1', 'x', 'processing', 1, 1, 1, 2)",
            [],
        );
        assert!(dup.is_err(), "the key is still unique");
        let indexes: Vec<String> = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'records' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            indexes,
            [
                "records_ambiguous",
                "records_expires_at",
                "records_failed",
                "records_first_seen_at",
                "records_key",
                "records_processing"
            ]
        );
    }

    #[test]
    fn a_changed_missing_or_dirty_record_is_refused() {
        let mut conn = migrated_by_sqlx_to_version_1();
        conn.execute("UPDATE _sqlx_migrations SET checksum = x'00'", [])
            .unwrap();
        let e = run(&mut conn).unwrap_err();
        assert!(matches!(e, MigrateError::VersionMismatch(1)), "{e}");

        let mut conn = migrated_by_sqlx_to_version_1();
        conn.execute(
            "INSERT INTO _sqlx_migrations VALUES (9, 'later', '2026-12-01', 1, x'00', 1)",
            [],
        )
        .unwrap();
        let e = run(&mut conn).unwrap_err();
        assert!(matches!(e, MigrateError::VersionMissing(9)), "{e}");

        let mut conn = migrated_by_sqlx_to_version_1();
        conn.execute("UPDATE _sqlx_migrations SET success = 0", [])
            .unwrap();
        let e = run(&mut conn).unwrap_err();
        assert_eq!(
            e.to_string(),
            "migration 1 is partially applied; fix and remove row from `_sqlx_migrations` table"
        );
        assert_eq!(versions(&conn).len(), 1, "nothing was applied");
    }
}
