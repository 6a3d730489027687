//! Every open client connection and where it stands: the bookkeeping behind
//! `max_connections`, the header and keep-alive timeouts and
//! `idemgate_connections{state}`.
//!
//! One short mutex (never held across an await) guards a slab of slots and
//! three lists threaded through it, each in the order its members entered
//! their phase: connections waiting for their first request's head
//! (`reading`), kept-alive connections with no byte of a next request
//! (`idle`), and kept-alive connections part-way through their next head.
//! Each list shares one timeout, so its head expires first: the reaper's
//! tick and a reclaim touch only the connections they close. A connection
//! with a request in progress (`active`) is in no list and is never closed
//! from here.
//!
//! Closing is `shutdown(2)` on the socket: the connection's own task, parked
//! in a read, wakes to an end of stream and goes away. The slot is freed (by
//! the task, under the lock) before its socket is closed, and only a
//! connection whose task is parked in idemgate's own head read (so owns its
//! stream) can be in a list, so the descriptor shut down is always that
//! connection's.

use std::os::unix::io::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntGauge};

pub use crate::metrics::CloseReason as Reason;
use crate::metrics::Metrics;

/// Where a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Before its first request's head is complete (the TLS handshake included).
    Reading,
    /// Kept alive, no byte of a next request yet: the one reclaimable phase.
    Idle,
    /// Kept alive, part of the next request's head arrived (counted as idle).
    IdleHead,
    /// A request in progress, from its complete head to the end of its response.
    Active,
    /// Closed from here (or being torn down at shutdown); waits for its task.
    Closed,
    /// Not a connection.
    Free,
}

const NIL: u32 = u32::MAX;
/// The lists, by phase: `Reading`, `Idle`, `IdleHead`.
const LISTS: usize = 3;

fn list_of(phase: Phase) -> Option<usize> {
    match phase {
        Phase::Reading => Some(0),
        Phase::Idle => Some(1),
        Phase::IdleHead => Some(2),
        _ => None,
    }
}

struct Slot {
    fd: RawFd,
    phase: Phase,
    /// When it entered its phase, in ms since the table's epoch.
    since: u64,
    prev: u32,
    next: u32,
}

#[derive(Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

struct Inner {
    slots: Vec<Slot>,
    free: Vec<u32>,
    lists: [List; LISTS],
    /// Connections not closed from here (those count against the cap).
    open: usize,
}

/// The limits the table enforces (from `downstream`).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub header_timeout: Duration,
    pub keepalive_timeout: Duration,
    pub max_connections: usize,
}

/// The resolved metric series: one atomic per transition, no label lookup.
struct Series {
    active: IntGauge,
    idle: IntGauge,
    reading: IntGauge,
    closed: [IntCounter; 5],
}

pub struct Table {
    inner: Mutex<Inner>,
    limits: ConnectionLimits,
    epoch: Instant,
    series: Series,
}

/// One admitted connection; dropping it frees its slot.
pub struct Conn {
    table: Arc<Table>,
    idx: u32,
}

impl Table {
    pub fn new(limits: ConnectionLimits, metrics: &Metrics) -> Arc<Table> {
        let series = Series {
            active: metrics.connections_gauge("active"),
            idle: metrics.connections_gauge("idle"),
            reading: metrics.connections_gauge("reading"),
            closed: Reason::ALL.map(|r| metrics.closed_counter(r.as_str())),
        };
        Arc::new(Table {
            inner: Mutex::new(Inner {
                slots: Vec::new(),
                free: Vec::new(),
                lists: [List {
                    head: NIL,
                    tail: NIL,
                }; LISTS],
                open: 0,
            }),
            limits,
            epoch: Instant::now(),
            series,
        })
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a close for `reason` (also for closes decided elsewhere: body
    /// and write timeouts).
    pub fn count_close(&self, reason: Reason) {
        self.series.closed[reason as usize].inc();
    }

    fn gauge(&self, phase: Phase) -> Option<&IntGauge> {
        match phase {
            Phase::Reading => Some(&self.series.reading),
            Phase::Idle | Phase::IdleHead => Some(&self.series.idle),
            Phase::Active => Some(&self.series.active),
            Phase::Closed | Phase::Free => None,
        }
    }

    /// Admits a new connection (socket `fd`) in the `reading` phase. At the
    /// cap, the oldest idle kept-alive connection is closed to make room;
    /// with none, `None`: the caller closes the new one at once.
    pub fn admit(self: &Arc<Self>, fd: RawFd) -> Option<Conn> {
        let now = self.now();
        let mut inner = self.lock();
        if inner.open >= self.limits.max_connections {
            let oldest = inner.lists[1].head;
            if oldest == NIL {
                drop(inner);
                self.count_close(Reason::Limit);
                return None;
            }
            self.close(&mut inner, oldest, Some(Reason::Limit));
        }
        let idx = match inner.free.pop() {
            Some(i) => i,
            None => {
                inner.slots.push(Slot {
                    fd: -1,
                    phase: Phase::Free,
                    since: 0,
                    prev: NIL,
                    next: NIL,
                });
                (inner.slots.len() - 1) as u32
            }
        };
        let slot = &mut inner.slots[idx as usize];
        slot.fd = fd;
        slot.phase = Phase::Reading;
        slot.since = now;
        inner.open += 1;
        push_back(&mut inner, 0, idx);
        drop(inner);
        self.series.reading.inc();
        Some(Conn {
            table: Arc::clone(self),
            idx,
        })
    }

    /// Closes connection `idx` from here: out of its list and its gauge,
    /// counted (unless `reason` is `None`: a shutdown), its socket shut down.
    fn close(&self, inner: &mut Inner, idx: u32, reason: Option<Reason>) {
        let phase = inner.slots[idx as usize].phase;
        if let Some(l) = list_of(phase) {
            unlink(inner, l, idx);
        }
        if let Some(g) = self.gauge(phase) {
            g.dec();
        }
        let slot = &mut inner.slots[idx as usize];
        slot.phase = Phase::Closed;
        inner.open -= 1;
        if let Some(r) = reason {
            self.count_close(r);
        }
        // the descriptor is this connection's (see the module comment), and
        // a shutdown socket only wakes its reader
        crate::sys::shutdown_socket(slot.fd);
    }

    /// Closes every connection whose header or keep-alive time is up; the
    /// lists are in deadline order, so this stops at the first one still in
    /// time. Returns how many it closed.
    pub fn reap(&self) -> usize {
        let now = self.now();
        let header = self.limits.header_timeout.as_millis() as u64;
        let keepalive = self.limits.keepalive_timeout.as_millis() as u64;
        let mut inner = self.lock();
        let mut closed = 0;
        for (list, timeout, reason) in [
            (0, header, Reason::HeaderTimeout),
            (1, keepalive, Reason::KeepaliveTimeout),
            (2, header, Reason::HeaderTimeout),
        ] {
            loop {
                let idx = inner.lists[list].head;
                if idx == NIL || inner.slots[idx as usize].since + timeout > now {
                    break;
                }
                self.close(&mut inner, idx, Some(reason));
                closed += 1;
            }
        }
        closed
    }

    /// At shutdown (a stop or a hand-over to a new process): closes every
    /// kept-alive connection with no byte of a next request, so that the
    /// client's next request goes to a new connection (not counted as a
    /// close for a limit). A connection whose request head has begun, or
    /// that has not sent its first one yet, is left to be answered (with
    /// `Connection: close`): the client has sent, or is about to send, a
    /// request on it. The header timeout still bounds those.
    pub fn close_idle(&self) {
        let mut inner = self.lock();
        let idle = list_of(Phase::Idle).expect("idle is a list");
        while inner.lists[idle].head != NIL {
            let idx = inner.lists[idle].head;
            self.close(&mut inner, idx, None);
        }
    }

    /// Open connections other than idle kept-alive ones: a request in
    /// progress, or one expected (the drain at shutdown waits for them).
    pub fn busy(&self) -> usize {
        let inner = self.lock();
        let mut idle = 0;
        let mut idx = inner.lists[list_of(Phase::Idle).expect("idle is a list")].head;
        while idx != NIL {
            idle += 1;
            idx = inner.slots[idx as usize].next;
        }
        inner.open - idle
    }

    /// The reaper's period: fine enough for the shortest timeout.
    pub fn tick(&self) -> Duration {
        let shortest = self
            .limits
            .header_timeout
            .min(self.limits.keepalive_timeout);
        (shortest / 10).clamp(Duration::from_millis(10), Duration::from_millis(100))
    }

    /// Open connections (not closed from here).
    pub fn open(&self) -> usize {
        self.lock().open
    }
}

fn push_back(inner: &mut Inner, list: usize, idx: u32) {
    let tail = inner.lists[list].tail;
    {
        let slot = &mut inner.slots[idx as usize];
        slot.prev = tail;
        slot.next = NIL;
    }
    if tail == NIL {
        inner.lists[list].head = idx;
    } else {
        inner.slots[tail as usize].next = idx;
    }
    inner.lists[list].tail = idx;
}

fn unlink(inner: &mut Inner, list: usize, idx: u32) {
    let (prev, next) = {
        let s = &inner.slots[idx as usize];
        (s.prev, s.next)
    };
    if prev == NIL {
        inner.lists[list].head = next;
    } else {
        inner.slots[prev as usize].next = next;
    }
    if next == NIL {
        inner.lists[list].tail = prev;
    } else {
        inner.slots[next as usize].prev = prev;
    }
    let s = &mut inner.slots[idx as usize];
    s.prev = NIL;
    s.next = NIL;
}

impl Conn {
    /// Moves to `to` unless closed from here; `false` when closed (the
    /// caller then drops the connection).
    fn enter(&self, to: Phase) -> bool {
        let table = &*self.table;
        let now = if list_of(to).is_some() {
            table.now()
        } else {
            0
        };
        let mut inner = table.lock();
        let from = inner.slots[self.idx as usize].phase;
        if from == Phase::Closed {
            return false;
        }
        if from == to {
            return true;
        }
        if let Some(l) = list_of(from) {
            unlink(&mut inner, l, self.idx);
        }
        let slot = &mut inner.slots[self.idx as usize];
        slot.phase = to;
        slot.since = now;
        if let Some(l) = list_of(to) {
            push_back(&mut inner, l, self.idx);
        }
        drop(inner);
        if let (Some(a), Some(b)) = (table.gauge(from), table.gauge(to)) {
            if !std::ptr::eq(a, b) {
                a.dec();
                b.inc();
            }
        }
        true
    }

    /// The head is complete: a request is in progress and nothing here will
    /// close the connection until its response is written.
    pub fn activate(&self) -> bool {
        self.enter(Phase::Active)
    }

    /// The response is written; the connection is kept alive.
    pub fn idle(&self) -> bool {
        self.enter(Phase::Idle)
    }

    /// The first bytes of the next head arrived on a kept-alive connection.
    pub fn head_started(&self) -> bool {
        self.enter(Phase::IdleHead)
    }

    /// Whether it was closed from here (a timeout, the cap, a shutdown).
    pub fn closed(&self) -> bool {
        self.table.lock().slots[self.idx as usize].phase == Phase::Closed
    }

    pub fn table(&self) -> &Table {
        &self.table
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let table = &*self.table;
        let mut inner = table.lock();
        let phase = inner.slots[self.idx as usize].phase;
        if let Some(l) = list_of(phase) {
            unlink(&mut inner, l, self.idx);
        }
        if phase != Phase::Closed {
            inner.open -= 1;
        }
        let slot = &mut inner.slots[self.idx as usize];
        slot.phase = Phase::Free;
        slot.fd = -1;
        inner.free.push(self.idx);
        drop(inner);
        if let Some(g) = table.gauge(phase) {
            g.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::io::AsRawFd;
    use std::os::unix::net::UnixStream;

    fn table(max: usize, header_ms: u64, keepalive_ms: u64) -> (Arc<Table>, Metrics) {
        let m = Metrics::new();
        let t = Table::new(
            ConnectionLimits {
                header_timeout: Duration::from_millis(header_ms),
                keepalive_timeout: Duration::from_millis(keepalive_ms),
                max_connections: max,
            },
            &m,
        );
        (t, m)
    }

    /// A socket pair: the table shuts down `.0`; `.1` sees the end of stream.
    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    /// `N` fresh socket pairs, admitted in order: their connections, and
    /// the pairs (`.1` is the peer that sees a shutdown).
    fn admitted<const N: usize>(t: &Arc<Table>) -> ([Conn; N], [(UnixStream, UnixStream); N]) {
        let socks: [_; N] = std::array::from_fn(|_| pair());
        let conns = socks.each_ref().map(|s| t.admit(s.0.as_raw_fd()).unwrap());
        (conns, socks)
    }

    fn shut(s: &UnixStream) -> bool {
        use std::io::Read;
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        matches!((&*s).read(&mut b), Ok(0))
    }

    fn gauge(m: &Metrics, state: &str) -> i64 {
        m.connections_gauge(state).get()
    }

    fn closed(m: &Metrics, reason: Reason) -> u64 {
        m.closed_counter(reason.as_str()).get()
    }

    #[test]
    fn at_the_cap_the_oldest_idle_connection_makes_room() {
        let (t, m) = table(3, 60_000, 60_000);
        let ([a, b, c], socks) = admitted(&t);
        let fourth = pair();
        // b goes idle before a; c has a request in progress
        assert!(b.activate() && b.idle());
        std::thread::sleep(Duration::from_millis(2));
        assert!(a.activate() && a.idle());
        assert!(c.activate());
        assert_eq!((gauge(&m, "idle"), gauge(&m, "active")), (2, 1));
        let d = t.admit(fourth.0.as_raw_fd()).expect("room made");
        assert!(shut(&socks[1].1), "the oldest idle one (b) is closed");
        assert!(!shut(&socks[0].1) && !shut(&socks[2].1));
        assert!(b.closed() && !b.activate(), "a closed one cannot come back");
        assert_eq!(closed(&m, Reason::Limit), 1);
        assert_eq!(t.open(), 3);
        assert_eq!(gauge(&m, "reading"), 1);
        drop((a, b, c, d));
        assert_eq!(t.open(), 0);
        for s in ["active", "idle", "reading"] {
            assert_eq!(gauge(&m, s), 0, "{s}");
        }
    }

    #[test]
    fn past_the_cap_without_idle_connections_new_ones_are_refused() {
        let (t, m) = table(2, 60_000, 60_000);
        let ([a, b], socks) = admitted(&t);
        let third = pair();
        assert!(a.activate());
        // b waits for its head (reading): not reclaimable, nor is a (active)
        assert!(t.admit(third.0.as_raw_fd()).is_none());
        assert_eq!(closed(&m, Reason::Limit), 1);
        assert!(!shut(&socks[0].1) && !shut(&socks[1].1));
        drop(b);
        assert!(t.admit(third.0.as_raw_fd()).is_some());
    }

    #[test]
    fn the_reaper_closes_expired_heads_and_idle_connections_only() {
        let (t, m) = table(10, 50, 150);
        let ([reading, idle, active, head], socks) = admitted(&t);
        assert!(idle.activate() && idle.idle());
        assert!(active.activate());
        assert!(head.activate() && head.idle() && head.head_started());
        assert_eq!(t.reap(), 0);
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(t.reap(), 2, "the reading one and the part-way head");
        assert!(reading.closed() && head.closed() && !idle.closed());
        assert!(shut(&socks[0].1) && shut(&socks[3].1));
        assert_eq!(closed(&m, Reason::HeaderTimeout), 2);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(t.reap(), 1);
        assert!(idle.closed() && !active.closed());
        assert_eq!(closed(&m, Reason::KeepaliveTimeout), 1);
        assert!(!shut(&socks[2].1), "a request in progress is never cut");
        assert_eq!(gauge(&m, "active"), 1);
        assert_eq!(t.open(), 1);
    }

    #[test]
    fn a_connection_that_goes_idle_again_starts_its_keepalive_anew() {
        let (t, _m) = table(10, 60_000, 100);
        let ([c], _socks) = admitted(&t);
        assert!(c.activate() && c.idle());
        std::thread::sleep(Duration::from_millis(70));
        assert!(c.activate() && c.idle());
        std::thread::sleep(Duration::from_millis(70));
        assert_eq!(t.reap(), 0, "70 ms since it last went idle");
        assert!(!c.closed());
    }

    #[test]
    fn shutdown_closes_idle_connections_only_uncounted() {
        let (t, m) = table(10, 60_000, 60_000);
        let ([reading, active, idle, next_head], socks) = admitted(&t);
        assert!(active.activate());
        assert!(idle.activate() && idle.idle());
        assert!(next_head.activate() && next_head.idle() && next_head.head_started());
        assert_eq!(t.busy(), 3);
        t.close_idle();
        assert!(idle.closed() && shut(&socks[2].1));
        for (c, s) in [(&reading, 0), (&active, 1), (&next_head, 3)] {
            assert!(!c.closed() && !shut(&socks[s].1));
        }
        assert_eq!(t.busy(), 3);
        drop(active);
        assert_eq!(t.busy(), 2);
        for r in Reason::ALL {
            assert_eq!(closed(&m, r), 0);
        }
    }
}
