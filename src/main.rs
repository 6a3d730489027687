#![deny(unsafe_code)]

use clap::Parser;

/// glibc's allocator was a fifth of the proxy's profile under load (arena
/// locking, consolidation of pingora's buffers); mimalloc's per-thread heaps
/// fit a proxy's allocate-on-one-request-free-at-its-end pattern.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = idemgate::cli::Cli::parse();
    idemgate::cli::init_logging(cli.log_format);
    let code = idemgate::cli::run(cli);
    idemgate::cli::flush_logs();
    std::process::exit(code);
}
