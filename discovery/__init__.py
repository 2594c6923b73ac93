"""Discovery of the offload endpoint over a retained MQTT topic: the gateway's advertiser.

The record and the client's cache of it are pure protocol values and live in
:mod:`client.protocol` (the client reads them without importing this package); they are
re-exported here under their historical names.
"""

from client.protocol import DISCOVERY_ENDPOINT_KEY as ENDPOINT_KEY
from client.protocol import DISCOVERY_PROTOCOL_VERSION as PROTOCOL_VERSION
from client.protocol import DISCOVERY_TOPIC as DEFAULT_TOPIC
from client.protocol import CachedRecord, DiscoveryRecord, EndpointCache

from ._advertiser import Advertiser

__all__ = [
    "DEFAULT_TOPIC",
    "ENDPOINT_KEY",
    "PROTOCOL_VERSION",
    "Advertiser",
    "CachedRecord",
    "DiscoveryRecord",
    "EndpointCache",
]
