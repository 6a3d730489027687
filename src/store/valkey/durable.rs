//! The durability wait of SPEC §18, shared as group commit shares an
//! fsync: a write's answer counts only once `WAITAOF 1 N` (or `WAIT N`)
//! confirmed it, sent *after* the write's reply, on the *same* connection,
//! with no other write of that connection in flight.
//!
//! Why this shape (measured on Valkey 9.1.2, V4-NOTES):
//! - `WAITAOF` counts only the calling connection's writes; sent on
//!   another connection it answered "1 replica" while the replica was
//!   stopped. So each wait is routed to the slot's primary explicitly
//!   (never with the command's own `ALL_SHARDS` policy, which a cluster
//!   client fans out), and who answers is asked in the same pipeline as
//!   the write and as the wait ([`ask_who`]: `CLUSTER MYID` and `CLIENT
//!   ID`): if the client reconnected in between, or the slot's primary is
//!   now another node, the answers differ and the write's durability is
//!   unknown (an error, never a confirmation that covers nothing). The
//!   node is part of it because client IDs are a count per server: two
//!   nodes hand out the same IDs.
//! - A write and its `WAITAOF` pipelined together answered after about
//!   1 s: the wait asks the replica for its fsync offset (`GETACK`), the
//!   replica answers before it has fsynced a write that reached it in the
//!   same read, and otherwise reports only once a second. Sent after the
//!   write's reply, the wait answered in a few ms, though still after 1 s
//!   for about one wait in ten when nothing else was waiting; a wait
//!   blocked so is released by the next wait of any connection (each asks
//!   the replicas again), so a wait not answered within [`ASK_AGAIN`] is
//!   sent again.
//! - A `WAITAOF` blocks its connection on the server: with every write to
//!   a node on one multiplexed connection, the writes sent while a wait
//!   was blocked reached the server right in front of the next wait, so
//!   under load nearly every wait was the 1 s case (scenario (v) of the
//!   load harness: 12 req/s, p50 1.0 s at 16 connections; about 510 req/s,
//!   p50 14 ms with the lanes below, docs/performance.md).
//!
//! So the store writes on [`LANES`] connections (each a [`Link`]), and
//! [`lanes`](super::lanes) keeps a lane's writes and its waits apart: a
//! write takes a lane with nothing in flight ([`Durable::lease`]), and
//! once its reply came it joins the lane's next round of waits
//! ([`Lease::wait`]); the lane takes no new write until that round is
//! done, and the round starts when the lane's last write in flight
//! answered. A round sends one wait per node the lane wrote to (the
//! writes of one connection to one node share it: group commit per
//! connection), concurrently. Writes that find every lane busy queue, and
//! the next lane that opens sends them all in one pipeline
//! ([`Durable::hand`]; issue 52's "claims and settles that arrive together
//! go to each shard in one pipeline, followed by one wait"): the server
//! runs them in one pass, with one fsync there and one on the replica, and
//! one pair of questions of who ran them. In (v) of the load harness this
//! took 3–7 % more requests per second and 8–11 % less idemgate CPU per
//! request than each write sent on its own (docs/performance.md). The phases are
//! kept per node, as a lane is one connection per node: its connection to
//! a shard whose replica is slow may wait while its connections to the
//! other shards write, so one shard's trouble does not hold the others'
//! writes (SPEC §18: "the other shards keep working"). A write learns its
//! node from its slot, by the node that slot was last written on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, Value};
use tokio::sync::oneshot;

use super::lanes::{Lanes, Next};
use super::link::{Conn, Link};
use super::target::Durability;
use crate::store::StoreError;

/// How many connections the store writes on (its lanes), each a cluster
/// connection (one multiplexed connection per node) or, for a server not
/// in cluster mode, one multiplexed connection. On one node a lane has
/// one write (or one batch) in flight, or its wait: two keep the node's
/// writes flowing while one waits, and more let more waits overlap, which
/// is what releases a wait the replica answered too early (each blocked
/// wait asks the replicas
/// again: a Python client on loopback, a write and its wait pipelined on
/// each connection, saw every wait take 1 s with 2 connections, and 12 ms
/// at p50 with 5). Eight: fewer lanes make larger rounds (more writes per
/// wait), more make more waits overlap; in smoke runs of (v) 8 lanes had a
/// p99 of 64 ms against about 950 ms with 4 (docs/performance.md); with
/// writes batched ([`Durable::hand`]), 8 lanes did better than 3 and 2
/// (3,748, 3,430 and 3,147 req/s, one 10 s run each at 64 connections). It
/// costs 8 connections per node per proxy (plus one for reads), against
/// Valkey's default `maxclients` of 10,000.
pub(super) const LANES: usize = 8;

type Answer = Result<(), String>;

/// How long one wait blocks on the server before it is sent again. A
/// replica reports how far it has fsynced when its primary asks (each
/// `WAITAOF` asks, once) and otherwise once a second; when the answer to
/// that one asking came before the replica's fsync of the write, the wait
/// would block until the next second. Sent again, it asks again: on
/// Valkey 9.1.2 here, scenario (v)'s p99 went from 686–798 ms to 81–87 ms
/// and its req/s up 17 % (3 interleaved rounds, docs/performance.md). In
/// the common case the first asking is answered within a few ms and no
/// more waits are sent (300 concurrent claims: 25 waits, 26 `WAITAOF`).
const ASK_AGAIN: Duration = Duration::from_millis(5);

/// What one wait counted.
enum Counted {
    /// The primary and enough replicas.
    Enough,
    /// Fewer: what was missing.
    Short(String),
}

/// Who ran a pipeline: the node (its cluster node ID; empty for a server
/// not in cluster mode, the only node) and the connection's `CLIENT ID`
/// there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Wrote {
    node: String,
    client: i64,
}

/// Adds to `pipe` the questions that say who runs it on `conn` (see
/// [`Wrote`]); how many they are. [`who`] reads their answers.
pub(super) fn ask_who(pipe: &mut Pipeline, conn: &Conn) -> usize {
    match conn {
        Conn::Cluster(_) => {
            pipe.cmd("CLUSTER").arg("MYID");
            pipe.cmd("CLIENT").arg("ID");
            2
        }
        Conn::Single(_) => {
            pipe.cmd("CLIENT").arg("ID");
            1
        }
    }
}

/// Who ran a pipeline, from the answers to [`ask_who`]'s questions.
pub(super) fn who(answers: Vec<Value>) -> Result<Wrote, String> {
    let text = |e: redis::ParsingError| e.to_string();
    match <[Value; 2]>::try_from(answers) {
        Ok([node, id]) => Ok(Wrote {
            node: redis::from_redis_value(node).map_err(text)?,
            client: redis::from_redis_value(id).map_err(text)?,
        }),
        Err(answers) => match <[Value; 1]>::try_from(answers) {
            Ok([id]) => Ok(Wrote {
                node: String::new(),
                client: redis::from_redis_value(id).map_err(text)?,
            }),
            Err(v) => Err(format!("{} answers to who wrote", v.len())),
        },
    }
}

/// A write's answer from the batch it was sent in (see [`Durable::hand`]):
/// the command's answer (an error in its place) and who ran it, or the
/// error of the whole pipeline.
pub(super) type Sent = Result<(Value, Result<Wrote, StoreError>), StoreError>;

/// A write that found no lane open on its node.
pub(super) struct Queued {
    /// Its command, for the batch; `None`: the writer sends it itself.
    cmd: Option<Cmd>,
    /// A slot it writes to: where the batch is routed.
    slot: u16,
    tx: oneshot::Sender<Handed>,
}

/// What a queued write is handed when a lane opens.
struct Handed {
    lease: Lease,
    sent: Option<Sent>,
}

/// Answers every write of a batch with `error` (each its own: a store
/// error is not `Clone`).
fn answer_all(batch: Vec<(oneshot::Sender<Handed>, Lease)>, error: impl Fn() -> StoreError) {
    for (tx, lease) in batch {
        let _ = tx.send(Handed {
            lease,
            sent: Some(Err(error())),
        });
    }
}

/// A writer waiting for its lane's next round.
struct Waiter {
    wrote: Wrote,
    /// A slot it wrote to: where the wait is routed.
    slot: u16,
    /// The connection that wrote (a handle).
    conn: Conn,
    tx: oneshot::Sender<Answer>,
}

/// The writers of one round that share a wait: same node, same
/// connection.
struct Group {
    wrote: Wrote,
    slot: u16,
    conn: Conn,
    txs: Vec<oneshot::Sender<Answer>>,
}

pub(super) struct Durable {
    mode: Durability,
    replicas: u32,
    /// The server-side timeout of one wait.
    limit: Duration,
    /// The lanes' connections, each renewed on its own failures.
    links: Vec<Arc<Link>>,
    /// The lanes' phases on each node (by [`Wrote::node`]): a lane's
    /// connection to one node waits while its connections to the others
    /// write.
    lanes: Mutex<HashMap<String, Lanes<Waiter, Queued>>>,
    /// The node each slot was last written on, so that a write takes a
    /// lane open on the node it goes to (a guess: a slot that moved costs
    /// speed until its next write tells, never a false confirmation, which
    /// each wait's own check rules out).
    slots: Mutex<HashMap<u16, String>>,
    /// Whether the links are to a server not in cluster mode (the only
    /// node, named "").
    single: bool,
    /// The next lane for `durability: none` (no waits, no phases).
    next: AtomicUsize,
    rt: tokio::runtime::Handle,
    /// How long each wait took since the metrics last took them, at most
    /// [`WAITS_KEPT`] (the metrics read them every second).
    waits: Mutex<Vec<f64>>,
}

/// The most wait durations kept between two reads of the metrics.
const WAITS_KEPT: usize = 4096;

/// A write's hold on a lane, from before it is sent until its reply came
/// ([`Lease::wait`]) or it is dropped (no wait wanted).
pub(super) struct Lease {
    durable: Arc<Durable>,
    /// The node whose lanes it counts in (where the slot was guessed to
    /// be).
    node: String,
    lane: usize,
    conn: Conn,
    /// Whether the lane counts this write (not for `durability: none`,
    /// nor once it joined the round).
    held: bool,
}

impl Durable {
    /// One lane per link in `links` (at least one).
    pub(super) fn new(
        mode: Durability,
        replicas: u32,
        limit: Duration,
        links: Vec<Arc<Link>>,
    ) -> Durable {
        assert!(!links.is_empty(), "the store writes on at least one lane");
        Durable {
            mode,
            replicas,
            limit,
            lanes: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
            single: matches!(links[0].conn(), Conn::Single(_)),
            links,
            next: AtomicUsize::new(0),
            rt: tokio::runtime::Handle::current(),
            waits: Mutex::new(Vec::new()),
        }
    }

    /// The lanes of `node`, for `f`.
    fn on_node<T>(&self, node: &str, f: impl FnOnce(&mut Lanes<Waiter, Queued>) -> T) -> T {
        let mut all = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(lanes) = all.get_mut(node) {
            return f(lanes);
        }
        f(all
            .entry(node.to_string())
            .or_insert_with(|| Lanes::new(self.links.len())))
    }

    /// The node `slot` was last written on; "?" when none is known yet.
    fn node_of(&self, slot: u16) -> String {
        if self.single {
            return String::new();
        }
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.get(&slot).cloned().unwrap_or_else(|| "?".into())
    }

    /// A lane to write to `slot` on: one open on the slot's node, or, when
    /// none is, the next that opens there.
    pub(super) async fn lease(self: &Arc<Self>, slot: u16) -> Lease {
        self.lease_to_send(slot, None).await.0
    }

    /// [`lease`](Self::lease) for a write whose command is `cmd`: when it
    /// queued, the lane that opens sends it with the others queued there,
    /// in one pipeline ([`Self::hand`]), and its answer comes with the
    /// lease (else the writer sends it itself).
    pub(super) async fn lease_to_send(
        self: &Arc<Self>,
        slot: u16,
        cmd: Option<&Cmd>,
    ) -> (Lease, Option<Sent>) {
        if self.mode == Durability::None {
            let lane = self.next.fetch_add(1, Ordering::Relaxed) % self.links.len();
            return (self.lease_on(String::new(), lane, false), None);
        }
        let node = self.node_of(slot);
        loop {
            let (tx, rx) = oneshot::channel();
            let queued = || Queued {
                cmd: cmd.cloned(),
                slot,
                tx,
            };
            let taken = self.on_node(&node, |l| l.take(queued));
            match taken {
                Some(lane) => return (self.lease_on(node, lane, true), None),
                // the lane that opens hands over a lease that holds it
                None => {
                    if let Ok(handed) = rx.await {
                        return (handed.lease, handed.sent);
                    }
                }
            }
        }
    }

    fn lease_on(self: &Arc<Self>, node: String, lane: usize, held: bool) -> Lease {
        Lease {
            durable: Arc::clone(self),
            node,
            lane,
            conn: self.links[lane].conn(),
            held,
        }
    }

    /// Does what `lane` on `node` does next: starts its round, or hands
    /// it to the writes queued for it.
    fn then(self: &Arc<Self>, node: &str, lane: usize, next: Next<Waiter, Queued>) {
        match next {
            Next::Nothing => {}
            Next::Round(joined) => {
                self.rt
                    .spawn(Arc::clone(self).round(node.to_string(), lane, joined));
            }
            Next::Hand(queued) => {
                let durable = Arc::clone(self);
                let node = node.to_string();
                self.rt
                    .spawn(async move { durable.hand(&node, lane, queued).await });
            }
        }
    }

    /// One round of waits on `lane`: one per node and connection that
    /// wrote, concurrently; then the lane opens to the writes queued.
    async fn round(self: Arc<Self>, node: String, lane: usize, joined: Vec<Waiter>) {
        let mut groups: Vec<Group> = Vec::new();
        for w in joined {
            match groups.iter_mut().find(|g| g.wrote == w.wrote) {
                Some(g) => g.txs.push(w.tx),
                None => groups.push(Group {
                    wrote: w.wrote,
                    slot: w.slot,
                    conn: w.conn,
                    txs: vec![w.tx],
                }),
            }
        }
        if groups.len() == 1 {
            if let Some(g) = groups.pop() {
                self.group(lane, g).await;
            }
        } else {
            let mut set = tokio::task::JoinSet::new();
            for g in groups {
                set.spawn(Arc::clone(&self).group_owned(lane, g));
            }
            while set.join_next().await.is_some() {}
        }
        let queued = self.on_node(&node, |l| l.done(lane));
        self.hand(&node, lane, queued).await;
    }

    /// Hands `lane` on `node`, just opened, to the writes `queued` for it:
    /// those that gave their command are sent together, in one pipeline
    /// with one pair of questions of who ran it, so that the server runs
    /// them in one pass (one fsync of its append-only file, one on its
    /// replica) and they share the lane's next wait, as group commit
    /// shares an fsync. A writer gone meanwhile is left out, and drops the
    /// lease it is handed, which lets go of the lane.
    async fn hand(self: &Arc<Self>, node: &str, lane: usize, queued: Vec<Queued>) {
        // one write gains nothing from a batch; writes to slots whose node
        // is not known yet ("?") may be for several nodes: each sends
        // itself, routed by the client's map
        let together = node != "?"
            && queued
                .iter()
                .filter(|q| q.cmd.is_some() && !q.tx.is_closed())
                .count()
                >= 2;
        let (mut pipe, mut route_slot) = (redis::pipe(), None);
        let mut batch = Vec::new();
        for q in queued {
            let lease = self.lease_on(node.to_string(), lane, true);
            match q.cmd {
                Some(cmd) if together && !q.tx.is_closed() => {
                    pipe.add_command(cmd);
                    route_slot.get_or_insert(q.slot);
                    batch.push((q.tx, lease));
                }
                _ => {
                    let _ = q.tx.send(Handed { lease, sent: None });
                }
            }
        }
        let Some(slot) = route_slot else { return };
        let conn = self.links[lane].conn();
        let asked = ask_who(&mut pipe, &conn);
        let n = batch.len();
        let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
        let answered = conn.clone().route_pipeline(pipe, 0, n + asked, route).await;
        let mut values = match answered {
            Ok(values) if values.len() == n + asked => values,
            Ok(values) => {
                let why = format!("{} answers to a batch of {n} writes", values.len());
                return answer_all(batch, || StoreError::Corrupt(why.clone()));
            }
            // a pipeline is refused whole for one command's redirection
            // (a slot that moved): the others may have run
            Err(e) => {
                self.links[lane].after_error(&e);
                return answer_all(batch, || StoreError::OutcomeUnknown(format!("valkey: {e}")));
            }
        };
        let who_ran = values.split_off(n);
        for ((tx, lease), value) in batch.into_iter().zip(values) {
            let wrote = who(who_ran.clone()).map_err(|e| StoreError::Corrupt(format!("who: {e}")));
            let _ = tx.send(Handed {
                lease,
                sent: Some(Ok((value, wrote))),
            });
        }
    }

    async fn group_owned(self: Arc<Self>, lane: usize, g: Group) {
        self.group(lane, g).await
    }

    /// The wait of one group, its answer to each of its writers: asked
    /// again every [`ASK_AGAIN`] until the count is there or the store's
    /// limit passed (each asking makes the primary ask its replicas again).
    async fn group(&self, lane: usize, mut g: Group) {
        let started = Instant::now();
        let answer = loop {
            let left = self.limit.saturating_sub(started.elapsed());
            // never 0: a server-side timeout of 0 blocks for good
            let step = left.min(ASK_AGAIN).max(Duration::from_millis(1));
            let asked = self.once(lane, &mut g, step);
            match tokio::time::timeout(step + Duration::from_secs(1), asked).await {
                Ok(Ok(Counted::Enough)) => break Ok(()),
                Ok(Ok(Counted::Short(why))) if started.elapsed() >= self.limit => break Err(why),
                Ok(Ok(Counted::Short(_))) => continue,
                Ok(Err(e)) => break Err(e),
                Err(_) => {
                    self.links[lane].renew();
                    break Err("no answer to the wait in time".into());
                }
            }
        };
        self.took(started.elapsed());
        for tx in g.txs {
            let _ = tx.send(answer.clone());
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

    /// One wait of at most `step` on the group's connection, routed to
    /// its slot's primary, checked to have run where the writes did.
    async fn once(&self, lane: usize, g: &mut Group, step: Duration) -> Result<Counted, String> {
        let ms = step.as_millis() as u64;
        let mut pipe = redis::pipe();
        match self.mode {
            Durability::Fsynced => pipe.cmd("WAITAOF").arg(1).arg(self.replicas).arg(ms),
            _ => pipe.cmd("WAIT").arg(self.replicas).arg(ms),
        };
        let asked = ask_who(&mut pipe, &g.conn);
        let route = SingleNodeRoutingInfo::SpecificNode(Route::new(g.slot, SlotAddr::Master));
        let mut values = g
            .conn
            .route_pipeline(pipe, 0, 1 + asked, route)
            .await
            .map_err(|e| {
                self.links[lane].after_error(&e);
                e.to_string()
            })?;
        if values.len() != 1 + asked {
            return Err(format!("{} answers to a wait", values.len()));
        }
        let answers = values.split_off(1);
        if who(answers)? != g.wrote {
            return Err("the connection that wrote was replaced before its wait".into());
        }
        let counts = values.pop().unwrap_or(Value::Nil);
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
            Ok(Counted::Enough)
        } else {
            Ok(Counted::Short(format!(
                "{replicas} of {} replicas confirmed within {} ms (the primary: {local})",
                self.replicas,
                self.limit.as_millis()
            )))
        }
    }
}

impl Lease {
    /// The lane's connection (a handle).
    pub(super) fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// The lane's link: renewed on this write's failures.
    pub(super) fn link(&self) -> &Arc<Link> {
        &self.durable.links[self.lane]
    }

    /// Waits until this lane's writes made so far (among them this one,
    /// `wrote`, to `slot`) are as durable as the store requires.
    pub(super) async fn wait(mut self, slot: u16, wrote: Wrote) -> Result<(), StoreError> {
        if !self.held {
            return Ok(());
        }
        self.held = false;
        let durable = Arc::clone(&self.durable);
        if !durable.single {
            let mut slots = durable.slots.lock().unwrap_or_else(|p| p.into_inner());
            if slots.get(&slot) != Some(&wrote.node) {
                slots.insert(slot, wrote.node.clone());
            }
        }
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter {
            wrote,
            slot,
            conn: self.conn.clone(),
            tx,
        };
        let next = durable.on_node(&self.node, |l| l.join(self.lane, waiter));
        durable.then(&self.node, self.lane, next);
        let unknown = |why: String| {
            StoreError::OutcomeUnknown(format!("the write was not confirmed durable: {why}"))
        };
        match tokio::time::timeout(durable.limit + Duration::from_secs(2), rx).await {
            Ok(Ok(answer)) => answer.map_err(unknown),
            Ok(Err(_)) => Err(unknown("the wait stopped".into())),
            Err(_) => {
                self.link().renew();
                Err(unknown("no answer to the wait in time".into()))
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.held {
            let next = self.durable.on_node(&self.node, |l| l.leave(self.lane));
            self.durable.then(&self.node, self.lane, next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_wrote_is_the_node_and_the_client_id() {
        let cluster = who(vec![Value::BulkString(b"abc".to_vec()), Value::Int(7)]).unwrap();
        assert_eq!(
            cluster,
            Wrote {
                node: "abc".into(),
                client: 7
            }
        );
        // the same client ID on another node is someone else
        let other = who(vec![Value::BulkString(b"def".to_vec()), Value::Int(7)]).unwrap();
        assert_ne!(cluster, other);
        let single = who(vec![Value::Int(7)]).unwrap();
        assert_eq!(single.node, "");
        assert!(who(vec![]).is_err());
        assert!(who(vec![Value::Int(1), Value::Int(2), Value::Int(3)]).is_err());
        assert!(who(vec![Value::Nil]).is_err());
    }
}
