//! The [`Backend`] operations of [`ValkeyStore`]: the claim's path (claim,
//! settle, peek), the operator's reads and release, the sweep and the
//! oldest claim here; the operator's other actions in `operator`.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::link::Conn;
use redis::Value;

use super::keys::{self, Bucket};
use super::{decode, driver, oldest_by_bucket, operator, opt, questions, scripts, ValkeyStore};
use crate::claim::{Millis, SettleResult};
use crate::store::sql;
use crate::store::{
    Attempt, Backend, BulkRelease, ClaimOutcome, ClaimRequest, EngineReport, Found, ListFilter,
    QuestionBatch, Reconciliation, Record, ReleaseOutcome, ReleaseRequest, ResolveOutcome,
    ResolveRequest, SettleOutcome, SettleRequest, StoreError, TraceRef, UnacknowledgedClaim,
};

impl Backend for ValkeyStore {
    /// Bounds every operation; a durability wait is at most [`WAIT_LIMIT`].
    const OP_TIMEOUT: Duration = Duration::from_secs(5);

    /// Checks that every shard can make writes durable (first: a write
    /// to a server that cannot take it would say less), then writes the
    /// format version, refusing a newer one.
    async fn migrate(&self) -> Result<(), StoreError> {
        self.check_shards().await?;
        let mut conn = self.conn();
        let _: bool = redis::cmd("SET")
            .arg(keys::FORMAT)
            .arg(keys::FORMAT_VERSION)
            .arg("NX")
            .query_async(&mut conn)
            .await
            .map(|v: Option<String>| v.is_some())
            .map_err(driver)?;
        let found: Option<i64> = redis::cmd("GET")
            .arg(keys::FORMAT)
            .query_async(&mut conn)
            .await
            .map_err(driver)?;
        if let Some(v) = found.filter(|&v| v > keys::FORMAT_VERSION) {
            return Err(StoreError::Migration(
                format!(
                    "the store's format is version {v}; this idemgate knows up to {}",
                    keys::FORMAT_VERSION
                )
                .into(),
            ));
        }
        Ok(())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let _: Option<i64> = redis::cmd("GET")
            .arg(keys::FORMAT)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.failed(e))?;
        self.check_shards().await
    }

    fn report(&self) -> EngineReport {
        EngineReport {
            shards: Some(self.shards_seen.load(Ordering::Relaxed)).filter(|&n| n > 0),
            waits: self.durable.take_waits(),
        }
    }

    // long: the script's keys and arguments, one a line, then its three
    // answers
    async fn claim(
        &self,
        req: &ClaimRequest<'_>,
        _limit: Duration,
    ) -> Result<ClaimOutcome, StoreError> {
        self.register_route(req.route).await?;
        let b = Bucket::of(req.route, req.event_id);
        let lease_until = req.now + req.lease_ms;
        let keys = [
            b.record(req.event_id),
            b.attempts(req.event_id),
            b.by_first_seen(),
            b.by_expiry(),
            b.processing(),
            b.ambiguous(),
        ];
        let args: Vec<Vec<u8>> = vec![
            req.event_id.into(),
            req.digest.into(),
            req.now.to_string().into(),
            lease_until.to_string().into(),
            (req.now + req.retention_ms).to_string().into(),
            if req.hold { "1" } else { "0" }.into(),
            req.instance.into(),
            req.token.to_string().into(),
            opt(req.trace.map(|t| t.stored())),
        ];
        let cmd = super::evalsha(&self.scripts.claim, &keys, &args);
        let (lease, sent) = self.durable.lease_to_send(b.slot, Some(&cmd)).await;
        let (value, wrote) = self
            .eval(&lease, b.slot, &self.scripts.claim, &cmd, sent)
            .await?;
        match decode::claim(value)? {
            decode::Claimed::Won {
                attempt,
                from,
                replaced,
            } => {
                lease.wait(b.slot, wrote).await?;
                Ok(sql::claimed(
                    attempt,
                    from.as_deref(),
                    replaced.as_deref(),
                    lease_until,
                ))
            }
            decode::Claimed::Held { trace } => {
                lease.wait(b.slot, wrote).await?;
                Ok(crate::store::outcome_unknown(TraceRef::from_column(
                    trace.as_deref(),
                )))
            }
            decode::Claimed::Existing(found) => {
                // nothing written: the lane's round need not wait for it
                drop(lease);
                match found.outcome(req.digest, req.now, req.hold) {
                    Found::Answer(outcome) => Ok(outcome),
                    Found::Claim | Found::Hold => Err(StoreError::Corrupt(
                        "the claim script refused a claimable record".into(),
                    )),
                }
            }
        }
    }

    async fn settle(
        &self,
        req: &SettleRequest<'_>,
        _limit: Duration,
    ) -> Result<SettleResult, StoreError> {
        let b = Bucket::of(req.route, req.event_id);
        let (outcome, status, error, replay, changed): (_, _, _, _, SettleResult) =
            match req.outcome {
                SettleOutcome::Delivered {
                    status,
                    content_type,
                    body,
                    ..
                } => (
                    "delivered",
                    Some(status),
                    None,
                    body.map(|b| (status, content_type, b)),
                    SettleResult::Delivered,
                ),
                SettleOutcome::Failed { status, error } => {
                    ("failed", status, error, None, SettleResult::Released)
                }
                SettleOutcome::Ambiguous { error } => {
                    ("ambiguous", None, error, None, SettleResult::Ambiguous)
                }
            };
        let keys = b.state_change_keys(req.event_id);
        let args: Vec<Vec<u8>> = vec![
            req.event_id.into(),
            outcome.into(),
            req.attempt.to_string().into(),
            req.now.to_string().into(),
            (req.now + req.retention_ms).to_string().into(),
            opt(status.map(|s| s.to_string())),
            opt(error),
            opt(replay.map(|(s, _, _)| s.to_string())),
            opt(replay.and_then(|(_, ct, _)| ct)),
            opt(replay.map(|(_, _, body)| body)),
            req.started_at.to_string().into(),
            req.instance.into(),
            opt(req.attempt_error),
            opt(replay_headers(&req.outcome)),
        ];
        let value = self
            .write(b.slot, &self.scripts.settle, &keys, &args)
            .await?;
        let rows: i64 = redis::from_redis_value(value)
            .map_err(|e| StoreError::Corrupt(format!("settle: {e}")))?;
        Ok(sql::settled(rows as u64, changed))
    }

    async fn peek(&self, req: &ClaimRequest<'_>) -> Result<Option<ClaimOutcome>, StoreError> {
        let b = Bucket::of(req.route, req.event_id);
        let mut conn = self.conn();
        let value: Value = redis::cmd("HMGET")
            .arg(b.record(req.event_id))
            .arg(&decode::READBACK_FIELDS[..])
            .query_async(&mut conn)
            .await
            .map_err(|e| self.failed(e))?;
        Ok(match decode::readback(value)? {
            None => None,
            Some(found) => match found.outcome(req.digest, req.now, req.hold) {
                Found::Answer(outcome) => Some(outcome),
                Found::Claim | Found::Hold => None,
            },
        })
    }

    async fn get(&self, route: &str, event_id: &str) -> Result<Option<Record>, StoreError> {
        let b = Bucket::of(route, event_id);
        let mut conn = self.conn();
        let value: Value = redis::cmd("HGETALL")
            .arg(b.record(event_id))
            .query_async(&mut conn)
            .await
            .map_err(driver)?;
        decode::record(route, event_id, value)
    }

    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError> {
        let routes = self.routes(filter.route.as_deref()).await?;
        let max = filter
            .after
            .as_ref()
            .map_or("+inf".to_string(), |k| k.first_seen_at.to_string());
        let args_tail: Vec<Vec<u8>> = vec![
            max.into(),
            opt(filter.state.map(|s| s.as_str())),
            opt(filter.id_prefix.as_deref()),
            opt(filter.lease_ended_by.map(|t| t.to_string())),
            filter.limit.to_string().into(),
        ];
        let pages = self
            .every_bucket(&routes, |conn, b| list_bucket(conn, b, args_tail.clone()))
            .await?;
        let mut all = Vec::new();
        for (route, page) in pages {
            for (event_id, fields) in page {
                if let Some(r) = decode::record(&route, &event_id, fields)? {
                    all.push(r);
                }
            }
        }
        if let Some(key) = &filter.after {
            all.retain(|r| {
                r.first_seen_at < key.first_seen_at
                    || (r.first_seen_at == key.first_seen_at
                        && (r.route.as_str(), r.event_id.as_str())
                            > (key.route.as_str(), key.event_id.as_str()))
            });
        }
        all.sort_by(|a, b| {
            b.first_seen_at
                .cmp(&a.first_seen_at)
                .then_with(|| a.route.cmp(&b.route))
                .then_with(|| a.event_id.cmp(&b.event_id))
        });
        all.truncate(usize::try_from(filter.limit).unwrap_or(0));
        Ok(all)
    }

    async fn release(&self, req: &ReleaseRequest<'_>) -> Result<ReleaseOutcome, StoreError> {
        let b = Bucket::of(req.route, req.event_id);
        let keys = b.state_change_keys(req.event_id);
        let args: Vec<Vec<u8>> = vec![
            req.event_id.into(),
            req.now.to_string().into(),
            if req.force { "1" } else { "0" }.into(),
        ];
        let value = self
            .write(b.slot, &self.scripts.release, &keys, &args)
            .await?;
        decode::release(value)
    }

    /// The oldest expired records first, over every bucket: each bucket's
    /// oldest `limit`, merged, then the first `limit` of those deleted by
    /// their bucket's script (which checks each again).
    async fn sweep(&self, now: Millis, limit: i64) -> Result<u64, StoreError> {
        let routes = self.routes(None).await?;
        let candidates = self
            .every_bucket(&routes, |mut conn, b| async move {
                let found: Vec<(String, f64)> = redis::cmd("ZRANGEBYSCORE")
                    .arg(b.by_expiry())
                    .arg("-inf")
                    .arg(now)
                    .arg("WITHSCORES")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit)
                    .query_async(&mut conn)
                    .await
                    .map_err(driver)?;
                Ok((b, found))
            })
            .await?;
        let mut deleted = 0u64;
        for (b, ids) in oldest_by_bucket(&candidates, limit).values() {
            let mut keys = vec![
                b.by_first_seen(),
                b.by_expiry(),
                b.processing(),
                b.ambiguous(),
            ];
            let mut args: Vec<Vec<u8>> = vec![now.to_string().into()];
            for id in ids {
                keys.push(b.record(id));
                keys.push(b.attempts(id));
                keys.push(b.questions(id));
                args.push(id.as_bytes().to_vec());
            }
            let cmd = super::evalsha(&self.scripts.sweep, &keys, &args);
            let lease = self.durable.lease(b.slot).await;
            let (value, _) = self
                .eval(&lease, b.slot, &self.scripts.sweep, &cmd, None)
                .await?;
            drop(lease);
            let n: i64 = redis::from_redis_value(value)
                .map_err(|e| StoreError::Corrupt(format!("sweep: {e}")))?;
            deleted += n as u64;
        }
        Ok(deleted)
    }

    async fn oldest_processing(&self) -> Result<Vec<(String, Millis)>, StoreError> {
        let routes = self.routes(None).await?;
        let firsts = self
            .every_bucket(&routes, |mut conn, b| async move {
                let first: Vec<(String, f64)> = redis::cmd("ZRANGE")
                    .arg(b.processing())
                    .arg(0)
                    .arg(0)
                    .arg("WITHSCORES")
                    .query_async(&mut conn)
                    .await
                    .map_err(driver)?;
                Ok(first.first().map(|(_, at)| *at as Millis))
            })
            .await?;
        let mut oldest: BTreeMap<String, Millis> = BTreeMap::new();
        for (route, at) in firsts {
            if let Some(at) = at {
                let e = oldest.entry(route).or_insert(at);
                *e = (*e).min(at);
            }
        }
        Ok(oldest.into_iter().collect())
    }

    async fn resolve(&self, req: &ResolveRequest<'_>) -> Result<ResolveOutcome, StoreError> {
        operator::resolve(self, req).await
    }

    async fn release_unacknowledged(
        &self,
        claim: &UnacknowledgedClaim<'_>,
    ) -> Result<bool, StoreError> {
        operator::release_unacknowledged(self, claim).await
    }

    async fn history(&self, route: &str, event_id: &str) -> Result<Vec<Attempt>, StoreError> {
        let mut rows = operator::history(self, route, event_id).await?;
        rows.extend(questions::of(self, route, event_id).await?);
        // each question after the attempt it asked about (stable)
        rows.sort_by_key(|a| (a.attempt, a.started_at));
        Ok(rows)
    }

    async fn release_bulk(&self, req: &BulkRelease<'_>, batch: i64) -> Result<u64, StoreError> {
        operator::release_bulk(self, req, batch).await
    }

    async fn set_paused(&self, route: &str, paused: bool, now: Millis) -> Result<(), StoreError> {
        operator::set_paused(self, route, paused, now).await
    }

    async fn paused(&self) -> Result<Vec<(String, Millis)>, StoreError> {
        operator::paused(self).await
    }

    async fn ambiguous_counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        operator::ambiguous_counts(self).await
    }

    async fn hold_ended_leases(&self, now: Millis, limit: i64) -> Result<u64, StoreError> {
        operator::hold_ended_leases(self, now, limit).await
    }

    async fn reconciled(&self, req: &Reconciliation<'_>) -> Result<ResolveOutcome, StoreError> {
        questions::reconciled(self, req).await
    }

    async fn take_questions(&self, batch: &QuestionBatch<'_>) -> Result<Vec<String>, StoreError> {
        questions::take(self, batch).await
    }

    async fn close(&self) {}
}

/// One bucket's page of a list ([`scripts::LIST_BUCKET`]): event IDs and
/// their fields. A read: no durability wait.
async fn list_bucket(
    conn: Conn,
    b: Bucket,
    tail: Vec<Vec<u8>>,
) -> Result<Vec<(String, Value)>, StoreError> {
    let mut args = vec![b.record_prefix().into_bytes()];
    args.extend(tail);
    let page =
        operator::eval_read(conn, scripts::LIST_BUCKET, vec![b.by_first_seen()], args).await?;
    decode::list_page(page)
}

/// The delivered settle's replayed headers, as kept (SPEC §22).
fn replay_headers<'a>(outcome: &SettleOutcome<'a>) -> Option<&'a str> {
    match outcome {
        SettleOutcome::Delivered { headers, .. } => headers.map(|h| h.stored()),
        _ => None,
    }
}
