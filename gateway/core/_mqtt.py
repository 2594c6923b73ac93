"""The gateway's broker link: the project's one MQTT adapter, in its server mode.

The link is a :class:`client.MqttConnection` (the adapter the client uses too) that connects
in the background and keeps reconnecting; `connected` feeds /readyz. It runs with
`resend_unacknowledged=False`: a PUBLISH still unacknowledged when the connection drops fails
at once instead of being sent again after the reconnect. The HTTP publish paths need exactly
that: their caller withdraws the stored message and answers 503 when the publish fails, so a
later resend would announce a message that no longer exists; and a PUBLISH the broker refuses
by disconnecting (validation should have stopped it first) cannot wedge the link by coming
back after every reconnect.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from client import BrokerUrl, InvalidPublish, MqttConnection, TlsFiles

from ._settings import Settings

__all__ = ["InvalidPublish", "MqttConnection", "broker_link"]


def _path(path: Path | None) -> str | None:
    return str(path) if path is not None else None


def broker_link(settings: Settings) -> MqttConnection | None:
    """The gateway's broker connection from its settings (not yet started), None without one.

    Args:
        settings: `mqtt_url`, `mqtt_username`, `mqtt_password`, `mqtt_client_id`,
            `mqtt_ca_file` and the client certificate (`mqtt_cert_file`, `mqtt_key_file`,
            `mqtt_key_password`) are read.
    """
    if not settings.mqtt_url:
        return None
    password = settings.mqtt_password.get_secret_value() if settings.mqtt_password else None
    broker = BrokerUrl.parse(settings.mqtt_url).with_login(
        settings.mqtt_username or None, password or None
    )
    return MqttConnection(
        broker,
        client_id=settings.mqtt_client_id or f"offload-gateway-{uuid.uuid4().hex[:12]}",
        tls=TlsFiles(
            _path(settings.mqtt_ca_file),
            _path(settings.mqtt_cert_file),
            _path(settings.mqtt_key_file),
            settings.mqtt_key_password.get_secret_value() if settings.mqtt_key_password else None,
        ),
        resend_unacknowledged=False,
    )
