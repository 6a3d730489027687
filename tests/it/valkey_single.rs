//! The Valkey store on one server not in cluster mode (SPEC §18: "used as
//! one shard, its replicas from INFO replication"): the real binary
//! through the proxy, a cut replica, and the start checks that refuse
//! such a server (no append-only file, a replica as the seed, several
//! seeds, Redis 7.0 without `WAITAOF`). The store contract runs on it in
//! `store_contract::valkey_single`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::valkey::{redis_server, valkey_server, Valkey};
use crate::common::{bin, eid, free_port, kit, route, wait_until, Consumer, TempDir};
use idemgate::store;

/// `serve` with `store` (the lines under `store:`): its exit code and its
/// output. It must exit within 60 s (a store it cannot use is refused at
/// start, never waited for).
fn serve_refused(dir: &TempDir, store: &str) -> (Option<i32>, String) {
    let config = dir.path().join("refused.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:{}\"\nadmin_listen: \"127.0.0.1:{}\"\nstore:\n{store}\
             defaults:\n  lease: 10s\n  upstream_timeout: 5s\nroutes:\n{}",
            free_port(),
            free_port(),
            route("r", "/hooks/r", "http://127.0.0.1:9/", "    verify: none\n")
        ),
    )
    .unwrap();
    let log = dir.path().join("refused.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(bin())
        .args(["serve", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("idemgate serve");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "serve did not exit within 60 s:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.code(),
        std::fs::read_to_string(&log).unwrap_or_default(),
    )
}

/// The line of `output` that says why the store was refused.
fn reason(output: &str) -> &str {
    output
        .lines()
        .find(|l| l.starts_with("idemgate:"))
        .unwrap_or(output)
}

/// The real binary on one server with a replica: a claim forwarded once,
/// a duplicate replayed, the same ID with another body refused, and the
/// server counted as one shard.
#[test]
fn serve_on_one_server_claims_forwards_once_and_replays() {
    let Some(v) = Valkey::single("serve", 1) else {
        return;
    };
    let dir = TempDir::new("valkey-single-serve");
    let up = Consumer::start().unwrap();
    let started = Instant::now();
    let px = v.proxy(&dir, "replicas=1", &up);
    let ready_in = started.elapsed();
    let id = eid("single");
    let first = px.deliver("/hooks/r", Some(&id), b"one");
    assert_eq!(first.status, 200, "{}", px.log());
    let t = Instant::now();
    let replay = px.deliver("/hooks/r", Some(&id), b"one");
    let replay_took = t.elapsed();
    assert_eq!(replay.status, 200);
    assert_eq!(replay.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(up.count(&id), 1, "forwarded once");
    let other = px.deliver("/hooks/r", Some(&id), b"another body");
    assert_eq!(other.status, 422, "the same ID with another body");
    assert_eq!(up.count(&id), 1, "nothing more forwarded");
    let primary = v.nodes[0].port;
    let waits = v
        .cli(primary, &["info", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_waitaof:calls="))
        .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(waits >= 2, "the claim and its settle waited: {waits}");
    let counted = wait_until(Duration::from_secs(5), || {
        px.metric("idemgate_store_shards") == 1.0
    });
    assert!(counted, "idemgate_store_shards 1: {}", px.metrics());
    println!(
        "one server, one replica: ready in {ready_in:?}, a replay in {replay_took:?}, \
         {waits} WAITAOF on the primary"
    );
}

/// The replica's link cut and the replica stopped: a claim is a store
/// error (503, nothing forwarded), `/readyz` is 503; once the replica runs
/// again both are back, and the refused event is forwarded then.
#[test]
fn a_cut_replica_fails_claims_closed_and_readyz_until_it_is_back() {
    let Some(v) = Valkey::single("cut", 1) else {
        return;
    };
    let dir = TempDir::new("valkey-single-cut");
    let up = Consumer::start().unwrap();
    let px = v.proxy(&dir, "replicas=1", &up);
    assert_eq!(px.deliver("/hooks/r", Some("before"), b"b").status, 200);
    let (primary, replica) = (v.nodes[0].port, v.nodes[1].port);
    let pid = v.cut_replica(primary, replica);
    let t = Instant::now();
    let refused = px.deliver("/hooks/r", Some("during"), b"d");
    let refused_in = t.elapsed();
    let ready_while_cut = kit::get(px.admin, "/readyz").map(|r| r.status);
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let t = Instant::now();
    assert_eq!(refused.status, 503, "fail closed: {}", px.log());
    assert_eq!(up.count("during"), 0, "nothing forwarded");
    assert_eq!(ready_while_cut.ok(), Some(503), "/readyz while cut");
    let back = wait_until(Duration::from_secs(30), || {
        kit::get(px.admin, "/readyz").is_ok_and(|r| r.status == 200)
    });
    assert!(back, "/readyz 200 once the replica runs again");
    let ready_in = t.elapsed();
    // the refused claim's write may stand: released by its token meanwhile
    let forwarded = wait_until(Duration::from_secs(15), || {
        px.deliver("/hooks/r", Some("during"), b"d").status == 200
    });
    assert!(
        forwarded,
        "the refused event is taken once the replica is back"
    );
    assert_eq!(up.count("during"), 1);
    let replay = px.deliver("/hooks/r", Some("before"), b"b");
    assert_eq!(replay.header("Idempotent-Replayed"), Some("true"));
    println!("replica cut: 503 in {refused_in:?}; after SIGCONT /readyz 200 in {ready_in:?}");
}

/// What is refused at start, each with a line naming the server and why:
/// a primary without an append-only file (by the real binary), a replica
/// as the seed, a server not in cluster mode among several seeds, more
/// replicas than it has.
#[test]
fn a_server_that_cannot_make_claims_durable_is_refused_at_start() {
    let Some(server) = valkey_server() else {
        return;
    };
    let v = Valkey::single_of(server, "no-aof", 1, &["--appendonly", "no"]);
    let (primary, replica) = (v.nodes[0].port, v.nodes[1].port);
    let dir = TempDir::new("valkey-single-refused");
    let (code, output) = serve_refused(&dir, &format!("  url: \"{}\"\n", v.url("replicas=1")));
    let line = reason(&output);
    assert_ne!(code, Some(0), "{output}");
    assert!(
        line.contains(&format!(
            "the server 127.0.0.1:{primary} (one shard, not in cluster mode)"
        )) && line.contains("appendonly no"),
        "{output}"
    );
    println!("no append-only file: exit {code:?}: {line}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let refused = |url: String| async move {
            match store::open(&url, 2).await {
                Err(e) => e.to_string(),
                Ok(s) => s.migrate().await.expect_err("refused").to_string(),
            }
        };
        let e = refused(format!("valkey://127.0.0.1:{replica}/?durability=none")).await;
        assert!(
            e.contains(&format!("127.0.0.1:{replica}"))
                && e.contains(&format!("a replica of 127.0.0.1:{primary}")),
            "{e}"
        );
        println!("a replica as the seed: {e}");
        let e = refused(format!(
            "valkey://127.0.0.1:{primary},127.0.0.1:{replica}/?durability=none"
        ))
        .await;
        assert!(
            e.contains("not in cluster mode") && e.contains("2 seeds"),
            "{e}"
        );
        println!("two seeds: {e}");
        let e = refused(v.url("replicas=2&durability=replica_received")).await;
        assert!(
            e.contains("1 replica(s) online") && e.contains("replicas=2"),
            "{e}"
        );
    });
}

/// Redis 7.0 (Debian's) has no `WAITAOF`: the default `fsynced` fails the
/// start with a line naming the server and that; `replica_received` serves,
/// each claim confirmed by `WAIT`.
#[test]
fn redis_7_0_is_refused_for_fsynced_and_serves_replica_received() {
    let Some(server) = redis_server() else {
        return;
    };
    let v = Valkey::single_of(server, "redis70", 1, &[]);
    let primary = v.nodes[0].port;
    let version = v.cli(primary, &["info", "server"]);
    let version = version
        .lines()
        .find_map(|l| l.trim().strip_prefix("redis_version:"))
        .unwrap_or("?")
        .to_string();
    let dir = TempDir::new("valkey-redis70");
    let (code, output) = serve_refused(
        &dir,
        &format!(
            "  url: \"{}\"\n  durability: fsynced\n",
            v.url("replicas=1")
        ),
    );
    let line = reason(&output);
    assert_ne!(code, Some(0), "{output}");
    assert!(
        line.contains(&format!(
            "the server 127.0.0.1:{primary} (one shard, not in cluster mode)"
        )) && line.contains("WAITAOF")
            && line.contains("Redis 7.2+"),
        "{output}"
    );
    println!("Redis {version}, fsynced: exit {code:?}: {line}");

    let up = Consumer::start().unwrap();
    let px = v.proxy(&dir, "replicas=1&durability=replica_received", &up);
    let id = eid("redis70");
    assert_eq!(px.deliver("/hooks/r", Some(&id), b"x").status, 200);
    let replay = px.deliver("/hooks/r", Some(&id), b"x");
    assert_eq!(replay.header("Idempotent-Replayed"), Some("true"));
    assert_eq!(up.count(&id), 1);
    let waits = v
        .cli(primary, &["info", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_wait:calls="))
        .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(waits >= 2, "the claim and its settle waited: {waits}");
    println!("Redis {version}, replica_received: served, {waits} WAIT on the primary");
}
