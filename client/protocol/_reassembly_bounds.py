"""How many chunks a reassembler may track, derived from the limits a client already has.

A sender controls how many chunks it announces and sends, and a chunk costs bookkeeping in
RAM whatever its size (an index, a store slot, a spool span), so chunk counts need bounds of
their own beside the byte bound. Rather than two more settings to tune, they follow from
the byte bound, the broker's packet limit and the RAM budget: :func:`chunk_bounds`.
"""

from __future__ import annotations

from ._chunk_header import MAX_U32

__all__ = ["CHUNK_ENTRY_COST", "CHUNK_HEADROOM", "CHUNK_SIZE_FLOOR", "chunk_bounds"]

#: Smallest chunk payload assumed of a sender when bounding chunks per message: brokers that
#: need chunking state limits of 64 KiB and more, and ADR 23 fills every chunk but the last.
CHUNK_SIZE_FLOOR = 64 * 1024
#: Headroom for a chunk's own PUBLISH header and properties within the packet limit.
CHUNK_HEADROOM = 1024
#: RAM charged per tracked chunk entry (index set, store slot, spool span) when deriving
#: how many entries the RAM budget allows.
CHUNK_ENTRY_COST = 256


def chunk_bounds(*, max_buffered_bytes: int, packet_limit: int, ram_budget: int) -> tuple[int, int]:
    """Chunks per message and chunk entries in all, derived from the limits in force.

    A message larger than `max_buffered_bytes` is dropped anyway, and a sender filling its
    chunks to the packet limit (or at least to :data:`CHUNK_SIZE_FLOOR`) needs no more than
    `max_buffered_bytes / chunk size + 1` of them. Chunk bookkeeping lives in RAM whatever
    the store does with the bytes, so entries across all partial messages are bounded by the
    RAM budget at :data:`CHUNK_ENTRY_COST` bytes each, and one message can never have more
    chunks than that either (a tiny packet limit then needs a larger RAM budget).

    Args:
        max_buffered_bytes: the reassembly byte bound.
        packet_limit: the Maximum Packet Size in force.
        ram_budget: bytes of RAM reassembly may use (the client's `spool_threshold`).

    Returns:
        `(max_chunks_per_message, max_tracked_chunks)`.
    """
    chunk = max(min(packet_limit, CHUNK_SIZE_FLOOR) - CHUNK_HEADROOM, 1)
    tracked = max(ram_budget // CHUNK_ENTRY_COST, 1)
    per_message = min(-(-max_buffered_bytes // chunk) + 1, tracked, MAX_U32)
    return per_message, tracked
