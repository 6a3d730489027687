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

/// The open-files limit cannot hold what the config asks for.
#[derive(Debug, thiserror::Error)]
pub enum FdsError {
    #[error("cannot raise the open-files limit: {0}")]
    Raise(#[source] std::io::Error),
    /// A config error line (`file:line:col: downstream.max_connections: …`).
    #[error(
        "{at}: downstream.max_connections: {max} client connections need {need} open files \
         (with the store's {store}, idle upstream connections, {room} upstream connections \
         in flight and {fixed} for the rest), but the hard limit (ulimit -Hn) is {limit}: \
         lower max_connections to at most {fits} or raise the limit (LimitNOFILE= in systemd)",
        room = IN_FLIGHT_ROOM,
        fixed = FIXED
    )]
    TooLow {
        /// Where `downstream.max_connections` is set (or what stands for it).
        at: String,
        max: u64,
        need: u64,
        /// The store's pool.
        store: u32,
        limit: u64,
        /// The most `max_connections` that would fit.
        fits: u64,
    },
}

/// Raises the limit and checks that `config` fits in it.
pub fn raise_and_check(config: &Config) -> Result<u64, FdsError> {
    let limit = crate::sys::raise_open_files_limit().map_err(FdsError::Raise)?;
    check(config, limit)?;
    Ok(limit)
}

/// Whether `config` fits in an open-files limit of `limit`.
pub fn check(config: &Config, limit: u64) -> Result<(), FdsError> {
    let need = needed(config);
    if need <= limit {
        return Ok(());
    }
    let max = config.downstream.max_connections as u64;
    Err(FdsError::TooLow {
        at: config.downstream.max_connections_at.clone(),
        max,
        need,
        store: config.store.max_connections,
        limit,
        fits: limit.saturating_sub(need - max),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_too_low_is_a_config_error_line() {
        let text = "listen: 127.0.0.1:8080\nadmin_listen: 127.0.0.1:9090\n\
                    store: {url: sqlite:///tmp/t.db}\ndownstream: {max_connections: 9000000}\n\
                    routes:\n  - {name: r, match: {path_prefix: /h}, upstream: http://h, guard_methods: []}\n";
        let config = crate::config::load_str(text, "t.yaml", &|_| None)
            .unwrap()
            .config;
        let need = needed(&config);
        assert!(check(&config, need).is_ok());
        let e = check(&config, 20_000).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "t.yaml:4:31: downstream.max_connections: 9000000 client connections need {need} open files \
                 (with the store's 16, idle upstream connections, 1024 upstream connections in flight \
                 and 256 for the rest), but the hard limit (ulimit -Hn) is 20000: lower max_connections \
                 to at most {} or raise the limit (LimitNOFILE= in systemd)",
                20_000 - (need - 9_000_000)
            )
        );
    }
}
