//! Config tests: every rule with its reported position.

mod admin;
mod depth;
mod keys;
mod reconcile;
mod resolve;
mod rules;
mod secrets;
mod svix_ids;
mod telemetry;
mod units;
mod values;

use super::{load_str, ConfigError, ConfigErrors, Loaded};

/// The environment every test sees.
pub fn test_env(name: &str) -> Option<String> {
    match name {
        "DB_PASS" => Some("s3cr$t".to_string()),
        "STRIPE_SECRET" => Some("whsec_stripe_raw_string".to_string()),
        "WH_SECRET" => Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_string()),
        "WH_SECRET_UNPADDED" => Some("whsec_aGVsbG8".to_string()),
        "WH_SECRET_PADDED" => Some("whsec_aGVsbG8=".to_string()),
        "WH_SECRET_BAD" => Some("whsec_not*base64!".to_string()),
        "WH_SECRET_NOPREFIX" => Some("aGVsbG8=".to_string()),
        "PLAIN" => Some("plain-secret".to_string()),
        "ADMIN_TOKEN" => Some("0123456789abcdef-admin".to_string()),
        "SHORT_TOKEN" => Some("abc".to_string()),
        "SPACED_TOKEN" => Some("has a space in it, long enough".to_string()),
        _ => None,
    }
}

pub fn load(text: &str) -> Result<Loaded, ConfigErrors> {
    load_str(text, "cfg.yaml", &test_env)
}

pub fn ok(text: &str) -> Loaded {
    match load(text) {
        Ok(l) => l,
        Err(e) => panic!("expected a valid config, got:\n{e}"),
    }
}

pub fn errors(text: &str) -> Vec<ConfigError> {
    match load(text) {
        Ok(l) => panic!("expected errors, got a valid config: {:?}", l.config),
        Err(e) => e.0,
    }
}

/// Asserts exactly one error, at `line:col`, whose text contains `needle`.
#[track_caller]
pub fn one_error(text: &str, line: usize, col: usize, needle: &str) -> ConfigError {
    let errs = errors(text);
    let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert_eq!(
        errs.len(),
        1,
        "expected one error mentioning `{needle}`, got:\n{}",
        shown.join("\n")
    );
    let e = errs.into_iter().next().unwrap();
    assert_eq!(
        (e.line, e.col),
        (line, col),
        "wrong position for `{needle}`: {e}"
    );
    assert!(
        e.to_string().contains(needle),
        "`{e}` does not mention `{needle}`"
    );
    e
}

/// The one error `text` has, as `check` prints it (the black-box view).
#[track_caller]
pub fn printed_error(text: &str) -> String {
    let errs = errors(text);
    assert_eq!(errs.len(), 1, "expected one error, got: {errs:?}");
    errs[0].to_string()
}

/// [`one_error`], and the error is about the value at `path`.
#[track_caller]
pub fn one_error_with_path(
    text: &str,
    line: usize,
    col: usize,
    path: &str,
    needle: &str,
) -> ConfigError {
    let e = one_error(text, line, col, needle);
    assert_eq!(e.path, path, "wrong path for `{needle}`: {e}");
    e
}

/// [`one_error`] for each case `(text, line, col, needle)`; a failure names
/// the case by its needle.
#[track_caller]
pub fn one_error_each(cases: &[(String, usize, usize, &str)]) {
    for (text, line, col, needle) in cases {
        one_error(text, *line, *col, needle);
    }
}

/// A valid top of file; routes follow from line 6 on.
pub const HEAD: &str = "listen: \"127.0.0.1:1\"
admin_listen: \"127.0.0.1:2\"
store:
  url: \"sqlite:///tmp/t.db\"
routes:
";

/// HEAD plus one valid route on lines 6-11; `extra` lines (written with
/// four spaces of indent) start at line 12.
pub fn route(extra: &str) -> String {
    format!(
        "{HEAD}  - name: alpha
    match:
      path_prefix: /hooks/alpha
    upstream: \"http://127.0.0.1:3001\"
    event_id:
      header: X-Event-ID
{extra}"
    )
}

#[test]
fn black_box_unknown_key_points_at_the_key() {
    let text = "listen: \"127.0.0.1:1\"
admin_listen: \"127.0.0.1:2\"
store:
  url: \"sqlite:///tmp/bad.db\"
routes:
  - name: alpha
    match:
      path_prefix: /hooks/alpha
    upstream: \"http://127.0.0.1:3001\"
    event_id:
      header: X-Event-ID
    colour: blue
";
    let errs = load_str(text, "unknown.yaml", &test_env).unwrap_err();
    assert_eq!(errs.0.len(), 1);
    let line = errs.to_string();
    assert!(
        line.starts_with("unknown.yaml:12:5: routes[0]: unknown field `colour`"),
        "{line}"
    );
}

#[test]
fn black_box_duplicate_name_points_at_the_second_name() {
    // The same name again on line 12, for another prefix and upstream.
    let second = route("")
        .replace(HEAD, "")
        .replace("/hooks/alpha", "/hooks/beta")
        .replace(":3001", ":3002");
    let text = route(&second);
    let line = printed_error(&text);
    assert!(
        line.starts_with(
            "cfg.yaml:12:5: routes[1].name: duplicate route name `alpha` (first defined at line 6)"
        ),
        "{line}"
    );
}

#[test]
fn black_box_lease_not_longer_than_timeout() {
    let text = route("    upstream_timeout: 10s\n    lease: 10s\n");
    let line = printed_error(&text);
    assert!(
        line.starts_with("cfg.yaml:13:5: routes[0].lease: lease (10s) must be longer than upstream_timeout (10s)"),
        "{line}"
    );
}

#[test]
fn three_independent_errors_are_reported_together() {
    let text = format!(
        "{HEAD}  - name: Alpha
    match:
      path_prefix: hooks
    upstream: \"ftp://x\"
    event_id:
      header: X-Event-ID
"
    );
    let errs = errors(&text);
    let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert_eq!(shown.len(), 3, "{}", shown.join("\n"));
    let expected = [
        "cfg.yaml:6:11: routes[0].name: invalid route name",
        "cfg.yaml:8:20: routes[0].match.path_prefix: ",
        "cfg.yaml:9:15: routes[0].upstream: malformed upstream URL",
    ];
    for (line, start) in shown.iter().zip(expected) {
        assert!(line.starts_with(start), "{line}");
    }
}

#[test]
fn errors_display_one_per_line() {
    let errs = ConfigErrors(vec![
        ConfigError {
            file: "a.yaml".into(),
            line: 1,
            col: 2,
            path: "x".into(),
            message: "m1".into(),
        },
        ConfigError {
            file: "a.yaml".into(),
            line: 3,
            col: 4,
            path: "y".into(),
            message: "m2".into(),
        },
    ]);
    assert_eq!(errs.to_string(), "a.yaml:1:2: x: m1\na.yaml:3:4: y: m2");
}

/// Every shipped config file loads (STYLE habit 3): `example.yaml` beside
/// Cargo.toml and every `*.yaml` / `*.yml` under `config/` (subfolders such
/// as `config/providers/` included) with a top-level `routes:` key (so alert
/// rules and other YAML there are skipped), with any env variable set to a
/// value every scheme accepts.
#[test]
fn shipped_config_files_load() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("example.yaml")];
    let mut dirs = vec![root.join("config")];
    while let Some(dir) = dirs.pop() {
        for path in std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path())
        {
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    let any_env = |_: &str| Some("whsec_aGVsbG8=".to_string());
    for file in files
        .iter()
        .filter(|f| f.is_file() && f.extension().is_some_and(|e| e == "yaml" || e == "yml"))
    {
        let text = std::fs::read_to_string(file).unwrap();
        if !text.lines().any(|l| l.starts_with("routes:")) {
            continue;
        }
        let name = file.display().to_string();
        if let Err(e) = load_str(&text, &name, &any_env) {
            panic!("{e}");
        }
    }
}

#[test]
fn load_file_names_the_file_as_given() {
    let e = super::load_file(std::path::Path::new("/nonexistent/idemgate.yaml")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("/nonexistent/idemgate.yaml:1:1: (file): cannot read"),
        "{e}"
    );
}
