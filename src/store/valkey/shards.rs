//! Whether every shard can make a write durable (SPEC §18): read from
//! `CLUSTER SHARDS` at start (`migrate`) and for `/readyz` (`ping`).
//! A shard fails the check, named by its slots and primary, when no
//! primary answers for it, when it has fewer replicas online than
//! `replicas` (its claims could not be confirmed), or, with `fsynced`,
//! when its primary has no append-only file or no `WAITAOF` (older than
//! Redis 7.2).
//!
//! A server not in cluster mode is one shard, named by its address: its
//! replicas are the `slaveN` lines of its `INFO replication` whose
//! `state` is `online`, and the same checks follow. Such a server that is
//! itself a replica (`role:slave`) fails the check, naming its primary:
//! every write would be refused (`READONLY`), and following it to its
//! primary would make the URL name a server that is not the one written
//! to, which a later failover would silently change.

use std::collections::HashMap;

use super::link::Conn;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;

use super::target::{Durability, ValkeyTarget};
use crate::store::StoreError;

/// One shard as `CLUSTER SHARDS` describes it (no slots: the one server
/// not in cluster mode).
#[derive(Debug, Default)]
struct Shard {
    slots: Vec<i64>,
    primary: Option<(String, u16)>,
    replicas_online: u32,
}

impl Shard {
    fn name(&self) -> String {
        if self.slots.is_empty() {
            let (h, p) = self.primary.clone().unwrap_or_default();
            return format!(
                "the server {} (one shard, not in cluster mode)",
                super::connect::addr(&h, p)
            );
        }
        let ranges: Vec<String> = self
            .slots
            .chunks(2)
            .map(|r| format!("{}-{}", r[0], r.get(1).copied().unwrap_or(r[0])))
            .collect();
        match &self.primary {
            Some((h, p)) => format!("the shard of slots {} (primary {h}:{p})", ranges.join(",")),
            None => format!(
                "the shard of slots {} (no primary online)",
                ranges.join(",")
            ),
        }
    }
}

/// A flat `[key, value, …]` array (or a map) as pairs by key.
fn pairs(v: Value) -> HashMap<String, Value> {
    let items: Vec<(Value, Value)> = match v {
        Value::Map(m) => m,
        Value::Array(a) => {
            let mut out = Vec::new();
            let mut it = a.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k, v));
            }
            out
        }
        _ => Vec::new(),
    };
    items
        .into_iter()
        .filter_map(|(k, v)| redis::from_redis_value::<String>(k).ok().map(|k| (k, v)))
        .collect()
}

fn field(node: &HashMap<String, Value>, name: &str) -> Option<String> {
    node.get(name)
        .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
}

fn parse_shards(v: Value) -> Vec<Shard> {
    let Value::Array(shards) = v else {
        return Vec::new();
    };
    shards
        .into_iter()
        .map(|s| {
            let mut s = pairs(s);
            let slots = s
                .remove("slots")
                .and_then(|v| redis::from_redis_value::<Vec<i64>>(v).ok())
                .unwrap_or_default();
            let mut shard = Shard {
                slots,
                ..Default::default()
            };
            let nodes = match s.remove("nodes") {
                Some(Value::Array(n)) => n,
                _ => Vec::new(),
            };
            for node in nodes.into_iter().map(pairs) {
                let online = field(&node, "health").as_deref() == Some("online");
                match field(&node, "role").as_deref() {
                    Some("master") | Some("primary") if online => {
                        let host = field(&node, "ip")
                            .or_else(|| field(&node, "endpoint"))
                            .unwrap_or_default();
                        let port = node
                            .get("port")
                            .or_else(|| node.get("tls-port"))
                            .and_then(|v| redis::from_redis_value_ref::<u16>(v).ok())
                            .unwrap_or(0);
                        shard.primary = Some((host, port));
                    }
                    Some("replica") | Some("slave") if online => shard.replicas_online += 1,
                    _ => {}
                }
            }
            shard
        })
        .filter(|s| !s.slots.is_empty())
        .collect()
}

/// What `INFO replication` says of a server not in cluster mode.
#[derive(Debug, PartialEq)]
struct Replication {
    /// `master_host:master_port` when it is a replica.
    replica_of: Option<String>,
    /// Its `slaveN` lines with `state=online`.
    replicas_online: u32,
}

fn parse_replication(info: &str) -> Replication {
    let mut role_replica = false;
    let (mut host, mut port) = (String::new(), String::new());
    let mut online = 0;
    for line in info.lines().map(str::trim) {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        match key {
            "role" => role_replica = value == "slave" || value == "replica",
            "master_host" => host = value.to_string(),
            "master_port" => port = value.to_string(),
            k if k.len() > 5
                && k.starts_with("slave")
                && k[5..].bytes().all(|b| b.is_ascii_digit())
                && value.split(',').any(|kv| kv == "state=online") =>
            {
                online += 1;
            }
            _ => {}
        }
    }
    Replication {
        replica_of: role_replica.then(|| super::connect::addr(&host, port.parse().unwrap_or(0))),
        replicas_online: online,
    }
}

/// Checks every shard; the error names the first that fails and why. How
/// many shards serve slots (1 for a server not in cluster mode).
pub(super) async fn check(conn: &Conn, target: &ValkeyTarget) -> Result<u64, StoreError> {
    let mut conn = conn.clone();
    if let Conn::Single(_) = conn {
        return check_single(&mut conn, target).await;
    }
    let reply = conn
        .route_command(
            redis::cmd("CLUSTER").arg("SHARDS").clone(),
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
        )
        .await
        .map_err(|e| StoreError::Unavailable(format!("valkey: CLUSTER SHARDS: {e}")))?;
    let shards = parse_shards(reply);
    if shards.is_empty() {
        return Err(StoreError::Unavailable(
            "valkey: CLUSTER SHARDS lists no shard serving slots".into(),
        ));
    }
    let served: i64 = shards
        .iter()
        .flat_map(|s| {
            s.slots
                .chunks(2)
                .map(|r| r.get(1).copied().unwrap_or(r[0]) - r[0] + 1)
        })
        .sum();
    for shard in &shards {
        check_shard(&mut conn, shard, target).await?;
    }
    if served < 16_384 {
        return Err(StoreError::Unavailable(format!(
            "valkey: only {served} of 16384 slots are served"
        )));
    }
    Ok(shards.len() as u64)
}

/// The one server not in cluster mode (the URL's only seed), as a shard.
async fn check_single(conn: &mut Conn, target: &ValkeyTarget) -> Result<u64, StoreError> {
    let mut shard = Shard {
        primary: target.seeds.first().cloned(),
        ..Default::default()
    };
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(conn)
        .await
        .map_err(|e| {
            StoreError::Unavailable(format!("valkey: {}: INFO replication: {e}", shard.name()))
        })?;
    let replication = parse_replication(&info);
    if let Some(primary) = replication.replica_of {
        return Err(StoreError::Unavailable(format!(
            "valkey: {}: it is a replica of {primary}, so every write would be refused; \
             name its primary in the store URL",
            shard.name()
        )));
    }
    shard.replicas_online = replication.replicas_online;
    check_shard(conn, &shard, target).await?;
    Ok(1)
}

async fn check_shard(
    conn: &mut Conn,
    shard: &Shard,
    target: &ValkeyTarget,
) -> Result<(), StoreError> {
    let refuse = |why: String| {
        Err(StoreError::Unavailable(format!(
            "valkey: {}: {why}",
            shard.name()
        )))
    };
    let Some((host, port)) = shard.primary.clone() else {
        return refuse("no primary answers for it".into());
    };
    if target.durability == Durability::None {
        return Ok(());
    }
    if shard.replicas_online < target.replicas {
        return refuse(format!(
            "{} replica(s) online, and replicas={} needs {} for each write (durability {})",
            shard.replicas_online, target.replicas, target.replicas, target.durability
        ));
    }
    if target.durability != Durability::Fsynced {
        return Ok(());
    }
    let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
    let aof = conn
        .route_command(
            redis::cmd("CONFIG").arg("GET").arg("appendonly").clone(),
            node.clone(),
        )
        .await
        .map_err(|e| {
            StoreError::Unavailable(format!("valkey: {}: CONFIG GET: {e}", shard.name()))
        })?;
    let aof = pairs(aof);
    if field(&aof, "appendonly").as_deref() != Some("yes") {
        return refuse(
            "its primary has no append-only file (appendonly no), so WAITAOF cannot confirm a \
             write on disk (set appendonly yes, or durability: replica_received)"
                .into(),
        );
    }
    if let Err(e) = conn
        .route_command(redis::cmd("WAITAOF").arg(0).arg(0).arg(1).clone(), node)
        .await
    {
        return refuse(format!(
            "its primary does not answer WAITAOF ({e}): Valkey 8+ or Redis 7.2+ is needed \
             (or durability: replica_received)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn node(role: &str, port: i64, health: &str) -> Value {
        Value::Array(vec![
            bulk("id"),
            bulk("abc"),
            bulk("port"),
            Value::Int(port),
            bulk("ip"),
            bulk("127.0.0.1"),
            bulk("role"),
            bulk(role),
            bulk("health"),
            bulk(health),
        ])
    }

    #[test]
    fn a_single_server_counts_its_online_replicas_and_says_when_it_is_one() {
        let primary = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n\
            slave0:ip=127.0.0.1,port=7001,state=online,offset=42,lag=0\r\n\
            slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\n\
            slave_read_repl_offset:42\r\nmaster_repl_offset:42\r\n";
        assert_eq!(
            parse_replication(primary),
            Replication {
                replica_of: None,
                replicas_online: 1
            }
        );
        let replica = "# Replication\r\nrole:slave\r\nmaster_host:10.0.0.5\r\n\
            master_port:6380\r\nmaster_link_status:up\r\nslave_read_only:1\r\n\
            connected_slaves:0\r\n";
        assert_eq!(
            parse_replication(replica),
            Replication {
                replica_of: Some("10.0.0.5:6380".into()),
                replicas_online: 0
            }
        );
        let shard = Shard {
            primary: Some(("127.0.0.1".into(), 7000)),
            ..Default::default()
        };
        assert_eq!(
            shard.name(),
            "the server 127.0.0.1:7000 (one shard, not in cluster mode)"
        );
    }

    #[test]
    fn shards_count_their_online_replicas() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                bulk("slots"),
                Value::Array(vec![Value::Int(0), Value::Int(5460)]),
                bulk("nodes"),
                Value::Array(vec![
                    node("master", 7000, "online"),
                    node("replica", 7003, "online"),
                    node("replica", 7004, "fail"),
                ]),
            ]),
            Value::Array(vec![
                bulk("slots"),
                Value::Array(vec![]),
                bulk("nodes"),
                Value::Array(vec![node("master", 7009, "online")]),
            ]),
        ]);
        let shards = parse_shards(reply);
        assert_eq!(shards.len(), 1, "a shard with no slots is not one");
        assert_eq!(shards[0].replicas_online, 1);
        assert_eq!(shards[0].primary, Some(("127.0.0.1".into(), 7000)));
        assert_eq!(
            shards[0].name(),
            "the shard of slots 0-5460 (primary 127.0.0.1:7000)"
        );
    }
}
