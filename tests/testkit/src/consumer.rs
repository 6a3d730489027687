//! The sample webhook consumer: the kit's [`Server`] with a script keyed by
//! the event (`Idempotency-Key`, else `X-Event-ID`). It records every
//! request and answers 200 "ok" unless a test scripted other answers.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::http::{self, Request};
use super::server::{Behavior, Server};

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    pub delay: Duration,
    pub content_type: &'static str,
    /// More header fields (`Retry-After`, …).
    pub headers: Vec<(String, String)>,
}

impl Reply {
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            body: b"ok".to_vec(),
            delay: Duration::ZERO,
            content_type: "text/plain",
            headers: Vec::new(),
        }
    }
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }
    pub fn body(mut self, body: &[u8]) -> Reply {
        self.body = body.to_vec();
        self
    }
    pub fn delay(mut self, d: Duration) -> Reply {
        self.delay = d;
        self
    }
}

/// Per key, answers consumed in order; the last one repeats.
type Scripts = Arc<Mutex<HashMap<String, VecDeque<Reply>>>>;

/// The sample consumer; stops when dropped.
pub struct Consumer {
    pub addr: SocketAddr,
    server: Server,
    scripts: Scripts,
}

impl Consumer {
    /// Starts on a free loopback port.
    pub fn start() -> std::io::Result<Consumer> {
        Self::start_on("127.0.0.1:0".parse().expect("loopback address"))
    }

    pub fn start_on(addr: SocketAddr) -> std::io::Result<Consumer> {
        let scripts = Scripts::default();
        let own = scripts.clone();
        let server = Server::start_on(addr, move |req: &Request, _| {
            let reply = req
                .key()
                .and_then(|k| {
                    own.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_mut(k)
                        .map(next)
                })
                .unwrap_or_else(|| Reply::status(200));
            let bytes = http::response_with(
                reply.status,
                reply.content_type,
                &reply.headers,
                &reply.body,
            );
            Behavior::Late(reply.delay, bytes)
        })?;
        Ok(Consumer {
            addr: server.addr,
            server,
            scripts,
        })
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Answers for `key`, in order; the last repeats. Default: 200 "ok".
    pub fn script(&self, key: &str, replies: Vec<Reply>) {
        (self.scripter())(key, replies)
    }

    /// One answer for `key`, every time: `status` (body "ok") after `delay`.
    pub fn hold(&self, key: &str, status: u16, delay: Duration) {
        self.script(key, vec![Reply::status(status).delay(delay)])
    }

    /// A handle that scripts answers from other threads.
    pub fn scripter(&self) -> impl Fn(&str, Vec<Reply>) + Send + Sync + 'static {
        let scripts = self.scripts.clone();
        move |key, replies| {
            scripts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.to_string(), replies.into());
        }
    }

    /// Every request received so far, in order.
    pub fn received(&self) -> Vec<Request> {
        self.server.received()
    }

    /// Requests received for this event.
    pub fn count(&self, key: &str) -> usize {
        self.server.count(key)
    }

    /// Requests received so far.
    pub fn total(&self) -> usize {
        self.server.total()
    }
}

/// The next scripted answer: the front one, or the last one again.
fn next(queue: &mut VecDeque<Reply>) -> Reply {
    if queue.len() > 1 {
        queue.pop_front().expect("non-empty")
    } else {
        queue[0].clone()
    }
}
