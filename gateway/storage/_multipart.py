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

Parts are read into buffers reused from upload to upload, and how many one upload holds
follows the load (`gateway.storage._buffers`). A buffer goes back to the free list only
once the part it held has been sent (its request done, retries included).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections import deque
from collections.abc import Callable
from typing import BinaryIO, Protocol, runtime_checkable

from minio import Minio
from minio.datatypes import Part
from minio.helpers import DictType

from ._buffers import PartBuffers, Plan
from ._checksums import ALGORITHM, HEADER, complete, crc32c_header

MAX_PARTS = 10_000  # S3's limit on the parts of one multipart upload
MAX_PART_SIZE = 5 * 1024**3  # S3's limit on one part
_GROWTH_STEP = 1_000  # parts of one size before an unknown-length upload doubles it
_MiB = 1024 * 1024


@runtime_checkable
class SupportsCrc32c(Protocol):
    """A reader that fills a buffer whole (or to the end of its stream) in one call and
    tells the CRC-32C of what it wrote (None: it took none)."""

    def readinto_crc32c(self, buffer: bytearray) -> tuple[int, int | None]: ...


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


def _fill(reader: BinaryIO, buffer: bytearray) -> tuple[int, int | None]:
    """Fill `buffer` from `reader`; the bytes read (fewer only at the end of the stream),
    and their CRC-32C when the reader took it on the way (None: not taken).

    The gateway's pipe fills the whole buffer in one `readinto_crc32c` (`SupportsCrc32c`),
    with the CRC-32C it takes anyway for the object: the part's header then costs no second
    pass. A reader with `readinto` (`io.BytesIO`) writes straight into the buffer; any other
    is read and copied.
    """
    if isinstance(reader, SupportsCrc32c):
        return reader.readinto_crc32c(buffer)
    view = memoryview(buffer)
    got = 0
    readinto = getattr(reader, "readinto", None)
    while got < len(view):
        if readinto is not None:
            n = readinto(view[got:])
        else:
            piece = reader.read(len(view) - got)
            n = len(piece)
            view[got : got + n] = piece
        if not n:
            break
        got += n
    return got, None


def _send_part(
    client: Minio,
    bucket: str,
    key: str,
    body: memoryview,
    crc: int | None,
    upload_id: str,
    number: int,
    checksums: bool,
) -> tuple[str, str]:
    """UploadPart in a part thread; its ETag and CRC-32C header value ("" without)."""
    headers = crc32c_header(body, crc) if checksums else None
    etag = client._upload_part(bucket, key, body, headers, upload_id, number)  # type: ignore[arg-type]
    return etag, "" if headers is None else str(headers[HEADER])


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
    buffers: PartBuffers,
    share: Callable[[], Plan],
    checksums: bool = False,
) -> None:
    """Store what `reader` yields under `key`, parts filled into reused buffers.

    Memory: at most `share().buffers` parts (asked again before each part), never more
    than `parallel` in flight plus the one being filled. A payload that fits one part is
    one PUT. Part sizes follow `part_size_for`, so S3's 10,000-part limit is never reached.
    With `checksums`, each request carries its body's CRC-32C for the store to verify and
    is signed `UNSIGNED-PAYLOAD` (`gateway.storage._checksums`).

    Raises:
        ValueError: the stream did not have `length` bytes (when `length` >= 0).
    """
    size = part_size_for(1, length, part_size)
    pooled = not 0 <= length < size
    # A payload known to fit one part gets a buffer of its size (one byte more, so a
    # stream longer than announced is caught), not a whole part from the free list.
    buffer = buffers.take(size) if pooled else bytearray(length + 1)
    single = True
    try:
        n, crc = _fill(reader, buffer)
        single = n < len(buffer) or n == length or not pooled
        if single:
            _check(n, length)
            body = memoryview(buffer)[:n]
            headers: DictType = {"Content-Type": content_type}
            if checksums:
                headers.update(crc32c_header(body, crc))
            client._put_object(bucket, key, body, headers)  # type: ignore[arg-type]
            return
    finally:
        if single and pooled:
            buffers.give(buffer)
    _put_multipart(
        client,
        bucket,
        key,
        reader,
        length,
        (buffer, size, n, crc),
        content_type=content_type,
        part_size=part_size,
        parallel=parallel,
        buffers=buffers,
        share=share,
        checksums=checksums,
    )


def _put_multipart(
    client: Minio,
    bucket: str,
    key: str,
    reader: BinaryIO,
    length: int,
    first: tuple[bytearray, int, int, int | None],
    *,
    content_type: str,
    part_size: int,
    parallel: int,
    buffers: PartBuffers,
    share: Callable[[], Plan],
    checksums: bool,
) -> None:
    """The multipart upload of a payload larger than its first part (`first`: that part's
    buffer from `buffers`, its part size, the bytes read into it and their CRC-32C), the rest
    read from `reader`."""
    buffer, size, n, crc = first
    created: DictType = {"Content-Type": content_type, **(ALGORITHM if checksums else {})}
    upload_id = client._create_multipart_upload(bucket, key, created)
    etags: list[concurrent.futures.Future[tuple[str, str]]] = []
    in_flight: deque[tuple[concurrent.futures.Future[tuple[str, str]], bytearray]] = deque()
    pool = concurrent.futures.ThreadPoolExecutor(parallel, thread_name_prefix="offload-part")
    held: bytearray | None = buffer
    try:
        number, total = 1, 0
        while n:
            total += n
            view = memoryview(buffer)[:n]
            future = pool.submit(
                _send_part, client, bucket, key, view, crc, upload_id, number, checksums
            )
            etags.append(future)
            in_flight.append((future, buffer))
            held = None
            if n < size:
                break  # a short part is the last
            number += 1
            limit = min(parallel + 1, share().buffers)
            while in_flight and len(in_flight) >= limit:
                done, used = in_flight.popleft()
                done.result()  # raises the first failure
                buffers.give(used)
            size = part_size_for(number, length, part_size)
            buffer = held = buffers.take(size)
            n, crc = _fill(reader, buffer)
        _check(total, length)
        _complete(client, bucket, key, upload_id, [etag.result() for etag in etags], checksums)
    except BaseException:
        _abort(client, bucket, key, upload_id, pool, [future for future, _ in in_flight])
        raise
    finally:
        pool.shutdown(wait=True)
        for _, used in in_flight:
            buffers.give(used)
        if held is not None:
            buffers.give(held)


def _complete(
    client: Minio,
    bucket: str,
    key: str,
    upload_id: str,
    sent: list[tuple[str, str]],
    checksums: bool,
) -> None:
    """Complete a multipart upload of the parts `sent` ((ETag, CRC-32C) each, in order)."""
    if checksums:
        complete(client, bucket, key, upload_id, sent)
    else:
        parts = [Part(i, etag) for i, (etag, _) in enumerate(sent, start=1)]
        client._complete_multipart_upload(bucket, key, upload_id, parts)


def _abort(
    client: Minio,
    bucket: str,
    key: str,
    upload_id: str,
    pool: concurrent.futures.ThreadPoolExecutor,
    in_flight: list[concurrent.futures.Future[tuple[str, str]]],
) -> None:
    """A failed multipart upload: no more parts sent, those running waited for, and the
    upload aborted."""
    for future in in_flight:
        future.cancel()
    pool.shutdown(wait=True)
    # Best effort: stores also expire abandoned multipart uploads themselves.
    with contextlib.suppress(Exception):
        client._abort_multipart_upload(bucket, key, upload_id)
