"""Session fixtures: real mosquitto and SeaweedFS on free loopback ports."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from _gateway import GatewayServer
from _servers import Mosquitto, SeaweedFS, free_port

if TYPE_CHECKING:
    from client import Client
    from gateway.storage import S3Store


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`-n 2 --dist loadgroup` (scripts/test.sh): a file's tests run on one worker, in order.

    A file's module fixtures (a stack, a wheel, certificates) then start once, not once per
    worker. Tests marked `@pytest.mark.xdist_group("name")` run on one worker with every test
    of that group, whichever files they are in (xdist's own loadgroup would spread every
    unmarked test on its own).
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FilesAndGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = super()._split_scope(nodeid)  # the nodeid itself when not in a group
            return nodeid.split("::", 1)[0] if group == nodeid else group

    return FilesAndGroups(config, log)


@pytest.fixture(scope="session")
def seaweed() -> Iterator[SeaweedFS]:
    server = SeaweedFS().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def bucket_name() -> str:
    return f"t-{uuid.uuid4().hex[:20]}"


@pytest.fixture
def storage_url(seaweed: SeaweedFS, bucket_name: str) -> str:
    return seaweed.storage_url(bucket_name)


@pytest.fixture
def store(seaweed: SeaweedFS, bucket_name: str) -> S3Store:
    """The gateway's own store class on the test's bucket (made): what a gateway on
    `storage_url` wrote, read the way it reads it. A file may define its own `store`."""
    from gateway.storage import S3Store

    s = S3Store(
        seaweed.endpoint, bucket_name, access_key=seaweed.access_key, secret_key=seaweed.secret_key
    )
    s.ensure_bucket()
    return s


@pytest.fixture
def s3_env(seaweed: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> SeaweedFS:
    monkeypatch.setenv("OFFLOAD_S3_ACCESS_KEY", seaweed.access_key)
    monkeypatch.setenv("OFFLOAD_S3_SECRET_KEY", seaweed.secret_key)
    return seaweed


@pytest.fixture
def mosquitto_factory() -> Iterator[Callable[..., Mosquitto]]:
    started: list[Mosquitto] = []

    def start(max_packet_size: int | None = None, extra_config: str = "") -> Mosquitto:
        broker = Mosquitto(max_packet_size=max_packet_size, extra_config=extra_config).start()
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.close()


@pytest.fixture
def broker(mosquitto_factory: Callable[..., Mosquitto]) -> Mosquitto:
    """A broker that only takes 256 KiB packets, as cloud brokers do."""
    return mosquitto_factory(max_packet_size=262144)


@pytest.fixture
def unique_topic() -> Callable[[str], str]:
    def make(prefix: str = "t") -> str:
        return f"{prefix}/{uuid.uuid4().hex[:12]}"

    return make


@pytest.fixture
def gateway_factory(seaweed: SeaweedFS, bucket_name: str) -> Iterator[Callable[..., GatewayServer]]:
    """Start gateways on the test's bucket; settings overridable per call."""
    from gateway import Settings

    started: list[GatewayServer] = []

    def start(
        broker: Mosquitto | None = None,
        *,
        send_buffer: int = 0,
        tracer_provider: Any = None,
        public_url: str | None = None,
        **overrides: object,
    ) -> GatewayServer:
        values: dict[str, object] = {
            "storage_url": seaweed.storage_url(bucket_name),
            "s3_access_key": seaweed.access_key,
            "s3_secret_key": seaweed.secret_key,
            "mqtt_url": broker.url if broker else None,
            "discovery_interval": 5.0,
            "metrics_port": free_port(),  # GatewayServer.metrics_url
        }
        # A gateway without credentials files serves nobody unless anonymous access is asked
        # for by name: these tests do ask, explicitly, unless they configure credentials.
        credentials = ("password_file", "tokens_file", "dynsec_file", "jwks_file", "jwks_url")
        if not any(name in overrides for name in (*credentials, "jwt_secret_file")):
            values["allow_anonymous"] = True
        values.update(overrides)
        settings = Settings(**values)  # type: ignore[arg-type]
        server = GatewayServer(
            settings,
            send_buffer=send_buffer,
            tracer_provider=tracer_provider,
            public_url=public_url,
        ).start()
        server.mqtt_url = broker.url if broker else None
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def gateway(gateway_factory: Callable[..., GatewayServer], broker: Mosquitto) -> GatewayServer:
    """A gateway on SeaweedFS advertising itself on the 256 KiB `broker`."""
    server = gateway_factory(broker)
    server.broker = broker  # type: ignore[attr-defined]
    return server


@pytest.fixture
def clients(gateway: GatewayServer) -> Iterator[Callable[..., Client]]:
    """Connected clients on the `gateway` fixture's broker, closed after the test."""
    from client import Client

    broker: Mosquitto = gateway.broker  # type: ignore[attr-defined]
    made: list[Client] = []

    def make(**kw: Any) -> Client:
        kw.setdefault("discovery_wait", 10.0)
        c = Client(broker.url, **kw)
        c.connect()
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
