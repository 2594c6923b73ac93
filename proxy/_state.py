"""What a connection's two relay directions share, and what all connections share."""

from __future__ import annotations

import asyncio
import collections
import hashlib
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from client.protocol import Placeholder, Reassembler, address_key
from client.tracing import Tracing

from ._account import Tokens
from ._flights import SharedFetches
from ._gateway import GatewayLink
from ._lifecycle import Lifecycle
from ._metrics import Metrics
from ._settings import MQTT_MAX_PACKET, ProxySettings
from ._shares import Holder, Pool, Taken
from ._stream import PacketStream
from ._turns import Turns
from .protocol import AliasMap, Connect, Stored, Will

POISONED_IDS = 4096


#: What a failed placeholder is remembered by: a digest of its payload URL, size and
#: SHA-256 (a URL may have 2,048 characters: 4,096 of them kept whole would be 8 MiB).
PoisonKey = bytes


def poison_key(ref: Placeholder) -> PoisonKey:
    url = ref.payload_url.encode("utf-8", "surrogatepass")
    named = b"%d:%s %d %s" % (len(url), url, ref.size, ref.sha256.encode())
    return hashlib.blake2b(named, digest_size=32).digest()


class Poisoned:
    """Placeholders whose payload failed its check on the way out, or names another
    payload than the gateway holds (bounded: the last `size`, each 32 bytes however long
    its URL): a broker's redelivery of such a placeholder is handed on as it is, without
    asking the gateway again.

    Remembered by URL, size and SHA-256 together, never by the message id alone: anyone
    who may publish on some topic can send a placeholder naming another user's message
    with a false digest, which fails; that must not stop the true placeholder (the same
    URL with the right digest) from resolving for others.
    """

    def __init__(self, size: int = POISONED_IDS) -> None:
        self._keys: collections.OrderedDict[PoisonKey, None] = collections.OrderedDict()
        self._size = size

    def add(self, ref: Placeholder) -> None:
        self._keys[poison_key(ref)] = None
        while len(self._keys) > self._size:
            self._keys.popitem(last=False)

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, Placeholder) and poison_key(ref) in self._keys

    def __len__(self) -> int:
        return len(self._keys)


REMEMBERED_FLOWS = 4096
FlowKey = tuple[str | None, str, int]  # user name, client id, packet id


class StoredFlows:
    """What the proxy stored for each QoS 2 PUBLISH whose flow has not ended (bounded,
    oldest dropped; :mod:`proxy._resends` says why)."""

    def __init__(self, size: int = REMEMBERED_FLOWS) -> None:
        self._flows: collections.OrderedDict[FlowKey, Stored] = collections.OrderedDict()
        self._size = size

    def add(self, key: FlowKey, stored: Stored) -> None:
        self._flows[key] = stored
        self._flows.move_to_end(key)
        while len(self._flows) > self._size:
            self._flows.popitem(last=False)

    def get(self, key: FlowKey) -> Stored | None:
        return self._flows.get(key)

    def forget(self, key: FlowKey) -> None:
        self._flows.pop(key, None)

    def __len__(self) -> int:
        return len(self._flows)


@dataclass(slots=True)
class Budget:
    """Bytes held across all connections (chunks being reassembled)."""

    used: int = 0


@dataclass(frozen=True, slots=True)
class Services:
    """Built once by the server; handed to every connection."""

    settings: ProxySettings
    gateway: GatewayLink
    endpoint: Callable[[], str | None]
    metrics: Metrics
    uploads: Pool  # slots: refused beyond (0x97)
    fetches: Pool  # slots: waited for
    logins: Pool  # bytes connections hold before their login is answered
    shared: SharedFetches  # one fetch for the devices that get the same placeholder
    poisoned: Poisoned = field(default_factory=Poisoned)
    closing: asyncio.Event = field(default_factory=asyncio.Event)  # no new transfers
    broker_tls: ssl.SSLContext | None = None
    reassembly: Budget = field(default_factory=Budget)
    stored_flows: StoredFlows = field(default_factory=StoredFlows)  # QoS 2 offloads
    identities: Sequence[Any] = ()  # age identities (client.load_identities) for _unseal
    tracing: Tracing = field(default_factory=Tracing)  # offloads' and fetches' spans
    tokens: Tokens = field(default_factory=Tokens)  # JWTs the gateway accepted (_account)
    turns: Turns = field(default_factory=Turns)  # each account's share of the loop's time
    lifecycle: Lifecycle | None = None  # dedup reads, group confirmations (proxy._lifecycle)


@dataclass(frozen=True, slots=True)
class PendingWill:
    """A Will over the broker's limit: the CONNECT the broker got carries its placeholder
    (`stored`, its id chosen by the proxy); the payload is stored once the broker has
    accepted the login (:mod:`proxy._will`)."""

    will: Will
    stored: Stored
    endpoint: str


@dataclass(slots=True)
class Conn:
    """One client connection and its broker connection."""

    connect: Connect
    account: str | None  # whose shares, once accepted (proxy._account)
    peer: str  # the device's address: every per-address rule, the gateway's X-Forwarded-For
    client: PacketStream
    client_writer: asyncio.StreamWriter
    broker: PacketStream
    broker_writer: asyncio.StreamWriter
    auth: httpx.Auth | None
    broker_limit: int
    keepalive: int
    aliases: AliasMap = field(default_factory=lambda: AliasMap(0))
    connack_seen: asyncio.Event = field(default_factory=asyncio.Event)
    client_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one packet at a time
    pings_in_flight: int = 0
    transfers: int = 0  # uploads and resolves under way
    unacked: set[int] = field(default_factory=set)  # placeholders the broker has not acked
    broker_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # packets sent in pieces
    reassembler: Reassembler | None = None  # chunked messages (ADR 23), made on first chunk
    reassembly_held: int = 0  # its bytes, as counted in Services.reassembly
    kept_rel: set[int] = field(default_factory=set)  # QoS 2 chunks the proxy PUBREC'd
    stored_flows: set[int] = field(default_factory=set)  # their packet ids, this connection
    upgraded: bool = False  # a 3.1.1 client on an MQTT 5 broker link (proxy.protocol._v311)
    accepted: bool = False  # the broker's CONNACK 0 came (and a pending Will is stored)
    will: PendingWill | None = None  # stored after the broker's CONNACK 0
    login: Taken | None = None  # what the login holds of Services.logins until its CONNACK
    slot: Taken | None = None  # its connection slot (proxy._admit: its account's share)

    @property
    def holder(self) -> Holder:
        """Who takes from the shared pools: the device's address, and its account once the
        broker accepted it (before, a user name is only a claim)."""
        return Holder(address_key(self.peer), self.account if self.accepted else None)

    @property
    def busy(self) -> bool:
        """Whether stopping now would lose work: a transfer, or a stored message whose
        PUBACK/PUBREC has not reached the client yet."""
        return self.transfers > 0 or bool(self.unacked)

    @property
    def broker_v5(self) -> bool:
        """Whether the broker link speaks MQTT 5 (the client's version, or upgraded)."""
        return self.connect.v5 or self.upgraded

    @property
    def client_limit(self) -> int:
        """The most the client takes in one packet (its CONNECT's Maximum Packet Size)."""
        return self.connect.max_packet_size or MQTT_MAX_PACKET
