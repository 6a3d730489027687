//! The statements both the batches and the store run on one connection
//! (the claim, the settle) and the decoding of their rows.

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Connection, PgConnection, Postgres, Row};

use crate::claim::{Millis, SettleResult};
use crate::store::sql::{self, Param, Readback, Value};
use crate::store::{
    outcome_unknown, ClaimOutcome, ClaimRequest, Found, Record, SettleOutcome, SettleRequest,
    StoreError, TraceRef,
};

/// The claim, on one pooled connection (a batch's or its own).
pub(crate) async fn claim_on(
    conn: &mut PgConnection,
    req: &ClaimRequest<'_>,
) -> Result<ClaimOutcome, StoreError> {
    let lease_until = req.now + req.lease_ms;
    let expires_at = req.now + req.retention_ms;
    let send = req.trace.map(|t| t.stored());
    // A refused claim is read back and decided; if the record became
    // claimable in between (released, lease ran out), claim again.
    for _ in 0..4 {
        let row = sqlx::query(sql::CLAIM)
            .bind(req.route)
            .bind(req.event_id)
            .bind(req.digest)
            .bind(lease_until)
            .bind(req.now)
            .bind(expires_at)
            .bind(i64::from(req.hold))
            .bind(req.instance)
            .bind(req.token)
            .bind(send.as_deref())
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(row) = row {
            let prev: Option<String> = row.try_get("claimed_from")?;
            let replaced: Option<String> = row.try_get("claimed_trace")?;
            return Ok(sql::claimed(
                row.try_get("attempts")?,
                prev.as_deref(),
                replaced.as_deref(),
                lease_until,
            ));
        }
        let row = sqlx::query(sql::CLAIM_READBACK)
            .bind(req.route)
            .bind(req.event_id)
            .fetch_optional(&mut *conn)
            .await?;
        let Some(row) = row else { continue };
        let found = readback(&row)?;
        let trace = found.trace();
        match found.outcome(req.digest, req.now, req.hold) {
            Found::Answer(outcome) => return Ok(outcome),
            Found::Claim => {}
            Found::Hold => {
                if hold_expired(conn, req.route, req.event_id, req.now).await? {
                    return Ok(outcome_unknown(trace));
                }
            }
        }
    }
    Err(StoreError::Unavailable(
        "claim kept racing with other writers".into(),
    ))
}

/// Under `hold`, turns a record whose lease ended `ambiguous` and records
/// its lost attempt, in one transaction; whether it did (the record may
/// have moved on meanwhile).
async fn hold_expired(
    conn: &mut PgConnection,
    route: &str,
    event_id: &str,
    now: Millis,
) -> Result<bool, StoreError> {
    let mut tx = conn.begin().await?;
    sqlx::query(sql::HOLD_LOST_ATTEMPT)
        .bind(route)
        .bind(event_id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    let done = sqlx::query(sql::HOLD_EXPIRED)
        .bind(route)
        .bind(event_id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(done.rows_affected() == 1)
}

/// A settle statement with its attempt's row and the trim of old ones, as
/// one statement (SPEC §13: no extra round trip). Its one row counts the
/// records the settle changed.
macro_rules! settle_with_attempt {
    ($settle:ident) => {
        concat!(
            "WITH s AS (",
            sql::$settle!(),
            "\n    RETURNING 1),\nw AS (",
            // a first attempt that delivered is its record's own columns
            sql::attempt_upsert!(
                "CASE WHEN EXISTS (SELECT 1 FROM s) THEN $13 ELSE 'stale' END",
                "\n  AND NOT ($3 = 1 AND $13 = 'delivered' AND EXISTS (SELECT 1 FROM s))"
            ),
            "),\nt AS (",
            sql::attempts_trim!(),
            ")\nSELECT count(*) AS settled FROM s"
        )
    };
}

const SETTLE_DELIVERED: &str = settle_with_attempt!(settle_delivered);
const SETTLE_FAILED: &str = settle_with_attempt!(settle_failed);
const SETTLE_AMBIGUOUS: &str = settle_with_attempt!(settle_ambiguous);

/// The settle, on one pooled connection.
pub(crate) async fn settle_on(
    conn: &mut PgConnection,
    req: &SettleRequest<'_>,
) -> Result<SettleResult, StoreError> {
    let st = sql::settle_statement(req);
    let statement = match req.outcome {
        SettleOutcome::Delivered { .. } => SETTLE_DELIVERED,
        SettleOutcome::Failed { .. } => SETTLE_FAILED,
        SettleOutcome::Ambiguous { .. } => SETTLE_AMBIGUOUS,
    };
    let row = bind_all(sqlx::query(statement), st.params())
        .fetch_one(&mut *conn)
        .await?;
    let settled: i64 = row.try_get("settled")?;
    Ok(sql::settled(settled as u64, st.changed))
}

/// The decisive columns of a record ([`sql::CLAIM_READBACK`]'s).
pub(crate) fn readback(row: &PgRow) -> Result<Readback, StoreError> {
    Ok(Readback {
        state: crate::store::state_of(row.try_get("state")?)?,
        lease_until: row.try_get("lease_until")?,
        body_sha256: row.try_get("body_sha256")?,
        last_status: row.try_get("last_status")?,
        replay_status: row.try_get("replay_status")?,
        replay_content_type: row.try_get("replay_content_type")?,
        replay_body: row.try_get("replay_body")?,
        replay_headers: row.try_get("replay_headers")?,
        send_trace: row.try_get("send_trace")?,
    })
}

/// Decodes a full record row of [`sql::SELECT_RECORD`]:
/// the read-back's columns and the rest.
pub(crate) fn record_from_row(row: &PgRow) -> Result<Record, StoreError> {
    let rb = readback(row)?;
    let (trace_id, span_id) = TraceRef::record_ids(rb.trace());
    Ok(Record {
        route: row.try_get("route")?,
        event_id: row.try_get("event_id")?,
        body_sha256: rb.body_sha256,
        state: rb.state,
        attempts: row.try_get("attempts")?,
        lease_until: rb.lease_until,
        last_status: rb.last_status,
        last_error: row.try_get("last_error")?,
        first_seen_at: row.try_get("first_seen_at")?,
        updated_at: row.try_get("updated_at")?,
        delivered_at: row.try_get("delivered_at")?,
        expires_at: row.try_get("expires_at")?,
        replay_status: rb.replay_status,
        replay_content_type: rb.replay_content_type,
        replay_body_bytes: rb.replay_body.map(|b| b.len() as i64),
        trace_id,
        span_id,
        history: None,
    })
}

/// Binds a statement's values ([`sql::Param`]) in order.
pub(crate) fn bind_all<'q>(
    mut query: Query<'q, Postgres, PgArguments>,
    params: &[Param<'q>],
) -> Query<'q, Postgres, PgArguments> {
    for p in params {
        query = match *p {
            Param::Text(t) => query.bind(t),
            Param::Int(n) => query.bind(n),
            Param::OptText(t) => query.bind(t),
            Param::OptInt(n) => query.bind(n),
            Param::OptBlob(b) => query.bind(b),
        };
    }
    query
}

/// A row of an operator's read, as values: integers and text are all
/// idemgate's tables hold besides the replay body, which no such read
/// selects.
pub(crate) fn values(row: &PgRow) -> Result<Vec<Value>, StoreError> {
    use sqlx::{Column, TypeInfo, ValueRef};
    let mut out = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        if row.try_get_raw(i)?.is_null() {
            out.push(Value::Null);
            continue;
        }
        out.push(match column.type_info().name() {
            "INT8" => Value::Int(row.try_get::<i64, _>(i)?),
            "INT4" => Value::Int(i64::from(row.try_get::<i32, _>(i)?)),
            "INT2" => Value::Int(i64::from(row.try_get::<i16, _>(i)?)),
            "TEXT" | "VARCHAR" | "NAME" => Value::Text(row.try_get::<String, _>(i)?),
            other => {
                return Err(StoreError::Corrupt(format!(
                    "column {} of type {other}",
                    column.name()
                )))
            }
        });
    }
    Ok(out)
}
