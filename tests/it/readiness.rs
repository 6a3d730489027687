//! `/readyz` tells the truth, fast (SPEC §5, §20): within 500 ms whatever
//! the store does, a store that stops answering included (a kubelet's probe
//! times out after 1 s, and a timeout is not an answer).

use std::time::{Duration, Instant};

use crate::common::vip::Vip;
use crate::common::*;

/// The most `/readyz` may take, as the client sees it.
const READY_WITHIN: Duration = Duration::from_millis(500);

/// `/readyz`'s status and how long it took.
fn timed_readyz(admin: std::net::SocketAddr) -> (u16, Duration) {
    let t = Instant::now();
    let r = kit::get(admin, "/readyz").expect("the admin listener answers");
    (r.status, t.elapsed())
}

/// PostgreSQL behind a forwarder that starts dropping every byte the
/// server sends (a host that stops answering, connections left open):
/// every `/readyz` is 503 within 500 ms.
/// Before, each took 2 s (the readiness timeout).
#[test]
fn readyz_answers_within_500ms_when_the_store_stops_answering() {
    let Some(base) = pg_url() else { return };
    let schema = PgSchema::create(&base, "ready_silent");
    let vip = Vip::start(5432);
    let url = schema.url_via(&format!("postgres://postgres@127.0.0.1:{}/test", vip.port));
    let dir = TempDir::new("ready-silent");
    let up = Consumer::start().unwrap();
    let px = Proxy::start(&dir, &url, &route("r", "/hooks/r", &up.url(), ""));
    assert_eq!(timed_readyz(px.admin).0, 200);
    vip.swallow_answers(true);
    let timings: Vec<(u16, Duration)> = (0..6)
        .map(|_| {
            let got = timed_readyz(px.admin);
            std::thread::sleep(Duration::from_millis(200));
            got
        })
        .collect();
    vip.swallow_answers(false);
    assert!(
        timings
            .iter()
            .all(|&(status, took)| status == 503 && took < READY_WITHIN),
        "every /readyz 503 within {READY_WITHIN:?}: {timings:?}"
    );
    // and once it answers again, ready within 10 s: the probes joined one
    // ping (admin/ready.rs) instead of leaving one hung connection each
    // (before: back in 1 run of 3)
    let back = wait_until(Duration::from_secs(10), || timed_readyz(px.admin).0 == 200);
    assert!(
        back,
        "/readyz back to 200 within 10 s of the store answering again; the proxy's log:\n{}",
        log_tails([&px], 40)
    );
}
