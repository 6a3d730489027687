//! SPEC §17: composite event IDs, `verify.scheme: hmac`, the token scheme,
//! `whpk_` public keys and the four new presets, each error at its spot.

use super::{errors, ok, one_error, HEAD};
use crate::config::{EventIdSource, IdPart, Provider, Scheme};
use crate::verify::{Algorithm, Encoding, Piece, Timestamp};

/// HEAD plus a route without event_id (lines 6-9); `extra` from line 10.
fn bare(extra: &str) -> String {
    format!(
        "{HEAD}  - name: alpha
    match:
      path_prefix: /hooks/alpha
    upstream: \"http://127.0.0.1:3001\"
{extra}"
    )
}

#[test]
fn composite_ids_load_in_order() {
    let text = bare(
        "    event_id:\n      parts: [{json_pointer: /team_id}, {header: X-Tenant}, {json_pointer: /event_id}]\n    verify: none\n",
    );
    let r = &ok(&text).config.routes[0];
    let EventIdSource::Parts(parts) = &r.event_id else {
        panic!("{:?}", r.event_id)
    };
    assert_eq!(parts.len(), 3);
    assert!(matches!(&parts[0], IdPart::JsonPointer(p) if p == "/team_id"));
    assert!(matches!(&parts[1], IdPart::Header(h) if h == "x-tenant"));
    assert!(r.event_id.reads_body());
    assert_eq!(
        r.event_id_source_text(),
        "parts [json_pointer /team_id, header x-tenant, json_pointer /event_id]"
    );
}

#[test]
fn composite_id_errors_point_at_their_part() {
    let verify_none = "    verify: none\n";
    one_error(
        &bare(&format!("    event_id:\n      parts: []\n{verify_none}")),
        11,
        14,
        "1 to 8 sources",
    );
    let text = bare(&format!(
        "    event_id:\n      parts:\n        - json_pointer: id\n        - {{header: X-A, json_pointer: /a}}\n        - {{}}\n        - header: \"bad name\"\n{verify_none}"
    ));
    let errs = errors(&text);
    let at: Vec<(usize, &str)> = errs.iter().map(|e| (e.line, e.path.as_str())).collect();
    assert_eq!(
        at,
        [
            (12, "routes[0].event_id.parts[0].json_pointer"),
            (13, "routes[0].event_id.parts[1]"),
            (14, "routes[0].event_id.parts[2]"),
            (15, "routes[0].event_id.parts[3].header"),
        ],
        "{errs:?}"
    );
    one_error(
        &bare(&format!(
            "    event_id:\n      header: X-A\n      parts: [{{header: X-B}}]\n{verify_none}"
        )),
        10,
        5,
        "found both",
    );
}

fn hmac_block(lines: &str) -> String {
    super::route(&format!(
        "    verify:\n      scheme: hmac\n      secrets: [env:PLAIN]\n      header: X-Signature\n{lines}"
    ))
}

#[test]
fn hmac_blocks_load_with_defaults_and_every_key() {
    let v = ok(&hmac_block("")).config.routes[0].verify.clone().unwrap();
    assert_eq!(v.scheme, Scheme::Hmac);
    let rule = v.rule.unwrap();
    assert_eq!(
        (rule.algorithm, rule.encoding),
        (Algorithm::Sha256, Encoding::Hex)
    );
    assert_eq!(rule.message.as_ref(), [Piece::Body]);

    let text = hmac_block(
        "      algorithm: sha512\n      encoding: base64\n      prefix: \"s=\"\n      signature_param: h1\n      timestamp: {param: ts}\n      message: \"{timestamp}:{body}\"\n      tolerance: 1m\n",
    );
    let v = ok(&text).config.routes[0].verify.clone().unwrap();
    let rule = v.rule.unwrap();
    assert_eq!(
        (rule.algorithm, rule.encoding),
        (Algorithm::Sha512, Encoding::Base64)
    );
    assert_eq!(rule.prefix.as_ref().unwrap().text, "s=");
    assert_eq!(rule.signature_param.as_deref(), Some("h1"));
    assert!(matches!(rule.timestamp, Some(Timestamp::Param(p)) if p == "ts"));
    assert_eq!(v.tolerance, std::time::Duration::from_secs(60));
}

#[test]
fn every_hmac_error_is_reported_at_once_at_its_key() {
    let text = hmac_block(
        "      algorithm: md5\n      encoding: base32\n      prefix: \"\"\n      signature_param: \"a=b\"\n      timestamp: {header: X-T, param: t}\n      message: \"{bogus}\"\n",
    );
    let errs = errors(&text);
    let at: Vec<(usize, &str)> = errs.iter().map(|e| (e.line, e.path.as_str())).collect();
    assert_eq!(
        at,
        [
            (16, "routes[0].verify.algorithm"),
            (17, "routes[0].verify.encoding"),
            (18, "routes[0].verify.prefix"),
            (19, "routes[0].verify.signature_param"),
            (20, "routes[0].verify.timestamp"),
            (21, "routes[0].verify.message"),
        ],
        "{errs:?}"
    );
    assert!(
        errs[0].to_string().contains("sha1, sha256, sha512"),
        "{}",
        errs[0]
    );
    // a rule that does not hold together
    one_error(
        &hmac_block("      message: \"{timestamp}\"\n"),
        16,
        7,
        "{body}",
    );
    one_error(
        &hmac_block("      timestamp: {header: X-T}\n"),
        12,
        5,
        "{timestamp} exactly when",
    );
    // hmac needs a header; the hmac keys need scheme hmac
    one_error(
        &super::route("    verify: {scheme: hmac, secrets: [env:PLAIN]}\n"),
        12,
        5,
        "requires `header`",
    );
    one_error(
        &super::route("    verify: {scheme: github, secrets: [env:PLAIN], algorithm: sha1}\n"),
        12,
        52,
        "only allowed with scheme hmac",
    );
}

#[test]
fn a_signed_id_must_not_need_the_body() {
    let text = format!(
        "{HEAD}  - name: alpha
    match:
      path_prefix: /hooks/alpha
    upstream: \"http://127.0.0.1:3001\"
    event_id: {{json_pointer: /id}}
    verify:
      scheme: hmac
      secrets: [env:PLAIN]
      header: X-Signature
      message: \"{{id}}.{{body}}\"
"
    );
    one_error(&text, 15, 16, "must come from headers");
    ok(&text.replace(
        "{json_pointer: /id}",
        "{parts: [{header: X-A}, {header: X-B}]}",
    ));
}

#[test]
fn public_keys_are_32_bytes() {
    let env = |name: &str| match name {
        "PK" => Some(crate::verify::sign::standard_webhooks_public_key(&[9; 32])),
        "PK_SHORT" => Some("whpk_AAAA".to_string()),
        "PK_BAD" => Some("whpk_*".to_string()),
        "WH" => Some("whsec_aGVsbG8=".to_string()),
        _ => None,
    };
    let text = |secrets: &str| {
        super::route(&format!(
            "    provider: svix\n    verify: {{secrets: [{secrets}]}}\n"
        ))
    };
    let l = crate::config::load_str(&text("env:PK, env:WH"), "cfg.yaml", &env).unwrap();
    let v = l.config.routes[0].verify.clone().unwrap();
    assert_eq!((v.secrets.len(), v.public_keys.len()), (1, 1));
    let l = crate::config::load_str(&text("env:PK"), "cfg.yaml", &env).unwrap();
    assert!(l.config.routes[0]
        .verify
        .as_ref()
        .unwrap()
        .secrets
        .is_empty());
    let e =
        crate::config::load_str(&text("env:PK_SHORT, env:PK_BAD"), "cfg.yaml", &env).unwrap_err();
    let shown = e.to_string();
    assert!(
        shown.contains("secrets[0]: a `whpk_` public key must be base64 of 32 bytes"),
        "{shown}"
    );
    assert!(shown.contains("secrets[1]"), "{shown}");
    assert!(!shown.contains("AAAA"), "{shown}");
}

#[test]
fn new_presets() {
    let text = |provider: &str, extra: &str| {
        bare(&format!(
            "    provider: {provider}\n    verify: {{secrets: [env:PLAIN]}}\n    retention: 30d\n{extra}"
        ))
    };
    let route = |t: &str| ok(t).config.routes[0].clone();
    let r = route(&text("paddle", ""));
    assert_eq!(r.verify.as_ref().unwrap().scheme, Scheme::Paddle);
    assert!(matches!(&r.event_id, EventIdSource::JsonPointer(p) if p == "/event_id"));
    let r = route(&text("typeform", ""));
    assert_eq!(r.verify.as_ref().unwrap().scheme, Scheme::Typeform);
    assert!(matches!(&r.event_id, EventIdSource::JsonPointer(p) if p == "/event_id"));
    let r = route(&text("gitlab", ""));
    assert_eq!(r.verify.as_ref().unwrap().scheme, Scheme::Token);
    assert!(matches!(&r.event_id, EventIdSource::Header(h) if h == "idempotency-key"));
    // a `whsec_` signing token: GitLab 19's standard-webhooks signature
    let r = route(&text("gitlab", "").replace("env:PLAIN", "env:WH_SECRET"));
    assert_eq!(r.verify.as_ref().unwrap().scheme, Scheme::StandardWebhooks);
    assert_eq!(r.provider, Some(Provider::Gitlab));
    // then the event ID is the signed webhook-id, not the unsigned Idempotency-Key
    assert!(matches!(&r.event_id, EventIdSource::Header(h) if h == "webhook-id"));
    // zoom names no ID of its own
    one_error(&text("zoom", ""), 6, 5, "zoom has no event ID of its own");
    let r = route(&text(
        "zoom",
        "    event_id: {parts: [{json_pointer: /event}, {json_pointer: /event_ts}]}\n",
    ));
    assert_eq!(r.verify.as_ref().unwrap().scheme, Scheme::Zoom);
}

#[test]
fn new_presets_warn_below_their_horizon() {
    for (provider, horizon, extra) in [
        ("paddle", "3d", ""),
        ("gitlab", "7d", ""),
        ("typeform", "10h", ""),
        ("zoom", "2h", "    event_id: {json_pointer: /event_ts}\n"),
    ] {
        let text = bare(&format!(
            "    provider: {provider}\n    verify: {{secrets: [env:PLAIN]}}\n    retention: 1h\n{extra}"
        ));
        let l = ok(&text);
        let w: Vec<String> = l.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(w.len(), 1, "{provider}: {w:?}");
        assert!(
            w[0].contains(&format!("{provider}'s redelivery horizon ({horizon})")),
            "{w:?}"
        );
        assert!(w[0].starts_with("cfg.yaml:12:16:"), "{w:?}");
    }
}
