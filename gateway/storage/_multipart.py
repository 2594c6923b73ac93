"""A multipart upload with parts in parallel that gives back everything when it fails.

The MinIO SDK's own parallel upload (`put_object(num_parallel_uploads > 1)`) starts a
thread pool per upload and stops its threads only on success: every failed or aborted
upload left its worker threads blocked for ever, each still holding the last part it
uploaded (8 MiB by default). A client hanging up mid-body 30 times grew the gateway by 60
threads and 530 MiB. Here the parts go through a `ThreadPoolExecutor` that is shut down
on every path, and the upload is aborted on the store when anything fails.

S3 allows at most 10,000 parts of at most 5 GiB each: a payload of known length gets a
part size large enough for it to fit (`part_size_for`); one of unknown length (a chunked
body) starts at the configured size and doubles it every 1,000 parts, so memory stays
`parallel + 1` configured parts up to 1,000 of them and no body ever needs part 10,001.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
from collections import deque
from typing import BinaryIO

from minio import Minio
from minio.datatypes import Part

MAX_PARTS = 10_000  # S3's limit on the parts of one multipart upload
MAX_PART_SIZE = 5 * 1024**3  # S3's limit on one part
_GROWTH_STEP = 1_000  # parts of one size before an unknown-length upload doubles it
_MiB = 1024 * 1024


def part_size_for(number: int, length: int, base: int) -> int:
    """The size of part `number` (1-based) of a `length`-byte upload (-1: unknown).

    Known length: one size for every part, at least `base`, rounded up to whole MiB, and
    large enough that the upload needs at most 10,000 parts (a 10 GiB payload at the
    default 8 MiB: 1,280 parts; 100 GiB: 10.3 MiB parts). Unknown length: `base`, doubled
    every 1,000 parts (8 MiB parts reach 8 GiB, then 16 MiB parts 24 GiB, ...: 10,000
    parts hold about 8 TiB, more than S3's 5 TiB object limit).
    """
    if length >= 0:
        needed = -(-length // MAX_PARTS)
        size = max(base, -(-needed // _MiB) * _MiB)
    else:
        size = base << min((number - 1) // _GROWTH_STEP, 20)
    return min(size, MAX_PART_SIZE)


def _read_part(reader: BinaryIO, size: int) -> bytes:
    """Up to `size` bytes; fewer only at the end of the stream."""
    pieces: list[bytes] = []
    got = 0
    while got < size:
        piece = reader.read(size - got)
        if not piece:
            break
        pieces.append(piece)
        got += len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _check(total: int, length: int) -> None:
    if length >= 0 and total != length:
        raise ValueError(f"stream had {total} bytes, expected {length}")


def put_parallel(
    client: Minio,
    bucket: str,
    key: str,
    reader: BinaryIO,
    length: int,
    *,
    content_type: str,
    part_size: int,
    parallel: int,
) -> None:
    """Store what `reader` yields under `key`, `parallel` parts in flight at most.

    Memory: at most `parallel + 1` parts. A payload that fits one part is one PUT. Part
    sizes follow `part_size_for`, so S3's 10,000-part limit is never reached.

    Raises:
        ValueError: the stream did not have `length` bytes (when `length` >= 0).
    """
    first_size = part_size_for(1, length, part_size)
    first = _read_part(reader, first_size)
    second = b""
    if len(first) == first_size:
        second = _read_part(reader, part_size_for(2, length, part_size))
    if not second:
        _check(len(first), length)
        client.put_object(bucket, key, io.BytesIO(first), len(first), content_type=content_type)
        return
    upload_id = client._create_multipart_upload(bucket, key, {"Content-Type": content_type})
    etags: dict[int, concurrent.futures.Future[str]] = {}
    in_flight: deque[concurrent.futures.Future[str]] = deque()
    pool = concurrent.futures.ThreadPoolExecutor(parallel, thread_name_prefix="offload-part")
    try:
        number, data, total = 1, first, 0
        pending_next: bytes | None = second
        while data:
            total += len(data)
            while len(in_flight) >= parallel:
                in_flight.popleft().result()  # raises the first failure
            future = pool.submit(client._upload_part, bucket, key, data, None, upload_id, number)
            etags[number] = future
            in_flight.append(future)
            number += 1
            if pending_next is not None:
                data, pending_next = pending_next, None
            else:
                data = _read_part(reader, part_size_for(number, length, part_size))
        _check(total, length)
        parts = [Part(n, etags[n].result()) for n in sorted(etags)]
        client._complete_multipart_upload(bucket, key, upload_id, parts)
    except BaseException:
        for future in in_flight:
            future.cancel()
        pool.shutdown(wait=True)
        # Best effort: stores also expire abandoned multipart uploads themselves.
        with contextlib.suppress(Exception):
            client._abort_multipart_upload(bucket, key, upload_id)
        raise
    finally:
        pool.shutdown(wait=True)
