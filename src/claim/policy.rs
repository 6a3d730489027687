//! The guard's policies, beside [`decide`](super::decide) and as pure: what
//! a delivery without an event ID comes to (`on_missing_id`), what a store
//! that fails it means (`on_store_error`, and a settle that failed), how a
//! duplicate is held while the first delivery is in flight (`in_flight:
//! wait`), and how a failing settle is retried. The proxy carries them out;
//! the tables in the tests are their specification.

use std::time::Duration;

use super::{AttemptEnd, Millis};

/// `on_missing_id`: what a guarded request without an event ID gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnMissingId {
    /// 400.
    Reject,
    /// Forward unguarded.
    Forward,
    /// The body digest is the event ID.
    BodyDigest,
}

/// `on_store_error`: what a delivery gets when the store cannot take its claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreError {
    /// 503, fail closed.
    Reject,
    /// Forward unguarded (counted).
    Forward,
}

/// `in_flight`: what a duplicate gets while the first delivery is in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InFlight {
    /// 409 at once.
    Conflict,
    /// Hold the duplicate until the first settles, up to the lease.
    Wait,
}

/// `Retry-After` of a delivery of an `ambiguous` event (SPEC §4).
pub const OUTCOME_UNKNOWN_RETRY_AFTER_SECS: u64 = 60;
/// `Retry-After` of a delivery to a paused route (SPEC §14).
pub const ROUTE_PAUSED_RETRY_AFTER_SECS: u64 = 30;

/// `on_ambiguous`: what an attempt whose outcome idemgate cannot know (the
/// consumer may have acted, no answer came) does to the claim (SPEC §12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnAmbiguous {
    /// Release it (at least once): the next delivery is forwarded again.
    Release,
    /// Hold the record `ambiguous` until an operator decides (at most once).
    Hold,
}

/// What keys a guarded delivery's claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key<T> {
    /// The event ID it carries.
    EventId(T),
    /// It has none: its body digest stands in for one.
    Digest,
    /// It has none: it is forwarded without a claim.
    Unguarded,
    /// It has none: it is refused (400 `missing-event-id`).
    Missing,
}

/// The key of a delivery that carries `event_id` (or none), by `on_missing_id`.
pub fn key<T>(event_id: Option<T>, on_missing: OnMissingId) -> Key<T> {
    match (event_id, on_missing) {
        (Some(id), _) => Key::EventId(id),
        (None, OnMissingId::Reject) => Key::Missing,
        (None, OnMissingId::Forward) => Key::Unguarded,
        (None, OnMissingId::BodyDigest) => Key::Digest,
    }
}

/// `Retry-After` of a 503 `store-unavailable`, in seconds.
pub const STORE_RETRY_AFTER_SECS: u64 = 1;

/// Where the store failed a guarded delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreStep {
    /// The read or the claim before forwarding: nothing went upstream yet.
    Claim,
    /// The settle of an attempt that ended so, retried to its deadline
    /// ([`SettleRetry`]).
    Settle(AttemptEnd),
}

/// What a delivery gets when the store fails it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WithoutStore {
    /// 503 `store-unavailable`, `Retry-After: 1`.
    Refuse,
    /// It goes on without the store: forwarded unguarded before the claim,
    /// or the upstream's answer passed on after it (the claim then waits
    /// for its lease).
    GoOn,
}

/// The store failed a delivery at `step`.
pub fn without_store(on_store_error: OnStoreError, step: StoreStep) -> WithoutStore {
    match (step, on_store_error) {
        (StoreStep::Claim, OnStoreError::Reject) => WithoutStore::Refuse,
        (StoreStep::Claim, OnStoreError::Forward) => WithoutStore::GoOn,
        // The settle commits before the answer is passed on (SPEC §3); this
        // one did not. A 2xx now would be a delivery the store does not know:
        // a sender that saw it never retries, and the claim ends as an
        // expired lease. Told to retry, the sender meets the claim in flight,
        // then (its lease over) a re-attempt with the same Idempotency-Key
        // that records it. Forwarding again is no way out: it went already.
        (StoreStep::Settle(AttemptEnd::Settled), _) => WithoutStore::Refuse,
        // A release that failed: the sender gets the failure either way, and
        // the claim becomes reclaimable when its lease ends. A hold that
        // failed likewise: its lease's end is found and held (SPEC §12).
        (StoreStep::Settle(AttemptEnd::Failed | AttemptEnd::Ambiguous), _) => WithoutStore::GoOn,
    }
}

/// Why a duplicate in flight gets 409.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// `in_flight: conflict`.
    Conflict,
    /// `in_flight: wait`, but the route holds `max_waiters` duplicates already.
    TooManyWaiting,
    /// The lease ran out while the duplicate was held.
    LeaseRanOut,
    /// `in_flight: wait`, but this process is handing its listeners over to
    /// a new one (SPEC §10): answered at once rather than held to its end.
    HandingOver,
}

/// A 409 for a duplicate in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightRefusal {
    pub why: Busy,
    /// `Retry-After`: what was left of the lease, rounded up; 1 once it ran out.
    pub retry_after_secs: u64,
}

/// First pause of a held duplicate between reads of its record.
const HOLD_FIRST_PAUSE: Duration = Duration::from_millis(10);
/// Longest pause of a held duplicate between reads (the pause doubles up to it).
const HOLD_LONGEST_PAUSE: Duration = Duration::from_millis(200);

/// A duplicate that meets a live lease: refused at once, or (`in_flight:
/// wait`) held, reading its record at growing pauses until the record
/// changes (then it claims again) or the latest lease end it saw passes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The latest lease end seen: a reclaim by another held request extends it.
    lease_end: Millis,
    /// The next pause between reads.
    pause: Duration,
    /// It holds one of the route's `max_waiters` places.
    placed: bool,
}

impl Default for Hold {
    fn default() -> Self {
        Hold {
            lease_end: 0,
            pause: HOLD_FIRST_PAUSE,
            placed: false,
        }
    }
}

impl Hold {
    /// The claim met a live lease with `retry_after_ms` left at `now`: `Ok`
    /// to be held, else the 409. `take_place` takes one of the route's
    /// `max_waiters` places; it is called with `in_flight: wait` only, and
    /// once.
    pub fn meet(
        &mut self,
        in_flight: InFlight,
        now: Millis,
        retry_after_ms: Millis,
        take_place: impl FnOnce() -> bool,
    ) -> Result<(), InFlightRefusal> {
        let refuse = |why| InFlightRefusal {
            why,
            retry_after_secs: super::retry_after_secs(retry_after_ms),
        };
        if in_flight == InFlight::Conflict {
            return Err(refuse(Busy::Conflict));
        }
        if !self.placed {
            self.placed = take_place();
            if !self.placed {
                return Err(refuse(Busy::TooManyWaiting));
            }
        }
        self.lease_end = self.lease_end.max(now + retry_after_ms);
        Ok(())
    }

    /// The 409 for a held (or about to be held) duplicate when the process
    /// hands over at `now`: `Retry-After` is what is left of the lease.
    pub fn handing_over(&self, now: Millis, retry_after_ms: Millis) -> InFlightRefusal {
        InFlightRefusal {
            why: Busy::HandingOver,
            retry_after_secs: super::retry_after_secs(retry_after_ms.max(self.lease_end - now)),
        }
    }

    /// A read while held found the record still processing, its lease until `until`.
    pub fn extend(&mut self, until: Option<Millis>) {
        if let Some(until) = until {
            self.lease_end = self.lease_end.max(until);
        }
    }

    /// The pause before the next read at `now`, never past the lease end;
    /// the 409 once that has passed.
    pub fn pause(&mut self, now: Millis) -> Result<Duration, InFlightRefusal> {
        let left = self.lease_end - now;
        if left <= 0 {
            return Err(InFlightRefusal {
                why: Busy::LeaseRanOut,
                retry_after_secs: super::retry_after_secs(1),
            });
        }
        let pause = self.pause.min(Duration::from_millis(left as u64));
        self.pause = (self.pause * 2).min(HOLD_LONGEST_PAUSE);
        Ok(pause)
    }
}

/// How long a settle is retried before the answer goes on to the sender
/// without it (the claim then waits for its lease).
pub const SETTLE_DEADLINE: Duration = Duration::from_secs(3);

/// Retries of a failing settle: after 50 ms, then three times longer each
/// time, while the pause ends before [`SETTLE_DEADLINE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettleRetry {
    pause: Duration,
}

impl Default for SettleRetry {
    fn default() -> Self {
        SettleRetry {
            pause: Duration::from_millis(50),
        }
    }
}

impl SettleRetry {
    /// A try failed with `left` before the deadline: the pause before the
    /// next one, or `None` to give up.
    pub fn after_failure(&mut self, left: Duration) -> Option<Duration> {
        let pause = self.pause;
        if pause >= left {
            return None;
        }
        self.pause *= 3;
        Some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_table() {
        use OnMissingId::*;
        let cases = [
            (Some("e"), Reject, Key::EventId("e")),
            (Some("e"), Forward, Key::EventId("e")),
            (Some("e"), BodyDigest, Key::EventId("e")),
            (None, Reject, Key::Missing),
            (None, Forward, Key::Unguarded),
            (None, BodyDigest, Key::Digest),
        ];
        for (id, policy, want) in cases {
            assert_eq!(key(id, policy), want, "{id:?} {policy:?}");
        }
    }

    #[test]
    fn without_store_table() {
        use AttemptEnd::*;
        use OnStoreError::*;
        use WithoutStore::*;
        let cases = [
            (Reject, StoreStep::Claim, Refuse),
            (Forward, StoreStep::Claim, GoOn),
            (Reject, StoreStep::Settle(Settled), Refuse),
            (Forward, StoreStep::Settle(Settled), Refuse),
            (Reject, StoreStep::Settle(Failed), GoOn),
            (Forward, StoreStep::Settle(Failed), GoOn),
            (Reject, StoreStep::Settle(Ambiguous), GoOn),
            (Forward, StoreStep::Settle(Ambiguous), GoOn),
        ];
        for (policy, step, want) in cases {
            assert_eq!(without_store(policy, step), want, "{policy:?} {step:?}");
        }
    }

    fn refused(why: Busy, retry_after_secs: u64) -> Result<(), InFlightRefusal> {
        Err(InFlightRefusal {
            why,
            retry_after_secs,
        })
    }

    #[test]
    fn meeting_a_live_lease_table() {
        const NOW: Millis = 1_000_000;
        // (policy, place free, lease left) -> answer, whether a place was asked for
        let cases = [
            (
                InFlight::Conflict,
                true,
                2_500,
                refused(Busy::Conflict, 3),
                false,
            ),
            (
                InFlight::Conflict,
                false,
                1,
                refused(Busy::Conflict, 1),
                false,
            ),
            (InFlight::Wait, true, 2_500, Ok(()), true),
            (
                InFlight::Wait,
                false,
                2_500,
                refused(Busy::TooManyWaiting, 3),
                true,
            ),
            (
                InFlight::Wait,
                false,
                999,
                refused(Busy::TooManyWaiting, 1),
                true,
            ),
        ];
        for (policy, free, left, want, asks) in cases {
            let mut hold = Hold::default();
            let mut asked = false;
            let got = hold.meet(policy, NOW, left, || {
                asked = true;
                free
            });
            assert_eq!(got, want, "{policy:?} free={free} left={left}");
            assert_eq!(asked, asks, "{policy:?} free={free}: place asked for");
        }
    }

    #[test]
    fn a_held_duplicate_keeps_its_place_and_the_latest_lease_end() {
        let mut hold = Hold::default();
        assert_eq!(hold.meet(InFlight::Wait, 100, 50, || true), Ok(()));
        // met again after a reclaim by another: no second place is taken
        let again = hold.meet(InFlight::Wait, 120, 10, || panic!("asked twice"));
        assert_eq!(again, Ok(()));
        assert_eq!(hold.lease_end, 150, "an earlier end does not shorten it");
        hold.extend(Some(400));
        hold.extend(None);
        hold.extend(Some(300));
        assert_eq!(hold.lease_end, 400);
    }

    #[test]
    fn handing_over_table() {
        // (lease end, now, retry_after_ms) -> Retry-After: the longer of the
        // lease left and what the claim said, rounded up to seconds, at least 1
        let cases = [
            (0, 0, 2_500, 3),
            (5_000, 1_000, 10, 4),
            (5_000, 4_999, 10, 1),
            (5_000, 9_000, 1, 1),
            (1_000, 0, 3_000, 3),
        ];
        for (end, now, retry_after_ms, secs) in cases {
            let mut hold = Hold::default();
            if end > 0 {
                hold.meet(InFlight::Wait, 0, end, || true).unwrap();
            }
            let r = hold.handing_over(now, retry_after_ms);
            assert_eq!(r.why, Busy::HandingOver);
            assert_eq!(
                r.retry_after_secs, secs,
                "end {end} now {now} ra {retry_after_ms}"
            );
        }
    }

    #[test]
    fn pauses_table() {
        let ms = Duration::from_millis;
        // lease end 1000: (now, pause) in order, backoff doubling up to 200 ms
        let mut hold = Hold::default();
        hold.meet(InFlight::Wait, 0, 1_000, || true).unwrap();
        let steps = [
            (0, Ok(ms(10))),
            (10, Ok(ms(20))),
            (30, Ok(ms(40))),
            (70, Ok(ms(80))),
            (150, Ok(ms(160))),
            (310, Ok(ms(200))),
            (510, Ok(ms(200))),
            (900, Ok(ms(100))), // never past the lease end
            (999, Ok(ms(1))),
            (1_000, Err(Busy::LeaseRanOut)),
            (1_500, Err(Busy::LeaseRanOut)),
        ];
        for (now, want) in steps {
            let got = hold.pause(now);
            match want {
                Ok(d) => assert_eq!(got, Ok(d), "at {now}"),
                Err(why) => assert_eq!(got, refused(why, 1).map(|()| ms(0)), "at {now}"),
            }
        }
    }

    #[test]
    fn settle_retry_table() {
        let ms = Duration::from_millis;
        let mut retry = SettleRetry::default();
        // (left before the deadline) -> pause, in order: 50, 150, 450, 1350 ms
        let steps = [
            (ms(3_000), Some(ms(50))),
            (ms(2_900), Some(ms(150))),
            (ms(2_700), Some(ms(450))),
            (ms(2_200), Some(ms(1_350))),
            (ms(800), None),
        ];
        for (left, want) in steps {
            assert_eq!(retry.after_failure(left), want, "{left:?} left");
        }
        // a pause that would end at the deadline, or after it, gives up
        assert_eq!(SettleRetry::default().after_failure(ms(50)), None);
        assert_eq!(SettleRetry::default().after_failure(ms(51)), Some(ms(50)));
        assert_eq!(SettleRetry::default().after_failure(Duration::ZERO), None);
    }
}
