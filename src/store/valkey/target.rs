//! A Valkey / Redis store URL taken apart (SPEC §18):
//! `valkey://[user[:password]@]host[:port][,host[:port]…][/][?replicas=N&durability=…&ca=file:PATH]`,
//! also `redis://`, and `valkeys://` / `rediss://` for TLS. Pure: the
//! config and the CLI check a URL with it before anything connects.
//! Messages never show the userinfo.

use std::fmt;
use std::path::PathBuf;

/// What a write must reach before its answer counts (SPEC §18).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `WAITAOF 1 N`: in the append-only file of the primary and of N
    /// replicas, on disk (the default: a single node lost loses nothing).
    #[default]
    Fsynced,
    /// `WAIT N`: N replicas received it, not yet on their disk (Redis 7.0/7.1).
    ReplicaReceived,
    /// No wait: a failover can forget a claim, and forward its event twice.
    None,
}

impl Durability {
    pub fn parse(text: &str) -> Option<Durability> {
        match text {
            "fsynced" => Some(Durability::Fsynced),
            "replica_received" => Some(Durability::ReplicaReceived),
            "none" => Some(Durability::None),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Durability::Fsynced => "fsynced",
            Durability::ReplicaReceived => "replica_received",
            Durability::None => "none",
        }
    }

    /// What `check` warns about a weaker setting (`None` for the default).
    pub fn risk(self) -> Option<&'static str> {
        match self {
            Durability::Fsynced => None,
            Durability::ReplicaReceived => Some(
                "durability `replica_received` waits only until a replica received each claim, \
                 not until it is on disk: a power cut of a shard's nodes together can forget \
                 claims, and the events they forwarded are forwarded again",
            ),
            Durability::None => Some(
                "durability `none` waits for no replica: after a failover the new primary may \
                 lack claims already forwarded, and their events are forwarded a second time \
                 (a cache, not a guard)",
            ),
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A parsed Valkey store URL. The password is for the client alone.
#[derive(Clone, PartialEq, Eq)]
pub struct ValkeyTarget {
    /// `host:port` of every seed node, as written (IPv6 in brackets).
    pub seeds: Vec<(String, u16)>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub tls: bool,
    /// A CA bundle to trust instead of the system roots (`ca=file:PATH`).
    pub ca: Option<PathBuf>,
    /// How many replicas of a shard must have each write.
    pub replicas: u32,
    pub durability: Durability,
}

impl fmt::Debug for ValkeyTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValkeyTarget")
            .field("seeds", &self.seeds)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .field("ca", &self.ca)
            .field("replicas", &self.replicas)
            .field("durability", &self.durability)
            .finish()
    }
}

/// The schemes this store answers to, and whether each is TLS.
pub fn scheme_tls(scheme: &str) -> Option<bool> {
    match scheme {
        "valkey" | "redis" => Some(false),
        "valkeys" | "rediss" => Some(true),
        _ => None,
    }
}

const DEFAULT_PORT: u16 = 6379;

/// Takes a Valkey URL apart; the message says what is wrong without the
/// userinfo.
pub fn parse(url: &str) -> Result<ValkeyTarget, String> {
    let (scheme, rest) = url.split_once("://").ok_or("the URL has no `://`")?;
    let tls = scheme_tls(&scheme.to_ascii_lowercase())
        .ok_or_else(|| format!("`{scheme}` is not a Valkey scheme"))?;
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        None => (None, None),
        Some(u) => {
            let (user, pass) = match u.split_once(':') {
                Some((user, pass)) => (user, Some(pass)),
                None => (u, None),
            };
            let user = (!user.is_empty()).then(|| decode(user)).transpose()?;
            (user, pass.map(decode).transpose()?)
        }
    };
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    if !(path.is_empty() || path == "/" || path == "/0") {
        return Err(format!(
            "the path `{path}` is not supported: a cluster has one database (leave it out, or /0)"
        ));
    }
    let mut target = ValkeyTarget {
        seeds: Vec::new(),
        user,
        password,
        tls,
        ca: None,
        replicas: 1,
        durability: Durability::default(),
    };
    for (i, host) in hosts.split(',').enumerate() {
        target
            .seeds
            .push(seed(host).map_err(|e| format!("seed {} of the store URL: {e}", i + 1))?);
    }
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "replicas" => {
                target.replicas = value
                    .parse()
                    .map_err(|_| format!("replicas={value} is not a whole number"))?
            }
            "durability" => {
                target.durability = Durability::parse(value).ok_or_else(|| {
                    format!("durability={value}: use fsynced, replica_received or none")
                })?
            }
            "ca" if tls => {
                let path = value
                    .strip_prefix("file:")
                    .ok_or_else(|| format!("ca={value}: write ca=file:PATH"))?;
                target.ca = Some(PathBuf::from(path));
            }
            "ca" => return Err("ca= needs a TLS scheme (valkeys:// or rediss://)".into()),
            other => {
                return Err(format!(
                    "unknown parameter `{other}` (replicas, durability, ca)"
                ))
            }
        }
    }
    Ok(target)
}

/// One `host[:port]` (an IPv6 address in brackets).
fn seed(text: &str) -> Result<(String, u16), String> {
    if text.is_empty() {
        return Err("empty host".into());
    }
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (addr, after) = v6.split_once(']').ok_or("unclosed `[`")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("text after `]`")?),
        };
        (addr, port)
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err("empty host".into());
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("port `{p}` is not a number from 1 to 65535"))?,
    };
    Ok((host.to_string(), port))
}

/// %-decodes a user or password (a password may hold `@` or `:` written as
/// %40 or %3A).
fn decode(text: &str) -> Result<String, String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| "the user or password is not UTF-8 once %-decoded".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_user_password_and_parameters() {
        let t = parse(
            "valkey://idem:p%40ss:w@h1:7000,h2:7001,[::1]:7002,h3/?replicas=2&durability=none",
        )
        .unwrap();
        assert_eq!(
            t.seeds,
            [
                ("h1".to_string(), 7000),
                ("h2".to_string(), 7001),
                ("::1".to_string(), 7002),
                ("h3".to_string(), 6379)
            ]
        );
        assert_eq!(t.user.as_deref(), Some("idem"));
        assert_eq!(t.password.as_deref(), Some("p@ss:w"));
        assert_eq!(
            (t.replicas, t.durability, t.tls),
            (2, Durability::None, false)
        );
        assert!(!format!("{t:?}").contains("p@ss"), "{t:?}");
    }

    #[test]
    fn defaults_and_tls_schemes() {
        let t = parse("redis://127.0.0.1:6380").unwrap();
        assert_eq!(
            (t.replicas, t.durability, t.tls),
            (1, Durability::Fsynced, false)
        );
        assert_eq!((t.user, t.password), (None, None));
        let t = parse("rediss://:secret@h?ca=file:/etc/ca.pem").unwrap();
        assert!(t.tls);
        assert_eq!(t.password.as_deref(), Some("secret"));
        assert_eq!(t.ca, Some(PathBuf::from("/etc/ca.pem")));
        assert!(parse("VALKEYS://h").unwrap().tls);
    }

    #[test]
    fn mistakes_are_named_without_the_password() {
        for (url, says) in [
            ("valkey://u:pw@h1,,h2", "seed 2"),
            ("valkey://u:pw@h:0", "port `0`"),
            ("valkey://u:pw@h:x", "port `x`"),
            ("valkey://u:pw@h?replicas=one", "replicas=one"),
            (
                "valkey://u:pw@h?durability=aof",
                "fsynced, replica_received or none",
            ),
            ("valkey://u:pw@h?ca=file:/x", "needs a TLS scheme"),
            ("valkey://u:pw@h?replica=1", "unknown parameter `replica`"),
            ("valkey://u:pw@h/3", "one database"),
            ("valkey://u:pw@[::1", "unclosed"),
        ] {
            let why = parse(url).unwrap_err();
            assert!(why.contains(says), "{url}: {why}");
            assert!(!why.contains("pw"), "{url}: {why}");
        }
    }

    #[test]
    fn only_the_default_has_no_risk() {
        assert_eq!(Durability::Fsynced.risk(), None);
        assert!(Durability::None.risk().unwrap().contains("second time"));
        assert!(Durability::ReplicaReceived
            .risk()
            .unwrap()
            .contains("not until it is on disk"));
        for d in [
            Durability::Fsynced,
            Durability::ReplicaReceived,
            Durability::None,
        ] {
            assert_eq!(Durability::parse(d.as_str()), Some(d));
        }
    }
}
