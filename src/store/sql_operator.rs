//! The operator's actions and reads (SPEC §12–14) and the sweeper's hold of
//! ended leases, in SQL written once for both SQL stores: resolving an
//! ambiguous record, the bulk release, pausing a route, a record's attempt
//! history, the ambiguous records per route, and the proxy's release of a
//! claim whose commit was not acknowledged. Each store runs the statements
//! through [`SqlRun`] (several in one transaction), and
//! [`sql_operator_ops!`] writes its `Backend` methods from these functions.

use std::future::Future;

use super::sql::{Param, Statement, Value, HISTORY};
use super::{
    state_of, Attempt, BulkRelease, Learned, QuestionBatch, Reconciliation, Resolution,
    ResolveOutcome, ResolveRequest, StoreError, UnacknowledgedClaim,
};
use crate::claim::{Millis, State};

/// How a SQL store runs the statements below.
pub(crate) trait SqlRun: Sync {
    /// Runs `statements` in one transaction; the rows each changed. A
    /// change of records that caches may hold counts itself (SQLite).
    fn execute(
        &self,
        statements: &[Statement<'_>],
    ) -> impl Future<Output = Result<Vec<u64>, StoreError>> + Send;

    /// The rows of one read, as values.
    fn query(
        &self,
        statement: &Statement<'_>,
    ) -> impl Future<Output = Result<Vec<Vec<Value>>, StoreError>> + Send;
}

/// The operator's `Backend` methods of a store that is [`SqlRun`], each
/// the function of the same name below; expanded inside its `impl
/// Backend` block.
macro_rules! sql_operator_ops {
    () => {
        async fn resolve(
            &self,
            req: &$crate::store::ResolveRequest<'_>,
        ) -> Result<$crate::store::ResolveOutcome, StoreError> {
            $crate::store::sql_operator::resolve(self, req).await
        }

        async fn release_unacknowledged(
            &self,
            claim: &$crate::store::UnacknowledgedClaim<'_>,
        ) -> Result<bool, StoreError> {
            $crate::store::sql_operator::release_unacknowledged(self, claim).await
        }

        async fn history(
            &self,
            route: &str,
            event_id: &str,
        ) -> Result<Vec<$crate::store::Attempt>, StoreError> {
            $crate::store::sql_operator::history(self, route, event_id).await
        }

        async fn release_bulk(
            &self,
            req: &$crate::store::BulkRelease<'_>,
            batch: i64,
        ) -> Result<u64, StoreError> {
            $crate::store::sql_operator::release_bulk(self, req, batch).await
        }

        async fn set_paused(
            &self,
            route: &str,
            paused: bool,
            now: Millis,
        ) -> Result<(), StoreError> {
            $crate::store::sql_operator::set_paused(self, route, paused, now).await
        }

        async fn paused(&self) -> Result<Vec<(String, Millis)>, StoreError> {
            $crate::store::sql_operator::paused(self).await
        }

        async fn ambiguous_counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
            $crate::store::sql_operator::ambiguous_counts(self).await
        }

        async fn hold_ended_leases(&self, now: Millis, limit: i64) -> Result<u64, StoreError> {
            $crate::store::sql_operator::hold_ended_leases(self, now, limit).await
        }

        async fn reconciled(
            &self,
            req: &$crate::store::Reconciliation<'_>,
        ) -> Result<$crate::store::ResolveOutcome, StoreError> {
            $crate::store::sql_operator::reconciled(self, req).await
        }

        async fn take_questions(
            &self,
            batch: &$crate::store::QuestionBatch<'_>,
        ) -> Result<Vec<String>, StoreError> {
            $crate::store::sql_operator::take_questions(self, batch).await
        }
    };
}
pub(crate) use sql_operator_ops;

/// The record's columns an operator's resolve sets. $1 route, $2 event_id,
/// $3 now, $4 status
const RESOLVE_DELIVERED: &str = "\
UPDATE records SET state = 'delivered', last_status = $4, last_error = NULL, lease_until = NULL,
    delivered_at = $3, expires_at = $3 + (expires_at - updated_at), updated_at = $3
WHERE route = $1 AND event_id = $2 AND state = 'ambiguous'";

/// $1 route, $2 event_id, $3 now
const RESOLVE_FAILED: &str = "\
UPDATE records SET state = 'failed', lease_until = NULL,
    last_error = 'resolved by an operator as not done',
    expires_at = $3 + (expires_at - updated_at), updated_at = $3
WHERE route = $1 AND event_id = $2 AND state = 'ambiguous'";

/// Settles an `ambiguous` record by hand; any other record is left as it is.
pub(crate) async fn resolve(
    store: &impl SqlRun,
    req: &ResolveRequest<'_>,
) -> Result<ResolveOutcome, StoreError> {
    let (route, event_id) = (req.route, req.event_id);
    let mut params = vec![
        Param::Text(route),
        Param::Text(event_id),
        Param::Int(req.now),
    ];
    let sql = match req.how {
        Resolution::Delivered { status } => {
            params.push(Param::Int(i64::from(status)));
            RESOLVE_DELIVERED
        }
        Resolution::Failed => RESOLVE_FAILED,
    };
    let changed = store.execute(&[Statement { sql, params }]).await?;
    if changed.first() == Some(&1) {
        return Ok(ResolveOutcome::Resolved);
    }
    let rows = store
        .query(&Statement {
            sql: super::sql::STATE_OF,
            params: vec![Param::Text(route), Param::Text(event_id)],
        })
        .await?;
    match rows.first().and_then(|r| r.first()).and_then(Value::text) {
        None => Ok(ResolveOutcome::NotFound),
        Some(state) => Ok(ResolveOutcome::NotAmbiguous(state_of(state)?)),
    }
}

/// Releases a claim whose commit was not acknowledged (SPEC §16), if it
/// did commit and still holds the record: fenced by its token, so that it
/// never ends another claim. Ends as a failed attempt would (the next
/// delivery claims again). $1 route, $2 event_id, $3 token, $4 now
const RELEASE_UNACKNOWLEDGED: &str = "\
UPDATE records SET state = 'failed', lease_until = NULL, updated_at = $4,
    last_error = 'the claim was not acknowledged by the store; released before any forward'
WHERE route = $1 AND event_id = $2 AND claim_token = $3 AND state = 'processing'";

/// Releases the claim `token` names if it committed and still holds its
/// record: whether it did.
pub(crate) async fn release_unacknowledged(
    store: &impl SqlRun,
    claim: &UnacknowledgedClaim<'_>,
) -> Result<bool, StoreError> {
    let params = vec![
        Param::Text(claim.route),
        Param::Text(claim.event_id),
        Param::Int(claim.token),
        Param::Int(claim.now),
    ];
    let sql = RELEASE_UNACKNOWLEDGED;
    let changed = store.execute(&[Statement { sql, params }]).await?;
    Ok(changed.first() == Some(&1))
}

/// A record's attempts (SPEC §13), oldest first.
pub(crate) async fn history(
    store: &impl SqlRun,
    route: &str,
    event_id: &str,
) -> Result<Vec<Attempt>, StoreError> {
    let rows = store
        .query(&Statement {
            sql: HISTORY,
            params: vec![Param::Text(route), Param::Text(event_id)],
        })
        .await?;
    rows.into_iter().map(attempt_from).collect()
}

fn attempt_from(row: Vec<Value>) -> Result<Attempt, StoreError> {
    let corrupt = || StoreError::Corrupt(format!("an attempt row: {row:?}"));
    let [attempt, started_at, ended_at, status, result, error, duration_ms, instance] =
        <[Value; 8]>::try_from(row.clone()).map_err(|_| corrupt())?;
    Ok(Attempt {
        attempt: attempt.int().ok_or_else(corrupt)?,
        started_at: started_at.int().ok_or_else(corrupt)?,
        ended_at: ended_at.int(),
        status: status.int(),
        result: result.text().ok_or_else(corrupt)?.to_owned(),
        error: error.text().map(str::to_owned),
        duration_ms: duration_ms.int(),
        instance: instance.text().map(str::to_owned),
    })
}

/// The records a bulk release takes, for each state it accepts: of the
/// route ($1), in the window ($3, $4; either may be NULL), changed before
/// the release began ($2: what it released itself is not taken again).
macro_rules! bulk_condition {
    ($state:literal) => {
        concat!(
            "route = $1 AND ",
            $state,
            " AND ($3 IS NULL OR updated_at >= $3) AND ($4 IS NULL OR updated_at < $4)
  AND updated_at < $2"
        )
    };
}

macro_rules! bulk_statements {
    ($state:literal) => {
        (
            concat!(
                "SELECT count(*) FROM records WHERE ",
                bulk_condition!($state)
            ),
            concat!(
                "UPDATE records SET state = 'failed', lease_until = NULL,
    last_error = 'released by operator', expires_at = $2 + (expires_at - updated_at),
    updated_at = $2
WHERE (route, event_id) IN (SELECT route, event_id FROM records WHERE ",
                bulk_condition!($state),
                " LIMIT $5)\n  AND ",
                bulk_condition!($state)
            ),
        )
    };
}

/// One batch of the bulk release (or, dry, the count of all it selects);
/// each record with the fencing of a single release: one that changed
/// meanwhile is left as it is. Never a delivered record, never a live claim.
pub(crate) async fn release_bulk(
    store: &impl SqlRun,
    req: &BulkRelease<'_>,
    batch: i64,
) -> Result<u64, StoreError> {
    let (count, release) = match req.state {
        State::Failed => bulk_statements!("state = 'failed'"),
        State::Ambiguous => bulk_statements!("state = 'ambiguous'"),
        State::Processing => {
            bulk_statements!("state = 'processing' AND (lease_until IS NULL OR lease_until <= $2)")
        }
        State::Delivered => {
            return Err(StoreError::Unavailable(
                "a delivered record is never released in bulk".into(),
            ))
        }
    };
    let mut params = vec![
        Param::Text(req.route),
        Param::Int(req.now),
        Param::OptInt(req.updated_after),
        Param::OptInt(req.updated_before),
    ];
    if req.dry_run {
        let rows = store.query(&Statement { sql: count, params }).await?;
        let n = rows.first().and_then(|r| r.first()).and_then(Value::int);
        return Ok(n.unwrap_or(0) as u64);
    }
    params.push(Param::Int(batch));
    let changed = store
        .execute(&[Statement {
            sql: release,
            params,
        }])
        .await?;
    Ok(changed.first().copied().unwrap_or(0))
}

/// $1 route, $2 now
const PAUSE: &str = "\
INSERT INTO route_pauses (route, paused_at) VALUES ($1, $2) ON CONFLICT (route) DO NOTHING";
/// $1 route
const RESUME: &str = "DELETE FROM route_pauses WHERE route = $1";
const PAUSED: &str = "SELECT route, paused_at FROM route_pauses ORDER BY route";

/// Pauses (or resumes) `route` for every process on the store (SPEC §14).
/// Pausing a paused route keeps its first `paused_at`.
pub(crate) async fn set_paused(
    store: &impl SqlRun,
    route: &str,
    paused: bool,
    now: Millis,
) -> Result<(), StoreError> {
    let statement = if paused {
        Statement {
            sql: PAUSE,
            params: vec![Param::Text(route), Param::Int(now)],
        }
    } else {
        Statement {
            sql: RESUME,
            params: vec![Param::Text(route)],
        }
    };
    store.execute(&[statement]).await.map(drop)
}

/// The paused routes and since when, by name.
pub(crate) async fn paused(store: &impl SqlRun) -> Result<Vec<(String, Millis)>, StoreError> {
    let rows = store
        .query(&Statement {
            sql: PAUSED,
            params: Vec::new(),
        })
        .await?;
    rows.iter()
        .map(|r| text_and_int(r, "route_pauses"))
        .collect()
}

const AMBIGUOUS_COUNTS: &str = "\
SELECT route, count(*) FROM records WHERE state = 'ambiguous' GROUP BY route ORDER BY route";

/// How many records of each route are `ambiguous` (routes with none are
/// absent).
pub(crate) async fn ambiguous_counts(
    store: &impl SqlRun,
) -> Result<Vec<(String, i64)>, StoreError> {
    let rows = store
        .query(&Statement {
            sql: AMBIGUOUS_COUNTS,
            params: Vec::new(),
        })
        .await?;
    rows.iter().map(|r| text_and_int(r, "a count")).collect()
}

fn text_and_int(row: &[Value], what: &str) -> Result<(String, i64), StoreError> {
    match row {
        [Value::Text(t), Value::Int(n)] => Ok((t.clone(), *n)),
        other => Err(StoreError::Corrupt(format!("{what}: {other:?}"))),
    }
}

/// The `processing` records claimed under `hold` whose lease ended by $1,
/// at most $2, the same ones in both statements below.
macro_rules! held_and_ended {
    () => {
        "SELECT route, event_id FROM records
    WHERE state = 'processing' AND hold = 1 AND (lease_until IS NULL OR lease_until <= $1)
    ORDER BY updated_at, route, event_id LIMIT $2"
    };
}

/// Whether any such record exists. $1 now
const ANY_HELD_AND_ENDED: &str = "\
SELECT 1 FROM records
WHERE state = 'processing' AND hold = 1 AND (lease_until IS NULL OR lease_until <= $1) LIMIT 1";

/// Their lost attempts, before they turn `ambiguous`.
const HELD_LOST_ATTEMPTS: &str = concat!(
    "INSERT INTO record_attempts
    (route, event_id, attempt, started_at, ended_at, status, result, error, duration_ms, instance)
SELECT route, event_id, attempts, updated_at, lease_until, NULL, 'ambiguous', '",
    super::sql::lease_lost!(),
    "', NULL, claimed_by
FROM records WHERE (route, event_id) IN (",
    held_and_ended!(),
    ")\nON CONFLICT DO NOTHING"
);

const HELD_ENDED: &str = concat!(
    "UPDATE records SET state = 'ambiguous', lease_until = NULL, last_error = '",
    super::sql::lease_lost!(),
    "',
    expires_at = $1 + (expires_at - updated_at), updated_at = $1
WHERE (route, event_id) IN (",
    held_and_ended!(),
    ")\n  AND state = 'processing' AND hold = 1 AND (lease_until IS NULL OR lease_until <= $1)"
);

/// The sweeper's part of SPEC §12: records claimed under `hold` whose lease
/// ended turn `ambiguous` (their attempt recorded as lost), at most `limit`;
/// how many did.
pub(crate) async fn hold_ended_leases(
    store: &impl SqlRun,
    now: Millis,
    limit: i64,
) -> Result<u64, StoreError> {
    let params = vec![Param::Int(now), Param::Int(limit)];
    // a read first: most sweeps find none, and a write would void SQLite's
    // caches of delivered records in every process for nothing
    let found = store
        .query(&Statement {
            sql: ANY_HELD_AND_ENDED,
            params: vec![Param::Int(now)],
        })
        .await?;
    if found.is_empty() {
        return Ok(0);
    }
    let changed = store
        .execute(&[
            Statement {
                sql: HELD_LOST_ATTEMPTS,
                params: params.clone(),
            },
            Statement {
                sql: HELD_ENDED,
                params,
            },
        ])
        .await?;
    Ok(changed.get(1).copied().unwrap_or(0))
}

/// The record a question asked about, as it was then: `ambiguous`, its
/// attempt count unchanged. $1 route, $2 event_id, $3 attempts
macro_rules! still_asked {
    () => {
        "route = $1 AND event_id = $2 AND state = 'ambiguous' AND attempts = $3"
    };
}

/// The question's row (SPEC §21, §13). $1 route, $2 event_id, $3 attempts,
/// $4 started_at, $5 now, $6 status, $7 result, $8 detail, $9 instance
const QUESTION_ROW: &str = concat!(
    "INSERT INTO record_questions
    (route, event_id, attempt, started_at, ended_at, status, result, error, duration_ms, instance)
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $5 - $4, $9
WHERE EXISTS (SELECT 1 FROM records WHERE ",
    still_asked!(),
    ")"
);

/// Found done. $1 route, $2 event_id, $3 attempts, $4 now, $5 status
const RECONCILED_DELIVERED: &str = concat!(
    "UPDATE records SET state = 'delivered', last_status = $5, last_error = NULL,
    lease_until = NULL, delivered_at = $4, expires_at = $4 + (expires_at - updated_at),
    updated_at = $4
WHERE ",
    still_asked!()
);

/// Found not done. $1 route, $2 event_id, $3 attempts, $4 now
const RECONCILED_FAILED: &str = concat!(
    "UPDATE records SET state = 'failed', lease_until = NULL,
    last_error = 'the consumer said it never acted on it (reconciled)',
    expires_at = $4 + (expires_at - updated_at), updated_at = $4
WHERE ",
    still_asked!()
);

/// Keeps the newest 20 questions of a record. $1 route, $2 event_id
const QUESTIONS_TRIM: &str = "\
DELETE FROM record_questions WHERE route = $1 AND event_id = $2 AND id <= (
    SELECT id FROM record_questions WHERE route = $1 AND event_id = $2
    ORDER BY id DESC LIMIT 1 OFFSET 20)";

/// Records a question's answer and acts on it, in one transaction fenced
/// by the record's state and attempt count.
pub(crate) async fn reconciled(
    store: &impl SqlRun,
    req: &Reconciliation<'_>,
) -> Result<ResolveOutcome, StoreError> {
    let (route, event_id) = (req.route, req.event_id);
    let key = || vec![Param::Text(route), Param::Text(event_id)];
    let fenced = || {
        let mut p = key();
        p.extend([Param::Int(req.attempts), Param::Int(req.now)]);
        p
    };
    let mut row = key();
    row.extend([
        Param::Int(req.attempts),
        Param::Int(req.started_at),
        Param::Int(req.now),
        Param::OptInt(req.status.map(i64::from)),
        Param::Text(req.learned.result()),
        Param::Text(req.detail),
        Param::Text(req.instance),
    ]);
    // the row first: its condition reads the record before the change
    let mut statements = vec![Statement {
        sql: QUESTION_ROW,
        params: row,
    }];
    match req.learned {
        Learned::Done { status } => {
            let mut params = fenced();
            params.push(Param::Int(i64::from(status)));
            statements.push(Statement {
                sql: RECONCILED_DELIVERED,
                params,
            });
        }
        Learned::NotDone => statements.push(Statement {
            sql: RECONCILED_FAILED,
            params: fenced(),
        }),
        Learned::Unknown => {}
    }
    statements.push(Statement {
        sql: QUESTIONS_TRIM,
        params: key(),
    });
    let changed = store.execute(&statements).await?;
    if changed.first() == Some(&1) {
        return Ok(ResolveOutcome::Resolved);
    }
    let rows = store
        .query(&Statement {
            sql: super::sql::STATE_OF,
            params: key(),
        })
        .await?;
    match rows.first().and_then(|r| r.first()).and_then(Value::text) {
        None => Ok(ResolveOutcome::NotFound),
        Some(state) => Ok(ResolveOutcome::NotAmbiguous(state_of(state)?)),
    }
}

/// The route's ambiguous records whose mark passed, oldest change first.
/// $1 route, $2 now, $3 limit
const QUESTIONS_DUE: &str = "\
SELECT event_id FROM records
WHERE route = $1 AND state = 'ambiguous' AND (reconcile_after IS NULL OR reconcile_after <= $2)
ORDER BY updated_at LIMIT $3";

/// One record's mark, taken as a compare-and-set. $1 route, $2 event_id,
/// $3 now, $4 next_at
const TAKE_QUESTION: &str = "\
UPDATE records SET reconcile_after = $4
WHERE route = $1 AND event_id = $2 AND state = 'ambiguous'
  AND (reconcile_after IS NULL OR reconcile_after <= $3)";

/// Takes the route's due ambiguous records: a read, then each record's
/// mark as a compare-and-set of its own (in one transaction); a record
/// another process took meanwhile is not taken.
pub(crate) async fn take_questions(
    store: &impl SqlRun,
    batch: &QuestionBatch<'_>,
) -> Result<Vec<String>, StoreError> {
    let rows = store
        .query(&Statement {
            sql: QUESTIONS_DUE,
            params: vec![
                Param::Text(batch.route),
                Param::Int(batch.now),
                Param::Int(batch.limit),
            ],
        })
        .await?;
    let due: Vec<String> = rows
        .iter()
        .filter_map(|r| r.first().and_then(Value::text).map(str::to_owned))
        .collect();
    if due.is_empty() {
        return Ok(due);
    }
    let statements: Vec<Statement<'_>> = due
        .iter()
        .map(|id| Statement {
            sql: TAKE_QUESTION,
            params: vec![
                Param::Text(batch.route),
                Param::Text(id),
                Param::Int(batch.now),
                Param::Int(batch.next_at),
            ],
        })
        .collect();
    let changed = store.execute(&statements).await?;
    Ok(due
        .into_iter()
        .zip(changed)
        .filter(|(_, n)| *n == 1)
        .map(|(id, _)| id)
        .collect())
}
