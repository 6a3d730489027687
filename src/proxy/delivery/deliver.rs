//! A claimed delivery's way to its ending: forward it, settle the claim
//! from the upstream's answer and pass that on; or replay the recorded
//! answer, refuse, or without the store do what `on_store_error` says.

use bytes::Bytes;
use pingora::proxy::Session;

use crate::claim::policy::{self, OnAmbiguous, StoreStep};
use crate::limits::{self, AttemptEnd};
use crate::metrics::Outcome;
use crate::proxy::exit::{Ending, Refused, Relay, Stop, Verdict};
use crate::proxy::forward::{self, Answered, Upstream, UpstreamFailure};
use crate::proxy::pass_through;
use crate::store::{ReplayHeaders, SettleOutcome, StoreError};

use super::claim::{ClaimStop, Claimed};
use super::settle::store_unavailable;
use super::Delivery;

// ---- Delivery: from the claim to the ending (forward, the upstream's answer, the breaker)

impl Delivery<'_> {
    /// Claims the event, then forwards it (boxed, like the unguarded
    /// forwards: the upstream exchange is most of this future's size, and a
    /// future that holds it inline is copied whole on every request,
    /// replays too), replays, refuses, or without the store does what
    /// `on_store_error` says.
    pub async fn deliver(&mut self, session: &mut Session, body: Bytes) -> Ending {
        crate::failpoint::hit("before_claim");
        let span = self.trace.map(|t| t.store_step("idemgate.claim"));
        let claimed = self.claim().await;
        if let Some(mut span) = span {
            crate::otel::store_outcome(&mut span, claim_outcome(&claimed));
        }
        if let (Some(t), Some(attempt)) = (self.trace, self.attempt) {
            t.set(opentelemetry::KeyValue::new("idemgate.attempt", attempt));
        }
        match claimed {
            Ok(Claimed::Own) => Box::pin(self.forward(session, body)).await,
            Ok(Claimed::Answer(recorded)) => Ok(Verdict::Replay(recorded)),
            Err(ClaimStop::Refused(p)) => Err(Refused::new(p).into()),
            Err(ClaimStop::Store(e)) => self.without_store(session, body, e).await,
        }
    }

    /// The claim store did not answer: refused, or forwarded unguarded, as
    /// the route's `on_store_error` says.
    async fn without_store(&self, session: &mut Session, body: Bytes, e: StoreError) -> Ending {
        let (route, event_id) = (self.route, self.event_id.as_str());
        let name = route.name();
        // counted, and summarised once a second (`telemetry::outage`)
        tracing::debug!(route = name, event_id, error = %e, "claim failed: store unavailable");
        crate::telemetry::outage::store_error(e.to_string());
        if policy::without_store(route.cfg.on_store_error, StoreStep::Claim)
            == policy::WithoutStore::Refuse
        {
            let detail = "the claim store did not answer; retry later";
            return Err(Refused::new(store_unavailable(event_id, detail)).into());
        }
        tracing::debug!(
            route = name,
            event_id,
            "store unavailable: forwarding unguarded"
        );
        crate::telemetry::outage::note("forwarded_unguarded");
        // within the slot this delivery holds already, if it holds one
        Box::pin(pass_through::forward(
            self.shared,
            session,
            route,
            body,
            self.trace,
            self.permit.is_some(),
        ))
        .await
    }

    /// Forwards the claimed delivery, settles the claim from the upstream's
    /// answer and passes that on.
    async fn forward(&self, session: &mut Session, body: Bytes) -> Ending {
        let cfg = &self.route.cfg;
        let key = cfg
            .idempotency_key_header
            .as_ref()
            .map(|h| (h, self.event_id.as_str()));
        let upstream = Upstream::of(self.shared, self.route).traced(self.trace, self.planned_send);
        let req = upstream.request(session, body.len(), key)?;
        crate::failpoint::hit("after_claim");
        let hold = cfg.on_ambiguous == OnAmbiguous::Hold;
        let mut answered = match upstream.exchange(req, body, hold).await {
            Ok(a) => a,
            Err(failure) => return Err(self.upstream_failed(failure).await),
        };
        crate::failpoint::hit("after_upstream");
        let status = answered.header.status.as_u16();
        self.upstream_answered(status, &answered.header.headers);
        let mut prefix = None;
        if cfg.settle_on.matches(status) {
            let no_body = forward::bodiless(&session.req_header().method, status);
            let stored;
            (prefix, stored) = self.replay_copy(&mut answered, no_body).await?;
            let (content_type, body) = match &stored {
                Some((ct, b)) => (ct.as_deref(), Some(&b[..])),
                None => (None, None),
            };
            let headers = self.replay_headers(&answered.header.headers);
            let delivered = SettleOutcome::Delivered {
                status,
                content_type,
                body,
                headers: headers.as_ref(),
            };
            self.settle(delivered, None).await?;
        } else {
            let error = format!("upstream answered {status}");
            let failed = SettleOutcome::Failed {
                status: Some(status),
                error: Some(&error),
            };
            self.settle(failed, Some(&error)).await?;
        }
        Ok(Verdict::Relay(Relay {
            answered,
            prefix,
            outcome: Outcome::Forwarded,
        }))
    }

    /// The upstream gave no answer to the claimed delivery: the claim is
    /// released, or under `on_ambiguous: hold` held for an operator when
    /// the consumer may have acted (SPEC §12); the sender gets 502 or 504.
    async fn upstream_failed(&self, failure: UpstreamFailure) -> Stop {
        let route = self.route;
        self.attempt_ended(AttemptEnd::Failure);
        let refused = Refused::upstream_failed(&failure, Some(self.event_id.as_str()));
        let held = failure.ambiguous() && route.cfg.on_ambiguous == OnAmbiguous::Hold;
        let error = match &failure {
            UpstreamFailure::Failed { error, .. } | UpstreamFailure::Lost { error, .. } => {
                error.clone()
            }
            UpstreamFailure::Timeout { .. } => format!(
                "{} (no response within {})",
                failure.attempt_error(),
                humantime::format_duration(route.cfg.upstream_timeout)
            ),
        };
        // where and why go to the log and the record, not to the sender
        tracing::warn!(
            route = route.name(),
            event_id = self.event_id.as_str(),
            attempt = self.attempt.unwrap_or(0),
            upstream = %route.cfg.upstream.original,
            error = %error,
            ambiguous = failure.ambiguous(),
            "upstream failed; {}",
            if held { "holding the event for an operator" } else { "releasing the claim" }
        );
        let outcome = if held {
            SettleOutcome::Ambiguous {
                error: Some(failure.attempt_error()),
            }
        } else {
            SettleOutcome::Failed {
                status: None,
                error: Some(&error),
            }
        };
        match self.settle(outcome, Some(failure.attempt_error())).await {
            Ok(()) => refused.into(),
            Err(r) => r.into(),
        }
    }

    /// An attempt's end, for the route's breaker (SPEC §15).
    fn attempt_ended(&self, end: AttemptEnd) {
        let limits = &self.route.limits;
        limits.ended(self.permit.as_ref(), limits::now(), end);
    }

    /// The upstream answered `status`: a failure for the breaker when it is
    /// 500 or more outside `settle_on`; a 429 or 503 with `Retry-After`
    /// opens it that long (capped), whatever the route configures. The
    /// answer itself goes to the sender unchanged.
    fn upstream_answered(&self, status: u16, headers: &http::HeaderMap) {
        let failed = status >= 500 && !self.route.cfg.settle_on.matches(status);
        self.attempt_ended(if failed {
            AttemptEnd::Failure
        } else {
            AttemptEnd::Success
        });
        if status != 429 && status != 503 {
            return;
        }
        let pause = headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| limits::retry_after(v, std::time::SystemTime::now()));
        if let Some(pause) = pause {
            let name = self.route.name();
            tracing::warn!(
                route = name,
                status,
                pause_secs = pause.as_secs(),
                "the upstream asked for a pause: the route's breaker opens"
            );
            self.route.limits.pushed_back(limits::now(), pause);
        }
    }

    /// With `replay_headers` (SPEC §22): the delivered response's values of
    /// those headers, to keep with the record in the settle's own write. A
    /// value over [`ReplayHeaders::MAX_VALUE`] (or not printable ASCII) is
    /// not kept, and the log says so. Nothing is allocated for a route
    /// without the key.
    fn replay_headers(&self, headers: &http::HeaderMap) -> Option<ReplayHeaders> {
        let names = &self.route.cfg.replay_headers;
        if names.is_empty() {
            return None;
        }
        let mut pairs = Vec::with_capacity(names.len());
        for name in names {
            for value in headers.get_all(name) {
                if ReplayHeaders::keeps(value.as_bytes()) {
                    pairs.push((name.as_str(), value.as_bytes()));
                } else {
                    tracing::info!(
                        route = self.route.name(),
                        event_id = self.event_id.as_str(),
                        header = name.as_str(),
                        bytes = value.len(),
                        "settle: a replay header is not kept (over 1 KiB, or not printable ASCII): replays go without it"
                    );
                }
            }
        }
        ReplayHeaders::new(pairs)
    }

    /// With `replay_body`, the start of the upstream's body, read to be
    /// stored for replay: the bytes read (passed on first), and the copy to
    /// store when that was the whole body (within `replay_body_limit`).
    async fn replay_copy(
        &self,
        answered: &mut Answered,
        no_body: bool,
    ) -> pingora::Result<(Option<Bytes>, Option<ReplayCopy>)> {
        let cfg = &self.route.cfg;
        if !cfg.replay_body {
            return Ok((None, None));
        }
        if no_body {
            return Ok((None, Some((None, Bytes::new()))));
        }
        let limit = cfg.replay_body_limit as usize;
        let (bytes, whole) = forward::read_prefix(answered, limit).await?;
        if !whole {
            tracing::info!(
                route = self.route.name(),
                event_id = self.event_id.as_str(),
                limit = cfg.replay_body_limit,
                "response body over replay_body_limit: not stored"
            );
            return Ok((Some(bytes), None));
        }
        let content_type = answered
            .header
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok((Some(bytes.clone()), Some((content_type, bytes))))
    }
}

/// The claim span's `idemgate.claim.outcome`: claimed, replay, the
/// refusal's problem (in_flight, mismatch, outcome_unknown, ...) or
/// store_error.
fn claim_outcome(claimed: &Result<Claimed, ClaimStop>) -> &'static str {
    match claimed {
        Ok(Claimed::Own) => "claimed",
        Ok(Claimed::Answer(_)) => "replay",
        Err(ClaimStop::Refused(p)) => p.kind.name(),
        Err(ClaimStop::Store(_)) => "store_error",
    }
}

/// A stored copy of a response for replay: its content type and body.
type ReplayCopy = (Option<String>, Bytes);
