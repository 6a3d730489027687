//! The Helm chart (`config/helm/idemgate/`, SPEC §20) without a cluster: `helm.py` beside this
//! file lints and renders every profile with PyPI `helm-python-sdk` (Helm 4's SDK), validates
//! every object strictly against Kubernetes 1.29 and 1.37 with `kubernetes-validate` and asserts
//! the chart's invariants; here, each rendered config passes `idemgate check`, and a pod's stop
//! is rehearsed with the rendered config and command. Without the Python packages: SKIP, or a
//! failure in CI (`.ci/run` installs them).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::stopping::{has_exited, poll_until_exit, signal, SIGNAL_HANDLED};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    repo().join("config/helm/idemgate")
}

/// Whether python3 has `helm_python` and `kubernetes_validate`; SKIP (or a
/// panic in CI) when not.
fn helm_tools() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import helm_python, kubernetes_validate, yaml"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return true;
    }
    let install = "python3 -m pip install 'helm-python-sdk==0.2.2' 'kubernetes-validate==1.37.0'";
    if std::env::var_os("CI").is_some() {
        panic!(
            "helm-python-sdk or kubernetes-validate is missing, and CI requires them: {install}"
        );
    }
    eprintln!(
        "SKIP: helm-python-sdk or kubernetes-validate not found ({install}); chart test skipped"
    );
    false
}

/// `python3 helm.py ARGS…`; panics unless it exits 0. Its stdout.
fn helm_py(args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(repo().join("tests/it/helm.py"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("python3 runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "helm.py {args:?}: {}\n{stdout}\n{stderr}",
        out.status
    );
    stdout.into_owned()
}

/// The environment a rendered config reads: the variables the chart takes
/// from Secrets, with stand-in values.
fn secret_env(store_url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("IDEMGATE_STORE_URL", store_url.to_string()),
        ("IDEMGATE_ADMIN_TOKEN", "stand-in-admin-token".into()),
        ("STRIPE_WEBHOOK_SECRET", "whsec_c3RhbmQtaW4=".into()),
        ("GITHUB_WEBHOOK_SECRET", "stand-in".into()),
    ]
}

/// Every profile lints, renders and validates against 1.29 and 1.37 with
/// its invariants (helm.py), and its config passes `idemgate check`; the
/// chart refuses SQLite with two replicas (or an autoscaler), a store or an
/// inline secret in the config, and a grace below preStop + drain + 5 s.
#[test]
fn chart_renders_validates_and_holds_its_invariants_for_every_store() {
    if !helm_tools() {
        return;
    }
    let out = TempDir::new("helm");
    let summary = helm_py(&[chart().to_str().unwrap(), out.path().to_str().unwrap()]);
    eprintln!("{summary}");
    let summary: serde_json::Value = serde_json::from_str(&summary).expect("a JSON summary");
    let profiles = summary["profiles"].as_object().expect("profiles");
    for profile in ["default", "sqlite", "postgres", "valkey"] {
        assert!(
            profiles.contains_key(profile),
            "{profile} rendered: {summary}"
        );
        let validated = profiles[profile]["validated"].as_u64().unwrap_or(0);
        assert!(validated >= 8, "{profile}: {validated} objects validated");
        let store = match profiles[profile]["store"].as_str() {
            Some("postgres") => "postgres://idemgate:stand-in@db.idemgate.svc:5432/idemgate",
            Some("valkey") => "valkey://valkey-0.valkey.idemgate.svc:6379",
            _ => "",
        };
        let config = out.path().join(profile).join("config.yaml");
        let env = secret_env(store);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (code, stdout, stderr) =
            cli_env(&["check", "--config", config.to_str().unwrap()], &env);
        if profile == "valkey" && stderr.contains("unsupported store scheme") {
            eprintln!(
                "SKIP: `idemgate check` of the valkey profile: this build has no Valkey store \
                 yet (\"unsupported store scheme\"); rendered and validated all the same"
            );
            continue;
        }
        assert_eq!(code, 0, "idemgate check, {profile}: {stdout}{stderr}");
    }
    let refused: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("refusals.json")).unwrap())
            .unwrap();
    let two = refused["sqlite_two_replicas"].as_str().unwrap_or_default();
    assert!(
        two.contains("/replicas") && two.contains("want 1"),
        "the schema's refusal names replicas: {two:?}"
    );
    for case in [
        "sqlite_autoscaling",
        "postgres_one_replica",
        "store_in_config",
        "inline_secret",
        "short_grace",
    ] {
        assert!(refused[case].is_string(), "{case} refused: {refused}");
    }
}

/// The chart's PrometheusRule carries config/monitoring/alerts.yaml byte
/// for byte (helm.py also compares the rendered rule with it).
#[test]
fn chart_alert_rules_are_the_shipped_ones() {
    let shipped = std::fs::read(repo().join("config/monitoring/alerts.yaml")).unwrap();
    let in_chart = std::fs::read(chart().join("files/alerts.yaml")).unwrap();
    assert!(
        shipped == in_chart,
        "config/helm/idemgate/files/alerts.yaml differs from config/monitoring/alerts.yaml: \
         cp config/monitoring/alerts.yaml config/helm/idemgate/files/alerts.yaml"
    );
}

/// What the pod spec says about its stop, and what its containers run.
struct PodStop {
    /// The main container's arguments, and the init container's (SQLite's migrations).
    serve: Vec<String>,
    migrate: Vec<String>,
    pre_stop: Duration,
    grace: Duration,
}

impl PodStop {
    fn read(pod: &serde_json::Value) -> PodStop {
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .expect("an argument list")
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect()
        };
        let main = &pod["containers"][0];
        let stop = &main["lifecycle"]["preStop"];
        let pre_stop = match stop["sleep"]["seconds"].as_u64() {
            Some(s) => s,
            None => stop["exec"]["command"][1]
                .as_str()
                .unwrap()
                .parse()
                .unwrap(),
        };
        PodStop {
            serve: strings(&main["args"]),
            migrate: strings(&pod["initContainers"][0]["args"]),
            pre_stop: Duration::from_secs(pre_stop),
            grace: Duration::from_secs(pod["terminationGracePeriodSeconds"].as_u64().unwrap()),
        }
    }
}

/// One delivery of the load: its status (`None`: no answer) and when it
/// started and ended.
struct Sent {
    status: Option<u16>,
    started: Instant,
    ended: Instant,
}

/// `senders` threads deliver fresh events in a loop until `cut` is set
/// (the load balancer has let go of the pod); one delivery in four waits
/// `slow` at the consumer.
fn load(
    proxy: std::net::SocketAddr,
    up: &Consumer,
    senders: usize,
    slow: Duration,
    cut: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<Vec<Sent>>> {
    let n = Arc::new(AtomicU64::new(0));
    (0..senders)
        .map(|_| {
            let (cut, n, script) = (cut.clone(), n.clone(), up.scripter());
            std::thread::spawn(move || {
                let mut sent = Vec::new();
                while !cut.load(Ordering::Relaxed) {
                    let id = eid("pod");
                    if n.fetch_add(1, Ordering::Relaxed) % 4 == 0 {
                        script(&id, vec![Reply::status(200).delay(slow)]);
                    }
                    let started = Instant::now();
                    let status = kit::deliver(proxy, "/hooks/r", Some(&id), b"{}")
                        .ok()
                        .map(|r| r.status);
                    sent.push(Sent {
                        status,
                        started,
                        ended: Instant::now(),
                    });
                }
                sent
            })
        })
        .collect()
}

/// The rendered config with loopback addresses and this test's paths.
fn localise(config: &str, ports: &Ports, store: &str, sock: &Path) -> String {
    let replaced = config
        .replace("0.0.0.0:8080", &ports.listen.to_string())
        .replace("0.0.0.0:9090", &ports.admin.to_string())
        .replace("sqlite:///data/idemgate.db", store)
        .replace("/tmp/idemgate.upgrade.sock", &sock.display().to_string());
    assert!(!replaced.contains("0.0.0.0"), "{replaced}");
    replaced
}

/// A pod's stop, rehearsed with the chart's rendered config and command:
/// under load (8 senders, one delivery in four held 4 s by the consumer),
/// the pod is deleted; the load balancer lets go of it 2 s into the preStop
/// sleep (the endpoint's removal propagating); SIGTERM at the sleep's end;
/// then the drain. Every delivery is answered 200 (the slow ones in flight
/// through the 503s included), `/readyz` is 503 from SIGTERM to the exit,
/// every answered event is delivered in the store, and the process exits 0
/// within the pod's grace.
// long: one timeline, in the kubelet's order: render, start, load, deletion, preStop, SIGTERM, drain, the figures
#[test]
fn a_pods_stop_under_load_fails_no_request_and_ends_within_the_grace() {
    if !helm_tools() {
        return;
    }
    let dir = TempDir::new("pod-stop");
    let up = kit::on_free_port(|p| Consumer::start_on(([127, 0, 0, 1], p).into())).unwrap();
    let values = serde_json::json!({"config": {"routes": [{
        "name": "r", "match": {"path_prefix": "/hooks/r"}, "upstream": up.url(),
        "event_id": {"header": "X-Event-ID"}, "verify": "none"}]}});
    let rendered = dir.path().join("rendered");
    helm_py(&[
        "render",
        chart().to_str().unwrap(),
        &values.to_string(),
        rendered.to_str().unwrap(),
    ]);
    let pod: serde_json::Value =
        serde_json::from_slice(&std::fs::read(rendered.join("pod.json")).unwrap()).unwrap();
    let stop = PodStop::read(&pod);
    let ports = Ports::free().unwrap();
    let store = dir.sqlite_url("idemgate.db");
    let config = dir.path().join("config.yaml");
    let text = std::fs::read_to_string(rendered.join("config.yaml")).unwrap();
    std::fs::write(
        &config,
        localise(&text, &ports, &store, &dir.path().join("up.sock")),
    )
    .unwrap();
    let swap = |args: &[String]| -> Vec<String> {
        args.iter()
            .map(|a| match a.as_str() {
                "sqlite:///data/idemgate.db" => store.clone(),
                "/etc/idemgate/config.yaml" => config.display().to_string(),
                _ => a.clone(),
            })
            .collect()
    };
    let migrate = swap(&stop.migrate);
    let args: Vec<&str> = migrate.iter().map(String::as_str).collect();
    let (code, _, err) = cli(&args);
    assert_eq!(code, 0, "the init container's {migrate:?}: {err}");
    let log_path = dir.path().join("serve.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut serve = Serve::spawn(
        Command::new(bin())
            .args(swap(&stop.serve))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log),
    )
    .unwrap();
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    serve
        .wait_ready(ports.admin, Duration::from_secs(30), |s| s == 200)
        .unwrap_or_else(|e| panic!("{e}: {}", read_log()));
    let pid = serve.pid().unwrap();

    let cut = Arc::new(AtomicBool::new(false));
    let slow = Duration::from_secs(4);
    let senders = load(ports.listen, &up, 8, slow, cut.clone());
    std::thread::sleep(Duration::from_secs(2));
    // the pod is deleted: the kubelet runs the preStop sleep; the endpoint's
    // removal reaches the load balancer 2 s in, and its last delivery is a
    // slow one, still in flight at SIGTERM
    let deleted = Instant::now();
    std::thread::sleep(Duration::from_millis(1900).min(stop.pre_stop));
    let last = eid("pod-last");
    up.hold(&last, 200, slow);
    let proxy = ports.listen;
    let last = std::thread::spawn(move || {
        let started = Instant::now();
        let status = kit::deliver(proxy, "/hooks/r", Some(&last), b"{}")
            .ok()
            .map(|r| r.status);
        Sent {
            status,
            started,
            ended: Instant::now(),
        }
    });
    std::thread::sleep(Duration::from_millis(100));
    cut.store(true, Ordering::Relaxed);
    std::thread::sleep(stop.pre_stop.saturating_sub(deleted.elapsed()));
    let signalled = Instant::now();
    signal(pid, "-TERM");
    let budget = stop.grace.saturating_sub(deleted.elapsed());
    let (polls, exited_after) = poll_until_exit(
        ports.admin,
        pid,
        signalled,
        Duration::from_millis(100),
        budget,
    );
    let mut sent: Vec<Sent> = senders
        .into_iter()
        .flat_map(|s| s.join().unwrap())
        .collect();
    sent.push(last.join().unwrap());
    assert!(has_exited(pid));
    assert_eq!(
        serve.stop(Duration::from_secs(5)),
        Some(0),
        "{}",
        read_log()
    );

    let failed = sent.iter().filter(|s| s.status != Some(200)).count();
    let through_503 = sent
        .iter()
        .filter(|s| s.started < signalled && s.ended > signalled)
        .count();
    let exit_in = signalled.duration_since(deleted) + exited_after;
    let not_503 = polls
        .iter()
        .filter(|p| p.at >= SIGNAL_HANDLED)
        .filter(|p| p.readyz != Some(503) || p.metrics != Some(200))
        .count();
    let delivered = records(&store, "delivered").len();
    let processing = records(&store, "processing").len();
    eprintln!(
        "pod stop rehearsal: {} requests, {failed} failed; {through_503} in flight at SIGTERM and \
         answered while /readyz said 503; /readyz polled {} times over {:.1} s from SIGTERM to \
         exit, {not_503} not 503; {delivered} settles committed (delivered), {processing} left \
         processing; exit {:.1} s after the deletion (preStop {} s), grace {} s",
        sent.len(),
        polls.len(),
        exited_after.as_secs_f64(),
        exit_in.as_secs_f64(),
        stop.pre_stop.as_secs(),
        stop.grace.as_secs(),
    );
    assert_eq!(failed, 0, "{}", read_log());
    assert!(through_503 >= 1, "a slow delivery was in flight at SIGTERM");
    assert_eq!(not_503, 0, "{:?}", polls);
    assert_eq!(
        (delivered, processing),
        (sent.len(), 0),
        "every answered event settled"
    );
    assert!(
        exit_in < stop.grace,
        "exited {exit_in:?} after the deletion, grace {:?}",
        stop.grace
    );
}

/// `events list --state STATE --json` on `store`: the records.
fn records(store: &str, state: &str) -> Vec<serde_json::Value> {
    let (code, out, err) = cli(&[
        "events", "list", "--store", store, "--state", state, "--limit", "100000", "--json",
    ]);
    assert_eq!(code, 0, "events list: {err}");
    serde_json::from_str(&out).unwrap()
}
