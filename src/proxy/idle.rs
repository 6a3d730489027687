//! Idle upstream connections kept for a route's next forward.
//!
//! pingora's own pool spawns a watcher task for every connection it takes
//! back and hands each reuse over through that task (a lock the watcher
//! holds until it is woken, a oneshot, a `getpeername`): a task spawn, a
//! timer and several wake-ups per forwarded request. Here a route keeps its
//! idle connections on a stack behind a short mutex (never held across an
//! await). A connection is checked when it is taken: a read that must find
//! nothing — an upstream that closed it or sent unasked-for data is dropped
//! then. Connections idle past the upstream's idle timeout are dropped when
//! the stack is touched and by [`IdleConnections::prune`], which the proxy
//! runs periodically (`routes::PruneIdle`) so that an unused route does not
//! keep sockets open.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::sync::Mutex;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use pingora::protocols::Stream;
use tokio::io::AsyncReadExt;

/// Most idle connections one route keeps (as pingora's pool size).
pub const MAX_IDLE: usize = 256;

/// One route's idle upstream connections, most recently used on top.
pub struct IdleConnections {
    stack: Mutex<VecDeque<Idle>>,
    /// How long a connection may stay idle (the upstream peer's idle timeout).
    idle_timeout: Duration,
}

struct Idle {
    stream: Stream,
    since: Instant,
}

impl IdleConnections {
    pub fn new(idle_timeout: Duration) -> Self {
        IdleConnections {
            stack: Mutex::new(VecDeque::new()),
            idle_timeout,
        }
    }

    /// The most recently used connection that is still open and quiet, if any.
    pub fn take(&self) -> Option<Stream> {
        let now = Instant::now();
        loop {
            let idle = self.lock().pop_back()?;
            if now.duration_since(idle.since) >= self.idle_timeout {
                // everything below it is older still (but not what another
                // thread put back meanwhile); closed outside the lock
                let expired = self.expired(&mut self.lock(), now);
                drop(expired);
                return None;
            }
            let mut stream = idle.stream;
            if quiet(&mut stream) {
                return Some(stream);
            }
        }
    }

    /// Keeps a connection whose last exchange ended cleanly.
    pub fn put(&self, stream: Stream) {
        let now = Instant::now();
        let dropped = {
            let mut stack = self.lock();
            let mut dropped = self.expired(&mut stack, now);
            if stack.len() >= MAX_IDLE {
                dropped.extend(stack.pop_front());
            }
            stack.push_back(Idle { stream, since: now });
            dropped
        };
        drop(dropped); // closed outside the lock
    }

    /// Closes the connections idle past the timeout; returns how many.
    pub fn prune(&self, now: Instant) -> usize {
        let expired = self.expired(&mut self.lock(), now);
        expired.len() // closed here, outside the lock
    }

    /// Takes the connections idle past the timeout off the stack (they are
    /// at its bottom: the stack is in the order they were put back).
    fn expired(&self, stack: &mut VecDeque<Idle>, now: Instant) -> Vec<Idle> {
        let n = stack
            .iter()
            .take_while(|i| now.duration_since(i.since) >= self.idle_timeout)
            .count();
        stack.drain(..n).collect()
    }

    /// Idle connections kept now (for the tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Idle>> {
        // a panic while holding it cannot leave the stack inconsistent
        self.stack.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Whether an idle connection has nothing to read: no end of stream, no
/// error, no bytes (an upstream never speaks first on an idle HTTP/1
/// connection). One non-blocking poll; it registers no waker of ours.
fn quiet(stream: &mut Stream) -> bool {
    let mut byte = [0u8; 1];
    let read = tokio::task::unconstrained(stream.read(&mut byte));
    let mut cx = Context::from_waker(Waker::noop());
    pin!(read).poll(&mut cx).is_pending()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    /// A connected pair: our side as a pingora stream, and the peer's socket.
    async fn pair() -> (Stream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (ours, theirs) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let ours: pingora::protocols::l4::stream::Stream = ours.unwrap().into();
        (Box::new(ours), theirs.unwrap().0)
    }

    /// Lets the reactor see what the peer did to the socket.
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    #[tokio::test]
    async fn takes_the_most_recent_open_connection() {
        let pool = IdleConnections::new(Duration::from_secs(60));
        let (a, _peer_a) = pair().await;
        let (b, _peer_b) = pair().await;
        let b_id = pingora::protocols::UniqueID::id(&*b);
        pool.put(a);
        pool.put(b);
        let taken = pool.take().expect("an open connection");
        assert_eq!(pingora::protocols::UniqueID::id(&*taken), b_id);
        assert_eq!(pool.len(), 1);
    }

    #[tokio::test]
    async fn drops_connections_the_upstream_closed_or_wrote_to() {
        let pool = IdleConnections::new(Duration::from_secs(60));
        let (open, _peer_open) = pair().await;
        let (closed, peer_closed) = pair().await;
        let (chatty, mut peer_chatty) = pair().await;
        let open_id = pingora::protocols::UniqueID::id(&*open);
        pool.put(open);
        pool.put(closed);
        pool.put(chatty);
        drop(peer_closed);
        peer_chatty
            .write_all(b"HTTP/1.1 408 \r\n\r\n")
            .await
            .unwrap();
        settle().await;
        let taken = pool.take().expect("the open one is left");
        assert_eq!(pingora::protocols::UniqueID::id(&*taken), open_id);
        assert!(pool.take().is_none());
    }

    #[tokio::test]
    async fn expired_connections_are_not_reused_and_are_pruned() {
        let pool = IdleConnections::new(Duration::from_millis(30));
        let (a, _peer_a) = pair().await;
        let (b, _peer_b) = pair().await;
        pool.put(a);
        pool.put(b);
        settle().await;
        assert_eq!(pool.prune(Instant::now()), 2);
        assert!(pool.is_empty());

        let (c, _peer_c) = pair().await;
        pool.put(c);
        settle().await;
        assert!(pool.take().is_none(), "idle past the timeout");
        assert!(pool.is_empty());
    }

    #[tokio::test]
    async fn keeps_at_most_max_idle() {
        let pool = IdleConnections::new(Duration::from_secs(60));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut peers = Vec::new();
        for _ in 0..MAX_IDLE + 3 {
            let (ours, theirs) = tokio::join!(TcpStream::connect(addr), listener.accept());
            let ours: pingora::protocols::l4::stream::Stream = ours.unwrap().into();
            pool.put(Box::new(ours));
            peers.push(theirs.unwrap().0);
        }
        assert_eq!(pool.len(), MAX_IDLE);
    }
}
