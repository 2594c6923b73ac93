"""zstd in independent frames (client/protocol/_zstd.py): round trips, frames, bombs, damage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.protocol._errors import DecompressionBomb, DecompressionFailed
from client.protocol._zstd import (
    MARK,
    PIECE,
    FrameCompressor,
    FrameDecompressor,
    compress,
    decompress,
    marked,
    pays,
    zstd,
)

TELEMETRY = json.dumps([{"sensor": i % 7, "t": i, "v": i * 0.5} for i in range(20000)]).encode()


@settings(max_examples=50, deadline=None)
@given(
    data=st.binary(max_size=5000), frame=st.integers(1, 3000), cuts=st.lists(st.integers(0, 9999))
)
def test_round_trip_any_frame_size_any_split(data: bytes, frame: int, cuts: list[int]) -> None:
    c = FrameCompressor(frame=frame)
    blob = c.feed(data) + c.finish()
    d, out, last = FrameDecompressor(len(data)), [], 0
    for cut in [*sorted(x % (len(blob) + 1) for x in cuts), len(blob)]:
        out.extend(d.feed(blob[last:cut]))
        last = cut
    d.finish()
    assert b"".join(out) == data


def test_frames_are_independent() -> None:
    frame = 64 * 1024
    c = FrameCompressor(frame=frame)
    blob = c.feed(TELEMETRY) + c.finish()
    assert marked(blob)
    sizes, offset = [len(MARK)], len(MARK)
    while offset < len(blob):
        sizes.append(zstd.get_frame_size(blob[offset:]))
        offset += sizes[-1]
    assert len(sizes) - 1 == -(-len(TELEMETRY) // frame)
    second = sum(sizes[:2])  # a reader may start at any frame
    assert decompress(blob[second:], 10**8) == TELEMETRY[frame:]


@pytest.mark.skipif(shutil.which("zstd") is None, reason="no zstd command")
def test_the_zstd_command_reads_the_frames() -> None:
    c = FrameCompressor(frame=10000)
    blob = c.feed(TELEMETRY) + c.finish()
    out = subprocess.run(["zstd", "-dc"], input=blob, capture_output=True, check=True).stdout
    assert out == TELEMETRY


def test_telemetry_pays_random_bytes_do_not() -> None:
    assert pays(TELEMETRY[: 256 * 1024])
    assert len(compress(TELEMETRY)) * 4 < len(TELEMETRY)
    assert not pays(os.urandom(256 * 1024))
    assert not pays(b"")


def test_a_bomb_stops_at_the_limit_in_bounded_pieces() -> None:
    bomb = zstd.compress(bytes(200 * 1024 * 1024))
    assert len(bomb) < 100_000
    d = FrameDecompressor(limit=10 * 1024 * 1024)
    seen = 0
    with pytest.raises(DecompressionBomb) as caught:
        for piece in d.feed(bomb):
            assert len(piece) <= PIECE
            seen += len(piece)
    assert seen <= 10 * 1024 * 1024
    assert caught.value.limit == 10 * 1024 * 1024


def test_exactly_the_limit_is_allowed() -> None:
    assert decompress(compress(b"x" * 1000), 1000) == b"x" * 1000
    with pytest.raises(DecompressionBomb):
        decompress(compress(b"x" * 1001), 1000)


def test_damage_is_a_decompression_failure() -> None:
    blob = compress(TELEMETRY)
    cases = {
        "not zstd": b"plain text, not zstd",
        "truncated": blob[:-5],
        "flipped": blob[:100] + bytes([blob[100] ^ 0xFF]) + blob[101:],
        "trailing garbage": blob + b"garbage",
    }
    for name, data in cases.items():
        with pytest.raises(DecompressionFailed):
            decompress(data, 10**8)
        assert name


def test_a_frame_asking_for_a_huge_window_is_refused() -> None:
    options = {int(zstd.CompressionParameter.window_log): 30}
    big_window = zstd.ZstdCompressor(options=options)
    # Streamed (size unknown up front), so the frame header keeps the 1 GiB window.
    blob = big_window.compress(os.urandom(1000) * 10)
    blob += big_window.flush(zstd.ZstdCompressor.FLUSH_FRAME)
    assert zstd.get_frame_info(blob).decompressed_size is None
    with pytest.raises(DecompressionFailed):
        decompress(blob, 10**8)
