"""The store's HTTP connection pool: connecting fails fast, sending a body may wait.

urllib3 sends a request's body under the *connect* timeout (it sets the read timeout only
before reading the answer). The gateway connects to the store with a short timeout (a
store that is down must fail fast), so a part upload whose body the store stopped reading
for 3 s while busy failed with "Connection aborted: timed out" and the client got 503:
72 uploads at once on one SeaweedFS did that (tests/test_chart_capacity.py). Here a body
is sent under the read timeout, like the answer is read.
"""

from __future__ import annotations

from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool


class _SendTimeout:
    """Mixed into urllib3's connections: every send waits up to `send_timeout`."""

    send_timeout: float | None = None
    sock: Any
    auto_open: int

    def send(self, data: Any) -> None:
        if self.sock is None and self.auto_open:
            self.connect()  # type: ignore[attr-defined]  # under the connect timeout
        if self.sock is not None and self.send_timeout is not None:
            self.sock.settimeout(self.send_timeout)
        super().send(data)  # type: ignore[misc]


def pool_manager(
    *, connect: float, read: float, maxsize: int, retries: urllib3.Retry
) -> urllib3.PoolManager:
    """A `PoolManager` whose connections connect within `connect` seconds and send and
    read within `read` seconds each time they wait."""

    class Connection(_SendTimeout, HTTPConnection):
        send_timeout = read

    class TlsConnection(_SendTimeout, HTTPSConnection):
        send_timeout = read

    class Pool(HTTPConnectionPool):
        ConnectionCls = Connection

    class TlsPool(HTTPSConnectionPool):
        ConnectionCls = TlsConnection

    manager = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=connect, read=read), maxsize=maxsize, retries=retries
    )
    manager.pool_classes_by_scheme = {"http": Pool, "https": TlsPool}
    return manager
