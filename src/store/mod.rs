//! The durable claim store: one record per (route, event ID), behind the
//! [`ClaimStore`] trait so that the proxy, the CLI and the tests do not care
//! whether it is the embedded SQLite file or a shared PostgreSQL database.
//!
//! Every transition is one atomic statement (see `claim` for the rules):
//! the claim is an `INSERT … ON CONFLICT DO UPDATE … WHERE <reclaimable>
//! RETURNING`, a release is an `UPDATE … WHERE attempts = $attempt`.
//!
//! Each database implements [`Backend`]; [`Bounded`] makes any backend a
//! `ClaimStore` by applying the time bounds, and [`open`] hands out that.

mod backend;
mod contract;
pub mod json;
pub mod operator;
pub(crate) mod owned;
pub mod postgres;
pub(crate) mod sql;
pub mod sqlite;
mod ticket;
mod url;
pub mod valkey;

use std::sync::Arc;

pub use backend::{Backend, Bounded};
pub(crate) use contract::{
    claim_kind_from_previous, existing_outcome, outcome_unknown, state_of, Found,
};
pub use contract::{
    Attempt, ClaimOutcome, ClaimRequest, ClaimStore, ListFilter, ListKey, Record, Recorded,
    ReleaseOutcome, ReleaseRequest, SettleOutcome, SettleRequest, StoreError,
};
pub use contract::{Param, Statement, Value};
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
