//! The command line of SPEC §1. Each subcommand returns its exit code;
//! `main` only parses, sets up logging ([`crate::telemetry`]) and exits with it.

mod args;
mod demo;
mod events;
pub mod exit;
mod reconcile;
mod serve;

pub use args::{
    Cli, Command, ConfigArg, EventsCommand, ListArgs, ReconcileArgs, RecordArg, ReleaseArgs,
    ResolveArgs, ResolveAs, RouteArg, RoutesCommand, ServeArgs, ShowArgs, StoreArg, SweepArgs,
};

/// Runs a parsed command; returns the process exit code.
pub fn run(cli: Cli) -> i32 {
    match cli.command {
        Command::Serve(args) => serve::serve(args),
        Command::Check(args) => serve::check(args),
        Command::Migrate(args) => events::migrate(args),
        Command::Events(cmd) => events::events(cmd),
        Command::Routes(cmd) => events::routes(cmd),
        Command::Sweep(args) => events::sweep(args),
        Command::Demo => demo::demo(),
    }
}
