//! The store contract (SPEC §3, §6), written once and run against every
//! backend: `sqlite::*` on a fresh file in a temp dir, `postgres::*` in a
//! fresh schema of the PostgreSQL test database (skipped with a note outside
//! CI when PostgreSQL is not there), `memory::*` on the in-memory reference
//! model (`store::memory`). Time is logical: every call names its
//! `now`, so nothing here sleeps.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use idemgate::claim::{self, ClaimKind, Decision, Existing, Millis, Refusal, SettleResult, State};
use idemgate::store::{
    self, ClaimOutcome, ClaimRequest, ClaimStore, ListFilter, Record, Recorded, ReleaseOutcome,
    ReplayHeaders, Resolution, ResolveOutcome, ResolveRequest, SettleOutcome, SettleRequest,
    TraceRef,
};

const T0: Millis = 1_700_000_000_000;
const LEASE: Millis = 10_000;
const RETENTION: Millis = 86_400_000;
const R: &str = "r";
const D1: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const D2: &str = "2222222222222222222222222222222222222222222222222222222222222222";

/// One backend under test; what it created goes away on drop.
pub struct Backend {
    pub store: Arc<dyn ClaimStore>,
    /// The same database for raw SQL (PostgreSQL only).
    pub url: String,
    _dir: Option<common::TempDir>,
    _schema: Option<common::PgSchema>,
}

async fn sqlite_backend() -> Backend {
    let dir = common::TempDir::new("contract");
    let url = dir.sqlite_url("contract.db");
    let store = store::open(&url, 4).await.expect("open sqlite");
    store.migrate().await.expect("migrate sqlite");
    Backend {
        store,
        url,
        _dir: Some(dir),
        _schema: None,
    }
}

/// A server that every case of one valkey module shares (`start`ed once
/// into `server`; its nodes die with the test process), and the `turn`
/// that keeps the cases apart: each flushes it first. Its URL.
async fn valkey_turn_on(
    server: &'static std::sync::OnceLock<Option<common::valkey::Valkey>>,
    turn: &'static tokio::sync::Mutex<()>,
    start: fn() -> Option<common::valkey::Valkey>,
) -> Option<(tokio::sync::MutexGuard<'static, ()>, String)> {
    let turn = turn.lock().await;
    let url = tokio::task::spawn_blocking(move || {
        server.get_or_init(start).as_ref().map(|v| {
            v.flush();
            v.url("replicas=1")
        })
    })
    .await
    .unwrap()?;
    Some((turn, url))
}

/// The 3-shard cluster every valkey case shares.
async fn valkey_turn() -> Option<(tokio::sync::MutexGuard<'static, ()>, String)> {
    static CLUSTER: std::sync::OnceLock<Option<common::valkey::Valkey>> =
        std::sync::OnceLock::new();
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    valkey_turn_on(&CLUSTER, &TURN, || {
        common::valkey::Valkey::cluster("contract")
    })
    .await
}

/// A server not in cluster mode with one replica (SPEC §18: "used as one
/// shard"), shared by the `valkey_single` cases as the cluster is above.
async fn valkey_single_turn() -> Option<(tokio::sync::MutexGuard<'static, ()>, String)> {
    static SERVER: std::sync::OnceLock<Option<common::valkey::Valkey>> = std::sync::OnceLock::new();
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    valkey_turn_on(&SERVER, &TURN, || {
        common::valkey::Valkey::single("contract-single", 1)
    })
    .await
}

async fn valkey_backend(url: String) -> Backend {
    let store = store::open(&url, 4).await.expect("open valkey");
    store.migrate().await.expect("migrate valkey");
    Backend {
        store,
        url,
        _dir: None,
        _schema: None,
    }
}

async fn postgres_backend() -> Option<Backend> {
    let base = common::pg_url()?;
    let schema = common::PgSchema::create(&base, "contract");
    let url = schema.url();
    let store = store::open(&url, 8).await.expect("open postgres");
    store.migrate().await.expect("migrate postgres");
    Some(Backend {
        store,
        url,
        _dir: None,
        _schema: Some(schema),
    })
}

fn claim_req<'a>(event_id: &'a str, digest: &'a str, now: Millis) -> ClaimRequest<'a> {
    ClaimRequest {
        route: R,
        event_id,
        digest,
        now,
        lease_ms: LEASE,
        retention_ms: RETENTION,
        hold: false,
        instance: "test",
        token: 0,
        trace: None,
    }
}

async fn claim(s: &dyn ClaimStore, event_id: &str, digest: &str, now: Millis) -> ClaimOutcome {
    s.claim(&claim_req(event_id, digest, now))
        .await
        .expect("claim")
}

/// Claims and insists on owning it; returns the attempt.
async fn own(s: &dyn ClaimStore, event_id: &str, now: Millis) -> i64 {
    match claim(s, event_id, D1, now).await {
        ClaimOutcome::Claimed { attempt, .. } => attempt,
        other => panic!("{event_id} at {now}: expected a claim, got {other:?}"),
    }
}

async fn settle(
    s: &dyn ClaimStore,
    event_id: &str,
    attempt: i64,
    now: Millis,
    outcome: SettleOutcome<'_>,
) -> SettleResult {
    s.settle(&settle_req(event_id, attempt, now, outcome))
        .await
        .expect("settle")
}

pub(crate) fn settle_req<'a>(
    event_id: &'a str,
    attempt: i64,
    now: Millis,
    outcome: SettleOutcome<'a>,
) -> SettleRequest<'a> {
    SettleRequest {
        route: R,
        event_id,
        attempt,
        now,
        retention_ms: RETENTION,
        outcome,
        started_at: 0,
        instance: "test",
        attempt_error: None,
    }
}

/// Claims a fresh `event_id` at `now` and settles it then with `outcome`,
/// both with `retention_ms`.
async fn claim_and_settle(
    s: &dyn ClaimStore,
    event_id: &str,
    now: Millis,
    retention_ms: Millis,
    outcome: SettleOutcome<'_>,
) {
    let claim = ClaimRequest {
        retention_ms,
        ..claim_req(event_id, D1, now)
    };
    assert_claimed(&s.claim(&claim).await.unwrap(), 1, ClaimKind::New);
    s.settle(&SettleRequest {
        retention_ms,
        ..settle_req(event_id, 1, now, outcome)
    })
    .await
    .unwrap();
}

/// `out` is a claim of attempt `attempt`, of kind `kind`.
#[track_caller]
fn assert_claimed(out: &ClaimOutcome, attempt: i64, kind: ClaimKind) {
    assert!(
        matches!(out, ClaimOutcome::Claimed { attempt: a, kind: k, .. } if (*a, *k) == (attempt, kind)),
        "expected attempt {attempt} ({kind:?}), got {out:?}"
    );
}

fn delivered(status: u16) -> SettleOutcome<'static> {
    SettleOutcome::Delivered {
        status,
        content_type: None,
        body: None,
        headers: None,
    }
}

fn failed(status: Option<u16>) -> SettleOutcome<'static> {
    SettleOutcome::Failed {
        status,
        error: Some("upstream answered badly"),
    }
}

async fn get(s: &dyn ClaimStore, event_id: &str) -> Record {
    s.get(R, event_id)
        .await
        .expect("get")
        .unwrap_or_else(|| panic!("{event_id}: no record"))
}

/// An operator release (`force` for a delivered record) of `event_id`.
async fn release(s: &dyn ClaimStore, event_id: &str, force: bool, now: Millis) -> ReleaseOutcome {
    s.release(&common::release_req(R, event_id, force, now))
        .await
        .unwrap()
}

/// The record is held: the claim is answered outcome-unknown.
fn assert_outcome_unknown(out: &ClaimOutcome) {
    assert!(
        matches!(
            out,
            ClaimOutcome::Existing {
                decision: Refusal::OutcomeUnknown,
                ..
            }
        ),
        "{out:?}"
    );
}

/// A send (SPEC §19) told apart by `n`: trace ID and span ID all `n`.
fn send(n: u8) -> TraceRef {
    TraceRef {
        trace_id: [n; 16],
        span_id: [n; 8],
    }
}

fn decision_of(outcome: &ClaimOutcome) -> Decision {
    match outcome {
        ClaimOutcome::Claimed { kind, .. } => Decision::Claim(*kind),
        ClaimOutcome::Existing { decision, .. } => Decision::Refuse(*decision),
    }
}

/// Each case is an async fn over `Arc<dyn ClaimStore>`; `contract!` runs it
/// once per backend.
mod cases {
    use super::*;

    /// SPEC §22: the delivered settle keeps the replayed headers (with or
    /// without a body), every replay gets them back in order (a header
    /// twice is two values), a failed settle keeps none, and a record
    /// delivered without them replays without them.
    // long: both records (without and with a body) go through the same
    // steps in one loop, then the record delivered without headers
    pub async fn replay_headers_kept_with_the_record(b: &Backend) {
        let s = &*b.store;
        let kept = ReplayHeaders::new([
            ("location", &b"/orders/17"[..]),
            ("etag", &b"\"v1\""[..]),
            ("link", &b"</a>; rel=a"[..]),
            ("link", &b"</b>; rel=b"[..]),
        ])
        .unwrap();
        let pairs: Vec<(&str, &str)> = kept.iter().collect();
        assert_eq!(
            pairs,
            [
                ("location", "/orders/17"),
                ("etag", "\"v1\""),
                ("link", "</a>; rel=a"),
                ("link", "</b>; rel=b")
            ]
        );
        let replayed = |status, body: Option<&[u8]>, headers| ClaimOutcome::Existing {
            decision: Refusal::Replay,
            recorded: Recorded {
                status: Some(status),
                content_type: body.map(|_| "text/plain".into()),
                body: body.map(<[u8]>::to_vec),
                headers,
                trace: None,
            },
        };
        for (id, body) in [("h-plain", None), ("h-body", Some(&b"made"[..]))] {
            // a failed attempt first: it keeps nothing
            let a = own(s, id, T0).await;
            settle(s, id, a, T0 + 1, failed(Some(500))).await;
            let a = match claim(s, id, D1, T0 + 2).await {
                ClaimOutcome::Claimed { attempt, .. } => attempt,
                other => panic!("{other:?}"),
            };
            let outcome = SettleOutcome::Delivered {
                status: 201,
                content_type: body.map(|_| "text/plain"),
                body,
                headers: Some(&kept),
            };
            assert_eq!(
                settle(s, id, a, T0 + 3, outcome).await,
                SettleResult::Delivered
            );
            for now in [T0 + 4, T0 + 5] {
                assert_eq!(
                    claim(s, id, D1, now).await,
                    replayed(201, body, Some(kept.clone())),
                    "{id}"
                );
            }
            // a late settle of another attempt changes nothing
            let late = SettleOutcome::Delivered {
                status: 200,
                content_type: None,
                body: None,
                headers: None,
            };
            assert_eq!(
                settle(s, id, a + 1, T0 + 6, late).await,
                SettleResult::Stale
            );
            assert_eq!(
                claim(s, id, D1, T0 + 7).await,
                replayed(201, body, Some(kept.clone()))
            );
        }
        let a = own(s, "h-none", T0).await;
        settle(s, "h-none", a, T0 + 1, delivered(200)).await;
        assert_eq!(
            claim(s, "h-none", D1, T0 + 2).await,
            replayed(200, None, None)
        );
    }

    /// SPEC §19: the record keeps its latest send, the one of the last
    /// claim that won (none when that claim's send was not traced). Every
    /// refusal (replay, in flight, mismatch, outcome unknown) and a peek
    /// carry it, a reclaim answers the one it replaced, a new record
    /// replaced none; settles, releases and resolves leave it; `get`, `list`
    /// and `show` print its IDs.
    // long: one record through every step, then the delivered, released
    // and held ones
    pub async fn links_follow_the_latest_send(b: &Backend) {
        let s = &*b.store;
        let (t1, t2, t3) = (send(1), send(2), send(3));
        let traced = |id, digest, now, trace| ClaimRequest {
            trace,
            ..claim_req(id, digest, now)
        };
        let link = |out: ClaimOutcome| match out {
            ClaimOutcome::Existing { recorded, .. } => recorded.trace,
            other => panic!("expected a refusal, got {other:?}"),
        };
        let previous = |out: ClaimOutcome| match out {
            ClaimOutcome::Claimed { previous, .. } => previous,
            other => panic!("expected a claim, got {other:?}"),
        };
        let ids = |rec: &Record| (rec.trace_id.clone(), rec.span_id.clone());
        let hex = |t: TraceRef| (Some(t.trace_hex()), Some(t.span_hex()));

        // a new record: its send is the latest, it replaced none
        let out = s.claim(&traced("t", D1, T0, Some(t1))).await.unwrap();
        assert_claimed(&out, 1, ClaimKind::New);
        assert_eq!(previous(out), None);
        assert_eq!(ids(&get(s, "t").await), hex(t1));
        // a duplicate in flight, and another digest, link to it
        let dup = traced("t", D1, T0 + 1, Some(t2));
        assert_eq!(link(s.claim(&dup).await.unwrap()), Some(t1), "409");
        assert_eq!(link(s.peek(&dup).await.unwrap().unwrap()), Some(t1));
        let other = traced("t", D2, T0 + 2, Some(t2));
        assert_eq!(link(s.claim(&other).await.unwrap()), Some(t1), "422");
        // a failed settle leaves it; the reclaim replaces it
        settle(s, "t", 1, T0 + 3, failed(Some(500))).await;
        assert_eq!(ids(&get(s, "t").await), hex(t1), "after a failed settle");
        let out = s.claim(&traced("t", D1, T0 + 4, Some(t2))).await.unwrap();
        assert_claimed(&out, 2, ClaimKind::RetryFailed);
        assert_eq!(previous(out), Some(t1));
        assert_eq!(ids(&get(s, "t").await), hex(t2));
        // a claim without a send: the record keeps none
        settle(s, "t", 2, T0 + 5, failed(None)).await;
        let out = s.claim(&traced("t", D1, T0 + 6, None)).await.unwrap();
        assert_claimed(&out, 3, ClaimKind::RetryFailed);
        assert_eq!(previous(out), Some(t2));
        assert_eq!(ids(&get(s, "t").await), (None, None));
        let dup = traced("t", D1, T0 + 7, Some(t3));
        assert_eq!(link(s.claim(&dup).await.unwrap()), None, "none kept");
        // an ended lease's takeover answers the send it replaced (none)
        let out = s
            .claim(&traced("t", D1, T0 + 6 + LEASE, Some(t3)))
            .await
            .unwrap();
        assert_claimed(&out, 4, ClaimKind::RetryExpired);
        assert_eq!(previous(out), None);
        let out = s
            .claim(&traced("t", D1, T0 + 6 + 2 * LEASE, Some(t1)))
            .await
            .unwrap();
        assert_claimed(&out, 5, ClaimKind::RetryExpired);
        assert_eq!(previous(out), Some(t3));

        // delivered: every duplicate links to the send that delivered it,
        // from a read or from whatever an engine keeps in hand
        let out = s.claim(&traced("d", D1, T0, Some(t1))).await.unwrap();
        assert_eq!(previous(out), None);
        settle(s, "d", 1, T0 + 1, delivered(200)).await;
        for now in [T0 + 2, T0 + 3] {
            let dup = traced("d", D1, now, Some(t2));
            let out = s.claim(&dup).await.unwrap();
            assert_eq!(decision_of(&out), Decision::Refuse(Refusal::Replay));
            assert_eq!(link(out), Some(t1), "replay");
            assert_eq!(link(s.peek(&dup).await.unwrap().unwrap()), Some(t1));
            let other = traced("d", D2, now, Some(t2));
            assert_eq!(link(s.claim(&other).await.unwrap()), Some(t1), "422");
        }
        let shown = s.show(R, "d").await.unwrap().unwrap();
        assert_eq!(ids(&shown), hex(t1));
        let listed = s
            .list(&ListFilter {
                route: Some(R.into()),
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap();
        let of = |id: &str| ids(listed.iter().find(|r| r.event_id == id).unwrap());
        assert_eq!(of("d"), hex(t1));
        assert_eq!(of("t"), hex(t1));
        // an operator's release leaves it; the next claim replaces it
        assert!(matches!(
            release(s, "d", true, T0 + 4).await,
            ReleaseOutcome::Released { .. }
        ));
        assert_eq!(ids(&get(s, "d").await), hex(t1), "after a release");
        let out = s.claim(&traced("d", D1, T0 + 5, Some(t3))).await.unwrap();
        assert_claimed(&out, 2, ClaimKind::RetryFailed);
        assert_eq!(previous(out), Some(t1));

        // held: the outcome-unknown answer links to the send whose outcome
        // is unknown, and a resolve leaves it
        let held = |now, trace| ClaimRequest {
            hold: true,
            ..traced("h", D1, now, trace)
        };
        s.claim(&held(T0, Some(t2))).await.unwrap();
        for now in [T0 + LEASE, T0 + LEASE + 1] {
            let out = s.claim(&held(now, Some(t3))).await.unwrap();
            assert_outcome_unknown(&out);
            assert_eq!(link(out), Some(t2));
        }
        let resolve = ResolveRequest {
            route: R,
            event_id: "h",
            how: Resolution::Failed,
            now: T0 + LEASE + 2,
        };
        assert_eq!(s.resolve(&resolve).await.unwrap(), ResolveOutcome::Resolved);
        assert_eq!(ids(&get(s, "h").await), hex(t2), "after a resolve");
        let out = s.claim(&held(T0 + LEASE + 3, None)).await.unwrap();
        assert_eq!(previous(out), Some(t2));
        assert_eq!(ids(&get(s, "h").await), (None, None));
    }

    pub async fn new_claim(b: &Backend) {
        let s = &*b.store;
        let out = claim(s, "e1", D1, T0).await;
        assert_eq!(
            out,
            ClaimOutcome::Claimed {
                attempt: 1,
                kind: ClaimKind::New,
                lease_until: T0 + LEASE,
                previous: None,
            }
        );
        let rec = get(s, "e1").await;
        let want = Record::claimed(&claim_req("e1", D1, T0));
        assert_eq!(rec, want);
        assert_eq!(rec.state, State::Processing);
        assert_eq!(s.get(R, "absent").await.unwrap(), None);
        assert_eq!(s.get("other-route", "e1").await.unwrap(), None);
        // Event IDs are scoped by route: the same ID elsewhere is a new claim.
        let other = s
            .claim(&ClaimRequest {
                route: "other-route",
                ..claim_req("e1", D2, T0)
            })
            .await
            .unwrap();
        assert_claimed(&other, 1, ClaimKind::New);
    }

    pub async fn replay_of_delivered(b: &Backend) {
        let s = &*b.store;
        let a = own(s, "plain", T0).await;
        assert_eq!(
            settle(s, "plain", a, T0 + 5, delivered(202)).await,
            SettleResult::Delivered
        );
        let rec = get(s, "plain").await;
        assert_eq!(rec.state, State::Delivered);
        assert_eq!(rec.last_status, Some(202));
        assert_eq!(rec.delivered_at, Some(T0 + 5));
        assert_eq!(rec.lease_until, None);
        assert_eq!(rec.replay_body_bytes, None);
        for now in [T0 + 6, T0 + LEASE * 100] {
            assert_eq!(
                claim(s, "plain", D1, now).await,
                ClaimOutcome::Existing {
                    decision: Refusal::Replay,
                    recorded: Recorded {
                        status: Some(202),
                        content_type: None,
                        body: None,
                        headers: None,
                        trace: None,
                    }
                }
            );
        }

        // With replay_body: status, content type and body come back.
        let a = own(s, "with-body", T0).await;
        let body = br#"{"ok":true}"#;
        let r = settle(
            s,
            "with-body",
            a,
            T0 + 7,
            SettleOutcome::Delivered {
                status: 201,
                content_type: Some("application/json"),
                body: Some(body),
                headers: None,
            },
        )
        .await;
        assert_eq!(r, SettleResult::Delivered);
        let rec = get(s, "with-body").await;
        assert_eq!(rec.replay_status, Some(201));
        assert_eq!(rec.replay_content_type.as_deref(), Some("application/json"));
        assert_eq!(rec.replay_body_bytes, Some(body.len() as i64));
        assert_eq!(
            claim(s, "with-body", D1, T0 + 8).await,
            ClaimOutcome::Existing {
                decision: Refusal::Replay,
                recorded: Recorded {
                    status: Some(201),
                    content_type: Some("application/json".into()),
                    body: Some(body.to_vec()),
                    headers: None,
                    trace: None,
                }
            }
        );

        // An empty stored body is a body, not an absent one.
        let a = own(s, "empty-body", T0).await;
        let r = settle(
            s,
            "empty-body",
            a,
            T0 + 9,
            SettleOutcome::Delivered {
                status: 204,
                content_type: None,
                body: Some(b""),
                headers: None,
            },
        )
        .await;
        assert_eq!(r, SettleResult::Delivered);
        let ClaimOutcome::Existing { recorded, .. } = claim(s, "empty-body", D1, T0 + 10).await
        else {
            panic!("expected a replay")
        };
        assert_eq!(recorded.status, Some(204));
        assert_eq!(recorded.body.as_deref(), Some(&b""[..]));
    }

    pub async fn mismatch_in_every_state(b: &Backend) {
        let s = &*b.store;
        // processing, lease live
        own(s, "live", T0).await;
        // processing, lease expired (probed after the lease)
        own(s, "expired", T0).await;
        // failed
        let a = own(s, "failed", T0).await;
        settle(s, "failed", a, T0 + 1, failed(Some(500))).await;
        // delivered
        let a = own(s, "delivered", T0).await;
        settle(s, "delivered", a, T0 + 1, delivered(200)).await;
        // failed by an operator's release
        own(s, "released", T0).await;
        release(s, "released", false, T0 + 1).await;

        for (id, now) in [
            ("live", T0 + 1),
            ("expired", T0 + LEASE + 1),
            ("failed", T0 + 2),
            ("delivered", T0 + 2),
            ("released", T0 + 2),
        ] {
            let before = get(s, id).await;
            let out = claim(s, id, D2, now).await;
            assert!(
                matches!(
                    out,
                    ClaimOutcome::Existing {
                        decision: Refusal::Mismatch,
                        ..
                    }
                ),
                "{id}: {out:?}"
            );
            assert_eq!(get(s, id).await, before, "{id}: a mismatch changes nothing");
        }
    }

    pub async fn in_flight_with_retry_after(b: &Backend) {
        let s = &*b.store;
        own(s, "e", T0).await;
        let before = get(s, "e").await;
        for (now, left) in [
            (T0, LEASE),
            (T0 + 2_500, LEASE - 2_500),
            (T0 + LEASE - 1, 1),
        ] {
            let out = claim(s, "e", D1, now).await;
            assert_eq!(
                decision_of(&out),
                Decision::Refuse(Refusal::InFlight {
                    retry_after_ms: left
                }),
                "at +{}",
                now - T0
            );
        }
        assert_eq!(get(s, "e").await, before, "refusals change nothing");
    }

    pub async fn reclaim_after_lease_expiry(b: &Backend) {
        let s = &*b.store;
        own(s, "e", T0).await;
        // A lease that ends exactly now is over.
        let t1 = T0 + LEASE;
        assert_eq!(
            claim(s, "e", D1, t1).await,
            ClaimOutcome::Claimed {
                attempt: 2,
                kind: ClaimKind::RetryExpired,
                lease_until: t1 + LEASE,
                previous: None,
            }
        );
        let t2 = t1 + LEASE + 3;
        assert_eq!(
            claim(s, "e", D1, t2).await,
            ClaimOutcome::Claimed {
                attempt: 3,
                kind: ClaimKind::RetryExpired,
                lease_until: t2 + LEASE,
                previous: None,
            }
        );
        let rec = get(s, "e").await;
        assert_eq!(
            (rec.state, rec.attempts, rec.lease_until, rec.first_seen_at),
            (State::Processing, 3, Some(t2 + LEASE), T0)
        );
    }

    pub async fn reclaim_after_release(b: &Backend) {
        let s = &*b.store;
        let a1 = own(s, "e", T0).await;
        assert_eq!(
            settle(s, "e", a1, T0 + 10, failed(Some(503))).await,
            SettleResult::Released
        );
        let rec = get(s, "e").await;
        assert_eq!(rec.state, State::Failed);
        assert_eq!(rec.lease_until, None);
        assert_eq!(rec.last_status, Some(503));
        assert_eq!(rec.last_error.as_deref(), Some("upstream answered badly"));
        // Reclaimable at once, long before the old lease would have ended.
        assert_eq!(
            claim(s, "e", D1, T0 + 11).await,
            ClaimOutcome::Claimed {
                attempt: 2,
                kind: ClaimKind::RetryFailed,
                lease_until: T0 + 11 + LEASE,
                previous: None,
            }
        );
        // A connect error or timeout releases too, with no status.
        let r = settle(
            s,
            "e",
            2,
            T0 + 12,
            SettleOutcome::Failed {
                status: None,
                error: Some("connection refused"),
            },
        )
        .await;
        assert_eq!(r, SettleResult::Released);
        let rec = get(s, "e").await;
        assert_eq!(
            (rec.last_status, rec.last_error.as_deref()),
            (None, Some("connection refused"))
        );
        let out = claim(s, "e", D1, T0 + 13).await;
        assert_claimed(&out, 3, ClaimKind::RetryFailed);
        // After a delivery, the last error is gone.
        settle(s, "e", 3, T0 + 14, delivered(200)).await;
        let rec = get(s, "e").await;
        assert_eq!(
            (rec.state, rec.last_status, rec.last_error),
            (State::Delivered, Some(200), None)
        );
    }

    pub async fn fenced_release(b: &Backend) {
        let s = &*b.store;
        let a1 = own(s, "e", T0).await;
        let t2 = T0 + LEASE + 1;
        let a2 = own(s, "e", t2).await;
        assert_eq!((a1, a2), (1, 2));
        // The stale attempt cannot release the newer claim.
        assert_eq!(
            settle(s, "e", a1, t2 + 5, failed(Some(500))).await,
            SettleResult::Stale
        );
        let rec = get(s, "e").await;
        assert_eq!(
            (rec.state, rec.attempts, rec.lease_until, rec.updated_at),
            (State::Processing, 2, Some(t2 + LEASE), t2)
        );
        assert_eq!(
            decision_of(&claim(s, "e", D1, t2 + 6).await),
            Decision::Refuse(Refusal::InFlight {
                retry_after_ms: LEASE - 6
            })
        );
        // A future attempt number cannot either.
        assert_eq!(
            settle(s, "e", 3, t2 + 7, failed(None)).await,
            SettleResult::Stale
        );
        // The owner can.
        assert_eq!(
            settle(s, "e", a2, t2 + 8, failed(Some(500))).await,
            SettleResult::Released
        );
        // Releasing twice is stale: the record is failed now.
        assert_eq!(
            settle(s, "e", a2, t2 + 9, failed(Some(500))).await,
            SettleResult::Stale
        );
    }

    pub async fn delivered_from_a_stale_attempt_wins(b: &Backend) {
        let s = &*b.store;
        let a1 = own(s, "e", T0).await;
        let t2 = T0 + LEASE + 1;
        let a2 = own(s, "e", t2).await;
        assert_eq!(
            settle(s, "e", a1, t2 + 5, delivered(200)).await,
            SettleResult::Delivered
        );
        let rec = get(s, "e").await;
        assert_eq!(
            (rec.state, rec.lease_until, rec.delivered_at),
            (State::Delivered, None, Some(t2 + 5))
        );
        // Delivered is final: the newer attempt neither releases nor re-delivers it.
        for (now, outcome) in [(t2 + 6, failed(Some(500))), (t2 + 7, delivered(201))] {
            let r = settle(s, "e", a2, now, outcome).await;
            assert_eq!(r, SettleResult::Stale, "attempt {a2} at {now}");
        }
        let rec = get(s, "e").await;
        assert_eq!(
            (rec.state, rec.last_status, rec.delivered_at),
            (State::Delivered, Some(200), Some(t2 + 5))
        );
        // ... and it also wins over a release that got there first.
        let a1 = own(s, "f", T0).await;
        settle(s, "f", a1, T0 + 1, failed(Some(500))).await;
        assert_eq!(
            settle(s, "f", a1, T0 + 2, delivered(200)).await,
            SettleResult::Delivered
        );
    }

    pub async fn settle_on_delivered_or_absent_is_stale(b: &Backend) {
        let s = &*b.store;
        let a = own(s, "e", T0).await;
        settle(s, "e", a, T0 + 1, delivered(200)).await;
        let before = get(s, "e").await;
        assert_eq!(
            settle(s, "e", a, T0 + 2, delivered(500)).await,
            SettleResult::Stale
        );
        assert_eq!(
            settle(s, "e", a, T0 + 3, failed(Some(500))).await,
            SettleResult::Stale
        );
        assert_eq!(get(s, "e").await, before);
        assert_eq!(
            settle(s, "absent", 1, T0, delivered(200)).await,
            SettleResult::Stale
        );
        assert_eq!(
            settle(s, "absent", 1, T0, failed(None)).await,
            SettleResult::Stale
        );
        assert_eq!(s.get(R, "absent").await.unwrap(), None, "no upsert");
    }

    pub async fn every_transition_refreshes_expires_at(b: &Backend) {
        let s = &*b.store;
        let check = |rec: Record, at: Millis, what: &str| {
            assert_eq!(
                (rec.updated_at, rec.expires_at),
                (at, at + RETENTION),
                "{what}"
            );
        };
        own(s, "e", T0).await;
        check(get(s, "e").await, T0, "claim");
        claim(s, "e", D1, T0 + 100).await; // in flight: not a transition
        check(get(s, "e").await, T0, "refused claim");
        let t = T0 + 200;
        settle(s, "e", 1, t, failed(Some(500))).await;
        check(get(s, "e").await, t, "release");
        let t = T0 + 300;
        own(s, "e", t).await;
        check(get(s, "e").await, t, "reclaim after failure");
        let t = t + LEASE;
        own(s, "e", t).await;
        check(get(s, "e").await, t, "reclaim after expiry");
        let t = t + 50;
        settle(s, "e", 3, t, delivered(200)).await;
        check(get(s, "e").await, t, "delivered");
        let t = t + 50;
        release(s, "e", true, t).await;
        check(get(s, "e").await, t, "operator release");
        assert_eq!(get(s, "e").await.first_seen_at, T0);
    }

    pub async fn operator_release(b: &Backend) {
        let s = &*b.store;
        // processing → failed, lease cleared; the next delivery reclaims it.
        own(s, "p", T0).await;
        assert_eq!(
            release(s, "p", false, T0 + 1).await,
            ReleaseOutcome::Released {
                previous: State::Processing
            }
        );
        let rec = get(s, "p").await;
        assert_eq!(
            (rec.state, rec.lease_until, rec.attempts),
            (State::Failed, None, 1)
        );
        assert!(rec.last_error.is_some());
        assert_claimed(&claim(s, "p", D1, T0 + 2).await, 2, ClaimKind::RetryFailed);
        // The released attempt's late failure does not undo the new claim.
        assert_eq!(
            settle(s, "p", 1, T0 + 3, failed(Some(500))).await,
            SettleResult::Stale
        );
        // failed → failed
        let a = own(s, "f", T0).await;
        settle(s, "f", a, T0 + 1, failed(Some(500))).await;
        assert_eq!(
            release(s, "f", false, T0 + 2).await,
            ReleaseOutcome::Released {
                previous: State::Failed
            }
        );
        // delivered: refused without force, unchanged; allowed with it.
        let a = own(s, "d", T0).await;
        settle(s, "d", a, T0 + 1, delivered(200)).await;
        let before = get(s, "d").await;
        assert_eq!(
            release(s, "d", false, T0 + 2).await,
            ReleaseOutcome::RefusedDelivered
        );
        assert_eq!(get(s, "d").await, before);
        assert_eq!(
            release(s, "d", true, T0 + 3).await,
            ReleaseOutcome::Released {
                previous: State::Delivered
            }
        );
        let rec = get(s, "d").await;
        assert_eq!((rec.state, rec.lease_until), (State::Failed, None));
        assert_claimed(&claim(s, "d", D1, T0 + 4).await, 2, ClaimKind::RetryFailed);
        // absent
        assert_eq!(
            release(s, "absent", false, T0).await,
            ReleaseOutcome::NotFound
        );
        assert_eq!(
            release(s, "absent", true, T0).await,
            ReleaseOutcome::NotFound
        );
    }

    pub async fn sweep_deletes_only_expired_in_batches(b: &Backend) {
        let s = &*b.store;
        let short = 1_000; // retention shorter than the lease
        let mk = |id: &'static str, now: Millis, retention_ms: Millis| ClaimRequest {
            retention_ms,
            ..claim_req(id, D1, now)
        };
        let now = T0 + 5_000;
        // Expired, settled: go.
        for id in ["del-1", "del-2", "del-3"] {
            claim_and_settle(s, id, T0, short, delivered(200)).await;
        }
        claim_and_settle(s, "fail-1", T0, short, failed(None)).await;
        // Expiring exactly now: goes.
        claim_and_settle(s, "edge", now - short, short, delivered(200)).await;
        // Processing, retention over, lease over: goes.
        s.claim(&mk("dead-lease", now - LEASE, short))
            .await
            .unwrap();
        // Processing, retention over but lease live: stays.
        s.claim(&mk("live-lease", T0, short)).await.unwrap();
        // Not expired: stays.
        s.claim(&mk("young", T0, RETENTION)).await.unwrap();
        s.claim(&mk("young-done", T0, RETENTION)).await.unwrap();
        settle(s, "young-done", 1, T0, delivered(200)).await;

        let mut batches = Vec::new();
        loop {
            let n = s.sweep_batch(now, 2).await.unwrap();
            batches.push(n);
            if n == 0 {
                break;
            }
            assert!(batches.len() < 10, "sweep does not converge: {batches:?}");
        }
        assert!(batches.iter().all(|&n| n <= 2), "bounded: {batches:?}");
        assert_eq!(batches.iter().sum::<u64>(), 6, "{batches:?}");
        let mut left: Vec<String> = s
            .list(&ListFilter {
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.event_id)
            .collect();
        left.sort();
        assert_eq!(left, ["live-lease", "young", "young-done"]);
        // Once its lease ends, the expired processing record goes too.
        assert_eq!(s.sweep_batch(T0 + LEASE, 100).await.unwrap(), 1);
        assert!(s.get(R, "live-lease").await.unwrap().is_none());
    }

    /// The oldest expired records go first, whatever order they were
    /// written in: a sweep spread over its interval must not leave them to
    /// its end (PostgreSQL's batches followed the table's physical order).
    pub async fn sweep_deletes_the_oldest_first(b: &Backend) {
        let s = &*b.store;
        // written newest-expiring first
        for (id, retention_ms) in [("late", 3_000), ("early", 1_000), ("middle", 2_000)] {
            let attempt = own(s, id, T0).await;
            s.settle(&SettleRequest {
                retention_ms,
                ..settle_req(id, attempt, T0, delivered(200))
            })
            .await
            .unwrap();
        }
        let now = T0 + LEASE + 5_000;
        for gone in ["early", "middle", "late"] {
            assert_eq!(s.sweep_batch(now, 1).await.unwrap(), 1);
            assert!(
                s.get(R, gone).await.unwrap().is_none(),
                "{gone} was not the oldest left"
            );
        }
        assert_eq!(s.sweep_batch(now, 1).await.unwrap(), 0);
    }

    pub async fn list_order_filters_and_limit(b: &Backend) {
        let s = &*b.store;
        for (i, (route, id)) in [
            ("a", "a1"),
            ("b", "b1"),
            ("a", "a2"),
            ("b", "b2"),
            ("a", "a3"),
        ]
        .into_iter()
        .enumerate()
        {
            put(s, route, id, T0 + i as Millis * 10).await;
        }
        // a2 delivered, b1 failed
        s.settle(&SettleRequest {
            route: "a",
            ..settle_req("a2", 1, T0 + 100, delivered(200))
        })
        .await
        .unwrap();
        s.settle(&SettleRequest {
            route: "b",
            ..settle_req("b1", 1, T0 + 100, failed(None))
        })
        .await
        .unwrap();
        // Two records first seen at the same instant: by route, then event ID.
        for (route, id) in [("b", "z-tie"), ("a", "z-tie")] {
            s.claim(&ClaimRequest {
                route,
                ..claim_req(id, D1, T0 + 1_000)
            })
            .await
            .unwrap();
        }
        let ids = |v: Vec<Record>| -> Vec<String> {
            v.into_iter()
                .map(|r| format!("{}/{}", r.route, r.event_id))
                .collect()
        };
        let list = |route: Option<&str>, state: Option<State>, limit: i64| ListFilter {
            route: route.map(str::to_owned),
            state,
            limit,
            ..Default::default()
        };
        assert_eq!(
            ids(s.list(&list(None, None, 100)).await.unwrap()),
            ["a/z-tie", "b/z-tie", "a/a3", "b/b2", "a/a2", "b/b1", "a/a1"],
            "newest first"
        );
        // (route, state, limit): the IDs listed
        type Case = (
            Option<&'static str>,
            Option<State>,
            i64,
            &'static [&'static str],
        );
        let cases: [Case; 7] = [
            (Some("a"), None, 100, &["a/z-tie", "a/a3", "a/a2", "a/a1"]),
            (
                None,
                Some(State::Processing),
                100,
                &["a/z-tie", "b/z-tie", "a/a3", "b/b2", "a/a1"],
            ),
            (None, Some(State::Delivered), 100, &["a/a2"]),
            (Some("b"), Some(State::Failed), 100, &["b/b1"]),
            (Some("a"), Some(State::Failed), 100, &[]),
            (None, None, 2, &["a/z-tie", "b/z-tie"]),
            (Some("nope"), None, 10, &[]),
        ];
        for (route, state, limit, want) in cases {
            assert_eq!(
                ids(s.list(&list(route, state, limit)).await.unwrap()),
                want,
                "route {route:?}, state {state:?}, limit {limit}"
            );
        }
        // The listed record is the whole record.
        let all = s.list(&list(Some("a"), None, 100)).await.unwrap();
        assert_eq!(all[2], get_route(s, "a", "a2").await);
    }

    /// Claims `route/id` first seen at `now`.
    async fn put(s: &dyn ClaimStore, route: &str, id: &str, now: Millis) {
        let out = s
            .claim(&ClaimRequest {
                route,
                ..claim_req(id, D1, now)
            })
            .await
            .unwrap();
        assert!(matches!(out, ClaimOutcome::Claimed { .. }), "{route}/{id}");
    }

    fn keys(v: &[Record]) -> Vec<String> {
        v.iter()
            .map(|r| format!("{}/{}", r.route, r.event_id))
            .collect()
    }

    /// Pages that start after the previous page's last record add up to
    /// the whole list, in order, even with ties on `first_seen_at` and with
    /// records arriving between pages (at the top, and at the very instant
    /// of the page boundary).
    pub async fn list_pages_after_a_key(b: &Backend) {
        let s = &*b.store;
        let mut n = 0;
        for t in [0, 10, 10, 10, 20, 30, 30, 40] {
            for route in ["a", "b"] {
                n += 1;
                put(s, route, &format!("e{n:02}"), T0 + t).await;
            }
        }
        let all = |filter: ListFilter| async move { s.list(&filter).await.unwrap() };
        let everything = || {
            all(ListFilter {
                limit: 1_000,
                ..Default::default()
            })
        };
        assert_eq!(everything().await.len(), 16);
        for limit in [1, 2, 3, 5, 16] {
            let before = everything().await;
            let arrived = |r: &Record| !before.iter().any(|o| o.list_key() == r.list_key());
            let mut seen: Vec<Record> = Vec::new();
            let mut after = None;
            let mut pages = 0;
            loop {
                let page = all(ListFilter {
                    limit,
                    after: after.clone(),
                    ..Default::default()
                })
                .await;
                assert!(page.len() as i64 <= limit);
                pages += 1;
                assert!(pages < 40, "paging does not end");
                let Some(last) = page.last() else { break };
                after = Some(last.list_key());
                seen.extend(page.iter().cloned());
                // newer records arrive at the top: never on a later page
                n += 1;
                put(s, "a", &format!("new{n:03}"), T0 + 1_000 + n).await;
            }
            assert!(
                !seen.iter().any(arrived),
                "limit {limit}: a record that arrived later showed on a later page"
            );
            assert_eq!(
                keys(&seen),
                keys(&before),
                "limit {limit}: every record once, in order"
            );
        }
        // With a filter: the key and the filter combine.
        let first = all(ListFilter {
            route: Some("b".into()),
            limit: 3,
            ..Default::default()
        })
        .await;
        assert_eq!(keys(&first), ["b/e16", "b/e12", "b/e14"]);
        let next = all(ListFilter {
            route: Some("b".into()),
            limit: 3,
            after: Some(first[2].list_key()),
            ..Default::default()
        })
        .await;
        assert_eq!(keys(&next), ["b/e10", "b/e04", "b/e06"]);
        // A record joining at the boundary's own instant, after the key in
        // the order, is found on the next page; one before it is not
        // repeated.
        put(s, "b", "e05", T0 + 10).await;
        put(s, "a", "d00", T0 + 10).await;
        let key = s.get("b", "e04").await.unwrap().unwrap().list_key();
        let rest = all(ListFilter {
            limit: 100,
            after: Some(key),
            ..Default::default()
        })
        .await;
        let rest = keys(&rest);
        assert_eq!(rest, ["b/e05", "b/e06", "b/e08", "a/e01", "b/e02"]);
        assert!(!rest.contains(&"a/d00".to_string()), "{rest:?}");
        assert!(!rest.contains(&"b/e04".to_string()), "{rest:?}");
    }

    /// The ID prefix is plain text (`%` and `_` match only themselves), and
    /// `lease_ended_by` finds the processing records whose lease is over.
    pub async fn list_by_id_prefix_and_ended_lease(b: &Backend) {
        let s = &*b.store;
        for (i, id) in ["evt_1", "evt%1", "evtX1", "ev_t", "x/evt_2", "evt_/3"]
            .into_iter()
            .enumerate()
        {
            put(s, R, id, T0 + i as Millis).await;
        }
        let by_prefix = |p: &str| ListFilter {
            id_prefix: Some(p.to_string()),
            limit: 100,
            ..Default::default()
        };
        let ids = |v: Vec<Record>| -> Vec<String> { v.into_iter().map(|r| r.event_id).collect() };
        assert_eq!(
            ids(s.list(&by_prefix("evt_")).await.unwrap()),
            ["evt_/3", "evt_1"]
        );
        assert_eq!(ids(s.list(&by_prefix("evt%")).await.unwrap()), ["evt%1"]);
        assert_eq!(ids(s.list(&by_prefix("x/")).await.unwrap()), ["x/evt_2"]);
        assert_eq!(
            ids(s.list(&by_prefix("EVT")).await.unwrap()),
            Vec::<String>::new()
        );
        assert_eq!(s.list(&by_prefix("")).await.unwrap().len(), 6);

        // lease ends at T0 + i + LEASE; one failed, one delivered, one reclaimed later
        settle(s, "evt%1", 1, T0 + 100, failed(Some(500))).await;
        settle(s, "evtX1", 1, T0 + 100, delivered(200)).await;
        assert_eq!(own(s, "ev_t", T0 + LEASE + 3).await, 2);
        let ended = |at: Millis| ListFilter {
            lease_ended_by: Some(at),
            limit: 100,
            ..Default::default()
        };
        assert_eq!(
            ids(s.list(&ended(T0 + LEASE - 1)).await.unwrap()),
            Vec::<String>::new()
        );
        assert_eq!(ids(s.list(&ended(T0 + LEASE)).await.unwrap()), ["evt_1"]);
        assert_eq!(
            ids(s.list(&ended(T0 + LEASE + 5)).await.unwrap()),
            ["evt_/3", "x/evt_2", "evt_1"],
            "processing past the lease only; ev_t was reclaimed with a new lease"
        );
        let both = ListFilter {
            id_prefix: Some("evt_".into()),
            ..ended(T0 + LEASE + 5)
        };
        assert_eq!(ids(s.list(&both).await.unwrap()), ["evt_/3", "evt_1"]);
    }

    async fn get_route(s: &dyn ClaimStore, route: &str, id: &str) -> Record {
        s.get(route, id).await.unwrap().expect("record")
    }

    pub async fn oldest_processing_per_route(b: &Backend) {
        let s = &*b.store;
        assert_eq!(s.oldest_processing().await.unwrap(), vec![]);
        for (route, id, now) in [
            ("a", "old-but-done", T0),
            ("a", "a1", T0 + 20),
            ("a", "a2", T0 + 10),
            ("b", "b1", T0 + 5),
            ("c", "c-failed", T0 + 1),
        ] {
            s.claim(&ClaimRequest {
                route,
                ..claim_req(id, D1, now)
            })
            .await
            .unwrap();
        }
        for (route, id, outcome) in [
            ("a", "old-but-done", delivered(200)),
            ("c", "c-failed", failed(None)),
        ] {
            s.settle(&SettleRequest {
                route,
                ..settle_req(id, 1, T0 + 30, outcome)
            })
            .await
            .unwrap();
        }
        let mut got = s.oldest_processing().await.unwrap();
        got.sort();
        assert_eq!(
            got,
            vec![("a".to_string(), T0 + 10), ("b".to_string(), T0 + 5)]
        );
        // A reclaim restarts the clock.
        s.claim(&ClaimRequest {
            route: "b",
            ..claim_req("b1", D1, T0 + 5 + LEASE)
        })
        .await
        .unwrap();
        let mut got = s.oldest_processing().await.unwrap();
        got.sort();
        assert_eq!(got[1], ("b".to_string(), T0 + 5 + LEASE));
    }

    pub async fn migrations_are_idempotent(b: &Backend) {
        let s = &*b.store;
        own(s, "kept", T0).await;
        s.migrate().await.expect("second migrate");
        s.migrate().await.expect("third migrate");
        // A second store on the same database migrates as a no-op too.
        let again = store::open(&b.url, 2).await.unwrap();
        again.migrate().await.expect("migrate from another pool");
        assert_eq!(get(&*again, "kept").await.attempts, 1);
        again.close().await;
        s.ping().await.unwrap();
    }

    /// 50 concurrent claims of one event: exactly one wins, the others see it
    /// in flight; then the same once the lease is over (the reclaim path).
    pub async fn concurrent_claims_one_winner(b: &Backend) {
        for (round, now) in [(1, T0), (2, T0 + LEASE)] {
            let barrier = Arc::new(tokio::sync::Barrier::new(50));
            let tasks: Vec<_> = (0..50)
                .map(|_| {
                    let store = b.store.clone();
                    let barrier = barrier.clone();
                    tokio::spawn(async move {
                        barrier.wait().await;
                        store.claim(&claim_req("hot", D1, now)).await
                    })
                })
                .collect();
            let mut claimed = Vec::new();
            let mut in_flight = 0;
            for t in tasks {
                match t.await.unwrap().expect("claim under contention") {
                    ClaimOutcome::Claimed { attempt, .. } => claimed.push(attempt),
                    ClaimOutcome::Existing {
                        decision: Refusal::InFlight { .. },
                        ..
                    } => in_flight += 1,
                    other => panic!("round {round}: {other:?}"),
                }
            }
            assert_eq!(claimed, vec![round], "round {round}: exactly one claim");
            assert_eq!(in_flight, 49);
            assert_eq!(get(&*b.store, "hot").await.attempts, round);
        }
        // Concurrent settles of one attempt: one release, the rest stale.
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let store = b.store.clone();
                tokio::spawn(async move {
                    store
                        .settle(&settle_req("hot", 2, T0 + LEASE + 1, failed(None)))
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut results = BTreeMap::new();
        for t in tasks {
            *results.entry(t.await.unwrap().as_str()).or_insert(0) += 1;
        }
        assert_eq!(results, BTreeMap::from([("released", 1), ("stale", 19)]));
    }

    /// The SQL and the pure `claim::decide` agree: each state is built through
    /// the store, then probed by both.
    pub async fn sql_agrees_with_decide(b: &Backend) {
        let s = &*b.store;
        #[derive(Debug, Clone, Copy)]
        enum Build {
            Absent,
            Processing,
            Failed,
            Released,
            Delivered,
            ForcedRelease,
        }
        let probes = [0, 1, LEASE - 1, LEASE, LEASE + 1, 100 * LEASE];
        let mut n = 0;
        for build in [
            Build::Absent,
            Build::Processing,
            Build::Failed,
            Build::Released,
            Build::Delivered,
            Build::ForcedRelease,
        ] {
            for same in [true, false] {
                for dt in probes {
                    n += 1;
                    let id = format!("agree-{n}");
                    let a = match build {
                        Build::Absent => 0,
                        _ => own(s, &id, T0).await,
                    };
                    match build {
                        Build::Absent | Build::Processing => {}
                        Build::Failed => {
                            settle(s, &id, a, T0, failed(Some(500))).await;
                        }
                        Build::Released => {
                            release(s, &id, false, T0).await;
                        }
                        Build::Delivered => {
                            settle(s, &id, a, T0, delivered(200)).await;
                        }
                        Build::ForcedRelease => {
                            settle(s, &id, a, T0, delivered(200)).await;
                            release(s, &id, true, T0).await;
                        }
                    }
                    let before = s.get(R, &id).await.unwrap();
                    let now = T0 + dt;
                    let digest = if same { D1 } else { D2 };
                    let existing = before.as_ref().map(|r| Existing {
                        state: r.state,
                        lease_until: r.lease_until,
                        same_digest: r.body_sha256 == digest,
                    });
                    let want = claim::decide(existing, now, false);
                    let out = claim(s, &id, digest, now).await;
                    let what = format!("{build:?} same_digest={same} +{dt}ms: {out:?}");
                    assert_eq!(decision_of(&out), want, "{what}");
                    let after = get(s, &id).await;
                    match out {
                        ClaimOutcome::Claimed {
                            attempt,
                            lease_until,
                            ..
                        } => {
                            let prev = before.map(|r| r.attempts).unwrap_or(0);
                            assert_eq!(attempt, prev + 1, "{what}");
                            assert_eq!(lease_until, now + LEASE, "{what}");
                            assert_eq!(
                                (after.state, after.attempts, after.lease_until),
                                (State::Processing, attempt, Some(lease_until)),
                                "{what}"
                            );
                        }
                        ClaimOutcome::Existing { .. } => {
                            assert_eq!(Some(after), before, "{what}: a refusal changes nothing");
                        }
                    }
                }
            }
        }
    }

    /// The attempt rows of one record, as `(attempt, result, status, error)`.
    async fn attempts(
        s: &dyn ClaimStore,
        event_id: &str,
    ) -> Vec<(i64, String, Option<i64>, Option<String>)> {
        let history = s.history(R, event_id).await.expect("history");
        history
            .into_iter()
            .map(|a| (a.attempt, a.result, a.status, a.error))
            .collect()
    }

    fn held_claim<'a>(event_id: &'a str, now: Millis) -> ClaimRequest<'a> {
        ClaimRequest {
            hold: true,
            instance: "held-by",
            ..claim_req(event_id, D1, now)
        }
    }

    /// Under `hold`, an ended lease is not taken over: the delivery that
    /// finds it turns the record `ambiguous` (its lost attempt recorded) and
    /// is answered outcome-unknown, as is every later one; a late answer of
    /// that attempt is still the knowledge the hold waited for.
    pub async fn hold_turns_an_ended_lease_ambiguous(b: &Backend) {
        let s = &*b.store;
        let first = s.claim(&held_claim("h", T0)).await.unwrap();
        assert_claimed(&first, 1, ClaimKind::New);
        let live = s.claim(&held_claim("h", T0 + 1)).await.unwrap();
        assert!(
            matches!(
                live,
                ClaimOutcome::Existing {
                    decision: Refusal::InFlight { .. },
                    ..
                }
            ),
            "{live:?}"
        );
        for now in [T0 + LEASE, T0 + LEASE + 5] {
            assert_outcome_unknown(&s.claim(&held_claim("h", now)).await.unwrap());
        }
        let rec = get(s, "h").await;
        assert_eq!(
            (rec.state, rec.attempts, rec.lease_until),
            (State::Ambiguous, 1, None)
        );
        assert_eq!(
            rec.last_error.as_deref(),
            Some("lease ended without an answer")
        );
        assert_eq!(rec.updated_at, T0 + LEASE);
        let history = s.history(R, "h").await.unwrap();
        assert_eq!(history.len(), 1, "{history:?}");
        assert_eq!(
            (history[0].result.as_str(), history[0].instance.as_deref()),
            ("ambiguous", Some("held-by"))
        );
        // a release-mode claim takes nothing from an ambiguous record either
        assert_outcome_unknown(&claim(s, "h", D1, T0 + LEASE + 9).await);
        assert!(matches!(
            claim(s, "h", D2, T0 + LEASE + 9).await,
            ClaimOutcome::Existing {
                decision: Refusal::Mismatch,
                ..
            }
        ));
        // the attempt's answer arrives after all: delivered is final
        assert_eq!(
            settle(s, "h", 1, T0 + LEASE + 10, delivered(200)).await,
            SettleResult::Delivered
        );
        assert_eq!(attempts(s, "h").await[0].1, "delivered");
    }

    /// An ambiguous settle is fenced like a release: only the attempt that
    /// holds the claim may hold it; every settle writes its attempt's row in
    /// its own commit, with the result it had.
    pub async fn settles_write_their_attempts(b: &Backend) {
        let s = &*b.store;
        own(s, "f", T0).await;
        let req = SettleRequest {
            started_at: T0,
            instance: "i-1",
            attempt_error: Some("upstream answered 500"),
            ..settle_req("f", 1, T0 + 40, failed(Some(500)))
        };
        assert_eq!(s.settle(&req).await.unwrap(), SettleResult::Released);
        assert_eq!(
            attempts(s, "f").await,
            [(
                1,
                "released".to_string(),
                Some(500),
                Some("upstream answered 500".to_string())
            )]
        );
        // attempt 1's lease ends and attempt 2 takes over; attempt 1's late
        // settle is stale and says so in its row (it replaces the "lost" guess)
        own(s, "a", T0).await;
        own(s, "a", T0 + LEASE).await;
        let ambiguous = SettleOutcome::Ambiguous {
            error: Some("timeout after the request was written"),
        };
        let late = SettleRequest {
            attempt_error: Some("timeout after the request was written"),
            ..settle_req("a", 1, T0 + LEASE + 1, ambiguous.clone())
        };
        assert_eq!(s.settle(&late).await.unwrap(), SettleResult::Stale);
        assert_eq!(
            settle(s, "a", 2, T0 + LEASE + 2, ambiguous).await,
            SettleResult::Ambiguous
        );
        let rec = get(s, "a").await;
        assert_eq!((rec.state, rec.lease_until), (State::Ambiguous, None));
        let got = attempts(s, "a").await;
        assert_eq!(
            got.iter().map(|a| (a.0, a.1.as_str())).collect::<Vec<_>>(),
            [(1, "stale"), (2, "ambiguous")],
            "{got:?}"
        );
        assert_eq!(
            got[0].3.as_deref(),
            Some("timeout after the request was written")
        );
        // a delivered settle of a batch (PostgreSQL) writes its row too
        own(s, "d", T0).await;
        let req = SettleRequest {
            started_at: T0,
            instance: "i-2",
            ..settle_req("d", 1, T0 + 25, delivered(201))
        };
        assert_eq!(s.settle(&req).await.unwrap(), SettleResult::Delivered);
        let history = s.history(R, "d").await.unwrap();
        assert_eq!(history.len(), 1);
        let a = &history[0];
        assert_eq!(
            (
                a.result.as_str(),
                a.status,
                a.duration_ms,
                a.instance.as_deref(),
                a.started_at,
                a.ended_at
            ),
            (
                "delivered",
                Some(201),
                Some(25),
                // a first attempt that delivered is read from its record: the
                // claim's instance, the claim's and the settle's times
                Some("test"),
                T0,
                Some(T0 + 25)
            )
        );
        // the same settle again (its commit was not acknowledged, and the
        // carrier retried it): nothing changes, the history still says
        // delivered, and a repeat of a later attempt's delivery likewise
        assert_eq!(s.settle(&req).await.unwrap(), SettleResult::Stale);
        let again = s.history(R, "d").await.unwrap();
        let seen: Vec<_> = again
            .iter()
            .map(|a| (a.attempt, a.result.as_str()))
            .collect();
        assert_eq!(seen, [(1, "delivered")], "{again:?}");
        own(s, "d2", T0).await;
        own(s, "d2", T0 + LEASE).await;
        let second = settle_req("d2", 2, T0 + LEASE + 5, delivered(200));
        assert_eq!(s.settle(&second).await.unwrap(), SettleResult::Delivered);
        assert_eq!(s.settle(&second).await.unwrap(), SettleResult::Stale);
        let late_first = settle_req("d2", 1, T0 + LEASE + 6, delivered(200));
        assert_eq!(s.settle(&late_first).await.unwrap(), SettleResult::Stale);
        let h2 = s.history(R, "d2").await.unwrap();
        let seen: Vec<_> = h2.iter().map(|a| (a.attempt, a.result.as_str())).collect();
        assert_eq!(seen, [(1, "stale"), (2, "delivered")], "{h2:?}");
    }

    /// Taking over an ended lease (`release`) records the attempt that held
    /// it as lost, with the instance that held it.
    pub async fn a_lost_lease_is_recorded_when_taken_over(b: &Backend) {
        let s = &*b.store;
        let lost = ClaimRequest {
            instance: "died",
            ..claim_req("l", D1, T0)
        };
        assert_claimed(&s.claim(&lost).await.unwrap(), 1, ClaimKind::New);
        assert_claimed(
            &claim(s, "l", D1, T0 + LEASE).await,
            2,
            ClaimKind::RetryExpired,
        );
        let history = s.history(R, "l").await.unwrap();
        assert_eq!(history.len(), 1, "{history:?}");
        let a = &history[0];
        assert_eq!(
            (
                a.attempt,
                a.result.as_str(),
                a.error.as_deref(),
                a.instance.as_deref(),
                a.ended_at
            ),
            (
                1,
                "released",
                Some("lease ended without an answer"),
                Some("died"),
                Some(T0 + LEASE)
            )
        );
    }

    /// The newest 20 attempts are kept; they go with the record.
    pub async fn attempts_keep_the_newest_and_go_with_the_record(b: &Backend) {
        let s = &*b.store;
        for n in 1..=23 {
            let now = T0 + n * 100;
            assert_eq!(own(s, "k", now).await, n);
            settle(s, "k", n, now + 1, failed(Some(503))).await;
        }
        let got = attempts(s, "k").await;
        assert_eq!(got.len(), 20);
        assert_eq!((got[0].0, got[19].0), (4, 23));
        while s.sweep_batch(Millis::MAX, 100).await.unwrap() > 0 {}
        assert!(attempts(s, "k").await.is_empty(), "swept with the record");
    }

    /// Resolving, the bulk release and pauses, as the operator module
    /// writes them once for both stores.
    pub async fn operator_actions(b: &Backend) {
        use idemgate::store::BulkRelease;
        let s = &*b.store;
        for id in ["x", "y", "z"] {
            s.claim(&held_claim(id, T0)).await.unwrap();
            s.claim(&held_claim(id, T0 + LEASE)).await.unwrap();
        }
        claim_and_settle(s, "done", T0, RETENTION, delivered(200)).await;
        let resolve = |event_id: &'static str, how| async move {
            let req = ResolveRequest {
                route: R,
                event_id,
                how,
                now: T0 + LEASE + 1,
            };
            s.resolve(&req).await
        };
        assert_eq!(
            resolve("done", Resolution::Failed).await.unwrap(),
            ResolveOutcome::NotAmbiguous(State::Delivered)
        );
        assert_eq!(
            resolve("none", Resolution::Failed).await.unwrap(),
            ResolveOutcome::NotFound
        );
        assert_eq!(
            resolve("x", Resolution::Delivered { status: 202 })
                .await
                .unwrap(),
            ResolveOutcome::Resolved
        );
        let rec = get(s, "x").await;
        assert_eq!((rec.state, rec.last_status), (State::Delivered, Some(202)));
        let replay = claim(s, "x", D1, T0 + LEASE + 2).await;
        assert!(
            matches!(replay, ClaimOutcome::Existing { decision: Refusal::Replay, ref recorded } if recorded.status == Some(202)),
            "{replay:?}"
        );
        assert_eq!(
            resolve("y", Resolution::Failed).await.unwrap(),
            ResolveOutcome::Resolved
        );
        assert_claimed(
            &claim(s, "y", D1, T0 + LEASE + 3).await,
            2,
            ClaimKind::RetryFailed,
        );
        let bulk = |state, dry_run, updated_before| BulkRelease {
            route: R,
            state,
            updated_after: None,
            updated_before,
            dry_run,
            now: T0 + LEASE + 10,
        };
        assert_eq!(
            s.release_bulk(&bulk(State::Ambiguous, true, None))
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            s.release_bulk(&bulk(State::Ambiguous, false, Some(T0)))
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            s.release_bulk(&bulk(State::Ambiguous, false, None))
                .await
                .unwrap(),
            1
        );
        assert_eq!(get(s, "z").await.state, State::Failed);
        assert!(s
            .release_bulk(&bulk(State::Delivered, false, None))
            .await
            .is_err());
        assert_eq!(get(s, "done").await.state, State::Delivered);
        s.set_paused("r", true, T0).await.unwrap();
        s.set_paused("r", true, T0 + 5).await.unwrap();
        s.set_paused("q", true, T0 + 6).await.unwrap();
        assert_eq!(
            s.paused().await.unwrap(),
            [("q".to_string(), T0 + 6), ("r".to_string(), T0)]
        );
        s.set_paused("q", false, T0 + 7).await.unwrap();
        assert_eq!(s.paused().await.unwrap(), [("r".to_string(), T0)]);
        assert_eq!(s.ambiguous_counts().await.unwrap(), []);
    }

    /// The background's take at `now` (marks until now + 1 s), sorted.
    async fn take_questions(s: &dyn ClaimStore, now: Millis, limit: i64) -> Vec<String> {
        let batch = idemgate::store::QuestionBatch {
            route: R,
            now,
            next_at: now + 1_000,
            limit,
        };
        let mut ids = s.take_questions(&batch).await.unwrap();
        ids.sort();
        ids
    }

    /// Reconciliation (SPEC §21): the background's mark, taken by one
    /// caller at a time until it passes; a question's answer recorded as an
    /// attempt row and acted on, fenced by the state and the attempt
    /// count; the newest 20 questions kept, swept with their record.
    pub async fn questions_are_marked_recorded_and_fenced(b: &Backend) {
        use idemgate::store::{Learned, Reconciliation, ResolveOutcome};
        let s = &*b.store;
        for id in ["q1", "q2", "q3"] {
            s.claim(&held_claim(id, T0)).await.unwrap();
            assert_outcome_unknown(&s.claim(&held_claim(id, T0 + LEASE)).await.unwrap());
        }
        s.claim(&held_claim("live", T0 + LEASE)).await.unwrap();
        claim_and_settle(s, "done", T0, RETENTION, delivered(200)).await;
        let t1 = T0 + LEASE + 100;
        let take = |now, limit| take_questions(s, now, limit);
        // concurrent takes: each record goes to one of them
        let (a, b2, c) = tokio::join!(take(t1, 10), take(t1, 10), take(t1, 10));
        let mut all: Vec<String> = [a, b2, c].concat();
        all.sort();
        assert_eq!(all, ["q1", "q2", "q3"]);
        assert!(
            take(t1 + 999, 10).await.is_empty(),
            "marked until t1 + 1000"
        );
        assert_eq!(take(t1 + 1_000, 2).await.len(), 2);
        assert_eq!(take(t1 + 1_000, 10).await.len(), 1);
        let answer = |event_id: &'static str, attempts: i64, learned, now: Millis| async move {
            let req = Reconciliation {
                route: R,
                event_id,
                attempts,
                learned,
                status: Some(200),
                detail: "asked",
                started_at: now - 5,
                now,
                instance: "asker",
            };
            s.reconciled(&req).await.unwrap()
        };
        let t2 = t1 + 2_000;
        let done = Learned::Done { status: 202 };
        assert_eq!(answer("q1", 1, done, t2).await, ResolveOutcome::Resolved);
        let q1 = get(s, "q1").await;
        assert_eq!(
            (q1.state, q1.attempts, q1.last_status, q1.delivered_at),
            (State::Delivered, 1, Some(202), Some(t2))
        );
        let h = s.history(R, "q1").await.unwrap();
        assert_eq!(h.len(), 2, "{h:?}");
        let q = &h[1];
        assert_eq!(
            (q.attempt, q.result.as_str(), q.status, q.error.as_deref()),
            (1, "reconciled", Some(200), Some("asked"))
        );
        assert_eq!(
            (
                q.started_at,
                q.ended_at,
                q.duration_ms,
                q.instance.as_deref()
            ),
            (t2 - 5, Some(t2), Some(5), Some("asker"))
        );
        match s.claim(&held_claim("q1", t2 + 1)).await.unwrap() {
            ClaimOutcome::Existing { decision, recorded } => {
                assert_eq!((decision, recorded.status), (Refusal::Replay, Some(202)));
            }
            other => panic!("{other:?}"),
        }

        assert_eq!(
            answer("q2", 1, Learned::Unknown, t2).await,
            ResolveOutcome::Resolved
        );
        assert_eq!(get(s, "q2").await.state, State::Ambiguous);
        let h = s.history(R, "q2").await.unwrap();
        assert_eq!(h.last().unwrap().result, "reconcile_unknown", "{h:?}");
        // fenced: another attempt count, another state, no record
        assert_eq!(
            answer("q2", 2, Learned::NotDone, t2).await,
            ResolveOutcome::NotAmbiguous(State::Ambiguous)
        );
        assert_eq!(get(s, "q2").await.state, State::Ambiguous);
        assert_eq!(s.history(R, "q2").await.unwrap().len(), h.len());
        assert_eq!(
            answer("q1", 1, Learned::NotDone, t2).await,
            ResolveOutcome::NotAmbiguous(State::Delivered)
        );
        assert_eq!(
            answer("live", 1, Learned::NotDone, t2).await,
            ResolveOutcome::NotAmbiguous(State::Processing)
        );
        assert_eq!(
            answer("none", 1, Learned::NotDone, t2).await,
            ResolveOutcome::NotFound
        );

        assert_eq!(
            answer("q3", 1, Learned::NotDone, t2).await,
            ResolveOutcome::Resolved
        );
        assert_eq!(get(s, "q3").await.state, State::Failed);
        assert_claimed(
            &s.claim(&held_claim("q3", t2 + 1)).await.unwrap(),
            2,
            ClaimKind::RetryFailed,
        );

        // only what is still ambiguous is taken
        assert_eq!(take(t2 + 1_000, 10).await, ["q2"]);
        for n in 0..25 {
            answer("q2", 1, Learned::Unknown, t2 + 10 + n).await;
        }
        let h = s.history(R, "q2").await.unwrap();
        let asked = h.iter().filter(|a| a.result == "reconcile_unknown").count();
        assert_eq!((h.len(), asked), (21, 20), "{h:?}");
        assert_eq!(h.last().unwrap().ended_at, Some(t2 + 34), "the newest kept");
        while s.sweep_batch(Millis::MAX, 100).await.unwrap() > 0 {}
        assert!(
            s.history(R, "q2").await.unwrap().is_empty(),
            "swept with the record"
        );
    }

    /// The sweeper's part: held claims whose lease ended turn ambiguous;
    /// released ones and live leases are left alone.
    pub async fn held_ended_leases_turn_ambiguous(b: &Backend) {
        let s = &*b.store;
        s.claim(&held_claim("ended", T0)).await.unwrap();
        s.claim(&held_claim("live", T0 + LEASE)).await.unwrap();
        own(s, "released-mode", T0).await;
        let n = s.hold_ended_leases(T0 + LEASE + 1, 100).await.unwrap();
        assert_eq!(n, 1);
        assert_eq!(get(s, "ended").await.state, State::Ambiguous);
        assert_eq!(get(s, "live").await.state, State::Processing);
        assert_eq!(get(s, "released-mode").await.state, State::Processing);
        assert_eq!(attempts(s, "ended").await[0].1, "ambiguous");
        assert_eq!(s.ambiguous_counts().await.unwrap(), [("r".to_string(), 1)]);
        assert_eq!(s.hold_ended_leases(T0 + LEASE + 2, 100).await.unwrap(), 0);
    }
}

/// A fresh in-memory reference model (`store::memory`): the suite holds
/// every database to it.
async fn memory_backend() -> Backend {
    Backend {
        store: Arc::new(store::Bounded::new(store::memory::MemoryStore::new())),
        url: String::new(),
        _dir: None,
        _schema: None,
    }
}

/// One test per case on the backend `$open` gives: `Some` of what holds
/// the backend's turn (if anything) and the backend, `None` to skip.
macro_rules! cases_on {
    ($open:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let Some((_turn, b)) = $open else { return };
                super::cases::$case(&b).await;
                b.store.close().await;
            }
        )*
    };
}

/// A Valkey backend on `turn`'s server, the turn kept with it.
async fn on_valkey<T>(turn: Option<(T, String)>) -> Option<(T, Backend)> {
    let (turn, url) = turn?;
    Some((turn, valkey_backend(url).await))
}

/// Runs every case once per backend, each on a fresh database; the cases
/// after `sql only:` need a database a second connection can open.
macro_rules! contract {
    ($($case:ident),* $(,)?; sql only: $($sql_case:ident),* $(,)?) => {
        mod sqlite {
            cases_on!(Some(((), super::sqlite_backend().await)); $($case,)* $($sql_case),*);
        }
        mod postgres {
            cases_on!(super::postgres_backend().await.map(|b| ((), b)); $($case,)* $($sql_case),*);
        }
        mod memory {
            cases_on!(Some(((), super::memory_backend().await)); $($case),*);
        }
        /// On a 3-shard Valkey cluster (three primaries, a replica each):
        /// the cases the model runs (no second connection to a database).
        mod valkey {
            cases_on!(super::on_valkey(super::valkey_turn().await).await; $($case),*);
        }
        /// On one server not in cluster mode, with a replica: the same
        /// cases, the server used as one shard.
        mod valkey_single {
            cases_on!(super::on_valkey(super::valkey_single_turn().await).await; $($case),*);
        }
    };
}

contract!(
    new_claim,
    replay_of_delivered,
    mismatch_in_every_state,
    in_flight_with_retry_after,
    reclaim_after_lease_expiry,
    reclaim_after_release,
    fenced_release,
    delivered_from_a_stale_attempt_wins,
    settle_on_delivered_or_absent_is_stale,
    every_transition_refreshes_expires_at,
    operator_release,
    sweep_deletes_only_expired_in_batches,
    sweep_deletes_the_oldest_first,
    list_order_filters_and_limit,
    list_pages_after_a_key,
    list_by_id_prefix_and_ended_lease,
    oldest_processing_per_route,
    concurrent_claims_one_winner,
    sql_agrees_with_decide,
    hold_turns_an_ended_lease_ambiguous,
    settles_write_their_attempts,
    a_lost_lease_is_recorded_when_taken_over,
    attempts_keep_the_newest_and_go_with_the_record,
    operator_actions,
    held_ended_leases_turn_ambiguous,
    replay_headers_kept_with_the_record,
    links_follow_the_latest_send,
    questions_are_marked_recorded_and_fenced;
    sql only: migrations_are_idempotent,
);

/// PostgreSQL-only races that need a second session holding a row lock.
mod postgres_races {
    use super::*;
    use std::time::{Duration, Instant};

    /// Waits until a statement starting with `prefix` is blocked on a lock.
    async fn until_blocked(pool: &sqlx::PgPool, prefix: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'
                   AND query LIKE $1",
            )
            .bind(format!("{prefix}%"))
            .fetch_one(pool)
            .await
            .unwrap();
            if n > 0 {
                return;
            }
            assert!(Instant::now() < deadline, "{prefix}… never blocked");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Runs `update` (its `$n` bound to `binds`) in another session's open
    /// transaction, as another replica would; starts `op` while that row
    /// lock is held; once `op`'s statement starting with `blocked` waits on
    /// the lock, commits; `op`'s result.
    async fn race<T: Send + 'static, F>(
        b: &Backend,
        update: &str,
        binds: &[i64],
        blocked: &str,
        op: impl FnOnce(Arc<dyn ClaimStore>) -> F,
    ) -> T
    where
        F: std::future::Future<Output = T> + Send + 'static,
    {
        let raw = sqlx::PgPool::connect(&b.url).await.unwrap();
        let mut tx = raw.begin().await.unwrap();
        let mut query = sqlx::query(update);
        for b in binds {
            query = query.bind(*b);
        }
        query.execute(&mut *tx).await.unwrap();
        let task = tokio::spawn(op(b.store.clone()));
        until_blocked(&raw, blocked).await;
        tx.commit().await.unwrap();
        let out = task.await.unwrap();
        raw.close().await;
        out
    }

    /// Runs each case on a fresh PostgreSQL database (skipped without one).
    macro_rules! on_postgres {
        ($($case:ident),* $(,)?) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let Some(b) = postgres_backend().await else { return };
                    cases::$case(&b).await;
                    b.store.close().await;
                }
            )*
        };
    }

    on_postgres!(
        sweep_spares_a_record_reclaimed_under_it,
        sweep_plan_follows_the_table,
        sweep_takes_the_oldest_from_a_large_table,
        fenced_release_waits_and_rechecks,
        release_racing_a_delivery_reports_it,
    );

    /// Each case is an async fn over a PostgreSQL [`Backend`]; `on_postgres!`
    /// runs it on a fresh database, or skips where there is none.
    mod cases {
        use super::*;

        /// A sweep that read a record as expired must not delete it once another
        /// replica's reclaim commits first (READ COMMITTED re-checks only the
        /// outer WHERE of the DELETE against the new row version).
        pub async fn sweep_spares_a_record_reclaimed_under_it(b: &Backend) {
            let s = &*b.store;
            claim_and_settle(s, "e", T0, 1_000, failed(None)).await;
            let now = T0 + 5_000;
            // Another replica reclaims it; its transaction is still open.
            let deleted = race(
                b,
                "UPDATE records SET state = 'processing', attempts = attempts + 1,
                 lease_until = $1, updated_at = $2, expires_at = $3
             WHERE route = 'r' AND event_id = 'e'",
                &[now + LEASE, now, now + RETENTION],
                "DELETE FROM records",
                |store| async move { store.sweep_batch(now, 100).await },
            )
            .await
            .expect("sweep");
            assert_eq!(deleted, 0, "the sweep deleted a live claim");
            let rec = get(s, "e").await;
            assert_eq!((rec.state, rec.attempts), (State::Processing, 2));
        }

        /// The sweep keeps working after its table grew from empty to large: a
        /// plan made while the table was empty and kept by the connection (a
        /// nested loop over the whole primary key) outlasted the statement
        /// timeout on every batch once the table held a few hundred thousand
        /// records, and the sweeper never deleted anything again.
        pub async fn sweep_plan_follows_the_table(b: &Backend) {
            let now = T0 + 10 * RETENTION;
            // First sweeps on the empty table, on every cold connection.
            for _ in 0..3 {
                for n in sweeps_at_once(b, 4, now).await {
                    assert_eq!(n.expect("sweep of the empty table"), 0);
                }
            }
            // Then the table grows: 300,000 expired delivered records.
            let raw = sqlx::PgPool::connect(&b.url).await.unwrap();
            sqlx::query(
                "INSERT INTO records (route, event_id, body_sha256, state, attempts, last_status,
                 first_seen_at, updated_at, delivered_at, expires_at)
             SELECT 'r', md5(i::text), md5(i::text) || md5(i::text), 'delivered', 1, 200,
                 $1 + i, $1 + i, $1 + i, $1 + RETENTION + i
             FROM generate_series(1, 300000) AS i"
                    .replace("RETENTION", &RETENTION.to_string())
                    .as_str(),
            )
            .bind(T0)
            .execute(&raw)
            .await
            .unwrap();
            raw.close().await;
            for _ in 0..3 {
                // Two at once may pick the same batch; one then deletes it.
                let swept: u64 = sweeps_at_once(b, 2, now)
                    .await
                    .into_iter()
                    .map(|n| n.expect("sweep of the grown table"))
                    .sum();
                assert!(swept >= 1_000, "two sweeps deleted {swept}");
            }
        }

        /// On a table the planner scans in physical order (many rows, all
        /// expired, written in no order of expiry) a batch is still
        /// the oldest expired records: the contract case above is too small to
        /// show the plan that skipped them.
        pub async fn sweep_takes_the_oldest_from_a_large_table(b: &Backend) {
            let raw = sqlx::PgPool::connect(&b.url).await.unwrap();
            sqlx::query(
                "INSERT INTO records (route, event_id, body_sha256, state, attempts, last_status,
                 first_seen_at, updated_at, delivered_at, expires_at)
             SELECT 'r', md5(i::text), md5(i::text) || md5(i::text), 'delivered', 1, 200,
                 $1, $1, $1, $1 + 50000 + (i * 7919) % 50000
             FROM generate_series(1, 50000) AS i",
            )
            .bind(T0)
            .execute(&raw)
            .await
            .unwrap();
            sqlx::query("ANALYZE records").execute(&raw).await.unwrap();
            // all expired: the oldest 1,000 expire at T0 + 50,000 ..= T0 + 50,999
            let now = T0 + 200_000;
            assert_eq!(b.store.sweep_batch(now, 1_000).await.unwrap(), 1_000);
            let oldest_left: i64 = sqlx::query_scalar("SELECT min(expires_at) FROM records")
                .fetch_one(&raw)
                .await
                .unwrap();
            assert_eq!(oldest_left, T0 + 51_000, "the batch skipped older records");
            raw.close().await;
        }

        /// `n` sweep batches of 1,000 started together (so that they take
        /// different connections), and what each did.
        async fn sweeps_at_once(
            b: &Backend,
            n: usize,
            now: Millis,
        ) -> Vec<Result<u64, idemgate::store::StoreError>> {
            let tasks: Vec<_> = (0..n)
                .map(|_| {
                    let store = b.store.clone();
                    tokio::spawn(async move { store.sweep_batch(now, 1_000).await })
                })
                .collect();
            let mut done = Vec::new();
            for t in tasks {
                done.push(t.await.unwrap());
            }
            done
        }

        /// A settle waiting on a reclaim's row lock sees the new attempt number.
        pub async fn fenced_release_waits_and_rechecks(b: &Backend) {
            own(&*b.store, "e", T0).await;
            let t2 = T0 + LEASE;
            let settled = race(
                b,
                "UPDATE records SET attempts = attempts + 1, lease_until = $1, updated_at = $2
             WHERE route = 'r' AND event_id = 'e'",
                &[t2 + LEASE, t2],
                // the settle with its attempt's row, one statement
                "WITH s AS (UPDATE records SET state = 'failed'",
                |store| async move {
                    store
                        .settle(&settle_req("e", 1, t2 + 1, failed(Some(500))))
                        .await
                },
            )
            .await;
            assert_eq!(settled.unwrap(), SettleResult::Stale);
            let rec = get(&*b.store, "e").await;
            assert_eq!((rec.state, rec.attempts), (State::Processing, 2));
        }

        /// An operator release that read `processing` while a delivery was
        /// committing reports the delivered record it then finds, not "not found".
        pub async fn release_racing_a_delivery_reports_it(b: &Backend) {
            own(&*b.store, "e", T0).await;
            let released = race(
                b,
                "UPDATE records SET state = 'delivered', lease_until = NULL, last_status = 200,
                 delivered_at = $1, updated_at = $1
             WHERE route = 'r' AND event_id = 'e'",
                &[T0 + 1],
                "UPDATE records SET state = 'failed'",
                |store| async move {
                    store
                        .release(&common::release_req(R, "e", false, T0 + 2))
                        .await
                },
            )
            .await;
            assert_eq!(released.unwrap(), ReleaseOutcome::RefusedDelivered);
            assert_eq!(get(&*b.store, "e").await.state, State::Delivered);
        }
    }
}

mod sqlite_writer {
    use super::*;
    use std::time::Duration;

    /// The counter file beside the database: *begun*, *ended*.
    fn counter_of(b: &Backend) -> std::path::PathBuf {
        let dir = b._dir.as_ref().expect("a SQLite backend");
        dir.path().join("contract.db-changes")
    }

    fn counts(b: &Backend) -> (u64, u64) {
        let bytes = std::fs::read(counter_of(b)).expect("read the change counter");
        let cell = |i: usize| u64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
        (cell(0), cell(1))
    }

    /// `n` delivered records that have expired by `T0 + 2 * RETENTION`.
    async fn expired(s: &dyn ClaimStore, n: usize) -> Millis {
        for i in 0..n {
            let id = format!("old-{i}");
            let attempt = own(s, &id, T0).await;
            settle(s, &id, attempt, T0, delivered(200)).await;
        }
        T0 + 2 * RETENTION
    }

    /// Claims of new events racing the sweep's slices: every claim commits
    /// once, every expired record goes, and each slice counted itself as a
    /// change begun and ended (else a cache could go on replaying a deleted
    /// record).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn slices_share_batches_with_claims() {
        let b = sqlite_backend().await;
        let s = b.store.clone();
        let now = expired(&*s, 250).await;
        let (begun, ended) = counts(&b);
        assert_eq!(begun, ended);
        let claims: Vec<_> = (0..200)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move {
                    let id = format!("new-{i}");
                    s.claim(&claim_req(&id, D1, now)).await
                })
            })
            .collect();
        let swept = s.sweep_batch(now, 1_000).await.expect("sweep");
        for c in claims {
            let outcome = c.await.unwrap().expect("claim beside the sweep");
            assert_eq!(decision_of(&outcome), Decision::Claim(ClaimKind::New));
        }
        assert_eq!(swept, 250);
        assert_eq!(s.sweep_batch(now, 1_000).await.unwrap(), 0);
        let left = s
            .list(&ListFilter {
                limit: 1_000,
                ..ListFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(left.len(), 200);
        assert!(left.iter().all(|r| r.event_id.starts_with("new-")));
        let (begun_after, ended_after) = counts(&b);
        assert_eq!(begun_after, ended_after, "a slice's change never ended");
        // 250 records in slices of at most 100, and the empty last sweep
        assert!(
            begun_after >= begun + 4,
            "the slices did not count themselves: {begun} -> {begun_after}"
        );
        b.store.close().await;
    }

    /// Two stores on one file are two processes sharing it: a record either
    /// one wrote is a duplicate for the other, to a lookup and to a claim.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_record_another_process_wrote_is_a_duplicate_here() {
        let a = sqlite_backend().await;
        let mine = own(&*a.store, "mine", T0).await;
        settle(&*a.store, "mine", mine, T0, delivered(200)).await;
        let b = store::open(&a.url, 4)
            .await
            .expect("a second store on the file");
        b.migrate().await.expect("migrate");
        let theirs = own(&*b, "theirs", T0).await;
        settle(&*b, "theirs", theirs, T0, delivered(201)).await;
        let now = T0 + 10;
        let replay = |status| ClaimOutcome::Existing {
            decision: Refusal::Replay,
            recorded: Recorded {
                status: Some(status),
                content_type: None,
                body: None,
                headers: None,
                trace: None,
            },
        };
        assert_eq!(
            common::peek(&*a.store, R, "theirs", D1, now).await.unwrap(),
            Some(replay(201))
        );
        assert_eq!(claim(&*a.store, "theirs", D1, now).await, replay(201));
        assert_eq!(
            decision_of(&claim(&*a.store, "theirs", D2, now).await),
            Decision::Refuse(Refusal::Mismatch)
        );
        assert_eq!(
            common::peek(&*b, R, "mine", D1, now).await.unwrap(),
            Some(replay(200))
        );
        assert_eq!(
            decision_of(&claim(&*b, "mine", D2, now).await),
            Decision::Refuse(Refusal::Mismatch)
        );
        b.close().await;
        a.store.close().await;
    }

    /// A release in another process holds the counter's lock: the writer
    /// does not wait for it (claims go on committing), and the sweep waits
    /// on a connection of its own, then deletes what expired.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_held_counter_delays_the_sweep_not_the_claims() {
        let b = sqlite_backend().await;
        let s = b.store.clone();
        let now = expired(&*s, 3).await;
        let other = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(counter_of(&b))
            .unwrap();
        other.lock().expect("take the counter's lock");
        let sweep = {
            let s = s.clone();
            tokio::spawn(async move { s.sweep_batch(now, 100).await })
        };
        for i in 0..20 {
            let id = format!("new-{i}");
            let outcome =
                tokio::time::timeout(Duration::from_secs(10), s.claim(&claim_req(&id, D1, now)))
                    .await
                    .expect("a claim waited for the held counter")
                    .unwrap();
            assert_eq!(decision_of(&outcome), Decision::Claim(ClaimKind::New));
        }
        assert!(!sweep.is_finished(), "the sweep ran uncounted");
        drop(other);
        let swept = tokio::time::timeout(Duration::from_secs(10), sweep)
            .await
            .expect("the sweep never ran once the lock was free")
            .unwrap()
            .unwrap();
        assert_eq!(swept, 3);
        let (begun, ended) = counts(&b);
        assert_eq!(begun, ended);
        b.store.close().await;
    }
}
