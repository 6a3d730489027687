//! What both scale sections share: a store of a given size (`Sized`) and
//! what it holds, an empty store of this run, an idemgate started on one, the
//! section's inputs (`Section`) and the cache's place. The types `preload.rs`,
//! `steady.rs` and `mod.rs` share, in a file of their own.

use std::path::Path;

use crate::pg::{pg_exec, pg_run_schema};
use crate::report::Report;
use crate::servers::{start_idemgate, Extra};
use crate::settings::Store;
use crate::world::{target_dir, Idemgate, World};

pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub(super) fn gib(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

/// A store the runs of one size load, and what is known of its content.
pub(super) struct Sized {
    pub(super) size: u64,
    pub(super) store: Store,
    /// idemgate's `store.url`.
    pub(super) url: String,
    /// Records first seen before this (ms) are the preloaded ones; 0 for the
    /// empty store.
    pub(super) loaded_at: i64,
    pub(super) sqlite: Option<std::path::PathBuf>,
    /// Schema-qualified table (`schema.records`).
    pub(super) pg_table: Option<String>,
}

/// What a store holds now.
pub(super) struct Content {
    pub(super) records: u64,
    /// Bytes on disk: SQLite db + wal, PostgreSQL `pg_total_relation_size`.
    pub(super) bytes: u64,
    pub(super) detail: String,
    /// `min(expires_at)`, ms (None: no record).
    pub(super) oldest_expiry: Option<i64>,
}

impl Sized {
    /// Records, size and oldest expiry; the records are counted as the
    /// preloaded count plus those first seen since the preload (an index
    /// range), so a 20M store is not scanned after each run.
    pub(super) fn content(&self, s: &crate::settings::Settings) -> Content {
        match (&self.sqlite, &self.pg_table) {
            (Some(db), _) => {
                let c = rusqlite::Connection::open_with_flags(
                    db,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                )
                .expect("the store opens");
                let added: i64 = c
                    .query_row(
                        "SELECT count(*) FROM records WHERE first_seen_at >= ?1",
                        [self.loaded_at],
                        |r| r.get(0),
                    )
                    .unwrap_or(-1);
                let oldest: Option<i64> = c
                    .query_row("SELECT min(expires_at) FROM records", [], |r| r.get(0))
                    .unwrap_or(None);
                let wal = db.with_extension("db-wal");
                let (d, w) = (file_len(db), file_len(&wal));
                Content {
                    records: self.size + added.max(0) as u64,
                    bytes: d + w,
                    detail: format!("db {} + wal {}", gib(d), gib(w)),
                    oldest_expiry: oldest,
                }
            }
            (None, Some(t)) => {
                let row = pg_exec(
                    &s.pg_url,
                    &format!(
                        "SELECT concat_ws(' ', (SELECT count(*) FROM {t} WHERE first_seen_at >= {}), \
                         pg_total_relation_size('{t}'), pg_indexes_size('{t}'), \
                         coalesce((SELECT min(expires_at) FROM {t}), -1))",
                        self.loaded_at
                    ),
                )
                .ok()
                .and_then(|v| v.into_iter().next())
                .unwrap_or_default();
                let f: Vec<i64> = row
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
                let g = |i: usize| f.get(i).copied().unwrap_or(0);
                Content {
                    records: self.size + g(0).max(0) as u64,
                    bytes: g(1) as u64,
                    detail: format!(
                        "table+indexes {} (indexes {})",
                        gib(g(1) as u64),
                        gib(g(2) as u64)
                    ),
                    oldest_expiry: (g(3) >= 0 && !f.is_empty()).then(|| g(3)),
                }
            }
            _ => unreachable!("a store is SQLite or PostgreSQL"),
        }
    }
}

/// An empty store of this run: a fresh SQLite file in the run dir or a
/// schema of its own (dropped at the end).
pub(super) fn fresh_store(
    s: &crate::settings::Settings,
    w: &World,
    store: Store,
    word: &str,
) -> Result<Sized, String> {
    let (url, sqlite, pg_table) = match store {
        Store::Sqlite => {
            let db = w.dir.join(format!("claims-{word}.db"));
            (format!("sqlite://{}", db.display()), Some(db), None)
        }
        Store::Postgres => {
            let schema = format!("load_{}_{word}", std::process::id());
            let url = pg_run_schema(s, &schema)?;
            (url, None, Some(format!("{schema}.records")))
        }
    };
    Ok(Sized {
        size: 0,
        store,
        url,
        loaded_at: 0,
        sqlite,
        pg_table,
    })
}

/// The harness's world, with `g` as the idemgate of `store`.
pub(super) fn world_with(w: &World, g: Idemgate, store: Store) -> World {
    World {
        dir: w.dir.clone(),
        upstream: w.upstream,
        proxy: None,
        sqlite: if store == Store::Sqlite { g } else { w.sqlite },
        pg: (store == Store::Postgres).then_some(g),
        traced: None,
        valkey: None,
        tck: w.tck,
        ncpu: w.ncpu,
    }
}

pub(super) fn start_on(
    s: &crate::settings::Settings,
    w: &World,
    logs: &Path,
    name: String,
    st: &Sized,
    extra: &Extra,
) -> Idemgate {
    let name: &'static str = Box::leak(name.into_boxed_str());
    start_idemgate(
        &w.dir,
        logs,
        name,
        s,
        &st.url,
        w.upstream.addr,
        &["unique"],
        extra,
    )
}

/// What a scale section runs with: the settings, the running world, the
/// log directory, the report it writes to and the run counter.
pub(crate) struct Section<'a> {
    pub s: &'a crate::settings::Settings,
    pub w: &'a World,
    pub logs: &'a Path,
    pub rep: &'a mut Report,
    pub serial: &'a mut usize,
}

/// The directory of the cached preloaded SQLite stores.
pub(super) fn stores_dir() -> std::path::PathBuf {
    target_dir().join("load-stores")
}
