//! The hot transitions on a connection this process drives itself
//! (rusqlite): a claim, a settle or a duplicate lookup costs the statement
//! and nothing else — no per-statement hand-off to a driver thread, which is
//! what dominated the durable path's profile under sqlx.
//!
//! The SQL is the shared text of [`crate::store::sql`]; its `$N` parameters
//! are bound by number with [`bind_numbered`], as sqlx does.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::types::ToSqlOutput;
use rusqlite::{Connection, OpenFlags, Statement, ToSql};

use super::changes::ChangeCounter;
use crate::claim::{Millis, SettleResult, State};
use crate::store::sql::{self, Readback};
use crate::store::{
    outcome_unknown, state_of, ClaimOutcome, ClaimRequest, Found, ReleaseOutcome, SettleRequest,
    StoreError,
};

/// How a connection will be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// The group-commit writer: `synchronous=FULL`, waits out another
    /// process's write lock (`events release`, a second proxy on the file).
    Writer,
    /// Duplicate lookups, run inline on the request's thread: never writes,
    /// and gives up quickly on the rare busy WAL index instead of blocking
    /// the thread (the request then fails closed with a 503).
    Reader,
}

/// How long the writer waits for another process's lock before failing.
pub(super) const WRITER_BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an inline read may wait (WAL readers almost never wait at all).
const READER_BUSY_TIMEOUT: Duration = Duration::from_millis(200);

/// Opens the file (created and migrated already) for one role.
pub(super) fn open(path: &Path, role: Role) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    match role {
        Role::Writer => {
            conn.busy_timeout(WRITER_BUSY_TIMEOUT)?;
            // journal_mode is a property of the file (set by `create`);
            // synchronous is per connection and is the durability.
            conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = OFF;")?;
            let mode: String = conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(StoreError::Unavailable(format!(
                    "{}: journal_mode is {mode}, expected wal",
                    path.display()
                )));
            }
        }
        Role::Reader => {
            conn.busy_timeout(READER_BUSY_TIMEOUT)?;
            conn.execute_batch("PRAGMA query_only = ON;")?;
        }
    }
    Ok(conn)
}

/// Opens the file for migrations, creating it (and its directory) if
/// missing and putting it in WAL mode, which is a property of the file.
pub(super) fn create(path: &Path) -> Result<Connection, StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::io(format_args!("cannot create {}", dir.display()), e))?;
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    conn.busy_timeout(WRITER_BUSY_TIMEOUT)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Unavailable(format!(
            "{}: journal_mode is {mode}, cannot be set to wal",
            path.display()
        )));
    }
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = OFF;")?;
    Ok(conn)
}

/// Binds `args[N-1]` to every `$N` of the statement, wherever it appears.
pub(super) fn bind_numbered(st: &mut Statement<'_>, args: &[&dyn ToSql]) -> rusqlite::Result<()> {
    bind_each(st, args)
}

/// [`bind_numbered`] for values of one type ([`sql::Param`]s).
pub(super) fn bind_each<T: ToSql>(st: &mut Statement<'_>, args: &[T]) -> rusqlite::Result<()> {
    for i in 1..=st.parameter_count() {
        let n = st
            .parameter_name(i)
            .and_then(|name| name.strip_prefix('$'))
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| (1..=args.len()).contains(n))
            .ok_or(rusqlite::Error::InvalidParameterCount(i, args.len()))?;
        st.raw_bind_parameter(i, &args[n - 1])?;
    }
    Ok(())
}

/// The record's decisive columns ([`sql::CLAIM_READBACK`]), if it exists.
pub(super) fn read_back(
    conn: &Connection,
    route: &str,
    event_id: &str,
) -> Result<Option<Readback>, StoreError> {
    first_row(conn, sql::CLAIM_READBACK, &[&route, &event_id], |row| {
        Ok(Readback {
            state: state_at(row, 0)?,
            lease_until: row.get(1)?,
            body_sha256: row.get(2)?,
            last_status: row.get(3)?,
            replay_status: row.get(4)?,
            replay_content_type: row.get(5)?,
            replay_body: row.get(6)?,
            replay_headers: row.get(7)?,
            send_trace: row.get(8)?,
        })
    })
}

/// The first row `sql` answers with `args` bound, as `read` decodes it.
pub(super) fn first_row<T>(
    conn: &Connection,
    sql: &str,
    args: &[&dyn ToSql],
    read: impl FnOnce(&rusqlite::Row<'_>) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    let mut st = conn.prepare_cached(sql)?;
    bind_numbered(&mut st, args)?;
    let mut rows = st.raw_query();
    rows.next()?.map(read).transpose()
}

/// Column `i` as a record state, read in place.
pub(super) fn state_at(row: &rusqlite::Row<'_>, i: usize) -> Result<State, StoreError> {
    let text = row
        .get_ref(i)?
        .as_str()
        .map_err(|e| StoreError::Corrupt(format!("state: {e}")))?;
    state_of(text)
}

/// A claim of a (route, event ID) that has no record: `CLAIM`'s insert,
/// without its takeover rule. Same parameters.
const CLAIM_NEW: &str = concat!(
    sql::claim_insert!(),
    sql::claim_values!(),
    "ON CONFLICT (route, event_id) DO NOTHING"
);

/// The claim, on the writer's connection inside its batch transaction.
pub(super) fn claim_in(
    conn: &Connection,
    req: &ClaimRequest<'_>,
) -> Result<ClaimOutcome, StoreError> {
    let lease_until = req.now + req.lease_ms;
    let expires_at = req.now + req.retention_ms;
    let hold = i64::from(req.hold);
    let send = req.trace.map(|t| t.stored());
    let params: [&dyn ToSql; 10] = [
        &req.route,
        &req.event_id,
        &req.digest,
        &lease_until,
        &req.now,
        &expires_at,
        &hold,
        &req.instance,
        &req.token,
        &send,
    ];
    // Most claims are of events never seen, which a plain insert decides;
    // a refused one (a duplicate in flight or delivered) is decided by the
    // read-back. Only a record the claim may take over (failed, or its lease
    // expired) runs the upsert: SQLite carries a RETURNING clause through an
    // ephemeral table, a cost the common cases need not pay. Inside the
    // writer's transaction nobody else changes the record between these
    // statements; the loop is for form.
    for _ in 0..4 {
        {
            let mut st = conn.prepare_cached(CLAIM_NEW)?;
            bind_numbered(&mut st, &params)?;
            if st.raw_execute()? == 1 {
                return Ok(sql::claimed(1, None, None, lease_until));
            }
        }
        let Some(found) = read_back(conn, req.route, req.event_id)? else {
            continue;
        };
        let trace = found.trace();
        match found.outcome(req.digest, req.now, req.hold) {
            Found::Answer(outcome) => return Ok(outcome),
            Found::Hold => {
                if hold_expired(conn, req.route, req.event_id, req.now)? {
                    return Ok(outcome_unknown(trace));
                }
                continue;
            }
            Found::Claim => {}
        }
        let mut st = conn.prepare_cached(sql::CLAIM)?;
        bind_numbered(&mut st, &params)?;
        let mut rows = st.raw_query();
        if let Some(row) = rows.next()? {
            let attempt: i64 = row.get(0)?;
            let claimed_from: Option<String> = row.get(2)?;
            let claimed_trace: Option<String> = row.get(3)?;
            // step to the end so the statement is done before the next
            while rows.next()?.is_some() {}
            return Ok(sql::claimed(
                attempt,
                claimed_from.as_deref(),
                claimed_trace.as_deref(),
                lease_until,
            ));
        }
    }
    Err(StoreError::Unavailable(
        "claim kept racing with other writers".into(),
    ))
}

/// Under `hold`, turns a record whose lease ended `ambiguous` and records
/// its lost attempt (inside the writer's transaction); whether it did.
fn hold_expired(
    conn: &Connection,
    route: &str,
    event_id: &str,
    now: Millis,
) -> Result<bool, StoreError> {
    let args: [&dyn ToSql; 3] = [&route, &event_id, &now];
    let mut st = conn.prepare_cached(sql::HOLD_LOST_ATTEMPT)?;
    bind_numbered(&mut st, &args)?;
    st.raw_execute()?;
    let mut st = conn.prepare_cached(sql::HOLD_EXPIRED)?;
    bind_numbered(&mut st, &args)?;
    Ok(st.raw_execute()? == 1)
}

/// The settle and its attempt's row (SPEC §13), on the writer's connection
/// inside its batch transaction: one commit for both.
pub(super) fn settle_in(
    conn: &Connection,
    req: &SettleRequest<'_>,
) -> Result<SettleResult, StoreError> {
    let settle = sql::settle_statement(req);
    let mut st = conn.prepare_cached(settle.sql)?;
    bind_each(&mut st, settle.params())?;
    let result = sql::settled(st.raw_execute()? as u64, settle.changed);
    if !sql::first_delivered(req.attempt, result) {
        let mut st = conn.prepare_cached(sql::ATTEMPT_UPSERT)?;
        bind_each(&mut st, &settle.attempt_params(result))?;
        st.raw_execute()?;
    }
    if req.attempt > sql::ATTEMPTS_KEPT {
        let mut st = conn.prepare_cached(sql::ATTEMPTS_TRIM)?;
        bind_each(&mut st, settle.params())?;
        st.raw_execute()?;
    }
    Ok(result)
}

/// A statement's value as SQLite binds it.
impl ToSql for sql::Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        use sql::Param::*;
        match self {
            Text(t) => t.to_sql(),
            Int(n) => n.to_sql(),
            OptText(t) => t.to_sql(),
            OptInt(n) => n.to_sql(),
            OptBlob(b) => b.to_sql(),
        }
    }
}

/// [`sql::OwnedParam`]s bound as SQLite binds them.
impl ToSql for sql::OwnedParam {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        match self {
            sql::OwnedParam::Text(t) => t.to_sql(),
            sql::OwnedParam::Int(n) => n.to_sql(),
            sql::OwnedParam::Blob(b) => b.to_sql(),
        }
    }
}

/// An operator's statement, owned to cross to a blocking thread.
pub(super) type OwnedStatement = (&'static str, Vec<sql::OwnedParam>);

/// Runs `statements` in one transaction (`ClaimStore::write`); run it
/// [`counted`].
pub(super) fn write_all(
    conn: &Connection,
    statements: &[OwnedStatement],
) -> Result<Vec<u64>, StoreError> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let run = || -> Result<Vec<u64>, StoreError> {
        let mut changed = Vec::with_capacity(statements.len());
        for (sql, params) in statements {
            let mut st = conn.prepare_cached(sql)?;
            bind_each(&mut st, params)?;
            changed.push(st.raw_execute()? as u64);
        }
        conn.execute_batch("COMMIT")?;
        Ok(changed)
    };
    run().inspect_err(|_| {
        let _ = conn.execute_batch("ROLLBACK");
    })
}

/// The rows of one read (`ClaimStore::read`).
pub(super) fn read_rows(
    conn: &Connection,
    (sql, params): &OwnedStatement,
) -> Result<Vec<Vec<sql::Value>>, StoreError> {
    let mut st = conn.prepare_cached(sql)?;
    bind_each(&mut st, params)?;
    let columns = st.column_count();
    let mut rows = st.raw_query();
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let mut values = Vec::with_capacity(columns);
        for i in 0..columns {
            values.push(match row.get_ref(i)? {
                rusqlite::types::ValueRef::Null => sql::Value::Null,
                rusqlite::types::ValueRef::Integer(n) => sql::Value::Int(n),
                rusqlite::types::ValueRef::Text(t) => {
                    sql::Value::Text(String::from_utf8_lossy(t).into_owned())
                }
                other => {
                    return Err(StoreError::Corrupt(format!(
                        "a value of type {}",
                        other.data_type()
                    )))
                }
            });
        }
        out.push(values);
    }
    Ok(out)
}

/// Runs `change` (a release or a sweep: what can change a delivered
/// record) on a connection of its own, counted in the change counter (see
/// `changes`): begun before it runs, ended after it committed. It waits for
/// the counter's lock. Blocking: run it off the async threads.
pub(super) fn counted<T>(
    path: &Path,
    changes: &ChangeCounter,
    change: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let conn = open(path, Role::Writer)?;
    let _under_way = changes.begin().map_err(|e| lock_failed(changes, e))?;
    change(&conn)
}

pub(super) fn lock_failed(changes: &ChangeCounter, e: std::io::Error) -> StoreError {
    StoreError::io(format_args!("cannot lock {}", changes.path().display()), e)
}

/// Operator release (`ClaimStore::release`); run it [`counted`].
pub(super) fn release(
    conn: &Connection,
    route: &str,
    event_id: &str,
    force: bool,
    now: Millis,
) -> Result<ReleaseOutcome, StoreError> {
    // Read the state, then release only that state: a record that changed
    // in between (settled, reclaimed) is read again.
    for _ in 0..4 {
        let before = first_row(conn, sql::STATE_OF, &[&route, &event_id], |row| {
            state_at(row, 0)
        })?;
        let Some(previous) = before else {
            return Ok(ReleaseOutcome::NotFound);
        };
        if previous == State::Delivered && !force {
            return Ok(ReleaseOutcome::RefusedDelivered);
        }
        if previous == State::Delivered {
            let mut st = conn.prepare_cached(sql::MATERIALISE_FIRST)?;
            bind_numbered(&mut st, &[&route, &event_id])?;
            st.raw_execute()?;
        }
        let mut st = conn.prepare_cached(sql::RELEASE)?;
        bind_numbered(&mut st, &[&route, &event_id, &now, &previous.as_str()])?;
        if st.raw_execute()? == 1 {
            return Ok(ReleaseOutcome::Released { previous });
        }
    }
    Err(StoreError::Unavailable(
        "release kept racing with other writers".into(),
    ))
}

/// One slice of the sweep, one statement: in the writer's batch (see
/// `writer::Writer::sweep`), or [`counted`] in a transaction of its own.
pub(super) fn sweep(conn: &Connection, now: Millis, limit: i64) -> Result<u64, StoreError> {
    let mut st = conn.prepare_cached(sql::SWEEP)?;
    bind_numbered(&mut st, &[&now, &limit])?;
    Ok(st.raw_execute()? as u64)
}

/// Idle read connections; a lookup takes one, runs one indexed point read
/// (microseconds, no await) and puts it back. The lock is held only to pop
/// and push.
pub(super) struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

/// More idle read connections than this are closed after use.
const MAX_IDLE_READERS: usize = 8;

impl Readers {
    pub(super) fn new(path: PathBuf) -> Self {
        Readers {
            path,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The record's decisive columns, if it exists.
    pub(super) fn read(&self, route: &str, event_id: &str) -> Result<Option<Readback>, StoreError> {
        self.with(|conn| read_back(conn, route, event_id))
    }

    /// Runs `read` on an idle connection (or a new one).
    pub(super) fn with<T>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = self.take()?;
        let done = read(&conn);
        // a connection that failed is dropped rather than reused
        if done.is_ok() {
            self.put(conn);
        }
        done
    }

    fn take(&self) -> Result<Connection, StoreError> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match idle {
            Some(conn) => Ok(conn),
            None => open(&self.path, Role::Reader),
        }
    }

    fn put(&self, conn: Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
    }

    /// Closes every idle connection (the store is closing).
    pub(super) fn close(&self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|p| p.into_inner()));
        drop(idle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `.cargo/config.toml` sets these for the bundled SQLite; a build that
    /// lost them (another build tool, a Dockerfile that left the file out)
    /// brings back two process-wide mutexes on the lookup path.
    #[test]
    fn sqlite_is_built_without_the_global_mutexes() {
        let conn = Connection::open_in_memory().unwrap();
        let mut st = conn.prepare("PRAGMA compile_options").unwrap();
        let options: Vec<String> = st
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "{options:?}"
        );
        assert!(
            !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
            "{options:?}"
        );
    }
}
