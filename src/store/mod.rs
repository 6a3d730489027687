//! The durable claim store: one record per (route, event ID), behind the
//! [`ClaimStore`] trait so that the proxy, the CLI and the tests do not care
//! whether it is the embedded SQLite file or a shared PostgreSQL database.
//!
//! Every transition is one atomic operation (see `claim` for the rules);
//! on SQL the claim is an `INSERT … ON CONFLICT DO UPDATE … WHERE
//! <reclaimable> RETURNING`, a release an `UPDATE … WHERE attempts =
//! $attempt`.
//!
//! Each engine implements [`Backend`], typed operation by operation (the
//! hot path's and the operator's alike: no SQL crosses the seam);
//! [`Bounded`] makes any backend a `ClaimStore` by applying the time
//! bounds, and [`open`] hands out that. The files: `contract.rs` (the
//! trait, its requests, outcomes and records), `backend.rs` (the seam and
//! the bounds), `sql.rs` and `sql_operator.rs` (the SQL both SQL stores
//! share: the transitions, and the operator's actions written once over
//! [`sql_operator::SqlRun`]), `sqlite/` and `postgres/` (the engines),
//! `memory.rs` (the in-memory reference model the contract suite holds
//! every engine to; no URL opens it), `ticket.rs` (a claim's or settle's
//! place in a batch), `owned.rs` (requests owned across a task), `json.rs`
//! (a record as the CLI and the API print it), `url.rs` (store URLs).

mod backend;
mod contract;
pub mod json;
pub mod memory;
pub(crate) mod owned;
pub mod postgres;
pub(crate) mod sql;
mod sql_operator;
pub mod sqlite;
mod ticket;
mod trace_ref;
mod url;
pub mod valkey;

use std::sync::Arc;

pub use backend::{Backend, Bounded};
pub(crate) use contract::{
    claim_kind_from_previous, existing_outcome, outcome_unknown, state_of, Found,
};
pub use contract::{
    Attempt, BulkRelease, ClaimOutcome, ClaimRequest, ClaimStore, EngineReport, Learned,
    ListFilter, ListKey, QuestionBatch, Reconciliation, Record, Recorded, ReleaseOutcome,
    ReleaseRequest, ReplayHeaders, Resolution, ResolveOutcome, ResolveRequest, SettleOutcome,
    SettleRequest, StoreError, UnacknowledgedClaim,
};
pub use trace_ref::TraceRef;
pub use url::{redact_url, StoreKind, StoreUrl};
pub use valkey::target::{Durability, ValkeyTarget};

/// Opens the store a URL names; `max_connections` sizes the pool.
pub async fn open(url: &str, max_connections: u32) -> Result<Arc<dyn ClaimStore>, StoreError> {
    open_url(&url.parse()?, max_connections).await
}

/// [`open`] for a URL checked already (the config's `store.url`).
pub async fn open_url(
    url: &StoreUrl,
    max_connections: u32,
) -> Result<Arc<dyn ClaimStore>, StoreError> {
    match url.kind() {
        StoreKind::Sqlite => Ok(Arc::new(Bounded::new(
            sqlite::SqliteStore::open(url, max_connections).await?,
        ))),
        StoreKind::Postgres => Ok(Arc::new(Bounded::new(
            postgres::PostgresStore::open(url, max_connections).await?,
        ))),
        StoreKind::Valkey => Ok(Arc::new(Bounded::new(
            valkey::ValkeyStore::open(url).await?,
        ))),
    }
}
