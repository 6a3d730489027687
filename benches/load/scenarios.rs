//! The scenarios: which server each loads, on which path, with which event IDs.

/// Which server a scenario loads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Target {
    Upstream,
    NginxProxy,
    IdemSqlite,
    IdemPg,
    /// Its own SQLite process, traced to a live collector at `sample: 1.0`.
    IdemTraced,
    /// Its own SQLite process, traced at `sample: 0.01`.
    IdemSampled,
    /// Its own SQLite process, started as the traced two but without a
    /// `telemetry` block: their baseline, so that a ratio measures tracing
    /// and nothing else (not a second process, a fresh store file).
    IdemUntraced,
    /// Its own process on a private 3-shard Valkey cluster (fsynced).
    IdemValkey,
}

impl Target {
    /// One of the three processes of the tracing A/B (SPEC §19): traced
    /// at 1.0, at 0.01, or not at all.
    pub(crate) fn traced(self) -> bool {
        matches!(
            self,
            Target::IdemTraced | Target::IdemSampled | Target::IdemUntraced
        )
    }
}

/// How the event IDs of a run are made.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Ids {
    /// A fresh ID per request.
    Unique,
    /// The same, already delivered, ID for every request.
    Same,
    /// 64 consecutive requests of a wrk thread share a fresh ID.
    Group64,
    /// A fresh random 32-hex ID per request (as most senders' IDs are).
    Random,
    /// A fresh 32-hex ID per request that begins with the wall clock's
    /// milliseconds, as UUIDv7, ULID and KSUID do: each claim's key lands
    /// beside the last one's in the key index.
    TimeOrdered,
}

pub(crate) struct Scenario {
    pub(crate) key: char,
    pub(crate) name: &'static str,
    pub(crate) target: Target,
    pub(crate) path: &'static str,
    pub(crate) ids: Ids,
    /// The idemgate route whose `/metrics` counters this run should move.
    pub(crate) route: Option<&'static str>,
}

pub(crate) const SCENARIOS: [Scenario; 18] = [
    Scenario {
        key: 'u',
        name: "upstream direct (ceiling)",
        target: Target::Upstream,
        path: "/pass",
        ids: Ids::Unique,
        route: None,
    },
    Scenario {
        key: 'n',
        name: "nginx reverse proxy",
        target: Target::NginxProxy,
        path: "/pass",
        ids: Ids::Unique,
        route: None,
    },
    Scenario {
        key: 'a',
        name: "unguarded pass-through",
        target: Target::IdemSqlite,
        path: "/pass",
        ids: Ids::Unique,
        route: Some("pass"),
    },
    Scenario {
        key: 'b',
        name: "unique events, SQLite",
        target: Target::IdemSqlite,
        path: "/unique",
        ids: Ids::Unique,
        route: Some("unique"),
    },
    Scenario {
        key: 'c',
        name: "replay of a delivered event",
        target: Target::IdemSqlite,
        path: "/replay",
        ids: Ids::Same,
        route: Some("replay"),
    },
    Scenario {
        key: 'd',
        name: "unique events, PostgreSQL",
        target: Target::IdemPg,
        path: "/unique",
        ids: Ids::Unique,
        route: Some("unique"),
    },
    Scenario {
        key: 'e',
        name: "64-way duplicates, fresh IDs",
        target: Target::IdemSqlite,
        path: "/conflict",
        ids: Ids::Group64,
        route: Some("conflict"),
    },
    Scenario {
        key: 'r',
        name: "unique random IDs, SQLite",
        target: Target::IdemSqlite,
        path: "/unique",
        ids: Ids::Random,
        route: Some("unique"),
    },
    Scenario {
        key: 'p',
        name: "unique random IDs, PostgreSQL",
        target: Target::IdemPg,
        path: "/unique",
        ids: Ids::Random,
        route: Some("unique"),
    },
    Scenario {
        key: 't',
        name: "unique time-ordered IDs, SQLite",
        target: Target::IdemSqlite,
        path: "/unique",
        ids: Ids::TimeOrdered,
        route: Some("unique"),
    },
    // (b) on routes with one v4 feature each, in the same process as (b),
    // for issue 55's and 56's A/B: 5,000 `allow_from` ranges, the
    // replayed headers kept, `reconcile` under `hold`.
    Scenario {
        key: 'l',
        name: "unique events, 5,000 allow_from ranges",
        target: Target::IdemSqlite,
        path: "/allowlisted",
        ids: Ids::Unique,
        route: Some("allowlisted"),
    },
    Scenario {
        key: 'h',
        name: "unique events, replay_headers kept",
        target: Target::IdemSqlite,
        path: "/headers",
        ids: Ids::Unique,
        route: Some("headers"),
    },
    Scenario {
        key: 'x',
        name: "unique events, reconcile under hold",
        target: Target::IdemSqlite,
        path: "/reconciled",
        ids: Ids::Unique,
        route: Some("reconciled"),
    },
    // (b) traced, in processes of their own, each with a `telemetry` block
    // to one live collector (rotel), for issue 53's A/B against (b).
    Scenario {
        key: 'o',
        name: "unique events, traced (sample 1.0)",
        target: Target::IdemTraced,
        path: "/unique",
        ids: Ids::Unique,
        route: Some("unique"),
    },
    Scenario {
        key: 'w',
        name: "unique events, untraced twin of (o)",
        target: Target::IdemUntraced,
        path: "/unique",
        ids: Ids::Unique,
        route: Some("unique"),
    },
    Scenario {
        key: 'm',
        name: "unique events, traced (sample 0.01)",
        target: Target::IdemSampled,
        path: "/unique",
        ids: Ids::Unique,
        route: Some("unique"),
    },
    // (b) on a private Valkey cluster (3 primaries, 3 replicas, append-only
    // files fsynced at every write; SPEC §18's default `durability:
    // fsynced`), in a process of its own, for issue 52.
    Scenario {
        key: 'v',
        name: "unique events, Valkey cluster (3 shards, fsynced)",
        target: Target::IdemValkey,
        path: "/unique",
        ids: Ids::Unique,
        route: Some("unique"),
    },
    Scenario {
        key: 'q',
        name: "unique time-ordered IDs, PostgreSQL",
        target: Target::IdemPg,
        path: "/unique",
        ids: Ids::TimeOrdered,
        route: Some("unique"),
    },
];

pub(crate) fn scenario(key: char) -> &'static Scenario {
    SCENARIOS.iter().find(|s| s.key == key).expect("known key")
}
