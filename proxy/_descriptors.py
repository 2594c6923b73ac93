"""File descriptors: `max_connections` is a promise only if the process may open them.

Each client connection takes two descriptors (its socket and its broker link's), each
transfer an HTTP connection to the gateway (and a decoded payload a spool file). When the
process runs out, `accept()` fails before the proxy sees the connection, or a broker link
cannot be opened: clients got 0x88 or a reset instead of the documented CONNACK 0x89. So at
start the soft limit (`RLIMIT_NOFILE`) is raised toward the hard one as far as
`max_connections` needs, and where the hard limit is lower, `max_connections` is lowered to
what fits: with a warning that says so and what to raise when it was set, with an INFO line
when it is the default (10,000 needs 20,320 descriptors: a hard limit of 20,000, a common
one, fits 9,840, and each worker of a default start warned of it).
"""

from __future__ import annotations

import logging
import resource

from ._exceptions import ProxyConfigError
from ._settings import ProxySettings

log = logging.getLogger("proxy")

#: Connections beyond `max_connections` that may wait at once for their CONNECT to be
#: answered 0x89; more are closed at once.
REFUSING = 64
#: Descriptors besides connections and transfers: listeners, the metrics port, the
#: discovery link, the event loop's own, standard streams, logs, libraries' files.
FIXED = 64


def needed(settings: ProxySettings, connections: int) -> int:
    """Descriptors the proxy may hold with `connections` client connections."""
    transfers = settings.max_uploads + 2 * settings.max_fetches  # fetches may spool to a file
    return 2 * connections + REFUSING + transfers + FIXED


def fit_connections(settings: ProxySettings) -> int:
    """The `max_connections` the descriptor limit allows, the soft limit raised first.

    Raises:
        ProxyConfigError: the hard limit leaves room for no connection at all.
    """
    want = needed(settings, settings.max_connections)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    if soft != infinite and soft < want:
        target = want if hard == infinite else min(want, hard)
        if target > soft:  # (not when the hard limit is the soft one already)
            soft = _raise(soft, target, hard)
    if soft == infinite or soft >= want:
        return settings.max_connections
    fitted = (soft - needed(settings, 0)) // 2
    if fitted < 1:
        raise ProxyConfigError(
            f"the open-file limit ({soft}) leaves no room for connections: raise it "
            f"(ulimit -n, LimitNOFILE) to at least {want} for max_connections "
            f"{settings.max_connections}"
        )
    fields = {
        "max_connections": fitted,
        "configured": settings.max_connections,
        "open_file_limit": soft,
        "needed": want,
    }
    if "max_connections" in settings.model_fields_set:
        log.warning(
            "max_connections lowered to fit the open-file limit: raise the limit (ulimit -n, "
            "LimitNOFILE) to keep it",
            extra=fields,
        )
    else:
        log.info("max_connections: what the open-file limit allows", extra=fields)
    return fitted


def _raise(soft: int, target: int, hard: int) -> int:
    """The soft open-file limit raised to `target`; what it is afterwards."""
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # a hard limit the kernel caps lower (nr_open)
        log.warning("could not raise the open-file limit", extra={"why": str(exc)})
        return soft
    log.info("open-file limit raised", extra={"from": soft, "to": target})
    return target
