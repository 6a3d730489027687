//! Value grammars inside the file: durations, sizes, URLs, addresses,
//! methods and statuses, each with its reported position.

use super::{ok, one_error, one_error_each, route, HEAD};

#[test]
fn zero_or_unparseable_durations_and_sizes() {
    one_error_each(&[
        (
            route("    lease: 0s\n"),
            12,
            12,
            "must be greater than zero",
        ),
        (
            route("    retention: 7days\n"),
            12,
            16,
            "unknown unit `days`",
        ),
        (route("    max_body: 1MB\n"), 12, 15, "unknown unit `MB`"),
        (
            route("    max_body: 0B\n"),
            12,
            15,
            "must be greater than zero",
        ),
        (
            route("    replay_body_limit: 4096\n"),
            12,
            24,
            "missing unit",
        ),
        (
            route("    upstream_timeout: \"\"\n"),
            12,
            23,
            "empty duration",
        ),
        (
            format!("shutdown_grace: 0s\n{}", route("")),
            1,
            17,
            "greater than zero",
        ),
        (
            format!("sweeper:\n  interval: 1x\n{}", route("")),
            2,
            13,
            "unknown unit `x`",
        ),
    ]);
}

#[test]
fn upstream_urls() {
    let up = |u: &str| route("").replace("\"http://127.0.0.1:3001\"", &format!("\"{u}\""));
    for (bad, why) in [
        ("ftp://x", "http:// or https://"),
        ("127.0.0.1:3000", "http:// or https://"),
        ("http://", "host is missing"),
        ("http:///x", "host is missing"),
        ("http://h/x?a=1", "query or fragment"),
        ("http://h/x#f", "query or fragment"),
        ("http://u:p@h", "user info"),
        ("http://h:0", "port"),
        ("http://h:99999", "port"),
        ("http://h:", "port"),
        ("http://[::1", "IPv6"),
        ("http://[::1]x", "IPv6"),
        ("http://::1:80", "host"),
        ("http://h o", "host"),
    ] {
        let e = one_error(&up(bad), 9, 15, why);
        assert!(e.message.starts_with("malformed upstream URL"), "{e}");
    }
    let u = |s: &str| ok(&up(s)).config.routes[0].upstream.clone();
    let a = u("http://127.0.0.1:3001");
    assert_eq!(
        (a.tls, a.host.as_str(), a.port, a.base_path.as_str()),
        (false, "127.0.0.1", 3001, "")
    );
    let b = u("https://Consumer.Internal/base/");
    assert_eq!(
        (b.tls, b.host.as_str(), b.port, b.base_path.as_str()),
        (true, "consumer.internal", 443, "/base")
    );
    assert_eq!(b.original, "https://Consumer.Internal/base/");
    let c = u("http://[::1]:8080/x");
    assert_eq!(
        (c.host.as_str(), c.port, c.base_path.as_str()),
        ("::1", 8080, "/x")
    );
    assert_eq!(u("http://h/").port, 80);
    // the Host a forwarded HTTP/1.0 request without one gets
    for (url, host) in [
        ("http://127.0.0.1:3001", "127.0.0.1:3001"),
        ("https://Consumer.Internal/base/", "consumer.internal"),
        ("https://h:8443", "h:8443"),
        ("http://h:443", "h:443"),
        ("http://[::1]:8080/x", "[::1]:8080"),
        ("http://[::1]", "[::1]"),
    ] {
        assert_eq!(u(url).host_header, host, "{url}");
    }
}

#[test]
fn store_scheme_and_env_expansion() {
    let store = |url: &str| route("").replace("sqlite:///tmp/t.db", url);
    one_error_each(&[
        (
            store("mysql://u@h/db"),
            4,
            8,
            "unsupported store scheme `mysql`",
        ),
        (store("/tmp/x.db"), 4, 8, "unsupported store scheme"),
        (
            store("postgres://u:${NOPE}@h/db"),
            4,
            8,
            "environment variable `NOPE` is not set",
        ),
        (store("postgres://u:${DB_PASS@h/db"), 4, 8, "unterminated"),
    ]);
    let l = ok(&store("postgres://u:${DB_PASS}@h:5432/db"));
    assert_eq!(l.config.store.url, "postgres://u:s3cr$t@h:5432/db");
    assert_eq!(
        l.config.store.url.kind(),
        crate::config::StoreKind::Postgres
    );
    assert_eq!(l.config.store.url.redacted(), "postgres://u:***@h:5432/db");
    let no_password = ok(&store("postgres://u@h/db"));
    assert_eq!(no_password.config.store.url.redacted(), "postgres://u@h/db");
    assert!(
        !format!("{:?}", l.config).contains("s3cr"),
        "Debug must hide the password"
    );
    assert_eq!(
        ok(&store("postgresql://h/db")).config.store.url.kind(),
        crate::config::StoreKind::Postgres
    );
    // A lone `$` stays as written.
    assert_eq!(
        ok(&store("postgres://u:pa$s@h/db")).config.store.url,
        "postgres://u:pa$s@h/db"
    );
    let l = ok(&route(""));
    assert_eq!(l.config.store.url.kind(), crate::config::StoreKind::Sqlite);
    assert_eq!(l.config.store.max_connections, 16);
    let zero = route("").replace("  url:", "  max_connections: 0\n  url:");
    one_error(&zero, 4, 20, "max_connections must be at least 1");
}

#[test]
fn listeners_and_top_level_fields() {
    let no_listen = route("").replace("listen: \"127.0.0.1:1\"\n", "");
    let no_routes = HEAD.replace("routes:\n", "routes: []\n");
    let missing_routes = HEAD.replace("routes:\n", "");
    let batch_zero = format!("sweeper: {{batch_size: 0}}\n{}", route(""));
    one_error_each(&[
        (
            route("").replace("127.0.0.1:1", "localhost:80"),
            1,
            9,
            "not a socket address",
        ),
        (no_listen, 1, 1, "required field `listen` is missing"),
        (no_routes, 5, 9, "at least one route is required"),
        (missing_routes, 1, 1, "required field `routes` is missing"),
        (
            format!("threads: 0\n{}", route("")),
            1,
            10,
            "threads must be at least 1",
        ),
        (batch_zero, 1, 23, "batch_size must be at least 1"),
    ]);
    let l = ok(&format!(
        "threads: 4\nshutdown_grace: 5s\nsweeper: {{interval: 10s}}\n{}",
        route("")
    ));
    assert_eq!(l.config.threads, Some(4));
    assert_eq!(l.config.shutdown_grace, std::time::Duration::from_secs(5));
    assert_eq!(
        l.config.sweeper.interval,
        std::time::Duration::from_secs(10)
    );
    assert_eq!(l.config.sweeper.batch_size, 1000);
}

#[test]
fn methods_statuses_and_idempotency_header() {
    let l = ok(&route(
        "    guard_methods: [post, Put, POST]\n    settle_on: [\"2xx\", 409, \"3xx\", \"409\"]\n",
    ));
    let r = &l.config.routes[0];
    assert_eq!(r.guard_methods, vec![http::Method::POST, http::Method::PUT]);
    assert!(r.settle_on.matches(204) && r.settle_on.matches(301) && r.settle_on.matches(409));
    assert!(!r.settle_on.matches(404) && !r.settle_on.matches(500) && !r.settle_on.matches(100));
    one_error_each(&[
        (
            route("    guard_methods: [POST, \"PO ST\"]\n"),
            12,
            27,
            "not a valid HTTP method",
        ),
        (
            route("    settle_on: [\"2xx\", \"6xx\"]\n"),
            12,
            24,
            "invalid status `6xx`",
        ),
        (
            route("    settle_on: [600]\n"),
            12,
            17,
            "invalid status `600`",
        ),
        (route("    settle_on: []\n"), 12, 16, "at least one status"),
        (
            route("    idempotency_key_header: \"a b\"\n"),
            12,
            29,
            "not a valid HTTP header name",
        ),
    ]);
    let r = |extra: &str| {
        ok(&route(extra)).config.routes[0]
            .idempotency_key_header
            .clone()
    };
    assert_eq!(
        r(""),
        Some(http::HeaderName::from_static("idempotency-key"))
    );
    assert_eq!(r("    idempotency_key_header: null\n"), None);
    assert_eq!(r("    idempotency_key_header: ~\n"), None);
    assert_eq!(
        r("    idempotency_key_header: X-Dedup\n"),
        Some(http::HeaderName::from_static("x-dedup"))
    );
}

#[test]
fn admin_listen_needs_a_port_of_its_own() {
    let same = route("").replace("127.0.0.1:2", "127.0.0.1:1");
    let wildcard = route("").replace("127.0.0.1:2", "0.0.0.0:1");
    let all = route("")
        .replace("127.0.0.1:1", "[::]:1")
        .replace("127.0.0.1:2", "127.0.0.1:1");
    one_error_each(&[
        (
            same,
            2,
            15,
            "admin_listen `127.0.0.1:1` overlaps listen `127.0.0.1:1`",
        ),
        (wildcard, 2, 15, "overlaps listen"),
        (all, 2, 15, "overlaps listen `[::]:1`"),
    ]);
    // another port or address, or port 0 on both (the kernel picks two), is fine
    ok(&route(""));
    ok(&route("").replace("127.0.0.1:2", "127.0.0.2:2"));
    ok(&route("").replace("127.0.0.1:2", "[::1]:1"));
    ok(&route("")
        .replace("127.0.0.1:1", "0.0.0.0:1")
        .replace("127.0.0.1:2", "[::1]:1"));
    ok(&route("")
        .replace("127.0.0.1:1", "127.0.0.1:0")
        .replace("127.0.0.1:2", "127.0.0.1:0"));
}

#[test]
fn downstream_limits_defaults_values_and_errors() {
    use std::time::Duration;
    let l = ok(&route(""));
    let d = &l.config.downstream;
    assert_eq!(
        (
            d.header_timeout,
            d.body_timeout,
            d.keepalive_timeout,
            d.write_timeout
        ),
        (
            Duration::from_secs(10),
            Duration::from_secs(30),
            Duration::from_secs(60),
            Duration::from_secs(30)
        )
    );
    assert_eq!(d.max_connections, 10_000);
    assert!(l.config.tls.is_none());
    let l = ok(&format!(
        "downstream:\n  header_timeout: 500ms\n  body_timeout: 2s\n  keepalive_timeout: 5m\n  write_timeout: 1s\n  max_connections: 64\n{}",
        route("")
    ));
    let d = &l.config.downstream;
    assert_eq!(d.header_timeout, Duration::from_millis(500));
    assert_eq!(d.body_timeout, Duration::from_secs(2));
    assert_eq!(d.keepalive_timeout, Duration::from_secs(300));
    assert_eq!(d.write_timeout, Duration::from_secs(1));
    assert_eq!(d.max_connections, 64);
    assert_eq!(
        d.max_connections_at, "cfg.yaml:6:20",
        "for the open-files check"
    );
    let downstream = |line: &str| format!("downstream:\n  {line}\n{}", route(""));
    let tls = format!(
        "tls:\n  cert: file:/nonexistent/c.pem\n  key: /k.pem\n{}",
        route("")
    );
    one_error_each(&[
        (
            downstream("body_timeout: 0s"),
            2,
            17,
            "downstream.body_timeout",
        ),
        (
            downstream("max_connections: 0"),
            2,
            20,
            "max_connections must be at least 1",
        ),
        (
            downstream("idle_timeout: 5s"),
            2,
            3,
            "unknown field `idle_timeout`",
        ),
        (tls, 3, 8, "tls.key: must be a `file:PATH` reference"),
    ]);
}

#[test]
fn upgrade_sock_has_a_default_and_must_fit_a_socket_address() {
    let l = ok(&route(""));
    assert_eq!(
        l.config.upgrade_sock,
        std::path::PathBuf::from("/tmp/idemgate.upgrade.sock")
    );
    let l = ok(&format!(
        "upgrade_sock: /run/idemgate/upgrade.sock\n{}",
        route("")
    ));
    assert_eq!(
        l.config.upgrade_sock,
        std::path::PathBuf::from("/run/idemgate/upgrade.sock")
    );
    let long = format!("/tmp/{}", "x".repeat(103));
    let sock = |path: &str| format!("upgrade_sock: {path}\n{}", route(""));
    one_error_each(&[
        (sock(&long), 1, 15, "a Unix socket path holds at most 107"),
        (sock("\"\""), 1, 15, "upgrade_sock must be a path"),
    ]);
}

/// SPEC §18: a Valkey URL, its password from the environment and hidden,
/// `store.durability` for it alone, and a warning naming the risk of each
/// weaker setting at its own line.
#[test]
fn valkey_store_url_and_durability() {
    let store = |url: &str| route("").replace("sqlite:///tmp/t.db", url);
    let l = ok(&store(
        "valkey://idem:${DB_PASS}@h1:7000,h2:7001/?replicas=1",
    ));
    assert_eq!(l.config.store.url.kind(), crate::config::StoreKind::Valkey);
    let t = l.config.store.url.valkey_target().unwrap();
    assert_eq!(t.password.as_deref(), Some("s3cr$t"));
    assert_eq!(t.durability, crate::store::Durability::Fsynced);
    assert!(!format!("{:?}", l.config).contains("s3cr"));
    assert!(l
        .warnings
        .iter()
        .all(|w| !w.to_string().contains("durability")));

    let weak = store("rediss://h:6380").replace("  url:", "  durability: replica_received\n  url:");
    let l = ok(&weak);
    let w: Vec<String> = l.warnings.iter().map(ToString::to_string).collect();
    assert!(
        w.iter()
            .any(|w| w.contains(":4:") && w.contains("not until it is on disk")),
        "{w:?}"
    );
    let l = ok(&store("valkey://h/?durability=none"));
    let w: Vec<String> = l.warnings.iter().map(ToString::to_string).collect();
    assert!(w.iter().any(|w| w.contains("a second time")), "{w:?}");

    one_error(
        &store("valkey://u:pw@h/?replicas=x"),
        4,
        8,
        "replicas=x is not a whole number",
    );
    one_error(
        &route("").replace("  url:", "  durability: none\n  url:"),
        4,
        3,
        "durability applies to valkey:// and redis:// stores only",
    );
    one_error(
        &store("valkey://h").replace("  url:", "  durability: aof\n  url:"),
        4,
        15,
        "use fsynced, replica_received or none",
    );
}
