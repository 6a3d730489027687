//! Owned copies of the borrowed claim and settle requests, for operations
//! that wait in a queue (the group-commit batches of both stores).

use super::{ClaimRequest, SettleOutcome, SettleRequest};
use crate::claim::Millis;

pub(crate) struct OwnedClaim {
    pub(crate) route: String,
    pub(crate) event_id: String,
    pub(crate) digest: String,
    pub(crate) now: Millis,
    pub(crate) lease_ms: Millis,
    pub(crate) retention_ms: Millis,
}

pub(crate) struct OwnedSettle {
    pub(crate) route: String,
    pub(crate) event_id: String,
    pub(crate) attempt: i64,
    pub(crate) now: Millis,
    pub(crate) retention_ms: Millis,
    pub(crate) delivered: Option<(u16, Option<String>, Option<Vec<u8>>)>,
    pub(crate) failed: Option<(Option<u16>, Option<String>)>,
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
        }
    }
}

impl OwnedSettle {
    pub(crate) fn new(r: &SettleRequest<'_>) -> Self {
        let (delivered, failed) = match &r.outcome {
            SettleOutcome::Delivered {
                status,
                content_type,
                body,
            } => (
                Some((
                    *status,
                    content_type.map(str::to_owned),
                    body.map(<[u8]>::to_vec),
                )),
                None,
            ),
            SettleOutcome::Failed { status, error } => {
                (None, Some((*status, error.map(str::to_owned))))
            }
        };
        OwnedSettle {
            route: r.route.to_owned(),
            event_id: r.event_id.to_owned(),
            attempt: r.attempt,
            now: r.now,
            retention_ms: r.retention_ms,
            delivered,
            failed,
        }
    }
    pub(crate) fn req(&self) -> SettleRequest<'_> {
        let outcome = match (&self.delivered, &self.failed) {
            (Some((status, ct, body)), _) => SettleOutcome::Delivered {
                status: *status,
                content_type: ct.as_deref(),
                body: body.as_deref(),
            },
            (None, Some((status, error))) => SettleOutcome::Failed {
                status: *status,
                error: error.as_deref(),
            },
            (None, None) => SettleOutcome::Failed {
                status: None,
                error: None,
            },
        };
        SettleRequest {
            route: &self.route,
            event_id: &self.event_id,
            attempt: self.attempt,
            now: self.now,
            retention_ms: self.retention_ms,
            outcome,
        }
    }
}
