//! The JSON admin API (SPEC §11), every row of its table, against the real
//! binary, a real consumer and a real store (SQLite, and PostgreSQL where
//! the row touches the store): routes and live counters that match
//! `/metrics`, event lists as `events list --json` with a cursor that is
//! stable while deliveries arrive, one record as `events show --json` with
//! percent-decoded segments (IDs with `/`), and releases behind the token
//! (401, 403, 404, 409).

use crate::admin_util;
use crate::common;

use admin_util::*;
use common::*;

/// `method path` (no headers) is refused with `status` and problem type `NAME`.
#[track_caller]
fn refuses(px: &Proxy, method: &str, path: &str, status: u16, name: &str) {
    refused(&call(px, method, path, &[]), status, name);
}

fn problem(r: &Response) -> serde_json::Value {
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "status {}: {}",
        r.status,
        r.text()
    );
    let doc = r.json();
    assert_eq!(doc["status"], r.status, "{doc}");
    assert!(doc["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(doc["detail"].as_str().is_some_and(|t| !t.is_empty()));
    doc
}

#[track_caller]
/// A proxy with the admin token on a fresh SQLite store and one route `r`
/// (`/hooks/r`) to a consumer: (its dir, the consumer, the proxy).
fn one_route_with_token(tag: &str) -> (TempDir, Consumer, Proxy) {
    let dir = TempDir::new(tag);
    let up = Consumer::start().unwrap();
    let route = route("r", "/hooks/r", &up.url(), "");
    let px = start_with_token(&dir, &dir.sqlite_url("a.db"), &route);
    (dir, up, px)
}

fn refused(r: &Response, status: u16, name: &str) -> serde_json::Value {
    assert_eq!(r.status, status, "{}", r.text());
    let doc = problem(r);
    assert_eq!(doc["type"], format!("urn:idemgate:problem:{name}"), "{doc}");
    doc
}

fn cli_list(store: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec![
        "events", "list", "--store", store, "--json", "--limit", "1000",
    ];
    args.extend_from_slice(extra);
    let (code, out, err) = cli(&args);
    assert_eq!(code, 0, "events list: {err}");
    serde_json::from_str(&out).unwrap()
}

// ---- GET /api/routes ---------------------------------------------------------

/// Every requests/upstream sample of /metrics is in the API document `doc`,
/// with its value, and nothing else is; how many samples were compared.
fn counters_match_metrics(
    doc: &serde_json::Value,
    routes: &[serde_json::Value],
    metrics: &str,
) -> usize {
    let by_name = |name: &str| routes.iter().find(|r| r["name"] == name);
    let mut checked = 0;
    for (metric, field, key) in [
        ("idemgate_requests_total", "requests", "outcome"),
        (
            "idemgate_upstream_responses_total",
            "upstream_responses",
            "class",
        ),
    ] {
        let scraped = samples(metrics, metric);
        let mut in_api = 0;
        for r in routes {
            in_api += r["counters"][field].as_object().unwrap().len();
        }
        if field == "requests" {
            in_api += doc["unrouted"]["requests"].as_object().unwrap().len();
        }
        assert_eq!(in_api, scraped.len(), "{metric}: {scraped:?}\n{doc}");
        for (series, value) in scraped {
            let route = label(&series, "route");
            let counters = match by_name(route) {
                Some(r) => &r["counters"],
                None => {
                    assert_eq!(route, "", "{series}");
                    &doc["unrouted"]
                }
            };
            assert_eq!(
                counters[field][label(&series, key)].as_f64(),
                Some(value),
                "{series} = {value}\n{doc}"
            );
            checked += 1;
        }
    }
    checked
}

#[test]
fn routes_have_their_settings_and_counters_that_match_metrics() {
    let dir = TempDir::new("api-routes");
    let up = Consumer::start().unwrap();
    let store = dir.sqlite_url("r.db");
    let routes = route("orders", "/hooks/orders", &up.url(), "    lease: 30s\n")
        + &format!(
            "  - name: pointer\n    match:\n      host: hooks.example.com\n      path_prefix: /hooks/p\n    \
             upstream: \"{}/base\"\n    event_id:\n      json_pointer: /id\n    retention: 2d\n",
            up.url()
        )
        + &format!(
            "  - name: plain\n    match:\n      path_prefix: /plain\n    upstream: \"{}\"\n    guard_methods: []\n",
            up.url()
        );
    let px = start_with_token(&dir, &store, &routes);
    let (a, b) = (eid("a"), eid("b"));
    assert_eq!(px.deliver("/hooks/orders", Some(&a), b"{}").status, 200);
    assert_eq!(px.deliver("/hooks/orders", Some(&a), b"{}").status, 200);
    assert_eq!(px.deliver("/hooks/orders", Some(&a), b"other").status, 422);
    up.script(&b, vec![Reply::status(503)]);
    assert_eq!(px.deliver("/hooks/orders", Some(&b), b"{}").status, 503);
    assert_eq!(px.deliver("/hooks/orders", None, b"{}").status, 400);
    assert_eq!(px.deliver("/nowhere", Some(&a), b"{}").status, 404);
    assert_eq!(px.deliver("/plain/x", None, b"{}").status, 200);

    let doc = get_json(&px, "/api/routes");
    let metrics = px.metrics();
    let routes = doc["routes"].as_array().unwrap();
    let names: Vec<&str> = routes.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["orders", "pointer", "plain"], "in config order");

    let orders = &routes[0];
    assert_eq!(
        orders["match"],
        serde_json::json!({"host": null, "path_prefix": "/hooks/orders"})
    );
    assert_eq!(orders["upstream"], up.url());
    assert_eq!(
        orders["event_id"],
        serde_json::json!({"header": "x-event-id"})
    );
    assert_eq!(orders["guard_methods"], serde_json::json!(["POST"]));
    assert_eq!(orders["provider"], serde_json::Value::Null);
    assert_eq!(orders["verify"], serde_json::Value::Null);
    assert_eq!(
        (orders["lease"].as_str(), orders["retention"].as_str()),
        (Some("30s"), Some("7d"))
    );
    let pointer = &routes[1];
    assert_eq!(pointer["match"]["host"], "hooks.example.com");
    assert_eq!(pointer["upstream"], format!("{}/base", up.url()));
    assert_eq!(
        pointer["event_id"],
        serde_json::json!({"json_pointer": "/id"})
    );
    assert_eq!(
        (pointer["lease"].as_str(), pointer["retention"].as_str()),
        (Some("10s"), Some("2d"))
    );
    assert_eq!(
        routes[2]["event_id"],
        serde_json::Value::Null,
        "pass-through"
    );

    let checked = counters_match_metrics(&doc, routes, &metrics);
    assert!(checked >= 7, "{checked} samples compared");
    assert_eq!(orders["counters"]["requests"]["forwarded"], 2);
    assert_eq!(orders["counters"]["requests"]["replayed"], 1);
    assert_eq!(orders["counters"]["requests"]["digest_mismatch"], 1);
    assert_eq!(orders["counters"]["requests"]["missing_id"], 1);
    assert_eq!(orders["counters"]["upstream_responses"]["5xx"], 1);
    assert_eq!(doc["unrouted"]["requests"]["no_route"], 1);
    assert_eq!(routes[2]["counters"]["requests"]["unguarded"], 1);
    for r in routes {
        let age = r["counters"]["processing_oldest_age_seconds"]
            .as_f64()
            .unwrap();
        let scraped = px.metric(&format!(
            "idemgate_processing_oldest_age_seconds{{route=\"{}\"}}",
            r["name"].as_str().unwrap()
        ));
        assert_eq!(age, scraped);
    }
    // store latency: the same histogram as /metrics
    let claim = &doc["store"]["duration_seconds"]["claim"];
    assert_eq!(
        claim["count"].as_f64(),
        Some(px.metric("idemgate_store_duration_seconds_count{operation=\"claim\"}"))
    );
    assert!(claim["buckets"].as_array().unwrap().len() >= 10);
    refuses(&px, "GET", "/api/routes?x=1", 400, "invalid-query");
    refuses(&px, "POST", "/api/routes", 405, "method-not-allowed");
}

// ---- GET /api/events -----------------------------------------------------------

fn list_pages_and_filters(b: TestStore) {
    let up = Consumer::start().unwrap();
    let routes = route("r", "/hooks/r", &up.url(), "") + &route("s", "/hooks/s", &up.url(), "");
    let px = start_with_token(&b.dir, &b.url, &routes);
    let tag = eid("pg");
    let mut ids = Vec::new();
    for i in 0..7 {
        let id = format!("{tag}/{i}");
        let path = if i % 2 == 0 { "/hooks/r" } else { "/hooks/s" };
        if i == 3 {
            up.script(&id, vec![Reply::status(500)]);
        }
        px.deliver(path, Some(&id), b"{}");
        ids.push(id);
    }
    let cli_all = cli_list(&b.url, &[]);
    assert_eq!(cli_all.len(), 7);

    // pages of 3 add up to the CLI's list, while new deliveries arrive
    let mut pages = Vec::new();
    let mut next: Option<String> = None;
    for n in 0.. {
        assert!(n < 10, "paging does not end");
        let path = match &next {
            None => "/api/events?limit=3".to_string(),
            Some(c) => format!("/api/events?limit=3&before={c}"),
        };
        let page = get_json(&px, &path);
        let events = page["events"].as_array().unwrap().clone();
        assert!(events.len() <= 3);
        pages.push(events.len());
        next = page["next"].as_str().map(str::to_owned);
        px.deliver("/hooks/r", Some(&format!("{tag}/late{n}")), b"{}");
        for e in &events {
            cli_all_contains(&cli_all, e);
            let id = e["event_id"].as_str().unwrap();
            assert!(
                ids.iter().any(|x| x == id),
                "{id}: listed twice, or a delivery that arrived after the first page"
            );
            ids.retain(|x| x != id);
        }
        if next.is_none() {
            break;
        }
    }
    assert_eq!(
        pages,
        [3, 3, 1],
        "three pages, the last without a next cursor"
    );
    assert!(ids.is_empty(), "every record listed once: {ids:?} left");

    // filters, as the CLI's
    let api = |q: &str| {
        get_json(&px, &format!("/api/events?{q}"))["events"]
            .as_array()
            .unwrap()
            .clone()
    };
    let mine = |v: Vec<serde_json::Value>| -> Vec<serde_json::Value> {
        v.into_iter()
            .filter(|e| e["event_id"].as_str().unwrap().starts_with(&tag))
            .collect()
    };
    assert_eq!(
        mine(api("route=s")),
        mine(cli_list(&b.url, &["--route", "s"]))
    );
    assert_eq!(
        mine(api("state=failed")),
        mine(cli_list(&b.url, &["--state", "failed"]))
    );
    let failed = mine(api("state=failed"));
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["event_id"], format!("{tag}/3"));
    assert_eq!(failed[0]["last_status"], 500);
    let by_prefix = api(&format!("prefix={}", enc(&format!("{tag}/late"))));
    assert_eq!(by_prefix.len(), 3, "{by_prefix:?}");
    assert!(by_prefix
        .iter()
        .all(|e| e["event_id"].as_str().unwrap().contains("/late")));
    assert_eq!(api("prefix=%25%25nothing").len(), 0);
    assert_eq!(api("route=s&state=delivered&limit=1").len(), 1);

    // stuck: a processing record whose lease ended (its process died)
    let stuck_id = format!("{tag}/stuck");
    stuck_claim(&b.url, "r", &stuck_id, 60_000, 10_000);
    let stuck = api("stuck=true");
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    assert_eq!(stuck[0]["event_id"], stuck_id.as_str());
    assert_eq!(stuck[0]["state"], "processing");
    assert_eq!(api("stuck=true&state=processing").len(), 1);
    assert_eq!(api("stuck=true&route=s").len(), 0);
    assert_eq!(api("stuck=false").len(), 11);

    for (q, name) in [
        ("state=bogus", "invalid-query"),
        ("limit=0", "invalid-query"),
        ("limit=501", "invalid-query"),
        ("limit=ten", "invalid-query"),
        ("route=Not%20A%20Route", "invalid-query"),
        ("stuck=yes", "invalid-query"),
        ("stuck=true&state=failed", "invalid-query"),
        ("state=failed&state=delivered", "invalid-query"),
        ("id=x", "invalid-query"),
        ("prefix=%zz", "invalid-query"),
        ("before=garbage", "invalid-cursor"),
        ("before=eyJhIjoxfQ", "invalid-cursor"), // base64 of {"a":1}: JSON, not a key
    ] {
        let r = call(&px, "GET", &format!("/api/events?{q}"), &[]);
        refused(&r, 400, name);
    }
    refuses(&px, "DELETE", "/api/events", 405, "method-not-allowed");
}

fn cli_all_contains(cli_all: &[serde_json::Value], e: &serde_json::Value) {
    assert!(
        cli_all.contains(e),
        "the API's record is the CLI's, field for field: {e}"
    );
}

on_both_stores!(list_pages_and_filters("api-list"): sqlite_list_pages_and_filters, postgres_list_pages_and_filters);

// ---- GET /api/events/{route}/{event_id} ------------------------------------------

fn show_with_encoded_segments(b: TestStore) {
    let up = Consumer::start().unwrap();
    let px = start_with_token(&b.dir, &b.url, &route("r", "/hooks/r", &up.url(), ""));
    let tag = eid("show");
    for id in [
        format!("{tag}/with/slashes"),
        format!("{tag}%2Fliteral-percent"),
        format!("{tag}+plus&amp=1?q#frag"),
        format!("{tag}<img/src/onerror=alert(1)>\"'"),
    ] {
        assert_eq!(px.deliver("/hooks/r", Some(&id), b"{}").status, 200, "{id}");
        let doc = get_json(&px, &format!("/api/events/r/{}", enc(&id)));
        assert_eq!(
            doc,
            show(&b.url, "r", &id),
            "{id}: the document of events show --json"
        );
        assert_eq!(doc["event_id"], id.as_str());
        assert_eq!(doc["state"], "delivered");
        assert!(doc.get("body").is_none() && doc.get("payload").is_none());
    }
    // absent: 404 with the event ID
    let absent = format!("{tag}/absent");
    let r = call(&px, "GET", &format!("/api/events/r/{}", enc(&absent)), &[]);
    assert_eq!(refused(&r, 404, "not-found")["event_id"], absent.as_str());
    // a `/` not encoded is a separator: no such endpoint, and the detail says %2F
    let r = call(
        &px,
        "GET",
        &format!("/api/events/r/{tag}/with/slashes"),
        &[],
    );
    let doc = refused(&r, 404, "no-endpoint");
    assert!(doc["detail"].as_str().unwrap().contains("%2F"));
    refuses(&px, "GET", "/api/events/r/a%zz", 400, "invalid-path");
    refuses(&px, "GET", "/api/events/r/a%00b", 400, "invalid-path");
    refuses(&px, "GET", "/api/events/r/%FF", 400, "invalid-path");
    refuses(&px, "GET", "/api/events/r/", 404, "no-endpoint");
    refuses(&px, "GET", "/api/nothing", 404, "no-endpoint");
    refuses(&px, "GET", "/api", 404, "no-endpoint");
    refuses(&px, "POST", "/api/events/r/x", 405, "method-not-allowed");
    refuses(
        &px,
        "GET",
        "/api/events/r/x?force=true",
        400,
        "invalid-query",
    );
}

on_both_stores!(show_with_encoded_segments("api-show"): sqlite_show_with_encoded_segments, postgres_show_with_encoded_segments);

// ---- POST /api/events/{route}/{event_id}/release ----------------------------------

fn release_behind_the_token(b: TestStore) {
    let up = Consumer::start().unwrap();
    let px = start_with_token(&b.dir, &b.url, &route("r", "/hooks/r", &up.url(), ""));
    let id = format!("{}/with/slash", eid("rel"));
    assert_eq!(px.deliver("/hooks/r", Some(&id), b"{}").status, 200);
    let path = format!("/api/events/r/{}/release", enc(&id));
    let before = show(&b.url, "r", &id);

    // 401: missing, wrong, another scheme, two headers
    let wrong = format!("Bearer {TOKEN}x");
    let prefix = format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]);
    let right = format!("Bearer {TOKEN}");
    for headers in [
        vec![],
        vec![("Authorization", wrong.as_str())],
        vec![("Authorization", prefix.as_str())],
        vec![("Authorization", "Bearer")],
        vec![("Authorization", "Basic dGVzdDp0ZXN0")],
        vec![("Authorization", TOKEN)],
        vec![
            ("Authorization", right.as_str()),
            ("Authorization", wrong.as_str()),
        ],
    ] {
        for force in ["", "?force=true"] {
            let r = call(&px, "POST", &format!("{path}{force}"), &headers);
            refused(&r, 401, "unauthorized");
            assert!(r
                .header("www-authenticate")
                .is_some_and(|v| v.starts_with("Bearer")));
        }
    }
    assert_eq!(
        show(&b.url, "r", &id),
        before,
        "a refused action changed nothing"
    );

    // 409: delivered without force; the record stays delivered
    let r = release(&px, "r", &id, false);
    assert_eq!(refused(&r, 409, "delivered")["event_id"], id.as_str());
    assert_eq!(show(&b.url, "r", &id), before);
    assert_eq!(
        px.deliver("/hooks/r", Some(&id), b"{}")
            .header("Idempotent-Replayed"),
        Some("true")
    );

    // 404: absent (the token is right)
    let absent = release(&px, "r", &format!("{id}-absent"), true);
    refused(&absent, 404, "not-found");
    refused(&release(&px, "nope", &id, true), 404, "not-found");

    // 200 with force: the record after; the next delivery is forwarded
    let r = release(&px, "r", &id, true);
    assert_eq!(r.status, 200, "{}", r.text());
    let after = r.json();
    assert_eq!(
        after,
        show(&b.url, "r", &id),
        "the record after, as events show --json"
    );
    assert_eq!(after["state"], "failed");
    assert_eq!(after["lease_until"], serde_json::Value::Null);
    assert_eq!(after["last_error"], "released by operator");
    let again = px.deliver("/hooks/r", Some(&id), b"{}");
    assert_eq!(
        (again.status, again.header("Idempotency-Status")),
        (200, Some("forwarded"))
    );
    assert_eq!(up.count(&id), 2, "the consumer saw the redelivery");
    assert_eq!(show(&b.url, "r", &id)["attempts"], 2);

    // a failed record needs no force
    let failing = eid("failing");
    up.script(&failing, vec![Reply::status(500)]);
    assert_eq!(px.deliver("/hooks/r", Some(&failing), b"{}").status, 500);
    let r = release(&px, "r", &failing, false);
    assert_eq!(
        (r.status, r.json()["state"].as_str()),
        (200, Some("failed"))
    );

    refused(&call(&px, "GET", &path, &[]), 405, "method-not-allowed");
    for query in ["force=maybe", "forse=true"] {
        let auth = [("Authorization", right.as_str())];
        let r = call(&px, "POST", &format!("{path}?{query}"), &auth);
        refused(&r, 400, "invalid-query");
    }
    assert!(!px.log().contains(TOKEN), "the token is never logged");
}

on_both_stores!(release_behind_the_token("api-release"): sqlite_release_behind_the_token, postgres_release_behind_the_token);

/// Without `admin.token` every action is refused, whatever is sent.
#[test]
fn without_a_token_every_action_is_forbidden() {
    let h = Harness::guarded("api-notoken", "");
    let id = eid("nt");
    assert_eq!(h.deliver("/hooks/r", Some(&id), b"{}").status, 200);
    let bearer = format!("Bearer {TOKEN}");
    for headers in [
        vec![],
        vec![("Authorization", bearer.as_str())],
        vec![("Authorization", "Bearer ")],
    ] {
        for q in ["", "?force=true"] {
            let r = call(
                &h,
                "POST",
                &format!("/api/events/r/{}/release{q}", enc(&id)),
                &headers,
            );
            refused(&r, 403, "actions-disabled");
        }
    }
    assert_eq!(show(&h.store, "r", &id)["state"], "delivered");
    // reads stay open
    assert_eq!(
        get_json(&h, &format!("/api/events/r/{}", enc(&id)))["state"],
        "delivered"
    );
}

/// The token may come from a file, like a verify secret.
#[test]
fn a_file_token_works() {
    let dir = TempDir::new("api-filetoken");
    let up = Consumer::start().unwrap();
    let store = dir.sqlite_url("f.db");
    let file = dir.path().join("admin-token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let routes = route("r", "/hooks/r", &up.url(), "")
        + &format!("admin:\n  token: file:{}\n", file.display());
    let px = Proxy::start(&dir, &store, &routes);
    let id = eid("ft");
    up.script(&id, vec![Reply::status(500)]);
    px.deliver("/hooks/r", Some(&id), b"{}");
    assert_eq!(release(&px, "r", &id, false).status, 200);
}

/// A token that cannot be read stops `serve` and `check` with exit 2 and
/// one line naming the file, line and column.
#[test]
fn an_unreadable_token_is_a_config_error() {
    let dir = TempDir::new("api-badtoken");
    let path = dir.path().join("c.yaml");
    let text = config_text(
        1,
        2,
        &dir.sqlite_url("b.db"),
        &route("r", "/hooks/r", "http://127.0.0.1:9", ""),
    ) + "admin:\n  token: file:/nonexistent/idemgate-admin-token\n";
    std::fs::write(&path, &text).unwrap();
    let line = text.lines().position(|l| l.contains("token:")).unwrap() + 1;
    for cmd in ["check", "serve"] {
        let (code, _, err) = cli(&[cmd, "--config", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(
            err.contains(&format!(
                "c.yaml:{line}:10: admin.token: the admin token cannot be read"
            )),
            "{cmd}: {err}"
        );
    }
}

// ---- the listener's guards ---------------------------------------------------------

/// A page of another site that resolves its name to 127.0.0.1 (DNS
/// rebinding) reaches the loopback admin listener with its own `Host`: the
/// API and the console refuse it; `/metrics` and the probes are unchanged.
#[test]
fn only_loopback_host_names_reach_the_api_and_console() {
    let (_dir, _up, px) = one_route_with_token("api-host");
    let raw = |path: &str, host: &str| {
        let mut c = Client::connect(px.admin).unwrap();
        c.send_raw(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
            .unwrap();
        c.read_response(false).unwrap()
    };
    for path in ["/", "/console.js", "/api/routes", "/api/events"] {
        refused(&raw(path, "evil.example:80"), 421, "misdirected-request");
        refused(
            &raw(path, "localhost.evil.example"),
            421,
            "misdirected-request",
        );
        for ok in ["localhost", &px.admin.to_string(), "127.0.0.1", "[::1]:9"] {
            assert_eq!(raw(path, ok).status, 200, "{path} with Host {ok}");
        }
    }
    assert_eq!(raw("/metrics", "evil.example").status, 200);
    assert_eq!(raw("/healthz", "evil.example").status, 200);
}

#[test]
fn the_console_page_and_its_headers() {
    let (_dir, _up, px) = one_route_with_token("api-console");
    let page = call(&px, "GET", "/", &[]);
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let csp = page.header("content-security-policy").unwrap();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
    ] {
        assert!(csp.contains(directive), "{csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(page.header("cache-control"), Some("no-store"));
    assert!(page.header("set-cookie").is_none());
    let js = call(&px, "GET", "/console.js", &[]);
    assert_eq!(
        js.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert!(String::from_utf8_lossy(&js.body).contains("textContent"));
    assert_eq!(call(&px, "GET", "/console.css", &[]).status, 200);
    assert_eq!(call(&px, "GET", "/favicon.svg", &[]).status, 200);
    assert_eq!(call(&px, "GET", "/console.js.map", &[]).status, 404);
    // the JSON answers are no page either
    let api = call(&px, "GET", "/api/routes", &[]);
    assert!(api
        .header("content-security-policy")
        .is_some_and(|c| c.starts_with("default-src 'none'")));
    assert_eq!(api.header("x-content-type-options"), Some("nosniff"));
}

// ---- POST /api/events/{route}/{event_id}/resolve (SPEC §12) ------------------------

/// Every way `POST path` (a resolve) is refused: the token, the method,
/// the body, the query, the size.
fn resolve_refusals(px: &Proxy, path: &str) {
    // 401 without the token or with a wrong one; nothing changes
    let body = br#"{"as":"delivered"}"#;
    refused(&post(px, path, body, None), 401, "unauthorized");
    let wrong = format!("Bearer {TOKEN}x");
    refused(&post(px, path, body, Some(&wrong)), 401, "unauthorized");
    refused(&call(px, "GET", path, &[]), 405, "method-not-allowed");
    // 400: a body that is missing, not JSON or not what resolve takes
    for (bad, says) in [
        ("", "needs a JSON body"),
        ("{\"as\":", "not JSON"),
        ("as=delivered", "JSON object"),
        ("[\"delivered\"]", "JSON object"),
        ("{\"as\":\"maybe\"}", "unknown variant"),
        ("{\"as\":\"delivered\",\"status\":42}", "100 to 599"),
        (
            "{\"as\":\"delivered\",\"status\":\"200\"}",
            "not what this action takes",
        ),
        ("{\"as\":\"failed\",\"status\":200}", "delivered\" only"),
        ("{\"as\":\"failed\",\"force\":true}", "unknown field"),
    ] {
        let doc = refused(&act(px, path, bad), 400, "invalid-body");
        let detail = doc["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{bad:?}: {detail}");
    }
    refused(
        &act(px, &format!("{}?as=failed", path), r#"{"as":"delivered"}"#),
        400,
        "invalid-query",
    );
    // 413: more than 4 KiB, however valid
    let big = format!("{{\"as\":\"failed\",\"x\":\"{}\"}}", "a".repeat(5000));
    refused(&act(px, path, &big), 413, "body-too-large");
}

fn resolve_both_ways(b: TestStore) {
    let up = slow_once_consumer();
    let routes = held_route("r", "/hooks/r", &format!("http://{}", up.addr));
    let px = start_with_token(&b.dir, &b.url, &routes);
    let tag = eid("res");
    let (done, undone) = (format!("{tag}/slow-done"), format!("{tag}/slow-undone"));
    make_ambiguous(
        &px,
        &b.url,
        "r",
        "/hooks/r",
        &[done.clone(), undone.clone()],
    );
    let fine = format!("{tag}/fine");
    assert_eq!(px.deliver("/hooks/r", Some(&fine), b"{}").status, 200);
    let path = |id: &str| format!("/api/events/r/{}/resolve", enc(id));
    // the record as the API shows it: its attempt, and the route's count
    let doc = get_json(&px, &format!("/api/events/r/{}", enc(&done)));
    assert_eq!(doc, show(&b.url, "r", &done), "with its history");
    assert_eq!(doc["history"][0]["result"], "ambiguous", "{doc}");
    let r = &get_json(&px, "/api/routes")["routes"][0];
    assert_eq!(
        (r["on_ambiguous"].as_str(), r["ambiguous_records"].as_i64()),
        (Some("hold"), Some(2))
    );
    let before = show(&b.url, "r", &done);
    resolve_refusals(&px, &path(&done));
    assert_eq!(
        show(&b.url, "r", &done),
        before,
        "a refused action changed nothing"
    );

    // as delivered, with a status: the record after; later deliveries replay it
    let r = act(&px, &path(&done), r#"{"as": "delivered", "status": 202}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let after = r.json();
    assert_eq!(
        after,
        show(&b.url, "r", &done),
        "the record after, as events show --json"
    );
    assert_eq!(
        (after["state"].as_str(), after["last_status"].as_i64()),
        (Some("delivered"), Some(202))
    );
    let replay = px.deliver("/hooks/r", Some(&done), b"{}");
    assert_eq!(
        (replay.status, replay.header("Idempotent-Replayed")),
        (202, Some("true"))
    );
    assert_eq!(up.count(&done), 1, "the consumer acted once");
    // as failed: the next delivery is forwarded, attempt 2, same key
    let r = act(&px, &path(&undone), r#"{"as":"failed"}"#);
    assert_eq!(
        (r.status, r.json()["state"].as_str()),
        (200, Some("failed")),
        "{}",
        r.text()
    );
    let again = px.deliver("/hooks/r", Some(&undone), b"{}");
    assert_eq!(
        (again.status, again.header("Idempotency-Status")),
        (200, Some("forwarded"))
    );
    assert_eq!(up.count(&undone), 2);
    assert_eq!(show(&b.url, "r", &undone)["attempts"], 2);

    // 409: only an ambiguous record; 404: none
    for id in [&done, &undone, &fine] {
        let doc = refused(
            &act(&px, &path(id), r#"{"as":"failed"}"#),
            409,
            "not-ambiguous",
        );
        assert_eq!(doc["event_id"], id.as_str());
    }
    refused(
        &act(&px, &path(&format!("{tag}/absent")), r#"{"as":"failed"}"#),
        404,
        "not-found",
    );
    assert_eq!(show(&b.url, "r", &fine)["state"], "delivered");
    assert_eq!(
        get_json(&px, "/api/routes")["routes"][0]["ambiguous_records"],
        0
    );
    let log = px.log();
    assert!(
        log.contains("resolved by the admin API") && log.contains(&done),
        "logged"
    );
    assert!(!log.contains(TOKEN), "the token is never logged");
}

on_both_stores!(resolve_both_ways("api-resolve"): sqlite_resolve_both_ways, postgres_resolve_both_ways);

/// `…/release` takes an ambiguous record too (SPEC §12: as resolving it failed).
#[test]
fn release_takes_an_ambiguous_record() {
    let dir = TempDir::new("api-release-amb");
    let up = slow_once_consumer();
    let routes = held_route("r", "/hooks/r", &format!("http://{}", up.addr));
    let px = start_with_token(&dir, &dir.sqlite_url("a.db"), &routes);
    let id = eid("slow-rel");
    make_ambiguous(
        &px,
        &dir.sqlite_url("a.db"),
        "r",
        "/hooks/r",
        std::slice::from_ref(&id),
    );
    let r = release(&px, "r", &id, false);
    assert_eq!(
        (r.status, r.json()["state"].as_str()),
        (200, Some("failed")),
        "{}",
        r.text()
    );
    assert_eq!(px.deliver("/hooks/r", Some(&id), b"{}").status, 200);
    assert_eq!(up.count(&id), 2);
}

// ---- POST /api/events/release (SPEC §14) ---------------------------------------

/// Every way `POST /api/events/release` is refused: the token, the
/// method, the body (a delivered state among others), an unknown route.
fn bulk_refusals(px: &Proxy) {
    let bulk = |body: serde_json::Value| act(px, "/api/events/release", &body.to_string());
    // refusals: no token, a bad body, a delivered state, an unknown route
    let ok = br#"{"route":"r","state":"ambiguous"}"#;
    refused(
        &post(px, "/api/events/release", ok, None),
        401,
        "unauthorized",
    );
    refused(
        &call(px, "GET", "/api/events/release", &[]),
        405,
        "method-not-allowed",
    );
    for (bad, says) in [
        (
            serde_json::json!({"route": "r", "state": "delivered"}),
            "never released in bulk",
        ),
        (
            serde_json::json!({"route": "r", "state": "done"}),
            "expected failed, ambiguous or processing",
        ),
        (serde_json::json!({"route": "r"}), "missing field `state`"),
        (
            serde_json::json!({"route": "r", "state": "ambiguous", "dry_run": "yes"}),
            "not what",
        ),
        (
            serde_json::json!({"route": "r", "state": "ambiguous", "updated_after": "yesterday"}),
            "updated_after `yesterday`",
        ),
        (
            serde_json::json!({"route": "r", "state": "ambiguous", "updated_before": "2026-01-01T00:00:00+02:00"}),
            "RFC 3339",
        ),
        (
            serde_json::json!({"route": "r", "state": "ambiguous", "limit": 5}),
            "unknown field `limit`",
        ),
    ] {
        let doc = refused(&bulk(bad.clone()), 400, "invalid-body");
        assert!(
            doc["detail"].as_str().unwrap().contains(says),
            "{bad}: {doc}"
        );
    }
    refused(
        &bulk(serde_json::json!({"route": "nope", "state": "failed"})),
        404,
        "unknown-route",
    );
}

fn bulk_release(b: TestStore) {
    let up = slow_once_consumer();
    let upstream = format!("http://{}", up.addr);
    let routes = held_route("r", "/hooks/r", &upstream) + &held_route("s", "/hooks/s", &upstream);
    let px = start_with_token(&b.dir, &b.url, &routes);
    let tag = eid("bulk");
    let held: Vec<String> = (0..3).map(|i| format!("{tag}/slow-{i}")).collect();
    make_ambiguous(&px, &b.url, "r", "/hooks/r", &held);
    let other = format!("{tag}/slow-s");
    make_ambiguous(&px, &b.url, "s", "/hooks/s", std::slice::from_ref(&other));
    let fine = format!("{tag}/fine");
    assert_eq!(px.deliver("/hooks/r", Some(&fine), b"{}").status, 200);
    let bulk = |body: serde_json::Value| act(&px, "/api/events/release", &body.to_string());
    let count = |r: Response, key: &str| {
        assert_eq!(r.status, 200, "{}", r.text());
        let doc = r.json();
        assert_eq!(doc.as_object().unwrap().len(), 1, "{doc}");
        doc[key].as_u64().unwrap()
    };

    bulk_refusals(&px);
    for id in &held {
        assert_eq!(
            show(&b.url, "r", id)["state"],
            "ambiguous",
            "refusals changed nothing"
        );
    }

    // a dry run counts; a window that ended before them takes none
    let dry = serde_json::json!({"route": "r", "state": "ambiguous", "dry_run": true});
    assert_eq!(count(bulk(dry), "would_release"), 3);
    let old = serde_json::json!({"route": "r", "state": "ambiguous", "updated_before": "2020-01-01T00:00:00Z"});
    assert_eq!(count(bulk(old), "released"), 0);
    let later = serde_json::json!({"route": "r", "state": "ambiguous", "updated_after": "2999-01-01T00:00:00Z", "dry_run": true});
    assert_eq!(count(bulk(later), "would_release"), 0);
    for id in &held {
        assert_eq!(
            show(&b.url, "r", id)["state"],
            "ambiguous",
            "a dry run changed nothing"
        );
    }
    // the release: every ambiguous record of r in the window, nothing else
    let now = show(&b.url, "r", &held[2])["updated_at"]
        .as_str()
        .unwrap()
        .to_string();
    let window = serde_json::json!({
        "route": "r", "state": "ambiguous",
        "updated_after": "2020-01-01T00:00:00Z", "updated_before": "2999-01-01T00:00:00Z",
    });
    assert_eq!(count(bulk(window.clone()), "released"), 3);
    for id in &held {
        let rec = show(&b.url, "r", id);
        assert_eq!(
            (rec["state"].as_str(), rec["last_error"].as_str()),
            (Some("failed"), Some("released by operator"))
        );
        assert!(rec["updated_at"].as_str().unwrap() >= now.as_str());
    }
    assert_eq!(count(bulk(window), "released"), 0, "nothing left to take");
    assert_eq!(
        show(&b.url, "s", &other)["state"],
        "ambiguous",
        "another route's record stays"
    );
    assert_eq!(
        show(&b.url, "r", &fine)["state"],
        "delivered",
        "never a delivered record"
    );
    // failed records are released again as failed (the count says so), never the delivered one
    assert_eq!(
        count(
            bulk(serde_json::json!({"route": "r", "state": "failed"})),
            "released"
        ),
        3
    );
    assert_eq!(show(&b.url, "r", &fine)["state"], "delivered");
    // and the next delivery of each is forwarded
    assert_eq!(px.deliver("/hooks/r", Some(&held[0]), b"{}").status, 200);
    assert_eq!(up.count(&held[0]), 2);
    assert!(px.log().contains("bulk release by the admin API"));
}

on_both_stores!(bulk_release("api-bulk"): sqlite_bulk_release, postgres_bulk_release);

// ---- POST /api/routes/{name}/pause|resume (SPEC §14) -------------------------------

/// Every way a pause is refused: the token, the method, an unknown route,
/// a body, a query, another verb.
fn pause_refusals(px: &Proxy) {
    refused(
        &post(px, "/api/routes/r/pause", b"", None),
        401,
        "unauthorized",
    );
    refused(
        &call(px, "GET", "/api/routes/r/pause", &[]),
        405,
        "method-not-allowed",
    );
    refused(&act(px, "/api/routes/nope/pause", ""), 404, "unknown-route");
    refused(&act(px, "/api/routes/r/pause", "{}"), 400, "invalid-body");
    refused(
        &act(px, "/api/routes/r/pause?for=1h", ""),
        400,
        "invalid-query",
    );
    refused(&act(px, "/api/routes/r/halt", ""), 404, "no-endpoint");
}

fn pause_and_resume(b: TestStore) {
    let up = Consumer::start().unwrap();
    let routes = route("r", "/hooks/r", &up.url(), "") + &route("s", "/hooks/s", &up.url(), "");
    let px = start_with_token(&b.dir, &b.url, &routes);
    let done = eid("done");
    assert_eq!(px.deliver("/hooks/r", Some(&done), b"{}").status, 200);
    let state = |name: &str| {
        let doc = get_json(&px, "/api/routes");
        let r = doc["routes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap()
            .clone();
        (r["paused"].clone(), r["paused_at"].clone())
    };
    assert_eq!(
        state("r"),
        (serde_json::json!(false), serde_json::Value::Null)
    );

    pause_refusals(&px);
    assert_eq!(state("r").0, false, "refusals paused nothing");

    let r = act(&px, "/api/routes/r/pause", "");
    assert_eq!(r.status, 200, "{}", r.text());
    let doc = r.json();
    assert_eq!(
        (doc["name"].as_str(), doc["paused"].as_bool()),
        (Some("r"), Some(true)),
        "{doc}"
    );
    let since = doc["paused_at"].as_str().unwrap().to_string();
    let paused = std::time::Instant::now();
    // pausing again keeps the first time
    assert_eq!(
        act(&px, "/api/routes/r/pause", "").json()["paused_at"],
        since.as_str()
    );
    assert_eq!(
        state("r"),
        (serde_json::json!(true), serde_json::json!(since))
    );
    assert_eq!(
        state("s"),
        (serde_json::json!(false), serde_json::Value::Null)
    );

    // within 2 s the proxy refuses what it would forward; it still replays
    let tag = eid("new");
    let (refused_id, r) =
        within_two_seconds(paused, &px, "/hooks/r", |n| format!("{tag}-{n}"), 503);
    assert_eq!(
        r.json()["type"],
        "urn:idemgate:problem:route-paused",
        "{r:?}"
    );
    assert_eq!(r.header("retry-after"), Some("30"));
    assert_eq!(up.count(&refused_id), 0, "nothing forwarded");
    let (code, _, _) = cli(&[
        "events",
        "show",
        "--store",
        &b.url,
        "--route",
        "r",
        &refused_id,
    ]);
    assert_eq!(code, 3, "nothing claimed");
    let replay = px.deliver("/hooks/r", Some(&done), b"{}");
    assert_eq!(
        (replay.status, replay.header("Idempotent-Replayed")),
        (200, Some("true"))
    );
    // an unguarded request on the paused route: refused, counted once
    let (paused_before, unguarded_before) =
        (px.requests("r", "paused"), px.requests("r", "unguarded"));
    let get = px.client().request("GET", "/hooks/r", &[], b"").unwrap();
    assert_eq!(get.status, 503, "{get:?}");
    std::thread::sleep(std::time::Duration::from_millis(200)); // past its logging hook
    assert_eq!(px.requests("r", "paused"), paused_before + 1.0);
    assert_eq!(
        px.requests("r", "unguarded"),
        unguarded_before,
        "not once more as unguarded"
    );
    assert_eq!(
        px.deliver("/hooks/s", Some(&eid("other")), b"{}").status,
        200,
        "another route flows"
    );
    let (code, out, _) = cli(&["routes", "list", "--store", &b.url]);
    assert_eq!(code, 0);
    assert!(out.contains("r  paused since"), "{out}");

    // resume: within 2 s the refused event goes through
    let r = act(&px, "/api/routes/r/resume", "");
    let resumed = std::time::Instant::now();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        serde_json::json!({"name": "r", "paused": false, "paused_at": null})
    );
    assert_eq!(
        state("r"),
        (serde_json::json!(false), serde_json::Value::Null)
    );
    within_two_seconds(resumed, &px, "/hooks/r", |_| refused_id.clone(), 200);
    assert_eq!(up.count(&refused_id), 1);
    let log = px.log();
    assert!(
        log.contains("route paused by the admin API")
            && log.contains("route resumed by the admin API"),
        "{log}"
    );
}

on_both_stores!(pause_and_resume("api-pause"): sqlite_pause_and_resume, postgres_pause_and_resume);

// ---- an action's body, as an attacker sends it --------------------------------------

/// Sends `bytes` on a fresh admin connection; what came back until the
/// peer closed (or `wait` passed), and whether it closed.
fn raw_admin(px: &Proxy, bytes: &[u8], wait: std::time::Duration) -> (Vec<u8>, bool) {
    crate::raw_upstream::send_and_read_to_close(px.admin, bytes, wait)
}

#[test]
fn an_action_body_is_bounded_in_size() {
    use std::time::{Duration, Instant};
    let (dir, _up, px) = one_route_with_token("api-body");
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let head = |extra: &str| {
        format!("POST /api/routes/r/pause HTTP/1.1\r\nHost: localhost\r\n{auth}{extra}\r\n")
    };
    let status = |bytes: &[u8]| crate::raw_upstream::status_of(bytes);

    // a huge declared length: refused before a byte of it is read, and closed
    let t = Instant::now();
    let (out, closed) = raw_admin(
        &px,
        head("Content-Length: 1000000000000\r\n").as_bytes(),
        Duration::from_secs(5),
    );
    assert_eq!(
        (status(&out), closed),
        (Some(413), true),
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(String::from_utf8_lossy(&out).contains("application/problem+json"));
    // a chunked body that grows past 4 KiB: 413 once it does, and closed
    let mut chunked = head("Transfer-Encoding: chunked\r\n").into_bytes();
    for _ in 0..3 {
        chunked.extend_from_slice(format!("800\r\n{}\r\n", "a".repeat(0x800)).as_bytes());
    }
    let (out, closed) = raw_admin(&px, &chunked, Duration::from_secs(5));
    assert_eq!(
        (status(&out), closed),
        (Some(413), true),
        "{}",
        String::from_utf8_lossy(&out)
    );
    // a small chunked body is read (and the connection closed after the answer)
    let mut small = format!(
        "POST /api/events/r/x/resolve HTTP/1.1\r\nHost: localhost\r\n{auth}Transfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    small.extend_from_slice(b"E\r\n{\"as\":\"failed\"\r\n1\r\n}\r\n0\r\n\r\n");
    let (out, closed) = raw_admin(&px, &small, Duration::from_secs(5));
    assert_eq!(
        (status(&out), closed),
        (Some(404), true),
        "read whole: {}",
        String::from_utf8_lossy(&out)
    );
    // a body on a path that reads none is left unread, and the connection closed
    let (out, closed) = raw_admin(
        &px,
        b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000000\r\n\r\nxx",
        Duration::from_secs(5),
    );
    assert_eq!((status(&out), closed), (Some(200), true));
    assert_eq!(
        get_json(&px, "/api/routes")["routes"][0]["paused"],
        false,
        "nothing refused was done"
    );
    drop(dir);
}

#[test]
fn an_action_body_is_bounded_in_time_and_framing() {
    use std::io::Write;
    use std::time::{Duration, Instant};
    let (dir, _up, px) = one_route_with_token("api-body-time");
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let head = |extra: &str| {
        format!("POST /api/routes/r/pause HTTP/1.1\r\nHost: localhost\r\n{auth}{extra}\r\n")
    };
    let status = |bytes: &[u8]| crate::raw_upstream::status_of(bytes);

    // a body that trickles in: 408 after 5 s in all, and closed
    let mut c = Client::connect(px.admin).unwrap();
    let t = Instant::now();
    c.send_raw(format!("{}{{\"a\"", head("Content-Length: 100\r\n")).as_bytes())
        .unwrap();
    let mut w = c.writer().unwrap();
    // a byte every 200 ms, each well within any per-read timeout, until
    // shortly before the deadline (so that nothing is left unread at the close)
    let trickle = std::thread::spawn(move || {
        for _ in 0..22 {
            std::thread::sleep(Duration::from_millis(200));
            if w.write_all(b" ").is_err() {
                break;
            }
        }
    });
    let r = c.read_response(false).unwrap();
    let took = t.elapsed();
    refused(&r, 408, "invalid-body");
    assert!(
        took >= Duration::from_millis(4500) && took < Duration::from_secs(8),
        "{took:?}"
    );
    trickle.join().unwrap();
    // a body cut short (the client closes its side): 400, nothing is done
    let mut s = std::net::TcpStream::connect(px.admin).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(format!("{}{{", head("Content-Length: 50\r\n")).as_bytes())
        .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut out = Vec::new();
    let _ = std::io::Read::read_to_end(&mut s, &mut out);
    assert_eq!(status(&out), Some(400), "{}", String::from_utf8_lossy(&out));
    assert!(String::from_utf8_lossy(&out).contains("could not be read"));

    // Expect: 100-continue is answered, then the body read
    let mut c = Client::connect(px.admin).unwrap();
    c.send_raw(head("Content-Length: 0\r\nExpect: 100-continue\r\n").as_bytes())
        .unwrap();
    assert_eq!(c.read_response(false).unwrap().status, 200);
    let mut c = Client::connect(px.admin).unwrap();
    let body = r#"{"as":"failed"}"#;
    let req = format!(
        "POST /api/events/r/x/resolve HTTP/1.1\r\nHost: localhost\r\n{auth}Content-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    );
    c.send_raw(req.as_bytes()).unwrap();
    let (interim, _) = c.head().unwrap();
    assert_eq!(interim, 100);
    c.send_raw(body.as_bytes()).unwrap();
    refused(&c.read_response(false).unwrap(), 404, "not-found");

    assert_eq!(get_json(&px, "/api/routes")["routes"][0]["paused"], true);
    drop(dir);
}

/// A body read whole keeps the connection for the next request.
#[test]
fn an_action_body_read_whole_keeps_the_connection() {
    let (_dir, _up, px) = one_route_with_token("api-body-keep");
    let body = r#"{"as":"failed"}"#;
    let mut c = Client::connect(px.admin).unwrap();
    let bearer = format!("Bearer {TOKEN}");
    for _ in 0..3 {
        let r = c
            .request(
                "POST",
                "/api/routes/r/resume",
                &[("Authorization", &bearer)],
                b"",
            )
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let r = c
            .request(
                "POST",
                "/api/events/r/x/resolve",
                &[("Authorization", &bearer)],
                body.as_bytes(),
            )
            .unwrap();
        refused(&r, 404, "not-found");
    }
}

/// Without `admin.token` the new actions are refused too.
#[test]
fn without_a_token_the_new_actions_are_forbidden() {
    let h = Harness::guarded("api-notoken-new", "");
    let bearer = format!("Bearer {TOKEN}");
    for (path, body) in [
        ("/api/events/r/x/resolve", r#"{"as":"failed"}"#),
        ("/api/events/release", r#"{"route":"r","state":"failed"}"#),
        ("/api/routes/r/pause", ""),
        ("/api/routes/r/resume", ""),
    ] {
        for auth in [None, Some(bearer.as_str())] {
            refused(
                &post(&h, path, body.as_bytes(), auth),
                403,
                "actions-disabled",
            );
        }
    }
    let doc = get_json(&h, "/api/routes");
    assert_eq!(doc["routes"][0]["paused"], false);
    assert_eq!(doc["routes"][0]["on_ambiguous"], "release");
    assert_eq!(doc["routes"][0]["ambiguous_records"], 0);
}
