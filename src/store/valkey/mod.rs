//! The sharded store (SPEC §18): records in a Valkey or Redis Cluster
//! (Valkey 8/9, Redis 7.2+), shared by any number of proxies, every claim
//! durable on the shard's replicas before its forward.
//!
//! # Key layout
//! Every key of a record carries the hash tag `{r:<route>:<bucket>}`, with
//! `bucket` = FNV-1a(event ID) mod [`keys::BUCKETS`] (256), so the record,
//! its attempts and the index entries that find it live in one slot, on
//! one shard, and each transition is one Lua script there ([`scripts`]):
//! - `{r:R:B}:e:<event id>`: the record, a hash of SPEC §3's fields (and
//!   the claim's `hold`, `claimed_by`, `claim_token`, `claimed_from`);
//! - `{r:R:B}:a:<event id>`: its attempts (SPEC §13), a hash of attempt
//!   number to a JSON row, the newest 20 kept;
//! - `{r:R:B}:f`, `:x`, `:p`: the bucket's indexes, sorted sets of event
//!   IDs by `first_seen_at` (operator lists), by `expires_at` (the sweep)
//!   and, for `processing` records only, by `updated_at` (the oldest claim);
//! - `idemgate:routes` (the routes that have records: where lists and the
//!   sweep look) and `idemgate:format` (the format version), on their own slots.
//!
//! The bucket spreads one route's records over 256 slots, so over every
//! shard of a cluster of up to a few dozen shards; what reads across the
//! cluster (a list, the sweep, the oldest claim) asks routes × 256 index
//! keys, concurrently. An operator list returns its page after reading at
//! most a page per bucket when it does not filter; a filter (state,
//! prefix) walks each bucket until it has a page, so on 1M records a list
//! of the rare state reads up to all of them (about 4,000 per bucket).
//!
//! # Durability
//! See [`durable`]: the write's reply, then `WAITAOF 1 N` on the same
//! connection, shared by the writes that came meanwhile. A claim is
//! answered won only after its wait; a wait that falls short is an error
//! whose write may stand (`OutcomeUnknown`), so the proxy forwards nothing
//! and releases the claim by its token once the store answers again.
//! At start and in `ping`, [`shards`] checks every shard can give the count.

mod decode;
mod durable;
pub mod keys;
mod scripts;
mod shards;
pub mod target;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Script, Value};

use self::keys::Bucket;
use self::target::ValkeyTarget;
use super::sql::{self, Statement};
use super::{
    Backend, ClaimOutcome, ClaimRequest, Found, ListFilter, Record, ReleaseOutcome, ReleaseRequest,
    SettleOutcome, SettleRequest, StoreError, StoreUrl,
};
use crate::claim::{Millis, SettleResult};

/// The scripts, each with its SHA1 for `EVALSHA`.
struct Scripts {
    claim: Script,
    settle: Script,
    release: Script,
    list: Script,
    sweep: Script,
}

pub struct ValkeyStore {
    conn: ClusterConnection,
    target: ValkeyTarget,
    scripts: Scripts,
    durable: Arc<durable::Durable>,
    /// Routes this process has written to `idemgate:routes` already.
    routes_known: Mutex<HashSet<String>>,
}

/// The longest one durability wait may take on the server.
const WAIT_LIMIT: Duration = Duration::from_secs(2);

/// A driver error as a store error: one whose write may have been applied
/// (the connection dropped, no answer in time) says so.
fn driver(e: redis::RedisError) -> StoreError {
    let text = e.to_string();
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        StoreError::OutcomeUnknown(format!("valkey: {text}"))
    } else {
        StoreError::Unavailable(format!("valkey: {text}"))
    }
}

/// The primary of `slot`.
fn primary(slot: u16) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master))
}

/// An optional value as the scripts take it (see [`scripts`]).
fn opt(v: Option<impl AsRef<[u8]>>) -> Vec<u8> {
    match v {
        None => Vec::new(),
        Some(v) => {
            let mut out = Vec::with_capacity(v.as_ref().len() + 1);
            out.push(b'=');
            out.extend_from_slice(v.as_ref());
            out
        }
    }
}

impl ValkeyStore {
    /// Connects to the seeds and reads the cluster's map. Nothing is
    /// checked here beyond the connection: `migrate` and `ping` check the
    /// shards.
    pub async fn open(url: &StoreUrl) -> Result<Self, StoreError> {
        let target = url
            .valkey_target()
            .ok_or_else(|| StoreError::UnsupportedUrl(url.redacted()))?
            .clone();
        let scheme = if target.tls { "rediss" } else { "redis" };
        let seeds: Vec<String> = target
            .seeds
            .iter()
            .map(|(h, p)| {
                let host = if h.contains(':') {
                    format!("[{h}]")
                } else {
                    h.clone()
                };
                format!("{scheme}://{host}:{p}")
            })
            .collect();
        let mut builder = ClusterClientBuilder::new(seeds)
            .connection_timeout(Duration::from_secs(2))
            .response_timeout(Self::OP_TIMEOUT)
            .retries(3);
        if let Some(user) = &target.user {
            builder = builder.username(user);
        }
        if let Some(password) = &target.password {
            builder = builder.password(password);
        }
        if target.tls {
            builder = builder.tls(redis::TlsMode::Secure);
            if let Some(ca) = &target.ca {
                let pem = std::fs::read(ca).map_err(|e| StoreError::io(ca.display(), e))?;
                builder = builder.certs(redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                });
            }
        }
        let client = builder.build().map_err(driver)?;
        let conn = client.get_async_connection().await.map_err(driver)?;
        Ok(ValkeyStore {
            conn,
            durable: Arc::new(durable::Durable::new(
                target.durability,
                target.replicas,
                WAIT_LIMIT,
            )),
            target,
            scripts: Scripts {
                claim: Script::new(scripts::CLAIM),
                settle: Script::new(scripts::SETTLE),
                release: Script::new(scripts::RELEASE),
                list: Script::new(scripts::LIST_BUCKET),
                sweep: Script::new(scripts::SWEEP_BUCKET),
            },
            routes_known: Mutex::new(HashSet::new()),
        })
    }

    /// Runs `script` on `slot`'s primary, with `CLIENT ID` in the same
    /// pipeline (the connection that wrote, for [`durable`]); loads the
    /// script there first if the server does not have it.
    async fn eval(
        &self,
        slot: u16,
        script: &Script,
        keys: &[String],
        args: &[Vec<u8>],
    ) -> Result<(Value, i64), StoreError> {
        let mut conn = self.conn.clone();
        for _ in 0..3 {
            let mut pipe = redis::pipe();
            pipe.cmd("EVALSHA")
                .arg(script.get_hash())
                .arg(keys.len())
                .arg(keys)
                .arg(args);
            pipe.cmd("CLIENT").arg("ID");
            let values = conn
                .route_pipeline(pipe, 0, 2, primary(slot))
                .await
                .map_err(driver)?;
            let [value, id] = <[Value; 2]>::try_from(values)
                .map_err(|v| StoreError::Corrupt(format!("{} answers to a script", v.len())))?;
            match &value {
                // a pipeline answers a command's error in its place
                Value::ServerError(e) if e.code() == "NOSCRIPT" => {
                    let mut load = redis::cmd("SCRIPT");
                    load.arg("LOAD").arg(script_text(script, &self.scripts));
                    let node = redis::cluster_routing::RoutingInfo::SingleNode(primary(slot));
                    conn.route_command(load, node).await.map_err(driver)?;
                }
                Value::ServerError(e) => {
                    return Err(StoreError::Unavailable(format!(
                        "valkey: {} {}",
                        e.code(),
                        e.details().unwrap_or_default()
                    )))
                }
                _ => {
                    let id = redis::from_redis_value(id)
                        .map_err(|e| StoreError::Corrupt(format!("CLIENT ID: {e}")))?;
                    return Ok((value, id));
                }
            }
        }
        Err(StoreError::Unavailable(
            "valkey kept answering NOSCRIPT after SCRIPT LOAD".into(),
        ))
    }

    /// [`eval`](Self::eval), then the durability wait for its write.
    async fn write(
        &self,
        slot: u16,
        script: &Script,
        keys: &[String],
        args: &[Vec<u8>],
    ) -> Result<Value, StoreError> {
        let (value, client) = self.eval(slot, script, keys, args).await?;
        self.durable.wait(&self.conn, slot, client).await?;
        Ok(value)
    }

    /// Adds `route` to `idemgate:routes` (once per process), durably, so
    /// that lists and the sweep find its records.
    async fn register_route(&self, route: &str) -> Result<(), StoreError> {
        let known = |set: &Mutex<HashSet<String>>| {
            set.lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(route)
        };
        if known(&self.routes_known) {
            return Ok(());
        }
        let slot = keys::slot_of(keys::ROUTES);
        let mut pipe = redis::pipe();
        pipe.cmd("SADD").arg(keys::ROUTES).arg(route);
        pipe.cmd("CLIENT").arg("ID");
        let mut conn = self.conn.clone();
        let values = conn
            .route_pipeline(pipe, 0, 2, primary(slot))
            .await
            .map_err(driver)?;
        let id: i64 = values
            .get(1)
            .and_then(|v| redis::from_redis_value_ref(v).ok())
            .ok_or_else(|| StoreError::Corrupt("CLIENT ID".into()))?;
        self.durable.wait(&self.conn, slot, id).await?;
        self.routes_known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(route.to_string());
        Ok(())
    }

    /// A record's attempts, oldest first (SPEC §13): the newest 20 rows.
    pub async fn history(
        &self,
        route: &str,
        event_id: &str,
    ) -> Result<Vec<super::Attempt>, StoreError> {
        let b = Bucket::of(route, event_id);
        let mut conn = self.conn.clone();
        let value: Value = redis::cmd("HGETALL")
            .arg(b.attempts(event_id))
            .query_async(&mut conn)
            .await
            .map_err(driver)?;
        decode::attempts(value)
    }

    /// The routes to read: the one asked for, else every known route.
    async fn routes(&self, only: Option<&str>) -> Result<Vec<String>, StoreError> {
        if let Some(r) = only {
            return Ok(vec![r.to_string()]);
        }
        let mut conn = self.conn.clone();
        let mut routes: Vec<String> = redis::cmd("SMEMBERS")
            .arg(keys::ROUTES)
            .query_async(&mut conn)
            .await
            .map_err(driver)?;
        routes.sort();
        Ok(routes)
    }

    /// Runs `each` on every bucket of every route, `CONCURRENT` at a time;
    /// the answers in bucket order.
    async fn every_bucket<T, F, Fut>(
        &self,
        routes: &[String],
        each: F,
    ) -> Result<Vec<(String, T)>, StoreError>
    where
        T: Send + 'static,
        F: Fn(ClusterConnection, Bucket) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let mut set = tokio::task::JoinSet::new();
        for route in routes {
            for b in 0..keys::BUCKETS {
                let fut = each(self.conn.clone(), Bucket::new(route, b));
                let route = route.clone();
                set.spawn(async move { fut.await.map(|t| (route, t)) });
            }
        }
        let mut out = Vec::with_capacity(set.len());
        while let Some(res) = set.join_next().await {
            let res = res.map_err(|e| StoreError::Unavailable(format!("a bucket's read: {e}")))?;
            out.push(res?);
        }
        Ok(out)
    }
}

/// A script's source, for `SCRIPT LOAD`.
fn script_text(script: &Script, all: &Scripts) -> &'static str {
    let hash = script.get_hash();
    [
        (&all.claim, scripts::CLAIM),
        (&all.settle, scripts::SETTLE),
        (&all.release, scripts::RELEASE),
        (&all.list, scripts::LIST_BUCKET),
        (&all.sweep, scripts::SWEEP_BUCKET),
    ]
    .into_iter()
    .find(|(s, _)| s.get_hash() == hash)
    .map(|(_, text)| text)
    .unwrap_or("")
}

impl Backend for ValkeyStore {
    /// Bounds every operation; a durability wait is at most [`WAIT_LIMIT`].
    const OP_TIMEOUT: Duration = Duration::from_secs(5);

    /// Writes the format version (refusing a newer one) and checks that
    /// every shard can make writes durable.
    async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
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
        shards::check(&self.conn, &self.target).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: Option<i64> = redis::cmd("GET")
            .arg(keys::FORMAT)
            .query_async(&mut conn)
            .await
            .map_err(driver)?;
        shards::check(&self.conn, &self.target).await
    }

    /// `ping` checked the shards; a write's own wait says the rest.
    async fn write_probe(&self, _limit: Duration) -> Result<(), StoreError> {
        Ok(())
    }

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
        ];
        let (value, client) = self.eval(b.slot, &self.scripts.claim, &keys, &args).await?;
        match decode::claim(value)? {
            decode::Claimed::Won { attempt, from } => {
                self.durable.wait(&self.conn, b.slot, client).await?;
                Ok(sql::claimed(attempt, from.as_deref(), lease_until))
            }
            decode::Claimed::Held => {
                self.durable.wait(&self.conn, b.slot, client).await?;
                Ok(super::outcome_unknown())
            }
            decode::Claimed::Existing(found) => {
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
        let keys = [
            b.record(req.event_id),
            b.attempts(req.event_id),
            b.by_expiry(),
            b.processing(),
        ];
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
        let mut conn = self.conn.clone();
        let value: Value = redis::cmd("HMGET")
            .arg(b.record(req.event_id))
            .arg(&decode::READBACK_FIELDS[..])
            .query_async(&mut conn)
            .await
            .map_err(driver)?;
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
        let mut conn = self.conn.clone();
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
        let sha = self.scripts.list.get_hash().to_string();
        let pages = self
            .every_bucket(&routes, |conn, b| {
                let args = args_tail.clone();
                let sha = sha.clone();
                async move { list_bucket(conn, b, sha, args).await }
            })
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
        let keys = [
            b.record(req.event_id),
            b.attempts(req.event_id),
            b.by_expiry(),
            b.processing(),
        ];
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
        let mut all: Vec<(f64, &Bucket, &str)> = candidates
            .iter()
            .flat_map(|(_, (b, found))| found.iter().map(move |(id, at)| (*at, b, id.as_str())))
            .collect();
        all.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.2.cmp(b.2)));
        all.truncate(usize::try_from(limit).unwrap_or(0));
        let mut by_bucket: BTreeMap<u16, (&Bucket, Vec<&str>)> = BTreeMap::new();
        for (_, b, id) in all {
            by_bucket
                .entry(b.slot)
                .or_insert((b, Vec::new()))
                .1
                .push(id);
        }
        let mut deleted = 0u64;
        for (b, ids) in by_bucket.values() {
            let mut keys = vec![b.by_first_seen(), b.by_expiry(), b.processing()];
            let mut args: Vec<Vec<u8>> = vec![now.to_string().into()];
            for id in ids {
                keys.push(b.record(id));
                keys.push(b.attempts(id));
                args.push(id.as_bytes().to_vec());
            }
            let (value, _) = self.eval(b.slot, &self.scripts.sweep, &keys, &args).await?;
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

    async fn write(&self, _statements: &[Statement<'_>]) -> Result<Vec<u64>, StoreError> {
        Err(StoreError::Unavailable(
            "operator SQL statements are not supported by the valkey store".into(),
        ))
    }

    async fn read(&self, _statement: &Statement<'_>) -> Result<Vec<Vec<sql::Value>>, StoreError> {
        Err(StoreError::Unavailable(
            "operator SQL reads are not supported by the valkey store".into(),
        ))
    }

    async fn close(&self) {}
}

/// One bucket's page of a list ([`scripts::LIST_BUCKET`]): event IDs and
/// their fields. A read: no durability wait.
async fn list_bucket(
    mut conn: ClusterConnection,
    b: Bucket,
    sha: String,
    tail: Vec<Vec<u8>>,
) -> Result<Vec<(String, Value)>, StoreError> {
    let run = |sha: &str| {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(sha)
            .arg(1)
            .arg(b.by_first_seen())
            .arg(b.record_prefix())
            .arg(&tail);
        cmd
    };
    let value: Value = match run(&sha).query_async(&mut conn).await {
        Err(e) if e.code() == Some("NOSCRIPT") => {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(scripts::LIST_BUCKET)
                .arg(1)
                .arg(b.by_first_seen())
                .arg(b.record_prefix())
                .arg(&tail);
            cmd.query_async(&mut conn).await.map_err(driver)?
        }
        res => res.map_err(driver)?,
    };
    decode::list_page(value)
}
