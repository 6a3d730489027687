//! What senders and operators are never told (issue 20): a store URL in a
//! message hides its password, even one holding `@`. Against the real binary.

mod common;

use common::*;

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
