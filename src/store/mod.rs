//! The durable claim store: one record per (route, event ID), behind the
//! [`ClaimStore`] trait so that the proxy, the CLI and the tests do not care
//! whether it is the embedded SQLite file or a shared PostgreSQL database.
//!
//! Every transition is one atomic statement (see `claim` for the rules):
//! the claim is an `INSERT … ON CONFLICT DO UPDATE … WHERE <reclaimable>
//! RETURNING`, a release is an `UPDATE … WHERE attempts = $attempt`.

pub mod json;
mod owned;
pub mod postgres;
pub(crate) mod sql;
pub mod sqlite;
mod ticket;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

use crate::claim::{ClaimKind, Decision, Millis, Refusal, SettleResult, State};

/// A store error: the proxy fails closed on it (503) unless told otherwise.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported store URL (expected sqlite://PATH or postgres://…): {0}")]
    UnsupportedUrl(String),
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store migration failed: {0}")]
    Migration(String),
    #[error("store returned an unexpected value: {0}")]
    Corrupt(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::Unavailable(e.to_string())
    }
}

/// A delivery asking for the claim on its event ID.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    pub route: &'a str,
    pub event_id: &'a str,
    /// Hex sha256 of the payload (raw or canonical).
    pub digest: &'a str,
    pub now: Millis,
    pub lease_ms: Millis,
    pub retention_ms: Millis,
}

/// The recorded answer replayed to duplicates of a delivered event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recorded {
    pub status: Option<u16>,
    /// With `replay_body`: the settled response's content type and body.
    pub content_type: Option<String>,
    pub body: Option<Vec<u8>>,
}

/// The store's answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// This delivery owns the event now, as attempt number `attempt`.
    Claimed {
        attempt: i64,
        kind: ClaimKind,
        lease_until: Millis,
    },
    /// Somebody else decided it already: the record refuses this claim.
    Existing {
        decision: Refusal,
        recorded: Recorded,
    },
}

/// How an attempt is settled.
#[derive(Debug, Clone)]
pub struct SettleRequest<'a> {
    pub route: &'a str,
    pub event_id: &'a str,
    pub attempt: i64,
    pub now: Millis,
    pub retention_ms: Millis,
    pub outcome: SettleOutcome<'a>,
}

#[derive(Debug, Clone)]
pub enum SettleOutcome<'a> {
    /// A status in `settle_on`: close the claim as delivered (final).
    Delivered {
        status: u16,
        content_type: Option<&'a str>,
        body: Option<&'a [u8]>,
    },
    /// Anything else: release the claim, fenced by the attempt number.
    Failed {
        status: Option<u16>,
        error: Option<&'a str>,
    },
}

/// One record, every field (SPEC §3). The replay body is never printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Record {
    pub route: String,
    pub event_id: String,
    pub body_sha256: String,
    pub state: String,
    pub attempts: i64,
    pub lease_until: Option<Millis>,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub first_seen_at: Millis,
    pub updated_at: Millis,
    pub delivered_at: Option<Millis>,
    pub expires_at: Millis,
    pub replay_status: Option<i64>,
    pub replay_content_type: Option<String>,
    pub replay_body_bytes: Option<i64>,
}

impl Record {
    pub fn state(&self) -> Option<State> {
        State::parse(&self.state)
    }
}

/// Filter of `events list` and `GET /api/events`.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub route: Option<String>,
    pub state: Option<State>,
    pub limit: i64,
    /// Only event IDs that start with this text (compared byte for byte:
    /// `%` and `_` are plain characters).
    pub id_prefix: Option<String>,
    /// Only `processing` records whose lease had ended by this time: claims
    /// whose attempt died or hangs.
    pub lease_ended_by: Option<Millis>,
    /// Only records after this one in the list's order (a page's last).
    pub after: Option<ListKey>,
}

/// A record's place in the list's order (newest first, then route, then event
/// ID). Records only ever join the list at its top (`first_seen_at` never
/// changes), so the records after a key stay the same while others arrive:
/// a page that starts after the previous page's last record neither repeats
/// nor skips one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListKey {
    pub first_seen_at: Millis,
    pub route: String,
    pub event_id: String,
}

impl Record {
    /// This record's place in the list's order.
    pub fn list_key(&self) -> ListKey {
        ListKey {
            first_seen_at: self.first_seen_at,
            route: self.route.clone(),
            event_id: self.event_id.clone(),
        }
    }
}

/// What an operator's release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    Released {
        previous: State,
    },
    NotFound,
    /// The record is delivered and `--force` was not given.
    RefusedDelivered,
}

#[async_trait]
pub trait ClaimStore: Send + Sync {
    /// Applies pending migrations.
    async fn migrate(&self) -> Result<(), StoreError>;
    /// One cheap round trip: `/readyz`.
    async fn ping(&self) -> Result<(), StoreError>;
    /// Claims the event atomically, or says why not. An error means the
    /// claim did not commit, or (said in the error) that the store could not
    /// learn whether it did; a claim not yet run when the store's own time
    /// limit passes is not run at all (SPEC §6).
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError>;
    /// Closes or releases an attempt's claim; errors as for `claim`.
    async fn settle(&self, req: &SettleRequest<'_>) -> Result<SettleResult, StoreError>;
    /// Like `settle`, not run at all unless it is under way within `limit`
    /// (then its result is waited for). Dropping the future before it
    /// answers has the same effect; cutting it off with a timeout from
    /// outside instead would lose the result of a settle under way.
    async fn settle_within(
        &self,
        req: &SettleRequest<'_>,
        limit: Duration,
    ) -> Result<SettleResult, StoreError>;
    /// The claim's answer from a plain read, when the record alone decides it
    /// (delivered: replay; other digest: mismatch; live lease: in flight);
    /// `None` when the claim statement must run. Never writes, so duplicates
    /// of settled events do not queue behind claims.
    async fn peek(
        &self,
        route: &str,
        event_id: &str,
        digest: &str,
        now: Millis,
    ) -> Result<Option<ClaimOutcome>, StoreError>;
    async fn get(&self, route: &str, event_id: &str) -> Result<Option<Record>, StoreError>;
    /// Newest first (then by route and event ID), at most `filter.limit`.
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>, StoreError>;
    /// Operator release: `processing`/`failed` (or, forced, `delivered`) to `failed` with no lease.
    async fn release(
        &self,
        route: &str,
        event_id: &str,
        force: bool,
        now: Millis,
    ) -> Result<ReleaseOutcome, StoreError>;
    /// Deletes at most `limit` expired records (never a live lease); returns how many.
    async fn sweep_batch(&self, now: Millis, limit: i64) -> Result<u64, StoreError>;
    /// Per route, the `updated_at` of the oldest `processing` record.
    async fn oldest_processing(&self) -> Result<Vec<(String, Millis)>, StoreError>;
    /// Closes the pool (flushes the SQLite WAL).
    async fn close(&self);
}

/// The kind of store a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Sqlite,
    Postgres,
}

pub fn kind_of(url: &str) -> Result<StoreKind, StoreError> {
    if url.starts_with("sqlite:") {
        Ok(StoreKind::Sqlite)
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(StoreKind::Postgres)
    } else {
        Err(StoreError::UnsupportedUrl(redact_url(url)))
    }
}

/// Opens the store a URL names; `max_connections` sizes the pool.
pub async fn open(url: &str, max_connections: u32) -> Result<Arc<dyn ClaimStore>, StoreError> {
    match kind_of(url)? {
        StoreKind::Sqlite => Ok(Arc::new(
            sqlite::SqliteStore::open(url, max_connections).await?,
        )),
        StoreKind::Postgres => Ok(Arc::new(
            postgres::PostgresStore::open(url, max_connections).await?,
        )),
    }
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

/// Builds a [`ClaimOutcome::Existing`] from a record read back after a refused
/// claim, using the same `decide` rules as the SQL. `None` means the record
/// became claimable in between: try the claim again.
pub(crate) fn existing_outcome(
    state: &str,
    lease_until: Option<Millis>,
    same_digest: bool,
    now: Millis,
    recorded: Recorded,
) -> Result<Option<ClaimOutcome>, StoreError> {
    let state =
        State::parse(state).ok_or_else(|| StoreError::Corrupt(format!("state {state:?}")))?;
    let decision = crate::claim::decide(
        Some(crate::claim::Existing {
            state,
            lease_until,
            same_digest,
        }),
        now,
    );
    Ok(match decision {
        Decision::Claim(_) => None,
        Decision::Refuse(refusal) => Some(ClaimOutcome::Existing {
            decision: refusal,
            recorded,
        }),
    })
}

/// Runs one store operation, failing it as unavailable once `limit` passes.
pub(crate) async fn bounded<T>(
    limit: Duration,
    op: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, op).await {
        Ok(res) => res,
        Err(_) => Err(StoreError::Unavailable(format!(
            "no answer within {}",
            humantime::format_duration(limit)
        ))),
    }
}

pub(crate) fn claim_kind_from_previous(prev: Option<&str>) -> ClaimKind {
    match prev {
        None => ClaimKind::New,
        Some("failed") => ClaimKind::RetryFailed,
        Some(_) => ClaimKind::RetryExpired,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_by_scheme() {
        assert_eq!(kind_of("sqlite:///tmp/x.db").unwrap(), StoreKind::Sqlite);
        assert_eq!(kind_of("sqlite://data/x.db").unwrap(), StoreKind::Sqlite);
        assert_eq!(kind_of("postgres://u@h/db").unwrap(), StoreKind::Postgres);
        assert_eq!(kind_of("postgresql://u@h/db").unwrap(), StoreKind::Postgres);
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
}
