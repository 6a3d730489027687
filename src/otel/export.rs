//! Spans leave the request path here: [`Queue`] takes each finished
//! request's spans ([`TraceRecord`]) onto a queue that holds at most
//! [`QUEUE`] spans and never waits; [`Exporter`] is a thread of its own
//! with a small runtime that takes them off in batches and sends each batch
//! to the collector (OTLP/HTTP, protobuf) within [`EXPORT_WITHIN`]. At the
//! stop, what is queued is sent at once, in one last export.
//!
//! A span that finds the queue full, and every span of a batch the
//! collector did not take in time (slow, stopped, gone, or answering an
//! error), is dropped and counted in `idemgate_spans_dropped_total`; the
//! request that made it never knows. No retry: a batch retried is a
//! queue that fills behind it.

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus::IntCounter;
use tokio::sync::Notify;

use super::client::Collector;
use super::record::{encode, TraceRecord};

/// Spans waiting to be exported, at most (SPEC §19).
const QUEUE: usize = 2048;
/// Spans per export, at most (a request's spans are not split).
const BATCH: usize = 512;
/// How long spans wait for a batch to fill: at most about this after the
/// first of them.
const GATHER: Duration = Duration::from_secs(1);
/// A batch the collector did not take within this is dropped.
pub const EXPORT_WITHIN: Duration = Duration::from_secs(5);

/// Where finished requests' spans go; clones share the queue.
///
/// A list under a lock, not a channel: the export thread is woken only
/// when a batch is full (or its time is up), not for every request, whose
/// wake-up and the thread's switches cost more CPU than the spans' own
/// encoding (measured: about 3 µs per request in the kernel's wake-up
/// paths).
#[derive(Clone)]
pub struct Queue(Arc<Shared>);

struct Shared {
    pending: Mutex<Pending>,
    /// A batch is full.
    full: Notify,
    /// Send what is queued and stop.
    stop: Notify,
    dropped: IntCounter,
}

#[derive(Default)]
struct Pending {
    traces: Vec<TraceRecord>,
    /// Their spans: the bound is in spans, a request's spans travel
    /// together.
    spans: usize,
}

impl Queue {
    /// An empty queue whose drops count in `dropped`.
    fn new(dropped: IntCounter) -> Queue {
        Queue(Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            full: Notify::new(),
            stop: Notify::new(),
            dropped,
        }))
    }

    /// Queues a request's spans, or drops and counts them if they would
    /// take the queue over [`QUEUE`] spans.
    pub fn push(&self, trace: TraceRecord) {
        let n = trace.spans.len();
        let mut p = self.0.lock();
        if p.spans + n > QUEUE {
            drop(p);
            self.0.dropped.inc_by(n as u64);
            return;
        }
        let was = p.spans;
        p.spans += n;
        p.traces.push(trace);
        drop(p);
        if was < BATCH && was + n >= BATCH {
            self.0.full.notify_one();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The oldest traces, [`BATCH`] spans or a little over (a request's
    /// spans are not split), or all of them when `all`; with how many
    /// spans they hold.
    fn take(&self, all: bool) -> (Vec<TraceRecord>, usize) {
        let mut p = self.lock();
        if all || p.spans <= BATCH {
            let spans = std::mem::take(&mut p.spans);
            return (std::mem::take(&mut p.traces), spans);
        }
        let mut spans = 0;
        let cut = p
            .traces
            .iter()
            .position(|t| {
                spans += t.spans.len();
                spans >= BATCH
            })
            .map_or(p.traces.len(), |i| i + 1);
        p.spans -= spans;
        let rest = p.traces.split_off(cut);
        (std::mem::replace(&mut p.traces, rest), spans)
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
    queue: Queue,
}

impl Exporter {
    /// The queue and the thread that empties it to the collector `make`
    /// names; the collector's client is made on that thread's runtime (its
    /// connections live there).
    pub fn start<F>(make: F, dropped: IntCounter) -> (Queue, Exporter)
    where
        F: FnOnce() -> Target + Send + 'static,
    {
        let queue = Queue::new(dropped);
        let shared = Arc::clone(&queue.0);
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
                rt.block_on(async move { run(&shared, make()).await });
            })
            .ok();
        (
            queue.clone(),
            Exporter {
                thread: Mutex::new(thread),
                queue,
            },
        )
    }

    /// Tells the thread to send what is queued and stop, and waits for it
    /// at most `within`.
    pub fn stop(&self, within: Duration) {
        self.queue.0.stop.notify_one();
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

/// Sends batches until the stop: when a batch is full, and every
/// [`GATHER`] what has come meanwhile; at the stop, what is queued.
async fn run(queue: &Shared, target: Target) {
    let mut failing = FailureLog::default();
    let mut stopping = false;
    while !stopping {
        tokio::select! {
            _ = queue.full.notified() => {}
            _ = tokio::time::sleep(GATHER) => {}
            _ = queue.stop.notified() => stopping = true,
        }
        loop {
            let (batch, spans) = queue.take(false);
            if batch.is_empty() {
                break;
            }
            export(&target, &batch, spans, &queue.dropped, &mut failing).await;
            if !stopping && queue.lock().spans < BATCH {
                // the rest waits to fill, or for its time
                break;
            }
        }
    }
    let (rest, spans) = queue.take(true);
    if !rest.is_empty() {
        export(&target, &rest, spans, &queue.dropped, &mut failing).await;
    }
}

/// One export of `batch` (`spans` spans), within [`EXPORT_WITHIN`]; a
/// failed or late one drops and counts them.
async fn export(
    target: &Target,
    batch: &[TraceRecord],
    spans: usize,
    dropped: &IntCounter,
    failing: &mut FailureLog,
) {
    let n = spans as u64;
    let body = encode(batch, &target.resource);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otel::record::{Kind, SpanRecord};

    fn trace(spans: usize) -> TraceRecord {
        TraceRecord {
            trace_id: [1; 16],
            state: String::new(),
            remote_parent: false,
            spans: (0..spans)
                .map(|_| SpanRecord::start([2; 8], [0; 8], "s", Kind::Internal, Vec::new()))
                .collect(),
        }
    }

    fn queue() -> Queue {
        Queue::new(IntCounter::new("d", "d").unwrap())
    }

    #[test]
    fn the_bound_is_in_spans_and_a_request_is_dropped_whole() {
        let q = queue();
        for _ in 0..409 {
            q.push(trace(5));
        }
        assert_eq!(q.0.lock().spans, 2045);
        q.push(trace(5));
        assert_eq!(
            q.0.dropped.get(),
            5,
            "2050 would be over 2048: all five dropped"
        );
        q.push(trace(3));
        assert_eq!(q.0.lock().spans, 2048);
        assert_eq!(q.0.dropped.get(), 5);
    }

    #[test]
    fn batches_are_taken_oldest_first_and_never_split_a_request() {
        let q = queue();
        for _ in 0..300 {
            q.push(trace(5));
        }
        let (batch, spans) = q.0.take(false);
        assert_eq!((batch.len(), spans), (103, 515), "the first past 512");
        assert_eq!(q.0.lock().spans, 1500 - 515);
        let (rest, spans) = q.0.take(true);
        assert_eq!((rest.len(), spans), (197, 985));
        assert_eq!(q.0.lock().spans, 0);
        assert_eq!(q.0.take(false).0.len(), 0);
    }
}
