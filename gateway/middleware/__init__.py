"""HTTP server plumbing under every route: ASGI middleware and uvicorn's protocol.

`_forwarded` (the client's address behind a trusted hop), `_limits` (uploads per client
address and per user, stalled bodies and readers), `_drain` (read the rest of a body
before an early refusal), `_target` (refuse a target that is not UTF-8), `_protocol` (a
deadline for every request head), `_closing` (a closed connection ends once its peer has
its answer). Two middlewares live elsewhere because lower layers need
them: CORS (`gateway.core._cors`, whose origins the settings parse) and metrics and request logs
(`gateway.core._observability`, whose counters the error mapping uses).

Other folders use only the names below.
"""

from ._drain import DrainBeforeEarlyAnswer
from ._forwarded import TrustedProxies
from ._limits import USER_SLOT_KEY, RequestTimeout, UploadLimits, UserSlot
from ._protocol import (
    MAX_HEAD_BYTES,
    STALL_KEY,
    STATE_KEY,
    GatewayHttpProtocol,
    HeadDeadlineProtocol,
)
from ._target import Utf8Target

__all__ = [
    "MAX_HEAD_BYTES",
    "STALL_KEY",
    "STATE_KEY",
    "USER_SLOT_KEY",
    "DrainBeforeEarlyAnswer",
    "GatewayHttpProtocol",
    "HeadDeadlineProtocol",
    "RequestTimeout",
    "TrustedProxies",
    "UploadLimits",
    "UserSlot",
    "Utf8Target",
]
