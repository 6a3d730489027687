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
                token: 0,
                trace: None,
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

/// A POST with `body` (as JSON) and, when `auth` is given, that
/// `Authorization` value, on a fresh connection.
pub fn post(px: &Proxy, path: &str, body: &[u8], auth: Option<&str>) -> Response {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(a) = auth {
        headers.push(("Authorization", a));
    }
    Client::connect(px.admin)
        .expect("connect to admin")
        .request("POST", path, &headers, body)
        .expect("admin answers")
}

/// [`post`] with the right token.
pub fn act(px: &Proxy, path: &str, body: &str) -> Response {
    post(px, path, body.as_bytes(), Some(&format!("Bearer {TOKEN}")))
}

/// A route `name` on `prefix` under `on_ambiguous: hold`, its
/// `upstream_timeout` 1 s (lease 4 s).
pub fn held_route(name: &str, prefix: &str, upstream: &str) -> String {
    route(
        name,
        prefix,
        upstream,
        "    upstream_timeout: 1s\n    lease: 4s\n    on_ambiguous: hold\n",
    )
}

/// A consumer that acts on every request and answers 200; the first time
/// it meets an event whose ID holds `slow`, it answers only after 2 s (past
/// [`held_route`]'s `upstream_timeout`): that event becomes `ambiguous`.
pub fn slow_once_consumer() -> Server {
    use crate::raw_upstream::{response, upstream, Behavior};
    let seen = std::sync::Mutex::new(std::collections::HashSet::<String>::new());
    upstream(move |req, _| {
        let key = req.key().unwrap_or_default().to_string();
        let first = seen.lock().unwrap().insert(key.clone());
        if first && key.contains("slow") {
            Behavior::Late(std::time::Duration::from_secs(2), response(200, b"ok"))
        } else {
            Behavior::Respond(response(200, b"ok"))
        }
    })
}

/// Delivers each of `ids` (at once, each on its own connection) to
/// `prefix` of a [`held_route`] whose consumer is [`slow_once_consumer`]:
/// each sender gets 504 and each record is `ambiguous`.
pub fn make_ambiguous(px: &Proxy, store: &str, route: &str, prefix: &str, ids: &[String]) {
    let addr = px.addr;
    let senders: Vec<_> = ids
        .iter()
        .map(|id| {
            let (id, prefix) = (id.clone(), prefix.to_string());
            std::thread::spawn(move || kit::deliver(addr, &prefix, Some(&id), b"{}").unwrap())
        })
        .collect();
    for (s, id) in senders.into_iter().zip(ids) {
        let r = s.join().unwrap();
        assert_eq!(r.status, 504, "{id}: {r:?}");
        assert_eq!(show(store, route, id)["state"], "ambiguous", "{id}");
    }
}

/// Delivers `id(n)` for n = 0, 1, … to `path` until the answer is
/// `status`, which must come within 2 s of `since` (SPEC §14: every process
/// follows a pause or a resume within 2 s); the ID and the answer. (A paused
/// route claims nothing, so a refused ID can be tried again; one let
/// through before a pause took is delivered, so the next try takes a new one.)
pub fn within_two_seconds(
    since: std::time::Instant,
    px: &Proxy,
    path: &str,
    id: impl Fn(usize) -> String,
    status: u16,
) -> (String, Response) {
    for n in 0.. {
        let id = id(n);
        let r = px.deliver(path, Some(&id), b"{}");
        if r.status == status {
            return (id, r);
        }
        assert!(
            [200, 503].contains(&r.status),
            "{id}: neither forwarded nor paused: {r:?}"
        );
        assert!(
            since.elapsed() < std::time::Duration::from_secs(2),
            "{id}: not {status} within 2 s: {r:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    unreachable!()
}
