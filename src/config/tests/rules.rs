//! Each validation rule, with the exact position it reports.

use super::{errors, ok, one_error, route, HEAD};

#[test]
fn unknown_keys_everywhere_point_at_the_key() {
    let e = one_error(
        &format!("colour: blue\n{}", route("")),
        1,
        1,
        "unknown field `colour`",
    );
    assert_eq!(e.path, "(root)");
    let flow = route("").replace(
        "    match:\n      path_prefix: /hooks/alpha\n",
        "    match: {path_prefix: /x, hots: a}\n",
    );
    let e = one_error(&flow, 7, 30, "unknown field `hots`");
    assert_eq!(e.path, "routes[0].match");
    one_error(
        &route("    match: {path_prefix: /x}\n"),
        12,
        5,
        "routes[0]: duplicate field `match`",
    );
    one_error(
        &format!("defaults:\n  leese: 5s\n{}", route("")),
        2,
        3,
        "unknown field `leese`",
    );
    one_error(
        &route(
            "    verify:\n      scheme: github\n      secrets: [env:PLAIN]\n      tolerence: 5m\n",
        ),
        15,
        7,
        "routes[0].verify: unknown field `tolerence`",
    );
    one_error(
        &route("    event_id2: x\n"),
        12,
        5,
        "unknown field `event_id2`",
    );
}

#[test]
fn unknown_enum_values_are_positioned() {
    one_error(
        &route("    digest: sha1\n"),
        12,
        13,
        "routes[0].digest: unknown variant `sha1`",
    );
    one_error(
        &route("    provider: paypal\n"),
        12,
        15,
        "unknown variant `paypal`",
    );
    one_error(
        &route("    strip_prefix: maybe\n"),
        12,
        19,
        "routes[0].strip_prefix: invalid type",
    );
}

#[test]
fn empty_file_is_an_error() {
    one_error("", 1, 1, "the config file is empty");
    one_error("# only a comment\n", 1, 1, "the config file is empty");
    one_error("---\n", 1, 1, "the config file is empty");
    one_error("{}\n", 1, 1, "the config file is empty");
    let e = one_error(
        "listen: x\n  admin_listen: y\n",
        2,
        15,
        "mapping values are not allowed",
    );
    assert_eq!(e.path, "(root)");
}

#[test]
fn duplicate_match_points_at_the_second_match() {
    let text = format!(
        "{HEAD}  - name: alpha
    match: {{path_prefix: /hooks/a/}}
    upstream: \"http://127.0.0.1:3001\"
    event_id: {{header: X-Event-ID}}
  - name: beta
    match: {{path_prefix: /hooks/a}}
    upstream: \"http://127.0.0.1:3001\"
    event_id: {{header: X-Event-ID}}
  - name: gamma
    match: {{path_prefix: /hooks/a, host: Hooks.Example.com}}
    upstream: \"http://127.0.0.1:3001\"
    event_id: {{header: X-Event-ID}}
"
    );
    let e = one_error(
        &text,
        11,
        5,
        "duplicate match (host *, path_prefix /hooks/a): route `alpha`",
    );
    assert_eq!(e.path, "routes[1].match");
}

#[test]
fn route_names_must_match_the_pattern() {
    let long = "a".repeat(65);
    one_error(
        &route("").replace("name: alpha", &format!("name: {long}")),
        6,
        11,
        "invalid route name",
    );
    one_error(
        &route("").replace("name: alpha", "name: al.pha"),
        6,
        11,
        "invalid route name",
    );
    let l = ok(&route("").replace("name: alpha", &format!("name: a_b-9{}", "x".repeat(59))));
    assert_eq!(l.config.routes[0].name.len(), 64);
}

#[test]
fn path_prefix_rules_and_normalisation() {
    one_error(
        &route("").replace("/hooks/alpha", "hooks/alpha"),
        8,
        20,
        "must start with `/`",
    );
    one_error(
        &route("").replace("/hooks/alpha", "/hooks?x=1"),
        8,
        20,
        "plain path",
    );
    let host = route("").replace(
        "      path_prefix",
        "      host: \"https://h/\"\n      path_prefix",
    );
    one_error(&host, 8, 13, "invalid host");
    let l = ok(&route("").replace("/hooks/alpha", "/hooks/alpha/"));
    assert_eq!(l.config.routes[0].path_prefix, "/hooks/alpha");
    let l = ok(&route("").replace("/hooks/alpha", "/"));
    assert_eq!(l.config.routes[0].path_prefix, "/");
}

#[test]
fn missing_route_fields_are_all_reported() {
    let text = format!("{HEAD}  - strip_prefix: true\n    match: {{host: a.example}}\n");
    let errs = errors(&text);
    let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert_eq!(errs.len(), 4, "{}", shown.join("\n"));
    for needle in [
        "6:5: routes[0]: required field `name`",
        "6:5: routes[0]: required field `upstream`",
        "6:5: routes[0]: required field `event_id`",
        "7:5: routes[0].match: required field `path_prefix`",
    ] {
        assert!(shown.iter().any(|e| e.contains(needle)), "{shown:?}");
    }
}

#[test]
fn event_id_needs_exactly_one_source() {
    let none = route("").replace(
        "    event_id:\n      header: X-Event-ID\n",
        "    event_id: {}\n",
    );
    one_error(&none, 10, 5, "found none");
    let both = route("      json_pointer: /id\n");
    one_error(&both, 10, 5, "found both");
    let missing = route("").replace("    event_id:\n      header: X-Event-ID\n", "");
    let e = one_error(&missing, 6, 5, "required field `event_id` is missing");
    assert_eq!(e.path, "routes[0]");
    one_error(
        &route("").replace("X-Event-ID", "X Event"),
        11,
        15,
        "not a valid HTTP header name",
    );
}

#[test]
fn pass_through_route_needs_no_event_id() {
    let text =
        route("    guard_methods: []\n").replace("    event_id:\n      header: X-Event-ID\n", "");
    let l = ok(&text);
    assert!(l.config.routes[0].guard_methods.is_empty());
}

#[test]
fn json_pointers_are_checked() {
    let ptr = |p: &str| route("").replace("header: X-Event-ID", &format!("json_pointer: \"{p}\""));
    one_error(&ptr("id"), 11, 21, "must be empty or start with `/`");
    one_error(&ptr("/a~2b"), 11, 21, "`~` must be followed by 0 or 1");
    one_error(&ptr("/a~"), 11, 21, "`~` must be followed by 0 or 1");
    for good in ["", "/", "/id", "/a~0b/c~1d", "/data/0"] {
        let l = ok(&ptr(good));
        assert_eq!(
            l.config.routes[0].event_id,
            crate::config::EventIdSource::JsonPointer(good.parse().unwrap())
        );
    }
}

#[test]
fn digest_ignore_requires_json_digest() {
    one_error(
        &route("    digest_ignore: [/delivery_attempt]\n"),
        12,
        5,
        "digest_ignore requires `digest: json`",
    );
    let e = one_error(
        &format!("defaults:\n  digest_ignore: [/a]\n{}", route("")),
        2,
        3,
        "digest_ignore requires `digest: json`",
    );
    assert_eq!(e.path, "defaults.digest_ignore");
    one_error(
        &route("    digest: json\n    digest_ignore: [/ok, bad]\n"),
        13,
        26,
        "invalid JSON pointer `bad`",
    );
    let l = ok(&route(
        "    digest: json\n    digest_ignore: [/delivery_attempt, /meta/sent_at]\n",
    ));
    assert_eq!(
        l.config.routes[0].digest_ignore,
        vec!["/delivery_attempt", "/meta/sent_at"]
    );
    ok(&route("    digest_ignore: []\n"));
}

#[test]
fn lease_must_exceed_upstream_timeout() {
    // Only the timeout is on the route (built-in lease 60s): point at it.
    let e = one_error(
        &route("    upstream_timeout: 60s\n"),
        12,
        5,
        "lease (1m, built-in default) must be longer than upstream_timeout (1m)",
    );
    assert_eq!(e.path, "routes[0].upstream_timeout");
    // Both from defaults: point at the route, say where the values came from.
    let text = format!(
        "defaults:\n  lease: 5s\n  upstream_timeout: 10s\n{}",
        route("")
    );
    let e = one_error(
        &text,
        9,
        5,
        "lease (5s, from defaults) must be longer than upstream_timeout (10s, from defaults)",
    );
    assert_eq!(e.path, "routes[0]");
    ok(&route("    lease: 11s\n    upstream_timeout: 10s\n"));
}

/// Issue 20's rules: a prefix in normal form, a host without a port, an
/// idempotency key header idemgate does not own, no method both guarded and
/// unverified, `verify: none` as the only word for "no verification".
#[test]
fn issue_20_rules_for_paths_and_hosts() {
    one_error(
        &route("").replace("/hooks/alpha", "/hooks/%61lpha"),
        8,
        20,
        "not in normal form: requests are matched after RFC 3986 normalisation, write `/hooks/alpha`",
    );
    one_error(
        &route("").replace("/hooks/alpha", "/hooks//alpha/./x"),
        8,
        20,
        "write `/hooks/alpha/x`",
    );
    one_error(
        &route("").replace("/hooks/alpha", "/hooks/%2Falpha"),
        8,
        20,
        "encoded `/`",
    );
    let with_host = |h: &str| {
        route("").replace(
            "      path_prefix",
            &format!("      host: \"{h}\"\n      path_prefix"),
        )
    };
    one_error(&with_host("a.example:443"), 8, 13, "has a port");
    one_error(&with_host("[::1]:443"), 8, 13, "has a port");
    one_error(&with_host("[nope]"), 8, 13, "IPv6");
    let l = ok(&with_host("A.Example."));
    assert_eq!(l.config.routes[0].host.as_deref(), Some("a.example"));
    assert_eq!(
        ok(&with_host("[::1]")).config.routes[0].host.as_deref(),
        Some("[::1]")
    );
}

#[test]
fn issue_20_rules_for_headers_methods_and_verify() {
    for h in [
        "Transfer-Encoding",
        "host",
        "proxy-x",
        "TE",
        "Expect",
        "connection",
    ] {
        one_error(
            &route(&format!("    idempotency_key_header: {h}\n")),
            12,
            29,
            "cannot carry the idempotency key",
        );
    }
    one_error(
        &route("    verify: none\n    unverified_methods: [GET, Post]\n"),
        13,
        25,
        "POST is in guard_methods",
    );
    one_error(
        &route("    unverified_methods: [G ET]\n"),
        12,
        26,
        "not a valid HTTP method",
    );
    let l = ok(&route(
        "    verify: none\n    guard_methods: [PUT]\n    unverified_methods: [post]\n",
    ));
    assert_eq!(
        l.config.routes[0].unverified_methods,
        vec![http::Method::POST]
    );
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    one_error(
        &route("    verify: nope\n"),
        12,
        13,
        "expected a verify block (scheme, secrets, ...) or `none`",
    );
    // `null` is no value, as for any key: the route warns
    assert_eq!(ok(&route("    verify: null\n")).warnings.len(), 1);
    // a pass-through route needs no verification, a guarded one gets the warning
    assert!(ok(&route("    guard_methods: []\n")).warnings.is_empty());
    let l = ok(&route("    guard_methods: [PUT]\n"));
    assert!(l.warnings[0].contains("anyone who can reach the listener can occupy event IDs"));
}
