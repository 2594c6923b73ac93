"""tests/_servers.py: a server stopped for an outage keeps its ports until it starts again.

Ports are chosen below the ephemeral range, so while a store or a broker is down for a test's
outage, nothing but another test's free_port() could take its port; if one did, the restart
would fail with `address already in use` (seen once in CI: the filer's port of a stopped
SeaweedFS). The ports are held, bound but not listening: refused like a closed port, not
choosable, and bound again by the server itself.
"""

from __future__ import annotations

import socket

import pytest

from _servers import GRPC_OFFSET, Mosquitto, SeaweedFS, _port_free, mqtt_answers


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_stopped_broker_keeps_its_port_until_it_starts_again_and_close_gives_it_back() -> None:
    broker = Mosquitto().start()
    try:
        port = broker.port
        broker.stop()
        assert refused(port)  # down, as a client sees it
        assert not _port_free(port)  # and no free_port() elsewhere can pick it
        broker.start()
        assert broker.port == port and mqtt_answers(port)
        assert not broker._held  # the broker's own listener has the port now
        broker.restart()
        assert mqtt_answers(port)
    finally:
        broker.close()
    assert not broker._held  # given back (a connection of its own may still be in TIME_WAIT)


@pytest.mark.timeout(180)
def test_a_stopped_store_keeps_every_port_of_its_own_and_starts_again_on_them() -> None:
    store = SeaweedFS().start()
    try:
        ports = dict(store.ports)
        store.stop()
        assert refused(store.s3_port)
        for name, port in ports.items():
            for p in (port, port + GRPC_OFFSET):
                assert not _port_free(p), f"{name}'s port {p} could be chosen by another test"
        store.start()
        assert store.ports == ports
        assert not store._held  # weed's own listeners have the ports now
        assert store._can_write()
    finally:
        store.close()
    assert not store._held
