//! The whole loader against documents built to exhaust it: deep nesting
//! and long keys are refused with a message, on a small stack, in bounded
//! time; the parser's own depth limit, where it is reported.

use crate::config::load_str;
use crate::config::yaml::{Doc, Pos, MAX_DEPTH};

/// Runs `load_str` on a 2 MiB stack; the message of its first error.
fn refuse_on_small_stack(text: String) -> String {
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || match load_str(&text, "t.yaml", &|_| None) {
            Ok(_) => panic!("accepted"),
            Err(errs) => errs.0[0].to_string(),
        })
        .unwrap()
        .join()
        .expect("the loader panicked")
}

fn block_maps(depth: usize) -> String {
    (0..depth)
        .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
        .collect()
}

#[test]
fn deep_documents_are_refused_without_overflowing() {
    let cases = [
        block_maps(5_000),
        format!("routes: {}{}", "[".repeat(100_000), "]".repeat(100_000)),
        format!("routes: {}x{}", "{a: ".repeat(100_000), "}".repeat(100_000)),
        format!("{}x{}", "{a: ".repeat(300), "}".repeat(300)),
        format!("{}{}", "- ".repeat(50_000), "x"),
    ];
    for text in cases {
        let t = std::time::Instant::now();
        let msg = refuse_on_small_stack(text);
        assert!(msg.contains("nested too deeply"), "{msg}");
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "{msg}");
    }
}

#[test]
fn a_long_key_over_many_descendants_stays_within_budget() {
    // Each descendant's path would repeat the 1 MB key: ~3 GB if built
    // in full. Paths are only ever written for an error.
    let mut text = format!("? {}\n:\n", "a".repeat(1 << 20));
    for i in 0..3_000 {
        text.push_str(&format!("  b{i}: 1\n"));
    }
    let msg = refuse_on_small_stack(text);
    assert!(msg.contains("unknown field"), "{}", &msg[..200]);
}

#[test]
fn nesting_up_to_the_limit_is_indexed() {
    let doc = Doc::parse(&block_maps(MAX_DEPTH)).unwrap();
    let deepest = (0..MAX_DEPTH - 1)
        .map(|i| format!("k{i}"))
        .collect::<Vec<_>>()
        .join(".");
    let line = MAX_DEPTH - 1;
    assert_eq!(doc.key_pos(&deepest), Pos { line, col: line });
}

#[test]
fn nesting_past_the_limit_is_refused_where_it_starts() {
    // The mapping at depth MAX_DEPTH + 1 starts at its first key.
    let err = Doc::parse(&block_maps(MAX_DEPTH + 1)).unwrap_err();
    let line = MAX_DEPTH + 1;
    assert_eq!(err.pos, Pos { line, col: line });
    assert!(err.message.contains("nested too deeply"), "{err:?}");
    let flow = format!("routes: {}{}", "[".repeat(200), "]".repeat(200));
    let col = "routes: ".len() + MAX_DEPTH;
    assert_eq!(Doc::parse(&flow).unwrap_err().pos, Pos { line: 1, col });
}
