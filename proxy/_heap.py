"""The garbage collector's pace for a process that holds thousands of connections.

Each connection holds about 110 objects the collector tracks (its tasks, coroutines,
futures, streams, transports), and a full collection looks at every one of them. With
CPython's defaults (700, 10, 10) a storm of 5,000 devices connecting through the proxy ran
a full collection every few hundred connects: 12 in two storms, 2.0 s of the proxy's CPU,
0.2 ms of its 0.59 ms per connect (`python bench/proxy_storm.py`, bench/RESULTS.md), and
each one a pause as long as the connections held make it. So, once the proxy listens:

* what the imports and the proxy's own services made (about 53,000 objects) is frozen out of
  every later collection (`gc.freeze`): it lives as long as the process;
* a young collection comes every :data:`YOUNG` container allocations instead of 700, so
  that what a connect makes and drops by reference counting is gone before a collection
  sees it, and fewer objects are promoted to the oldest generation; a full collection then
  comes at most every 100 x as many (and, as before, only when the oldest generation has
  grown by a quarter since the last). Cyclic garbage (a closed connection's transport and
  its bound methods, an exception's traceback) waits longer: a reset after each of 10,000
  connects left the proxy's resident size 4 MiB larger, 3 with the defaults.

Measured: 0.38 ms of CPU per connect instead of 0.59, and 0.6 s of collections in two
storms instead of 2.4. This is for the `offload-proxy` process (:mod:`proxy.cli`); a
:class:`proxy.Proxy` in someone else's process leaves that process's collector alone.
"""

from __future__ import annotations

import gc

#: Container allocations (less deallocations) between young collections (CPython: 700).
YOUNG = 10_000


def settle() -> None:
    """The proxy is built and listens: what exists now stays; collect at the proxy's pace."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
