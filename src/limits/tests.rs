//! The limits' pure logic on a made-up clock.

use super::clock::SEC;
use super::*;
use std::sync::Arc;
use std::time::Duration;

fn limits(cfg: LimitsCfg) -> Arc<RouteLimits> {
    Arc::new(RouteLimits::new(cfg))
}

const S: Micros = SEC;

#[test]
fn a_route_without_limits_holds_nothing() {
    let l = limits(LimitsCfg::default());
    for _ in 0..1000 {
        assert!(l.admit(S, true).unwrap().is_none());
    }
    assert_eq!(l.snapshot(S).in_flight, 0);
}

#[test]
fn concurrency_slots_come_back_on_drop() {
    let l = limits(LimitsCfg {
        concurrency: Some(2),
        ..Default::default()
    });
    let a = l.admit(S, true).unwrap();
    let b = l.admit(S, false).unwrap();
    assert_eq!(
        l.admit(S, true).unwrap_err(),
        OverLimit::Saturated {
            retry_after_secs: 1
        }
    );
    assert_eq!(l.snapshot(S).in_flight, 2);
    drop(a);
    let c = l.admit(S, true).unwrap();
    drop((b, c));
    assert_eq!(l.snapshot(S).in_flight, 0);
}

#[test]
fn the_bucket_starts_full_with_one_seconds_worth() {
    let rate = Rate {
        per: 10,
        every: Duration::from_secs(1),
    };
    let l = limits(LimitsCfg {
        rate: Some(rate),
        ..Default::default()
    });
    let t0 = 100 * S;
    for _ in 0..10 {
        l.admit(t0, true).unwrap();
    }
    // the 11th waits for the next token: 100 ms, so Retry-After 1
    assert_eq!(
        l.admit(t0, true).unwrap_err(),
        OverLimit::Saturated {
            retry_after_secs: 1
        }
    );
    // one token every 100 ms
    l.admit(t0 + S / 10, true).unwrap();
    assert!(l.admit(t0 + S / 10, true).is_err());
    // over 5 s: the burst and 50 more, no more
    let mut passed = 0;
    let mut t = t0 + S / 10;
    while t < t0 + 5 * S {
        t += S / 100;
        passed += l.admit(t, true).is_ok() as u32;
    }
    assert_eq!(passed, 49);
}

#[test]
fn a_per_minute_rate_bursts_one_and_says_how_long() {
    let rate = Rate {
        per: 6,
        every: Duration::from_secs(60),
    };
    assert_eq!(rate.burst(), 1);
    let l = limits(LimitsCfg {
        rate: Some(rate),
        ..Default::default()
    });
    l.admit(S, false).unwrap();
    assert_eq!(
        l.admit(S + S / 2, false).unwrap_err(),
        OverLimit::Saturated {
            retry_after_secs: 10
        }
    );
    l.admit(11 * S, false).unwrap();
}

#[test]
fn a_refused_token_gives_its_slot_back() {
    let l = limits(LimitsCfg {
        concurrency: Some(1),
        rate: Some(Rate {
            per: 1,
            every: Duration::from_secs(1),
        }),
        ..Default::default()
    });
    drop(l.admit(S, true).unwrap());
    assert!(l.admit(S, true).is_err());
    assert_eq!(l.snapshot(S).in_flight, 0);
}

fn breaker(failures: u32, open_secs: u64) -> Arc<RouteLimits> {
    limits(LimitsCfg {
        breaker: Some(BreakerCfg {
            failures,
            open: Duration::from_secs(open_secs),
        }),
        ..Default::default()
    })
}

#[test]
fn the_breaker_opens_after_f_consecutive_failures() {
    let l = breaker(3, 10);
    let t = 5 * S;
    for end in [
        AttemptEnd::Failure,
        AttemptEnd::Failure,
        AttemptEnd::Success,
    ] {
        let p = l.admit(t, true).unwrap();
        l.ended(p.as_ref(), t, end);
    }
    for _ in 0..3 {
        let p = l.admit(t, true).unwrap();
        l.ended(p.as_ref(), t, AttemptEnd::Failure);
    }
    assert_eq!(
        l.admit(t + S / 2, true).unwrap_err(),
        OverLimit::Open {
            retry_after_secs: 10
        }
    );
    assert_eq!(l.snapshot(t + 3 * S).breaker, "open");
    assert_eq!(l.snapshot(t + 3 * S).open_secs, 7);
    // unguarded requests are not the breaker's
    assert!(l.admit(t + S, false).is_ok());
}

#[test]
fn half_open_lets_exactly_one_through_and_its_success_closes() {
    let l = breaker(1, 10);
    let p = l.admit(S, true).unwrap();
    l.ended(p.as_ref(), S, AttemptEnd::Failure);
    drop(p);
    let t = 11 * S;
    assert_eq!(l.snapshot(t).breaker, "half-open");
    let probe = l.admit(t, true).unwrap().unwrap();
    for _ in 0..10 {
        assert_eq!(
            l.admit(t, true).unwrap_err(),
            OverLimit::Open {
                retry_after_secs: 1
            }
        );
    }
    l.ended(Some(&probe), t, AttemptEnd::Success);
    drop(probe);
    assert_eq!(l.snapshot(t).breaker, "closed");
    assert!(l.admit(t, true).is_ok());
}

#[test]
fn a_failed_probe_reopens_and_a_lost_one_lets_the_next_probe() {
    let l = breaker(1, 10);
    l.ended(None, S, AttemptEnd::Failure);
    let t = 11 * S;
    // a probe dropped without an outcome (cancelled, or a replay after all)
    drop(l.admit(t, true).unwrap());
    let probe = l.admit(t, true).unwrap().unwrap();
    l.ended(Some(&probe), t, AttemptEnd::Failure);
    drop(probe);
    assert_eq!(
        l.admit(t + S, true).unwrap_err(),
        OverLimit::Open {
            retry_after_secs: 9
        }
    );
    assert!(l.admit(t + 10 * S, true).is_ok());
}

#[test]
fn a_pushback_opens_any_routes_breaker_capped() {
    let l = limits(LimitsCfg::default());
    l.pushed_back(S, Duration::from_secs(3));
    assert_eq!(
        l.admit(S, true).unwrap_err(),
        OverLimit::Open {
            retry_after_secs: 3
        }
    );
    // unguarded requests of a route without limits still pass
    assert!(l.admit(S, false).unwrap().is_none());
    let probe = l.admit(4 * S, true).unwrap().unwrap();
    assert!(l.admit(4 * S, true).is_err());
    l.ended(Some(&probe), 4 * S, AttemptEnd::Success);
    drop(probe);
    assert!(l.admit(4 * S, true).unwrap().is_none());
    l.pushed_back(S, Duration::from_secs(86_400));
    assert_eq!(l.snapshot(S).open_secs, 600);
}

#[test]
fn retry_after_takes_seconds_or_a_date() {
    let now = std::time::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
    assert_eq!(retry_after("3", now), Some(Duration::from_secs(3)));
    assert_eq!(
        retry_after("99999999999999999999999", now),
        Some(MAX_PUSHBACK)
    );
    // Wed, 21 Oct 2015 07:28:00 GMT is 1_445_412_480
    assert_eq!(
        retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now),
        Some(Duration::from_secs(10))
    );
    assert_eq!(
        retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
        Some(Duration::ZERO)
    );
    assert_eq!(retry_after("-1", now), None);
    assert_eq!(retry_after("soon", now), None);
    assert_eq!(retry_after("", now), None);
}
