//! Nothing internal reaches a sender (SPEC §4, §5; issue 20): no upstream
//! address or connector error in a 502/504, no store error on `/readyz`,
//! no password in a store URL shown in a message. Against the real binary,
//! a real consumer and a real SQLite store.

mod common;
mod core_util;
mod raw_upstream;

use std::time::Duration;

use common::*;
use core_util::{payload, problem_type, wait_until};
use raw_upstream::{Behavior, RawUpstream};

// ------------------------------------------------------------ nothing internal

/// The text of a problem's `detail`.
fn detail(r: &Response) -> String {
    r.json()["detail"].as_str().unwrap_or_default().to_string()
}

/// Nothing in a problem (its type, title and detail) that names the
/// upstream or the connector's words.
fn assert_tells_nothing(r: &Response, port: u16, what: &str) {
    let doc = r.json();
    let text = format!("{} {} {}", doc["type"], doc["title"], doc["detail"]);
    for leak in [
        "127.0.0.1".to_string(),
        port.to_string(),
        "refused".into(),
        "Refused".into(),
        "Peer".into(),
        "context".into(),
        "os error".into(),
    ] {
        assert!(!text.contains(&leak), "{what}: `{leak}` in {text:?}");
    }
}

/// A 502 and a 504 say what happened and nothing of where: no address, no
/// port, no connector error — on the guarded, read-whole and streamed
/// paths. The address and the error go to the warn log, and for a guarded
/// delivery to the record's `last_error`.
#[test]
fn upstream_failures_tell_the_sender_nothing_internal() {
    let dir = TempDir::new("hard-internal");
    let closed = free_port(); // nothing listens there
    let dead = format!("http://127.0.0.1:{closed}");
    let stall = RawUpstream::start(|_, _| Behavior::Stall(Vec::new()));
    let routes = [
        route("dead", "/hooks/dead", &dead, ""),
        route(
            "slow",
            "/hooks/slow",
            &stall.url(),
            "    upstream_timeout: 1s\n    lease: 5s\n",
        ),
        route("plain", "/plain", &dead, "    guard_methods: []\n"),
    ]
    .concat();
    let store = dir.sqlite_url("i.db");
    let px = Proxy::start(&dir, &store, &routes);

    let id = eid("dead");
    let r = px.deliver("/hooks/dead", Some(&id), b"{}");
    assert_eq!(
        (r.status, problem_type(&r)),
        (502, "upstream-unreachable".into())
    );
    assert_eq!(r.json()["event_id"], id.as_str());
    assert_tells_nothing(&r, closed, "guarded 502");
    let rec = show(&store, "dead", &id);
    assert_eq!(rec["state"], "failed");
    let last_error = rec["last_error"].as_str().unwrap_or_default();
    assert!(
        last_error.contains("refused") || last_error.contains("Refused"),
        "last_error keeps the cause: {rec}"
    );

    let id = eid("slow");
    let r = px.deliver("/hooks/slow", Some(&id), b"{}");
    assert_eq!(
        (r.status, problem_type(&r)),
        (504, "upstream-timeout".into())
    );
    assert_tells_nothing(&r, stall.addr.port(), "guarded 504");
    assert!(show(&store, "slow", &id)["last_error"]
        .as_str()
        .unwrap_or_default()
        .contains("no response within"));

    let mut c = px.client();
    let r = c.request("GET", "/plain/x", &[], b"").unwrap();
    assert_eq!(r.status, 502, "read whole");
    assert_tells_nothing(&r, closed, "unguarded 502");
    let mut c = px.client();
    c.send_raw(b"POST /plain/y HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n")
        .unwrap();
    let r = c.read_response(false).unwrap();
    assert_eq!(
        (r.status, problem_type(&r)),
        (502, "upstream-unreachable".into()),
        "streamed"
    );
    assert_tells_nothing(&r, closed, "streamed 502");
    assert!(!detail(&r).is_empty());

    // the operator learns where and why
    let addr = format!("127.0.0.1:{closed}");
    assert!(
        wait_until(Duration::from_secs(5), || {
            let log = px.log();
            log.lines()
                .filter(|l| l.contains("WARN") && l.contains(&addr))
                .count()
                >= 3
        }),
        "warn lines naming the upstream:\n{}",
        px.log()
    );
}

/// `/readyz` says the store does not answer, and nothing else (no path, no
/// driver message); the log has the error.
#[test]
fn readyz_names_no_store_error() {
    let dir = TempDir::new("hard-readyz");
    let up = Consumer::start().unwrap();
    let db = dir.path().join("ready.db");
    let px = Proxy::start(
        &dir,
        &dir.sqlite_url("ready.db"),
        &route("r", "/hooks/r", &up.url(), ""),
    );
    assert_eq!(px.deliver("/hooks/r", Some(&eid("x")), b"{}").status, 200);
    // the file turns to noise under the running proxy
    for suffix in ["", "-wal", "-shm"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let len = std::fs::metadata(&name).unwrap().len() as usize;
        std::fs::write(&name, payload(len, 3)).unwrap();
    }
    let r = px.deliver("/hooks/r", Some(&eid("y")), b"{}");
    assert_eq!(r.status, 503);
    assert_eq!(detail(&r), "the claim store did not answer; retry later");
    let ready = sample::get(px.admin, "/readyz").unwrap();
    assert_eq!(ready.status, 503);
    assert_eq!(
        String::from_utf8_lossy(&ready.body),
        "store: not answering\n"
    );
    assert!(
        wait_until(Duration::from_secs(5), || px
            .log()
            .contains("/readyz: the store")),
        "{}",
        px.log()
    );
}

/// A store URL in a message hides its password, even one holding `@` (the
/// userinfo ends at the last `@`), and a `password=` parameter.
#[test]
fn store_urls_in_messages_hide_passwords_holding_at_signs() {
    for (url, secret) in [
        ("mysql://idemgate:p@ss-w0rd@127.0.0.1/db", "ss-w0rd"),
        (
            "postgres://idemgate:p@ss-w0rd@127.0.0.1:notaport/db",
            "ss-w0rd",
        ),
        (
            "postgres://idemgate@127.0.0.1:notaport/db?password=hunter2",
            "hunter2",
        ),
    ] {
        for cmd in [
            &["migrate", "--store", url][..],
            &["events", "list", "--store", url][..],
        ] {
            let (code, out, err) = cli(cmd);
            assert_eq!(code, 1, "{cmd:?}: {out}{err}");
            assert!(
                err.contains("***"),
                "{cmd:?}: the URL is shown, redacted: {err}"
            );
            assert!(
                !err.contains(secret) && !out.contains(secret),
                "{cmd:?}: {err}"
            );
        }
    }
}
