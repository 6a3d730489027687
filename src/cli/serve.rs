//! `serve` and `check`.

use std::time::Duration;

use super::{exit, ConfigArg, ServeArgs};
use crate::config;
use crate::metrics::Metrics;

/// Loads the config, printing every error (exit 2) and every warning.
fn load(args: &ConfigArg) -> Result<config::Config, i32> {
    match config::load_file(&args.config) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            Ok(loaded.config)
        }
        Err(errors) => {
            eprintln!("{errors}");
            Err(exit::BAD_CONFIG)
        }
    }
}

pub fn check(args: ConfigArg) -> i32 {
    match load(&args) {
        Ok(cfg) => {
            for line in cfg.describe_routes() {
                println!("{line}");
            }
            exit::OK
        }
        Err(code) => code,
    }
}

pub fn serve(args: ServeArgs) -> i32 {
    let cfg = match load(&args.config) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // SPEC §9: the hard limit, and exit 2 when max_connections cannot fit
    match crate::listener::fds::raise_and_check(&cfg) {
        Ok(limit) => tracing::debug!(limit, "open-files limit"),
        Err(e) => {
            eprintln!("{e}");
            return exit::BAD_CONFIG;
        }
    }
    // The store lives on its own runtime for the whole process: pooled
    // connections and their timers must outlive any one pingora service.
    let store_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("idemgate-store")
        .enable_all()
        .build()
        .expect("store runtime");
    let opened = store_rt.block_on(async {
        let store = crate::store::open_url(&cfg.store.url, cfg.store.max_connections).await?;
        if !args.no_migrate {
            tokio::time::timeout(Duration::from_secs(60), store.migrate())
                .await
                .map_err(|_| {
                    crate::store::StoreError::Unavailable("migration timed out".into())
                })??;
        }
        Ok::<_, crate::store::StoreError>(store)
    });
    let store = match opened {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot open the store");
            eprintln!("idemgate: {e}");
            return exit::FAILURE;
        }
    };
    match crate::server::run(cfg, store, Metrics::new(), args.upgrade) {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("idemgate: {e}");
            exit::FAILURE
        }
    }
}
