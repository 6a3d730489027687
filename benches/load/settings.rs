//! The harness's settings, read from the environment (described in `main.rs`).

use crate::scale;
use crate::scenarios::SCENARIOS;

pub(crate) struct Settings {
    pub(crate) duration: u64,
    pub(crate) repeats: usize,
    pub(crate) warmup: u64,
    pub(crate) conns: Vec<usize>,
    pub(crate) scenarios: Vec<char>,
    pub(crate) wrk_threads: usize,
    pub(crate) idemgate_threads: Option<usize>,
    pub(crate) nginx_workers: String,
    pub(crate) pg_url: String,
    pub(crate) rust_log: String,
    pub(crate) perf: Vec<char>,
    pub(crate) perf_callgraph: bool,
    pub(crate) syscalls: Vec<char>,
    pub(crate) keep: bool,
    pub(crate) logs_on_disk: bool,
    pub(crate) bin: String,
    pub(crate) attack: usize,
    /// Events of the retry-storm section (issue 42; 0: not run).
    pub(crate) storm: usize,
    /// The store-size and steady-state sections (issue 24).
    pub(crate) scale: scale::Settings,
}

pub(crate) fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not valid")),
        _ => default,
    }
}

pub(crate) fn env_list(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

impl Settings {
    pub(crate) fn from_env() -> Settings {
        let quick = env_or("LOAD_QUICK", 0u8) != 0;
        let conns: Vec<usize> = env_list("LOAD_CONNS", "16,64")
            .split(',')
            .map(|s| s.trim().parse().expect("LOAD_CONNS: numbers"))
            .collect();
        let keys = |s: String| -> Vec<char> {
            s.split(',')
                .filter_map(|k| k.trim().chars().next())
                .map(|k| k.to_ascii_lowercase())
                .collect()
        };
        let scale = scale::Settings::from_env();
        // With a section of issue 24 asked for, the rounds run only if asked for too.
        let storm = env_or("LOAD_STORM", 0usize);
        let default_scenarios = if scale.any() || storm > 0 {
            ""
        } else {
            "u,n,a,b,c,d,e"
        };
        let scenarios = keys(env_list("LOAD_SCENARIOS", default_scenarios));
        for k in &scenarios {
            assert!(
                SCENARIOS.iter().any(|s| s.key == *k),
                "unknown scenario {k}"
            );
        }
        let wrk_threads = env_or("LOAD_WRK_THREADS", 1usize).max(1);
        assert!(
            conns.iter().all(|&c| c >= wrk_threads),
            "every LOAD_CONNS must be >= LOAD_WRK_THREADS"
        );
        Settings {
            duration: env_or("LOAD_DURATION", if quick { 3 } else { 10 }),
            repeats: env_or("LOAD_REPEATS", if quick { 1 } else { 3 }).max(1),
            warmup: env_or("LOAD_WARMUP", if quick { 1 } else { 2 }),
            conns,
            scenarios,
            wrk_threads,
            idemgate_threads: std::env::var("LOAD_THREADS")
                .ok()
                .map(|v| v.parse().expect("LOAD_THREADS: a number")),
            nginx_workers: env_list("LOAD_NGINX_WORKERS", "auto"),
            pg_url: std::env::var("LOAD_PG_URL")
                .or_else(|_| std::env::var("IDEMGATE_TEST_PG_URL"))
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into()),
            rust_log: env_list("LOAD_RUST_LOG", "info"),
            perf: keys(env_list("LOAD_PERF", "")),
            perf_callgraph: env_or("LOAD_PERF_CALLGRAPH", 0u8) != 0,
            syscalls: keys(env_list("LOAD_SYSCALLS", "")),
            keep: env_or("LOAD_KEEP", 0u8) != 0,
            logs_on_disk: env_or("LOAD_LOGS_ON_DISK", 0u8) != 0,
            bin: env_list("LOAD_BIN", env!("CARGO_BIN_EXE_idemgate")),
            attack: env_or("LOAD_ATTACK", 0usize),
            storm,
            scale,
        }
    }
}
