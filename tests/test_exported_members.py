"""The public surface of each package, and the errors the protocol core shares with `client`.

As httpx's `tests/test_exported_members.py`: every public name a package holds is in its
`__all__`, and every name in `__all__` is there. The protocol core defines its own errors;
`client` must hand out those very classes, or `except client.MalformedPlaceholder` would miss
what the core raises.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from pathlib import Path

import pytest

import client
import client.core._exceptions
import client.malloc
import client.metrics
import client.protocol
import client.protocol._errors
import client.tracing
import discovery

PACKAGES = [client, client.malloc, client.metrics, client.protocol, client.tracing, discovery]
#: What other packages may import of `client` (the contract public-names-only says the same).
CLIENT_PUBLIC = {"client", "client.malloc", "client.metrics", "client.protocol", "client.tracing"}
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_all_names_what_the_package_holds(package: types.ModuleType) -> None:
    public = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name not in {"annotations", "TYPE_CHECKING", "Any", "importlib"}
    }
    exported = set(package.__all__)
    assert len(exported) == len(package.__all__), "a name is listed twice"
    # `client` loads its I/O classes on first use: listed, not yet in its namespace.
    assert public <= exported
    for name in exported:
        assert getattr(package, name) is not None


def test_protocol_errors_are_the_client_errors() -> None:
    core = {
        name: value
        for name, value in vars(client.protocol._errors).items()
        if isinstance(value, type) and issubclass(value, Exception)
    }
    assert "MalformedPlaceholder" in core and "OffloadError" in core
    for name, cls in core.items():
        assert getattr(client.protocol, name) is cls
        assert getattr(client.core._exceptions, name) is cls
        if name in client.__all__:
            assert getattr(client, name) is cls
    # The I/O errors hang under the same root.
    assert issubclass(client.FetchError, client.protocol.OffloadError)
    assert issubclass(client.ConfigError, client.OffloadError)


def test_an_error_the_core_raises_is_caught_as_a_client_error() -> None:
    with pytest.raises(client.MalformedDiscoveryRecord):
        client.protocol.DiscoveryRecord.from_json(b"[1]")
    with pytest.raises(client.ProtocolError):
        client.protocol.Topic("a/#")


def test_discovery_hands_out_the_protocol_record() -> None:
    assert discovery.DiscoveryRecord is client.protocol.DiscoveryRecord
    assert discovery.EndpointCache is client.protocol.EndpointCache
    assert discovery.ENDPOINT_KEY == "LargeMessageUploadEndpoint"
    assert discovery.DEFAULT_TOPIC == "sys/metadata"


def test_the_protocol_core_loads_no_io_library() -> None:
    """Spark executors and the discovery advertiser import the core without the MQTT client."""
    code = (
        "import sys, client.protocol, discovery\n"
        "loaded = {'paho', 'httpx', 'scramp', 'minio', 'fastapi'} & set(sys.modules)\n"
        "print(sorted(loaded))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_other_packages_import_only_clients_public_modules() -> None:
    """gateway/, proxy/ and discovery/ name no private module of `client` (issue 43: three
    did, `client._malloc` and `client.http._pool`), lazily imported ones included."""
    private = []
    for package in ("gateway", "proxy", "discovery"):
        for path in sorted((ROOT / package).glob("**/*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                private += [
                    f"{path.relative_to(ROOT)}:{node.lineno} {name}"
                    for name in names
                    if name.split(".")[0] == "client" and name not in CLIENT_PUBLIC
                ]
    assert private == []
