"""The client's public surface: AsyncClient mirrors Client, and the connection is injectable."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

from client import AsyncClient, BrokerUrl, Client, Message, MqttConnection

from _servers import Mosquitto

# Methods that wait on the network (or on a delivery): a coroutine on AsyncClient.
_IO = {"connect", "close", "publish", "subscribe", "unsubscribe", "wait_for_endpoint"}
_WAIT = {"next_message"}
# Context-manager protocol and the iterator differ by nature (async with / async for).
_RENAMED = {"__enter__": "__aenter__", "__exit__": "__aexit__"}


def _public(cls: type) -> dict[str, object]:
    names = {n for n in dir(cls) if not n.startswith("_")} | set(_RENAMED)
    return {n: inspect.getattr_static(cls, n) for n in names}


def _params(fn: object) -> list[tuple[str, object, object, str]]:
    target = fn.__func__ if isinstance(fn, classmethod | staticmethod) else fn
    sig = inspect.signature(target)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default, str(p.annotation)) for p in sig.parameters.values()]


def test_async_client_has_every_public_member_of_client_with_the_same_parameters() -> None:
    sync_members = _public(Client)
    assert {"publish", "messages", "connection", "from_config"} <= set(sync_members)
    checked = 0
    for name, member in sync_members.items():
        async_name = _RENAMED.get(name, name)
        assert hasattr(AsyncClient, async_name), f"AsyncClient lacks {async_name}"
        mirror = inspect.getattr_static(AsyncClient, async_name)
        if isinstance(member, property):
            assert isinstance(mirror, property), name
            checked += 1
            continue
        if not callable(member) and not isinstance(member, classmethod):
            continue
        if name == "__exit__":
            assert _params(mirror)[1:] == _params(member)[1:]
        else:
            assert _params(mirror) == _params(member), name
        if name in _IO | _WAIT or name in _RENAMED:
            assert inspect.iscoroutinefunction(mirror), f"AsyncClient.{async_name} not async"
        elif name == "messages":
            assert inspect.isasyncgenfunction(mirror)
        checked += 1
    assert checked >= 15
    # settings is a plain attribute on Client, a property on AsyncClient.
    assert isinstance(inspect.getattr_static(AsyncClient, "settings"), property)


def test_the_signature_check_sees_a_drifted_parameter() -> None:
    """The comparison above is not vacuous: a missing `message_id` is a difference."""

    async def publish(self: object, topic: str, payload: bytes) -> None: ...

    assert _params(publish) != _params(Client.publish)


@pytest.mark.servers
def test_an_injected_connection_is_the_one_the_client_uses(
    broker: Mosquitto, unique_topic: Callable[[str], str]
) -> None:
    conn = MqttConnection(BrokerUrl.parse(broker.url), client_id="injected-conn")
    topic = unique_topic("inject")
    with Client(connection=conn, endpoint=None, discovery_wait=0.1) as client:
        assert client.connection is conn
        assert conn.connected and conn.connections == 1
        assert client.max_packet_size == 262144  # CONNACK, read through the given connection
        client.subscribe(topic)
        conn.publish(topic, b"raw", qos=1).result(10)  # straight through the adapter
        client.publish(topic, b"routed", qos=1)
        got = [client.next_message(10) for _ in range(2)]
    assert [m.payload for m in got if isinstance(m, Message)] == [b"raw", b"routed"]
    assert not conn.connected  # the client closed the connection it was given
    assert "injected-conn" in broker.log()
