//! `reconcile:` (SPEC §21): its defaults, its refusals with their
//! positions, and the percent-encoding of the event ID into the question.

use std::time::Duration;

use super::{ok, one_error, route};
use crate::config::{Ask, Reconcile};

/// The standard route under `hold` with a `reconcile` block from line 13.
fn held(block: &str) -> String {
    route(&format!("    on_ambiguous: hold\n    reconcile:\n{block}"))
}

fn reconcile_of(text: &str) -> Reconcile {
    ok(text).config.routes[0].reconcile.clone().unwrap()
}

#[test]
fn defaults_and_headers_from_secrets() {
    let r = reconcile_of(&held(
        "      url: \"http://127.0.0.1:3000/internal/webhooks/{id}?full=1\"\n      headers: {authorization: env:PLAIN}\n",
    ));
    assert_eq!(r.done, vec![200]);
    assert_eq!(r.not_done, vec![404]);
    assert_eq!(r.delivered_status, 200);
    assert_eq!(r.timeout, Duration::from_secs(5));
    assert_eq!(r.every, Duration::from_secs(30));
    let Ask::Url(url) = r.ask else {
        panic!("a url question")
    };
    assert_eq!(url.target.host, "127.0.0.1");
    assert_eq!(url.target.port, 3000);
    assert_eq!(url.headers[0].0.as_str(), "authorization");
    assert_eq!(url.headers[0].1.as_bytes(), b"plain-secret");
    assert!(!format!("{url:?}").contains("plain-secret"));
    assert_eq!(url.path_for("evt_1"), "/internal/webhooks/evt_1?full=1");
    // an ID cannot add a segment, a query, a fragment or an authority
    assert_eq!(
        url.path_for("../a/b?c=d#e@f%g h\r\n"),
        "/internal/webhooks/..%2Fa%2Fb%3Fc%3Dd%23e%40f%25g%20h%0D%0A?full=1"
    );
}

#[test]
fn values_as_written() {
    let r = reconcile_of(&held(
        "      sql: {url: \"postgres://reader@db/app\", query: \"select 1 from processed_webhook_events where event_id = $1\"}\n      done: [200, 204]\n      not_done: [404, 410]\n      delivered_status: 202\n      timeout: 2s\n      every: 10s\n",
    ));
    assert_eq!(r.done, vec![200, 204]);
    assert_eq!(r.not_done, vec![404, 410]);
    assert_eq!(r.delivered_status, 202);
    assert_eq!(
        (r.timeout, r.every),
        (Duration::from_secs(2), Duration::from_secs(10))
    );
    assert!(matches!(r.ask, Ask::Sql { .. }));
}

#[test]
fn refused_without_hold() {
    let text = route("    reconcile:\n      url: \"http://127.0.0.1:3000/w/{id}\"\n");
    one_error(&text, 12, 5, "reconcile needs `on_ambiguous: hold`");
}

#[test]
fn refusals_with_their_positions() {
    let url = "      url: \"http://127.0.0.1:3000/w/{id}\"\n";
    one_error(&held("      done: [200]\n"), 13, 5, "reconcile needs `url`");
    one_error(
        &held("      url: \"http://h/{id}\"\n      sql: {url: \"postgres://db/app\", query: \"select 1\"}\n"),
        13,
        5,
        "not both",
    );
    one_error(
        &held(&format!("{url}      done: []\n")),
        15,
        13,
        "at least one status",
    );
    one_error(
        &held(&format!("{url}      done: [200, 404]\n")),
        15,
        13,
        "404 is in both",
    );
    one_error(
        &held(&format!("{url}      done: [99]\n")),
        15,
        14,
        "not an HTTP status",
    );
    one_error(&held(&format!("{url}      timeout: soon\n")), 15, 16, "");
    one_error(
        &held("      url: \"http://{id}/w\"\n"),
        14,
        12,
        "{id} must appear once",
    );
    one_error(
        &held("      url: \"http://h/w/\"\n"),
        14,
        12,
        "{id} must appear once",
    );
    one_error(&held("      url: \"ftp://h/{id}\"\n"), 14, 12, "http://");
    one_error(
        &held(&format!(
            "{url}      headers: {{authorization: Bearer xyz}}\n"
        )),
        15,
        32,
        "must be a reference",
    );
}

#[test]
fn warns_when_every_is_shorter_than_timeout() {
    let loaded = ok(&held(
        "      url: \"http://127.0.0.1:3000/w/{id}\"\n      timeout: 10s\n      every: 5s\n",
    ));
    assert!(
        loaded
            .warnings
            .iter()
            .any(|w| w.contains("every is shorter than timeout")),
        "{:?}",
        loaded.warnings
    );
}
