//! The cold reads (`events`, the admin API and console, `/readyz`, a held
//! duplicate's wait) on a reader connection of [`super::direct::Readers`].
//! Blocking: the store runs them on a blocking thread, never on a thread
//! that serves requests (a list may read many rows).

use rusqlite::types::ValueRef;
use rusqlite::{Connection, Row};

use super::direct::{bind_each, first_row, state_at};
use crate::claim::Millis;
use crate::store::sql;
use crate::store::{ListFilter, Record, StoreError, TraceRef};

/// One cheap read that touches the database file itself, not just the
/// connection: on a fresh connection (see `SqliteStore::ping`), the file's
/// header, the schema and the records table's first page, read from disk.
pub(super) fn ping(conn: &Connection) -> Result<(), StoreError> {
    let mut st = conn.prepare("SELECT 1 FROM records LIMIT 1")?;
    let mut rows = st.raw_query();
    while rows.next()?.is_some() {}
    Ok(())
}

/// The record, if it exists.
pub(super) fn get(
    conn: &Connection,
    route: &str,
    event_id: &str,
) -> Result<Option<Record>, StoreError> {
    first_row(conn, sql::GET_RECORD, &[&route, &event_id], record)
}

/// The records `filter` asks for, newest first.
pub(super) fn list(conn: &Connection, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
    let (text, params) = sql::list_statement(filter);
    let mut st = conn.prepare_cached(&text)?;
    bind_each(&mut st, &params)?;
    let mut rows = st.raw_query();
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(record(row)?);
    }
    Ok(out)
}

/// Per route, the `updated_at` of the oldest `processing` record.
pub(super) fn oldest_processing(conn: &Connection) -> Result<Vec<(String, Millis)>, StoreError> {
    let mut st = conn.prepare_cached(sql::OLDEST_PROCESSING)?;
    let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// A row of [`sql::SELECT_RECORD`], by column position; the replay body is
/// measured where it lies, not copied.
fn record(row: &Row<'_>) -> Result<Record, StoreError> {
    let replay_body_bytes = match row.get_ref(14)? {
        ValueRef::Null => None,
        ValueRef::Blob(b) | ValueRef::Text(b) => Some(b.len() as i64),
        other => {
            return Err(StoreError::Corrupt(format!(
                "replay_body of type {}",
                other.data_type()
            )))
        }
    };
    let send_trace: Option<String> = row.get(16)?;
    let (trace_id, span_id) = TraceRef::record_ids(TraceRef::from_column(send_trace.as_deref()));
    Ok(Record {
        route: row.get(0)?,
        event_id: row.get(1)?,
        body_sha256: row.get(2)?,
        state: state_at(row, 3)?,
        attempts: row.get(4)?,
        lease_until: row.get(5)?,
        last_status: row.get(6)?,
        last_error: row.get(7)?,
        first_seen_at: row.get(8)?,
        updated_at: row.get(9)?,
        delivered_at: row.get(10)?,
        expires_at: row.get(11)?,
        replay_status: row.get(12)?,
        replay_content_type: row.get(13)?,
        replay_body_bytes,
        trace_id,
        span_id,
        history: None,
    })
}
