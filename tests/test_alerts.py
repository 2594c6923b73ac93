"""The alert rules and the dashboard as files and chart objects (docs/operations.md, "Alerts").

Prometheus' own `promtool` (Debian's `prometheus` package) checks the rules and runs their
unit tests (helm/monitoring/alerts.test.yaml: each alert fires on the series that should fire it
and stays quiet on its near misses). The rules have one source, the chart's
templates/_alerts.tpl: helm/monitoring/alerts.yaml must be its rendering, and the chart's
dashboard ConfigMap carries dashboards/mqtt-offload.json as it is. tests/test_prometheus.py
runs both against a real Prometheus scraping a running gateway and proxy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from test_helm import NAMESPACE, RELEASE, chart, manifests  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import monitoring  # noqa: E402

RULES = ROOT / "helm" / "monitoring" / "alerts.yaml"
RULE_TESTS = ROOT / "helm" / "monitoring" / "alerts.test.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"
DEFAULTS = monitoring.DEFAULT_RULES

# scripts/_bootstrap.sh installs it for the tests; CI must not skip what it installs.
promtool = pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("CI"),
    reason="promtool: apt-get install prometheus",
)


def rules(groups: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for group in groups["groups"]:
        yield from group["rules"]


def alert_names(groups: dict[str, Any]) -> set[str]:
    return {rule["alert"] for rule in rules(groups)}


# --- promtool ------------------------------------------------------------------------------


@promtool
def test_promtool_checks_the_rules_file() -> None:
    done = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    count = sum(1 for _ in rules(yaml.safe_load(RULES.read_text())))
    assert f"SUCCESS: {count} rules found" in done.stdout


@promtool
def test_promtool_unit_tests_of_every_alert_pass() -> None:
    done = subprocess.run(
        ["promtool", "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def _projection(labels: dict[str, str], keys: set[str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k in keys))


def _series_labels(series: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', series))


def test_every_alert_has_a_unit_test_that_fires_it_beside_one_that_must_not() -> None:
    """Each alert: an evaluation where it fires, and in the same test input series of the
    same metrics that match no expected alert (the near miss it must stay quiet on)."""
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == ["alerts.yaml"]
    fired: set[str] = set()
    for test in tests["tests"]:
        series = [_series_labels(s["series"]) for s in test["input_series"]]
        for check in test["alert_rule_test"]:
            expected = [a["exp_labels"] for a in check["exp_alerts"]]
            if not expected:
                continue
            keys = set().union(*expected) - {"severity", "operation", "alertname"}
            wanted = {_projection(labels, keys) for labels in expected}
            quiet = {_projection(labels, keys) for labels in series} - wanted
            assert quiet, f"{test['name']}: no series that must not fire"
            fired.add(check["alertname"])
    assert fired == alert_names(yaml.safe_load(RULES.read_text()))


# --- one source ----------------------------------------------------------------------------


def test_the_rules_file_and_the_dashboard_are_rendered_from_their_sources() -> None:
    for path, text in monitoring.expected().items():
        assert path.read_text() == text, f"{path} is stale: run python scripts/monitoring.py"


def test_every_alert_says_what_to_do_and_links_its_runbook_section() -> None:
    groups = yaml.safe_load(RULES.read_text())
    anchors = _anchors(OPERATIONS.read_text())
    assert alert_names(groups) == set(DEFAULTS)  # a value block per alert, no stray one
    for rule in rules(groups):
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), name
        summary = rule["annotations"]["summary"]
        assert re.search(r"; (check|read|find|renew|open|if)\b", summary), f"{name}: {summary}"
        url = rule["annotations"]["runbook_url"]
        assert url == f"docs/operations.md#{name.lower()}"
        assert name.lower() in anchors, f"docs/operations.md has no section {name}"
        assert rule["for"] == DEFAULTS[name]["for"]


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_thresholds_and_durations_are_values() -> None:
    values = {
        "rules": {
            "OffloadHttp5xx": {"ratio": 0.25, "for": "3m"},
            "OffloadLatencyHigh": {
                "seconds": 2.5,
                "routes": {"/uploads/{upload_id}": 7, "/topic/{topic:path}": None},
            },
            "OffloadTlsCertificateExpiring": {"days": 3},
            "OffloadSweeperFailing": {"staleSeconds": 120},
            "OffloadTargetDown": {"enabled": False},
        }
    }
    by_name: dict[str, list[dict[str, Any]]] = {}
    for rule in rules(monitoring.render_rules(values)):
        by_name.setdefault(rule["alert"], []).append(rule)
    (http,) = by_name["OffloadHttp5xx"]
    assert http["for"] == "3m" and http["expr"].rstrip().endswith("> 0.25")
    latency = {r["labels"].get("route"): r["expr"] for r in by_name["OffloadLatencyHigh"]}
    # Helm merges the map into the defaults; a route set to null leaves it.
    assert set(latency) == {None, *DEFAULTS["OffloadLatencyHigh"]["routes"]} - {
        "/topic/{topic:path}"
    }
    assert latency[None].rstrip().endswith("> 2.5")
    assert r"/uploads/\{upload_id\}`" in latency[None]  # the others' threshold leaves it out
    assert latency["/uploads/{upload_id}"].rstrip().endswith("> 7")
    (cert,) = by_name["OffloadTlsCertificateExpiring"]
    assert cert["expr"].rstrip().endswith(f"< {3 * 86400}")
    assert "[120s]" in by_name["OffloadSweeperFailing"][0]["expr"]
    assert "OffloadTargetDown" not in by_name


# --- the chart -----------------------------------------------------------------------------


def _kinds(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_the_prometheus_rule_is_optional_and_the_operators_model_takes_it(
    chart: helm.Chart,  # noqa: F811
) -> None:
    assert _kinds(manifests(chart, {}), "PrometheusRule") == []
    docs = manifests(chart, {"alerts": {"enabled": True, "labels": {"release": "kps"}}})
    (rule,) = _kinds(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    models = pytest.importorskip("cloudcoil.models.prometheus_operator.v1")
    parsed = models.PrometheusRule.model_validate(rule)
    assert parsed.model_dump(by_alias=True, exclude_none=True) == rule
    # The same rules as the plain file, kept to this release's namespace.
    plain = yaml.safe_load(RULES.read_text())
    assert alert_names(rule["spec"]) == alert_names(plain)
    for ours, theirs in zip(rules(rule["spec"]), rules(plain), strict=True):
        assert ours["annotations"] == theirs["annotations"]
        assert f'namespace="{NAMESPACE}"' in ours["expr"]


def test_the_default_jobs_are_the_ones_the_chart_scrapes(chart: helm.Chart) -> None:  # noqa: F811
    values = {"alerts": {"enabled": True}, "serviceMonitor": {"enabled": True}}
    values["proxy"] = {"enabled": True}
    docs = manifests(chart, values)
    (rule,) = _kinds(docs, "PrometheusRule")
    (down,) = [r for r in rules(rule["spec"]) if r["alert"] == "OffloadTargetDown"]
    jobs = re.search(r'job=~"([^"]+)"', down["expr"])
    assert jobs is not None
    # The Prometheus Operator names a ServiceMonitor's job after the Service, a PodMonitor's
    # NAMESPACE/NAME.
    (service,) = [
        s for s in _kinds(docs, "Service") if s["metadata"]["name"] == f"{RELEASE}-mqtt-offload"
    ]
    (pods,) = _kinds(docs, "PodMonitor")
    assert re.fullmatch(jobs.group(1), service["metadata"]["name"])
    assert re.fullmatch(jobs.group(1), f"{NAMESPACE}/{pods['metadata']['name']}")
    assert not re.fullmatch(jobs.group(1), "other-release-mqtt-offload")
    models = pytest.importorskip("cloudcoil.models.prometheus_operator.v1")
    parsed = models.PodMonitor.model_validate(pods)
    assert parsed.model_dump(by_alias=True, exclude_none=True) == pods
    proxy = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-proxy")
    )
    labels = proxy["spec"]["template"]["metadata"]["labels"]
    assert pods["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (container,) = proxy["spec"]["template"]["spec"]["containers"]
    assert pods["spec"]["podMetricsEndpoints"][0]["port"] in {p["name"] for p in container["ports"]}


def test_the_dashboard_configmap_carries_the_file_for_grafanas_sidecar(
    chart: helm.Chart,  # noqa: F811
) -> None:
    def dashboards(values: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            d
            for d in _kinds(manifests(chart, values), "ConfigMap")
            if d["metadata"]["name"].endswith("-dashboard")
        ]

    assert dashboards({}) == []
    (config,) = dashboards(
        {"dashboard": {"enabled": True, "annotations": {"grafana_folder": "MQTT"}}}
    )
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config["metadata"]["annotations"] == {"grafana_folder": "MQTT"}
    assert config["data"]["mqtt-offload.json"] == monitoring.DASHBOARD_FILE.read_text().rstrip("\n")
    import kubernetes_validate

    assert kubernetes_validate.validate(config, "1.30.0", strict=True) == "1.30"


def test_the_dashboard_has_a_row_per_component_and_queries_in_every_panel() -> None:
    board = json.loads(monitoring.DASHBOARD_FILE.read_text())
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Gateway", "Proxy", "Store", "Broker", "Targets"]
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    for panel in panels:
        assert panel["targets"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        for target in panel["targets"]:
            assert 'job=~"$job"' in target["expr"], (panel["title"], target["expr"])
            assert target["datasource"]["uid"] == "${datasource}"
    latency = [p for p in panels if any(t.get("exemplar") for t in p["targets"])]
    assert {p["title"] for p in latency} == {"Latency by route", "Offload and fetch latency"}


def test_lint_is_clean_with_every_monitoring_object_on() -> None:
    values = {
        "alerts": {"enabled": True},
        "dashboard": {"enabled": True},
        "serviceMonitor": {"enabled": True},
        "proxy": {"enabled": True},
    }
    report = helm.lint(monitoring.CHART, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_a_chains_expiry_is_its_earliest_certificates(tmp_path: Path) -> None:
    """offload_tls_certificate_expiry_timestamp_seconds: a client refuses a chain once any
    certificate in it expired, so a chain expires with its earliest; a file without one is
    a ValueError (the gateway then logs it and exports nothing for it)."""
    from client.metrics import certificate_expiry

    def make(name: str, days: int) -> Path:
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
             str(tmp_path / f"{name}.key"), "-out", str(tmp_path / f"{name}.pem"),
             "-days", str(days), "-subj", f"/CN={name}"],
            check=True, capture_output=True,
        )  # fmt: skip
        return tmp_path / f"{name}.pem"

    leaf, intermediate = make("leaf", 90), make("intermediate", 3)
    chain = tmp_path / "chain.pem"
    chain.write_text(leaf.read_text() + intermediate.read_text())
    assert certificate_expiry(chain) == certificate_expiry(intermediate)
    assert certificate_expiry(leaf) - certificate_expiry(intermediate) == pytest.approx(
        87 * 86400, abs=60
    )
    with pytest.raises(ValueError):
        certificate_expiry(tmp_path / "leaf.key")
