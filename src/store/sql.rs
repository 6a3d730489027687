//! The SQL both stores share: SQLite (3.35+) and PostgreSQL accept the same
//! `INSERT … ON CONFLICT … DO UPDATE … WHERE … RETURNING`, `$N` parameters and
//! row-value `IN`, so each transition is written once, here.

use super::{SettleOutcome, SettleRequest};
use crate::claim::SettleResult;

/// A value bound to a statement; each SQL store binds it with its own
/// driver.
#[derive(Debug, Clone, Copy)]
pub enum Param<'a> {
    Text(&'a str),
    Int(i64),
    OptText(Option<&'a str>),
    OptInt(Option<i64>),
    OptBlob(Option<&'a [u8]>),
}

/// One statement and its values, for the operator's actions and reads
/// (`sql_operator`), which both SQL stores run as they are.
#[derive(Debug, Clone)]
pub struct Statement<'a> {
    pub sql: &'static str,
    pub params: Vec<Param<'a>>,
}

/// A column's value as an operator's read returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
}

impl Value {
    pub fn int(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }

    pub fn text(&self) -> Option<&str> {
        match self {
            Value::Text(t) => Some(t),
            _ => None,
        }
    }
}

/// What an attempt's `error` says when its lease ended without an answer:
/// one text for every statement that writes or reads it.
macro_rules! lease_lost {
    () => {
        "lease ended without an answer"
    };
}
pub(crate) use lease_lost;

/// The start of every claim statement: the columns a new record gets.
/// `send_trace` is the claim's send (SPEC §19), NULL when not traced.
macro_rules! claim_insert {
    () => {
        "INSERT INTO records (route, event_id, body_sha256, state, attempts, lease_until,
                     first_seen_at, updated_at, expires_at, hold, claimed_by, claim_token,
                     send_trace)\n"
    };
}
pub(crate) use claim_insert;

/// A new record's values for [`claim_insert!`], from the claim's parameters.
macro_rules! claim_values {
    () => {
        "VALUES ($1, $2, $3, 'processing', 1, $4, $5, $5, $6, $7, $8, $9, $10)\n"
    };
}
pub(crate) use claim_values;

/// The reclaim rule every claim statement ends with (before `RETURNING`):
/// take over a record with the same digest that failed, or is processing
/// with an expired lease unless the claim is made under `on_ambiguous:
/// hold` (`excluded.hold`). Mirrors `claim::decide`. Taking over an expired
/// lease records the lost attempt (the trigger `records_lease_lost`).
/// The claim's send replaces the record's latest (SPEC §19); the one it
/// replaced is kept in `claimed_trace` (SET's right-hand sides read the
/// row as it was, as `claimed_from` does) for the `RETURNING`, which
/// gives new values only.
macro_rules! claim_on_conflict {
    () => {
        "ON CONFLICT (route, event_id) DO UPDATE SET
    state = 'processing',
    attempts = records.attempts + 1,
    lease_until = excluded.lease_until,
    updated_at = excluded.updated_at,
    expires_at = excluded.expires_at,
    claimed_from = records.state,
    hold = excluded.hold,
    claimed_by = excluded.claimed_by,
    claim_token = excluded.claim_token,
    claimed_trace = records.send_trace,
    send_trace = excluded.send_trace
WHERE records.body_sha256 = excluded.body_sha256
  AND (records.state = 'failed'
       OR (records.state = 'processing' AND excluded.hold = 0
           AND (records.lease_until IS NULL OR records.lease_until <= excluded.updated_at)))\n"
    };
}
pub(crate) use claim_on_conflict;

/// Claim: insert a fresh record, or take over one that is reclaimable with the
/// same digest (failed, or processing with an expired lease). Mirrors
/// `claim::decide`; a refused claim returns no row.
/// $1 route, $2 event_id, $3 digest, $4 lease_until, $5 now, $6 expires_at,
/// $7 hold (0/1), $8 instance, $9 the claim's token, $10 the claim's send
/// ([`TraceRef::stored`](super::TraceRef::stored), or NULL). Returns the
/// send a reclaim replaced as `claimed_trace` (for a new record, NULL).
pub const CLAIM: &str = concat!(
    claim_insert!(),
    claim_values!(),
    claim_on_conflict!(),
    "RETURNING attempts, lease_until, claimed_from, claimed_trace"
);

/// What a refused claim needs to know. $1 route, $2 event_id
pub const CLAIM_READBACK: &str = "\
SELECT state, lease_until, body_sha256, last_status, replay_status, replay_content_type, replay_body,
       replay_headers, send_trace
FROM records WHERE route = $1 AND event_id = $2";

/// Every settle statement takes the same values ([`settle_statement`]):
/// $1 route, $2 event_id, $3 attempt, $4 now (the attempt's end),
/// $5 expires_at, $6 status, $7 error, $8 replay status, $9 replay content
/// type, $10 replay body, $11 the attempt's start, $12 instance, $13 the
/// attempt's result when the settle changed the record, $14 the attempt's
/// error (no upstream address: SPEC §13), $15 the replayed headers (SPEC
/// §22; written by the delivered settle alone, so a process of the release
/// before, which never names the column, leaves it NULL).
macro_rules! settle_delivered {
    () => {
        "UPDATE records SET state = 'delivered', last_status = $6, last_error = NULL, lease_until = NULL,
    delivered_at = $4, updated_at = $4, expires_at = $5,
    replay_status = $8, replay_content_type = $9, replay_body = $10, replay_headers = $15
WHERE route = $1 AND event_id = $2 AND state <> 'delivered'"
    };
}
pub(crate) use settle_delivered;

/// Delivered is final and may come from any attempt; the first one wins.
pub const SETTLE_DELIVERED: &str = settle_delivered!();

/// A settle that ends a live claim without delivering it: fenced, only the
/// attempt that holds the claim may end it; `$state` is what it ends in.
macro_rules! settle_fenced {
    ($state:literal) => {
        concat!(
            "UPDATE records SET state = '",
            $state,
            "', last_status = $6, last_error = $7, lease_until = NULL,
    updated_at = $4, expires_at = $5
WHERE route = $1 AND event_id = $2 AND state = 'processing' AND attempts = $3"
        )
    };
}

pub(crate) use settle_fenced;

/// A release: the next delivery reclaims the event.
macro_rules! settle_failed {
    () => {
        $crate::store::sql::settle_fenced!("failed")
    };
}
pub(crate) use settle_failed;
pub const SETTLE_FAILED: &str = settle_failed!();

/// An outcome idemgate cannot know, under `on_ambiguous: hold`: the record
/// waits for an operator.
macro_rules! settle_ambiguous {
    () => {
        $crate::store::sql::settle_fenced!("ambiguous")
    };
}
pub(crate) use settle_ambiguous;
pub const SETTLE_AMBIGUOUS: &str = settle_ambiguous!();

/// A record that its first attempt delivered (its own columns hold that
/// attempt, [`first_delivered`]): a settle of attempt 1 that finds it is
/// that attempt's settle again (a commit not acknowledged, retried), not
/// a new outcome, and writes no row.
macro_rules! first_delivered_by_attempt_1 {
    () => {
        "state = 'delivered' AND attempts = 1"
    };
}
pub(crate) use first_delivered_by_attempt_1;

/// The attempt's row, written in the settle's commit (SPEC §13). Its real
/// outcome replaces a row written for it as lost (an ended lease found
/// before its answer came); a delivered row is final (a settle repeated
/// after its commit was not acknowledged finds it and leaves it). The values of [`settle_delivered!`]; `result`
/// is the expression given.
macro_rules! attempt_upsert {
    ($result:literal) => {
        attempt_upsert!($result, "")
    };
    ($result:literal, $and:literal) => {
        concat!(
            "INSERT INTO record_attempts
    (route, event_id, attempt, started_at, ended_at, status, result, error, duration_ms, instance)
SELECT $1, $2, $3, $11, $4, $6, ",
            $result,
            ", $14, $4 - $11, $12
WHERE EXISTS (SELECT 1 FROM records WHERE route = $1 AND event_id = $2",
            "\n                AND NOT ($3 = 1 AND ",
            $crate::store::sql::first_delivered_by_attempt_1!(),
            "))",
            $and,
            "
ON CONFLICT (route, event_id, attempt) DO UPDATE SET
    started_at = excluded.started_at, ended_at = excluded.ended_at, status = excluded.status,
    result = excluded.result, error = excluded.error, duration_ms = excluded.duration_ms,
    instance = excluded.instance
WHERE record_attempts.result <> 'delivered'"
        )
    };
}
pub(crate) use attempt_upsert;

/// The attempt's row where the store knows the result ($13) beforehand.
pub const ATTEMPT_UPSERT: &str = attempt_upsert!("$13");

/// Whether an attempt's row is its record's own columns: the first attempt
/// of a record that it delivered, by far the most common attempt, is
/// `first_seen_at` (its start: the claim), `delivered_at` (its end),
/// `last_status` and `claimed_by`, all written by the same claim and settle
/// commits. Its row is not written (a delivery pays no insert for its
/// history); [`HISTORY`] reads it from the record. A forced release
/// writes it before it changes those columns.
pub(crate) fn first_delivered(attempt: i64, result: SettleResult) -> bool {
    attempt == 1 && result == SettleResult::Delivered
}

/// The record, if its first attempt delivered it. $1 route, $2 event_id
macro_rules! first_delivered_record {
    () => {
        "SELECT 1 FROM records
     WHERE route = $1 AND event_id = $2 AND state = 'delivered' AND attempts = 1"
    };
}

/// A record's attempts, oldest first: the rows, the questions asked about
/// them (SPEC §21, each after the attempt it asked about), and a first attempt that
/// delivered read from the record (see [`first_delivered`]). A row written
/// for that attempt as lost (its lease ended before its answer came) is
/// only a guess: once the record says the attempt delivered, the record
/// wins. $1 route, $2 event_id
pub const HISTORY: &str = concat!(
    "SELECT attempt, started_at, ended_at, status, result, error, duration_ms, instance
FROM record_attempts
WHERE route = $1 AND event_id = $2
  AND NOT (attempt = 1 AND error = '",
    lease_lost!(),
    "' AND EXISTS (",
    first_delivered_record!(),
    "))
UNION ALL
SELECT 1, first_seen_at, delivered_at, last_status, 'delivered', NULL, delivered_at - first_seen_at,
       claimed_by
FROM records
WHERE route = $1 AND event_id = $2 AND state = 'delivered' AND attempts = 1
  AND NOT EXISTS (SELECT 1 FROM record_attempts
                  WHERE route = $1 AND event_id = $2 AND attempt = 1
                    AND (error IS NULL OR error <> '",
    lease_lost!(),
    "'))
UNION ALL
SELECT attempt, started_at, ended_at, status, result, error, duration_ms, instance
FROM record_questions
WHERE route = $1 AND event_id = $2
ORDER BY 1, 2"
);

/// Before a forced release of a delivered record: its first attempt's row,
/// if the record held it (see [`first_delivered`]). $1 route, $2 event_id
pub const MATERIALISE_FIRST: &str = "\
INSERT INTO record_attempts
    (route, event_id, attempt, started_at, ended_at, status, result, error, duration_ms, instance)
SELECT route, event_id, 1, first_seen_at, delivered_at, last_status, 'delivered', NULL,
       delivered_at - first_seen_at, claimed_by
FROM records WHERE route = $1 AND event_id = $2 AND state = 'delivered' AND attempts = 1
ON CONFLICT DO NOTHING";

/// How many attempts a record keeps (SPEC §13).
pub const ATTEMPTS_KEPT: i64 = 20;

/// Drops a record's attempts older than the newest [`ATTEMPTS_KEPT`].
/// Settle values ($1 route, $2 event_id, $3 attempt).
macro_rules! attempts_trim {
    () => {
        "DELETE FROM record_attempts WHERE route = $1 AND event_id = $2 AND attempt <= $3 - 20"
    };
}
pub(crate) use attempts_trim;
pub const ATTEMPTS_TRIM: &str = attempts_trim!();

/// The condition of a `processing` record whose lease ended by $3.
macro_rules! lease_ended {
    () => {
        "state = 'processing' AND (lease_until IS NULL OR lease_until <= $3)"
    };
}

/// Under `hold`, the lost attempt of a record whose lease ended, before
/// [`HOLD_EXPIRED`] turns it `ambiguous` (same transaction).
/// $1 route, $2 event_id, $3 now
pub const HOLD_LOST_ATTEMPT: &str = concat!(
    "INSERT INTO record_attempts
    (route, event_id, attempt, started_at, ended_at, status, result, error, duration_ms, instance)
SELECT route, event_id, attempts, updated_at, lease_until, NULL, 'ambiguous', '",
    lease_lost!(),
    "', NULL, claimed_by
FROM records WHERE route = $1 AND event_id = $2 AND ",
    lease_ended!(),
    "\nON CONFLICT DO NOTHING"
);

/// Under `hold`, a record whose lease ended turns `ambiguous` (SPEC §12).
/// $1 route, $2 event_id, $3 now
pub const HOLD_EXPIRED: &str = concat!(
    "UPDATE records SET state = 'ambiguous', lease_until = NULL, last_error = '",
    lease_lost!(),
    "',
    expires_at = $3 + (expires_at - updated_at), updated_at = $3
WHERE route = $1 AND event_id = $2 AND ",
    lease_ended!()
);

/// For telling a stale settle's reason apart. $1 route, $2 event_id
pub const STATE_OF: &str = "SELECT state FROM records WHERE route = $1 AND event_id = $2";

/// Operator release, as a compare-and-set on the state read just before
/// (`$4`), so that the outcome names the state actually released; keeps the
/// record's retention span from now on.
/// $1 route, $2 event_id, $3 now, $4 expected state
pub const RELEASE: &str = "\
UPDATE records SET state = 'failed', lease_until = NULL, last_error = 'released by operator',
    expires_at = $3 + (expires_at - updated_at), updated_at = $3
WHERE route = $1 AND event_id = $2 AND state = $4";

/// Every column of a record, in the order the SQLite store reads them by
/// position.
macro_rules! select_record {
    () => {
        "SELECT route, event_id, body_sha256, state, attempts, lease_until, last_status, last_error,
       first_seen_at, updated_at, delivered_at, expires_at,
       replay_status, replay_content_type, replay_body, replay_headers, send_trace
FROM records"
    };
}

pub const SELECT_RECORD: &str = select_record!();

/// One record. $1 route, $2 event_id
pub const GET_RECORD: &str = concat!(select_record!(), " WHERE route = $1 AND event_id = $2");

/// A [`Param`] owned, to cross to a blocking thread.
#[derive(Debug, Clone)]
pub(crate) enum OwnedParam {
    Text(Option<String>),
    Int(Option<i64>),
    Blob(Option<Vec<u8>>),
}

impl From<&Param<'_>> for OwnedParam {
    fn from(p: &Param<'_>) -> Self {
        match *p {
            Param::Text(t) => OwnedParam::Text(Some(t.to_owned())),
            Param::OptText(t) => OwnedParam::Text(t.map(str::to_owned)),
            Param::Int(n) => OwnedParam::Int(Some(n)),
            Param::OptInt(n) => OwnedParam::Int(n),
            Param::OptBlob(b) => OwnedParam::Blob(b.map(<[u8]>::to_vec)),
        }
    }
}

/// The list statement for `filter` and the values to bind, in order. Only
/// the conditions the filter sets are written, and a state as a literal, so
/// that each store can use its indexes: `state = 'failed'` and
/// `state = 'processing'` reach their partial indexes (the console asks for
/// failed and stuck records every few seconds; with none of them, a generic
/// `($2 IS NULL OR state = $2)` scanned the whole table each time), and
/// `route = $1` the key (SQLite: `records_key`). `substr` rather than
/// `LIKE`, whose `%` and `_` an event ID may hold. The page key's comparison is spelled out
/// because the order mixes DESC and ASC; it uses the `ORDER BY`'s collation,
/// so pages agree with the order on PostgreSQL too.
pub(crate) fn list_statement<'a>(filter: &'a super::ListFilter) -> (String, Vec<Param<'a>>) {
    let mut params = Vec::new();
    let mut bind = |p: Param<'a>| -> String {
        params.push(p);
        format!("${}", params.len())
    };
    let mut conds: Vec<String> = Vec::new();
    if let Some(route) = &filter.route {
        conds.push(format!("route = {}", bind(Param::Text(route))));
    }
    if let Some(state) = filter.state {
        // a closed set of words, never the caller's text
        conds.push(format!("state = '{}'", state.as_str()));
    }
    if let Some(prefix) = &filter.id_prefix {
        let p = bind(Param::Text(prefix));
        conds.push(format!("substr(event_id, 1, length({p})) = {p}"));
    }
    if let Some(at) = filter.lease_ended_by {
        let t = bind(Param::Int(at));
        conds.push(format!(
            "state = 'processing' AND (lease_until IS NULL OR lease_until <= {t})"
        ));
    }
    if let Some(key) = &filter.after {
        let t = bind(Param::Int(key.first_seen_at));
        let r = bind(Param::Text(&key.route));
        let e = bind(Param::Text(&key.event_id));
        conds.push(format!(
            "(first_seen_at < {t} OR (first_seen_at = {t} AND (route > {r} OR (route = {r} AND event_id > {e}))))"
        ));
    }
    let limit = bind(Param::Int(filter.limit));
    let filter = if conds.is_empty() {
        String::new()
    } else {
        format!("\nWHERE {}", conds.join("\n  AND "))
    };
    (
        format!(
            "{SELECT_RECORD}{filter}\nORDER BY first_seen_at DESC, route, event_id LIMIT {limit}"
        ),
        params,
    )
}

/// Deletes one bounded batch of expired records, never a live lease.
/// The condition is repeated outside the subquery on purpose: under READ
/// COMMITTED, PostgreSQL re-checks only the DELETE's own WHERE against a row
/// that another session changed (a reclaim refreshing `expires_at` and the
/// lease) while the sweep waited for its lock; the subquery's verdict is from
/// before, and alone it would delete a claim that just went live.
/// The oldest first: without the order PostgreSQL took its batches in the
/// table's physical order (a sequential scan, with the space vacuum freed
/// reused anywhere), and a sweep spread over its interval left the oldest
/// expired records to its end (a lag of 54 s with a 30 s interval).
/// $1 now, $2 batch size
pub const SWEEP: &str = "\
DELETE FROM records
WHERE (route, event_id) IN (
        SELECT route, event_id FROM records
        WHERE expires_at <= $1
          AND NOT (state = 'processing' AND lease_until IS NOT NULL AND lease_until > $1)
        ORDER BY expires_at
        LIMIT $2)
  AND expires_at <= $1
  AND NOT (state = 'processing' AND lease_until IS NOT NULL AND lease_until > $1)";

pub const OLDEST_PROCESSING: &str = "\
SELECT route, MIN(updated_at) AS oldest FROM records WHERE state = 'processing' GROUP BY route";

/// A [`CLAIM_READBACK`] row, whichever driver read it.
pub(crate) struct Readback {
    pub state: crate::claim::State,
    pub lease_until: Option<crate::claim::Millis>,
    pub body_sha256: String,
    pub last_status: Option<i64>,
    pub replay_status: Option<i64>,
    pub replay_content_type: Option<String>,
    pub replay_body: Option<Vec<u8>>,
    /// [`ReplayHeaders::stored`](super::ReplayHeaders::stored), or NULL.
    pub replay_headers: Option<String>,
    /// The latest send, [`TraceRef::stored`](super::TraceRef::stored), or
    /// NULL (not traced, or written by the release before).
    pub send_trace: Option<String>,
}

impl Readback {
    /// The answer a duplicate of this record would be replayed.
    pub(crate) fn recorded(&self) -> super::Recorded {
        super::Recorded {
            status: self.replay_status(),
            content_type: self.replay_content_type.clone(),
            body: self.replay_body.clone(),
            headers: self
                .replay_headers
                .clone()
                .and_then(super::ReplayHeaders::from_stored),
            trace: self.trace(),
        }
    }

    /// The record's latest send (SPEC §19).
    pub(crate) fn trace(&self) -> Option<super::TraceRef> {
        super::TraceRef::from_column(self.send_trace.as_deref())
    }

    /// The recorded body's status, else the delivering answer's.
    fn replay_status(&self) -> Option<u16> {
        self.replay_status
            .or(self.last_status)
            .and_then(|s| u16::try_from(s).ok())
    }

    /// Decides a delivery with `claim::decide`.
    pub(crate) fn outcome(
        self,
        digest: &str,
        now: crate::claim::Millis,
        hold: bool,
    ) -> super::Found {
        let recorded = super::Recorded {
            status: self.replay_status(),
            trace: self.trace(),
            content_type: self.replay_content_type,
            body: self.replay_body,
            headers: self
                .replay_headers
                .and_then(super::ReplayHeaders::from_stored),
        };
        super::existing_outcome(
            self.state,
            self.lease_until,
            self.body_sha256 == digest,
            now,
            hold,
            recorded,
        )
    }
}

/// A settle as a statement: the one list of a settle's values, for both
/// stores, in the layout of [`settle_delivered!`]. No allocation: a settle
/// is on every delivery's path.
pub(crate) struct SettleStatement<'a> {
    pub(crate) sql: &'static str,
    params: [Param<'a>; 15],
    /// What the settle did when it changed the record ([`settled`]).
    pub(crate) changed: SettleResult,
}

impl<'a> SettleStatement<'a> {
    /// The values to bind, in order; the last is the attempt's result when
    /// the settle changes the record.
    pub(crate) fn params(&self) -> &[Param<'a>] {
        &self.params
    }

    /// The values of [`ATTEMPT_UPSERT`] once the settle ran: `result` is
    /// what it did.
    pub(crate) fn attempt_params(&self, result: SettleResult) -> [Param<'a>; 15] {
        let mut params = self.params;
        params[12] = Param::Text(result.as_str());
        params
    }
}

/// The statement that settles `req`, with its values.
// long: the statement's 15 parameters listed once, in the SQL's $n order, after the outcome's values
pub(crate) fn settle_statement<'a>(req: &SettleRequest<'a>) -> SettleStatement<'a> {
    use Param::*;
    let (mut status, mut error) = (None, None);
    let (mut replay_status, mut content_type, mut body) = (None, None, None);
    let mut headers = None;
    let (sql, changed) = match req.outcome {
        SettleOutcome::Delivered {
            status: s,
            content_type: ct,
            body: b,
            headers: h,
        } => {
            status = Some(i64::from(s));
            headers = h.map(super::ReplayHeaders::stored);
            // the replay's status and type only beside a stored body
            if b.is_some() {
                (replay_status, content_type, body) = (status, ct, b);
            }
            (SETTLE_DELIVERED, SettleResult::Delivered)
        }
        SettleOutcome::Failed {
            status: s,
            error: e,
        } => {
            (status, error) = (s.map(i64::from), e);
            (SETTLE_FAILED, SettleResult::Released)
        }
        SettleOutcome::Ambiguous { error: e } => {
            error = e;
            (SETTLE_AMBIGUOUS, SettleResult::Ambiguous)
        }
    };
    SettleStatement {
        sql,
        params: [
            Text(req.route),
            Text(req.event_id),
            Int(req.attempt),
            Int(req.now),
            Int(req.now + req.retention_ms),
            OptInt(status),
            OptText(error),
            OptInt(replay_status),
            OptText(content_type),
            OptBlob(body),
            Int(req.started_at),
            Text(req.instance),
            Text(changed.as_str()),
            OptText(req.attempt_error),
            OptText(headers),
        ],
        changed,
    }
}

/// What a settle statement did: `result` when it changed the record (one
/// row), else `Stale` (the record moved on).
pub(crate) fn settled(rows: u64, result: SettleResult) -> SettleResult {
    if rows == 1 {
        result
    } else {
        SettleResult::Stale
    }
}

/// The outcome of a claim statement that returned its row: `claimed_trace`
/// is the send a reclaim replaced (the row's `claimed_trace`), left out
/// for a new record (attempt 1), which replaced none.
pub(crate) fn claimed(
    attempt: i64,
    claimed_from: Option<&str>,
    claimed_trace: Option<&str>,
    lease_until: crate::claim::Millis,
) -> super::ClaimOutcome {
    let (kind, previous) = if attempt == 1 {
        (crate::claim::ClaimKind::New, None)
    } else {
        (
            super::claim_kind_from_previous(claimed_from),
            super::TraceRef::from_column(claimed_trace),
        )
    };
    super::ClaimOutcome::Claimed {
        attempt,
        kind,
        lease_until,
        previous,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::State;
    use crate::store::{ListFilter, ListKey};

    /// A claim's row names the send it replaced (SPEC §19): a reclaim's,
    /// read as stored; a new record replaced none, whatever the column
    /// holds; a text not in the stored form is none.
    #[test]
    fn a_claimed_row_names_the_send_it_replaced() {
        use crate::claim::ClaimKind;
        use crate::store::{ClaimOutcome, TraceRef};
        let sent = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7";
        let previous = |out: ClaimOutcome| match out {
            ClaimOutcome::Claimed { kind, previous, .. } => (kind, previous),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            previous(claimed(2, Some("failed"), Some(sent), 9)),
            (ClaimKind::RetryFailed, TraceRef::from_stored(sent))
        );
        assert_eq!(
            previous(claimed(3, Some("processing"), None, 9)),
            (ClaimKind::RetryExpired, None)
        );
        assert_eq!(
            previous(claimed(1, None, Some(sent), 9)),
            (ClaimKind::New, None)
        );
        assert_eq!(
            previous(claimed(2, Some("failed"), Some("junk"), 9)),
            (ClaimKind::RetryFailed, None)
        );
        let rb = Readback {
            state: State::Delivered,
            lease_until: None,
            body_sha256: "d".into(),
            last_status: Some(200),
            replay_status: None,
            replay_content_type: None,
            replay_body: None,
            replay_headers: None,
            send_trace: Some(sent.into()),
        };
        assert_eq!(rb.recorded().trace, TraceRef::from_stored(sent));
        match rb.outcome("d", 0, false) {
            crate::store::Found::Answer(ClaimOutcome::Existing { recorded, .. }) => {
                assert_eq!(recorded.trace, TraceRef::from_stored(sent))
            }
            other => panic!("{other:?}"),
        }
    }

    fn every_filter() -> ListFilter {
        ListFilter {
            route: Some("r'; DROP TABLE records; --".into()),
            state: Some(State::Processing),
            limit: 21,
            id_prefix: Some("evt_%'".into()),
            lease_ended_by: Some(5),
            after: Some(ListKey {
                first_seen_at: 7,
                route: "k'".into(),
                event_id: "e'".into(),
            }),
        }
    }

    #[test]
    fn the_callers_text_is_only_ever_bound() {
        let filter = every_filter();
        let (sql, params) = list_statement(&filter);
        assert!(
            !sql.contains("DROP") && !sql.contains("evt_") && !sql.contains("k'"),
            "{sql}"
        );
        assert_eq!(
            params.len(),
            7,
            "route, prefix, lease, three for the key, limit: {sql}"
        );
        assert!(sql.contains("$7") && !sql.contains("$8"), "{sql}");
        let none = ListFilter {
            limit: 3,
            ..Default::default()
        };
        let (plain, params) = list_statement(&none);
        assert!(!plain.contains("WHERE"), "{plain}");
        assert!(matches!(params.as_slice(), [Param::Int(3)]));
    }

    /// The lists the console asks for every few seconds find their rows by
    /// index, not by a scan of every record (SQLite's plan; PostgreSQL's is
    /// measured in docs/performance.md).
    #[test]
    fn failed_stuck_and_route_lists_use_an_index() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        for sql in [
            include_str!("../../migrations/sqlite/0001_records.sql"),
            include_str!("../../migrations/sqlite/0002_failed_index.sql"),
            include_str!("../../migrations/sqlite/0006_replay_headers.sql"),
            include_str!("../../migrations/sqlite/0008_send_trace.sql"),
        ] {
            conn.execute_batch(sql).unwrap();
        }
        let plan = |filter: ListFilter| -> String {
            let (sql, params) = list_statement(&filter);
            let values = params.into_iter().map(|p| match p {
                Param::Text(t) => rusqlite::types::Value::Text(t.to_owned()),
                Param::Int(n) => rusqlite::types::Value::Integer(n),
                other => panic!("a list binds text and integers only: {other:?}"),
            });
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let rows = stmt
                .query_map(rusqlite::params_from_iter(values), |r| {
                    r.get::<_, String>(3)
                })
                .unwrap()
                .map(Result::unwrap)
                .collect::<Vec<_>>();
            rows.join("; ")
        };
        let base = || ListFilter {
            limit: 21,
            ..Default::default()
        };
        let failed = plan(ListFilter {
            state: Some(State::Failed),
            ..base()
        });
        assert!(failed.contains("records_failed"), "{failed}");
        let stuck = plan(ListFilter {
            lease_ended_by: Some(1),
            ..base()
        });
        assert!(stuck.contains("records_processing"), "{stuck}");
        let route = plan(ListFilter {
            route: Some("r".into()),
            ..base()
        });
        assert!(route.contains("PRIMARY KEY"), "{route}");
        let newest = plan(base());
        assert!(newest.contains("records_first_seen_at"), "{newest}");
    }
}
