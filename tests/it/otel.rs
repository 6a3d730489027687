//! OpenTelemetry traces (SPEC §19), asserted from what a real collector
//! (rotel, `common::collector`) received: the trace tree of a delivery and
//! its attributes, the consumer's `traceparent` (the CLIENT span's), a
//! sender's context replaced or, on a trusting route, continued; the links
//! of a replay, a 409, a 422 and a reclaim to the delivering send, and the
//! record's `trace_id`; sampling; and a collector stopped (SIGSTOP) or
//! absent: every request answered as before, the spans dropped and counted.

use std::time::{Duration, Instant};

use crate::common::collector::{Collector, Span};
use crate::common::*;
use crate::stopping::signal;
use idemgate::verify::sign;

const SECRET: &str = "otel-test-secret";
/// In every payload: it must never reach the collector.
const MARK: &str = "payload-mark-7f3a";
const SENDER_PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const SERVER_KIND: &str = "SPAN_KIND_SERVER";

fn telemetry(c: &Collector, extra: &str) -> String {
    format!(
        "telemetry:\n  otlp:\n    endpoint: \"{}\"\n{extra}",
        c.endpoint()
    )
}

/// Route `r` (signed, hmac) and route `t` (the same, trusting the
/// sender's trace context), traced to `c`.
fn traced(tag: &str, c: &Collector, otlp_extra: &str) -> Harness {
    let verify = "    verify:\n      scheme: hmac-sha256\n      header: X-Signature\n      secrets: [env:HOOK_SECRET]\n";
    Harness::sqlite(tag)
        .route("r", "/hooks/r", verify)
        .route(
            "t",
            "/hooks/t",
            &format!("{verify}    trust_inbound_trace: true\n"),
        )
        .yaml(&telemetry(c, otlp_extra))
        .env("HOOK_SECRET", SECRET)
        .start()
}

fn body(id: &str) -> Vec<u8> {
    format!("{{\"id\":\"{id}\",\"note\":\"{MARK}\"}}").into_bytes()
}

/// A signed delivery of `id` to `path` with more header fields.
fn signed(h: &Harness, path: &str, id: &str, body: &[u8], more: &[(&str, &str)]) -> Response {
    let mut headers = vec![
        ("X-Event-ID".to_string(), id.to_string()),
        (
            "X-Signature".to_string(),
            sign::hmac_hex(SECRET.as_bytes(), body),
        ),
    ];
    headers.extend(more.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    h.post(path, &headers, body)
}

/// The `traceparent`s the consumer got for `id`, in order: (trace ID,
/// span ID, flags).
fn consumer_parents(h: &Harness, id: &str) -> Vec<(String, String, String)> {
    h.up.received()
        .iter()
        .filter(|r| r.header("X-Event-ID") == Some(id))
        .map(|r| {
            let tp = r.header("traceparent").expect("a traceparent");
            let parts: Vec<&str> = tp.split('-').collect();
            assert_eq!((parts.len(), parts[0]), (4, "00"), "{tp}");
            (parts[1].into(), parts[2].into(), parts[3].into())
        })
        .collect()
}

/// The SERVER spans for `id` with `outcome`, once there are `n`.
fn servers(c: &Collector, id: &str, outcome: &str, n: usize) -> Vec<Span> {
    let pick = |spans: &[Span]| -> Vec<Span> {
        spans
            .iter()
            .filter(|s| {
                s.kind == SERVER_KIND
                    && s.attr("idemgate.event_id") == Some(id)
                    && s.attr("idemgate.outcome") == Some(outcome)
            })
            .cloned()
            .collect()
    };
    let spans = c.wait(Duration::from_secs(15), |s| pick(s).len() >= n);
    pick(&spans)
}

#[track_caller]
fn child<'a>(spans: &'a [Span], parent: &Span, name: &str) -> &'a Span {
    let found: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_id == parent.id && s.name == name)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {name} under {}: {spans:#?}",
        parent.name
    );
    found[0]
}

#[test]
fn a_delivery_is_one_trace_and_the_consumer_gets_its_client_span() {
    let Some(c) = Collector::start("tree") else {
        return;
    };
    let h = traced("otel-tree", &c, "");
    let r = signed(
        &h,
        "/hooks/r",
        "e1",
        &body("e1"),
        &[("traceparent", SENDER_PARENT), ("tracestate", "vendor=1")],
    );
    assert_eq!(r.status, 200, "{r:?}");

    // the consumer's parent is a new trace's CLIENT span, not the sender's
    let parents = consumer_parents(&h, "e1");
    assert_eq!(parents.len(), 1);
    let (trace_id, client_id, flags) = parents[0].clone();
    assert_ne!(trace_id, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(flags, "01");
    let got = &h.up.received()[0];
    assert_eq!(
        got.header("tracestate"),
        None,
        "the sender's tracestate is dropped"
    );

    let spans = c.trace(&trace_id, 5);
    assert_eq!(spans.len(), 5, "{spans:#?}");
    let server = servers(&c, "e1", "forwarded", 1).remove(0);
    assert_eq!(server.trace_id, trace_id);
    assert_eq!(
        (server.parent_id.as_str(), server.name.as_str()),
        ("", "POST /hooks/r")
    );
    for (key, value) in [
        ("http.request.method", "POST"),
        ("url.path", "/hooks/r"),
        ("http.route", "/hooks/r"),
        ("client.address", "127.0.0.1"),
        ("network.protocol.version", "1.1"),
        ("idemgate.route", "r"),
        ("idemgate.attempt", "1"),
        ("http.response.status_code", "200"),
    ] {
        assert_eq!(server.attr(key), Some(value), "{key}: {server:#?}");
    }
    assert_eq!(server.attr("error.type"), None);
    assert_eq!(server.status, "STATUS_CODE_UNSET");

    let verify = child(&spans, &server, "idemgate.verify");
    assert_eq!(verify.attr("idemgate.verify.result"), Some("valid"));
    let claim = child(&spans, &server, "idemgate.claim");
    assert_eq!(claim.attr("db.system.name"), Some("sqlite"));
    assert_eq!(claim.attr("idemgate.store.outcome"), Some("claimed"));
    let settle = child(&spans, &server, "idemgate.settle");
    assert_eq!(settle.attr("db.system.name"), Some("sqlite"));
    assert_eq!(settle.attr("idemgate.store.outcome"), Some("delivered"));
    let send = child(&spans, &server, "POST");
    assert_eq!(send.kind, "SPAN_KIND_CLIENT");
    assert_eq!(
        send.id, client_id,
        "the consumer's parent is the CLIENT span"
    );
    assert_eq!(send.attr("server.address"), Some("127.0.0.1"));
    assert_eq!(send.attr("http.response.status_code"), Some("200"));
    assert_eq!(send.attr("http.request.resend_count"), None);

    // never the payload, a header value or the secret
    let text = c.text();
    let signature = sign::hmac_hex(SECRET.as_bytes(), &body("e1"));
    for secret in [MARK, SECRET, signature.as_str(), "vendor=1"] {
        assert!(!text.contains(secret), "{secret} reached the collector");
    }
    // the request's log line carries the trace ID
    let line = format!("trace_id=\"{trace_id}\"");
    assert!(
        wait_until(Duration::from_secs(5), || h.log().contains(&line)),
        "{}",
        h.log()
    );

    // a signature that does not verify: 401, the verify span says so
    let mut headers = vec![("X-Event-ID".to_string(), "e-bad".to_string())];
    headers.push(("X-Signature".to_string(), "00".repeat(32)));
    assert_eq!(h.post("/hooks/r", &headers, &body("e-bad")).status, 401);
    let bad = servers(&c, "e-bad", "invalid_signature", 1).remove(0);
    let spans = c.trace(&bad.trace_id, 2);
    let verify = child(&spans, &bad, "idemgate.verify");
    assert_eq!(verify.attr("idemgate.verify.result"), Some("invalid"));
    assert_eq!(verify.status, "STATUS_CODE_ERROR");
    assert_eq!(bad.attr("http.response.status_code"), Some("401"));
    assert_eq!(bad.attr("error.type"), None, "a 4xx is no server error");
}

#[test]
fn duplicates_link_to_the_send_their_record_remembers() {
    let Some(c) = Collector::start("links") else {
        return;
    };
    let h = traced("otel-links", &c, "");
    let link_of = |s: &Span| -> (String, String, String) {
        assert_eq!(s.links.len(), 1, "{s:#?}");
        let l = &s.links[0];
        let why = l
            .attributes
            .get("idemgate.link")
            .cloned()
            .unwrap_or_default();
        (l.trace_id.clone(), l.span_id.clone(), why)
    };

    // delivered, then replayed and refused with another payload
    assert_eq!(signed(&h, "/hooks/r", "d1", &body("d1"), &[]).status, 200);
    let (trace1, send1, _) = consumer_parents(&h, "d1").remove(0);
    let replay = signed(&h, "/hooks/r", "d1", &body("d1"), &[]);
    assert_eq!(replay.status, 200, "{replay:?}");
    assert_eq!(replay.header("Idempotent-Replayed"), Some("true"));
    let other = b"{\"id\":\"d1\",\"other\":true}";
    assert_eq!(signed(&h, "/hooks/r", "d1", other, &[]).status, 422);
    let replayed = servers(&c, "d1", "replayed", 1).remove(0);
    assert_eq!(
        link_of(&replayed),
        (trace1.clone(), send1.clone(), "replayed".into())
    );
    assert_ne!(
        replayed.trace_id, trace1,
        "a duplicate has a trace of its own"
    );
    let mismatch = servers(&c, "d1", "digest_mismatch", 1).remove(0);
    assert_eq!(
        link_of(&mismatch),
        (trace1.clone(), send1.clone(), "mismatch".into())
    );
    // the record shows the delivering send's trace
    let rec = show(&h.store, "r", "d1");
    assert_eq!(rec["trace_id"], trace1.as_str(), "{rec}");
    assert_eq!(rec["span_id"], send1.as_str(), "{rec}");

    // in flight: the duplicate's 409 links to the send under way
    h.up.hold("f1", 200, Duration::from_millis(1500));
    let first = {
        let addr = h.addr;
        let b = body("f1");
        let sig = sign::hmac_hex(SECRET.as_bytes(), &b);
        std::thread::spawn(move || {
            let mut client = Client::connect(addr).unwrap();
            let headers = [("X-Event-ID", "f1"), ("X-Signature", sig.as_str())];
            client.request("POST", "/hooks/r", &headers, &b).unwrap()
        })
    };
    assert!(wait_until(Duration::from_secs(5), || h.up.count("f1") == 1));
    let (trace_f, send_f, _) = consumer_parents(&h, "f1").remove(0);
    let busy = signed(&h, "/hooks/r", "f1", &body("f1"), &[]);
    assert_eq!(busy.status, 409, "{busy:?}");
    assert_eq!(first.join().unwrap().status, 200);
    let in_flight = servers(&c, "f1", "in_flight", 1).remove(0);
    assert_eq!(link_of(&in_flight), (trace_f, send_f, "in_flight".into()));

    // the consumer fails, the sender retries: the reclaim links to the failed send
    h.up.script("x1", vec![Reply::status(500), Reply::status(200)]);
    assert_eq!(signed(&h, "/hooks/r", "x1", &body("x1"), &[]).status, 500);
    assert_eq!(signed(&h, "/hooks/r", "x1", &body("x1"), &[]).status, 200);
    let sends = consumer_parents(&h, "x1");
    assert_eq!(sends.len(), 2);
    let retried = c
        .wait(Duration::from_secs(15), |s| {
            s.iter().any(|s| {
                s.kind == SERVER_KIND
                    && s.attr("idemgate.event_id") == Some("x1")
                    && s.attr("idemgate.attempt") == Some("2")
            })
        })
        .into_iter()
        .find(|s| {
            s.kind == SERVER_KIND
                && s.attr("idemgate.event_id") == Some("x1")
                && s.attr("idemgate.attempt") == Some("2")
        })
        .unwrap();
    assert_eq!(
        link_of(&retried),
        (sends[0].0.clone(), sends[0].1.clone(), "reclaimed".into())
    );
    let rec = show(&h.store, "r", "x1");
    assert_eq!(
        rec["trace_id"],
        sends[1].0.as_str(),
        "the latest send: {rec}"
    );
    assert_eq!(rec["span_id"], sends[1].1.as_str(), "{rec}");
    // the first delivery of an event links to nothing
    let fresh = servers(&c, "x1", "forwarded", 2);
    let first_try = fresh
        .iter()
        .find(|s| s.attr("idemgate.attempt") == Some("1"))
        .unwrap();
    assert!(first_try.links.is_empty(), "{first_try:#?}");
    assert_eq!(first_try.attr("error.type"), Some("500"), "a relayed 5xx");
}

#[test]
fn a_trusting_route_continues_the_senders_trace_and_others_start_their_own() {
    let Some(c) = Collector::start("trust") else {
        return;
    };
    let h = traced("otel-trust", &c, "");
    let sender_trace = "0af7651916cd43dd8448eb211c80319c";
    let more = [("traceparent", SENDER_PARENT), ("tracestate", "vendor=1")];
    assert_eq!(signed(&h, "/hooks/t", "t1", &body("t1"), &more).status, 200);
    let (trace_id, client_id, _) = consumer_parents(&h, "t1").remove(0);
    assert_eq!(trace_id, sender_trace, "continued");
    let got =
        h.up.received()
            .into_iter()
            .find(|r| r.header("X-Event-ID") == Some("t1"))
            .unwrap();
    assert_eq!(
        got.header("tracestate"),
        Some("vendor=1"),
        "a trusted tracestate goes on"
    );
    let server = servers(&c, "t1", "forwarded", 1).remove(0);
    assert_eq!(server.trace_id, sender_trace);
    assert_eq!(
        server.parent_id, "b7ad6b7169203331",
        "the sender's span is the parent"
    );
    let spans = c.trace(sender_trace, 5);
    assert_eq!(child(&spans, &server, "POST").id, client_id);

    // an invalid traceparent on a trusting route: a new root
    let bad = [(
        "traceparent",
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",
    )];
    assert_eq!(signed(&h, "/hooks/t", "t2", &body("t2"), &bad).status, 200);
    let (trace2, _, _) = consumer_parents(&h, "t2").remove(0);
    assert_ne!(trace2, "00000000000000000000000000000000");
    let server2 = servers(&c, "t2", "forwarded", 1).remove(0);
    assert_eq!(
        (server2.trace_id.as_str(), server2.parent_id.as_str()),
        (trace2.as_str(), "")
    );

    // a sender's unsampled context on a trusting route is followed: not recorded
    let unsampled = [(
        "traceparent",
        "00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
    )];
    assert_eq!(
        signed(&h, "/hooks/t", "t3", &body("t3"), &unsampled).status,
        200
    );
    let (trace3, _, flags3) = consumer_parents(&h, "t3").remove(0);
    assert_eq!(
        (trace3.as_str(), flags3.as_str()),
        ("1af7651916cd43dd8448eb211c80319c", "00")
    );
    assert_eq!(
        show(&h.store, "t", "t3")["trace_id"],
        serde_json::Value::Null
    );
}

#[test]
fn with_sample_0_nothing_is_recorded_and_the_consumer_still_gets_a_parent() {
    let Some(c) = Collector::start("sample") else {
        return;
    };
    let h = traced("otel-sample", &c, "    sample: 0.0\n");
    for i in 0..20 {
        let id = format!("s{i}");
        assert_eq!(signed(&h, "/hooks/r", &id, &body(&id), &[]).status, 200);
        let (_, _, flags) = consumer_parents(&h, &id).remove(0);
        assert_eq!(flags, "00", "not sampled");
    }
    assert_eq!(
        show(&h.store, "r", "s0")["trace_id"],
        serde_json::Value::Null
    );
    // the log still names each request's trace
    assert!(wait_until(Duration::from_secs(5), || h
        .log()
        .contains("trace_id=")));
    std::thread::sleep(Duration::from_millis(2500));
    assert!(c.spans().is_empty(), "{:#?}", c.spans());
    assert_eq!(h.metric("idemgate_spans_dropped_total"), 0.0);
}

#[test]
fn without_telemetry_nothing_is_traced_and_the_request_goes_on_unchanged() {
    let h = Harness::sqlite("otel-off")
        .route("r", "/hooks/r", "    verify: none\n")
        .start();
    let mut c = h.client();
    let headers = [("X-Event-ID", "o1"), ("traceparent", SENDER_PARENT)];
    assert_eq!(
        c.request("POST", "/hooks/r", &headers, b"{}")
            .unwrap()
            .status,
        200
    );
    let got = &h.up.received()[0];
    assert_eq!(
        got.header("traceparent"),
        Some(SENDER_PARENT),
        "passed as any header"
    );
    assert!(wait_until(Duration::from_secs(5), || h
        .log()
        .contains("event_id=\"o1\"")));
    assert!(!h.log().contains("trace_id"), "{}", h.log());
    assert_eq!(
        show(&h.store, "r", "o1")["trace_id"],
        serde_json::Value::Null
    );
    assert!(h.metrics().contains("idemgate_spans_dropped_total 0"));
}

/// `/proc/PID/status`'s peak resident set, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

/// Deliveries of `prefix0..prefixN` (unsigned route `u`) from `threads`
/// senders; every answer's status.
fn deliver_many(h: &Harness, prefix: &str, n: usize, threads: usize) -> Vec<u16> {
    let addr = h.addr;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let prefix = prefix.to_string();
            std::thread::spawn(move || {
                let mut client = Client::connect(addr).unwrap();
                let mut statuses = Vec::new();
                for i in (t..n).step_by(threads) {
                    let id = format!("{prefix}{i}");
                    let headers = [("X-Event-ID", id.as_str())];
                    let r = match client.request("POST", "/hooks/u", &headers, b"{}") {
                        Ok(r) => r,
                        Err(_) => {
                            client = Client::connect(addr).unwrap();
                            client.request("POST", "/hooks/u", &headers, b"{}").unwrap()
                        }
                    };
                    statuses.push(r.status);
                }
                statuses
            })
        })
        .collect();
    handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect()
}

#[test]
fn a_stopped_collector_costs_requests_nothing_and_every_drop_is_counted() {
    let Some(c) = Collector::start("stopped") else {
        return;
    };
    let h = Harness::sqlite("otel-stopped")
        .route("u", "/hooks/u", "    verify: none\n")
        .yaml(&telemetry(&c, ""))
        .start();
    // traced while the collector answers
    assert_eq!(deliver_many(&h, "warm", 200, 4), vec![200; 200]);
    c.wait(Duration::from_secs(15), |s| s.len() >= 800);
    let rss_before = peak_rss_kib(h.px.pid().unwrap());

    signal(c.pid(), "-STOP");
    let started = Instant::now();
    let statuses = deliver_many(&h, "n", 10_000, 8);
    let took = started.elapsed();
    assert_eq!(statuses.len(), 10_000);
    assert!(
        statuses.iter().all(|&s| s == 200),
        "every delivery answered 200"
    );
    assert_eq!(h.up.total(), 10_200);
    // 4 spans a delivery; at most a queue's worth (2,048) and one batch
    // (512) wait for the collector, every other one is dropped and counted
    let spans = 4.0 * 10_000.0;
    let counted = || h.metric("idemgate_spans_dropped_total");
    let dropped_enough = wait_until(Duration::from_secs(15), || {
        counted() >= spans - 2048.0 - 512.0
    });
    let dropped = counted();
    let rss_peak = peak_rss_kib(h.px.pid().unwrap());
    eprintln!(
        "10,000 deliveries with the collector stopped: {took:?}, {dropped} spans dropped, \
         peak RSS {rss_peak} KiB (before: {rss_before} KiB)"
    );
    assert!(dropped_enough, "dropped {dropped} of {spans}");
    assert!(dropped <= spans, "{dropped}");
    assert!(
        rss_peak < rss_before + 64 * 1024,
        "bounded: {rss_peak} KiB, {rss_before} KiB before"
    );
    // the batch under way fails once its time runs out: one WARN, not one
    // per batch
    let warned = "the collector did not take spans";
    let said = wait_until(Duration::from_secs(15), || h.log().contains(warned));
    std::thread::sleep(Duration::from_secs(6));
    assert!(said, "{}", h.log());
    assert_eq!(h.log().matches(warned).count(), 1, "one WARN: {}", h.log());

    // the collector back: spans flow again, and the log says so
    signal(c.pid(), "-CONT");
    assert_eq!(deliver_many(&h, "back", 10, 1), vec![200; 10]);
    c.wait(Duration::from_secs(20), |s| {
        s.iter()
            .any(|s| s.attr("idemgate.event_id") == Some("back9"))
    });
    let recovered = || h.log().contains("the collector takes spans again");
    assert!(
        wait_until(Duration::from_secs(10), recovered),
        "{}",
        h.log()
    );
}

#[test]
fn an_absent_collector_drops_and_counts_every_span() {
    let port = free_port();
    let h = Harness::sqlite("otel-absent")
        .route("u", "/hooks/u", "    verify: none\n")
        .yaml(&format!(
            "telemetry:\n  otlp:\n    endpoint: \"http://127.0.0.1:{port}\"\n"
        ))
        .start();
    assert_eq!(deliver_many(&h, "a", 100, 2), vec![200; 100]);
    // SERVER, claim, CLIENT and settle for each
    let all = wait_until(Duration::from_secs(20), || {
        h.metric("idemgate_spans_dropped_total") == 400.0
    });
    assert!(all, "{}", h.metric("idemgate_spans_dropped_total"));
    assert_eq!(h.up.total(), 100);
}
