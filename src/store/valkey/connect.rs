//! How the store connects (SPEC §18): the seeds are asked whether they
//! are a cluster (`INFO cluster`, `cluster_enabled`); a cluster gets the
//! redis crate's cluster client, a server not in cluster mode one
//! multiplexed connection of its own, used as one shard (`shards` reads
//! its replicas from `INFO replication`).
//!
//! A server not in cluster mode must be the only seed: the URL names the
//! server that takes the writes, and nothing here follows a failover
//! between separate servers (that is what a cluster is for). Several
//! seeds of which one is not in cluster mode are refused at start with a
//! line that says so, rather than guessing which one is meant.

use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::{AsyncConnectionConfig, ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};

use super::target::ValkeyTarget;
use crate::store::StoreError;

/// How long a connection may take to be made.
pub(super) const CONNECT_WITHIN: Duration = Duration::from_secs(2);

/// Asks the seeds, in order, until one answers, whether it is in cluster
/// mode: the client for the one server that is not, `None` for a cluster
/// (or when no seed answered: the cluster client then says why). A server
/// whose ACL refuses `INFO` is taken for a cluster, as before this
/// question was asked.
pub(super) async fn single_server(
    target: &ValkeyTarget,
    ca: Option<&[u8]>,
) -> Result<Option<redis::Client>, StoreError> {
    for (host, port) in &target.seeds {
        let client = single_client(target, host, *port, ca)
            .map_err(|e| StoreError::Unavailable(format!("valkey: {e}")))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_WITHIN))
            .set_response_timeout(Some(CONNECT_WITHIN));
        let Ok(mut conn) = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
        else {
            continue;
        };
        let info: Result<String, _> = redis::cmd("INFO")
            .arg("cluster")
            .query_async(&mut conn)
            .await;
        match info {
            Ok(text) if cluster_disabled(&text) => {
                if target.seeds.len() > 1 {
                    return Err(StoreError::Unavailable(format!(
                        "valkey: {} is not in cluster mode, and the URL names {} seeds: a server \
                         not in cluster mode is used alone, as one shard with the replicas it \
                         lists itself (INFO replication); name its primary as the only seed",
                        addr(host, *port),
                        target.seeds.len()
                    )));
                }
                return Ok(Some(client));
            }
            _ => return Ok(None),
        }
    }
    Ok(None)
}

/// Whether `INFO cluster` says `cluster_enabled:0`.
fn cluster_disabled(info: &str) -> bool {
    info.lines().any(|l| l.trim() == "cluster_enabled:0")
}

/// `host:port`, an IPv6 address in brackets.
pub(super) fn addr(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A client for the one server `host:port`, with the URL's user,
/// password and TLS.
fn single_client(
    target: &ValkeyTarget,
    host: &str,
    port: u16,
    ca: Option<&[u8]>,
) -> redis::RedisResult<redis::Client> {
    let address = if target.tls {
        ConnectionAddr::TcpTls {
            host: host.to_string(),
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host.to_string(), port)
    };
    let mut settings = RedisConnectionInfo::default();
    if let Some(user) = &target.user {
        settings = settings.set_username(user);
    }
    if let Some(password) = &target.password {
        settings = settings.set_password(password);
    }
    let info = address.into_connection_info()?.set_redis_settings(settings);
    match ca {
        Some(pem) if target.tls => redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
        _ => redis::Client::open(info),
    }
}

/// The cluster client for the seeds, with the URL's user, password and
/// TLS; `respond_within` bounds each request.
pub(super) fn cluster_client(
    target: &ValkeyTarget,
    ca: Option<Vec<u8>>,
    respond_within: Duration,
) -> redis::RedisResult<ClusterClient> {
    let scheme = if target.tls { "rediss" } else { "redis" };
    let seeds: Vec<String> = target
        .seeds
        .iter()
        .map(|(h, p)| format!("{scheme}://{}", addr(h, *p)))
        .collect();
    let mut builder = ClusterClientBuilder::new(seeds)
        .connection_timeout(CONNECT_WITHIN)
        .response_timeout(respond_within)
        .retries(3);
    if let Some(user) = &target.user {
        builder = builder.username(user);
    }
    if let Some(password) = &target.password {
        builder = builder.password(password);
    }
    if target.tls {
        builder = builder.tls(redis::TlsMode::Secure);
        if let Some(pem) = ca {
            builder = builder.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            });
        }
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_cluster_tells_a_single_server() {
        assert!(cluster_disabled("# Cluster\r\ncluster_enabled:0\r\n"));
        assert!(!cluster_disabled("# Cluster\r\ncluster_enabled:1\r\n"));
        assert!(!cluster_disabled(""));
        assert_eq!(addr("::1", 7000), "[::1]:7000");
        assert_eq!(addr("h", 7000), "h:7000");
    }
}
