//! The guarded request, from its header to its answer: read the body
//! (bounded), verify the signature, extract the event ID and digest, claim,
//! forward with pingora's client connector, settle, answer. Every refusal is
//! a problem+json written here; one info log line per request.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora::http::RequestHeader;
use pingora::proxy::Session;
use pingora::Result;

use super::body::{self, BodyError};
use super::forward::{self, UpstreamFailure};
use super::respond;
use super::routes::RouteRt;
use super::{now_ms, Gate, InFlightRequests};
use crate::claim::{self, digest, event_id, Decision, Millis, SettleResult};
use crate::config::{DigestMode, InFlight, OnMissingId, OnStoreError};
use crate::metrics::{CloseReason, Outcome};
use crate::problem::{Problem, ProblemKind};
use crate::store::{ClaimOutcome, ClaimRequest, Recorded, SettleOutcome, SettleRequest};

struct InFlightGuard<'a>(&'a InFlightRequests);

impl<'a> InFlightGuard<'a> {
    fn enter(c: &'a InFlightRequests) -> Self {
        c.0.fetch_add(1, Ordering::AcqRel);
        InFlightGuard(c)
    }
}

/// A place among a route's held duplicates (`max_waiters`).
struct WaitSlot<'a>(&'a AtomicUsize);

impl<'a> WaitSlot<'a> {
    fn take(waiters: &'a AtomicUsize, max: usize) -> Option<Self> {
        let mut n = waiters.load(Ordering::Acquire);
        loop {
            if n >= max {
                return None;
            }
            match waiters.compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(WaitSlot(waiters)),
                Err(now) => n = now,
            }
        }
    }
}

impl Drop for WaitSlot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What one guarded request came to, for its log line.
struct Summary {
    outcome: Outcome,
    event_id: Option<String>,
    upstream_status: Option<u16>,
    attempt: Option<i64>,
}

/// How the guard ends: a response was written (or the connection is gone).
pub(super) type Handled = Result<bool>;

impl Gate {
    pub(super) async fn respond_problem(
        &self,
        session: &mut Session,
        route: &str,
        p: Problem,
        close: bool,
    ) -> Handled {
        self.metrics.request(route, p.kind.outcome());
        self.count_body_timeout(&p);
        respond::problem(session, &p, p.kind.outcome().as_str(), close).await?;
        Ok(true)
    }

    /// A 408 closes its connection: counted as a body-timeout close.
    fn count_body_timeout(&self, p: &Problem) {
        if p.kind == ProblemKind::BodyTimeout {
            self.metrics.connection_closed(CloseReason::BodyTimeout);
        }
    }

    /// The guarded request, from the header to the answer.
    pub(super) async fn guard(&self, session: &mut Session, route: &Arc<RouteRt>) -> Handled {
        let started = Instant::now();
        // Counted from the start: a claim may commit before the answer is written.
        let _busy = InFlightGuard::enter(&self.in_flight);
        let mut summary = Summary {
            outcome: Outcome::Forwarded,
            event_id: None,
            upstream_status: None,
            attempt: None,
        };
        let result = self.guard_inner(session, route, &mut summary).await;
        tracing::info!(
            route = route.name(),
            event_id = summary.event_id.as_deref().unwrap_or(""),
            outcome = summary.outcome.as_str(),
            upstream_status = summary.upstream_status.map(i64::from).unwrap_or(0),
            attempt = summary.attempt.unwrap_or(0),
            // to the microsecond: `0.013`, not `0.013316999999999999`
            duration_ms = started.elapsed().as_micros() as f64 / 1000.0,
            "guarded request"
        );
        result
    }

    async fn guard_inner(
        &self,
        session: &mut Session,
        route: &Arc<RouteRt>,
        summary: &mut Summary,
    ) -> Handled {
        let cfg = &route.cfg;
        let name = route.name();
        let expect_continue = body::expects_continue(session);

        // 1. What the headers alone decide.
        if body::content_length(session).is_some_and(|n| n > cfg.max_body) {
            summary.outcome = Outcome::BodyTooLarge;
            let p = Problem::new(
                ProblemKind::BodyTooLarge,
                format!("the body is larger than {} bytes", cfg.max_body),
            );
            return self.respond_problem(session, name, p, true).await;
        }
        let mut header_id: Option<String> = None;
        if let Some(h) = cfg.event_id.header_for(&session.req_header().headers) {
            match header_event_id(&session.req_header().headers, h, cfg.on_missing_id) {
                Ok(id) => header_id = id,
                Err(p) => {
                    summary.outcome = p.kind.outcome();
                    return self
                        .refuse_before_body(session, name, p, expect_continue, cfg.max_body)
                        .await;
                }
            }
        }
        if expect_continue {
            // pingora turns keep-alive off for any response header written
            // before the body was read, a 100 included; only the final
            // answer should decide that.
            session.set_close_on_response_before_downstream_finish(false);
            session.write_continue_response().await?;
            session.set_close_on_response_before_downstream_finish(true);
        }

        // 2. The whole body, bounded.
        let body = match body::read_full(session, cfg.max_body).await {
            Ok(b) => b,
            Err(BodyError::TooLarge) => {
                summary.outcome = Outcome::BodyTooLarge;
                let p = Problem::new(
                    ProblemKind::BodyTooLarge,
                    format!("the body is larger than {} bytes", cfg.max_body),
                );
                return self.respond_problem(session, name, p, true).await;
            }
            Err(e) => {
                // a timeout, or malformed framing: answer, then close (the
                // stream is unusable)
                summary.outcome = Outcome::InvalidBody;
                if let BodyError::Broken(cause) = &e {
                    tracing::debug!(route = name, error = %cause, "unreadable request body");
                }
                let p = Problem::new(e.invalid_kind(), e.invalid_detail());
                return self.respond_problem(session, name, p, true).await;
            }
        };

        // 3. Signature, on the raw body, before anything is claimed.
        if let Some(v) = &route.verifier {
            let now_secs = (now_ms() / 1000) as i64;
            if let Err(e) = v.verify(&session.req_header().headers, &body, now_secs) {
                summary.outcome = Outcome::InvalidSignature;
                let p = Problem::new(ProblemKind::InvalidSignature, e.to_string())
                    .with_event_id(header_id.as_deref());
                return self.respond_problem(session, name, p, false).await;
            }
        }

        // 4. Event ID and digest.
        let json = if cfg.digest == DigestMode::Json || route.id_pointer.is_some() {
            match digest::parse_json_body(&body) {
                Ok(doc) => Some(doc),
                Err(e) => {
                    summary.outcome = Outcome::InvalidBody;
                    let p = Problem::new(ProblemKind::InvalidBody, e.to_string())
                        .with_event_id(header_id.as_deref());
                    return self.respond_problem(session, name, p, false).await;
                }
            }
        } else {
            None
        };
        if let (Some(tokens), Some(doc)) = (&route.id_pointer, &json) {
            match event_id::event_id_from_json_tokens(doc, tokens) {
                Ok(id) => header_id = Some(id),
                Err(event_id::JsonIdError::Absent) if cfg.on_missing_id != OnMissingId::Reject => {}
                Err(event_id::JsonIdError::Absent) => {
                    summary.outcome = Outcome::MissingId;
                    let p = Problem::new(
                        ProblemKind::MissingEventId,
                        "the body has no event ID at the configured JSON pointer",
                    );
                    return self.respond_problem(session, name, p, false).await;
                }
                Err(e) => {
                    summary.outcome = Outcome::InvalidId;
                    let p = Problem::new(ProblemKind::InvalidEventId, e.to_string());
                    return self.respond_problem(session, name, p, false).await;
                }
            }
        }
        let digest = match (&json, cfg.digest) {
            (Some(doc), DigestMode::Json) => digest::json_digest(doc, &route.ignore),
            _ => digest::raw_digest(&body),
        };
        let digest_hex = digest::to_hex(&digest);
        let event_id = match header_id {
            Some(id) => id,
            None => match cfg.on_missing_id {
                OnMissingId::BodyDigest => digest_hex.clone(),
                OnMissingId::Forward => {
                    summary.outcome = Outcome::Unguarded;
                    summary.upstream_status =
                        Box::pin(self.forward_unguarded(session, route, body)).await?;
                    return Ok(true);
                }
                OnMissingId::Reject => unreachable!("rejected above"),
            },
        };
        summary.event_id = Some(event_id.clone());
        let event_id = event_id.as_str();

        // 5. The claim.
        crate::failpoint::hit("before_claim");
        let claimed = self.claim(route, event_id, &digest_hex).await;
        let attempt = match claimed {
            Err(p)
                if p.kind == ProblemKind::StoreUnavailable
                    && cfg.on_store_error == OnStoreError::Forward =>
            {
                tracing::warn!(
                    route = name,
                    event_id,
                    "store unavailable: forwarding unguarded"
                );
                summary.outcome = Outcome::Unguarded;
                summary.upstream_status =
                    Box::pin(self.forward_unguarded(session, route, body)).await?;
                return Ok(true);
            }
            Err(p) => {
                summary.outcome = p.kind.outcome();
                return self.respond_problem(session, name, p, false).await;
            }
            Ok(Claimed::Answer(recorded)) => {
                summary.outcome = Outcome::Replayed;
                summary.upstream_status = recorded.status;
                self.metrics
                    .route_request(&route.requests, name, Outcome::Replayed);
                respond::replay(session, &recorded).await?;
                return Ok(true);
            }
            Ok(Claimed::Own { attempt }) => attempt,
        };
        summary.attempt = Some(attempt);

        // 6. Forward, settle, answer. Boxed, like the unguarded forwards:
        // the upstream exchange is most of this future's size, and a future
        // that holds it inline is copied whole on every request, replays too.
        Box::pin(self.forward_guarded(session, route, body, event_id, attempt, summary)).await
    }

    /// A request that reaches no route (no match, or a path with no normal
    /// form): counted with `route=""`. The path decides it, so a sender
    /// waiting for `100 Continue` gets the answer at once, on a connection
    /// that closes; otherwise the body is read and dropped.
    pub(super) async fn refuse_unrouted(&self, session: &mut Session, p: Problem) -> Handled {
        let close =
            body::expects_continue(session) || body::read_full(session, 1 << 20).await.is_err();
        self.respond_problem(session, "", p, close).await
    }

    /// A request of a method the route does not guard, on a route with
    /// `verify` (SPEC §8: every method is verified but `unverified_methods`):
    /// read whole (bounded by `max_body`), verified, then forwarded
    /// unguarded. A forged one gets 401 and reaches nothing.
    pub(super) async fn pass_verified(
        &self,
        session: &mut Session,
        route: &Arc<RouteRt>,
    ) -> Handled {
        let cfg = &route.cfg;
        let name = route.name();
        if body::content_length(session).is_some_and(|n| n > cfg.max_body) {
            let p = Problem::new(
                ProblemKind::BodyTooLarge,
                format!("the body is larger than {} bytes", cfg.max_body),
            );
            return self.respond_problem(session, name, p, true).await;
        }
        if body::expects_continue(session) {
            session.set_close_on_response_before_downstream_finish(false);
            session.write_continue_response().await?;
            session.set_close_on_response_before_downstream_finish(true);
        }
        let body = match body::read_full(session, cfg.max_body).await {
            Ok(b) => b,
            Err(BodyError::TooLarge) => {
                let p = Problem::new(
                    ProblemKind::BodyTooLarge,
                    format!("the body is larger than {} bytes", cfg.max_body),
                );
                return self.respond_problem(session, name, p, true).await;
            }
            Err(e) => {
                let p = Problem::new(ProblemKind::InvalidBody, e.invalid_detail());
                return self.respond_problem(session, name, p, true).await;
            }
        };
        if let Some(v) = &route.verifier {
            let now_secs = (now_ms() / 1000) as i64;
            if let Err(e) = v.verify(&session.req_header().headers, &body, now_secs) {
                let p = Problem::new(ProblemKind::InvalidSignature, e.to_string());
                return self.respond_problem(session, name, p, false).await;
            }
        }
        Box::pin(self.forward_unguarded(session, route, body)).await?;
        Ok(true)
    }

    /// A refusal decided from the headers alone. With `Expect: 100-continue`
    /// the body never comes: answer at once and close. Otherwise read and
    /// discard the body so the connection stays usable.
    async fn refuse_before_body(
        &self,
        session: &mut Session,
        route: &str,
        p: Problem,
        expect_continue: bool,
        max_body: u64,
    ) -> Handled {
        let close = expect_continue || {
            let drained = body::read_full(session, max_body).await;
            if matches!(drained, Err(BodyError::Timeout)) {
                self.metrics.connection_closed(CloseReason::BodyTimeout);
            }
            drained.is_err()
        };
        self.respond_problem(session, route, p, close).await
    }

    /// Claims the event; `Ok(Own)` when this request is to forward it,
    /// `Ok(Answer)` for a replay, `Err` for every refusal. With
    /// `in_flight: wait` a duplicate that finds a live lease is held until
    /// the attempt settles (then replayed, or one held request reclaims and
    /// forwards) or the lease runs out (409).
    async fn claim(
        &self,
        route: &Arc<RouteRt>,
        event_id: &str,
        digest_hex: &str,
    ) -> std::result::Result<Claimed, Problem> {
        let name = route.name();
        let unavailable = |e: crate::store::StoreError| {
            tracing::warn!(route = name, event_id, error = %e, "claim failed: store unavailable");
            Problem::new(
                ProblemKind::StoreUnavailable,
                "the claim store did not answer; retry later",
            )
            .with_event_id(Some(event_id))
            .with_retry_after(1)
        };
        // Duplicates of settled or in-flight events are decided by a read and
        // never queue behind claims. An event this process has not met lately
        // is most likely new: it claims at once, and the claim decides the
        // rare duplicate just as the read would have.
        let mut decided = None;
        if self.seen.check_and_record(name, event_id) {
            let t = Instant::now();
            let peeked = self.store.peek(name, event_id, digest_hex, now_ms()).await;
            self.metrics.store_time("lookup", t.elapsed().as_secs_f64());
            // a store that cannot answer a read will not take a claim: fail fast
            decided = peeked.map_err(unavailable)?;
        }
        let mut waiting: Option<WaitSlot<'_>> = None;
        // The latest lease end seen: a reclaim by another held request extends it.
        let mut lease_end: Millis = 0;
        let mut backoff = Duration::from_millis(10);
        loop {
            let outcome = match decided.take() {
                Some(outcome) => outcome,
                None => self
                    .claim_once(route, event_id, digest_hex)
                    .await
                    .map_err(unavailable)?,
            };
            let retry_after_ms = match self.decide(name, event_id, outcome)? {
                Ok(claimed) => return Ok(claimed),
                Err(retry_after_ms) => retry_after_ms,
            };
            if route.cfg.in_flight != InFlight::Wait {
                return Err(in_flight(event_id, retry_after_ms, ""));
            }
            if self.in_flight.handing_over() {
                return Err(in_flight(event_id, retry_after_ms, HANDING_OVER));
            }
            if waiting.is_none() {
                waiting = Some(
                    WaitSlot::take(&route.waiters, route.cfg.max_waiters).ok_or_else(|| {
                        in_flight(
                            event_id,
                            retry_after_ms,
                            " (too many deliveries of this route are already waiting)",
                        )
                    })?,
                );
            }
            lease_end = lease_end.max(now_ms() + retry_after_ms);
            self.hold(name, event_id, &mut lease_end, &mut backoff)
                .await?;
        }
    }

    /// One claim in the store, timed.
    async fn claim_once(
        &self,
        route: &RouteRt,
        event_id: &str,
        digest_hex: &str,
    ) -> std::result::Result<ClaimOutcome, crate::store::StoreError> {
        let req = ClaimRequest {
            route: route.name(),
            event_id,
            digest: digest_hex,
            now: now_ms(),
            lease_ms: route.lease_ms,
            retention_ms: route.retention_ms,
        };
        let t = Instant::now();
        let res = self.store.claim(&req).await;
        self.metrics.store_time("claim", t.elapsed().as_secs_f64());
        res
    }

    /// What a claim's outcome means: this request's to forward or a replay
    /// (`Ok(Ok)`), a refusal (`Err`), or another delivery in flight
    /// (`Ok(Err(retry_after_ms))`).
    fn decide(
        &self,
        name: &str,
        event_id: &str,
        outcome: ClaimOutcome,
    ) -> std::result::Result<std::result::Result<Claimed, Millis>, Problem> {
        match outcome {
            ClaimOutcome::Claimed { attempt, kind, .. } => {
                self.metrics
                    .claims
                    .with_label_values(&[name, kind.as_str()])
                    .inc();
                Ok(Ok(Claimed::Own { attempt }))
            }
            ClaimOutcome::Existing {
                decision: Decision::Replay,
                recorded,
            } => Ok(Ok(Claimed::Answer(recorded))),
            ClaimOutcome::Existing {
                decision: Decision::Mismatch,
                ..
            } => Err(mismatch(event_id)),
            ClaimOutcome::Existing {
                decision: Decision::InFlight { retry_after_ms },
                ..
            } => Ok(Err(retry_after_ms)),
            ClaimOutcome::Existing {
                decision: Decision::Claim(_),
                ..
            } => {
                unreachable!("stores never return a claimable record as existing")
            }
        }
    }

    /// Holds a duplicate until its event's record leaves `processing`
    /// (`Ok`: the claim decides again), its lease ends, or this process
    /// hands its listeners over to a new one (SPEC §10; both `Err`, a 409
    /// at once). Cheap reads only. `lease_end` is the latest lease end seen.
    async fn hold(
        &self,
        name: &str,
        event_id: &str,
        lease_end: &mut Millis,
        backoff: &mut Duration,
    ) -> std::result::Result<(), Problem> {
        let handed_over = self.in_flight.handed_over();
        tokio::pin!(handed_over);
        loop {
            let left = *lease_end - now_ms();
            if left <= 0 {
                return Err(in_flight(
                    event_id,
                    1,
                    " (its lease ran out while this delivery waited)",
                ));
            }
            tokio::select! {
                _ = tokio::time::sleep((*backoff).min(Duration::from_millis(left as u64))) => {}
                _ = &mut handed_over => return Err(in_flight(event_id, left, HANDING_OVER)),
            }
            *backoff = (*backoff * 2).min(Duration::from_millis(200));
            let t = Instant::now();
            let rec = self.store.get(name, event_id).await;
            self.metrics.store_time("lookup", t.elapsed().as_secs_f64());
            match rec {
                Ok(Some(r)) if r.state() == Some(claim::State::Processing) => {
                    if let Some(until) = r.lease_until {
                        *lease_end = (*lease_end).max(until);
                    }
                }
                // settled, released, swept, or the store hiccupped: let the claim decide
                _ => return Ok(()),
            }
        }
    }

    async fn forward_guarded(
        &self,
        session: &mut Session,
        route: &Arc<RouteRt>,
        body: Bytes,
        event_id: &str,
        attempt: i64,
        summary: &mut Summary,
    ) -> Handled {
        let cfg = &route.cfg;
        let name = route.name();
        let key = cfg.idempotency_key_header.as_ref().map(|h| (h, event_id));
        let req = self.upstream_request(session, route, body.len(), key)?;
        crate::failpoint::hit("after_claim");
        let result = forward::exchange(
            &self.connector,
            &route.idle,
            &route.peer,
            req,
            body,
            cfg.upstream_timeout,
            &|| self.metrics.upstream_retry(name),
        )
        .await;
        let mut answered = match result {
            Ok(a) => a,
            Err(failure) => {
                self.metrics
                    .upstream_responses
                    .with_label_values(&[name, failure.class()])
                    .inc();
                let error = match &failure {
                    UpstreamFailure::Connect(e) => e.clone(),
                    UpstreamFailure::Timeout => format!(
                        "no response within {}",
                        humantime::format_duration(cfg.upstream_timeout)
                    ),
                };
                // where and why go to the log and the record, not to the sender
                tracing::warn!(
                    route = name,
                    event_id,
                    attempt,
                    upstream = %cfg.upstream.original,
                    error = %error,
                    "upstream failed; releasing the claim"
                );
                self.settle(
                    route,
                    event_id,
                    attempt,
                    SettleOutcome::Failed {
                        status: None,
                        error: Some(&error),
                    },
                )
                .await;
                let kind = failure.kind();
                let p =
                    Problem::new(kind, forward::failure_detail(kind)).with_event_id(Some(event_id));
                self.metrics
                    .route_request(&route.requests, name, Outcome::Forwarded);
                respond::problem(session, &p, Outcome::Forwarded.as_str(), false).await?;
                return Ok(true);
            }
        };
        crate::failpoint::hit("after_upstream");
        let status = answered.header.status.as_u16();
        summary.upstream_status = Some(status);
        self.metrics
            .upstream_answered(name, status, answered.elapsed);
        let method = session.req_header().method.clone();
        let no_body = forward::bodiless(&method, status);
        let mut prefix = None;
        if cfg.settle_on.matches(status) {
            let mut stored: Option<(Option<String>, Bytes)> = None;
            if cfg.replay_body && !no_body {
                let (bytes, whole) =
                    forward::read_prefix(&mut answered, cfg.replay_body_limit as usize).await?;
                if whole {
                    let ct = answered
                        .header
                        .headers
                        .get(http::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    stored = Some((ct, bytes.clone()));
                } else {
                    tracing::info!(
                        route = name,
                        event_id,
                        limit = cfg.replay_body_limit,
                        "response body over replay_body_limit: not stored"
                    );
                }
                prefix = Some(bytes);
            } else if cfg.replay_body {
                stored = Some((None, Bytes::new()));
            }
            let (ct, b) = match &stored {
                Some((ct, b)) => (ct.as_deref(), Some(&b[..])),
                None => (None, None),
            };
            let settled = self
                .settle(
                    route,
                    event_id,
                    attempt,
                    SettleOutcome::Delivered {
                        status,
                        content_type: ct,
                        body: b,
                    },
                )
                .await;
            if settled.is_none() {
                // The settle commits before the answer is passed on (SPEC
                // §3); this one did not. A 2xx now would be a delivery the
                // store does not know: a sender that saw it never retries,
                // and the claim ends as an expired lease. Told to retry, the
                // sender meets the claim in flight, then (its lease over) a
                // re-attempt with the same Idempotency-Key that records it.
                summary.outcome = Outcome::StoreUnavailable;
                drop(answered); // its connection is not reused
                let p = Problem::new(
                    ProblemKind::StoreUnavailable,
                    "the upstream's answer could not be recorded; retry later",
                )
                .with_event_id(Some(event_id))
                .with_retry_after(1);
                return self.respond_problem(session, name, p, false).await;
            }
        } else {
            let error = format!("upstream answered {status}");
            self.settle(
                route,
                event_id,
                attempt,
                SettleOutcome::Failed {
                    status: Some(status),
                    error: Some(&error),
                },
            )
            .await;
        }
        self.metrics
            .route_request(&route.requests, name, Outcome::Forwarded);
        let header = forward::downstream_header(&answered.header, Outcome::Forwarded.as_str())?;
        forward::relay(
            session,
            &self.connector,
            &route.idle,
            &route.peer,
            answered,
            header,
            prefix,
            no_body,
        )
        .await?;
        Ok(true)
    }

    /// An unguarded request whose body is read before it is forwarded
    /// ([`body::buffered_pass_through`]): it goes out as guarded requests
    /// do, header and body in one write on one of the route's kept
    /// connections. No claim and no log line, as on pingora's path.
    pub(super) async fn pass_buffered(
        &self,
        session: &mut Session,
        route: &Arc<RouteRt>,
    ) -> Handled {
        match body::read_full(session, body::BUFFERED_PASS_LIMIT).await {
            Ok(body) => {
                // boxed: inline, the exchange (~12 KiB) made the request
                // filter's future that large for every request, guarded
                // ones waiting for their body included
                Box::pin(self.forward_unguarded(session, route, body)).await?;
            }
            Err(e) => {
                self.metrics
                    .route_request(&route.requests, route.name(), Outcome::Unguarded);
                let p = Problem::new(e.invalid_kind(), e.invalid_detail());
                self.count_body_timeout(&p);
                respond::problem(session, &p, Outcome::Unguarded.as_str(), true).await?;
            }
        }
        Ok(true)
    }

    /// Forwards a request whose body was read, without a claim (unguarded
    /// requests read whole, `on_missing_id: forward`, `on_store_error:
    /// forward`), and answers the sender. Returns the upstream's status, if
    /// it answered.
    async fn forward_unguarded(
        &self,
        session: &mut Session,
        route: &Arc<RouteRt>,
        body: Bytes,
    ) -> Result<Option<u16>> {
        let name = route.name();
        let req = self.upstream_request(session, route, body.len(), None)?;
        self.metrics
            .route_request(&route.requests, name, Outcome::Unguarded);
        match forward::exchange(
            &self.connector,
            &route.idle,
            &route.peer,
            req,
            body,
            route.cfg.upstream_timeout,
            &|| self.metrics.upstream_retry(name),
        )
        .await
        {
            Ok(answered) => {
                let status = answered.header.status.as_u16();
                self.metrics
                    .upstream_answered(name, status, answered.elapsed);
                let no_body = forward::bodiless(&session.req_header().method, status);
                let header =
                    forward::downstream_header(&answered.header, Outcome::Unguarded.as_str())?;
                forward::relay(
                    session,
                    &self.connector,
                    &route.idle,
                    &route.peer,
                    answered,
                    header,
                    None,
                    no_body,
                )
                .await?;
                Ok(Some(status))
            }
            Err(failure) => {
                self.metrics
                    .upstream_responses
                    .with_label_values(&[name, failure.class()])
                    .inc();
                tracing::warn!(
                    route = name,
                    upstream = %route.cfg.upstream.original,
                    error = ?failure,
                    "unguarded request: upstream failed"
                );
                let kind = failure.kind();
                respond::problem(
                    session,
                    &Problem::new(kind, forward::failure_detail(kind)),
                    Outcome::Unguarded.as_str(),
                    false,
                )
                .await?;
                Ok(None)
            }
        }
    }

    fn upstream_request(
        &self,
        session: &Session,
        route: &RouteRt,
        body_len: usize,
        key: Option<(&http::HeaderName, &str)>,
    ) -> Result<RequestHeader> {
        let original = session.req_header();
        let pq = original
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        forward::upstream_request(
            original,
            &route.upstream_path(pq),
            body_len,
            key,
            &route.host_header,
        )
    }

    /// Commits the settle, retrying a failing store with bounded backoff. A
    /// settle that still fails leaves the claim to its lease.
    async fn settle(
        &self,
        route: &RouteRt,
        event_id: &str,
        attempt: i64,
        outcome: SettleOutcome<'_>,
    ) -> Option<SettleResult> {
        let name = route.name();
        let deadline = Instant::now() + SETTLE_DEADLINE;
        let mut backoff = Duration::from_millis(50);
        let mut tries = 0;
        let error = loop {
            tries += 1;
            let req = SettleRequest {
                route: name,
                event_id,
                attempt,
                now: now_ms(),
                retention_ms: route.retention_ms,
                outcome: outcome.clone(),
            };
            let t = Instant::now();
            let left = deadline.saturating_duration_since(t);
            // Not cut off from outside: a settle under way when `left` runs
            // out is waited for, so an error counted here never committed.
            let res = self
                .store
                .settle_within(&req, left)
                .await
                .map_err(|e| e.to_string());
            self.metrics.store_time("settle", t.elapsed().as_secs_f64());
            match res {
                Ok(result) => {
                    self.metrics
                        .settles
                        .with_label_values(&[name, result.as_str()])
                        .inc();
                    return Some(result);
                }
                Err(e) if Instant::now() + backoff < deadline => {
                    tracing::debug!(route = name, event_id, tries, error = %e, "settle failed, retrying");
                    tokio::time::sleep(backoff).await;
                    backoff *= 3;
                }
                Err(e) => break e,
            }
        };
        self.metrics
            .settles
            .with_label_values(&[name, "error"])
            .inc();
        tracing::error!(route = name, event_id, attempt, tries, error = %error, "settle failed; the claim stays until its lease ends");
        None
    }
}

/// How long a settle is retried before the answer goes on to the sender
/// without it (the claim then waits for its lease).
const SETTLE_DEADLINE: Duration = Duration::from_secs(3);

enum Claimed {
    Own { attempt: i64 },
    Answer(Recorded),
}

/// Why a held duplicate is answered at once when the process hands over.
const HANDING_OVER: &str = " (this process is handing over to a new one: retry then)";

/// The 409 for a duplicate of an event in flight; `why` completes the detail.
fn in_flight(event_id: &str, retry_after_ms: Millis, why: &str) -> Problem {
    Problem::new(
        ProblemKind::InFlight,
        format!("another delivery of this event is being processed{why}"),
    )
    .with_event_id(Some(event_id))
    .with_retry_after(claim::retry_after_secs(retry_after_ms))
}

fn mismatch(event_id: &str) -> Problem {
    Problem::new(
        ProblemKind::DigestMismatch,
        "this event ID was already used with a different payload",
    )
    .with_event_id(Some(event_id))
}

/// The event ID from header `h`: `Ok(None)` when it is absent and the route
/// does not reject that; a problem when it is absent (rejected), invalid, or
/// given twice with different values.
fn header_event_id(
    headers: &http::HeaderMap,
    h: &http::HeaderName,
    on_missing: OnMissingId,
) -> std::result::Result<Option<String>, Problem> {
    let mut values = headers.get_all(h).iter();
    let Some(first) = values.next() else {
        return match on_missing {
            OnMissingId::Reject => Err(Problem::new(
                ProblemKind::MissingEventId,
                format!("the request has no {h} header"),
            )),
            OnMissingId::Forward | OnMissingId::BodyDigest => Ok(None),
        };
    };
    if values.any(|v| v != first) {
        return Err(Problem::new(
            ProblemKind::InvalidEventId,
            format!("the request carries several different {h} headers"),
        ));
    }
    event_id::validate_event_id(first.as_bytes())
        .map(|id| Some(id.to_owned()))
        .map_err(|e| Problem::new(ProblemKind::InvalidEventId, format!("header {h}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> http::HeaderMap {
        let mut m = http::HeaderMap::new();
        for v in values {
            m.append("x-event-id", v.parse().unwrap());
        }
        m
    }

    #[test]
    fn header_event_ids() {
        let h = http::HeaderName::from_static("x-event-id");
        let kind = |r: std::result::Result<Option<String>, Problem>| r.map_err(|p| p.kind);
        assert_eq!(
            kind(header_event_id(
                &headers(&["evt_1"]),
                &h,
                OnMissingId::Reject
            )),
            Ok(Some("evt_1".into()))
        );
        assert_eq!(
            kind(header_event_id(
                &headers(&["e", "e"]),
                &h,
                OnMissingId::Reject
            )),
            Ok(Some("e".into()))
        );
        assert_eq!(
            kind(header_event_id(
                &headers(&["a", "b"]),
                &h,
                OnMissingId::Reject
            )),
            Err(ProblemKind::InvalidEventId)
        );
        assert_eq!(
            kind(header_event_id(&headers(&["a b"]), &h, OnMissingId::Reject)),
            Err(ProblemKind::InvalidEventId)
        );
        assert_eq!(
            kind(header_event_id(&headers(&[]), &h, OnMissingId::Reject)),
            Err(ProblemKind::MissingEventId)
        );
        assert_eq!(
            kind(header_event_id(&headers(&[]), &h, OnMissingId::Forward)),
            Ok(None)
        );
        assert_eq!(
            kind(header_event_id(&headers(&[]), &h, OnMissingId::BodyDigest)),
            Ok(None)
        );
    }
}
