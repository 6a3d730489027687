//! The open-files limit: raised to its hard limit at start, and checked
//! against `downstream.max_connections` with room for everything else the
//! process opens.

use crate::config::Config;

/// Descriptors the process needs besides client connections and upstream
/// connections: listeners, the store's files, the log, epoll and the
/// runtime's own, with a margin.
const FIXED: u64 = 256;
/// Upstream connections in flight that the limit must leave room for, at
/// least (each guarded request in progress holds one). Past that room an
/// upstream connect fails: 502 and the claim released, never a lost record.
pub const IN_FLIGHT_ROOM: u64 = 1024;

/// What `config` needs: client connections, the store's pool, the upstream
/// connections kept idle (pingora's pool and each route's), those in
/// flight, and the fixed rest.
pub fn needed(config: &Config) -> u64 {
    let idle_upstream = crate::proxy::idle::MAX_IDLE as u64 * (config.routes.len() as u64 + 1);
    config.downstream.max_connections as u64
        + u64::from(config.store.max_connections)
        + idle_upstream
        + IN_FLIGHT_ROOM
        + FIXED
}

/// Raises the limit and checks that `config` fits in it; the error is a
/// config error line (`file:line:col: downstream.max_connections: …`).
pub fn raise_and_check(config: &Config) -> Result<u64, String> {
    let limit = crate::sys::raise_open_files_limit()
        .map_err(|e| format!("cannot raise the open-files limit: {e}"))?;
    check(config, limit)?;
    Ok(limit)
}

/// Whether `config` fits in an open-files limit of `limit`.
pub fn check(config: &Config, limit: u64) -> Result<(), String> {
    let need = needed(config);
    if need <= limit {
        return Ok(());
    }
    let max = config.downstream.max_connections as u64;
    let fits = limit.saturating_sub(need - max);
    Err(format!(
        "{}: downstream.max_connections: {max} client connections need {need} open files \
         (with the store's {}, idle upstream connections, {IN_FLIGHT_ROOM} upstream connections \
         in flight and {FIXED} for the rest), but the hard limit (ulimit -Hn) is {limit}: \
         lower max_connections to at most {fits} or raise the limit (LimitNOFILE= in systemd)",
        config.downstream.max_connections_at, config.store.max_connections,
    ))
}
