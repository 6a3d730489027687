//! `telemetry:` (SPEC §19): its defaults, its refusals with their
//! positions, headers from secrets, and `trust_inbound_trace`.

use super::{errors, ok, one_error, route};

/// The standard route, then a `telemetry` block from line 12.
fn with(block: &str) -> String {
    format!("{}telemetry:\n{block}", route(""))
}

#[test]
fn defaults_and_headers_from_secrets() {
    let loaded = ok(&with(
        "  otlp:\n    endpoint: \"http://127.0.0.1:4318/base\"\n    headers: {authorization: env:PLAIN}\n",
    ));
    let t = loaded.config.telemetry.unwrap();
    let otlp = t.otlp.unwrap();
    assert_eq!(
        (otlp.endpoint.host.as_str(), otlp.endpoint.port),
        ("127.0.0.1", 4318)
    );
    assert_eq!(otlp.path, "/base/v1/traces");
    assert_eq!(otlp.sample, 1.0);
    assert_eq!(otlp.service_name, "idemgate");
    assert_eq!(otlp.headers[0].1.as_bytes(), b"plain-secret");
    assert!(!format!("{otlp:?}").contains("plain-secret"));
    assert_eq!(t.trace_url, None);
    // without the block: no tracing; the route does not trust a sender
    let plain = ok(&route(""));
    assert!(plain.config.telemetry.is_none());
    assert!(!plain.config.routes[0].trust_inbound_trace);
    let trusting = ok(&route("    trust_inbound_trace: true\n"));
    assert!(trusting.config.routes[0].trust_inbound_trace);
}

#[test]
fn a_trace_url_alone_is_a_link_without_tracing() {
    let t = ok(&with(
        "  trace_url: \"https://grafana.example/explore?traceId={trace_id}\"\n",
    ))
    .config
    .telemetry
    .unwrap();
    assert!(t.otlp.is_none());
    assert_eq!(
        t.trace_url.as_deref(),
        Some("https://grafana.example/explore?traceId={trace_id}")
    );
}

#[test]
fn wrong_values_are_refused_at_their_position() {
    let otlp = |line: &str| {
        with(&format!(
            "  otlp:\n    endpoint: \"http://127.0.0.1:4318\"\n{line}"
        ))
    };
    one_error(
        &otlp("    sample: 1.5\n"),
        15,
        13,
        "not a ratio from 0 to 1",
    );
    one_error(
        &otlp("    sample: -0.1\n"),
        15,
        13,
        "not a ratio from 0 to 1",
    );
    one_error(
        &otlp("    headers: {authorization: Bearer x}\n"),
        15,
        30,
        "reference",
    );
    one_error(&otlp("    service_name: \"\"\n"), 15, 19, "non-empty");
    one_error(
        &otlp("    compression: gzip\n"),
        15,
        5,
        "unknown field `compression`",
    );
    one_error(
        &with("  otlp:\n    endpoint: \"grpc://127.0.0.1:4317\"\n"),
        14,
        15,
        "http://",
    );
    one_error(
        &with("  otlp:\n    endpoint: \"http://h:4318/?x=1\"\n"),
        14,
        15,
        "a query or fragment is not allowed",
    );
    one_error(&with("  otlp: {sample: 0.5}\n"), 13, 3, "needs `endpoint`");
    one_error(
        &with("  trace_url: \"https://g.example/explore\"\n"),
        13,
        14,
        "{trace_id}",
    );
    assert!(!errors(&with("  tracing: {}\n")).is_empty());
}
