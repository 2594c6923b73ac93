"""Each account's share of the event loop's time (proxy/_turns.py, PacketStream): a
connection with a backlog hands out at most its account's share per turn of the loop, an
account's connections share one, and nothing is lost, reordered or left waiting for ever.

The streams here are the relay's own (:class:`proxy._stream.PacketStream` over asyncio
stream readers fed whole floods at once); what they hand out is logged in the order the
loop serves them, so the order itself shows who waited for whom, with no timing."""

from __future__ import annotations

import asyncio

from proxy._stream import READ_SIZE, PacketStream
from proxy._turns import TURN_BYTES, TURN_PACKETS, Turn, Turns, turn_key
from proxy.protocol import CONNECT, DISCONNECT, RunRule, encode_varint, type_mask

RULE = RunRule(262144, True)
STOP = type_mask(CONNECT, DISCONNECT)


def publish(seq: int, size: int = 32) -> bytes:
    """A small QoS 0 PUBLISH numbered `seq` (MQTT 5, no properties)."""
    body = b"\x00\x03f/1\x00" + seq.to_bytes(4, "big") + bytes(size - 4)
    return b"\x30" + encode_varint(len(body)) + body


def count(run: bytes) -> int:
    """The packets of a run of small PUBLISHes (each under 128 bytes)."""
    at = n = 0
    while at < len(run):
        at += 2 + run[at + 1]
        n += 1
    return n


async def relay(
    name: str, stream: PacketStream, log: list[tuple[str, int]], out: list[bytes]
) -> None:
    """Hand out runs until the peer is gone, as a relay direction does."""
    while (run := await stream.run(RULE, lambda: STOP)) is not None:
        assert run, "every packet here passes in runs"
        log.append((name, count(run)))
        out.append(run)


def stream_of(data: bytes, turn: Turn) -> PacketStream:
    reader = asyncio.StreamReader(limit=1 << 22)
    reader.feed_data(data)
    reader.feed_eof()
    stream = PacketStream(reader, max_length=1 << 28, idle=5)
    stream.turn = turn
    return stream


def flood(n: int) -> bytes:
    return b"".join(publish(i) for i in range(n))


def served_before(log: list[tuple[str, int]], victim: str) -> int:
    """Packets the others were handed before `victim`'s first run."""
    before = 0
    for name, packets in log:
        if name == victim:
            return before
        before += packets
    raise AssertionError(f"{victim} was never served")


def test_a_connection_with_a_backlog_waits_for_its_next_turn_while_another_passes() -> None:
    """A connection with 20,000 packets buffered (the flood) is served its account's share
    (256 packets), then waits for its next turn, and the other account's one packet goes
    before the rest of the flood; every packet of both is handed out, in order. Without
    the cut (a run of what a read brought) or the wait (a stream served until its buffer is
    empty) the victim comes after thousands of the flood's packets."""

    async def main() -> tuple[list[tuple[str, int]], bytes]:
        turns = Turns()
        log: list[tuple[str, int]] = []
        flooded: list[bytes] = []
        data = flood(20_000)
        a = stream_of(data, turns.of(turn_key("a", "127.0.0.2")))
        b = stream_of(publish(7), turns.of(turn_key("b", "127.0.0.7")))
        await asyncio.gather(relay("a", a, log, flooded), relay("b", b, log, []))
        assert b"".join(flooded) == data  # nothing lost, nothing reordered
        return log, data

    log, _ = asyncio.run(main())
    assert served_before(log, "b") <= TURN_PACKETS, log[:5]
    assert max(packets for _, packets in log) <= TURN_PACKETS


def test_an_accounts_connections_share_one_turn() -> None:
    """Eight connections of account A, each with a backlog, take one share per turn of the
    loop between them, not one each: B's packet passes after at most one share of A's
    (with a turn per connection, it would come after eight)."""

    async def main() -> list[tuple[str, int]]:
        turns = Turns()
        log: list[tuple[str, int]] = []
        outs: list[list[bytes]] = [[] for _ in range(8)]
        data = [flood(2_000) for _ in range(8)]
        flooders = [
            relay(
                f"a{i}",
                stream_of(data[i], turns.of(turn_key("a", f"127.0.0.{2 + i}"))),
                log,
                outs[i],
            )
            for i in range(8)
        ]
        b = stream_of(publish(7), turns.of(turn_key("b", "127.0.0.20")))
        await asyncio.gather(*flooders, relay("b", b, log, []))
        assert [b"".join(out) for out in outs] == data
        return log

    log = asyncio.run(main())
    assert served_before(log, "b") <= TURN_PACKETS + 1, log[:12]


def test_many_connections_of_one_account_all_get_through() -> None:
    """300 connections of one account, each with a few packets: every one is served (a new
    turn wakes as many waiters as its share may serve, and turns follow while any wait),
    and the bytes of a large packet count: a 200 KB one ends its turn."""

    async def main() -> None:
        turns = Turns()
        turn = turns.of(turn_key(None, "127.0.0.9"))
        log: list[tuple[str, int]] = []
        outs: list[list[bytes]] = [[] for _ in range(300)]
        data = [flood(3) for _ in range(300)]
        await asyncio.gather(
            *(relay(str(i), stream_of(data[i], turn), log, outs[i]) for i in range(300))
        )
        assert [b"".join(out) for out in outs] == data
        body = b"\x00\x03f/1\x00" + bytes(200_000)
        large = b"\x30" + encode_varint(len(body)) + body
        stream = stream_of(large + publish(1), turn)
        assert await stream.run(RULE, lambda: STOP) == large
        assert turn.spent and turn.room() == (TURN_PACKETS - 1, 1)
        assert len(large) > TURN_BYTES
        assert await stream.run(RULE, lambda: STOP) == publish(1)  # after a turn

    asyncio.run(main())


def test_a_connection_that_ends_while_waiting_holds_no_one_up() -> None:
    """A waiting connection cancelled (its session ended) is skipped: the next waiter of
    its account is served at the next turn."""

    async def main() -> None:
        turn = Turn()
        turn.charge(TURN_PACKETS, 0)
        first = asyncio.create_task(turn.wait())
        second = asyncio.create_task(turn.wait())
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.wait_for(second, 5)
        assert first.cancelled()

    asyncio.run(main())


async def framed(name: str, stream: PacketStream, log: list[tuple[str, int]]) -> None:
    """Frame every packet one by one, its body whole or in pieces, as the relay does with
    the packets that stop a run (a Topic Alias, a PUBLISH over the run's wait)."""
    while (head := await stream.head()) is not None:
        if head.length > 65536:
            async for piece in stream.pieces(head):
                log.append((name, len(piece)))
        else:
            await stream.body(head)
            log.append((name, 1))


def aliased(seq: int) -> bytes:
    """A small PUBLISH with a Topic Alias: the up rule stops a run at it."""
    body = b"\x00\x03f/1" + b"\x03\x23\x00\x01" + seq.to_bytes(4, "big")
    return b"\x30" + encode_varint(len(body)) + body


def test_packets_framed_one_by_one_and_body_pieces_take_turns_too() -> None:
    """A flood of 5,000 PUBLISHes that each stop a run (a Topic Alias: framed one by one)
    gives way after one share of packets; a 4 MB PUBLISH streamed piece by piece gives way
    after one share of bytes (a piece of at most a read). Without the wait in `head` (or
    in `pieces`) the victim came after the whole flood."""

    body = b"\x00\x03f/1\x00" + bytes(4 << 20)

    async def main() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        turns = Turns()
        heads: list[tuple[str, int]] = []
        flood_a = stream_of(b"".join(aliased(i) for i in range(5000)), turns.of("a"))
        victim = stream_of(publish(7), turns.of("b"))
        await asyncio.gather(framed("a", flood_a, heads), framed("b", victim, heads))
        pieces: list[tuple[str, int]] = []
        large = b"\x30" + encode_varint(len(body)) + body
        flood_c = stream_of(large, turns.of("c"))
        victim = stream_of(publish(8), turns.of("d"))
        await asyncio.gather(framed("c", flood_c, pieces), framed("b", victim, pieces))
        return heads, pieces

    heads, pieces = asyncio.run(main())
    assert served_before(heads, "b") <= TURN_PACKETS
    assert sum(n for name, n in heads if name == "a") == 5000
    assert served_before(pieces, "b") <= 2 * READ_SIZE  # a piece is at most a read
    assert sum(n for name, n in pieces if name == "c") == len(body)
