"""The monitoring files, each rendered from its one source (docs/operations.md, "Alerts").

* `helm/monitoring/alerts.yaml`: the chart's alert rules (helm/mqtt-offload/templates/_alerts.tpl)
  rendered with the chart's default thresholds, for a Prometheus without the Operator, which
  scrapes the gateway as job `mqtt-offload-gateway` and the proxy as `mqtt-offload-proxy`;
* `helm/mqtt-offload/dashboards/mqtt-offload.json`: the Grafana dashboard, from `ROWS` below
  (the chart's ConfigMap reads the file as it is).

`python scripts/monitoring.py` writes both; `--check` only says whether they are current
(tests/test_alerts.py checks the same). The rules are rendered by Helm's own Go library
(helm-python-sdk, a test dependency), as `helm template` would.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "mqtt-offload"
RULES_FILE = ROOT / "helm" / "monitoring" / "alerts.yaml"
DASHBOARD_FILE = CHART / "dashboards" / "mqtt-offload.json"

#: The alerts' values in the chart (alerts.rules): their names, `for:` and thresholds.
DEFAULT_RULES: dict[str, dict[str, Any]] = yaml.safe_load((CHART / "values.yaml").read_text())[
    "alerts"
]["rules"]

#: The scrape jobs helm/monitoring/alerts.yaml expects (OffloadTargetDown), as the docs name them.
PLAIN_JOBS = "mqtt-offload-(gateway|proxy)"

HEADER = """\
# mqtt-offload's alert rules for Prometheus (rule_files), docs/operations.md "Alerts".
# Rendered by `python scripts/monitoring.py` from helm/mqtt-offload/templates/_alerts.tpl with
# the chart's default thresholds (helm/mqtt-offload/values.yaml, alerts.rules): edit those, not
# this file. OffloadTargetDown expects the scrape jobs mqtt-offload-gateway and
# mqtt-offload-proxy. Unit tests: promtool test rules helm/monitoring/alerts.test.yaml
"""


# --- the rules ---------------------------------------------------------------------------


def render_rules(alerts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The rule groups the chart renders (`{"groups": [...]}`).

    Args:
        alerts: values under `alerts` beside the plain file's (short `for:` in a test).
    """
    import helm_python as helm

    values = {"alerts": {"enabled": True, "selector": "", "jobs": PLAIN_JOBS, **(alerts or {})}}
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name="mqtt-offload", namespace="default", is_install=True)
    rule = yaml.safe_load(out["mqtt-offload/templates/prometheusrule.yaml"])
    return dict(rule["spec"])


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None  # multi-line expressions stay readable
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def rules_text(groups: Mapping[str, Any]) -> str:
    """A rules file: the header and the groups as YAML."""
    body = yaml.dump(dict(groups), Dumper=_Dumper, sort_keys=False, width=1000)
    return HEADER + body


# --- the dashboard -----------------------------------------------------------------------

J = 'job=~"$job"'  # every query keeps to the jobs the dashboard's variable selects
RATE = "$__rate_interval"


def sel(metric: str, matchers: str = "") -> str:
    """`metric{matchers,job=~"$job"}`."""
    return f"{metric}{{{matchers + ',' if matchers else ''}{J}}}"


def rate(metric: str, by: str = "", matchers: str = "") -> str:
    """The per-second rate of a counter, summed (by `by`)."""
    inner = f"rate({sel(metric, matchers)}[{RATE}])"
    return f"sum by ({by}) ({inner})" if by else f"sum({inner})"


def total(metric: str, by: str = "", matchers: str = "", how: str = "sum") -> str:
    """A gauge summed (or `how`: min, max) by `by`."""
    return f"{how} by ({by}) ({sel(metric, matchers)})" if by else f"{how}({sel(metric, matchers)})"


@dataclass(frozen=True)
class Panel:
    """One panel: its title, what it tells, its queries (expression, legend) and unit."""

    title: str
    description: str
    targets: tuple[tuple[str, str], ...]
    unit: str = "short"
    kind: str = "timeseries"
    exemplars: bool = False  # latency: a dot per exemplar, linked to its trace
    width: int = 8


def quantiles(metric: str, by: str, legend: str) -> tuple[tuple[str, str], ...]:
    """p50, p90 and p99 of a histogram (by `by`)."""
    return tuple(
        (
            f"histogram_quantile({q}, sum by ({by}le) (rate({sel(metric + '_bucket')}[{RATE}])))",
            f"p{int(q * 100)} {legend}".rstrip(),
        )
        for q in (0.5, 0.9, 0.99)
    )


GATEWAY = (
    Panel(
        "Requests by route",
        "HTTP requests per second, by method and route template.",
        ((rate("offload_http_requests_total", "method, route"), "{{method}} {{route}}"),),
        unit="reqps",
    ),
    Panel(
        "Bytes by route",
        "Request and response body bytes per second, by route.",
        (
            (rate("offload_http_received_bytes_total", "route"), "in {{route}}"),
            (rate("offload_http_sent_bytes_total", "route"), "out {{route}}"),
        ),
        unit="Bps",
    ),
    Panel(
        "Payloads stored by kind",
        "Messages stored per second: envelope, raw, publish, resumable (tus), direct "
        "(straight to the store).",
        ((rate("offload_uploads_total", "kind"), "{{kind}}"),),
        unit="ops",
    ),
    Panel(
        "Latency by route",
        "p50, p90 and p99 per route; the dots are exemplars: a click opens the trace of a "
        "request in that bucket (docs/operations.md, 'From a slow bucket to its trace').",
        quantiles("offload_http_request_seconds", "method, route, ", "{{method}} {{route}}"),
        unit="s",
        exemplars=True,
        width=12,
    ),
    Panel(
        "Errors by status",
        "4xx (the caller's) and 5xx (the gateway's; 503 too when every transfer slot is "
        "taken) responses per second.",
        ((rate("offload_http_requests_total", "status", 'status=~"[45].."'), "{{status}}"),),
        unit="reqps",
        width=6,
    ),
    Panel(
        "Refused requests",
        "401 (bad credentials), 403 (not allowed), 429 (too many at once, or the failed-login "
        "limit) per second, and downloads their client abandoned.",
        (
            (rate("offload_auth_failures_total", "status"), "{{status}}"),
            (rate("offload_downloads_abandoned_total"), "downloads abandoned"),
        ),
        unit="reqps",
        width=6,
    ),
)

PROXY = (
    Panel(
        "Connections",
        "Device connections per proxy replica, against its limit.",
        (
            (total("offload_proxy_connections", "instance"), "{{instance}}"),
            (
                total("offload_proxy_pool_limit", "instance", 'pool="connections"'),
                "limit {{instance}}",
            ),
        ),
    ),
    Panel(
        "Pools in use",
        "Uploads streaming to the gateway and placeholders being resolved, against each "
        "pool's size.",
        (
            (total("offload_proxy_uploads"), "uploads"),
            (total("offload_proxy_fetches"), "fetches"),
            (
                total("offload_proxy_pool_limit", "pool", 'pool=~"uploads|fetches"'),
                "limit {{pool}}",
            ),
        ),
    ),
    Panel(
        "Shares full",
        "Refusals (connections, uploads, logins) and waits (fetches) per second because a "
        "pool's total, an account's or an address's share was taken.",
        ((rate("offload_proxy_shares_full_total", "pool, share"), "{{pool}} {{share}}"),),
        unit="ops",
    ),
    Panel(
        "Messages: offloaded, direct, chunked",
        "PUBLISHes offloaded to the gateway, placeholders resolved for devices, chunked "
        "messages delivered whole, and MQTT packets passed direct (in runs or one by one), "
        "per second.",
        (
            (rate("offload_proxy_offloaded_total"), "offloaded"),
            (rate("offload_proxy_resolved_total"), "placeholders resolved"),
            (rate("offload_proxy_reassembled_total"), "chunked, reassembled"),
            (
                rate("offload_proxy_packets_relayed_total", "direction")
                + " + "
                + rate("offload_proxy_packets_decoded_total", "direction"),
                "direct packets {{direction}}",
            ),
        ),
        unit="ops",
    ),
    Panel(
        "Payload bytes",
        "Bytes streamed to the gateway (offloads) and fetched for devices.",
        (
            (rate("offload_proxy_uploaded_bytes_total"), "offloaded"),
            (rate("offload_proxy_fetched_bytes_total"), "fetched"),
        ),
        unit="Bps",
    ),
    Panel(
        "Offload and fetch latency",
        "p50, p90, p99 of an offload (PUBLISH to the gateway's answer) and of a fetch; "
        "exemplars link to the traces.",
        quantiles("offload_proxy_offload_seconds", "", "offload")
        + quantiles("offload_proxy_fetch_seconds", "", "fetch"),
        unit="s",
        exemplars=True,
    ),
    Panel(
        "Failures by kind",
        "Offloads refused or failed (the gateway's status, or an MQTT reason), placeholders "
        "handed on unresolved, chunked messages dropped, connections refused and ended for "
        "malformed input, per second.",
        (
            (rate("offload_proxy_offload_failures_total", "why"), "offload {{why}}"),
            (rate("offload_proxy_placeholders_passed_total", "why"), "unresolved {{why}}"),
            (rate("offload_proxy_chunk_failures_total", "why"), "chunked {{why}}"),
            (rate("offload_proxy_refused_connections_total", "why"), "refused {{why}}"),
            (rate("offload_proxy_protocol_errors_total"), "malformed input"),
        ),
        unit="ops",
        width=24,
    ),
)

STORE = (
    Panel(
        "Store up",
        "1 when the gateway's last probe of the object store succeeded "
        "(OFFLOAD_STORE_PROBE_INTERVAL).",
        ((total("offload_store_up", "instance", how="min"), "{{instance}}"),),
        kind="stat",
        width=6,
    ),
    Panel(
        "Store errors",
        "Failed object store operations per second.",
        ((rate("offload_storage_errors_total", "instance"), "{{instance}}"),),
        unit="ops",
        width=6,
    ),
    Panel(
        "Retention sweeps",
        "Retention sweeps per second, by result (ok, failed).",
        ((rate("offload_sweeper_runs_total", "result"), "{{result}}"),),
        unit="ops",
        width=6,
    ),
    Panel(
        "Since the last sweep",
        "Seconds since each replica's last finished sweep (OFFLOAD_SWEEP_INTERVAL).",
        (
            (
                "time() - max by (instance) "
                f"({sel('offload_sweeper_last_success_timestamp_seconds')} > 0)",
                "{{instance}}",
            ),
        ),
        unit="s",
        kind="stat",
        width=6,
    ),
)

BROKER = (
    Panel(
        "Broker link up",
        "1 while the gateway's broker link is connected.",
        ((total("offload_broker_up", "instance", how="min"), "{{instance}}"),),
        kind="stat",
    ),
    Panel(
        "Gateway publishes failed",
        "Placeholders and HTTP publishes the broker refused or dropped, per second.",
        ((rate("offload_broker_errors_total", "instance"), "{{instance}}"),),
        unit="ops",
    ),
    Panel(
        "Proxy: broker unreachable",
        "Device connections the proxy refused because the broker did not answer, per second.",
        (
            (
                rate(
                    "offload_proxy_refused_connections_total",
                    "instance",
                    'why="broker-unreachable"',
                ),
                "{{instance}}",
            ),
        ),
        unit="ops",
    ),
)

TARGETS = (
    Panel(
        "Replicas scraped",
        "1 per gateway and proxy replica Prometheus scraped last time, 0 when the scrape failed.",
        ((sel("up"), "{{job}} {{instance}}"),),
        width=12,
    ),
    Panel(
        "Certificates expire in",
        "Days until each certificate chain the gateway and the proxy present expires.",
        (
            (
                f"({sel('offload_tls_certificate_expiry_timestamp_seconds')} - time()) / 86400",
                "{{job}} {{certificate}}",
            ),
        ),
        unit="d",
        kind="stat",
        width=12,
    ),
)

ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Gateway", GATEWAY),
    ("Proxy", PROXY),
    ("Store", STORE),
    ("Broker", BROKER),
    ("Targets", TARGETS),
)

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets = []
    for index, (expr, legend) in enumerate(panel.targets):
        target: dict[str, Any] = {
            "datasource": DATASOURCE,
            "expr": expr,
            "legendFormat": legend,
            "refId": chr(ord("A") + index),
        }
        if panel.exemplars:
            target["exemplar"] = True
        targets.append(target)
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {},
        "targets": targets,
    }


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard: a row per component, its panels laid out left to right."""
    panels: list[dict[str, Any]] = []
    y = 0
    for title, row in ROWS:
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        x = 0
        for panel in row:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(_panel(panel, len(panels) + 1, x, y))
            x += panel.width
        y += 8
    return {
        "title": "MQTT offload",
        "uid": "mqtt-offload",
        "description": "The gateway, offload-proxy, the object store and the broker "
        "(docs/operations.md, 'Alerts' and 'Dashboard').",
        "tags": ["mqtt-offload"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                },
                {
                    "name": "job",
                    "label": "Job",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "query": {
                        "query": 'label_values({__name__=~"offload_http_requests_total|'
                        'offload_proxy_connections"}, job)',
                        "refId": "jobs",
                    },
                    "refresh": 2,
                    "multi": True,
                    "includeAll": True,
                    "allValue": ".+",
                    "current": {"text": "All", "value": "$__all"},
                },
            ]
        },
        "panels": panels,
    }


def dashboard_text() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


# --- the command ---------------------------------------------------------------------------


def expected() -> dict[Path, str]:
    """Each generated file and what it must hold."""
    return {RULES_FILE: rules_text(render_rules()), DASHBOARD_FILE: dashboard_text()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail when a file is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in expected().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(map(str, stale))}: run python scripts/monitoring.py")
        return 1
    for path in stale:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
