//! The guarded request, from its header to its verdict: read the body
//! (bounded), verify the signature, extract the event ID and digest, claim,
//! forward with pingora's client connector, settle. What it does without an
//! event ID, without the store, and with a duplicate in flight is
//! [`policy`]'s to say. Its verdict, or the problem it stopped with, goes to
//! the one exit ([`Gate::answer`]); one info log line per request follows.

mod claim;
mod key;
mod settle;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use pingora::proxy::Session;

use super::body::{self, BodyError};
use super::forward::{self, Answered, UpstreamFailure};
use super::routes::RouteRt;
use super::unguarded::{check_declared_length, check_signature, send_continue, upstream_request};
use super::verdict::{self, Ending, Handled, Refused, Relay, Stop, Verdict};
use super::Gate;
use crate::claim::digest;
use crate::claim::policy::{self, Key, StoreStep};
use crate::config::DigestMode;
use crate::metrics::{CloseReason, Outcome};
use crate::problem::{Problem, ProblemKind};
use crate::store::SettleOutcome;
use claim::{ClaimStop, Claimed};
use key::{header_key, json_body, json_key};
use settle::store_unavailable;

/// What the log line tells of a guarded request besides its ending.
#[derive(Default)]
struct Trace {
    event_id: Option<String>,
    attempt: Option<i64>,
}

impl Gate {
    /// The guarded request, from the header to the answer.
    pub(super) async fn guard(&self, session: &mut Session, route: &Arc<RouteRt>) -> Handled {
        let started = Instant::now();
        // Counted from the start: a claim may commit before the answer is written.
        let _busy = self.in_flight.enter();
        let mut trace = Trace::default();
        let ending = self.verdict(session, route, &mut trace).await;
        let (outcome, upstream_status) = verdict::summary(&ending);
        let result = self.answer(session, route, ending).await;
        tracing::info!(
            route = route.name(),
            event_id = trace.event_id.as_deref().unwrap_or(""),
            outcome = outcome.as_str(),
            upstream_status = upstream_status.map(i64::from).unwrap_or(0),
            attempt = trace.attempt.unwrap_or(0),
            // to the microsecond: `0.013`, not `0.013316999999999999`
            duration_ms = started.elapsed().as_micros() as f64 / 1000.0,
            "guarded request"
        );
        result
    }

    async fn verdict(
        &self,
        session: &mut Session,
        route: &Arc<RouteRt>,
        trace: &mut Trace,
    ) -> Ending {
        let cfg = &route.cfg;
        // 1. What the headers alone decide.
        let expect_continue = body::expects_continue(session);
        check_declared_length(session, cfg.max_body)?;
        let header_key = match header_key(session, route) {
            Ok(key) => key,
            Err(p) => {
                let r = self.refuse_before_body(session, p, expect_continue, cfg.max_body);
                return Err(r.await.into());
            }
        };
        send_continue(session, expect_continue).await?;

        // 2. The whole body, bounded.
        let body = body::read_full(session, cfg.max_body)
            .await
            .map_err(|e| body_refused(e, cfg.max_body, route.name()))?;

        // 3. Signature, on the raw body, before anything is claimed.
        let header_id = match &header_key {
            Some(Key::EventId(id)) => Some(id.as_str()),
            _ => None,
        };
        check_signature(session, route, &body, header_id)?;

        // 4. Event ID and digest.
        let json = json_body(route, &body, header_id)?;
        let key = match header_key {
            Some(key) => key,
            None => json_key(route, json.as_ref())?,
        };
        let id = match key {
            Key::EventId(id) => Some(id),
            Key::Digest => None,
            Key::Unguarded => return Box::pin(self.forward_unguarded(session, route, body)).await,
            Key::Missing => {
                let p = Problem::new(
                    ProblemKind::MissingEventId,
                    "the body has no event ID at the configured JSON pointer",
                );
                return Err(Refused::new(p).into());
            }
        };
        let digest = match (&json, cfg.digest) {
            (Some(doc), DigestMode::Json) => digest::json_digest(doc, &route.cfg.digest_ignore),
            _ => digest::raw_digest(&body),
        };
        let digest_hex = digest::to_hex(&digest);
        let event_id = trace
            .event_id
            .insert(id.unwrap_or_else(|| digest_hex.clone()));

        // 5. The claim, then forward and settle, or answer from the record.
        crate::failpoint::hit("before_claim");
        let claimed = self.claim(route, event_id, &digest_hex).await;
        self.claimed(session, route, body, event_id, claimed, &mut trace.attempt)
            .await
    }

    /// What the claim came to: forward (boxed, like the unguarded forwards:
    /// the upstream exchange is most of this future's size, and a future
    /// that holds it inline is copied whole on every request, replays too),
    /// replay, refuse, or without the store what `on_store_error` says.
    async fn claimed(
        &self,
        session: &mut Session,
        route: &Arc<RouteRt>,
        body: Bytes,
        event_id: &str,
        claimed: Result<Claimed, ClaimStop>,
        attempt: &mut Option<i64>,
    ) -> Ending {
        match claimed {
            Ok(Claimed::Own { attempt: a }) => {
                *attempt = Some(a);
                Box::pin(self.forward_guarded(session, route, body, event_id, a)).await
            }
            Ok(Claimed::Answer(recorded)) => Ok(Verdict::Replay(recorded)),
            Err(ClaimStop::Refused(p)) => Err(Refused::new(p).into()),
            Err(ClaimStop::Store(e)) => {
                let name = route.name();
                tracing::warn!(route = name, event_id, error = %e, "claim failed: store unavailable");
                if policy::without_store(route.cfg.on_store_error, StoreStep::Claim)
                    == policy::WithoutStore::Refuse
                {
                    let detail = "the claim store did not answer; retry later";
                    return Err(Refused::new(store_unavailable(event_id, detail)).into());
                }
                tracing::warn!(
                    route = name,
                    event_id,
                    "store unavailable: forwarding unguarded"
                );
                Box::pin(self.forward_unguarded(session, route, body)).await
            }
        }
    }

    /// A refusal decided from the headers alone. With `Expect: 100-continue`
    /// the body never comes: answer at once and close. Otherwise read and
    /// discard the body so the connection stays usable.
    async fn refuse_before_body(
        &self,
        session: &mut Session,
        p: Problem,
        expect_continue: bool,
        max_body: u64,
    ) -> Refused {
        let close = expect_continue || {
            let drained = body::read_full(session, max_body).await;
            if matches!(drained, Err(BodyError::Timeout)) {
                self.metrics.connection_closed(CloseReason::BodyTimeout);
            }
            drained.is_err()
        };
        Refused::new(p).closing(close)
    }

    /// Forwards a claimed delivery, settles the claim from the upstream's
    /// answer and passes that on.
    async fn forward_guarded(
        &self,
        session: &mut Session,
        route: &Arc<RouteRt>,
        body: Bytes,
        event_id: &str,
        attempt: i64,
    ) -> Ending {
        let cfg = &route.cfg;
        let key = cfg.idempotency_key_header.as_ref().map(|h| (h, event_id));
        let req = upstream_request(session, route, body.len(), key)?;
        crate::failpoint::hit("after_claim");
        let mut answered = match self.exchange(route, req, body).await {
            Ok(a) => a,
            Err(failure) => {
                return Err(self
                    .upstream_failed(route, event_id, attempt, failure)
                    .await)
            }
        };
        crate::failpoint::hit("after_upstream");
        let status = answered.header.status.as_u16();
        let mut prefix = None;
        if cfg.settle_on.matches(status) {
            let no_body = forward::bodiless(&session.req_header().method, status);
            let stored;
            (prefix, stored) = replay_copy(route, event_id, &mut answered, no_body).await?;
            let (content_type, body) = match &stored {
                Some((ct, b)) => (ct.as_deref(), Some(&b[..])),
                None => (None, None),
            };
            let delivered = SettleOutcome::Delivered {
                status,
                content_type,
                body,
            };
            self.settle_or_refuse(route, event_id, attempt, delivered)
                .await?;
        } else {
            let error = format!("upstream answered {status}");
            let failed = SettleOutcome::Failed {
                status: Some(status),
                error: Some(&error),
            };
            self.settle_or_refuse(route, event_id, attempt, failed)
                .await?;
        }
        Ok(Verdict::Relay(Relay {
            answered,
            prefix,
            outcome: Outcome::Forwarded,
        }))
    }

    /// The upstream gave no answer to a claimed delivery: the claim is
    /// released, the sender gets 502 or 504.
    async fn upstream_failed(
        &self,
        route: &RouteRt,
        event_id: &str,
        attempt: i64,
        failure: UpstreamFailure,
    ) -> Stop {
        let refused = Refused::upstream_failed(&failure, Some(event_id));
        let error = match failure {
            UpstreamFailure::Connect(e) => e,
            UpstreamFailure::Timeout => format!(
                "no response within {}",
                humantime::format_duration(route.cfg.upstream_timeout)
            ),
        };
        // where and why go to the log and the record, not to the sender
        tracing::warn!(
            route = route.name(),
            event_id,
            attempt,
            upstream = %route.cfg.upstream.original,
            error = %error,
            "upstream failed; releasing the claim"
        );
        let failed = SettleOutcome::Failed {
            status: None,
            error: Some(&error),
        };
        match self
            .settle_or_refuse(route, event_id, attempt, failed)
            .await
        {
            Ok(()) => refused.into(),
            Err(r) => r.into(),
        }
    }
}

/// A stored copy of a response for replay: its content type and body.
type ReplayCopy = (Option<String>, Bytes);

/// With `replay_body`, the start of the upstream's body, read to be stored
/// for replay: the bytes read (passed on first), and the copy to store when
/// that was the whole body (within `replay_body_limit`).
async fn replay_copy(
    route: &RouteRt,
    event_id: &str,
    answered: &mut Answered,
    no_body: bool,
) -> pingora::Result<(Option<Bytes>, Option<ReplayCopy>)> {
    let cfg = &route.cfg;
    if !cfg.replay_body {
        return Ok((None, None));
    }
    if no_body {
        return Ok((None, Some((None, Bytes::new()))));
    }
    let (bytes, whole) = forward::read_prefix(answered, cfg.replay_body_limit as usize).await?;
    if !whole {
        tracing::info!(
            route = route.name(),
            event_id,
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

/// A body that could not be read whole: too large (413), or a timeout or
/// malformed framing (answered, then closed: the stream is unusable).
pub(super) fn body_refused(e: BodyError, max_body: u64, route: &str) -> Refused {
    if let BodyError::Broken(cause) = &e {
        tracing::debug!(route, error = %cause, "unreadable request body");
    }
    match e {
        BodyError::TooLarge => Refused::too_large(max_body),
        e => Refused::new(Problem::new(e.invalid_kind(), e.invalid_detail())).closing(true),
    }
}
