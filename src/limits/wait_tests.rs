//! `upstream_wait`, on the real clock (each test well under a second).

use super::*;
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

fn waiting(concurrency: Option<u32>, rate: Option<Rate>, wait_ms: u64) -> Arc<RouteLimits> {
    Arc::new(RouteLimits::new(LimitsCfg {
        concurrency,
        rate,
        wait: Some(Duration::from_millis(wait_ms)),
        ..LimitsCfg::default()
    }))
}

fn run<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn a_slot_given_back_goes_to_a_waiter() {
    run(async {
        let l = waiting(Some(1), None, 2_000);
        let held = l.admit(now(), true).unwrap();
        let t = Instant::now();
        let waiter = tokio::spawn({
            let l = l.clone();
            async move { l.admit_waiting(true).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(l.snapshot(now()).waiting, 1);
        drop(held);
        let permit = waiter.await.unwrap().unwrap();
        assert!(permit.is_some());
        let waited = t.elapsed();
        assert!(waited >= Duration::from_millis(100) && waited < Duration::from_millis(1_500));
        assert_eq!(l.snapshot(now()).waiting, 0);
        assert_eq!(l.snapshot(now()).in_flight, 1, "the waiter holds the slot");
    });
}

#[test]
fn a_waiter_is_refused_at_its_deadline_and_uncounted() {
    run(async {
        let l = waiting(Some(1), None, 150);
        let _held = l.admit(now(), true).unwrap();
        let t = Instant::now();
        let r = l.admit_waiting(true).await.map(|p| p.is_some());
        assert_eq!(
            r,
            Err(OverLimit::Saturated {
                retry_after_secs: 1
            })
        );
        assert!(t.elapsed() >= Duration::from_millis(150));
        let s = l.snapshot(now());
        assert_eq!((s.waiting, s.in_flight), (0, 1));
    });
}

#[test]
fn tokens_are_reserved_in_turn_and_a_wait_too_short_is_refused_at_once() {
    run(async {
        // 10/s: a bucket of 10, then one every 100 ms
        let rate = Rate {
            per: 10,
            every: Duration::from_secs(1),
        };
        let l = waiting(None, Some(rate), 1_000);
        for _ in 0..10 {
            l.admit(now(), true).unwrap();
        }
        let t = Instant::now();
        let mut at = Vec::new();
        for _ in 0..3 {
            l.admit_waiting(true).await.unwrap();
            at.push(t.elapsed());
        }
        for (i, d) in at.iter().enumerate() {
            let want = Duration::from_millis(100 * (i as u64 + 1));
            assert!(
                *d + Duration::from_millis(15) >= want && *d < want + Duration::from_millis(400),
                "{at:?}"
            );
        }
        // 1/m: the next token is a minute away, past any wait
        let slow = waiting(
            None,
            Some(Rate {
                per: 1,
                every: Duration::from_secs(60),
            }),
            1_000,
        );
        slow.admit(now(), true).unwrap();
        let t = Instant::now();
        let r = slow.admit_waiting(true).await.map(|p| p.is_some());
        assert_eq!(
            r,
            Err(OverLimit::Saturated {
                retry_after_secs: 60
            })
        );
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "refused without waiting"
        );
    });
}

#[test]
fn at_most_max_waiting_wait_and_the_breaker_is_never_waited_for() {
    run(async {
        let l = waiting(Some(1), None, 2_000);
        let held = l.admit(now(), true).unwrap();
        let waiters: Vec<_> = (0..MAX_WAITING)
            .map(|_| {
                let l = l.clone();
                tokio::spawn(async move { l.admit_waiting(true).await.is_ok() })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(l.snapshot(now()).waiting, MAX_WAITING);
        let t = Instant::now();
        assert!(l.admit_waiting(true).await.is_err(), "one past the bound");
        assert!(t.elapsed() < Duration::from_millis(50));
        for w in &waiters {
            w.abort();
        }
        drop(held);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let s = l.snapshot(now());
        assert_eq!(
            (s.waiting, s.in_flight),
            (0, 0),
            "aborted waiters hold nothing"
        );
        // an open breaker: refused at once, as `upstream-unavailable`
        l.pushed_back(now(), Duration::from_secs(30));
        let r = l.admit_waiting(true).await.map(|p| p.is_some());
        assert_eq!(
            r,
            Err(OverLimit::Open {
                retry_after_secs: 30
            })
        );
    });
}
