//! The durability wait of SPEC §18, shared as group commit shares an
//! fsync: a write's answer counts only once `WAITAOF 1 N` (or `WAIT N`)
//! confirmed it, sent *after* the write's reply, on the *same* connection.
//!
//! Why this shape (measured on Valkey 9.1.2, V4-NOTES):
//! - `WAITAOF` counts only the calling connection's writes; sent on
//!   another connection it answered "1 replica" while the replica was
//!   stopped. So each wait is routed to the slot's primary explicitly
//!   (never with the command's own `ALL_SHARDS` policy, which a cluster
//!   client fans out), and `CLIENT ID` is asked in the same pipeline as
//!   the write and as the wait: if the client reconnected in between, the
//!   IDs differ and the write's durability is unknown (an error, never a
//!   confirmation that covers nothing).
//! - A write and its `WAITAOF` pipelined together answered after about
//!   1 s (the replica reports its fsync once a second unless asked); sent
//!   after the write's reply, in about 1 ms. So the wait follows the reply.
//! - A `WAITAOF` covers every earlier write of its connection. Writes to
//!   one node share its multiplexed connection, so concurrent writes share
//!   one wait: the first writer whose reply came sends it, the writers
//!   whose replies come meanwhile wait for the next one, which is sent as
//!   soon as the first answers (one wait in flight per connection).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::link::Conn;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use tokio::sync::oneshot;

use super::link::Link;
use super::target::Durability;
use crate::store::StoreError;

type Answer = Result<(), String>;

/// The writers waiting on one connection (by its `CLIENT ID`).
struct Queue {
    /// A slot on the connection's node: where the wait is routed.
    slot: u16,
    waiters: Vec<oneshot::Sender<Answer>>,
}

pub(super) struct Durable {
    mode: Durability,
    replicas: u32,
    /// The server-side timeout of one wait.
    limit: Duration,
    queues: Mutex<HashMap<i64, Queue>>,
    rt: tokio::runtime::Handle,
    /// Told of a wait that got no answer (the connection may be stuck).
    link: Arc<Link>,
    /// How long each wait took since the metrics last took them, at most
    /// [`WAITS_KEPT`] (the metrics read them every second).
    waits: Mutex<Vec<f64>>,
}

/// The most wait durations kept between two reads of the metrics.
const WAITS_KEPT: usize = 4096;

impl Durable {
    pub(super) fn new(
        mode: Durability,
        replicas: u32,
        limit: Duration,
        link: Arc<Link>,
    ) -> Durable {
        Durable {
            mode,
            replicas,
            limit,
            queues: Mutex::new(HashMap::new()),
            rt: tokio::runtime::Handle::current(),
            link,
            waits: Mutex::new(Vec::new()),
        }
    }

    /// Waits until the writes of connection `client` made so far are as
    /// durable as the store requires; `slot` is one it wrote to.
    pub(super) async fn wait(
        self: &Arc<Self>,
        conn: &Conn,
        slot: u16,
        client: i64,
    ) -> Result<(), StoreError> {
        if self.mode == Durability::None {
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
            match queues.get_mut(&client) {
                Some(q) => {
                    q.waiters.push(tx);
                    false
                }
                None => {
                    queues.insert(
                        client,
                        Queue {
                            slot,
                            waiters: vec![tx],
                        },
                    );
                    true
                }
            }
        };
        if lead {
            self.rt.spawn(Arc::clone(self).lead(conn.clone(), client));
        }
        let unknown = |why: String| {
            StoreError::OutcomeUnknown(format!("the write was not confirmed durable: {why}"))
        };
        match tokio::time::timeout(self.limit + Duration::from_secs(1), rx).await {
            Ok(Ok(answer)) => answer.map_err(unknown),
            Ok(Err(_)) => Err(unknown("the wait stopped".into())),
            Err(_) => {
                self.link.renew();
                Err(unknown("no answer to the wait in time".into()))
            }
        }
    }

    /// Sends waits on one connection while writers queue for them; the
    /// queue goes when it is empty.
    async fn lead(self: Arc<Self>, mut conn: Conn, client: i64) {
        loop {
            let (slot, batch) = {
                let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
                let Some(q) = queues.get_mut(&client) else {
                    return;
                };
                if q.waiters.is_empty() {
                    queues.remove(&client);
                    return;
                }
                (q.slot, std::mem::take(&mut q.waiters))
            };
            let started = std::time::Instant::now();
            let answer = self.once(&mut conn, slot, client).await;
            self.took(started.elapsed());
            for w in batch {
                let _ = w.send(answer.clone());
            }
        }
    }

    /// The durations of the waits since the last call.
    pub(super) fn take_waits(&self) -> Vec<f64> {
        std::mem::take(&mut *self.waits.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn took(&self, d: Duration) {
        let mut waits = self.waits.lock().unwrap_or_else(|p| p.into_inner());
        if waits.len() < WAITS_KEPT {
            waits.push(d.as_secs_f64());
        }
    }

    /// One wait on the connection `client`, routed to `slot`'s primary.
    async fn once(&self, conn: &mut Conn, slot: u16, client: i64) -> Answer {
        let ms = self.limit.as_millis() as u64;
        let mut pipe = redis::pipe();
        match self.mode {
            Durability::Fsynced => pipe.cmd("WAITAOF").arg(1).arg(self.replicas).arg(ms),
            _ => pipe.cmd("WAIT").arg(self.replicas).arg(ms),
        };
        pipe.cmd("CLIENT").arg("ID");
        let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
        let values = conn.route_pipeline(pipe, 0, 2, route).await.map_err(|e| {
            self.link.after_error(&e);
            e.to_string()
        })?;
        let [counts, id] = <[redis::Value; 2]>::try_from(values)
            .map_err(|v| format!("{} answers to a wait", v.len()))?;
        let id: i64 = redis::from_redis_value(id).map_err(|e| e.to_string())?;
        if id != client {
            return Err("the connection that wrote was replaced before its wait".into());
        }
        let (local, replicas) = match self.mode {
            Durability::Fsynced => {
                let (l, r): (i64, i64) =
                    redis::from_redis_value(counts).map_err(|e| e.to_string())?;
                (l, r)
            }
            _ => (
                1,
                redis::from_redis_value(counts).map_err(|e| e.to_string())?,
            ),
        };
        if local >= 1 && replicas >= i64::from(self.replicas) {
            Ok(())
        } else {
            Err(format!(
                "{replicas} of {} replicas confirmed within {} ms (the primary: {local})",
                self.replicas, ms
            ))
        }
    }
}
