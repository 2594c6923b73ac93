"""The Helm chart: rendered and linted by Helm's own Go library, validated against Kubernetes.

`helm-python-sdk` binds Helm v4's Go SDK (a shared library inside the wheel), so no helm binary
and no cluster are needed; `kubernetes-validate` ships the Kubernetes OpenAPI schemas per minor
version, and its `-strict` variants reject unknown fields, which is what catches a mis-indented
key in a template. The ServiceMonitor is a Prometheus Operator CRD with no schema there; it is
checked against the operator's generated models instead, when those are installed.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART_DIR = ROOT / "helm" / "mqtt-offload"
EXAMPLE = CHART_DIR / "examples" / "minio-mosquitto.yaml"
KUBE_VERSION = "1.30.0"
RELEASE = "offload"
NAMESPACE = "mqtt-offload"

# Kinds Kubernetes itself does not define; each must be checked some other way below.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}

# Every branch the default and example values leave untaken: gateway TLS, no HPA,
# maxUnavailable, inline credentials and files, hard anti-affinity, plain ingress.
BRANCHES: dict[str, Any] = {
    "replicaCount": 3,
    "image": {"digest": "sha256:" + "ab" * 32},
    "imagePullSecrets": [{"name": "registry"}],
    "gateway": {"workers": 2, "allowAnonymous": True, "extraConfig": {"OFFLOAD_FUTURE": "1"}},
    "storage": {
        "url": "s3://s3.example.com/bucket?secure=true",
        "accessKey": "a",
        "secretKey": "s",
    },
    "mqtt": {"url": "mqtts://broker.example.com", "username": "gw", "password": "pw"},
    "auth": {
        "secret": "x" * 40,
        "passwordFile": {"content": "gw:$7$101$c2FsdA==$aGFzaA=="},
        "aclFile": {"content": "user gw\ntopic readwrite #\n"},
        "tokensFile": {"existingSecret": "tokens", "existingSecretKey": "tokens.txt"},
    },
    "tls": {"enabled": True, "existingSecret": "gateway-tls"},
    "service": {"type": "LoadBalancer", "port": 443},
    "ingress": {"enabled": True, "nginxAnnotations": False, "className": "traefik"},
    "autoscaling": {"enabled": False},
    "podDisruptionBudget": {"minAvailable": None, "maxUnavailable": "25%"},
    "tmp": {"medium": "Memory", "sizeLimit": "256Mi"},
    "podAntiAffinityPreset": "hard",
    "priorityClassName": "high",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "networkPolicy": {"egress": {"extraPorts": [9000]}},
    "serviceMonitor": {"enabled": True},
    "serviceAccount": {"create": False, "name": "existing"},
    "extraEnv": [{"name": "TZ", "value": "UTC"}],
    "extraVolumes": [{"name": "ca", "configMap": {"name": "ca-bundle"}}],
    "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/custom", "readOnly": True}],
}


def example_values() -> dict[str, Any]:
    return helm.values_from_yaml(EXAMPLE.read_text())


CASES: dict[str, Any] = {"defaults": {}, "example": example_values, "branches": BRANCHES}


def values_for(case: str) -> dict[str, Any]:
    values = CASES[case]
    return copy.deepcopy(values() if callable(values) else values)


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict[str, Any]) -> dict[str, str]:
    return chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def manifests(chart: helm.Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders, NOTES.txt left out."""
    docs: list[dict[str, Any]] = []
    for path, text in sorted(render(chart, values).items()):
        if path.endswith(".yaml"):
            docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for doc in docs:
        assert doc["kind"] not in found, f"two {doc['kind']} objects"
        found[doc["kind"]] = doc
    return found


def gateway_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


# --- Helm itself -------------------------------------------------------------------------------


def test_helm_library_is_the_go_sdk() -> None:
    # A Python re-implementation would be no evidence that real Helm accepts the chart.
    assert helm.helm_sdk_version().startswith("v4.")
    assert Path(helm.library_path).name.startswith("libhelm_c")


@pytest.mark.parametrize("case", sorted(CASES))
def test_lint_is_clean(case: str) -> None:
    report = helm.lint(
        CHART_DIR,
        values_for(case),
        strict=True,
        namespace=NAMESPACE,
        kube_version=f"v{KUBE_VERSION}",
    )
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); warnings and errors must not occur.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_reports_a_bad_value() -> None:
    # Proves the lint test above can fail: the same call with a schema violation.
    report = helm.lint(CHART_DIR, {"replicaCount": "three"}, strict=True)
    text = " ".join(m["error"] for m in report["messages"]) + " ".join(report["errors"])
    assert "replicaCount" in text


# --- Kubernetes schemas ------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_manifest_validates_strictly_against_kubernetes(chart: helm.Chart, case: str) -> None:
    assert KUBE_VERSION in kubernetes_validate.utils.all_versions()
    validated: set[str] = set()
    for doc in manifests(chart, values_for(case)):
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        schema_version = kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        # validate() silently falls back to an older schema set; make sure it did not.
        assert schema_version == "1.30"
        validated.add(doc["kind"])
    assert {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ConfigMap",
        "NetworkPolicy",
    } <= validated
    if case != "branches":  # the only case that turns autoscaling off
        assert "HorizontalPodAutoscaler" in validated


def test_strict_validation_catches_a_misplaced_field(chart: helm.Chart) -> None:
    # The strict schemas are what make the test above worth having: show one failing.
    deployment = by_kind(manifests(chart, {}))["Deployment"]
    gateway_container(deployment)["livenessProbe"]["path"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("case", ["example", "branches"])
def test_service_monitor_matches_the_operator_model(chart: helm.Chart, case: str) -> None:
    # kubernetes-validate has no CRD schemas; cloudcoil's models are generated from the
    # Prometheus Operator CRDs. pydantic ignores unknown fields, so a lossless round trip is
    # the strictness check.
    models = pytest.importorskip("cloudcoil.models.prometheus_operator.v1")
    monitor = by_kind(manifests(chart, values_for(case)))["ServiceMonitor"]
    parsed = models.ServiceMonitor.model_validate(monitor)
    assert parsed.model_dump(by_alias=True, exclude_none=True) == monitor


@pytest.mark.parametrize("case", ["example", "branches"])
def test_prometheus_scrapes_the_metrics_port_never_the_api(chart: helm.Chart, case: str) -> None:
    """Issue 51: `/metrics` on the API port showed anyone the trace ids of every user's
    requests (its exemplars). The gateway serves it on a port of its own; the ServiceMonitor
    scrapes that port by name, through the Service, and the NetworkPolicy lets it in."""
    objects = by_kind(manifests(chart, values_for(case)))
    endpoints = objects["ServiceMonitor"]["spec"]["endpoints"]
    assert [(e["port"], e["path"], e["scheme"]) for e in endpoints] == [
        ("metrics", "/metrics", "http")
    ]
    ports = {p["name"]: p for p in objects["Service"]["spec"]["ports"]}
    assert ports["metrics"]["targetPort"] == "metrics"
    assert ports["http"]["targetPort"] == "http"
    container = gateway_container(objects["Deployment"])
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = objects["ConfigMap"]["data"]
    assert named["metrics"] == int(config["OFFLOAD_METRICS_PORT"]) != named["http"]
    assert config["OFFLOAD_METRICS_HOST"] == "0.0.0.0"  # the pod's address: Prometheus's
    # Probes stay on the API port, where the process answers them.
    assert container["livenessProbe"]["httpGet"]["port"] == "http"
    allowed = objects["NetworkPolicy"]["spec"]["ingress"][0]["ports"]
    assert {p["port"] for p in allowed} == {"http", "metrics"}
    if objects.get("Ingress"):
        for rule in objects["Ingress"]["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                assert path["backend"]["service"]["port"]["name"] == "http"


# --- What the chart must contain ---------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_renders_the_required_objects(chart: helm.Chart, case: str) -> None:
    kinds = {doc["kind"] for doc in manifests(chart, values_for(case))}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "NetworkPolicy"} <= kinds
    if values_for(case).get("autoscaling", {}).get("enabled", True):
        assert "HorizontalPodAutoscaler" in kinds


@pytest.mark.parametrize("case", ["defaults", "example"])
def test_hpa_and_pdb_are_on_by_default(chart: helm.Chart, case: str) -> None:
    objects = by_kind(manifests(chart, values_for(case)))
    hpa, deployment = objects["HorizontalPodAutoscaler"], objects["Deployment"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    # With an HPA the Deployment must not pin replicas, or every upgrade resets the scale.
    assert "replicas" not in deployment["spec"]
    assert objects["PodDisruptionBudget"]["apiVersion"] == "policy/v1"


@pytest.mark.parametrize("case", sorted(CASES))
def test_selectors_match_the_pods(chart: helm.Chart, case: str) -> None:
    objects = by_kind(manifests(chart, values_for(case)))
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    selectors = [
        objects["Deployment"]["spec"]["selector"]["matchLabels"],
        objects["Service"]["spec"]["selector"],
        objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"],
        objects["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"],
    ]
    for selector in selectors:
        assert selector.items() <= pod_labels.items()


@pytest.mark.parametrize("case", sorted(CASES))
def test_probes_resources_and_hardening(chart: helm.Chart, case: str) -> None:
    deployment = by_kind(manifests(chart, values_for(case)))["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = gateway_container(deployment)

    assert [p["name"] for p in container["ports"]] == ["http", "metrics"]
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert container[probe]["httpGet"]["path"] == path
        assert container[probe]["httpGet"]["port"] == "http"
    assert container["resources"]["requests"]["cpu"]
    assert container["resources"]["requests"]["memory"]
    assert container["resources"]["limits"]["memory"]

    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["automountServiceAccountToken"] is False

    # The only writable path: /tmp from an emptyDir.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    for mount in container["volumeMounts"]:
        if mount["mountPath"] != "/tmp":
            assert mount.get("readOnly") is True, mount

    # Graceful shutdown: the preStop pause must fit well inside the grace period.
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert 0 < pause < pod["terminationGracePeriodSeconds"] / 2


def test_container_command_line(chart: helm.Chart) -> None:
    container = gateway_container(
        by_kind(manifests(chart, {"gateway": {"workers": 3}}))["Deployment"]
    )
    assert container["args"] == ["--host", "0.0.0.0", "--port", "8080", "--workers", "3"]
    assert container["ports"][0]["containerPort"] == 8080


def test_service_account_token_is_not_mounted(chart: helm.Chart) -> None:
    account = by_kind(manifests(chart, {}))["ServiceAccount"]
    assert account["automountServiceAccountToken"] is False


# --- Settings and secrets ----------------------------------------------------------------------


def env_sources(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {
        e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in container["env"]
        if "valueFrom" in e
    }


def config_map(chart: helm.Chart, values: dict[str, Any]) -> dict[str, str]:
    data = by_kind(manifests(chart, values))["ConfigMap"]["data"]
    assert isinstance(data, dict)
    return data


def test_every_rendered_setting_is_one_the_gateway_reads(chart: helm.Chart) -> None:
    """A misspelt OFFLOAD_* name would be ignored silently by pydantic-settings."""
    from gateway.core._settings import Settings

    values = {
        "gateway": {"corsOrigins": "https://app.example.com"},
        "storage": {"publicUrl": "https://s3.example.com"},
    }
    names = {f"OFFLOAD_{field.upper()}" for field in Settings.model_fields}
    config = config_map(chart, values)
    assert set(config) <= names
    # And the gateway accepts every value the chart renders (types, ranges, CORS syntax).
    fields = {f"OFFLOAD_{f.upper()}": f for f in Settings.model_fields}
    Settings.model_validate({fields[k]: v for k, v in config.items()})


def test_load_settings_follow_the_values(chart: helm.Chart) -> None:
    values = {
        "gateway": {
            "maxTransfers": 8,
            "hashThreads": 4,
            "timeouts": {"header": 4, "bodyIdle": 5, "sendIdle": 6, "storeStall": 7, "health": 8},
        },
        "storage": {"timeout": 3, "partMemory": 64 * 2**20},
    }
    config = config_map(chart, values)
    assert config["OFFLOAD_MAX_TRANSFERS"] == "8"
    assert config["OFFLOAD_S3_PART_MEMORY"] == str(64 * 2**20)
    assert config_map(chart, {})["OFFLOAD_MAX_TRANSFERS"] == "72"
    assert config["OFFLOAD_HASH_THREADS"] == "4"
    assert config["OFFLOAD_HEADER_TIMEOUT"] == "4"
    assert config["OFFLOAD_BODY_IDLE_TIMEOUT"] == "5"
    assert config["OFFLOAD_HEALTH_TIMEOUT"] == "8"
    assert config["OFFLOAD_S3_TIMEOUT"] == "3"
    defaults = config_map(chart, {})
    assert "OFFLOAD_CORS_ORIGINS" not in defaults  # no CORS unless origins named
    assert "OFFLOAD_S3_PUBLIC_URL" not in defaults  # direct transfers only when asked for


def test_default_transfers_fit_the_memory_limit() -> None:
    """Admission (maxTransfers) must refuse before the pod's memory limit kills it."""
    values = yaml.safe_load(Path(CHART_DIR / "values.yaml").read_text())
    limit = values["resources"]["limits"]["memory"]
    units = {"Mi": 2**20, "Gi": 2**30}
    limit_bytes = int(limit[:-2]) * units[limit[-2:]]
    # docs/operations.md's rule: 100 MiB idle, 12 MiB per transfer under load (bench/load.py,
    # 16 x 64 MiB uploads + 4 downloads at once), the part budget shared by all uploads.
    # tests/test_chart_capacity.py runs maxTransfers uploads at these settings.
    baseline, per_transfer = 100 * 2**20, 12 * 2**20
    storage = values["storage"]
    assert storage["partMemory"] >= storage["partSize"] * (storage["parallelUploads"] + 1)
    assert baseline + storage["partMemory"] <= limit_bytes
    assert baseline + values["gateway"]["maxTransfers"] * per_transfer <= limit_bytes
    assert values["gateway"]["maxTransfers"] >= 72  # issue 31: three times 24, same memory


def test_example_reads_credentials_from_existing_secrets(chart: helm.Chart) -> None:
    objects = by_kind(manifests(chart, example_values()))
    assert "Secret" not in objects  # nothing inline: the chart must not invent an empty Secret
    container = gateway_container(objects["Deployment"])
    assert env_sources(container) == {
        "OFFLOAD_S3_ACCESS_KEY": ("offload-s3", "access-key"),
        "OFFLOAD_S3_SECRET_KEY": ("offload-s3", "secret-key"),
        "OFFLOAD_MQTT_USERNAME": ("offload-mqtt", "username"),
        "OFFLOAD_MQTT_PASSWORD": ("offload-mqtt", "password"),
        "OFFLOAD_AUTH_SECRET": ("offload-auth", "auth-secret"),
    }
    config = objects["ConfigMap"]["data"]
    assert config["OFFLOAD_PUBLIC_URL"] == "https://offload.example.com"
    assert config["OFFLOAD_TLS"] == "true"  # TLS ends at the Ingress; clients still use https
    assert config["OFFLOAD_MAX_BODY_BYTES"] == "2147483648"
    assert config["OFFLOAD_S3_PART_SIZE"] == "16777216"
    assert config["OFFLOAD_S3_PARALLEL_UPLOADS"] == "3"
    assert container["envFrom"] == [
        {"configMapRef": {"name": objects["ConfigMap"]["metadata"]["name"]}}
    ]


@pytest.mark.parametrize("case", ["example", "branches"])
def test_file_settings_point_into_mounted_secrets(chart: helm.Chart, case: str) -> None:
    objects = by_kind(manifests(chart, values_for(case)))
    config = objects["ConfigMap"]["data"]
    container = gateway_container(objects["Deployment"])
    volumes = {v["name"]: v for v in objects["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    files: dict[str, tuple[str, str]] = {}  # mounted path -> (secret, key)
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        for source in volume.get("projected", {}).get("sources", []):
            for item in source["secret"]["items"]:
                files[f"{mount['mountPath']}/{item['path']}"] = (
                    source["secret"]["name"],
                    item["key"],
                )
        if "secret" in volume:
            for key in ("tls.crt", "tls.key"):
                files[f"{mount['mountPath']}/{key}"] = (volume["secret"]["secretName"], key)
    file_settings = {k: v for k, v in config.items() if k.endswith("_FILE")}
    assert file_settings
    for setting, path in file_settings.items():
        assert path in files, f"{setting}={path} is not mounted"
    chart_secret = objects.get("Secret", {"metadata": {"name": None}, "data": {}})
    for secret, key in files.values():
        if secret == chart_secret["metadata"]["name"]:
            assert key in chart_secret["data"]


def test_inline_values_land_in_the_chart_secret(chart: helm.Chart) -> None:
    objects = by_kind(manifests(chart, BRANCHES))
    secret = objects["Secret"]
    assert set(secret["data"]) == {
        "s3-access-key",
        "s3-secret-key",
        "mqtt-username",
        "mqtt-password",
        "auth-secret",
        "password_file",
        "acl_file",
    }
    sources = env_sources(gateway_container(objects["Deployment"]))
    assert {name for name, _ in sources.values()} == {secret["metadata"]["name"]}
    assert {key for _, key in sources.values()} <= set(secret["data"])
    config = objects["ConfigMap"]["data"]
    assert config["OFFLOAD_TLS_CERT_FILE"].endswith("/tls.crt")
    assert config["OFFLOAD_FUTURE"] == "1"


def test_auth_secret_is_generated_when_not_given(chart: helm.Chart) -> None:
    secret = by_kind(manifests(chart, {}))["Secret"]
    assert len(secret["data"]["auth-secret"]) >= 64


def checksums(chart: helm.Chart, values: dict[str, Any]) -> dict[str, str]:
    deployment = by_kind(manifests(chart, values))["Deployment"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    return {k: v for k, v in annotations.items() if k.startswith("checksum/")}


def test_config_changes_roll_the_pods(chart: helm.Chart) -> None:
    base = checksums(chart, {})
    # Stable across renders even though the generated auth secret is random each time.
    assert checksums(chart, {}) == base
    changed_config = checksums(chart, {"gateway": {"defaultTtl": 60}})
    assert changed_config["checksum/config"] != base["checksum/config"]
    assert changed_config["checksum/secret"] == base["checksum/secret"]
    changed_secret = checksums(chart, {"storage": {"secretKey": "rotated"}})
    assert changed_secret["checksum/secret"] != base["checksum/secret"]


# --- Networking --------------------------------------------------------------------------------


def test_nginx_ingress_streams_large_bodies(chart: helm.Chart) -> None:
    values = example_values()
    values["ingress"]["annotations"]["nginx.ingress.kubernetes.io/proxy-send-timeout"] = "7"
    ingress = by_kind(manifests(chart, values))["Ingress"]
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-body-size"] == "2147483648"
    assert annotations["nginx.ingress.kubernetes.io/proxy-request-buffering"] == "off"
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "1800"
    # The operator's own annotation wins over the chart's default.
    assert annotations["nginx.ingress.kubernetes.io/proxy-send-timeout"] == "7"
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": f"{RELEASE}-mqtt-offload", "port": {"name": "http"}}


def egress_ports(chart: helm.Chart, values: dict[str, Any]) -> set[int]:
    policy = by_kind(manifests(chart, values))["NetworkPolicy"]
    return {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]}


def test_network_policy_opens_the_ports_the_urls_name(chart: helm.Chart) -> None:
    assert egress_ports(chart, {}) == {53, 9000, 1883}
    # Scheme defaults when the URL names no port: https for secure S3, 8883 for mqtts.
    assert egress_ports(chart, BRANCHES) == {53, 443, 8883, 9000}
    unrestricted = by_kind(manifests(chart, {"networkPolicy": {"egress": {"restrict": False}}}))
    assert unrestricted["NetworkPolicy"]["spec"]["policyTypes"] == ["Ingress"]


def test_public_url_follows_ingress_then_service(chart: helm.Chart) -> None:
    def public_url(values: dict[str, Any]) -> str:
        url = by_kind(manifests(chart, values))["ConfigMap"]["data"]["OFFLOAD_PUBLIC_URL"]
        assert isinstance(url, str)
        return url

    assert public_url({}) == f"http://{RELEASE}-mqtt-offload.{NAMESPACE}.svc"
    assert by_kind(manifests(chart, {}))["ConfigMap"]["data"]["OFFLOAD_TLS"] == "false"
    assert public_url({"service": {"port": 8080}}).endswith(".svc:8080")
    ingress = {"enabled": True, "tls": [{"secretName": "t", "hosts": ["offload.example.com"]}]}
    assert public_url({"ingress": ingress}) == "https://offload.example.com"
    assert public_url({"ingress": {"enabled": True}}) == "http://offload.example.com"
    explicit = {"ingress": ingress, "gateway": {"publicUrl": "https://o.example.net"}}
    assert public_url(explicit) == "https://o.example.net"


# --- Refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"replicaCount": "three"}, "/replicaCount"),
        ({"replicas": 3}, "replicas"),
        ({"gateway": {"log": {"format": "xml"}}}, "/gateway/log/format"),
        ({"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot"),
        ({"storage": {"url": "http://minio:9000/bucket"}}, "/storage/url"),
        ({"mqtt": {"url": "tcp://broker:1883"}}, "/mqtt/url"),
        ({"auth": {"secret": "short"}}, "/auth/secret"),
        ({"gateway": {"extraConfig": {"PATH": "/bin"}}}, "PATH"),
        ({"autoscaling": {"targetCPUUtilizationPercentage": 150}}, "/autoscaling"),
        ({"storage": {"partSize": 1024}}, "/storage/partSize"),
    ],
)
def test_schema_rejects_bad_values(chart: helm.Chart, values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError, match=re.escape(where)):
        render(chart, values)


def test_schema_accepts_the_shipped_values(chart: helm.Chart) -> None:
    for case in CASES:
        chart.validate_schema(values_for(case))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"storage": {"accessKey": "a", "existingSecret": "s3"}}, "storage: set either"),
        ({"mqtt": {"password": "p", "existingSecret": "m"}}, "mqtt: set either"),
        ({"auth": {"secret": "x" * 40, "existingSecret": "a"}}, "auth: set either"),
        (
            {"auth": {"aclFile": {"content": "topic #", "existingSecret": "acl"}}},
            "auth.aclFile: set either",
        ),
        ({"tls": {"enabled": True}}, "tls.enabled needs tls.existingSecret"),
        ({"podDisruptionBudget": {"maxUnavailable": 1}}, "podDisruptionBudget: set"),
        # The gateway would refuse to start: bearer tokens need TLS.
        ({"auth": {"tokensFile": {"content": "a:" + "0" * 64}}}, "auth.tokensFile without"),
    ],
)
def test_contradictory_values_fail_the_render(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(chart, values)


# --- NOTES and image ---------------------------------------------------------------------------


def test_notes_tell_how_to_test_the_release(chart: helm.Chart) -> None:
    notes = render(chart, {})["mqtt-offload/templates/NOTES.txt"]
    assert f"port-forward service/{RELEASE}-mqtt-offload 8080:80" in notes
    assert "curl -fsS $GW/healthz" in notes
    assert "curl -fsS $GW/readyz" in notes
    assert "curl -fsS $GW/metrics" not in notes  # on its own port
    assert "curl -fsS http://127.0.0.1:9090/metrics" in notes
    assert "$GW/publish/test/helm" in notes
    assert "every request will be" in notes  # no credentials configured: said loudly
    assert "gateway.allowAnonymous=true" in notes
    # The code agrees: closed unless anonymous access is asked for by name.
    config = by_kind(manifests(chart, {}))["ConfigMap"]["data"]
    assert config["OFFLOAD_ALLOW_ANONYMOUS"] == "false"
    assert not {"OFFLOAD_PASSWORD_FILE", "OFFLOAD_TOKENS_FILE"} & config.keys()
    from gateway import Settings

    settings = Settings(allow_anonymous=config["OFFLOAD_ALLOW_ANONYMOUS"])  # type: ignore[arg-type]
    assert settings.allow_anonymous is False
    anonymous = {"gateway": {"allowAnonymous": True, "publicUrl": "https://o.example"}}
    warned = render(chart, anonymous)["mqtt-offload/templates/NOTES.txt"]
    assert "there is no ACL file" in warned
    anonymous["auth"] = {"aclFile": {"content": "topic read #\n"}}
    quiet = render(chart, anonymous)
    assert "WARNING" not in quiet["mqtt-offload/templates/NOTES.txt"]
    tokens = {
        "gateway": {"publicUrl": "https://o.example"},
        "auth": {"tokensFile": {"content": "a:" + "0" * 64}},
    }
    tokens_only = render(chart, tokens)
    assert "Tokens only" in tokens_only["mqtt-offload/templates/NOTES.txt"]
    assert "WARNING" not in tokens_only["mqtt-offload/templates/NOTES.txt"]


def test_chart_user_matches_the_image_user(chart: helm.Chart) -> None:
    # runAsNonRoot only works if the image's numeric USER is the one the chart runs as.
    dockerfile = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, flags=re.MULTILINE)
    assert users, "Dockerfile sets no USER"
    assert users[-1].split(":")[0] == str(chart.values["podSecurityContext"]["runAsUser"])
    entrypoint = re.findall(r"^ENTRYPOINT\s+(.+)$", dockerfile, flags=re.MULTILINE)
    assert entrypoint and "offload-gateway" in entrypoint[-1]
