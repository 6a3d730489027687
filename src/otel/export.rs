//! Spans leave the request path here: [`Queue`] is the SDK's span
//! processor, which puts each finished span on a bounded queue (at most
//! [`QUEUE`] waiting) and never waits; [`Exporter`] is a thread of its own
//! with a small runtime that takes them off in batches and sends each batch
//! to the collector (OTLP/HTTP, protobuf) within [`EXPORT_WITHIN`].
//!
//! A span that finds the queue full, and every span of a batch the
//! collector did not take in time (slow, stopped, gone, or answering an
//! error), is dropped and counted in `idemgate_spans_dropped_total`; the
//! request that made it never knows. No retry: a batch retried is a
//! queue that fills behind it.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;
use tokio::sync::{mpsc, Notify};

/// Spans waiting to be exported, at most (SPEC §19).
const QUEUE: usize = 2048;
/// Spans per export, at most.
const BATCH: usize = 512;
/// How long a batch waits to fill after its first span.
const GATHER: Duration = Duration::from_secs(1);
/// A batch the collector did not take within this is dropped.
pub const EXPORT_WITHIN: Duration = Duration::from_secs(5);

/// The SDK's span processor: finished, sampled spans onto the queue.
#[derive(Debug)]
pub struct Queue {
    tx: mpsc::Sender<SpanData>,
    dropped: IntCounter,
    /// Told at the provider's shutdown: send what is queued, then stop.
    stop: Arc<Notify>,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if span.span_context.is_sampled() && self.tx.try_send(span).is_err() {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        self.stop.notify_one();
        Ok(())
    }
}

/// The export thread; stopped (what is queued sent, within
/// [`EXPORT_WITHIN`]) once every [`Queue`] is gone and [`Exporter::stop`]
/// is called.
pub struct Exporter {
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Exporter {
    /// The queue and the thread that empties it into `exporter`, which is
    /// made on that thread's runtime (the HTTP client's connections live
    /// there).
    pub fn start<E, F>(make: F, resource: Resource, dropped: IntCounter) -> (Queue, Exporter)
    where
        E: SpanExporter + 'static,
        F: FnOnce() -> Option<E> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(QUEUE);
        let counter = dropped.clone();
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
                    let exporter = make().map(|mut e| {
                        e.set_resource(&resource);
                        e
                    });
                    run(rx, exporter, counter, told).await
                });
            })
            .ok();
        (
            Queue { tx, dropped, stop },
            Exporter {
                thread: Mutex::new(thread),
            },
        )
    }

    /// Waits for the thread to send what is queued (call after the
    /// provider, and so every [`Queue`], is dropped), at most `within`.
    pub fn stop(&self, within: Duration) {
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

/// Batches off the queue until the provider stops: a batch is sent when
/// it has [`BATCH`] spans, or [`GATHER`] after its first; at the stop, what
/// is queued is sent at once. Without an exporter every span is dropped.
async fn run<E: SpanExporter>(
    mut rx: mpsc::Receiver<SpanData>,
    exporter: Option<E>,
    dropped: IntCounter,
    stop: Arc<Notify>,
) {
    let mut failing = FailureLog::default();
    let mut stopping = false;
    loop {
        let first = if stopping {
            rx.try_recv().ok()
        } else {
            tokio::select! {
                span = rx.recv() => span,
                _ = stop.notified() => {
                    stopping = true;
                    rx.try_recv().ok()
                }
            }
        };
        let Some(first) = first else {
            return;
        };
        let mut batch = Vec::with_capacity(BATCH);
        batch.push(first);
        let until = tokio::time::Instant::now() + GATHER;
        while batch.len() < BATCH {
            if stopping {
                match rx.try_recv() {
                    Ok(span) => batch.push(span),
                    Err(_) => break,
                }
                continue;
            }
            tokio::select! {
                span = tokio::time::timeout_at(until, rx.recv()) => match span {
                    Ok(Some(span)) => batch.push(span),
                    Ok(None) | Err(_) => break,
                },
                _ = stop.notified() => stopping = true,
            }
        }
        let n = batch.len() as u64;
        let Some(exporter) = &exporter else {
            dropped.inc_by(n);
            continue;
        };
        match tokio::time::timeout(EXPORT_WITHIN, exporter.export(batch)).await {
            Ok(Ok(())) => failing.recovered(),
            Ok(Err(e)) => {
                dropped.inc_by(n);
                failing.failed(n, &e.to_string());
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
