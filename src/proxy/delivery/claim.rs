//! The claim step of a delivery, as a small loop over its [`Step`]s: a
//! read first for an event met lately, then the claim within the route's
//! limits; a duplicate in flight held while [`Hold`] says so.

use std::time::Instant;

use crate::claim::policy::{Hold, InFlight, InFlightRefusal, OnAmbiguous};
use crate::claim::{claim_token, now_ms, Millis, Refusal, State};
use crate::limits::{self, Permit};
use crate::problem::{upstream_refusal, Problem};
use crate::reconcile::Asked;
use crate::store::{ClaimOutcome, ClaimRequest, Learned, Recorded, StoreError, TraceRef};

use crate::proxy::routes::WaitPlace;

use super::refused::{in_flight, mismatch, outcome_unknown, route_paused};
use super::Delivery;

/// How the claim went for this delivery.
pub enum Claimed {
    /// It is to forward, as [`Delivery::attempt`].
    Own,
    /// A duplicate of a delivered event: the recorded answer.
    Answer(Recorded),
}

/// A claim that did not come to [`Claimed`].
pub enum ClaimStop {
    Refused(Problem),
    /// The store did not answer: `on_store_error` decides.
    Store(StoreError),
}

/// The claim's steps, one at a time ([`Delivery::claim`]).
enum Step {
    /// Read the event's record first: an event met lately, or a paused
    /// route (which still replays delivered events).
    Peek,
    /// Within the route's limits, claim; `peeked`: a read just said "to
    /// claim", so a refusal needs no other.
    Claim {
        peeked: bool,
    },
    /// What the store answered, read or claim.
    Decide(ClaimOutcome),
    /// A duplicate in flight: held while [`Hold`] says so, then claimed again.
    Hold {
        retry_after_ms: Millis,
    },
    /// An ambiguous record on a route that asks its consumer (SPEC §21):
    /// asked about once, then read again.
    Reconcile,
    Done(Claimed),
}

/// What the route's limits say before the claim.
enum Limited {
    /// To claim, with this permit (`None`: nothing to hold, or held already).
    Let(Option<Permit>),
    /// A read found the event's record: no claim, no limit.
    Decided(ClaimOutcome),
}

// ---- Delivery: the claim, within the route's limits

impl<'a> Delivery<'a> {
    /// Claims the event: `Own` when this request is to forward it, `Answer`
    /// for a replay. With `in_flight: wait` a duplicate that finds a live
    /// lease is held until the attempt settles (then replayed, or one held
    /// request reclaims and forwards) or the lease runs out (409).
    pub async fn claim(&mut self) -> Result<Claimed, ClaimStop> {
        let mut hold = Hold::default();
        let mut place = None;
        let mut asked = false;
        let mut step = self.first_step();
        loop {
            step = match step {
                Step::Peek => match self.peek().await? {
                    Some(outcome) => Step::Decide(outcome),
                    None => Step::Claim { peeked: true },
                },
                Step::Claim { peeked } => Step::Decide(self.claim_within_limits(peeked).await?),
                Step::Decide(outcome) => self.decide(outcome)?,
                Step::Hold { retry_after_ms } => {
                    self.hold(&mut hold, &mut place, retry_after_ms).await?;
                    Step::Claim { peeked: false }
                }
                Step::Reconcile if asked => {
                    return Err(ClaimStop::Refused(outcome_unknown(&self.event_id)))
                }
                Step::Reconcile => {
                    asked = true;
                    // boxed: a question is rare, and its future would
                    // weigh on every request's
                    Box::pin(self.reconcile()).await?
                }
                Step::Done(claimed) => return Ok(claimed),
            }
        }
    }

    /// Duplicates of settled or in-flight events are decided by a read and
    /// never queue behind claims. An event this process has not met lately
    /// is most likely new: it claims at once, and the claim decides the
    /// rare duplicate just as the read would have. A paused route still
    /// replays delivered events: it always reads first.
    fn first_step(&self) -> Step {
        let name = self.route.name();
        let met = self.shared.seen.check_and_record(name, &self.event_id);
        if met || self.shared.paused.contains(name) {
            Step::Peek
        } else {
            Step::Claim { peeked: false }
        }
    }

    /// The claim, unless the route is paused (what would be forwarded is
    /// refused) or its limits refuse it ([`Delivery::within_limits`]).
    async fn claim_within_limits(&mut self, peeked: bool) -> Result<ClaimOutcome, ClaimStop> {
        if self.shared.paused.contains(self.route.name()) {
            return Err(ClaimStop::Refused(route_paused(Some(&self.event_id))));
        }
        match self.within_limits(peeked).await? {
            Limited::Decided(outcome) => Ok(outcome),
            Limited::Let(permit) => {
                self.permit = permit.or(self.permit.take());
                self.try_claim().await
            }
        }
    }

    /// What the store's answer comes to: this delivery's claim, a replay, a
    /// refusal, or a duplicate in flight to hold.
    fn decide(&mut self, outcome: ClaimOutcome) -> Result<Step, ClaimStop> {
        if !matches!(outcome, ClaimOutcome::Claimed { .. }) {
            // not to forward after all: the slot goes back at once
            self.permit = None;
        }
        let (decision, recorded) = match outcome {
            ClaimOutcome::Claimed {
                attempt,
                kind,
                lease_until,
                previous,
            } => {
                self.link(previous, "reclaimed");
                let name = self.route.name();
                self.shared.metrics.claimed(name, kind.as_str());
                self.attempt = Some(attempt);
                self.lease_until = lease_until;
                self.started_at = now_ms();
                return Ok(Step::Done(Claimed::Own));
            }
            ClaimOutcome::Existing { decision, recorded } => (decision, recorded),
        };
        self.link(recorded.trace, link_reason(&decision));
        let event_id = self.event_id.as_str();
        match decision {
            Refusal::Replay => Ok(Step::Done(Claimed::Answer(recorded))),
            Refusal::InFlight { retry_after_ms } => Ok(Step::Hold { retry_after_ms }),
            Refusal::OutcomeUnknown if self.shared.reconciler.asks(self.route.name()) => {
                Ok(Step::Reconcile)
            }
            Refusal::OutcomeUnknown => Err(ClaimStop::Refused(outcome_unknown(event_id))),
            Refusal::Mismatch => Err(ClaimStop::Refused(mismatch(event_id))),
        }
    }

    /// A link from the request's SERVER span to the send a record
    /// remembers (SPEC §19), once per send met.
    fn link(&mut self, to: Option<TraceRef>, why: &'static str) {
        let (Some(trace), Some(to)) = (self.trace, to) else {
            return;
        };
        if self.linked != Some(to) {
            self.linked = Some(to);
            trace.link(to, why);
        }
    }

    /// A duplicate in flight: refused at once (409) unless the route holds
    /// it (`in_flight: wait`) and this process is not handing over; held
    /// until its record changes.
    async fn hold(
        &self,
        hold: &mut Hold,
        place: &mut Option<WaitPlace<'a>>,
        retry_after_ms: Millis,
    ) -> Result<(), ClaimStop> {
        let route = self.route;
        let busy = |r| ClaimStop::Refused(in_flight(&self.event_id, r));
        if route.cfg.in_flight == InFlight::Wait && self.shared.in_flight.handing_over() {
            return Err(busy(hold.handing_over(now_ms(), retry_after_ms)));
        }
        hold.meet(route.cfg.in_flight, now_ms(), retry_after_ms, || {
            *place = route.wait_place();
            place.is_some()
        })
        .map_err(busy)?;
        self.wait_for_change(hold).await.map_err(busy)
    }

    /// Asks the consumer at once (SPEC §21, within the route's `timeout`):
    /// found done or not done, the record is read again (a replay, or a
    /// claim that forwards the next attempt); unknown, or asked about by
    /// another delivery of this process right now, the 409 of SPEC §12.
    async fn reconcile(&self) -> Result<Step, ClaimStop> {
        let (route, event_id) = (self.route.name(), self.event_id.as_str());
        let unknown = || ClaimStop::Refused(outcome_unknown(event_id));
        match self.shared.reconciler.ask(route, event_id).await {
            Ok(Asked::Learned { answer, .. }) if answer.learned == Learned::Unknown => {
                Err(unknown())
            }
            // learned, or the record changed since it said ambiguous
            Ok(Asked::Learned { .. } | Asked::NotAmbiguous(_) | Asked::NotFound) => Ok(Step::Peek),
            Ok(Asked::Busy | Asked::NotConfigured) => Err(unknown()),
            Err(e) => {
                tracing::warn!(route, event_id, error = %e, "reconcile: the store failed around the question");
                Err(unknown())
            }
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
    async fn within_limits(&self, peeked: bool) -> Result<Limited, ClaimStop> {
        if self.permit.is_some() {
            return Ok(Limited::Let(None));
        }
        let limits = &self.route.limits;
        let refusal = match limits.admit(limits::now(), true) {
            Ok(permit) => return Ok(Limited::Let(permit)),
            Err(refusal) => refusal,
        };
        let refusal = if peeked {
            refusal
        } else {
            if let Some(outcome) = self.peek().await? {
                return Ok(Limited::Decided(outcome));
            }
            // to claim: a slot may have come free meanwhile, or with
            // `upstream_wait` it is waited for
            match limits.admit_waiting(true).await {
                Ok(permit) => return Ok(Limited::Let(permit)),
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
            trace: self.planned_send,
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

/// Why a duplicate's span links to its record's send.
fn link_reason(decision: &Refusal) -> &'static str {
    match decision {
        Refusal::Replay => "replayed",
        Refusal::InFlight { .. } => "in_flight",
        Refusal::Mismatch => "mismatch",
        Refusal::OutcomeUnknown => "outcome_unknown",
    }
}
