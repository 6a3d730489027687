//! The whole loader against documents built to exhaust it: deep nesting
//! and long keys are refused with a message, on a small stack, in bounded
//! time (the parser's own limits are tested in `yaml.rs`).

use crate::config::load_str;

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
