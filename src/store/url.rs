//! A store URL: which backend it names, and how to show it without its
//! password. The config file's `store.url` and the CLI's `--store` are
//! checked by the same rule.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use super::valkey::target::{self as valkey, Durability, ValkeyTarget};
use super::StoreError;

/// The kind of store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// `sqlite://PATH` (or `sqlite:PATH`)
    Sqlite,
    /// `postgres://…` or `postgresql://…`
    Postgres,
    /// `valkey://…`, `redis://…` (`valkeys://`, `rediss://`: TLS), SPEC §18
    Valkey,
}

/// A URL whose scheme names a backend (any case). `Display` and `Debug`
/// hide its password; [`StoreUrl::as_str`] is for the driver alone.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl {
    url: String,
    kind: StoreKind,
    /// Where a SQLite URL's path starts and ends (before any `?query`).
    path: std::ops::Range<usize>,
    /// A Valkey URL taken apart (its durability may come from the config).
    valkey: Option<ValkeyTarget>,
}

const SCHEMES: &str =
    "sqlite://, postgres://, postgresql://, valkey://, redis://, valkeys:// or rediss://";

impl StoreUrl {
    /// Checks the scheme and that a path or host follows it. The message
    /// shows the scheme only: the rest of the URL may hold a password.
    pub fn parse(url: &str) -> Result<StoreUrl, String> {
        let unsupported = || format!("unsupported store scheme: the URL must start with {SCHEMES}");
        let Some((scheme, rest)) = url.split_once(':') else {
            return Err(unsupported());
        };
        let kind = match scheme.to_ascii_lowercase().as_str() {
            "sqlite" => StoreKind::Sqlite,
            "postgres" | "postgresql" if rest.starts_with("//") => StoreKind::Postgres,
            s if rest.starts_with("//") && valkey::scheme_tls(s).is_some() => StoreKind::Valkey,
            other if rest.starts_with("//") && !other.is_empty() => {
                return Err(format!(
                    "unsupported store scheme `{other}` (use {SCHEMES})"
                ))
            }
            _ => return Err(unsupported()),
        };
        let start = url.len() - rest.strip_prefix("//").unwrap_or(rest).len();
        let end = match kind {
            StoreKind::Sqlite => url[start..].find('?').map_or(url.len(), |q| start + q),
            StoreKind::Postgres | StoreKind::Valkey => url.len(),
        };
        if start == end {
            return Err(format!(
                "store URL `{scheme}://` is missing the path or host"
            ));
        }
        if kind == StoreKind::Postgres {
            for (i, one) in postgres_targets(url)?.urls.iter().enumerate() {
                sqlx::postgres::PgConnectOptions::from_str(one)
                    .map_err(|e| format!("host {} of the store URL: {e}", i + 1))?;
            }
        }
        let valkey = match kind {
            StoreKind::Valkey => Some(valkey::parse(url)?),
            _ => None,
        };
        Ok(StoreUrl {
            url: url.to_string(),
            kind,
            path: start..end,
            valkey,
        })
    }

    /// A Valkey URL's seeds, credentials and settings.
    pub fn valkey_target(&self) -> Option<&ValkeyTarget> {
        self.valkey.as_ref()
    }

    /// Sets a Valkey store's durability (the config's `store.durability`);
    /// `false` for another kind of store, which has no such setting.
    pub fn set_durability(&mut self, durability: Durability) -> bool {
        match &mut self.valkey {
            Some(t) => {
                t.durability = durability;
                true
            }
            None => false,
        }
    }

    pub fn kind(&self) -> StoreKind {
        self.kind
    }

    /// The URL itself, password included: for the driver, never for output.
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// The URL with any password replaced by `***`, safe for logs and output.
    pub fn redacted(&self) -> String {
        redact_url(&self.url)
    }

    /// A PostgreSQL URL's hosts, each as a URL of its own (see
    /// [`postgres_targets`]). Checked by [`StoreUrl::parse`].
    pub fn postgres_targets(&self) -> Option<PgTargets> {
        if self.kind != StoreKind::Postgres {
            return None;
        }
        postgres_targets(&self.url).ok()
    }

    /// A SQLite URL's file (relative to the working directory unless
    /// absolute, as in `sqlite:///abs/x.db`).
    pub fn sqlite_path(&self) -> Option<&Path> {
        (self.kind == StoreKind::Sqlite).then(|| Path::new(&self.url[self.path.clone()]))
    }
}

/// For the CLI's `--store` and the tests: the error shows the URL redacted.
impl FromStr for StoreUrl {
    type Err = StoreError;
    fn from_str(url: &str) -> Result<StoreUrl, StoreError> {
        StoreUrl::parse(url).map_err(|_| StoreError::UnsupportedUrl(redact_url(url)))
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        fmt::Debug::fmt(&self.redacted(), f)
    }
}

impl PartialEq<str> for StoreUrl {
    fn eq(&self, other: &str) -> bool {
        self.url == other
    }
}

impl PartialEq<&str> for StoreUrl {
    fn eq(&self, other: &&str) -> bool {
        self.url == *other
    }
}

/// A PostgreSQL URL taken apart as libpq reads one (SPEC §16): the hosts
/// to try in order, each as a one-host URL the driver parses (the same
/// user, database and parameters), and the libpq parameters the driver
/// does not know, read here.
pub struct PgTargets {
    /// One URL per host, password included: for the driver only.
    pub urls: Vec<String>,
    /// libpq's `connect_timeout` (whole seconds; 0 or absent: none).
    pub connect_timeout: Option<std::time::Duration>,
}

/// The values of `target_session_attrs` idemgate accepts: it always
/// needs a server that takes writes.
const WRITABLE_ATTRS: [&str; 2] = ["read-write", "primary"];

/// Splits `postgres://[userinfo@]h1[:p1],h2[:p2]…[/db][?query]` into one
/// URL per host. `target_session_attrs` must ask for a writable server;
/// it and `connect_timeout` are taken out (the driver ignores both, with a
/// warning). Messages never show the userinfo.
pub fn postgres_targets(url: &str) -> Result<PgTargets, String> {
    let (scheme, rest) = url.split_once("://").ok_or("the URL has no `://`")?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((user, hosts)) => (Some(user), hosts),
        None => (None, authority),
    };
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let mut kept = Vec::new();
    let mut connect_timeout = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "target_session_attrs" if WRITABLE_ATTRS.contains(&value) => {}
            "target_session_attrs" => {
                return Err(format!(
                    "target_session_attrs={value} is not supported: idemgate needs a server \
                     that takes writes (use read-write or primary, or leave it out)"
                ))
            }
            "connect_timeout" => {
                let secs: u64 = value.parse().map_err(|_| {
                    format!("connect_timeout={value} is not a whole number of seconds")
                })?;
                connect_timeout = (secs > 0).then(|| std::time::Duration::from_secs(secs.max(2)));
            }
            _ => kept.push(pair),
        }
    }
    let query = if kept.is_empty() {
        String::new()
    } else {
        format!("?{}", kept.join("&"))
    };
    let mut urls = Vec::new();
    for host in hosts.split(',') {
        if host.is_empty() {
            return Err("the store URL's host list has an empty entry".to_string());
        }
        let user = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        urls.push(format!("{scheme}://{user}{host}{path}{query}"));
    }
    Ok(PgTargets {
        urls,
        connect_timeout,
    })
}

/// The URL with any password replaced by `***`, safe for messages and logs
/// (the one implementation; `StoreConfig::redacted_url` calls it). The
/// userinfo ends at the *last* `@`, since a password may hold one (the URL
/// parser reads it so too); when in doubt this hides too much, never too
/// little. A `password=` query parameter is hidden as well. SQLite URLs
/// carry no credentials: a path with `@` or `:` is shown as written.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    if scheme.eq_ignore_ascii_case("sqlite") {
        return url.to_string();
    }
    let mut out = format!("{scheme}://");
    let after = match rest.rfind('@') {
        Some(at) => {
            match rest[..at].split_once(':') {
                Some((user, _password)) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                None => out.push_str(&rest[..at]),
            }
            out.push('@');
            &rest[at + 1..]
        }
        None => rest,
    };
    match after.split_once('?') {
        Some((base, query)) => {
            out.push_str(base);
            out.push('?');
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match pair.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => {
                        out.push_str(k);
                        out.push_str("=***");
                    }
                    _ => out.push_str(pair),
                }
            }
        }
        None => out.push_str(after),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_hosts_as_libpq_lists_them() {
        let t = postgres_targets(
            "postgres://u:p@ss@db1:5432,db2:5433,db3/idem?target_session_attrs=read-write&connect_timeout=3&sslmode=disable",
        )
        .unwrap();
        assert_eq!(
            t.urls,
            [
                "postgres://u:p@ss@db1:5432/idem?sslmode=disable",
                "postgres://u:p@ss@db2:5433/idem?sslmode=disable",
                "postgres://u:p@ss@db3/idem?sslmode=disable",
            ]
        );
        assert_eq!(t.connect_timeout, Some(std::time::Duration::from_secs(3)));
        let one = postgres_targets("postgresql://h/db?target_session_attrs=primary").unwrap();
        assert_eq!(one.urls, ["postgresql://h/db"]);
        assert_eq!(one.connect_timeout, None);
        assert_eq!(
            postgres_targets("postgres://[::1]:5,h").unwrap().urls.len(),
            2
        );
    }

    #[test]
    fn a_url_that_could_reach_a_standby_is_refused_without_its_password() {
        for (url, says) in [
            (
                "postgres://u:pw@h/db?target_session_attrs=read-only",
                "target_session_attrs=read-only",
            ),
            (
                "postgres://u:pw@h/db?target_session_attrs=any",
                "needs a server",
            ),
            (
                "postgres://u:pw@h/db?target_session_attrs=prefer-standby",
                "read-write or primary",
            ),
            ("postgres://u:pw@h1,,h2/db", "empty entry"),
            ("postgres://u:pw@h/db?connect_timeout=soon", "whole number"),
            (
                "postgres://u:pw@h1:5432,h2:54x2/db",
                "host 2 of the store URL",
            ),
        ] {
            let why = StoreUrl::parse(url).unwrap_err();
            assert!(why.contains(says), "{url}: {why}");
            assert!(!why.contains("pw"), "{url}: {why}");
        }
        assert!(StoreUrl::parse(
            "postgres://u:pw@h1:5432,h2:5433/db?target_session_attrs=read-write"
        )
        .is_ok());
    }

    #[test]
    fn kinds_by_scheme() {
        let kind_of = |url: &str| url.parse::<StoreUrl>().map(|u| u.kind());
        assert_eq!(kind_of("sqlite:///tmp/x.db").unwrap(), StoreKind::Sqlite);
        assert_eq!(kind_of("sqlite://data/x.db").unwrap(), StoreKind::Sqlite);
        assert_eq!(kind_of("SQLite:x.db").unwrap(), StoreKind::Sqlite);
        assert_eq!(kind_of("postgres://u@h/db").unwrap(), StoreKind::Postgres);
        assert_eq!(kind_of("postgresql://u@h/db").unwrap(), StoreKind::Postgres);
        assert_eq!(kind_of("PostgreSQL://u@h/db").unwrap(), StoreKind::Postgres);
        for valkey in [
            "valkey://h:1",
            "redis://h",
            "valkeys://u:p@h1,h2",
            "REDISS://h",
        ] {
            assert_eq!(kind_of(valkey).unwrap(), StoreKind::Valkey, "{valkey}");
        }
        assert_eq!(
            redact_url("valkey://idem:pw@h1:7000,h2:7001/?replicas=1"),
            "valkey://idem:***@h1:7000,h2:7001/?replicas=1"
        );
        assert!(kind_of("mysql://u:secret@h/db")
            .unwrap_err()
            .to_string()
            .contains("***"));
    }

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            redact_url("postgres://u:pw@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite:///a/b.db"), "sqlite:///a/b.db");
    }

    /// A password may hold `@`, `:` and more: the userinfo ends at the last `@`.
    #[test]
    fn redacts_passwords_holding_at_signs() {
        for (url, want) in [
            ("postgres://u:p@ss@h:5432/db", "postgres://u:***@h:5432/db"),
            ("postgres://u:p@s:s@w@h/db", "postgres://u:***@h/db"),
            ("postgresql://u:@@h/db", "postgresql://u:***@h/db"),
            ("mysql://u:se@cret@h/db", "mysql://u:***@h/db"),
            (
                "postgres://u@h/db?sslmode=require&password=pw&x=1",
                "postgres://u@h/db?sslmode=require&password=***&x=1",
            ),
            // hides too much rather than too little
            (
                "postgres://u:pw@h/db?application_name=a@b",
                "postgres://u:***@b",
            ),
            ("sqlite:///data/a@b:c.db", "sqlite:///data/a@b:c.db"),
            ("no scheme:pw@h", "no scheme:pw@h"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
    }

    /// One rule for the config and the store: the config's messages, the
    /// store's `sqlite:PATH` form, schemes in any case, a path required.
    #[test]
    fn one_rule_with_messages_that_hide_the_rest() {
        let why = |url: &str| StoreUrl::parse(url).unwrap_err();
        assert!(why("mysql://u:pw@h/db").starts_with("unsupported store scheme `mysql`"));
        assert!(!why("mysql://u:pw@h/db").contains("pw"));
        assert!(why("/tmp/x.db").starts_with("unsupported store scheme: "));
        assert!(why("postgres:h/db").starts_with("unsupported store scheme: "));
        assert!(why("sqlite://").contains("missing the path or host"));
        assert!(why("sqlite://?mode=rwc").contains("missing the path or host"));
        assert!(why("postgres://").contains("missing the path or host"));
        let url = StoreUrl::parse("postgres://u:pw@h/db").unwrap();
        assert_eq!(url.to_string(), "postgres://u:***@h/db");
        assert_eq!(format!("{url:?}"), "\"postgres://u:***@h/db\"");
        assert_eq!(url.as_str(), "postgres://u:pw@h/db");
        assert_eq!(url.sqlite_path(), None);
        let file = StoreUrl::parse("sqlite://data/x.db?mode=rwc").unwrap();
        assert_eq!(file.sqlite_path(), Some(std::path::Path::new("data/x.db")));
    }
}
