//! `/readyz`'s store check, one ping at a time.
//!
//! A probe that gives up at its budget leaves its ping running on a task
//! of its own (cut short, a connection being tested would go back to the
//! pool untested). Were every probe to start another, a store that stops
//! answering would collect one hung ping (and one connection) per probe,
//! and once it answered again the probes would queue behind them for
//! seconds. So a probe joins the ping under way, if any, and one answer
//! serves every probe that waits for it.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;

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
