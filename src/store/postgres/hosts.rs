//! Which server the pools connect to (SPEC §16). A URL may list several
//! hosts, as libpq's does; idemgate keeps connections only to a server
//! that takes writes. Every new connection is checked on arrival (a
//! standby, or a primary demoted or set read-only, is refused), and a
//! follower task, woken by any sign that the server is gone or no longer
//! writable, tries the hosts (the current one first, then the others in
//! the URL's order) and points both pools at the first writable one.
//!
//! Behind a single name that moves (a virtual IP, a DNS name) the check on
//! arrival is what keeps a connection off the standby.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{Connection, PgConnection};
use tokio::sync::Notify;

/// How long a host has to accept a connection during a search, when the
/// URL sets no `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Between two searches that found no writable server.
const SEARCH_AGAIN: Duration = Duration::from_secs(1);

/// Why a server was refused or a connection dropped: the text every such
/// error carries.
pub(super) const NOT_WRITABLE: &str = "the server takes no writes (a standby, or read-only)";

/// A host's turn-aways are logged at most this often: a standby refused is
/// expected during a failover, and the pool tries again many times a second.
const TURN_AWAY_LOG_EVERY: Duration = Duration::from_secs(60);

/// The URL's hosts and the one in use.
pub(super) struct Hosts {
    targets: Vec<PgConnectOptions>,
    connect_timeout: Duration,
    current: AtomicUsize,
    trouble: Notify,
    /// Per host, when a connection turned away was last logged.
    logged: Mutex<Vec<Option<Instant>>>,
}

impl Hosts {
    pub(super) fn new(
        targets: Vec<PgConnectOptions>,
        connect_timeout: Option<Duration>,
    ) -> Arc<Self> {
        assert!(!targets.is_empty(), "a store URL names a host at least");
        let targets_len = targets.len();
        Arc::new(Hosts {
            targets,
            connect_timeout: connect_timeout.unwrap_or(CONNECT_TIMEOUT),
            current: AtomicUsize::new(0),
            trouble: Notify::new(),
            logged: Mutex::new(vec![None; targets_len]),
        })
    }

    /// The options of the host in use.
    pub(super) fn current(&self) -> &PgConnectOptions {
        &self.targets[self.current.load(Ordering::Relaxed)]
    }

    /// Something suggests the server is gone or takes no writes: look
    /// again (at once if the follower is idle, or once more after its
    /// search under way).
    pub(super) fn trouble(&self) {
        if self.targets.len() > 1 {
            self.trouble.notify_one();
        }
    }

    /// The check every new connection passes before either pool takes it.
    /// A connection refused here is logged by [`Hosts::turned_away`], at
    /// WARN once a minute per host (sqlx's own ERROR line for each is
    /// silenced by `telemetry`).
    pub(super) async fn check_arrival(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        match writable(conn).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.trouble();
                self.turned_away(NOT_WRITABLE);
                Err(sqlx::Error::Configuration(NOT_WRITABLE.into()))
            }
            Err(e) => {
                self.trouble();
                self.turned_away(&e.to_string());
                Err(e)
            }
        }
    }

    /// Logs a connection to the host in use turned away, unless one was
    /// logged for that host within [`TURN_AWAY_LOG_EVERY`].
    fn turned_away(&self, why: &str) {
        let i = self.current.load(Ordering::Relaxed);
        let now = Instant::now();
        {
            let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
            if logged[i].is_some_and(|at| now.duration_since(at) < TURN_AWAY_LOG_EVERY) {
                return;
            }
            logged[i] = Some(now);
        }
        tracing::warn!(
            host = %host_of(&self.targets[i]),
            reason = why,
            "store: a new connection turned away (logged once a minute per host)"
        );
    }

    /// Follows the writable server for `pools` until the first of them
    /// closes. Nothing to follow with one host.
    pub(super) fn follow(self: &Arc<Self>, pools: [PgPool; 2]) {
        if self.targets.len() < 2 {
            return;
        }
        let hosts = Arc::clone(self);
        tokio::spawn(async move {
            let closing = pools[0].close_event();
            tokio::select! {
                () = closing => {}
                () = hosts.search_on_trouble(&pools) => {}
            }
        });
    }

    async fn search_on_trouble(&self, pools: &[PgPool; 2]) {
        loop {
            self.trouble.notified().await;
            let mut searches = 0u32;
            loop {
                searches += 1;
                match self.find_writable().await {
                    Some(i) => {
                        self.switch_to(i, pools);
                        break;
                    }
                    None => {
                        if searches == 1 {
                            tracing::warn!(
                                hosts = self.targets.len(),
                                "store: no listed host takes writes; searching every second"
                            );
                        }
                        tokio::time::sleep(SEARCH_AGAIN).await;
                    }
                }
            }
        }
    }

    /// The first host that takes writes: the current one, then the rest
    /// in the URL's order.
    async fn find_writable(&self) -> Option<usize> {
        let now = self.current.load(Ordering::Relaxed);
        let order = std::iter::once(now).chain((0..self.targets.len()).filter(|&i| i != now));
        for i in order {
            if self.takes_writes(i).await {
                return Some(i);
            }
        }
        None
    }

    async fn takes_writes(&self, i: usize) -> bool {
        let attempt = async {
            let mut conn = PgConnection::connect_with(&self.targets[i]).await?;
            let ok = writable(&mut conn).await;
            let _ = conn.close().await;
            ok
        };
        matches!(
            tokio::time::timeout(self.connect_timeout, attempt).await,
            Ok(Ok(true))
        )
    }

    fn switch_to(&self, i: usize, pools: &[PgPool; 2]) {
        let before = self.current.swap(i, Ordering::Relaxed);
        if before == i {
            return;
        }
        for pool in pools {
            pool.set_connect_options(self.targets[i].clone());
        }
        tracing::warn!(
            host = %host_of(&self.targets[i]),
            was = %host_of(&self.targets[before]),
            "store: switched to the listed host that takes writes"
        );
    }
}

/// `host:port`, never the credentials.
fn host_of(opts: &PgConnectOptions) -> String {
    format!("{}:{}", opts.get_host(), opts.get_port())
}

/// Whether the connection's server takes writes: not in recovery, and not
/// read-only by `default_transaction_read_only`.
pub(super) async fn writable(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    let read_only: bool = sqlx::query_scalar(
        "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'",
    )
    .fetch_one(conn)
    .await?;
    Ok(!read_only)
}

/// Whether an error says the connection's server is gone, or takes no
/// writes: the connection is not worth keeping, and another host may be.
pub(super) fn server_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed => true,
        sqlx::Error::Configuration(why) => why.to_string() == NOT_WRITABLE,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // read_only_sql_transaction, admin/crash shutdown, cannot
            // connect now, and the connection exceptions
            matches!(&*code, "25006" | "57P01" | "57P02" | "57P03") || code.starts_with("08")
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_server_is_told_from_an_error_of_the_statement() {
        let io = || std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(server_lost(&sqlx::Error::Io(io())));
        assert!(server_lost(&sqlx::Error::PoolTimedOut));
        assert!(server_lost(&sqlx::Error::Protocol("cut".into())));
        assert!(server_lost(&sqlx::Error::Configuration(
            NOT_WRITABLE.into()
        )));
        assert!(!server_lost(&sqlx::Error::Configuration(
            "a bad port".into()
        )));
        assert!(!server_lost(&sqlx::Error::RowNotFound));
    }

    #[test]
    fn a_search_begins_at_the_host_in_use() {
        let opts = |port| PgConnectOptions::new().host("127.0.0.1").port(port);
        let hosts = Hosts::new(vec![opts(1), opts(2), opts(3)], None);
        assert_eq!(hosts.current().get_port(), 1);
        hosts.current.store(2, Ordering::Relaxed);
        assert_eq!(hosts.current().get_port(), 3);
        assert_eq!(host_of(hosts.current()), "127.0.0.1:3");
        assert_eq!(hosts.connect_timeout, CONNECT_TIMEOUT);
    }
}
