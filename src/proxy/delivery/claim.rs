//! The claim step of a delivery: a read first for an event met lately,
//! then the claim; a duplicate in flight held while [`Hold`] says so.

use std::time::Instant;

use crate::claim::policy::{self, Busy, Hold, InFlight, InFlightRefusal, OnAmbiguous};
use crate::claim::{claim_token, now_ms, Refusal, State};
use crate::limits::{self, Permit};
use crate::problem::{upstream_refusal, Problem, ProblemKind};
use crate::store::{ClaimOutcome, ClaimRequest, Recorded, StoreError};

use super::event::Delivery;

/// How the claim went for this delivery.
pub enum Claimed {
    /// It is to forward, as [`Delivery::attempt`].
    Own,
    /// A duplicate of a delivered event: the recorded answer.
    Answer(Recorded),
}

/// What the route's limits say before the claim.
enum Admission {
    /// To claim, with this permit (`None`: nothing to hold, or held already).
    Let(Option<Permit>),
    /// A read found the event's record: no claim, no limit.
    Decided(ClaimOutcome),
}

/// A claim that did not come to [`Claimed`].
pub enum ClaimStop {
    Refused(Problem),
    /// The store did not answer: `on_store_error` decides.
    Store(StoreError),
}

impl Delivery<'_> {
    /// Claims the event: `Own` when this request is to forward it, `Answer`
    /// for a replay. With `in_flight: wait` a duplicate that finds a live
    /// lease is held until the attempt settles (then replayed, or one held
    /// request reclaims and forwards) or the lease runs out (409).
    pub async fn claim(&mut self) -> Result<Claimed, ClaimStop> {
        let (shared, route, event_id) = (self.shared, self.route, self.event_id.as_str());
        let name = route.name();
        // Duplicates of settled or in-flight events are decided by a read and
        // never queue behind claims. An event this process has not met lately
        // is most likely new: it claims at once, and the claim decides the
        // rare duplicate just as the read would have.
        let mut decided = None;
        // A paused route still replays delivered events: always read first.
        let paused = shared.paused.contains(name);
        // whether the last read said "to claim": a refusal needs no other
        let mut peeked = false;
        if shared.seen.check_and_record(name, event_id) || paused {
            // a store that cannot answer a read will not take a claim: fail fast
            decided = self.peek().await?;
            peeked = true;
        }
        let mut hold = Hold::default();
        let mut place = None;
        loop {
            let outcome = match decided.take() {
                Some(outcome) => outcome,
                // what would be forwarded is refused while the route is paused
                None if shared.paused.contains(name) => {
                    return Err(ClaimStop::Refused(route_paused(Some(event_id))))
                }
                None => match self.admit(peeked).await? {
                    Admission::Decided(outcome) => outcome,
                    Admission::Let(permit) => {
                        self.permit = permit.or(self.permit.take());
                        self.try_claim().await?
                    }
                },
            };
            if !matches!(outcome, ClaimOutcome::Claimed { .. }) {
                // not to forward after all: the slot goes back at once
                self.permit = None;
            }
            let retry_after_ms = match outcome {
                ClaimOutcome::Claimed {
                    attempt,
                    kind,
                    lease_until,
                } => {
                    shared.metrics.claimed(name, kind.as_str());
                    self.attempt = Some(attempt);
                    self.lease_until = lease_until;
                    self.started_at = now_ms();
                    return Ok(Claimed::Own);
                }
                ClaimOutcome::Existing {
                    decision: Refusal::OutcomeUnknown,
                    ..
                } => return Err(ClaimStop::Refused(outcome_unknown(event_id))),
                ClaimOutcome::Existing {
                    decision: Refusal::Replay,
                    recorded,
                } => return Ok(Claimed::Answer(recorded)),
                ClaimOutcome::Existing {
                    decision: Refusal::Mismatch,
                    ..
                } => return Err(ClaimStop::Refused(mismatch(event_id))),
                ClaimOutcome::Existing {
                    decision: Refusal::InFlight { retry_after_ms },
                    ..
                } => retry_after_ms,
            };
            let busy = |r| ClaimStop::Refused(in_flight(event_id, r));
            if route.cfg.in_flight == InFlight::Wait && shared.in_flight.handing_over() {
                return Err(busy(hold.handing_over(now_ms(), retry_after_ms)));
            }
            hold.meet(route.cfg.in_flight, now_ms(), retry_after_ms, || {
                place = route.wait_place();
                place.is_some()
            })
            .map_err(busy)?;
            self.wait_for_change(&mut hold).await.map_err(busy)?;
            peeked = false;
        }
    }

    /// The store's read of this event: `None` when it is to claim.
    async fn peek(&self) -> Result<Option<ClaimOutcome>, ClaimStop> {
        let t = Instant::now();
        let peeked = self.shared.store.peek(&self.claim_request()).await;
        self.shared
            .metrics
            .store_time("lookup", t.elapsed().as_secs_f64());
        peeked.map_err(ClaimStop::Store)
    }

    /// Before a claim that would forward: the route's limits (SPEC §15).
    /// A route without limits whose breaker is closed passes with one
    /// atomic load. Only a delivery that would be forwarded is refused, so
    /// a refusal reads the store first (unless `peeked` just did): a
    /// duplicate gets its replay, 409 or 422 as always.
    async fn admit(&self, peeked: bool) -> Result<Admission, ClaimStop> {
        if self.permit.is_some() {
            return Ok(Admission::Let(None));
        }
        let limits = &self.route.limits;
        let refusal = match limits.admit(limits::now(), true) {
            Ok(permit) => return Ok(Admission::Let(permit)),
            Err(refusal) => refusal,
        };
        let refusal = if peeked {
            refusal
        } else {
            if let Some(outcome) = self.peek().await? {
                return Ok(Admission::Decided(outcome));
            }
            // to claim: a slot may have come free meanwhile, or with
            // `upstream_wait` it is waited for
            match limits.admit_waiting(true).await {
                Ok(permit) => return Ok(Admission::Let(permit)),
                Err(refusal) => refusal,
            }
        };
        let name = self.route.name();
        tracing::debug!(
            route = name,
            event_id = self.event_id.as_str(),
            ?refusal,
            "refused before the claim: the route's upstream limits"
        );
        Err(ClaimStop::Refused(upstream_refusal(
            refusal,
            Some(&self.event_id),
        )))
    }

    /// This delivery's claim, as of now: what the store's read (`peek`)
    /// and claim statement both answer.
    fn claim_request(&self) -> ClaimRequest<'_> {
        let cfg = &self.route.cfg;
        ClaimRequest {
            route: self.route.name(),
            event_id: &self.event_id,
            digest: &self.digest,
            now: now_ms(),
            lease_ms: cfg.lease.ms(),
            retention_ms: cfg.retention.ms(),
            hold: cfg.on_ambiguous == OnAmbiguous::Hold,
            instance: &self.shared.instance,
            token: 0,
        }
    }

    /// Claims with a fresh token. A claim the store did not answer may
    /// still have committed: it is released by its token once the store
    /// answers again (SPEC §16).
    async fn try_claim(&self) -> Result<ClaimOutcome, ClaimStop> {
        let t = Instant::now();
        let req = ClaimRequest {
            token: claim_token(),
            ..self.claim_request()
        };
        let res = self.shared.store.claim(&req).await;
        self.shared
            .metrics
            .store_time("claim", t.elapsed().as_secs_f64());
        if res.as_ref().is_err_and(StoreError::may_have_committed) {
            let lease_until = req.now + req.lease_ms;
            let shared = self.shared;
            let pending = &shared.pending;
            pending.carry_release(
                &shared.store,
                req.route,
                req.event_id,
                req.token,
                lease_until,
            );
        }
        res.map_err(ClaimStop::Store)
    }

    /// Holds a duplicate until its record changes, the lease it saw ends, or
    /// this process hands its listeners over (SPEC §10: a 409 at once);
    /// cheap reads only.
    async fn wait_for_change(&self, hold: &mut Hold) -> Result<(), InFlightRefusal> {
        let shared = self.shared;
        let handed_over = shared.in_flight.handed_over();
        tokio::pin!(handed_over);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(hold.pause(now_ms())?) => {}
                _ = &mut handed_over => return Err(hold.handing_over(now_ms(), 1)),
            }
            let t = Instant::now();
            let rec = shared.store.get(self.route.name(), &self.event_id).await;
            shared
                .metrics
                .store_time("lookup", t.elapsed().as_secs_f64());
            match rec {
                Ok(Some(r)) if r.state == State::Processing => hold.extend(r.lease_until),
                // settled, released, swept, or the store hiccupped: let the claim decide
                _ => return Ok(()),
            }
        }
    }
}

fn in_flight(event_id: &str, r: InFlightRefusal) -> Problem {
    let why = match r.why {
        Busy::Conflict => "",
        Busy::TooManyWaiting => " (too many deliveries of this route are already waiting)",
        Busy::LeaseRanOut => " (its lease ran out while this delivery waited)",
        Busy::HandingOver => " (this process is handing over to a new one: retry then)",
    };
    Problem::new(
        ProblemKind::InFlight,
        format!("another delivery of this event is being processed{why}"),
    )
    .with_event_id(Some(event_id))
    .with_retry_after(r.retry_after_secs)
}

/// The record is `ambiguous`: the sender keeps retrying while an operator
/// finds out what the consumer did (SPEC §12).
fn outcome_unknown(event_id: &str) -> Problem {
    Problem::new(
        ProblemKind::OutcomeUnknown,
        "an earlier delivery of this event may have reached the consumer and its answer was \
         lost; it waits for an operator's decision",
    )
    .with_event_id(Some(event_id))
    .with_retry_after(policy::OUTCOME_UNKNOWN_RETRY_AFTER_SECS)
}

/// The route is paused: nothing is claimed, the sender retries (SPEC §14).
pub fn route_paused(event_id: Option<&str>) -> Problem {
    Problem::new(
        ProblemKind::RoutePaused,
        "deliveries to this route are paused by an operator; retry later",
    )
    .with_event_id(event_id)
    .with_retry_after(policy::ROUTE_PAUSED_RETRY_AFTER_SECS)
}

fn mismatch(event_id: &str) -> Problem {
    Problem::new(
        ProblemKind::DigestMismatch,
        "this event ID was already used with a different payload",
    )
    .with_event_id(Some(event_id))
}
