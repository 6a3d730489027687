//! Reconciliation with the consumer (SPEC §21), against the real process
//! and one scripted consumer on loopback that takes the webhooks (the
//! first delivery of a `slow` event answers past `upstream_timeout`, having
//! acted: the record turns ambiguous under `hold`) and answers the
//! questions (`GET /check/{id}`) as the event ID says: `said-undone` 404,
//! `said-err` 500, `said-hang` after 5 s, anything else 200.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::admin_util::{act, TOKEN};
use crate::common::*;
use crate::raw_upstream::{response, upstream, Behavior, Server};

/// The token the questions carry (`headers: {authorization: env:…}`).
const ASK_TOKEN: &str = "Bearer reconcile-secret";

/// The consumer: see the module doc.
fn consumer() -> Server {
    let posts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    upstream(move |req, _| {
        if req.method == "GET" {
            let id = req.path.strip_prefix("/check/").unwrap_or_default();
            return if id.contains("said-undone") {
                Behavior::Respond(response(404, b"no"))
            } else if id.contains("said-err") {
                Behavior::Respond(response(500, b"oops"))
            } else if id.contains("said-hang") {
                Behavior::Late(Duration::from_secs(5), response(200, b"late"))
            } else {
                Behavior::Respond(response(200, b"yes"))
            };
        }
        let key = req.key().unwrap_or_default().to_string();
        let mut posts = posts.lock().unwrap();
        let n = posts.entry(key.clone()).or_default();
        *n += 1;
        if key.contains("slow") && *n == 1 {
            Behavior::Late(Duration::from_secs(2), response(200, b"acted"))
        } else {
            Behavior::Respond(response(200, b"acted"))
        }
    })
}

/// The route `name` on `path` to `upstream`, under `on_ambiguous: hold`
/// with `lease` (and a 1 s `upstream_timeout`, so that a late answer turns
/// it ambiguous), whose `reconcile` block is `ask` (its lines, indented).
pub(crate) fn asking_route(
    name: &str,
    path: &str,
    upstream: &str,
    lease: &str,
    ask: &str,
) -> String {
    let held = format!(
        "    upstream_timeout: 1s\n    lease: {lease}\n    on_ambiguous: hold\n    reconcile:\n{ask}"
    );
    route(name, path, upstream, &held)
}

/// The route `r` on `/r`, held, asking `ask_url` every `every`.
fn held_route(upstream: &str, ask_url: &str, every: &str) -> String {
    let ask = format!(
        "      url: \"{ask_url}\"\n      headers: {{authorization: env:ASK_TOKEN}}\n      \
         timeout: 1s\n      every: {every}\n"
    );
    asking_route("r", "/r", upstream, "4s", &ask)
}

/// A proxy (with the admin token) on `ts`.
fn start_on(ts: &TestStore, up: &Server, every: &str) -> Proxy {
    let routes = held_route(
        &format!("http://{}", up.addr),
        &format!("http://{}/check/{{id}}", up.addr),
        every,
    ) + "admin:\n  token: env:IDEMGATE_ADMIN_TOKEN\n";
    let env = [("ASK_TOKEN", ASK_TOKEN), ("IDEMGATE_ADMIN_TOKEN", TOKEN)];
    Proxy::start_with_env(&ts.dir, &ts.url, &routes, &env)
}

/// The [`consumer`], and a proxy [`start_on`] a fresh SQLite store.
pub(crate) fn start(tag: &str, every: &str) -> (Server, TestStore, Proxy) {
    let up = consumer();
    let ts = TestStore::sqlite(tag);
    let px = start_on(&ts, &up, every);
    (up, ts, px)
}

/// Delivers `id` once, past the timeout: the record is ambiguous.
pub(crate) fn make_ambiguous(px: &Proxy, store: &str, id: &str) {
    let r = px.deliver("/r", Some(id), b"{\"a\":1}");
    assert_eq!(r.status, 504, "{r:?}");
    assert_state(store, "r", id, "ambiguous", 1);
}

/// The questions the consumer got about `id`.
fn questions(up: &Server, id: &str) -> Vec<testkit::Request> {
    (up.received().into_iter())
        .filter(|r| r.method == "GET" && r.path.contains(id))
        .collect()
}

/// `idemgate_reconciliations_total` of route `r` with `result`.
fn reconciliations(px: &Proxy, result: &str) -> f64 {
    px.metric(&format!(
        "idemgate_reconciliations_total{{result=\"{result}\",route=\"r\"}}"
    ))
}

fn history(store: &str, id: &str) -> Vec<serde_json::Value> {
    show(store, "r", id)["history"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Found done: the retry is replayed (the consumer acted once), the record
/// is delivered with `delivered_status`, the question is in its history.
#[test]
fn found_done_the_retry_is_replayed() {
    let (up, ts, px) = start("rec-done", "1h");
    let store = ts.url.clone();
    let zero = "idemgate_reconciliations_total{result=\"unknown\",route=\"r\"} 0";
    assert!(px.metrics().contains(zero), "at zero from the start");
    let id = eid("slow");
    make_ambiguous(&px, &store, &id);
    let retry = px.deliver("/r", Some(&id), b"{\"a\":1}");
    assert_eq!(retry.status, 200, "{retry:?}");
    assert_eq!(
        retry.header("idempotency-status"),
        Some("replayed"),
        "{retry:?}"
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(up.count(&id), 1, "the consumer acted once");
    let rec = show(&store, "r", &id);
    assert_eq!(
        (rec["state"].as_str(), rec["last_status"].as_i64()),
        (Some("delivered"), Some(200)),
        "{rec}"
    );
    assert_eq!(rec["attempts"], 1, "a question is no attempt: {rec}");
    let h = history(&store, &id);
    assert_eq!(h.len(), 2, "{h:?}");
    assert_eq!(
        (h[1]["attempt"].as_i64(), h[1]["result"].as_str()),
        (Some(1), Some("reconciled")),
        "{h:?}"
    );
    assert_eq!(h[1]["status"], 200, "{h:?}");
    assert_eq!(h[1]["error"], "done: the consumer answered 200", "{h:?}");
    let asked = questions(&up, &id);
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].header("authorization"), Some(ASK_TOKEN));
    assert_eq!(reconciliations(&px, "delivered"), 1.0);
}

/// Found not done: the retry is forwarded as attempt 2 with the same key.
#[test]
fn found_not_done_the_retry_is_forwarded_as_attempt_2() {
    let (up, ts, px) = start("rec-undone", "1h");
    let store = ts.url.clone();
    let id = eid("slow-said-undone");
    make_ambiguous(&px, &store, &id);
    let retry = px.deliver("/r", Some(&id), b"{\"a\":1}");
    assert_eq!(retry.status, 200, "{retry:?}");
    assert_eq!(retry.body, b"acted");
    assert_state(&store, "r", &id, "delivered", 2);
    let h = history(&store, &id);
    let results: Vec<&str> = h
        .iter()
        .map(|a| a["result"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(results, ["ambiguous", "reconciled", "delivered"], "{h:?}");
    assert_eq!(
        h[1]["error"], "not done: the consumer answered 404",
        "{h:?}"
    );
    assert_eq!(up.count(&id), 2, "forwarded again");
    assert_eq!(reconciliations(&px, "failed"), 1.0);
}

/// Another status, no answer within `timeout`, a refused connection: the
/// record stays ambiguous, the retry gets the 409 of SPEC §12 (within
/// `timeout` and a little), each question recorded as reconcile_unknown.
#[test]
fn unknown_answers_leave_it_ambiguous() {
    let (up, ts, px) = start("rec-unknown", "1h");
    let store = ts.url.clone();
    for (tag, said) in [
        ("slow-said-err", "unknown: the consumer answered 500"),
        ("slow-said-hang", "unknown: no answer within 1s"),
    ] {
        let id = eid(tag);
        make_ambiguous(&px, &store, &id);
        let t = Instant::now();
        let retry = px.deliver("/r", Some(&id), b"{\"a\":1}");
        let took = t.elapsed();
        eprintln!("{tag}: the delivery's own question answered in {took:?} (timeout 1s)");
        assert_eq!(retry.status, 409, "{tag}: {retry:?}");
        assert_eq!(retry.header("retry-after"), Some("60"));
        assert!(took < Duration::from_millis(1600), "{tag}: {took:?}");
        assert_state(&store, "r", &id, "ambiguous", 1);
        let h = history(&store, &id);
        assert_eq!(h.last().unwrap()["result"], "reconcile_unknown", "{h:?}");
        assert_eq!(h.last().unwrap()["error"], said, "{h:?}");
    }
    assert_eq!(reconciliations(&px, "unknown"), 2.0);
    drop(px);

    // a consumer that does not listen
    let dir = TempDir::new("rec-refused");
    let closed = free_port();
    let routes = held_route(
        &format!("http://{}", up.addr),
        &format!("http://127.0.0.1:{closed}/check/{{id}}"),
        "1h",
    );
    let store = dir.sqlite_url("r.db");
    let px = Proxy::start_with_env(&dir, &store, &routes, &[("ASK_TOKEN", ASK_TOKEN)]);
    let id = eid("slow");
    make_ambiguous(&px, &store, &id);
    let retry = px.deliver("/r", Some(&id), b"{\"a\":1}");
    assert_eq!(retry.status, 409, "{retry:?}");
    let h = history(&store, &id);
    assert_eq!(
        h.last().unwrap()["error"],
        "unknown: the consumer could not be reached",
        "{h:?}"
    );
    assert!(!h.last().unwrap()["error"]
        .as_str()
        .unwrap()
        .contains("127.0.0.1"));
}

/// The background asks without any delivery, every `every`.
#[test]
fn the_background_resolves_without_a_delivery() {
    let (up, ts, px) = start("rec-background", "1s");
    let store = ts.url.clone();
    let (done, undone, unknown) = (eid("slow"), eid("slow-said-undone"), eid("slow-said-err"));
    for id in [&done, &undone, &unknown] {
        make_ambiguous(&px, &store, id);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let states: Vec<String> = [&done, &undone]
            .iter()
            .map(|id| {
                show(&store, "r", id)["state"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        if states == ["delivered", "failed"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not resolved in time: {states:?}\n{}",
            px.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    while questions(&up, &unknown).is_empty() {
        assert!(Instant::now() < deadline, "never asked about {unknown}");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_state(&store, "r", &unknown, "ambiguous", 1);
    // the next delivery of the one found not done is forwarded
    assert_eq!(px.deliver("/r", Some(&undone), b"{\"a\":1}").status, 200);
    assert_state(&store, "r", &undone, "delivered", 2);
}

/// Two processes on one store ask at most once per record per `every`.
fn two_processes(ts: TestStore) {
    let up = consumer();
    let px = start_on(&ts, &up, "1s");
    let other = start_on(&ts, &up, "1s");
    let id = eid("slow-said-err");
    make_ambiguous(&px, &ts.url, &id);
    let since = Instant::now();
    std::thread::sleep(Duration::from_millis(5500));
    let window = since.elapsed().as_secs_f64();
    let asked = questions(&up, &id).len();
    // at most one per second since it turned ambiguous, and it was asked
    assert!(
        asked as f64 <= window.floor() + 1.0,
        "{asked} questions in {window:.1}s"
    );
    assert!(asked >= 3, "{asked} questions in {window:.1}s");
    drop((other, px));
}

on_both_stores!(two_processes("rec-two"): two_processes_ask_at_most_once_per_every_sqlite, two_processes_ask_at_most_once_per_every_postgres);

/// `events reconcile` and the API ask now and say what they learned.
#[test]
fn the_cli_and_the_api() {
    let (_up, ts, px) = start("rec-cli", "1h");
    let store = ts.url.clone();
    let (a, b, c) = (eid("slow"), eid("slow-said-undone"), eid("slow-said-err"));
    for id in [&a, &b, &c] {
        make_ambiguous(&px, &store, id);
    }
    let config = px.config_path.display().to_string();
    let env = [("ASK_TOKEN", ASK_TOKEN), ("IDEMGATE_ADMIN_TOKEN", TOKEN)];
    // `events reconcile` on route r, and `more`
    let reconcile = |more: &[&str]| {
        let mut args = vec![
            "events",
            "reconcile",
            "--store",
            store.as_str(),
            "--config",
            config.as_str(),
            "--route",
            "r",
        ];
        args.extend(more);
        cli_env(&args, &env)
    };
    let (code, out, err) = reconcile(&[&a]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("{a}: delivered")), "{out}");
    assert_state(&store, "r", &a, "delivered", 1);
    // every ambiguous record of the route
    let (code, out, err) = reconcile(&[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("{b}: failed")), "{out}");
    assert!(
        out.contains(&format!(
            "{c}: still ambiguous (unknown: the consumer answered 500)"
        )),
        "{out}"
    );
    assert!(
        out.contains("2 ambiguous records of route r asked about"),
        "{out}"
    );
    // the API: the record as it then is, and what was learned
    let r = act(&px, &format!("/api/events/r/{c}/reconcile"), "");
    assert_eq!(r.status, 200, "{r:?}");
    let doc = r.json();
    assert_eq!(doc["state"], "ambiguous", "{doc}");
    assert_eq!(doc["asked"]["learned"], "unknown", "{doc}");
    assert_eq!(doc["asked"]["status"], 500, "{doc}");
    let r = act(&px, &format!("/api/events/r/{a}/reconcile"), "");
    assert_eq!(r.status, 409, "a delivered record: {r:?}");
    let r = crate::admin_util::post(&px, &format!("/api/events/r/{c}/reconcile"), b"", None);
    assert_eq!(r.status, 401, "without the token: {r:?}");
    // a route that does not ask, and the exit code on error
    let (code, _, err) = cli_env(
        &[
            "events",
            "reconcile",
            "--store",
            &store,
            "--config",
            &config,
            "--route",
            "nope",
        ],
        &env,
    );
    assert_eq!(code, 1, "{err}");
}

/// `check` refuses `reconcile` without `on_ambiguous: hold`, at its line.
#[test]
fn check_refuses_reconcile_without_hold() {
    let dir = TempDir::new("rec-check");
    let path = dir.path().join("c.yaml");
    let text = config_text(
        1,
        2,
        &dir.sqlite_url("c.db"),
        "  - name: r\n    match:\n      path_prefix: /r\n    upstream: \"http://127.0.0.1:9\"\n    \
         event_id:\n      header: X-Event-ID\n    reconcile:\n      url: \"http://127.0.0.1:9/c/{id}\"\n",
    );
    std::fs::write(&path, &text).unwrap();
    let (code, _, err) = cli(&["check", "--config", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    let line = text.lines().position(|l| l.contains("reconcile:")).unwrap() + 1;
    let want =
        format!("c.yaml:{line}:5: routes[0].reconcile: reconcile needs `on_ambiguous: hold`");
    assert!(err.contains(&want), "{err}");
}

/// The event ID is the sender's: percent-encoded into the path, it can
/// change neither the path nor the host the question goes to.
#[test]
fn the_event_id_cannot_steer_the_question() {
    let (up, ts, px) = start("rec-encode", "1h");
    let store = ts.url.clone();
    let id = format!("{}/../../admin?x=1#f@evil.example:80%41", eid("slow"));
    make_ambiguous(&px, &store, &id);
    assert_eq!(px.deliver("/r", Some(&id), b"{\"a\":1}").status, 200);
    let asked: Vec<testkit::Request> = up
        .received()
        .into_iter()
        .filter(|r| r.method == "GET")
        .collect();
    assert_eq!(asked.len(), 1);
    let prefix = id.split('/').next().unwrap();
    assert_eq!(
        asked[0].path,
        format!("/check/{prefix}%2F..%2F..%2Fadmin%3Fx%3D1%23f%40evil.example%3A80%2541")
    );
    assert_eq!(asked[0].header("host"), Some(up.addr.to_string().as_str()));
}

/// `reconcile.sql`: the consumer's own table of processed events, on the
/// real PostgreSQL (here the store's own schema): a row is done, none not
/// done.
#[test]
fn the_sql_form_asks_the_consumers_table() {
    let Some(ts) = TestStore::postgres("rec-sql") else {
        return;
    };
    let up = consumer();
    let url = ts.url.clone();
    crate::common::pg_cluster::psql_at(
        &url,
        "CREATE TABLE processed_webhook_events (event_id text PRIMARY KEY)",
    );
    let (done, undone) = (eid("slow"), eid("slow"));
    crate::common::pg_cluster::psql_at(
        &url,
        &format!("INSERT INTO processed_webhook_events VALUES ('{done}')"),
    );
    let ask = format!(
        "      sql: {{url: \"{url}\", query: \"select 1 from processed_webhook_events where event_id = $1\"}}\n      \
         timeout: 2s\n      every: 1h\n"
    );
    let routes = asking_route("r", "/r", &format!("http://{}", up.addr), "4s", &ask);
    let px = Proxy::start(&ts.dir, &ts.url, &routes);
    for id in [&done, &undone] {
        make_ambiguous(&px, &ts.url, id);
    }
    let r = px.deliver("/r", Some(&done), b"{\"a\":1}");
    assert_eq!(
        (r.status, r.header("idempotency-status")),
        (200, Some("replayed")),
        "{r:?}"
    );
    assert_eq!(
        history(&ts.url, &done).last().unwrap()["error"],
        "done: the query found a row"
    );
    assert_eq!(px.deliver("/r", Some(&undone), b"{\"a\":1}").status, 200);
    assert_state(&ts.url, "r", &undone, "delivered", 2);
    let h = history(&ts.url, &undone);
    assert_eq!(h[1]["error"], "not done: the query found no row", "{h:?}");
    drop(px);
}

/// Issue 55's count: two processes on one store, `every: 5s`, for 60 s,
/// three records whose consumer never knows (500): each record is asked at
/// most 13 times (60 s / 5 s, and the first at once), and it was asked
/// throughout.
#[test]
fn two_processes_ask_each_record_at_most_13_times_in_60s() {
    let up = consumer();
    let ts = TestStore::sqlite("rec-sixty");
    let px = start_on(&ts, &up, "5s");
    let other = start_on(&ts, &up, "5s");
    let ids: Vec<String> = (0..3).map(|_| eid("slow-said-err")).collect();
    for id in &ids {
        make_ambiguous(&px, &ts.url, id);
    }
    let since = Instant::now();
    std::thread::sleep(Duration::from_secs(60));
    let asked: Vec<usize> = ids.iter().map(|id| questions(&up, id).len()).collect();
    eprintln!(
        "two processes, every 5s, {:.1}s: questions per record {asked:?}",
        since.elapsed().as_secs_f64()
    );
    assert!(asked.iter().all(|&n| n <= 13), "{asked:?}");
    assert!(
        asked.iter().all(|&n| n >= 10),
        "asked throughout: {asked:?}"
    );
    drop((other, px));
}
