//! # idemgate
//!
//! A reverse proxy that makes at-least-once webhook deliveries reach an
//! unmodified consumer exactly once: it claims each event ID in a durable
//! store before forwarding, answers duplicates itself, and settles the claim
//! from the upstream's outcome.
//!
//! "SPEC §N" in comments refers to section N of the contract, summarised in `docs/spec.md`.
//!
//! # Layout
//! - [`config`]: YAML → validated model (errors with file:line:col).
//! - [`claim`]: the state machine as data (`decide`, `settle`), event IDs, digests.
//! - [`store`]: the `ClaimStore` trait; the `Backend` trait, with SQLite and
//!   PostgreSQL implementations, made a `ClaimStore` by `Bounded`.
//! - [`path`]: RFC 3986 normalisation of request paths (routes match, and requests carry, the normal form).
//! - [`strict`]: the strict HTTP/1.1 request grammar: heads, header fields and chunked framing (SPEC §4).
//! - [`source`]: who sent a request: address ranges (CIDRs, matched by binary search) and the client address behind trusted proxies (SPEC §22).
//! - [`proxy`]: the pingora hooks, route matching and guarded forwarding.
//! - [`reconcile`]: asking the consumer about ambiguous outcomes (SPEC §21): inline, in the background, for the operator.
//! - [`paused`]: the routes an operator paused (SPEC §14), as last read from the store.
//! - [`limits`]: per-route upstream concurrency, rate and breaker (SPEC §15), atomics only.
//! - [`listener`]: client connections: limits, timeouts, TLS, head reading.
//! - [`problem`]: problem+json responses and request outcomes.
//! - [`metrics`]: the metric set over an owned Prometheus registry.
//! - [`otel`]: OpenTelemetry traces (SPEC §19): the request's spans, W3C propagation, the bounded export.
//! - [`telemetry`]: the log (subscriber, line format, writer) and the registry's plumbing.
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz`, the JSON admin API and the operator console.
//! - [`server`]: assembles and runs the pingora server, with graceful stop.
//! - [`sweeper`]: background deletion of expired records, the oldest-processing gauge.
//! - [`verify`]: provider signature schemes, checked before the claim.
//! - `failpoint`: crash injection for the crash tests (armed only with the `failpoints` feature).
//! - [`cli`]: the subcommands.
//! - [`sys`]: the few OS calls without a safe wrapper elsewhere; the one
//!   module allowed `unsafe` (the crate denies it everywhere else).

#![deny(unsafe_code)]

pub mod admin;
pub mod claim;
pub mod cli;
pub mod config;
mod failpoint;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod otel;
pub mod path;
pub mod paused;
pub mod problem;
pub mod proxy;
pub mod reconcile;
pub mod server;
pub mod source;
pub mod store;
pub mod strict;
pub mod sweeper;
pub mod sys;
pub mod telemetry;
pub mod verify;
