//! The operator's actions and reads (SPEC §12–14) and the sweeper's hold
//! of ended leases on the sharded store, as `store::memory` models them
//! and `store::sql_operator` writes them in SQL. A change of one record is
//! one script on its slot ([`scripts`](super::scripts)), checked again
//! there, then made durable as a claim is. What spans routes asks every
//! bucket of every route, concurrently:
//! - `release_bulk`: each bucket's script walks its records (all of them
//!   when counting, up to the batch otherwise), then the batch is released
//!   bucket by bucket;
//! - `hold_ended_leases`: each bucket's `processing` index, a read (no
//!   write when nothing ended);
//! - `ambiguous_counts`: one `SCARD` of each bucket's ambiguous set, so
//!   routes × 256 small reads, whatever the number of records;
//! - `paused`: one hash, `idemgate:pauses`, on its own slot.

use std::collections::BTreeMap;

use super::link::Conn;
use redis::{Script, Value};

use super::keys::{self, Bucket};
use super::{decode, driver, oldest_by_bucket, opt, scripts, ValkeyStore};
use crate::claim::{Millis, State};
use crate::store::{
    state_of, Attempt, BulkRelease, Resolution, ResolveOutcome, ResolveRequest, StoreError,
    UnacknowledgedClaim,
};

/// What an attempt's error says when its lease ended without an answer.
const LEASE_LOST: &str = crate::store::sql::lease_lost!();

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

pub(super) async fn resolve(
    store: &ValkeyStore,
    req: &ResolveRequest<'_>,
) -> Result<ResolveOutcome, StoreError> {
    let b = Bucket::of(req.route, req.event_id);
    let keys = b.state_change_keys(req.event_id);
    let (how, status) = match req.how {
        Resolution::Delivered { status } => ("delivered", status.to_string()),
        Resolution::Failed => ("failed", String::new()),
    };
    let args: Vec<Vec<u8>> = vec![
        req.event_id.into(),
        req.now.to_string().into(),
        how.into(),
        status.into(),
    ];
    let value = store
        .write(b.slot, &store.scripts.resolve, &keys, &args)
        .await?;
    let answer: Vec<String> = redis::from_redis_value(value).map_err(|e| corrupt("resolve", e))?;
    match answer.as_slice() {
        [done] if done == "resolved" => Ok(ResolveOutcome::Resolved),
        [none] if none == "not_found" => Ok(ResolveOutcome::NotFound),
        [not, state] if not == "not_ambiguous" => {
            Ok(ResolveOutcome::NotAmbiguous(state_of(state)?))
        }
        other => Err(corrupt("resolve", format!("{other:?}"))),
    }
}

pub(super) async fn release_unacknowledged(
    store: &ValkeyStore,
    claim: &UnacknowledgedClaim<'_>,
) -> Result<bool, StoreError> {
    let b = Bucket::of(claim.route, claim.event_id);
    let keys = [b.record(claim.event_id), b.processing()];
    let args: Vec<Vec<u8>> = vec![
        claim.event_id.into(),
        claim.token.to_string().into(),
        claim.now.to_string().into(),
    ];
    let value = store
        .write(b.slot, &store.scripts.release_unacknowledged, &keys, &args)
        .await?;
    let n: i64 = redis::from_redis_value(value).map_err(|e| corrupt("release", e))?;
    Ok(n == 1)
}

/// The record's attempts, oldest first: the newest 20 rows, and for a
/// record its first attempt delivered, that attempt as the record says it
/// ended (a row that guessed it lost is replaced, as in `store::memory`).
pub(super) async fn history(
    store: &ValkeyStore,
    route: &str,
    event_id: &str,
) -> Result<Vec<Attempt>, StoreError> {
    let b = Bucket::of(route, event_id);
    let mut pipe = redis::pipe();
    pipe.cmd("HGETALL").arg(b.attempts(event_id));
    pipe.cmd("HGETALL").arg(b.record(event_id));
    pipe.cmd("HGET").arg(b.record(event_id)).arg("claimed_by");
    let mut conn = store.conn();
    let (rows, record, claimed_by): (Value, Value, Option<String>) =
        pipe.query_async(&mut conn).await.map_err(driver)?;
    let Some(r) = decode::record(route, event_id, record)? else {
        return Ok(Vec::new());
    };
    let mut rows = decode::attempts(rows)?;
    if r.state == State::Delivered && r.attempts == 1 {
        let first = Attempt {
            attempt: 1,
            started_at: r.first_seen_at,
            ended_at: r.delivered_at,
            status: r.last_status,
            result: "delivered".into(),
            error: None,
            duration_ms: r.delivered_at.map(|d| d - r.first_seen_at),
            instance: claimed_by,
        };
        match rows.iter_mut().find(|a| a.attempt == 1) {
            Some(row) if row.error.as_deref() == Some(LEASE_LOST) => *row = first,
            Some(_) => {}
            None => rows.insert(0, first),
        }
    }
    Ok(rows)
}

/// One batch of a bulk release (see the module doc), or with `dry_run`
/// the count of what it selects.
pub(super) async fn release_bulk(
    store: &ValkeyStore,
    req: &BulkRelease<'_>,
    batch: i64,
) -> Result<u64, StoreError> {
    let state = req.state.as_str();
    let window: [Vec<u8>; 2] = [
        opt(req.updated_after.map(|t| t.to_string())),
        opt(req.updated_before.map(|t| t.to_string())),
    ];
    let limit = if req.dry_run { 0 } else { batch.max(1) };
    let routes = [req.route.to_string()];
    let found = store
        .every_bucket(&routes, |conn, b| {
            let args: Vec<Vec<u8>> = vec![
                b.record_prefix().into(),
                state.into(),
                req.now.to_string().into(),
                window[0].clone(),
                window[1].clone(),
                limit.to_string().into(),
            ];
            let keys = vec![b.by_first_seen()];
            async move {
                let value = eval_read(conn, scripts::BULK_SELECT, keys, args).await?;
                let mut items = decode_items(value)?.into_iter();
                let n: u64 = items
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| corrupt("a bulk count", "missing"))?;
                Ok((b, n, items.collect::<Vec<String>>()))
            }
        })
        .await?;
    if req.dry_run {
        return Ok(found.iter().map(|(_, (_, n, _))| n).sum());
    }
    let mut left = usize::try_from(batch.max(0)).unwrap_or(usize::MAX);
    let mut released = 0;
    for (_, (b, _, ids)) in &found {
        let ids = &ids[..ids.len().min(left)];
        if ids.is_empty() {
            continue;
        }
        left -= ids.len();
        let mut keys = vec![b.by_expiry(), b.processing(), b.ambiguous()];
        let mut args: Vec<Vec<u8>> = vec![
            state.into(),
            req.now.to_string().into(),
            window[0].clone(),
            window[1].clone(),
        ];
        for id in ids {
            keys.push(b.record(id));
            keys.push(b.attempts(id));
            args.push(id.as_bytes().to_vec());
        }
        let value = store
            .write(b.slot, &store.scripts.bulk_release, &keys, &args)
            .await?;
        let n: u64 = redis::from_redis_value(value).map_err(|e| corrupt("bulk release", e))?;
        released += n;
    }
    Ok(released)
}

/// Adds (keeping a first `paused_at`) or removes the route's pause.
pub(super) async fn set_paused(
    store: &ValkeyStore,
    route: &str,
    paused: bool,
    now: Millis,
) -> Result<(), StoreError> {
    let mut cmd = redis::cmd(if paused { "HSETNX" } else { "HDEL" });
    cmd.arg(keys::PAUSES).arg(route);
    if paused {
        cmd.arg(now);
    }
    store
        .command_durably(keys::slot_of(keys::PAUSES), cmd)
        .await
        .map(drop)
}

pub(super) async fn paused(store: &ValkeyStore) -> Result<Vec<(String, Millis)>, StoreError> {
    let mut conn = store.conn();
    let all: BTreeMap<String, Millis> = redis::cmd("HGETALL")
        .arg(keys::PAUSES)
        .query_async(&mut conn)
        .await
        .map_err(driver)?;
    Ok(all.into_iter().collect())
}

pub(super) async fn ambiguous_counts(
    store: &ValkeyStore,
) -> Result<Vec<(String, i64)>, StoreError> {
    let routes = store.routes(None).await?;
    let counts = store
        .every_bucket(&routes, |mut conn, b| async move {
            let n: i64 = redis::cmd("SCARD")
                .arg(b.ambiguous())
                .query_async(&mut conn)
                .await
                .map_err(driver)?;
            Ok(n)
        })
        .await?;
    let mut per_route: BTreeMap<String, i64> = BTreeMap::new();
    for (route, n) in counts {
        if n > 0 {
            *per_route.entry(route).or_default() += n;
        }
    }
    Ok(per_route.into_iter().collect())
}

/// The oldest `limit` held records whose lease ended, over every bucket,
/// each bucket's turned by its script (which checks each again).
pub(super) async fn hold_ended_leases(
    store: &ValkeyStore,
    now: Millis,
    limit: i64,
) -> Result<u64, StoreError> {
    if limit <= 0 {
        return Ok(0);
    }
    let routes = store.routes(None).await?;
    let found = store
        .every_bucket(&routes, |conn, b| {
            let keys = vec![b.processing()];
            let args: Vec<Vec<u8>> = vec![
                b.record_prefix().into(),
                now.to_string().into(),
                limit.to_string().into(),
            ];
            async move {
                let value = eval_read(conn, scripts::HOLD_SELECT, keys, args).await?;
                let items = decode_items(value)?;
                let mut ended = Vec::with_capacity(items.len() / 2);
                for pair in items.chunks(2) {
                    if let [id, at] = pair {
                        let at: f64 = at.parse().map_err(|e| corrupt("updated_at", e))?;
                        ended.push((id.clone(), at));
                    }
                }
                Ok((b, ended))
            }
        })
        .await?;
    let mut turned = 0;
    for (b, ids) in oldest_by_bucket(&found, limit).values() {
        let mut keys = vec![b.by_expiry(), b.processing(), b.ambiguous()];
        let mut args: Vec<Vec<u8>> = vec![now.to_string().into()];
        for id in ids {
            keys.push(b.record(id));
            keys.push(b.attempts(id));
            args.push(id.as_bytes().to_vec());
        }
        let value = store
            .write(b.slot, &store.scripts.hold_ended, &keys, &args)
            .await?;
        let n: u64 = redis::from_redis_value(value).map_err(|e| corrupt("hold", e))?;
        turned += n;
    }
    Ok(turned)
}

/// A flat array of texts (IDs, numbers) as a read script answers it.
fn decode_items(v: Value) -> Result<Vec<String>, StoreError> {
    redis::from_redis_value(v).map_err(|e| corrupt("a script's answer", e))
}

/// Runs a read-only script on its keys' slot (`EVALSHA`, loading it with
/// `EVAL` where the server does not have it). No durability wait.
pub(super) async fn eval_read(
    mut conn: Conn,
    text: &'static str,
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
) -> Result<Value, StoreError> {
    let script = Script::new(text);
    let run = |verb: &str, body: &str| {
        let mut cmd = redis::cmd(verb);
        cmd.arg(body).arg(keys.len()).arg(&keys).arg(&args);
        cmd
    };
    match run("EVALSHA", script.get_hash())
        .query_async(&mut conn)
        .await
    {
        Err(e) if e.code() == Some("NOSCRIPT") => run("EVAL", text)
            .query_async(&mut conn)
            .await
            .map_err(driver),
        res => res.map_err(driver),
    }
}
