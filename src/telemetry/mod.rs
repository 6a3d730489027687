//! What the process tells its operators, below every other module: the log
//! (the `tracing` subscriber, its line format and its never-blocking writer)
//! and the plumbing of the metrics registry (registering and encoding; the
//! metric set itself is `metrics.rs`'s).

pub mod log_buffer;
mod log_line;
pub mod outage;
pub mod registry;

use std::sync::Mutex;

pub use log_buffer::LOG_LINES_DROPPED;

/// The log's format (its level comes from `RUST_LOG`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Keeps the background log writer alive; dropped by [`flush_logs`].
static LOG_GUARD: Mutex<Option<log_buffer::LogGuard>> = Mutex::new(None);

/// sqlx's pool logs each connection its `after_connect` check refuses at
/// ERROR (a standby turned away during a failover, many times a second), and
/// each failed ping before use at WARN; the store logs those itself, once a
/// minute per host (`store/postgres/hosts.rs`).
const QUIET_POOL: &str = "sqlx_core::pool::inner=off";

/// Sets up `tracing`: human-readable or JSON, level from `RUST_LOG` (default
/// info), written to stderr by a background thread so that a request never
/// waits on a log write ([`log_buffer`]).
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive(QUIET_POOL.parse().expect("a valid directive"));
    let (writer, guard) = log_buffer::LogBuffer::new(std::io::stderr(), |dropped| {
        tracing::warn!(
            dropped,
            "log lines dropped: the log's output did not take them (idemgate_log_lines_dropped_total)"
        )
    });
    // colour codes only for a person at a terminal, not in log files
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(terminal)
        .with_writer(writer);
    let installed = match format {
        LogFormat::Text if terminal => builder.try_init(),
        LogFormat::Text => builder.event_format(log_line::PlainText).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if installed.is_ok() {
        *LOG_GUARD.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard);
    }
}

/// Writes out buffered log lines; call before `std::process::exit`.
pub fn flush_logs() {
    drop(LOG_GUARD.lock().unwrap_or_else(|e| e.into_inner()).take());
}
