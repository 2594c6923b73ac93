"""gateway/storage/_pool.py: the kept connections of the gateway's store reads (its own tests,
test_store_reads.py, cover reuse over real sockets); here the bounds: how many are kept, for
how long, and which are never handed back."""

from __future__ import annotations

from gateway.storage._pool import KeptConnections


class Conn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.usable = True
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.usable = False


def test_at_most_size_kept_per_origin_newest_first() -> None:
    pool: KeptConnections[str, Conn] = KeptConnections(size=2, keep_alive=60.0)
    a, b, c, other = Conn("a"), Conn("b"), Conn("c"), Conn("other")
    for conn in (a, b, c):
        pool.release("http://s:1", conn)
    pool.release("http://t:1", other)
    assert (a.closed, b.closed, c.closed, other.closed) == (False, False, True, False)
    assert pool.take("http://s:1") is b
    assert pool.take("http://s:1") is a
    assert pool.take("http://s:1") is None
    assert pool.take("http://t:1") is other
    assert not any(conn.closed for conn in (a, b, other))


def test_expired_and_unusable_connections_are_closed_never_handed_back() -> None:
    expiring: KeptConnections[str, Conn] = KeptConnections(size=4, keep_alive=0.0)
    old = Conn("old")
    expiring.release("o", old)
    assert expiring.take("o") is None
    assert old.closed

    pool: KeptConnections[str, Conn] = KeptConnections(size=4, keep_alive=60.0)
    dead = Conn("dead")
    dead.usable = False
    pool.release("o", dead)  # not kept at all
    assert dead.closed
    kept, dying = Conn("kept"), Conn("dying")
    pool.release("o", kept)
    pool.release("o", dying)
    dying.usable = False  # the server closed it while idle
    assert pool.take("o") is kept
    assert dying.closed and not kept.closed


def test_close_closes_every_idle_connection() -> None:
    pool: KeptConnections[tuple[str, str, int], Conn] = KeptConnections(size=4, keep_alive=60.0)
    conns = [Conn(str(i)) for i in range(3)]
    for i, conn in enumerate(conns):
        pool.release(("http", "h", i % 2), conn)
    pool.close()
    assert all(conn.closed for conn in conns)
    assert pool.take(("http", "h", 0)) is None
