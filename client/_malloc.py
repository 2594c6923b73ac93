"""glibc's allocator thresholds for a long-running process that moves large payloads.

The gateway and the proxy call :func:`tune_malloc` at start (the library never does: the
allocator belongs to the application that embeds it). Payload bytes cross them in pieces of
up to 1 MiB, allocated on one thread and freed on another; with glibc's defaults the free
top of a heap was handed back to the kernel after nearly every piece and faulted in, zeroed,
again for the next (bench/RESULTS.md, "The heap's free top").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3


def tune_malloc(*, mmap_threshold: int, trim_threshold: int) -> None:
    """Fix glibc's mmap and trim thresholds, in this process and its children.

    `mmap_threshold`: blocks from this size up get their own mapping, returned on free (a
    fixed value also stops glibc from raising it after large frees, which moved 4-16 MiB
    transfer buffers into heaps that were never given back). `trim_threshold`: the free top
    a heap keeps before it is handed back. Does nothing where there is no glibc (musl has
    no `mallopt`).
    """
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(mmap_threshold))  # for workers
    os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(trim_threshold))
    name = ctypes.util.find_library("c")
    if sys.platform != "linux" or name is None:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
        libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    except (OSError, AttributeError):
        pass
