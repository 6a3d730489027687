//! The store's cluster connection, replaced by a fresh one when it goes
//! stale.
//!
//! Why: the redis crate's cluster connection (1.8) repairs itself in the
//! background after a node is lost, and its slot map follows `MOVED`. But
//! measured here (tests/it/valkey_faults.rs), after a primary's SIGKILL or
//! in the middle of a slot migration, one connection stayed stuck in its
//! recovery: every request on it timed out for 20 s and more, long after
//! the cluster had promoted the replica, while another process's
//! connection to the same cluster carried on. And a pipeline (how every
//! write here is sent, see `durable`) answers `MOVED` in the command's
//! place, which the crate does not act on. A new connection reads the
//! cluster's current map from the seeds. So a request that failed in a way
//! a stale map or a stuck connection explains asks for a renewal, at most
//! one at a time and one a second; the requests after it use the new one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

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

pub(super) struct Link {
    client: ClusterClient,
    current: RwLock<ClusterConnection>,
    renewing: AtomicBool,
    /// Milliseconds after `born` of the last renewal's start.
    last_renewal: AtomicU64,
    born: Instant,
    /// Renewals made, for the log.
    renewals: AtomicU64,
}

impl Link {
    /// Connects to the cluster.
    pub(super) async fn open(client: ClusterClient) -> Result<Link, redis::RedisError> {
        let conn = client.get_async_connection().await?;
        Ok(Link {
            client,
            current: RwLock::new(conn),
            renewing: AtomicBool::new(false),
            last_renewal: AtomicU64::new(0),
            born: Instant::now(),
            renewals: AtomicU64::new(0),
        })
    }

    /// The connection to send on (a handle: clones share it).
    pub(super) fn conn(&self) -> ClusterConnection {
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
            let fresh =
                tokio::time::timeout(RENEW_WITHIN, link.client.get_async_connection()).await;
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
