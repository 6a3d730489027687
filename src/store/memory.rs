//! The contract's reference model: a [`Backend`] that keeps its records in
//! this process's memory, written from SPEC §3 and §12–14 with
//! `claim::decide` and `claim::settle` and nothing of SQL. No store URL
//! opens it and nothing durable depends on it: it is what the store
//! contract suite (`tests/it/store_contract.rs`) and the unit tests of the
//! state machine and the operator's operations run against beside SQLite
//! and PostgreSQL, so that a new backend has one model to agree with from
//! its first day, and the suite cannot encode one engine's accident.
//!
//! One mutex over the whole map, held by plain code only: no await ever
//! runs under it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::sql::ATTEMPTS_KEPT;
use super::{
    outcome_unknown, Attempt, Backend, BulkRelease, ClaimOutcome, ClaimRequest, Found, Learned,
    ListFilter, QuestionBatch, Reconciliation, Record, Recorded, ReleaseOutcome, ReleaseRequest,
    ReplayHeaders, Resolution, ResolveOutcome, ResolveRequest, SettleOutcome, SettleRequest,
    StoreError, TraceRef, UnacknowledgedClaim,
};
use crate::claim::{self, AttemptEnd, ClaimKind, Current, Millis, SettleResult, State};

/// What an attempt's error says when its lease ended without an answer.
const LEASE_LOST: &str = super::sql::lease_lost!();

/// A record and the columns only the store sees.
#[derive(Debug, Clone)]
struct Entry {
    record: Record,
    replay_body: Option<Vec<u8>>,
    /// The replayed headers the delivered settle kept (SPEC §22).
    replay_headers: Option<ReplayHeaders>,
    /// The latest send (SPEC §19): the last winning claim's, `None` when
    /// it was not traced. The record's `trace_id` and `span_id` show it.
    send: Option<TraceRef>,
    /// Claimed under `on_ambiguous: hold`.
    hold: bool,
    claimed_by: Option<String>,
    claim_token: i64,
    /// The record's attempts by number, as rows (a first attempt that
    /// delivered is not kept as a row: it is the record's own columns).
    attempts: BTreeMap<i64, Attempt>,
    /// The background's mark (SPEC §21): not asked about before this.
    reconcile_after: Option<Millis>,
    /// The questions asked about it, oldest first, the newest 20 kept.
    questions: Vec<Attempt>,
}

impl Entry {
    fn first_delivered(&self) -> bool {
        self.record.state == State::Delivered && self.record.attempts == 1
    }

    /// The first attempt, read from the record when it delivered.
    fn first_attempt(&self) -> Attempt {
        let r = &self.record;
        Attempt {
            attempt: 1,
            started_at: r.first_seen_at,
            ended_at: r.delivered_at,
            status: r.last_status,
            result: SettleResult::Delivered.as_str().into(),
            error: None,
            duration_ms: r.delivered_at.map(|d| d - r.first_seen_at),
            instance: self.claimed_by.clone(),
        }
    }

    /// Keeps a row unless one is there already (SQL's `DO NOTHING`).
    fn add_attempt(&mut self, row: Attempt) {
        self.attempts.entry(row.attempt).or_insert(row);
    }

    /// The claim's attempt as lost: its lease ended without an answer.
    fn lost_attempt(&self, result: SettleResult) -> Attempt {
        Attempt {
            attempt: self.record.attempts,
            started_at: self.record.updated_at,
            ended_at: self.record.lease_until,
            status: None,
            result: result.as_str().into(),
            error: Some(LEASE_LOST.into()),
            duration_ms: None,
            instance: self.claimed_by.clone(),
        }
    }

    fn lease_ended(&self, now: Millis) -> bool {
        self.record.state == State::Processing
            && self.record.lease_until.is_none_or(|until| until <= now)
    }

    /// A change by hand keeps the record's retention span from `now` on.
    fn touch(&mut self, now: Millis) {
        let r = &mut self.record;
        r.expires_at = now + (r.expires_at - r.updated_at);
        r.updated_at = now;
    }

    fn recorded(&self) -> Recorded {
        let r = &self.record;
        Recorded {
            status: r
                .replay_status
                .or(r.last_status)
                .and_then(|s| u16::try_from(s).ok()),
            content_type: r.replay_content_type.clone(),
            body: self.replay_body.clone(),
            headers: self.replay_headers.clone(),
            trace: self.send,
        }
    }

    /// A winning claim's send becomes the latest; the one it replaced.
    fn set_send(&mut self, send: Option<TraceRef>) -> Option<TraceRef> {
        (self.record.trace_id, self.record.span_id) = TraceRef::record_ids(send);
        std::mem::replace(&mut self.send, send)
    }
}

type Key = (String, String);

#[derive(Default)]
struct Tables {
    records: HashMap<Key, Entry>,
    pauses: BTreeMap<String, Millis>,
}

/// The in-memory reference backend; see the module doc.
#[derive(Default)]
pub struct MemoryStore {
    tables: Mutex<Tables>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn key(route: &str, event_id: &str) -> Key {
    (route.to_owned(), event_id.to_owned())
}

fn new_entry(req: &ClaimRequest<'_>) -> Entry {
    Entry {
        record: Record::claimed(req),
        replay_body: None,
        replay_headers: None,
        send: req.trace,
        hold: req.hold,
        claimed_by: Some(req.instance.to_owned()),
        claim_token: req.token,
        attempts: BTreeMap::new(),
        reconcile_after: None,
        questions: Vec::new(),
    }
}

/// What the record decides for a claim, as the SQL stores decide it.
fn found(e: &Entry, req: &ClaimRequest<'_>) -> Found {
    super::existing_outcome(
        e.record.state,
        e.record.lease_until,
        e.record.body_sha256 == req.digest,
        req.now,
        req.hold,
        e.recorded(),
    )
}

/// Takes over a reclaimable record: the next attempt. An ended lease's
/// attempt is recorded as lost (the SQL stores' trigger).
fn take_over(e: &mut Entry, req: &ClaimRequest<'_>) -> ClaimOutcome {
    let previous = e.record.state;
    if previous == State::Processing {
        e.add_attempt(e.lost_attempt(SettleResult::Released));
    }
    let r = &mut e.record;
    r.state = State::Processing;
    r.attempts += 1;
    r.lease_until = Some(req.now + req.lease_ms);
    r.updated_at = req.now;
    r.expires_at = req.now + req.retention_ms;
    e.hold = req.hold;
    e.claimed_by = Some(req.instance.to_owned());
    e.claim_token = req.token;
    let replaced = e.set_send(req.trace);
    let kind = match previous {
        State::Failed => ClaimKind::RetryFailed,
        _ => ClaimKind::RetryExpired,
    };
    ClaimOutcome::Claimed {
        attempt: e.record.attempts,
        kind,
        lease_until: req.now + req.lease_ms,
        previous: replaced,
    }
}

/// Under `hold`, an ended lease turns the record `ambiguous`, its attempt
/// recorded as lost.
fn hold_ended(e: &mut Entry, now: Millis) {
    e.add_attempt(e.lost_attempt(SettleResult::Ambiguous));
    e.record.state = State::Ambiguous;
    e.record.lease_until = None;
    e.record.last_error = Some(LEASE_LOST.into());
    e.touch(now);
}

fn claim_in(t: &mut Tables, req: &ClaimRequest<'_>) -> ClaimOutcome {
    let Some(e) = t.records.get_mut(&key(req.route, req.event_id)) else {
        t.records
            .insert(key(req.route, req.event_id), new_entry(req));
        return ClaimOutcome::Claimed {
            attempt: 1,
            kind: ClaimKind::New,
            lease_until: req.now + req.lease_ms,
            previous: None,
        };
    };
    match found(e, req) {
        Found::Answer(outcome) => outcome,
        Found::Hold => {
            hold_ended(e, req.now);
            outcome_unknown(e.send)
        }
        Found::Claim => take_over(e, req),
    }
}

fn settle_in(t: &mut Tables, req: &SettleRequest<'_>) -> SettleResult {
    let Some(e) = t.records.get_mut(&key(req.route, req.event_id)) else {
        return SettleResult::Stale;
    };
    let current = Current {
        state: e.record.state,
        attempts: e.record.attempts,
    };
    let end = match req.outcome {
        SettleOutcome::Delivered { .. } => AttemptEnd::Settled,
        SettleOutcome::Failed { .. } => AttemptEnd::Failed,
        SettleOutcome::Ambiguous { .. } => AttemptEnd::Ambiguous,
    };
    let result = claim::settle(Some(current), req.attempt, end);
    let status = apply_settle(e, req, result);
    // the first attempt of a record it delivered is the record's own
    // columns (see `Entry::first_attempt`), never a row
    if !(req.attempt == 1 && e.first_delivered()) {
        let row = Attempt {
            attempt: req.attempt,
            started_at: req.started_at,
            ended_at: Some(req.now),
            status,
            result: result.as_str().into(),
            error: req.attempt_error.map(str::to_owned),
            duration_ms: Some(req.now - req.started_at),
            instance: Some(req.instance.to_owned()),
        };
        match e.attempts.get(&req.attempt) {
            Some(kept) if kept.result == SettleResult::Delivered.as_str() => {}
            _ => {
                e.attempts.insert(req.attempt, row);
            }
        }
    }
    if req.attempt > ATTEMPTS_KEPT {
        e.attempts = e.attempts.split_off(&(req.attempt - ATTEMPTS_KEPT + 1));
    }
    result
}

/// Writes what the settle changed; the status its attempt's row shows.
fn apply_settle(e: &mut Entry, req: &SettleRequest<'_>, result: SettleResult) -> Option<i64> {
    let (status, error) = match req.outcome {
        SettleOutcome::Delivered { status, .. } => (Some(i64::from(status)), None),
        SettleOutcome::Failed { status, error } => (status.map(i64::from), error),
        SettleOutcome::Ambiguous { error } => (None, error),
    };
    let r = &mut e.record;
    let state = match result {
        SettleResult::Stale => return status,
        SettleResult::Delivered => State::Delivered,
        SettleResult::Released => State::Failed,
        SettleResult::Ambiguous => State::Ambiguous,
    };
    r.state = state;
    r.last_status = status;
    r.last_error = error.map(str::to_owned);
    r.lease_until = None;
    r.updated_at = req.now;
    r.expires_at = req.now + req.retention_ms;
    if let SettleOutcome::Delivered {
        content_type,
        body,
        headers,
        ..
    } = req.outcome
    {
        e.replay_headers = headers.cloned();
        r.delivered_at = Some(req.now);
        // the replay's status and type only beside a stored body
        let kept = body.is_some();
        r.replay_status = status.filter(|_| kept);
        r.replay_content_type = content_type.filter(|_| kept).map(str::to_owned);
        r.replay_body_bytes = body.map(|b| b.len() as i64);
        e.replay_body = body.map(<[u8]>::to_vec);
    }
    status
}

/// Whether a record passes a list's filter.
fn listed(r: &Record, f: &ListFilter) -> bool {
    f.route.as_ref().is_none_or(|route| &r.route == route)
        && f.state.is_none_or(|s| r.state == s)
        && f.id_prefix
            .as_ref()
            .is_none_or(|p| r.event_id.as_bytes().starts_with(p.as_bytes()))
        && f.lease_ended_by.is_none_or(|at| {
            r.state == State::Processing && r.lease_until.is_none_or(|until| until <= at)
        })
        && f.after.as_ref().is_none_or(|k| {
            r.first_seen_at < k.first_seen_at
                || (r.first_seen_at == k.first_seen_at
                    && (r.route.as_str(), r.event_id.as_str())
                        > (k.route.as_str(), k.event_id.as_str()))
        })
}

/// The list's order: newest first, then route, then event ID.
fn list_order(a: &Record, b: &Record) -> std::cmp::Ordering {
    b.first_seen_at
        .cmp(&a.first_seen_at)
        .then_with(|| a.route.cmp(&b.route))
        .then_with(|| a.event_id.cmp(&b.event_id))
}

/// Whether a bulk release takes this record (SPEC §14): of the route and
/// state, in the window, changed before the release began, and for
/// `processing` only with its lease ended.
fn bulk_selects(e: &Entry, req: &BulkRelease<'_>) -> bool {
    let r = &e.record;
    r.route == req.route
        && r.state == req.state
        && (req.state != State::Processing || e.lease_ended(req.now))
        && req.updated_after.is_none_or(|t| r.updated_at >= t)
        && req.updated_before.is_none_or(|t| r.updated_at < t)
        && r.updated_at < req.now
}

impl Backend for MemoryStore {
    const OP_TIMEOUT: Duration = Duration::from_secs(5);

    async fn migrate(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn claim(
        &self,
        req: &ClaimRequest<'_>,
        _limit: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        Ok(claim_in(&mut self.tables(), req))
    }

    async fn settle(
        &self,
        req: &SettleRequest<'_>,
        _limit: Duration,
    ) -> Result<SettleResult, StoreError> {
        Ok(settle_in(&mut self.tables(), req))
    }

    async fn peek(&self, req: &ClaimRequest<'_>) -> Result<Option<ClaimOutcome>, StoreError> {
        let t = self.tables();
        let Some(e) = t.records.get(&key(req.route, req.event_id)) else {
            return Ok(None);
        };
        Ok(match found(e, req) {
            Found::Answer(outcome) => Some(outcome),
            Found::Claim | Found::Hold => None,
        })
    }

    async fn get(&self, route: &str, event_id: &str) -> Result<Option<Record>, StoreError> {
        let t = self.tables();
        Ok(t.records
            .get(&key(route, event_id))
            .map(|e| e.record.clone()))
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
        let t = self.tables();
        let mut found: Vec<Record> = (t.records.values())
            .filter(|e| listed(&e.record, filter))
            .map(|e| e.record.clone())
            .collect();
        found.sort_by(list_order);
        found.truncate(usize::try_from(filter.limit.max(0)).unwrap_or(usize::MAX));
        Ok(found)
    }

    async fn release(&self, req: &ReleaseRequest<'_>) -> Result<ReleaseOutcome, StoreError> {
        let mut t = self.tables();
        let Some(e) = t.records.get_mut(&key(req.route, req.event_id)) else {
            return Ok(ReleaseOutcome::NotFound);
        };
        let previous = e.record.state;
        if previous == State::Delivered && !req.force {
            return Ok(ReleaseOutcome::RefusedDelivered);
        }
        if e.first_delivered() {
            e.add_attempt(e.first_attempt());
        }
        release_to_failed(e, "released by operator", req.now);
        Ok(ReleaseOutcome::Released { previous })
    }

    async fn sweep(&self, now: Millis, limit: i64) -> Result<u64, StoreError> {
        let mut t = self.tables();
        let mut expired: Vec<(Millis, Key)> = (t.records.iter())
            .filter(|(_, e)| {
                let r = &e.record;
                let live = r.state == State::Processing && r.lease_until.is_some_and(|u| u > now);
                r.expires_at <= now && !live
            })
            .map(|(k, e)| (e.record.expires_at, k.clone()))
            .collect();
        expired.sort();
        expired.truncate(usize::try_from(limit.max(0)).unwrap_or(usize::MAX));
        for (_, k) in &expired {
            t.records.remove(k);
        }
        Ok(expired.len() as u64)
    }

    async fn oldest_processing(&self) -> Result<Vec<(String, Millis)>, StoreError> {
        let t = self.tables();
        let mut oldest: BTreeMap<String, Millis> = BTreeMap::new();
        for e in t.records.values() {
            if e.record.state == State::Processing {
                let at = oldest
                    .entry(e.record.route.clone())
                    .or_insert(e.record.updated_at);
                *at = (*at).min(e.record.updated_at);
            }
        }
        Ok(oldest.into_iter().collect())
    }

    async fn resolve(&self, req: &ResolveRequest<'_>) -> Result<ResolveOutcome, StoreError> {
        let mut t = self.tables();
        let Some(e) = t.records.get_mut(&key(req.route, req.event_id)) else {
            return Ok(ResolveOutcome::NotFound);
        };
        if e.record.state != State::Ambiguous {
            return Ok(ResolveOutcome::NotAmbiguous(e.record.state));
        }
        match req.how {
            Resolution::Delivered { status } => delivered_by_word(e, status, req.now),
            Resolution::Failed => {
                release_to_failed(e, "resolved by an operator as not done", req.now)
            }
        }
        Ok(ResolveOutcome::Resolved)
    }

    async fn release_unacknowledged(
        &self,
        claim: &UnacknowledgedClaim<'_>,
    ) -> Result<bool, StoreError> {
        let mut t = self.tables();
        let Some(e) = t.records.get_mut(&key(claim.route, claim.event_id)) else {
            return Ok(false);
        };
        if e.record.state != State::Processing || e.claim_token != claim.token {
            return Ok(false);
        }
        let r = &mut e.record;
        r.state = State::Failed;
        r.lease_until = None;
        r.updated_at = claim.now;
        r.last_error =
            Some("the claim was not acknowledged by the store; released before any forward".into());
        Ok(true)
    }

    async fn history(&self, route: &str, event_id: &str) -> Result<Vec<Attempt>, StoreError> {
        let t = self.tables();
        let Some(e) = t.records.get(&key(route, event_id)) else {
            return Ok(Vec::new());
        };
        let mut rows: BTreeMap<i64, Attempt> = e.attempts.clone();
        if e.first_delivered() {
            // the record says how its first attempt ended: a row that
            // guessed it lost is replaced, a real one kept
            let lost = |a: &Attempt| a.error.as_deref() == Some(LEASE_LOST);
            if rows.get(&1).is_none_or(lost) {
                rows.insert(1, e.first_attempt());
            }
        }
        let mut rows: Vec<Attempt> = rows.into_values().collect();
        rows.extend(e.questions.iter().cloned());
        // each question after the attempt it asked about (stable: SQL's
        // ORDER BY attempt, started_at)
        rows.sort_by_key(|a| (a.attempt, a.started_at));
        Ok(rows)
    }

    async fn release_bulk(&self, req: &BulkRelease<'_>, batch: i64) -> Result<u64, StoreError> {
        if req.state == State::Delivered {
            return Err(StoreError::Unavailable(
                "a delivered record is never released in bulk".into(),
            ));
        }
        let mut t = self.tables();
        let selected = (t.records.values_mut()).filter(|e| bulk_selects(e, req));
        if req.dry_run {
            return Ok(selected.count() as u64);
        }
        let mut released = 0;
        for e in selected.take(usize::try_from(batch.max(0)).unwrap_or(usize::MAX)) {
            release_to_failed(e, "released by operator", req.now);
            released += 1;
        }
        Ok(released)
    }

    async fn set_paused(&self, route: &str, paused: bool, now: Millis) -> Result<(), StoreError> {
        let mut t = self.tables();
        if paused {
            t.pauses.entry(route.to_owned()).or_insert(now);
        } else {
            t.pauses.remove(route);
        }
        Ok(())
    }

    async fn paused(&self) -> Result<Vec<(String, Millis)>, StoreError> {
        let t = self.tables();
        Ok(t.pauses.iter().map(|(r, at)| (r.clone(), *at)).collect())
    }

    async fn ambiguous_counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let t = self.tables();
        let mut counts: BTreeMap<String, i64> = BTreeMap::new();
        for e in t.records.values() {
            if e.record.state == State::Ambiguous {
                *counts.entry(e.record.route.clone()).or_default() += 1;
            }
        }
        Ok(counts.into_iter().collect())
    }

    async fn hold_ended_leases(&self, now: Millis, limit: i64) -> Result<u64, StoreError> {
        let mut t = self.tables();
        let mut ended: Vec<(Millis, Key)> = (t.records.iter())
            .filter(|(_, e)| e.hold && e.lease_ended(now))
            .map(|(k, e)| (e.record.updated_at, k.clone()))
            .collect();
        ended.sort();
        ended.truncate(usize::try_from(limit.max(0)).unwrap_or(usize::MAX));
        for (_, k) in &ended {
            if let Some(e) = t.records.get_mut(k) {
                hold_ended(e, now);
            }
        }
        Ok(ended.len() as u64)
    }

    async fn reconciled(&self, req: &Reconciliation<'_>) -> Result<ResolveOutcome, StoreError> {
        let mut t = self.tables();
        let Some(e) = t.records.get_mut(&key(req.route, req.event_id)) else {
            return Ok(ResolveOutcome::NotFound);
        };
        if e.record.state != State::Ambiguous || e.record.attempts != req.attempts {
            return Ok(ResolveOutcome::NotAmbiguous(e.record.state));
        }
        e.questions.push(Attempt {
            attempt: req.attempts,
            started_at: req.started_at,
            ended_at: Some(req.now),
            status: req.status.map(i64::from),
            result: req.learned.result().into(),
            error: Some(req.detail.into()),
            duration_ms: Some(req.now - req.started_at),
            instance: Some(req.instance.into()),
        });
        let kept = usize::try_from(ATTEMPTS_KEPT).unwrap_or(usize::MAX);
        let extra = e.questions.len().saturating_sub(kept);
        e.questions.drain(..extra);
        match req.learned {
            Learned::Done { status } => delivered_by_word(e, status, req.now),
            Learned::NotDone => release_to_failed(
                e,
                "the consumer said it never acted on it (reconciled)",
                req.now,
            ),
            Learned::Unknown => {}
        }
        Ok(ResolveOutcome::Resolved)
    }

    async fn take_questions(&self, batch: &QuestionBatch<'_>) -> Result<Vec<String>, StoreError> {
        let mut t = self.tables();
        let mut due: Vec<(Millis, String)> = (t.records.values())
            .filter(|e| {
                let r = &e.record;
                r.route == batch.route
                    && r.state == State::Ambiguous
                    && e.reconcile_after.is_none_or(|at| at <= batch.now)
            })
            .map(|e| (e.record.updated_at, e.record.event_id.clone()))
            .collect();
        due.sort();
        due.truncate(usize::try_from(batch.limit.max(0)).unwrap_or(usize::MAX));
        for (_, id) in &due {
            if let Some(e) = t.records.get_mut(&key(batch.route, id)) {
                e.reconcile_after = Some(batch.next_at);
            }
        }
        Ok(due.into_iter().map(|(_, id)| id).collect())
    }

    async fn close(&self) {}
}

/// A record found delivered with `status` (an operator's resolve, the
/// consumer's answer to a question), its lease gone, its retention span
/// kept from `now` on.
fn delivered_by_word(e: &mut Entry, status: u16, now: Millis) {
    let r = &mut e.record;
    r.state = State::Delivered;
    r.last_status = Some(i64::from(status));
    r.last_error = None;
    r.lease_until = None;
    r.delivered_at = Some(now);
    e.touch(now);
}

/// A record released by hand to `failed`, its lease gone, its retention
/// span kept from `now` on.
fn release_to_failed(e: &mut Entry, why: &str, now: Millis) {
    e.record.state = State::Failed;
    e.record.lease_until = None;
    e.record.last_error = Some(why.into());
    e.touch(now);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::{decide, Decision, Existing, Refusal};
    use crate::store::{Bounded, ClaimStore};

    const T0: Millis = 1_000_000;
    const LEASE: Millis = 1_000;
    const D1: &str = "d1";
    const D2: &str = "d2";

    fn claim_req<'a>(
        event_id: &'a str,
        digest: &'a str,
        now: Millis,
        hold: bool,
    ) -> ClaimRequest<'a> {
        ClaimRequest {
            route: "r",
            event_id,
            digest,
            now,
            lease_ms: LEASE,
            retention_ms: 10 * LEASE,
            hold,
            trace: None,
            instance: "i",
            token: 7,
        }
    }

    /// Settles attempt `attempt` of the record `event_id` (route `r`),
    /// which began `now`, as of `now`.
    async fn settle(
        s: &Bounded<MemoryStore>,
        event_id: &str,
        attempt: i64,
        now: Millis,
        outcome: SettleOutcome<'static>,
    ) -> SettleResult {
        let req = SettleRequest {
            route: "r",
            event_id,
            attempt,
            started_at: now,
            instance: "i",
            attempt_error: None,
            now,
            retention_ms: 10 * LEASE,
            outcome,
        };
        s.settle(&req).await.unwrap()
    }

    const DELIVERED: SettleOutcome<'static> = SettleOutcome::Delivered {
        status: 200,
        content_type: None,
        body: None,
        headers: None,
    };
    const FAILED: SettleOutcome<'static> = SettleOutcome::Failed {
        status: Some(500),
        error: None,
    };
    const AMBIGUOUS: SettleOutcome<'static> = SettleOutcome::Ambiguous { error: None };

    /// A store holding one record `e` in `state` (with a lease that ends at
    /// `T0 + LEASE`, claimed under `hold`), or none.
    async fn with_record(state: Option<State>, hold: bool) -> Bounded<MemoryStore> {
        let s = Bounded::new(MemoryStore::new());
        let Some(state) = state else { return s };
        s.claim(&claim_req("e", D1, T0, hold)).await.unwrap();
        let end = match state {
            State::Processing => return s,
            State::Delivered => DELIVERED,
            State::Failed => FAILED,
            State::Ambiguous => AMBIGUOUS,
        };
        settle(&s, "e", 1, T0, end).await;
        s
    }

    fn outcome_as_decision(out: &ClaimOutcome) -> Decision {
        match out {
            ClaimOutcome::Claimed { kind, .. } => Decision::Claim(*kind),
            ClaimOutcome::Existing { decision, .. } => Decision::Refuse(*decision),
        }
    }

    /// Every state (and none), both digests, a live and an ended lease,
    /// both `on_ambiguous` settings: the model's claim answers what
    /// `claim::decide` says (a held ended lease answers outcome-unknown and
    /// leaves the record `ambiguous`).
    #[tokio::test]
    async fn claims_follow_decide_in_every_case() {
        let states = [
            None,
            Some(State::Processing),
            Some(State::Delivered),
            Some(State::Failed),
            Some(State::Ambiguous),
        ];
        for state in states {
            for digest in [D1, D2] {
                for now in [T0 + 1, T0 + LEASE] {
                    for hold in [false, true] {
                        let s = with_record(state, hold).await;
                        let existing = s.get("r", "e").await.unwrap().map(|r| Existing {
                            state: r.state,
                            lease_until: r.lease_until,
                            same_digest: digest == D1,
                        });
                        let want = decide(existing, now, hold);
                        let got = s.claim(&claim_req("e", digest, now, hold)).await.unwrap();
                        let case = format!("{state:?} {digest} {now} hold={hold}");
                        match want {
                            Decision::Hold => {
                                assert_eq!(
                                    outcome_as_decision(&got),
                                    Decision::Refuse(Refusal::OutcomeUnknown),
                                    "{case}"
                                );
                                assert_eq!(
                                    s.get("r", "e").await.unwrap().unwrap().state,
                                    State::Ambiguous,
                                    "{case}"
                                );
                            }
                            want => assert_eq!(outcome_as_decision(&got), want, "{case}"),
                        }
                    }
                }
            }
        }
    }

    /// Every state, attempt (the claim's and an older one) and end: the
    /// model's settle answers what `claim::settle` says, and changes the
    /// record exactly when it is not stale.
    #[tokio::test]
    async fn settles_follow_settle_in_every_case() {
        let ends = [
            (DELIVERED, AttemptEnd::Settled),
            (FAILED, AttemptEnd::Failed),
            (AMBIGUOUS, AttemptEnd::Ambiguous),
        ];
        for state in State::ALL {
            for attempt in [1, 2] {
                for (outcome, end) in ends.clone() {
                    let s = with_record(Some(state), false).await;
                    // a second attempt of a failed record claims it again
                    let before = s.get("r", "e").await.unwrap().unwrap();
                    let want = claim::settle(
                        Some(Current {
                            state: before.state,
                            attempts: before.attempts,
                        }),
                        attempt,
                        end,
                    );
                    let got = settle(&s, "e", attempt, T0 + 5, outcome).await;
                    let case = format!("{state:?} attempt {attempt} {end:?}");
                    assert_eq!(got, want, "{case}");
                    let after = s.get("r", "e").await.unwrap().unwrap();
                    assert_eq!(
                        after.updated_at != before.updated_at,
                        want != SettleResult::Stale,
                        "{case}"
                    );
                }
            }
        }
        let s = with_record(None, false).await;
        assert_eq!(settle(&s, "e", 1, T0, DELIVERED).await, SettleResult::Stale);
    }

    /// Resolve takes only an ambiguous record; the token-fenced release
    /// only its own claim.
    #[tokio::test]
    async fn resolve_and_unacknowledged_release() {
        let s = with_record(Some(State::Ambiguous), true).await;
        let resolve = |how| ResolveRequest {
            route: "r",
            event_id: "e",
            how,
            now: T0 + 9,
        };
        assert_eq!(
            s.resolve(&resolve(Resolution::Delivered { status: 201 }))
                .await
                .unwrap(),
            ResolveOutcome::Resolved
        );
        assert_eq!(
            s.resolve(&resolve(Resolution::Failed)).await.unwrap(),
            ResolveOutcome::NotAmbiguous(State::Delivered)
        );
        let replay = s.claim(&claim_req("e", D1, T0 + 10, true)).await.unwrap();
        assert!(
            matches!(replay, ClaimOutcome::Existing { decision: Refusal::Replay, ref recorded } if recorded.status == Some(201))
        );

        let s = with_record(Some(State::Processing), false).await;
        let claim = |token| UnacknowledgedClaim {
            route: "r",
            event_id: "e",
            token,
            now: T0 + 1,
        };
        assert!(
            !s.release_unacknowledged(&claim(8)).await.unwrap(),
            "another claim's token"
        );
        assert!(s.release_unacknowledged(&claim(7)).await.unwrap());
        assert_eq!(s.get("r", "e").await.unwrap().unwrap().state, State::Failed);
        assert!(
            !s.release_unacknowledged(&claim(7)).await.unwrap(),
            "no longer processing"
        );
    }

    /// The bulk release's window and state, and pauses.
    #[tokio::test]
    async fn bulk_release_and_pauses() {
        let s = Bounded::new(MemoryStore::new());
        for (id, at) in [("a", T0), ("b", T0 + 100), ("c", T0 + 200)] {
            s.claim(&claim_req(id, D1, at, false)).await.unwrap();
            settle(&s, id, 1, at, FAILED).await;
        }
        let bulk = |dry_run, updated_before| BulkRelease {
            route: "r",
            state: State::Failed,
            updated_after: Some(T0 + 50),
            updated_before,
            dry_run,
            now: T0 + 300,
        };
        assert_eq!(s.release_bulk(&bulk(true, None)).await.unwrap(), 2);
        assert_eq!(
            s.release_bulk(&bulk(false, Some(T0 + 150))).await.unwrap(),
            1
        );
        assert_eq!(
            s.get("r", "b")
                .await
                .unwrap()
                .unwrap()
                .last_error
                .as_deref(),
            Some("released by operator")
        );
        assert_eq!(s.get("r", "c").await.unwrap().unwrap().updated_at, T0 + 200);
        let delivered = BulkRelease {
            state: State::Delivered,
            ..bulk(false, None)
        };
        assert!(s.release_bulk(&delivered).await.is_err());

        s.set_paused("r", true, T0).await.unwrap();
        s.set_paused("r", true, T0 + 1).await.unwrap();
        assert_eq!(s.paused().await.unwrap(), [("r".to_string(), T0)]);
        s.set_paused("r", false, T0 + 2).await.unwrap();
        assert!(s.paused().await.unwrap().is_empty());
    }
}
