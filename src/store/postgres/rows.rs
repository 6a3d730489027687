//! The statements both the batches and the store run on one connection
//! (the claim, the settle) and the decoding of their rows.

use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{PgConnection, Postgres, Row};

use crate::claim::{Millis, SettleResult};
use crate::store::sql::{self, Param, Readback};
use crate::store::{ClaimOutcome, ClaimRequest, Record, SettleRequest, StoreError};

/// The claim, on one pooled connection (a batch's or its own).
pub(crate) async fn claim_on(
    conn: &mut PgConnection,
    req: &ClaimRequest<'_>,
) -> Result<ClaimOutcome, StoreError> {
    let lease_until = req.now + req.lease_ms;
    let expires_at = req.now + req.retention_ms;
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
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(row) = row {
            let prev: Option<String> = row.try_get("claimed_from")?;
            return Ok(sql::claimed(
                row.try_get("attempts")?,
                prev.as_deref(),
                lease_until,
            ));
        }
        let row = sqlx::query(sql::CLAIM_READBACK)
            .bind(req.route)
            .bind(req.event_id)
            .fetch_optional(&mut *conn)
            .await?;
        let Some(row) = row else { continue };
        if let Some(outcome) = readback_outcome(&row, req.digest, req.now)? {
            return Ok(outcome);
        }
    }
    Err(StoreError::Unavailable(
        "claim kept racing with other writers".into(),
    ))
}

/// The settle, on one pooled connection.
pub(crate) async fn settle_on(
    conn: &mut PgConnection,
    req: &SettleRequest<'_>,
) -> Result<SettleResult, StoreError> {
    let st = sql::settle_statement(req);
    let done = bind_all(sqlx::query(st.sql), st.params())
        .execute(&mut *conn)
        .await?;
    Ok(sql::settled(done.rows_affected(), st.changed))
}

/// Decides a delivery from a [`sql::CLAIM_READBACK`] row read from PostgreSQL.
fn readback_outcome(
    row: &PgRow,
    digest: &str,
    now: Millis,
) -> Result<Option<ClaimOutcome>, StoreError> {
    readback(row)?.outcome(digest, now)
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
    })
}

/// Decodes a full record row of [`sql::SELECT_RECORD`]:
/// the read-back's columns and the rest.
pub(crate) fn record_from_row(row: &PgRow) -> Result<Record, StoreError> {
    let rb = readback(row)?;
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
