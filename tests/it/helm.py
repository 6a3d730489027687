"""The Helm chart checked without a cluster (run by tests/it/helm.rs; SPEC §20).

    python3 tests/it/helm.py CHART_DIR OUT_DIR
    python3 tests/it/helm.py render CHART_DIR VALUES_JSON OUT_DIR

Uses PyPI `helm-python-sdk` (Helm 4's SDK in a wheel: lint, render, the values schema) and
`kubernetes-validate` (the API's schemas, offline). For each profile in CHART_DIR/ci/ (and the
chart's own defaults): lints it, renders it, validates every object strictly against each
Kubernetes version in KUBE_VERSIONS, asserts the chart's invariants from the rendered YAML,
and writes the idemgate config the ConfigMap carries to OUT_DIR/PROFILE/config.yaml (the Rust
side runs `idemgate check` on it). Then asks the chart to refuse what it must refuse and writes
each refusal's message to OUT_DIR/refusals.json. Exits 0 when everything held, 1 with every
failure on stderr otherwise; 3 when the packages are missing.

`render` renders one set of values and writes what a pod would run: OUT_DIR/config.yaml (the
ConfigMap's file) and OUT_DIR/pod.json (the workload's pod spec), for the stop rehearsal.
"""

import json
import os
import sys

try:
    import helm_python as helm
    import kubernetes_validate
    import yaml
except ImportError as e:  # the Rust side prints SKIP (or fails in CI)
    print(f"missing Python package: {e.name}", file=sys.stderr)
    sys.exit(3)

KUBE_VERSIONS = ["1.29.0", "1.37.0"]
# Custom resources the API's schemas do not cover: checked by hand below.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}
SECRET_HINTS = ("password", "secret", "token", "whsec_", "BEGIN ")

failures = []


def fail(where, what):
    failures.append(f"{where}: {what}")


def render(chart, values, name="rel"):
    out = chart.render(values, name=name, namespace="idemgate", is_install=True)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def by_kind(docs):
    kinds = {}
    for d in docs:
        kinds.setdefault(d["kind"], []).append(d)
    return kinds


def validate(profile, docs):
    checked = 0
    for version in KUBE_VERSIONS:
        for d in docs:
            if d["kind"] in CUSTOM_KINDS:
                continue
            try:
                kubernetes_validate.validate(d, version, strict=True)
                checked += 1
            except Exception as e:  # ValidationError or SchemaNotFoundError
                fail(profile, f"{d['kind']} {d['metadata']['name']} against {version}: {e}")
    return checked


def container(pod_spec, name):
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def invariants(profile, kind, values, docs):
    k = by_kind(docs)
    config_map = k["ConfigMap"][0]
    config_text = config_map["data"]["config.yaml"]
    config = yaml.safe_load(config_text)
    sqlite = kind == "sqlite"
    workloads = k.get("StatefulSet", []) + k.get("Deployment", [])
    if len(workloads) != 1:
        fail(profile, f"one workload expected, got {[w['kind'] for w in workloads]}")
        return config_text
    wl = workloads[0]
    spec = wl["spec"]
    pod = spec["template"]["spec"]
    c = container(pod, "idemgate")
    # SQLite: one StatefulSet pod with a volume, no autoscaler, no PDB; else a Deployment of >= 2
    if sqlite:
        if wl["kind"] != "StatefulSet" or spec.get("replicas") != 1:
            fail(profile, f"sqlite runs a StatefulSet of 1, got {wl['kind']} of {spec.get('replicas')}")
        if not spec.get("volumeClaimTemplates"):
            fail(profile, "sqlite: no volume claim")
        if "HorizontalPodAutoscaler" in k or "PodDisruptionBudget" in k:
            fail(profile, "sqlite: an autoscaler or a disruption budget")
        if not config["store"]["url"].startswith("sqlite:///data/"):
            fail(profile, f"sqlite store not on the volume: {config['store']['url']}")
    else:
        hpa = k.get("HorizontalPodAutoscaler", [])
        least = hpa[0]["spec"]["minReplicas"] if hpa else spec.get("replicas", 0)
        if wl["kind"] != "Deployment" or least < 2:
            fail(profile, f"{kind}: a Deployment of at least 2, got {wl['kind']} of {least}")
        pdb = k.get("PodDisruptionBudget", [])
        if len(pdb) != 1 or pdb[0]["spec"].get("maxUnavailable") != 1:
            fail(profile, "a PodDisruptionBudget with maxUnavailable 1")
        if not pod.get("topologySpreadConstraints"):
            fail(profile, "pods not spread over nodes")
        if config["store"]["url"] != "${IDEMGATE_STORE_URL}":
            fail(profile, f"store URL not from the Secret: {config['store']['url']}")
        jobs = k.get("Job", [])
        hooks = [j for j in jobs if "pre-install" in j["metadata"].get("annotations", {}).get("helm.sh/hook", "")]
        if len(hooks) != 1 or container(hooks[0]["spec"]["template"]["spec"], "migrate")["args"] != ["migrate"]:
            fail(profile, "a pre-install/pre-upgrade hook Job running `idemgate migrate`")
    if c["args"] != ["serve", "--config", "/etc/idemgate/config.yaml", "--no-migrate"]:
        fail(profile, f"the pod runs {c['args']}")
    # the grace: preStop + shutdown_grace + 5 s at least
    pre = values.get("lifecycle", {}).get("preStopSleepSeconds", 5)
    drain = int(config["shutdown_grace"].rstrip("s"))
    grace = pod["terminationGracePeriodSeconds"]
    if grace < pre + drain + 5:
        fail(profile, f"grace {grace} < preStop {pre} + shutdown_grace {drain} + 5")
    stop = c["lifecycle"]["preStop"]
    slept = stop["sleep"]["seconds"] if "sleep" in stop else int(stop["exec"]["command"][1])
    if slept != pre:
        fail(profile, f"preStop sleeps {slept}, values say {pre}")
    # the probes: the ports' names lead to the admin listener's port
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    admin_port = int(config["admin_listen"].rsplit(":", 1)[1])
    proxy_port = int(config["listen"].rsplit(":", 1)[1])
    if ports != {"proxy": proxy_port, "admin": admin_port}:
        fail(profile, f"container ports {ports} vs listen {proxy_port}, admin_listen {admin_port}")
    if not config["admin_listen"].startswith("0.0.0.0:"):
        fail(profile, "admin_listen must bind the pod's address for the kubelet's probes")
    for probe, path in [("readinessProbe", "/readyz"), ("startupProbe", "/readyz"), ("livenessProbe", "/healthz")]:
        got = c.get(probe, {}).get("httpGet", {})
        if got.get("path") != path or ports.get(got.get("port")) != admin_port:
            fail(profile, f"{probe}: {got}, expected {path} on the admin port {admin_port}")
    # non-root, read-only root, a writable /tmp for the upgrade socket
    sc = c["securityContext"]
    if not (sc.get("readOnlyRootFilesystem") and sc.get("runAsNonRoot")):
        fail(profile, f"securityContext {sc}")
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    sock_dir = os.path.dirname(config["upgrade_sock"])
    vols = {v["name"]: v for v in pod["volumes"]}
    if "emptyDir" not in vols.get(mounts.get(sock_dir, ""), {}):
        fail(profile, f"upgrade_sock's folder {sock_dir} is not a writable emptyDir")
    # secrets only from Secrets, by reference; nothing secret in a ConfigMap
    for e in c.get("env", []):
        if "value" in e and any(h in e["value"].lower() for h in SECRET_HINTS):
            fail(profile, f"env {e['name']} holds a literal that looks secret")
    referenced = {e["name"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
    for ref in secret_refs(config):
        if not ref.startswith(("env:", "file:")):
            fail(profile, "a secret written into the ConfigMap")
        elif ref.startswith("env:") and ref[4:] not in referenced:
            fail(profile, f"{ref} is not an environment variable from a Secret")
    for cm in k["ConfigMap"]:
        text = json.dumps(cm["data"]).lower()
        if "://" in text and "@" in text.split("://", 1)[1].split('"', 1)[0]:
            fail(profile, "a URL with credentials in a ConfigMap")
    # services: the proxy, and the admin one ClusterIP only
    services = {s["spec"]["ports"][0]["name"]: s for s in k["Service"]}
    if services.get("admin", {}).get("spec", {}).get("type") != "ClusterIP" or "proxy" not in services:
        fail(profile, "a proxy Service and a ClusterIP admin Service")
    monitoring(profile, values, k)
    return config_text


def secret_refs(config):
    refs = []
    token = (config.get("admin") or {}).get("token")
    if token:
        refs.append(token)
    for route in config.get("routes", []):
        verify = route.get("verify")
        if isinstance(verify, dict):
            refs.extend(verify.get("secrets", []))
    return refs


def monitoring(profile, values, k):
    wanted = values.get("metrics", {}).get("prometheusRule", {}).get("enabled", False)
    rules = k.get("PrometheusRule", [])
    if wanted != bool(rules):
        fail(profile, f"PrometheusRule wanted {wanted}, rendered {len(rules)}")
    if rules:
        with open(os.path.join(REPO, "config/monitoring/alerts.yaml")) as f:
            shipped = yaml.safe_load(f)
        if rules[0]["spec"] != shipped:
            fail(profile, "the PrometheusRule's groups differ from config/monitoring/alerts.yaml")
    for sm in k.get("ServiceMonitor", []):
        ep = sm["spec"]["endpoints"][0]
        if (ep.get("port"), ep.get("path")) != ("admin", "/metrics"):
            fail(profile, f"ServiceMonitor scrapes {ep}")


def refusals(chart, chart_dir):
    """What the chart must refuse, and the message it refuses it with."""
    cases = {
        "sqlite_two_replicas": {"store": {"kind": "sqlite"}, "replicas": 2},
        "sqlite_autoscaling": {"store": {"kind": "sqlite"}, "autoscaling": {"enabled": True}},
        "postgres_one_replica": {"store": {"kind": "postgres", "urlSecret": {"name": "s"}}, "replicas": 1},
        "store_in_config": {"config": {"store": {"url": "postgres://u:pw@db/x"}}},
        "inline_secret": {"config": {"routes": [{"name": "r", "match": {"path_prefix": "/"},
                                                 "upstream": "http://u", "verify": {"secrets": ["whsec_abc"]}}]}},
        "short_grace": {"terminationGracePeriodSeconds": 20},
    }
    messages = {}
    for name, values in cases.items():
        refused = None
        try:
            chart.validate_schema(chart.merge_values(values))
            render(chart, values)
        except helm.HelmError as e:
            refused = str(e)
        if refused is None:
            fail("refusals", f"{name} was accepted: {values}")
        else:
            messages[name] = refused
        # `helm lint` must refuse the schema's cases too (it skips a template's `fail`)
        if name != "short_grace":
            report = helm.lint(chart_dir, values, strict=True)
            if not report.get("errors") and not any(m["severity"] >= 3 for m in report["messages"]):
                fail("refusals", f"helm lint accepts {name}")
    return messages


def render_one(chart_dir, values_json, out_dir):
    chart = helm.Chart.load(chart_dir)
    docs = by_kind(render(chart, json.loads(values_json)))
    workload = (docs.get("StatefulSet") or docs["Deployment"])[0]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.yaml"), "w") as f:
        f.write(docs["ConfigMap"][0]["data"]["config.yaml"])
    with open(os.path.join(out_dir, "pod.json"), "w") as f:
        json.dump(workload["spec"]["template"]["spec"], f, indent=2)
    return 0


def main():
    if sys.argv[1] == "render":
        return render_one(*sys.argv[2:5])
    chart_dir, out_dir = sys.argv[1], sys.argv[2]
    chart = helm.Chart.load(chart_dir)
    profiles = {"default": {}}
    ci_dir = os.path.join(chart_dir, "ci")
    for f in sorted(os.listdir(ci_dir)):
        if f.endswith("-values.yaml"):
            with open(os.path.join(ci_dir, f)) as fh:
                profiles[f[: -len("-values.yaml")]] = helm.values_from_yaml(fh.read())
    summary = {"helm_sdk": helm.helm_sdk_version(), "kubernetes_validate": kubernetes_validate.__version__,
               "kube_versions": KUBE_VERSIONS, "profiles": {}}
    for profile, values in profiles.items():
        report = helm.lint(chart_dir, values, strict=True)
        problems = report.get("errors", []) + [m["error"] for m in report["messages"] if m["severity"] >= 2]
        if problems:
            fail(profile, f"helm lint: {problems}")
        try:
            docs = render(chart, values)
        except helm.HelmError as e:
            fail(profile, f"render: {e}")
            continue
        kind = chart.merge_values(values)["store"]["kind"]
        checked = validate(profile, docs)
        config_text = invariants(profile, kind, values, docs)
        os.makedirs(os.path.join(out_dir, profile), exist_ok=True)
        with open(os.path.join(out_dir, profile, "config.yaml"), "w") as f:
            f.write(config_text)
        with open(os.path.join(out_dir, profile, "manifests.yaml"), "w") as f:
            yaml.safe_dump_all(docs, f, sort_keys=False)
        summary["profiles"][profile] = {"store": kind, "objects": sorted(d["kind"] for d in docs),
                                        "validated": checked}
    # the kubelet's own sleep action: Kubernetes 1.30 and later
    native = dict(profiles.get("postgres", {}), lifecycle={"preStopSleepSeconds": 5, "nativeSleep": True})
    for d in render(chart, native):
        if d["kind"] not in CUSTOM_KINDS:
            try:
                kubernetes_validate.validate(d, KUBE_VERSIONS[-1], strict=True)
            except Exception as e:
                fail("native sleep", f"{d['kind']}: {e}")
    summary["refusals"] = refusals(chart, chart_dir)
    with open(os.path.join(out_dir, "refusals.json"), "w") as f:
        json.dump(summary["refusals"], f, indent=2)
    print(json.dumps(summary, indent=2))
    for line in failures:
        print(line, file=sys.stderr)
    return 1 if failures else 0


REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

if __name__ == "__main__":
    sys.exit(main())
