//! Reconciliation with the consumer (SPEC §21): asking the consumer what
//! it did with an event whose outcome idemgate could not know, and
//! resolving the record by what it says.
//!
//! Three callers ask through one [`Reconciler`]:
//! - a delivery that meets an `ambiguous` record asks at once, before its
//!   answer ([`Reconciler::ask`]): found done it is replayed, not done it
//!   is forwarded as the next attempt, unknown it gets the 409;
//! - the background ([`Background`]) looks five times per route's `every`
//!   ([`round_every`]) for the route's ambiguous records whose mark
//!   passed, and asks about them, taking each mark in the store first
//!   ([`ClaimStore::take_questions`]), so that every process sharing the
//!   store asks at most once per record per `every`;
//! - the operator: `events reconcile` and the admin API's action.
//!
//! One question per record is in flight in a process at a time: another
//! caller meanwhile is told [`Asked::Busy`] (a delivery gets its 409). A
//! question is a network call: no store transaction or lock is held across
//! it; the record is read before it, and the answer is written after it
//! fenced by the record's state and attempt count
//! ([`ClaimStore::reconciled`]), so a record that changed meanwhile is left
//! as it is. `question.rs` holds the question itself.

mod question;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::connectors::http::Connector;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::claim::{now_ms, State};
use crate::config::Route;
use crate::metrics::Metrics;
use crate::store::{ClaimStore, QuestionBatch, Reconciliation, ResolveOutcome, StoreError};
pub use question::Answer;
use question::Asker;

/// Records the background takes per batch (its questions run a few at a
/// time, [`AT_ONCE`]).
const BATCH: i64 = 64;
/// Questions the background has in flight at once, per route.
const AT_ONCE: usize = 8;

/// What asking about one record came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// The consumer was asked; `recorded` says whether the record was
    /// still as read (else nothing was changed).
    Learned {
        answer: Answer,
        recorded: bool,
    },
    /// The record is not `ambiguous`: nothing to ask.
    NotAmbiguous(State),
    NotFound,
    /// Another question about it is in flight in this process.
    Busy,
    /// The route has no `reconcile`.
    NotConfigured,
}

struct Inner {
    store: Arc<dyn ClaimStore>,
    metrics: Metrics,
    instance: String,
    connector: Connector,
    /// By route name: the routes with `reconcile`.
    routes: HashMap<String, Asker>,
    /// (route, event ID) of the questions in flight in this process.
    asking: Mutex<HashSet<(String, String)>>,
}

/// Asks consumers about ambiguous records; cheap to clone.
#[derive(Clone)]
pub struct Reconciler(Arc<Inner>);

/// Takes a record's place among the questions in flight; gives it back on
/// drop, however the question ends.
struct Asking<'a> {
    inner: &'a Inner,
    key: (String, String),
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        let mut asking = self.inner.asking.lock().unwrap_or_else(|p| p.into_inner());
        asking.remove(&self.key);
    }
}

impl Reconciler {
    /// The reconciler of `routes` (those with `reconcile`).
    pub fn new(
        routes: &[Route],
        store: Arc<dyn ClaimStore>,
        metrics: Metrics,
        instance: String,
    ) -> Reconciler {
        let routes: HashMap<String, Asker> = (routes.iter())
            .filter_map(|r| Some((r.name.clone(), Asker::new(r.reconcile.clone()?))))
            .collect();
        for name in routes.keys() {
            metrics.init_reconciliations(name);
        }
        Reconciler(Arc::new(Inner {
            store,
            metrics,
            instance,
            connector: Connector::new(None),
            routes,
            asking: Mutex::new(HashSet::new()),
        }))
    }

    /// Whether `route` asks its consumer.
    pub fn asks(&self, route: &str) -> bool {
        self.0.routes.contains_key(route)
    }

    /// Asks now about one record, if it is `ambiguous`, and resolves it by
    /// the answer. A store error is the record's read or the answer's
    /// write; the consumer's own failures are an unknown answer.
    pub async fn ask(&self, route: &str, event_id: &str) -> Result<Asked, StoreError> {
        let inner = &*self.0;
        let Some(asker) = inner.routes.get(route) else {
            return Ok(Asked::NotConfigured);
        };
        let Some(_asking) = self.take_place(route, event_id) else {
            return Ok(Asked::Busy);
        };
        let Some(record) = inner.store.get(route, event_id).await? else {
            return Ok(Asked::NotFound);
        };
        if record.state != State::Ambiguous {
            return Ok(Asked::NotAmbiguous(record.state));
        }
        let started_at = now_ms();
        let answer = asker.ask(&inner.connector, event_id).await;
        let outcome = inner
            .store
            .reconciled(&Reconciliation {
                route,
                event_id,
                attempts: record.attempts,
                learned: answer.learned,
                status: answer.status,
                detail: &answer.detail,
                started_at,
                now: now_ms(),
                instance: &inner.instance,
            })
            .await?;
        let recorded = outcome == ResolveOutcome::Resolved;
        if recorded {
            inner.metrics.reconciled(route, answer.learned.as_str());
        }
        tracing::info!(
            route,
            event_id,
            learned = answer.learned.as_str(),
            detail = answer.detail.as_str(),
            recorded,
            "reconcile: asked the consumer"
        );
        Ok(Asked::Learned { answer, recorded })
    }

    fn take_place(&self, route: &str, event_id: &str) -> Option<Asking<'_>> {
        let key = (route.to_owned(), event_id.to_owned());
        let mut asking = self.0.asking.lock().unwrap_or_else(|p| p.into_inner());
        asking.insert(key.clone()).then_some(Asking {
            inner: &self.0,
            key,
        })
    }

    /// The background's round on one route: takes the due records in
    /// batches (each one's mark set to now + `every` in the store) and asks
    /// about them, a few at a time; how many were asked about.
    pub async fn round(&self, route: &str) -> Result<usize, StoreError> {
        let Some(asker) = self.0.routes.get(route) else {
            return Ok(0);
        };
        let every = millis(asker.cfg.every);
        let mut asked = 0;
        loop {
            let now = now_ms();
            let taken = (self.0.store)
                .take_questions(&QuestionBatch {
                    route,
                    now,
                    next_at: now + every,
                    limit: BATCH,
                })
                .await?;
            if taken.is_empty() {
                return Ok(asked);
            }
            asked += taken.len();
            for chunk in taken.chunks(AT_ONCE) {
                let mut set = tokio::task::JoinSet::new();
                for id in chunk {
                    let (me, route, id) = (self.clone(), route.to_owned(), id.clone());
                    set.spawn(async move { me.ask(&route, &id).await });
                }
                while let Some(res) = set.join_next().await {
                    if let Ok(Err(e)) = res {
                        tracing::warn!(route, error = %e, "reconcile: a question's record");
                    }
                }
            }
            if taken.len() < BATCH as usize {
                return Ok(asked);
            }
        }
    }

    /// The routes that ask, and how often.
    fn schedule(&self) -> Vec<(String, Duration)> {
        (self.0.routes.iter())
            .map(|(name, a)| (name.clone(), a.cfg.every))
            .collect()
    }
}

/// How often the background looks for due records: a fifth of `every`,
/// from 200 ms to 5 s. Each record's mark in the store keeps its questions
/// at most one per `every`; looking more often makes a record asked soon
/// after its mark passed, not up to `every` later. That matters when the
/// process that took a mark died before it asked: the record then waits
/// for the mark to pass, and with a look only every `every` it could wait
/// 2 × `every` after its mark was taken (issue 55's promise is 2 × `every`
/// from the crash, the lease and the sweep included). Each look is one
/// read of the route's ambiguous records.
fn round_every(every: Duration) -> Duration {
    (every / 5).clamp(Duration::from_millis(200), Duration::from_secs(5))
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2)
}

/// The background's questions (SPEC §21): each route with `reconcile`,
/// its due records (each asked at most once per `every`), looked for
/// every [`round_every`].
pub struct Background(pub Reconciler);

#[async_trait]
impl BackgroundService for Background {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut set = tokio::task::JoinSet::new();
        for (route, every) in self.0.schedule() {
            let me = self.0.clone();
            set.spawn(async move {
                let mut tick = tokio::time::interval(round_every(every));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    if let Err(e) = me.round(&route).await {
                        tracing::warn!(route, error = %e, "reconcile: the round failed");
                    }
                }
            });
        }
        let _ = shutdown.changed().await;
        set.abort_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_background_looks_five_times_per_every_within_its_bounds() {
        let s = Duration::from_secs;
        assert_eq!(round_every(s(5)), s(1));
        assert_eq!(round_every(s(30)), s(5));
        assert_eq!(round_every(s(3600)), s(5));
        assert_eq!(
            round_every(Duration::from_millis(500)),
            Duration::from_millis(200)
        );
    }
}
