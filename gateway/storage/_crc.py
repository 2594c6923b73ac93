"""CRC-32C over any buffer, without copying it, off the GIL where the C library allows.

`google_crc32c.extend` takes `bytes` only (its C extension parses `y#`, which refuses a
`memoryview` or a `bytearray`), and a part buffer is a `bytearray` that the gateway fills
in place. Copying 8 MiB into `bytes` only to checksum it would undo the buffer's point, so
a writable buffer goes to the same C library's `crc32c_extend` through ctypes (which also
lets other threads run meanwhile). Without that library (another platform's wheel, the
pure-Python fallback) the buffer is copied; without the C extension at all no CRC-32C is
taken (`available` is False; the manifest's field is optional).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from pathlib import Path

import google_crc32c

available = google_crc32c.implementation == "c"


def _find_extend() -> Callable[[int, object, int], int] | None:
    here = Path(google_crc32c.__file__).parent
    candidates = [str(p) for p in sorted(here.parent.glob("google_crc32c.libs/libcrc32c*.so*"))]
    system = ctypes.util.find_library("crc32c")
    if system is not None:
        candidates.append(system)
    for name in candidates:
        try:
            fn = ctypes.CDLL(name).crc32c_extend
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        fn.restype = ctypes.c_uint32
        extend: Callable[[int, object, int], int] = fn
        return extend
    return None


_extend_pointer = _find_extend() if available else None


def crc32c_extend(crc: int, data: bytes | bytearray | memoryview) -> int:
    """`crc` extended by `data` (unchanged when no C implementation is available)."""
    if not available:
        return crc
    if isinstance(data, bytes):
        return int(google_crc32c.extend(crc, data))
    view = memoryview(data)
    if _extend_pointer is not None and not view.readonly and view.contiguous:
        n = view.nbytes
        if n == 0:
            return crc
        block = (ctypes.c_char * n).from_buffer(view)
        return int(_extend_pointer(crc, ctypes.addressof(block), n))
    return int(google_crc32c.extend(crc, view.tobytes()))


# CRC-32C of a concatenation from the CRC-32Cs of its parts (zlib's crc32_combine, with the
# Castagnoli polynomial): the CRC of `b` is appended to that of `a` by multiplying the
# first by x^(8 len(b)) modulo the polynomial. A few dozen integer steps per call, so a part's
# CRC-32C, taken once for its request, also extends the whole object's.
_POLY = 0x82F63B78  # reflected


def _multiply(a: int, b: int) -> int:
    """a * b modulo the polynomial (reflected bit order)."""
    product, bit = 0, 1 << 31
    while True:
        if a & bit:
            product ^= b
            if not a & (bit - 1):
                return product
        bit >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _powers() -> list[int]:
    """x^(2^k) modulo the polynomial, k = 0..31."""
    table = [1 << 30]  # x^1
    for _ in range(31):
        table.append(_multiply(table[-1], table[-1]))
    return table


_X2N = _powers()


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """The CRC-32C of `a + b` from `a`'s, `b`'s and `b`'s length in bytes."""
    shift, n, k = 1 << 31, length_b, 3  # x^0; 8 bits per byte is 2^3
    while n:
        if n & 1:
            shift = _multiply(_X2N[k & 31], shift)
        n >>= 1
        k += 1
    return _multiply(shift, crc_a) ^ crc_b
