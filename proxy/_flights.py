"""One fetch for a broadcast: devices behind this proxy that get the same placeholder while
its payload is being delivered are fed from one fetch of it (singleflight, as Go's
`x/sync/singleflight` or nginx's `proxy_cache_lock`), each at its own pace.

Each device first asks the gateway with its own login what it holds for the placeholder
(:mod:`proxy._stat`, a HEAD, taking a slot of the device's fetch share while it runs): so a
device is never fed bytes it could not have fetched itself, and a placeholder whose size or
SHA-256 is not the stored one is found out before anything is written to the device
(:class:`proxy._exceptions.PayloadMismatch`). Then, by what names the payload (its URL,
size and SHA-256: :data:`FlightKey`):

- a :class:`Flight` of it is under way or still read by others: the device reads the same
  :class:`proxy._spool.Spool` from its start, as far as the fetch has come;
- none: the device starts one, with its login, and hands it its fetch slot, held until the
  GET ends (so the shares bound the gateway transfers, whoever reads them);
- there is no room for one (the spools' total, count, or the share of the device's account
  or address: :class:`proxy._spool.SpoolBudget`): the payload is fetched for the device
  alone, its slot held until the last byte is written, as before there was sharing.

The fetch writes into the spool at the gateway's pace and never waits for a reader: a slow
device holds nobody back, and one that leaves takes only its place in the flight with it.
The last to leave ends the flight (its GET, if it still runs, and its spool). The digest
is checked before any device gets the last byte of the payload: a reader is never handed
the last byte before the fetch has ended with the placeholder's size and SHA-256; a fetch
that breaks off or whose bytes do not match fails every reader (those that have begun a
PUBLISH are cut off, the others get the placeholder).
"""

from __future__ import annotations

import asyncio
import collections
import copy
import logging
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Protocol

import httpx

from client.protocol import Placeholder, TraceContext

from ._exceptions import PayloadMismatch, TransferFailed
from ._gateway import GatewayLink
from ._metrics import Metrics
from ._shares import Holder, Pool, Taken
from ._spool import Spool, SpoolBudget, SpoolLimits

log = logging.getLogger("proxy")

#: What names a payload for sharing: its URL, size and SHA-256.
FlightKey = tuple[str, int, str]
#: The most of a payload a reader takes from a spool at once: from memory a view (no copy),
#: from a file what a write to the device takes in one loop step anyway.
MEMORY_READ = 1 << 20
FILE_READ = 256 * 1024
#: The pieces a flight's GET hands to the loop: nothing slow holds them (the spool takes
#: each at once), and each hop of a piece from the GET's thread waits for the loop, which
#: is busy writing to the devices: 8 MiB took 0.5-0.7 s in 1 MiB pieces, 1.6-2.0 s in the
#: 256 KiB of a device's own fetch (python bench/proxy_broadcast.py, 200 devices).
SHARED_PIECE = 1 << 20


def flight_key(ref: Placeholder) -> FlightKey:
    return ref.payload_url, ref.size, ref.sha256


def mismatch(ref: Placeholder, size: int, sha256: str | None) -> PayloadMismatch | None:
    """The error when what the gateway holds (or sent) is not what `ref` names."""
    if size != ref.size:
        return PayloadMismatch(f"{ref.payload_url} holds {size} bytes, not the placeholder's")
    if sha256 is not None and sha256 != ref.sha256:
        return PayloadMismatch(f"{ref.payload_url} does not match its placeholder's SHA-256")
    return None


class Source(Protocol):
    """A payload for one device: its pieces, the last only once the digest matched."""

    def pieces(self) -> AsyncGenerator[bytes | memoryview, None]:
        """The payload in order.

        Raises:
            TransferFailed: the fetch broke off; PayloadMismatch: its bytes do not match.
        """
        ...

    def close(self) -> None:
        """Give back what the device held (called once, when it is done or gone)."""
        ...


class Flight:
    """One fetch of a payload into a spool, read by its members."""

    def __init__(self, key: FlightKey, spool: Spool, budget: SpoolBudget) -> None:
        self.key = key
        self.spool = spool
        self.verified = False  # every byte fetched, the size and SHA-256 the placeholder's
        self.failure: TransferFailed | None = None
        self.task: asyncio.Task[None] | None = None
        self.members = 0
        self.ended = False  # its spool closed, its budget given back
        self._budget = budget
        self._grown = asyncio.Event()  # pulsed on every piece and at the end
        self._users: collections.Counter[str] = collections.Counter()
        self._addresses: collections.Counter[str] = collections.Counter()

    @property
    def done(self) -> bool:
        return self.verified or self.failure is not None

    def attach(self, who: Holder) -> bool:
        """Make `who` a member; False when its account's or address's share of the spools
        has no room for this payload (charged once per account and per address)."""
        size = self.spool.size
        user = who.user is not None and not self._users[who.user]
        address = not self._addresses[who.address]
        if not self._budget.fits(who, size, user=user, address=address):
            return False
        self._budget.charge(who, size, user=user, address=address)
        if who.user is not None:
            self._users[who.user] += 1
        self._addresses[who.address] += 1
        self.members += 1
        return True

    def detach(self, who: Holder) -> int:
        """`who` leaves; the members left."""
        user = who.user is not None and self._users[who.user] == 1
        address = self._addresses[who.address] == 1
        self._budget.discharge(who, self.spool.size, user=user, address=address)
        if who.user is not None:
            self._users[who.user] -= 1
            if not self._users[who.user]:
                del self._users[who.user]
        self._addresses[who.address] -= 1
        if not self._addresses[who.address]:
            del self._addresses[who.address]
        self.members -= 1
        return self.members

    def append(self, piece: bytes) -> None:
        self.spool.append(piece)
        self._pulse()

    def end(self, failure: TransferFailed | None) -> None:
        if failure is None:
            self.verified = True
        else:
            self.failure = failure
        self._pulse()

    def _pulse(self) -> None:
        self._grown.set()  # wakes every reader waiting now
        self._grown.clear()

    async def reader(self, offset: int = 0) -> AsyncGenerator[bytes | memoryview, None]:
        """The payload from `offset` as far as it has come, waiting for the rest; the last
        byte only once :attr:`verified`."""
        spool = self.spool
        step = MEMORY_READ if spool.in_memory else FILE_READ
        while True:
            if self.failure is not None:  # each reader its own (tracebacks are per raise)
                raise copy.copy(self.failure) from self.failure
            end = spool.length if self.verified else min(spool.length, spool.size - 1)
            if offset < end:
                piece = spool.read(offset, min(end - offset, step))
                offset += len(piece)
                yield piece
            elif self.verified:
                return
            else:
                await self._grown.wait()


class FlightReading:
    """A member's place in a flight (:class:`Source`)."""

    def __init__(self, flights: SharedFetches, flight: Flight, who: Holder) -> None:
        self._flights = flights
        self._flight: Flight | None = flight
        self._who = who

    def pieces(self) -> AsyncGenerator[bytes | memoryview, None]:
        assert self._flight is not None, "read after close"
        return self._flight.reader()

    def close(self) -> None:
        flight, self._flight = self._flight, None
        if flight is not None:
            self._flights.leave(flight, self._who)


class Alone:
    """A payload fetched for one device (no room to share it: :class:`Source`), its fetch
    slot held until the last byte is written; the last piece held back until the digest
    matched."""

    def __init__(
        self, gateway: GatewayLink, metrics: Metrics, taken: Taken, fetch: FetchArgs
    ) -> None:
        self._gateway = gateway
        self._metrics = metrics
        self._taken = taken
        self._fetch = fetch

    async def pieces(self) -> AsyncGenerator[bytes | memoryview, None]:
        ref, auth, peer, trace = self._fetch
        async with self._gateway.fetch(ref, auth, peer, trace) as fetched:
            held: bytes | None = None
            async for piece in fetched:
                self._metrics.bytes_down.inc(len(piece))
                if held is not None:
                    yield held
                held = piece
            failure = mismatch(ref, fetched.size, fetched.sha256)
            if failure is not None:
                raise failure
            if held is not None:
                yield held

    def close(self) -> None:
        self._taken.give_back()


#: What a fetch needs: the placeholder, the device's login and address, the trace context.
FetchArgs = tuple[Placeholder, httpx.Auth | None, str, TraceContext | None]


class SharedFetches:
    """The flights under way or still read, by what names their payload.

    Args:
        gateway: the gateway link (HEADs and GETs).
        fetches: the fetch slots and their shares (a HEAD, a flight's GET, or a payload
            fetched for one device takes one).
        limits: what the spools may hold together.
        metrics: `_fetched_bytes`, `_fetches_joined`, `_shared_bytes`.
        spool_dir: where spools beyond memory go (None: the system's temporary directory).
    """

    def __init__(
        self,
        gateway: GatewayLink,
        fetches: Pool,
        limits: SpoolLimits,
        metrics: Metrics,
        spool_dir: Path | None = None,
    ) -> None:
        self._gateway = gateway
        self._fetches = fetches
        self._metrics = metrics
        self._spool_dir = spool_dir
        self.budget = SpoolBudget(limits, metrics.shared_bytes.set)
        self._flights: dict[FlightKey, Flight] = {}
        # Devices that got a placeholder and have not joined or left its flight yet.
        self._coming: collections.Counter[FlightKey] = collections.Counter()

    async def source(self, who: Holder, fetch: FetchArgs) -> Source:
        """The payload of `fetch`'s placeholder for the device `who` (the caller closes it).

        Waits for a slot of `who`'s fetch share for the HEAD (and, when it starts a flight
        or fetches alone, for the GET).

        Raises:
            PayloadMismatch: the gateway holds another size or SHA-256 than the placeholder's.
            TransferFailed: the gateway refused the device, or did not answer.
        """
        ref, auth, peer, trace = fetch
        key = flight_key(ref)
        self._coming[key] += 1  # a flight whose readers are all gone waits for this one
        try:
            taken = await self._fetches.take(who)
            try:
                stat = await self._gateway.stat(ref, auth, peer, trace)
                failure = mismatch(ref, stat.size, stat.sha256)
                if failure is not None:
                    raise failure
                return self._join(key, who, fetch, taken)
            except BaseException:
                taken.give_back()
                raise
        finally:
            self._coming[key] -= 1
            if not self._coming[key]:
                del self._coming[key]
                flight = self._flights.get(key)
                if flight is not None and not flight.members:
                    self._end(flight)

    def _join(self, key: FlightKey, who: Holder, fetch: FetchArgs, taken: Taken) -> Source:
        """`who`'s place in the flight of `key` (a new one when there is none), or its own
        fetch when it may not read one (no room): `taken` goes with the GET, else back."""
        flight = self._flights.get(key) or self._start(key, fetch, taken)
        if flight is not None and flight.attach(who):
            if flight.task is None:  # ours: it holds the slot until its GET ends
                flight.task = asyncio.create_task(self._run(flight, fetch, taken))
            else:
                taken.give_back()
                self._metrics.joined.inc()
            return FlightReading(self, flight, who)
        if flight is not None and flight.task is None:  # ours, but we may not read it
            self._end(flight)
        return Alone(self._gateway, self._metrics, taken, fetch)

    def _start(self, key: FlightKey, fetch: FetchArgs, taken: Taken) -> Flight | None:
        """A new flight (its GET not started yet), or None when no spool fits."""
        size = key[1]
        in_memory = self.budget.reserve(size)
        if in_memory is None:
            return None
        try:
            spool = Spool(size, self._spool_dir, in_memory=in_memory)
        except OSError as exc:
            self.budget.release(size, in_memory=in_memory)
            log.warning("no spool for a shared fetch", extra={"why": str(exc)})
            return None
        flight = Flight(key, spool, self.budget)
        self._flights[key] = flight
        return flight

    async def _run(self, flight: Flight, fetch: FetchArgs, taken: Taken) -> None:
        """The flight's GET, with the login of the device that started it, into its spool."""
        ref, auth, peer, trace = fetch
        failure: TransferFailed | None = None
        try:
            async with self._gateway.fetch(ref, auth, peer, trace, SHARED_PIECE) as fetched:
                async for piece in fetched:
                    self._metrics.bytes_down.inc(len(piece))
                    flight.append(piece)
                failure = mismatch(ref, fetched.size, fetched.sha256)
        except TransferFailed as exc:
            failure = exc
        except Exception as exc:  # never a task that dies unseen: its readers would wait
            log.exception("shared fetch failed")
            failure = TransferFailed(f"fetch of {ref.payload_url} failed: {exc!r}")
        finally:
            taken.give_back()
        if failure is not None and self._flights.get(flight.key) is flight:
            del self._flights[flight.key]  # the next device fetches anew
        flight.end(failure)
        if failure is not None and not flight.members:
            self._end(flight)  # nobody to tell (those on their way fetch anew)

    def leave(self, flight: Flight, who: Holder) -> None:
        """`who` is done with `flight`; the last member ends it, unless devices that got
        the same placeholder are still on their way to it (waiting for their HEAD)."""
        if not flight.detach(who) and (flight.failure is not None or not self._coming[flight.key]):
            self._end(flight)

    def _end(self, flight: Flight) -> None:
        if flight.ended:
            return
        flight.ended = True
        if self._flights.get(flight.key) is flight:
            del self._flights[flight.key]
        if flight.task is not None and not flight.task.done():
            flight.task.cancel()  # nobody reads: its GET stops
        in_memory = flight.spool.in_memory
        flight.spool.close()
        self.budget.release(flight.spool.size, in_memory=in_memory)

    @property
    def flights(self) -> int:
        """Flights under way or still read (tests)."""
        return len(self._flights)
