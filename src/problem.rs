//! The responses idemgate writes itself: RFC 9457 problem+json bodies with a
//! `urn:idemgate:problem:NAME` type, and the `Idempotency-Status` outcome each
//! one carries. The one place that maps a refusal to an HTTP status, and the
//! one place every problem's NAME is spelled: the proxy's and the admin
//! API's ([`AdminKind`]), which share `invalid-body`, `body-too-large` and
//! `store-unavailable` with the proxy.

use crate::limits::OverLimit;
use crate::metrics::Outcome;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    InFlight,
    DigestMismatch,
    MissingEventId,
    InvalidEventId,
    InvalidBody,
    /// `invalid-body` with 408: the body did not arrive within `body_timeout`.
    BodyTimeout,
    BodyTooLarge,
    InvalidSignature,
    StoreUnavailable,
    UpstreamUnreachable,
    UpstreamTimeout,
    NoRoute,
    /// The path has no normal form (SPEC §4, "Paths").
    InvalidPath,
    /// Not in SPEC §4 (proposed): a header section over idemgate's limit.
    HeadersTooLarge,
    /// The event's record is `ambiguous` (SPEC §12): held for an operator.
    OutcomeUnknown,
    /// The route is paused (SPEC §14): nothing is forwarded.
    RoutePaused,
    /// Over the route's `upstream_concurrency` or `upstream_rate` (SPEC §15).
    UpstreamSaturated,
    /// The route's breaker is open (SPEC §15).
    UpstreamUnavailable,
    /// The client address is outside the route's `allow_from` (SPEC §22).
    SourceNotAllowed,
    /// SPEC §4, "Strictness": a head (or chunked framing) RFC 9112 says a
    /// server must reject.
    InvalidRequest,
    /// `invalid-request` with 501: a transfer coding or method idemgate
    /// does not implement (RFC 9112 §6.1).
    NotImplemented,
    /// One of the admin API's own (SPEC §11).
    Admin(AdminKind),
}

/// The admin API's own refusals (SPEC §11). They answer an operator, never
/// a proxied request: no outcome is counted for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminKind {
    InvalidQuery,
    /// `invalid-path`, titled for the API: a path segment that does not decode.
    InvalidPath,
    NoEndpoint,
    /// No record of this event ID.
    NotFound,
    /// With [`Problem::allow`].
    MethodNotAllowed,
    /// A release of a delivered event without `force`.
    Delivered,
    /// A resolve of a record that is not `ambiguous`.
    NotAmbiguous,
    UnknownRoute,
    /// No `admin.token`: every action is refused.
    ActionsDisabled,
    Unauthorized,
    InvalidCursor,
    /// A `Host` that is not a loopback name.
    MisdirectedRequest,
}

impl AdminKind {
    fn status(self) -> u16 {
        match self {
            AdminKind::InvalidQuery | AdminKind::InvalidPath | AdminKind::InvalidCursor => 400,
            AdminKind::Unauthorized => 401,
            AdminKind::ActionsDisabled => 403,
            AdminKind::NoEndpoint | AdminKind::NotFound | AdminKind::UnknownRoute => 404,
            AdminKind::MethodNotAllowed => 405,
            AdminKind::Delivered | AdminKind::NotAmbiguous => 409,
            AdminKind::MisdirectedRequest => 421,
        }
    }

    fn name(self) -> &'static str {
        match self {
            AdminKind::InvalidQuery => "invalid-query",
            AdminKind::InvalidPath => ProblemKind::InvalidPath.name(),
            AdminKind::NoEndpoint => "no-endpoint",
            AdminKind::NotFound => "not-found",
            AdminKind::MethodNotAllowed => "method-not-allowed",
            AdminKind::Delivered => "delivered",
            AdminKind::NotAmbiguous => "not-ambiguous",
            AdminKind::UnknownRoute => "unknown-route",
            AdminKind::ActionsDisabled => "actions-disabled",
            AdminKind::Unauthorized => "unauthorized",
            AdminKind::InvalidCursor => "invalid-cursor",
            AdminKind::MisdirectedRequest => "misdirected-request",
        }
    }

    fn title(self) -> &'static str {
        match self {
            AdminKind::InvalidQuery => "Invalid query parameter",
            AdminKind::InvalidPath => "Invalid path",
            AdminKind::NoEndpoint => "No such endpoint",
            AdminKind::NotFound => "No such record",
            AdminKind::MethodNotAllowed => "Method not allowed",
            AdminKind::Delivered => "Event already delivered",
            AdminKind::NotAmbiguous => "Event is not ambiguous",
            AdminKind::UnknownRoute => "No such route",
            AdminKind::ActionsDisabled => "Admin actions are disabled",
            AdminKind::Unauthorized => "Admin token required",
            AdminKind::InvalidCursor => "Invalid cursor",
            AdminKind::MisdirectedRequest => "Not a loopback host name",
        }
    }
}

impl ProblemKind {
    pub fn status(self) -> u16 {
        match self {
            ProblemKind::InFlight | ProblemKind::OutcomeUnknown => 409,
            ProblemKind::DigestMismatch => 422,
            ProblemKind::MissingEventId
            | ProblemKind::InvalidEventId
            | ProblemKind::InvalidBody
            | ProblemKind::InvalidPath
            | ProblemKind::InvalidRequest => 400,
            ProblemKind::NotImplemented => 501,
            ProblemKind::BodyTimeout => 408,
            ProblemKind::BodyTooLarge => 413,
            ProblemKind::InvalidSignature => 401,
            ProblemKind::SourceNotAllowed => 403,
            ProblemKind::StoreUnavailable
            | ProblemKind::RoutePaused
            | ProblemKind::UpstreamSaturated
            | ProblemKind::UpstreamUnavailable => 503,
            ProblemKind::UpstreamUnreachable => 502,
            ProblemKind::UpstreamTimeout => 504,
            ProblemKind::NoRoute => 404,
            ProblemKind::HeadersTooLarge => 431,
            ProblemKind::Admin(k) => k.status(),
        }
    }

    /// NAME of `urn:idemgate:problem:NAME`.
    pub fn name(self) -> &'static str {
        match self {
            ProblemKind::InFlight => "in-flight",
            ProblemKind::DigestMismatch => "digest-mismatch",
            ProblemKind::MissingEventId => "missing-event-id",
            ProblemKind::InvalidEventId => "invalid-event-id",
            ProblemKind::InvalidBody | ProblemKind::BodyTimeout => "invalid-body",
            ProblemKind::BodyTooLarge => "body-too-large",
            ProblemKind::InvalidSignature => "invalid-signature",
            ProblemKind::StoreUnavailable => "store-unavailable",
            ProblemKind::UpstreamUnreachable => "upstream-unreachable",
            ProblemKind::UpstreamTimeout => "upstream-timeout",
            ProblemKind::NoRoute => "no-route",
            ProblemKind::InvalidPath => "invalid-path",
            ProblemKind::HeadersTooLarge => "headers-too-large",
            ProblemKind::OutcomeUnknown => "outcome-unknown",
            ProblemKind::RoutePaused => "route-paused",
            ProblemKind::UpstreamSaturated => "upstream-saturated",
            ProblemKind::UpstreamUnavailable => "upstream-unavailable",
            ProblemKind::SourceNotAllowed => "source-not-allowed",
            ProblemKind::InvalidRequest | ProblemKind::NotImplemented => "invalid-request",
            ProblemKind::Admin(k) => k.name(),
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            ProblemKind::InFlight => "Event is being processed",
            ProblemKind::DigestMismatch => "Event ID reused with a different payload",
            ProblemKind::MissingEventId => "Missing event ID",
            ProblemKind::InvalidEventId => "Invalid event ID",
            ProblemKind::InvalidBody => "Invalid request body",
            ProblemKind::BodyTimeout => "Request body timed out",
            ProblemKind::BodyTooLarge => "Request body too large",
            ProblemKind::InvalidSignature => "Invalid signature",
            ProblemKind::StoreUnavailable => "Claim store unavailable",
            ProblemKind::UpstreamUnreachable => "Upstream unreachable",
            ProblemKind::UpstreamTimeout => "Upstream timed out",
            ProblemKind::NoRoute => "No route",
            ProblemKind::InvalidPath => "Invalid request path",
            ProblemKind::HeadersTooLarge => "Request header fields too large",
            ProblemKind::OutcomeUnknown => "Event outcome unknown",
            ProblemKind::RoutePaused => "Route paused",
            ProblemKind::UpstreamSaturated => "Upstream saturated",
            ProblemKind::UpstreamUnavailable => "Upstream unavailable",
            ProblemKind::SourceNotAllowed => "Source address not allowed",
            ProblemKind::InvalidRequest => "Invalid request",
            ProblemKind::NotImplemented => "Not implemented",
            ProblemKind::Admin(k) => k.title(),
        }
    }

    /// The request outcome: a metric label and the `Idempotency-Status` value.
    /// 502/504 happen after a guarded request was sent upstream: `forwarded`.
    pub fn outcome(self) -> Outcome {
        match self {
            ProblemKind::InFlight => Outcome::InFlight,
            ProblemKind::DigestMismatch => Outcome::DigestMismatch,
            ProblemKind::MissingEventId => Outcome::MissingId,
            ProblemKind::InvalidEventId => Outcome::InvalidId,
            ProblemKind::InvalidBody | ProblemKind::BodyTimeout => Outcome::InvalidBody,
            ProblemKind::BodyTooLarge => Outcome::BodyTooLarge,
            ProblemKind::InvalidSignature => Outcome::InvalidSignature,
            ProblemKind::StoreUnavailable => Outcome::StoreUnavailable,
            ProblemKind::UpstreamUnreachable | ProblemKind::UpstreamTimeout => Outcome::Forwarded,
            ProblemKind::NoRoute => Outcome::NoRoute,
            ProblemKind::InvalidPath => Outcome::InvalidPath,
            // an admin API problem never reaches the proxy's exit, which
            // alone counts outcomes; were one to, it is a request refused
            ProblemKind::HeadersTooLarge
            | ProblemKind::InvalidRequest
            | ProblemKind::NotImplemented
            | ProblemKind::Admin(_) => Outcome::InvalidRequest,
            ProblemKind::OutcomeUnknown => Outcome::OutcomeUnknown,
            ProblemKind::RoutePaused => Outcome::Paused,
            ProblemKind::UpstreamSaturated => Outcome::Saturated,
            ProblemKind::UpstreamUnavailable => Outcome::BreakerOpen,
            ProblemKind::SourceNotAllowed => Outcome::SourceRefused,
        }
    }
}

/// One generated refusal. `detail` must never contain payload bytes.
#[derive(Debug, Clone)]
pub struct Problem {
    pub kind: ProblemKind,
    pub detail: String,
    pub event_id: Option<String>,
    /// Seconds for `Retry-After` (409 and 503).
    pub retry_after: Option<u64>,
    /// With 405 (the admin API): the methods the resource takes (`Allow`).
    pub allow: Option<&'static str>,
}

impl Problem {
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Problem {
        Problem {
            kind,
            detail: detail.into(),
            event_id: None,
            retry_after: None,
            allow: None,
        }
    }

    /// One of the admin API's own problems.
    pub fn admin(kind: AdminKind, detail: impl Into<String>) -> Problem {
        Problem::new(ProblemKind::Admin(kind), detail)
    }

    pub fn with_event_id(mut self, event_id: Option<&str>) -> Problem {
        self.event_id = event_id.map(str::to_owned);
        self
    }

    pub fn with_retry_after(mut self, secs: u64) -> Problem {
        self.retry_after = Some(secs);
        self
    }

    pub fn status(&self) -> u16 {
        self.kind.status()
    }

    /// The problem+json document.
    pub fn body(&self) -> Vec<u8> {
        document(
            self.kind.name(),
            self.kind.title(),
            self.kind.status(),
            &self.detail,
            self.event_id.as_deref(),
        )
    }
}

/// A problem+json document of type `urn:idemgate:problem:NAME`.
fn document(name: &str, title: &str, status: u16, detail: &str, event_id: Option<&str>) -> Vec<u8> {
    let mut doc = serde_json::json!({
        "type": format!("urn:idemgate:problem:{name}"),
        "title": title,
        "status": status,
        "detail": detail,
    });
    if let Some(id) = event_id {
        doc["event_id"] = serde_json::Value::String(id.to_owned());
    }
    serde_json::to_vec(&doc).expect("a JSON value always serialises")
}

/// What a route's limits refused (SPEC §15): nothing was claimed, the
/// sender retries after `Retry-After`.
pub fn upstream_refusal(r: OverLimit, event_id: Option<&str>) -> Problem {
    let (kind, detail, secs) = match r {
        OverLimit::Saturated { retry_after_secs } => (
            ProblemKind::UpstreamSaturated,
            "the route's upstream is at its configured concurrency or rate; nothing was \
             claimed, retry later",
            retry_after_secs,
        ),
        OverLimit::Open { retry_after_secs } => (
            ProblemKind::UpstreamUnavailable,
            "the route's upstream failed or asked for a pause; nothing was claimed, retry later",
            retry_after_secs,
        ),
    };
    Problem::new(kind, detail)
        .with_event_id(event_id)
        .with_retry_after(secs.max(1))
}

pub const CONTENT_TYPE: &str = "application/problem+json";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_have_every_member() {
        let p =
            Problem::new(ProblemKind::DigestMismatch, "other payload").with_event_id(Some("evt_1"));
        let doc: serde_json::Value = serde_json::from_slice(&p.body()).unwrap();
        assert_eq!(doc["type"], "urn:idemgate:problem:digest-mismatch");
        assert_eq!(doc["status"], 422);
        assert_eq!(doc["event_id"], "evt_1");
        assert!(doc["title"].as_str().is_some_and(|t| !t.is_empty()));
        assert_eq!(doc["detail"], "other payload");
        let q = Problem::new(ProblemKind::NoRoute, "x");
        let doc: serde_json::Value = serde_json::from_slice(&q.body()).unwrap();
        assert!(doc.get("event_id").is_none());
    }

    #[test]
    fn statuses_and_outcomes() {
        use ProblemKind::*;
        let table = [
            (InFlight, 409, "in_flight"),
            (DigestMismatch, 422, "digest_mismatch"),
            (MissingEventId, 400, "missing_id"),
            (InvalidEventId, 400, "invalid_id"),
            (InvalidBody, 400, "invalid_body"),
            (BodyTimeout, 408, "invalid_body"),
            (BodyTooLarge, 413, "body_too_large"),
            (InvalidSignature, 401, "invalid_signature"),
            (StoreUnavailable, 503, "store_unavailable"),
            (UpstreamUnreachable, 502, "forwarded"),
            (UpstreamTimeout, 504, "forwarded"),
            (NoRoute, 404, "no_route"),
            (InvalidPath, 400, "invalid_path"),
            (HeadersTooLarge, 431, "invalid_request"),
            (InvalidRequest, 400, "invalid_request"),
            (NotImplemented, 501, "invalid_request"),
            (RoutePaused, 503, "paused"),
            (UpstreamSaturated, 503, "saturated"),
            (UpstreamUnavailable, 503, "breaker_open"),
            (SourceNotAllowed, 403, "source_refused"),
        ];
        for (kind, status, outcome) in table {
            assert_eq!(kind.status(), status, "{kind:?}");
            assert_eq!(kind.outcome().as_str(), outcome, "{kind:?}");
        }
    }
}
