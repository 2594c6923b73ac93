"""Executor-side reading: sidecar, then payload, of each key in a task, into Arrow batches.

Each task opens its own store client; nothing but keys travels from the driver. Rows are
handed to Spark as `pyarrow.RecordBatch`es built here, bounded by bytes: Spark's own
tuple-to-Arrow path batches by row count only (a few hundred large payloads in one batch
would overflow Arrow's 2 GiB binary offsets), and converts every value in Python.

Every payload byte is copied several times on its way into the JVM, so the batches are
shaped to copy as little as possible (measured with bench/spark_read.py):

* A payload of BATCH_BYTES or more travels alone in its batch, and its `bytes` object
  becomes the Arrow data buffer as is (no copy in Python).
* Batches stay near BATCH_BYTES. The JVM allocates each batch's Arrow body off-heap with
  malloc; glibc serves blocks above 32 MiB from fresh mmap()s, whose page faults and
  zeroing cost more than the copy itself (64 MiB batches were ~30% slower than 16 MiB).

Verification (`Verify`, in `_options`) is the one cost here that is not a copy. On two cores
every reader is CPU-bound, so SHA-256 (0.6-0.7 CPU-s per GiB with SHA-NI) was the whole gap to
Spark's `binaryFile`; the manifest's CRC-32C costs 0.1-0.2 CPU-s per GiB. google_crc32c takes
only `bytes` (a mapping or a memoryview is refused) and releases the GIL for 1 MiB or more
of them, so a mapped payload is fed to it in 1 MiB slices: copies that stay in the CPU cache
(measured 0.094 against 0.082 CPU-s per GiB for one `bytes`).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import google_crc32c

from .._exceptions import PayloadChecksumMismatch, PayloadDecodeError, ProtocolError
from ..protocol import Manifest, meta_key
from ._options import ScanOptions, Verify
from ._store import Payload, ReadStore

BATCH_BYTES = 16 * 1024 * 1024
BATCH_ROWS = 4096
# Requests in flight per task: overlaps one object's round trip with the previous one's
# transfer and hashing, without holding more than a few payloads in memory.
FETCH_AHEAD = 2
CRC_SLICE = 1024 * 1024  # google_crc32c releases the GIL from this size on
# Without its C extension google_crc32c is pure Python, far slower than hashlib: SHA-256 then.
CRC_IN_C = google_crc32c.implementation == "c"

DDL = (
    "id string, topic string, timestamp timestamp, size long, sha256 string, "
    "content_type string, key binary, headers map<string,binary>, payload binary"
)


def arrow_schema() -> Any:
    """The Arrow schema Spark expects for DDL (timestamps in µs, UTC)."""
    import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

    return pa.schema(
        [
            ("id", pa.string()),
            ("topic", pa.string()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("size", pa.int64()),
            ("sha256", pa.string()),
            ("content_type", pa.string()),
            ("key", pa.binary()),
            ("headers", pa.map_(pa.string(), pa.binary())),
            ("payload", pa.binary()),
        ]
    )


def _fetch(
    store: ReadStore, key: str, options: ScanOptions
) -> tuple[Manifest, Payload | None] | None:
    """One message, or None when it is gone or outside the time range."""
    raw = store.get(meta_key(key))
    if raw is None:  # deleted (expired) since the driver listed it
        return None
    try:
        manifest = Manifest.from_json(raw)
    except ProtocolError as exc:
        raise ProtocolError(f"{meta_key(key)}: {exc}") from exc
    # Keys were pruned by hour; the manifest's timestamp is the exact one.
    if not options.selects_time(manifest.timestamp):
        return None
    if not options.payload:
        return manifest, None
    payload = store.get_payload(key)
    if payload is None:
        return None
    if options.verify is not Verify.OFF:
        check(manifest, payload, options.verify, f"{options.location.url}/{key}")
    if options.decode:  # after the check: the manifest describes the stored bytes
        payload = decoded(payload, options.identity_files, f"{options.location.url}/{key}")
    return manifest, payload


#: The most a payload may decode to: Arrow's binary column holds 2 GiB at most.
MAX_DECODED = 2**31 - 1
_AGE_MAGIC = b"age-encryption.org/v1\n"


@functools.lru_cache(maxsize=8)
def _identities(files: tuple[str, ...]) -> tuple[Any, ...]:
    from .._keys import load_identities

    return tuple(load_identities(files))


def decoded(payload: Payload, identity_files: tuple[str, ...], url: str) -> Payload:
    """The plaintext of an encrypted or compressed payload (told by its first bytes, the
    way `offload fetch` does: the manifest does not say), else `payload` itself.

    Raises:
        PayloadDecodeError: no identity opens it (naming the key ids), damaged, a bomb.
    """
    from ..protocol._zstd import MARK, marked

    head = bytes(payload[: len(MARK)])
    if not (head.startswith(_AGE_MAGIC) or marked(head)):
        return payload
    from .._unseal import Decoder
    from ..protocol._encoding import PLAIN

    pieces: list[bytes] = []
    try:
        decoder = Decoder(PLAIN, _identities(identity_files), MAX_DECODED, sniff=True)
        # Slices of 1 MiB, plaintext in 64 KiB pieces joined once: each copy stays in the
        # CPU cache (fed whole, the Python workers spent 4.0 CPU-s/GiB against 2.7).
        for start in range(0, len(payload), CRC_SLICE):
            pieces.extend(decoder.feed(bytes(payload[start : start + CRC_SLICE])))
        pieces.extend(decoder.finish())
    except PayloadDecodeError as exc:
        raise PayloadDecodeError(f"{url}: {exc} (option identity_files)") from exc
    return b"".join(pieces)


def crc32c_hex(payload: Payload) -> str:
    """The CRC-32C of `payload` as a manifest records it (8 lowercase hex digits)."""
    if isinstance(payload, bytes):
        crc = google_crc32c.value(payload)
    else:
        crc = 0
        for start in range(0, len(payload), CRC_SLICE):
            crc = google_crc32c.extend(crc, payload[start : start + CRC_SLICE])
    return f"{crc:08x}"


def check(manifest: Manifest, payload: Payload, verify: Verify, url: str) -> None:
    """Raise unless `payload` has the manifest's size and checksum.

    Args:
        manifest: the payload's sidecar.
        payload: its bytes as read.
        verify: AUTO checks the CRC-32C where the manifest records one (manifests from
            before it did not), else the SHA-256; SHA256 always the SHA-256.
        url: names the object in the error.

    Raises:
        PayloadChecksumMismatch: the size or the checksum differs.
    """
    if verify is Verify.AUTO and manifest.crc32c is not None and CRC_IN_C:
        algorithm, expected, actual = "crc32c", manifest.crc32c, crc32c_hex(payload)
    else:
        algorithm, expected = "sha256", manifest.sha256.lower()
        actual = hashlib.sha256(payload).hexdigest()
    if actual != expected or len(payload) != manifest.size:
        raise PayloadChecksumMismatch(
            url,
            f"{algorithm} {expected} ({manifest.size} bytes)",
            f"{algorithm} {actual} ({len(payload)} bytes)",
        )


def fetch_all(
    store: ReadStore, keys: Iterable[str], options: ScanOptions
) -> Iterator[tuple[Manifest, Payload | None]]:
    """Messages for `keys`, in order, with up to FETCH_AHEAD requests in flight.

    Args:
        store: the task's own store client.
        keys: payload keys of this task.
        options: the scan's options (time range, payload, verify).
    """
    with ThreadPoolExecutor(FETCH_AHEAD, thread_name_prefix="offload-fetch") as pool:
        pending = []
        for key in keys:
            pending.append(pool.submit(_fetch, store, key, options))
            if len(pending) > FETCH_AHEAD:
                done = pending.pop(0).result()
                if done is not None:
                    yield done
        for future in pending:
            done = future.result()
            if done is not None:
                yield done


def _binary(values: list[Payload | None]) -> Any:
    """A binary Arrow array; a lone payload is wrapped, not copied (bytes or a mapping)."""
    import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

    if all(v is None for v in values):
        return pa.nulls(len(values), pa.binary())
    offsets = [0, *itertools.accumulate(0 if v is None else len(v) for v in values)]
    present = [v for v in values if v is not None]
    data = present[0] if len(present) == 1 else b"".join(present)
    validity = None
    if len(present) != len(values):
        validity = pa.array([v is not None for v in values]).buffers()[1]
    return pa.Array.from_buffers(
        pa.binary(),
        len(values),
        [validity, pa.array(offsets, pa.int32()).buffers()[1], pa.py_buffer(data)],
        null_count=len(values) - len(present),
    )


def _batch(rows: list[tuple[Manifest, Payload | None]]) -> Any:
    import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

    schema = arrow_schema()
    columns = [
        pa.array([str(m.id) for m, _ in rows], pa.string()),
        pa.array([m.topic.value for m, _ in rows], pa.string()),
        pa.array([m.timestamp * 1000 for m, _ in rows], pa.int64()).cast(schema.field(2).type),
        pa.array([m.size for m, _ in rows], pa.int64()),
        pa.array([m.sha256 for m, _ in rows], pa.string()),
        pa.array([m.content_type for m, _ in rows], pa.string()),
        pa.array([m.key for m, _ in rows], pa.binary()),
        # MQTT user properties may repeat a name; a map keeps the last, like dict().
        pa.array([list(dict(m.headers).items()) for m, _ in rows], schema.field(7).type),
        _binary([p for _, p in rows]),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def read_batches(
    store: ReadStore,
    keys: Iterable[str],
    options: ScanOptions,
    *,
    batch_bytes: int = BATCH_BYTES,
) -> Iterator[Any]:
    """The rows of one task as Arrow record batches.

    A batch holds at most `batch_bytes` of payloads, or a single larger payload.

    Args:
        store: the task's own store client.
        keys: payload keys of this task.
        options: the scan's options.
        batch_bytes: payload bytes per batch (tests make it small).
    """
    rows: list[tuple[Manifest, Payload | None]] = []
    held = 0
    for manifest, payload in fetch_all(store, keys, options):
        size = len(payload) if payload is not None else 0
        # Flush first rather than overshoot: a batch is either near BATCH_BYTES or one
        # payload alone (which then needs no copy).
        if rows and (held + size > batch_bytes or len(rows) >= BATCH_ROWS):
            yield _batch(rows)
            rows, held = [], 0
        rows.append((manifest, payload))
        held += size
    if rows:
        yield _batch(rows)
