"""The chart on the other identity sources: mosquitto's dynamic security file, JWT keys."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
from test_helm import KUBE_VERSION, by_kind, chart, gateway_container, manifests, render

__all__ = ["chart"]  # the module fixture, shared

HTTPS = {
    "ingress": {
        "enabled": True,
        "hosts": [{"host": "offload.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}],
        "tls": [{"secretName": "offload-tls", "hosts": ["offload.example.com"]}],
    }
}


def mounted(objects: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Mounted file path -> (Secret, key), from the pod's projected auth volume."""
    container = gateway_container(objects["Deployment"])
    volumes = {v["name"]: v for v in objects["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    files = {}
    for mount in container["volumeMounts"]:
        for source in volumes[mount["name"]].get("projected", {}).get("sources", []):
            for item in source["secret"]["items"]:
                files[f"{mount['mountPath']}/{item['path']}"] = (
                    source["secret"]["name"],
                    item["key"],
                )
    return files


def gateway_settings(config: dict[str, str]) -> Any:
    from gateway.core._settings import Settings

    fields = {f"OFFLOAD_{f.upper()}": f for f in Settings.model_fields}
    assert set(config) <= set(fields)
    return Settings.model_validate({fields[k]: v for k, v in config.items()})


def test_dynamic_security_file_from_the_broker_secret(chart: helm.Chart) -> None:
    values = {"auth": {"dynsecFile": {"existingSecret": "broker-dynsec"}}}
    docs = manifests(chart, values)
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    objects = by_kind(docs)
    config = objects["ConfigMap"]["data"]
    path = config["OFFLOAD_DYNSEC_FILE"]
    assert mounted(objects)[path] == ("broker-dynsec", "dynamic-security.json")
    assert "OFFLOAD_PASSWORD_FILE" not in config and "OFFLOAD_ACL_FILE" not in config
    settings = gateway_settings(config)
    assert str(settings.dynsec_file) == path and settings.dynsec_substitute is False


def test_jwt_keys_and_claims(chart: helm.Chart) -> None:
    values = {
        **HTTPS,
        "auth": {
            "jwksFile": {"content": '{"keys": []}'},
            "jwt": {
                "jwksUrl": "https://idp.example.com/.well-known/jwks.json",
                "issuer": "https://idp.example.com/",
                "audience": "mqtt-offload",
                "usernameClaim": "preferred_username",
                "aclClaim": "acl",
                "leewaySeconds": 10,
            },
        },
    }
    objects = by_kind(manifests(chart, values))
    config = objects["ConfigMap"]["data"]
    settings = gateway_settings(config)
    assert settings.jwks_url == "https://idp.example.com/.well-known/jwks.json"
    assert settings.jwt_issuer == "https://idp.example.com/"
    assert settings.jwt_audience == "mqtt-offload"
    assert settings.jwt_username_claim == "preferred_username" and settings.jwt_leeway == 10
    secret, key = mounted(objects)[config["OFFLOAD_JWKS_FILE"]]
    assert secret == objects["Secret"]["metadata"]["name"] and key in objects["Secret"]["data"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"auth": {"dynsecFile": {"content": "{}"}, "aclFile": {"content": "topic #"}}},
            "auth.dynsecFile holds the users and the rules",
        ),
        # JWT only, over plain HTTP: the gateway would refuse to start.
        ({"auth": {"jwt": {"jwksUrl": "https://idp.example/jwks"}}}, "JWT keys without"),
        (
            {"auth": {"jwksFile": {"content": "{}", "existingSecret": "jwks"}}},
            "auth.jwksFile: set either",
        ),
    ],
)
def test_contradictory_identity_values_fail(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(chart, values)
