//! `/readyz`'s store check, one ping at a time, and its log lines about
//! the store, at most one every 10 s while it does not answer.
//!
//! A probe that gives up at its budget leaves its ping running on a task
//! of its own (cut short, a connection being tested would go back to the
//! pool untested). Were every probe to start another, a store that stops
//! answering would collect one hung ping (and one connection) per probe,
//! and once it answered again the probes would queue behind them for
//! seconds. So a probe joins the ping under way, if any, and one answer
//! serves every probe that waits for it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// While the store does not answer, the most often `/readyz` says so in
/// the log: a prober asking every second would otherwise write a line a
/// second beside the outage's own summary (`telemetry::outage`).
const NOT_READY_LOG_EVERY: Duration = Duration::from_secs(10);

use crate::store::ClaimStore;

/// A ping's answer: `Ok`, or the store's error as text (for the log).
type Answer = Option<Result<(), String>>;

/// The ping under way, if any.
#[derive(Default)]
pub struct StorePing {
    under_way: Mutex<Option<watch::Receiver<Answer>>>,
}

impl StorePing {
    /// The store's answer, waited for until `deadline`; `None` when none
    /// came by then.
    pub(super) async fn answer(
        &self,
        store: &Arc<dyn ClaimStore>,
        deadline: Instant,
    ) -> Option<Result<(), String>> {
        let mut answer = self.join_or_start(store);
        let waited = tokio::time::timeout_at(deadline, answer.wait_for(Option::is_some))
            .await
            .map(|seen| seen.map(|got| (*got).clone()));
        match waited {
            Ok(Ok(got)) => got,
            Ok(Err(_)) => Some(Err("the readiness ping stopped".into())),
            Err(_) => None,
        }
    }

    /// The ping under way, or a new one.
    fn join_or_start(&self, store: &Arc<dyn ClaimStore>) -> watch::Receiver<Answer> {
        let mut under_way = self.under_way.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(answer) = under_way.as_ref() {
            // unanswered, and its task still there to answer
            if answer.borrow().is_none() && answer.has_changed().is_ok() {
                return answer.clone();
            }
        }
        let (tell, answer) = watch::channel(None);
        let store = Arc::clone(store);
        tokio::spawn(async move {
            let got = store.ping().await.map_err(|e| e.to_string());
            let _ = tell.send(Some(got));
        });
        *under_way = Some(answer.clone());
        answer
    }
}

/// `/readyz`'s log lines about the store: one when it stops answering,
/// then at most one every [`NOT_READY_LOG_EVERY`] while it does not, and
/// one when it answers again.
#[derive(Default)]
pub struct NotReadyLog {
    /// When a not-ready line was last written; `None` while ready.
    last_written: Mutex<Option<Instant>>,
}

impl NotReadyLog {
    /// The store did not answer: `line` writes the WARN, when one is due.
    pub(super) fn not_ready(&self, line: impl FnOnce()) {
        let mut last = self.last_written.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|at| at.elapsed() >= NOT_READY_LOG_EVERY) {
            *last = Some(Instant::now());
            drop(last);
            line();
        }
    }

    /// The store answered.
    pub(super) fn ready(&self) {
        let was = self
            .last_written
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if was.is_some() {
            tracing::info!("/readyz: the store answers again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn an_outage_is_logged_once_per_period_and_again_after_it_ends() {
        let log = NotReadyLog::default();
        let written = Cell::new(0);
        for _ in 0..5 {
            log.not_ready(|| written.set(written.get() + 1));
        }
        assert_eq!(written.get(), 1, "one line for five probes");
        log.ready();
        log.not_ready(|| written.set(written.get() + 1));
        assert_eq!(written.get(), 2, "a new outage is written at once");
        // a period later, another
        *log.last_written.lock().unwrap() = Instant::now().checked_sub(NOT_READY_LOG_EVERY);
        log.not_ready(|| written.set(written.get() + 1));
        assert_eq!(written.get(), 3);
    }
}
