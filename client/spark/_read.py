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

A message that cannot become a row (its sidecar is not a manifest a row can hold, its
payload differs from it, it was deleted after planning, it is over 2 GiB) is handed to
`report` (`_bad.Reporter`) and the task goes on. Reads are bounded: a sidecar by
MAX_SIDECAR_BYTES, a payload by the size its manifest states: a larger object is refused
unread (`_store.Oversize`).

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
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeAlias

import google_crc32c

from ..core._exceptions import PayloadChecksumMismatch, PayloadDecodeError
from ..protocol import Manifest, meta_key
from ._bad import BadObject, Problem, Reporter
from ._options import ScanOptions, Verify
from ._store import Oversize, Payload, ReadStore

BATCH_BYTES = 16 * 1024 * 1024
BATCH_ROWS = 4096
# Requests in flight per task: overlaps one object's round trip with the previous one's
# transfer and hashing, without holding more than a few payloads in memory.
FETCH_AHEAD = 2
CRC_SLICE = 1024 * 1024  # google_crc32c releases the GIL from this size on
# Without its C extension google_crc32c is pure Python, far slower than hashlib: SHA-256 then.
CRC_IN_C = google_crc32c.implementation == "c"
# A sidecar holds headers of at most the gateway's OFFLOAD_MAX_HEADER_BYTES (1 MiB by default),
# base64-encoded; a larger one is refused unread rather than held in memory.
MAX_SIDECAR_BYTES = 16 * 1024 * 1024
# Arrow's binary arrays, and so Spark's binary values, address their bytes with 32-bit offsets.
MAX_PAYLOAD_BYTES = 2**31 - 1
_VALUE_LIMIT = f"{MAX_PAYLOAD_BYTES} bytes, the most a Spark binary value holds"
_INT64 = 2**63
# What Spark's timestamps and Python's datetime (a collect()) both hold: years 1 to 9999.
_FIRST_MS = -62_135_596_800_000
_LAST_MS = 253_402_300_799_999

Message: TypeAlias = tuple[Manifest, Payload | None]

DDL = (
    "id string, topic string, timestamp timestamp, size long, sha256 string, "
    "content_type string, key binary, headers map<string,binary>, trace_id string, "
    "payload binary"
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
            ("trace_id", pa.string()),  # the upload's W3C trace id, None when untraced
            ("payload", pa.binary()),
        ]
    )


def _safe(text: str) -> str:
    """`text` as valid UTF-8 for a log line or an error (hostile values may hold surrogates)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def unfit(manifest: Manifest, key: str | None) -> str | None:
    """Why `manifest` cannot become a row (None: it can).

    `Manifest.from_json` checks what the protocol needs; a row also needs text that UTF-8
    can encode (JSON escapes allow lone surrogates), a timestamp Spark and Python both hold,
    and a size Arrow's 64-bit column holds.

    Args:
        manifest: a parsed sidecar or index entry.
        key: the payload key a sidecar was read for (None for an index entry).
    """
    if key is not None and manifest.home != key:  # filed here (its payload may be shared)
        return f"describes another payload, {_safe(repr(manifest.home))}"
    if not _FIRST_MS <= manifest.timestamp <= _LAST_MS:
        return "timestamp outside the years 1-9999"
    if not 0 <= manifest.size < _INT64:
        return "size out of range"
    texts: list[tuple[str, object]] = [("sha256", manifest.sha256)]
    if manifest.content_type is not None:
        texts.append(("content_type", manifest.content_type))
    texts.extend(("header name", name) for name, _ in manifest.headers)
    for what, value in texts:
        if not isinstance(value, str):
            return f"{what} is not text: {_safe(repr(value))[:200]}"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{what} {ascii(value)[:200]} is not UTF-8 text (a lone surrogate)"
    return None


def parse_manifest(
    raw: bytes | Oversize, key: str | None, what: str, bad_key: str
) -> Manifest | BadObject:
    """A sidecar or index entry as a manifest a row can hold, or why it is not one.

    Args:
        raw: the entry's bytes as read (Oversize beyond MAX_SIDECAR_BYTES).
        key: the payload key a sidecar was read for (None for an index entry).
        what: names the entry in the reason ("sidecar", "index entry").
        bad_key: the payload key to report a bad entry under.
    """
    if isinstance(raw, Oversize):
        return BadObject(bad_key, Problem.TOO_LARGE, f"{what} over {MAX_SIDECAR_BYTES} bytes")
    try:
        manifest = Manifest.from_json(raw)
    except Exception as exc:  # foreign JSON: whatever the parser meets is this entry's fault
        return BadObject(bad_key, Problem.MALFORMED, f"{what}: {_safe(str(exc))[:500]}")
    problem = unfit(manifest, key)
    if problem is not None:
        return BadObject(bad_key, Problem.MALFORMED, f"{what}: {problem}")
    return manifest


def _fetch(store: ReadStore, key: str, options: ScanOptions) -> Message | BadObject | None:
    """One message, why it cannot be delivered, or None when outside the time range."""
    raw = store.get(meta_key(key), MAX_SIDECAR_BYTES)
    if raw is None:  # deleted (expired, swept) since it was planned
        return BadObject(key, Problem.GONE, "sidecar deleted after the scan was planned")
    manifest = parse_manifest(raw, key, "sidecar", key)
    if isinstance(manifest, BadObject):
        return manifest
    # Keys were pruned by hour; the manifest's timestamp is the exact one.
    if not options.selects_time(manifest.timestamp):
        return None
    if not options.payload:
        return manifest, None
    if manifest.size > MAX_PAYLOAD_BYTES:
        return BadObject(key, Problem.TOO_LARGE, f"{manifest.size} bytes: over {_VALUE_LIMIT}")
    verifying = options.verify is not Verify.OFF
    # Never more than the manifest promises: a larger object is refused unread.
    limit = manifest.size if verifying else MAX_PAYLOAD_BYTES
    # Its own object, or (one object per payload per account) the account's stored copy.
    payload = store.get_payload(manifest.data_key, limit)
    if payload is None:
        return BadObject(key, Problem.GONE, "payload deleted after the scan was planned")
    url = f"{options.location.url}/{key}"
    try:
        if isinstance(payload, Oversize):
            found = "more bytes" if payload.size is None else f"{payload.size} bytes"
            if not verifying:
                return BadObject(key, Problem.TOO_LARGE, f"{found}: over {_VALUE_LIMIT}")
            raise PayloadChecksumMismatch(url, f"{manifest.size} bytes", f"{found}, left unread")
        if verifying:
            check(manifest, payload, options.verify, url)
    except PayloadChecksumMismatch as exc:
        reason = f"expected {exc.expected}, got {exc.actual}"
        return BadObject(key, Problem.CHECKSUM, reason, exc)
    if options.decode:  # after the check: the manifest describes the stored bytes
        try:
            payload = decoded(payload, options.identity_files, url)
        except PayloadDecodeError as exc:  # no identity opens it, damaged, a bomb
            return BadObject(key, Problem.UNDECODABLE, _safe(str(exc))[:500], exc)
    return manifest, payload


#: The most a payload may decode to: Arrow's binary column holds 2 GiB at most.
MAX_DECODED = 2**31 - 1
_AGE_MAGIC = b"age-encryption.org/v1\n"


@functools.lru_cache(maxsize=8)
def _identities(files: tuple[str, ...]) -> tuple[Any, ...]:
    from ..config._keys import load_identities

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
    from ..protocol._encoding import PLAIN
    from ..seal._unseal import Decoder

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
    store: ReadStore,
    keys: Iterable[str],
    options: ScanOptions,
    report: Callable[[BadObject], None],
) -> Iterator[Message]:
    """Messages for `keys`, in order, with up to FETCH_AHEAD requests in flight.

    Args:
        store: the task's own store client.
        keys: payload keys of this task.
        options: the scan's options (time range, payload, verify).
        report: called with each object that cannot be delivered (`_bad.Reporter`).
    """
    with ThreadPoolExecutor(FETCH_AHEAD, thread_name_prefix="offload-fetch") as pool:
        pending: list[Future[Message | BadObject | None]] = []

        def settle(future: Future[Message | BadObject | None]) -> Message | None:
            done = future.result()
            if isinstance(done, BadObject):
                report(done)
                return None
            return done

        for key in keys:
            pending.append(pool.submit(_fetch, store, key, options))
            if len(pending) > FETCH_AHEAD and (done := settle(pending.pop(0))) is not None:
                yield done
        for future in pending:
            if (done := settle(future)) is not None:
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


def _batch(rows: list[Message]) -> Any:
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
        pa.array([m.trace_id for m, _ in rows], pa.string()),
        _binary([p for _, p in rows]),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def read_batches(
    store: ReadStore,
    keys: Iterable[str],
    options: ScanOptions,
    *,
    report: Callable[[BadObject], None] | None = None,
    batch_bytes: int = BATCH_BYTES,
    delivered: list[str] | None = None,
) -> Iterator[Any]:
    """The rows of one task as Arrow record batches.

    A batch holds at most `batch_bytes` of payloads, or a single larger payload.

    Args:
        store: the task's own store client.
        keys: payload keys of this task.
        options: the scan's options.
        report: called with each object that cannot be delivered (default: a `Reporter`
            that logs, and under `fail` raises, without counting).
        batch_bytes: payload bytes per batch (tests make it small).
        delivered: where each message handed on is noted, as `<id>.<token>` (a stream's
            confirmations, `_confirm`).
    """
    if report is None:
        report = Reporter(options.location.url, options.on_bad_object)
    rows: list[Message] = []
    held = 0
    for manifest, payload in fetch_all(store, keys, options, report):
        size = len(payload) if payload is not None else 0
        # Flush first rather than overshoot: a batch is either near BATCH_BYTES or one
        # payload alone (which then needs no copy).
        if rows and (held + size > batch_bytes or len(rows) >= BATCH_ROWS):
            yield _batch(rows)
            rows, held = [], 0
        rows.append((manifest, payload))
        held += size
        if delivered is not None:
            delivered.append(f"{manifest.id}.{manifest.token}")
    if rows:
        yield _batch(rows)
