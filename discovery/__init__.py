"""Discovery of the offload endpoint over a retained MQTT topic."""

from ._advertiser import Advertiser
from ._record import DEFAULT_TOPIC, ENDPOINT_KEY, PROTOCOL_VERSION, DiscoveryRecord
from ._resolver import CachedRecord, EndpointCache

__all__ = [
    "DEFAULT_TOPIC",
    "ENDPOINT_KEY",
    "PROTOCOL_VERSION",
    "Advertiser",
    "CachedRecord",
    "DiscoveryRecord",
    "EndpointCache",
]
