//! `verify` blocks, secret resolution and the retention warning.

use std::time::Duration;

use super::{errors, ok, one_error, one_error_each, one_error_with_path, route};
use crate::config::Scheme;

/// Writes `content` to a fresh temp file and returns its path.
fn temp_secret(name: &str, content: &[u8]) -> String {
    let dir = std::env::temp_dir().join(format!("idemgate-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path.display().to_string()
}

/// The standard route plus a verify block on lines 12-13.
fn with_verify(scheme: &str, secret: &str) -> String {
    route(&format!(
        "    verify:\n      {{scheme: {scheme}, secrets: [\"{secret}\"]}}\n"
    ))
    .replace("    verify:\n      {", "    verify: {")
}

fn keys(text: &str) -> Vec<Vec<u8>> {
    ok(text).config.routes[0]
        .verify
        .clone()
        .unwrap()
        .secrets
        .to_vec()
}

#[test]
fn env_and_file_secrets() {
    assert_eq!(
        keys(&with_verify("github", "env:PLAIN")),
        vec![b"plain-secret".to_vec()]
    );
    let lf = temp_secret("lf", b"from-file\n");
    let crlf = temp_secret("crlf", b"from-file\r\n");
    let bare = temp_secret("bare", b"from-file");
    let two = temp_secret("two", b"from-file\n\n");
    for path in [&lf, &crlf, &bare] {
        assert_eq!(
            keys(&with_verify("slack", &format!("file:{path}"))),
            vec![b"from-file".to_vec()],
            "{path}"
        );
    }
    // Only ONE trailing newline goes.
    assert_eq!(
        keys(&with_verify("shopify", &format!("file:{two}"))),
        vec![b"from-file\n".to_vec()]
    );
    // Several secrets, for rotation, in order; stripe uses the raw string.
    let text = route("    verify: {scheme: stripe, secrets: [env:STRIPE_SECRET, env:PLAIN]}\n");
    assert_eq!(
        keys(&text),
        vec![
            b"whsec_stripe_raw_string".to_vec(),
            b"plain-secret".to_vec()
        ]
    );
}

#[test]
fn secret_errors_never_echo_the_value() {
    // line 12: `    verify: {scheme: github, secrets: ["…"]}`: the secret value is at col 40.
    one_error_with_path(
        &with_verify("github", "env:NOPE"),
        12,
        40,
        "routes[0].verify.secrets[0]",
        "environment variable `NOPE` is not set",
    );
    let e = one_error(
        &with_verify("github", "hunter2"),
        12,
        40,
        "must be a reference",
    );
    assert!(!e.to_string().contains("hunter2"), "{e}");
    let empty = temp_secret("empty", b"\n");
    for (secret, needle) in [
        (
            "file:/nonexistent/idemgate/secret".to_owned(),
            "cannot read the file",
        ),
        ("env:".to_owned(), "needs a variable name"),
        (format!("file:{empty}"), "is empty"),
    ] {
        one_error(&with_verify("github", &secret), 12, 40, needle);
    }
}

#[test]
fn standard_webhooks_secrets_are_decoded() {
    let sw = |var: &str| with_verify("standard-webhooks", &format!("env:{var}"));
    assert_eq!(keys(&sw("WH_SECRET_PADDED")), vec![b"hello".to_vec()]);
    assert_eq!(keys(&sw("WH_SECRET_UNPADDED")), vec![b"hello".to_vec()]);
    assert_eq!(keys(&sw("WH_SECRET")).len(), 1);
    // col 51: the secret in `    verify: {scheme: standard-webhooks, secrets: ["…"]}`.
    let e = one_error(&sw("WH_SECRET_BAD"), 12, 51, "not valid base64");
    assert!(!e.to_string().contains("not*base64"), "{e}");
    one_error(
        &sw("WH_SECRET_NOPREFIX"),
        12,
        51,
        "must start with `whsec_`",
    );
    let file = temp_secret("whsec", b"whsec_aGVsbG8=\n");
    assert_eq!(
        keys(&with_verify("standard-webhooks", &format!("file:{file}"))),
        vec![b"hello".to_vec()]
    );
}

#[test]
fn verify_block_rules() {
    // No scheme and no provider.
    one_error_with_path(
        &route("    verify:\n      secrets: [env:PLAIN]\n"),
        12,
        5,
        "routes[0].verify",
        "needs a `scheme`",
    );
    // hmac-sha256 needs `header`; the others refuse it.
    let block = |lines: &str| route(&format!("    verify:\n{lines}"));
    let plain = "      secrets: [env:PLAIN]\n";
    one_error_each(&[
        (
            block(&format!("      scheme: hmac-sha256\n{plain}")),
            12,
            5,
            "requires `header`",
        ),
        (
            block(&format!(
                "      scheme: github\n      header: X-Sig\n{plain}"
            )),
            14,
            7,
            "only allowed with scheme hmac-sha256",
        ),
        // At least one secret.
        (
            block("      scheme: github\n      secrets: []\n"),
            14,
            16,
            "at least one secret",
        ),
        (
            block("      scheme: github\n"),
            12,
            5,
            "required field `secrets`",
        ),
        (
            block(&format!("      scheme: sha1\n{plain}")),
            13,
            15,
            "unknown variant `sha1`",
        ),
        (
            block(&format!(
                "      scheme: stripe\n{plain}      tolerance: 0s\n"
            )),
            15,
            18,
            "greater than zero",
        ),
    ]);
    // Independent problems in one block are all reported.
    let errs = errors(&route(
        "    verify:\n      scheme: hmac-sha256\n      secrets: [env:NOPE, inline]\n      tolerance: soon\n",
    ));
    assert_eq!(errs.len(), 4, "{errs:?}");
    let v = ok(&route(
        "    verify: {scheme: hmac-sha256, header: X-Signature, secrets: [env:PLAIN]}\n",
    ))
    .config
    .routes[0]
        .verify
        .clone()
        .unwrap();
    assert_eq!(
        (v.scheme, v.tolerance),
        (Scheme::HmacSha256, Duration::from_secs(300))
    );
    assert_eq!(v.header, Some(http::HeaderName::from_static("x-signature")));
}

#[test]
fn retention_shorter_than_redelivery_horizon_warns() {
    let text = |provider: &str, retention: &str| {
        route(&format!(
            "    provider: {provider}\n    retention: {retention}\n    verify: none\n"
        ))
        .replace("    event_id:\n      header: X-Event-ID\n", "")
    };
    for (provider, short, enough) in [
        ("stripe", "71h", "3d"),
        ("github", "2d", "3d"),
        ("shopify", "3h", "4h"),
        ("slack", "59m", "1h"),
        ("standard-webhooks", "75h", "76h"),
        ("svix", "1d", "28h"),
    ] {
        let l = ok(&text(provider, short));
        assert_eq!(l.warnings.len(), 1, "{provider}: {:?}", l.warnings);
        assert!(
            l.warnings[0].starts_with(&format!("cfg.yaml:11:16: routes[0].retention: retention {short} is shorter than {provider}'s redelivery horizon")),
            "{}",
            l.warnings[0]
        );
        assert!(
            ok(&text(provider, enough)).warnings.is_empty(),
            "{provider}"
        );
    }
    // The built-in 7d covers every horizon; a short default warns at defaults.
    assert!(ok(&route("    provider: slack\n    verify: none\n"))
        .warnings
        .is_empty());
    let l = ok(&format!(
        "defaults:\n  retention: 1h\n{}",
        route("    provider: stripe\n")
    ));
    assert!(
        l.warnings[0].starts_with("cfg.yaml:2:14: defaults.retention: retention 1h"),
        "{:?}",
        l.warnings
    );
}
