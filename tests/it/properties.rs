//! Property and fuzz tests (issue 8) for the parsers that take outside
//! input: the config file (`config::load_str`), event-ID extraction (header
//! bytes and JSON bodies), JSON pointers, and canonical JSON. Arbitrary input
//! never panics; what should round-trip does.
//!
//! Case counts follow proptest's defaults (256, or `PROPTEST_CASES`); every
//! property here is pure and the whole file runs in a few seconds.

use std::time::Duration;

use idemgate::claim::digest::{canonical_json, json_digest, parse_json_body, raw_digest};
use idemgate::claim::event_id::{
    event_id_from_json, event_id_from_json_tokens, validate_event_id, InvalidEventId,
    MAX_EVENT_ID_LEN,
};
use idemgate::claim::json_pointer::{lookup, parse_pointer, remove, JsonPointer};
use idemgate::config::{
    load_str, Config, DigestMode, EventIdSource, InFlight, OnMissingId, OnStoreError,
};
use proptest::prelude::*;
use serde_json::{json, Value};

// ---------------------------------------------------------------- helpers

/// RFC 6901 escaping of one reference token.
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

fn pointer_of(tokens: &[String]) -> String {
    tokens.iter().map(|t| format!("/{}", escape(t))).collect()
}

/// Any JSON value, a few levels deep: every kind of number (and floats
/// that print in full), strings across the UTF-16 surrogate boundary, and
/// member names whose order differs between UTF-16 and code points.
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        any::<u64>().prop_map(|u| json!(u)),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        "\\PC{0,12}".prop_map(Value::String),
        "[\\x00-\\x7f\u{e000}-\u{ffff}\u{10000}-\u{10ffff}]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec(
                ("[a-c~/\u{e000}\u{fb33}\u{1f600}]{0,3}|\\PC{0,6}", inner),
                0..8
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Reference tokens, including the characters that need escaping.
fn arb_token() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_~/ .-]{0,8}",
        "\\PC{0,8}",
        Just("~".to_string()),
        Just("/".to_string()),
        Just("~1".to_string()),
        Just("~0/".to_string()),
        Just(String::new()),
    ]
}

// ---------------------------------------------------------------- event IDs

proptest! {
    /// Any header bytes: no panic, and accepted exactly when they are 1 to
    /// 255 bytes of visible ASCII — returned unchanged.
    #[test]
    fn event_id_validation_is_exact(raw in prop::collection::vec(any::<u8>(), 0..300)) {
        let visible = raw.iter().all(|b| (0x21..=0x7E).contains(b));
        let want_ok = !raw.is_empty() && raw.len() <= MAX_EVENT_ID_LEN && visible;
        match validate_event_id(&raw) {
            Ok(id) => {
                prop_assert!(want_ok);
                prop_assert_eq!(id.as_bytes(), &raw[..]);
            }
            Err(e) => {
                prop_assert!(!want_ok, "{:?} refused: {}", raw, e);
                match e {
                    InvalidEventId::Empty => prop_assert!(raw.is_empty()),
                    InvalidEventId::TooLong { len } => prop_assert_eq!(len, raw.len()),
                    InvalidEventId::NotVisibleAscii { at } => {
                        prop_assert!(!(0x21..=0x7E).contains(&raw[at]));
                        prop_assert!(raw[..at].iter().all(|b| (0x21..=0x7E).contains(b)));
                    }
                }
            }
        }
    }

    /// Visible-ASCII IDs of every valid length are accepted.
    #[test]
    fn valid_event_ids_are_accepted(id in "[!-~]{1,255}") {
        prop_assert_eq!(validate_event_id(id.as_bytes()), Ok(id.as_str()));
    }

    /// Any JSON document and any pointer text: no panic.
    #[test]
    fn json_event_id_never_panics(doc in arb_json(), pointer in "\\PC{0,16}|(/[a-c~01]{0,3}){0,4}") {
        let _ = event_id_from_json(&doc, &pointer);
    }

    /// Any body bytes through the path a guarded request takes: parse, then
    /// look up `/id`. No panic.
    #[test]
    fn body_bytes_to_event_id_never_panic(body in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(doc) = parse_json_body(&body) {
            let _ = event_id_from_json(&doc, "/id");
            let _ = canonical_json(&doc);
        }
    }

    /// A valid ID (string or integer) placed anywhere in a document is found
    /// by the pointer to that place.
    #[test]
    fn json_event_id_is_found_where_it_is(
        path in prop::collection::vec(arb_token(), 1..5),
        id in prop_oneof!["[!-~]{1,64}".prop_map(Value::String), any::<i64>().prop_map(|i| json!(i)), any::<u64>().prop_map(|u| json!(u))],
        noise in arb_json(),
    ) {
        let mut doc = id.clone();
        for token in path.iter().rev() {
            let mut obj = serde_json::Map::new();
            obj.insert(format!("{token}-noise"), noise.clone());
            obj.insert(token.clone(), doc);
            doc = Value::Object(obj);
        }
        let want = match &id {
            Value::String(s) => s.clone(),
            n => n.to_string(),
        };
        let pointer = pointer_of(&path);
        prop_assert_eq!(event_id_from_json(&doc, &pointer), Ok(want.clone()));
        prop_assert_eq!(event_id_from_json_tokens(&doc, &path), Ok(want));
    }
}

// ---------------------------------------------------------------- JSON pointer

proptest! {
    /// Escaping tokens and parsing the pointer gives the tokens back.
    #[test]
    fn pointer_escape_parse_round_trip(tokens in prop::collection::vec(arb_token(), 0..6)) {
        let p = pointer_of(&tokens);
        prop_assert_eq!(parse_pointer(&p), Ok(tokens));
    }

    /// Any text: no panic; what parses is the escaping of what it parsed to
    /// (the escapes are a bijection, so the text is canonical).
    #[test]
    fn pointer_parse_never_panics_and_is_canonical(p in "\\PC{0,24}|(/[a-z~01/]{0,4}){0,4}") {
        if let Ok(tokens) = parse_pointer(&p) {
            prop_assert_eq!(pointer_of(&tokens), p);
        } else {
            prop_assert!(!p.is_empty());
        }
    }

    /// A value placed at a pointer is found there; removed, it is gone and
    /// its siblings stay.
    #[test]
    fn pointer_lookup_and_remove(path in prop::collection::vec(arb_token(), 1..5), leaf in arb_json()) {
        let mut doc = leaf.clone();
        for token in path.iter().rev() {
            let mut obj = serde_json::Map::new();
            obj.insert(format!("{token}~sibling"), json!(1));
            obj.insert(token.clone(), doc);
            doc = Value::Object(obj);
        }
        let tokens = parse_pointer(&pointer_of(&path)).unwrap();
        prop_assert_eq!(lookup(&doc, &tokens), Some(&leaf));
        prop_assert!(remove(&mut doc, &tokens));
        prop_assert_eq!(lookup(&doc, &tokens), None);
        let (last, parent) = tokens.split_last().unwrap();
        let mut sibling = parent.to_vec();
        sibling.push(format!("{last}~sibling"));
        prop_assert_eq!(lookup(&doc, &sibling), Some(&json!(1)));
        prop_assert!(!remove(&mut doc, &tokens), "a second remove finds nothing");
    }

    /// Array indexes: the decimal index finds the element; a leading zero,
    /// a sign, `-` or an index past the end find nothing.
    #[test]
    fn pointer_array_indexes(items in prop::collection::vec(arb_json(), 1..8), i in 0usize..10) {
        let doc = json!({ "a": items.clone() });
        let at = |t: &str| lookup(&doc, &["a".to_string(), t.to_string()]).cloned();
        prop_assert_eq!(at(&i.to_string()), items.get(i).cloned());
        prop_assert_eq!(at(&format!("0{i}")), None);
        prop_assert_eq!(at(&format!("+{i}")), None);
        prop_assert_eq!(at("-"), None);
    }
}

// ---------------------------------------------------------------- canonical JSON

proptest! {
    /// The canonical form parses back to itself; whitespace and serde_json's
    /// own formatting do not matter; the JSON digest is its sha256.
    #[test]
    fn canonical_form_is_a_fixed_point(v in arb_json()) {
        let c1 = canonical_json(&v);
        let back = parse_json_body(&c1).expect("canonical output parses");
        let c2 = canonical_json(&back);
        prop_assert_eq!(&c1, &c2);
        let pretty = serde_json::to_vec_pretty(&v).unwrap();
        prop_assert_eq!(&canonical_json(&parse_json_body(&pretty).unwrap()), &c1);
        prop_assert_eq!(json_digest(&v, &[]), raw_digest(&c1));
    }

    #[test]
    fn parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(v) = parse_json_body(&bytes) {
            let c = canonical_json(&v);
            prop_assert_eq!(canonical_json(&parse_json_body(&c).unwrap()), c);
        }
    }

    #[test]
    fn parse_never_panics_on_jsonish(s in "[\\[\\]{}\",:0-9eE.+\\-\\\\u tfnrl ]{0,64}") {
        let _ = parse_json_body(s.as_bytes());
    }

    /// Member order and whitespace do not change the canonical form.
    #[test]
    fn canonical_json_ignores_member_order(
        members in prop::collection::btree_map("\\PC{0,6}", arb_json(), 0..8),
        seed in any::<u64>(),
    ) {
        let mut entries: Vec<(String, Value)> = members.clone().into_iter().collect();
        // A deterministic shuffle from the seed.
        let mut s = seed | 1;
        for i in (1..entries.len()).rev() {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            entries.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let text = format!(
            "{{ {} }}",
            entries
                .iter()
                .map(|(k, v)| format!("{} :\n {}", serde_json::to_string(k).unwrap(), serde_json::to_string_pretty(v).unwrap()))
                .collect::<Vec<_>>()
                .join(" ,\t")
        );
        let parsed = parse_json_body(text.as_bytes()).expect("generated JSON parses");
        let direct = Value::Object(members.into_iter().collect());
        prop_assert_eq!(canonical_json(&parsed), canonical_json(&direct));
    }

    /// Ignoring a pointer is hashing the document without it.
    #[test]
    fn digest_ignore_is_removal(doc in arb_json(), path in prop::collection::vec("[a-c]{1,2}", 1..3)) {
        let tokens: Vec<String> = path;
        let mut without = doc.clone();
        remove(&mut without, &tokens);
        let ignore = JsonPointer::parse(&pointer_of(&tokens)).unwrap();
        prop_assert_eq!(json_digest(&doc, &[ignore]), json_digest(&without, &[]));
    }
}

// ---------------------------------------------------------------- config

fn no_env(_: &str) -> Option<String> {
    None
}

/// Checks the contract of a failed load: at least one error, each with a
/// real position and a message.
fn check_errors(text: &str) -> Result<(), TestCaseError> {
    if let Err(errs) = load_str(text, "fuzz.yaml", &no_env) {
        prop_assert!(!errs.0.is_empty(), "an error list is never empty");
        let lines = text.lines().count().max(1);
        for e in &errs.0 {
            prop_assert!(e.line >= 1 && e.col >= 1, "{}", e);
            prop_assert!(e.line <= lines + 1, "{} (the text has {} lines)", e, lines);
            prop_assert!(!e.message.is_empty(), "{}", e);
            prop_assert_eq!(&e.file, "fuzz.yaml");
        }
    }
    Ok(())
}

/// Pieces of YAML and of config values, for building and mutating texts.
const SNIPPETS: &[&str] = &[
    ": ",
    "\n",
    "\n  ",
    "\n    ",
    "- ",
    "-",
    "[",
    "]",
    "{",
    "}",
    ",",
    "'",
    "\"",
    "#",
    "&a ",
    "*a",
    "!!binary ",
    "!!str ",
    "? ",
    "|",
    ">",
    "~",
    "null",
    "true",
    "0",
    "-1",
    "1e309",
    "0x1f",
    "99999999999999999999s",
    "18446744073709551616",
    "30s",
    "0s",
    "1KiB",
    "0B",
    "${X}",
    "${",
    "\t",
    "\u{feff}",
    "\u{0}",
    "é",
    "routes",
    "name",
    "match",
    "path_prefix",
    "upstream",
    "event_id",
    "header",
    "json_pointer",
    "lease",
    "upstream_timeout",
    "max_body",
    "defaults",
    "store",
    "url",
    "settle_on",
    "guard_methods",
    "digest_ignore",
    "provider",
    "verify",
    "secrets",
    "env:NOPE",
    "file:/nonexistent",
    "stripe",
    "http://",
    "sqlite://",
    "postgres://",
    "---\n",
    "...\n",
    "<<: *a",
    "%YAML 1.2\n",
];

/// A small valid config to mutate.
const BASE: &str = "listen: \"127.0.0.1:8080\"
admin_listen: \"127.0.0.1:9090\"
store:
  url: \"sqlite:///tmp/fuzz.db\"
defaults:
  lease: 45s
  max_body: 64KiB
routes:
  - name: a
    match:
      path_prefix: /hooks/a
    upstream: \"http://127.0.0.1:3000\"
    event_id:
      header: X-Event-ID
    digest: json
    digest_ignore: [/attempt]
    settle_on: [\"2xx\", 409]
  - name: b
    match: {host: Hooks.Example.com, path_prefix: /hooks/b/}
    upstream: https://[::1]:8443/base/
    provider: stripe
    verify:
      secrets: [env:STRIPE]
    upstream_timeout: 10s
";

#[derive(Debug, Clone)]
enum Edit {
    Insert(usize, &'static str),
    Delete(usize, usize),
    Duplicate(usize, usize),
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut s = text.to_string();
    let boundary = |s: &str, at: usize| {
        let mut i = at % (s.len() + 1);
        while !s.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    for e in edits {
        match *e {
            Edit::Insert(at, what) => {
                let i = boundary(&s, at);
                s.insert_str(i, what);
            }
            Edit::Delete(at, len) => {
                let i = boundary(&s, at);
                let j = boundary(&s, i + len.min(s.len() - i));
                s.replace_range(i..j.max(i), "");
            }
            Edit::Duplicate(at, len) => {
                let i = boundary(&s, at);
                let j = boundary(&s, i + len.min(s.len() - i)).max(i);
                let piece = s[i..j].to_string();
                s.insert_str(j, &piece);
            }
        }
    }
    s
}

fn arb_edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<usize>(), prop::sample::select(SNIPPETS)).prop_map(|(a, w)| Edit::Insert(a, w)),
        2 => (any::<usize>(), 1usize..40).prop_map(|(a, l)| Edit::Delete(a, l)),
        1 => (any::<usize>(), 1usize..80).prop_map(|(a, l)| Edit::Duplicate(a, l)),
    ]
}

proptest! {
    /// Arbitrary text: no panic, and every error has a place and a message.
    #[test]
    fn config_arbitrary_text_never_panics(text in "\\PC{0,400}") {
        check_errors(&text)?;
    }

    /// Text assembled from YAML and config fragments: no panic.
    #[test]
    fn config_yamlish_text_never_panics(pieces in prop::collection::vec(prop::sample::select(SNIPPETS), 0..80)) {
        check_errors(&pieces.concat())?;
    }

    /// A valid config with random insertions, deletions and duplications:
    /// no panic, and every error has a place and a message.
    #[test]
    fn config_mutated_valid_file_never_panics(edits in prop::collection::vec(arb_edit(), 1..8)) {
        check_errors(&apply(BASE, &edits))?;
    }
}

#[test]
fn the_mutation_base_is_valid() {
    let env = |name: &str| (name == "STRIPE").then(|| "whsec_x".to_string());
    load_str(BASE, "base.yaml", &env).expect("BASE is a valid config");
}

/// Loads `text` on a thread with a 2 MiB stack (a test thread's default);
/// `Err` when the loader panicked or overflowed.
fn load_on_small_stack(name: &str, text: String) -> Result<(), String> {
    let t = std::time::Instant::now();
    let r = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || load_str(&text, "hostile.yaml", &no_env).map(|_| ()))
        .unwrap()
        .join();
    let took = t.elapsed();
    match r {
        Ok(Err(errs)) => eprintln!("{name}: refused in {took:?}: {}", errs.0[0]),
        Ok(Ok(())) => return Err(format!("{name}: accepted")),
        Err(_) => return Err(format!("{name}: the loader panicked")),
    }
    if took > Duration::from_secs(5) {
        return Err(format!("{name}: took {took:?}"));
    }
    Ok(())
}

/// Hostile YAML: an alias bomb and deep nesting are refused quickly, not
/// expanded or recursed into without bound.
#[test]
fn config_alias_bomb_and_deep_nesting_are_refused() {
    // 10^12 leaves if expanded, under a key the loader must read.
    let mut bomb = String::from("routes:\n  - name: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let prev = i - 1;
        bomb.push_str(&format!(
            "  - name: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
        ));
    }
    let cases = [
        ("alias bomb", bomb),
        // serde_yaml's time grows with the square of the depth: 20k levels ≈ 0.6 s.
        (
            "20k nested sequences",
            format!("routes: {}{}", "[".repeat(20_000), "]".repeat(20_000)),
        ),
        (
            "10k nested flow maps",
            format!("routes: {}x{}", "{a: ".repeat(10_000), "}".repeat(10_000)),
        ),
        (
            "2k nested block maps",
            (0..2_000)
                .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
                .collect(),
        ),
    ];
    for (name, text) in cases {
        load_on_small_stack(name, text).unwrap();
    }
}

/// 5,000 nested block maps (a 12.5 MB file): refused as nested too deeply,
/// on a small stack (the position index walks the parser's events with a
/// stack of its own, never recursing per level).
#[test]
fn config_deep_block_nesting_does_not_overflow() {
    let text: String = (0..5_000)
        .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
        .collect();
    load_on_small_stack("5k nested block maps", text).unwrap();
}

// ---------------------------------------------------------------- config round trip

/// A duration as the file writes it (in a unit that divides it) and its value.
fn arb_duration(min_ms: u64, max_ms: u64) -> impl Strategy<Value = (String, Duration)> {
    (min_ms..=max_ms, 0usize..5).prop_map(|(ms, pick)| {
        let units = [
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1_000),
            ("ms", 1),
        ];
        let fitting: Vec<_> = units.iter().filter(|(_, f)| ms % f == 0).collect();
        let (unit, factor) = fitting[pick % fitting.len()];
        (format!("{}{unit}", ms / factor), Duration::from_millis(ms))
    })
}

fn arb_size() -> impl Strategy<Value = (String, u64)> {
    (
        1u64..4096,
        prop::sample::select(vec![("B", 1u64), ("KiB", 1 << 10), ("MiB", 1 << 20)]),
    )
        .prop_map(|(n, (unit, f))| (format!("{n}{unit}"), n * f))
}

/// One generated route: the YAML and what the model must say.
#[derive(Debug, Clone)]
struct RouteSpec {
    name: String,
    host: Option<String>,
    prefix_written: String,
    prefix: String,
    upstream: (bool, String, u16, String),
    strip_prefix: bool,
    event_id: EventIdSource,
    event_id_written: String,
    json_digest: bool,
    ignore: Vec<String>,
    methods: Vec<&'static str>,
    on_missing_id: (&'static str, OnMissingId),
    on_store_error: (&'static str, OnStoreError),
    in_flight: (&'static str, InFlight),
    max_waiters: usize,
    settle_on: Vec<String>,
    replay_body: bool,
    replay_body_limit: (String, u64),
    key_header: Option<String>,
    timeout: (String, Duration),
    lease: (String, Duration),
    retention: (String, Duration),
    max_body: (String, u64),
}

/// Where a route takes its event ID from, and how the config writes it.
fn arb_event_id() -> impl Strategy<Value = (EventIdSource, String)> {
    let header_names = vec![
        "X-Event-ID",
        "x-event-id",
        "Webhook-Id",
        "X-GitHub-Delivery",
        "idempotency-key",
    ];
    prop_oneof![
        prop::sample::select(header_names).prop_map(|h| (
            EventIdSource::Header(http::HeaderName::from_bytes(h.as_bytes()).unwrap()),
            format!("header: {h}")
        )),
        prop::collection::vec(arb_token(), 0..3).prop_map(|t| {
            let p = pointer_of(&t);
            (
                EventIdSource::JsonPointer(p.parse().unwrap()),
                format!("json_pointer: {}", serde_json::to_string(&p).unwrap()),
            )
        }),
    ]
}

/// A `settle_on` list as the config writes it: classes and statuses.
fn arb_settle_on() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            (1u16..=5).prop_map(|c| format!("\"{c}xx\"")),
            (100u16..=599).prop_map(|c| c.to_string()),
        ],
        1..4,
    )
}

fn arb_route(i: usize) -> impl Strategy<Value = RouteSpec> {
    let event_id = arb_event_id();
    let upstream = (
        any::<bool>(),
        "[a-z][a-z0-9-]{0,10}(\\.[a-z]{2,5})?",
        1u16..=65535,
        "(/[a-z0-9]{1,6}){0,2}",
    );
    let settle = arb_settle_on();
    (
        (
            "[a-z0-9_-]{1,20}",
            prop::option::of("[a-z][a-z0-9.-]{0,12}"),
            // segments in normal form: no `.` or `..` (a prefix must be normal)
            "(/[a-z0-9_.-]{1,8}){1,3}/?".prop_filter("no dot segments", |p: &String| {
                p.split('/').all(|s| s != "." && s != "..")
            }),
            upstream,
            any::<bool>(),
            event_id,
            any::<bool>(),
            prop::collection::vec(prop::collection::vec(arb_token(), 1..3), 0..3),
        ),
        (
            prop::sample::subsequence(vec!["POST", "put", "Patch", "DELETE"], 1..=4),
            prop::sample::select(vec![
                ("reject", OnMissingId::Reject),
                ("forward", OnMissingId::Forward),
                ("body_digest", OnMissingId::BodyDigest),
            ]),
            prop::sample::select(vec![
                ("reject", OnStoreError::Reject),
                ("forward", OnStoreError::Forward),
            ]),
            prop::sample::select(vec![
                ("conflict", InFlight::Conflict),
                ("wait", InFlight::Wait),
            ]),
            1usize..1000,
            settle,
            any::<bool>(),
            arb_size(),
        ),
        (
            prop::option::of(
                prop::sample::select(vec!["Idempotency-Key", "X-Dedup-Key"])
                    .prop_map(str::to_string),
            ),
            arb_duration(1, 600_000),
            1u64..3_600_000,
            arb_duration(1, 30 * 86_400_000),
            arb_size(),
        ),
    )
        .prop_map(move |(a, b, c)| {
            let (
                name,
                host,
                prefix_written,
                up,
                strip_prefix,
                (event_id, event_id_written),
                json_digest,
                ignore,
            ) = a;
            let (key_header, timeout, extra, retention, max_body) = c;
            let lease_ms = timeout.1.as_millis() as u64 + extra;
            let lease = (format!("{lease_ms}ms"), Duration::from_millis(lease_ms));
            let prefix = match prefix_written.strip_suffix('/') {
                Some(p) if !p.is_empty() => p.to_string(),
                _ => prefix_written.clone(),
            };
            RouteSpec {
                // Unique names and prefixes: the index is part of both.
                name: format!("{name}-{i}"),
                host,
                prefix: format!("/r{i}{prefix}"),
                prefix_written: format!("/r{i}{prefix_written}"),
                upstream: (up.0, up.1, up.2, up.3),
                strip_prefix,
                event_id,
                event_id_written,
                json_digest,
                ignore: if json_digest {
                    ignore.iter().map(|t| pointer_of(t)).collect()
                } else {
                    Vec::new()
                },
                // the second tuple, in RouteSpec's order
                methods: b.0,
                on_missing_id: b.1,
                on_store_error: b.2,
                in_flight: b.3,
                max_waiters: b.4,
                settle_on: b.5,
                replay_body: b.6,
                replay_body_limit: b.7,
                key_header,
                timeout,
                lease,
                retention,
                max_body,
            }
        })
}

fn yaml_of(routes: &[RouteSpec], listen: u16, admin: u16, max_conn: u32) -> String {
    let mut y = format!(
        "listen: \"127.0.0.1:{listen}\"\nadmin_listen: \"[::1]:{admin}\"\nstore:\n  url: \"sqlite:///tmp/prop.db\"\n  max_connections: {max_conn}\nroutes:\n"
    );
    for r in routes {
        let (tls, host, port, base) = &r.upstream;
        y.push_str(&format!("  - name: {}\n    match:\n", r.name));
        if let Some(h) = &r.host {
            y.push_str(&format!("      host: \"{}\"\n", h.to_ascii_uppercase()));
        }
        y.push_str(&format!("      path_prefix: \"{}\"\n", r.prefix_written));
        y.push_str(&format!(
            "    upstream: \"{}://{host}:{port}{base}\"\n",
            if *tls { "https" } else { "http" }
        ));
        y.push_str(&format!("    strip_prefix: {}\n", r.strip_prefix));
        y.push_str(&format!("    event_id:\n      {}\n", r.event_id_written));
        y.push_str(&format!(
            "    digest: {}\n",
            if r.json_digest { "json" } else { "raw" }
        ));
        if !r.ignore.is_empty() {
            y.push_str("    digest_ignore:\n");
            for p in &r.ignore {
                y.push_str(&format!("      - {}\n", serde_json::to_string(p).unwrap()));
            }
        }
        y.push_str(&format!("    guard_methods: [{}]\n", r.methods.join(", ")));
        y.push_str(&format!("    on_missing_id: {}\n", r.on_missing_id.0));
        y.push_str(&format!("    on_store_error: {}\n", r.on_store_error.0));
        y.push_str(&format!("    in_flight: {}\n", r.in_flight.0));
        y.push_str(&format!("    max_waiters: {}\n", r.max_waiters));
        y.push_str(&format!("    settle_on: [{}]\n", r.settle_on.join(", ")));
        y.push_str(&format!("    replay_body: {}\n", r.replay_body));
        y.push_str(&format!(
            "    replay_body_limit: {}\n",
            r.replay_body_limit.0
        ));
        match &r.key_header {
            Some(h) => y.push_str(&format!("    idempotency_key_header: {h}\n")),
            None => y.push_str("    idempotency_key_header: null\n"),
        }
        y.push_str(&format!("    upstream_timeout: {}\n", r.timeout.0));
        y.push_str(&format!("    lease: {}\n", r.lease.0));
        y.push_str(&format!("    retention: {}\n", r.retention.0));
        y.push_str(&format!("    max_body: {}\n", r.max_body.0));
    }
    y
}

fn check_model(cfg: &Config, specs: &[RouteSpec]) -> Result<(), TestCaseError> {
    prop_assert_eq!(cfg.routes.len(), specs.len());
    for (r, s) in cfg.routes.iter().zip(specs) {
        let (tls, host, port, base) = &s.upstream;
        prop_assert_eq!(&r.name, &s.name);
        let host_name = s
            .host
            .as_deref()
            .map(|h| h.strip_suffix('.').filter(|h| !h.is_empty()).unwrap_or(h));
        prop_assert_eq!(
            r.host.as_deref(),
            host_name,
            "hosts are lowercased, one trailing dot dropped"
        );
        prop_assert_eq!(&r.path_prefix, &s.prefix, "a trailing slash is dropped");
        prop_assert_eq!(r.upstream.tls, *tls);
        prop_assert_eq!(&r.upstream.host, host);
        prop_assert_eq!(r.upstream.port, *port);
        prop_assert_eq!(&r.upstream.base_path, base);
        prop_assert_eq!(r.strip_prefix, s.strip_prefix);
        prop_assert_eq!(&r.event_id, &s.event_id);
        prop_assert_eq!(
            r.digest,
            if s.json_digest {
                DigestMode::Json
            } else {
                DigestMode::Raw
            }
        );
        prop_assert_eq!(&r.digest_ignore, &s.ignore);
        let methods: Vec<http::Method> = s
            .methods
            .iter()
            .map(|m| http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()).unwrap())
            .collect();
        prop_assert_eq!(&r.guard_methods, &methods);
        prop_assert_eq!(r.on_missing_id, s.on_missing_id.1);
        prop_assert_eq!(r.on_store_error, s.on_store_error.1);
        prop_assert_eq!(r.in_flight, s.in_flight.1);
        prop_assert_eq!(r.max_waiters, s.max_waiters);
        for status in 100u16..=599 {
            let want = s.settle_on.iter().any(|item| {
                let item = item.trim_matches('"');
                match item.strip_suffix("xx") {
                    Some(class) => class.parse::<u16>() == Ok(status / 100),
                    None => item.parse::<u16>() == Ok(status),
                }
            });
            prop_assert_eq!(
                r.settle_on.matches(status),
                want,
                "settle_on {:?} for {}",
                s.settle_on,
                status
            );
        }
        prop_assert_eq!(r.replay_body, s.replay_body);
        prop_assert_eq!(r.replay_body_limit, s.replay_body_limit.1);
        let key = s
            .key_header
            .as_ref()
            .map(|h| http::HeaderName::from_bytes(h.as_bytes()).unwrap());
        prop_assert_eq!(&r.idempotency_key_header, &key);
        prop_assert_eq!(r.upstream_timeout, s.timeout.1);
        prop_assert_eq!(r.lease, s.lease.1);
        prop_assert_eq!(r.retention, s.retention.1);
        prop_assert_eq!(r.max_body, s.max_body.1);
        prop_assert!(r.provider.is_none() && r.verify.is_none());
    }
    Ok(())
}

fn arb_routes() -> impl Strategy<Value = Vec<RouteSpec>> {
    (1usize..4).prop_flat_map(|n| (0..n).map(arb_route).collect::<Vec<_>>())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// A generated valid config loads, and the model holds exactly what the
    /// file said (normalised as documented).
    #[test]
    fn config_round_trips_to_the_model(
        routes in arb_routes(),
        listen in 1u16..=65535,
        admin in 1u16..=65535,
        max_conn in 1u32..=256,
    ) {
        let text = yaml_of(&routes, listen, admin, max_conn);
        let loaded = match load_str(&text, "gen.yaml", &no_env) {
            Ok(l) => l,
            Err(e) => return Err(TestCaseError::fail(format!("a valid config was refused:\n{e}\n---\n{text}"))),
        };
        let cfg = &loaded.config;
        prop_assert_eq!(cfg.listen, format!("127.0.0.1:{listen}").parse().unwrap());
        prop_assert_eq!(cfg.admin_listen, format!("[::1]:{admin}").parse().unwrap());
        prop_assert_eq!(&cfg.store.url, "sqlite:///tmp/prop.db");
        prop_assert_eq!(cfg.store.max_connections, max_conn);
        check_model(cfg, &routes)?;
    }
}
