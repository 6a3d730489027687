//! Step 2: raw file → model, collecting every problem instead of stopping at
//! the first. This file handles the top level, the store and cross-route
//! checks (duplicate names and matches); `route.rs` handles one route.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::ctx::Ctx;
use super::fields;
use super::layer::{parse_layer, Layer};
use super::model::{Config, Downstream, Route, StoreConfig, SweeperConfig};
use super::raw::{RawConfig, RawDownstream, RawRoute, RawStore, RawSweeper, Text};
use super::route::parse_route;
use crate::source::{Range, Ranges};
use crate::store::{Durability, StoreUrl};

/// Validates the whole file. `None` means at least one error was recorded.
// long: the one place RawConfig is taken apart and Config filled in (habit 12), a line a key
pub fn validate(raw: RawConfig, ctx: &mut Ctx) -> Option<Config> {
    let RawConfig {
        listen,
        admin_listen,
        store,
        defaults,
        routes,
        shutdown_grace,
        sweeper,
        threads,
        downstream,
        tls,
        admin,
        upgrade_sock,
        instance,
        trusted_proxies,
        telemetry,
    } = raw;

    let (listen, admin_listen) = listeners(ctx, listen.as_ref(), admin_listen.as_ref());
    let store = match store {
        Some(s) => store_config(ctx, s),
        None => {
            ctx.at_key(
                "store",
                "required field `store` is missing (store: {url: sqlite://...})",
            );
            None
        }
    };
    let shutdown_grace = ctx
        .duration("shutdown_grace", shutdown_grace.as_ref())
        .unwrap_or(Duration::from_secs(30));
    let sweeper = sweeper_config(ctx, sweeper);
    let admin = super::admin::admin_config(ctx, admin);
    let threads = threads_config(ctx, threads);
    let upgrade_sock = upgrade_sock_path(ctx, upgrade_sock);
    let instance = instance_name(ctx, instance);
    let trusted_proxies = trusted_proxies_config(ctx, trusted_proxies);
    let telemetry = super::telemetry::optional(ctx, telemetry);
    let downstream = downstream_config(ctx, downstream);
    let tls = match tls {
        None => Some(None),
        Some(raw) => super::tls::tls_config(ctx, raw).map(Some),
    };

    let defaults = parse_layer(ctx, "defaults", defaults.unwrap_or_default());
    let routes = parse_routes(ctx, routes, &defaults);

    Some(Config {
        listen: listen?,
        admin_listen: admin_listen?,
        store: store?,
        routes,
        shutdown_grace,
        sweeper: sweeper?,
        threads: threads?,
        downstream: downstream?,
        tls: tls?,
        admin: admin?,
        upgrade_sock: upgrade_sock?,
        instance: instance?,
        trusted_proxies: trusted_proxies?,
        telemetry: telemetry?,
    })
}

/// `listen` and `admin_listen`, which must not take each other's connections.
fn listeners(
    ctx: &mut Ctx,
    listen: Option<&Text>,
    admin_listen: Option<&Text>,
) -> (Option<SocketAddr>, Option<SocketAddr>) {
    let listen = socket_addr(ctx, "listen", listen);
    let admin_listen = socket_addr(ctx, "admin_listen", admin_listen);
    if let (Some(proxy), Some(admin)) = (listen, admin_listen) {
        if listeners_overlap(proxy, admin) {
            // pingora binds with SO_REUSEPORT: both would bind, and the
            // kernel would split connections between proxy and admin
            ctx.at_value(
                "admin_listen",
                format!(
                    "admin_listen `{admin}` overlaps listen `{proxy}`: \
                     the admin endpoints need a port of their own"
                ),
            );
        }
    }
    (listen, admin_listen)
}

/// `trusted_proxies`: address ranges (SPEC §22); none by default.
fn trusted_proxies_config(ctx: &mut Ctx, raw: Option<Vec<String>>) -> Option<Arc<Ranges>> {
    let items = raw.unwrap_or_default();
    let mut ranges = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        match Range::parse(item) {
            Ok(r) => ranges.push(r),
            Err(e) => ctx.at_value(&format!("trusted_proxies[{i}]"), e.to_string()),
        }
    }
    (ranges.len() == items.len()).then(|| Arc::new(Ranges::new(ranges)))
}

/// `routes`: each route, and the checks across them (duplicate names and
/// matches).
fn parse_routes(ctx: &mut Ctx, routes: Option<Vec<RawRoute>>, defaults: &Layer) -> Vec<Route> {
    let mut out_routes = Vec::new();
    match routes {
        None => ctx.at_key(
            "routes",
            "required field `routes` is missing: at least one route is required",
        ),
        Some(r) if r.is_empty() => ctx.at_value("routes", "at least one route is required"),
        Some(routes) => {
            let mut seen = SeenRoutes::default();
            for (i, raw_route) in routes.into_iter().enumerate() {
                let path = format!("routes[{i}]");
                let name = raw_route.name.clone();
                let label = name
                    .as_ref()
                    .map_or_else(|| path.clone(), |n| format!("`{n}`"));
                let match_key = match_key(&raw_route);
                if let Some(route) = parse_route(ctx, &path, raw_route, defaults) {
                    out_routes.push(route);
                }
                if let Some(name) = name {
                    seen.name(ctx, &path, name);
                }
                if let Some(key) = match_key {
                    seen.match_key(ctx, &path, key, label);
                }
            }
        }
    }
    out_routes
}

/// A route's `(host, path_prefix)`.
type MatchKey = (Option<String>, String);

/// The match key, read even when the route has other errors; `None` when
/// the host or prefix is missing or malformed (parse_route reports that).
fn match_key(raw_route: &RawRoute) -> Option<MatchKey> {
    let m = raw_route.match_.as_ref()?;
    let host = match &m.host {
        Some(h) => Some(fields::match_host(h).ok()?),
        None => None,
    };
    Some((host, fields::path_prefix(m.path_prefix.as_deref()?).ok()?))
}

/// The names and matches of the routes so far, so that a second route with
/// either is reported where it stands.
#[derive(Default)]
struct SeenRoutes {
    /// name → path of its `name` key, for the first one's line.
    names: HashMap<String, String>,
    /// (host, prefix) → the route that has it.
    matches: HashMap<MatchKey, String>,
}

impl SeenRoutes {
    /// The name of the route at `path`: kept, or reported as a duplicate.
    fn name(&mut self, ctx: &mut Ctx, path: &str, name: String) {
        let name_path = format!("{path}.name");
        if let Some(first) = self.names.get(&name) {
            let first_line = ctx.line_of(first);
            ctx.at_key(
                &name_path,
                format!("duplicate route name `{name}` (first defined at line {first_line})"),
            );
        } else {
            self.names.insert(name, name_path);
        }
    }

    /// The match of the route at `path` (shown as `label`): kept, or
    /// reported as a duplicate.
    fn match_key(&mut self, ctx: &mut Ctx, path: &str, key: MatchKey, label: String) {
        if let Some(other) = self.matches.get(&key) {
            ctx.at_key(
                &format!("{path}.match"),
                format!(
                    "duplicate match (host {}, path_prefix {}): route {other} already matches it",
                    key.0.as_deref().unwrap_or("*"),
                    key.1
                ),
            );
        } else {
            self.matches.insert(key, label);
        }
    }
}

/// `threads`: `Some(None)` when unset (the runtime decides).
fn threads_config(ctx: &mut Ctx, threads: Option<u64>) -> Option<Option<usize>> {
    match threads {
        None => Some(None),
        Some(0) => {
            ctx.at_value("threads", "threads must be at least 1");
            None
        }
        Some(n) => match usize::try_from(n) {
            Ok(n) => Some(Some(n)),
            Err(_) => {
                ctx.at_value("threads", "threads is too large");
                None
            }
        },
    }
}

/// `instance` (SPEC §13): this process's name in attempt records, 1 to 64
/// visible ASCII characters; unset or empty, the host name and pid.
fn instance_name(ctx: &mut Ctx, raw: Option<String>) -> Option<String> {
    let name = match raw {
        Some(name) if !name.is_empty() => name,
        _ => return Some(default_instance()),
    };
    if name.len() <= 64 && name.bytes().all(|b| b.is_ascii_graphic()) {
        return Some(name);
    }
    ctx.at_value(
        "instance",
        "instance must be 1 to 64 visible ASCII characters (no spaces)".to_string(),
    );
    None
}

/// `host:pid`: tells replicas and restarts apart in attempt records.
fn default_instance() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

/// `upgrade_sock` (SPEC §10): a Unix socket path, default
/// `/tmp/idemgate.upgrade.sock`. A socket address holds 107 bytes of path.
fn upgrade_sock_path(ctx: &mut Ctx, raw: Option<String>) -> Option<std::path::PathBuf> {
    let Some(path) = raw else {
        return Some(DEFAULT_UPGRADE_SOCK.into());
    };
    let why = if path.is_empty() {
        "upgrade_sock must be a path".to_string()
    } else if path.len() > 107 {
        format!(
            "upgrade_sock is {} bytes long; a Unix socket path holds at most 107",
            path.len()
        )
    } else if path.contains('\0') {
        "upgrade_sock must not contain a NUL byte".to_string()
    } else {
        return Some(path.into());
    };
    ctx.at_value("upgrade_sock", why);
    None
}

/// Where `serve --upgrade` waits for the listening sockets unless the config says.
pub const DEFAULT_UPGRADE_SOCK: &str = "/tmp/idemgate.upgrade.sock";

fn downstream_config(ctx: &mut Ctx, raw: Option<RawDownstream>) -> Option<Downstream> {
    let present = raw.is_some();
    let RawDownstream {
        header_timeout,
        body_timeout,
        keepalive_timeout,
        write_timeout,
        max_connections,
    } = raw.unwrap_or_default();
    let d = Downstream::default();
    let before = ctx.error_count();
    let header_timeout = ctx.duration("downstream.header_timeout", header_timeout.as_ref());
    let body_timeout = ctx.duration("downstream.body_timeout", body_timeout.as_ref());
    let keepalive_timeout =
        ctx.duration("downstream.keepalive_timeout", keepalive_timeout.as_ref());
    let write_timeout = ctx.duration("downstream.write_timeout", write_timeout.as_ref());
    let max = max_connections_of(ctx, max_connections, d.max_connections);
    let at = if max_connections.is_some() {
        ctx.position("downstream.max_connections", true)
    } else if present {
        ctx.position("downstream", false)
    } else {
        d.max_connections_at.clone()
    };
    if ctx.error_count() > before {
        return None;
    }
    Some(Downstream {
        header_timeout: header_timeout.unwrap_or(d.header_timeout),
        body_timeout: body_timeout.unwrap_or(d.body_timeout),
        keepalive_timeout: keepalive_timeout.unwrap_or(d.keepalive_timeout),
        write_timeout: write_timeout.unwrap_or(d.write_timeout),
        max_connections: max,
        max_connections_at: at,
    })
}

/// `downstream.max_connections`: `default` when unset, 0 when wrong (recorded).
fn max_connections_of(ctx: &mut Ctx, raw: Option<u64>, default: usize) -> usize {
    match raw {
        None => default,
        Some(0) => {
            ctx.at_value(
                "downstream.max_connections",
                "max_connections must be at least 1",
            );
            0
        }
        Some(n) => match usize::try_from(n) {
            Ok(n) if n <= MAX_DOWNSTREAM_CONNECTIONS => n,
            _ => {
                ctx.at_value(
                    "downstream.max_connections",
                    format!("max_connections is too large (at most {MAX_DOWNSTREAM_CONNECTIONS})"),
                );
                0
            }
        },
    }
}

/// More client connections than this is a typo: each costs a file descriptor.
const MAX_DOWNSTREAM_CONNECTIONS: usize = 10_000_000;

/// Whether two listeners would take the same connections: one port (not 0,
/// which the kernel picks) on the same address, or on a wildcard that covers
/// the other (`0.0.0.0` the IPv4 addresses, `[::]` all of them).
fn listeners_overlap(a: SocketAddr, b: SocketAddr) -> bool {
    let covers = |x: SocketAddr, y: SocketAddr| {
        x.ip() == y.ip() || (x.ip().is_unspecified() && (x.is_ipv6() || y.is_ipv4()))
    };
    a.port() != 0 && a.port() == b.port() && (covers(a, b) || covers(b, a))
}

fn socket_addr(ctx: &mut Ctx, path: &str, value: Option<&Text>) -> Option<SocketAddr> {
    let Some(text) = value else {
        ctx.at_key(
            path,
            format!("required field `{path}` is missing (e.g. \"127.0.0.1:8080\")"),
        );
        return None;
    };
    match text.0.trim().parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            ctx.at_value(
                path,
                format!(
                    "`{}` is not a socket address (e.g. \"0.0.0.0:8080\")",
                    text.0
                ),
            );
            None
        }
    }
}

fn store_config(ctx: &mut Ctx, raw: RawStore) -> Option<StoreConfig> {
    let RawStore {
        url,
        max_connections,
        durability,
    } = raw;
    let max_connections = match max_connections {
        None => Some(16),
        Some(0) => {
            ctx.at_value(
                "store.max_connections",
                "max_connections must be at least 1",
            );
            None
        }
        Some(n) => u32::try_from(n)
            .map_err(|_| ctx.at_value("store.max_connections", "max_connections is too large"))
            .ok(),
    };
    let Some(url) = url else {
        ctx.at_key(
            "store",
            "required field `url` is missing (sqlite://PATH or postgres://...)",
        );
        return None;
    };
    let url = match expand_env(&url, ctx.env) {
        Ok(u) => u,
        Err(e) => {
            ctx.at_value("store.url", e);
            return None;
        }
    };
    let mut url = match StoreUrl::parse(&url) {
        Ok(u) => u,
        Err(e) => {
            ctx.at_value("store.url", e);
            return None;
        }
    };
    store_durability(ctx, &mut url, durability.as_deref())?;
    Some(StoreConfig {
        url,
        max_connections: max_connections?,
    })
}

/// `store.durability` into a Valkey URL (it may also say `durability=`),
/// and a warning naming the risk of anything but `fsynced` (SPEC §18).
fn store_durability(ctx: &mut Ctx, url: &mut StoreUrl, durability: Option<&str>) -> Option<()> {
    if let Some(text) = durability {
        let Some(d) = Durability::parse(text) else {
            ctx.at_value(
                "store.durability",
                format!("durability `{text}`: use fsynced, replica_received or none"),
            );
            return None;
        };
        if !url.set_durability(d) {
            ctx.at_key(
                "store.durability",
                "durability applies to valkey:// and redis:// stores only",
            );
            return None;
        }
    }
    if let Some(risk) = url.valkey_target().and_then(|t| t.durability.risk()) {
        let at = if durability.is_some() {
            "store.durability"
        } else {
            "store.url"
        };
        ctx.warn_value(at, risk);
    }
    Some(())
}

/// Expands `${NAME}`; a lone `$` is kept (passwords may contain one).
/// Messages name the variable, never the value.
pub fn expand_env(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err("unterminated `${` in store.url (write ${NAME})".to_string());
        };
        let name = &after[..end];
        let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "invalid environment variable name `{name}` in store.url"
            ));
        }
        match env(name) {
            Some(v) => out.push_str(&v),
            None => return Err(format!("environment variable `{name}` is not set")),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn sweeper_config(ctx: &mut Ctx, raw: Option<RawSweeper>) -> Option<SweeperConfig> {
    let RawSweeper {
        interval,
        batch_size,
    } = raw.unwrap_or(RawSweeper {
        interval: None,
        batch_size: None,
    });
    let interval = ctx
        .duration("sweeper.interval", interval.as_ref())
        .unwrap_or(Duration::from_secs(60));
    let batch_size = match batch_size {
        None => 1000,
        Some(0) => {
            ctx.at_value("sweeper.batch_size", "batch_size must be at least 1");
            return None;
        }
        Some(n) => match u32::try_from(n) {
            Ok(n) => n,
            Err(_) => {
                ctx.at_value("sweeper.batch_size", "batch_size is too large");
                return None;
            }
        },
    };
    Some(SweeperConfig {
        interval,
        batch_size,
    })
}
