//! Whether every shard can make a write durable (SPEC §18): read from
//! `CLUSTER SHARDS` at start (`migrate`) and for `/readyz` (`ping`).
//! A shard fails the check, named by its slots and primary, when no
//! primary answers for it, when it has fewer replicas online than
//! `replicas` (its claims could not be confirmed), or, with `fsynced`,
//! when its primary has no append-only file or no `WAITAOF` (older than
//! Redis 7.2).

use std::collections::HashMap;

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;

use super::target::{Durability, ValkeyTarget};
use crate::store::StoreError;

/// One shard as `CLUSTER SHARDS` describes it.
#[derive(Debug, Default)]
struct Shard {
    slots: Vec<i64>,
    primary: Option<(String, u16)>,
    replicas_online: u32,
}

impl Shard {
    fn name(&self) -> String {
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

/// Checks every shard; the error names the first that fails and why. How
/// many shards serve slots.
pub(super) async fn check(
    conn: &ClusterConnection,
    target: &ValkeyTarget,
) -> Result<u64, StoreError> {
    let mut conn = conn.clone();
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

async fn check_shard(
    conn: &mut ClusterConnection,
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
