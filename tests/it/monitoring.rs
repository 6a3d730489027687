//! The shipped Grafana dashboard and Prometheus alert rules only reference
//! metrics that idemgate exports, with labels it sets.

use std::collections::BTreeSet;

use idemgate::metrics::Metrics;

fn exported() -> BTreeSet<String> {
    let m = Metrics::new();
    m.init_routes(["r"]);
    // a route with a limit: its in-flight gauge (SPEC §15)
    let limits = idemgate::limits::LimitsCfg {
        concurrency: Some(1),
        ..Default::default()
    };
    let limited = std::sync::Arc::new(idemgate::limits::RouteLimits::new(limits));
    m.follow_limits(vec![("r".to_string(), limited)]);
    let text = String::from_utf8(m.render()).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Every `idemgate_*` identifier in `text`, with histogram suffixes removed.
fn referenced(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("idemgate_") {
        let start = i + pos;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        let name = &text[start..end];
        let base = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        out.insert(base.to_string());
        i = end;
    }
    out
}

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn dashboard_and_alerts_reference_only_exported_metrics() {
    let exported = exported();
    let own = exported
        .iter()
        .filter(|n| n.starts_with("idemgate_"))
        .count();
    assert_eq!(
        own, 20,
        "SPEC §5's idemgate_ metrics: v2's thirteen, §12's and §14's two gauges, \
         headers_dropped (issue 44), §16's settles_pending, §15's two upstream gauges and \
         §19's spans_dropped: {exported:?}"
    );
    for process in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(exported.contains(process), "{process} in {exported:?}");
    }
    for file in [
        "config/monitoring/grafana-dashboard.json",
        "config/monitoring/alerts.yaml",
    ] {
        let text = read(file);
        let used = referenced(&text);
        assert!(!used.is_empty(), "{file} references no metric");
        for name in &used {
            assert!(
                exported.contains(name),
                "{file} references {name}, which idemgate does not export"
            );
        }
    }
}

#[test]
fn alert_rules_and_dashboard_parse_and_cover_the_operational_risks() {
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&read("config/monitoring/alerts.yaml")).unwrap();
    let alerts: Vec<String> = rules["groups"][0]["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(r["expr"].as_str().is_some_and(|e| !e.trim().is_empty()));
            assert!(
                r["annotations"]["runbook"].as_str().is_some(),
                "every alert names its runbook entry"
            );
            r["alert"].as_str().unwrap().to_string()
        })
        .collect();
    for needed in [
        "UpstreamFailing",
        "ProcessingStuck",
        "DigestMismatches",
        "StoreUnavailable",
        "SweeperBehind",
        "AmbiguousRecords",
        "BreakerOpen",
    ] {
        assert!(
            alerts.iter().any(|a| a.contains(needed)),
            "no alert for {needed}: {alerts:?}"
        );
    }
    let dash: serde_json::Value =
        serde_json::from_str(&read("config/monitoring/grafana-dashboard.json")).unwrap();
    assert!(dash["panels"].as_array().unwrap().len() >= 6);
    // every runbook entry an alert names ("docs/runbook.md / Heading") is a
    // heading of the page it names
    for r in rules["groups"][0]["rules"].as_sequence().unwrap() {
        let entry = r["annotations"]["runbook"].as_str().unwrap();
        let (page, heading) = entry
            .split_once(" / ")
            .expect("runbook: \"PAGE / Heading\"");
        assert_eq!(page, "docs/runbook.md", "{entry:?}");
        assert!(
            read(page).lines().any(|l| l == format!("## {heading}")),
            "{page} lacks the runbook entry {heading:?}"
        );
    }
}

/// The promtool unit tests of the alerts (the minute-scale ones, and the
/// day-scale one evaluated less often).
const ALERT_TESTS: [&str; 2] = ["alerts.test.yaml", "alerts-daily.test.yaml"];

/// `promtool test rules` (Prometheus's own tool, Debian package
/// `prometheus`) runs `config/monitoring/alerts*.test.yaml`, in which every
/// alert of `alerts.yaml` has a case where it fires and one where it stays
/// quiet. Without promtool: SKIP, or a failure in CI.
#[test]
fn every_alert_passes_its_promtool_unit_tests() {
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&read("config/monitoring/alerts.yaml")).unwrap();
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    let files: Vec<serde_yaml::Value> = ALERT_TESTS
        .iter()
        .map(|f| serde_yaml::from_str(&read(&format!("config/monitoring/{f}"))).unwrap())
        .collect();
    for case in files.iter().flat_map(|f| f["tests"].as_sequence().unwrap()) {
        for t in case["alert_rule_test"].as_sequence().unwrap() {
            let name = t["alertname"].as_str().unwrap().to_string();
            if t["exp_alerts"].as_sequence().unwrap().is_empty() {
                quiet.insert(name);
            } else {
                fires.insert(name);
            }
        }
    }
    for rule in rules["groups"][0]["rules"].as_sequence().unwrap() {
        let alert = rule["alert"].as_str().unwrap();
        assert!(
            fires.contains(alert),
            "no promtool case where {alert} fires"
        );
        assert!(
            quiet.contains(alert),
            "no promtool case where {alert} stays quiet"
        );
    }

    let promtool = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("promtool"))
            .find(|p| p.is_file())
    });
    let Some(promtool) = promtool else {
        if std::env::var_os("CI").is_some() {
            panic!("promtool is missing, and CI requires it: apt-get install -y prometheus");
        }
        eprintln!(
            "SKIP: promtool not found (apt-get install -y prometheus); alert unit tests skipped"
        );
        return;
    };
    let dir = format!("{}/config/monitoring", env!("CARGO_MANIFEST_DIR"));
    let test_args: Vec<&str> = ["test", "rules"].into_iter().chain(ALERT_TESTS).collect();
    for args in [vec!["check", "rules", "alerts.yaml"], test_args] {
        let out = std::process::Command::new(&promtool)
            .args(&args)
            .current_dir(&dir)
            .output()
            .expect("promtool runs");
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
