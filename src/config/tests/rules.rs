//! Each validation rule, with the exact position it reports.

use super::{errors, ok, one_error, one_error_each, one_error_with_path, route, HEAD};

#[test]
fn unknown_keys_everywhere_point_at_the_key() {
    one_error_with_path(
        &format!("colour: blue\n{}", route("")),
        1,
        1,
        "(root)",
        "unknown field `colour`",
    );
    let flow = route("").replace(
        "    match:\n      path_prefix: /hooks/alpha\n",
        "    match: {path_prefix: /x, hots: a}\n",
    );
    one_error_with_path(&flow, 7, 30, "routes[0].match", "unknown field `hots`");
    let verify =
        "    verify:\n      scheme: github\n      secrets: [env:PLAIN]\n      tolerence: 5m\n";
    one_error_each(&[
        (
            route("    match: {path_prefix: /x}\n"),
            12,
            5,
            "routes[0]: duplicate field `match`",
        ),
        (
            format!("defaults:\n  leese: 5s\n{}", route("")),
            2,
            3,
            "unknown field `leese`",
        ),
        (
            route(verify),
            15,
            7,
            "routes[0].verify: unknown field `tolerence`",
        ),
        (
            route("    event_id2: x\n"),
            12,
            5,
            "unknown field `event_id2`",
        ),
    ]);
}

#[test]
fn unknown_enum_values_are_positioned() {
    one_error_each(&[
        (
            route("    digest: sha1\n"),
            12,
            13,
            "routes[0].digest: unknown variant `sha1`",
        ),
        (
            route("    provider: paypal\n"),
            12,
            15,
            "unknown variant `paypal`",
        ),
        (
            route("    strip_prefix: maybe\n"),
            12,
            19,
            "routes[0].strip_prefix: invalid type",
        ),
    ]);
}

#[test]
fn empty_file_is_an_error() {
    for empty in ["", "# only a comment\n", "---\n", "{}\n"] {
        one_error(empty, 1, 1, "the config file is empty");
    }
    one_error_with_path(
        "listen: x\n  admin_listen: y\n",
        2,
        15,
        "(root)",
        "mapping values are not allowed",
    );
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
    one_error_with_path(
        &text,
        11,
        5,
        "routes[1].match",
        "duplicate match (host *, path_prefix /hooks/a): route `alpha`",
    );
}

#[test]
fn route_names_must_match_the_pattern() {
    let long = "a".repeat(65);
    for name in [long.as_str(), "al.pha"] {
        let text = route("").replace("name: alpha", &format!("name: {name}"));
        one_error(&text, 6, 11, "invalid route name");
    }
    let l = ok(&route("").replace("name: alpha", &format!("name: a_b-9{}", "x".repeat(59))));
    assert_eq!(l.config.routes[0].name.len(), 64);
}

#[test]
fn path_prefix_rules_and_normalisation() {
    let prefix = |p: &str| route("").replace("/hooks/alpha", p);
    let host = route("").replace(
        "      path_prefix",
        "      host: \"https://h/\"\n      path_prefix",
    );
    one_error_each(&[
        (prefix("hooks/alpha"), 8, 20, "must start with `/`"),
        (prefix("/hooks?x=1"), 8, 20, "plain path"),
        (host, 8, 13, "invalid host"),
    ]);
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
    let both = route("      json_pointer: /id\n");
    let bad_header = route("").replace("X-Event-ID", "X Event");
    one_error_each(&[
        (none, 10, 5, "found none"),
        (both, 10, 5, "found both"),
        (bad_header, 11, 15, "not a valid HTTP header name"),
    ]);
    let missing = route("").replace("    event_id:\n      header: X-Event-ID\n", "");
    one_error_with_path(
        &missing,
        6,
        5,
        "routes[0]",
        "required field `event_id` is missing",
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
    let needs_json = "digest_ignore requires `digest: json`";
    let bad_pointer = route("    digest: json\n    digest_ignore: [/ok, bad]\n");
    one_error_each(&[
        (
            route("    digest_ignore: [/delivery_attempt]\n"),
            12,
            5,
            needs_json,
        ),
        (bad_pointer, 13, 26, "invalid JSON pointer `bad`"),
    ]);
    let in_defaults = format!("defaults:\n  digest_ignore: [/a]\n{}", route(""));
    one_error_with_path(&in_defaults, 2, 3, "defaults.digest_ignore", needs_json);
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
    one_error_with_path(
        &route("    upstream_timeout: 60s\n"),
        12,
        5,
        "routes[0].upstream_timeout",
        "lease (1m, built-in default) must be longer than upstream_timeout (1m)",
    );
    // Both from defaults: point at the route, say where the values came from.
    let text = format!(
        "defaults:\n  lease: 5s\n  upstream_timeout: 10s\n{}",
        route("")
    );
    one_error_with_path(
        &text,
        9,
        5,
        "routes[0]",
        "lease (5s, from defaults) must be longer than upstream_timeout (10s, from defaults)",
    );
    ok(&route("    lease: 11s\n    upstream_timeout: 10s\n"));
}

/// Issue 20's rules: a prefix in normal form, a host without a port, an
/// idempotency key header idemgate does not own, no method both guarded and
/// unverified, `verify: none` as the only word for "no verification".
#[test]
fn issue_20_rules_for_paths_and_hosts() {
    let prefix = |p: &str| route("").replace("/hooks/alpha", p);
    let with_host = |h: &str| {
        route("").replace(
            "      path_prefix",
            &format!("      host: \"{h}\"\n      path_prefix"),
        )
    };
    one_error_each(&[
        (
            prefix("/hooks/%61lpha"),
            8,
            20,
            "not in normal form: requests are matched after RFC 3986 normalisation, write `/hooks/alpha`",
        ),
        (prefix("/hooks//alpha/./x"), 8, 20, "write `/hooks/alpha/x`"),
        (prefix("/hooks/%2Falpha"), 8, 20, "encoded `/`"),
        (with_host("a.example:443"), 8, 13, "has a port"),
        (with_host("[::1]:443"), 8, 13, "has a port"),
        (with_host("[nope]"), 8, 13, "IPv6"),
    ]);
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
    let unverified_post = route("    verify: none\n    unverified_methods: [GET, Post]\n");
    one_error_each(&[
        (unverified_post, 13, 25, "POST is in guard_methods"),
        (
            route("    unverified_methods: [G ET]\n"),
            12,
            26,
            "not a valid HTTP method",
        ),
        (
            route("    verify: nope\n"),
            12,
            13,
            "expected a verify block (scheme, secrets, ...) or `none`",
        ),
    ]);
    let l = ok(&route(
        "    verify: none\n    guard_methods: [PUT]\n    unverified_methods: [post]\n",
    ));
    assert_eq!(
        l.config.routes[0].unverified_methods,
        vec![http::Method::POST]
    );
    assert!(l.warnings.is_empty(), "{:?}", l.warnings);
    // `null` is no value, as for any key: the route warns
    assert_eq!(ok(&route("    verify: null\n")).warnings.len(), 1);
    // a pass-through route needs no verification, a guarded one gets the warning
    assert!(ok(&route("    guard_methods: []\n")).warnings.is_empty());
    let l = ok(&route("    guard_methods: [PUT]\n"));
    assert!(l.warnings[0].contains("anyone who can reach the listener can occupy event IDs"));
}
