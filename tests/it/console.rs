//! The operator console (SPEC §11) in a real browser: Debian's headless
//! Chromium, driven through WebDriver, against the real binary, a real
//! consumer and a real SQLite store.
//!
//! - the overview lists the routes with counters that match `/metrics`, and
//!   follows them as traffic goes on;
//! - a search finds a delivered event, and its detail shows every field;
//! - a forced release with the token makes the next delivery forwarded;
//! - event IDs carrying HTML render as text, and no script runs;
//! - an ambiguous event's attempts are shown, and it is resolved both ways
//!   from its page; a route is paused and resumed from the overview, and
//!   the proxy follows;
//! - each route's limits, requests in flight and breaker are shown (SPEC §15).
//!
//! `IDEMGATE_SCREENSHOTS=DIR` writes the overview and an event's detail to
//! DIR, each as it is and with the ambiguous events and a paused route (the
//! ones in `docs/` were taken so).

use crate::admin_util;
use crate::common;
use crate::webdriver;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use admin_util::*;
use common::*;
use serde_json::{json, Value};
use webdriver::Browser;

/// One browser at a time: a 2-core machine runs one Chromium well.
static ONE_BROWSER: Mutex<()> = Mutex::new(());

fn screenshots() -> Option<PathBuf> {
    std::env::var_os("IDEMGATE_SCREENSHOTS").map(PathBuf::from)
}

/// The browser, taken in turn (`ONE_BROWSER`), and a console made by
/// `start` on `tag` ([`Setup::start`], [`Held::start`]); `None` where no
/// browser is installed. The caller binds the guard to a name (`_one`, not
/// `_`), so that it is held until the test ends.
fn browser_and<S>(
    tag: &str,
    start: fn(&str) -> S,
) -> Option<(MutexGuard<'static, ()>, Browser, S)> {
    let one = ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let b = Browser::start()?;
    Some((one, b, start(tag)))
}

/// A proxy with the admin token on a SQLite store of its own, and `up`, the
/// consumer its routes go to.
struct Console<U> {
    up: U,
    px: Proxy,
    store: String,
    _dir: TempDir,
}

impl<U> Console<U> {
    fn serve(tag: &str, up: U, routes: &str) -> Console<U> {
        let dir = TempDir::new(tag);
        let store = dir.sqlite_url("console.db");
        let px = start_with_token(&dir, &store, routes);
        Console {
            up,
            px,
            store,
            _dir: dir,
        }
    }

    fn url(&self, fragment: &str) -> String {
        format!("http://{}/{fragment}", self.px.admin)
    }
}

/// Two guarded routes (`orders`, `billing`) to a scripted consumer.
type Setup = Console<Consumer>;

impl Setup {
    fn start(tag: &str) -> Setup {
        let up = Consumer::start().unwrap();
        let orders = "    lease: 30s\n    upstream_concurrency: 4\n";
        let routes = route("orders", "/hooks/orders", &up.url(), orders)
            + &format!(
                "  - name: billing\n    match:\n      path_prefix: /hooks/billing\n    \
                 upstream: \"{}\"\n    event_id:\n      json_pointer: /id\n    digest: json\n",
                up.url()
            );
        Console::serve(tag, up, &routes)
    }

    fn billing(&self, id: &str) -> Response {
        let body = format!("{{\"id\":\"{id}\",\"amount\":12}}");
        kit::deliver(self.px.addr, "/hooks/billing", None, body.as_bytes()).unwrap()
    }
}

/// Every `[data-counter]` the overview shows: (counter, route, label) → text.
fn shown_counters(b: &Browser) -> BTreeMap<(String, String, String), String> {
    let v = b.execute(
        "return Array.from(document.querySelectorAll('#routes [data-counter]')).map(e => \
         [e.dataset.counter, e.dataset.route, e.dataset.label || '', e.textContent]);",
        json!([]),
    );
    v.as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let s = |i: usize| row[i].as_str().unwrap().to_string();
            ((s(0), s(1), s(2)), s(3))
        })
        .collect()
}

/// What the overview must show, from a `/metrics` scrape: the requests and
/// upstream samples of the configured routes.
fn expected_counters(metrics: &str) -> BTreeMap<(String, String, String), String> {
    let mut out = BTreeMap::new();
    for (metric, counter, key) in [
        ("idemgate_requests_total", "requests", "outcome"),
        ("idemgate_upstream_responses_total", "upstream", "class"),
    ] {
        for (series, value) in samples(metrics, metric) {
            let route = label(&series, "route");
            if route.is_empty() {
                continue; // no_route: shown below the table
            }
            out.insert(
                (
                    counter.to_string(),
                    route.to_string(),
                    label(&series, key).to_string(),
                ),
                format!("{value}"),
            );
        }
    }
    out
}

#[test]
fn the_overview_lists_the_routes_with_counters_that_match_metrics() {
    let Some((_one, b, s)) = browser_and("console-overview", Setup::start) else {
        return;
    };
    let tag = eid("ov");
    for i in 0..4 {
        assert_eq!(
            s.px.deliver("/hooks/orders", Some(&format!("{tag}-{i}")), b"{}")
                .status,
            200
        );
    }
    for _ in 0..3 {
        s.px.deliver("/hooks/orders", Some(&format!("{tag}-0")), b"{}"); // replayed
    }
    s.px.deliver("/hooks/orders", Some(&format!("{tag}-1")), b"other"); // digest_mismatch
    s.px.deliver("/hooks/orders", None, b"{}"); // missing_id
    let failing = format!("{tag}-fails");
    s.up.script(&failing, vec![Reply::status(502)]);
    s.px.deliver("/hooks/orders", Some(&failing), b"{}");
    for i in 0..2 {
        assert_eq!(s.billing(&format!("{tag}-b{i}")).status, 200);
    }
    s.px.deliver("/nowhere", Some("x"), b"{}"); // no_route

    b.goto(&s.url(""));
    b.wait_visible("#routes tr[data-route=\"orders\"]");
    b.wait_visible("#routes tr[data-route=\"billing\"]");
    let want = expected_counters(&s.px.metrics());
    let key = |c: &str, r: &str, l: &str| (c.to_string(), r.to_string(), l.to_string());
    assert_eq!(want[&key("requests", "orders", "forwarded")], "5");
    assert_eq!(want[&key("requests", "orders", "replayed")], "3");
    assert_eq!(want[&key("upstream", "orders", "5xx")], "1");
    let shown = shown_counters(&b);
    let requests_and_upstream: BTreeMap<_, _> = shown
        .iter()
        .filter(|((c, _, _), _)| c == "requests" || c == "upstream")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(
        requests_and_upstream, want,
        "the overview shows /metrics' counters, all of them"
    );
    // the oldest processing age, per route, as the gauge says (0: none)
    for r in ["orders", "billing"] {
        assert_eq!(shown[&key("oldest", r, "")], "0 s");
        assert_eq!(
            s.px.metric(&format!(
                "idemgate_processing_oldest_age_seconds{{route=\"{r}\"}}"
            )),
            0.0
        );
    }
    // the no-route request and the store's round trips
    let unrouted = b.text(&b.find("#unrouted").unwrap());
    assert!(unrouted.contains("no_route 1"), "{unrouted}");
    let claims = b.text(
        &b.find("#store [data-counter=\"store-count\"][data-label=\"claim\"]")
            .unwrap(),
    );
    assert_eq!(
        claims.parse::<f64>().unwrap(),
        s.px.metric("idemgate_store_duration_seconds_count{operation=\"claim\"}")
    );
    // the failed delivery waits in "Needs attention"
    wait_listed(
        &b,
        "the failed event listed",
        "#failed a.event-link",
        &failing,
    );

    // live: more traffic shows up within a few refreshes, still equal to /metrics
    for i in 10..16 {
        s.px.deliver("/hooks/orders", Some(&format!("{tag}-{i}")), b"{}");
    }
    let want = expected_counters(&s.px.metrics());
    assert_eq!(want[&key("requests", "orders", "forwarded")], "11");
    b.wait_for("the new counters", |b| {
        let shown = shown_counters(b);
        (shown
            .get(&key("requests", "orders", "forwarded"))
            .map(String::as_str)
            == Some("11"))
        .then_some(())
    });
    let shown = shown_counters(&b);
    for (k, v) in &want {
        assert_eq!(shown.get(k), Some(v), "{k:?} after the refresh");
    }
    b.screenshot(screenshots().as_deref(), "console-overview.png");
}

/// The `[data-field]` rows of the event detail: field → text.
/// Waits until the link list `css` shows `id`.
fn wait_listed(b: &Browser, what: &str, css: &str, id: &str) {
    let found = b.wait_for(what, |b| b.texts(css).into_iter().find(|t| t == id));
    assert_eq!(found, id);
}

/// Waits until the detail's field `name` shows `value`.
fn wait_shown(b: &Browser, what: &str, name: &str, value: &str) {
    b.wait_for(what, |b| {
        (shown_fields(b).get(name).map(String::as_str) == Some(value)).then_some(())
    });
}

fn shown_fields(b: &Browser) -> BTreeMap<String, String> {
    let v = b.execute(
        "return Array.from(document.querySelectorAll('#fields tr[data-field]')).map(r => \
         [r.dataset.field, r.querySelector('td').textContent]);",
        json!([]),
    );
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_str().unwrap().to_string(),
                r[1].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The attempts table's rows, cell by cell.
fn shown_attempts(b: &Browser) -> Vec<[String; 7]> {
    let v = b.execute(
        "return Array.from(document.querySelectorAll('#attempts tbody tr[data-attempt]')).map(r => \
         Array.from(r.cells).map(c => c.textContent));",
        json!([]),
    );
    serde_json::from_value(v).unwrap()
}

fn as_shown(v: &Value) -> String {
    match v {
        Value::Null => "—".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[test]
fn a_search_finds_a_delivered_event_and_its_detail_shows_every_field() {
    let Some((_one, b, s)) = browser_and("console-search", Setup::start) else {
        return;
    };
    let tag = eid("se");
    let id = format!("{tag}/order-42");
    // other records around it: another route, other states, other IDs
    assert_eq!(s.billing(&format!("{tag}/order-43")).status, 200);
    let failing = format!("{tag}/order-44");
    s.up.script(&failing, vec![Reply::status(500)]);
    s.px.deliver("/hooks/orders", Some(&failing), b"{}");
    s.px.deliver("/hooks/orders", Some(&format!("{tag}/other")), b"{}");
    assert_eq!(
        s.px.deliver("/hooks/orders", Some(&id), br#"{"n":42}"#)
            .status,
        200
    );

    b.goto(&s.url("#/events"));
    b.wait_visible("#search-route option[value=\"orders\"]");
    b.click(&b.find("#search-route option[value=\"orders\"]").unwrap());
    b.click(&b.find("#search-state option[value=\"delivered\"]").unwrap());
    b.type_text(&b.find("#search-prefix").unwrap(), &format!("{tag}/order"));
    b.click(&b.find("#search-go").unwrap());
    let links = b.wait_for("one result", |b| {
        let rows = b.find_all("#results tbody a.event-link");
        (rows.len() == 1 && b.text(&rows[0]) == id).then_some(rows)
    });
    b.click(&links[0]);
    let want = show(&s.store, "orders", &id);
    wait_shown(&b, "the detail", "event_id", &id);
    let fields = shown_fields(&b);
    let want_fields: BTreeMap<String, String> = want
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "history")
        .map(|(k, v)| (k.clone(), as_shown(v)))
        .collect();
    assert_eq!(
        fields, want_fields,
        "every field of events show --json, as it says (the attempts apart)"
    );
    // its one attempt, as the history says
    let attempts = shown_attempts(&b);
    let a = &want["history"][0];
    assert_eq!(
        attempts,
        [[
            "1".to_string(),
            a["started_at"].as_str().unwrap().to_string(),
            "200".to_string(),
            "delivered".to_string(),
            format!("{} ms", a["duration_ms"]),
            as_shown(&a["instance"]),
            "—".to_string(),
        ]]
    );
    assert_eq!(fields["state"], "delivered");
    assert_eq!(fields["last_status"], "200");
    // the timeline: its times, in order, and now
    let moments = b.execute(
        "return Array.from(document.querySelectorAll('#timeline li')).map(li => \
         [li.dataset.moment, li.querySelector('.when').textContent]);",
        json!([]),
    );
    let moments: Vec<(String, String)> = moments
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m[0].as_str().unwrap().into(), m[1].as_str().unwrap().into()))
        .collect();
    let names: Vec<&str> = moments.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "first seen",
            "attempt 1",
            "last change",
            "delivered",
            "now",
            "record expires"
        ],
        "{moments:?}"
    );
    assert_eq!(moments[0].1, want["first_seen_at"].as_str().unwrap());
    assert_eq!(
        moments[1].1,
        want["history"][0]["started_at"].as_str().unwrap()
    );
    assert_eq!(moments[3].1, want["delivered_at"].as_str().unwrap());
    assert_eq!(moments[5].1, want["expires_at"].as_str().unwrap());
    // a delivered event offers only the forced release
    assert!(b.displayed(&b.find("#force-release").unwrap()));
    assert!(!b.displayed(&b.find("#release").unwrap()));
    let page = b.execute("return document.body.innerText", json!([]));
    assert!(
        !page.as_str().unwrap().contains("\"n\":42"),
        "no payload is shown"
    );
}

#[test]
fn a_forced_release_with_the_token_makes_the_next_delivery_forwarded() {
    let Some((_one, b, s)) = browser_and("console-release", Setup::start) else {
        return;
    };
    let id = format!("{}/redeliver-me", eid("rel"));
    assert_eq!(s.px.deliver("/hooks/orders", Some(&id), b"{}").status, 200);
    let dup = s.px.deliver("/hooks/orders", Some(&id), b"{}");
    assert_eq!(dup.header("Idempotent-Replayed"), Some("true"));

    b.goto(&s.url(&format!("#/event/orders/{}", enc(&id))));
    let force = b.wait_visible("#force-release");
    b.click(&force);
    b.wait_visible("#confirm[open]");
    let text = b.text(&b.find("#confirm-text").unwrap());
    assert!(text.contains(&id) && text.contains("AGAIN"), "{text}");
    // a wrong token is refused, and nothing changes
    let input = b.find("#confirm-token").unwrap();
    b.type_text(&input, "not-the-token");
    b.click(&b.find("#confirm-ok").unwrap());
    let error = b.wait_for("the refusal", |b| {
        b.text_of("#confirm-error").filter(|t| !t.is_empty())
    });
    assert!(error.contains("refused"), "{error}");
    assert_eq!(show(&s.store, "orders", &id)["state"], "delivered");
    // the right one releases it
    b.clear(&input);
    b.type_text(&input, TOKEN);
    b.click(&b.find("#confirm-ok").unwrap());
    wait_shown(&b, "the released record", "state", "failed");
    assert!(
        !b.displayed(&b.find("#confirm").unwrap()),
        "the dialog closed"
    );
    let result = b.text(&b.find("#action-result").unwrap());
    assert!(result.contains("Force released"), "{result}");
    let rec = show(&s.store, "orders", &id);
    assert_eq!(
        (rec["state"].as_str(), rec["lease_until"].as_null()),
        (Some("failed"), Some(()))
    );
    assert_eq!(shown_fields(&b)["last_error"], "released by operator");
    // the token: in this tab's memory only — no cookie, not in sessionStorage
    let kept = b.execute(
        "return [document.cookie, sessionStorage.length, document.getElementById('token-state').textContent]",
        json!([]),
    );
    assert_eq!(kept, json!(["", 0, "admin token held in memory"]));

    let again = s.px.deliver("/hooks/orders", Some(&id), b"{}");
    assert_eq!(
        (again.status, again.header("Idempotency-Status")),
        (200, Some("forwarded"))
    );
    assert_eq!(s.up.count(&id), 2, "the consumer got the delivery again");

    // a failed event: Release, with the token the tab holds (none typed),
    // kept in sessionStorage this time
    let failing = format!("{}/fails", eid("rel"));
    s.up.script(&failing, vec![Reply::status(500)]);
    s.px.deliver("/hooks/orders", Some(&failing), b"{}");
    b.goto(&s.url(&format!("#/event/orders/{}", enc(&failing))));
    let release = b.wait_visible("#release");
    assert!(!b.displayed(&b.find("#force-release").unwrap()));
    b.click(&release);
    b.wait_visible("#confirm[open]");
    b.click(&b.find("#confirm-keep").unwrap());
    b.click(&b.find("#confirm-ok").unwrap());
    b.wait_for("the release", |b| {
        b.text_of("#action-result")
            .filter(|r| r.starts_with("Released"))
    });
    let kept = b.execute(
        "return [document.cookie, sessionStorage.getItem('idemgate.admin-token')]",
        json!([]),
    );
    assert_eq!(kept, json!(["", TOKEN]));
    assert_eq!(
        show(&s.store, "orders", &failing)["last_error"],
        "released by operator"
    );
}

#[test]
fn event_ids_carrying_html_render_as_text_and_no_script_runs() {
    let Some((_one, b, s)) = browser_and("console-xss", Setup::start) else {
        return;
    };
    let tag = eid("x");
    // what a sender can put in an event ID (visible ASCII, no spaces) ...
    let sent = [
        format!("{tag}<svg/onload=alert(1)>"),
        format!("{tag}\"><img/src/onerror=alert(2)>"),
        format!("{tag}</td></tr><script>alert(3)</script>"),
        format!("{tag}'-alert(4)-'"),
    ];
    for id in &sent {
        assert_eq!(
            s.px.deliver("/hooks/orders", Some(id), b"{}").status,
            200,
            "{id}"
        );
    }
    // ... and the issue's own example, with spaces, written to the store
    // directly as a claim whose process died (so it is also a stuck claim)
    let issue = "<img src=x onerror=alert(1)>".to_string();
    stuck_claim(&s.store, "orders", &issue, 120_000, 30_000);

    let no_markup = |b: &Browser, where_: &str| {
        let v = b.execute(
            "return [document.querySelectorAll('img, svg, iframe, object, embed').length, \
             document.querySelectorAll('script').length, \
             document.querySelectorAll('[onerror], [onload], [onclick]').length, \
             window.__idemgate_pwned === undefined]",
            json!([]),
        );
        assert_eq!(
            v,
            json!([0, 1, 0, true]),
            "{where_}: markup from an event ID became elements"
        );
        assert_eq!(b.alert_text(), None, "{where_}: a script ran");
    };

    // the overview's stuck claims
    b.goto(&s.url(""));
    wait_listed(&b, "the stuck claim", "#stuck a.event-link", &issue);
    no_markup(&b, "overview");

    // the search results
    b.goto(&s.url(&format!("#/events?route=orders&prefix={}", enc(&tag))));
    let texts = b.wait_for("the results", |b| {
        let t = b.texts("#results tbody a.event-link");
        (t.len() == sent.len()).then_some(t)
    });
    let mut want = sent.to_vec();
    want.sort();
    let mut got = texts.clone();
    got.sort();
    assert_eq!(got, want, "each ID, character for character");
    no_markup(&b, "results");

    // every detail page, the issue's ID included
    for id in sent.iter().chain([&issue]) {
        b.goto(&s.url(&format!("#/event/orders/{}", enc(id))));
        wait_shown(&b, "the detail", "event_id", id);
        assert_eq!(b.text(&b.find("#detail-id").unwrap()), *id);
        no_markup(&b, id);
    }
    // a release dialog quotes the ID as text too
    b.click_on("#release");
    b.wait_visible("#confirm[open]");
    assert!(b.text(&b.find("#confirm-text").unwrap()).contains(&issue));
    no_markup(&b, "dialog");

    // and the policy is the browser's, not only the script's habit: an HTML
    // sink throws (Trusted Types), inline script does not run
    let sink = b.execute(
        "try { document.body.insertAdjacentHTML('beforeend', '<b>x</b>'); return 'inserted'; } \
         catch (e) { return e.name; }",
        json!([]),
    );
    assert_eq!(
        sink, "TypeError",
        "require-trusted-types-for 'script' is enforced"
    );
    let inline = b.execute(
        "const s = document.createElement('script'); \
         try { s.text = 'window.__idemgate_pwned = 1'; document.head.append(s); } catch (e) {} \
         return window.__idemgate_pwned === undefined;",
        json!([]),
    );
    assert_eq!(inline, true, "an inline script does not run");
    assert_eq!(b.alert_text(), None);
}

/// Two routes under `on_ambiguous: hold` to a consumer that acts on each
/// request: an event whose ID holds `slow` is answered after 2 s the first
/// time (past the 1 s `upstream_timeout`); one whose ID holds `flaky` gets
/// 503 twice, then that late answer.
type Held = Console<Server>;

impl Held {
    /// `id` on the `orders` route, left `ambiguous` ([`make_ambiguous`]).
    fn make_ambiguous_on_orders(&self, id: &str) {
        let ids = [id.to_string()];
        make_ambiguous(&self.px, &self.store, "orders", "/hooks/orders", &ids);
    }

    fn start(tag: &str) -> Held {
        use crate::raw_upstream::{response, upstream, Behavior};
        let seen = Mutex::new(BTreeMap::<String, usize>::new());
        let up = upstream(move |req, _| {
            let key = req.key().unwrap_or_default().to_string();
            let n = {
                let mut seen = seen.lock().unwrap();
                let n = seen.entry(key.clone()).or_default();
                *n += 1;
                *n
            };
            let late = Behavior::Late(Duration::from_secs(2), response(200, b"ok"));
            match n {
                1 | 2 if key.contains("flaky") => Behavior::Respond(response(503, b"busy")),
                3 if key.contains("flaky") => late,
                1 if key.contains("slow") => late,
                _ => Behavior::Respond(response(200, b"ok")),
            }
        });
        let upstream = format!("http://{}", up.addr);
        let routes = held_route("orders", "/hooks/orders", &upstream)
            + &held_route("billing", "/hooks/billing", &upstream);
        Console::serve(tag, up, &routes)
    }
}

/// Clicks `button`, waits for the dialog, optionally types the token, and
/// confirms.
fn confirm(b: &Browser, button: &str, token: Option<&str>) {
    b.click_on(button);
    b.wait_visible("#confirm[open]");
    if let Some(t) = token {
        b.type_text(&b.find("#confirm-token").unwrap(), t);
    }
    b.click(&b.find("#confirm-ok").unwrap());
}

fn wait_result(b: &Browser, css: &str, starts: &str) -> String {
    b.wait_for(&format!("{css} saying {starts:?}"), |b| {
        b.text_of(css).filter(|t| t.starts_with(starts))
    })
}

/// The `Forwarding` cell of `route` on the overview: its `data-paused`.
fn shown_paused(b: &Browser, route: &str) -> String {
    b.execute(
        "const c = document.querySelector('#routes tr[data-route=\"' + arguments[0] + '\"] td.forwarding'); \
         return c ? c.dataset.paused : '';",
        json!([route]),
    )
    .as_str()
    .unwrap_or_default()
    .to_string()
}

/// The event page of `id` shows its three attempts — 503, 503, then no
/// answer in time — as its history has them, in the table and the timeline.
fn shows_three_attempts(b: &Browser, store: &str, id: &str) {
    let rec = show(store, "orders", id);
    let rows = b.wait_for("three attempts", |b| {
        Some(shown_attempts(b)).filter(|r| r.len() == 3)
    });
    let got: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| (r[0].as_str(), r[2].as_str(), r[3].as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("1", "503", "released"),
            ("2", "503", "released"),
            ("3", "—", "ambiguous")
        ],
        "{rec}"
    );
    for (row, a) in rows.iter().zip(rec["history"].as_array().unwrap()) {
        assert_eq!(row[1], a["started_at"].as_str().unwrap());
        assert_eq!(row[6], as_shown(&a["error"]));
    }
    assert_eq!(rows[2][6], "timeout after the request was written");
    for moment in ["attempt 1", "attempt 2", "attempt 3"] {
        assert!(
            b.find(&format!("#timeline li[data-moment=\"{moment}\"]"))
                .is_some(),
            "{moment}"
        );
    }
}

#[test]
fn ambiguous_events_are_resolved_both_ways_from_the_console() {
    let Some((_one, b, s)) = browser_and("console-ambiguous", Held::start) else {
        return;
    };
    let tag = eid("amb");
    // three attempts (503, 503, then no answer in time), and two that timed out
    let flaky = format!("{tag}/flaky");
    for want in [503, 503, 504] {
        assert_eq!(
            s.px.deliver("/hooks/orders", Some(&flaky), b"{}").status,
            want
        );
    }
    let undone = format!("{tag}/slow-undone");
    s.make_ambiguous_on_orders(&undone);
    assert_eq!(show(&s.store, "orders", &flaky)["state"], "ambiguous");

    // the overview lists them, the route says how many
    b.goto(&s.url(""));
    for id in [&flaky, &undone] {
        wait_listed(&b, "an ambiguous event", "#ambiguous a.event-link", id);
    }
    let count = b.wait_visible("#routes [data-counter=\"ambiguous\"][data-route=\"orders\"]");
    assert_eq!(b.text(&count), "2 outcome unknown");
    assert_eq!(shown_paused(&b, "orders"), "false");

    // the event's page: its three attempts, and the two decisions offered
    b.goto(&s.url(&format!("#/event/orders/{}", enc(&flaky))));
    wait_shown(&b, "the detail", "state", "ambiguous");
    shows_three_attempts(&b, &s.store, &flaky);
    assert!(b.displayed(&b.find("#resolve-delivered").unwrap()));
    assert!(b.displayed(&b.find("#resolve-failed").unwrap()));
    assert!(!b.displayed(&b.find("#release").unwrap()));
    assert!(!b.displayed(&b.find("#force-release").unwrap()));
    b.screenshot(screenshots().as_deref(), "console-event-attempts.png");

    // resolve as delivered: the dialog asks for the status (200 unless changed)
    b.click(&b.find("#resolve-delivered").unwrap());
    b.wait_visible("#confirm[open]");
    let status = b.wait_visible("#confirm-status");
    assert_eq!(
        b.execute(
            "return document.getElementById('confirm-status').value",
            json!([])
        ),
        "200"
    );
    assert!(b.text(&b.find("#confirm-text").unwrap()).contains(&flaky));
    b.clear(&status);
    b.type_text(&status, "42");
    b.type_text(&b.find("#confirm-token").unwrap(), TOKEN);
    b.click(&b.find("#confirm-ok").unwrap());
    let error = b.wait_for("the status refused", |b| {
        b.text_of("#confirm-error").filter(|t| !t.is_empty())
    });
    assert!(error.contains("100 to 599"), "{error}");
    assert_eq!(
        show(&s.store, "orders", &flaky)["state"],
        "ambiguous",
        "nothing sent"
    );
    b.clear(&status);
    b.type_text(&status, "202");
    b.click(&b.find("#confirm-ok").unwrap());
    wait_shown(&b, "the resolved record", "state", "delivered");
    assert_eq!(shown_fields(&b)["last_status"], "202");
    let said = wait_result(&b, "#action-result", "Resolved as delivered");
    assert!(said.contains("202"), "{said}");
    let replay = s.px.deliver("/hooks/orders", Some(&flaky), b"{}");
    assert_eq!(
        (replay.status, replay.header("Idempotent-Replayed")),
        (202, Some("true"))
    );
    assert_eq!(
        s.up.count(&flaky),
        3,
        "the consumer saw it three times, never a fourth"
    );

    // resolve as failed, with the token the tab holds: the next delivery is forwarded
    b.goto(&s.url(&format!("#/event/orders/{}", enc(&undone))));
    wait_shown(&b, "the detail", "state", "ambiguous");
    confirm(&b, "#resolve-failed", None);
    wait_shown(&b, "the resolved record", "state", "failed");
    wait_result(&b, "#action-result", "Resolved as failed");
    let again = s.px.deliver("/hooks/orders", Some(&undone), b"{}");
    assert_eq!(
        (again.status, again.header("Idempotency-Status")),
        (200, Some("forwarded"))
    );
    assert_eq!(s.up.count(&undone), 2);
    assert_eq!(b.alert_text(), None);
}

/// SPEC §21: "Ask the consumer" on an ambiguous event's page asks the
/// route's consumer now; found done, the page shows it delivered, and the
/// question in its attempts.
#[test]
fn an_ambiguous_event_is_reconciled_from_the_console() {
    let _one = ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(b) = Browser::start() else {
        return;
    };
    let (_up, ts, px) = crate::reconcile::start("console-reconcile", "1h");
    let id = eid("slow");
    crate::reconcile::make_ambiguous(&px, &ts.url, &id);
    b.goto(&format!("http://{}/#/event/r/{}", px.admin, enc(&id)));
    wait_shown(&b, "the detail", "state", "ambiguous");
    assert!(b.displayed(&b.find("#ask-consumer").unwrap()));
    confirm(&b, "#ask-consumer", Some(TOKEN));
    wait_shown(&b, "the reconciled record", "state", "delivered");
    let said = wait_result(&b, "#action-result", "Asked the consumer");
    assert!(said.contains("done: the consumer answered 200"), "{said}");
    assert!(!b.displayed(&b.find("#ask-consumer").unwrap()));
    let results = b.execute(
        "return Array.from(document.querySelectorAll('#attempts tbody tr')).map(r => r.children[3].textContent);",
        json!([]),
    );
    assert_eq!(results, json!(["ambiguous", "reconciled"]));
    assert_eq!(b.alert_text(), None);
    drop((px, ts));
}

#[test]
fn a_route_is_paused_and_resumed_from_the_console() {
    let Some((_one, b, s)) = browser_and("console-pause", Held::start) else {
        return;
    };
    let tag = eid("pause");
    // an event that waits for a decision (its ID holds markup), one delivered on billing
    let kept = format!("{tag}/slow<svg/onload=alert(9)>");
    s.make_ambiguous_on_orders(&kept);
    assert_eq!(
        s.px.deliver("/hooks/billing", Some(&format!("{tag}/b")), b"{}")
            .status,
        200
    );

    // pause billing from the overview, the token typed: the proxy refuses
    // within 2 s, and replays what was delivered
    b.goto(&s.url(""));
    b.wait_visible("#routes tr[data-route=\"billing\"] button.pause-toggle");
    assert_eq!(shown_paused(&b, "billing"), "false");
    confirm(
        &b,
        "#routes tr[data-route=\"billing\"] button.pause-toggle",
        Some(TOKEN),
    );
    let said = wait_result(&b, "#overview-result", "Route billing paused since");
    let paused = std::time::Instant::now();
    let since = show_paused_at(&s.store, "billing");
    assert!(said.contains(&since), "{said} / {since}");
    b.wait_for("billing shown paused", |b| {
        (shown_paused(b, "billing") == "true").then_some(())
    });
    assert_eq!(shown_paused(&b, "orders"), "false");
    let (new, r) = within_two_seconds(
        paused,
        &s.px,
        "/hooks/billing",
        |n| format!("{tag}/b-new-{n}"),
        503,
    );
    assert_eq!(r.json()["type"], "urn:idemgate:problem:route-paused");
    assert_eq!(s.up.count(&new), 0);
    let dup =
        s.px.deliver("/hooks/billing", Some(&format!("{tag}/b")), b"{}");
    assert_eq!(
        dup.header("Idempotent-Replayed"),
        Some("true"),
        "still replayed"
    );
    // the overview with a paused route and an ambiguous event waiting
    wait_listed(&b, "the kept event", "#ambiguous a.event-link", &kept);
    assert_eq!(
        b.execute(
            "return document.querySelectorAll('svg, img, [onload]').length",
            json!([])
        ),
        0,
        "an event ID's markup is text"
    );
    b.screenshot(screenshots().as_deref(), "console-overview-paused.png");

    // and resume: forwarded again within 2 s
    confirm(
        &b,
        "#routes tr[data-route=\"billing\"] button.pause-toggle",
        None,
    );
    wait_result(&b, "#overview-result", "Route billing resumed");
    let resumed = std::time::Instant::now();
    b.wait_for("billing shown forwarding", |b| {
        (shown_paused(b, "billing") == "false").then_some(())
    });
    within_two_seconds(resumed, &s.px, "/hooks/billing", |_| new.clone(), 200);
    assert_eq!(s.up.count(&new), 1);
    assert_eq!(b.alert_text(), None);
}

/// `routes list`'s time for a paused `route`.
fn show_paused_at(store: &str, route: &str) -> String {
    let (code, out, err) = cli(&["routes", "list", "--store", store]);
    assert_eq!(code, 0, "{err}");
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{route}  paused since ")))
        .unwrap_or_else(|| panic!("{route} not paused: {out}"))
        .to_string()
}

/// The text of `route`'s `[data-limit=what]` in the overview's consumer
/// column, if it is there.
fn shown_limit(b: &Browser, what: &str, route: &str) -> Option<String> {
    let css = format!("#routes [data-limit=\"{what}\"][data-route=\"{route}\"]");
    b.text_of(&css)
}

#[test]
fn the_overview_shows_each_routes_limits_in_flight_and_breaker() {
    let Some((_one, b, s)) = browser_and("console-limits", Setup::start) else {
        return;
    };
    let id = eid("held");
    s.up.hold(&id, 200, Duration::from_secs(4));
    let held = {
        let (addr, id) = (s.px.addr, id.clone());
        std::thread::spawn(move || kit::deliver(addr, "/hooks/orders", Some(&id), b"{}"))
    };
    assert!(wait_until(Duration::from_secs(10), || s.up.count(&id) > 0));
    b.goto(&s.url(""));
    b.wait_visible("#routes [data-limit=\"limits\"][data-route=\"orders\"]");
    assert_eq!(
        shown_limit(&b, "limits", "orders").as_deref(),
        Some("at most 4 at once")
    );
    assert_eq!(
        shown_limit(&b, "in-flight", "orders").as_deref(),
        Some("1 in flight")
    );
    assert_eq!(
        shown_limit(&b, "breaker", "orders").as_deref(),
        Some("breaker closed")
    );
    assert_eq!(
        shown_limit(&b, "limits", "billing").as_deref(),
        Some("no limits")
    );
    assert_eq!(
        shown_limit(&b, "in-flight", "billing"),
        None,
        "nothing counted"
    );
    assert_eq!(held.join().unwrap().unwrap().status, 200);
    b.wait_for("orders' request no longer in flight", |b| {
        (shown_limit(b, "in-flight", "orders").as_deref() == Some("0 in flight")).then_some(())
    });
    // billing's consumer asks for a minute's pause: its breaker opens
    let paused = eid("pause");
    s.up.script(
        &paused,
        vec![Reply::status(429).header("Retry-After", "60")],
    );
    assert_eq!(s.billing(&paused).status, 429);
    let text = b.wait_for("billing's breaker shown open", |b| {
        shown_limit(b, "breaker", "billing").filter(|t| t.starts_with("breaker open"))
    });
    assert!(text.ends_with("s left)"), "{text}");
    b.screenshot(screenshots().as_deref(), "console-overview-limits");
}

/// SPEC §19: a traced record's page shows its trace ID, a link to
/// `telemetry.trace_url` (here the collector is absent: spans are dropped,
/// the record still keeps its send's trace).
#[test]
fn an_event_page_links_its_trace_id_to_trace_url() {
    let _one = ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(b) = Browser::start() else {
        return;
    };
    let dir = TempDir::new("console-trace");
    let up = Consumer::start().unwrap();
    let store = dir.sqlite_url("console.db");
    let routes = route("orders", "/hooks/orders", &up.url(), "    lease: 30s\n")
        + &format!(
            "telemetry:\n  otlp:\n    endpoint: \"http://127.0.0.1:{}\"\n  \
             trace_url: \"https://traces.example/trace/{{trace_id}}?from=console\"\n",
            free_port()
        );
    let px = start_with_token(&dir, &store, &routes);
    let id = eid("traced");
    assert_eq!(
        px.deliver("/hooks/orders", Some(&id), br#"{"n":7}"#).status,
        200
    );
    let want = show(&store, "orders", &id);
    let trace = want["trace_id"].as_str().expect("a trace ID").to_string();
    assert_eq!(trace.len(), 32, "{want}");

    b.goto(&format!("http://{}/#/event/orders/{id}", px.admin));
    wait_shown(&b, "the detail", "trace_id", &trace);
    let link = b.execute(
        "const a = document.querySelector('#fields tr[data-field=\"trace_id\"] a'); \
         return a ? [a.textContent, a.getAttribute('href'), a.getAttribute('rel')] : null;",
        json!([]),
    );
    let href = format!("https://traces.example/trace/{trace}?from=console");
    assert_eq!(link, json!([trace, href, "noopener noreferrer"]));
    assert!(
        !shown_fields(&b).contains_key("trace_url"),
        "the link is the trace ID's"
    );
    b.screenshot(screenshots().as_deref(), "console-event.png");
}
