"""The parts a :class:`client.Client` is made of when it is not handed them, from its settings.

The client is a facade (:mod:`client._client`): it merges the settings and wires what it
owns. What each part is made with when the caller passes none (the MQTT connection, the HTTP
transport, the gateway login) and how the receive path is put together (the receiver, its
placeholder fetcher, their unsealer) is decided here, once, so that the facade only wires.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from .config._settings import ClientSettings
from .core._tracing import DISABLED, Tracing
from .http._scram import gateway_auth
from .http._store_origin import ConfiguredStore
from .http._transport import HttpTransport
from .mqtt._broker import BrokerUrl
from .mqtt._paho import MqttConnection
from .mqtt._websocket import websocket_headers
from .receive._fetcher import FetchProgress, PlaceholderFetcher, PlainHttpWarner
from .receive._receive import Receiver
from .seal._unseal import Unsealer


def default_transport(s: ClientSettings) -> HttpTransport:
    """The HTTP transport to the gateway: the settings' timeout and TLS files."""
    return HttpTransport(timeout=s.http_timeout, verify=s.tls_files.http_verify())


def default_connection(s: ClientSettings) -> MqttConnection:
    """The MQTT connection the settings describe."""
    return MqttConnection(
        s.broker_url,
        client_id=s.client_id,
        protocol=s.protocol,
        keepalive=s.keepalive,
        tls=s.tls_files,
        websocket_headers=websocket_headers(s.websocket_headers),
        # Flow control: QoS 1/2 messages are acknowledged as the receive worker takes them
        # (`client/receive/_inbound.py`), so the hand-off holds at most this many.
        receive_maximum=min(s.max_pending_deliveries, 65535),
        session_expiry=s.session_expiry,
    )


def default_http_auth(s: ClientSettings, login: BrokerUrl) -> httpx.Auth | None:
    """The gateway login the settings describe, with the broker login `login` (see
    :func:`client.http._scram.gateway_auth`)."""
    return gateway_auth(
        username=login.username,
        password=login.password,
        token=s.http_token,
        scheme=s.http_login,
    )


def receive_path(
    s: ClientSettings,
    *,
    conn: MqttConnection,
    transport: HttpTransport,
    http_auth: httpx.Auth | None,
    endpoint_in_force: Callable[[], str | None],
    direct_store: Callable[[], str | None],
    warn_plain_http: PlainHttpWarner,
    on_fetch_progress: FetchProgress | None,
    use_discovery: bool,
    tracing: Tracing = DISABLED,
) -> Receiver:
    """The receiver, its placeholder fetcher (see :class:`PlaceholderFetcher`; with a
    configured endpoint, the store that gateway declares may be redirected to as well; its
    fetch spans from `tracing`) and their unsealer, which reads `identity_files` once: a bad
    one fails here."""
    unsealer = Unsealer(s)
    fetcher = PlaceholderFetcher(
        settings=s,
        transport=transport,
        http_auth=http_auth,
        unsealer=unsealer,
        endpoint_in_force=endpoint_in_force,
        warn_plain_http=warn_plain_http,
        on_fetch_progress=on_fetch_progress,
        direct_store=direct_store,
        configured_store=None
        if s.endpoint is None
        else ConfiguredStore(s.endpoint, transport.reader),
        tracing=tracing,
    )
    return Receiver(
        settings=s, conn=conn, fetcher=fetcher, unsealer=unsealer, use_discovery=use_discovery
    )
