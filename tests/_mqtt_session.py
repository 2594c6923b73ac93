"""One MQTT 5 client for the ACL tables: PUBACK codes of its publishes, topics delivered."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties


class Session:
    """Connects at once; ``refused`` when the broker refused the login.

    Args:
        port: the broker's loopback port.
        login: user name and password, None for an anonymous client.
        client_id: its client id (random when None).
        is_sync: tells the marker message that ends a batch of deliveries (``synced``).
    """

    def __init__(
        self,
        port: int,
        login: tuple[str, str] | None,
        client_id: str | None = None,
        *,
        is_sync: Callable[[str], bool] = lambda topic: topic.startswith("sync/"),
    ) -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id or f"t-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5,
        )
        if login is not None:
            self.client.username_pw_set(*login)
        self.is_sync = is_sync
        self.acks: dict[int, int] = {}
        self.received: list[str] = []
        self.synced = threading.Event()
        self.subscribed = threading.Event()
        self.answered = threading.Event()
        self.refused = False
        self.client.on_connect = self._on_connect
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda c, u, mid, codes, p: self.subscribed.set()
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.answered.wait(10)

    def _on_connect(
        self, c: mqtt.Client, u: object, f: object, rc: mqtt.ReasonCode, p: object
    ) -> None:
        self.refused = rc.is_failure
        self.answered.set()

    def _on_publish(
        self, c: mqtt.Client, u: object, mid: int, reason: mqtt.ReasonCode, p: Properties
    ) -> None:
        self.acks[mid] = reason.value

    def _on_message(self, c: mqtt.Client, u: object, message: mqtt.MQTTMessage) -> None:
        if self.is_sync(message.topic):
            self.synced.set()
        else:
            self.received.append(message.topic)

    def publish_all(self, topics: list[str]) -> dict[str, int]:
        """Publish each topic at QoS 1; its PUBACK reason code per topic."""
        infos = {t: self.client.publish(t, b"x", qos=1) for t in topics}
        for info in infos.values():
            info.wait_for_publish(10)
        return {t: self.acks[info.mid] for t, info in infos.items()}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
