//! Model-based test of the claim store (issue 8): proptest drives random
//! sequences of claims (same or other digest), settles (delivered or failed,
//! from the current attempt or a stale one), time moving past leases and
//! retentions, sweeps and operator releases over a few event IDs, against the
//! real store and against a tiny in-memory model built on the pure
//! `claim::decide` / `claim::settle`. Each claim is preceded by the read
//! the proxy makes first (`peek`, which SQLite may answer from its cache of
//! delivered records), and both must decide as the model does. After every step the store's records
//! must equal the model's, and the invariants are checked explicitly:
//!
//! - at most one live claim per event (a claim is never granted while another
//!   granted attempt still holds a live lease);
//! - `delivered` is final (only an operator's forced release or the sweeper,
//!   after retention, ends it), and no claim (no forward) is granted after it;
//! - a stale attempt never releases a newer claim;
//! - the sweeper never deletes a live lease (nor anything not yet expired).
//!
//! Time is logical: every store call names its `now`, so nothing sleeps.
//! SQLite runs on a temp file; PostgreSQL in a schema of its own (skipped
//! with a note outside CI when the server is not there). The seed is fixed
//! (override with `IDEMGATE_MODEL_SEED=<u64>`); `PROPTEST_CASES` scales the
//! case count.

use crate::common;

use std::sync::Arc;

use idemgate::claim::{
    self, AttemptEnd, ClaimKind, Current, Decision, Existing, Millis, Refusal, SettleResult, State,
};
use idemgate::store::{
    self, ClaimOutcome, ClaimRequest, ClaimStore, Record, ReleaseOutcome, SettleOutcome,
    SettleRequest, StoreError,
};
use proptest::prelude::*;
use proptest::test_runner::{
    Config as PtConfig, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner,
};

const T0: Millis = 1_700_000_000_000;
const LEASE: Millis = 10_000;
const RETENTION: Millis = 60_000;
const ROUTE: &str = "model";
const EVENTS: [&str; 3] = ["ev-a", "ev-b", "ev-c"];
const DIGESTS: [&str; 2] = [
    "1111111111111111111111111111111111111111111111111111111111111111",
    "2222222222222222222222222222222222222222222222222222222222222222",
];
/// Cases per backend unless `PROPTEST_CASES` says otherwise.
const DEFAULT_CASES: u32 = 256;

/// One step of a scenario.
#[derive(Debug, Clone)]
enum Op {
    /// A delivery arrives; `digest` 1 is "the same ID with another payload".
    Claim { ev: usize, digest: usize },
    /// An attempt ends. `back` = how many attempts behind the current one it
    /// is (0 = the attempt that holds the record now, more = a stale one).
    Settle { ev: usize, back: i64, end: End },
    /// Time passes.
    Advance(Millis),
    /// Time moves to just before / at / just after an event's lease end.
    ToLeaseEnd { ev: usize, offset: Millis },
    /// Time moves to just before / at / just after an event's expiry.
    ToExpiry { ev: usize, offset: Millis },
    /// One sweeper batch of at most `limit` rows.
    Sweep { limit: i64 },
    /// `idemgate events release [--force]`.
    Release { ev: usize, force: bool },
}

#[derive(Debug, Clone, Copy)]
enum End {
    Delivered(u16),
    /// An upstream status that does not settle, or `None` for a connect error or timeout.
    Failed(Option<u16>),
    /// An outcome idemgate cannot know, held (`on_ambiguous: hold`).
    Ambiguous,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let ev = 0..EVENTS.len();
    let end = prop_oneof![
        prop::sample::select(vec![200u16, 202, 204]).prop_map(End::Delivered),
        prop::sample::select(vec![Some(500u16), Some(503), Some(404), None]).prop_map(End::Failed),
        Just(End::Ambiguous),
    ];
    prop_oneof![
        6 => (ev.clone(), prop::bool::weighted(0.15))
            .prop_map(|(ev, other)| Op::Claim { ev, digest: usize::from(other) }),
        6 => (ev.clone(), prop_oneof![3 => Just(0i64), 2 => 1i64..3], end)
            .prop_map(|(ev, back, end)| Op::Settle { ev, back, end }),
        3 => prop_oneof![
            1i64..3_000,
            Just(LEASE),
            Just(LEASE + 1),
            Just(RETENTION + 1),
        ]
        .prop_map(Op::Advance),
        2 => (ev.clone(), -1i64..=1).prop_map(|(ev, offset)| Op::ToLeaseEnd { ev, offset }),
        1 => (ev.clone(), -1i64..=1).prop_map(|(ev, offset)| Op::ToExpiry { ev, offset }),
        2 => prop_oneof![Just(1i64), Just(2), Just(100)].prop_map(|limit| Op::Sweep { limit }),
        1 => (ev, prop::bool::weighted(0.3)).prop_map(|(ev, force)| Op::Release { ev, force }),
    ]
}

/// The model's record: the fields the claim protocol defines.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MRec {
    digest: usize,
    state: State,
    attempts: i64,
    lease_until: Option<Millis>,
    last_status: Option<i64>,
    first_seen_at: Millis,
    updated_at: Millis,
    delivered_at: Option<Millis>,
    expires_at: Millis,
}

impl MRec {
    /// A settle at `now`: the new state and last status, no lease, the
    /// retention counted from now.
    fn settle(&mut self, state: State, last_status: Option<i64>, now: Millis) {
        self.state = state;
        self.lease_until = None;
        self.last_status = last_status;
        self.updated_at = now;
        self.expires_at = now + RETENTION;
    }
}

/// A claim the store granted: an attempt that went (or would go) upstream.
#[derive(Debug, Clone)]
struct Grant {
    ev: usize,
    attempt: i64,
    lease_until: Millis,
    /// Still in progress as far as the protocol knows: not settled by itself,
    /// not superseded by a delivery, not released by an operator.
    open: bool,
}

/// What the scenarios exercised, printed at the end (a test that never
/// reaches a stale settle or a sweep of a record proves little).
#[derive(Debug, Default)]
struct Stats {
    claims_granted: usize,
    replays: usize,
    in_flight: usize,
    mismatches: usize,
    delivered: usize,
    released: usize,
    stale_settles: usize,
    stale_releases_refused: usize,
    /// Attempts held as ambiguous, by a settle or by an ended lease.
    held: usize,
    outcome_unknown: usize,
    swept: u64,
    operator_releases: usize,
}

struct Run<'a> {
    s: &'a dyn ClaimStore,
    /// The route's `on_ambiguous` is `hold` in this scenario.
    hold: bool,
    stats: &'a std::sync::Mutex<Stats>,
    now: Millis,
    model: [Option<MRec>; 3],
    grants: Vec<Grant>,
    /// The event is delivered and must stay so (until a forced release or the
    /// sweeper, after retention, ends the record).
    delivered_final: [bool; 3],
}

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

fn st<T>(r: Result<T, StoreError>, what: &str) -> Result<T, TestCaseError> {
    r.map_err(|e| fail(format!("{what}: store error {e}")))
}

impl Run<'_> {
    async fn get(&self, ev: usize) -> Result<Option<Record>, TestCaseError> {
        st(self.s.get(ROUTE, EVENTS[ev]).await, "get")
    }

    fn live_lease(&self, ev: usize) -> bool {
        self.model[ev].as_ref().is_some_and(|r| {
            r.state == State::Processing && r.lease_until.is_some_and(|l| l > self.now)
        })
    }

    fn close_grants(&mut self, ev: usize, attempt: Option<i64>) {
        for g in self
            .grants
            .iter_mut()
            .filter(|g| g.ev == ev && attempt.is_none_or(|a| a == g.attempt))
        {
            g.open = false;
        }
    }

    async fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Claim { ev, digest } => self.claim(ev, digest).await?,
            Op::Settle { ev, back, end } => self.settle(ev, back, end).await?,
            Op::Advance(d) => self.now += d,
            Op::ToLeaseEnd { ev, offset } => {
                if let Some(l) = self.model[ev].as_ref().and_then(|r| r.lease_until) {
                    self.now = self.now.max(l + offset);
                }
            }
            Op::ToExpiry { ev, offset } => {
                if let Some(r) = &self.model[ev] {
                    self.now = self.now.max(r.expires_at + offset);
                }
            }
            Op::Sweep { limit } => self.sweep(limit).await?,
            Op::Release { ev, force } => self.release(ev, force).await?,
        }
        self.compare().await
    }

    /// A delivery arrives: the read the proxy makes first, then the claim.
    async fn claim(&mut self, ev: usize, digest: usize) -> Result<(), TestCaseError> {
        let now = self.now;
        let existing = self.model[ev].as_ref().map(|r| Existing {
            state: r.state,
            lease_until: r.lease_until,
            same_digest: r.digest == digest,
        });
        let want = claim::decide(existing, now, self.hold);
        // The read the proxy makes first for an event it met lately
        // (on SQLite answered from the cache of delivered records
        // when it holds one) decides as the claim would, or defers.
        let peeked = st(
            common::peek(self.s, ROUTE, EVENTS[ev], DIGESTS[digest], now).await,
            "peek",
        )?;
        match (&want, peeked) {
            (Decision::Claim(_) | Decision::Hold, None) => {}
            (Decision::Refuse(want), Some(ClaimOutcome::Existing { decision, .. })) => {
                prop_assert_eq!(&decision, want, "decision of the read");
            }
            (want, peeked) => {
                return Err(fail(format!("read gave {peeked:?}, expected {want:?}")));
            }
        }
        let got = st(
            self.s
                .claim(&ClaimRequest {
                    route: ROUTE,
                    event_id: EVENTS[ev],
                    digest: DIGESTS[digest],
                    now,
                    lease_ms: LEASE,
                    retention_ms: RETENTION,
                    hold: self.hold,
                    instance: "test",
                    token: 0,
                    trace: None,
                })
                .await,
            "claim",
        )?;
        match (want, got) {
            (
                Decision::Claim(kind),
                ClaimOutcome::Claimed {
                    attempt,
                    kind: got_kind,
                    lease_until,
                    ..
                },
            ) => {
                self.granted(ev, digest, kind, attempt, got_kind, lease_until)?;
            }
            (Decision::Refuse(want), ClaimOutcome::Existing { decision, recorded }) => {
                prop_assert_eq!(decision, want, "decision on an existing record");
                {
                    let mut stats = self.stats.lock().unwrap();
                    match decision {
                        Refusal::Replay => stats.replays += 1,
                        Refusal::InFlight { .. } => stats.in_flight += 1,
                        Refusal::Mismatch => stats.mismatches += 1,
                        Refusal::OutcomeUnknown => stats.outcome_unknown += 1,
                    }
                }
                if decision == Refusal::Replay {
                    let rec = self.model[ev].as_ref().expect("replay of a known record");
                    prop_assert_eq!(
                        recorded.status.map(i64::from),
                        rec.last_status,
                        "replayed status"
                    );
                }
            }
            (
                Decision::Hold,
                ClaimOutcome::Existing {
                    decision: Refusal::OutcomeUnknown,
                    ..
                },
            ) => {
                // the lease ended under hold: the record waits for an operator
                let rec = self.model[ev].as_mut().expect("held a known record");
                rec.state = State::Ambiguous;
                rec.lease_until = None;
                rec.expires_at = now + (rec.expires_at - rec.updated_at);
                rec.updated_at = now;
                self.close_grants(ev, None);
                let mut stats = self.stats.lock().unwrap();
                stats.held += 1;
                stats.outcome_unknown += 1;
            }
            (want, got) => return Err(fail(format!("model decided {want:?}, store said {got:?}"))),
        }
        Ok(())
    }

    /// The store granted the claim the model decided on: the invariants, then the model follows.
    fn granted(
        &mut self,
        ev: usize,
        digest: usize,
        kind: ClaimKind,
        attempt: i64,
        got_kind: ClaimKind,
        lease_until: Millis,
    ) -> Result<(), TestCaseError> {
        let now = self.now;
        // Invariants: no forward after delivered; one live claim.
        prop_assert!(
            !self.delivered_final[ev],
            "a claim was granted on a delivered event"
        );
        if let Some(g) = self
            .grants
            .iter()
            .find(|g| g.ev == ev && g.open && g.lease_until > now)
        {
            return Err(fail(format!(
                "attempt {attempt} granted while attempt {} still holds a live lease (until {})",
                g.attempt, g.lease_until
            )));
        }
        let attempts = self.model[ev].as_ref().map_or(1, |r| r.attempts + 1);
        prop_assert_eq!(attempt, attempts, "attempt number");
        prop_assert_eq!(got_kind, kind, "claim kind");
        prop_assert_eq!(lease_until, now + LEASE, "lease end");
        let rec = self.model[ev].get_or_insert(MRec {
            digest,
            state: State::Processing,
            attempts: 0,
            lease_until: None,
            last_status: None,
            first_seen_at: now,
            updated_at: now,
            delivered_at: None,
            expires_at: now,
        });
        rec.state = State::Processing;
        rec.attempts = attempts;
        rec.lease_until = Some(now + LEASE);
        rec.updated_at = now;
        rec.expires_at = now + RETENTION;
        self.stats.lock().unwrap().claims_granted += 1;
        self.grants.push(Grant {
            ev,
            attempt,
            lease_until: now + LEASE,
            open: true,
        });
        Ok(())
    }

    /// An attempt ends.
    async fn settle(&mut self, ev: usize, back: i64, end: End) -> Result<(), TestCaseError> {
        let now = self.now;
        let current = self.model[ev].as_ref().map(|r| Current {
            state: r.state,
            attempts: r.attempts,
        });
        let attempt = current.map_or(1, |c| (c.attempts - back).max(1));
        let (pure_end, outcome) = match end {
            End::Delivered(status) => (
                AttemptEnd::Settled,
                SettleOutcome::Delivered {
                    status,
                    content_type: None,
                    body: None,
                    headers: None,
                },
            ),
            End::Failed(status) => (
                AttemptEnd::Failed,
                SettleOutcome::Failed {
                    status,
                    error: Some("upstream failed"),
                },
            ),
            End::Ambiguous => (
                AttemptEnd::Ambiguous,
                SettleOutcome::Ambiguous {
                    error: Some("timeout after the request was written"),
                },
            ),
        };
        let want = claim::settle(current, attempt, pure_end);
        let before = self.get(ev).await?;
        let got = st(
            self.s
                .settle(&SettleRequest {
                    route: ROUTE,
                    retention_ms: RETENTION,
                    ..crate::store_contract::settle_req(EVENTS[ev], attempt, now, outcome)
                })
                .await,
            "settle",
        )?;
        prop_assert_eq!(got, want, "settle result for attempt {}", attempt);
        // Invariant: a stale attempt never releases a newer claim.
        if let (AttemptEnd::Failed, Some(c)) = (pure_end, current) {
            if attempt < c.attempts {
                prop_assert_eq!(got, SettleResult::Stale, "stale release");
                self.stats.lock().unwrap().stale_releases_refused += 1;
            }
        }
        match got {
            SettleResult::Delivered => {
                let End::Delivered(status) = end else {
                    unreachable!()
                };
                let rec = self.model[ev].as_mut().expect("delivered a known record");
                rec.settle(State::Delivered, Some(i64::from(status)), now);
                rec.delivered_at = Some(now);
                self.delivered_final[ev] = true;
                self.close_grants(ev, None);
                self.stats.lock().unwrap().delivered += 1;
            }
            SettleResult::Released => {
                let End::Failed(status) = end else {
                    unreachable!()
                };
                let rec = self.model[ev].as_mut().expect("released a known record");
                rec.settle(State::Failed, status.map(i64::from), now);
                self.close_grants(ev, Some(attempt));
                self.stats.lock().unwrap().released += 1;
            }
            SettleResult::Ambiguous => {
                let rec = self.model[ev].as_mut().expect("held a known record");
                rec.settle(State::Ambiguous, None, now);
                self.close_grants(ev, Some(attempt));
                self.stats.lock().unwrap().held += 1;
            }
            SettleResult::Stale => {
                self.stats.lock().unwrap().stale_settles += 1;
                let after = self.get(ev).await?;
                prop_assert_eq!(after, before, "a stale settle changed the record");
            }
        }
        Ok(())
    }

    /// One sweeper batch of at most `limit` rows.
    async fn sweep(&mut self, limit: i64) -> Result<(), TestCaseError> {
        let now = self.now;
        let eligible: Vec<usize> = (0..EVENTS.len())
            .filter(|&ev| {
                self.model[ev]
                    .as_ref()
                    .is_some_and(|r| r.expires_at <= now && !self.live_lease(ev))
            })
            .collect();
        let n = st(self.s.sweep_batch(now, limit).await, "sweep")?;
        prop_assert_eq!(
            n,
            (eligible.len() as u64).min(limit as u64),
            "rows swept (eligible: {:?})",
            eligible
        );
        let mut deleted = 0;
        #[allow(clippy::needless_range_loop)] // `ev` also indexes the store
        for ev in 0..EVENTS.len() {
            if self.model[ev].is_none() {
                continue;
            }
            let present = self.get(ev).await?.is_some();
            if !eligible.contains(&ev) {
                // Invariant: never a live lease, never an unexpired record.
                prop_assert!(
                    present,
                    "the sweeper deleted {} (live lease: {})",
                    EVENTS[ev],
                    self.live_lease(ev)
                );
            } else if !present {
                deleted += 1;
                self.model[ev] = None;
                self.delivered_final[ev] = false;
                self.close_grants(ev, None);
            }
        }
        prop_assert_eq!(deleted, n, "records gone after the sweep");
        self.stats.lock().unwrap().swept += n;
        Ok(())
    }

    /// `idemgate events release [--force]`.
    async fn release(&mut self, ev: usize, force: bool) -> Result<(), TestCaseError> {
        let now = self.now;
        let want = match &self.model[ev] {
            None => ReleaseOutcome::NotFound,
            Some(r) if r.state == State::Delivered && !force => ReleaseOutcome::RefusedDelivered,
            Some(r) => ReleaseOutcome::Released { previous: r.state },
        };
        let got = st(
            self.s
                .release(&common::release_req(ROUTE, EVENTS[ev], force, now))
                .await,
            "release",
        )?;
        prop_assert_eq!(got, want, "operator release");
        if let ReleaseOutcome::Released { .. } = got {
            let rec = self.model[ev].as_mut().expect("released a known record");
            rec.expires_at = now + (rec.expires_at - rec.updated_at);
            rec.updated_at = now;
            rec.state = State::Failed;
            rec.lease_until = None;
            // An operator's override: the attempt in progress, if
            // any, no longer holds the claim.
            self.delivered_final[ev] = false;
            self.close_grants(ev, None);
            self.stats.lock().unwrap().operator_releases += 1;
        }
        Ok(())
    }

    /// Store and model agree on every event.
    async fn compare(&self) -> Result<(), TestCaseError> {
        #[allow(clippy::needless_range_loop)] // `ev` also indexes the store
        for ev in 0..EVENTS.len() {
            let got = self.get(ev).await?;
            let want = &self.model[ev];
            match (got, want) {
                (None, None) => {}
                (Some(r), Some(m)) => {
                    let as_model = MRec {
                        digest: DIGESTS
                            .iter()
                            .position(|d| *d == r.body_sha256)
                            .ok_or_else(|| fail(format!("unknown digest {}", r.body_sha256)))?,
                        state: r.state,
                        attempts: r.attempts,
                        lease_until: r.lease_until,
                        last_status: r.last_status,
                        first_seen_at: r.first_seen_at,
                        updated_at: r.updated_at,
                        delivered_at: r.delivered_at,
                        expires_at: r.expires_at,
                    };
                    prop_assert_eq!(&as_model, m, "record {} at now={}", EVENTS[ev], self.now);
                }
                (got, want) => {
                    return Err(fail(format!(
                        "{}: store has {got:?}, model has {want:?}",
                        EVENTS[ev]
                    )))
                }
            }
            if self.delivered_final[ev] {
                let state = self.model[ev].as_ref().map(|r| r.state);
                prop_assert_eq!(state, Some(State::Delivered), "delivered is final");
            }
        }
        Ok(())
    }
}

/// Empties the store between cases: at the end of time every record is
/// expired and no lease is live.
async fn reset(s: &dyn ClaimStore) {
    while s
        .sweep_batch(Millis::MAX, 10_000)
        .await
        .expect("reset sweep")
        > 0
    {}
}

fn runner(tag: &str) -> TestRunner {
    let seed: u64 = std::env::var("IDEMGATE_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x1de6_a7e0_0008);
    eprintln!("{tag}: model seed {seed} (IDEMGATE_MODEL_SEED)");
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    let config = PtConfig {
        cases,
        failure_persistence: None,
        max_shrink_time: 30_000,
        ..PtConfig::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes))
}

fn run_model(tag: &str, rt: &tokio::runtime::Runtime, store: Arc<dyn ClaimStore>) {
    let started = std::time::Instant::now();
    let mut runner = runner(tag);
    let steps = std::sync::atomic::AtomicUsize::new(0);
    let stats = std::sync::Mutex::new(Stats::default());
    let scenario = (any::<bool>(), prop::collection::vec(op_strategy(), 1..64));
    let result = runner.run(&scenario, |(hold, ops)| {
        rt.block_on(async {
            reset(&*store).await;
            let mut run = Run {
                s: &*store,
                hold,
                stats: &stats,
                now: T0,
                model: [None, None, None],
                grants: Vec::new(),
                delivered_final: [false; 3],
            };
            for (i, op) in ops.iter().enumerate() {
                run.step(op)
                    .await
                    .map_err(|e| fail(format!("step {i} {op:?} (now={}): {e}", run.now)))?;
            }
            steps.fetch_add(ops.len(), std::sync::atomic::Ordering::Relaxed);
            Ok(())
        })
    });
    let stats = stats.into_inner().unwrap();
    eprintln!(
        "{tag}: {} steps in {:.1?}; {stats:?}",
        steps.into_inner(),
        started.elapsed(),
    );
    match result {
        // the scenarios reached the ambiguous state both ways, and met it
        Ok(()) => assert!(
            stats.held > 0 && stats.outcome_unknown > 0,
            "{tag}: no scenario held an ambiguous outcome: {stats:?}"
        ),
        Err(TestError::Fail(why, ops)) => {
            panic!("{tag}: the store disagrees with the model: {why}\nminimal scenario: {ops:#?}")
        }
        Err(e) => panic!("{tag}: {e}"),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn sqlite_store_agrees_with_the_model() {
    let rt = runtime();
    let dir = common::TempDir::new("model");
    let url = dir.sqlite_url("model.db");
    let store = rt.block_on(async {
        let s = store::open(&url, 2).await.expect("open sqlite");
        s.migrate().await.expect("migrate sqlite");
        s
    });
    run_model("sqlite", &rt, store.clone());
    rt.block_on(store.close());
}

#[test]
fn postgres_store_agrees_with_the_model() {
    let Some(base) = common::pg_url() else {
        return;
    };
    // dropped when the test ends, pass or fail
    let schema = common::PgSchema::create(&base, "model");
    let url = schema.url();
    let rt = runtime();
    let store = rt.block_on(async {
        let s = store::open(&url, 4).await.expect("open postgres");
        s.migrate().await.expect("migrate postgres");
        s
    });
    run_model("postgres", &rt, store.clone());
    rt.block_on(store.close());
}
