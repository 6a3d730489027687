//! The route table: the config's routes, each with what only the running
//! process can make of it (the upstream peer, from the upstream's address;
//! the route's counters and kept connections), matched by host and longest
//! whole-segment path prefix.

use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::upstreams::peer::{HttpPeer, HttpUpstreamRequestPolicy};

use crate::config::Route;
use crate::limits::RouteLimits;

use super::idle::IdleConnections;

/// How long an upstream connection is kept idle for reuse.
const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A route as the proxy uses it.
pub struct RouteRt {
    /// The validated route: pointers parsed, verifier built, durations as
    /// the store takes them.
    pub cfg: Route,
    /// The upstream peer with its timeouts; cloned per request.
    pub peer: HttpPeer,
    /// Duplicates held by `in_flight: wait` right now (capped by `max_waiters`).
    pub waiters: AtomicUsize,
    /// This route's `idemgate_requests_total` series.
    pub requests: crate::metrics::RequestCounters,
    /// Upstream connections kept for the next forward.
    pub idle: IdleConnections,
    /// What protects the consumer (SPEC §15): the route's limits and
    /// breaker in this process (shared with the metrics and the console).
    pub limits: Arc<RouteLimits>,
}

/// A route whose upstream the process cannot reach by address.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("route {route}: cannot resolve upstream {upstream}: {source}")]
    Resolve {
        route: String,
        upstream: String,
        #[source]
        source: std::io::Error,
    },
    #[error("route {route}: upstream {upstream} has no address")]
    NoAddress { route: String, upstream: String },
}

impl RouteRt {
    /// Resolves the upstream's address (once, at start) into its peer.
    pub fn new(cfg: Route) -> Result<RouteRt, RouteError> {
        let up = &cfg.upstream;
        let (route, upstream) = (cfg.name.clone(), up.original.clone());
        let addr = match (up.host.as_str(), up.port).to_socket_addrs() {
            Ok(mut addrs) => addrs.next(),
            Err(source) => {
                return Err(RouteError::Resolve {
                    route,
                    upstream,
                    source,
                })
            }
        };
        let addr = addr.ok_or(RouteError::NoAddress { route, upstream })?;
        let mut peer = HttpPeer::new(addr, up.tls, up.host.clone());
        let t = cfg.upstream_timeout;
        peer.options.connection_timeout = Some(t);
        peer.options.total_connection_timeout = Some(t);
        peer.options.read_timeout = Some(t);
        peer.options.write_timeout = Some(t);
        peer.options.idle_timeout = Some(UPSTREAM_IDLE_TIMEOUT);
        // pingora's streaming path: idemgate drops the hop-by-hop headers
        // itself (hop.rs, in upstream_request_filter), the same way as on its
        // own paths, and never forwards an upgrade.
        peer.options.http_upstream_request_policy = HttpUpstreamRequestPolicy::preserve();
        Ok(RouteRt {
            limits: Arc::new(RouteLimits::new(cfg.limits())),
            cfg,
            peer,
            waiters: Default::default(),
            requests: Default::default(),
            idle: IdleConnections::new(UPSTREAM_IDLE_TIMEOUT),
        })
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// One of the route's `max_waiters` places for a held duplicate, if one is free.
    pub fn wait_place(&self) -> Option<WaitPlace<'_>> {
        let mut n = self.waiters.load(Ordering::Acquire);
        loop {
            if n >= self.cfg.max_waiters {
                return None;
            }
            match self
                .waiters
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(WaitPlace(&self.waiters)),
                Err(now) => n = now,
            }
        }
    }

    pub fn guards(&self, method: &http::Method) -> bool {
        self.cfg.guard_methods.iter().any(|m| m == method)
    }

    /// Whether a request with `method` must pass the signature check: on a
    /// route with `verify`, every method but the `unverified_methods`
    /// (never a guarded one: config validation refuses that).
    pub fn verifies(&self, method: &http::Method) -> bool {
        self.cfg.verify.is_some() && !self.cfg.unverified_methods.iter().any(|m| m == method)
    }

    /// The path the upstream sees: `strip_prefix` applied, the upstream's base
    /// path prepended. `path_and_query` is the request's, starting with `/`.
    pub fn upstream_path(&self, path_and_query: &str) -> String {
        let base = &self.cfg.upstream.base_path;
        let (slash, rest) = if self.cfg.strip_prefix && self.cfg.path_prefix != "/" {
            let stripped = &path_and_query[self.cfg.path_prefix.len().min(path_and_query.len())..];
            let slash = stripped.is_empty() || stripped.starts_with('?');
            (if slash { "/" } else { "" }, stripped)
        } else {
            ("", path_and_query)
        };
        // one allocation per forwarded request
        let mut path = String::with_capacity(base.len() + slash.len() + rest.len());
        path.push_str(base);
        path.push_str(slash);
        path.push_str(rest);
        path
    }
}

/// A place among a route's held duplicates (`max_waiters`), given back on drop.
pub struct WaitPlace<'a>(&'a AtomicUsize);

impl Drop for WaitPlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Routes ordered for matching: longest prefix first, host-bound before
/// host-less at equal length.
pub struct RouteTable {
    routes: Vec<Arc<RouteRt>>,
}

impl RouteTable {
    pub fn new(routes: Vec<Route>) -> Result<RouteTable, RouteError> {
        let mut routes = routes
            .into_iter()
            .map(RouteRt::new)
            .collect::<Result<Vec<_>, _>>()?;
        routes.sort_by(|a, b| {
            b.cfg
                .path_prefix
                .len()
                .cmp(&a.cfg.path_prefix.len())
                .then(b.cfg.host.is_some().cmp(&a.cfg.host.is_some()))
        });
        Ok(RouteTable {
            routes: routes.into_iter().map(Arc::new).collect(),
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<RouteRt>> {
        self.routes.iter()
    }

    /// `host` is lower-case without a port; `path` has no query.
    pub fn find(&self, host: Option<&str>, path: &str) -> Option<&Arc<RouteRt>> {
        self.routes.iter().find(|r| {
            r.cfg.host.as_deref().is_none_or(|h| Some(h) == host)
                && prefix_matches(&r.cfg.path_prefix, path)
        })
    }
}

/// Whole path segments: `/hooks/stripe` matches `/hooks/stripe` and
/// `/hooks/stripe/x`, not `/hooks/stripex`.
pub fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return path.starts_with('/');
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// The request's host, lower-case and without a port: from an absolute-form
/// URI or the `Host` header.
pub fn request_host(req: &pingora::http::RequestHeader) -> Option<String> {
    let raw = match req.uri.host() {
        Some(h) => h,
        None => req.headers.get(http::header::HOST)?.to_str().ok()?,
    };
    let host = if raw.starts_with('[') {
        raw.split(']')
            .next()
            .map(|h| format!("{h}]"))
            .unwrap_or_default()
    } else {
        raw.split(':').next().unwrap_or_default().to_string()
    };
    // `hooks.example.com.` is the same name (as match_host reads it)
    let host = host
        .strip_suffix('.')
        .filter(|h| !h.is_empty())
        .unwrap_or(&host);
    Some(host.to_ascii_lowercase())
}

/// Closes every route's connections idle past the timeout, every
/// [`PRUNE_EVERY`], so a route without traffic lets its upstream go.
pub struct PruneIdle {
    pub routes: Vec<Arc<RouteRt>>,
}

/// How often [`PruneIdle`] looks.
const PRUNE_EVERY: Duration = Duration::from_secs(10);

#[async_trait]
impl BackgroundService for PruneIdle {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(PRUNE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now = Instant::now();
                    for route in &self.routes {
                        route.idle.prune(now);
                    }
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_segment_prefixes() {
        assert!(prefix_matches("/hooks/stripe", "/hooks/stripe"));
        assert!(prefix_matches("/hooks/stripe", "/hooks/stripe/x"));
        assert!(!prefix_matches("/hooks/stripe", "/hooks/stripex"));
        assert!(!prefix_matches("/hooks/stripe", "/hooks"));
        assert!(prefix_matches("/", "/anything"));
    }
}
