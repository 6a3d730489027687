//! Spans leave the request path here: [`Queue`] takes each finished
//! request's spans ([`TraceRecord`]) onto a queue that holds at most
//! [`QUEUE`] spans and never waits; [`Exporter`] is a thread of its own
//! with a small runtime that takes them off in batches and sends each batch
//! to the collector (OTLP/HTTP, protobuf) within [`EXPORT_WITHIN`].
//!
//! A span that finds the queue full, and every span of a batch the
//! collector did not take in time (slow, stopped, gone, or answering an
//! error), is dropped and counted in `idemgate_spans_dropped_total`; the
//! request that made it never knows. No retry: a batch retried is a
//! queue that fills behind it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus::IntCounter;
use tokio::sync::{mpsc, Notify};

use super::client::Collector;
use super::record::{encode, TraceRecord};

/// Spans waiting to be exported, at most (SPEC §19).
const QUEUE: usize = 2048;
/// Spans per export, at most (a request's spans are not split).
const BATCH: usize = 512;
/// How long a batch waits to fill after its first span.
const GATHER: Duration = Duration::from_secs(1);
/// A batch the collector did not take within this is dropped.
pub const EXPORT_WITHIN: Duration = Duration::from_secs(5);

/// Where finished requests' spans go; clones share the queue.
#[derive(Clone)]
pub struct Queue {
    tx: mpsc::UnboundedSender<TraceRecord>,
    /// Spans on the queue now: the bound is in spans, a request's spans
    /// travel together.
    queued: Arc<AtomicUsize>,
    dropped: IntCounter,
}

impl Queue {
    /// Queues a request's spans, or drops and counts them if they would
    /// take the queue over [`QUEUE`] spans (or the thread is gone).
    pub fn push(&self, trace: TraceRecord) {
        let n = trace.spans.len();
        if self.queued.fetch_add(n, Ordering::Relaxed) + n > QUEUE {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            self.dropped.inc_by(n as u64);
            return;
        }
        if self.tx.send(trace).is_err() {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            self.dropped.inc_by(n as u64);
        }
    }
}

/// What an export is sent with.
pub struct Target {
    pub collector: Collector,
    /// The path and the configured headers.
    pub path: String,
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The resource's attributes (`service.name`, `service.instance.id`).
    pub resource: Vec<opentelemetry::KeyValue>,
}

/// The export thread; stopped (what is queued sent, within
/// [`EXPORT_WITHIN`]) by [`Exporter::stop`].
pub struct Exporter {
    thread: Mutex<Option<JoinHandle<()>>>,
    stop: Arc<Notify>,
}

impl Exporter {
    /// The queue and the thread that empties it to the collector `make`
    /// names; the collector's client is made on that thread's runtime (its
    /// connections live there).
    pub fn start<F>(make: F, dropped: IntCounter) -> (Queue, Exporter)
    where
        F: FnOnce() -> Target + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let queue = Queue {
            tx,
            queued: queued.clone(),
            dropped: dropped.clone(),
        };
        let stop = Arc::new(Notify::new());
        let told = stop.clone();
        let thread = std::thread::Builder::new()
            .name("idemgate-otlp".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "tracing: the export thread has no runtime; spans are dropped");
                        return;
                    }
                };
                rt.block_on(async move {
                    let taken = Taken { rx, queued };
                    run(taken, make(), dropped, told).await
                });
            })
            .ok();
        (
            queue,
            Exporter {
                thread: Mutex::new(thread),
                stop,
            },
        )
    }

    /// Tells the thread to send what is queued and stop, and waits for it
    /// at most `within`.
    pub fn stop(&self, within: Duration) {
        self.stop.notify_one();
        let Some(thread) = self.thread.lock().ok().and_then(|mut t| t.take()) else {
            return;
        };
        let deadline = std::time::Instant::now() + within;
        while !thread.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if thread.is_finished() {
            let _ = thread.join();
        }
    }
}

/// The queue's receiving end, which gives the spans' places back.
struct Taken {
    rx: mpsc::UnboundedReceiver<TraceRecord>,
    queued: Arc<AtomicUsize>,
}

impl Taken {
    fn took(&self, t: Option<TraceRecord>) -> Option<TraceRecord> {
        if let Some(t) = &t {
            self.queued.fetch_sub(t.spans.len(), Ordering::Relaxed);
        }
        t
    }

    async fn next(&mut self) -> Option<TraceRecord> {
        let t = self.rx.recv().await;
        self.took(t)
    }

    fn now(&mut self) -> Option<TraceRecord> {
        let t = self.rx.try_recv().ok();
        self.took(t)
    }
}

/// Batches off the queue until the stop: a batch is sent when it has
/// [`BATCH`] spans, or [`GATHER`] after its first; at the stop, what is
/// queued is sent at once.
async fn run(mut queue: Taken, target: Target, dropped: IntCounter, stop: Arc<Notify>) {
    let mut failing = FailureLog::default();
    let mut stopping = false;
    loop {
        let first = if stopping {
            queue.now()
        } else {
            tokio::select! {
                t = queue.next() => t,
                _ = stop.notified() => {
                    stopping = true;
                    queue.now()
                }
            }
        };
        let Some(first) = first else {
            return;
        };
        let mut spans = first.spans.len();
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + GATHER;
        while spans < BATCH {
            let next = if stopping {
                queue.now()
            } else {
                tokio::select! {
                    t = tokio::time::timeout_at(until, queue.next()) => t.ok().flatten(),
                    _ = stop.notified() => {
                        stopping = true;
                        continue;
                    }
                }
            };
            let Some(t) = next else { break };
            spans += t.spans.len();
            batch.push(t);
        }
        let n = spans as u64;
        let body = encode(&batch, &target.resource);
        let sent = target.collector.post(&target.path, &target.headers, body);
        match tokio::time::timeout(EXPORT_WITHIN, sent).await {
            Ok(Ok(())) => failing.recovered(),
            Ok(Err(e)) => {
                dropped.inc_by(n);
                failing.failed(n, &e);
            }
            Err(_) => {
                dropped.inc_by(n);
                failing.failed(n, "no answer in time");
            }
        }
    }
}

/// One WARN when exports start failing, then at most one a minute, and an
/// INFO when one succeeds again: a collector that is gone must not fill
/// the log.
#[derive(Default)]
struct FailureLog {
    since: Option<std::time::Instant>,
    last_line: Option<std::time::Instant>,
    dropped: u64,
}

impl FailureLog {
    fn failed(&mut self, spans: u64, why: &str) {
        let now = std::time::Instant::now();
        self.since.get_or_insert(now);
        self.dropped += spans;
        if self
            .last_line
            .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60))
        {
            self.last_line = Some(now);
            tracing::warn!(
                spans_dropped = self.dropped,
                error = why,
                "tracing: the collector did not take spans; dropping them (idemgate_spans_dropped_total)"
            );
        }
    }

    fn recovered(&mut self) {
        if let Some(since) = self.since.take() {
            tracing::info!(
                spans_dropped = self.dropped,
                failing_secs = since.elapsed().as_secs(),
                "tracing: the collector takes spans again"
            );
            self.dropped = 0;
            self.last_line = None;
        }
    }
}
