"""The chart's retention values (docs/operations.md): the groups file as a mounted ConfigMap
the gateway parses, the quota and dedup settings, the proxy's group."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
from test_helm import CHART_DIR, KUBE_VERSION, gateway_container, manifests

from client.protocol import Topic
from gateway.core._settings import Settings
from gateway.retention import parse_groups


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


VALUES: dict[str, Any] = {
    "gateway": {"allowAnonymous": True},
    "retention": {
        "groups": {"cameras/#": ["archive", "analytics"], "sensors/+/raw": ["archive"]},
        "members": {"archive": ["archiver-1"]},
        "maxStoredBytesPerUser": 53687091200,
        "confirmSweepInterval": 10,
    },
    "proxy": {"enabled": True, "group": "devices"},
}


def test_the_groups_file_is_rendered_mounted_and_parses(chart: helm.Chart) -> None:
    docs = manifests(chart, VALUES)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    config = next(data for name, data in maps.items() if not name.endswith("-retention"))
    groups = next(data for name, data in maps.items() if name.endswith("-retention"))
    rules = parse_groups(groups["groups.toml"])
    assert rules.groups_for(Topic("cameras/1")) == ("analytics", "archive")
    assert rules.may_confirm("archive", "archiver-1") and not rules.may_confirm("archive", "x")
    assert config["OFFLOAD_RETENTION_GROUPS_FILE"] == "/etc/mqtt-offload/retention/groups.toml"
    assert config["OFFLOAD_MAX_STORED_BYTES_PER_USER"] == "53687091200"
    assert config["OFFLOAD_DEDUP"] == "true" and config["OFFLOAD_CONFIRM_SWEEP_INTERVAL"] == "10"
    fields = {f"OFFLOAD_{f.upper()}": f for f in Settings.model_fields}
    Settings.model_validate({fields[k]: v for k, v in config.items() if k in fields})
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    deployment = next(d for name, d in deployments.items() if "proxy" not in name)
    mounts = {m["name"]: m["mountPath"] for m in gateway_container(deployment)["volumeMounts"]}
    assert mounts["retention"] == "/etc/mqtt-offload/retention"
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["retention"]["configMap"]["name"].endswith("-retention")
    proxy = next(d for name, d in deployments.items() if "proxy" in name)
    (container,) = proxy["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["OFFLOAD_PROXY_GROUP"] == "devices"


def test_without_groups_there_is_no_groups_file(chart: helm.Chart) -> None:
    docs = manifests(chart, {"gateway": {"allowAnonymous": True}})
    maps = [d for d in docs if d["kind"] == "ConfigMap"]
    assert len(maps) == 1 and "OFFLOAD_RETENTION_GROUPS_FILE" not in maps[0]["data"]


@pytest.mark.parametrize(
    "bad",
    [
        {"retention": {"groups": {"a/#": ["bad name"]}}},
        {"retention": {"maxStoredBytesPerUser": -1}},
        {"retention": {"typo": 1}},
        {"proxy": {"group": "-x"}},
    ],
)
def test_a_bad_retention_value_fails_the_install(chart: helm.Chart, bad: dict[str, Any]) -> None:
    with pytest.raises(Exception, match=r"values don't meet the specifications|schema"):
        manifests(chart, bad)
