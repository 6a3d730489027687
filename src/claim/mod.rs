//! The claim protocol as data: record states, the pure `decide` step that an
//! incoming delivery goes through, and the pure `settle` step that closes an
//! attempt; beside them the guard's [`policy`] (no event ID, a store that
//! does not answer, a duplicate held while in flight, a settle retried) and
//! the clock. The stores implement these same rules as single atomic SQL
//! statements; the store contract tests check that both agree.

pub mod digest;
pub mod event_id;
pub mod json_pointer;
pub mod policy;

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch: the one time unit of records and stores.
pub type Millis = i64;

/// The wall clock in [`Millis`] (0 for a clock set before 1970).
pub fn now_ms() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

/// A new claim's token (SPEC §16): distinct for every claim of this
/// process (a counter through the splitmix64 bijection) and unguessable
/// across processes (the counter starts at a random point).
pub fn claim_token() -> i64 {
    static START: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let start = *START.get_or_init(|| RandomState::new().hash_one(std::process::id()));
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    splitmix64(start.wrapping_add(n)) as i64
}

/// Steele, Lea and Flood's finaliser: a bijection on u64 that spreads
/// neighbouring inputs apart.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Where a record stands. Stored as its lower-case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Claimed by one attempt; its lease says how long the claim is live.
    Processing,
    /// The upstream answered with a settling status: final.
    Delivered,
    /// The last attempt failed or was released: the next delivery reclaims it.
    Failed,
    /// The consumer may have acted and no answer was learned, on a route
    /// with `on_ambiguous: hold`: held for an operator (SPEC §12).
    Ambiguous,
}

impl State {
    pub const ALL: [State; 4] = [
        State::Processing,
        State::Delivered,
        State::Failed,
        State::Ambiguous,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Processing => "processing",
            State::Delivered => "delivered",
            State::Failed => "failed",
            State::Ambiguous => "ambiguous",
        }
    }

    pub fn parse(s: &str) -> Option<State> {
        match s {
            "processing" => Some(State::Processing),
            "delivered" => Some(State::Delivered),
            "failed" => Some(State::Failed),
            "ambiguous" => Some(State::Ambiguous),
            _ => None,
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a delivery got to forward: the `kind` label of `idemgate_claims_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimKind {
    New,
    RetryFailed,
    RetryExpired,
}

impl ClaimKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimKind::New => "new",
            ClaimKind::RetryFailed => "retry_failed",
            ClaimKind::RetryExpired => "retry_expired",
        }
    }
}

/// The facts about an existing record that `decide` needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Existing {
    pub state: State,
    pub lease_until: Option<Millis>,
    /// Whether the stored digest equals the incoming one.
    pub same_digest: bool,
}

/// What to do with an incoming delivery (SPEC §3, the table): take the
/// claim, or leave the existing record standing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take the claim and forward.
    Claim(ClaimKind),
    /// An existing record stands; the delivery does not claim.
    Refuse(Refusal),
    /// Under `on_ambiguous: hold`, a `processing` record whose lease ended:
    /// its attempt's outcome is unknown. The record turns `ambiguous` and
    /// the delivery is answered as [`Refusal::OutcomeUnknown`].
    Hold,
}

/// Why an existing record refuses a delivery its claim: what a store
/// answers for a record it did not claim (so that answer can never be a
/// claim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Answer with the recorded outcome; the upstream is not contacted.
    Replay,
    /// Another attempt holds a live lease; `retry_after_ms` is what is left of it.
    InFlight { retry_after_ms: Millis },
    /// The event ID was already used with another payload.
    Mismatch,
    /// The record is `ambiguous`: nothing is sent until an operator decides.
    OutcomeUnknown,
}

/// The claim table of SPEC §3. A digest mismatch wins in every state; a lease
/// that ends exactly at `now` is expired. `hold`: the route's
/// `on_ambiguous` is `hold` (an expired lease is not reclaimed).
pub fn decide(existing: Option<Existing>, now: Millis, hold: bool) -> Decision {
    let Some(rec) = existing else {
        return Decision::Claim(ClaimKind::New);
    };
    if !rec.same_digest {
        return Decision::Refuse(Refusal::Mismatch);
    }
    match rec.state {
        State::Delivered => Decision::Refuse(Refusal::Replay),
        State::Failed => Decision::Claim(ClaimKind::RetryFailed),
        State::Ambiguous => Decision::Refuse(Refusal::OutcomeUnknown),
        State::Processing => match rec.lease_until {
            Some(until) if until > now => Decision::Refuse(Refusal::InFlight {
                retry_after_ms: until - now,
            }),
            _ if hold => Decision::Hold,
            _ => Decision::Claim(ClaimKind::RetryExpired),
        },
    }
}

/// Whole seconds left on a lease, rounded up, at least 1: the `Retry-After` value.
pub fn retry_after_secs(retry_after_ms: Millis) -> u64 {
    let ms = retry_after_ms.max(1) as u64;
    ms.div_ceil(1000)
}

/// How an attempt ended, as far as the claim is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// The upstream answered with a status in `settle_on`.
    Settled,
    /// Any other status, a connect error or a timeout.
    Failed,
    /// The consumer may have acted and no answer came (SPEC §12), on a
    /// route with `on_ambiguous: hold`.
    Ambiguous,
}

/// The facts about the current record that `settle` needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Current {
    pub state: State,
    pub attempts: i64,
}

/// What a settle did: the `result` label of `idemgate_settles_total` (with
/// `error` counted by the caller when the store fails).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleResult {
    Delivered,
    Released,
    /// Held for an operator: the record is `ambiguous` now.
    Ambiguous,
    /// Nothing changed: the record moved on (delivered already, or a newer
    /// attempt owns it, or it is gone).
    Stale,
}

impl SettleResult {
    pub fn as_str(self) -> &'static str {
        match self {
            SettleResult::Delivered => "delivered",
            SettleResult::Released => "released",
            SettleResult::Ambiguous => "ambiguous",
            SettleResult::Stale => "stale",
        }
    }
}

/// The settle rules of SPEC §3: delivered is final and may come from any
/// attempt (an answer that arrives after the record was held as ambiguous
/// is the knowledge the hold waited for); a release or a hold is fenced by
/// the attempt number and only ends a live `processing` claim of that very
/// attempt.
pub fn settle(current: Option<Current>, attempt: i64, end: AttemptEnd) -> SettleResult {
    let Some(cur) = current else {
        return SettleResult::Stale;
    };
    let mine = cur.state == State::Processing && cur.attempts == attempt;
    match end {
        AttemptEnd::Settled if cur.state == State::Delivered => SettleResult::Stale,
        AttemptEnd::Settled => SettleResult::Delivered,
        AttemptEnd::Failed if mine => SettleResult::Released,
        AttemptEnd::Ambiguous if mine => SettleResult::Ambiguous,
        AttemptEnd::Failed | AttemptEnd::Ambiguous => SettleResult::Stale,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = 1_000_000;

    #[test]
    fn claim_tokens_do_not_repeat() {
        let tokens: std::collections::HashSet<i64> = (0..100_000).map(|_| claim_token()).collect();
        assert_eq!(tokens.len(), 100_000);
        assert_ne!(splitmix64(0), splitmix64(1));
    }

    fn ex(state: State, lease_until: Option<Millis>, same_digest: bool) -> Option<Existing> {
        Some(Existing {
            state,
            lease_until,
            same_digest,
        })
    }

    /// Every state, digest and lease position, under both `on_ambiguous`
    /// settings: the whole table of SPEC §3.
    #[test]
    // long: the whole table of SPEC §3 in one place, one row a line
    fn decide_full_table() {
        use Decision::{Claim, Hold, Refuse};
        use Refusal::{InFlight, Mismatch, OutcomeUnknown, Replay};
        let live = Some(NOW + 2_500);
        let expired = Some(NOW - 1);
        let in_flight = Refuse(InFlight {
            retry_after_ms: 2_500,
        });
        let expired_claim = Claim(ClaimKind::RetryExpired);
        // (record, want under release, want under hold)
        let cases = [
            (None, Claim(ClaimKind::New), Claim(ClaimKind::New)),
            (ex(State::Processing, live, true), in_flight, in_flight),
            (
                ex(State::Processing, live, false),
                Refuse(Mismatch),
                Refuse(Mismatch),
            ),
            (ex(State::Processing, expired, true), expired_claim, Hold),
            (
                ex(State::Processing, expired, false),
                Refuse(Mismatch),
                Refuse(Mismatch),
            ),
            (ex(State::Processing, Some(NOW), true), expired_claim, Hold),
            (ex(State::Processing, None, true), expired_claim, Hold),
            (
                ex(State::Failed, None, true),
                Claim(ClaimKind::RetryFailed),
                Claim(ClaimKind::RetryFailed),
            ),
            (
                ex(State::Failed, live, true),
                Claim(ClaimKind::RetryFailed),
                Claim(ClaimKind::RetryFailed),
            ),
            (
                ex(State::Failed, None, false),
                Refuse(Mismatch),
                Refuse(Mismatch),
            ),
            (
                ex(State::Delivered, None, true),
                Refuse(Replay),
                Refuse(Replay),
            ),
            (
                ex(State::Delivered, live, true),
                Refuse(Replay),
                Refuse(Replay),
            ),
            (
                ex(State::Delivered, None, false),
                Refuse(Mismatch),
                Refuse(Mismatch),
            ),
            (
                ex(State::Ambiguous, None, true),
                Refuse(OutcomeUnknown),
                Refuse(OutcomeUnknown),
            ),
            (
                ex(State::Ambiguous, expired, true),
                Refuse(OutcomeUnknown),
                Refuse(OutcomeUnknown),
            ),
            (
                ex(State::Ambiguous, None, false),
                Refuse(Mismatch),
                Refuse(Mismatch),
            ),
        ];
        for (input, release, hold) in cases {
            assert_eq!(decide(input, NOW, false), release, "release: {input:?}");
            assert_eq!(decide(input, NOW, true), hold, "hold: {input:?}");
        }
    }

    #[test]
    fn settle_full_table() {
        use SettleResult::*;
        let mine = 3;
        for state in State::ALL {
            for attempts in [mine - 1, mine, mine + 1] {
                let cur = Some(Current { state, attempts });
                let own_live_claim = state == State::Processing && attempts == mine;
                let want_delivered = if state == State::Delivered {
                    Stale
                } else {
                    Delivered
                };
                let (want_failed, want_ambiguous) = if own_live_claim {
                    (Released, Ambiguous)
                } else {
                    (Stale, Stale)
                };
                let got = |end| settle(cur, mine, end);
                let at = format!("{state} attempts={attempts}");
                assert_eq!(got(AttemptEnd::Settled), want_delivered, "{at} settled");
                assert_eq!(got(AttemptEnd::Failed), want_failed, "{at} failed");
                assert_eq!(got(AttemptEnd::Ambiguous), want_ambiguous, "{at} ambiguous");
            }
        }
        for end in [
            AttemptEnd::Settled,
            AttemptEnd::Failed,
            AttemptEnd::Ambiguous,
        ] {
            assert_eq!(settle(None, 1, end), Stale);
        }
    }

    #[test]
    fn retry_after_rounds_up_and_is_at_least_one() {
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(-5), 1);
        assert_eq!(retry_after_secs(1000), 1);
        assert_eq!(retry_after_secs(1001), 2);
        assert_eq!(retry_after_secs(5999), 6);
    }

    #[test]
    fn lease_arithmetic_is_consistent_for_every_offset() {
        // The live/expired boundary and Retry-After agree for any lease end.
        for offset in -3_000i64..3_000 {
            let d = decide(ex(State::Processing, Some(NOW + offset), true), NOW, false);
            if offset > 0 {
                let Decision::Refuse(Refusal::InFlight { retry_after_ms }) = d else {
                    panic!("{offset}: {d:?}")
                };
                assert_eq!(retry_after_ms, offset);
                let secs = retry_after_secs(retry_after_ms) as i64;
                assert!(
                    secs * 1000 >= offset && (secs - 1) * 1000 < offset,
                    "{offset} -> {secs}"
                );
            } else {
                assert_eq!(d, Decision::Claim(ClaimKind::RetryExpired), "{offset}");
            }
        }
    }

    #[test]
    fn state_names_round_trip() {
        for s in State::ALL {
            assert_eq!(State::parse(s.as_str()), Some(s));
        }
        assert_eq!(State::parse("PROCESSING"), None);
    }
}
