//! Reconciliation's part of the sharded store (SPEC §21), as
//! `store::memory` models it and `store::sql_operator` writes it in SQL:
//! a question's answer recorded and acted on (one script on the record's
//! slot, made durable as a claim is), the questions read back for the
//! history, and the background's take of a route's due records: each
//! bucket's due ambiguous records read (routes × 256 small reads,
//! concurrently), then each one's mark taken by a script of its own on its
//! slot.

use super::decode::AttemptRow;
use super::keys::Bucket;
use super::operator::eval_read;
use super::{driver, scripts, ValkeyStore};
use crate::store::{
    state_of, Attempt, Learned, QuestionBatch, Reconciliation, ResolveOutcome, StoreError,
};

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

/// A question's row as the list keeps it: an attempt's row with its
/// number.
#[derive(serde::Serialize, serde::Deserialize)]
struct Row {
    attempt: String,
    #[serde(flatten)]
    row: AttemptRow,
}

impl Row {
    /// The row of the question `req` records: asked from `started_at`,
    /// answered `now`.
    fn of(req: &Reconciliation<'_>) -> Row {
        Row {
            attempt: req.attempts.to_string(),
            row: AttemptRow {
                started_at: req.started_at.to_string(),
                ended_at: Some(req.now.to_string()),
                status: req.status.map(|s| s.to_string()),
                result: req.learned.result().into(),
                error: Some(req.detail.into()),
                duration_ms: Some((req.now - req.started_at).to_string()),
                instance: Some(req.instance.into()),
            },
        }
    }
}

pub(super) async fn reconciled(
    store: &ValkeyStore,
    req: &Reconciliation<'_>,
) -> Result<ResolveOutcome, StoreError> {
    let b = Bucket::of(req.route, req.event_id);
    let keys = [
        b.record(req.event_id),
        b.attempts(req.event_id),
        b.questions(req.event_id),
        b.by_expiry(),
        b.processing(),
        b.ambiguous(),
    ];
    let (how, status) = match req.learned {
        Learned::Done { status } => ("delivered", status.to_string()),
        Learned::NotDone => ("failed", String::new()),
        Learned::Unknown => ("unknown", String::new()),
    };
    let row = serde_json::to_vec(&Row::of(req)).map_err(|e| corrupt("a question's row", e))?;
    let args: Vec<Vec<u8>> = vec![
        req.event_id.into(),
        req.attempts.to_string().into(),
        req.now.to_string().into(),
        how.into(),
        status.into(),
        row,
    ];
    let value = store
        .write(b.slot, &store.scripts.reconciled, &keys, &args)
        .await?;
    let answer: Vec<String> =
        redis::from_redis_value(value).map_err(|e| corrupt("reconciled", e))?;
    match answer.as_slice() {
        [done] if done == "resolved" => Ok(ResolveOutcome::Resolved),
        [none] if none == "not_found" => Ok(ResolveOutcome::NotFound),
        [not, state] if not == "not_ambiguous" => {
            Ok(ResolveOutcome::NotAmbiguous(state_of(state)?))
        }
        other => Err(corrupt("reconciled", format!("{other:?}"))),
    }
}

/// The questions asked about a record, oldest first.
pub(super) async fn of(
    store: &ValkeyStore,
    route: &str,
    event_id: &str,
) -> Result<Vec<Attempt>, StoreError> {
    let b = Bucket::of(route, event_id);
    let mut conn = store.conn();
    let rows: Vec<String> = redis::cmd("LRANGE")
        .arg(b.questions(event_id))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .map_err(driver)?;
    rows.iter()
        .map(|json| {
            let row: Row = serde_json::from_str(json).map_err(|e| corrupt("a question", e))?;
            row.row.into_attempt(&row.attempt)
        })
        .collect()
}

/// The route's due ambiguous records, each taken by its own
/// compare-and-set; at most `batch.limit` are asked to be taken. Each
/// bucket answers with its due records only ([`scripts::DUE_QUESTIONS`], a
/// read), so that a look finding nothing due writes nothing: the
/// background looks a few times per `every`.
pub(super) async fn take(
    store: &ValkeyStore,
    batch: &QuestionBatch<'_>,
) -> Result<Vec<String>, StoreError> {
    let routes = [batch.route.to_owned()];
    let now = batch.now;
    let found = store
        .every_bucket(&routes, |conn, b| async move {
            let args = vec![b.record_prefix().into(), now.to_string().into()];
            let due = eval_read(conn, scripts::DUE_QUESTIONS, vec![b.ambiguous()], args).await?;
            redis::from_redis_value::<Vec<String>>(due).map_err(|e| corrupt("due questions", e))
        })
        .await?;
    let limit = usize::try_from(batch.limit.max(0)).unwrap_or(usize::MAX);
    let mut taken = Vec::new();
    for id in found.into_iter().flat_map(|(_, ids)| ids) {
        if taken.len() >= limit {
            break;
        }
        let b = Bucket::of(batch.route, &id);
        let args: Vec<Vec<u8>> = vec![
            batch.now.to_string().into(),
            batch.next_at.to_string().into(),
        ];
        let value = store
            .write(
                b.slot,
                &store.scripts.take_question,
                &[b.record(&id)],
                &args,
            )
            .await?;
        let n: i64 = redis::from_redis_value(value).map_err(|e| corrupt("take", e))?;
        if n == 1 {
            taken.push(id);
        }
    }
    Ok(taken)
}
