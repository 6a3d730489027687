//! The integration tests: one binary, one module per concern. Each module
//! starts the real `idemgate` binary (or drives the library) against real
//! stores, real consumers and real sockets on loopback; everything a test
//! starts is stopped when its handle drops.
//!
//! Run one module with `cargo test --release --test it MODULE::`, one test
//! with `cargo test --release --test it MODULE::NAME -- --exact`.
//!
//! # Support
//! - [`common`]: the harness — [`common::Harness`] (temp dir, loopback
//!   consumer, proxy process, store), [`common::TestStore`] and
//!   `on_both_stores!` (one suite, once per backend), the proxy process
//!   itself, temp dirs, PostgreSQL schemas, the `idemgate` command line.
//!   The HTTP pieces underneath (client, scripted servers, the `serve`
//!   process) are the `testkit` crate (tests/testkit), shared with the
//!   benches and `demo`.
//! - [`core_util`]: background and in-flight deliveries, payloads, raw
//!   connections that show 1xx heads, problem types, status tallies.
//! - [`raw_upstream`]: a scripted raw TCP upstream for fault tests.
//! - [`admin_util`]: admin-token proxies and admin API calls.
//! - [`webdriver`]: headless Chromium for the console tests.
//!
//! # Adding a test module
//! 1. Write `tests/it/NAME.rs`: a `//!` line saying what it covers, then
//!    `use crate::common::*;` (and the other support modules it needs).
//! 2. Add `mod NAME;` to the list below (alphabetical).
//! 3. Start fixtures with `Harness::sqlite(tag).route(..).start()` (or
//!    `Harness::postgres(tag)`, which skips without a database outside CI);
//!    add a helper to the support modules rather than a copy in the test.
//!
//! A standalone `tests/NAME.rs` (say a branch's new `tests/upgrade.rs`)
//! still builds as a binary of its own, since cargo discovers it, but links
//! everything again and repeats the preamble. To fold one in: `git mv` it to
//! `tests/it/NAME.rs`; replace its `mod common;` (and `mod core_util;` …)
//! with `use crate::common;`, or `use crate::common::*;`; `idemgate::sample`
//! is now `testkit` (`kit::` in `common`), `RawUpstream::start`
//! is `raw_upstream::upstream`; add `mod NAME;` below; its tests are then
//! `--test it NAME::…`.

#[macro_use]
mod common;
mod admin_util;
mod core_util;
mod raw_upstream;
mod webdriver;

mod admin_api;
mod ambiguous;
mod console;
mod core;
mod core_http;
mod core_retry;
mod core_routes;
mod crash;
mod edge;
mod failover;
mod hardening;
mod headers;
mod helm;
mod hostile;
mod in_flight_wait;
mod keys;
mod listener;
mod model;
mod monitoring;
mod operations;
mod options;
mod otel;
mod outage;
mod paths;
mod properties;
mod protect;
mod providers;
mod readiness;
mod reconcile;
mod replicas;
mod smuggling;
mod stopping;
mod store_contract;
mod store_edges;
mod store_faults;
mod store_upgrade;
mod strict;
mod svix;
mod tls;
mod upgrade;
mod upstream_faults;
mod valkey_faults;
mod valkey_single;
mod valkey_store;
