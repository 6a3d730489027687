//! `admin.token`: read from a reference like a verify secret, never shown.

use super::{ok, one_error, route};

/// The standard route, then `admin:` on line 12 and its token on line 13.
fn with_token(reference: &str) -> String {
    route(&format!("admin:\n  token: {reference}\n"))
}

fn token_of(text: &str) -> Option<Vec<u8>> {
    ok(text).config.admin.token.map(|t| t.0)
}

#[test]
fn no_admin_key_or_no_token_means_no_token() {
    assert_eq!(token_of(&route("")), None);
    assert_eq!(token_of(&route("admin: {}\n")), None);
}

#[test]
fn env_and_file_tokens() {
    assert_eq!(
        token_of(&with_token("env:ADMIN_TOKEN")),
        Some(b"0123456789abcdef-admin".to_vec())
    );
    let dir = std::env::temp_dir().join(format!("idemgate-admin-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, b"from-a-file-0123456789\n").unwrap();
    assert_eq!(
        token_of(&with_token(&format!("file:{}", file.display()))),
        Some(b"from-a-file-0123456789".to_vec())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_token_never_shows_in_debug_output() {
    let loaded = ok(&with_token("env:ADMIN_TOKEN"));
    let shown = format!("{:?}", loaded.config);
    assert!(!shown.contains("0123456789abcdef"), "{shown}");
    assert!(shown.contains("redacted"), "{shown}");
}

#[test]
fn an_unreadable_token_is_a_positioned_error() {
    one_error(
        &with_token("env:NOT_SET_ANYWHERE"),
        13,
        10,
        "cfg.yaml:13:10: admin.token: the admin token cannot be read: secret env:NOT_SET_ANYWHERE: environment variable `NOT_SET_ANYWHERE` is not set",
    );
    one_error(
        &with_token("file:/nonexistent/idemgate/token"),
        13,
        10,
        "secret file:/nonexistent/idemgate/token: cannot read the file",
    );
    one_error(&with_token("\"env:\""), 13, 10, "needs a variable name");
}

#[test]
fn an_inline_token_is_refused_without_echoing_it() {
    let e = one_error(
        &with_token("my-inline-admin-token-123"),
        13,
        10,
        "inline secrets are not allowed",
    );
    assert!(!e.to_string().contains("my-inline"), "{e}");
}

#[test]
fn a_token_that_cannot_travel_in_a_header_is_refused() {
    let e = one_error(&with_token("env:SPACED_TOKEN"), 13, 10, "not visible ASCII");
    assert!(!e.to_string().contains("space in it"), "{e}");
}

#[test]
fn a_short_token_loads_with_a_warning() {
    let loaded = ok(&with_token("env:SHORT_TOKEN"));
    assert_eq!(
        loaded.config.admin.token.map(|t| t.0),
        Some(b"abc".to_vec())
    );
    assert!(
        loaded
            .warnings
            .iter()
            .any(|w| w.starts_with("cfg.yaml:13:10: admin.token: ") && w.contains("3 bytes")),
        "{:?}",
        loaded.warnings
    );
    assert!(ok(&with_token("env:ADMIN_TOKEN"))
        .warnings
        .iter()
        .all(|w| !w.contains("admin")));
}

#[test]
fn unknown_admin_keys_are_refused() {
    one_error(
        &route("admin:\n  tokn: env:ADMIN_TOKEN\n"),
        13,
        3,
        "unknown field `tokn`",
    );
}
