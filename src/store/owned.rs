//! Owned copies of the borrowed claim and settle requests, for operations
//! that wait in a queue (the group-commit batches of both stores).

use super::{ClaimRequest, ReplayHeaders, SettleOutcome, SettleRequest};
use crate::claim::Millis;

pub(crate) struct OwnedClaim {
    pub(crate) route: String,
    pub(crate) event_id: String,
    pub(crate) digest: String,
    pub(crate) now: Millis,
    pub(crate) lease_ms: Millis,
    pub(crate) retention_ms: Millis,
    pub(crate) hold: bool,
    pub(crate) instance: String,
    pub(crate) token: i64,
    pub(crate) trace: Option<super::TraceRef>,
}

pub(crate) struct OwnedSettle {
    pub(crate) route: String,
    pub(crate) event_id: String,
    pub(crate) attempt: i64,
    pub(crate) started_at: Millis,
    pub(crate) instance: String,
    pub(crate) attempt_error: Option<String>,
    pub(crate) now: Millis,
    pub(crate) retention_ms: Millis,
    pub(crate) outcome: OwnedOutcome,
}

/// [`SettleOutcome`], owned.
pub(crate) enum OwnedOutcome {
    Delivered {
        status: u16,
        content_type: Option<String>,
        body: Option<Vec<u8>>,
        headers: Option<ReplayHeaders>,
    },
    Failed {
        status: Option<u16>,
        error: Option<String>,
    },
    Ambiguous {
        error: Option<String>,
    },
}

impl OwnedClaim {
    pub(crate) fn new(r: &ClaimRequest<'_>) -> Self {
        OwnedClaim {
            route: r.route.to_owned(),
            event_id: r.event_id.to_owned(),
            digest: r.digest.to_owned(),
            now: r.now,
            lease_ms: r.lease_ms,
            retention_ms: r.retention_ms,
            hold: r.hold,
            instance: r.instance.to_owned(),
            token: r.token,
            trace: r.trace,
        }
    }
    pub(crate) fn req(&self) -> ClaimRequest<'_> {
        ClaimRequest {
            route: &self.route,
            event_id: &self.event_id,
            digest: &self.digest,
            now: self.now,
            lease_ms: self.lease_ms,
            retention_ms: self.retention_ms,
            hold: self.hold,
            instance: &self.instance,
            token: self.token,
            trace: self.trace,
        }
    }
}

impl OwnedSettle {
    pub(crate) fn new(r: &SettleRequest<'_>) -> Self {
        let outcome = match r.outcome {
            SettleOutcome::Delivered {
                status,
                content_type,
                body,
                headers,
            } => OwnedOutcome::Delivered {
                status,
                content_type: content_type.map(str::to_owned),
                body: body.map(<[u8]>::to_vec),
                headers: headers.cloned(),
            },
            SettleOutcome::Failed { status, error } => OwnedOutcome::Failed {
                status,
                error: error.map(str::to_owned),
            },
            SettleOutcome::Ambiguous { error } => OwnedOutcome::Ambiguous {
                error: error.map(str::to_owned),
            },
        };
        OwnedSettle {
            route: r.route.to_owned(),
            event_id: r.event_id.to_owned(),
            attempt: r.attempt,
            started_at: r.started_at,
            instance: r.instance.to_owned(),
            attempt_error: r.attempt_error.map(str::to_owned),
            now: r.now,
            retention_ms: r.retention_ms,
            outcome,
        }
    }
    pub(crate) fn req(&self) -> SettleRequest<'_> {
        let outcome = match &self.outcome {
            OwnedOutcome::Delivered {
                status,
                content_type,
                body,
                headers,
            } => SettleOutcome::Delivered {
                status: *status,
                content_type: content_type.as_deref(),
                body: body.as_deref(),
                headers: headers.as_ref(),
            },
            OwnedOutcome::Failed { status, error } => SettleOutcome::Failed {
                status: *status,
                error: error.as_deref(),
            },
            OwnedOutcome::Ambiguous { error } => SettleOutcome::Ambiguous {
                error: error.as_deref(),
            },
        };
        SettleRequest {
            route: &self.route,
            event_id: &self.event_id,
            attempt: self.attempt,
            started_at: self.started_at,
            instance: &self.instance,
            attempt_error: self.attempt_error.as_deref(),
            now: self.now,
            retention_ms: self.retention_ms,
            outcome,
        }
    }
}
