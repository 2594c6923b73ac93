"""mqtt.js (npm `mqtt`, unmodified) in Node through offload-proxy: 20 MiB across a 256 KiB
mosquitto, MQTT 5 and 3.1.1. mqtt.js comes from npm (tests/mqttjs/package.json and its
lock), installed once into a cache directory, as tests/test_tus_js.py installs its peer."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from test_proxy import MiB, proxy  # noqa: F401 - the fixture

from _npm import npm_modules
from _proxy import ProxyServer

pytestmark = pytest.mark.servers

PEERS = Path(__file__).parent / "mqttjs"


@pytest.fixture(scope="session")
def mqtt_js() -> Path:
    """node_modules holding mqtt.js, installed from the committed lock on first use."""
    try:
        return npm_modules(PEERS, "mqttjs", "mqtt")
    except RuntimeError as exc:
        pytest.fail(str(exc))


def _node(modules: Path, *args: str, **kw: object) -> subprocess.Popen[str]:
    env = {**os.environ, "NODE_PATH": str(modules)}
    return subprocess.Popen(
        ["node", str(PEERS / "peer.js"), *args], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw,  # type: ignore[call-overload]
    )  # fmt: skip


@pytest.mark.parametrize("version", ["5", "4"])
def test_mqtt_js_20mib_through_the_proxy(
    proxy: ProxyServer,  # noqa: F811
    mqtt_js: Path,
    tmp_path: Path,
    unique_topic: Callable[[str], str],
    version: str,
) -> None:
    topic = unique_topic("mqttjs")
    data = os.urandom(20 * MiB)
    (tmp_path / "big.bin").write_bytes(data)
    url = f"mqtt://127.0.0.1:{proxy.port}"
    sub = _node(mqtt_js, "sub", url, topic, version)
    assert sub.stdout is not None
    assert sub.stdout.readline().strip() == "ready"  # subscribed: the SUBACK came back
    pub = _node(mqtt_js, "pub", url, topic, str(tmp_path / "big.bin"), version, "1")
    _, err = pub.communicate(timeout=120)
    assert pub.returncode == 0, err
    out, err = sub.communicate(timeout=120)
    assert sub.returncode == 0, err
    assert json.loads(out) == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
