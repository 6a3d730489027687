//! # The test kit
//!
//! Loopback HTTP/1.1 pieces around the real proxy: one core (heads parsed
//! with `httparse`, bodies framed and decoded), a scripted server on it
//! (the sample consumer is one script; the fault tests' upstreams are
//! others), a blocking client, and an `idemgate serve` process on free
//! ports.
//!
//! Public only with the `testkit` cargo feature, which the tests and benches
//! get through the package's dev-dependency on itself (Cargo.toml). The
//! shipped library keeps it private: there only `idemgate demo` uses it (the
//! consumer, the client and the process), hence the `dead_code` allowance
//! for the rest in builds without the feature.
//!
//! - [`http`]: the core: requests, responses, framing, no I/O.
//! - [`server`]: the scripted server ([`Behavior`] per request).
//! - [`consumer`]: the sample consumer (answers scripted per event).
//! - [`client`]: the blocking client, `deliver`, `get`, free ports, polling.
//! - [`serve`]: an `idemgate serve` process, stopped on drop.
#![cfg_attr(not(feature = "testkit"), allow(dead_code))]

pub mod client;
pub mod consumer;
pub mod http;
pub mod serve;
pub mod server;

// The short paths are for the tests and benches; `demo` names the modules.
#[cfg(feature = "testkit")]
pub use client::{deliver, free_port, get, wait_ready, wait_until, Client};
#[cfg(feature = "testkit")]
pub use consumer::{Consumer, Reply};
#[cfg(feature = "testkit")]
pub use http::{Request, Response};
#[cfg(feature = "testkit")]
pub use serve::{memory_kib, proc_number, Ports, Serve};
#[cfg(feature = "testkit")]
pub use server::{response, Behavior, Server};
