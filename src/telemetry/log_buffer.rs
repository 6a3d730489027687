//! Where `tracing` writes its lines: one shared in-memory buffer, written out
//! by a background thread a few milliseconds later.
//!
//! Why not `tracing_appender::non_blocking`: it hands every line to its thread
//! through a channel, which wakes that thread and costs one `write(2)` per
//! line. With one info line per guarded request (SPEC §7) that was ~20 µs of
//! CPU per request on a 2-core machine. Here a line costs one short lock and a
//! copy; under load the thread wakes about once per [`LINGER`] and writes
//! everything that gathered in one call, and when idle it sleeps.
//!
//! The log never blocks the proxy (SPEC §9): a line that finds
//! [`HARD_LIMIT`] bytes waiting (the output is stuck: a pipe nobody reads, a
//! paused terminal) is dropped and counted
//! ([`LOG_LINES_DROPPED`], `idemgate_log_lines_dropped_total`),
//! and once the output takes lines again one warning says how many were
//! dropped. Lines reach the output in the order they were appended, at most
//! [`LINGER`] late; [`LogGuard`]'s drop writes out the rest, and lines after
//! that go straight to the output.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Log lines dropped because the log's output stalled (the writer counts
/// here; every `Metrics` of the process shows it at its next scrape).
pub static LOG_LINES_DROPPED: AtomicU64 = AtomicU64::new(0);

/// How long lines may gather before they are written out.
pub const LINGER: Duration = Duration::from_millis(5);
/// Past this many waiting bytes the thread writes out without lingering.
const SOFT_LIMIT: usize = 256 * 1024;
/// Past this many waiting bytes, lines are dropped.
pub const HARD_LIMIT: usize = 8 * 1024 * 1024;
/// How long closing waits for the rest to be written: an output that does
/// not take it (a paused terminal, a pipe nobody reads) must not hang exit.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

type Output = Box<dyn Write + Send>;
/// Says that `n` lines were dropped; called on the writer thread once the
/// output took lines again (it may log: the buffer has room then).
type Report = Box<dyn Fn(u64) + Send + Sync>;

struct Shared {
    pending: Mutex<Pending>,
    /// Wakes the thread: the buffer stopped being empty, passed the soft
    /// limit, someone asked for a flush, or the buffer closed.
    work: Condvar,
    /// Signalled after each write-out.
    drained: Condvar,
    /// Taken only by whoever writes to the output, never while `pending` is.
    output: Mutex<Output>,
    report: Report,
}

struct Pending {
    buf: Vec<u8>,
    closed: bool,
    /// A flush is waiting: write out now.
    urgent: bool,
    /// A swapped-out batch is being written.
    writing: bool,
    /// The thread has written out everything and stopped.
    finished: bool,
    /// Write-outs completed so far.
    written: u64,
    /// Lines dropped since the last report.
    dropped: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding either lock leaves plain bytes behind; keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// `urgent`: a warning or an error, written out without lingering.
    fn append(&self, bytes: &[u8], urgent: bool) -> io::Result<()> {
        let mut p = lock(&self.pending);
        if p.buf.len() >= HARD_LIMIT && !p.closed {
            // the output is stuck: never wait for it (a request would)
            p.dropped += 1;
            drop(p);
            LOG_LINES_DROPPED.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if p.closed {
            drop(p);
            return lock(&self.output).write_all(bytes);
        }
        let before = p.buf.len();
        p.buf.extend_from_slice(bytes);
        let wake = before == 0
            || (before < SOFT_LIMIT && p.buf.len() >= SOFT_LIMIT)
            || (urgent && !p.urgent);
        p.urgent |= urgent;
        drop(p);
        if wake {
            self.work.notify_one();
        }
        Ok(())
    }

    /// Returns once everything appended before the call has been written out.
    fn flush(&self) -> io::Result<()> {
        let mut p = lock(&self.pending);
        if p.closed {
            drop(p);
            return lock(&self.output).flush();
        }
        // Our bytes are in the batch being written, in the buffer, or both
        // (several lines): wait for each of those write-outs.
        let target = p.written + u64::from(p.writing) + u64::from(!p.buf.is_empty());
        while p.written < target && !p.closed {
            if !p.buf.is_empty() {
                p.urgent = true;
                self.work.notify_one();
            }
            p = self.drained.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    /// The background thread: waits for lines, lets them gather, writes them.
    fn run(&self, linger: Duration) {
        let mut spare = Vec::new();
        loop {
            let mut p = lock(&self.pending);
            while p.buf.is_empty() && !p.closed {
                p = self.work.wait(p).unwrap_or_else(|e| e.into_inner());
            }
            if p.buf.is_empty() {
                return; // closed and written out
            }
            if !p.closed && !p.urgent && p.buf.len() < SOFT_LIMIT {
                p = self
                    .work
                    .wait_timeout_while(p, linger, |p| {
                        !p.closed && !p.urgent && p.buf.len() < SOFT_LIMIT
                    })
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            std::mem::swap(&mut p.buf, &mut spare);
            p.urgent = false;
            p.writing = true;
            drop(p);

            let mut out = lock(&self.output);
            // A failed write has nowhere to be reported: the log is the output.
            let _ = out.write_all(&spare).and_then(|()| out.flush());
            drop(out);
            spare.clear();
            if spare.capacity() > SOFT_LIMIT {
                spare = Vec::new(); // give back what a burst took
            }

            let mut p = lock(&self.pending);
            p.written += 1;
            p.writing = false;
            let dropped = std::mem::take(&mut p.dropped);
            drop(p);
            self.drained.notify_all();
            if dropped > 0 {
                // the output took a batch: there is room again
                (self.report)(dropped);
            }
        }
    }
}

/// The `MakeWriter` for `tracing_subscriber::fmt`: each write appends.
#[derive(Clone)]
pub struct LogBuffer {
    shared: Arc<Shared>,
}

/// One event's writer: appends, and wakes the thread at once for warnings
/// and errors, which an operator (or a crash right after) should not wait for.
pub struct Appender<'a> {
    shared: &'a Shared,
    urgent: bool,
}

/// Keeps the background thread; dropping it writes out what is left.
pub struct LogGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl LogBuffer {
    /// Starts the background thread writing to `output`.
    /// `report(n)` says that n lines were dropped (see the module comment).
    pub fn new(
        output: impl Write + Send + 'static,
        report: impl Fn(u64) + Send + Sync + 'static,
    ) -> (LogBuffer, LogGuard) {
        Self::with_linger(output, LINGER, report)
    }

    fn with_linger(
        output: impl Write + Send + 'static,
        linger: Duration,
        report: impl Fn(u64) + Send + Sync + 'static,
    ) -> (LogBuffer, LogGuard) {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                buf: Vec::new(),
                closed: false,
                urgent: false,
                writing: false,
                finished: false,
                written: 0,
                dropped: 0,
            }),
            work: Condvar::new(),
            drained: Condvar::new(),
            output: Mutex::new(Box::new(output)),
            report: Box::new(report),
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("idemgate-log".into())
            .spawn(move || {
                worker.run(linger);
                lock(&worker.pending).finished = true;
                worker.drained.notify_all();
            })
            .expect("spawn the log writer thread");
        let guard = LogGuard {
            shared: Arc::clone(&shared),
            thread: Some(thread),
        };
        (LogBuffer { shared }, guard)
    }
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        let mut p = lock(&self.shared.pending);
        p.closed = true;
        self.shared.work.notify_one();
        self.shared.drained.notify_all();
        let p = self
            .shared
            .drained
            .wait_timeout_while(p, CLOSE_TIMEOUT, |p| !p.finished)
            .unwrap_or_else(|e| e.into_inner())
            .0;
        let finished = p.finished;
        drop(p);
        if !finished {
            return; // the output is stuck: leave the thread to it
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Ok(mut out) = self.shared.output.try_lock() {
            let _ = out.flush();
        }
    }
}

impl Write for Appender<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.shared.append(bytes, self.urgent)?;
        Ok(bytes.len())
    }

    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.shared.append(bytes, self.urgent)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.shared.flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = Appender<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Appender {
            shared: &self.shared,
            urgent: false,
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        Appender {
            shared: &self.shared,
            // ERROR and WARN are the levels at or above WARN in severity
            urgent: *meta.level() <= tracing::Level::WARN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use tracing_subscriber::fmt::MakeWriter;

    /// An output the test can read while the thread writes to it.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            lock(&self.0).extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// An output that blocks every write until the test opens it.
    #[derive(Clone, Default)]
    struct Gate {
        open: Arc<(Mutex<bool>, Condvar)>,
        sink: Sink,
    }

    impl Gate {
        fn open(&self) {
            *lock(&self.open.0) = true;
            self.open.1.notify_all();
        }
    }

    impl Write for Gate {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let (open, cv) = &*self.open;
            let mut o = lock(open);
            while !*o {
                o = cv.wait(o).unwrap();
            }
            self.sink.write(b)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8(lock(&self.0).clone()).unwrap()
        }
    }

    /// A buffer that holds lines for `linger`, over a fresh [`Sink`].
    fn over_sink(linger: Duration) -> (Sink, LogBuffer, LogGuard) {
        let sink = Sink::default();
        let (buf, guard) = LogBuffer::with_linger(sink.clone(), linger, |_| {});
        (sink, buf, guard)
    }

    /// One write, as tracing makes it for a line.
    fn put(buf: &LogBuffer, bytes: &[u8]) {
        buf.make_writer().write_all(bytes).unwrap();
    }

    /// Waits until `done`, for 5 s at most (the assertion after it tells).
    fn wait_for(done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn lines_arrive_in_order_after_the_linger() {
        let (sink, buf, _guard) = over_sink(Duration::from_millis(20));
        for i in 0..100 {
            writeln!(buf.make_writer(), "line {i}").unwrap();
        }
        wait_for(|| sink.text().lines().count() >= 100);
        let want: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(sink.text(), want);
    }

    #[test]
    fn warnings_and_errors_are_written_out_without_lingering() {
        let (sink, buf, _guard) = over_sink(Duration::from_secs(3600));
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(buf.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("an info line waits for company");
            tracing::warn!("a warning goes at once");
        });
        wait_for(|| sink.text().contains("a warning goes at once"));
        let text = sink.text();
        assert!(text.contains("a warning goes at once"), "{text:?}");
        // the info line before it went out in the same write, in order
        let info = text
            .find("an info line")
            .expect("info line written with the warning");
        assert!(info < text.find("a warning").unwrap());
    }

    #[test]
    fn flush_writes_out_at_once() {
        // A linger far longer than the test: only flush can write these out.
        let (sink, buf, _guard) = over_sink(Duration::from_secs(3600));
        put(&buf, b"a\n");
        put(&buf, b"b\n");
        buf.make_writer().flush().unwrap();
        assert_eq!(sink.text(), "a\nb\n");
        put(&buf, b"c\n");
        buf.make_writer().flush().unwrap();
        assert_eq!(sink.text(), "a\nb\nc\n");
    }

    #[test]
    fn dropping_the_guard_writes_out_the_rest_and_later_lines_go_straight_through() {
        let (sink, buf, guard) = over_sink(Duration::from_secs(3600));
        put(&buf, b"before\n");
        drop(guard);
        assert_eq!(sink.text(), "before\n");
        put(&buf, b"after\n");
        assert_eq!(sink.text(), "before\nafter\n");
    }

    #[test]
    fn closing_gives_up_on_a_stuck_output_instead_of_hanging() {
        let gate = Gate::default();
        let (buf, guard) = LogBuffer::with_linger(gate.clone(), Duration::from_millis(1), |_| {});
        put(&buf, b"stuck\n");
        let t = Instant::now();
        drop(guard);
        let took = t.elapsed();
        assert!(took < CLOSE_TIMEOUT + Duration::from_secs(2), "{took:?}");
        gate.open(); // let the thread finish
    }

    #[test]
    fn many_threads_lose_no_line_and_keep_each_threads_order() {
        let (sink, buf, guard) = over_sink(Duration::from_millis(1));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let buf = buf.clone();
                std::thread::spawn(move || {
                    for i in 0..5_000 {
                        // whole lines, as tracing writes them
                        put(&buf, format!("{t} {i}\n").as_bytes());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let text = sink.text();
        let mut next = [0u32; 4];
        for line in text.lines() {
            let (t, i) = line.split_once(' ').unwrap();
            let (t, i): (usize, u32) = (t.parse().unwrap(), i.parse().unwrap());
            assert_eq!(i, next[t], "thread {t} out of order");
            next[t] += 1;
        }
        assert_eq!(next, [5_000; 4]);
    }

    #[test]
    fn a_stuck_output_drops_lines_instead_of_blocking_and_reports_them_later() {
        let gate = Gate::default();
        let reported = Arc::new(Mutex::new(Vec::new()));
        let (buf, guard) = {
            let reported = reported.clone();
            LogBuffer::with_linger(gate.clone(), Duration::from_millis(1), move |n| {
                lock(&reported).push(n)
            })
        };
        let line = vec![b'x'; 64 * 1024];
        let before = LOG_LINES_DROPPED.load(Ordering::Relaxed);
        let lines = 3 * HARD_LIMIT / line.len();
        let t = Instant::now();
        for _ in 0..lines {
            put(&buf, &line);
        }
        // every write returned although nothing reached the output
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(gate.sink.text().is_empty());
        assert!(lock(&buf.shared.pending).buf.len() <= HARD_LIMIT + line.len());
        let dropped = lock(&buf.shared.pending).dropped;
        // the thread holds one batch (being written) and the buffer up to the limit
        assert!(
            dropped as usize >= lines - 2 * (HARD_LIMIT / line.len()) - 2,
            "{dropped}"
        );
        assert!(LOG_LINES_DROPPED.load(Ordering::Relaxed) >= before + dropped);
        assert!(
            lock(&reported).is_empty(),
            "no report while the output is stuck"
        );
        gate.open();
        wait_for(|| !lock(&reported).is_empty());
        assert_eq!(*lock(&reported), vec![dropped], "one report with the count");
        // lines go through again
        put(&buf, b"after\n");
        drop(guard);
        let text = gate.sink.text();
        assert!(text.ends_with("after\n"));
        assert_eq!(
            text.len() as u64,
            (lines as u64 - dropped) * line.len() as u64 + 6,
            "every line not dropped was written whole"
        );
    }
}
