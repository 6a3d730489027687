//! The harness's settings, read from the environment (described in `main.rs`).

use crate::scenarios::{scenario, Scenario, SCENARIOS};

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
    pub(crate) scale: ScaleSettings,
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
        let scale = ScaleSettings::from_env();
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

/// Which store a section loads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Store {
    Sqlite,
    Postgres,
}

pub(crate) struct ScaleSettings {
    /// Store sizes (records preloaded); 0 is the empty store.
    pub preload: Vec<u64>,
    pub preload_stores: Vec<Store>,
    /// Remove the cached preloaded stores first.
    pub preload_drop: bool,
    /// Load time-ordered IDs, (t) and (q), instead of random ones.
    pub time_ids: bool,
    /// Seconds of the steady-state run (0: none).
    pub steady: u64,
    pub steady_stores: Vec<Store>,
    pub steady_retention: u64,
    pub steady_sweep: u64,
    pub steady_segment: u64,
    /// Fixed claim rate (req/s); `None`: `steady_share` of a flat-out run's.
    pub steady_rate: Option<f64>,
    pub steady_share: f64,
}

/// `5000000`, `5M`, `200k`.
fn count(v: &str) -> u64 {
    let v = v.trim();
    let (num, mul) = match v.chars().last() {
        Some('k' | 'K') => (&v[..v.len() - 1], 1_000),
        Some('m' | 'M') => (&v[..v.len() - 1], 1_000_000),
        _ => (v, 1),
    };
    num.parse::<u64>()
        .unwrap_or_else(|_| panic!("LOAD_PRELOAD: {v:?} is not a count"))
        * mul
}

fn stores(name: &str, default: &str) -> Vec<Store> {
    env_list(name, default)
        .split(',')
        .map(|v| match v.trim() {
            "sqlite" => Store::Sqlite,
            "postgres" | "pg" => Store::Postgres,
            other => panic!("{name}: unknown store {other:?} (sqlite, postgres)"),
        })
        .collect()
}

impl ScaleSettings {
    pub fn from_env() -> ScaleSettings {
        let mut preload: Vec<u64> = env_list("LOAD_PRELOAD", "")
            .split(',')
            .filter(|v| !v.trim().is_empty())
            .map(count)
            .collect();
        if !preload.is_empty() && !preload.contains(&0) {
            // The ratios need the empty store of the same round.
            preload.insert(0, 0);
        }
        preload.sort_unstable();
        preload.dedup();
        let share = env_or("LOAD_STEADY_SHARE", 0.6f64);
        assert!(share > 0.0 && share <= 1.0, "LOAD_STEADY_SHARE: in (0, 1]");
        ScaleSettings {
            preload,
            preload_stores: stores("LOAD_PRELOAD_STORES", "sqlite,postgres"),
            preload_drop: env_or("LOAD_PRELOAD_DROP", 0u8) != 0,
            time_ids: match env_list("LOAD_SCALE_IDS", "random").trim() {
                "random" => false,
                "time" => true,
                v => panic!("LOAD_SCALE_IDS: random or time, not {v:?}"),
            },
            steady: env_or("LOAD_STEADY", 0u64),
            steady_stores: stores("LOAD_STEADY_STORES", "sqlite"),
            steady_retention: env_or("LOAD_STEADY_RETENTION", 60u64).max(1),
            steady_sweep: env_or("LOAD_STEADY_SWEEP", 30u64).max(1),
            steady_segment: env_or("LOAD_STEADY_SEGMENT", 10u64).max(1),
            steady_rate: std::env::var("LOAD_STEADY_RATE")
                .ok()
                .filter(|v| !v.trim().is_empty())
                .map(|v| v.trim().parse().expect("LOAD_STEADY_RATE: req/s")),
            steady_share: share,
        }
    }

    /// The scenario both sections load on `store`: (r) or (p) with random
    /// IDs, (t) or (q) with time-ordered ones.
    pub(crate) fn scenario(&self, store: Store) -> &'static Scenario {
        scenario(match (store, self.time_ids) {
            (Store::Sqlite, false) => 'r',
            (Store::Postgres, false) => 'p',
            (Store::Sqlite, true) => 't',
            (Store::Postgres, true) => 'q',
        })
    }

    /// How the loaded IDs are made, for the reports' headings.
    pub fn ids_word(&self) -> &'static str {
        if self.time_ids {
            "time-ordered"
        } else {
            "random"
        }
    }

    /// Whether a section of issue 24 runs, or the cache is dropped (then the
    /// usual rounds run only if `LOAD_SCENARIOS` asks for them).
    pub fn any(&self) -> bool {
        !self.preload.is_empty() || self.steady > 0 || self.preload_drop
    }

    pub fn uses_pg(&self) -> bool {
        self.preload_drop
            || (!self.preload.is_empty() && self.preload_stores.contains(&Store::Postgres))
            || (self.steady > 0 && self.steady_stores.contains(&Store::Postgres))
    }
}
