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
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tokio::time::Instant;

/// How long a statement may go without an answer before the server is
/// asked whether it is still there: past the statement timeout (3 s), so
/// that a statement the server gives up on answers before anyone asks.
pub(super) const QUIET: Duration = Duration::from_millis(3500);
/// How long the server has to answer that question: a live server passes a
/// new connection's startup handshake in milliseconds, however busy its
/// disk. With [`QUIET`], a silent server's 503 comes after 5 s.
const PROBE: Duration = Duration::from_millis(1500);
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
    unless_silent_by(op, || answers(server)).await
}

/// [`unless_silent`] with `alive` for the question to the server.
async fn unless_silent_by<T, F>(
    op: impl Future<Output = T>,
    mut alive: impl FnMut() -> F,
) -> Result<T, GaveUp>
where
    F: Future<Output = bool>,
{
    let started = Instant::now();
    let mut op = std::pin::pin!(op);
    loop {
        let left = LIMIT.saturating_sub(started.elapsed());
        let wait = QUIET.min(left);
        if let Ok(out) = tokio::time::timeout(wait, &mut op).await {
            return Ok(out);
        }
        if wait == left {
            return Err(GaveUp::TooLong);
        }
        // the statement may still finish while the server is asked
        let answered = tokio::select! {
            out = &mut op => return Ok(out),
            answered = alive() => answered,
        };
        if !answered {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::future::pending;
    use tokio::time::sleep;

    /// A live server: answers a new connection in 5 ms.
    async fn live() -> bool {
        sleep(Duration::from_millis(5)).await;
        true
    }

    /// A silent one: the question times out.
    async fn silent() -> bool {
        sleep(PROBE).await;
        false
    }

    /// `op` with `alive`: the result, the (virtual) time it took and how
    /// often the server was asked.
    async fn run<T, F: Future<Output = bool>>(
        op: impl Future<Output = T>,
        alive: impl Fn() -> F,
    ) -> (Result<T, GaveUp>, Duration, u32) {
        let (asked, t) = (Cell::new(0), Instant::now());
        let res = unless_silent_by(op, || {
            asked.set(asked.get() + 1);
            alive()
        })
        .await;
        (res, t.elapsed(), asked.get())
    }

    #[tokio::test(start_paused = true)]
    async fn a_prompt_answer_is_passed_on_without_asking() {
        let (res, took, asked) = run(async { 7 }, live).await;
        assert_eq!((res, took, asked), (Ok(7), Duration::ZERO, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_statement_on_a_live_server_is_waited_for() {
        let op = async {
            sleep(Duration::from_secs(20)).await;
            7
        };
        let (res, took, asked) = run(op, live).await;
        assert_eq!(res, Ok(7));
        assert_eq!(took, Duration::from_secs(20));
        assert_eq!(asked, 5, "asked after every 3.5 s of quiet");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_server_is_given_up_as_soon_as_one_timer_would() {
        let (res, took, asked) = run(pending::<()>(), silent).await;
        assert_eq!(res, Err(GaveUp::Silent(QUIET + PROBE)));
        assert_eq!((took, asked), (Duration::from_secs(5), 1));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_comes_while_the_server_is_asked_is_taken() {
        let op = async {
            sleep(QUIET + PROBE / 2).await;
            7
        };
        let (res, took, asked) = run(op, silent).await;
        assert_eq!((res, took, asked), (Ok(7), QUIET + PROBE / 2, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_statement_held_on_a_live_server_is_given_up_at_the_limit() {
        let (res, took, asked) = run(pending::<()>(), live).await;
        assert_eq!((res, took), (Err(GaveUp::TooLong), LIMIT));
        assert_eq!(asked, 8, "not asked once more after the limit");
    }

    #[test]
    fn the_errors_say_why_and_that_the_outcome_is_unknown() {
        let silent = GaveUp::Silent(Duration::from_micros(5_000_300)).describe("a batch");
        assert_eq!(
            silent,
            "the database did not answer a batch within 5s nor a new connection within \
             1s 500ms; whether it committed is unknown"
        );
        let long = GaveUp::TooLong.describe("the settle");
        assert!(long.contains("not the settle within 30s"), "{long}");
        assert!(long.ends_with("whether it committed is unknown"), "{long}");
    }
}
