"""The chart's optional offload-proxy Deployment and Service (docs/proxy.md)."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
from test_helm import KUBE_VERSION, NAMESPACE, chart, manifests, values_for  # noqa: F401

ON = {"proxy": {"enabled": True}}


def _proxy_objects(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs if d["metadata"]["name"].endswith("-proxy")}


@pytest.mark.parametrize("case", ["defaults", "example"])
def test_the_proxy_is_off_by_default_and_validates_strictly_when_on(
    chart: helm.Chart,  # noqa: F811
    case: str,
) -> None:
    assert _proxy_objects(manifests(chart, values_for(case))) == {}
    values = values_for(case)
    values["proxy"] = {"enabled": True}
    if not values.get("mqtt", {}).get("url", "mqtt://").startswith("mqtt://"):
        values["proxy"]["broker"] = "mqtt://mosquitto:1883"
    docs = manifests(chart, values)
    found = _proxy_objects(docs)
    assert set(found) == {"Deployment", "Service"}
    for doc in found.values():
        assert kubernetes_validate.validate(doc, KUBE_VERSION, strict=True) == "1.30"
    selector = found["Service"]["spec"]["selector"]
    pod_labels = found["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert (
        selector.items() <= pod_labels.items()
        and selector["app.kubernetes.io/component"] == "proxy"
    )
    gateway = next(d for d in docs if d["kind"] == "Service" and d not in found.values())
    assert not gateway["spec"]["selector"].items() <= pod_labels.items()  # never mixed up


def test_the_proxy_container_runs_offload_proxy_against_the_release(
    chart: helm.Chart,  # noqa: F811
) -> None:
    values = {"proxy": {"enabled": True, "extraConfig": {"OFFLOAD_PROXY_IDLE_TIMEOUT": "20"}}}
    found = _proxy_objects(manifests(chart, values))
    (container,) = found["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["offload-proxy"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["OFFLOAD_PROXY_BROKER"] == "mqtt://mosquitto.mosquitto.svc.cluster.local:1883"
    assert env["OFFLOAD_PROXY_ENDPOINT"] == f"http://offload-mqtt-offload.{NAMESPACE}.svc:80"
    assert env["OFFLOAD_PROXY_IDLE_TIMEOUT"] == "20"
    assert env["OFFLOAD_PROXY_JWT_USERNAME_CLAIM"] == "sub"  # the gateway's auth.jwt claim
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    from proxy import ProxySettings  # every rendered variable is one the proxy reads

    known = {f"OFFLOAD_PROXY_{name.upper()}" for name in ProxySettings.model_fields}
    assert set(env) <= known


def test_an_mqtts_broker_without_proxy_broker_fails_the_render(
    chart: helm.Chart,  # noqa: F811
) -> None:
    with pytest.raises(Exception, match=r"proxy\.broker"):
        manifests(chart, {"mqtt": {"url": "mqtts://b:8883"}, **ON})


@pytest.mark.parametrize("enabled", [False, True])
def test_the_websocket_listener_is_opt_in(
    chart: helm.Chart,  # noqa: F811
    enabled: bool,
) -> None:
    values = {"proxy": {"enabled": True, "websocket": {"enabled": enabled, "port": 443}}}
    found = _proxy_objects(manifests(chart, values))
    (container,) = found["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    service_ports = {
        p["name"]: (p["port"], p["targetPort"]) for p in found["Service"]["spec"]["ports"]
    }
    if enabled:
        assert env["OFFLOAD_PROXY_WS_PORT"] == "8083"
        assert container_ports["mqtt-ws"] == 8083
        assert service_ports["mqtt-ws"] == (443, "mqtt-ws")
        for doc in found.values():
            assert kubernetes_validate.validate(doc, KUBE_VERSION, strict=True) == "1.30"
    else:
        assert "OFFLOAD_PROXY_WS_PORT" not in env
        assert set(container_ports) == {"mqtt", "metrics"}
        assert set(service_ports) == {"mqtt"}


def test_workers_and_trusted_load_balancers_reach_the_proxy(
    chart: helm.Chart,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Several processes per pod and PROXY protocol from the named balancers, as settings
    the proxy reads; a writable /tmp for the workers' metrics files on a read-only root."""
    values = {
        "proxy": {
            "enabled": True,
            "replicaCount": 3,
            "workers": 4,
            "trustedLoadBalancers": ["10.0.0.0/16", "2001:db8::/64", "192.0.2.7"],
        },
        "tmp": {"sizeLimit": "2Gi"},  # what 4 workers may spool in a broadcast: 1,792 MiB
    }
    found = _proxy_objects(manifests(chart, values))
    for doc in found.values():
        assert kubernetes_validate.validate(doc, KUBE_VERSION, strict=True) == "1.30"
    deployment = found["Deployment"]
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    from proxy import ProxySettings

    settings = ProxySettings()
    assert settings.workers == 4
    assert [str(n) for n in settings.trusted_lbs] == [
        "10.0.0.0/16",
        "2001:db8::/64",
        "192.0.2.7/32",
    ]
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/tmp"
    assert any(v["name"] == mount["name"] and "emptyDir" in v for v in pod["volumes"])
    default = _proxy_objects(manifests(chart, ON))["Deployment"]
    (plain,) = default["spec"]["template"]["spec"]["containers"]
    names = {e["name"]: e["value"] for e in plain["env"]}
    assert names["OFFLOAD_PROXY_WORKERS"] == "1" and "OFFLOAD_PROXY_TRUSTED_LBS" not in names
    with pytest.raises(Exception, match="trustedLoadBalancers"):
        manifests(chart, {"proxy": {"enabled": True, "trustedLoadBalancers": ["lb.example"]}})


def test_the_listen_backlog_and_an_accounts_share_reach_the_proxy_when_set(
    chart: helm.Chart,  # noqa: F811
) -> None:
    """`proxy.backlog` is OFFLOAD_PROXY_BACKLOG (unset by default: the pod's somaxconn),
    `proxy.maxConnectionsPerUser` OFFLOAD_PROXY_MAX_CONNECTIONS_PER_USER (unset: an eighth
    of maxConnections)."""

    def env(values: dict[str, Any]) -> dict[str, str]:
        deployment = _proxy_objects(manifests(chart, values))["Deployment"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e["value"] for e in container["env"]}

    default = env(ON)
    assert "OFFLOAD_PROXY_BACKLOG" not in default
    assert "OFFLOAD_PROXY_MAX_CONNECTIONS_PER_USER" not in default
    values = {"proxy": {"enabled": True, "backlog": 8192, "maxConnectionsPerUser": 5000}}
    found = env(values)
    assert found["OFFLOAD_PROXY_BACKLOG"] == "8192"
    assert found["OFFLOAD_PROXY_MAX_CONNECTIONS_PER_USER"] == "5000"
    for bad in ({"backlog": 0}, {"maxConnectionsPerUser": 0}):
        with pytest.raises(Exception, match=next(iter(bad))):
            manifests(chart, {"proxy": {"enabled": True, **bad}})


def _gateway_config(docs: list[dict[str, Any]]) -> dict[str, str]:
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and "OFFLOAD_STORAGE_URL" in d["data"]]
    return dict(config["data"])


@pytest.mark.parametrize(
    ("values", "trusted"),
    [
        ({}, None),  # no proxy: no hop is trusted
        (ON, "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7"),  # the pods' networks
        ({**ON, "gateway": {"trustedProxies": ["10.42.0.0/16"]}}, "10.42.0.0/16"),
        ({"gateway": {"trustedProxies": ["192.0.2.7"]}}, "192.0.2.7"),  # an Ingress, say
    ],
)
def test_the_gateway_trusts_the_proxy_it_is_deployed_with_to_name_each_device(
    chart: helm.Chart,  # noqa: F811
    values: dict[str, Any],
    trusted: str | None,
) -> None:
    """The proxy sends each device's address (X-Forwarded-For); the gateway believes it only
    from OFFLOAD_TRUSTED_PROXIES, which the chart sets for the proxy it deploys, so the
    per-address limits count devices, not the proxy's pods."""
    from gateway import Settings

    config = _gateway_config(manifests(chart, values))
    assert config.get("OFFLOAD_TRUSTED_PROXIES") == trusted
    assert config["OFFLOAD_MAX_UPLOADS_PER_USER"] == "8"
    networks = Settings(trusted_proxies=trusted or "").trusted_networks  # the gateway reads it
    assert len(networks) == (len(trusted.split(",")) if trusted else 0)


def _proxy_env(chart: helm.Chart, values: dict[str, Any]) -> dict[str, str]:  # noqa: F811
    deployment = _proxy_objects(manifests(chart, values))["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def test_a_broadcasts_shared_bytes_and_their_shares_reach_the_proxy(
    chart: helm.Chart,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`proxy.maxSharedBytes`, `sharedMemoryBytes` (the proxy's defaults, always set) and an
    account's and an address's share of them (unset: an eighth), as settings the proxy
    reads (docs/proxy.md, "One fetch for a broadcast")."""
    from proxy import ProxySettings

    default = _proxy_env(chart, ON)
    assert default["OFFLOAD_PROXY_MAX_SHARED_BYTES"] == "536870912"
    assert default["OFFLOAD_PROXY_SHARED_MEMORY_BYTES"] == "67108864"
    assert not {
        "OFFLOAD_PROXY_MAX_SHARED_BYTES_PER_USER",
        "OFFLOAD_PROXY_MAX_SHARED_BYTES_PER_ADDRESS",
    } & set(default)
    shares = {
        "maxSharedBytes": 256 * 2**20,
        "sharedMemoryBytes": 32 * 2**20,
        "maxSharedBytesPerUser": 128 * 2**20,
        "maxSharedBytesPerAddress": 0,  # no device address may share
    }
    for name, value in _proxy_env(chart, {"proxy": {"enabled": True, **shares}}).items():
        monkeypatch.setenv(name, value)
    limits = ProxySettings().shared_limits
    assert limits.memory == 32 * 2**20
    assert (limits.shares.total, limits.shares.per_user, limits.shares.per_address) == (
        256 * 2**20,
        128 * 2**20,
        0,
    )
    for bad in (
        {"maxSharedBytes": -1},
        {"sharedMemoryBytes": "64Mi"},
        {"maxSharedBytesPerUser": -1},
    ):
        with pytest.raises(Exception, match=next(iter(bad))):
            manifests(chart, {"proxy": {"enabled": True, **bad}})


@pytest.mark.parametrize(
    ("values", "fits"),
    [
        ({"proxy": {"workers": 2}}, True),  # 2 x 448 MiB in 1 GiB
        ({"proxy": {"workers": 3}}, False),  # 1,344 MiB
        ({"proxy": {"workers": 3}, "tmp": {"sizeLimit": "1500Mi"}}, True),
        ({"proxy": {"workers": 3}, "tmp": {"sizeLimit": "1.5G"}}, True),  # 1,430 MiB
        ({"proxy": {"workers": 3}, "tmp": {"sizeLimit": "1.4G"}}, False),  # 1,335 MiB
        ({"proxy": {"workers": 3}, "tmp": {"sizeLimit": ""}}, True),  # no limit
        ({"proxy": {"workers": 8, "maxSharedBytes": 0}}, True),  # never shared
        ({"proxy": {"workers": 8, "sharedMemoryBytes": 536870912}}, True),  # all in memory
        ({"proxy": {"maxSharedBytes": 2**30, "sharedMemoryBytes": 0}}, False),  # 1 GiB
    ],
)
def test_what_a_broadcast_may_spool_must_fit_the_pods_tmp(
    chart: helm.Chart,  # noqa: F811
    values: dict[str, Any],
    fits: bool,
) -> None:
    """Each proxy process may spool maxSharedBytes - sharedMemoryBytes to /tmp during a
    broadcast (448 MiB by default): an emptyDir past its sizeLimit gets the pod evicted,
    every device behind it cut off, so the chart refuses to render what cannot fit."""
    values = {**values, "proxy": {"enabled": True, **values["proxy"]}}
    if fits:
        _proxy_env(chart, values)
    else:
        with pytest.raises(Exception, match=r"tmp\.sizeLimit"):
            manifests(chart, values)
