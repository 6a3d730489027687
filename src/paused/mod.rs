//! The routes an operator paused (SPEC §14): the set the proxy checks on
//! every request that would be forwarded (`routes.rs`), and the loop that
//! follows it, and the ambiguous count, in the store (`follow.rs`).

mod follow;
mod routes;

pub use follow::RouteState;
pub use routes::PausedRoutes;
