//! The store's contract with the rest of idemgate: the [`ClaimStore`]
//! trait, the requests it takes and the outcomes it answers, its records
//! and its errors. Both backends and the bounds wrapper build on it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

use super::TraceRef;
use crate::claim::{ClaimKind, Decision, Millis, Refusal, SettleResult, State};

/// A store error: the proxy fails closed on it (503) unless told otherwise.
/// A driver's error is kept as the [`source`](std::error::Error::source),
/// never flattened into text.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL names no backend (shown redacted).
    #[error("unsupported store URL (expected sqlite://PATH or postgres://…): {0}")]
    UnsupportedUrl(String),
    /// What the store found itself: a time limit passed, a writer stopped.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A write was sent and its answer never came (the server went
    /// silent): whether it committed is unknown.
    #[error("store unavailable: {0}")]
    OutcomeUnknown(String),
    #[error("store unavailable: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL's driver.
    #[error("store unavailable: {0}")]
    Sqlx(#[from] sqlx::Error),
    /// A file beside the database: its directory, the change counter.
    #[error("store unavailable: {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// One failure answered to every operation of a batch: each waiter
    /// gets its own error, sharing the one cause (and its source).
    #[error(transparent)]
    Batch(Arc<StoreError>),
    #[error("store migration failed: {0}")]
    Migration(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("store returned an unexpected value: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Whether the write that failed may have committed all the same: its
    /// answer was lost on the way (SPEC §16). Every other error means it
    /// did not take effect.
    pub fn may_have_committed(&self) -> bool {
        match self {
            StoreError::OutcomeUnknown(_) => true,
            StoreError::Sqlx(sqlx::Error::Io(_) | sqlx::Error::Protocol(_)) => true,
            StoreError::Batch(inner) => inner.may_have_committed(),
            _ => false,
        }
    }

    /// A file operation on `what` failed.
    pub(crate) fn io(what: impl fmt::Display, source: std::io::Error) -> StoreError {
        StoreError::Io {
            what: what.to_string(),
            source,
        }
    }
}

/// A record's state as the stores write it.
pub(crate) fn state_of(text: &str) -> Result<State, StoreError> {
    State::parse(text).ok_or_else(|| StoreError::Corrupt(format!("state {text:?}")))
}

/// A delivery asking for the claim on its event ID.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    pub route: &'a str,
    pub event_id: &'a str,
    /// Hex sha256 of the payload (raw or canonical).
    pub digest: &'a str,
    pub now: Millis,
    pub lease_ms: Millis,
    pub retention_ms: Millis,
    /// The route's `on_ambiguous` is `hold`: an ended lease is not taken
    /// over (SPEC §12).
    pub hold: bool,
    /// This process's name (config `instance`), kept with the claim for
    /// the attempt history.
    pub instance: &'a str,
    /// Random per claim, kept with the record: a claim whose commit was
    /// not acknowledged is released by it, and by nothing else (SPEC §16).
    pub token: i64,
    /// The send this claim's attempt makes (SPEC §19), kept with the record
    /// as its latest send; `None` without tracing (or unsampled): the
    /// record then keeps none.
    pub trace: Option<TraceRef>,
}

/// An operator's release of one record (`events release`, the API).
#[derive(Debug, Clone, Copy)]
pub struct ReleaseRequest<'a> {
    pub route: &'a str,
    pub event_id: &'a str,
    /// A `delivered` record too.
    pub force: bool,
    pub now: Millis,
}

/// The recorded answer replayed to duplicates of a delivered event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recorded {
    pub status: Option<u16>,
    /// With `replay_body`: the settled response's content type and body.
    pub content_type: Option<String>,
    pub body: Option<Vec<u8>>,
    /// With `replay_headers` (SPEC §22): the delivered response's values
    /// of those headers.
    pub headers: Option<ReplayHeaders>,
    /// The record's latest send (SPEC §19), whatever its state: a
    /// duplicate's span (replay, 409, 422) links to it.
    pub trace: Option<TraceRef>,
}

/// Response headers kept with a delivered record and sent again with every
/// replay (SPEC §22): pairs of a lowercase name and a value of at most
/// [`ReplayHeaders::MAX_VALUE`] bytes of visible ASCII (and spaces). Every
/// engine keeps them as one text ([`ReplayHeaders::stored`]: a
/// `name: value` line each), one nullable column or hash field beside the
/// replay body: written by the delivered settle itself, read with the
/// record, and absent on a record a process of the release before wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayHeaders(String);

impl ReplayHeaders {
    /// The longest value kept (SPEC §22: 1 KiB).
    pub const MAX_VALUE: usize = 1024;

    /// Whether a value can be kept: short enough, and of bytes a header
    /// line holds without ambiguity (no control byte, no byte outside
    /// ASCII).
    pub fn keeps(value: &[u8]) -> bool {
        value.len() <= Self::MAX_VALUE && value.iter().all(|&b| b == b' ' || b.is_ascii_graphic())
    }

    /// The pairs, in order; `None` when there are none. A pair whose name
    /// is not a lowercase token, or whose value [`keeps`](Self::keeps)
    /// refuses, is left out (the caller checks and logs first).
    pub fn new<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Option<ReplayHeaders> {
        let mut text = String::new();
        for (name, value) in pairs {
            let name_ok = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b':' && !b.is_ascii_uppercase());
            if !name_ok || !Self::keeps(value) {
                continue;
            }
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(name);
            text.push_str(": ");
            // checked ASCII above
            text.push_str(std::str::from_utf8(value).unwrap_or_default());
        }
        (!text.is_empty()).then_some(ReplayHeaders(text))
    }

    /// As an engine read it back; `None` for an empty text.
    pub fn from_stored(text: String) -> Option<ReplayHeaders> {
        (!text.is_empty()).then_some(ReplayHeaders(text))
    }

    /// What an engine keeps.
    pub fn stored(&self) -> &str {
        &self.0
    }

    /// The pairs, in the order kept; a line that is not `name: value` (a
    /// hand edit) is skipped.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.split('\n').filter_map(|line| line.split_once(": "))
    }
}

/// The store's answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// This delivery owns the event now, as attempt number `attempt`.
    Claimed {
        attempt: i64,
        kind: ClaimKind,
        lease_until: Millis,
        /// A reclaim: the send of the attempt before (SPEC §19), which
        /// this claim replaced with its own; `None` for a new record.
        previous: Option<TraceRef>,
    },
    /// Somebody else decided it already: the record refuses this claim.
    Existing {
        decision: Refusal,
        recorded: Recorded,
    },
}

/// How an attempt is settled.
#[derive(Debug, Clone)]
pub struct SettleRequest<'a> {
    pub route: &'a str,
    pub event_id: &'a str,
    pub attempt: i64,
    /// When the attempt began (its claim), for its row in the history.
    pub started_at: Millis,
    /// This process's name, for the attempt's row.
    pub instance: &'a str,
    /// What the attempt's row says went wrong, without the upstream's
    /// address (the record's `last_error` may hold the connector's words).
    pub attempt_error: Option<&'a str>,
    pub now: Millis,
    pub retention_ms: Millis,
    pub outcome: SettleOutcome<'a>,
}

#[derive(Debug, Clone)]
pub enum SettleOutcome<'a> {
    /// A status in `settle_on`: close the claim as delivered (final).
    Delivered {
        status: u16,
        content_type: Option<&'a str>,
        body: Option<&'a [u8]>,
        /// With `replay_headers`: kept whether or not a body is (SPEC §22).
        headers: Option<&'a ReplayHeaders>,
    },
    /// Anything else: release the claim, fenced by the attempt number.
    Failed {
        status: Option<u16>,
        error: Option<&'a str>,
    },
    /// An outcome idemgate cannot know, under `on_ambiguous: hold`: hold
    /// the record for an operator, fenced by the attempt number.
    Ambiguous { error: Option<&'a str> },
}

/// One forward of a guarded request (SPEC §13), as recorded beside its
/// record. No payload, no header value, no upstream address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attempt {
    pub attempt: i64,
    pub started_at: Millis,
    pub ended_at: Option<Millis>,
    pub status: Option<i64>,
    /// delivered, released, ambiguous, stale or settle_error.
    pub result: String,
    pub error: Option<String>,
    pub duration_ms: Option<i64>,
    pub instance: Option<String>,
}

/// One record, every field (SPEC §3). The replay body is never printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Record {
    pub route: String,
    pub event_id: String,
    pub body_sha256: String,
    #[serde(serialize_with = "state_text")]
    pub state: State,
    pub attempts: i64,
    pub lease_until: Option<Millis>,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub first_seen_at: Millis,
    pub updated_at: Millis,
    pub delivered_at: Option<Millis>,
    pub expires_at: Millis,
    pub replay_status: Option<i64>,
    pub replay_content_type: Option<String>,
    pub replay_body_bytes: Option<i64>,
    /// The latest send's trace and span ID, hex (SPEC §19); `None` when
    /// it was not traced.
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
    /// The newest attempts, oldest first: read for one record (`get`),
    /// not for a list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<Attempt>>,
}

fn state_text<S: serde::Serializer>(state: &State, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(state.as_str())
}

/// Filter of `events list` and `GET /api/events`.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub route: Option<String>,
    pub state: Option<State>,
    pub limit: i64,
    /// Only event IDs that start with this text (compared byte for byte:
    /// `%` and `_` are plain characters).
    pub id_prefix: Option<String>,
    /// Only `processing` records whose lease had ended by this time: claims
    /// whose attempt died or hangs.
    pub lease_ended_by: Option<Millis>,
    /// Only records after this one in the list's order (a page's last).
    pub after: Option<ListKey>,
}

/// A record's place in the list's order (newest first, then route, then event
/// ID). Records only ever join the list at its top (`first_seen_at` never
/// changes), so the records after a key stay the same while others arrive:
/// a page that starts after the previous page's last record neither repeats
/// nor skips one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListKey {
    pub first_seen_at: Millis,
    pub route: String,
    pub event_id: String,
}

impl Record {
    /// The record a new claim writes: `processing`, its first attempt
    /// leased, retained from `req.now`, nothing answered yet, its send the
    /// claim's own (the one shape every engine's fresh record reads back as).
    pub fn claimed(req: &ClaimRequest<'_>) -> Record {
        let (trace_id, span_id) = TraceRef::record_ids(req.trace);
        Record {
            route: req.route.to_owned(),
            event_id: req.event_id.to_owned(),
            body_sha256: req.digest.to_owned(),
            state: State::Processing,
            attempts: 1,
            lease_until: Some(req.now + req.lease_ms),
            last_status: None,
            last_error: None,
            first_seen_at: req.now,
            updated_at: req.now,
            delivered_at: None,
            expires_at: req.now + req.retention_ms,
            replay_status: None,
            replay_content_type: None,
            replay_body_bytes: None,
            trace_id,
            span_id,
            history: None,
        }
    }

    /// This record's place in the list's order.
    pub fn list_key(&self) -> ListKey {
        ListKey {
            first_seen_at: self.first_seen_at,
            route: self.route.clone(),
            event_id: self.event_id.clone(),
        }
    }
}

/// What an operator's release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    Released {
        previous: State,
    },
    NotFound,
    /// The record is delivered and `--force` was not given.
    RefusedDelivered,
}

/// How an operator settles an `ambiguous` record (SPEC §12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The consumer did act: replay `status` to later deliveries.
    Delivered { status: u16 },
    /// It did not: the next delivery is forwarded.
    Failed,
}

/// An operator's resolve of one `ambiguous` record.
#[derive(Debug, Clone, Copy)]
pub struct ResolveRequest<'a> {
    pub route: &'a str,
    pub event_id: &'a str,
    pub how: Resolution,
    pub now: Millis,
}

/// What a resolve did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolveOutcome {
    Resolved,
    NotFound,
    /// Only an `ambiguous` record can be resolved.
    NotAmbiguous(State),
}

/// What a question to the consumer learned (SPEC §21).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Learned {
    /// The consumer acted on the event: the record turns `delivered`, and
    /// later deliveries are replayed with `status` (`delivered_status`).
    Done { status: u16 },
    /// It never acted on it: the record turns `failed`, and the next
    /// delivery is forwarded.
    NotDone,
    /// No answer that says: the record stays `ambiguous`.
    Unknown,
}

impl Learned {
    /// The question's row's `result` (SPEC §13).
    pub fn result(self) -> &'static str {
        match self {
            Learned::Done { .. } | Learned::NotDone => "reconciled",
            Learned::Unknown => "reconcile_unknown",
        }
    }

    /// The metric's `result` (SPEC §21).
    pub fn as_str(self) -> &'static str {
        match self {
            Learned::Done { .. } => "delivered",
            Learned::NotDone => "failed",
            Learned::Unknown => "unknown",
        }
    }
}

/// One question's answer, to record beside its record and act on (SPEC
/// §21): one atomic change, fenced by the record's state and attempt count.
#[derive(Debug, Clone, Copy)]
pub struct Reconciliation<'a> {
    pub route: &'a str,
    pub event_id: &'a str,
    /// The record's `attempts` when it was read before the question: a
    /// record that changed since (another attempt, a resolve) is left as
    /// it is, and the question is not recorded.
    pub attempts: i64,
    pub learned: Learned,
    /// The consumer's status, when it answered one.
    pub status: Option<u16>,
    /// What was learned, for the row's `error` column (never the
    /// consumer's address).
    pub detail: &'a str,
    pub started_at: Millis,
    pub now: Millis,
    pub instance: &'a str,
}

/// The background's take of a route's ambiguous records to ask about
/// (SPEC §21).
#[derive(Debug, Clone, Copy)]
pub struct QuestionBatch<'a> {
    pub route: &'a str,
    pub now: Millis,
    /// The mark each record taken gets: it is not taken again, by any
    /// process, before this time (now + `every`).
    pub next_at: Millis,
    pub limit: i64,
}

/// A claim whose commit was not acknowledged (SPEC §16), named by the
/// random token it was made with.
#[derive(Debug, Clone, Copy)]
pub struct UnacknowledgedClaim<'a> {
    pub route: &'a str,
    pub event_id: &'a str,
    pub token: i64,
    pub now: Millis,
}

/// What the bulk release takes (SPEC §14).
#[derive(Debug, Clone)]
pub struct BulkRelease<'a> {
    pub route: &'a str,
    /// `failed`, `ambiguous`, or `processing` (only those whose lease ended).
    pub state: State,
    /// Only records whose `updated_at` is at or after this.
    pub updated_after: Option<Millis>,
    /// Only records whose `updated_at` is before this.
    pub updated_before: Option<Millis>,
    pub dry_run: bool,
    pub now: Millis,
}

/// What an engine tells the metrics of itself, read every second
/// (SPEC §18: `idemgate_store_shards`, the `wait` operation).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct EngineReport {
    /// The shards the engine saw last (a sharded engine only).
    pub shards: Option<u64>,
    /// The durability waits since the last report, in seconds each.
    pub waits: Vec<f64>,
}

#[async_trait]
pub trait ClaimStore: Send + Sync {
    /// Applies pending migrations.
    async fn migrate(&self) -> Result<(), StoreError>;
    /// One cheap round trip: `/readyz`.
    async fn ping(&self) -> Result<(), StoreError>;
    /// Claims the event atomically, or says why not. An error means the
    /// claim did not commit, or (said in the error) that the store could not
    /// learn whether it did; a claim not yet run when the store's own time
    /// limit passes is not run at all (SPEC §6).
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError>;
    /// Closes or releases an attempt's claim; errors as for `claim`.
    async fn settle(&self, req: &SettleRequest<'_>) -> Result<SettleResult, StoreError>;
    /// Like `settle`, not run at all unless it is under way within `limit`
    /// (then its result is waited for). Dropping the future before it
    /// answers has the same effect; cutting it off with a timeout from
    /// outside instead would lose the result of a settle under way.
    async fn settle_within(
        &self,
        req: &SettleRequest<'_>,
        limit: Duration,
    ) -> Result<SettleResult, StoreError>;
    /// The claim's answer from a plain read, when the record alone decides it
    /// (delivered: replay; other digest: mismatch; live lease: in flight);
    /// `None` when the claim statement must run. Never writes, so duplicates
    /// of settled events do not queue behind claims.
    async fn peek(&self, req: &ClaimRequest<'_>) -> Result<Option<ClaimOutcome>, StoreError>;
    async fn get(&self, route: &str, event_id: &str) -> Result<Option<Record>, StoreError>;
    /// Newest first (then by route and event ID), at most `filter.limit`.
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError>;
    /// Operator release: `processing`/`failed` (or, forced, `delivered`) to `failed` with no lease.
    async fn release(&self, req: &ReleaseRequest<'_>) -> Result<ReleaseOutcome, StoreError>;
    /// Deletes at most `limit` expired records (never a live lease); returns how many.
    async fn sweep_batch(&self, now: Millis, limit: i64) -> Result<u64, StoreError>;
    /// Per route, the `updated_at` of the oldest `processing` record.
    async fn oldest_processing(&self) -> Result<Vec<(String, Millis)>, StoreError>;
    /// Settles an `ambiguous` record by hand (SPEC §12); any other record
    /// is left as it is. One compare-and-set on the state.
    async fn resolve(&self, req: &ResolveRequest<'_>) -> Result<ResolveOutcome, StoreError>;
    /// Releases the claim `token` names if it committed and still holds its
    /// record (SPEC §16), as a failed attempt would end; whether it did.
    /// Fenced by the token: it never ends another claim.
    async fn release_unacknowledged(
        &self,
        claim: &UnacknowledgedClaim<'_>,
    ) -> Result<bool, StoreError>;
    /// A record's attempts (SPEC §13), oldest first.
    async fn history(&self, route: &str, event_id: &str) -> Result<Vec<Attempt>, StoreError>;
    /// Releases (or, dry, counts) every record `req` selects (SPEC §14), in
    /// batches; each record with the fencing of a single release: one that
    /// changed meanwhile is left as it is. Never a delivered record, never
    /// a live claim.
    async fn release_bulk(&self, req: &BulkRelease<'_>) -> Result<u64, StoreError>;
    /// Pauses (or resumes) `route` for every process on the store (SPEC
    /// §14). Pausing a paused route keeps its first `paused_at`.
    async fn set_paused(&self, route: &str, paused: bool, now: Millis) -> Result<(), StoreError>;
    /// The paused routes and since when, by name.
    async fn paused(&self) -> Result<Vec<(String, Millis)>, StoreError>;
    /// How many records of each route are `ambiguous`, by route (routes
    /// with none are absent).
    async fn ambiguous_counts(&self) -> Result<Vec<(String, i64)>, StoreError>;
    /// The sweeper's part of SPEC §12: records claimed under `hold` whose
    /// lease ended by `now` turn `ambiguous` (their attempt recorded as
    /// lost), at most `limit`; how many did.
    async fn hold_ended_leases(&self, now: Millis, limit: i64) -> Result<u64, StoreError>;
    /// Records what a question to the consumer learned (SPEC §21) and acts
    /// on it, in one atomic change: `Done` resolves the record as
    /// `delivered` (`last_status` its status), `NotDone` as `failed`,
    /// `Unknown` leaves it `ambiguous`; each adds the question's row to the
    /// record's history. Only an `ambiguous` record whose attempt count is
    /// still `req.attempts` is changed (`Resolved`); otherwise nothing is,
    /// and the outcome says what was found.
    async fn reconciled(&self, req: &Reconciliation<'_>) -> Result<ResolveOutcome, StoreError>;
    /// Takes at most `batch.limit` of the route's `ambiguous` records whose
    /// mark is unset or at most `batch.now`, setting each one's mark to
    /// `batch.next_at` with a compare-and-set: a record is taken by one
    /// process only, until its mark passes. The taken event IDs.
    async fn take_questions(&self, batch: &QuestionBatch<'_>) -> Result<Vec<String>, StoreError>;
    /// One record with its attempt history (`events show`, the API).
    async fn show(&self, route: &str, event_id: &str) -> Result<Option<Record>, StoreError> {
        let Some(mut record) = self.get(route, event_id).await? else {
            return Ok(None);
        };
        record.history = Some(self.history(route, event_id).await?);
        Ok(Some(record))
    }
    /// What the engine tells the metrics (nothing, unless it says so).
    fn report(&self) -> EngineReport {
        EngineReport::default()
    }
    /// Closes the pool (flushes the SQLite WAL).
    async fn close(&self);
}

/// What a record read back decides for a claim.
#[derive(Debug)]
pub(crate) enum Found {
    /// The record refuses the claim with this answer.
    Answer(ClaimOutcome),
    /// The record is claimable: run the claim statement (again).
    Claim,
    /// Its lease ended under `hold`: turn it `ambiguous`, then answer
    /// outcome-unknown.
    Hold,
}

/// Decides a claim from a record read back, with the same `decide` rules as
/// the SQL.
pub(crate) fn existing_outcome(
    state: State,
    lease_until: Option<Millis>,
    same_digest: bool,
    now: Millis,
    hold: bool,
    recorded: Recorded,
) -> Found {
    let decision = crate::claim::decide(
        Some(crate::claim::Existing {
            state,
            lease_until,
            same_digest,
        }),
        now,
        hold,
    );
    match decision {
        Decision::Claim(_) => Found::Claim,
        Decision::Hold => Found::Hold,
        Decision::Refuse(refusal) => Found::Answer(ClaimOutcome::Existing {
            decision: refusal,
            recorded,
        }),
    }
}

/// The answer to the delivery that found a record [`Found::Hold`], once
/// the record is `ambiguous`: `trace` is the record's latest send (the
/// attempt whose outcome is unknown), as the engine read it.
pub(crate) fn outcome_unknown(trace: Option<TraceRef>) -> ClaimOutcome {
    ClaimOutcome::Existing {
        decision: Refusal::OutcomeUnknown,
        recorded: Recorded {
            trace,
            ..Recorded::default()
        },
    }
}

pub(crate) fn claim_kind_from_previous(prev: Option<&str>) -> ClaimKind {
    match prev {
        None => ClaimKind::New,
        Some("failed") => ClaimKind::RetryFailed,
        Some(_) => ClaimKind::RetryExpired,
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// A driver's error stays reachable through `source()`, through a
    /// batch's shared error too, and prints as it did.
    #[test]
    fn errors_keep_their_sources() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let driver = conn.execute_batch("SELECT FROM nowhere").unwrap_err();
        let text = driver.to_string();
        let e = StoreError::from(driver);
        assert_eq!(e.to_string(), format!("store unavailable: {text}"));
        let source = e.source().expect("a source");
        assert!(
            source.downcast_ref::<rusqlite::Error>().is_some(),
            "{source:?}"
        );

        let shared = StoreError::Batch(Arc::new(e));
        assert_eq!(shared.to_string(), format!("store unavailable: {text}"));
        let source = shared.source().expect("the shared cause's source");
        assert!(
            source.downcast_ref::<rusqlite::Error>().is_some(),
            "{source:?}"
        );

        let pool = StoreError::from(sqlx::Error::PoolTimedOut);
        assert!(pool
            .source()
            .unwrap()
            .downcast_ref::<sqlx::Error>()
            .is_some());
        let io = StoreError::io("/x", std::io::Error::other("gone"));
        assert_eq!(io.to_string(), "store unavailable: /x: gone");
        assert!(io
            .source()
            .unwrap()
            .downcast_ref::<std::io::Error>()
            .is_some());
        let plain = StoreError::Unavailable("no answer within 1s".into());
        assert!(plain.source().is_none());
    }
}
