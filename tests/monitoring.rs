//! The shipped Grafana dashboard and Prometheus alert rules only reference
//! metrics that idemgate exports, with labels it sets.

use std::collections::BTreeSet;

use idemgate::metrics::Metrics;

fn exported() -> BTreeSet<String> {
    let m = Metrics::new();
    m.init_routes(["r"]);
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
    assert_eq!(
        exported.len(),
        9,
        "SPEC §5's metrics so far (v1's eight and idemgate_upstream_retries_total): {exported:?}"
    );
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
    ] {
        assert!(
            alerts.iter().any(|a| a.contains(needed)),
            "no alert for {needed}: {alerts:?}"
        );
    }
    let dash: serde_json::Value =
        serde_json::from_str(&read("config/monitoring/grafana-dashboard.json")).unwrap();
    assert!(dash["panels"].as_array().unwrap().len() >= 6);
    // every runbook entry an alert names exists in the README
    let readme = read("README.md");
    for r in rules["groups"][0]["rules"].as_sequence().unwrap() {
        let entry = r["annotations"]["runbook"].as_str().unwrap();
        let heading = entry.rsplit(" / ").next().unwrap();
        assert!(
            readme.contains(&format!("### {heading}")),
            "README lacks the runbook entry {heading:?}"
        );
    }
}
