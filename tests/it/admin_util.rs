//! Shared by the admin API and console tests: a proxy with an admin token,
//! admin API calls, and percent-encoding of path segments.

use crate::common::*;

/// The token the test proxies are configured with (through `env:`).
pub const TOKEN: &str = "test-admin-token-0123456789abcdef";

/// `routes` plus `admin.token: env:IDEMGATE_ADMIN_TOKEN`, with the variable set.
pub fn start_with_token(dir: &TempDir, store: &str, routes: &str) -> Proxy {
    let routes = format!("{routes}admin:\n  token: env:IDEMGATE_ADMIN_TOKEN\n");
    Proxy::start_with_env(dir, store, &routes, &[("IDEMGATE_ADMIN_TOKEN", TOKEN)])
}

/// Writes a claim for `id` straight to the store, as a process that died
/// `age_ms` ago holding a `lease_ms` lease would have left it: a stuck claim.
pub fn stuck_claim(store: &str, route: &str, id: &str, age_ms: i64, lease_ms: i64) {
    use idemgate::store::{self, ClaimOutcome, ClaimRequest};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let s = store::open(store, 1).await.unwrap();
        let now = idemgate::claim::now_ms();
        let out = s
            .claim(&ClaimRequest {
                route,
                event_id: id,
                digest: &"0".repeat(64),
                now: now - age_ms,
                lease_ms,
                retention_ms: 86_400_000,
                hold: false,
                instance: "test",
            })
            .await
            .unwrap();
        assert!(matches!(out, ClaimOutcome::Claimed { .. }), "a new claim");
        s.close().await;
    });
}

/// One request to the admin listener on a fresh connection.
pub fn call(px: &Proxy, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    Client::connect(px.admin)
        .expect("connect to admin")
        .request(method, path, headers, b"")
        .expect("admin answers")
}

pub fn get_json(px: &Proxy, path: &str) -> serde_json::Value {
    let r = call(px, "GET", path, &[]);
    assert_eq!(r.status, 200, "GET {path}: {}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    r.json()
}

/// POST …/release with the right token.
pub fn release(px: &Proxy, route: &str, id: &str, force: bool) -> Response {
    let auth = format!("Bearer {TOKEN}");
    let q = if force { "?force=true" } else { "" };
    call(
        px,
        "POST",
        &format!("/api/events/{}/{}/release{q}", enc(route), enc(id)),
        &[("Authorization", &auth)],
    )
}

/// `encodeURIComponent` for a path segment: everything but the unreserved
/// characters is %-escaped.
pub fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The value of one `/metrics` sample line (`name{labels} value`), by its full series text.
pub fn samples(metrics: &str, name: &str) -> Vec<(String, f64)> {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// A label's value in a series text such as `x{outcome="a",route="r"}`.
pub fn label<'a>(series: &'a str, name: &str) -> &'a str {
    let key = format!("{name}=\"");
    let start = series.find(&key).expect("label") + key.len();
    let end = series[start..].find('"').unwrap() + start;
    &series[start..end]
}
