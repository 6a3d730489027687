//! Telling a database that went silent from one that is only slow.
//!
//! A statement on its way can outlast every server-side bound: the
//! statement timeout stops counting before the commit, and a commit waits
//! for its WAL to reach the disk however long that takes (a claim's commit
//! took over 5 s in a CI run whose disk was busy flushing). A client-side
//! timer alone cannot tell that from a network partition, where no answer
//! will ever come, and giving up on a commit that is merely slow leaves its
//! outcome unknown: a claim that did commit then holds its event in flight
//! until the lease ends, and the sender's retries get 409s.
//!
//! So after [`QUIET`] without an answer the server is asked, on a new
//! connection, whether it is there. One that answers within [`PROBE`] is
//! slow: the wait goes on, asking again after each further `QUIET`, up to
//! [`LIMIT`]. One that does not is silent, and the statement is given up
//! after at most `QUIET + PROBE`, as soon as a single timer would have.

use std::future::Future;
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

/// How long a statement may go without an answer before the server is
/// asked whether it is still there.
pub(super) const QUIET: Duration = Duration::from_secs(4);
/// How long the server has to answer that question (a new connection
/// passes the startup handshake within milliseconds on a live server,
/// however busy its disk).
const PROBE: Duration = Duration::from_secs(1);
/// The longest a statement is waited for while the server keeps answering:
/// the default `upstream_timeout`, a time a sender already waits for one
/// delivery. Below the requester's backstop in `ticket`.
const LIMIT: Duration = Duration::from_secs(30);

/// Why a statement was given up; its outcome is unknown either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GaveUp {
    /// No answer for this long, and none to a new connection either.
    Silent(Duration),
    /// The server kept answering new connections, but not this statement
    /// within [`LIMIT`].
    TooLong,
}

impl GaveUp {
    /// The error's text, for `what` ("a batch", "the settle").
    pub(super) fn describe(self, what: &str) -> String {
        match self {
            GaveUp::Silent(after) => format!(
                "the database did not answer {what} within {} nor a new connection within {}; \
                 whether it committed is unknown",
                humantime::format_duration(round_ms(after)),
                humantime::format_duration(PROBE),
            ),
            GaveUp::TooLong => format!(
                "the database answered new connections but not {what} within {}; \
                 whether it committed is unknown",
                humantime::format_duration(LIMIT),
            ),
        }
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// `op`'s output, unless the server went silent or held it past [`LIMIT`].
/// The caller drops its connection on `Err`: it was cut off mid-statement.
pub(super) async fn unless_silent<T>(
    server: &PgConnectOptions,
    op: impl Future<Output = T>,
) -> Result<T, GaveUp> {
    let started = Instant::now();
    let mut op = std::pin::pin!(op);
    loop {
        let left = LIMIT.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(GaveUp::TooLong);
        }
        if let Ok(out) = tokio::time::timeout(QUIET.min(left), &mut op).await {
            return Ok(out);
        }
        // the statement may still finish while the server is asked
        let alive = tokio::select! {
            out = &mut op => return Ok(out),
            alive = answers(server) => alive,
        };
        if !alive {
            return Err(GaveUp::Silent(started.elapsed()));
        }
    }
}

/// Whether the server answers a new connection within [`PROBE`]. A refusal
/// from the server itself (too many clients, say) is an answer too.
async fn answers(server: &PgConnectOptions) -> bool {
    match tokio::time::timeout(PROBE, PgConnection::connect_with(server)).await {
        Ok(Ok(conn)) => {
            // a polite goodbye, off the caller's path
            tokio::spawn(async move {
                let _ = tokio::time::timeout(PROBE, conn.close()).await;
            });
            true
        }
        Ok(Err(sqlx::Error::Database(_))) => true,
        Ok(Err(_)) | Err(_) => false,
    }
}
