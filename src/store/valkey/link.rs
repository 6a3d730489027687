//! One of the store's connections, replaced by a fresh one when it goes
//! stale: a cluster connection, or, for a server not in cluster mode (SPEC
//! §18: "used as one shard"), one multiplexed connection to it. [`Conn`]
//! is either, so the rest of the store sends the same way to both. The
//! store keeps one [`Link`] for reads and one per write lane (`durable`);
//! each renews itself on its own failures, from the one [`Connector`].
//!
//! Why the renewal: the redis crate's cluster connection (1.8) repairs
//! itself in the background after a node is lost, and its slot map
//! follows `MOVED`. But measured here (tests/it/valkey_faults.rs), after a
//! primary's SIGKILL or in the middle of a slot migration, one connection
//! stayed stuck in its recovery: every request on it timed out for 20 s
//! and more, long after the cluster had promoted the replica, while
//! another process's connection to the same cluster carried on. And a
//! pipeline (how every write here is sent, see `durable`) answers `MOVED`
//! in the command's place, which the crate does not act on. A new
//! connection reads the cluster's current map from the seeds. So a request
//! that failed in a way a stale map or a stuck connection explains asks
//! its link for a renewal, at most one at a time and one a second; the
//! requests after it on that link use the new one (a lane's next write
//! takes the new connection when it takes the lane; a write made on the
//! old one is waited for on the old one, and found out if that one was
//! replaced underneath). A multiplexed connection to one server does
//! not reconnect by itself at all once its socket broke: the same renewal
//! makes its next one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// The least time between two renewals.
const RENEW_EVERY: Duration = Duration::from_secs(1);
/// How long a renewal may take to read the map and connect.
const RENEW_WITHIN: Duration = Duration::from_secs(3);

/// The server's error codes that say the map the request was routed by
/// is stale (`MOVED`, `ASK`, a write on a demoted primary), or the shard
/// is between owners.
const STALE_MAP_CODES: [&str; 7] = [
    "MOVED",
    "ASK",
    "READONLY",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "MASTERDOWN",
    "LOADING",
];

/// What a connection is made from.
pub(super) enum Connector {
    /// A cluster, from its seeds.
    Cluster(ClusterClient),
    /// One server not in cluster mode; `config` bounds each request.
    Single {
        client: redis::Client,
        config: AsyncConnectionConfig,
    },
}

impl Connector {
    async fn connect(&self) -> RedisResult<Conn> {
        match self {
            Connector::Cluster(c) => c.get_async_connection().await.map(Conn::Cluster),
            Connector::Single { client, config } => client
                .get_multiplexed_async_connection_with_config(config)
                .await
                .map(Conn::Single),
        }
    }
}

/// A connection to the store (a handle: clones share it).
#[derive(Clone)]
pub(super) enum Conn {
    Cluster(ClusterConnection),
    /// To the one server: every route leads there.
    Single(MultiplexedConnection),
}

impl Conn {
    /// `pipeline` on the node `route` names (on one server: that server);
    /// a command's error comes in its place.
    pub(super) async fn route_pipeline(
        &mut self,
        pipeline: Pipeline,
        offset: usize,
        count: usize,
        route: SingleNodeRoutingInfo,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Conn::Cluster(c) => c.route_pipeline(pipeline, offset, count, route).await,
            Conn::Single(c) => c.send_packed_commands(&pipeline, offset, count).await,
        }
    }

    /// `cmd` on the node(s) `routing` names (on one server: that server);
    /// the server's error as an error, on both.
    pub(super) async fn route_command(
        &mut self,
        cmd: Cmd,
        routing: RoutingInfo,
    ) -> RedisResult<Value> {
        match self {
            Conn::Cluster(c) => c.route_command(cmd, routing).await,
            Conn::Single(c) => c
                .send_packed_command(&cmd)
                .await
                .and_then(Value::extract_error),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Single(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Cluster(c) => c.get_db(),
            Conn::Single(c) => c.get_db(),
        }
    }
}

pub(super) struct Link {
    /// Shared by the store's links (one for reads, one per lane).
    connector: Arc<Connector>,
    current: RwLock<Conn>,
    renewing: AtomicBool,
    /// Milliseconds after `born` of the last renewal's start.
    last_renewal: AtomicU64,
    born: Instant,
    /// Renewals made, for the log.
    renewals: AtomicU64,
}

impl Link {
    /// Connects to the cluster, or to the one server.
    pub(super) async fn open(connector: Arc<Connector>) -> Result<Link, redis::RedisError> {
        let conn = connector.connect().await?;
        Ok(Link {
            connector,
            current: RwLock::new(conn),
            renewing: AtomicBool::new(false),
            last_renewal: AtomicU64::new(0),
            born: Instant::now(),
            renewals: AtomicU64::new(0),
        })
    }

    /// The connection to send on (a handle: clones share it).
    pub(super) fn conn(&self) -> Conn {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// After a request failed with `e`: renews the connection when the
    /// failure says it may be stuck (no answer, a dropped or refused
    /// connection) or routed by a stale map.
    pub(super) fn after_error(self: &Arc<Self>, e: &redis::RedisError) {
        let stale = e.is_timeout()
            || e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.code().is_some_and(is_stale_map_code);
        if stale {
            self.renew();
        }
    }

    /// After a command of a pipeline was answered with the server error
    /// `code`: renews when the code says the map is stale.
    pub(super) fn after_server_error(self: &Arc<Self>, code: &str) {
        if is_stale_map_code(code) {
            self.renew();
        }
    }

    /// Replaces the connection with a fresh one, in the background: at
    /// most one renewal at a time, and one a second.
    pub(super) fn renew(self: &Arc<Self>) {
        let now = self.born.elapsed().as_millis() as u64;
        let last = self.last_renewal.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < RENEW_EVERY.as_millis() as u64 {
            return;
        }
        if self.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        self.last_renewal.store(now.max(1), Ordering::Relaxed);
        let link = Arc::clone(self);
        tokio::spawn(async move {
            let fresh = tokio::time::timeout(RENEW_WITHIN, link.connector.connect()).await;
            match fresh {
                Ok(Ok(conn)) => {
                    *link.current.write().unwrap_or_else(|p| p.into_inner()) = conn;
                    let n = link.renewals.fetch_add(1, Ordering::Relaxed) + 1;
                    tracing::info!(
                        renewals = n,
                        "store: valkey connection renewed after a failed request"
                    );
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "store: valkey connection not renewed"),
                Err(_) => {
                    tracing::warn!("store: valkey connection not renewed within {RENEW_WITHIN:?}")
                }
            }
            link.renewing.store(false, Ordering::Release);
        });
    }
}

fn is_stale_map_code(code: &str) -> bool {
    STALE_MAP_CODES.contains(&code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_of_a_moved_slot_or_a_failover_are_stale_map_codes() {
        for code in ["MOVED", "ASK", "READONLY", "CLUSTERDOWN", "TRYAGAIN"] {
            assert!(is_stale_map_code(code), "{code}");
        }
        for code in ["NOSCRIPT", "ERR", "WRONGTYPE", "NOPERM", "moved"] {
            assert!(!is_stale_map_code(code), "{code}");
        }
    }
}
