//! The command line as clap parses it (SPEC §1): every command, its
//! arguments and their environment variables.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::telemetry::LogFormat;

#[derive(Parser, Debug)]
#[command(
    name = "idemgate",
    version,
    about = "Webhook-deduplication reverse proxy: claim before forwarding, replay duplicates, settle from the upstream's outcome."
)]
pub struct Cli {
    /// Log format (level from RUST_LOG).
    #[arg(long, global = true, env = "IDEMGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the proxy and the admin listener (migrates the store first).
    Serve(ServeArgs),
    /// Validate a config and print one line per route.
    Check(ConfigArg),
    /// Apply pending migrations to a store.
    Migrate(StoreArg),
    /// Inspect, release, resolve and reconcile records.
    #[command(subcommand)]
    Events(EventsCommand),
    /// Pause, resume and list paused routes (for every process on the store).
    #[command(subcommand)]
    Routes(RoutesCommand),
    /// Delete records past their retention once, in batches; prints how many.
    Sweep(SweepArgs),
    /// Self-contained demonstration on loopback ports with a temporary SQLite store.
    Demo,
}

#[derive(Args, Debug)]
pub struct ConfigArg {
    /// The YAML config file.
    #[arg(long, env = "IDEMGATE_CONFIG")]
    pub config: PathBuf,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: ConfigArg,
    /// Do not apply pending migrations at start.
    #[arg(long)]
    pub no_migrate: bool,
    /// Take the listening sockets over from the running `serve` that shares
    /// `upgrade_sock` (send that one SIGQUIT); see docs/operating.md, "Reloading without downtime".
    #[arg(long)]
    pub upgrade: bool,
}

#[derive(Args, Debug)]
pub struct StoreArg {
    /// sqlite://PATH or postgres://USER:PASS@HOST:PORT/DB
    #[arg(long, env = "IDEMGATE_STORE_URL")]
    pub store: String,
}

#[derive(Args, Debug)]
pub struct SweepArgs {
    #[command(flatten)]
    pub store: StoreArg,
    /// Records deleted per statement.
    #[arg(long, default_value_t = 1000)]
    pub batch_size: i64,
}

#[derive(Subcommand, Debug)]
pub enum EventsCommand {
    /// List records, newest first.
    List(ListArgs),
    /// Show one record, every field (exit 3 when absent).
    Show(ShowArgs),
    /// Make a processing, failed or ambiguous record reclaimable (delivered
    /// needs --force); or, with --state instead of an event ID, every record
    /// of the route in that state (bulk).
    Release(ReleaseArgs),
    /// Settle an ambiguous record by hand, once you know what the consumer did.
    Resolve(ResolveArgs),
    /// Ask the route's consumer now about its ambiguous records (or one),
    /// and resolve what it says (the route's `reconcile`).
    Reconcile(ReconcileArgs),
}

#[derive(Args, Debug)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub store: StoreArg,
    #[command(flatten)]
    pub config: ConfigArg,
    #[arg(long)]
    pub route: String,
    /// One record; or none: every ambiguous record of the route.
    pub event_id: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum RoutesCommand {
    /// Pause a route: what would be forwarded gets 503, delivered events are still replayed.
    Pause(RouteArg),
    /// Resume a paused route.
    Resume(RouteArg),
    /// List the paused routes.
    List(StoreArg),
}

#[derive(Args, Debug)]
pub struct RouteArg {
    #[command(flatten)]
    pub store: StoreArg,
    /// The route's name.
    pub name: String,
}

/// How an operator settles an ambiguous record.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResolveAs {
    /// The consumer did act: later deliveries are replayed with --status.
    Delivered,
    /// It did not: the next delivery is forwarded.
    Failed,
}

#[derive(Args, Debug)]
pub struct ResolveArgs {
    #[command(flatten)]
    pub record: RecordArg,
    #[arg(long = "as", value_enum)]
    pub resolve_as: ResolveAs,
    /// With --as delivered: the status replayed to later deliveries.
    #[arg(long, value_parser = clap::value_parser!(u16).range(100..=599))]
    pub status: Option<u16>,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub store: StoreArg,
    #[arg(long)]
    pub route: Option<String>,
    /// processing | delivered | failed | ambiguous
    #[arg(long)]
    pub state: Option<String>,
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
    /// One JSON array of records.
    #[arg(long)]
    pub json: bool,
}

/// One record: the store, its route and its event ID.
#[derive(Args, Debug)]
pub struct RecordArg {
    #[command(flatten)]
    pub store: StoreArg,
    #[arg(long)]
    pub route: String,
    pub event_id: String,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    #[command(flatten)]
    pub record: RecordArg,
    /// One JSON object with the record's fields.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub store: StoreArg,
    #[arg(long)]
    pub route: String,
    /// One record; or none, with --state (bulk).
    #[arg(required_unless_present = "state", conflicts_with = "state")]
    pub event_id: Option<String>,
    /// Also release a delivered record (a deliberate manual redelivery).
    #[arg(long, conflicts_with = "state")]
    pub force: bool,
    /// Bulk: every record of the route in this state (failed, ambiguous, or
    /// processing whose lease ended).
    #[arg(long)]
    pub state: Option<String>,
    /// Bulk: only records updated at or after this time (RFC 3339, UTC).
    #[arg(long, requires = "state")]
    pub updated_after: Option<String>,
    /// Bulk: only records updated before this time (RFC 3339, UTC).
    #[arg(long, requires = "state")]
    pub updated_before: Option<String>,
    /// Bulk: only count what would be released.
    #[arg(long, requires = "state")]
    pub dry_run: bool,
}
