//! Readiness follows a stop (SPEC §20): from SIGTERM until the process
//! exits, the admin listener answers, `/readyz` says 503 and `/metrics`
//! keeps answering, while the request in flight finishes.

use std::time::{Duration, Instant};

use crate::common::*;
use crate::core_util::deliver_in_flight;

/// Sends `sig` (`-TERM`, `-QUIT`) to `pid`.
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(ok.success(), "kill {sig} {pid}");
}

/// The process has exited (a zombie not yet reaped, or gone).
pub fn has_exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // the state follows the command's closing parenthesis
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => true,
    }
}

/// How long after `kill` returns a poll may still find the process ready:
/// the signal is handled on a thread of its own.
pub const SIGNAL_HANDLED: Duration = Duration::from_millis(100);

/// One poll of the admin listener during a stop.
#[derive(Debug)]
pub struct Poll {
    /// Since the signal.
    pub at: Duration,
    /// `/readyz`'s status, or `None` when it could not be reached.
    pub readyz: Option<u16>,
    pub metrics: Option<u16>,
}

/// Polls `/readyz` and `/metrics` every `every` until `pid` exits; the
/// polls, and when the exit was seen (both since `since`). A poll that
/// failed because the process was exiting at that moment is dropped: it
/// is the exit, not an answer.
pub fn poll_until_exit(
    admin: std::net::SocketAddr,
    pid: u32,
    since: Instant,
    every: Duration,
    limit: Duration,
) -> (Vec<Poll>, Duration) {
    let mut polls = Vec::new();
    while !has_exited(pid) {
        assert!(since.elapsed() < limit, "still running after {limit:?}");
        let at = since.elapsed();
        let readyz = kit::get(admin, "/readyz").ok().map(|r| r.status);
        let metrics = kit::get(admin, "/metrics").ok().map(|r| r.status);
        let failed = readyz.is_none() || metrics.is_none();
        // a refusal in the exit's last moment is the exit itself
        if failed && wait_until(Duration::from_millis(300), || has_exited(pid)) {
            break;
        }
        polls.push(Poll {
            at,
            readyz,
            metrics,
        });
        std::thread::sleep(every);
    }
    (polls, since.elapsed())
}

/// A request in flight to a slow upstream (3 s), SIGTERM half a second in:
/// until the exit, every poll of `/readyz` is answered 503 and every
/// `/metrics` 200; the request completes 200, its record is delivered, the
/// exit code is 0. Before, the admin listener closed at the signal
/// (connection refused for the whole drain).
#[test]
fn readyz_is_503_and_metrics_answer_from_sigterm_until_exit() {
    let mut h = Harness::sqlite("stop-readyz")
        .route("s", "/hooks/s", "")
        .start();
    let id = eid("slow");
    h.up.hold(&id, 200, Duration::from_secs(3));
    let sender = deliver_in_flight(&h, "/hooks/s", &id, b"{}");
    std::thread::sleep(Duration::from_millis(500));
    let pid = h.pid().expect("running");
    let signalled = Instant::now();
    signal(pid, "-TERM");
    let (polls, exited_after) = poll_until_exit(
        h.admin,
        pid,
        signalled,
        Duration::from_millis(50),
        Duration::from_secs(20),
    );
    let answer = sender.join().unwrap().expect("the request was answered");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(h.stop(Duration::from_secs(5)), Some(0), "{}", h.log());
    assert!(
        exited_after >= Duration::from_millis(2000),
        "the stop waited for the request: exited after {exited_after:?}"
    );
    // the signal takes a moment to be handled: polls sent within it may
    // still find the process ready
    let wrong: Vec<&Poll> = polls
        .iter()
        .filter(|p| p.at >= SIGNAL_HANDLED)
        .filter(|p| p.readyz != Some(503) || p.metrics != Some(200))
        .collect();
    assert!(
        wrong.is_empty(),
        "from SIGTERM to exit, /readyz 503 and /metrics 200; got {wrong:?}; log:\n{}",
        h.log()
    );
    // polled through the drain, not once at its end
    let last = polls.last().map(|p| p.at).unwrap_or_default();
    assert!(
        polls.len() >= 20 && last + Duration::from_millis(500) >= exited_after,
        "{} polls, the last at {last:?}, exit at {exited_after:?}",
        polls.len()
    );
    assert_state(&h.store, "s", &id, "delivered", 1);
}
