"""Each account's share of the client connections.

A connection takes its slot of `max_connections` when it is accepted, counted against its
address's share (`max_connections_per_address`, :meth:`proxy.Proxy._accept`): no account is
known then. Its account (:attr:`proxy._state.Conn.holder`) is known only once the broker
accepted its login, and only then may it count: a user name the broker has not accepted is
a claim, and a wrong password must not take another account's share. So at the broker's
CONNACK 0 the slot is counted against the account's share as well
(`max_connections_per_user`). Beyond it, the login is undone: the broker link ends with
DISCONNECT 0x00 (Normal disconnection, so the broker discards the Will) and the device gets
CONNACK 0x97, Quota exceeded (3.1.1: 3, server unavailable), as an upload beyond the
account's share gets 0x97. Before, one account logged in 500 connections from 9 addresses
and held every slot: another account's device got CONNACK 0x89.

Anonymous devices have no account: they are held to their address's share alone.
"""

from __future__ import annotations

import contextlib
import logging

from ._exceptions import QUOTA_EXCEEDED
from ._shares import PoolFull
from ._state import Conn, Services
from ._will import DISCONNECT_NORMAL
from .protocol import connack_refusal

log = logging.getLogger("proxy")


async def claim_account(conn: Conn, services: Services) -> bool:
    """After the broker's CONNACK 0 (`conn.accepted`): the connection's slot counted against
    its account's share too. False when the share is full and both sides were told (the
    broker's link ended without its Will, the client refused with 0x97): the session ends.
    """
    user = conn.holder.user
    if conn.slot is None or user is None:  # anonymous: the address's share alone
        return True
    try:
        conn.slot.claim(user)
    except PoolFull:
        services.metrics.refused.labels(why="max-connections-per-user").inc()
        log.info("login refused: its account holds its share of the connections")
        with contextlib.suppress(OSError):
            conn.broker_writer.write(DISCONNECT_NORMAL)
        async with conn.client_lock:
            conn.client_writer.write(connack_refusal(v5=conn.connect.v5, reason=QUOTA_EXCEEDED))
        return False
    return True
