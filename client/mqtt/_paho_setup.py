"""How the adapter's paho client is built: its options, its CONNECT properties, its socket.

Used only by :mod:`client.mqtt._paho` (the one module that owns the paho client): what a
connection is made with is decided once, here; what it does while it runs is `_paho`'s.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Mapping

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ..protocol import PLACEHOLDER_AWARE
from ._broker import BrokerUrl
from ._tls import TlsFiles


def new_paho_client(
    broker: BrokerUrl,
    *,
    client_id: str,
    protocol: int,
    clean: bool,
    tls: TlsFiles | None,
    ca_file: str | None,
    websocket_headers: Mapping[str, str] | None,
) -> mqtt.Client:
    """A paho client for `broker`: transport, login, TLS, reconnect delays, TCP_NODELAY.

    Args:
        broker: where it connects.
        client_id: MQTT client id.
        protocol: 5 or 4 (3.1.1).
        clean: Clean Session of a 3.1.1 connection (MQTT 5 says it in CONNECT).
        tls: CA and client certificate for an `mqtts://` broker; None: `ca_file` alone.
        ca_file: CA bundle when `tls` is None.
        websocket_headers: extra headers of a `ws[s]://` upgrade request.
    """
    paho = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=mqtt.MQTTv5 if protocol == 5 else mqtt.MQTTv311,
        clean_session=None if protocol == 5 else clean,
        transport="websockets" if broker.websocket else "tcp",
    )
    if broker.ws_path is not None:
        paho.ws_set_options(broker.ws_path, dict(websocket_headers or {}))
    if broker.username is not None:
        paho.username_pw_set(broker.username, broker.password)
    if broker.tls:
        paho.tls_set_context((tls or TlsFiles(ca_file=ca_file)).context())
    # A quarter second first (paho's hint says int; it only does time arithmetic with it,
    # paho-mqtt 2.x): closing a link that just dropped waits out this sleep.
    paho.reconnect_delay_set(min_delay=0.25, max_delay=10)  # type: ignore[arg-type]
    paho.on_socket_open = no_delay  # every (re)connect
    return paho


def connect_properties(
    protocol: int, session_expiry: int | None, receive_maximum: int | None
) -> Properties | None:
    """The MQTT 5 CONNECT properties (None for 3.1.1, which has none).

    Args:
        protocol: 5 or 4.
        session_expiry: the Session Expiry Interval to send, None for none.
        receive_maximum: the Receive Maximum to ask for, None for the broker's.

    Raises:
        ValueError: `receive_maximum` is not 1-65535.
    """
    if receive_maximum is not None and not 1 <= receive_maximum <= 65535:
        raise ValueError(f"receive_maximum must be 1-65535, not {receive_maximum}")
    if protocol != 5:  # 3.1.1: the broker's inflight bounds what it sends
        return None
    properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    # Says "I resolve placeholders myself" to an offload-proxy between us and the
    # broker (docs/proxy.md); a broker ignores user properties it does not know.
    properties.UserProperty = [PLACEHOLDER_AWARE]
    if session_expiry:
        properties.SessionExpiryInterval = session_expiry
    if receive_maximum is not None:
        properties.ReceiveMaximum = receive_maximum
    return properties


def linger(sock: object, timeout: float) -> None:
    """End a connection without a reset: send FIN, then read until the broker closes.

    Closing a socket with received bytes unread (a retained message, any message in flight
    to a subscriber) makes the kernel send RST instead of FIN and discard what it had not
    sent yet: the last QoS 0 PUBLISHes and the DISCONNECT itself (a broker then also sends
    the Will). So, as HTTP servers do, half-close and drain until the broker has read
    everything and closed its side (mosquitto does so at once on DISCONNECT), for at most
    `timeout` seconds; what is read is discarded.
    """
    if not isinstance(sock, socket.socket):  # e.g. paho's WebSocket wrapper: left as is
        return
    deadline = time.monotonic() + timeout
    with contextlib.suppress(OSError, ValueError):  # reset, timed out, TLS closed: done
        if not isinstance(sock, ssl.SSLSocket):  # TLS: the broker closes on DISCONNECT
            sock.shutdown(socket.SHUT_WR)
        while (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            if not sock.recv(65536):
                return


def no_delay(client: mqtt.Client, userdata: object, sock: object) -> None:
    """TCP_NODELAY on the broker connection (paho leaves Nagle's algorithm on).

    With Nagle on, a small PUBLISH written while the previous one is still unacknowledged
    waits for the broker's delayed ACK: the second message after connecting arrived 31-33 ms
    late every time, against ~1 ms for the others (bench/RESULTS.md, "Telemetry: Nagle").
    paho writes each packet whole, so nothing is sent in needless small pieces.
    """
    setsockopt = getattr(sock, "setsockopt", None)
    if setsockopt is not None:
        with contextlib.suppress(OSError):  # not a TCP socket: nothing to do
            setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
