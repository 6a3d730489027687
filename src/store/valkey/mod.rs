//! The sharded store (SPEC §18): records in a Valkey or Redis Cluster
//! (Valkey 8/9, Redis 7.2+), or in one server not in cluster mode used as
//! one shard, shared by any number of proxies, every claim durable on the
//! shard's replicas before its forward.
//!
//! # Key layout
//! Every key of a record carries the hash tag `{r:<route>:<bucket>}`, with
//! `bucket` = FNV-1a(event ID) mod [`keys::BUCKETS`] (256), so the record,
//! its attempts and the index entries that find it live in one slot, on
//! one shard, and each transition is one Lua script there ([`scripts`]):
//! - `{r:R:B}:e:<event id>`: the record, a hash of SPEC §3's fields (and
//!   the claim's `hold`, `claimed_by`, `claim_token`, `claimed_from`, and
//!   `send_trace`, the latest send's trace and span ID, SPEC §19);
//! - `{r:R:B}:a:<event id>`: its attempts (SPEC §13), a hash of attempt
//!   number to a JSON row, the newest 20 kept;
//! - `{r:R:B}:q:<event id>`: the questions asked about it (SPEC §21), a
//!   list of JSON rows, the newest 20 kept (`questions.rs`); the record's
//!   hash keeps the background's mark, `reconcile_after`;
//! - `{r:R:B}:f`, `:x`, `:p`: the bucket's indexes, sorted sets of event
//!   IDs by `first_seen_at` (operator lists), by `expires_at` (the sweep)
//!   and, for `processing` records only, by `updated_at` (the oldest claim
//!   and the hold of ended leases);
//! - `{r:R:B}:m`: the bucket's `ambiguous` records, a set every script
//!   that changes a state keeps (`ambiguous_counts` is one `SCARD` each);
//! - `idemgate:routes` (the routes that have records: where lists and the
//!   sweep look), `idemgate:pauses` (the paused routes, a hash of route to
//!   `paused_at`) and `idemgate:format` (the format version), on their own
//!   slots.
//!
//! The bucket spreads one route's records over 256 slots, so over every
//! shard of a cluster of up to a few dozen shards; what reads across the
//! cluster (a list, the sweep, the oldest claim) asks routes × 256 index
//! keys, concurrently. An operator list returns its page after reading at
//! most a page per bucket when it does not filter; a filter (state,
//! prefix) walks each bucket until it has a page, so on 1M records a list
//! of the rare state reads up to all of them (about 4,000 per bucket).
//! The operator's other actions and reads are in [`operator`], each with
//! its cost.
//!
//! # Durability
//! See [`durable`]: the write's reply, then `WAITAOF 1 N` on the same
//! connection, shared by the writes made on it meanwhile. Writes go on
//! [`durable::LANES`] connections ([`lanes`]), so that a connection in its
//! wait carries no new write; those that queue for one go out together,
//! in one pipeline (a batch). A claim is answered won only after its wait;
//! a wait that falls short is an error whose write may stand
//! (`OutcomeUnknown`), so the proxy forwards nothing and releases the
//! claim by its token once the store answers again. At start and in
//! `ping`, [`shards`] checks every shard can give the count.
//!
//! # The connection
//! [`connect`] asks the seeds at open whether they are a cluster (`INFO
//! cluster`): a cluster gets cluster connections, a server not in cluster
//! mode (the URL's only seed) multiplexed connections: one for reads and
//! the operator's checks, and one per lane for writes and their waits;
//! each is a [`link::Conn`], so nothing else here tells them apart but
//! [`shards`] (`CLUSTER SHARDS`, or the one server's `INFO replication`)
//! and the question of who ran a write ([`durable::ask_who`]). The
//! hash-tagged keys and the scripts are the same on one server. Each
//! [`link`] replaces its connection with a fresh one when a request on it
//! fails in a way a stuck connection or a stale slot map explains (the
//! redis crate's own repair was seen stuck for 20 s; a multiplexed
//! connection whose socket broke never recovers by itself), and the
//! engine's figures for the metrics (shards, wait times) come out through
//! `Backend::report`.

mod backend;
mod connect;
mod decode;
mod durable;
pub mod keys;
mod lanes;
mod link;
mod operator;
mod questions;
mod scripts;
mod shards;
pub mod target;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Script, Value};

use self::durable::{Lease, Wrote};
use self::keys::Bucket;
use self::link::Conn;
use self::target::ValkeyTarget;
use super::{Backend, StoreError, StoreUrl};

/// The scripts that write, each with its SHA1 for `EVALSHA` (the reads
/// run through `operator::eval_read`).
struct Scripts {
    claim: Script,
    settle: Script,
    release: Script,
    sweep: Script,
    resolve: Script,
    release_unacknowledged: Script,
    bulk_release: Script,
    hold_ended: Script,
    reconciled: Script,
    take_question: Script,
}

impl Scripts {
    /// Each script with its SHA1, computed once per store.
    fn new() -> Scripts {
        Scripts {
            claim: Script::new(scripts::CLAIM),
            settle: Script::new(scripts::SETTLE),
            release: Script::new(scripts::RELEASE),
            sweep: Script::new(scripts::SWEEP_BUCKET),
            resolve: Script::new(scripts::RESOLVE),
            release_unacknowledged: Script::new(scripts::RELEASE_UNACKNOWLEDGED),
            bulk_release: Script::new(scripts::BULK_RELEASE),
            hold_ended: Script::new(scripts::HOLD_ENDED),
            reconciled: Script::new(scripts::RECONCILED),
            take_question: Script::new(scripts::TAKE_QUESTION),
        }
    }
}

pub struct ValkeyStore {
    link: Arc<link::Link>,
    target: ValkeyTarget,
    scripts: Scripts,
    durable: Arc<durable::Durable>,
    /// Routes this process has written to `idemgate:routes` already.
    routes_known: Mutex<HashSet<String>>,
    /// The shards the last check saw (`idemgate_store_shards`).
    shards_seen: AtomicU64,
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

/// A write's driver error as a store error, the lane of `lease` renewed
/// where the error says it may be stuck or its map stale.
fn failed_on(lease: &Lease, e: redis::RedisError) -> StoreError {
    lease.link().after_error(&e);
    driver(e)
}

/// `script` with its keys and arguments, as `EVALSHA`.
fn evalsha(script: &Script, keys: &[String], args: &[Vec<u8>]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(keys.len())
        .arg(keys)
        .arg(args);
    cmd
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
    /// Connects to the seeds: to the cluster, or to the one server not in
    /// cluster mode ([`connect`]). Nothing is checked here beyond the
    /// connection (and that such a server is the only seed): `migrate`
    /// and `ping` check the shards.
    pub async fn open(url: &StoreUrl) -> Result<Self, StoreError> {
        let target = url
            .valkey_target()
            .ok_or_else(|| StoreError::UnsupportedUrl(url.redacted()))?
            .clone();
        let ca = match &target.ca {
            Some(ca) => Some(std::fs::read(ca).map_err(|e| StoreError::io(ca.display(), e))?),
            None => None,
        };
        let connector = match connect::single_server(&target, ca.as_deref()).await? {
            None => link::Connector::Cluster(
                connect::cluster_client(&target, ca, Self::OP_TIMEOUT).map_err(driver)?,
            ),
            Some(client) => link::Connector::Single {
                client,
                config: redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect::CONNECT_WITHIN))
                    .set_response_timeout(Some(Self::OP_TIMEOUT)),
            },
        };
        let connector = Arc::new(connector);
        let link = Arc::new(
            link::Link::open(Arc::clone(&connector))
                .await
                .map_err(driver)?,
        );
        let lanes = Self::lanes(&connector).await?;
        Ok(ValkeyStore {
            durable: Arc::new(durable::Durable::new(
                target.durability,
                target.replicas,
                WAIT_LIMIT,
                lanes,
            )),
            link,
            target,
            scripts: Scripts::new(),
            routes_known: Mutex::new(HashSet::new()),
            shards_seen: AtomicU64::new(0),
        })
    }

    /// The connections writes go on ([`durable::LANES`]).
    async fn lanes(connector: &Arc<link::Connector>) -> Result<Vec<Arc<link::Link>>, StoreError> {
        let mut lanes = Vec::with_capacity(durable::LANES);
        for _ in 0..durable::LANES {
            let lane = link::Link::open(Arc::clone(connector))
                .await
                .map_err(driver)?;
            lanes.push(Arc::new(lane));
        }
        Ok(lanes)
    }

    /// Checks every shard ([`shards::check`]) and keeps their count.
    async fn check_shards(&self) -> Result<(), StoreError> {
        let seen = shards::check(&self.conn(), &self.target).await?;
        self.shards_seen.store(seen, Ordering::Relaxed);
        Ok(())
    }

    /// The connection to send on (see [`link`]).
    fn conn(&self) -> Conn {
        self.link.conn()
    }

    /// A driver error as a store error, the connection renewed where the
    /// error says it may be stuck or its map stale.
    fn failed(&self, e: redis::RedisError) -> StoreError {
        self.link.after_error(&e);
        driver(e)
    }

    /// Runs `script` on `slot`'s primary on the lane `lease` holds, with
    /// the questions of who ran it in the same pipeline (for [`durable`]);
    /// loads the script there first if the server does not have it.
    ///
    /// `sent`: its answer from the batch it was sent in when it queued
    /// ([`durable::Durable::hand`]), taken as if it had sent it itself (a
    /// `NOSCRIPT` is loaded and sent again, alone).
    async fn eval(
        &self,
        lease: &Lease,
        slot: u16,
        script: &Script,
        cmd: &redis::Cmd,
        mut sent: Option<durable::Sent>,
    ) -> Result<(Value, Wrote), StoreError> {
        let mut conn = lease.conn();
        for _ in 0..3 {
            let (value, wrote) = match sent.take() {
                Some(answer) => answer?,
                None => {
                    let mut pipe = redis::pipe();
                    pipe.add_command(cmd.clone());
                    self.run_on(lease, &mut conn, slot, pipe).await?
                }
            };
            match &value {
                // a pipeline answers a command's error in its place
                Value::ServerError(e) if e.code() == "NOSCRIPT" => {
                    let mut load = redis::cmd("SCRIPT");
                    load.arg("LOAD").arg(script_text(script, &self.scripts));
                    let node = redis::cluster_routing::RoutingInfo::SingleNode(primary(slot));
                    conn.route_command(load, node)
                        .await
                        .map_err(|e| failed_on(lease, e))?;
                }
                Value::ServerError(e) => return Err(self.refused(lease, e)),
                _ => return Ok((value, wrote?)),
            }
        }
        Err(StoreError::Unavailable(
            "valkey kept answering NOSCRIPT after SCRIPT LOAD".into(),
        ))
    }

    /// Runs `pipe` (one command) on `slot`'s primary over `conn`, the
    /// lane of `lease`, with the questions of who ran it: the command's
    /// answer (an error in its place) and who ran it.
    async fn run_on(
        &self,
        lease: &Lease,
        conn: &mut Conn,
        slot: u16,
        mut pipe: redis::Pipeline,
    ) -> Result<(Value, Result<Wrote, StoreError>), StoreError> {
        let asked = durable::ask_who(&mut pipe, conn);
        let mut values = conn
            .route_pipeline(pipe, 0, 1 + asked, primary(slot))
            .await
            .map_err(|e| failed_on(lease, e))?;
        if values.len() != 1 + asked {
            return Err(StoreError::Corrupt(format!(
                "{} answers to a command",
                values.len()
            )));
        }
        let answers = values.split_off(1);
        let value = values.pop().unwrap_or(Value::Nil);
        let wrote = durable::who(answers).map_err(|e| StoreError::Corrupt(format!("who: {e}")));
        Ok((value, wrote))
    }

    /// A command's server error as a store error, the lane renewed when
    /// the code says its map is stale.
    fn refused(&self, lease: &Lease, e: &redis::ServerError) -> StoreError {
        lease.link().after_server_error(e.code());
        StoreError::Unavailable(format!(
            "valkey: {} {}",
            e.code(),
            e.details().unwrap_or_default()
        ))
    }

    /// [`eval`](Self::eval) on a lane, then the durability wait for its
    /// write.
    async fn write(
        &self,
        slot: u16,
        script: &Script,
        keys: &[String],
        args: &[Vec<u8>],
    ) -> Result<Value, StoreError> {
        let cmd = evalsha(script, keys, args);
        let (lease, sent) = self.durable.lease_to_send(slot, Some(&cmd)).await;
        let (value, wrote) = self.eval(&lease, slot, script, &cmd, sent).await?;
        lease.wait(slot, wrote).await?;
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
        let mut sadd = redis::cmd("SADD");
        sadd.arg(keys::ROUTES).arg(route);
        self.command_durably(keys::slot_of(keys::ROUTES), sadd)
            .await?;
        self.routes_known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(route.to_string());
        Ok(())
    }

    /// Runs one command on `slot`'s primary on a lane, then the
    /// durability wait for its write; its answer.
    async fn command_durably(&self, slot: u16, cmd: redis::Cmd) -> Result<Value, StoreError> {
        let mut pipe = redis::pipe();
        pipe.add_command(cmd);
        let lease = self.durable.lease(slot).await;
        let mut conn = lease.conn();
        let (value, wrote) = self.run_on(&lease, &mut conn, slot, pipe).await?;
        if let Value::ServerError(e) = &value {
            return Err(self.refused(&lease, e));
        }
        lease.wait(slot, wrote?).await?;
        Ok(value)
    }

    /// The routes to read: the one asked for, else every known route.
    async fn routes(&self, only: Option<&str>) -> Result<Vec<String>, StoreError> {
        if let Some(r) = only {
            return Ok(vec![r.to_string()]);
        }
        let mut conn = self.conn();
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
        F: Fn(Conn, Bucket) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let mut set = tokio::task::JoinSet::new();
        for route in routes {
            for b in 0..keys::BUCKETS {
                let fut = each(self.conn(), Bucket::new(route, b));
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

/// What one bucket found: event IDs, each with its time.
type BucketFound = (Bucket, Vec<(String, f64)>);

/// The oldest `limit` of what each bucket found (per route, as
/// [`ValkeyStore::every_bucket`] answers), ties by event ID, grouped again
/// by bucket: each group one script's work on its bucket's slot. By
/// bucket, not by slot: two buckets can share a slot (about two pairs among a
/// route's 256 buckets), and a group's keys are its bucket's.
fn oldest_by_bucket(
    found: &[(String, BucketFound)],
    limit: i64,
) -> BTreeMap<&str, (&Bucket, Vec<&str>)> {
    let mut all: Vec<(f64, &Bucket, &str)> = found
        .iter()
        .flat_map(|(_, (b, found))| found.iter().map(move |(id, at)| (*at, b, id.as_str())))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.2.cmp(b.2)));
    all.truncate(usize::try_from(limit).unwrap_or(0));
    let mut by_bucket: BTreeMap<&str, (&Bucket, Vec<&str>)> = BTreeMap::new();
    for (_, b, id) in all {
        by_bucket
            .entry(b.tag())
            .or_insert((b, Vec::new()))
            .1
            .push(id);
    }
    by_bucket
}

/// A script's source, for `SCRIPT LOAD`.
fn script_text(script: &Script, all: &Scripts) -> &'static str {
    let hash = script.get_hash();
    [
        (&all.claim, scripts::CLAIM),
        (&all.settle, scripts::SETTLE),
        (&all.release, scripts::RELEASE),
        (&all.sweep, scripts::SWEEP_BUCKET),
        (&all.resolve, scripts::RESOLVE),
        (&all.release_unacknowledged, scripts::RELEASE_UNACKNOWLEDGED),
        (&all.bulk_release, scripts::BULK_RELEASE),
        (&all.hold_ended, scripts::HOLD_ENDED),
        (&all.reconciled, scripts::RECONCILED),
        (&all.take_question, scripts::TAKE_QUESTION),
    ]
    .into_iter()
    .find(|(s, _)| s.get_hash() == hash)
    .map(|(_, text)| text)
    .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_that_share_a_slot_keep_their_own_event_ids() {
        let first = Bucket::new("r", 0);
        let twin = (1..100_000)
            .map(|n| Bucket::new("r", n))
            .find(|b| b.slot == first.slot)
            .expect("a bucket on the same slot");
        let found = vec![
            ("r".to_owned(), (first.clone(), vec![("a".to_owned(), 1.0)])),
            (
                "r".to_owned(),
                (
                    twin.clone(),
                    vec![("b".to_owned(), 2.0), ("c".to_owned(), 9.0)],
                ),
            ),
        ];
        let groups = oldest_by_bucket(&found, 2);
        assert_eq!(groups.len(), 2, "one group per bucket, not per slot");
        assert_eq!(groups[first.tag()].1, ["a"]);
        assert_eq!(groups[twin.tag()].1, ["b"], "the oldest two over both");
    }
}
