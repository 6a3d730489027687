//! # The test kit
//!
//! Loopback HTTP/1.1 pieces around the real proxy: one core (heads parsed
//! with `httparse`, bodies framed and decoded), a scripted server on it
//! (the sample consumer is one script; the fault tests' upstreams are
//! others), a blocking client, and an `idemgate serve` process on free
//! ports.
//!
//! A crate of its own in the workspace (`idemgate-testkit`, imported as
//! `testkit`), used by the integration tests, the benches and `idemgate
//! demo` (the consumer, the client and the process). It drives idemgate
//! from outside and does not depend on it, so idemgate can depend on it.
//!
//! - [`http`]: the core: requests, responses, framing, no I/O.
//! - [`server`]: the scripted server ([`Behavior`] per request).
//! - [`consumer`]: the sample consumer (answers scripted per event).
//! - [`client`]: the blocking client, `deliver`, `get`, free ports, polling.
//! - [`serve`]: an `idemgate serve` process, stopped on drop.

pub mod client;
pub mod consumer;
pub mod http;
pub mod serve;
pub mod server;

// The short paths are for the tests and benches; `demo` names the modules.
pub use client::{deliver, free_port, get, on_free_port, wait_ready, wait_until, Client};
pub use consumer::{Consumer, Reply};
pub use http::{Request, Response};
pub use serve::{memory_kib, proc_number, Ports, Serve};
pub use server::{response, Behavior, Server};
