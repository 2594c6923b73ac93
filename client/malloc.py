"""glibc's allocator thresholds for a long-running process that moves large payloads.

Public (`client.malloc`), for the processes that embed the library: the gateway and the
proxy call :func:`tune_malloc` at start, and the proxy :func:`trim_malloc` after a burst of
connections (the library never does: the allocator belongs to the application that embeds
it). Payload bytes cross them in pieces of
up to 1 MiB, allocated on one thread and freed on another; with glibc's thresholds left as
they were, the free top of a heap was handed back to the kernel after nearly every piece
and faulted in, zeroed, again for the next (bench/RESULTS.md, "The heap's free top").
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys

__all__ = ["trim_malloc", "tune_malloc"]

_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3


def tune_malloc(*, mmap_threshold: int, trim_threshold: int) -> None:
    """Fix glibc's mmap and trim thresholds, in this process and its children.

    `mmap_threshold`: blocks from this size up get their own mapping, returned on free (a
    fixed value also stops glibc from raising it after large frees, which moved 4-16 MiB
    transfer buffers into heaps that were never given back). `trim_threshold`: the free top
    a heap keeps before it is handed back. A threshold already set in the environment
    (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`: glibc applied it at start) is the
    operator's and is left alone. Does nothing where there is no glibc (musl has no
    `mallopt`).
    """
    wanted = [
        (variable, parameter, value)
        for variable, parameter, value in (
            ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, mmap_threshold),
            ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, trim_threshold),
        )
        if variable not in os.environ
    ]
    for variable, _, value in wanted:
        os.environ[variable] = str(value)  # for worker processes
    name = ctypes.util.find_library("c")
    if not wanted or sys.platform != "linux" or name is None:
        return
    try:
        mallopt = ctypes.CDLL(name).mallopt
        for _, parameter, value in wanted:
            mallopt(parameter, value)
    except (OSError, AttributeError):
        pass


def trim_malloc() -> None:
    """Hand the free pages of every heap back to the kernel (glibc's `malloc_trim(0)`).

    Memory freed in small blocks stays in the process's heaps, kept for reuse: after a
    burst (many connections' buffers, then gone) the resident size stays at its peak until
    the next burst. Costs a walk of the heaps; call it after a burst, not per free. Does
    nothing where there is no glibc.
    """
    name = ctypes.util.find_library("c")
    if sys.platform != "linux" or name is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name).malloc_trim(0)
